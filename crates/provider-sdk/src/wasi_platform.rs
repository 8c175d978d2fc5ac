//! [`Platform`] over the component's WASI imports: `wasi:http` for
//! requests, `wasi:clocks` for deadlines, `wasi:random`, and the host
//! interface for live output, cancellation and interaction events.
//!
//! Every wait polls the operation's pollable together with a deadline
//! pollable and, when cancellable, the host's cancellation pollable: no
//! busy-waiting, and a stuck server can never hold the component past its
//! deadline. A wait for an interactive process's output also polls the
//! host's `interaction-events`, so an event is carried out at once.

use crate::bindings::sandbox::provider::host;
use crate::bindings::wasi::clocks::monotonic_clock;
use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    http_error_code, ErrorCode, Fields, FutureIncomingResponse, IncomingBody, IncomingResponse,
    Method as HttpMethod, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::bindings::wasi::io::poll::{poll, Pollable};
use crate::bindings::wasi::io::streams::{InputStream, OutputStream, StreamError};
use crate::origin::Origin;
use crate::platform::{
    BodyReader, BodyStep, Instant, Method, OpenedWithHeader, Platform, Request, Response, StreamId,
    TransportError, Wait,
};

/// How many bytes are read from a body stream at a time.
const READ_CHUNK: u64 = 256 * 1024;

/// The platform of one operation.
pub struct WasiPlatform {
    default_origin: Option<Origin>,
    cancellation: Pollable,
}

impl Default for WasiPlatform {
    fn default() -> Self {
        Self::new()
    }
}

impl WasiPlatform {
    /// A platform with no default origin yet.
    pub fn new() -> WasiPlatform {
        WasiPlatform {
            default_origin: None,
            cancellation: host::cancellation(),
        }
    }

