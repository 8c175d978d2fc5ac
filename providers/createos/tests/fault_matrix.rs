//! The fault matrix: every request of execute, acquire, resume, release,
//! destroy and probe × every fault, run on the built component under
//! wasmtime against a stateful scripted CreateOS.
//!
//! Each cell injects one fault into one request (the others get the fake's
//! normal answers) and checks the outcome against what the fake *knows*
//! from the answers it gave — the ground truth of what may still exist:
//!
//! - a process may run when its creation was accepted (or answered
//!   ambiguously) and neither an exit frame was delivered nor a DELETE
//!   answered `tree_exited: true` / 404;
//! - a sandbox may exist when its creation was accepted (or answered
//!   ambiguously) and no DELETE answered success / 404;
//! - a request refused before it was sent (the host's denial, DNS,
//!   connection refused, TLS) did nothing: it is never ambiguous;
//! - only a 404 or a `destroyed`/`failed` state proves a sandbox gone; an
//!   `error` or `destroying` state proves nothing.
//!
//! The contract, per cell: no trap; a result only with proof (an exit
//! frame, a confirmed DELETE, a paused state, a matching marker, a 404);
//! `cleanup-failed` exactly when something the operation was responsible
//! for may be left running; otherwise a typed error, whose text never holds
//! the response body; once a process existed and its termination was
//! confirmed, a typed error carries the partial output. The matrix is
//! printed (`--nocapture`).

#![allow(clippy::result_large_err)]

#[path = "component/support.rs"]
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_host::types::*;
use sandbox_host::{
    HostOptions, RecordedRequest, ScriptedChunk, ScriptedResponse, ScriptedTransport,
};
use serde_json::{json, Value};
use support::{component, query_param, ErrorCode, API_URL, PROCESS, SANDBOX};
use wasmtime_wasi_http::p2::bindings::http::types::DnsErrorPayload;

const MARKER: &str = "marker-123";
const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-lease-marker";
/// Text in every fault body: it must never reach an error.
const BODY_CANARY: &str = "SECRET-BODY-TEXT";
/// The command deadline of execute cells (long enough never to be reached
/// on a loaded machine, short enough for the hanging-connect cell).
const COMMAND_TIMEOUT_MS: u64 = 6_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Execute,
    Acquire,
    Resume,
    ReleaseReusable,
    Release,
    Destroy,
    Probe,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Route {
    CreateSandbox,
    GetSandbox,
    DeleteSandbox,
    Pause,
    Resume,
    PutFile,
    GetFile,
    Exec,
    CreateProcess,
    Connect,
    DeleteProcess,
}

