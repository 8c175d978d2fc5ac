//! How API failures map onto the contract's error cases, the same way for
//! every provider, and the receipts and reports that say what a cleanup
//! or a probe proved.
//!
//! Nothing here puts a response body, a URL or a secret into an error: a
//! rejection carries the operation and the status only.

use crate::platform::TransportError;
use crate::types::{
    ApiRejection, CleanupCause, CleanupFailure, CleanupPhase, InvalidResponse, PartialOutput,
    ProbeReport, ProviderError, TerminationAction, TerminationReceipt, TransportFailure,
    TransportKind,
};

/// Why an API call did not give a valid success answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// A non-2xx answer (redirects included: they are never followed).
    Status(u16),
    /// No HTTP answer.
    Transport(TransportError),
    /// A 2xx answer that is not what the API documents (not JSON, a missing
    /// or invalid field).
    Invalid(String),
}

impl ApiError {
    /// True for a 404 (already gone).
    pub fn is_not_found(&self) -> bool {
        *self == ApiError::Status(404)
    }

    /// True when the request provably never reached the server (the host
    /// denied it, or the server could not be reached): whatever it asked
    /// for cannot have happened.
    pub fn never_sent(&self) -> bool {
        matches!(
            self,
            ApiError::Transport(TransportError::Denied(_) | TransportError::Unreachable(_))
        )
    }

    /// True when the request surely did nothing: it never reached the
    /// server, or the server refused it with a 4xx.
    pub fn is_definite(&self) -> bool {
        self.never_sent() || matches!(self, ApiError::Status(status) if *status < 500)
    }

    /// The contract error for a failed request that creates something (a
    /// sandbox, a process): a definite failure is the API's error; any
    /// other leaves something that may exist, so it is `cleanup-failed`
    /// (with `sandbox_id` when known).
    pub fn into_creation_error(
        self,
        operation: &str,
        sandbox_id: Option<&str>,
        phase: CleanupPhase,
    ) -> ProviderError {
        if self.is_definite() {
            self.into_provider_error(operation)
        } else {
            cleanup_failed(sandbox_id, phase, cleanup_cause(self))
        }
    }

    /// The contract error for a failure that leaves nothing running.
    pub fn into_provider_error(self, operation: &str) -> ProviderError {
        match self {
            ApiError::Status(status) => ProviderError::ApiRejected(ApiRejection {
                operation: operation.to_string(),
                status,
                partial: None,
            }),
            ApiError::Transport(TransportError::Cancelled) => ProviderError::Cancelled(None),
            ApiError::Transport(error) => ProviderError::TransportFailed(TransportFailure {
                operation: operation.to_string(),
                kind: match &error {
                    TransportError::Denied(_) => TransportKind::Denied,
                    TransportError::Unreachable(_) => TransportKind::Unreachable,
                    TransportError::Connection(_) => TransportKind::Connection,
                    TransportError::Deadline => TransportKind::Deadline,
                    _ => TransportKind::Other,
                },
                detail: error.to_string(),
                partial: None,
            }),
            ApiError::Invalid(reason) => ProviderError::InvalidResponse(InvalidResponse {
                operation: operation.to_string(),
                reason,
                partial: None,
            }),
        }
    }
}

/// Attaches what a command printed to an error raised after its process
/// existed (and its termination was confirmed). Errors that cannot carry
/// output, or already carry it, are returned as they are.
pub fn with_partial(error: ProviderError, output: PartialOutput) -> ProviderError {
    match error {
        ProviderError::ApiRejected(mut r) => {
            r.partial = Some(output);
            ProviderError::ApiRejected(r)
        }
        ProviderError::TransportFailed(mut f) => {
            f.partial = Some(output);
            ProviderError::TransportFailed(f)
        }
        ProviderError::InvalidResponse(mut r) => {
            r.partial = Some(output);
            ProviderError::InvalidResponse(r)
        }
        ProviderError::Cancelled(_) => ProviderError::Cancelled(Some(output)),
        other => other,
    }
}

/// No output: what a command that never ran printed.
pub fn empty_output() -> PartialOutput {
    PartialOutput {
        stdout: String::new(),
        stderr: String::new(),
        timed_out: false,
        output_truncated: false,
    }
}