    fn request(
        &self,
        request: &Request,
    ) -> Result<(OutgoingRequest, Option<Vec<u8>>), TransportError> {
        let origin = request
            .origin
            .as_ref()
            .or(self.default_origin.as_ref())
            .ok_or_else(|| TransportError::Denied("the request names no API origin".into()))?;
        let headers = Fields::new();
        let invalid_header = |_| TransportError::Other("invalid request header".into());
        if let Some((content_type, _)) = request.body.as_ref().filter(|(t, _)| !t.is_empty()) {
            headers
                .append("content-type", content_type.as_bytes())
                .map_err(invalid_header)?;
        }
        for (name, value) in &request.headers {
            headers
                .append(name, value.as_bytes())
                .map_err(invalid_header)?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let method = match request.method {
            Method::Get => HttpMethod::Get,
            Method::Post => HttpMethod::Post,
            Method::Put => HttpMethod::Put,
            Method::Delete => HttpMethod::Delete,
        };
        let scheme = if origin.https {
            Scheme::Https
        } else {
            Scheme::Http
        };
        let invalid = |what: &str| TransportError::Other(format!("invalid request {what}"));
        outgoing
            .set_method(&method)
            .map_err(|()| invalid("method"))?;
        outgoing
            .set_scheme(Some(&scheme))
            .map_err(|()| invalid("scheme"))?;
        outgoing
            .set_authority(Some(&origin.authority))
            .map_err(|()| invalid("authority"))?;
        outgoing
            .set_path_with_query(Some(&request.path))
            .map_err(|()| invalid("path"))?;
        Ok((
            outgoing,
            request.body.as_ref().map(|(_, bytes)| bytes.clone()),
        ))
    }

    /// Sends a request and waits for the response head.
    fn start(&mut self, request: &Request, wait: Wait) -> Result<IncomingResponse, TransportError> {
        let (outgoing, body) = self.request(request)?;
        let outgoing_body = outgoing
            .body()
            .map_err(|()| TransportError::Other("request body unavailable".into()))?;
        let future = outgoing_handler::handle(outgoing, None).map_err(|code| error_code(&code))?;
        {
            let stream = outgoing_body
                .write()
                .map_err(|()| TransportError::Other("request body stream unavailable".into()))?;
            if let Some(bytes) = &body {
                self.write_all(&stream, bytes, wait)?;
            }
        }
        OutgoingBody::finish(outgoing_body, None).map_err(|code| error_code(&code))?;
        self.await_response(&future, wait)
    }

    fn write_all(
        &self,
        stream: &OutputStream,
        mut bytes: &[u8],
        wait: Wait,
    ) -> Result<(), TransportError> {
        while !bytes.is_empty() {
            let permitted = stream.check_write().map_err(stream_error)?;
            if permitted == 0 {
                self.block_on(&stream.subscribe(), wait)?;
                continue;
            }
            let n = bytes
                .len()
                .min(usize::try_from(permitted).unwrap_or(usize::MAX));
            stream.write(&bytes[..n]).map_err(stream_error)?;
            bytes = &bytes[n..];
        }
        stream.flush().map_err(stream_error)?;
        loop {
            if stream.check_write().map_err(stream_error)? > 0 {
                return Ok(());
            }
            self.block_on(&stream.subscribe(), wait)?;
        }
    }

    fn await_response(
        &self,
        future: &FutureIncomingResponse,
        wait: Wait,
    ) -> Result<IncomingResponse, TransportError> {
        loop {
            match future.get() {
                Some(Ok(Ok(response))) => return Ok(response),
                Some(Ok(Err(code))) => return Err(error_code(&code)),
                Some(Err(())) => {
                    return Err(TransportError::Other("response already taken".into()))
                }
                None => self.block_on(&future.subscribe(), wait)?,
            }
        }
    }

    /// Blocks until `pollable` is ready, or the deadline passes, or (when
    /// cancellable) the host cancels.
    fn block_on(&self, pollable: &Pollable, wait: Wait) -> Result<(), TransportError> {
        block_on(pollable, &self.cancellation, wait)
    }
}

fn block_on(
    pollable: &Pollable,
    cancellation: &Pollable,
    wait: Wait,
) -> Result<(), TransportError> {
    block_on_or_event(pollable, cancellation, None, wait).map(|_| ())
}

/// Blocks until `pollable` is ready (`Ok(false)`), or `events` is
/// (`Ok(true)`), or the deadline passes, or (when cancellable) the host
/// cancels.
fn block_on_or_event(
    pollable: &Pollable,
    cancellation: &Pollable,
    events: Option<&Pollable>,
    wait: Wait,
) -> Result<bool, TransportError> {
    if wait.cancellable && cancellation.ready() {
        return Err(TransportError::Cancelled);
    }
    let deadline = monotonic_clock::subscribe_instant(wait.deadline);
    let mut set = vec![pollable, &deadline];
    let cancel_index = wait.cancellable.then(|| {
        set.push(cancellation);
        set.len() as u32 - 1
    });
    let events_index = events.map(|events| {
        set.push(events);
        set.len() as u32 - 1
    });
    let ready = poll(&set);
    if cancel_index.is_some_and(|i| ready.contains(&i)) {
        Err(TransportError::Cancelled)
    } else if ready.contains(&0) {
        Ok(false)
    } else if events_index.is_some_and(|i| ready.contains(&i)) {
        Ok(true)
    } else {
        Err(TransportError::Deadline)
    }
}

impl Platform for WasiPlatform {
    fn set_default_origin(&mut self, origin: Origin) {
        self.default_origin = Some(origin);
    }

    fn now(&self) -> Instant {
        monotonic_clock::now()
    }

