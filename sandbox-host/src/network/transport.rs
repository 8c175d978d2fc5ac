//! The pluggable HTTP capability: what the guest's `wasi:http` requests are
//! handed to once the body is collected.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};

pub use crate::network::body::{BodySender, ResponseBody};
/// The `wasi:http/types.error-code` a transport answers with; the guest
/// receives it unchanged.
pub use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;

/// Per-phase timeouts the guest asked for with `request-options`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestTimeouts {
    /// How long to wait for the connection.
    pub connect: Option<Duration>,
    /// How long to wait for the response head.
    pub first_byte: Option<Duration>,
    /// How long to wait between two frames of the response body.
    pub between_bytes: Option<Duration>,
}

/// One outgoing request of the guest, body already collected.
#[derive(Debug, Clone)]
pub struct OutgoingRequest {
    /// The method.
    pub method: Method,
    /// The absolute URI (scheme, authority, path and query).
    pub uri: Uri,
    /// The headers as the guest set them (plus `host`), and whatever a
    /// [`Guard`](crate::Guard) added.
    pub headers: HeaderMap,
    /// The whole request body.
    pub body: Bytes,
    /// The guest's per-phase timeouts (a guard clamps them).
    pub timeouts: RequestTimeouts,
    /// The instance's operation deadline, when it has one.
    pub deadline: Option<Instant>,
}

/// A response head and its (possibly streaming) body.
#[derive(Debug)]
pub struct TransportResponse {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body; it may yield chunks over time and end with an error.
    pub body: ResponseBody,
}

impl TransportResponse {
    /// A response with no headers.
    pub fn new(status: StatusCode, body: ResponseBody) -> Self {
        TransportResponse {
            status,
            headers: HeaderMap::new(),
            body,
        }
    }
}

/// What [`Transport::send`] returns. A future that never completes is a
/// valid answer (the guest's own deadline then decides).
pub type TransportFuture =
    Pin<Box<dyn Future<Output = Result<TransportResponse, ErrorCode>> + Send + 'static>>;

/// Carries a guest's HTTP request somewhere and brings back the answer.
///
/// Implementations: [`NetworkTransport`](crate::NetworkTransport) (real
/// network), `ScriptedTransport` (tests, feature `testing`),
/// [`DenyAll`] (the default), and [`Guard`](crate::Guard), which wraps any of
/// them with the allow-list, secret header, pacing and limits.
///
/// The returned future runs on wasmtime-wasi's tokio runtime, so it may use
/// `tokio::time` and `tokio::spawn`.
pub trait Transport: Send + Sync + 'static {
    /// Sends `request`.
    fn send(&self, request: OutgoingRequest) -> TransportFuture;
}

/// Refuses every request with `HTTP-request-denied`. The default transport,
/// right for `describe` and `validate-config`, which make no request.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenyAll;

impl Transport for DenyAll {
    fn send(&self, _request: OutgoingRequest) -> TransportFuture {
        Box::pin(async { Err(ErrorCode::HttpRequestDenied) })
    }
}
