//! `PUT/GET /v1/sandboxes/{id}/files?path=...`, confined to the sandbox root
//! (see [`crate::confine`]).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::envelope::{ok, ApiError};
use super::{sandbox, Shared};
use crate::confine::{self, PathError};

/// `?path=`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: Option<String>,
}

fn path_error(e: PathError) -> ApiError {
    match e {
        PathError::Invalid(why) => ApiError::bad_request(why),
        PathError::SystemDir => ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only_system_dir",
            "host system directories are read-only in the local backend",
        ),
        PathError::NotFound => ApiError::not_found("file"),
        PathError::NotAFile => ApiError::bad_request("not a regular file"),
        PathError::Io(msg) => ApiError::internal(format!("file I/O failed: {msg}")),
    }
}

fn required(q: PathQuery) -> Result<String, ApiError> {
    q.path
        .ok_or_else(|| ApiError::bad_request("query parameter path is required"))
}

/// `PUT .../files?path=`: writes the raw body, creating parents.
pub async fn put_file(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let path = required(q)?;
    let root = sb.root.clone();
    let p = path.clone();
    let len = body.len();
    tokio::task::spawn_blocking(move || confine::write_file(&root, &p, &body))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(path_error)?;
    Ok(ok(json!({ "path": path, "bytes": len })))
}

/// `GET .../files?path=`: the raw bytes (not an envelope).
pub async fn get_file(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let path = required(q)?;
    let root = sb.root.clone();
    let data = tokio::task::spawn_blocking(move || confine::read_file(&root, &path))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(path_error)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}