fn route_of(req: &RecordedRequest) -> Option<Route> {
    let sandbox = format!("/v1/sandboxes/{SANDBOX}");
    let process = format!("{sandbox}/processes/{PROCESS}");
    let path = req.path();
    Some(match (req.method.as_str(), path) {
        ("POST", "/v1/sandboxes") => Route::CreateSandbox,
        ("GET", p) if p == sandbox => Route::GetSandbox,
        ("DELETE", p) if p == sandbox => Route::DeleteSandbox,
        ("POST", p) if p == format!("{sandbox}/pause") => Route::Pause,
        ("POST", p) if p == format!("{sandbox}/resume") => Route::Resume,
        ("PUT", p) if p == format!("{sandbox}/files") => Route::PutFile,
        ("GET", p) if p == format!("{sandbox}/files") => Route::GetFile,
        ("POST", p) if p == format!("{sandbox}/exec") => Route::Exec,
        ("POST", p) if p == format!("{sandbox}/processes") => Route::CreateProcess,
        ("GET", p) if p == format!("{process}/connect") => Route::Connect,
        ("DELETE", p) if p == process => Route::DeleteProcess,
        _ => return None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    S500,
    S400,
    S404,
    S409,
    S410,
    S429,
    Deadline,
    /// The host's HTTP capability denied the request (never sent).
    Denied,
    /// DNS failed (never sent).
    Dns,
    /// The connection was refused (never sent).
    Refused,
    /// The TLS handshake failed (never sent).
    Tls,
    /// The connection closed after the request was sent, before an answer.
    Terminated,
    /// The connection was reset in the middle of the answer's body.
    Reset,
    InvalidJson,
    MissingField,
    WrongType,
    Oversized,
    InvalidBase64,
    TreeExitedFalse,
    /// `GET /sandboxes/{id}` answers the state `error` (proves nothing).
    StateError,
    /// ... the state `destroying` (proves nothing).
    StateDestroying,
    /// ... the state `destroyed` (proves the sandbox gone).
    StateDestroyed,
}

const FAULTS: &[(Fault, &str)] = &[
    (Fault::S500, "5xx"),
    (Fault::S400, "4xx"),
    (Fault::S404, "404"),
    (Fault::S409, "409"),
    (Fault::S410, "410"),
    (Fault::S429, "429"),
    (Fault::Deadline, "dline"),
    (Fault::Denied, "deny"),
    (Fault::Dns, "dns"),
    (Fault::Refused, "refus"),
    (Fault::Tls, "tls"),
    (Fault::Terminated, "term"),
    (Fault::Reset, "reset"),
    (Fault::InvalidJson, "!json"),
    (Fault::MissingField, "nofld"),
    (Fault::WrongType, "type"),
    (Fault::Oversized, "big"),
    (Fault::InvalidBase64, "b64"),
    (Fault::TreeExitedFalse, "tree"),
    (Fault::StateError, "s:err"),
    (Fault::StateDestroying, "s:dsg"),
    (Fault::StateDestroyed, "s:dsd"),
];

impl Fault {
    fn status(self) -> Option<u16> {
        Some(match self {
            Fault::S500 => 500,
            Fault::S400 => 400,
            Fault::S404 => 404,
            Fault::S409 => 409,
            Fault::S410 => 410,
            Fault::S429 => 429,
            _ => return None,
        })
    }

    /// A definite rejection: the request did nothing.
    fn definite_rejection(self) -> bool {
        self.status().is_some_and(|s| s < 500)
    }

    /// Refused before it was sent: the server never saw the request.
    fn never_sent(self) -> bool {
        matches!(
            self,
            Fault::Denied | Fault::Dns | Fault::Refused | Fault::Tls
        )
    }

    /// The request provably did nothing on the server.
    fn did_nothing(self) -> bool {
        self.definite_rejection() || self.never_sent()
    }

    fn applies_to(self, route: Route) -> bool {
        match self {
            Fault::InvalidBase64 => route == Route::Connect,
            Fault::TreeExitedFalse => route == Route::DeleteProcess,
            Fault::StateError | Fault::StateDestroying | Fault::StateDestroyed => {
                route == Route::GetSandbox
            }
            Fault::MissingField | Fault::WrongType => route != Route::GetFile,
            _ => true,
        }
    }
}

/// What must happen before the faulted request is reached.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pre {
    None,
    /// `/connect` prints and then hangs: the command times out.
    ConnectHangs,
    /// The workspace `mkdir` exits 1: acquire must delete its sandbox.
    MkdirFails,
}

struct Row {
    op: Op,
    route: Route,
    /// Which request to this route gets the fault (0 = the first).
    nth: usize,
    label: &'static str,
    pre: Pre,
}

const fn row(op: Op, route: Route, nth: usize, label: &'static str, pre: Pre) -> Row {
    Row {
        op,
        route,
        nth,
        label,
        pre,
    }
}

const ROWS: &[Row] = &[
    row(
        Op::Execute,
        Route::PutFile,
        0,
        "execute  PUT files (stdin)",
        Pre::None,
    ),
    row(
        Op::Execute,
        Route::CreateProcess,
        0,
        "execute  POST processes",
        Pre::None,
    ),
    row(
        Op::Execute,
        Route::Connect,
        0,
        "execute  GET connect",
        Pre::None,
    ),
    row(
        Op::Execute,
        Route::DeleteProcess,
        0,
        "execute  DELETE process (timeout)",
        Pre::ConnectHangs,
    ),
    row(
        Op::Execute,
        Route::Exec,
        0,
        "execute  POST exec (rm stdin)",
        Pre::None,
    ),
    row(
        Op::Acquire,
        Route::CreateSandbox,
        0,
        "acquire  POST sandboxes",
        Pre::None,
    ),
    row(
        Op::Acquire,
        Route::GetSandbox,
        0,
        "acquire  GET sandbox (wait)",
        Pre::None,
    ),
    row(
        Op::Acquire,
        Route::Exec,
        0,
        "acquire  POST exec (mkdir)",
        Pre::None,
    ),
    row(
        Op::Acquire,
        Route::PutFile,
        0,
        "acquire  PUT files (marker)",
        Pre::None,
    ),
    row(
        Op::Acquire,
        Route::DeleteSandbox,
        0,
        "acquire  DELETE sandbox (setup failed)",
        Pre::MkdirFails,
    ),
    row(
        Op::Resume,
        Route::GetSandbox,
        0,
        "resume   GET sandbox",
        Pre::None,
    ),
    row(
        Op::Resume,
        Route::Resume,
        0,
        "resume   POST resume",
        Pre::None,
    ),
    row(
        Op::Resume,
        Route::GetSandbox,
        1,
        "resume   GET sandbox (wait)",
        Pre::None,
    ),
    row(
        Op::Resume,
        Route::GetFile,
        0,
        "resume   GET files (marker)",
        Pre::None,
    ),
    row(
        Op::ReleaseReusable,
        Route::GetSandbox,
        0,
        "release  GET sandbox (reusable)",
        Pre::None,
    ),
    row(
        Op::ReleaseReusable,
        Route::Pause,
        0,
        "release  POST pause (reusable)",
        Pre::None,
    ),
    row(
        Op::ReleaseReusable,
        Route::GetSandbox,
        1,
        "release  GET sandbox (wait paused)",
        Pre::None,
    ),
    row(
        Op::Release,
        Route::DeleteSandbox,
        0,
        "release  DELETE sandbox",
        Pre::None,
    ),
    row(
        Op::Destroy,
        Route::DeleteSandbox,
        0,
        "destroy  DELETE sandbox",
        Pre::None,
    ),
    row(
        Op::Probe,
        Route::CreateSandbox,
        0,
        "probe    POST sandboxes",
        Pre::None,
    ),
    row(
        Op::Probe,
        Route::GetSandbox,
        0,
        "probe    GET sandbox (wait)",
        Pre::None,
    ),
    row(
        Op::Probe,
        Route::Exec,
        0,
        "probe    POST exec (echo)",
        Pre::None,
    ),
    row(
        Op::Probe,
        Route::DeleteSandbox,
        0,
        "probe    DELETE sandbox",
        Pre::None,
    ),
];

/// Whether something exists, as far as the answers given prove.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Exists {
    /// Never created (not asked, or definitely rejected).
    No,
    /// Created, or its creation was answered ambiguously.
    Maybe,
    /// Created.
    Yes,
    /// A deletion was confirmed.
    Gone,
}

