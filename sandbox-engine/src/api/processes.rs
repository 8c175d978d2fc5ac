//! Managed processes, their output stream, and one-shot `exec`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::envelope::{ok, success};
use super::sandboxes::require_running;
use super::{process, sandbox};
use crate::faults::FaultAction;
use crate::http::error::{cwd_error, over_budget, parse_json, start_failed, ApiError};
use crate::http::limits;
use crate::http::middleware::InjectedFault;
use crate::http::state::{blocking, detached, AppState, Shared};
use crate::machine::isolation::IsolationMode;
use crate::machine::pty::Winsize;
use crate::sandboxes::store::{Sandbox, Status};
use crate::sandboxes::supervisor::{build_env, Process, ReaderGuard, StartRequest};
use crate::storage::journal::{ExitStatus, Frame, Replay, Retention, StreamKind};

/// Default cwd when the request has none. The spec is silent; `/` is what a
/// process started by a VM agent most plausibly gets.
const DEFAULT_CWD: &str = "/";

/// Body of `POST .../processes` (and of `exec`, which ignores `env`/`cwd`
/// unless given).
#[derive(Debug, Deserialize)]
pub struct CreateBody {
    cmd: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// `exec` only: give up (and kill the tree) after this long.
    timeout_ms: Option<u64>,
    /// `process` (pipes, the default) or `pty` (a terminal).
    kind: Option<String>,
    /// A terminal's columns at start (an engine extension; default 80).
    cols: Option<u64>,
    /// A terminal's rows at start (an engine extension; default 24).
    rows: Option<u64>,
}

impl CreateBody {
    /// The terminal asked for (`kind: "pty"`), or none; a 400 for an
    /// unknown kind, a size out of bounds or a size for pipes.
    fn terminal(&self) -> Result<Option<Winsize>, ApiError> {
        match self.kind.as_deref() {
            None | Some("process") => {
                if self.cols.is_some() || self.rows.is_some() {
                    return Err(ApiError::bad_request(
                        "cols and rows are the size of a terminal; a process of kind \"process\" has pipes",
                    ));
                }
                Ok(None)
            }
            Some("pty") => {
                let d = Winsize::DEFAULT;
                Winsize::new(
                    self.cols.unwrap_or(d.cols.into()),
                    self.rows.unwrap_or(d.rows.into()),
                )
                .map(Some)
                .map_err(|e| ApiError::bad_request(e.to_string()))
            }
            Some(other) => Err(ApiError::bad_request(format!(
                "kind {:?} is not known; it is \"process\" (pipes) or \"pty\" (a terminal)",
                other.chars().take(64).collect::<String>()
            ))),
        }
    }
}

async fn start(
    state: &AppState,
    sb: &Sandbox,
    body: CreateBody,
    journal: Retention,
) -> Result<Arc<Process>, ApiError> {
    require_running(sb)?;
    let terminal = body.terminal()?;
    if terminal.is_some()
        && state.mode == IsolationMode::Bwrap
        && !crate::machine::available(&sb.root)
    {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            crate::machine::pty::NO_MACHINE,
        ));
    }
    let cmd = body
        .cmd
        .filter(|c| !c.is_empty())
        .ok_or_else(|| ApiError::bad_request("cmd is required"))?;
    if cmd.contains('\0')
        || body.args.iter().any(|a| a.contains('\0'))
        || body.env.values().any(|v| v.contains('\0'))
    {
        return Err(ApiError::bad_request(
            "cmd, args and env values must not contain NUL",
        ));
    }
    limits::name("cwd", body.cwd.as_deref())?;
    let total = limits::command(&cmd, &body.args)? + limits::env("env", &body.env)?;
    if total > limits::MAX_EXEC_TOTAL {
        return Err(ApiError::bad_request(format!(
            "cmd, args and env take {total} bytes; at most {} are accepted",
            limits::MAX_EXEC_TOTAL
        )));
    }
    let cwd = body.cwd.unwrap_or_else(|| DEFAULT_CWD.to_string());
    let root = sb.root.clone();
    let c = cwd.clone();
    let host_cwd = blocking(state, move || {
        crate::storage::sandbox_paths::resolve_dir(&root, &c)
    })
    .await?
    .map_err(|e| cwd_error(&cwd, e))?;
    let mut env =
        build_env(&state.mode, &sb.root, &sb.spec.env, &body.env).map_err(ApiError::bad_request)?;
    if terminal.is_some() && !env.iter().any(|(k, _)| k == "TERM") {
        // What a terminal program needs to know; the sandbox's env may say
        // otherwise.
        env.push(("TERM".to_string(), "xterm-256color".to_string()));
    }
    let id = format!("proc-{}", crate::util::random_hex(8));
    let req = StartRequest {
        cmd,
        args: body.args,
        cwd,
        host_cwd,
        env,
        root: sb.root.clone(),
        journal,
        output_budget: Some(state.output_budget.clone()),
        terminal,
        registries: state.registries.clone(),
    };
    Ok(Process::start(id, state.bwrap.clone(), &state.mode, req).await)
}