/// `cleanup-failed` for a command: its process (when known) may still run
/// in sandbox `sandbox_id`; `partial` is what it printed.
pub fn command_cleanup_failed(
    sandbox_id: &str,
    process_id: Option<&str>,
    phase: CleanupPhase,
    cause: CleanupCause,
    partial: PartialOutput,
) -> ProviderError {
    ProviderError::CleanupFailed(CleanupFailure {
        sandbox_id: Some(sandbox_id.to_string()),
        process_id: process_id.map(str::to_string),
        phase,
        cause,
        partial: Some(partial),
    })
}

/// A provider that deletes sandboxes by id, and the rules that follow: a
/// delete proves its receipt or is `cleanup-failed`.
pub trait DeleteSandbox {
    /// Deletes sandbox `id` (a fresh budget, not cancellable): what it
    /// proved, or why nothing is confirmed.
    fn delete_sandbox(&mut self, id: &str) -> Result<TerminationAction, CleanupCause>;

    /// Deletes sandbox `id`: its receipt, or `cleanup-failed` in phase
    /// `sandbox-deletion`.
    fn destroy_sandbox(&mut self, id: &str) -> Result<TerminationReceipt, ProviderError> {
        let deleted = self.delete_sandbox(id);
        deletion_receipt(id, deleted)
    }

    /// After `error` in a step that left sandbox `id`: deletes it, and
    /// gives `error` once that is confirmed, otherwise `cleanup-failed` in
    /// `phase`.
    fn undo_sandbox(
        &mut self,
        error: ProviderError,
        id: &str,
        phase: CleanupPhase,
    ) -> ProviderError {
        let deleted = self.delete_sandbox(id);
        after_delete(error, id, phase, deleted)
    }
}

/// `cleanup-failed`: something may still exist or run.
pub fn cleanup_failed(
    sandbox_id: Option<&str>,
    phase: CleanupPhase,
    cause: CleanupCause,
) -> ProviderError {
    ProviderError::CleanupFailed(CleanupFailure {
        sandbox_id: sandbox_id.map(str::to_string),
        process_id: None,
        phase,
        cause,
        partial: None,
    })
}

/// `invalid-response`: an answer that is not what the API documents.
pub fn invalid_response(operation: &str, reason: &str) -> ProviderError {
    ApiError::Invalid(reason.into()).into_provider_error(operation)
}

/// The receipt of a terminated sandbox.
pub fn receipt(sandbox_id: &str, action: TerminationAction) -> TerminationReceipt {
    TerminationReceipt {
        sandbox_id: sandbox_id.to_string(),
        action,
    }
}

/// What a sandbox's delete proved: its receipt, or `cleanup-failed` in
/// phase `sandbox-deletion` (it may still exist).
pub fn deletion_receipt(
    sandbox_id: &str,
    deleted: Result<TerminationAction, CleanupCause>,
) -> Result<TerminationReceipt, ProviderError> {
    match deleted {
        Ok(action) => Ok(receipt(sandbox_id, action)),
        Err(cause) => Err(cleanup_failed(
            Some(sandbox_id),
            CleanupPhase::SandboxDeletion,
            cause,
        )),
    }
}

/// After `error` in a step that left sandbox `sandbox_id`, which was then
/// deleted (`deleted`): `error` once the delete is confirmed, otherwise
/// `cleanup-failed` in `phase`.
pub fn after_delete<T>(
    error: ProviderError,
    sandbox_id: &str,
    phase: CleanupPhase,
    deleted: Result<T, CleanupCause>,
) -> ProviderError {
    match deleted {
        Ok(_) => error,
        Err(cause) => cleanup_failed(Some(sandbox_id), phase, cause),
    }
}

/// A probe's report: `ok` when the marker command printed its marker in a
/// sandbox of `service` at `origin` that was then deleted.
pub fn probe_report(
    ok: bool,
    service: &str,
    origin: &str,
    diagnostics: Vec<String>,
) -> ProbeReport {
    ProbeReport {
        ok,
        summary: if ok {
            format!("{service} at {origin} created, ran and deleted a sandbox")
        } else {
            "the probe command did not print its marker".into()
        },
        diagnostics,
    }
}

/// Why a cleanup request did not confirm anything, for `cleanup-failed`.
pub fn cleanup_cause(error: ApiError) -> CleanupCause {
    match error {
        ApiError::Status(status) => CleanupCause::HttpStatus(status),
        ApiError::Transport(TransportError::Deadline) => CleanupCause::Deadline,
        ApiError::Transport(error) => CleanupCause::Transport(error.to_string()),
        ApiError::Invalid(reason) => CleanupCause::InvalidResponse(reason),
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn encode_query_value(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    encoded
}