impl Exists {
    fn may_exist(self) -> bool {
        matches!(self, Exists::Maybe | Exists::Yes)
    }
}

/// The fake's ground truth.
struct Truth {
    sandbox: Exists,
    /// Set when `POST /sandboxes` was answered ambiguously.
    sandbox_ambiguous: bool,
    process: Exists,
    process_ambiguous: bool,
    /// A `/connect` answer with the exit frame was served whole.
    exit_delivered: bool,
    status: String,
    files: HashMap<String, Vec<u8>>,
    /// A 404, a `destroyed` state or a mismatching marker was served:
    /// expiry is proven.
    expiry_proof: bool,
    /// The served answer proved the sandbox gone (404, `destroyed`).
    gone_proof: bool,
    counts: HashMap<Route, usize>,
    fault_served: bool,
}

impl Truth {
    fn initial(op: Op) -> Truth {
        let (sandbox, status) = match op {
            Op::Acquire | Op::Probe => (Exists::No, ""),
            Op::Resume => (Exists::Yes, "paused"),
            _ => (Exists::Yes, "running"),
        };
        let mut files = HashMap::new();
        if op == Op::Resume {
            files.insert(MARKER_PATH.to_string(), MARKER.as_bytes().to_vec());
        }
        Truth {
            sandbox,
            sandbox_ambiguous: false,
            process: Exists::No,
            process_ambiguous: false,
            exit_delivered: false,
            status: status.into(),
            files,
            expiry_proof: false,
            gone_proof: false,
            counts: HashMap::new(),
            fault_served: false,
        }
    }
}

fn success(data: Value) -> ScriptedResponse {
    ScriptedResponse::jsend_success(data)
}

fn raw(status: u16, body: impl Into<Vec<u8>>) -> ScriptedResponse {
    ScriptedResponse::Full {
        status,
        headers: vec![],
        body: body.into().into(),
    }
}

fn data_line(seq: u64, bytes: &[u8]) -> String {
    support::data_frame(seq, "stdout", bytes)
}

