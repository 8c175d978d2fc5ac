//! Host-wide budgets: how many sandboxes may exist and how many processes
//! may be live across all of them, so that many sandboxes together cannot
//! exhaust the host (each sandbox's own limits are per sandbox; 2 000
//! sandboxes were created in 1.7 s before these budgets, and about 16
//! fork-bombed ones exhaust a default `pid_max`).
//!
//! A creation over a budget is refused before anything is done: 429 with
//! code `sandbox_limit` or `process_limit` (the Daytona face: 429 with the
//! same message).
//!
//! The defaults follow the host: [`Budgets::for_host`] allows one sandbox
//! per [`PIDS_PER_SANDBOX`] of a quarter of the kernel's `pid_max` (at
//! least 16, at most 256), and 64 live managed processes per sandbox
//! allowed, at least 256 and at most 1024. A sandbox under its fair
//! share of the process budget ([`Budgets::fair_share`]) may start a
//! command even when the budget is spent. The process budget counts the
//! processes started through the API and, where each command has a pids
//! group of its own (one machine per sandbox), every task they started
//! ([`sandbox_tasks`]), whichever is more; counting and admitting a start
//! are one step ([`crate::sandboxes::store::Store::admit_process`]). On a host with a small `pid_max` (32 768) the minimum of 16
//! sandboxes times 2048 tasks reaches `pid_max`: there the per-sandbox task
//! limit of the launch path, or a lower `--max-sandboxes`, bounds the rest.

use axum::http::StatusCode;

/// The tasks one sandbox may hold at most (its own per-uid limit).
pub const PIDS_PER_SANDBOX: u64 = 2048;

/// Upper bound of the default sandbox budget.
pub const MAX_DEFAULT_SANDBOXES: usize = 256;

/// Upper bound of the default live process budget.
pub const MAX_DEFAULT_PROCESSES: usize = 1024;

/// Host-wide budgets, checked at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Most sandboxes existing at once (both faces together).
    pub max_sandboxes: usize,
    /// Most live managed processes (started through the API, tree not yet
    /// gone) across every sandbox.
    pub max_processes: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self::for_host()
    }
}

fn pid_max() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32_768)
}

impl Budgets {
    /// A sandbox's fair share of the process budget: the budget over the
    /// sandboxes it allows, at least 1. A sandbox under its share may
    /// start a command even when others hold the whole budget.
    pub fn fair_share(&self) -> usize {
        (self.max_processes / self.max_sandboxes.max(1)).max(1)
    }

    /// The defaults for this host (see the module docs).
    pub fn for_host() -> Self {
        let sandboxes =
            ((pid_max() / 4 / PIDS_PER_SANDBOX) as usize).clamp(16, MAX_DEFAULT_SANDBOXES);
        Self {
            max_sandboxes: sandboxes,
            max_processes: (sandboxes * 64).clamp(256, MAX_DEFAULT_PROCESSES),
        }
    }
}

/// The tasks (processes and threads) the API-started commands of the
/// sandbox at `root` hold now, as the kernel counts them: the sum over the
/// command's pids groups (see [`crate::machine`]) of their members, each
/// group's launcher (the server's fork that joins the machine) not counted. `None` where commands have no
/// pids group of their own (no machine per sandbox here): then the budget
/// counts API-started processes only.
pub fn sandbox_tasks(root: &std::path::Path) -> Option<usize> {
    crate::trees::process_limits::command_tasks(root)
}

/// Why a creation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `sandbox_limit` or `process_limit`.
    pub code: &'static str,
    /// For people.
    pub message: String,
}

impl Refusal {
    /// The HTTP status of a refusal over a budget.
    pub const STATUS: StatusCode = StatusCode::TOO_MANY_REQUESTS;

    /// The HTTP status of this refusal: [`Refusal::STATUS`], but 503 for
    /// an engine short of descriptors (the engine's state, not a budget
    /// the client can count on).
    pub fn status(&self) -> StatusCode {
        if self.code == OUT_OF_DESCRIPTORS {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            Self::STATUS
        }
    }
}

/// The code of a creation refused because the engine is short of
/// descriptors.
pub const OUT_OF_DESCRIPTORS: &str = "out_of_descriptors";

/// `Err` (503 `out_of_descriptors`) while the engine has fewer than
/// [`crate::trees::fds::NEW_WORK_RESERVE`] descriptors free: what is left
/// stays for proving sandboxes gone (issue 40 item 2).
pub fn admit_by_descriptors(what: &str) -> Result<(), Refusal> {
    let free = crate::trees::fds::headroom_fast();
    if free < crate::trees::fds::NEW_WORK_RESERVE {
        return Err(Refusal {
            code: OUT_OF_DESCRIPTORS,
            message: format!(
                "the server has {free} file descriptors left, fewer than the {} it keeps \
                 for ending sandboxes with proof; no {what} was started: end processes or \
                 close connections, then retry",
                crate::trees::fds::NEW_WORK_RESERVE
            ),
        });
    }
    Ok(())
}

/// `Err` when one more sandbox would exceed the budget.
pub fn admit_sandbox(budgets: &Budgets, existing: usize) -> Result<(), Refusal> {
    if existing >= budgets.max_sandboxes {
        return Err(sandbox_refusal(budgets, existing));
    }
    Ok(())
}

/// The refusal of a sandbox over the budget (`existing` sandboxes exist).
pub fn sandbox_refusal(budgets: &Budgets, existing: usize) -> Refusal {
    Refusal {
        code: "sandbox_limit",
        message: format!(
            "this server already holds {existing} sandboxes, its limit \
             (--max-sandboxes {}); nothing was created: delete a sandbox and retry",
            budgets.max_sandboxes
        ),
    }
}

/// `Err` when one more process would exceed the budget: `live` are live
/// across every sandbox, `own` of them in the sandbox asking. A sandbox
/// under its [`Budgets::fair_share`] is admitted even when the budget is
/// spent (one sandbox's fork bomb, whose tasks the budget counts, must not
/// starve the others; the overshoot is at most one share per sandbox).
pub fn admit_process(budgets: &Budgets, live: usize, own: usize) -> Result<(), Refusal> {
    let share = budgets.fair_share();
    if live >= budgets.max_processes && own >= share {
        return Err(Refusal {
            code: "process_limit",
            message: format!(
                "{live} processes are live across this server's sandboxes (every task of \
                 running commands counted where the kernel counts them), its limit \
                 (--max-processes {}), and this sandbox holds {own} of them, at least its \
                 fair share ({share}); nothing was started: wait for processes to end or \
                 terminate some, then retry",
                budgets.max_processes
            ),
        });
    }
    Ok(())
}
