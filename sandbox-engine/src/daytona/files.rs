//! The toolbox face's file API: upload (multipart, field `file`),
//! download, create folder. Paths are confined to the sandbox root exactly
//! as in the CreateOS face's Files API (see [`crate::storage::sandbox_paths`]).

use std::collections::BTreeMap;

use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::TryStreamExt;
use serde::Deserialize;
use serde_json::json;

use super::error::DaytonaError;
use super::sandboxes::daytona_sandbox;
use crate::http::error::path_error;
use crate::http::files::{read_response, write_stream};
use crate::http::state::Shared;

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
    crate::http::state::blocking(&state, move || {
        crate::storage::sandbox_paths::create_dir(&root, &path, mode)
    })
    .await?
    .map_err(path_error)?;
    Ok(StatusCode::CREATED.into_response())
}

/// `POST /files/upload-v2?path=` (the endpoint of the current clients):
/// the body is the file, either `multipart/form-data` with a part `file`
/// or the raw bytes (for example `application/octet-stream`). Parents are
/// created, an existing file is replaced; 200 `{"path","bytes"}`.
pub async fn upload_v2(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    request: Request,
) -> Result<Response, DaytonaError> {
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if multipart {
        let form = Multipart::from_request(request, &state)
            .await
            .map_err(|e| DaytonaError::bad_request(e.body_text()))?;
        return upload(State(state), Path(id), Query(q), form).await;
    }
    let sb = daytona_sandbox(&state, &id)?;
    let path = required(&q)?;
    let stream = request.into_body().into_data_stream();
    let bytes = write_stream(&state, sb.core.root.clone(), path.clone(), stream).await?;
    Ok(Json(json!({ "path": path, "bytes": bytes })).into_response())
}

/// `POST /files/bulk-upload`: `multipart/form-data` whose parts come in
/// pairs, `files[i].path` (the destination) then `files[i].file` (the
/// content), as the SDK's `uploadFiles` sends them. Every file is written
/// like an upload; 200 once all are.
pub async fn bulk_upload(
    State(state): State<Shared>,
    Path(id): Path<String>,
    mut form: Multipart,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let mut paths: BTreeMap<String, String> = BTreeMap::new();
    let mut written = 0usize;
    while let Some(field) = form.next_field().await.map_err(|e| {
        DaytonaError::bad_request(format!("the multipart body could not be read: {e}"))
    })? {
        let name = field.name().unwrap_or_default().to_owned();
        if let Some(index) = name.strip_suffix(".path") {
            let path = field.text().await.map_err(|e| {
                DaytonaError::bad_request(format!("the multipart body could not be read: {e}"))
            })?;
            paths.insert(index.to_owned(), path);
        } else if let Some(index) = name.strip_suffix(".file") {
            let path = paths.get(index).cloned().ok_or_else(|| {
                DaytonaError::bad_request(format!(
                    "part {name:?} comes before its {index}.path part"
                ))
            })?;
            let stream = field.map_err(|e| e.body_text());
            write_stream(&state, sb.core.root.clone(), path, Box::pin(stream)).await?;
            written += 1;
        }
    }
    if written == 0 {
        return Err(DaytonaError::bad_request(
            "the multipart body has no files[i].path / files[i].file parts",
        ));
    }
    Ok(StatusCode::OK.into_response())
}

/// Body of `POST /files/bulk-download`.
#[derive(Debug, Deserialize)]
pub struct BulkDownloadBody {
    paths: Vec<String>,
}

/// The most one bulk download sends (the files are read into memory).
const MAX_BULK_DOWNLOAD: u64 = 256 * 1024 * 1024;

/// `POST /files/bulk-download {"paths":[...]}`: `multipart/form-data`
/// with one part per path, named `file` (its bytes) or `error` (a JSON
/// error for that path), the path as the part's `filename`, as the SDK's
/// `downloadFile(s)` reads it.
pub async fn bulk_download(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let body: BulkDownloadBody = crate::http::error::parse_json(&body)?;
    let root = sb.core.root.clone();
    let paths = body.paths;
    let parts = crate::http::state::blocking(&state, move || {
        let mut total = 0u64;
        paths
            .into_iter()
            .map(|path| {
                let read = crate::storage::sandbox_paths::open_file(&root, &path).and_then(
                    |(file, size)| {
                        total += size;
                        if total > MAX_BULK_DOWNLOAD {
                            return Err(crate::storage::sandbox_paths::PathError::Io(
                                "more than 256 MiB asked for in one bulk download".into(),
                            ));
                        }
                        let mut bytes = Vec::with_capacity(size as usize);
                        std::io::Read::read_to_end(
                            &mut std::io::Read::take(file, size),
                            &mut bytes,
                        )
                        .map_err(|e| crate::storage::sandbox_paths::PathError::Io(e.to_string()))?;
                        Ok(bytes)
                    },
                );
                (path, read)
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let boundary = format!("createos-local-{}", crate::util::random_hex(12));
    let mut out = Vec::new();
    for (path, read) in parts {
        let quoted = path.replace(['"', '\r', '\n'], "_");
        let (name, content_type, bytes) = match read {
            Ok(bytes) => ("file", "application/octet-stream", bytes),
            Err(e) => {
                let status = path_error(e).status;
                let error = json!({
                    "message": format!("cannot download {path}"),
                    "statusCode": status.as_u16(),
                    "code": status.canonical_reason().unwrap_or("error"),
                });
                ("error", "application/json", error.to_string().into_bytes())
            }
        };
        out.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{quoted}\"\r\n\
                 Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(&bytes);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={boundary}"),
        )],
        out,
    )
        .into_response())
}

/// `GET /files?path=DIR`: the directory's entries as the service lists
/// them (`name`, `isDir`, `size`, `modTime`, `mode`, `permissions`,
/// `owner`, `group`), symlinks not followed.
pub async fn list(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let path = required(&q)?;
    let root = sb.core.root.clone();
    let entries = crate::http::state::blocking(&state, move || {
        crate::storage::sandbox_paths::list_dir(&root, &path)
    })
    .await?
    .map_err(path_error)?;
    let files: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "isDir": e.is_dir,
                "size": e.size,
                "modTime": crate::util::rfc3339(e.modified),
                "mode": format!("{:o}", e.mode & 0o7777),
                "permissions": format!("{:o}", e.mode & 0o777),
                "owner": e.uid.to_string(),
                "group": e.gid.to_string(),
            })
        })
        .collect();
    Ok(Json(files).into_response())
}
