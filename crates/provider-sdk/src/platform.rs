//! The capabilities the protocol needs, as a trait: HTTP through the host,
//! a monotonic clock, randomness, live output, cancellation, and the host's
//! events for an interactive process.
//!
//! The component implements it over WASI (`wasi_platform`); native unit
//! tests implement it with scripted answers.

use crate::origin::Origin;
use crate::types::InteractionEvent;

/// Which output stream a chunk of a command's output belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamId {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// An interactive process's terminal: one stream, what the command
    /// wrote to it and the terminal's echo of its input
    /// (`output-stream.terminal`).
    Terminal,
}

/// A point on the monotonic clock, in nanoseconds.
pub type Instant = u64;

/// One millisecond in [`Instant`] units.
pub const MS: u64 = 1_000_000;

/// HTTP methods a provider may use.
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

/// A request to one of the provider's API origins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The origin it goes to; `None` for the platform's default origin
    /// ([`Platform::set_default_origin`]).
    pub origin: Option<Origin>,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Headers besides the content type. Never a secret: the host injects
    /// those, and only for the origins the config names.
    pub headers: Vec<(String, String)>,
    /// The body and its content type, if any (an empty content type adds
    /// no header: give it in `headers` when it is not a constant).
    pub body: Option<(&'static str, Vec<u8>)>,
}

impl Request {
    /// A request without body to the default origin.
    pub fn new(method: Method, path: impl Into<String>) -> Request {
        Request {
            method,
            origin: None,
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// The same request with a body of `content_type`.
    pub fn with_body(mut self, content_type: &'static str, body: Vec<u8>) -> Request {
        self.body = Some((content_type, body));
        self
    }

    /// The same request with `body` as its JSON body.
    pub fn with_json(self, body: &serde_json::Value) -> Request {
        self.with_body("application/json", body.to_string().into_bytes())
    }

    /// The same request sent to `origin` instead of the default one.
    pub fn to_origin(mut self, origin: Origin) -> Request {
        self.origin = Some(origin);
        self
    }

    /// The same request with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
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

impl Wait {
    /// A wait of `ms` milliseconds from now.
    pub fn from_now(platform: &dyn Platform, ms: u64, cancellable: bool) -> Wait {
        Wait {
            deadline: platform.now().saturating_add(ms.saturating_mul(MS)),
            cancellable,
        }
    }
}

/// A request that did not produce an HTTP answer (or whose body broke).
///
/// [`Denied`](Self::Denied) and [`Unreachable`](Self::Unreachable) prove
/// that the request never reached the server; every other case leaves open
/// that it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The host's HTTP capability refused the request: it never left the host.
    Denied(String),
    /// The server could not be reached (DNS, connection refused or timed
    /// out, TLS failed before the request was written): it never reached
    /// the server.
    Unreachable(String),
    /// The connection broke after the request may have reached the server.
    Connection(String),
    /// The deadline passed (after the request may have been sent).
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
            TransportError::Unreachable(d) => {
                write!(f, "the server could not be reached ({d}); nothing was sent")
            }
            TransportError::Connection(d) => write!(f, "connection failed: {d}"),
            TransportError::Deadline => f.write_str("deadline exceeded"),
            TransportError::Cancelled => f.write_str("cancelled"),
            TransportError::TooLarge => f.write_str("response body too large"),
            TransportError::Other(d) => write!(f, "HTTP error: {d}"),
        }
    }
}

/// What [`BodyReader::next_chunk_or_event`] stopped waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyStep {
    /// The next chunk of the body.
    Chunk(Vec<u8>),
    /// The body ended.
    End,
    /// The host has an interaction event to take
    /// ([`Platform::next_interaction_event`]); the body is where it was.
    Event,
}

/// A response whose body is read as it arrives (`/connect`).
pub trait BodyReader {
    /// The next chunk of the body, `None` at its end. The wait's deadline
    /// and (when cancellable) the host's cancellation are checked before
    /// every chunk, so a body that never pauses still ends on time.
    fn next_chunk(&mut self, wait: Wait) -> Result<Option<Vec<u8>>, TransportError>;

    /// Like [`next_chunk`](Self::next_chunk), and also returns early, with
    /// [`BodyStep::Event`], as soon as the host has an interaction event
    /// for the running `interact` call: a provider follows an interactive
    /// process's output with it and carries out each event when it comes.
    /// Output that has already arrived comes first (a process's output is
    /// read before more input is written to it); otherwise an event
    /// waiting is reported at once. The
    /// default waits for the body only (a platform without events).
    fn next_chunk_or_event(&mut self, wait: Wait) -> Result<BodyStep, TransportError> {
        Ok(match self.next_chunk(wait)? {
            Some(chunk) => BodyStep::Chunk(chunk),
            None => BodyStep::End,
        })
    }
}

/// What [`Platform::open_with_header`] gives: the status, the header's
/// value, and a reader of the body.
pub type OpenedWithHeader = (u16, Option<String>, Box<dyn BodyReader>);

/// The capabilities the protocol runs on.
pub trait Platform {
    /// The origin of requests that name none (usually the config's API
    /// origin). Sending a request without any origin is a
    /// [`TransportError::Denied`]: nothing leaves the component.
    fn set_default_origin(&mut self, origin: Origin);
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
    /// Like [`Platform::open`], and also the value of the response header
    /// `name` (when present and valid UTF-8). The default reads no header.
    fn open_with_header(
        &mut self,
        request: &Request,
        wait: Wait,
        name: &str,
    ) -> Result<OpenedWithHeader, TransportError> {
        let _ = name;
        let (status, body) = self.open(request, wait)?;
        Ok((status, None, body))
    }
    /// Sleeps until `until` (or the wait's deadline, or cancellation).
    fn sleep_until(&mut self, until: Instant, wait: Wait) -> Result<(), TransportError>;
    /// True once the host has asked the operation to stop.
    fn cancelled(&self) -> bool;
    /// Random bytes for unique names.
    fn random_bytes(&mut self, len: usize) -> Vec<u8>;
    /// Forwards output to the host while a command runs: the bytes the
    /// command printed, as they are (`host.emit-output`).
    fn emit_output(&mut self, stream: StreamId, chunk: &[u8]);
    /// Tells the host the id of a sandbox this operation just created,
    /// before anything else is done with it (`host.record-sandbox`).
    fn record_sandbox(&mut self, sandbox_id: &str);
    /// Tells the host that the running `interact` call's process exists
    /// and takes events (`host.interaction-started`); called once, before
    /// the first [`next_interaction_event`](Self::next_interaction_event).
    /// The default does nothing (a platform without interactions).
    fn interaction_started(&mut self) {}
    /// Takes the host's next event for the running interactive process,
    /// `None` when there is none now (`host.next-interaction-event`); it
    /// never waits. [`BodyReader::next_chunk_or_event`] is how to wait for
    /// one. The default has none.
    fn next_interaction_event(&mut self) -> Option<InteractionEvent> {
        None
    }
}

/// A random lowercase hex string of `bytes` bytes.
pub fn random_hex(platform: &mut dyn Platform, bytes: usize) -> String {
    platform
        .random_bytes(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