/// The fake's normal answer, updating the ground truth.
fn normal(truth: &mut Truth, pre: Pre, route: Route, req: &RecordedRequest) -> ScriptedResponse {
    match route {
        Route::CreateSandbox => {
            truth.sandbox = Exists::Yes;
            truth.status = "running".into();
            success(json!({"id": SANDBOX, "status": "creating"}))
        }
        Route::GetSandbox => {
            let answer =
                success(json!({"id": SANDBOX, "status": truth.status, "shape": "s-1vcpu-1gb"}));
            match truth.status.as_str() {
                "pausing" => truth.status = "paused".into(),
                "resuming" => truth.status = "running".into(),
                _ => {}
            }
            answer
        }
        Route::DeleteSandbox => {
            truth.sandbox = Exists::Gone;
            truth.status = "destroyed".into();
            success(json!({}))
        }
        Route::Pause => {
            truth.status = "pausing".into();
            success(json!({"status": "pausing"}))
        }
        Route::Resume => {
            truth.status = "resuming".into();
            success(json!({"status": "resuming"}))
        }
        Route::PutFile => {
            truth
                .files
                .insert(query_param(req, "path"), req.body.to_vec());
            success(json!({}))
        }
        Route::GetFile => match truth.files.get(&query_param(req, "path")) {
            Some(bytes) => raw(200, bytes.clone()),
            None => {
                truth.expiry_proof = true;
                ScriptedResponse::json(404, json!({"status": "fail", "data": {"path": "missing"}}))
            }
        },
        Route::Exec => {
            let body = req.body_json().unwrap_or_default();
            let (code, stdout) = match body["cmd"].as_str() {
                Some("/bin/echo") => (0, format!("{}\n", body["args"][0].as_str().unwrap_or(""))),
                Some("/bin/mkdir") if pre == Pre::MkdirFails => (1, String::new()),
                _ => (0, String::new()),
            };
            success(
                json!({"result": {"exit_code": code, "stdout": stdout, "stderr": ""}, "exec_ms": 1}),
            )
        }
        Route::CreateProcess => {
            truth.process = Exists::Yes;
            success(json!({"process_id": PROCESS, "state": "running"}))
        }
        Route::Connect if pre == Pre::ConnectHangs => ScriptedResponse::ndjson(
            vec![
                ScriptedChunk::now(data_line(1, b"partial")),
                ScriptedChunk::after(Duration::from_secs(600), support::exit_frame(0)),
            ],
            None,
        ),
        Route::Connect => {
            truth.exit_delivered = true;
            ScriptedResponse::ndjson(
                vec![
                    ScriptedChunk::now(data_line(1, b"hello\n")),
                    ScriptedChunk::now(support::exit_frame(0)),
                ],
                None,
            )
        }
        Route::DeleteProcess => {
            truth.process = Exists::Gone;
            success(json!({"process_id": PROCESS, "tree_exited": true}))
        }
    }
}

