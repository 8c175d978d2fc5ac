//! `execute`: the request flow, quoting, stdin, output and the stream's
//! failure paths.

use crate::support::*;
use sandbox_host::types::*;
use sandbox_host::{CancelToken, HostOptions, ResponseBody, ScriptedChunk, ScriptedResponse};
use std::sync::Arc;
use std::time::Duration;

fn process_route(suffix: &str) -> String {
    format!("/v1/sandboxes/{SANDBOX}/processes/{PROCESS}{suffix}")
}

#[test]
/// Two requests per command without stdin (issue 18: the script redirects
/// the command's stdin, so no `stdin/close` is sent).
fn echo_runs_with_the_exact_requests_of_the_spec() {
    let fake = Fake::new();
    let result = fake.execute(&command("echo", &["hello"])).unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.signal, None);
    assert!(!result.timed_out && !result.output_truncated);
    assert_eq!(result.stdout, "hello\n");
    assert_eq!(result.stderr, "");
    assert_eq!(result.process_id, PROCESS);
    assert_eq!(
        fake.calls(),
        vec![
            format!("POST /v1/sandboxes/{SANDBOX}/processes"),
            format!("GET {}?after=0", process_route("/connect")),
        ]
    );
    assert_eq!(sent_script(&fake), "exec -- 'echo' 'hello' < /dev/null");
    let create = &fake.requests_to(&format!("POST /v1/sandboxes/{SANDBOX}/processes"))[0];
    assert_eq!(create.header("content-type"), Some("application/json"));
    assert_eq!(
        create.uri,
        format!("{API_URL}/v1/sandboxes/{SANDBOX}/processes")
    );
    assert_eq!(fake.output.text(OutputStream::Stdout), "hello\n");
}

