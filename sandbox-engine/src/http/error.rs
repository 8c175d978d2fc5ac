//! The error answer both faces share, and the errors that mean the same in
//! both (a budget refusal, a process that could not start, a bad path or
//! body). Each face renders them in its own words.

use axum::http::StatusCode;
use serde_json::Value;

use crate::storage::sandbox_paths::PathError;

/// An error answer of either face, before a face renders it: the CreateOS
/// face as a JSend envelope (4xx `fail`, 5xx `error`, see
/// [`crate::api::envelope`]), the Daytona face as its NestJS-style body
/// (see [`crate::daytona::error`]).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Short machine-readable reason (`not_found`, `conflict`, …).
    pub reason: &'static str,
    /// Human-readable message (never contains secrets).
    pub message: String,
    /// Extra `data` fields for `fail` answers.
    pub extra: Option<Value>,
}

impl ApiError {
    /// An error with a status, reason and message.
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            extra: None,
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Adds `data` fields to a `fail` answer.
    pub fn with_extra(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }
}

/// 503 for a process the server could not start (see
/// [`crate::sandboxes::supervisor::Process::server_failure`]).
pub fn start_failed(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "start_failed", message)
}

/// The answer to a path the server could not resolve as the process's
/// cwd: 400 when the path itself is wrong, 500 when the server failed
/// (out of descriptors, I/O error).
pub fn cwd_error(cwd: &str, e: PathError) -> ApiError {
    match e {
        PathError::Io(msg) => ApiError::internal(format!(
            "the server could not open the working directory {cwd:?} ({msg}); nothing was started"
        )),
        other => ApiError::bad_request(format!("invalid cwd {cwd:?}: {other}")),
    }
}

/// A budget refusal (429), in either face.
pub fn over_budget(r: crate::trees::budgets::Refusal) -> ApiError {
    ApiError::new(r.status(), r.code, r.message)
}

/// The answer to a refused or failed path.
pub fn path_error(e: PathError) -> ApiError {
    match e {
        PathError::Invalid(why) => ApiError::bad_request(why),
        PathError::SystemDir => ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only_system_dir",
            "host system directories are read-only in the local backend",
        ),
        PathError::NotFound => ApiError::not_found("file"),
        PathError::NotAFile => ApiError::bad_request(
            "not a regular file (directories, FIFOs, sockets and devices cannot be read or replaced)",
        ),
        PathError::Io(msg) => ApiError::internal(format!("file I/O failed: {msg}")),
    }
}

/// Parses a JSON object body, answering 400 on malformed input and on any
/// other JSON value (serde would otherwise accept an array for a struct).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