/// The faulted answer, updating the ground truth with what it proves.
fn faulted(truth: &mut Truth, route: Route, fault: Fault) -> ScriptedResponse {
    truth.fault_served = true;
    match route {
        Route::CreateSandbox if fault.did_nothing() => {}
        Route::CreateSandbox => {
            truth.sandbox = Exists::Maybe;
            truth.sandbox_ambiguous = true;
        }
        Route::CreateProcess if fault.did_nothing() => {}
        Route::CreateProcess => {
            truth.process = Exists::Maybe;
            truth.process_ambiguous = true;
        }
        Route::DeleteSandbox if fault == Fault::S404 => {
            truth.sandbox = Exists::Gone;
            truth.gone_proof = true;
        }
        Route::DeleteProcess if fault == Fault::S404 => truth.process = Exists::Gone,
        Route::GetSandbox if matches!(fault, Fault::S404 | Fault::StateDestroyed) => {
            truth.expiry_proof = true;
            truth.gone_proof = true;
        }
        Route::GetFile if matches!(fault, Fault::S404 | Fault::InvalidJson) => {
            // Missing, or bytes that are not the marker.
            truth.expiry_proof = true;
        }
        _ => {}
    }
    if let Some(status) = fault.status() {
        let body = if status >= 500 {
            json!({"status": "error", "message": BODY_CANARY, "code": status})
        } else {
            json!({"status": "fail", "data": {"message": BODY_CANARY}})
        };
        return ScriptedResponse::json(status, body);
    }
    let connect = |lines: Vec<String>| {
        ScriptedResponse::ndjson(lines.into_iter().map(ScriptedChunk::now).collect(), None)
    };
    let state =
        |status: &str| success(json!({"id": SANDBOX, "status": status, "shape": "s-1vcpu-1gb"}));
    match (fault, route) {
        (Fault::Deadline, _) => ScriptedResponse::Hang,
        (Fault::Denied, _) => ScriptedResponse::Error(ErrorCode::HttpRequestDenied),
        (Fault::Dns, _) => ScriptedResponse::Error(ErrorCode::DnsError(DnsErrorPayload {
            rcode: Some("NXDOMAIN".into()),
            info_code: None,
        })),
        (Fault::Refused, _) => ScriptedResponse::Error(ErrorCode::ConnectionRefused),
        (Fault::Tls, _) => ScriptedResponse::Error(ErrorCode::TlsCertificateError),
        (Fault::Terminated, _) => ScriptedResponse::Error(ErrorCode::ConnectionTerminated),
        (Fault::StateError, _) => state("error"),
        (Fault::StateDestroying, _) => state("destroying"),
        (Fault::StateDestroyed, _) => state("destroyed"),
        (Fault::Reset, Route::Connect) => ScriptedResponse::ndjson(
            vec![
                ScriptedChunk::now(data_line(1, b"hello\n")),
                ScriptedChunk::now("{\"type\":\"data\",\"seq\":2,"),
            ],
            Some(ErrorCode::ConnectionTerminated),
        ),
        (Fault::Reset, _) => ScriptedResponse::Streamed {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![ScriptedChunk::now(if route == Route::GetFile {
                "marke".to_string()
            } else {
                format!("{{\"status\":\"success\",\"data\":{{\"id\":\"{SANDBOX}")
            })],
            end: Some(ErrorCode::ConnectionTerminated),
        },
        (Fault::InvalidJson, Route::Connect) => {
            connect(vec![format!("{{not json {BODY_CANARY}\n")])
        }
        (Fault::InvalidJson, _) => raw(
            200,
            format!("{{\"status\":\"success\",\"data\": {BODY_CANARY}"),
        ),
        (Fault::MissingField, r) => match r {
            Route::CreateSandbox => success(json!({"status": "creating"})),
            Route::GetSandbox => success(json!({"id": SANDBOX, "shape": "s-1vcpu-1gb"})),
            Route::CreateProcess => success(json!({"state": "running"})),
            Route::DeleteProcess => success(json!({"process_id": PROCESS})),
            Route::Exec => success(json!({"exec_ms": 1})),
            Route::Connect => connect(vec![
                "{\"type\":\"data\",\"stream\":\"stdout\",\"data_base64\":\"aGk=\"}\n".into(),
            ]),
            _ => ScriptedResponse::json(200, json!({"status": "success"})),
        },
        (Fault::WrongType, r) => match r {
            Route::CreateSandbox => success(json!({"id": 7, "status": "creating"})),
            Route::GetSandbox => success(json!({"id": SANDBOX, "status": 7})),
            Route::CreateProcess => success(json!({"process_id": 7})),
            Route::DeleteProcess => success(json!({"process_id": PROCESS, "tree_exited": "yes"})),
            Route::Exec => success(json!({"result": {"exit_code": "0", "stdout": ""}})),
            Route::Connect => connect(vec![
                "{\"type\":\"data\",\"seq\":\"1\",\"stream\":\"stdout\",\"data_base64\":\"aGk=\"}\n"
                    .into(),
            ]),
            _ => ScriptedResponse::json(200, json!({"status": "success", "data": BODY_CANARY})),
        },
        (Fault::Oversized, Route::Connect) => connect(vec![
            data_line(1, &vec![b'x'; 800 * 1024]),
            support::exit_frame(0),
        ]),
        (Fault::Oversized, Route::GetFile) => raw(200, vec![b'm'; 9 * 1024 * 1024]),
        (Fault::Oversized, _) => raw(
            200,
            format!(
                "{{\"status\":\"success\",\"data\":{{\"id\":\"{SANDBOX}\",\"pad\":\"{}\"}}}}",
                "x".repeat(9 * 1024 * 1024)
            ),
        ),
        (Fault::InvalidBase64, _) => connect(vec![
            "{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data_base64\":\"***\"}\n".into(),
            support::exit_frame(0),
        ]),
        (Fault::TreeExitedFalse, _) => {
            success(json!({"process_id": PROCESS, "tree_exited": false}))
        }
        _ => unreachable!("{fault:?} on {route:?}"),
    }
}

fn context(op: Op) -> EnvironmentContext {
    support::ctx_with(
        json!({
            "apiUrl": API_URL,
            "timeoutMs": 6_000,
            "requestTimeoutMs": 3_000,
            "reuseLease": matches!(op, Op::Resume | Op::ReleaseReusable),
        })
        .to_string(),
    )
}

fn lease_for(op: Op) -> Lease {
    Lease {
        provider_lease_id: SANDBOX.into(),
        metadata: support::metadata(matches!(op, Op::Resume | Op::ReleaseReusable)).to_string(),
        expires_at: None,
    }
}

/// The outcome of one cell: its code in the printed matrix, and every way
/// it broke the contract.
struct Cell {
    code: String,
    violations: Vec<String>,
}

