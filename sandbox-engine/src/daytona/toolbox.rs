//! The toolbox face's process API: sessions, commands run in them, their
//! logs, and the one-shot `process/execute`. Reached at
//! `{toolboxProxyUrl}/{sandboxId}/...`.
//!
//! Each session command runs as its own process tree (`bash -c COMMAND`,
//! or `sh -c` where bash is missing) under the same isolation as the
//! CreateOS face. Unlike the real service, where a session is one
//! long-lived shell, nothing carries over between the commands of a
//! session (`cd`, `export`): put what a command needs into its text.
//! Also unlike the service, a spent session (every command it started
//! finished and was dropped by the finished-process retention) is dropped
//! and answers 404 like a deleted one (see
//! [`crate::sandboxes::daytona_registry::DaytonaSandbox::retire_commands`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, Query, State, WebSocketUpgrade};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::DaytonaError;
use super::log_socket::SDK_VERSION_HEADER;
use super::sandboxes::{daytona_sandbox, uuid};
use crate::faults::FaultAction;
use crate::http::error::parse_json;
use crate::http::limits;
use crate::http::middleware::InjectedFault;
use crate::http::state::detached;
use crate::http::state::{AppState, Shared};
use crate::network::connections::ConnectionSlot;
use crate::sandboxes::daytona_registry::{
    exit_code, terminate_verified, Command, DaytonaSandbox, Session, State as SbState,
};
use crate::sandboxes::supervisor::{build_env, Process, ReaderGuard, StartRequest};
use crate::storage::journal::{Frame, Journal, Replay, Retention, StreamKind};

/// Marker before each stdout chunk in a command's logs (as the real
/// service's log format).
pub const STDOUT_PREFIX: &[u8] = &[1, 1, 1];

/// Marker before each stderr chunk in a command's logs.
pub const STDERR_PREFIX: &[u8] = &[2, 2, 2];

/// Working directory of every command unless `process/execute` names one:
/// the sandbox user's home.
pub const WORK_DIR: &str = "/root";

/// Default timeout of `process/execute` when none (or 0) is given, as the
/// real daemon: 360 s.
const EXECUTE_TIMEOUT: Duration = Duration::from_secs(360);

/// The most output one `process/execute` keeps (its newest bytes).
const EXECUTE_OUTPUT_CAP: usize = 8 * 1024 * 1024;

/// Longest `sessionId`.
const MAX_SESSION_ID: usize = 256;

fn shell() -> &'static str {
    // Process-wide: a fact of the host (which shell it has), looked up once.
    static SHELL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    SHELL.get_or_init(|| {
        if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    })
}

pub(super) fn session_of(sb: &DaytonaSandbox, id: &str) -> Result<Arc<Session>, DaytonaError> {
    sb.session(id)
        .ok_or_else(|| DaytonaError::not_found("session"))
}

pub(super) fn command_of(session: &Session, id: &str) -> Result<Arc<Command>, DaytonaError> {
    session
        .command(id)
        .ok_or_else(|| DaytonaError::not_found("command"))
}

/// 409 unless the sandbox is `started`.
pub(super) fn require_started(sb: &DaytonaSandbox) -> Result<(), DaytonaError> {
    match sb.state() {
        SbState::Started => Ok(()),
        other => Err(DaytonaError::conflict(format!(
            "sandbox is {}; the toolbox answers only while it is started",
            json!(other)
        ))),
    }
}

