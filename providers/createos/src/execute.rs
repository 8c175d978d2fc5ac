//! Running one command: the spec's execute steps 1–9.
//!
//! After the process is created, every path that did not see a valid exit
//! frame (deadline, cancellation, stream error, sequence gap, 410, bad
//! frame) ends with `DELETE .../processes/{pid}?grace_ms=1000` under a fresh
//! deadline. Only `tree_exited: true` or a 404 confirms termination; anything
//! else replaces the outcome with `cleanup-failed`, carrying the output
//! captured so far. When termination is confirmed, the error of the path
//! (`cancelled`, a rejection, a transport failure, an invalid stream)
//! carries that output too.
//!
//! A process creation that never reached the server (the host denied it,
//! or the server could not be reached) is `transport-failed`: no process
//! can exist. Only a creation that may have reached the server without a
//! valid answer is "creation unconfirmed".

use crate::api;
use crate::config::Config;
use crate::frames::{parse_frame, ExitStatus, Frame, FrameError, LineSplitter};
use provider_sdk::errors::{
    cleanup_cause, command_cleanup_failed, empty_output, with_partial, ApiError,
};
use provider_sdk::http::id_field;
use provider_sdk::output::CommandOutput;
use provider_sdk::platform::{
    random_hex, BodyReader, BodyStep, Method, Platform, Request, TransportError, Wait, MS,
};
use provider_sdk::script;
use provider_sdk::types::{
    CleanupCause, CleanupPhase, ExecuteRequest, ExecuteResult, OutputLoss, ProviderError,
};
use serde_json::{json, Value};
use std::ops::ControlFlow;

/// The grace the server gives the tree between SIGTERM and SIGKILL.
pub const GRACE_MS: u64 = 1_000;
/// How often `/connect` is reopened after a retryable failure.
pub const MAX_RECONNECTS: u32 = 3;
/// The pause before a reconnect.
pub const RECONNECT_DELAY_MS: u64 = 250;

// Daytona's `execute` has this signature and budget rule too: both are the
// lease's command entry point (the protocols behind them share nothing).
/// Runs `request` in sandbox `sandbox_id`. The config's `timeoutMs`
/// applies when the request sets no timeout; its `requestTimeoutMs` bounds
/// each request outside the command's run, and each cleanup request gets
/// that budget afresh.
pub fn execute(
    platform: &mut dyn Platform,
    config: &Config,
    sandbox_id: &str,
    request: &ExecuteRequest,
) -> Result<ExecuteResult, ProviderError> {
    let budget = config.budget.request_timeout_ms.saturating_mul(MS);
    let timeout_ms = script::check(request, config.budget.timeout_ms, sandbox_id)?;
    let stdin_path = request
        .stdin
        .as_ref()
        .map(|_| format!("/tmp/paperclip-stdin-{}", random_hex(platform, 16)));
    let result = run(
        platform,
        budget,
        sandbox_id,
        timeout_ms,
        request,
        stdin_path.as_deref(),
    );
    if let Some(path) = &stdin_path {
        remove_staged_stdin(platform, budget, sandbox_id, path);
    }
    result
}

fn run(
    platform: &mut dyn Platform,
    budget: u64,
    sandbox_id: &str,
    timeout_ms: u64,
    request: &ExecuteRequest,
    stdin_path: Option<&str>,
) -> Result<ExecuteResult, ProviderError> {
    if let (Some(path), Some(stdin)) = (stdin_path, &request.stdin) {
        let upload = Request {
            method: Method::Put,
            origin: None,
            headers: Vec::new(),
            path: api::file_path(sandbox_id, path),
            body: Some(("application/octet-stream", stdin.clone())),
        };
        let wait = request_wait(platform, budget, true);
        api::call(platform, &upload, wait).map_err(|e| e.into_provider_error("stage-stdin"))?;
    }
    if platform.cancelled() {
        return Err(ProviderError::Cancelled(None));
    }
    let process_id = create_process(platform, budget, sandbox_id, request, stdin_path)?;
    let deadline = platform.now().saturating_add(timeout_ms.saturating_mul(MS));
    let mut run = Run::new(
        sandbox_id,
        &process_id,
        deadline,
        budget,
        request.result_chars,
    );
    // The script gives the command its staged stdin or /dev/null, so the
    // process's own stdin pipe needs no `stdin/close` request.
    let stop = run.follow(platform);
    run.finish(platform, stop)
}

