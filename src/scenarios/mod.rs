//! The scenarios, grouped by what they exercise. Each starts its own
//! session (a fresh backend), checks with `ensure!`, and finishes the
//! session (leases destroyed, backend stopped with no survivor) before it
//! reports.

pub mod cleanup;
pub mod exec;
pub mod interactive;
pub mod lifecycle;
pub mod output;
pub mod secret;
pub mod termination;

use anyhow::{bail, Result};
use sandbox_host::types::{ExecuteResult, ProviderError};
use sandbox_host::{CancelToken, LeaseRefused};
use serde_json::Value;

use crate::command::cmd;
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// Runs `body` in a fresh session of `target` (config `patch` merged) and
/// finishes the session; a failed finish fails the scenario.
pub(crate) fn with_session(
    target: &Target,
    patch: Option<&Value>,
    body: impl FnOnce(&Session) -> Result<Verdict>,
) -> Result<Verdict> {
    let session = Session::open(target, patch)?;
    let verdict = body(&session)?;
    session.finish()?;
    Ok(verdict)
}

/// Checks that the lease store refuses a command on `lease_id` before
/// anything reaches the provider (`what` says why it should).
pub(crate) fn expect_refused(session: &Session, lease_id: &str, what: &str) -> Result<()> {
    match session.execute(lease_id, &cmd("true", &[]), None, CancelToken::new()) {
        Err(error) if error.downcast_ref::<LeaseRefused>().is_some() => Ok(()),
        Err(error) => bail!("{what}: execute failed, but not as a refusal of the lease: {error:#}"),
        Ok(outcome) => bail!(
            "{what}: execute was not refused: {}",
            crate::command::outcome_text(&outcome)
        ),
    }
}

/// Notes a check that needs the backend's processes on this machine.
pub(crate) fn not_observable(what: &str) -> String {
    format!("{what}: the backend's processes are not on this machine")
}

/// The result of a command that must exit 0.
pub(crate) fn succeeded(
    what: &str,
    outcome: Result<ExecuteResult, ProviderError>,
) -> Result<ExecuteResult> {
    match outcome {
        Ok(result) if result.exit_code == Some(0) && !result.timed_out => Ok(result),
        other => bail!(
            "{what}: expected exit code 0, got {}",
            crate::command::outcome_text(&other)
        ),
    }
}
