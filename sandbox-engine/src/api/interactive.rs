//! Talking to a running managed process (issue 38): input bytes written
//! while it runs (`POST …/input`, as the service has it) and a terminal's
//! window size (`POST …/resize`, an engine extension: the service has no
//! resize its clients rely on).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::envelope::ok;
use super::process;
use crate::http::error::{parse_json, ApiError};
use crate::http::input::{input_error, too_large, INPUT_PATIENCE, MAX_INPUT};
use crate::http::state::{detached, Shared};
use crate::machine::pty::Winsize;
use crate::sandboxes::store::Status;
use crate::sandboxes::supervisor::ResizeError;

/// Body of `POST …/input`.
#[derive(Debug, Deserialize)]
pub struct InputBody {
    data_base64: Option<String>,
}

/// Body of `POST …/resize`.
#[derive(Debug, Deserialize)]
pub struct ResizeBody {
    cols: Option<u64>,
    rows: Option<u64>,
}

/// 409 while the sandbox is pausing, paused or resuming: the command
/// cannot read, and its stopped tree must not be woken behind the pause.
fn require_awake(sb: &crate::sandboxes::store::Sandbox, what: &str) -> Result<(), ApiError> {
    let status = sb.status();
    if matches!(status, Status::Pausing | Status::Paused | Status::Resuming) {
        return Err(ApiError::conflict(format!(
            "sandbox is {}; {what} is refused until it is resumed",
            json!(status)
        ))
        .with_extra(json!({ "current_status": status })));
    }
    Ok(())
}

/// `POST …/processes/{pid}/input {data_base64}`: writes the bytes to the
/// process's terminal (`pty`) or stdin pipe (`process`), in the order
/// requests arrive, and answers once all were written. Bytes are bytes: a
/// UTF-8 character may be split across requests, and control bytes (`^C`
/// is `\x03`) reach a terminal's line discipline as typed keys.
pub async fn input(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (sb, p) = process(&state, &id, &pid)?;
    let body: InputBody = parse_json(&body)?;
    let encoded = body
        .data_base64
        .ok_or_else(|| ApiError::bad_request("data_base64 is required"))?;
    if encoded.len() > base64::encoded_len(MAX_INPUT, true).unwrap_or(usize::MAX) {
        return Err(too_large(format!("about {}", encoded.len() / 4 * 3)));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(encoded.as_bytes())
        .map_err(|_| ApiError::bad_request("data_base64 is not standard padded base64"))?;
    if data.len() > MAX_INPUT {
        return Err(too_large(data.len()));
    }
    require_awake(&sb, "input")?;
    // Not cancelled with the request: a write cut off midway would lose
    // the process's stdin pipe.
    let writer = p.clone();
    let len = data.len();
    let written = detached(&state.supervision, async move {
        Ok(writer.write_input(&data, INPUT_PATIENCE).await)
    })
    .await?;
    match written {
        Ok(()) => Ok(ok(json!({ "process_id": p.id, "written": len }))),
        Err(e) => Err(input_error(e)),
    }
}

/// `POST …/processes/{pid}/resize {cols, rows}` (an engine extension):
/// sets a terminal's window size; the kernel sends `SIGWINCH` to the
/// terminal's foreground process group. 409 `not_a_terminal` for a pipe
/// process, 409 `process_exited` once the command has exited.
pub async fn resize(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (sb, p) = process(&state, &id, &pid)?;
    let body: ResizeBody = parse_json(&body)?;
    let (Some(cols), Some(rows)) = (body.cols, body.rows) else {
        return Err(ApiError::bad_request("cols and rows are required"));
    };
    let size = Winsize::new(cols, rows).map_err(|e| ApiError::bad_request(e.to_string()))?;
    require_awake(&sb, "a resize")?;
    match p.resize(size) {
        Ok(()) => Ok(ok(
            json!({ "process_id": p.id, "terminal": { "cols": size.cols, "rows": size.rows } }),
        )),
        Err(ResizeError::NotATerminal) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_a_terminal",
            "the process has pipes, not a terminal; only a process of kind \"pty\" has a size",
        )),
        Err(ResizeError::Exited) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "process_exited",
            "the command has exited",
        )),
        Err(ResizeError::Failed(why)) => Err(ApiError::internal(why)),
    }
}