/// `POST /processes`. Any outcome but a definite rejection, a request that
/// never reached the server, or a valid id means a process may exist that
/// cannot be cleaned up by id.
fn create_process(
    platform: &mut dyn Platform,
    budget: u64,
    sandbox_id: &str,
    request: &ExecuteRequest,
    stdin_path: Option<&str>,
) -> Result<String, ProviderError> {
    let mut body = json!({
        "cmd": "/bin/bash",
        "args": ["-lc", script::build(request, stdin_path)],
    });
    if let Some(cwd) = &request.cwd {
        body["cwd"] = Value::String(cwd.clone());
    }
    create(platform, budget, sandbox_id, body)
}

/// `POST /processes` with `body` (a command's or an interactive
/// process's): the id of the process, or why there is none for certain.
pub(crate) fn create(
    platform: &mut dyn Platform,
    budget: u64,
    sandbox_id: &str,
    body: Value,
) -> Result<String, ProviderError> {
    let create = api::json_request(
        Method::Post,
        format!("{}/processes", api::sandbox_path(sandbox_id)),
        Some(body),
    );
    // Not cancellable: once sent, only an answer tells whether it started.
    let wait = request_wait(platform, budget, false);
    let unconfirmed = |cause| {
        let phase = CleanupPhase::ProcessCreation;
        command_cleanup_failed(sandbox_id, None, phase, cause, empty_output())
    };
    match api::call(platform, &create, wait) {
        Ok(data) => id_field(&data, "process_id").map_err(|e| unconfirmed(cleanup_cause(e))),
        Err(ApiError::Status(status)) if status < 500 => {
            Err(ApiError::Status(status).into_provider_error("create-process"))
        }
        // Denied by the host, or the server was never reached: no process.
        Err(error) if error.never_sent() => Err(error.into_provider_error("create-process")),
        Err(error) => Err(unconfirmed(cleanup_cause(error))),
    }
}

/// Why following the output stopped.
pub(crate) enum Stop {
    /// A valid exit frame arrived: the command is done.
    Exited(ExitStatus),
    /// The command deadline passed.
    TimedOut,
    /// The host asked to stop.
    Cancelled,
    /// The stream failed; the error is returned after cleanup.
    Failed(ProviderError),
    /// The server dropped output after the cursor before it was read (410,
    /// `output_offset_expired`): `output-lost` after cleanup, with the
    /// number of lost frames when the server said.
    Lost(Option<u64>),
    /// The host asked an interactive process to end (`interaction-event.end`):
    /// its result once its tree is proven gone, ended by SIGTERM.
    Ended,
}

/// How one `/connect` response ended.
enum StreamEnd {
    Stop(Stop),
    /// Reconnect (transport error, 5xx, 429, end without exit frame).
    Retry(ProviderError),
}

/// One running command: its ids, deadline, and the output read so far.
pub(crate) struct Run {
    pub(crate) sandbox_id: String,
    pub(crate) process_id: String,
    deadline: u64,
    pub(crate) budget: u64,
    cursor: u64,
    output: CommandOutput,
    /// An interactive process: the host's events are carried out while its
    /// output is followed (`crate::interact`).
    pub(crate) interactive: bool,
    /// Input taken from the host and not yet written, written a piece at a
    /// time with the output read in between.
    pub(crate) pending_input: Vec<u8>,
    /// The output paused since the last piece of input was written.
    quiet: bool,
}