/// Starts one process in the sandbox under an admission (a stop or delete
/// that begins meanwhile waits for it and then terminates it).
async fn start_process(
    state: &AppState,
    sb: &Arc<DaytonaSandbox>,
    argv: Vec<String>,
    cwd: String,
    journal: Retention,
    extra_env: &BTreeMap<String, String>,
) -> Result<Arc<Process>, DaytonaError> {
    require_started(sb)?;
    let _admission = state
        .store
        .admit_process(
            &sb.core,
            &state.budgets,
            state.disk_budget.as_deref(),
            &state.registries.machines,
        )
        .map_err(crate::http::error::over_budget)?
        .ok_or_else(|| DaytonaError::conflict("sandbox is stopping or being deleted"))?;
    let root = sb.core.root.clone();
    let c = cwd.clone();
    let host_cwd = crate::http::state::blocking(state, move || {
        crate::storage::sandbox_paths::resolve_dir(&root, &c)
    })
    .await?
    .map_err(|e| crate::http::error::cwd_error(&cwd, e))?;
    let mut env = build_env(&state.mode, &sb.core.root, &sb.spec.env, &BTreeMap::new())
        .map_err(DaytonaError::internal)?;
    // Variables of this command alone (`process/execute`'s `envs`).
    env.retain(|(name, _)| !extra_env.contains_key(name));
    env.extend(extra_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut argv = argv.into_iter();
    let cmd = argv
        .next()
        .ok_or_else(|| DaytonaError::bad_request("empty command"))?;
    let req = StartRequest {
        cmd,
        args: argv.collect(),
        cwd,
        host_cwd,
        env,
        root: sb.core.root.clone(),
        journal,
        output_budget: Some(state.output_budget.clone()),
        terminal: None,
        registries: state.registries.clone(),
    };
    let id = format!("proc-{}", crate::util::random_hex(8));
    let p = Process::start(id, state.bwrap.clone(), &state.mode, req).await;
    if let Some(why) = p.server_failure() {
        return Err(crate::http::error::start_failed(why).into());
    }
    sb.core.add_process(p.clone());
    Ok(p)
}

/// Waits (without a limit) until the leader's exit is recorded, which
/// happens only after its output was read to the end.
async fn exited(p: &Process) {
    let mut rx = p.subscribe();
    loop {
        rx.borrow_and_update();
        if p.exit().is_some() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Body of `POST /process/session`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSessionBody {
    session_id: Option<String>,
}

/// `POST /process/session {"sessionId"}`: 201, empty body; 409 when the id
/// is taken.
pub async fn create_session(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let body: CreateSessionBody = parse_json(&body)?;
    let sid = body
        .session_id
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| DaytonaError::bad_request("sessionId is required"))?;
    if sid.len() > MAX_SESSION_ID || sid.contains(['/', '\0']) {
        return Err(DaytonaError::bad_request(format!(
            "sessionId must be at most {MAX_SESSION_ID} bytes without '/' or NUL"
        )));
    }
    require_started(&sb)?;
    if !sb.add_session(Arc::new(Session::new(sid))) {
        return Err(DaytonaError::conflict("session already exists"));
    }
    Ok(StatusCode::CREATED.into_response())
}

fn command_json(c: &Command) -> Value {
    let mut v = json!({ "id": c.id, "command": c.command });
    if let Some(code) = c.exit_code() {
        v["exitCode"] = json!(code);
    }
    v
}

fn session_json(s: &Session) -> Value {
    let commands: Vec<Value> = s.commands().iter().map(|c| command_json(c)).collect();
    json!({ "sessionId": s.id, "commands": commands })
}

/// `GET /process/session`: every session with its commands.
pub async fn list_sessions(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let all: Vec<Value> = sb.sessions().iter().map(|s| session_json(s)).collect();
    Ok(Json(Value::Array(all)).into_response())
}

/// `GET /process/session/{sessionId}`.
pub async fn get_session(
    State(state): State<Shared>,
    Path((id, sid)): Path<(String, String)>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let s = session_of(&sb, &sid)?;
    Ok(Json(session_json(&s)).into_response())
}

/// `DELETE /process/session/{sessionId}`: terminates the process tree of
/// every command the session started (SIGTERM, 500 ms grace, SIGKILL, a
/// fresh scan) and answers 204 only when all are verified gone. Otherwise
/// 500 naming the survivors; the session stays (without accepting new
/// commands) so that a retry terminates again.
pub async fn delete_session(
    State(state): State<Shared>,
    Path((id, sid)): Path<(String, String)>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let session = session_of(&sb, &sid)?;
    let s = session.clone();
    let core = sb.core.clone();
    let survivors = detached(&state.supervision, async move {
        // A command start under way finishes (and is terminated below);
        // none starts after this.
        *s.gate.lock().await = true;
        let terminations = s.commands().into_iter().map(|c| async move {
            let t = terminate_verified(&c.process, Duration::from_millis(500)).await;
            (c, t)
        });
        let mut survivors = Vec::new();
        for (c, t) in futures_util::future::join_all(terminations).await {
            if t.verified {
                core.remove_process(&c.process.id);
            } else {
                survivors.extend(t.survivors);
            }
        }
        Ok(survivors)
    })
    .await?;
    if !survivors.is_empty() {
        return Err(DaytonaError::internal(format!(
            "{} process(es) of session {sid:?} survived termination (host pids {survivors:?}); \
             they may still run; delete the session again",
            survivors.len()
        )));
    }
    sb.remove_session(&sid);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Body of `POST /process/session/{sessionId}/exec`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecBody {
    command: Option<String>,
    #[serde(default)]
    run_async: bool,
    #[serde(default, rename = "async")]
    is_async: bool,
    #[serde(default)]
    #[allow(dead_code)] // accepted for compatibility: nothing is echoed locally
    suppress_input_echo: bool,
}

/// The logs of a command as the real service writes them: each chunk
/// preceded by [`STDOUT_PREFIX`] or [`STDERR_PREFIX`].
fn labelled(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(match f.stream {
            StreamKind::Stdout => STDOUT_PREFIX,
            StreamKind::Stderr => STDERR_PREFIX,
        });
        out.extend_from_slice(&f.data);
    }
    out
}

fn only(frames: &[Frame], stream: StreamKind) -> String {
    let bytes: Vec<u8> = frames
        .iter()
        .filter(|f| f.stream == stream)
        .flat_map(|f| f.data.iter().copied())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every retained frame, and whether older ones were evicted.
fn retained(p: &Process) -> (Vec<Frame>, bool) {
    p.with_journal(retained_in)
}

fn retained_in(j: &Journal) -> (Vec<Frame>, bool) {
    match j.after(0) {
        Replay::Frames(f) => (f, false),
        Replay::Expired => match j.after(j.oldest_seq().saturating_sub(1)) {
            Replay::Frames(f) => (f, true),
            Replay::Expired => (Vec::new(), true),
        },
    }
}

/// The retained log as a logs answer starts it: its frames, whether older
/// ones were evicted, and the byte offset of its first byte in the whole
/// labelled log (see [`LOG_OFFSET_HEADER`]).
fn log_snapshot(j: &Journal) -> (Vec<Frame>, bool, u64) {
    let (frames, evicted) = retained_in(j);
    (
        frames,
        evicted,
        j.evicted_log_bytes(STDOUT_PREFIX.len() as u64),
    )
}

/// `POST /process/session/{sessionId}/exec {"command","runAsync"}`:
/// with `runAsync` (or `async`) 202 `{"cmdId"}` at once; otherwise 200
/// `{"cmdId","output","stdout","stderr","exitCode"}` when the command has
/// exited (no server-side time limit, as the real service). `output` is
/// the labelled log (see [`labelled`]). When the start of the output was
/// evicted (more than `journal_capacity` bytes), `outputTruncated: true`.
pub async fn session_exec(
    State(state): State<Shared>,
    Path((id, sid)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let session = session_of(&sb, &sid)?;
    let body: ExecBody = parse_json(&body)?;
    let command = body
        .command
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| DaytonaError::bad_request("command cannot be empty"))?;
    if command.len() > limits::MAX_ARG || command.contains('\0') {
        return Err(DaytonaError::bad_request(format!(
            "command must be at most {} bytes without NUL",
            limits::MAX_ARG
        )));
    }
    let run_async = body.run_async || body.is_async;
    let st = state.clone();
    let cmd = detached(&state.supervision.clone(), async move {
        let gate = session.gate.lock().await;
        if *gate {
            return Err(DaytonaError::not_found("session").0);
        }
        let argv = vec![shell().to_string(), "-c".to_string(), command.clone()];
        // A command run in the background is followed through its logs:
        // its journal holds output for that follower (backpressure). A
        // synchronous one answers its retained output at the end.
        let journal = if run_async {
            Retention::Streamed(st.journal_capacity)
        } else {
            Retention::Total(st.journal_capacity)
        };
        let p = start_process(
            &st,
            &sb,
            argv,
            WORK_DIR.to_string(),
            journal,
            &BTreeMap::new(),
        )
        .await
        .map_err(|e| e.0)?;
        let c = Arc::new(Command {
            id: uuid(),
            command,
            process: p,
        });
        session.add_command(c.clone());
        drop(gate);
        Ok(c)
    })
    .await?;
    if run_async {
        return Ok((StatusCode::ACCEPTED, Json(json!({ "cmdId": cmd.id }))).into_response());
    }
    // A synchronous command reads end-of-file on stdin, as on the real
    // service; an asynchronous one keeps an open, empty stdin.
    cmd.process.close_stdin();
    exited(&cmd.process).await;
    if let Some(why) = cmd.process.server_failure() {
        return Err(crate::http::error::start_failed(why).into());
    }
    let (frames, evicted) = retained(&cmd.process);
    let mut v = json!({
        "cmdId": cmd.id,
        "output": String::from_utf8_lossy(&labelled(&frames)),
        "stdout": only(&frames, StreamKind::Stdout),
        "stderr": only(&frames, StreamKind::Stderr),
        "exitCode": cmd.exit_code(),
    });
    if evicted {
        // Never a silently shortened result.
        v["outputTruncated"] = json!(true);
    }
    Ok(Json(v).into_response())
}

/// `GET /process/session/{sessionId}/command/{commandId}`: `{"id",
/// "command","exitCode"}`; `exitCode` appears once the command exited and
/// its output was read to the end.
pub async fn get_command(
    State(state): State<Shared>,
    Path((id, sid, cid)): Path<(String, String, String)>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let session = session_of(&sb, &sid)?;
    let c = command_of(&session, &cid)?;
    Ok(Json(command_json(&c)).into_response())
}

/// `POST /process/session/{sessionId}/command/{commandId}/terminate`:
/// terminates the command's process tree; 204 when verified gone, 500
/// otherwise.
pub async fn terminate_command(
    State(state): State<Shared>,
    Path((id, sid, cid)): Path<(String, String, String)>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let session = session_of(&sb, &sid)?;
    let c = command_of(&session, &cid)?;
    let p = c.process.clone();
    let t = detached(&state.supervision, async move {
        Ok(terminate_verified(&p, Duration::from_millis(500)).await)
    })
    .await?;
    if !t.verified {
        return Err(DaytonaError::internal(format!(
            "{} process(es) of command {cid} survived termination (host pids {:?}); they may still run",
            t.survivors.len(),
            t.survivors
        )));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The header that asks for the logs with their stream markers.
pub const SPLIT_OUTPUT_HEADER: &str = "x-daytona-split-output";

/// Whether a logs request gets the labelled log (see [`labelled`]) or the
/// combined text with the markers removed, as the real daemon decides:
/// labelled when `X-Daytona-Split-Output: true` is sent without an SDK
/// version, or when an SDK version of 0.27 or later (one that demuxes) is
/// sent; combined otherwise.
pub fn wants_split(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match text(SDK_VERSION_HEADER)
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        Some(version) => !sdk_predates_split(version),
        None => text(SPLIT_OUTPUT_HEADER) == Some("true"),
    }
}

/// True for an SDK version before 0.27.0 (`0.0.0-dev` excepted); a
/// version that does not parse counts as a new one.
fn sdk_predates_split(version: &str) -> bool {
    if version == "0.0.0-dev" {
        return false;
    }
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) < (0, 27),
        _ => false,
    }
}

/// Whether a logs request asks for JSON (`Accept` naming
/// `application/json`, as the current SDKs send it): then a plain read
/// answers `{"output","stdout","stderr"}`.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().split(';').next() == Some("application/json"))
}

/// A command's frames as a logs answer: labelled, or combined.
fn rendered(frames: &[Frame], split: bool) -> Vec<u8> {
    if split {
        labelled(frames)
    } else {
        frames.iter().flat_map(|f| f.data.iter().copied()).collect()
    }
}

/// Whether a request asks to become a WebSocket (`Upgrade: websocket`).
fn asks_for_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `?follow=`.
#[derive(Debug, Deserialize)]
pub struct LogsQuery {
    follow: Option<bool>,
}

/// Header set when the start of a command's output was evicted (the logs
/// keep the newest `journal_capacity` bytes): the body is not the whole
/// output.
pub const EVICTED_HEADER: &str = "x-createos-local-output-evicted";

/// Header on every logs answer (a local extension): the byte offset of the
/// body's first byte in the command's whole labelled log, that is how many
/// bytes of it were evicted before. A client that has taken `n` bytes of
/// the log skips `n - offset` bytes of the body (and has lost output when
/// the offset exceeds `n`). The real daemon keeps the whole log, so
/// without this header the offset is 0.
pub const LOG_OFFSET_HEADER: &str = "x-createos-local-log-offset";

/// `GET /process/session/{sessionId}/command/{commandId}/logs[?follow=true]`:
/// `text/plain`, each chunk labelled (see [`labelled`]) when the request
/// asks for split output ([`wants_split`]), else stdout and stderr combined
/// without markers, as the real daemon answers. Without `follow`:
/// the output so far. With `follow=true` (over plain HTTP; the real service
/// follows only over WebSocket and answers plain HTTP with the output so
/// far): the output so far, then live output, and the body ends once the
/// command has exited and its output was read to the end. A WebSocket
/// upgrade gets the same pieces as binary messages ([`super::log_socket`]),
/// as the SDKs' log callbacks expect.
#[allow(clippy::too_many_arguments)]
pub async fn logs(
    State(state): State<Shared>,
    Path((id, sid, cid)): Path<(String, String, String)>,
    Query(q): Query<LogsQuery>,
    headers: HeaderMap,
    fault: Option<Extension<InjectedFault>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    slot: Option<Extension<ConnectionSlot>>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let session = session_of(&sb, &sid)?;
    let c = command_of(&session, &cid)?;
    let upgrade = match upgrade {
        Ok(upgrade) => Some(upgrade),
        Err(rejection) if asks_for_websocket(&headers) => {
            return Err(DaytonaError::bad_request(format!(
                "the WebSocket upgrade for these logs was refused: {rejection}"
            )))
        }
        Err(_) => None,
    };
    let slot = slot.and_then(|Extension(slot)| slot.take());
    let p = c.process.clone();
    let rx = p.subscribe();
    let follow = q.follow.unwrap_or(false);
    // A follower is attached (as the `/connect` streams are) atomically with
    // the snapshot it starts from: what it has not sent is never evicted,
    // and the command waits for it (backpressure).
    let (reader, (frames, evicted, offset)) = if follow {
        p.attach_reader(|j| {
            let snapshot = log_snapshot(j);
            let start = snapshot
                .0
                .first()
                .map_or(j.newest_seq(), |f| f.seq.saturating_sub(1));
            Ok::<_, std::convert::Infallible>((start, snapshot))
        })
        .unwrap_or_else(|never| match never {})
    } else {
        (None, p.with_journal(log_snapshot))
    };
    // The newest frame is always retained: no frame means none was written.
    let cursor = frames.last().map_or(0, |f| f.seq);
    let split = wants_split(&headers);
    let first = rendered(&frames, split);
    let mut builder = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(LOG_OFFSET_HEADER, offset.to_string());
    if evicted {
        builder = builder.header(EVICTED_HEADER, "true");
    }
    if !follow {
        if let Some(upgrade) = upgrade {
            let once = futures_util::stream::iter([Ok(Bytes::from(first))]);
            return Ok(super::log_socket::serve(upgrade, &headers, slot, once));
        }
        if wants_json(&headers) {
            // The current clients ask for JSON: the three views at once.
            let mut v = json!({
                "output": String::from_utf8_lossy(&rendered(&frames, false)),
                "stdout": only(&frames, StreamKind::Stdout),
                "stderr": only(&frames, StreamKind::Stderr),
            });
            if evicted {
                v["outputTruncated"] = json!(true);
            }
            let mut response = Json(v).into_response();
            if evicted {
                response
                    .headers_mut()
                    .insert(EVICTED_HEADER, header::HeaderValue::from_static("true"));
            }
            return Ok(response);
        }
        return builder
            .body(Body::from(first))
            .map_err(|e| DaytonaError::internal(e.to_string()));
    }
    let limit = match fault.map(|Extension(InjectedFault(f))| f) {
        Some(FaultAction::ResetAfterFrames { frames }) => Some((frames, false)),
        Some(FaultAction::StallAfterFrames { frames }) => Some((frames, true)),
        _ => None,
    };
    // Under a frame-limited fault, the output so far is replayed frame by
    // frame so that the limit counts frames.
    let (first, cursor) = match limit {
        None => (Some(first), cursor),
        Some(_) => (None, frames.first().map_or(cursor, |f| f.seq - 1)),
    };
    let follow = LogFollow {
        proc: p,
        rx,
        cursor,
        reader,
        first,
        sent: 0,
        limit,
        done: false,
        split,
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        f.next().await.map(|item| (item, f))
    });
    if let Some(upgrade) = upgrade {
        return Ok(super::log_socket::serve(upgrade, &headers, slot, stream));
    }
    builder
        .body(Body::from_stream(stream))
        .map_err(|e| DaytonaError::internal(e.to_string()))
}

