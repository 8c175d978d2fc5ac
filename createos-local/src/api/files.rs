//! `PUT/GET /v1/sandboxes/{id}/files?path=...`, confined to the sandbox root
//! (see [`crate::confine`]).

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncReadExt;

use super::envelope::{ok, ApiError};
use super::{sandbox, Shared, MAX_BODY};
use crate::confine::{self, PathError};

/// `?path=`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: Option<String>,
}

/// The answer to a refused or failed path.
pub(crate) fn path_error(e: PathError) -> ApiError {
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

fn required(q: PathQuery) -> Result<String, ApiError> {
    q.path
        .ok_or_else(|| ApiError::bad_request("query parameter path is required"))
}

/// Upload chunks in flight between the request body and the writing thread.
const UPLOAD_QUEUE: usize = 4;

/// Download chunk size.
const CHUNK: usize = 64 * 1024;

/// Feeds the chunks of a request body to [`confine::write_file`] on a
/// blocking thread; an `Err` item aborts the write (no file is left).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Err(e)) => return Err(e),
                Some(Ok(b)) => self.current = b,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("file uploads are limited to {MAX_BODY} bytes"),
    )
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

/// Streams `stream` into `path` inside `root` (see [`put_file`]): at most
/// [`MAX_BODY`] bytes, through a temporary file renamed over the target
/// when complete. Returns the number of bytes written.
pub(crate) async fn write_stream<S, E>(
    state: &super::AppState,
    root: std::path::PathBuf,
    path: String,
    mut stream: S,
) -> Result<usize, ApiError>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let slot = super::slot(&state.uploads, "uploads").await?;
    let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_QUEUE);
    let writer = tokio::task::spawn_blocking(move || {
        let mut reader = ChannelReader {
            rx,
            current: Bytes::new(),
        };
        let written = confine::write_file(&root, &path, &mut reader);
        drop(slot);
        written
    });
    let mut len = 0usize;
    let mut refused = None;
    loop {
        // A body that stalls gives its slot back: no chunk within the
        // body-read timeout ends the upload (nothing is written).
        let chunk = match tokio::time::timeout(state.body_read_timeout, stream.next()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(_) => {
                refused = Some(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!(
                        "the upload body stalled: no data for {} ms; nothing was written",
                        state.body_read_timeout.as_millis()
                    ),
                ));
                let _ = tx
                    .send(Err(std::io::Error::other("upload body stalled")))
                    .await;
                break;
            }
        };
        let item = match chunk {
            Ok(c) => {
                len += c.len();
                if len > MAX_BODY {
                    refused = Some(too_large());
                    Err(std::io::Error::other("upload over the size limit"))
                } else {
                    Ok(c)
                }
            }
            Err(e) => {
                refused = Some(ApiError::bad_request(format!(
                    "the upload body could not be read: {e}"
                )));
                Err(std::io::Error::other("upload body failed"))
            }
        };
        let stop = item.is_err();
        // A send error means the writer already failed; its error follows.
        if tx.send(item).await.is_err() || stop {
            break;
        }
    }
    drop(tx);
    let written = writer
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    if let Some(e) = refused {
        return Err(e);
    }
    written.map_err(path_error)?;
    Ok(len)
}

/// `GET .../files?path=`: the raw bytes (not an envelope), streamed in
/// chunks with the size as `Content-Length`. Only regular files are served;
/// a directory, FIFO, socket or device is a 400, decided without opening it
/// for reading (see [`confine::open_file`]).
pub async fn get_file(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let path = required(q)?;
    read_response(&state, sb.root.clone(), path).await
}

/// The download answer for `path` inside `root` (see [`get_file`]).
pub(crate) async fn read_response(
    state: &super::AppState,
    root: std::path::PathBuf,
    path: String,
) -> Result<Response, ApiError> {
    let (file, size) = super::blocking(state, move || confine::open_file(&root, &path))
        .await?
        .map_err(path_error)?;
    // Exactly `size` bytes: a file that shrinks meanwhile ends the body
    // short of its Content-Length, which the client sees as an error.
    let reader = tokio::fs::File::from_std(file).take(size);
    let stream = futures_util::stream::unfold(reader, |mut r| async move {
        let mut buf = vec![0u8; CHUNK];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