/// The most output one-shot `exec` keeps per stream: 8 MiB (its newest
/// bytes). Longer output is flagged as truncated in the result, never
/// silently dropped; use a managed process and `/connect` to stream more.
pub const EXEC_OUTPUT_CAP: usize = 8 * 1024 * 1024;

/// Starts a process and registers it in the sandbox, under an admission:
/// a sandbox delete that begins meanwhile waits for the registration and
/// then terminates the process; once a delete began, starts are refused.
async fn start_registered(
    state: &AppState,
    sb: &Arc<Sandbox>,
    body: CreateBody,
    retention: Retention,
) -> Result<Arc<Process>, ApiError> {
    let admission = state
        .store
        .admit_process(
            sb,
            &state.budgets,
            state.disk_budget.as_deref(),
            &state.registries.machines,
        )
        .map_err(over_budget)?;
    let _admission = admission.ok_or_else(|| {
        ApiError::conflict("sandbox is being deleted")
            .with_extra(json!({ "current_status": sb.status() }))
    })?;
    let p = start(state, sb, body, retention).await?;
    if let Some(why) = p.server_failure() {
        return Err(start_failed(why));
    }
    sb.add_process(p.clone());
    // A pause that began while this process was starting may have scanned
    // the sandbox before it was registered.
    if matches!(
        sb.status(),
        crate::sandboxes::store::Status::Pausing | crate::sandboxes::store::Status::Paused
    ) {
        p.freeze(true);
    }
    Ok(p)
}

/// `POST .../processes`. The process is registered before the answer is
/// sent, in a task of its own: a client that times out leaves a process that
/// sandbox delete and shutdown still find.
pub async fn create(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let body: CreateBody = parse_json(&body)?;
    let supervision = state.supervision.clone();
    let p = detached(&supervision, async move {
        start_registered(
            &state,
            &sb,
            body,
            Retention::Streamed(state.journal_capacity),
        )
        .await
    })
    .await?;
    Ok(success(StatusCode::CREATED, p.to_json()))
}

/// `POST .../exec`: runs to completion and answers the buffered output.
/// Processes the command left behind are terminated afterwards (a one-shot
/// command owns nothing that outlives it here). Each stream keeps at most
/// [`EXEC_OUTPUT_CAP`] bytes, its newest; beyond that the result says
/// `stdout_truncated` / `stderr_truncated: true` with the number of bytes
/// dropped from the start (`stdout_dropped_bytes`, `stderr_dropped_bytes`).
/// `timeout_ms` (an extension, default 10 minutes) bounds the run. While it runs, the exec is
/// registered like a managed process, so shutdown and sandbox delete
/// terminate it even if the client has gone away.
pub async fn exec(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let body: CreateBody = parse_json(&body)?;
    if body.kind.as_deref().is_some_and(|k| k != "process") {
        return Err(ApiError::bad_request(
            "exec runs commands with pipes; start a terminal as a managed process (kind \"pty\")",
        ));
    }
    let timeout = Duration::from_millis(body.timeout_ms.unwrap_or(600_000));
    let started = Instant::now();
    let supervision = state.supervision.clone();
    detached(&supervision, async move {
        let p = start_registered(&state, &sb, body, Retention::PerStream(EXEC_OUTPUT_CAP)).await?;
        p.close_stdin();
        let finished = p.wait(false, timeout).await;
        let t = p.terminate(Duration::from_millis(200)).await;
        if t.verified {
            sb.remove_process(&p.id);
        } else {
            eprintln!(
                "createos-local: exec {} left {} process(es) that could not be terminated",
                p.id,
                t.survivors.len()
            );
        }
        if !finished {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                "exec timed out; the command was terminated",
            ));
        }
        if let Some(why) = p.server_failure() {
            return Err(start_failed(why));
        }
        let exit_code = match p.exit() {
            Some(ExitStatus::Code(c)) => c,
            Some(ExitStatus::Signal(s)) => 128 + signal_number(&s),
            None => -1,
        };
        let (stdout, stdout_dropped) = p.collect(StreamKind::Stdout);
        let (stderr, stderr_dropped) = p.collect(StreamKind::Stderr);
        Ok(ok(json!({
            "result": {
                "exit_code": exit_code,
                "stdout": String::from_utf8_lossy(&stdout),
                "stderr": String::from_utf8_lossy(&stderr),
                "stdout_truncated": stdout_dropped > 0,
                "stderr_truncated": stderr_dropped > 0,
                "stdout_dropped_bytes": stdout_dropped,
                "stderr_dropped_bytes": stderr_dropped,
            },
            "exec_ms": started.elapsed().as_millis() as u64,
        })))
    })
    .await
}

