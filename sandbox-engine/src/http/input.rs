//! What both faces answer about input written to a running process
//! (issue 38): how much one request may carry, how long the command has
//! to take it, and the errors when it does not. The CreateOS face's
//! `…/input` ([`crate::api`]) and the Daytona face's session command
//! input ([`crate::daytona`]) use the same rules.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use super::error::ApiError;
use crate::sandboxes::supervisor::InputError;

/// The most input bytes one request carries (decoded): 1 MiB. A longer
/// paste is split by the client (the public CreateOS plugin sends at most
/// 256 KiB a request); one over the limit is refused whole (413).
pub const MAX_INPUT: usize = 1024 * 1024;

/// How long an input request waits for the command to take its bytes (a
/// command that does not read its input fills the pipe or the terminal's
/// queue): then 409 `input_blocked`, with how many bytes were written.
pub const INPUT_PATIENCE: Duration = Duration::from_secs(30);

/// 413 for input over [`MAX_INPUT`] (both faces).
pub fn too_large(len: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "input_too_large",
        format!(
            "the input is {len} bytes; at most {MAX_INPUT} are accepted in one request: \
             send it in parts, in order"
        ),
    )
    .with_extra(json!({ "max_bytes": MAX_INPUT }))
}

/// The answer to input that was not (wholly) written (both faces).
pub fn input_error(e: InputError) -> ApiError {
    match e {
        InputError::Closed => ApiError::new(
            StatusCode::CONFLICT,
            "stdin_closed",
            "the process's stdin was closed; it takes no more input",
        ),
        InputError::Exited { written } => ApiError::new(
            StatusCode::CONFLICT,
            "process_exited",
            "the command has exited or no longer reads its input",
        )
        .with_extra(json!({ "written": written })),
        InputError::Blocked { written } => ApiError::new(
            StatusCode::CONFLICT,
            "input_blocked",
            format!(
                "the command did not take its input within {} s; the first {written} bytes \
                 were written",
                INPUT_PATIENCE.as_secs()
            ),
        )
        .with_extra(json!({ "written": written })),
        InputError::Failed { written, reason } => ApiError::internal(format!(
            "the server could not write the input ({reason}); the first {written} bytes were \
             written"
        )),
    }
}
