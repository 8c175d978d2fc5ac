//! The HTTP side of the benchmarks: the native baseline client, the
//! native run of the component's decoding code, and the transports that
//! record what the component sends (request starts, the DELETE of a
//! cancellation, the arrival of the exit frame).

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use createos_provider::frames::{parse_frame, ExitStatus, Frame, LineSplitter, StreamId};
use http::{Method, StatusCode};
use provider_sdk::output::Tail;
use sandbox_host::{
    ErrorCode, OutgoingRequest, ResponseBody, Transport, TransportFuture, TransportResponse,
};
use serde_json::Value;

/// How many bytes are read from a response body at a time: the component's
/// own `READ_CHUNK` (64 KiB).
pub const READ_CHUNK: usize = 64 * 1024;

/// The component's decoding of a `/connect` stream, run natively: the same
/// `frames` and `output` code, in the same order as `execute.rs` applies it
/// (line split, frame parse, replay skip, gap check, live sink of the
/// bytes, capped tail converted to text at the end).
#[derive(Default)]
pub struct Decoder {
    lines: LineSplitter,
    cursor: u64,
    stdout: Tail,
    stderr: Tail,
    /// Bytes handed to the live sink (the component's `emit-output`).
    pub emitted: u64,
    /// The exit status, once the exit frame came.
    pub exit: Option<ExitStatus>,
}

impl Decoder {
    /// Feeds one chunk of the body; `Ok(true)` once the exit frame came.
    pub fn push(&mut self, chunk: &[u8]) -> Result<bool, String> {
        for line in self.lines.push(chunk).map_err(|e| e.to_string())? {
            if self.line(&line)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The body ended: its last line without a newline, if any.
    pub fn end(&mut self) -> Result<bool, String> {
        match self.lines.finish() {
            Some(line) => self.line(&line),
            None => Ok(false),
        }
    }

    fn line(&mut self, line: &[u8]) -> Result<bool, String> {
        match parse_frame(line).map_err(|e| e.to_string())? {
            None | Some(Frame::Heartbeat) => Ok(false),
            Some(Frame::Exit(status)) => {
                self.exit = Some(status);
                Ok(true)
            }
            Some(Frame::Error(error)) => Err(format!("stream error: {error}")),
            Some(Frame::Data { seq, .. }) if seq <= self.cursor => Ok(false),
            Some(Frame::Data { seq, .. }) if seq != self.cursor + 1 => {
                Err(format!("sequence gap after {}", self.cursor))
            }
            Some(Frame::Data { seq, stream, bytes }) => {
                self.cursor = seq;
                let tail = match stream {
                    StreamId::Stdout | StreamId::Terminal => &mut self.stdout,
                    StreamId::Stderr => &mut self.stderr,
                };
                self.emitted += bytes.len() as u64;
                tail.push(&bytes);
                Ok(false)
            }
        }
    }

    /// Converts the tails to text and returns (stdout tail, stderr tail,
    /// truncated).
    pub fn finish(self) -> (String, String, bool) {
        let truncated = self.stdout.truncated() || self.stderr.truncated();
        (self.stdout.text(), self.stderr.text(), truncated)
    }
}

/// What the native client got for one command.
pub struct NativeOutcome {
    pub exit: Option<ExitStatus>,
    pub stdout: String,
    pub truncated: bool,
    pub emitted: u64,
}

/// The native baseline: a blocking Rust HTTP client (ureq) making the
/// requests the component makes for a command without stdin: `POST
/// /processes`, `GET .../connect?after=0` read to the exit frame.
pub struct NativeClient {
    agent: ureq::Agent,
    base: String,
    key: String,
}

impl NativeClient {
    /// `pooled = false` opens a new connection per request, as the host's
    /// wasi-http transport does; `true` keeps connections alive.
    pub fn new(base: &str, key: &str, pooled: bool) -> NativeClient {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)));
        if !pooled {
            config = config
                .max_idle_connections(0)
                .max_idle_connections_per_host(0);
        }
        NativeClient {
            agent: config.build().into(),
            base: base.to_string(),
            key: key.to_string(),
        }
    }

    fn post_json(&self, path: &str, body: Option<&str>) -> Result<Value, String> {
        let request = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("X-Api-Key", &self.key);
        let response = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .send(body.as_bytes()),
            None => request.send_empty(),
        }
        .map_err(|e| format!("POST {path}: {e}"))?;
        let status = response.status();
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| format!("POST {path}: {e}"))?;
        if status == StatusCode::CONFLICT {
            return Ok(Value::Null);
        }
        if !status.is_success() {
            return Err(format!("POST {path}: {status}"));
        }
        let envelope: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if envelope["status"] != "success" {
            return Err(format!("POST {path}: not a success envelope"));
        }
        Ok(envelope["data"].clone())
    }

    /// Opens `/connect?after=0` of a process and returns its body reader.
    fn connect(&self, sandbox: &str, process: &str) -> Result<impl Read, String> {
        let path = format!("/v1/sandboxes/{sandbox}/processes/{process}/connect?after=0");
        let response = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("X-Api-Key", &self.key)
            .call()
            .map_err(|e| format!("GET {path}: {e}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("GET {path}: {}", response.status()));
        }
        Ok(response.into_body().into_reader())
    }

    /// Runs one command given as the body of `POST /processes`.
    pub fn run(&self, sandbox: &str, create_body: &str) -> Result<NativeOutcome, String> {
        let created = self.post_json(
            &format!("/v1/sandboxes/{sandbox}/processes"),
            Some(create_body),
        )?;
        let process = created["process_id"]
            .as_str()
            .ok_or("no process_id")?
            .to_string();
        let mut reader = self.connect(sandbox, &process)?;
        let mut decoder = Decoder::default();
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let n = reader.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                decoder.end()?;
                break;
            }
            if decoder.push(&buf[..n])? {
                break;
            }
        }
        let exit = decoder.exit.clone();
        let emitted_before = decoder.emitted;
        let (stdout, _stderr, truncated) = decoder.finish();
        Ok(NativeOutcome {
            exit,
            stdout,
            truncated,
            emitted: emitted_before,
        })
    }

    /// Runs one command given as the body of `POST /processes` and returns
    /// its whole `/connect?after=0` body, read as the process's first
    /// reader (the engine drops frames its reader took, so a finished
    /// process's body cannot be read again from the start).
    pub fn record(&self, sandbox: &str, create_body: &str) -> Result<Vec<u8>, String> {
        let created = self.post_json(
            &format!("/v1/sandboxes/{sandbox}/processes"),
            Some(create_body),
        )?;
        let process = created["process_id"].as_str().ok_or("no process_id")?;
        let mut body = Vec::new();
        self.connect(sandbox, process)?
            .read_to_end(&mut body)
            .map_err(|e| e.to_string())?;
        Ok(body)
    }
}