fn signal_number(name: &str) -> i32 {
    crate::machine::isolation::signal_from_name(name).map_or(0, |s| s.as_raw())
}

/// `GET .../processes/{pid}`.
pub async fn get_one(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (_, p) = process(&state, &id, &pid)?;
    Ok(ok(p.to_json()))
}

/// `?grace_ms=`.
#[derive(Debug, Deserialize)]
pub struct DeleteQuery {
    grace_ms: Option<u64>,
}

/// `DELETE .../processes/{pid}?grace_ms=N` (default 1000, at most 60000):
/// SIGTERM to the whole tree, wait, SIGKILL the rest, verify with a fresh
/// scan. A verified process is forgotten (later requests get 404); an
/// unverified one stays so that a retry can try again.
pub async fn delete(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<DeleteQuery>,
    fault: Option<Extension<InjectedFault>>,
) -> Result<Response, ApiError> {
    let (sb, p) = process(&state, &id, &pid)?;
    let grace = Duration::from_millis(q.grace_ms.unwrap_or(1000).min(60_000));
    let (t, p) = detached(&state.supervision, async move {
        let t = p.terminate(grace).await;
        if t.verified {
            sb.remove_process(&p.id);
        }
        Ok((t, p))
    })
    .await?;
    let mut data = p.to_json();
    data["tree_exited"] = json!(t.verified);
    if matches!(
        fault,
        Some(Extension(InjectedFault(FaultAction::TreeNotExited)))
    ) {
        data["tree_exited"] = json!(false);
    }
    if !t.verified {
        data["survivors"] = json!(t.survivors);
    }
    Ok(ok(data))
}

/// `POST .../stdin/close`.
pub async fn close_stdin(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (_, p) = process(&state, &id, &pid)?;
    if p.is_terminal() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_a_pipe",
            "a terminal has no input pipe to close; send ^D (\\x04) as input to end a line \
             discipline's input, or signal or delete the process",
        ));
    }
    if p.close_stdin() {
        Ok(ok(json!({ "process_id": p.id, "stdin": "closed" })))
    } else {
        Err(ApiError::conflict("stdin is already closed"))
    }
}

/// Body of `POST .../signal`.
#[derive(Debug, Deserialize)]
pub struct SignalBody {
    signal: Option<String>,
}

/// `POST .../signal {signal}`: delivered to every process of the tree.
/// 409 while the sandbox is pausing, paused or resuming.
pub async fn signal(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (sb, p) = process(&state, &id, &pid)?;
    let body: SignalBody = parse_json(&body)?;
    limits::name("signal", body.signal.as_deref())?;
    let name = body.signal.unwrap_or_else(|| "SIGTERM".to_string());
    let sig = crate::machine::isolation::signal_from_name(&name)
        .ok_or_else(|| ApiError::bad_request(format!("unknown signal {name:?}")))?;
    // A command bwrap has not forked yet would miss the signal.
    p.command_forked().await;
    // A signal (SIGCONT above all) must not undo a pause behind the
    // sandbox's back. (Pause freezes the tree only after its transition
    // delay, after any signal that passed this check.)
    let status = sb.status();
    if matches!(status, Status::Pausing | Status::Paused | Status::Resuming) {
        return Err(ApiError::conflict(format!(
            "sandbox is {}; signals are refused until it is resumed",
            json!(status)
        ))
        .with_extra(json!({ "current_status": status })));
    }
    let hit = p.signal_now(sig);
    Ok(ok(
        json!({ "process_id": p.id, "signal": name, "delivered_to": hit }),
    ))
}

