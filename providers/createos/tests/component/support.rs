//! The test host: the built component, a scripted fake CreateOS, and
//! helpers to build contexts, leases and requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use sandbox_host::types::*;
use sandbox_host::{
    CancelToken, HostOptions, OutputCapture, ProviderInstance, RecordedRequest, ScriptedChunk,
    ScriptedResponse, ScriptedTransport,
};
use serde_json::{json, Value};

pub use sandbox_host::ErrorCode;
use wasmtime_wasi_http::p2::bindings::http::types::DnsErrorPayload;

/// The sandbox every fake lease points at.
pub const SANDBOX: &str = "sb-test";
/// The process id the fake gives every command.
pub const PROCESS: &str = "proc-1";
/// The origin of the test config.
pub const API_URL: &str = "https://api.createos.test";

pub use test_support::components::createos as component;
pub use test_support::requests::command;

/// A scripted answer to one request, or `None` for the fake's default.
pub type Override = dyn Fn(&RecordedRequest, usize) -> Option<ScriptedResponse> + Send + Sync;

/// A fake CreateOS: sensible default answers for every route, which a test
/// overrides per request. `usize` counts earlier requests to the same
/// method and path (0 for the first).
pub struct Fake {
    pub transport: ScriptedTransport,
    pub output: OutputCapture,
    pub cancel: CancelToken,
}

/// The default output of a command: `hello\n` then exit 0.
pub fn default_connect() -> ScriptedResponse {
    ScriptedResponse::ndjson(
        vec![
            ScriptedChunk::now(data_frame(1, "stdout", b"hello\n")),
            ScriptedChunk::now(exit_frame(0)),
        ],
        None,
    )
}

impl Fake {
    /// A fake with only default answers.
    pub fn new() -> Fake {
        Fake::with(|_, _| None)
    }

    /// A fake whose answers come from `script` first.
    pub fn with(
        script: impl Fn(&RecordedRequest, usize) -> Option<ScriptedResponse> + Send + Sync + 'static,
    ) -> Fake {
        let script: Arc<Override> = Arc::new(script);
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let transport = ScriptedTransport::new(move |req| {
            let key = format!("{} {}", req.method, req.path());
            let n = {
                let mut counts = counts.lock().unwrap();
                let n = counts.entry(key).or_insert(0);
                *n += 1;
                *n - 1
            };
            if let Some(answer) = script(req, n) {
                return answer;
            }
            default_answer(req, &files)
        });
        Fake {
            transport,
            output: OutputCapture::new(),
            cancel: CancelToken::new(),
        }
    }

    /// A fresh instance wired to this fake.
    pub fn instance(&self) -> ProviderInstance {
        component()
            .instantiate(
                HostOptions::new()
                    .with_transport(self.transport.shared())
                    .with_output_sink(self.output.sink())
                    .with_cancel(self.cancel.clone()),
            )
            .expect("instantiate")
    }

    /// Every request so far as `METHOD path?query`.
    pub fn calls(&self) -> Vec<String> {
        self.transport
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path_and_query))
            .collect()
    }

    /// How many requests went to `method` on the sandbox's path followed
    /// by `suffix` (`""`, `"/pause"`, `"/resume"`...).
    pub fn sandbox_calls(&self, method: &str, suffix: &str) -> usize {
        self.requests_to(&format!("{method} /v1/sandboxes/{SANDBOX}{suffix}"))
            .len()
    }

    /// The requests whose `METHOD path` (without query) is `route`.
    pub fn requests_to(&self, route: &str) -> Vec<RecordedRequest> {
        self.transport
            .requests()
            .into_iter()
            .filter(|r| format!("{} {}", r.method, r.path()) == route)
            .collect()
    }

    /// Runs `execute` on the default lease.
    pub fn execute(&self, request: &ExecuteRequest) -> Result<ExecuteResult, ProviderError> {
        self.instance()
            .execute(&ctx(), &lease(), request)
            .expect("no trap")
    }
}

