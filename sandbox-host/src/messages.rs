//! Provider errors in words for people: what happened and what may still
//! run, never a Rust `Debug` name.

use crate::bindings::types::{
    CleanupCause, CleanupFailure, CleanupPhase, ProviderError, TransportKind,
};

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
    }
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
    use crate::bindings::types::{ApiRejection, TransportFailure};

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
        ];
        for error in &errors {
            let text = error_text(error);
            for debug in [
                "CleanupPhase",
                "LeaseSetup",
                "ProcessTermination",
                "TreeStillRunning",
                "Deadline",
                "Connection",
                "<unknown>",
                "::",
            ] {
                assert!(!text.contains(debug), "{text}");
            }
        }
    }
}