/// `?scope=&timeout_ms=`.
#[derive(Debug, Deserialize)]
pub struct WaitQuery {
    scope: Option<String>,
    timeout_ms: Option<u64>,
}

/// `GET .../wait?scope=tree|process&timeout_ms=N` (default 30 s, at most
/// 10 min): 408 with the ManagedProcess in `data` when it timed out.
pub async fn wait(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> Result<Response, ApiError> {
    let (_, p) = process(&state, &id, &pid)?;
    let tree = match q.scope.as_deref() {
        None | Some("tree") => true,
        Some("process") | Some("leader") => false,
        Some(other) => return Err(ApiError::bad_request(format!("unknown scope {other:?}"))),
    };
    let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(30_000).min(600_000));
    if p.wait(tree, timeout).await {
        Ok(ok(p.to_json()))
    } else {
        Err(
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "timeout", "wait timed out")
                .with_extra(p.to_json()),
        )
    }
}

/// `?after=`.
#[derive(Debug, Deserialize)]
pub struct ConnectQuery {
    after: Option<u64>,
}

/// Heartbeat interval of `/connect`.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Appends the NDJSON line of a data frame to `out`, the base64 written in
/// place: the same object `serde_json` would give (the payload needs no
/// escaping), without building a JSON value and re-scanning the payload.
fn data_line(out: &mut Vec<u8>, f: &Frame, terminal: bool) {
    let stream = match f.stream {
        // A terminal's output is one stream (kept as stdout).
        _ if terminal => "pty",
        StreamKind::Stdout => "stdout",
        StreamKind::Stderr => "stderr",
    };
    let head = format!(
        "{{\"type\":\"data\",\"seq\":{},\"stream\":\"{stream}\",\"data_base64\":\"",
        f.seq
    );
    let engine = &base64_simd::STANDARD;
    let encoded = engine.encoded_length(f.data.len());
    out.reserve(head.len() + encoded + 3);
    out.extend_from_slice(head.as_bytes());
    let start = out.len();
    out.resize(start + encoded, 0);
    let written = engine
        .encode(&f.data, base64_simd::Out::from_slice(&mut out[start..]))
        .len();
    out.truncate(start + written);
    out.extend_from_slice(b"\"}\n");
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

fn exit_line(e: &ExitStatus) -> Vec<u8> {
    match e {
        ExitStatus::Code(c) => line(&json!({ "type": "exit", "exit_code": c })),
        ExitStatus::Signal(s) => line(&json!({ "type": "exit", "signal": s })),
    }
}

struct Follow {
    proc: Arc<Process>,
    rx: tokio::sync::watch::Receiver<u64>,
    cursor: u64,
    /// This stream as an attached reader: what it has not sent is kept,
    /// and the process waits for it (backpressure).
    reader: Option<ReaderGuard>,
    sent: u64,
    fault: Option<FaultAction>,
    abort_next: bool,
    /// A `stall_after_frames` fault was reached: send nothing more, never end.
    stall: bool,
    done: bool,
}

enum Step {
    Chunk(Vec<u8>),
    Abort,
    End,
}

impl Follow {
    async fn next(&mut self) -> Step {
        if self.done {
            return Step::End;
        }
        if self.stall {
            futures_util::future::pending::<()>().await;
        }
        if self.abort_next {
            return self.next_abort();
        }
        loop {
            self.rx.borrow_and_update();
            let (replay, exit) = self
                .proc
                .with_journal(|j| (j.after(self.cursor), j.exit().cloned()));
            let frames = match replay {
                Replay::Expired => {
                    self.done = true;
                    return Step::Chunk(line(
                        &json!({ "type": "error", "error": "output_offset_expired" }),
                    ));
                }
                Replay::Frames(f) => f,
            };
            if !frames.is_empty() {
                return self.frames(frames);
            }
            if let Some(e) = exit {
                self.done = true;
                return Step::Chunk(exit_line(&e));
            }
            match tokio::time::timeout(HEARTBEAT, self.rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    self.done = true;
                    return Step::End;
                }
                Err(_) => return Step::Chunk(line(&json!({ "type": "heartbeat" }))),
            }
        }
    }

    fn frames(&mut self, frames: Vec<Frame>) -> Step {
        let limit = match &self.fault {
            Some(FaultAction::ResetAfterFrames { frames })
            | Some(FaultAction::StallAfterFrames { frames })
            | Some(FaultAction::MalformedFrame { frames }) => Some(*frames),
            _ => None,
        };
        let mut out = Vec::new();
        let terminal = self.proc.is_terminal();
        for f in frames {
            if limit.is_some_and(|l| self.sent >= l) {
                break;
            }
            data_line(&mut out, &f, terminal);
            self.cursor = f.seq;
            self.sent += 1;
        }
        // Handed to the connection, which asks for more only once it has
        // written this: frames up to the cursor may go, and the pipes may
        // be read again.
        if let Some(reader) = &self.reader {
            reader.advance(self.cursor);
        }
        if limit.is_some_and(|l| self.sent >= l) {
            match self.fault.take() {
                Some(FaultAction::ResetAfterFrames { .. }) => {
                    self.abort_next = true;
                    if out.is_empty() {
                        return self.next_abort();
                    }
                }
                Some(FaultAction::StallAfterFrames { .. }) => self.stall = true,
                Some(FaultAction::MalformedFrame { .. }) => {
                    out.extend_from_slice(b"{\"type\":\"data\",\"seq\":\"not-a-number\",\n");
                    self.done = true;
                }
                _ => {}
            }
        }
        Step::Chunk(out)
    }

    fn next_abort(&mut self) -> Step {
        self.abort_next = false;
        self.done = true;
        Step::Abort
    }
}

