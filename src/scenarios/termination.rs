//! Ending a command that would not end: its timeout and its cancellation
//! both prove its whole tree gone (a tree that ignores SIGTERM, with a
//! background child), keep its partial output, and leave the lease usable.

use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Result};
use sandbox_host::types::{Capabilities, ExecuteRequest, OutputStream, ProviderError};
use sandbox_host::{CancelToken, LeaseState, OutputSink};

use crate::command::{cmd, outcome_text, stubborn_tree, SHORT_MS};
use crate::procs::{self, unique_marker};
use crate::scenarios::{not_observable, succeeded, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// Why a scenario that waits for `ready` through live output cannot run.
fn needs_live_output(session: &Session) -> Option<Verdict> {
    let live = session
        .runtime()
        .description()
        .capabilities
        .contains(Capabilities::INCREMENTAL_OUTPUT);
    (!live).then(|| {
        Verdict::NotApplicable(
            "the provider does not declare incremental-output, so the kit cannot see the \
             command's tree ready"
                .into(),
        )
    })
}

/// What the sink saw when the command said `ready`.
#[derive(Default)]
struct Readiness {
    stdout: String,
    /// Marked processes alive at `ready` (`None` before it, or when the
    /// backend's processes are not on this machine).
    alive: Option<usize>,
}

/// A sink that, once the command printed `ready`, counts the marked
/// processes (so the later "none left" scan is known to look at the right
/// ones) and cancels `cancel` if given.
fn ready_sink(
    session: &Session,
    marker: &str,
    cancel: Option<CancelToken>,
) -> (OutputSink, Arc<Mutex<Readiness>>) {
    let readiness = Arc::new(Mutex::new(Readiness::default()));
    let visible = session.backend().processes_on_this_machine();
    let sink: OutputSink = {
        let (readiness, marker) = (readiness.clone(), marker.to_owned());
        Arc::new(move |stream, chunk: &[u8]| {
            if stream != OutputStream::Stdout {
                return;
            }
            let mut seen = readiness.lock().unwrap_or_else(|e| e.into_inner());
            let was_ready = seen.stdout.contains("ready");
            // The marker is ASCII: a character cut between chunks only
            // changes what else this text shows.
            seen.stdout.push_str(&String::from_utf8_lossy(chunk));
            if !was_ready && seen.stdout.contains("ready") {
                if visible {
                    seen.alive = Some(procs::survivors(&marker).len());
                }
                if let Some(cancel) = &cancel {
                    cancel.cancel();
                }
            }
        })
    };
    (sink, readiness)
}

/// Checks that nothing carrying `marker` is left, that the scan saw the
/// tree alive at `ready`, and that the lease is still active and usable.
fn nothing_left(
    session: &Session,
    lease_id: &str,
    marker: &str,
    readiness: &Mutex<Readiness>,
    notes: &mut Vec<String>,
) -> Result<()> {
    match session.survivors(marker) {
        Some(left) => {
            ensure!(
                left.is_empty(),
                "the provider confirmed the end of the command, but these are alive: {left:?}"
            );
            let alive = readiness.lock().unwrap_or_else(|e| e.into_inner()).alive;
            ensure!(
                alive.is_some_and(|n| n > 0),
                "the scan for {marker} found nothing while the command ran ({alive:?}), so it \
                 proves nothing"
            );
        }
        None => notes.push(not_observable("no survivor")),
    }
    let state = session.state(lease_id)?;
    ensure!(
        state == LeaseState::Active,
        "a confirmed end must leave the lease active, it is {state}"
    );
    let again = succeeded(
        "a command after the confirmed end",
        session.execute(lease_id, &cmd("echo", &["again"]), None, CancelToken::new())?,
    )?;
    ensure!(again.stdout == "again\n", "echo again: {:?}", again.stdout);
    Ok(())
}

/// A SIGTERM-ignoring tree times out: `timed-out`, no exit code, its
/// partial output kept, nothing left.
pub fn timeout(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if let Some(not_applicable) = needs_live_output(s) {
            return Ok(not_applicable);
        }
        let lease = s.acquire()?;
        let marker = unique_marker();
        let (sink, readiness) = ready_sink(s, &marker, None);
        let request = ExecuteRequest {
            timeout_ms: Some(SHORT_MS),
            result_chars: None,
            ..stubborn_tree(&marker)
        };
        let outcome = s.execute(&lease.id, &request, Some(sink), CancelToken::new())?;
        match &outcome {
            Ok(result) if result.timed_out && result.exit_code.is_none() => {
                ensure!(
                    result.stdout == "ready\n",
                    "the timed-out result must keep the partial output `ready` (got {:?}); if \
                     the command never printed it, the machine was too slow for a {SHORT_MS} ms \
                     timeout",
                    result.stdout
                );
            }
            other => bail!(
                "a command that never ends with a {SHORT_MS} ms timeout: expected a confirmed \
                 timeout, got {}",
                outcome_text(other)
            ),
        }
        let mut notes = Vec::new();
        nothing_left(s, &lease.id, &marker, &readiness, &mut notes)?;
        Ok(Verdict::Passed(notes))
    })
}

/// A SIGTERM-ignoring tree cancelled by the host once it printed `ready`:
/// `cancelled` with the partial output, nothing left.
pub fn cancellation(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if let Some(not_applicable) = needs_live_output(s) {
            return Ok(not_applicable);
        }
        let lease = s.acquire()?;
        let marker = unique_marker();
        let token = CancelToken::new();
        let (sink, readiness) = ready_sink(s, &marker, Some(token.clone()));
        let outcome = s.execute(
            &lease.id,
            &stubborn_tree(&marker),
            Some(sink),
            token.clone(),
        )?;
        match &outcome {
            Err(ProviderError::Cancelled(Some(partial))) if partial.stdout == "ready\n" => {}
            other => bail!(
                "a command cancelled once it printed `ready`: expected `cancelled` with the \
                 partial output `ready`, got {}",
                outcome_text(other)
            ),
        }
        ensure!(token.is_cancelled(), "the command never printed `ready`");
        let mut notes = Vec::new();
        nothing_left(s, &lease.id, &marker, &readiness, &mut notes)?;
        Ok(Verdict::Passed(notes))
    })
}