/// The body of `POST /processes` the component sends for `request`.
pub fn create_body(request: &sandbox_host::types::ExecuteRequest) -> String {
    let guest = provider_sdk::types::ExecuteRequest {
        command: request.command.clone(),
        args: request.args.clone(),
        cwd: request.cwd.clone(),
        env: request.env.clone(),
        stdin: request.stdin.clone(),
        timeout_ms: request.timeout_ms,
        result_chars: request.result_chars,
    };
    serde_json::json!({
        "cmd": "/bin/bash",
        "args": ["-lc", provider_sdk::script::build(&guest, None)],
    })
    .to_string()
}

/// One request as a [`Recorder`] saw it (after the guard's pacing).
#[derive(Clone, Debug)]
pub struct Sent {
    pub at: Instant,
    pub method: Method,
    pub path: String,
}

/// Records the start of every request, then delegates. Put it *inside* a
/// guard so the times are the paced starts.
pub struct Recorder {
    inner: Arc<dyn Transport>,
    log: Arc<Mutex<Vec<Sent>>>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn Transport>) -> Recorder {
        Recorder {
            inner,
            log: Arc::default(),
        }
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.log.lock().unwrap().clone()
    }
}

impl Transport for Recorder {
    fn send(&self, request: OutgoingRequest) -> TransportFuture {
        self.log.lock().unwrap().push(Sent {
            at: Instant::now(),
            method: request.method.clone(),
            path: request.uri.path().to_string(),
        });
        self.inner.send(request)
    }
}