fn default_answer(
    req: &RecordedRequest,
    files: &Mutex<HashMap<String, Vec<u8>>>,
) -> ScriptedResponse {
    let method = req.method.as_str();
    let path = req.path();
    let sandbox = format!("/v1/sandboxes/{SANDBOX}");
    let process = format!("{sandbox}/processes/{PROCESS}");
    let ok = |data: Value| ScriptedResponse::jsend_success(data);
    match (method, path) {
        ("POST", "/v1/sandboxes") => ok(json!({"id": SANDBOX, "status": "creating"})),
        ("GET", p) if p == sandbox => {
            ok(json!({"id": SANDBOX, "status": "running", "shape": "s-1vcpu-1gb"}))
        }
        ("DELETE", p) if p == sandbox => ok(json!({})),
        ("POST", p) if p == format!("{sandbox}/pause") => ok(json!({"status": "pausing"})),
        ("POST", p) if p == format!("{sandbox}/resume") => ok(json!({"status": "resuming"})),
        ("PUT", p) if p == format!("{sandbox}/files") => {
            files
                .lock()
                .unwrap()
                .insert(query_param(req, "path"), req.body.to_vec());
            ok(json!({}))
        }
        ("GET", p) if p == format!("{sandbox}/files") => {
            match files.lock().unwrap().get(&query_param(req, "path")) {
                Some(bytes) => ScriptedResponse::Full {
                    status: 200,
                    headers: vec![],
                    body: bytes.clone().into(),
                },
                None => ScriptedResponse::json(
                    404,
                    json!({"status": "fail", "data": {"path": "not found"}}),
                ),
            }
        }
        ("POST", p) if p == format!("{sandbox}/exec") => {
            let body = req.body_json().unwrap_or_default();
            let stdout = if body["cmd"] == "/bin/echo" {
                format!("{}\n", body["args"][0].as_str().unwrap_or_default())
            } else {
                String::new()
            };
            ok(json!({"result": {"exit_code": 0, "stdout": stdout, "stderr": ""}, "exec_ms": 1}))
        }
        ("POST", p) if p == format!("{sandbox}/processes") => {
            ok(json!({"process_id": PROCESS, "state": "running"}))
        }
        ("POST", p) if p == format!("{process}/stdin/close") => ok(json!({})),
        ("GET", p) if p == format!("{process}/connect") => default_connect(),
        ("DELETE", p) if p == process => ok(json!({"process_id": PROCESS, "tree_exited": true})),
        _ => ScriptedResponse::json(404, json!({"status": "fail", "data": {"route": "unknown"}})),
    }
}

