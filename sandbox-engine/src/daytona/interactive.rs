//! Talking to a running session command on the Daytona face (issue 38):
//! `POST T/process/session/{sid}/command/{cmdId}/input {"data"}` writes
//! the text to the command's stdin, as the real toolbox does for an
//! asynchronous command. The real service never closes that stdin (there
//! is no endpoint for it); neither does this one. Input goes through the
//! same writer as the CreateOS face's `…/input` (one request at a time, in
//! order, at most 1 MiB, 30 s for the command to take it).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::error::DaytonaError;
use super::sandboxes::daytona_sandbox;
use super::toolbox::{command_of, require_started, session_of};
use crate::http::error::parse_json;
use crate::http::input::{input_error, too_large, INPUT_PATIENCE, MAX_INPUT};
use crate::http::state::{detached, Shared};

/// Body of `…/command/{cmdId}/input`.
#[derive(Debug, Deserialize)]
pub struct InputBody {
    data: Option<String>,
}

/// `POST T/process/session/{sid}/command/{cmdId}/input {"data"}`: 200
/// with an empty body once every byte was written. 409 `stdin_closed` for
/// a synchronous command (its stdin reads end-of-file from the start), 409
/// `process_exited` once the command has exited.
pub async fn command_input(
    State(state): State<Shared>,
    Path((id, sid, cid)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    require_started(&sb)?;
    let session = session_of(&sb, &sid)?;
    let command = command_of(&session, &cid)?;
    let body: InputBody = parse_json(&body)?;
    let data = body
        .data
        .ok_or_else(|| DaytonaError::bad_request("data is required (the text to send)"))?;
    if data.len() > MAX_INPUT {
        return Err(too_large(data.len()).into());
    }
    let writer = command.process.clone();
    let written = detached(&state.supervision, async move {
        Ok(writer.write_input(data.as_bytes(), INPUT_PATIENCE).await)
    })
    .await?;
    match written {
        Ok(()) => Ok(StatusCode::OK.into_response()),
        Err(e) => Err(input_error(e).into()),
    }
}