fn error_code(error: &ProviderError) -> String {
    match error {
        ProviderError::InvalidConfig(_) => "cfg".into(),
        ProviderError::InvalidRequest(_) => "req".into(),
        ProviderError::ForeignLease(_) => "for".into(),
        ProviderError::Unsupported(_) => "uns".into(),
        ProviderError::ApiRejected(_) => "rej".into(),
        ProviderError::TransportFailed(_) => "trn".into(),
        ProviderError::InvalidResponse(_) => "inv".into(),
        ProviderError::Cancelled(_) => "can".into(),
        ProviderError::OutputLost(loss) => {
            format!("OL:{}", if loss.tree_deleted { 'd' } else { 'u' })
        }
        ProviderError::CleanupFailed(f) => format!(
            "CF:{}",
            match f.phase {
                CleanupPhase::ProcessCreation => 'c',
                CleanupPhase::ProcessTermination => 't',
                CleanupPhase::LeaseSetup => 's',
                CleanupPhase::SandboxDeletion => 'd',
            }
        ),
    }
}

/// The partial output a typed error carries, if any.
fn partial_of(error: &ProviderError) -> Option<&PartialOutput> {
    match error {
        ProviderError::ApiRejected(r) => r.partial.as_ref(),
        ProviderError::TransportFailed(f) => f.partial.as_ref(),
        ProviderError::InvalidResponse(r) => r.partial.as_ref(),
        ProviderError::Cancelled(partial) => partial.as_ref(),
        ProviderError::CleanupFailed(f) => f.partial.as_ref(),
        ProviderError::OutputLost(loss) => Some(&loss.partial),
        _ => None,
    }
}

