//! A scripted [`Platform`] for providers' unit tests (native and wasm): a
//! virtual clock (a hang jumps to the wait's deadline), recorded requests
//! and output. Enabled by the `testing` feature.

use crate::origin::Origin;
use crate::platform::*;
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

/// The fake platform.
pub struct FakePlatform {
    clock: Rc<Cell<Instant>>,
    script: Box<dyn FnMut(&Request) -> Answer>,
    /// Every request, with the wait it was given.
    pub requests: Vec<(Request, Wait)>,
    /// Forwarded output: each `emit-output` call's stream and bytes.
    pub output: Vec<(StreamId, Vec<u8>)>,
    /// Cancel once the clock reaches this instant.
    pub cancel_at: Option<Instant>,
    /// The default origin the provider set.
    pub default_origin: Option<Origin>,
    /// The sandbox ids recorded with the host, in order.
    pub recorded_sandboxes: Vec<String>,
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
            default_origin: None,
            recorded_sandboxes: Vec::new(),
        }
    }

    /// The bytes forwarded on `stream`, concatenated.
    pub fn output_bytes(&self, stream: StreamId) -> Vec<u8> {
        self.output
            .iter()
            .filter(|(s, _)| *s == stream)
            .flat_map(|(_, chunk)| chunk.iter().copied())
            .collect()
    }

    /// The requests as `METHOD path`.
    pub fn calls(&self) -> Vec<String> {
        self.requests
            .iter()
            .map(|(r, _)| format!("{:?} {}", r.method, r.path).to_uppercase())
            .collect()
    }

    fn answer(&mut self, request: &Request, wait: Wait) -> Result<(u16, FakeBody), TransportError> {
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
    fn set_default_origin(&mut self, origin: Origin) {
        self.default_origin = Some(origin);
    }

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

    fn record_sandbox(&mut self, sandbox_id: &str) {
        self.recorded_sandboxes.push(sandbox_id.to_string());
    }

    fn emit_output(&mut self, stream: StreamId, chunk: &[u8]) {
        self.output.push((stream, chunk.to_vec()));
    }
}

/// An environment context (company `co`, environment `env`) whose config
/// is `config`.
pub fn context(config: &str) -> crate::types::EnvironmentContext {
    crate::types::EnvironmentContext {
        driver_key: "test".into(),
        company_id: "co".into(),
        environment_id: "env".into(),
        issue_id: None,
        config: config.into(),
    }
}
