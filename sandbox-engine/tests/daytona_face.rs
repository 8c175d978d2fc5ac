//! The Daytona face against real processes: the main API under
//! `/daytona/api` on the server's origin, the toolbox on a second origin
//! (the `toolboxProxyUrl`), sessions whose commands run as real process
//! trees, followed logs, termination with verification, auth, fault
//! injection, files and bad input. See `docs/daytona-api.md`.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{marked_pids, marker, wait_marked, Harness, KEY};
use futures_util::FutureExt;
use reqwest::{Method, StatusCode};
use sandbox_engine::{FaultAction, FaultRule, Server, STDERR_PREFIX, STDOUT_PREFIX};
use serde_json::{json, Value};

/// A server with a toolbox listener, and the two base URLs.
struct Daytona {
    h: Harness,
    api: String,
    toolbox: String,
}

impl Daytona {
    async fn start() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(toolbox_listener: bool) -> Self {
        let mut builder = Server::builder();
        if toolbox_listener {
            builder = builder.toolbox_port(0);
        }
        let h = Harness::start_builder(builder).await;
        let api = h.server.daytona_api_url();
        let toolbox = h.server.toolbox_url().to_string();
        Self { h, api, toolbox }
    }

    /// A request with `Authorization: Bearer KEY`: status, JSON body (Null
    /// when not JSON) and raw body.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value, Bytes) {
        // Logs with stream markers, as the provider asks for them.
        self.h.daytona_raw(method, url, body, true).await
    }

    async fn api(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let (st, v, _) = self
            .call(method, &format!("{}{path}", self.api), body)
            .await;
        (st, v)
    }

    async fn tb(
        &self,
        method: Method,
        sb: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (st, v, _) = self
            .call(method, &format!("{}/{sb}{path}", self.toolbox), body)
            .await;
        (st, v)
    }

    /// Creates a sandbox with `env` and labels; returns its id.
    async fn sandbox(&self, env: Value) -> String {
        let (st, v) = self
            .api(
                Method::POST,
                "/sandbox",
                Some(json!({"snapshot": "daytona-small", "env": env, "labels": {"suite": "daytona_face"},
                            "autoStopInterval": 0, "autoDeleteInterval": 30})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["state"], "started", "{v}");
        v["id"].as_str().expect("id").to_string()
    }

    async fn session(&self, sb: &str, sid: &str) {
        let (st, v) = self
            .tb(
                Method::POST,
                sb,
                "/process/session",
                Some(json!({"sessionId": sid})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }

    /// Runs `command` asynchronously in a session; returns its `cmdId`.
    async fn exec_async(&self, sb: &str, sid: &str, command: &str) -> String {
        let (st, v) = self
            .tb(
                Method::POST,
                sb,
                &format!("/process/session/{sid}/exec"),
                Some(json!({"command": command, "runAsync": true})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        v["cmdId"].as_str().expect("cmdId").to_string()
    }

    fn logs_url(&self, sb: &str, sid: &str, cmd: &str) -> String {
        format!(
            "{}/{sb}/process/session/{sid}/command/{cmd}/logs?follow=true",
            self.toolbox
        )
    }

    async fn follow(&self, sb: &str, sid: &str, cmd: &str) -> reqwest::Response {
        let resp = self
            .h
            .http
            .get(self.logs_url(sb, sid, cmd))
            .header("Authorization", format!("Bearer {KEY}"))
            .header("X-Daytona-Split-Output", "true")
            .send()
            .await
            .expect("logs request");
        assert_eq!(resp.status(), StatusCode::OK);
        resp
    }

    async fn command(&self, sb: &str, sid: &str, cmd: &str) -> Value {
        let (st, v) = self
            .tb(
                Method::GET,
                sb,
                &format!("/process/session/{sid}/command/{cmd}"),
                None,
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v
    }

    /// Polls the command until it has an exit code (generous deadline; the
    /// value asserted is the code, not the time).
    async fn exit_code(&self, sb: &str, sid: &str, cmd: &str) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.command(sb, sid, cmd).await;
            if let Some(code) = v["exitCode"].as_i64() {
                return code;
            }
            assert!(Instant::now() < deadline, "command never exited: {v}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn upload(&self, sb: &str, path: &str, content: &[u8]) -> (StatusCode, Value) {
        let boundary = "----createos-local-test-boundary";
        let mut body = Vec::new();
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let resp = self
            .h
            .http
            .post(format!("{}/{sb}/files/upload", self.toolbox))
            .query(&[("path", path)])
            .header("Authorization", format!("Bearer {KEY}"))
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await
            .expect("upload sent");
        let st = resp.status();
        (st, resp.json().await.unwrap_or(Value::Null))
    }
}

/// Splits labelled log bytes into (stdout, stderr), as a client of the
/// real service does: a marker switches the stream the following bytes
/// belong to.
fn demux(log: &[u8]) -> (String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut current: Option<&mut Vec<u8>> = None;
    let mut i = 0;
    while i < log.len() {
        if log[i..].starts_with(STDOUT_PREFIX) {
            current = Some(&mut out);
            i += STDOUT_PREFIX.len();
        } else if log[i..].starts_with(STDERR_PREFIX) {
            current = Some(&mut err);
            i += STDERR_PREFIX.len();
        } else {
            current
                .as_mut()
                .expect("log bytes before any marker")
                .push(log[i]);
            i += 1;
        }
    }
    (
        String::from_utf8(out).expect("utf8 stdout"),
        String::from_utf8(err).expect("utf8 stderr"),
    )
}

/// Reads a response body to its end.
async fn read_all(resp: reqwest::Response) -> Vec<u8> {
    resp.bytes().await.expect("whole body").to_vec()
}

/// The whole cycle against real processes: create (snapshot, env, labels)
/// → session → a command whose cwd and env are set in its text and which
/// sees the sandbox env → its followed logs end only after all its output,
/// separated into stdout and stderr → its exit code is there when the
/// stream ends → a synchronous command → one-shot `process/execute` with a
/// cwd → delete the session → delete the sandbox → 404.
#[tokio::test]
async fn session_command_runs_with_cwd_env_and_complete_logs() {
    let d = Daytona::start().await;
    assert!(
        d.toolbox.ends_with("/toolbox") && !d.toolbox.starts_with(&d.h.base),
        "the toolbox has its own origin: {} vs {}",
        d.toolbox,
        d.h.base
    );
    let sb = d.sandbox(json!({"SB_VAR": "from-create"})).await;
    let (st, v) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["toolboxProxyUrl"], d.toolbox.as_str());
    assert_eq!(v["labels"]["suite"], "daytona_face");
    assert_eq!(v["snapshot"], "daytona-small");
    assert_eq!(v["autoDeleteInterval"], 30);
    let (st, v) = d
        .api(
            Method::GET,
            &format!("/sandbox/{sb}/toolbox-proxy-url"),
            None,
        )
        .await;
    assert_eq!(
        (st, v["url"].as_str()),
        (StatusCode::OK, Some(d.toolbox.as_str()))
    );
    let (st, v) = d
        .api(
            Method::GET,
            "/sandbox?labels=%7B%22suite%22%3A%22daytona_face%22%7D",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(v["items"]
        .as_array()
        .expect("list")
        .iter()
        .any(|s| s["id"] == sb.as_str()));
    // Start on a started sandbox is a no-op.
    let (st, v) = d
        .api(Method::POST, &format!("/sandbox/{sb}/start"), None)
        .await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("started")),
        "{v}"
    );

    d.session(&sb, "s1").await;
    let script = "cd /tmp && export GREETING=hi && echo \"$GREETING $SB_VAR $(pwd)\"; \
                  for i in $(seq 1 2000); do echo \"line $i\"; echo \"err $i\" >&2; done; exit 3";
    let cmd = d.exec_async(&sb, "s1", script).await;
    let log = read_all(d.follow(&sb, "s1", &cmd).await).await;
    // The stream ended: the exit is recorded, with every byte before it.
    let v = d.command(&sb, "s1", &cmd).await;
    assert_eq!(v["exitCode"], 3, "{v}");
    assert_eq!(v["command"], script);
    let (out, err) = demux(&log);
    let mut want_out = String::from("hi from-create /tmp\n");
    let mut want_err = String::new();
    for i in 1..=2000 {
        want_out.push_str(&format!("line {i}\n"));
        want_err.push_str(&format!("err {i}\n"));
    }
    assert_eq!(out, want_out);
    assert_eq!(err, want_err);
    // The snapshot (no follow) is the same log.
    let (st, _, snapshot) = d
        .call(
            Method::GET,
            &format!("{}/{sb}/process/session/s1/command/{cmd}/logs", d.toolbox),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(demux(&snapshot), (want_out, want_err));

    // Synchronous execution answers with the exit and the separated output.
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/session/s1/exec",
            Some(json!({"command": "echo sync; echo oops >&2; exit 7"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 7);
    assert_eq!(v["stdout"], "sync\n");
    assert_eq!(v["stderr"], "oops\n");
    assert!(v["cmdId"].is_string());
    // A synchronous command reads end-of-file on stdin.
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/session/s1/exec",
            Some(json!({"command": "cat; echo after-eof"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["exitCode"].as_i64(), v["stdout"].as_str()),
        (Some(0), Some("after-eof\n"))
    );
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/s1", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["sessionId"], "s1");
    assert_eq!(v["commands"].as_array().map(Vec::len), Some(3), "{v}");

    // One-shot execution: words, no shell; cwd honoured; stderr is part of
    // the result (one pipe here, so the order is fixed).
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "sh -c 'pwd >&2; echo \"a b\" >&2; exit 4'", "cwd": "/tmp"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 4);
    let result = v["result"].as_str().expect("result");
    if d.h.bwrap() {
        assert_eq!(result, "/tmp\na b\n");
    } else {
        // process-group mode maps cwd into the sandbox root on the host.
        assert!(result.ends_with("/tmp\na b\n"), "{result}");
    }

    let (st, _) = d.tb(Method::DELETE, &sb, "/process/session/s1", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/s1", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = d.api(Method::DELETE, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "destroyed");
    let (st, v) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["statusCode"], 404);
    let (st, _) = d.tb(Method::GET, &sb, "/process/session", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Followed logs are live: the first line arrives while the command is
/// still blocked (it can only go on once the test creates a file through
/// the toolbox), and the exit code is absent until then.
#[tokio::test]
async fn followed_logs_arrive_while_the_command_runs() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    d.session(&sb, "live").await;
    let cmd = d
        .exec_async(
            &sb,
            "live",
            "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second >&2",
        )
        .await;
    let mut stream = d.follow(&sb, "live", &cmd).await;
    let mut seen = Vec::new();
    while !demux(&seen).0.contains("first\n") {
        let chunk = stream
            .chunk()
            .await
            .expect("chunk")
            .expect("the stream stays open while the command runs");
        seen.extend_from_slice(&chunk);
    }
    let v = d.command(&sb, "live", &cmd).await;
    assert!(v.get("exitCode").is_none(), "still running: {v}");
    let (st, v) = d.upload(&sb, "/root/go", b"").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    while let Some(chunk) = stream.chunk().await.expect("chunk") {
        seen.extend_from_slice(&chunk);
    }
    assert_eq!(
        demux(&seen),
        ("first\n".to_string(), "second\n".to_string())
    );
    assert_eq!(d.command(&sb, "live", &cmd).await["exitCode"], 0);
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Deleting a session terminates every process tree it started (a command
/// that ignores SIGTERM and its background children included) and answers
/// 204 only after a fresh scan found none: no survivor is left.
#[tokio::test]
async fn deleting_a_session_kills_its_sleep_trees() {
    let d = Daytona::start().await;
    let m = marker("dt-session");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    d.session(&sb, "s").await;
    d.exec_async(&sb, "s", "trap '' TERM; sleep 300 & sleep 300 & wait")
        .await;
    d.exec_async(&sb, "s", "sleep 300").await;
    assert!(
        wait_marked(&m, 4).await.len() >= 4,
        "bash and three sleeps at least"
    );
    let (st, v) = d.tb(Method::DELETE, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(marked_pids(&m), Vec::<i32>::new(), "no survivor");
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = d.tb(Method::DELETE, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Stop terminates every process (verified) and forgets the sessions; a
/// stopped sandbox refuses toolbox commands; start makes it usable again
/// with its files kept; delete removes it (404 on both origins).
#[tokio::test]
async fn stop_start_delete_with_real_processes() {
    let d = Daytona::start().await;
    let m = marker("dt-stop");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    d.session(&sb, "s").await;
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/session/s/exec",
            Some(json!({"command": "echo kept > file"})),
        )
        .await;
    assert_eq!(
        (st, v["exitCode"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{v}"
    );
    d.exec_async(&sb, "s", "sleep 300 & sleep 300").await;
    assert!(wait_marked(&m, 3).await.len() >= 3);

    let (st, v) = d
        .api(Method::POST, &format!("/sandbox/{sb}/stop"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "stopped");
    assert_eq!(marked_pids(&m), Vec::<i32>::new(), "stop leaves no process");
    let (_, v) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(v["state"], "stopped");
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "sessions end with a stop: {v}");
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/session",
            Some(json!({"sessionId": "t"})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");

    let (st, v) = d
        .api(Method::POST, &format!("/sandbox/{sb}/start"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "started");
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "cat file"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "kept\n", "files survive a stop");

    d.session(&sb, "again").await;
    d.exec_async(&sb, "again", "sleep 300").await;
    assert!(!wait_marked(&m, 2).await.is_empty());
    let (st, v) = d.api(Method::DELETE, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        marked_pids(&m),
        Vec::<i32>::new(),
        "delete leaves no process"
    );
    let (st, v) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = d
        .api(Method::POST, &format!("/sandbox/{sb}/start"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/again", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// A wrong or missing key is 401 with a JSON error on both origins; the
/// CreateOS header does not open the Daytona face, and the CreateOS face
/// does not show Daytona sandboxes.
#[tokio::test]
async fn auth_is_required_on_both_origins() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    let urls = [
        (Method::POST, format!("{}/sandbox", d.api)),
        (Method::GET, format!("{}/sandbox/{sb}", d.api)),
        (Method::DELETE, format!("{}/sandbox/{sb}", d.api)),
        (Method::GET, format!("{}/{sb}/process/session", d.toolbox)),
        (Method::POST, format!("{}/{sb}/process/execute", d.toolbox)),
        (
            Method::GET,
            format!("{}/{sb}/files/download?path=/tmp/x", d.toolbox),
        ),
    ];
    for (method, url) in &urls {
        for (name, value) in [
            (None, None),
            (Some("Authorization"), Some("Bearer wrong")),
            (Some("Authorization"), Some(KEY.to_string()).as_deref()),
            (Some("X-Api-Key"), Some(KEY)),
        ] {
            let mut rb = d.h.http.request(method.clone(), url);
            if let (Some(n), Some(v)) = (name, value) {
                rb = rb.header(n, v);
            }
            let resp = rb.send().await.expect("send");
            assert_eq!(
                resp.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {url} {name:?}"
            );
            let v: Value = resp.json().await.expect("json error body");
            assert_eq!(v["statusCode"], 401, "{v}");
            assert!(v["message"].is_string(), "{v}");
        }
    }
    // The sandbox is untouched and invisible to the CreateOS face.
    let (st, _) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = d.h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Fault rules apply to both Daytona origins: a failed session delete (503)
/// and sandbox delete (500) leave the processes running and the resources
/// in place, and a retry then terminates them; a reset logs stream fails
/// mid-body; a stalled one neither ends nor fails although the command has
/// ended; every injected answer is recorded.
#[tokio::test]
async fn faults_apply_to_daytona_paths() {
    let d = Daytona::start().await;
    let m = marker("dt-faults");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    let faults = d.h.server.faults();
    d.session(&sb, "s").await;
    d.exec_async(&sb, "s", "sleep 300").await;
    assert!(!wait_marked(&m, 1).await.is_empty());

    faults.add(FaultRule::new(
        "DELETE",
        "/toolbox/*/process/session/*",
        FaultAction::Status { status: 503 },
    ));
    let (st, v) = d.tb(Method::DELETE, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["statusCode"], 503);
    assert_eq!(v["injected"], true);
    assert!(
        !marked_pids(&m).is_empty(),
        "a failed delete terminated nothing"
    );
    let (st, _) = d.tb(Method::DELETE, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(marked_pids(&m), Vec::<i32>::new());

    // Logs: reset after one chunk.
    d.session(&sb, "logs").await;
    let cmd = d
        .exec_async(
            &sb,
            "logs",
            "echo one; while [ ! -e go ]; do sleep 0.05; done; echo two",
        )
        .await;
    faults.add(FaultRule::new(
        "GET",
        "/toolbox/*/process/session/*/command/*/logs",
        FaultAction::ResetAfterFrames { frames: 1 },
    ));
    let mut stream = d.follow(&sb, "logs", &cmd).await;
    let mut got = Vec::new();
    let mut failed = false;
    loop {
        match stream.chunk().await {
            Ok(Some(b)) => got.extend_from_slice(&b),
            Ok(None) => break,
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the reset body fails instead of ending");
    assert_eq!(demux(&got).0, "one\n");

    // Logs: stall after one chunk, while an unfaulted follower sees the end.
    faults.add(FaultRule::new(
        "GET",
        "/toolbox/*/process/session/*/command/*/logs",
        FaultAction::StallAfterFrames { frames: 1 },
    ));
    let mut stalled = d.follow(&sb, "logs", &cmd).await;
    let first = stalled.chunk().await.expect("chunk").expect("first chunk");
    assert_eq!(demux(&first).0, "one\n");
    let healthy = d.follow(&sb, "logs", &cmd).await;
    let (st, _) = d.upload(&sb, "/root/go", b"").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(demux(&read_all(healthy).await).0, "one\ntwo\n");
    assert_eq!(d.exit_code(&sb, "logs", &cmd).await, 0);
    assert!(
        stalled.chunk().now_or_never().is_none(),
        "the stalled stream neither ends nor fails"
    );
    drop(stalled);

    // Sandbox delete failing with 500 leaves the sandbox and its processes.
    d.exec_async(&sb, "logs", "sleep 300").await;
    assert!(!wait_marked(&m, 1).await.is_empty());
    faults.add(FaultRule::new(
        "DELETE",
        "/daytona/api/sandbox/*",
        FaultAction::Status { status: 500 },
    ));
    let (st, v) = d.api(Method::DELETE, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["statusCode"], 500);
    assert!(!marked_pids(&m).is_empty());
    let (st, v) = d.api(Method::GET, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("started")),
        "{v}"
    );
    let (st, _) = d.api(Method::DELETE, &format!("/sandbox/{sb}"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(marked_pids(&m), Vec::<i32>::new());

    let injected: Vec<_> = faults
        .requests()
        .into_iter()
        .filter(|r| r.fault.is_some())
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        injected,
        vec![
            ("DELETE".to_string(), 503),
            ("GET".to_string(), 200),
            ("GET".to_string(), 200),
            ("DELETE".to_string(), 500),
        ]
    );
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Files: a binary upload (parents created) downloads byte for byte and is
/// seen by commands; create folder applies the mode; confinement and
/// missing files are typed errors.
#[tokio::test]
async fn files_upload_download_and_folders() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    let content: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let (st, v) = d.upload(&sb, "/root/deep/dir/blob.bin", &content).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["bytes"], 300_000);
    let (st, _, body) = d
        .call(
            Method::GET,
            &format!(
                "{}/{sb}/files/download?path=/root/deep/dir/blob.bin",
                d.toolbox
            ),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body.as_ref(), content.as_slice());
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "wc -c deep/dir/blob.bin"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "300000 deep/dir/blob.bin\n");

    let (st, _, _) = d
        .call(
            Method::POST,
            &format!(
                "{}/{sb}/files/folder?path=/root/private/inner&mode=0700",
                d.toolbox
            ),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (_, v) = d
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "stat -c %a private/inner"})),
        )
        .await;
    assert_eq!(v["result"], "700\n", "{v}");

    for (url, want) in [
        (
            format!("{}/{sb}/files/download?path=/root/missing", d.toolbox),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("{}/{sb}/files/download?path=relative", d.toolbox),
            StatusCode::BAD_REQUEST,
        ),
        (
            format!("{}/{sb}/files/download?path=/root/deep", d.toolbox),
            StatusCode::BAD_REQUEST,
        ),
        (
            format!("{}/{sb}/files/download?path=/usr/bin/env", d.toolbox),
            StatusCode::FORBIDDEN,
        ),
        (
            format!("{}/{sb}/files/download", d.toolbox),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (st, v, _) = d.call(Method::GET, &url, None).await;
        assert_eq!(st, want, "{url}: {v}");
        assert_eq!(v["statusCode"], want.as_u16(), "{v}");
    }
    let (st, v) = d.upload(&sb, "/etc/passwd", b"x").await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Bad input anywhere is a 4xx with a JSON error body naming the problem;
/// nothing is created by a refused request.
#[tokio::test]
async fn bad_input_is_a_4xx_with_a_json_error() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    d.session(&sb, "s").await;
    let raw = |method: Method, url: String, body: &'static str| {
        d.h.http
            .request(method, url)
            .header("Authorization", format!("Bearer {KEY}"))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let api = d.api.clone();
    let tb = format!("{}/{sb}", d.toolbox);
    let cases: Vec<(Method, String, &'static str, StatusCode)> = vec![
        (
            Method::POST,
            format!("{api}/sandbox"),
            "[]",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{api}/sandbox"),
            "{not json",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{api}/sandbox"),
            r#"{"env":{"1BAD":"x"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{api}/sandbox"),
            r#"{"env":{"A":1}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{api}/sandbox"),
            r#"{"snapshot":"s","cpu":2}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{api}/sandbox"),
            r#"{"volumes":[{"volumeId":"v"}]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("{api}/sandbox/nope"),
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("{api}/no-such-route"),
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::PUT,
            format!("{api}/sandbox"),
            "{}",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::POST,
            format!("{tb}/process/session"),
            "{}",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/process/session"),
            r#"{"sessionId":"a/b"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/process/session"),
            r#"{"sessionId":"s"}"#,
            StatusCode::CONFLICT,
        ),
        (
            Method::POST,
            format!("{tb}/process/session/s/exec"),
            r#"{"command":"  "}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/process/session/s/exec"),
            r#"{"command":true}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/process/session/nope/exec"),
            r#"{"command":"true"}"#,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("{tb}/process/session/s/command/nope"),
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("{tb}/process/session/s/command/nope/logs"),
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("{tb}/process/execute"),
            r#"{"command":"true","envs":{"1BAD":"x"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/process/execute"),
            r#"{"command":"true","cwd":"/no/such/dir"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{tb}/files/folder?path=/root/x&mode=9z"),
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("{}/nope/process/session", d.toolbox),
            "",
            StatusCode::NOT_FOUND,
        ),
    ];
    for (method, url, body, want) in cases {
        let resp = raw(method.clone(), url.clone(), body).await.expect("send");
        let st = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(st, want, "{method} {url} {body}: {v}");
        assert_eq!(v["statusCode"], want.as_u16(), "{method} {url}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {url}: {v}"
        );
    }
    // WebSocket follow is refused with a clear message.
    let (st, _) = d
        .tb(
            Method::POST,
            &sb,
            "/process/session/s/exec",
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (_, v) = d.tb(Method::GET, &sb, "/process/session/s", None).await;
    let cmd = v["commands"][0]["id"]
        .as_str()
        .expect("command id")
        .to_string();
    let resp =
        d.h.http
            .get(d.logs_url(&sb, "s", &cmd))
            .header("Authorization", format!("Bearer {KEY}"))
            .header("Upgrade", "websocket")
            .header("Connection", "Upgrade")
            .send()
            .await
            .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let (_, v) = d.api(Method::GET, "/sandbox", None).await;
    assert_eq!(
        v["items"].as_array().map(Vec::len),
        Some(1),
        "refused creates made nothing: {v}"
    );
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Without a toolbox listener the toolbox is served on the main origin
/// under `/daytona/toolbox` (and named so in `toolboxProxyUrl`); with one,
/// the main origin does not serve it.
#[tokio::test]
async fn toolbox_origin_follows_the_listener_option() {
    let single = Daytona::start_with(false).await;
    assert_eq!(single.toolbox, format!("{}/daytona/toolbox", single.h.base));
    let sb = single.sandbox(json!({})).await;
    let (st, v) = single
        .tb(
            Method::POST,
            &sb,
            "/process/execute",
            Some(json!({"command": "echo one-origin"})),
        )
        .await;
    assert_eq!(
        (st, v["result"].as_str()),
        (StatusCode::OK, Some("one-origin\n")),
        "{v}"
    );
    assert!(single.h.server.shutdown().await.all_exited());

    let two = Daytona::start().await;
    let sb = two.sandbox(json!({})).await;
    let (st, v, _) = two
        .call(
            Method::POST,
            &format!("{}/daytona/toolbox/{sb}/process/execute", two.h.base),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(two.h.server.shutdown().await.all_exited());
}

/// The binary prints one `listening on` line by default, and a second
/// `toolbox on` line with `--toolbox-port`; that origin serves the toolbox.
#[tokio::test]
async fn binary_prints_the_toolbox_origin_when_asked() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_createos-local"))
        .args(["--port", "0", "--toolbox-port", "0"])
        .env("CREATEOS_API_KEY", "cli-key")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn binary");
    let (base, mut lines) = test_support::local::listening(&mut child);
    let second = lines.next().expect("line").expect("utf8");
    let toolbox = second
        .strip_prefix("toolbox on ")
        .expect("toolbox line")
        .to_string();
    assert!(
        toolbox.starts_with("http://127.0.0.1:") && toolbox != base,
        "{toolbox}"
    );
    let http = reqwest::Client::new();
    let v: Value = http
        .post(format!("{base}/daytona/api/sandbox"))
        .header("Authorization", "Bearer cli-key")
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    assert_eq!(v["toolboxProxyUrl"], format!("{toolbox}/toolbox"));
    let sb = v["id"].as_str().expect("id");
    let v: Value = http
        .post(format!("{toolbox}/toolbox/{sb}/process/execute"))
        .header("Authorization", "Bearer cli-key")
        .json(&json!({"command": "echo via-cli"}))
        .send()
        .await
        .expect("execute")
        .json()
        .await
        .expect("json");
    assert_eq!(v["result"], "via-cli\n");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("sigterm");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
}

/// Terminating one command kills its whole tree (verified, 204) and its
/// exit code then says it was killed, while the session's other command
/// keeps running.
#[tokio::test]
async fn terminating_one_command_kills_only_its_tree() {
    let d = Daytona::start().await;
    let m = marker("dt-term");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    d.session(&sb, "s").await;
    let victim = d
        .exec_async(&sb, "s", "trap '' TERM; sleep 300 & sleep 300; wait")
        .await;
    assert!(wait_marked(&m, 3).await.len() >= 3);
    let before = marked_pids(&m);
    let other = d.exec_async(&sb, "s", "sleep 300").await;
    let with_other = wait_marked(&m, before.len() + 1).await;
    assert!(with_other.len() > before.len());
    let (st, v) = d
        .tb(
            Method::POST,
            &sb,
            &format!("/process/session/s/command/{victim}/terminate"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{v}");
    let left = marked_pids(&m);
    assert!(
        before.iter().all(|p| !left.contains(p)),
        "the terminated tree is gone: {before:?} vs {left:?}"
    );
    assert!(!left.is_empty(), "the other command still runs");
    assert_eq!(
        d.exit_code(&sb, "s", &victim).await,
        128 + 9,
        "killed by SIGKILL"
    );
    assert!(d.command(&sb, "s", &other).await.get("exitCode").is_none());
    let (st, _) = d.tb(Method::DELETE, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(marked_pids(&m), Vec::<i32>::new());
    assert!(d.h.server.shutdown().await.all_exited());
}

/// A session delete racing command starts: every command that was
/// accepted (202) is terminated by the delete, every later one is refused
/// (404), and no process survives.
#[tokio::test]
async fn session_delete_racing_command_starts_leaves_no_process() {
    let d = Daytona::start().await;
    let m = marker("dt-race");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    d.session(&sb, "s").await;
    let starts = (0..8).map(|_| {
        d.tb(
            Method::POST,
            &sb,
            "/process/session/s/exec",
            Some(json!({"command": "sleep 300", "runAsync": true})),
        )
    });
    let delete = d.tb(Method::DELETE, &sb, "/process/session/s", None);
    let (starts, (st, v)) = tokio::join!(futures_util::future::join_all(starts), delete);
    assert_eq!(st, StatusCode::NO_CONTENT, "{v}");
    for (st, v) in starts {
        assert!(
            st == StatusCode::ACCEPTED || st == StatusCode::NOT_FOUND,
            "{st} {v}"
        );
    }
    assert_eq!(marked_pids(&m), Vec::<i32>::new(), "no survivor");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// A dropped answer: the session delete happened (its processes are gone)
/// but the client only sees a transport error; asking again gives the
/// proof (404).
#[tokio::test]
async fn a_dropped_session_delete_answer_can_be_confirmed_by_asking_again() {
    let d = Daytona::start().await;
    let m = marker("dt-drop");
    let sb = d.sandbox(json!({"TEST_MARKER": m})).await;
    d.session(&sb, "s").await;
    d.exec_async(&sb, "s", "sleep 300").await;
    assert!(!wait_marked(&m, 1).await.is_empty());
    d.h.server.faults().add(FaultRule::new(
        "DELETE",
        "/toolbox/*/process/session/*",
        FaultAction::DropResponse,
    ));
    let sent =
        d.h.http
            .delete(format!("{}/{sb}/process/session/s", d.toolbox))
            .header("Authorization", format!("Bearer {KEY}"))
            .send()
            .await;
    let failed = match sent {
        Err(_) => true,
        Ok(resp) => resp.bytes().await.is_err(),
    };
    assert!(failed, "the answer was dropped");
    assert_eq!(marked_pids(&m), Vec::<i32>::new());
    let (st, v) = d.tb(Method::GET, &sb, "/process/session/s", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Pins issue 27 item 1: the real toolbox answers a command's logs as
/// stdout and stderr combined, markers removed, unless the request sends
/// `X-Daytona-Split-Output: true` (or the version of an SDK that demuxes,
/// 0.27 or later). The face always answered marked text, so no test could
/// see that a client sending neither reads every byte as stdout.
#[tokio::test]
async fn logs_are_combined_unless_split_output_is_asked_for() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    d.session(&sb, "s").await;
    let cmd = d
        .exec_async(&sb, "s", "echo out; sleep 0.2; echo err >&2")
        .await;
    assert_eq!(d.exit_code(&sb, "s", &cmd).await, 0);
    let url = format!("{}/{sb}/process/session/s/command/{cmd}/logs", d.toolbox);
    let logs = |headers: &'static [(&'static str, &'static str)], follow: bool| {
        let mut rb =
            d.h.http
                .get(if follow {
                    format!("{url}?follow=true")
                } else {
                    url.clone()
                })
                .header("Authorization", format!("Bearer {KEY}"));
        for (name, value) in headers {
            rb = rb.header(*name, *value);
        }
        async move {
            let resp = rb.send().await.expect("logs request");
            assert_eq!(resp.status(), StatusCode::OK);
            read_all(resp).await
        }
    };
    for follow in [false, true] {
        for combined in [
            &[][..],
            &[("X-Daytona-Split-Output", "false")][..],
            &[("X-Daytona-SDK-Version", "0.26.1")][..],
        ] {
            assert_eq!(
                logs(combined, follow).await,
                b"out\nerr\n",
                "{combined:?} follow={follow}"
            );
        }
        for split in [
            &[("X-Daytona-Split-Output", "true")][..],
            &[("X-Daytona-SDK-Version", "0.218.0")][..],
        ] {
            assert_eq!(
                demux(&logs(split, follow).await),
                ("out\n".to_owned(), "err\n".to_owned()),
                "{split:?} follow={follow}"
            );
        }
    }
    assert!(d.h.server.shutdown().await.all_exited());
}

/// Pins issue 27 item 4 in Rust (the official SDK's suite in
/// `node/daytona-sdk-test` drives the same): the list is a page
/// `{items, nextCursor}`; `process/execute` runs through a shell with
/// `envs`; logs asked for as JSON are `{output, stdout, stderr}`;
/// `files/upload-v2` takes raw bytes; `GET files?path=` lists a directory.
#[tokio::test]
async fn the_face_answers_as_the_current_service() {
    let d = Daytona::start().await;
    let first = d.sandbox(json!({})).await;
    let second = d.sandbox(json!({})).await;
    let (st, page) = d.api(Method::GET, "/sandbox?limit=1", None).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    let cursor = page["nextCursor"].as_str().expect("a next page").to_owned();
    let (_, next) = d
        .api(
            Method::GET,
            &format!("/sandbox?limit=1&cursor={cursor}"),
            None,
        )
        .await;
    assert!(next["nextCursor"].is_null(), "{next}");
    let mut ids = vec![
        page["items"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        next["items"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    ];
    ids.sort();
    let mut want = vec![first.clone(), second.clone()];
    want.sort();
    assert_eq!(ids, want);

    let (st, v) = d
        .tb(
            Method::POST,
            &first,
            "/process/execute",
            Some(json!({"command": "echo \"$A $B\" | tr a-z A-Z; exit 5", "envs": {"A": "one two", "B": "x"}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["exitCode"].as_i64(), v["result"].as_str()),
        (Some(5), Some("ONE TWO X\n"))
    );

    d.session(&first, "s").await;
    let cmd = d
        .exec_async(&first, "s", "echo out; sleep 0.2; echo err >&2")
        .await;
    assert_eq!(d.exit_code(&first, "s", &cmd).await, 0);
    let resp =
        d.h.http
            .get(format!(
                "{}/{first}/process/session/s/command/{cmd}/logs",
                d.toolbox
            ))
            .header("Authorization", format!("Bearer {KEY}"))
            .header("Accept", "application/json,text/plain")
            .send()
            .await
            .expect("logs");
    let logs: Value = resp.json().await.expect("JSON logs");
    assert_eq!(
        logs,
        json!({"output": "out\nerr\n", "stdout": "out\n", "stderr": "err\n"})
    );

    let resp =
        d.h.http
            .post(format!("{}/{first}/files/upload-v2", d.toolbox))
            .query(&[("path", "/root/dir/raw.bin")])
            .header("Authorization", format!("Bearer {KEY}"))
            .header("Content-Type", "application/octet-stream")
            .body(b"raw\0bytes".to_vec())
            .send()
            .await
            .expect("upload-v2");
    assert_eq!(resp.status(), StatusCode::OK);
    let (st, _, bytes) = d
        .call(
            Method::GET,
            &format!(
                "{}/{first}/files/download?path=/root/dir/raw.bin",
                d.toolbox
            ),
            None,
        )
        .await;
    assert_eq!((st, &bytes[..]), (StatusCode::OK, &b"raw\0bytes"[..]));
    let (st, listing) = d
        .tb(Method::GET, &first, "/files?path=/root/dir", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{listing}");
    assert_eq!(listing[0]["name"], "raw.bin", "{listing}");
    assert_eq!(listing[0]["size"], 9, "{listing}");
    assert_eq!(listing[0]["isDir"], false, "{listing}");
    let (st, _) = d
        .tb(Method::GET, &first, "/files?path=/root/../etc", None)
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(d.h.server.shutdown().await.all_exited());
}

/// `process/execute` answers stdout and stderr in the order the command
/// printed them, as the daemon's one shared pipe does: the face read them
/// from two pipes, and a CI run of the official SDK's suite saw stderr
/// first. Repeated, because two pipes lose the order only now and then.
#[tokio::test]
async fn execute_keeps_the_order_of_stdout_and_stderr() {
    let d = Daytona::start().await;
    let sb = d.sandbox(json!({})).await;
    for round in 0..30 {
        let (st, v) = d
            .tb(
                Method::POST,
                &sb,
                "/process/execute",
                Some(json!({"command": "echo a; echo b >&2; echo c; echo d >&2; echo e"})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["result"], "a\nb\nc\nd\ne\n", "round {round}: {v}");
    }
    assert!(d.h.server.shutdown().await.all_exited());
}
