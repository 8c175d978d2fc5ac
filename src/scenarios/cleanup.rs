//! Every `cleanup-failed` cause the backend can produce: the provider
//! reports it with the right phase, the host poisons the lease in the store
//! and refuses it, and `sweep` (once the fault is gone) destroys it with
//! nothing of the scenario's commands left alive.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use sandbox_host::types::{CleanupFailure, ExecuteRequest, ProviderError};
use sandbox_host::{error_text, CancelToken, LeaseRecord, LeaseState};

use crate::command::{background_leftover, outcome_text, stubborn_tree, GENEROUS_MS, SHORT_MS};
use crate::fault::{phase_name, FaultPoint};
use crate::procs::unique_marker;
use crate::scenarios::{expect_refused, not_observable, succeeded, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// How long a command the backend started may take to reach its marked
/// process (bash starting under load) before "started" is doubted.
const MARKER_WAIT: Duration = Duration::from_secs(10);

/// Runs the scenario of `point` against `target`.
pub fn cleanup_failed(target: &Target, point: FaultPoint) -> Result<Verdict> {
    with_session(target, None, |s| {
        if !s.backend().supports(point) {
            return Ok(Verdict::NotApplicable(format!(
                "the {} backend cannot produce the fault {}",
                target.name(),
                point.name()
            )));
        }
        let marker = unique_marker();
        let mut notes = Vec::new();
        let poisoned = match point {
            FaultPoint::CommandCreationUnanswered
            | FaultPoint::CommandCreationServerError
            | FaultPoint::CommandTerminationFails
            | FaultPoint::CommandTerminationUnconfirmed
            | FaultPoint::CommandTerminationTimesOut
            | FaultPoint::CommandTerminationInvalidAnswer
            | FaultPoint::OutputStreamHangs => command_fault(s, point, &marker, &mut notes)?,
            FaultPoint::SandboxDeletionFails | FaultPoint::SandboxDeletionUnanswered => {
                deletion_fault(s, point, &marker)?
            }
            FaultPoint::OutputEvicted => {
                return Ok(Verdict::NotApplicable(
                    "output_evicted is not a cleanup fault: the output_lost scenario runs it"
                        .into(),
                ))
            }
            FaultPoint::SandboxCreationAmbiguous => match creation_fault(s)? {
                Some(record) => Some(record),
                None => {
                    notes.push(
                        "sweep: the creation left no sandbox id, so the lease is recorded \
                         `unknown` for a person to inspect (nothing to destroy it by)"
                            .into(),
                    );
                    return Ok(Verdict::Passed(notes));
                }
            },
        };
        let Some(poisoned) = poisoned else {
            // The provider proved the command's end itself (checked).
            return Ok(Verdict::Passed(notes));
        };
        swept(s, &poisoned, &marker, &mut notes)?;
        Ok(Verdict::Passed(notes))
    })
}

/// Checks that `failure` has the phase of `point` and names the sandbox.
fn check_failure(point: FaultPoint, failure: &CleanupFailure, sandbox: Option<&str>) -> Result<()> {
    ensure!(
        Some(failure.phase) == point.phase(),
        "{}: cleanup-failed in phase {}, expected {}",
        point.name(),
        phase_name(failure.phase),
        point.phase().map_or("none", phase_name)
    );
    if let Some(sandbox) = sandbox {
        ensure!(
            failure.sandbox_id.as_deref() == Some(sandbox),
            "{}: cleanup-failed names sandbox {:?}, the lease is {sandbox}",
            point.name(),
            failure.sandbox_id
        );
    }
    Ok(())
}

/// Checks that the lease is poisoned in the store and refused.
pub(crate) fn poisoned(s: &Session, lease_id: &str, point: FaultPoint) -> Result<LeaseRecord> {
    let record = s.record(lease_id)?;
    ensure!(
        record.state == LeaseState::Poisoned,
        "{}: after cleanup-failed the lease is {}, not poisoned",
        point.name(),
        record.state
    );
    expect_refused(s, lease_id, "a poisoned lease")?;
    Ok(record)
}

/// A command under a fault of its creation, termination or output stream.
/// Returns the poisoned lease, or `None` when the provider proved the
/// command's end itself (the hanging stream ended in a confirmed timeout,
/// or a doubtful creation was cleaned up with proof; checked here: nothing
/// left, lease usable).
fn command_fault(
    s: &Session,
    point: FaultPoint,
    marker: &str,
    notes: &mut Vec<String>,
) -> Result<Option<LeaseRecord>> {
    let lease = s.acquire()?;
    let sandbox = lease
        .lease
        .as_ref()
        .map(|l| l.provider_lease_id.clone())
        .context("an active lease has a sandbox")?;
    s.backend().inject(point)?;
    let creation = matches!(
        point,
        FaultPoint::CommandCreationUnanswered | FaultPoint::CommandCreationServerError
    );
    let request = ExecuteRequest {
        timeout_ms: Some(if creation { GENEROUS_MS } else { SHORT_MS }),
        result_chars: None,
        ..stubborn_tree(marker)
    };
    let outcome = s.execute(&lease.id, &request, None, CancelToken::new())?;
    match &outcome {
        Err(ProviderError::CleanupFailed(failure)) => {
            check_failure(point, failure, Some(&sandbox))?;
            if point == FaultPoint::CommandCreationUnanswered {
                // The command was started: the doubt was real. Its shell
                // may still be on its way to the marked process (a loaded
                // machine), so the marker is waited for, within a bound.
                let started = Instant::now();
                while let Some(alive) = s.survivors(marker) {
                    if !alive.is_empty() {
                        break;
                    }
                    ensure!(
                        started.elapsed() < MARKER_WAIT,
                        "{}: the backend started the command, yet no process carries its marker \
                         after {} s",
                        point.name(),
                        MARKER_WAIT.as_secs()
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            poisoned(s, &lease.id, point).map(Some)
        }
        Ok(result) if point == FaultPoint::OutputStreamHangs && result.timed_out => {
            ensure!(
                result.exit_code.is_none(),
                "a timed-out result has no exit code: {}",
                outcome_text(&outcome)
            );
            confirmed_end(s, &lease.id, marker, notes)?;
            Ok(None)
        }
        Err(error) if creation && !matches!(error, ProviderError::CleanupFailed(_)) => {
            // The provider resolved the doubt itself (it terminated what
            // may have started, with proof) and raised a typed error.
            notes.push(format!(
                "the provider confirmed its own cleanup of the doubtful creation and raised: {}",
                error_text(error)
            ));
            confirmed_end(s, &lease.id, marker, notes)?;
            Ok(None)
        }
        other => bail!(
            "{}: a command that may still run must end in cleanup-failed (phase {}){}; got {}",
            point.name(),
            point.phase().map_or("none", phase_name),
            match point {
                FaultPoint::OutputStreamHangs => " or a confirmed timeout",
                _ if creation => " or a typed error after a confirmed cleanup",
                _ => "",
            },
            outcome_text(other)
        ),
    }
}

/// The provider claimed the command's end with proof: with the fault gone,
/// nothing carrying `marker` is alive and the lease is active and usable.
pub(crate) fn confirmed_end(
    s: &Session,
    lease_id: &str,
    marker: &str,
    notes: &mut Vec<String>,
) -> Result<()> {
    s.backend().clear_faults();
    match s.survivors(marker) {
        Some(left) => ensure!(
            left.is_empty(),
            "the provider claimed the command ended, but these are alive: {left:?}"
        ),
        None => notes.push(not_observable("no survivor after the confirmed end")),
    }
    let state = s.state(lease_id)?;
    ensure!(
        state == LeaseState::Active,
        "a confirmed end leaves the lease active, it is {state}"
    );
    succeeded(
        "a command after the confirmed end",
        s.execute(
            lease_id,
            &crate::command::cmd("true", &[]),
            None,
            CancelToken::new(),
        )?,
    )?;
    Ok(())
}

/// A destroy under a fault of the sandbox's deletion, with a process left
/// running in the background by an earlier command.
fn deletion_fault(s: &Session, point: FaultPoint, marker: &str) -> Result<Option<LeaseRecord>> {
    let lease = s.acquire()?;
    let sandbox = lease
        .lease
        .as_ref()
        .map(|l| l.provider_lease_id.clone())
        .context("an active lease has a sandbox")?;
    succeeded(
        "a command leaving a background process",
        s.execute(
            &lease.id,
            &background_leftover(marker),
            None,
            CancelToken::new(),
        )?,
    )?;
    s.backend().inject(point)?;
    match s.runtime().destroy(s.env(), &lease.id)? {
        Err(ProviderError::CleanupFailed(failure)) => {
            check_failure(point, &failure, Some(&sandbox))?
        }
        Err(error) => bail!(
            "{}: an unconfirmed delete must be cleanup-failed, got {}",
            point.name(),
            error_text(&error)
        ),
        Ok(receipt) => bail!(
            "{}: destroy reported {} without proof",
            point.name(),
            sandbox_host::action_name(receipt.action)
        ),
    }
    poisoned(s, &lease.id, point).map(Some)
}

/// An acquire under an ambiguous sandbox creation. Returns the poisoned
/// lease when the provider knew the sandbox's id, `None` when it did not
/// (then the record must be `unknown` and refused).
fn creation_fault(s: &Session) -> Result<Option<LeaseRecord>> {
    let point = FaultPoint::SandboxCreationAmbiguous;
    s.backend().inject(point)?;
    let run_id = format!("kit-{}", unique_marker());
    let outcome = s.try_acquire(s.env(), &run_id)?;
    let failure = match outcome {
        Err(ProviderError::CleanupFailed(failure)) => failure,
        Err(error) => bail!(
            "{}: an ambiguous creation must be cleanup-failed, got {}",
            point.name(),
            error_text(&error)
        ),
        Ok(record) => bail!(
            "{}: acquire succeeded (lease {}) although the creation was never answered",
            point.name(),
            record.id
        ),
    };
    check_failure(point, &failure, None)?;
    let record = s
        .runtime()
        .store()
        .list()?
        .into_iter()
        .find(|r| r.run_id == run_id)
        .context("the failed acquire left no record in the lease store")?;
    match (&failure.sandbox_id, record.state) {
        (Some(_), LeaseState::Poisoned) => Ok(Some(poisoned(s, &record.id, point)?)),
        (None, LeaseState::Unknown) => {
            expect_refused(s, &record.id, "a lease whose creation is unknown")?;
            Ok(None)
        }
        (id, state) => bail!(
            "{}: cleanup-failed with sandbox id {id:?} left the lease {state}, expected poisoned \
             (with an id) or unknown (without)",
            point.name()
        ),
    }
}

/// With the fault gone, `sweep` destroys the poisoned lease and nothing
/// carrying `marker` is left.
pub(crate) fn swept(
    s: &Session,
    poisoned: &LeaseRecord,
    marker: &str,
    notes: &mut Vec<String>,
) -> Result<()> {
    s.backend().clear_faults();
    let report = s.runtime().sweep(s.env())?;
    let entry = report
        .iter()
        .find(|(record, _)| record.id == poisoned.id)
        .with_context(|| format!("sweep did not handle the poisoned lease {}", poisoned.id))?;
    if let Err(why) = &entry.1 {
        bail!("sweep could not destroy the poisoned lease: {why}");
    }
    let state = s.state(&poisoned.id)?;
    ensure!(
        state == LeaseState::Destroyed,
        "after sweep the lease is {state}, not destroyed"
    );
    match s.survivors(marker) {
        Some(left) => ensure!(
            left.is_empty(),
            "sweep destroyed the sandbox, but these are alive: {left:?}"
        ),
        None => notes.push(not_observable("no survivor after sweep")),
    }
    Ok(())
}