impl Run {
    pub(crate) fn new(
        sandbox_id: &str,
        process_id: &str,
        deadline: u64,
        budget: u64,
        result_chars: Option<u32>,
    ) -> Run {
        Run {
            sandbox_id: sandbox_id.to_string(),
            process_id: process_id.to_string(),
            deadline,
            budget,
            cursor: 0,
            output: CommandOutput::with_result_chars(result_chars),
            interactive: false,
            pending_input: Vec::new(),
            quiet: false,
        }
    }

    pub(crate) fn process_path(&self) -> String {
        api::process_path(&self.sandbox_id, &self.process_id)
    }

    fn command_wait(&self) -> Wait {
        Wait {
            deadline: self.deadline,
            cancellable: true,
        }
    }

    /// Follows `/connect` until the exit frame, the deadline, cancellation
    /// or a fatal error, reconnecting from the cursor a bounded number of times.
    pub(crate) fn follow(&mut self, platform: &mut dyn Platform) -> Stop {
        let mut reconnects = 0;
        loop {
            let connect = Request {
                method: Method::Get,
                origin: None,
                headers: Vec::new(),
                path: format!("{}/connect?after={}", self.process_path(), self.cursor),
                body: None,
            };
            let retry = match platform.open(&connect, self.command_wait()) {
                Err(TransportError::Deadline) => return Stop::TimedOut,
                Err(TransportError::Cancelled) => return Stop::Cancelled,
                Err(error) => transport_error("connect", &error),
                Ok((200, mut body)) => match self.read_stream(platform, body.as_mut()) {
                    StreamEnd::Stop(stop) => return stop,
                    StreamEnd::Retry(error) => error,
                },
                Ok((status, _)) if status == 429 || status >= 500 => rejected("connect", status),
                Ok((410, mut body)) => return Stop::Lost(self.lost_frames(body.as_mut())),
                Ok((status, _)) => return Stop::Failed(rejected("connect", status)),
            };
            if reconnects == MAX_RECONNECTS {
                return Stop::Failed(retry);
            }
            reconnects += 1;
            let until = platform.now().saturating_add(RECONNECT_DELAY_MS * MS);
            match platform.sleep_until(until, self.command_wait()) {
                Err(TransportError::Cancelled) => return Stop::Cancelled,
                Err(_) => return Stop::TimedOut,
                Ok(()) => {}
            }
        }
    }

    fn read_stream(&mut self, platform: &mut dyn Platform, body: &mut dyn BodyReader) -> StreamEnd {
        let mut lines = LineSplitter::default();
        loop {
            let next = if self.interactive {
                if self.pending_input.is_empty() || self.quiet {
                    self.quiet = false;
                    if let Some(stop) = crate::interact::take_event(self, platform) {
                        return StreamEnd::Stop(stop);
                    }
                }
                if self.pending_input.is_empty() {
                    body.next_chunk_or_event(self.command_wait())
                } else {
                    // More input to write: first the output the last piece
                    // caused, until it pauses, so that a process echoing
                    // its input (which the server stops reading while its
                    // output is not taken) never stalls the next write.
                    let pause = platform
                        .now()
                        .saturating_add(crate::interact::QUIET_MS * MS);
                    let wait = Wait {
                        deadline: pause.min(self.deadline),
                        cancellable: true,
                    };
                    match body.next_chunk(wait) {
                        // The pause, not the command's deadline.
                        Err(TransportError::Deadline) if pause < self.deadline => {
                            self.quiet = true;
                            Ok(BodyStep::Event)
                        }
                        other => other.map(|chunk| chunk.map_or(BodyStep::End, BodyStep::Chunk)),
                    }
                }
            } else {
                body.next_chunk(self.command_wait())
                    .map(|chunk| match chunk {
                        Some(chunk) => BodyStep::Chunk(chunk),
                        None => BodyStep::End,
                    })
            };
            let chunk = match next {
                Err(TransportError::Deadline) => return StreamEnd::Stop(Stop::TimedOut),
                Err(TransportError::Cancelled) => return StreamEnd::Stop(Stop::Cancelled),
                Err(error) => return StreamEnd::Retry(transport_error("connect", &error)),
                Ok(BodyStep::Event) => continue,
                Ok(BodyStep::Chunk(chunk)) => chunk,
                Ok(BodyStep::End) => {
                    if let Some(line) = lines.finish() {
                        let stop = self.handle_line(platform, &line);
                        self.output.flush(platform);
                        if let Some(stop) = stop {
                            return StreamEnd::Stop(stop);
                        }
                    }
                    return StreamEnd::Retry(invalid(
                        "connect",
                        "the output stream ended without an exit frame",
                    ));
                }
            };
            let flow = lines.for_each_line(&chunk, |line| match self.handle_line(platform, line) {
                Some(stop) => ControlFlow::Break(stop),
                None => ControlFlow::Continue(()),
            });
            // The chunk's output goes to the host in one call per stream run.
            self.output.flush(platform);
            match flow {
                Ok(ControlFlow::Continue(())) => {}
                Ok(ControlFlow::Break(stop)) => return StreamEnd::Stop(stop),
                Err(error) => return StreamEnd::Stop(Stop::Failed(frame_error(&error))),
            }
        }
    }

