//! File uploads and downloads as both faces stream them, confined to the
//! sandbox root (see [`crate::storage::sandbox_paths`]): a body streamed through a
//! bounded pool to a temporary file, a file streamed back in chunks.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use super::error::{path_error, ApiError};
use super::limits::MAX_BODY;
use super::state::{blocking, slot, AppState};
use crate::storage::sandbox_paths;

/// Upload chunks in flight between the request body and the writing thread.
const UPLOAD_QUEUE: usize = 4;

/// Download chunk size.
const CHUNK: usize = 64 * 1024;

/// Feeds the chunks of a request body to [`sandbox_paths::write_file`] on a
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

/// 413 for an upload over [`MAX_BODY`].
pub fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("file uploads are limited to {MAX_BODY} bytes"),
    )
}

/// Streams `stream` into `path` inside `root` (the CreateOS `PUT .../files`, the Daytona uploads): at most
/// [`MAX_BODY`] bytes, through a temporary file renamed over the target
/// when complete. Returns the number of bytes written.
pub async fn write_stream<S, E>(
    state: &AppState,
    root: std::path::PathBuf,
    path: String,
    mut stream: S,
) -> Result<usize, ApiError>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let slot = slot(&state.uploads, "uploads").await?;
    let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_QUEUE);
    let writer = tokio::task::spawn_blocking(move || {
        let mut reader = ChannelReader {
            rx,
            current: Bytes::new(),
        };
        let written = sandbox_paths::write_file(&root, &path, &mut reader);
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

/// The download answer for `path` inside `root` (the CreateOS `GET .../files`, the Daytona download).
pub async fn read_response(
    state: &AppState,
    root: std::path::PathBuf,
    path: String,
) -> Result<Response, ApiError> {
    let (file, size) = blocking(state, move || sandbox_paths::open_file(&root, &path))
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
