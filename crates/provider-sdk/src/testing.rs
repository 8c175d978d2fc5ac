//! A scripted [`Platform`] for providers' unit tests (native and wasm): a
//! virtual clock (a hang jumps to the wait's deadline), recorded requests
//! and output, and interaction events the host queues at given instants.
//! Enabled by the `testing` feature.

use crate::origin::Origin;
use crate::platform::*;
use crate::types::InteractionEvent;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

/// Interaction events and the instants the host queues them at, in order.
type EventQueue = Rc<RefCell<VecDeque<(Instant, InteractionEvent)>>>;

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

/// Where the fake clock starts.
const START: Instant = 1_000 * MS;

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
    /// The instants at which the provider said its interactive process had
    /// started (`host.interaction-started`).
    pub started: Vec<Instant>,
    /// The events queued with [`FakePlatform::queue_event`] not yet taken.
    events: EventQueue,
    /// The events the provider took, with the instant it took each.
    pub taken_events: Vec<(Instant, InteractionEvent)>,
}

impl FakePlatform {
    /// A platform answering with `script`.
    pub fn new(script: impl FnMut(&Request) -> Answer + 'static) -> FakePlatform {
        FakePlatform {
            clock: Rc::new(Cell::new(START)),
            script: Box::new(script),
            requests: Vec::new(),
            output: Vec::new(),
            cancel_at: None,
            default_origin: None,
            recorded_sandboxes: Vec::new(),
            started: Vec::new(),
            events: Rc::default(),
            taken_events: Vec::new(),
        }
    }

    /// Queues `event` for the interactive process at `after_ms`
    /// milliseconds after the clock's start, after the events queued
    /// before it: a body waited for with
    /// [`BodyReader::next_chunk_or_event`] reports it once the clock gets
    /// there (a body with nothing more to give jumps the clock to it).
    pub fn queue_event(&mut self, after_ms: u64, event: InteractionEvent) {
        let at = START + after_ms * MS;
        let mut events = self.events.borrow_mut();
        let at = events.back().map_or(at, |(last, _)| at.max(*last));
        events.push_back((at, event));
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
            events: self.events.clone(),
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
    events: EventQueue,
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

    fn next_chunk_or_event(&mut self, wait: Wait) -> Result<BodyStep, TransportError> {
        let next_event = self.events.borrow().front().map(|(at, _)| *at);
        if let (Some(at), true) = (next_event, self.chunks.is_empty()) {
            if at <= self.clock.get() {
                return Ok(BodyStep::Event);
            }
            let cancel = self.cancel_at.filter(|_| wait.cancellable);
            if at < wait.deadline && cancel.is_none_or(|c| at < c) {
                self.clock.set(at);
                return Ok(BodyStep::Event);
            }
        }
        Ok(match self.next_chunk(wait)? {
            Some(chunk) => BodyStep::Chunk(chunk),
            None => BodyStep::End,
        })
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

    fn interaction_started(&mut self) {
        self.started.push(self.clock.get());
    }

    fn next_interaction_event(&mut self) -> Option<InteractionEvent> {
        let mut events = self.events.borrow_mut();
        if events
            .front()
            .is_some_and(|(at, _)| *at <= self.clock.get())
        {
            let (_, event) = events.pop_front()?;
            self.taken_events.push((self.clock.get(), event.clone()));
            return Some(event);
        }
        None
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

/// A request to acquire a lease for run `run`, asking for nothing else
/// (no directory, workspace mode, expiry, policy, image or template).
pub fn acquire_request(run: &str) -> crate::types::AcquireRequest {
    crate::types::AcquireRequest {
        run_id: run.into(),
        requested_cwd: None,
        workspace_mode: None,
        requested_expires_at: None,
        egress: None,
        adapter_type: None,
        image: None,
        template: None,
    }
}

/// An interactive `bash` (no arguments, directory or environment) with a
/// terminal of `terminal` (pipes for none) and a 60 s limit.
pub fn bash_interaction(
    terminal: Option<crate::types::TerminalSize>,
) -> crate::types::InteractionRequest {
    crate::types::InteractionRequest {
        command: "bash".into(),
        args: vec![],
        cwd: None,
        env: vec![],
        terminal,
        timeout_ms: Some(60_000),
        result_chars: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{InteractionSignal, TerminalSize};
    use wasm_bindgen_test::wasm_bindgen_test;

    fn wait(platform: &FakePlatform, ms: u64) -> Wait {
        Wait::from_now(platform, ms, true)
    }

    /// A queued event is reported by a body wait once the clock reaches
    /// it: the chunks there are first, then the clock jumps to it; taken
    /// once, in order; an event past the deadline is not reported.
    #[wasm_bindgen_test(unsupported = test)]
    fn events_interrupt_a_body_wait_when_due() {
        let mut platform =
            FakePlatform::new(|_| Answer::Stream(200, vec![Ok(b"a".to_vec()), Ok(b"b".to_vec())]));
        platform.queue_event(5, InteractionEvent::Input(b"x".to_vec()));
        platform.queue_event(
            5,
            InteractionEvent::Resize(TerminalSize {
                columns: 100,
                rows: 30,
            }),
        );
        platform.queue_event(
            60_000,
            InteractionEvent::Signal(InteractionSignal::Interrupt),
        );
        let request = Request::new(Method::Get, "/connect");
        let (_, mut body) = platform.open(&request, wait(&platform, 1_000)).unwrap();
        let w = wait(&platform, 1_000);
        assert!(platform.next_interaction_event().is_none(), "not due yet");
        assert_eq!(
            body.next_chunk_or_event(w).unwrap(),
            BodyStep::Chunk(b"a".to_vec())
        );
        assert_eq!(
            body.next_chunk_or_event(w).unwrap(),
            BodyStep::Chunk(b"b".to_vec())
        );
        assert_eq!(body.next_chunk_or_event(w).unwrap(), BodyStep::Event);
        assert_eq!(platform.now(), START + 5 * MS);
        assert!(matches!(
            platform.next_interaction_event(),
            Some(InteractionEvent::Input(bytes)) if bytes == b"x"
        ));
        assert_eq!(body.next_chunk_or_event(w).unwrap(), BodyStep::Event);
        assert!(matches!(
            platform.next_interaction_event(),
            Some(InteractionEvent::Resize(TerminalSize {
                columns: 100,
                rows: 30
            }))
        ));
        assert!(platform.next_interaction_event().is_none());
        // The interrupt comes after the deadline: the wait ends at it.
        assert_eq!(body.next_chunk_or_event(w), Err(TransportError::Deadline));
        assert_eq!(platform.taken_events.len(), 2);
        platform.interaction_started();
        assert_eq!(platform.started, vec![platform.now()]);
    }
}