    fn send(
        &mut self,
        request: &Request,
        wait: Wait,
        max_body: usize,
    ) -> Result<Response, TransportError> {
        let response = self.start(request, wait)?;
        let status = response.status();
        let mut reader = WasiBody::new(response, self.cancellation_handle())?;
        let mut body = Vec::new();
        while let Some(chunk) = reader.next_chunk(wait)? {
            if body.len() + chunk.len() > max_body {
                return Err(TransportError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response { status, body })
    }

    fn open(
        &mut self,
        request: &Request,
        wait: Wait,
    ) -> Result<(u16, Box<dyn BodyReader>), TransportError> {
        let response = self.start(request, wait)?;
        let status = response.status();
        Ok((
            status,
            Box::new(WasiBody::new(response, self.cancellation_handle())?),
        ))
    }

    fn open_with_header(
        &mut self,
        request: &Request,
        wait: Wait,
        name: &str,
    ) -> Result<OpenedWithHeader, TransportError> {
        let response = self.start(request, wait)?;
        let status = response.status();
        let value = response
            .headers()
            .get(name)
            .into_iter()
            .find_map(|v| String::from_utf8(v).ok());
        Ok((
            status,
            value,
            Box::new(WasiBody::new(response, self.cancellation_handle())?),
        ))
    }

    fn sleep_until(&mut self, until: Instant, wait: Wait) -> Result<(), TransportError> {
        let timer = monotonic_clock::subscribe_instant(until.min(wait.deadline));
        self.block_on(&timer, wait)?;
        if until > wait.deadline {
            return Err(TransportError::Deadline);
        }
        Ok(())
    }

    fn cancelled(&self) -> bool {
        self.cancellation.ready()
    }

    fn random_bytes(&mut self, len: usize) -> Vec<u8> {
        crate::bindings::wasi::random::random::get_random_bytes(len as u64)
    }

    fn record_sandbox(&mut self, sandbox_id: &str) {
        host::record_sandbox(sandbox_id);
    }

    fn emit_output(&mut self, stream: StreamId, chunk: &[u8]) {
        let stream = match stream {
            StreamId::Stdout => host::OutputStream::Stdout,
            StreamId::Stderr => host::OutputStream::Stderr,
            StreamId::Terminal => host::OutputStream::Terminal,
        };
        host::emit_output(stream, chunk);
    }

    fn interaction_started(&mut self) {
        host::interaction_started();
    }

    fn next_interaction_event(&mut self) -> Option<crate::types::InteractionEvent> {
        host::next_interaction_event()
    }
}

impl WasiPlatform {
    /// A second handle on the cancellation signal, for a body reader that
    /// outlives this borrow.
    fn cancellation_handle(&self) -> Pollable {
        host::cancellation()
    }
}

/// A response body being read. Fields drop in order: the stream before the
/// body, the body before the response, as WASI requires of child resources.
struct WasiBody {
    stream: InputStream,
    _body: IncomingBody,
    _response: IncomingResponse,
    cancellation: Pollable,
    /// `host.interaction-events`, taken at the first wait that asks for it.
    events: Option<Pollable>,
}

impl WasiBody {
    fn new(response: IncomingResponse, cancellation: Pollable) -> Result<WasiBody, TransportError> {
        let body = response
            .consume()
            .map_err(|()| TransportError::Other("response body unavailable".into()))?;
        let stream = body
            .stream()
            .map_err(|()| TransportError::Other("response body stream unavailable".into()))?;
        Ok(WasiBody {
            stream,
            _body: body,
            _response: response,
            cancellation,
            events: None,
        })
    }
}

impl BodyReader for WasiBody {
    fn next_chunk(&mut self, wait: Wait) -> Result<Option<Vec<u8>>, TransportError> {
        self.read(wait, false).map(|step| match step {
            BodyStep::Chunk(bytes) => Some(bytes),
            _ => None,
        })
    }

    fn next_chunk_or_event(&mut self, wait: Wait) -> Result<BodyStep, TransportError> {
        self.read(wait, true)
    }
}

impl WasiBody {
    /// The next chunk, the end, or (with `events`) an event of the host.
    fn read(&mut self, wait: Wait, events: bool) -> Result<BodyStep, TransportError> {
        if events && self.events.is_none() {
            self.events = Some(host::interaction_events());
        }
        let events = self.events.as_ref().filter(|_| events);
        loop {
            // Checked before every chunk, not only when the stream is idle:
            // a server that streams without pause must still stop on time.
            if wait.cancellable && self.cancellation.ready() {
                return Err(TransportError::Cancelled);
            }
            if monotonic_clock::now() >= wait.deadline {
                return Err(TransportError::Deadline);
            }
            // Output that has arrived first: a process's output is read
            // before more input is written to it.
            match self.stream.read(READ_CHUNK) {
                Ok(bytes) if bytes.is_empty() => {
                    if events.is_some_and(|events| events.ready()) {
                        return Ok(BodyStep::Event);
                    }
                    let subscription = self.stream.subscribe();
                    if block_on_or_event(&subscription, &self.cancellation, events, wait)? {
                        return Ok(BodyStep::Event);
                    }
                }
                Ok(bytes) => return Ok(BodyStep::Chunk(bytes)),
                Err(StreamError::Closed) => return Ok(BodyStep::End),
                Err(StreamError::LastOperationFailed(error)) => return Err(body_error(&error)),
            }
        }
    }
}

/// A response body that broke: the request had reached the server.
fn body_error(error: &crate::bindings::wasi::io::error::Error) -> TransportError {
    match http_error_code(error) {
        Some(ErrorCode::HttpResponseBodySize(_)) => TransportError::TooLarge,
        Some(code) => match error_code(&code) {
            // A failure while reading the body comes after sending, whatever its code.
            TransportError::Unreachable(detail) | TransportError::Denied(detail) => {
                TransportError::Connection(detail)
            }
            other => other,
        },
        None => TransportError::Connection("the answer broke off".into()),
    }
}

fn stream_error(error: StreamError) -> TransportError {
    match error {
        StreamError::Closed => TransportError::Connection("the request body stream closed".into()),
        StreamError::LastOperationFailed(error) => match http_error_code(&error) {
            Some(code) => error_code(&code),
            None => TransportError::Connection("the request body could not be written".into()),
        },
    }
}

/// Maps a wasi-http error code to a transport error with a message for
/// people. Codes raised before the request was written (the host's denial,
/// DNS, connect, TLS) prove the request never reached the server; every
/// other code leaves open that it did.
fn error_code(code: &ErrorCode) -> TransportError {
    let unreachable = |what: &str| TransportError::Unreachable(what.to_string());
    let connection = |what: &str| TransportError::Connection(what.to_string());
    match code {
        ErrorCode::HttpRequestDenied => {
            TransportError::Denied("the host does not allow this request".into())
        }
        ErrorCode::DnsTimeout => unreachable("the DNS lookup timed out"),
        ErrorCode::DnsError(_) => unreachable("the DNS lookup failed"),
        ErrorCode::DestinationNotFound => unreachable("the destination was not found"),
        ErrorCode::DestinationUnavailable => unreachable("the destination is unavailable"),
        ErrorCode::DestinationIpProhibited => unreachable("the destination address is prohibited"),
        ErrorCode::DestinationIpUnroutable => unreachable("the destination address is unroutable"),
        ErrorCode::ConnectionRefused => unreachable("the connection was refused"),
        // A connect timeout: the connection (or the host's pacing before it)
        // never completed. The provider's own deadline is its pollable.
        ErrorCode::ConnectionTimeout => unreachable("the connection was not established in time"),
        ErrorCode::TlsProtocolError => unreachable("the TLS handshake failed"),
        ErrorCode::TlsCertificateError => {
            unreachable("the server's TLS certificate was not accepted")
        }
        ErrorCode::TlsAlertReceived(_) => {
            unreachable("the server refused the TLS handshake with an alert")
        }
        ErrorCode::HttpRequestUriInvalid => unreachable("the request URI is invalid"),
        ErrorCode::ConnectionTerminated => {
            connection("the connection closed before the answer was complete")
        }
        ErrorCode::ConnectionReadTimeout => connection("the answer did not start in time"),
        ErrorCode::ConnectionWriteTimeout => connection("the request could not be written in time"),
        ErrorCode::HttpResponseTimeout => connection("the answer did not arrive in time"),
        ErrorCode::ConnectionLimitReached => connection("the connection limit was reached"),
        ErrorCode::HttpResponseIncomplete => connection("the answer was incomplete"),
        ErrorCode::HttpProtocolError => connection("the server broke the HTTP protocol"),
        ErrorCode::HttpResponseBodySize(_) => TransportError::TooLarge,
        ErrorCode::InternalError(Some(message)) => TransportError::Other(format!(
            "the host's HTTP layer failed: {}",
            message.chars().take(200).collect::<String>()
        )),
        _ => TransportError::Other("the HTTP request failed".into()),
    }
}