/// A query parameter of a recorded request, percent-decoded.
pub fn query_param(req: &RecordedRequest, name: &str) -> String {
    let query = req.path_and_query.split_once('?').map_or("", |(_, q)| q);
    for pair in query.split('&') {
        if let Some((key, value)) = pair.split_once('=') {
            if key == name {
                return percent_decode(value);
            }
        }
    }
    String::new()
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&value[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A data frame line.
pub fn data_frame(seq: u64, stream: &str, bytes: &[u8]) -> String {
    format!(
        "{}\n",
        json!({"type": "data", "seq": seq, "stream": stream,
               "data_base64": base64::engine::general_purpose::STANDARD.encode(bytes)})
    )
}

/// An exit frame line.
pub fn exit_frame(code: i32) -> String {
    format!("{}\n", json!({"type": "exit", "exit_code": code}))
}

/// A `/connect` answer: `partial` on stdout, then nothing for a long time.
pub fn hanging_connect(partial: &str) -> ScriptedResponse {
    ScriptedResponse::ndjson(
        vec![
            ScriptedChunk::now(data_frame(1, "stdout", partial.as_bytes())),
            ScriptedChunk::after(Duration::from_secs(600), exit_frame(0)),
        ],
        None,
    )
}

/// The config every test uses, with short request budgets.
pub fn config_json() -> String {
    json!({"apiUrl": API_URL, "timeoutMs": 20_000, "requestTimeoutMs": 1_500}).to_string()
}

/// An environment context for `config`.
pub fn ctx_with(config: String) -> EnvironmentContext {
    EnvironmentContext {
        driver_key: "createos".into(),
        company_id: "company-1".into(),
        environment_id: "env-1".into(),
        issue_id: None,
        config,
    }
}

/// The default context.
pub fn ctx() -> EnvironmentContext {
    ctx_with(config_json())
}

/// Lease metadata as the provider writes it, for the fake sandbox.
pub fn metadata(reusable: bool) -> Value {
    json!({
        "provider": "createos",
        "sandboxId": SANDBOX,
        "environmentId": "env-1",
        "apiOrigin": API_URL,
        "shape": "s-1vcpu-1gb",
        "rootfs": null,
        "region": null,
        "workspaceRoot": "/paperclip-workspace",
        "cwd": "/paperclip-workspace",
        "marker": "marker-123",
        "reusable": reusable,
    })
}

/// The default lease.
pub fn lease() -> Lease {
    Lease {
        provider_lease_id: SANDBOX.into(),
        metadata: metadata(false).to_string(),
        expires_at: None,
    }
}

/// The bash script the component sent for its process.
pub fn sent_script(fake: &Fake) -> String {
    let create = fake.requests_to(&format!("POST /v1/sandboxes/{SANDBOX}/processes"));
    assert_eq!(create.len(), 1, "one process creation");
    let body = create[0].body_json().expect("JSON body");
    assert_eq!(body["cmd"], "/bin/bash");
    assert_eq!(body["args"][0], "-lc");
    assert!(body.get("env").is_none(), "no API env");
    body["args"][1].as_str().expect("script").to_string()
}

/// A JSON error answer with a body that must never surface.
pub fn error_answer(status: u16) -> ScriptedResponse {
    ScriptedResponse::json(
        status,
        json!({"status": "error", "message": "SECRET-BODY-TEXT", "code": status}),
    )
}

/// Asserts a debug rendering holds no secret body text.
pub fn assert_no_body<T: std::fmt::Debug>(value: &T) {
    let text = format!("{value:?}");
    assert!(!text.contains("SECRET-BODY-TEXT"), "{text}");
}

/// Asserts a cleanup cause has the expected shape (the bindings' types do
/// not implement `PartialEq`).
pub fn assert_matches_cause(cause: CleanupCause, expected: impl Fn(&CleanupCause) -> bool) {
    assert!(expected(&cause), "unexpected cause {cause:?}");
}

/// Transport failures that prove the request never reached the server: the
/// host denied it, DNS failed, the connection was refused or timed out, or
/// TLS failed before the request was written.
pub fn never_sent_errors() -> Vec<ErrorCode> {
    vec![
        ErrorCode::HttpRequestDenied,
        ErrorCode::DnsError(DnsErrorPayload {
            rcode: Some("NXDOMAIN".into()),
            info_code: None,
        }),
        ErrorCode::DnsTimeout,
        ErrorCode::ConnectionRefused,
        ErrorCode::ConnectionTimeout,
        ErrorCode::DestinationUnavailable,
        ErrorCode::TlsProtocolError,
        ErrorCode::TlsCertificateError,
    ]
}

/// Transport failures after the request may have reached the server.
pub fn after_send_errors() -> Vec<ErrorCode> {
    vec![
        ErrorCode::ConnectionTerminated,
        ErrorCode::ConnectionReadTimeout,
        ErrorCode::ConnectionWriteTimeout,
        ErrorCode::HttpResponseTimeout,
        ErrorCode::HttpResponseIncomplete,
        ErrorCode::HttpProtocolError,
        ErrorCode::InternalError(None),
    ]
}
