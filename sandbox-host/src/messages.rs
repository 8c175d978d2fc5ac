//! Provider errors in words for people: what happened and what may still
//! run, never a Rust `Debug` name.

use crate::wasm::bindings::types::{
    CleanupCause, CleanupFailure, CleanupPhase, OutputLoss, ProviderError, TransportKind,
};

/// The `output-loss.operation` of output the host's own sink did not
/// consume (the host, not the provider, reports it).
pub const OUTPUT_SINK: &str = "output-sink";

/// One line about a provider error.
pub fn error_text(error: &ProviderError) -> String {
    match error {
        ProviderError::InvalidConfig(problems) => {
            format!("invalid config: {}", problems.join("; "))
        }
        ProviderError::InvalidRequest(why) => format!("invalid request: {why}"),
        ProviderError::ForeignLease(why) => {
            format!("the lease belongs to another provider or environment: {why}")
        }
        ProviderError::Unsupported(what) => format!("not supported: {what}"),
        ProviderError::ApiRejected(r) => {
            format!("the API refused {} (HTTP {})", r.operation, r.status)
        }
        ProviderError::TransportFailed(f) => {
            let how = match f.kind {
                TransportKind::Denied => "the host did not allow the request",
                TransportKind::Unreachable => "the server could not be reached (nothing was sent)",
                TransportKind::Connection => "the connection failed",
                TransportKind::Deadline => "the time allowed ran out",
                TransportKind::Other => "the request failed",
            };
            // The provider's detail already says it in words; the kind is
            // the fallback when it gave none.
            let detail = if f.detail.trim().is_empty() {
                how
            } else {
                f.detail.as_str()
            };
            format!("{} could not reach the API: {detail}", f.operation)
        }
        ProviderError::InvalidResponse(r) => {
            format!(
                "the API's answer to {} was not valid: {}",
                r.operation, r.reason
            )
        }
        ProviderError::Cancelled(_) => "cancelled; cleanup completed".to_owned(),
        ProviderError::CleanupFailed(failure) => cleanup_text(failure),
        ProviderError::OutputLost(loss) => loss_text(loss),
    }
}

/// What an output loss lost and what may still run, in words.
pub fn loss_text(loss: &OutputLoss) -> String {
    let amount = match (loss.lost_bytes, loss.lost_chunks) {
        (Some(bytes), _) => format!("{bytes} bytes of the command's output"),
        (None, Some(chunks)) => format!("{chunks} chunks of the command's output"),
        (None, None) => "part of the command's output (the server did not say how much)".to_owned(),
    };
    let process = match &loss.process_id {
        Some(id) => format!("process {id}"),
        None => "the command".to_owned(),
    };
    let after = if loss.tree_deleted {
        format!("{process} was stopped and all of its processes are confirmed gone")
    } else {
        format!(
            "stopping {process} was not confirmed, so part of it may still run: the lease is \
             not reused"
        )
    };
    if loss.operation == OUTPUT_SINK {
        let ended = if loss.partial.timed_out {
            "the command's timeout ended it"
        } else {
            "the command had ended"
        };
        return format!(
            "{amount} were not consumed: the host's output sink stopped taking output and \
             {ended}, so the live output is incomplete (the result keeps the last 4 Mi \
             characters of each stream); {after}"
        );
    }
    format!(
        "the server dropped {amount} before it was read ({} found the loss), so the output is \
         incomplete; what arrived before the loss is kept; {after}",
        loss.operation
    )
}

/// What a cleanup failure leaves behind, in words.
pub fn cleanup_text(failure: &CleanupFailure) -> String {
    let sandbox = match &failure.sandbox_id {
        Some(id) => format!("sandbox {id}"),
        None => "the sandbox".to_owned(),
    };
    let what = match (failure.phase, &failure.sandbox_id) {
        (CleanupPhase::ProcessCreation, _) => format!(
            "starting the command in {sandbox} got no clear answer, so the command may be running"
        ),
        (CleanupPhase::ProcessTermination, _) => format!(
            "stopping the command in {sandbox} was not confirmed, so part of it may still run"
        ),
        (CleanupPhase::LeaseSetup, None) => "creating a sandbox got no clear answer, so one may \
             exist that has no id to delete it by"
            .to_owned(),
        (CleanupPhase::LeaseSetup, Some(_)) => format!(
            "setting up {sandbox} failed and deleting it was not confirmed, so it may still exist"
        ),
        (CleanupPhase::SandboxDeletion, _) => {
            format!("deleting {sandbox} was not confirmed, so it may still exist and run")
        }
    };
    format!("{what} ({})", cause_text(&failure.cause))
}

fn cause_text(cause: &CleanupCause) -> String {
    match cause {
        CleanupCause::HttpStatus(status) => format!("the API answered HTTP {status}"),
        CleanupCause::Transport(detail) => format!("the request failed: {detail}"),
        CleanupCause::Deadline => "the request ran out of time".to_owned(),
        CleanupCause::TreeStillRunning => {
            "the API did not confirm that every process exited".to_owned()
        }
        CleanupCause::InvalidResponse(why) => format!("the API's answer was not valid: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wasm::bindings::types::{ApiRejection, PartialOutput, TransportFailure};

    #[test]
    fn no_message_carries_a_debug_name() {
        let errors = [
            ProviderError::CleanupFailed(CleanupFailure {
                sandbox_id: None,
                process_id: None,
                phase: CleanupPhase::LeaseSetup,
                cause: CleanupCause::Deadline,
                partial: None,
            }),
            ProviderError::CleanupFailed(CleanupFailure {
                sandbox_id: Some("sb-1".into()),
                process_id: Some("p".into()),
                phase: CleanupPhase::ProcessTermination,
                cause: CleanupCause::TreeStillRunning,
                partial: None,
            }),
            ProviderError::TransportFailed(TransportFailure {
                operation: "create-sandbox".into(),
                kind: TransportKind::Connection,
                detail: "connection refused".into(),
                partial: None,
            }),
            ProviderError::ApiRejected(ApiRejection {
                operation: "create-sandbox".into(),
                status: 401,
                partial: None,
            }),
            ProviderError::OutputLost(OutputLoss {
                operation: "connect".into(),
                process_id: Some("p".into()),
                lost_bytes: None,
                lost_chunks: Some(3),
                tree_deleted: false,
                partial: PartialOutput {
                    stdout: String::new(),
                    stderr: String::new(),
                    timed_out: false,
                    output_truncated: false,
                },
            }),
        ];
        for error in &errors {
            let text = error_text(error);
            for debug in [
                "CleanupPhase",
                "LeaseSetup",
                "ProcessTermination",
                "TreeStillRunning",
                "Deadline",
                "OutputLoss",
                "Some(",
                "Connection",
                "<unknown>",
                "::",
            ] {
                assert!(!text.contains(debug), "{text}");
            }
        }
    }
}
