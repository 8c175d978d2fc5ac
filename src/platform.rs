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

/// A response whose body is read as it arrives (`/connect`).
pub trait BodyReader {
    /// The next chunk of the body, `None` at its end. The wait's deadline
    /// and (when cancellable) the host's cancellation are checked before
    /// every chunk, so a body that never pauses still ends on time.
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

/// A scripted [`Platform`] for native unit tests: a virtual clock (a hang
/// jumps to the wait's deadline), recorded requests and output.
#[cfg(test)]
pub mod fake {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// What the fake answers to one request.
    pub enum Answer {
        /// Status and whole body.
        Full(u16, Vec<u8>),
        /// Status and body chunks (or errors); after the last one the body
        /// hangs until the wait's deadline.
        Stream(u16, Vec<Result<Vec<u8>, TransportError>>),
        /// The request fails.
        Fail(TransportError),
        /// No answer until the wait's deadline.
        Hang,
    }

    /// A JSend success answer.
    pub fn ok(data: serde_json::Value) -> Answer {
        Answer::Full(
            200,
            serde_json::json!({"status": "success", "data": data})
                .to_string()
                .into_bytes(),
        )
    }

    /// The fake platform.
    pub struct FakePlatform {
        clock: Rc<Cell<Instant>>,
        script: Box<dyn FnMut(&Request) -> Answer>,
        /// Every request, with the wait it was given.
        pub requests: Vec<(Request, Wait)>,
        /// Forwarded output.
        pub output: Vec<(StreamId, String)>,
        /// Cancel once the clock reaches this instant.
        pub cancel_at: Option<Instant>,
    }

    impl FakePlatform {
        /// A platform answering with `script`.
        pub fn new(script: impl FnMut(&Request) -> Answer + 'static) -> FakePlatform {
            FakePlatform {
                clock: Rc::new(Cell::new(1_000 * MS)),
                script: Box::new(script),
                requests: Vec::new(),
                output: Vec::new(),
                cancel_at: None,
            }
        }

        /// The requests as `METHOD path`.
        pub fn calls(&self) -> Vec<String> {
            self.requests
                .iter()
                .map(|(r, _)| format!("{:?} {}", r.method, r.path).to_uppercase())
                .collect()
        }

        fn answer(
            &mut self,
            request: &Request,
            wait: Wait,
        ) -> Result<(u16, FakeBody), TransportError> {
            self.requests.push((request.clone(), wait));
            let body = |chunks| FakeBody {
                clock: self.clock.clone(),
                chunks,
                cancel_at: self.cancel_at,
            };
            match (self.script)(request) {
                Answer::Full(status, bytes) => Ok((status, body(vec![Ok(bytes)]).ending())),
                Answer::Stream(status, chunks) => Ok((status, body(chunks))),
                Answer::Fail(error) => Err(error),
                Answer::Hang => {
                    self.clock.set(self.clock.get().max(wait.deadline));
                    Err(TransportError::Deadline)
                }
            }
        }
    }

    /// A body of scripted chunks; `None` marks its clean end.
    pub struct FakeBody {
        clock: Rc<Cell<Instant>>,
        chunks: Vec<Result<Vec<u8>, TransportError>>,
        cancel_at: Option<Instant>,
    }

    impl FakeBody {
        fn ending(mut self) -> FakeBody {
            self.chunks.push(Err(TransportError::Other("end".into())));
            self
        }
    }

    impl BodyReader for FakeBody {
        fn next_chunk(&mut self, wait: Wait) -> Result<Option<Vec<u8>>, TransportError> {
            if self.chunks.is_empty() {
                let cancel = self.cancel_at.filter(|_| wait.cancellable);
                match cancel {
                    Some(at) if at < wait.deadline => {
                        self.clock.set(self.clock.get().max(at));
                        return Err(TransportError::Cancelled);
                    }
                    _ => {
                        self.clock.set(self.clock.get().max(wait.deadline));
                        return Err(TransportError::Deadline);
                    }
                }
            }
            match self.chunks.remove(0) {
                Err(TransportError::Other(end)) if end == "end" => Ok(None),
                other => other.map(Some),
            }
        }
    }

    impl Platform for FakePlatform {
        fn now(&self) -> Instant {
            self.clock.get()
        }

        fn send(
            &mut self,
            request: &Request,
            wait: Wait,
            _max_body: usize,
        ) -> Result<Response, TransportError> {
            let (status, mut body) = self.answer(request, wait)?;
            let mut bytes = Vec::new();
            while let Some(chunk) = body.next_chunk(wait)? {
                bytes.extend(chunk);
            }
            Ok(Response {
                status,
                body: bytes,
            })
        }

        fn open(
            &mut self,
            request: &Request,
            wait: Wait,
        ) -> Result<(u16, Box<dyn BodyReader>), TransportError> {
            let (status, body) = self.answer(request, wait)?;
            Ok((status, Box::new(body)))
        }

        fn sleep_until(&mut self, until: Instant, wait: Wait) -> Result<(), TransportError> {
            if until > wait.deadline {
                self.clock.set(wait.deadline);
                return Err(TransportError::Deadline);
            }
            self.clock.set(self.clock.get().max(until));
            Ok(())
        }

        fn cancelled(&self) -> bool {
            self.cancel_at.is_some_and(|at| self.clock.get() >= at)
        }

        fn random_bytes(&mut self, len: usize) -> Vec<u8> {
            vec![0xab; len]
        }

        fn emit_output(&mut self, stream: StreamId, chunk: &str) {
            self.output.push((stream, chunk.to_string()));
        }
    }
}
