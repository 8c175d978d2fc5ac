//! A scripted transport for tests: answers from a closure and records every
//! request it receives.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::network::body::ResponseBody;
use crate::network::transport::{
    ErrorCode, OutgoingRequest, Transport, TransportFuture, TransportResponse,
};

/// A request as the transport received it (after any [`Guard`](crate::Guard),
/// so with the injected secret header).
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The method.
    pub method: Method,
    /// The full URI, for example `http://127.0.0.1:9/v1/sandboxes?x=1`.
    pub uri: String,
    /// The path and query, for example `/v1/sandboxes?x=1`.
    pub path_and_query: String,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.path_and_query
            .split_once('?')
            .map_or(self.path_and_query.as_str(), |(path, _)| path)
    }

    /// The first value of header `name`, when it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text (lossy).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON, when it is JSON.
    pub fn body_json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// One step of a streamed body: wait `delay`, then send `data`.
#[derive(Clone, Debug)]
pub struct ScriptedChunk {
    /// How long to wait before this chunk.
    pub delay: Duration,
    /// The bytes.
    pub data: Bytes,
}

impl ScriptedChunk {
    /// A chunk sent at once.
    pub fn now(data: impl Into<Bytes>) -> Self {
        ScriptedChunk {
            delay: Duration::ZERO,
            data: data.into(),
        }
    }

    /// A chunk sent after `delay`.
    pub fn after(delay: Duration, data: impl Into<Bytes>) -> Self {
        ScriptedChunk {
            delay,
            data: data.into(),
        }
    }
}

/// What the script answers to one request.
pub enum ScriptedResponse {
    /// A complete response.
    Full {
        /// The status code.
        status: u16,
        /// The response headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Bytes,
    },
    /// A response whose body arrives in chunks over time and may end with an
    /// error (for example `ErrorCode::ConnectionTerminated` for a reset).
    Streamed {
        /// The status code.
        status: u16,
        /// The response headers.
        headers: Vec<(String, String)>,
        /// The chunks, in order.
        chunks: Vec<ScriptedChunk>,
        /// How the body ends: `None` cleanly, `Some(code)` with that error.
        end: Option<ErrorCode>,
    },
    /// A response with any body, for example one fed by
    /// [`ResponseBody::channel`] from the test.
    Body {
        /// The status code.
        status: u16,
        /// The response headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: ResponseBody,
    },
    /// The request fails at once with this error code.
    Error(ErrorCode),
    /// The request never completes (the guest's deadline must end it).
    Hang,
}

impl ScriptedResponse {
    /// A `Full` response with `content-type: application/json`.
    pub fn json(status: u16, body: impl fmt::Display) -> Self {
        ScriptedResponse::Full {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(body.to_string()),
        }
    }

    /// A JSend success envelope `{"status":"success","data":data}` with 200.
    pub fn jsend_success(data: serde_json::Value) -> Self {
        Self::json(
            200,
            serde_json::json!({ "status": "success", "data": data }),
        )
    }

    /// A `Full` response with an empty body.
    pub fn status(status: u16) -> Self {
        ScriptedResponse::Full {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A `Full` response with a text body and no content type.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        ScriptedResponse::Full {
            status,
            headers: Vec::new(),
            body: Bytes::from(body.into()),
        }
    }

    /// An NDJSON `Streamed` response (200, `application/x-ndjson`).
    pub fn ndjson(chunks: Vec<ScriptedChunk>, end: Option<ErrorCode>) -> Self {
        ScriptedResponse::Streamed {
            status: 200,
            headers: vec![("content-type".into(), "application/x-ndjson".into())],
            chunks,
            end,
        }
    }
}

impl fmt::Debug for ScriptedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScriptedResponse::Full { status, body, .. } => f
                .debug_struct("Full")
                .field("status", status)
                .field("body_len", &body.len())
                .finish(),
            ScriptedResponse::Streamed {
                status,
                chunks,
                end,
                ..
            } => f
                .debug_struct("Streamed")
                .field("status", status)
                .field("chunks", &chunks.len())
                .field("end", end)
                .finish(),
            ScriptedResponse::Body { status, .. } => {
                f.debug_struct("Body").field("status", status).finish()
            }
            ScriptedResponse::Error(code) => f.debug_tuple("Error").field(code).finish(),
            ScriptedResponse::Hang => f.write_str("Hang"),
        }
    }
}

type Script = dyn Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync;

/// A [`Transport`] that answers from a closure and records every request.
/// Clones share the script and the record.
#[derive(Clone)]
pub struct ScriptedTransport {
    script: Arc<Script>,
    log: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl ScriptedTransport {
    /// A transport answering each request with `script(&request)`.
    pub fn new(
        script: impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync + 'static,
    ) -> Self {
        ScriptedTransport {
            script: Arc::new(script),
            log: Arc::default(),
        }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the recorded requests.
    pub fn clear(&self) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// This transport as the trait object [`HostOptions`](crate::HostOptions) takes.
    pub fn shared(&self) -> Arc<dyn Transport> {
        Arc::new(self.clone())
    }
}

impl fmt::Debug for ScriptedTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedTransport")
            .field("requests", &self.requests().len())
            .finish_non_exhaustive()
    }
}

impl Transport for ScriptedTransport {
    fn send(&self, request: OutgoingRequest) -> TransportFuture {
        let recorded = RecordedRequest {
            method: request.method.clone(),
            uri: request.uri.to_string(),
            path_and_query: request
                .uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            headers: request.headers.clone(),
            body: request.body.clone(),
        };
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(recorded.clone());
        let answer = (self.script)(&recorded);
        Box::pin(async move {
            match answer {
                ScriptedResponse::Full {
                    status,
                    headers,
                    body,
                } => response(status, &headers, ResponseBody::full(body)),
                ScriptedResponse::Streamed {
                    status,
                    headers,
                    chunks,
                    end,
                } => {
                    let chunks = chunks.into_iter().map(|c| (c.delay, c.data)).collect();
                    response(status, &headers, ResponseBody::chunks(chunks, end))
                }
                ScriptedResponse::Body {
                    status,
                    headers,
                    body,
                } => response(status, &headers, body),
                ScriptedResponse::Error(code) => Err(code),
                ScriptedResponse::Hang => std::future::pending().await,
            }
        })
    }
}

fn response(
    status: u16,
    headers: &[(String, String)],
    body: ResponseBody,
) -> Result<TransportResponse, ErrorCode> {
    let status = StatusCode::from_u16(status)
        .map_err(|_| ErrorCode::InternalError(Some(format!("scripted status {status}"))))?;
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ErrorCode::InternalError(Some(format!("scripted header {name:?}"))))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| ErrorCode::InternalError(Some(format!("scripted header {name}"))))?;
        map.append(name, value);
    }
    Ok(TransportResponse {
        status,
        headers: map,
        body,
    })
}