fn run_cell(row: &Row, fault: Fault) -> Cell {
    let truth = Arc::new(Mutex::new(Truth::initial(row.op)));
    let transport = {
        let truth = truth.clone();
        let (route, nth, pre) = (row.route, row.nth, row.pre);
        ScriptedTransport::new(move |req| {
            let Some(r) = route_of(req) else {
                return ScriptedResponse::json(404, json!({"status": "fail", "data": {}}));
            };
            let mut truth = truth.lock().unwrap();
            let n = {
                let n = truth.counts.entry(r).or_insert(0);
                *n += 1;
                *n - 1
            };
            if r == route && n == nth {
                faulted(&mut truth, r, fault)
            } else {
                normal(&mut truth, pre, r, req)
            }
        })
    };
    let mut instance = component()
        .instantiate(HostOptions::new().with_transport(transport.shared()))
        .expect("instantiate");
    let ctx = context(row.op);
    let lease = lease_for(row.op);
    let mut violations = Vec::new();
    let mut check = |ok: bool, what: &str| {
        if !ok {
            violations.push(what.to_string());
        }
    };

    macro_rules! outcome {
        ($call:expr) => {
            match $call {
                Ok(outcome) => outcome,
                Err(trap) => {
                    return Cell {
                        code: "TRAP".into(),
                        violations: vec![format!("trapped: {trap:#}")],
                    }
                }
            }
        };
    }

    let code = match row.op {
        Op::Execute => {
            let mut request = support::command("cat", &[]);
            request.stdin = Some(b"input".to_vec());
            request.timeout_ms = Some(if row.pre == Pre::ConnectHangs {
                400
            } else {
                COMMAND_TIMEOUT_MS
            });
            let outcome = outcome!(instance.execute(&ctx, &lease, &request));
            check(
                !format!("{outcome:?}").contains(BODY_CANARY),
                "the response body leaked",
            );
            let t = truth.lock().unwrap();
            let may_run = t.process.may_exist() && !t.exit_delivered;
            match &outcome {
                Ok(result) if result.timed_out => {
                    check(
                        t.process == Exists::Gone,
                        "timed-out result without a confirmed DELETE",
                    );
                    "to".to_string()
                }
                Ok(result) => {
                    check(t.exit_delivered, "a result without an exit frame");
                    check(
                        result.exit_code == Some(0) && result.stdout == "hello\n",
                        "the result is not what the command printed",
                    );
                    "ok".to_string()
                }
                Err(ProviderError::CleanupFailed(f)) => {
                    check(may_run, "cleanup-failed although termination was proven");
                    check(
                        f.partial.is_some(),
                        "cleanup-failed without the partial output",
                    );
                    if t.process_ambiguous {
                        check(
                            f.phase == CleanupPhase::ProcessCreation && f.process_id.is_none(),
                            "an ambiguous creation must be phase process-creation without a process id",
                        );
                    } else {
                        check(
                            f.phase == CleanupPhase::ProcessTermination
                                && f.process_id.as_deref() == Some(PROCESS),
                            "an unconfirmed termination must be phase process-termination with the process id",
                        );
                    }
                    error_code(&ProviderError::CleanupFailed(f.clone()))
                }
                // Lost output: `tree-deleted` exactly when termination was
                // proven (otherwise the host poisons the lease).
                Err(error @ ProviderError::OutputLost(loss)) => {
                    check(
                        loss.tree_deleted != may_run,
                        "output-lost's tree-deleted disagrees with what may still run",
                    );
                    check(
                        loss.process_id.as_deref() == Some(PROCESS),
                        "output-lost without the process id",
                    );
                    error_code(error)
                }
                Err(error) => {
                    check(!may_run, "a typed error while the process may still run");
                    match t.process {
                        Exists::Gone => check(
                            partial_of(error).is_some(),
                            "a typed error after a confirmed termination without the partial output",
                        ),
                        Exists::No => check(
                            partial_of(error).is_none(),
                            "partial output although no process existed",
                        ),
                        _ => {}
                    }
                    error_code(error)
                }
            }
        }
        Op::Acquire | Op::Probe => {
            let (outcome_text, result): (String, Result<String, ProviderError>) =
                if row.op == Op::Acquire {
                    // In a subdirectory of the workspace, so that acquire
                    // makes it with `mkdir` (the workspace root alone is
                    // made by writing the marker).
                    let request = AcquireRequest {
                        requested_cwd: Some("work".into()),
                        ..test_support::acquire("run-1")
                    };
                    let outcome = outcome!(instance.acquire_lease(&ctx, &request));
                    (format!("{outcome:?}"), outcome.map(|lease| lease.metadata))
                } else {
                    let outcome = outcome!(instance.probe(&ctx));
                    (
                        format!("{outcome:?}"),
                        outcome.map(|report| {
                            if report.ok {
                                "ok".into()
                            } else {
                                "not-ok".into()
                            }
                        }),
                    )
                };
            check(
                !outcome_text.contains(BODY_CANARY),
                "the response body leaked",
            );
            let t = truth.lock().unwrap();
            match &result {
                Ok(detail) if row.op == Op::Acquire => {
                    let metadata: Value = serde_json::from_str(detail).unwrap_or_default();
                    let marker = metadata["marker"].as_str().unwrap_or("<none>").as_bytes();
                    check(
                        t.sandbox == Exists::Yes,
                        "a lease on a sandbox that is not there",
                    );
                    check(
                        t.files.get(MARKER_PATH).map(Vec::as_slice) == Some(marker),
                        "a lease whose marker was not written",
                    );
                    "ok".into()
                }
                Ok(detail) => {
                    check(
                        t.sandbox == Exists::Gone,
                        "a probe report without a confirmed delete",
                    );
                    check(
                        detail != "ok" || row.route != Route::Exec,
                        "probe ok although its echo failed",
                    );
                    if detail == "ok" {
                        "ok".into()
                    } else {
                        "!ok".into()
                    }
                }
                Err(ProviderError::CleanupFailed(f)) => {
                    check(
                        t.sandbox.may_exist(),
                        "cleanup-failed although the sandbox is proven gone",
                    );
                    check(
                        f.sandbox_id.is_none() == t.sandbox_ambiguous,
                        "the sandbox id must be absent exactly when creation was ambiguous",
                    );
                    let phase_ok = if t.sandbox_ambiguous || row.op == Op::Acquire {
                        f.phase == CleanupPhase::LeaseSetup
                    } else {
                        f.phase == CleanupPhase::SandboxDeletion
                    };
                    check(phase_ok, "wrong cleanup phase");
                    error_code(&ProviderError::CleanupFailed(f.clone()))
                }
                Err(error) => {
                    check(
                        !t.sandbox.may_exist(),
                        "a typed error while the sandbox may still exist",
                    );
                    error_code(error)
                }
            }
        }
        Op::Resume => {
            let outcome = outcome!(instance.resume_lease(&ctx, &lease));
            check(
                !format!("{outcome:?}").contains(BODY_CANARY),
                "the response body leaked",
            );
            let t = truth.lock().unwrap();
            match &outcome {
                Ok(ResumeOutcome::Resumed(_)) => {
                    check(
                        t.status == "running",
                        "resumed a sandbox that is not running",
                    );
                    check(
                        row.route != Route::GetFile,
                        "resumed without reading the marker",
                    );
                    "ok".into()
                }
                Ok(ResumeOutcome::Expired(_)) => {
                    check(
                        t.expiry_proof,
                        "expired without proof that the sandbox is gone",
                    );
                    "exp".into()
                }
                Err(error) => error_code(error),
            }
        }
        Op::ReleaseReusable | Op::Release | Op::Destroy => {
            let outcome = if row.op == Op::Destroy {
                outcome!(instance.destroy_lease(&ctx, &lease))
            } else {
                outcome!(instance.release_lease(&ctx, &lease))
            };
            check(
                !format!("{outcome:?}").contains(BODY_CANARY),
                "the response body leaked",
            );
            let t = truth.lock().unwrap();
            match &outcome {
                Ok(receipt) => {
                    let proven = match receipt.action {
                        TerminationAction::Paused => t.status == "paused",
                        TerminationAction::Deleted => t.sandbox == Exists::Gone && !t.gone_proof,
                        TerminationAction::AlreadyGone => t.gone_proof,
                        TerminationAction::IdlePause => t.status == "running",
                    };
                    check(proven, "a receipt without proof");
                    match receipt.action {
                        TerminationAction::Paused => "paus",
                        TerminationAction::Deleted => "del",
                        TerminationAction::AlreadyGone => "gone",
                        TerminationAction::IdlePause => "idle",
                    }
                    .into()
                }
                Err(ProviderError::CleanupFailed(f)) => {
                    check(
                        t.sandbox != Exists::Gone,
                        "cleanup-failed although the delete was confirmed",
                    );
                    check(
                        f.phase == CleanupPhase::SandboxDeletion,
                        "wrong cleanup phase",
                    );
                    error_code(&ProviderError::CleanupFailed(f.clone()))
                }
                Err(error) => {
                    // A failed pause leaves the lease with the host (still
                    // active): a typed error is enough. A failed delete is not.
                    check(
                        row.op == Op::ReleaseReusable,
                        "a failed delete must be cleanup-failed",
                    );
                    error_code(error)
                }
            }
        }
    };
    if !truth.lock().unwrap().fault_served {
        violations.push("the faulted request was never made".into());
    }
    Cell { code, violations }
}

