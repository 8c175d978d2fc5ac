//! The host's deadlines, derived from the budget the provider declares.
//!
//! ("Deadlines" is the contract's word, the WIT `operation-budget`; what the
//! host derives from it are deadlines, and the request starts an API allows
//! are its rate limit, `network/request_pacer.rs`.)
//!
//! The provider plans its work from the config it validated and says so in
//! `validate-config`'s `operation-budget`: a lifecycle operation (acquire,
//! resume, release, destroy, realize, probe) takes at most `operation-ms`;
//! a command runs at most its own timeout (or `operation-ms`); each request
//! outside a command's run takes at most `request-ms`; and each cleanup
//! request (delete the sandbox, terminate the process tree, remove staged
//! stdin) gets `request-ms` afresh, after the work's own budget may be
//! spent. (The CreateOS provider derives them from `timeoutMs` and
//! `requestTimeoutMs`; the host reads no provider's config fields.)
//!
//! The host sets each instance's hard deadline (epoch interruption and
//! every HTTP request of the instance) to that plan plus a **cleanup
//! reserve** (two cleanup requests) plus a margin. So the provider never
//! plans past the host's deadline, and a cleanup request that starts when
//! the work's budget is spent still has its whole `request-ms`.

use std::time::Duration;

use crate::wasm::bindings::types::OperationBudget;

/// `operation-ms` when the provider declares no budget.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// `request-ms` when the provider declares no budget.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// The longest `operation-ms` or `request-ms` the host accepts from a
/// provider (24 hours).
pub const MAX_BUDGET_MS: u64 = 86_400_000;
/// The margin beyond the plan and its cleanup reserve, by default.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(5);

/// Cleanup requests one operation may make after its budget is spent:
/// terminating the process tree and removing staged stdin (execute), or
/// deleting the sandbox (acquire, probe).
const CLEANUP_REQUESTS: u32 = 2;
/// Requests `execute` makes before its command's timeout starts: stage
/// stdin, create the process, close stdin.
const SETUP_REQUESTS: u32 = 3;

/// The deadlines of one environment, from the budget its provider declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// `operation-ms`: a lifecycle operation's budget and the default command timeout.
    pub timeout: Duration,
    /// `request-ms`: one request's budget, and each cleanup request's.
    pub request: Duration,
    /// Slack beyond the plan and the cleanup reserve.
    pub margin: Duration,
}

impl Deadlines {
    /// The budget `validate-config` declared (defaults when none; values
    /// above 24 hours are capped).
    pub fn from_validation(budget: Option<&OperationBudget>) -> Deadlines {
        let (operation, request) = budget
            .map(|b| (b.operation_ms, b.request_ms))
            .unwrap_or((DEFAULT_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS));
        Deadlines {
            timeout: Duration::from_millis(operation.min(MAX_BUDGET_MS)),
            request: Duration::from_millis(request.min(MAX_BUDGET_MS)),
            margin: DEFAULT_MARGIN,
        }
    }

    /// The same deadlines with another margin.
    pub fn with_margin(mut self, margin: Duration) -> Deadlines {
        self.margin = margin;
        self
    }

    /// Time kept for cleanup requests after an operation's budget is spent.
    pub fn cleanup_reserve(&self) -> Duration {
        self.request * CLEANUP_REQUESTS
    }

    /// The host's deadline for a lifecycle operation (and for `probe`).
    pub fn lifecycle_deadline(&self) -> Duration {
        self.timeout + self.cleanup_reserve() + self.margin
    }

    /// The host's deadline for `execute` with the request's timeout (the
    /// budget's `operation-ms` when it sets none).
    pub fn execute_deadline(&self, command_timeout: Option<Duration>) -> Duration {
        let command = command_timeout
            .unwrap_or(self.timeout)
            .min(Duration::from_millis(MAX_BUDGET_MS));
        command + self.request * SETUP_REQUESTS + self.cleanup_reserve() + self.margin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_cover_the_plan_and_its_cleanup_requests() {
        let budget = Deadlines::from_validation(Some(&OperationBudget {
            operation_ms: 1000,
            request_ms: 60000,
        }))
        .with_margin(Duration::ZERO);
        // A cleanup request may start when the work's budget is spent and
        // still get its whole requestTimeoutMs.
        assert!(budget.lifecycle_deadline() >= budget.timeout + budget.request);
        assert_eq!(budget.lifecycle_deadline(), Duration::from_millis(121_000));
        assert_eq!(
            budget.execute_deadline(Some(Duration::from_millis(10))),
            Duration::from_millis(10 + 5 * 60_000)
        );
        let defaults = Deadlines::from_validation(None);
        assert_eq!(defaults.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(
            defaults.request,
            Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS)
        );
        let capped = Deadlines::from_validation(Some(&OperationBudget {
            operation_ms: u64::MAX,
            request_ms: 1,
        }));
        assert_eq!(capped.timeout, Duration::from_millis(MAX_BUDGET_MS));
    }
}