    /// Applies one frame; returns a stop on the exit frame or a fatal frame.
    fn handle_line(&mut self, platform: &mut dyn Platform, line: &[u8]) -> Option<Stop> {
        match parse_frame(line) {
            Err(error) => Some(Stop::Failed(frame_error(&error))),
            Ok(None) | Ok(Some(Frame::Heartbeat)) => None,
            Ok(Some(Frame::Exit(status))) => Some(Stop::Exited(status)),
            Ok(Some(Frame::Error(error))) if error == "output_offset_expired" => {
                Some(Stop::Lost(None))
            }
            Ok(Some(Frame::Error(error))) => Some(Stop::Failed(invalid(
                "connect",
                &format!("the server reported a stream error: {error}"),
            ))),
            Ok(Some(Frame::Data { seq, .. })) if seq <= self.cursor => None,
            Ok(Some(Frame::Data { seq, .. })) if seq != self.cursor + 1 => {
                Some(Stop::Failed(invalid(
                    "connect",
                    &format!("output sequence gap after {}: output was lost", self.cursor),
                )))
            }
            Ok(Some(Frame::Data { seq, stream, bytes })) => {
                self.cursor = seq;
                self.output.push(platform, stream, &bytes);
                None
            }
        }
    }

    /// How many frames after the cursor a 410's body says were evicted
    /// (`oldest_seq` is the first kept frame); none when it does not say.
    fn lost_frames(&self, body: &mut dyn BodyReader) -> Option<u64> {
        let wait = Wait {
            deadline: self.deadline,
            cancellable: true,
        };
        let mut text = Vec::new();
        while let Ok(Some(chunk)) = body.next_chunk(wait) {
            text.extend_from_slice(&chunk);
            if text.len() > 64 * 1024 {
                return None;
            }
        }
        let answer: Value = serde_json::from_slice(&text).ok()?;
        let oldest = answer
            .get("data")
            .and_then(|data| data.get("oldest_seq"))
            .or_else(|| answer.get("oldest_seq"))?
            .as_u64()?;
        oldest.checked_sub(self.cursor + 1)
    }

