//! The capabilities the protocol needs, as a trait: HTTP through the host,
//! a monotonic clock, randomness, live output and cancellation.
//!
//! The component implements it over WASI (`wasi_platform`); native unit
//! tests implement it with scripted answers.

use crate::frames::StreamId;

/// A point on the monotonic clock, in nanoseconds.
pub type Instant = u64;

/// One millisecond in [`Instant`] units.
pub const MS: u64 = 1_000_000;

/// HTTP methods the CreateOS API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
}

/// A request to the API origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// Path and query, starting with `/v1/`.
    pub path: String,
    /// The body and its content type, if any.
    pub body: Option<(&'static str, Vec<u8>)>,
}

/// A response with its whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The body bytes.
    pub body: Vec<u8>,
}

/// How long a wait may last and whether the host's cancellation ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The instant at which the wait gives up with [`TransportError::Deadline`].
    pub deadline: Instant,
    /// Whether a host cancellation ends it with [`TransportError::Cancelled`].
    /// Cleanup requests are not cancellable.
    pub cancellable: bool,
}

/// A request that did not produce an HTTP answer (or whose body broke).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The host's HTTP capability refused the request.
    Denied(String),
    /// The connection failed or broke.
    Connection(String),
    /// The deadline passed.
    Deadline,
    /// The host asked the operation to stop.
    Cancelled,
    /// The response body exceeded the size the provider accepts.
    TooLarge,
    /// Anything else the HTTP layer reported.
    Other(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Denied(d) => write!(f, "request denied by the host: {d}"),
            TransportError::Connection(d) => write!(f, "connection failed: {d}"),
            TransportError::Deadline => f.write_str("deadline exceeded"),
            TransportError::Cancelled => f.write_str("cancelled"),
            TransportError::TooLarge => f.write_str("response body too large"),
            TransportError::Other(d) => write!(f, "HTTP error: {d}"),
        }
    }
}

/// A response whose body is read as it arrives (`/connect`).
pub trait BodyReader {
    /// The next chunk of the body, `None` at its end.
    fn next_chunk(&mut self, wait: Wait) -> Result<Option<Vec<u8>>, TransportError>;
}

/// The capabilities the protocol runs on.
pub trait Platform {
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// Sends a request and reads its whole body (at most `max_body` bytes).
    fn send(
        &mut self,
        request: &Request,
        wait: Wait,
        max_body: usize,
    ) -> Result<Response, TransportError>;
    /// Sends a request and returns its status and a reader of its body.
    fn open(
        &mut self,
        request: &Request,
        wait: Wait,
    ) -> Result<(u16, Box<dyn BodyReader>), TransportError>;
    /// Sleeps until `until` (or the wait's deadline, or cancellation).
    fn sleep_until(&mut self, until: Instant, wait: Wait) -> Result<(), TransportError>;
    /// True once the host has asked the operation to stop.
    fn cancelled(&self) -> bool;
    /// Random bytes for unique names.
    fn random_bytes(&mut self, len: usize) -> Vec<u8>;
    /// Forwards decoded output to the host while a command runs.
    fn emit_output(&mut self, stream: StreamId, chunk: &str);
}

/// A random lowercase hex string of `bytes` bytes.
pub fn random_hex(platform: &mut dyn Platform, bytes: usize) -> String {
    platform
        .random_bytes(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