/// Sends everything through `inner` except `GET .../connect`, which it
/// carries itself (a ureq reader thread feeding a channel body) so it can
/// note when the chunk holding the exit frame arrived from the network.
pub struct ExitStamp {
    inner: Arc<dyn Transport>,
    stamps: Arc<Mutex<Vec<Instant>>>,
}

impl ExitStamp {
    pub fn new(inner: Arc<dyn Transport>) -> ExitStamp {
        ExitStamp {
            inner,
            stamps: Arc::default(),
        }
    }

    /// When the exit-frame chunks arrived, oldest first.
    pub fn stamps(&self) -> Vec<Instant> {
        self.stamps.lock().unwrap().clone()
    }
}

impl Transport for ExitStamp {
    fn send(&self, request: OutgoingRequest) -> TransportFuture {
        if request.method != Method::GET || !request.uri.path().ends_with("/connect") {
            return self.inner.send(request);
        }
        let stamps = self.stamps.clone();
        Box::pin(async move {
            let (head_tx, head_rx) = tokio::sync::oneshot::channel();
            let (sender, body) = ResponseBody::channel();
            std::thread::spawn(move || forward(request, head_tx, sender, stamps));
            let status = head_rx
                .await
                .map_err(|_| ErrorCode::ConnectionTerminated)??;
            Ok(TransportResponse::new(status, body))
        })
    }
}

fn forward(
    request: OutgoingRequest,
    head: tokio::sync::oneshot::Sender<Result<StatusCode, ErrorCode>>,
    sender: sandbox_host::BodySender,
    stamps: Arc<Mutex<Vec<Instant>>>,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .build()
        .into();
    let mut get = agent.get(request.uri.to_string());
    for (name, value) in &request.headers {
        if name != http::header::HOST {
            if let Ok(value) = value.to_str() {
                get = get.header(name.as_str(), value);
            }
        }
    }
    let response = match get.call() {
        Ok(response) => response,
        Err(_) => {
            let _ = head.send(Err(ErrorCode::ConnectionRefused));
            return;
        }
    };
    let _ = head.send(Ok(response.status()));
    let mut reader = response.into_body().into_reader();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let chunk = &buf[..n];
                if contains(chunk, b"\"type\":\"exit\"") {
                    stamps.lock().unwrap().push(Instant::now());
                }
                if !sender.send(Bytes::copy_from_slice(chunk)) {
                    return;
                }
            }
            Err(_) => {
                sender.fail(ErrorCode::ConnectionTerminated);
                return;
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Answers a command's requests without a server: process creation and
/// stdin close succeed, and `/connect` replays recorded NDJSON bytes in
/// [`READ_CHUNK`] pieces. The component then does nothing but decode.
pub struct Replay {
    ndjson: Bytes,
}

impl Replay {
    pub fn new(ndjson: Bytes) -> Replay {
        Replay { ndjson }
    }
}

fn json(status: StatusCode, body: &'static str) -> TransportResponse {
    let mut response = TransportResponse::new(status, ResponseBody::full(body));
    response.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl Transport for Replay {
    fn send(&self, request: OutgoingRequest) -> TransportFuture {
        let path = request.uri.path();
        let response = if request.method == Method::POST && path.ends_with("/processes") {
            json(
                StatusCode::OK,
                r#"{"status":"success","data":{"process_id":"p-replay"}}"#,
            )
        } else if request.method == Method::POST && path.ends_with("/stdin/close") {
            json(StatusCode::OK, r#"{"status":"success","data":{}}"#)
        } else if request.method == Method::GET && path.ends_with("/connect") {
            let chunks = (0..self.ndjson.len())
                .step_by(READ_CHUNK)
                .map(|at| {
                    let end = (at + READ_CHUNK).min(self.ndjson.len());
                    (Duration::ZERO, self.ndjson.slice(at..end))
                })
                .collect();
            TransportResponse::new(StatusCode::OK, ResponseBody::chunks(chunks, None))
        } else {
            json(StatusCode::NOT_FOUND, r#"{"status":"fail","data":{}}"#)
        };
        Box::pin(async move { Ok(response) })
    }
}