/// `GET .../connect?after=N`: NDJSON frames with `seq > N`, then live output
/// until the exit frame. 410 when frames after `N` were evicted; 400 (with
/// `newest_seq`) when `N` is beyond the newest frame written so far.
pub async fn connect(
    State(state): State<Shared>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<ConnectQuery>,
    fault: Option<Extension<InjectedFault>>,
) -> Result<Response, ApiError> {
    let (_, p) = process(&state, &id, &pid)?;
    let after = q.after.unwrap_or(0);
    let rx = p.subscribe();
    // Attached at once, so nothing after the cursor is evicted from here on;
    // the guard detaches when the stream ends or the client goes away.
    let (reader, ()) = p.attach_reader(|j| {
        let newest = j.newest_seq();
        if after > newest {
            return Err(ApiError::bad_request(format!(
                "after={after} is beyond the newest output frame ({newest})"
            ))
            .with_extra(json!({ "newest_seq": newest })));
        }
        if matches!(j.after(after), Replay::Expired) {
            return Err(ApiError::new(
                StatusCode::GONE,
                "output_offset_expired",
                "output after this cursor was evicted",
            )
            .with_extra(
                json!({ "error": "output_offset_expired", "oldest_seq": j.oldest_seq() }),
            ));
        }
        Ok((after, ()))
    })?;
    let fault_kind = fault.map(|Extension(InjectedFault(f))| f);
    let mut follow = Follow {
        proc: p,
        rx,
        cursor: after,
        reader,
        sent: 0,
        stall: matches!(
            fault_kind,
            Some(FaultAction::StallAfterFrames { frames: 0 })
        ),
        fault: fault_kind,
        abort_next: false,
        done: false,
    };
    if matches!(
        follow.fault,
        Some(FaultAction::ResetAfterFrames { frames: 0 })
    ) {
        follow.abort_next = true;
    }
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        match f.next().await {
            Step::Chunk(c) => Some((Ok::<_, std::io::Error>(Bytes::from(c)), f)),
            Step::Abort => {
                // Let hyper flush the frames already produced; an error right
                // away can discard its write buffer.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let err = std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected connection reset",
                );
                Some((Err(err), f))
            }
            Step::End => None,
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}