#[test]
fn fault_matrix() {
    component();
    let cells: Vec<(usize, usize)> = (0..ROWS.len())
        .flat_map(|r| (0..FAULTS.len()).map(move |f| (r, f)))
        .filter(|&(r, f)| FAULTS[f].0.applies_to(ROWS[r].route))
        .collect();
    let results: Mutex<HashMap<(usize, usize), Cell>> = Mutex::default();
    let next = Mutex::new(cells.iter());
    // Most of the time is spent waiting on deadlines: run cells in parallel.
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| loop {
                let Some(&(r, f)) = next.lock().unwrap().next() else {
                    break;
                };
                let cell = run_cell(&ROWS[r], FAULTS[f].0);
                results.lock().unwrap().insert((r, f), cell);
            });
        }
    });
    let results = results.into_inner().unwrap();

    let mut table = String::new();
    let label_width = ROWS.iter().map(|r| r.label.len()).max().unwrap_or(0);
    table.push_str(&format!("{:label_width$} ", "request \\ fault"));
    for (_, name) in FAULTS {
        table.push_str(&format!("{name:>6}"));
    }
    table.push('\n');
    let mut violations = Vec::new();
    for (r, row) in ROWS.iter().enumerate() {
        table.push_str(&format!("{:label_width$} ", row.label));
        for (f, (_, name)) in FAULTS.iter().enumerate() {
            let code = match results.get(&(r, f)) {
                None => "-".to_string(),
                Some(cell) => {
                    for v in &cell.violations {
                        violations.push(format!("{} × {name}: {} ({v})", row.label, cell.code));
                    }
                    if cell.violations.is_empty() {
                        cell.code.clone()
                    } else {
                        format!("!{}", cell.code)
                    }
                }
            };
            table.push_str(&format!("{code:>6}"));
        }
        table.push('\n');
    }
    println!(
        "\nfault matrix ({} cells): ok/to = confirmed result (exit frame / timed out after a confirmed DELETE), \
         exp = expired with proof, paus/del/gone = receipt with proof, rej/trn/inv = typed error, \
         CF:c/t/s/d = cleanup-failed (process-creation / process-termination / lease-setup / sandbox-deletion), \
         - = not applicable, ! = contract violated; faults deny/dns/refus/tls = refused before the request was sent, \
         term = connection closed after sending, reset = reset in the middle of the answer, \
         s:err/s:dsg/s:dsd = the sandbox answers state error/destroying/destroyed\n\n{table}",
        results.len()
    );
    assert!(
        violations.is_empty(),
        "{} contract violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}