/// Runs the script the component sent with a real bash; returns stdout.
fn run_sent_script(fake: &Fake) -> String {
    let out = std::process::Command::new("/bin/bash")
        .arg("-c")
        .arg(sent_script(fake))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn hostile_args_reach_the_command_verbatim() {
    let fake = Fake::new();
    let hostile = [
        "'; rm -rf / #",
        "$(id)",
        "`id`",
        "a\nb",
        "\\'\"",
        "€",
        "",
        "-n",
    ];
    let mut request = command("printf", &["%s|"]);
    request.args.extend(hostile.iter().map(|s| s.to_string()));
    fake.execute(&request).unwrap();
    let expected: String = hostile.iter().map(|s| format!("{s}|")).collect();
    assert_eq!(run_sent_script(&fake), expected);
}

#[test]
fn hostile_env_and_cwd_are_applied_verbatim() {
    let fake = Fake::new();
    let dir = std::env::temp_dir().join("createos it cwd 'q' $(x)");
    std::fs::create_dir_all(&dir).unwrap();
    let mut request = command("sh", &["-c", "printf '%s|' \"$HOSTILE\"; pwd"]);
    request.cwd = Some(dir.to_string_lossy().into_owned());
    request.env = vec![("HOSTILE".into(), "'$(id)' \"`x`\" ; exit 3".into())];
    fake.execute(&request).unwrap();
    let body = fake.requests_to(&format!("POST /v1/sandboxes/{SANDBOX}/processes"))[0]
        .body_json()
        .unwrap();
    assert_eq!(body["cwd"], dir.to_string_lossy().as_ref(), "API cwd too");
    assert_eq!(
        run_sent_script(&fake),
        format!("'$(id)' \"`x`\" ; exit 3|{}\n", dir.display())
    );
}

#[test]
fn stdin_is_staged_as_a_file_and_removed_afterwards() {
    let fake = Fake::new();
    let mut request = command("cat", &[]);
    request.stdin = Some(b"line one\nline two".to_vec());
    fake.execute(&request).unwrap();
    let puts = fake.requests_to(&format!("PUT /v1/sandboxes/{SANDBOX}/files"));
    assert_eq!(puts.len(), 1);
    let path = query_param(&puts[0], "path");
    assert!(
        path.starts_with("/tmp/paperclip-stdin-") && path.len() > 30,
        "{path}"
    );
    assert_eq!(&puts[0].body[..], b"line one\nline two");
    assert_eq!(
        puts[0].header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(sent_script(&fake), format!("exec -- 'cat' < '{path}'"));
    let calls = fake.calls();
    assert!(calls[0].starts_with("PUT "), "stdin first: {calls:?}");
    assert!(
        !calls.iter().any(|c| c.contains("/input")),
        "never streamed: {calls:?}"
    );
    let rm = fake.requests_to(&format!("POST /v1/sandboxes/{SANDBOX}/exec"));
    assert_eq!(rm.len(), 1);
    assert_eq!(
        rm[0].body_json().unwrap(),
        serde_json::json!({"cmd": "/bin/rm", "args": ["-f", "--", path]})
    );
    assert!(
        calls.last().unwrap().ends_with("/exec"),
        "removal last: {calls:?}"
    );
}

#[test]
fn empty_stdin_is_staged_too() {
    let fake = Fake::new();
    let mut request = command("cat", &[]);
    request.stdin = Some(Vec::new());
    fake.execute(&request).unwrap();
    let puts = fake.requests_to(&format!("PUT /v1/sandboxes/{SANDBOX}/files"));
    assert_eq!(puts.len(), 1);
    assert!(puts[0].body.is_empty());
}

#[test]
fn replay_after_disconnect_has_no_duplicate_and_keeps_a_split_euro() {
    let euro = "€".as_bytes();
    let fake = Fake::with(move |req, n| {
        if req.path() != process_route("/connect") {
            return None;
        }
        Some(match n {
            0 => ScriptedResponse::ndjson(
                vec![
                    ScriptedChunk::now(data_frame(1, "stdout", b"price: ")),
                    ScriptedChunk::now(data_frame(2, "stdout", &euro[..1])),
                    ScriptedChunk::now(data_frame(3, "stderr", b"warn ")),
                ],
                Some(ErrorCode::ConnectionTerminated),
            ),
            _ => ScriptedResponse::ndjson(
                vec![
                    ScriptedChunk::now(data_frame(2, "stdout", &euro[..1])),
                    ScriptedChunk::now(data_frame(3, "stderr", b"warn ")),
                    ScriptedChunk::now(data_frame(4, "stdout", &euro[1..])),
                    ScriptedChunk::now(data_frame(5, "stdout", b"5\n")),
                    ScriptedChunk::now(exit_frame(3)),
                ],
                None,
            ),
        })
    });
    let result = fake.execute(&command("price", &[])).unwrap();
    assert_eq!(result.stdout, "price: €5\n");
    assert_eq!(result.stderr, "warn ");
    assert_eq!(result.exit_code, Some(3));
    let connects: Vec<String> = fake
        .calls()
        .into_iter()
        .filter(|c| c.contains("/connect"))
        .collect();
    assert_eq!(connects.len(), 2);
    assert!(connects[1].ends_with("?after=3"), "{connects:?}");
    assert_eq!(
        fake.output.text(OutputStream::Stdout),
        "price: €5\n",
        "live output once"
    );
    assert!(fake
        .requests_to(&format!("DELETE {}", process_route("")))
        .is_empty());
}

#[test]
fn a_signal_exit_is_reported() {
    let fake = Fake::with(|req, _| {
        (req.path() == process_route("/connect")).then(|| {
            ScriptedResponse::ndjson(
                vec![ScriptedChunk::now(
                    "{\"type\":\"exit\",\"signal\":\"SIGKILL\"}",
                )],
                None,
            )
        })
    });
    let result = fake.execute(&command("x", &[])).unwrap();
    assert_eq!(
        (result.exit_code, result.signal.as_deref()),
        (None, Some("SIGKILL"))
    );
}

/// A stream failure: the process is deleted, then the typed error returns.
fn stream_failure(
    connect: impl Fn(usize) -> ScriptedResponse + Send + Sync + 'static,
) -> (Fake, ProviderError) {
    let fake =
        Fake::with(move |req, n| (req.path() == process_route("/connect")).then(|| connect(n)));
    let error = fake.execute(&command("x", &[])).unwrap_err();
    let deletes = fake.requests_to(&format!("DELETE {}", process_route("")));
    assert_eq!(deletes.len(), 1, "DELETE issued: {:?}", fake.calls());
    assert_eq!(
        deletes[0].path_and_query,
        format!("{}?grace_ms=1000", process_route(""))
    );
    assert_no_body(&error);
    (fake, error)
}

/// [`stream_failure`] that must end as an invalid answer whose reason
/// names `reason`.
fn invalid_stream(
    connect: impl Fn(usize) -> ScriptedResponse + Send + Sync + 'static,
    reason: &str,
) {
    let (_, error) = stream_failure(connect);
    assert!(
        matches!(&error, ProviderError::InvalidResponse(r) if r.reason.contains(reason)),
        "{reason}: {error:?}"
    );
}

fn frames(lines: &[&str]) -> ScriptedResponse {
    ScriptedResponse::ndjson(
        lines
            .iter()
            .map(|l| ScriptedChunk::now(format!("{l}\n")))
            .collect(),
        None,
    )
}

#[test]
fn a_sequence_gap_deletes_the_process() {
    let gap = |_| {
        ScriptedResponse::ndjson(
            vec![
                ScriptedChunk::now(data_frame(1, "stdout", b"a")),
                ScriptedChunk::now(data_frame(3, "stdout", b"c")),
            ],
            None,
        )
    };
    invalid_stream(gap, "gap");
}

/// Issue 23 item 4: a 410 on `/connect` is lost output, its own typed
/// cause (it was an API rejection), after a confirmed delete of the tree.
#[test]
fn output_eviction_410_deletes_the_process() {
    let (_, error) = stream_failure(|_| error_answer(410));
    assert!(
        matches!(&error, ProviderError::OutputLost(l) if l.tree_deleted && l.operation == "connect" && l.lost_chunks.is_none()),
        "{error:?}"
    );
}

/// Issue 23 item 4: an `output_offset_expired` stream error is lost
/// output (it was "invalid answer"), after a confirmed delete of the tree.
#[test]
fn an_error_frame_deletes_the_process() {
    let (_, error) =
        stream_failure(|_| frames(&[r#"{"type":"error","error":"output_offset_expired"}"#]));
    assert!(
        matches!(&error, ProviderError::OutputLost(l) if l.tree_deleted && l.process_id.as_deref() == Some(PROCESS)),
        "{error:?}"
    );
}

/// Any other stream error stays an invalid answer.
#[test]
fn another_error_frame_is_an_invalid_answer() {
    invalid_stream(
        |_| frames(&[r#"{"type":"error","error":"mystery"}"#]),
        "mystery",
    );
}

#[test]
fn a_malformed_frame_deletes_the_process() {
    for line in [
        "{not json",
        r#"{"type":"mystery"}"#,
        r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"***"}"#,
    ] {
        // Any reason: the frame is not one the protocol knows.
        invalid_stream(move |_| frames(&[line]), "");
    }
}

#[test]
fn an_exit_frame_without_status_deletes_the_process() {
    invalid_stream(|_| frames(&[r#"{"type":"exit"}"#]), "exit status");
}

#[test]
fn reconnects_are_bounded() {
    let (fake, error) = stream_failure(|_| error_answer(503));
    assert_eq!(connect_calls(&fake), 4, "1 + 3 reconnects");
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 503),
        "{error:?}"
    );
}

#[test]
fn a_stream_that_keeps_ending_without_exit_is_an_error() {
    let (fake, error) = stream_failure(|_| frames(&[r#"{"type":"heartbeat"}"#]));
    assert_eq!(connect_calls(&fake), 4);
    assert!(
        matches!(error, ProviderError::InvalidResponse(_)),
        "{error:?}"
    );
}

#[test]
fn a_4xx_on_connect_fails_at_once() {
    let (fake, error) = stream_failure(|_| error_answer(403));
    assert_eq!(connect_calls(&fake), 1);
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 403),
        "{error:?}"
    );
}

#[test]
fn timeout_returns_partial_output_after_a_confirmed_delete_with_a_fresh_deadline() {
    // The DELETE answers after 800 ms: longer than what was left of the
    // 300 ms command deadline, within the fresh 1.5 s cleanup budget.
    let fake = Fake::with(|req, _| {
        if req.path() == process_route("/connect") {
            return Some(hanging_connect("partial out"));
        }
        (req.method == "DELETE" && req.path() == process_route("")).then(|| {
            ScriptedResponse::Streamed {
                status: 200,
                headers: vec![],
                chunks: vec![ScriptedChunk::after(
                    Duration::from_millis(800),
                    serde_json::json!({"status":"success","data":{"tree_exited":true}}).to_string(),
                )],
                end: None,
            }
        })
    });
    let mut request = command("sleep", &["60"]);
    request.timeout_ms = Some(300);
    let result = fake.execute(&request).unwrap();
    assert!(result.timed_out);
    assert_eq!((result.exit_code, result.signal), (None, None));
    assert_eq!(result.stdout, "partial out");
    assert_eq!(
        fake.requests_to(&format!("DELETE {}", process_route("")))
            .len(),
        1
    );
}

#[test]
fn invalid_input_makes_no_request_at_all() {
    let mut bad_env = command("ls", &[]);
    bad_env.env = vec![("BAD-NAME".into(), "x".into())];
    let mut nul_arg = command("ls", &["a\0b"]);
    nul_arg.stdin = Some(b"x".to_vec());
    let mut zero_timeout = command("ls", &[]);
    zero_timeout.timeout_ms = Some(0);
    for request in [bad_env, nul_arg, command("", &[]), zero_timeout] {
        let fake = Fake::new();
        let error = fake.execute(&request).unwrap_err();
        assert!(
            matches!(error, ProviderError::InvalidRequest(_)),
            "{error:?}"
        );
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    }
}

#[test]
fn redirects_are_never_followed() {
    let fake = Fake::with(|req, _| {
        req.path()
            .ends_with("/processes")
            .then(|| ScriptedResponse::Full {
                status: 307,
                headers: vec![("location".into(), "https://evil.example/steal".into())],
                body: Default::default(),
            })
    });
    let error = fake.execute(&command("ls", &[])).unwrap_err();
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 307),
        "{error:?}"
    );
    let requests = fake.transport.requests();
    assert_eq!(requests.len(), 1);
    assert!(requests.iter().all(|r| r.uri.starts_with(API_URL)));
}

#[test]
fn a_definite_creation_rejection_is_not_a_cleanup_failure() {
    for status in [400, 401, 403, 404, 429] {
        let fake = Fake::with(move |req, _| {
            req.path()
                .ends_with("/processes")
                .then(|| error_answer(status))
        });
        let error = fake.execute(&command("ls", &[])).unwrap_err();
        assert!(
            matches!(&error, ProviderError::ApiRejected(r) if r.status == status && r.operation == "create-process"),
            "{error:?}"
        );
        assert_no_body(&error);
    }
}

#[test]
fn output_is_capped_at_four_mebi_characters_per_stream() {
    let chunk = vec![b'x'; 512 * 1024];
    let fake = Fake::with(move |req, _| {
        (req.path() == process_route("/connect")).then(|| {
            let mut chunks: Vec<ScriptedChunk> = (1..=9)
                .map(|seq| ScriptedChunk::now(data_frame(seq, "stdout", &chunk)))
                .collect();
            chunks.push(ScriptedChunk::now(data_frame(10, "stdout", b"END")));
            chunks.push(ScriptedChunk::now(exit_frame(0)));
            ScriptedResponse::ndjson(chunks, None)
        })
    });
    let result = fake.execute(&command("yes", &[])).unwrap();
    assert!(result.output_truncated);
    assert_eq!(result.stdout.len(), 4 * 1024 * 1024);
    assert!(result.stdout.ends_with("xxEND"));
}

/// Pins issue 9 item 7: a process creation that never reached the server
/// (host denial, DNS, refused, connect or TLS failure) was reported as
/// `cleanup-failed` "creation unconfirmed" and poisoned the lease. No
/// process can exist: it is `transport-failed`.
#[test]
fn a_process_creation_that_never_reached_the_server_is_a_transport_failure() {
    // The process creation fails with `code`; the command's error.
    let creation_fails = |code: &ErrorCode| {
        let answer = code.clone();
        let fake = Fake::with(move |req, _| {
            req.path()
                .ends_with("/processes")
                .then(|| ScriptedResponse::Error(answer.clone()))
        });
        fake.execute(&command("ls", &[])).unwrap_err()
    };
    for code in never_sent_errors() {
        let error = creation_fails(&code);
        assert!(
            matches!(&error, ProviderError::TransportFailed(f) if f.operation == "create-process"),
            "{code:?}: {error:?}"
        );
    }
    for code in after_send_errors() {
        let error = creation_fails(&code);
        assert!(
            matches!(&error, ProviderError::CleanupFailed(f) if f.phase == CleanupPhase::ProcessCreation),
            "{code:?}: {error:?}"
        );
    }
}

/// A `/connect` body that never pauses: every poll yields the next data
/// frame at once, forever. `on_frame` sees each frame's sequence number.
struct Endless {
    seq: u64,
    on_frame: Box<dyn Fn(u64) + Send>,
}

impl http_body::Body for Endless {
    type Data = bytes::Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, ErrorCode>>> {
        self.seq += 1;
        (self.on_frame)(self.seq);
        let line = data_frame(self.seq, "stdout", b"y\n");
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(line.into()))))
    }
}

/// Runs `yes` against a server that streams its output without pause. The
/// instance's host deadline (20 s) traps it if the component never stops
/// by itself.
fn run_against_endless_stream(
    timeout_ms: u64,
    on_frame: impl Fn(u64, &CancelToken) + Send + Sync + 'static,
) -> (Fake, Result<Result<ExecuteResult, ProviderError>, String>) {
    let cancel = CancelToken::new();
    let on_frame = Arc::new(on_frame);
    let token = cancel.clone();
    let fake = Fake::with(move |req, _| {
        (req.path() == process_route("/connect")).then(|| {
            let (on_frame, token) = (on_frame.clone(), token.clone());
            ScriptedResponse::Body {
                status: 200,
                headers: vec![],
                body: ResponseBody::new(Endless {
                    seq: 0,
                    on_frame: Box::new(move |seq| on_frame(seq, &token)),
                }),
            }
        })
    });
    let mut instance = component()
        .instantiate(
            HostOptions::new()
                .with_transport(fake.transport.shared())
                .with_cancel(cancel)
                .with_deadline(Duration::from_secs(20)),
        )
        .unwrap();
    let mut request = command("yes", &[]);
    request.timeout_ms = Some(timeout_ms);
    let outcome = instance
        .execute(&ctx(), &lease(), &request)
        .map_err(|trap| format!("{trap:#}"));
    (fake, outcome)
}

/// Pins issue 9 item 9: the command deadline was only checked while the
/// stream was idle, so a server streaming without pause kept the command
/// running until the host trapped the instance. It must time out (after a
/// confirmed DELETE) like any other command.
#[test]
fn a_server_streaming_without_pause_still_times_out() {
    let (fake, outcome) = run_against_endless_stream(500, |_, _| {});
    let result = outcome
        .expect("the component stops by itself, no trap")
        .unwrap();
    assert!(result.timed_out);
    assert!(result.stdout.starts_with("y\ny\n"), "partial output kept");
    assert_eq!(
        fake.requests_to(&format!("DELETE {}", process_route("")))
            .len(),
        1
    );
}

/// Pins issue 9 item 9: cancellation was only seen while the stream was
/// idle; a server streaming without pause made Ctrl-C wait for the host to
/// trap the instance.
#[test]
fn a_server_streaming_without_pause_is_still_cancelled() {
    let (fake, outcome) = run_against_endless_stream(600_000, |seq, token| {
        if seq == 1_000 {
            token.cancel();
        }
    });
    let outcome = outcome.expect("the component stops by itself, no trap");
    assert!(
        matches!(outcome, Err(ProviderError::Cancelled(_))),
        "{outcome:?}"
    );
    assert_eq!(
        fake.requests_to(&format!("DELETE {}", process_route("")))
            .len(),
        1
    );
}

/// Pins issue 9 item 10: any string up to 64 bytes was accepted as the
/// exit frame's `signal` and returned to the host as the command's signal.
/// Only `SIG[A-Z0-9]+` (bounded) is a signal; anything else is an invalid
/// frame, and the process is deleted.
#[test]
fn an_exit_frame_with_an_invalid_signal_deletes_the_process() {
    for signal in [
        "rm -rf /",
        "sigkill",
        "SIG",
        "KILL",
        "SIGKILL\n",
        &format!("SIG{}", "A".repeat(40)),
    ] {
        let line = serde_json::json!({"type": "exit", "signal": signal}).to_string();
        let (_, error) = stream_failure(move |_| frames(&[&line]));
        assert!(
            matches!(&error, ProviderError::InvalidResponse(r) if r.reason.contains("signal")),
            "{signal:?}: {error:?}"
        );
    }
}

/// Pins issue 9 item 10: after a stream error whose cleanup was confirmed,
/// the typed error dropped what the command had printed (only
/// `cleanup-failed` kept it). The error carries the partial output.
#[test]
fn a_stream_error_after_a_confirmed_cleanup_keeps_the_partial_output() {
    let (_, error) = stream_failure(|_| {
        ScriptedResponse::ndjson(
            vec![
                ScriptedChunk::now(data_frame(1, "stdout", b"before ")),
                ScriptedChunk::now(data_frame(2, "stderr", b"warned")),
                ScriptedChunk::now(data_frame(4, "stdout", b"lost")),
            ],
            None,
        )
    });
    let partial = match &error {
        ProviderError::InvalidResponse(r) => r.partial.clone(),
        other => panic!("{other:?}"),
    }
    .expect("partial output");
    assert_eq!(
        (partial.stdout.as_str(), partial.stderr.as_str()),
        ("before ", "warned")
    );
    assert!(!partial.timed_out);
    let (_, error) = stream_failure(|n| {
        if n == 0 {
            frames(&[data_frame(1, "stdout", b"first").trim_end()])
        } else {
            error_answer(410)
        }
    });
    match &error {
        ProviderError::OutputLost(l) => assert_eq!(l.partial.stdout, "first"),
        other => panic!("{other:?}"),
    }
}

/// How many `/connect` requests `fake` answered.
fn connect_calls(fake: &Fake) -> usize {
    fake.calls()
        .iter()
        .filter(|c| c.contains("/connect"))
        .count()
}