    /// Turns a stop into the outcome, deleting the process tree first on
    /// every path but a clean exit.
    pub(crate) fn finish(
        mut self,
        platform: &mut dyn Platform,
        stop: Stop,
    ) -> Result<ExecuteResult, ProviderError> {
        self.output.finish(platform);
        let timed_out = matches!(stop, Stop::TimedOut);
        let ended = matches!(stop, Stop::Ended);
        let after_cleanup = match stop {
            Stop::Exited(ExitStatus::Code(code)) => {
                return Ok(self.result(Some(code), None, false))
            }
            Stop::Exited(ExitStatus::Signal(signal)) => {
                return Ok(self.result(None, Some(signal), false))
            }
            Stop::TimedOut => Ok(()),
            Stop::Ended => {
                crate::interact::signal(&self, platform, "SIGTERM");
                Ok(())
            }
            Stop::Cancelled => Err(ProviderError::Cancelled(None)),
            Stop::Failed(error) => Err(error),
            Stop::Lost(lost_chunks) => {
                let tree_deleted = self.terminate(platform).is_ok();
                return Err(ProviderError::OutputLost(OutputLoss {
                    operation: "connect".into(),
                    process_id: Some(self.process_id.clone()),
                    lost_bytes: None,
                    lost_chunks,
                    tree_deleted,
                    partial: self.output.partial(false),
                }));
            }
        };
        if let Err(cause) = self.terminate(platform) {
            return Err(command_cleanup_failed(
                &self.sandbox_id,
                Some(&self.process_id),
                CleanupPhase::ProcessTermination,
                cause,
                self.output.partial(timed_out),
            ));
        }
        // Termination is confirmed: an error keeps what the command printed.
        // An ended interactive process was ended by its SIGTERM.
        after_cleanup
            .map(|()| match ended {
                true => self.result(None, Some("SIGTERM".into()), false),
                false => self.result(None, None, true),
            })
            .map_err(|error| with_partial(error, self.output.partial(false)))
    }

    fn result(
        &self,
        exit_code: Option<i32>,
        signal: Option<String>,
        timed_out: bool,
    ) -> ExecuteResult {
        ExecuteResult {
            exit_code,
            signal,
            timed_out,
            stdout: self.output.stdout(),
            stderr: self.output.stderr(),
            process_id: self.process_id.clone(),
            output_truncated: self.output.truncated(),
        }
    }

    /// `DELETE .../processes/{pid}?grace_ms=1000` with a fresh deadline;
    /// `Ok` only when the server proved the tree exited (or it is gone).
    fn terminate(&self, platform: &mut dyn Platform) -> Result<(), CleanupCause> {
        let delete = Request {
            method: Method::Delete,
            origin: None,
            headers: Vec::new(),
            path: format!("{}?grace_ms={GRACE_MS}", self.process_path()),
            body: None,
        };
        let wait = Wait {
            deadline: platform.now().saturating_add(self.budget),
            cancellable: false,
        };
        match api::call(platform, &delete, wait) {
            Ok(data) => match data.get("tree_exited") {
                Some(Value::Bool(true)) => Ok(()),
                Some(Value::Bool(false)) | None | Some(Value::Null) => {
                    Err(CleanupCause::TreeStillRunning)
                }
                Some(_) => Err(CleanupCause::InvalidResponse(
                    "`tree_exited` is not a boolean".into(),
                )),
            },
            Err(ApiError::Status(404)) => Ok(()),
            Err(error) => Err(cleanup_cause(error)),
        }
    }
}

/// Best effort: `exec /bin/rm -f -- <path>`; failures are ignored because
/// the file holds only the command's own input and lives in the sandbox.
fn remove_staged_stdin(platform: &mut dyn Platform, budget: u64, sandbox_id: &str, path: &str) {
    let remove = api::json_request(
        Method::Post,
        format!("{}/exec", api::sandbox_path(sandbox_id)),
        Some(json!({ "cmd": "/bin/rm", "args": ["-f", "--", path] })),
    );
    let wait = Wait {
        deadline: platform.now().saturating_add(budget),
        cancellable: false,
    };
    let _ = api::call(platform, &remove, wait);
}

pub(crate) fn request_wait(platform: &dyn Platform, budget: u64, cancellable: bool) -> Wait {
    Wait {
        deadline: platform.now().saturating_add(budget),
        cancellable,
    }
}

