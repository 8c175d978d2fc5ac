//! `cleanup-failed`: every way termination or creation can go unconfirmed,
//! each with the partial output preserved, and cancellation.

use crate::support::*;
use sandbox_host::types::*;
use sandbox_host::{HostOptions, ScriptedResponse};
use serde_json::json;
use std::sync::Arc;

fn process_path() -> String {
    format!("/v1/sandboxes/{SANDBOX}/processes/{PROCESS}")
}

/// A command that prints `partial out`, times out after 300 ms, and whose
/// DELETE gets `delete`.
fn timed_out_with_delete(
    delete: impl Fn() -> ScriptedResponse + Send + Sync + 'static,
) -> (Fake, Result<ExecuteResult, ProviderError>) {
    let fake = Fake::with(move |req, _| {
        if req.path() == format!("{}/connect", process_path()) {
            return Some(hanging_connect("partial out"));
        }
        (req.method == "DELETE" && req.path() == process_path()).then(&delete)
    });
    let mut request = command("sleep", &["60"]);
    request.timeout_ms = Some(300);
    let outcome = fake.execute(&request);
    (fake, outcome)
}

fn expect_termination_failure(outcome: Result<ExecuteResult, ProviderError>) -> CleanupCause {
    match outcome {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.sandbox_id.as_deref(), Some(SANDBOX));
            assert_eq!(failure.process_id.as_deref(), Some(PROCESS));
            assert_eq!(failure.phase, CleanupPhase::ProcessTermination);
            let partial = failure.partial.expect("partial output");
            assert_eq!(partial.stdout, "partial out");
            assert!(partial.timed_out, "the command had timed out");
            assert_no_body(&failure.cause);
            failure.cause
        }
        other => panic!("expected cleanup-failed, got {other:?}"),
    }
}

#[test]
fn delete_500_is_a_cleanup_failure() {
    let (_, outcome) = timed_out_with_delete(|| error_answer(500));
    assert_matches_cause(expect_termination_failure(outcome), |c| {
        matches!(c, CleanupCause::HttpStatus(500))
    });
}

#[test]
fn delete_403_is_a_cleanup_failure() {
    let (_, outcome) = timed_out_with_delete(|| error_answer(403));
    assert_matches_cause(expect_termination_failure(outcome), |c| {
        matches!(c, CleanupCause::HttpStatus(403))
    });
}

#[test]
fn delete_transport_error_is_a_cleanup_failure() {
    let (_, outcome) =
        timed_out_with_delete(|| ScriptedResponse::Error(ErrorCode::ConnectionRefused));
    assert!(matches!(
        expect_termination_failure(outcome),
        CleanupCause::Transport(_)
    ));
}

#[test]
fn delete_deadline_is_a_cleanup_failure() {
    let (_, outcome) = timed_out_with_delete(|| ScriptedResponse::Hang);
    assert_matches_cause(expect_termination_failure(outcome), |c| {
        matches!(c, CleanupCause::Deadline)
    });
}

#[test]
fn tree_still_running_is_a_cleanup_failure() {
    let (_, outcome) =
        timed_out_with_delete(|| ScriptedResponse::jsend_success(json!({"tree_exited": false})));
    assert_matches_cause(expect_termination_failure(outcome), |c| {
        matches!(c, CleanupCause::TreeStillRunning)
    });
}

#[test]
fn missing_tree_exited_is_a_cleanup_failure() {
    let (_, outcome) =
        timed_out_with_delete(|| ScriptedResponse::jsend_success(json!({"state": "exited"})));
    assert_matches_cause(expect_termination_failure(outcome), |c| {
        matches!(c, CleanupCause::TreeStillRunning)
    });
}

#[test]
fn invalid_delete_json_is_a_cleanup_failure() {
    let (_, outcome) =
        timed_out_with_delete(|| ScriptedResponse::text(200, "SECRET-BODY-TEXT not json"));
    assert!(matches!(
        expect_termination_failure(outcome),
        CleanupCause::InvalidResponse(_)
    ));
    let (_, outcome) =
        timed_out_with_delete(|| ScriptedResponse::jsend_success(json!({"tree_exited": "yes"})));
    assert!(matches!(
        expect_termination_failure(outcome),
        CleanupCause::InvalidResponse(_)
    ));
}

#[test]
fn delete_404_confirms_termination() {
    let (_, outcome) = timed_out_with_delete(|| error_answer(404));
    let result = outcome.expect("a clean timed-out result");
    assert!(result.timed_out);
    assert_eq!(result.stdout, "partial out");
}