/// A follower of one command's logs.
struct LogFollow {
    proc: Arc<Process>,
    rx: tokio::sync::watch::Receiver<u64>,
    cursor: u64,
    /// This follower as an attached reader (see [`logs`]).
    reader: Option<ReaderGuard>,
    /// The output so far, sent first.
    first: Option<Vec<u8>>,
    sent: u64,
    /// An injected fault: after this many frames, abort (`false`) or stall
    /// forever (`true`).
    limit: Option<(u64, bool)>,
    done: bool,
    /// Labelled (`true`) or combined output ([`wants_split`]).
    split: bool,
}

impl LogFollow {
    /// Everything up to the cursor is handed to the connection (which asks
    /// for more only once it has written it).
    fn advance(&self) {
        if let Some(reader) = &self.reader {
            reader.advance(self.cursor);
        }
    }

    async fn next(&mut self) -> Option<std::io::Result<Bytes>> {
        if self.done {
            return None;
        }
        if let Some((limit, stall)) = self.limit {
            if self.sent >= limit {
                if stall {
                    futures_util::future::pending::<()>().await;
                }
                self.done = true;
                // Let hyper flush what was produced before failing the body.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected connection reset",
                )));
            }
        }
        if let Some(first) = self.first.take() {
            self.advance();
            if !first.is_empty() {
                return Some(Ok(Bytes::from(first)));
            }
        }
        loop {
            self.rx.borrow_and_update();
            let (replay, exit) = self
                .proc
                .with_journal(|j| (j.after(self.cursor), j.exit().is_some()));
            match replay {
                Replay::Expired => {
                    // The follower fell behind the journal: output was lost,
                    // so the body fails rather than silently skipping it.
                    self.done = true;
                    return Some(Err(std::io::Error::other(
                        "log output was evicted before it could be sent",
                    )));
                }
                Replay::Frames(frames) if !frames.is_empty() => {
                    let frames = match self.limit {
                        Some((limit, _)) => {
                            let room = limit.saturating_sub(self.sent) as usize;
                            frames.into_iter().take(room.max(1)).collect::<Vec<_>>()
                        }
                        None => frames,
                    };
                    if let Some(last) = frames.last() {
                        self.cursor = last.seq;
                    }
                    self.advance();
                    self.sent += frames.len() as u64;
                    return Some(Ok(Bytes::from(rendered(&frames, self.split))));
                }
                Replay::Frames(_) if exit => {
                    self.done = true;
                    return None;
                }
                Replay::Frames(_) => {}
            }
            if self.rx.changed().await.is_err() {
                self.done = true;
                return None;
            }
        }
    }
}

