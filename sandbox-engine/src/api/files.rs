//! `PUT/GET /v1/sandboxes/{id}/files?path=...`, confined to the sandbox root
//! (see [`crate::storage::sandbox_paths`]).

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::envelope::ok;
use super::sandbox;
use crate::http::error::ApiError;
use crate::http::files::{read_response, too_large, write_stream};
use crate::http::limits::MAX_BODY;
use crate::http::state::Shared;

/// `?path=`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: Option<String>,
}

fn required(q: PathQuery) -> Result<String, ApiError> {
    q.path
        .ok_or_else(|| ApiError::bad_request("query parameter path is required"))
}

/// `PUT .../files?path=`: writes the raw body, creating parents. The body
/// streams to a temporary file (a few chunks in memory at a time) that
/// replaces the target only when the whole body arrived within
/// [`MAX_BODY`]; a larger declared `Content-Length` is refused before
/// anything is read.
pub async fn put_file(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let path = required(q)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let len = write_stream(
        &state,
        sb.root.clone(),
        path.clone(),
        body.into_data_stream(),
    )
    .await?;
    Ok(ok(json!({ "path": path, "bytes": len })))
}

/// `GET .../files?path=`: the raw bytes (not an envelope), streamed in
/// chunks with the size as `Content-Length`. Only regular files are served;
/// a directory, FIFO, socket or device is a 400, decided without opening it
/// for reading (see [`crate::storage::sandbox_paths::open_file`]).
pub async fn get_file(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let path = required(q)?;
    read_response(&state, sb.root.clone(), path).await
}