/// A creation that gets `answer`: the process may exist without an id.
fn ambiguous_creation(
    answer: impl Fn() -> ScriptedResponse + Send + Sync + 'static,
) -> CleanupCause {
    let fake = Fake::with(move |req, _| req.path().ends_with("/processes").then(&answer));
    let mut request = command("ls", &[]);
    request.stdin = Some(b"in".to_vec());
    match fake.execute(&request) {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.phase, CleanupPhase::ProcessCreation);
            assert_eq!(failure.sandbox_id.as_deref(), Some(SANDBOX));
            assert_eq!(failure.process_id, None);
            let partial = failure.partial.expect("partial output, empty");
            assert!(partial.stdout.is_empty() && !partial.timed_out);
            assert!(
                !fake.calls().iter().any(|c| c.contains("/connect")),
                "{:?}",
                fake.calls()
            );
            assert!(
                fake.calls().last().unwrap().ends_with("/exec"),
                "stdin removal still tried"
            );
            assert_no_body(&failure.cause);
            failure.cause
        }
        other => panic!("expected cleanup-failed, got {other:?}"),
    }
}

#[test]
fn creation_502_is_unconfirmed() {
    assert_matches_cause(ambiguous_creation(|| error_answer(502)), |c| {
        matches!(c, CleanupCause::HttpStatus(502))
    });
}

#[test]
fn creation_transport_error_is_unconfirmed() {
    assert!(matches!(
        ambiguous_creation(|| ScriptedResponse::Error(ErrorCode::ConnectionTerminated)),
        CleanupCause::Transport(_)
    ));
}

#[test]
fn creation_deadline_is_unconfirmed() {
    assert_matches_cause(ambiguous_creation(|| ScriptedResponse::Hang), |c| {
        matches!(c, CleanupCause::Deadline)
    });
}

#[test]
fn creation_with_an_invalid_id_is_unconfirmed() {
    for data in [
        json!({"process_id": "../escape"}),
        json!({"process_id": 7}),
        json!({}),
    ] {
        let cause = ambiguous_creation(move || ScriptedResponse::jsend_success(data.clone()));
        assert!(
            matches!(cause, CleanupCause::InvalidResponse(_)),
            "{cause:?}"
        );
    }
    let cause = ambiguous_creation(|| ScriptedResponse::text(201, "garbage"));
    assert!(matches!(cause, CleanupCause::InvalidResponse(_)));
}

/// Runs a command that prints and hangs; the host cancels as soon as the
/// first output arrives.
fn cancelled_during_connect(
    delete: ScriptedResponse,
) -> (Fake, Result<ExecuteResult, ProviderError>) {
    let delete = std::sync::Mutex::new(Some(delete));
    let fake = Fake::with(move |req, _| {
        if req.path() == format!("{}/connect", process_path()) {
            return Some(hanging_connect("working"));
        }
        if req.method == "DELETE" && req.path() == process_path() {
            return delete.lock().unwrap().take();
        }
        None
    });
    let token = fake.cancel.clone();
    let mut instance = component()
        .instantiate(
            HostOptions::new()
                .with_transport(fake.transport.shared())
                .with_cancel(token.clone())
                .with_output_sink(Arc::new(move |_, _| token.cancel())),
        )
        .unwrap();
    let outcome = instance
        .execute(&ctx(), &lease(), &command("sleep", &["600"]))
        .expect("no trap");
    (fake, outcome)
}

#[test]
fn cancellation_during_connect_deletes_before_returning_cancelled() {
    let (fake, outcome) = cancelled_during_connect(ScriptedResponse::jsend_success(
        json!({"tree_exited": true}),
    ));
    // Issue 9 item 10: the output printed before the cancellation is kept.
    match &outcome {
        Err(ProviderError::Cancelled(Some(partial))) => {
            assert_eq!(partial.stdout, "working");
            assert!(!partial.timed_out);
        }
        other => panic!("{other:?}"),
    }
    let calls = fake.calls();
    assert_eq!(
        calls.last().unwrap(),
        &format!("DELETE {}?grace_ms=1000", process_path()),
        "{calls:?}"
    );
}

#[test]
fn cancellation_with_a_failed_delete_is_a_cleanup_failure() {
    let (_, outcome) = cancelled_during_connect(error_answer(500));
    match outcome {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_matches_cause(failure.cause, |c| {
                matches!(c, CleanupCause::HttpStatus(500))
            });
            let partial = failure.partial.unwrap();
            assert_eq!(partial.stdout, "working");
            assert!(!partial.timed_out);
        }
        other => panic!("{other:?}"),
    }
}