/// Body of `POST /process/execute`.
#[derive(Debug, Deserialize)]
pub struct ExecuteBody {
    command: Option<String>,
    cwd: Option<String>,
    /// Seconds; absent or 0: 360 s.
    timeout: Option<u64>,
    /// Variables for this command alone (names must be shell names).
    #[serde(default)]
    envs: BTreeMap<String, String>,
}

/// `POST /process/execute {"command","cwd","timeout","envs"}`: runs
/// `command` through a shell (`bash -c`, or `sh -c`), as the current
/// daemon does, with `envs` added to the sandbox's environment; answers
/// 200 `{"exitCode","result"}` (stdout and stderr through one pipe, in
/// the order printed). What the command left in the background keeps
/// running, as on the daemon (a sandbox is one machine). 408 after
/// `timeout` seconds (the tree is terminated).
pub async fn execute(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let body: ExecuteBody = parse_json(&body)?;
    let command = body
        .command
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| DaytonaError::bad_request("command is required"))?;
    if command.len() > limits::MAX_ARG || command.contains('\0') {
        return Err(DaytonaError::bad_request(format!(
            "command must be at most {} bytes without NUL",
            limits::MAX_ARG
        )));
    }
    limits::name("cwd", body.cwd.as_deref())?;
    if let Some((name, _)) = body.envs.iter().find(|(k, v)| {
        !super::sandboxes::valid_env_name(k) || v.contains('\0') || k.len() > limits::MAX_ARG
    }) {
        return Err(DaytonaError::bad_request(format!(
            "envs: {:?} is not a variable name (letters, digits, _; not first a digit) \
             or its value holds NUL",
            name.escape_default().to_string()
        )));
    }
    // One pipe for both streams, as the daemon's combined output: the
    // shell is started with its stderr on its stdout (`sh` execs it, so
    // the tree is the same), and the answer keeps the order printed.
    let argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "exec \"$0\" -c \"$1\" 2>&1".to_string(),
        shell().to_string(),
        command,
    ];
    let envs = body.envs;
    let cwd = body.cwd.unwrap_or_else(|| WORK_DIR.to_string());
    let timeout = match body.timeout {
        None | Some(0) => EXECUTE_TIMEOUT,
        Some(s) => Duration::from_secs(s.min(24 * 3600)),
    };
    let st = state.clone();
    let (p, finished) = detached(&state.supervision.clone(), async move {
        let p = start_process(
            &st,
            &sb,
            argv,
            cwd,
            Retention::Total(EXECUTE_OUTPUT_CAP),
            &envs,
        )
        .await
        .map_err(|e| e.0)?;
        p.close_stdin();
        let finished = tokio::time::timeout(timeout, exited(&p)).await.is_ok();
        if !finished {
            // Only a timeout ends the tree, as the daemon kills the
            // command's group then; what a command that exited left in
            // the background keeps running (a sandbox is one machine)
            // until the sandbox stops or is deleted.
            let t = terminate_verified(&p, Duration::from_millis(200)).await;
            if t.verified {
                sb.core.remove_process(&p.id);
            } else {
                eprintln!(
                    "createos-local: process/execute {} left {} process(es) that could not be \
                     terminated",
                    p.id,
                    t.survivors.len()
                );
            }
        }
        Ok((p, finished))
    })
    .await?;
    if !finished {
        return Err(DaytonaError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            "command execution timeout; the command was terminated",
        ));
    }
    if let Some(why) = p.server_failure() {
        return Err(crate::http::error::start_failed(why).into());
    }
    let (frames, evicted) = retained(&p);
    let result: Vec<u8> = frames.iter().flat_map(|f| f.data.iter().copied()).collect();
    let mut v = json!({
        "exitCode": p.exit().map(|e| exit_code(&e)),
        "result": String::from_utf8_lossy(&result),
    });
    if evicted {
        v["resultTruncated"] = json!(true);
    }
    Ok(Json(v).into_response())
}

/// `GET /work-dir` and `GET /user-home-dir`: `{"dir":"/root"}`.
pub async fn work_dir(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    daytona_sandbox(&state, &id)?;
    Ok(Json(json!({ "dir": WORK_DIR })).into_response())
}

/// `GET /version`.
pub async fn version(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    daytona_sandbox(&state, &id)?;
    Ok(
        Json(json!({ "version": concat!("createos-local ", env!("CARGO_PKG_VERSION")) }))
            .into_response(),
    )
}