pub(crate) fn rejected(operation: &str, status: u16) -> ProviderError {
    ApiError::Status(status).into_provider_error(operation)
}

fn invalid(operation: &str, reason: &str) -> ProviderError {
    ApiError::Invalid(reason.into()).into_provider_error(operation)
}

fn frame_error(error: &FrameError) -> ProviderError {
    invalid("connect", &error.to_string())
}

fn transport_error(operation: &str, error: &TransportError) -> ProviderError {
    ApiError::Transport(error.clone()).into_provider_error(operation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::StreamId;
    use crate::testing::ok;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::platform::Instant;
    use provider_sdk::testing::{Answer, FakePlatform};
    use wasm_bindgen_test::wasm_bindgen_test;

    const PROCESS: &str = "/v1/sandboxes/sb/processes/p1";

    fn config() -> Config {
        Config::parse(r#"{"requestTimeoutMs": 2000}"#).unwrap()
    }

    fn request(timeout_ms: Option<u64>) -> ExecuteRequest {
        ExecuteRequest {
            command: "echo".into(),
            args: vec!["hi".into()],
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms,
            result_chars: None,
        }
    }

    fn frame(seq: u64, text: impl AsRef<[u8]>) -> Vec<u8> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(text);
        format!("{{\"type\":\"data\",\"seq\":{seq},\"stream\":\"stdout\",\"data_base64\":\"{data}\"}}\n").into_bytes()
    }

    /// A fake sandbox whose `/connect` gives `connect` and DELETE gives `delete`.
    fn sandbox(
        connect: impl Fn() -> Vec<Result<Vec<u8>, TransportError>> + 'static,
        delete: impl Fn() -> Answer + 'static,
    ) -> FakePlatform {
        FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes/sb/processes") => ok(json!({"process_id": "p1"})),
            (Method::Get, p) if p.starts_with(&format!("{PROCESS}/connect")) => {
                Answer::Stream(200, connect())
            }
            (Method::Delete, p) if p.starts_with(PROCESS) => delete(),
            _ => ok(json!({})),
        })
    }

    fn deleted() -> Answer {
        ok(json!({"tree_exited": true}))
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_exit_frame_gives_the_result_without_a_delete() {
        let mut platform = sandbox(
            || {
                vec![
                    Ok(frame(1, "hi\n")),
                    Ok(b"{\"type\":\"exit\",\"exit_code\":0}\n".to_vec()),
                ]
            },
            deleted,
        );
        let result = execute(&mut platform, &config(), "sb", &request(None)).unwrap();
        assert_eq!(
            (result.exit_code, result.stdout.as_str()),
            (Some(0), "hi\n")
        );
        assert_eq!(
            platform.calls(),
            vec![
                "POST /V1/SANDBOXES/SB/PROCESSES".to_string(),
                format!("GET {PROCESS}/CONNECT?AFTER=0").to_uppercase(),
            ]
        );
        assert_eq!(platform.output, vec![(StreamId::Stdout, b"hi\n".to_vec())]);
    }

    /// Live output goes to the host once per body chunk and stream run,
    /// not once per frame (a server's frames are often a 4 KiB pipe read
    /// each), in order across the two streams.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_chunk_of_many_frames_reaches_the_host_in_one_call_per_stream_run() {
        let mut platform = sandbox(
            || {
                let mut chunk = Vec::new();
                for (seq, text) in ["a", "b", "c"].iter().enumerate() {
                    chunk.extend(frame(seq as u64 + 1, text));
                }
                chunk.extend(b"{\"type\":\"data\",\"seq\":4,\"stream\":\"stderr\",\"data_base64\":\"ZQ==\"}\n");
                chunk.extend(frame(5, "d"));
                vec![
                    Ok(chunk),
                    Ok([frame(6, "x"), frame(7, "y")].concat()),
                    Ok(b"{\"type\":\"exit\",\"exit_code\":0}\n".to_vec()),
                ]
            },
            deleted,
        );
        let result = execute(&mut platform, &config(), "sb", &request(None)).unwrap();
        assert_eq!(
            (result.stdout.as_str(), result.stderr.as_str()),
            ("abcdxy", "e")
        );
        assert_eq!(
            platform.output,
            vec![
                (StreamId::Stdout, b"abc".to_vec()),
                (StreamId::Stderr, b"e".to_vec()),
                (StreamId::Stdout, b"d".to_vec()),
                (StreamId::Stdout, b"xy".to_vec()),
            ]
        );
    }

    /// Contract 0.4.0: the host gets the bytes the command printed, binary
    /// data and a character cut between frames included, unchanged; only
    /// the result's tail is text (lossy UTF-8).
    #[wasm_bindgen_test(unsupported = test)]
    fn binary_output_reaches_the_host_byte_for_byte() {
        let binary: Vec<u8> = (0..=255u8).rev().collect();
        let euro = "€".as_bytes().to_vec();
        let frames = {
            let (binary, euro) = (binary.clone(), euro.clone());
            move || {
                vec![
                    Ok([frame(1, &binary[..100]), frame(2, [b'x', euro[0]])].concat()),
                    Ok([frame(3, &euro[1..]), frame(4, &binary[100..])].concat()),
                    Ok(b"{\"type\":\"exit\",\"exit_code\":0}\n".to_vec()),
                ]
            }
        };
        let mut platform = sandbox(frames, deleted);
        let result = execute(&mut platform, &config(), "sb", &request(None)).unwrap();
        let mut printed = binary[..100].to_vec();
        printed.push(b'x');
        printed.extend_from_slice(&euro);
        printed.extend_from_slice(&binary[100..]);
        assert_eq!(platform.output_bytes(StreamId::Stdout), printed);
        assert_eq!(result.stdout, String::from_utf8_lossy(&printed));
        assert!(result.stdout.contains("x€"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_timeout_deletes_with_a_fresh_deadline_and_keeps_partial_output() {
        let mut platform = sandbox(|| vec![Ok(frame(1, "part"))], deleted);
        let result = execute(&mut platform, &config(), "sb", &request(Some(5_000))).unwrap();
        assert!(result.timed_out);
        assert_eq!(result.stdout, "part");
        let (delete, wait) = platform.requests.last().unwrap();
        assert_eq!(delete.method, Method::Delete);
        assert_eq!(delete.path, format!("{PROCESS}?grace_ms=1000"));
        let (_, connect) = platform
            .requests
            .iter()
            .find(|(request, _)| request.path.contains("/connect"))
            .unwrap();
        let connect_deadline: Instant = connect.deadline;
        assert_eq!(
            wait.deadline,
            connect_deadline + 2_000 * MS,
            "fresh budget after the deadline"
        );
        assert!(!wait.cancellable, "cleanup cannot be cancelled");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_unconfirmed_delete_replaces_the_timeout_result() {
        let mut platform = sandbox(
            || vec![Ok(frame(1, "part"))],
            || ok(json!({"tree_exited": false})),
        );
        match execute(&mut platform, &config(), "sb", &request(Some(5_000))) {
            Err(ProviderError::CleanupFailed(failure)) => {
                assert!(matches!(failure.cause, CleanupCause::TreeStillRunning));
                assert_eq!(failure.partial.unwrap().stdout, "part");
            }
            other => panic!("{other:?}"),
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn cancellation_deletes_then_reports_cancelled() {
        let mut platform = sandbox(|| vec![Ok(frame(1, "x"))], deleted);
        platform.cancel_at = Some(platform.now() + 100 * MS);
        let outcome = execute(&mut platform, &config(), "sb", &request(Some(60_000)));
        assert!(
            matches!(&outcome, Err(ProviderError::Cancelled(Some(p))) if p.stdout == "x"),
            "{outcome:?}"
        );
        assert_eq!(platform.requests.last().unwrap().0.method, Method::Delete);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_transport_error_on_creation_is_unconfirmed() {
        let mut platform =
            FakePlatform::new(|_| Answer::Fail(TransportError::Connection("reset".into())));
        match execute(&mut platform, &config(), "sb", &request(None)) {
            Err(ProviderError::CleanupFailed(failure)) => {
                assert!(matches!(failure.phase, CleanupPhase::ProcessCreation));
                assert_eq!(failure.process_id, None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(platform.requests.len(), 1);
    }

    /// Issue 23 item 4: a 410 after a reconnect is `output-lost`, counting
    /// the frames between the cursor and the body's `oldest_seq`.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_410_is_lost_output_counting_the_evicted_frames() {
        let attempts = std::cell::Cell::new(0);
        let mut platform = FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes/sb/processes") => ok(json!({"process_id": "p1"})),
            (Method::Get, p) if p.starts_with(&format!("{PROCESS}/connect")) => {
                attempts.set(attempts.get() + 1);
                if attempts.get() == 1 {
                    Answer::Stream(
                        200,
                        vec![
                            Ok(frame(1, "a")),
                            Err(TransportError::Connection("reset".into())),
                        ],
                    )
                } else {
                    Answer::Full(
                        410,
                        br#"{"status":"fail","data":{"reason":"output_offset_expired","oldest_seq":5}}"#
                            .to_vec(),
                    )
                }
            }
            (Method::Delete, p) if p.starts_with(PROCESS) => deleted(),
            _ => ok(json!({})),
        });
        match execute(&mut platform, &config(), "sb", &request(None)) {
            Err(ProviderError::OutputLost(loss)) => {
                assert_eq!(loss.lost_chunks, Some(3), "frames 2 to 4");
                assert_eq!(loss.lost_bytes, None);
                assert!(loss.tree_deleted);
                assert_eq!(loss.partial.stdout, "a");
                assert_eq!(loss.process_id.as_deref(), Some("p1"));
            }
            other => panic!("{other:?}"),
        }
    }

    /// Lost output whose tree deletion is not proven says so: the host
    /// then poisons the lease.
    #[wasm_bindgen_test(unsupported = test)]
    fn lost_output_without_a_proven_deletion_says_the_tree_may_run() {
        let mut platform = sandbox(
            || {
                vec![
                    Ok(frame(1, "kept")),
                    Ok(b"{\"type\":\"error\",\"error\":\"output_offset_expired\"}\n".to_vec()),
                ]
            },
            || ok(json!({"tree_exited": false})),
        );
        match execute(&mut platform, &config(), "sb", &request(None)) {
            Err(ProviderError::OutputLost(loss)) => {
                assert!(!loss.tree_deleted);
                assert_eq!(loss.lost_chunks, None);
                assert_eq!(loss.partial.stdout, "kept");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(platform.requests.last().unwrap().0.method, Method::Delete);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reconnects_resume_from_the_cursor() {
        let attempts = std::cell::Cell::new(0);
        let mut platform = sandbox(
            move || {
                attempts.set(attempts.get() + 1);
                if attempts.get() == 1 {
                    vec![
                        Ok(frame(1, "a")),
                        Err(TransportError::Connection("reset".into())),
                    ]
                } else {
                    vec![
                        Ok(frame(1, "a")),
                        Ok(frame(2, "b")),
                        // A final line without newline, parsed at the end of the stream.
                        Ok(b"{\"type\":\"exit\",\"exit_code\":1}".to_vec()),
                        Err(TransportError::Other("end".into())),
                    ]
                }
            },
            deleted,
        );
        let result = execute(&mut platform, &config(), "sb", &request(None)).unwrap();
        assert_eq!((result.stdout.as_str(), result.exit_code), ("ab", Some(1)));
        assert!(
            platform
                .calls()
                .iter()
                .any(|c| c.ends_with("CONNECT?AFTER=1")),
            "{:?}",
            platform.calls()
        );
    }
}
