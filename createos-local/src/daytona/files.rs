//! The toolbox face's file API: upload (multipart, field `file`),
//! download, create folder. Paths are confined to the sandbox root exactly
//! as in the CreateOS face's Files API (see [`crate::confine`]).

use axum::extract::{Multipart, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::TryStreamExt;
use serde::Deserialize;
use serde_json::json;

use super::error::DaytonaError;
use super::sandboxes::daytona_sandbox;
use crate::api::files::{path_error, read_response, write_stream};
use crate::api::Shared;

/// `?path=&mode=`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: Option<String>,
    mode: Option<String>,
}

fn required(q: &PathQuery) -> Result<String, DaytonaError> {
    q.path
        .clone()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| DaytonaError::bad_request("query parameter path is required"))
}

/// `POST /files/upload?path=` with a `multipart/form-data` body whose part
/// `file` is the content: 200 `{"path","bytes"}`. The part streams to a
/// temporary file that replaces the target when complete (parents are
/// created); at most 256 MiB.
pub async fn upload(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    mut form: Multipart,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let path = required(&q)?;
    loop {
        let field = tokio::time::timeout(state.body_read_timeout, form.next_field())
            .await
            .map_err(|_| {
                DaytonaError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!(
                        "the upload body stalled: no data for {} ms; nothing was written",
                        state.body_read_timeout.as_millis()
                    ),
                )
            })?
            .map_err(|e| {
                DaytonaError::bad_request(format!("the multipart body could not be read: {e}"))
            })?;
        let Some(field) = field else {
            return Err(DaytonaError::bad_request(
                "the multipart body has no part named \"file\"",
            ));
        };
        if field.name() != Some("file") {
            continue;
        }
        let stream = field.map_err(|e| e.body_text());
        let bytes =
            write_stream(&state, sb.core.root.clone(), path.clone(), Box::pin(stream)).await?;
        return Ok(Json(json!({ "path": path, "bytes": bytes })).into_response());
    }
}

/// `GET /files/download?path=`: the raw bytes (`application/octet-stream`,
/// with `Content-Length`); 404 when missing, 400 for a directory or other
/// non-regular file.
pub async fn download(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let path = required(&q)?;
    Ok(read_response(&state, sb.core.root.clone(), path).await?)
}

/// `POST /files/folder?path=&mode=0755`: 201; creates missing parents;
/// an existing directory is fine.
pub async fn create_folder(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let path = required(&q)?;
    let mode = match q.mode.as_deref() {
        None | Some("") => 0o755,
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                DaytonaError::bad_request(format!("mode {m:?} is not an octal file mode"))
            })?,
    };
    let root = sb.core.root.clone();
    crate::api::blocking(&state, move || {
        crate::confine::create_dir(&root, &path, mode)
    })
    .await?
    .map_err(path_error)?;
    Ok(StatusCode::CREATED.into_response())
}
