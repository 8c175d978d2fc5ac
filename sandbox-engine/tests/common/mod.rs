//! Test harness: an in-process server, a small JSON client, and `/proc`
//! scans for marked processes.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::{Method, StatusCode};
use sandbox_engine::{IsolationMode, IsolationPreference, RunningServer, Server};
use serde_json::{json, Value};

pub const KEY: &str = "test-key-123";

pub struct Harness {
    pub server: RunningServer,
    pub http: reqwest::Client,
    pub base: String,
}

pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

impl Harness {
    /// Auto isolation, or the process-group fallback when
    /// `CREATEOS_LOCAL_TEST_ISOLATION=process-group` (to run the whole
    /// suite in that mode).
    pub async fn start() -> Self {
        let pref = match std::env::var("CREATEOS_LOCAL_TEST_ISOLATION").as_deref() {
            Ok("process-group") => IsolationPreference::ProcessGroup,
            _ => IsolationPreference::Auto,
        };
        Self::start_with(pref).await
    }

    pub async fn start_with(pref: IsolationPreference) -> Self {
        Self::start_builder(Server::builder().isolation(pref)).await
    }

    pub async fn start_builder(mut builder: sandbox_engine::ServerBuilder) -> Self {
        if std::env::var("CREATEOS_LOCAL_TEST_ISOLATION").as_deref() == Ok("process-group") {
            builder = builder.isolation(IsolationPreference::ProcessGroup);
        }
        let server = builder
            .api_key(KEY)
            .transition_delay(Duration::from_millis(150))
            .quiet(true)
            .start()
            .await
            .expect("server starts");
        let base = server.base_url();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Self { server, http, base }
    }

    pub fn bwrap(&self) -> bool {
        *self.server.isolation() == IsolationMode::Bwrap
    }

    /// A JSON request with the key; returns status and parsed body.
    pub async fn req(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let rb = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .header("X-Api-Key", KEY);
        let (status, v, _) = send(rb, body).await;
        (status, v)
    }

    /// A Bearer request to the Daytona face (`url` is absolute); returns
    /// status and parsed body.
    pub async fn daytona(
        &self,
        method: Method,
        url: impl AsRef<str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (status, v, _) = self.daytona_raw(method, url, body, false).await;
        (status, v)
    }

    /// [`Harness::daytona`] with the raw body too; `split_output` asks for
    /// logs with stream markers (`X-Daytona-Split-Output`), as the
    /// provider does.
    pub async fn daytona_raw(
        &self,
        method: Method,
        url: impl AsRef<str>,
        body: Option<Value>,
        split_output: bool,
    ) -> (StatusCode, Value, bytes::Bytes) {
        let mut rb = self
            .http
            .request(method, url.as_ref())
            .header("Authorization", format!("Bearer {KEY}"));
        if split_output {
            rb = rb.header("X-Daytona-Split-Output", "true");
        }
        send(rb, body).await
    }

    /// `POST /sandbox` on the Daytona face with `body`.
    pub async fn daytona_create(&self, body: Value) -> (StatusCode, Value) {
        let url = format!("{}/sandbox", self.server.daytona_api_url());
        self.daytona(Method::POST, url, Some(body)).await
    }

    /// `process/execute` of `command` in Daytona sandbox `sb`.
    pub async fn daytona_execute(&self, sb: &str, command: &str) -> (StatusCode, Value) {
        let url = format!("{}/{sb}/process/execute", self.server.toolbox_url());
        self.daytona(Method::POST, url, Some(json!({ "command": command })))
            .await
    }

    /// Creates session `id` in Daytona sandbox `sb`.
    pub async fn daytona_session(&self, sb: &str, id: &str) -> (StatusCode, Value) {
        let url = format!("{}/{sb}/process/session", self.server.toolbox_url());
        self.daytona(Method::POST, url, Some(json!({ "sessionId": id })))
            .await
    }

    /// Runs `body` (`command`, maybe `runAsync`) in session `id` of
    /// Daytona sandbox `sb`.
    pub async fn daytona_session_exec(
        &self,
        sb: &str,
        id: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let url = format!(
            "{}/{sb}/process/session/{id}/exec",
            self.server.toolbox_url()
        );
        self.daytona(Method::POST, url, Some(body)).await
    }

    /// `DELETE /sandbox/{sb}` on the Daytona face.
    pub async fn daytona_delete(&self, sb: &str) -> (StatusCode, Value) {
        let url = format!("{}/sandbox/{sb}", self.server.daytona_api_url());
        self.daytona(Method::DELETE, url, None).await
    }

    /// Creates a sandbox through the Daytona face (no auto-stop); its id.
    pub async fn daytona_sandbox(&self) -> String {
        let (st, v) = self
            .daytona_create(json!({"snapshot": "daytona-small", "autoStopInterval": 0}))
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v["id"].as_str().expect("id").to_string()
    }

    /// Asserts that a new process in `sb` is refused: 429
    /// `process_limit` (the process budget is spent).
    pub async fn assert_process_limit(&self, sb: &str) {
        let (st, v) = self
            .post(
                &format!("/v1/sandboxes/{sb}/processes"),
                json!({"cmd": "/bin/true"}),
            )
            .await;
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert_eq!(v["data"]["reason"], "process_limit", "{v}");
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.req(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.req(Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.req(Method::DELETE, path, None).await
    }

    /// `POST /v1/sandboxes` with declared `env`, as it answers.
    pub async fn create_sandbox(&self, env: Value) -> (StatusCode, Value) {
        self.post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false, "env": env}),
        )
        .await
    }

    /// Creates a sandbox (optionally with declared env) and waits for `running`.
    pub async fn sandbox_with_env(&self, env: Value) -> String {
        let (st, v) = self.create_sandbox(env).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        self.wait_status(&id, "running").await;
        id
    }

    /// Starts `script` in sandbox `sb` and waits until its tree is gone:
    /// its process id and its final record.
    pub async fn spawn_finished(&self, sb: &str, script: &str) -> (String, Value) {
        let pid = self.spawn(sb, script).await;
        let record = self.wait_tree(sb, &pid).await;
        (pid, record)
    }

    /// A started engine and one sandbox in it.
    pub async fn with_sandbox() -> (Harness, String) {
        let h = Harness::start().await;
        let sb = h.sandbox().await;
        (h, sb)
    }

    pub async fn sandbox(&self) -> String {
        self.sandbox_with_env(json!({})).await
    }

    pub async fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (st, v) = self.get(&format!("/v1/sandboxes/{id}")).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            if v["data"]["status"] == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sandbox never became {want}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts `bash -c script` as a managed process; returns its id.
    pub async fn spawn(&self, sb: &str, script: &str) -> String {
        self.spawn_body(sb, json!({"cmd": "/bin/bash", "args": ["-c", script]}))
            .await
    }

    pub async fn spawn_body(&self, sb: &str, body: Value) -> String {
        let (st, v) = self
            .post(&format!("/v1/sandboxes/{sb}/processes"), body)
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        v["data"]["process_id"]
            .as_str()
            .expect("process_id")
            .to_string()
    }

    /// Reads a whole `/connect` stream (until the server ends it).
    /// `GET /connect?after=` of process `pid`, as it answers (the body
    /// not read yet).
    pub async fn connect_response(&self, sb: &str, pid: &str, after: u64) -> reqwest::Response {
        self.http
            .get(format!(
                "{}/v1/sandboxes/{sb}/processes/{pid}/connect?after={after}",
                self.base
            ))
            .header("X-Api-Key", KEY)
            .send()
            .await
            .expect("connect")
    }

    pub async fn connect(&self, sb: &str, pid: &str, after: u64) -> R<(StatusCode, Vec<Value>)> {
        let resp = self.connect_response(sb, pid, after).await;
        let status = resp.status();
        let body = resp.bytes().await?;
        if !status.is_success() {
            return Ok((
                status,
                vec![serde_json::from_slice(&body).unwrap_or(Value::Null)],
            ));
        }
        let frames = body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_slice(l)
                    .unwrap_or(Value::String(String::from_utf8_lossy(l).into()))
            })
            .collect();
        Ok((status, frames))
    }

    pub async fn delete_process(&self, sb: &str, pid: &str, grace_ms: u64) -> (StatusCode, Value) {
        self.delete(&format!(
            "/v1/sandboxes/{sb}/processes/{pid}?grace_ms={grace_ms}"
        ))
        .await
    }

    pub async fn wait_tree(&self, sb: &str, pid: &str) -> Value {
        let (st, v) = self
            .get(&format!(
                "/v1/sandboxes/{sb}/processes/{pid}/wait?scope=tree&timeout_ms=60000"
            ))
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v["data"].clone()
    }

    pub async fn exec(&self, sb: &str, script: &str) -> Value {
        let (st, v) = self
            .post(
                &format!("/v1/sandboxes/{sb}/exec"),
                json!({"cmd": "/bin/bash", "args": ["-c", script]}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v["data"]["result"].clone()
    }
}

/// Concatenated bytes of one stream from data frames; also checks that seq
/// numbers are contiguous from `after + 1`.
pub fn stream_bytes(frames: &[Value], stream: &str, after: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (expect, f) in (after + 1..).zip(frames.iter().filter(|f| f["type"] == "data")) {
        assert_eq!(f["seq"].as_u64(), Some(expect), "seq gap in {f}");
        if f["stream"] == stream {
            let b64 = f["data_base64"].as_str().expect("data_base64");
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .expect("padded base64"),
            );
        }
    }
    out
}

pub fn exit_frame(frames: &[Value]) -> Value {
    let last = frames.last().cloned().unwrap_or(Value::Null);
    assert_eq!(
        last["type"], "exit",
        "last frame is the exit frame: {frames:?}"
    );
    last
}

/// A unique marker for this test's processes.
pub fn marker(name: &str) -> String {
    format!("cl-mark-{name}-{}-{}", std::process::id(), nanos())
}

/// Sends `rb` with `body` as JSON, if any: status, parsed body (Null when
/// not JSON) and raw body.
async fn send(
    mut rb: reqwest::RequestBuilder,
    body: Option<Value>,
) -> (StatusCode, Value, bytes::Bytes) {
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.expect("request sent");
    let status = resp.status();
    let bytes = resp.bytes().await.expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v, bytes)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Host pids of live (non-zombie) processes whose argv or environment
/// contains `marker`.
pub fn marked_pids(marker: &str) -> Vec<i32> {
    test_support::procs::marked(marker)
        .into_iter()
        .map(|pid| pid as i32)
        .collect()
}

/// Waits (generously) until at least `n` marked processes are visible.
pub async fn wait_marked(marker: &str, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pids = marked_pids(marker);
        if pids.len() >= n || Instant::now() > deadline {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A one-page HTTP server on the host's loopback (the test's own), which
/// answers every request with `body`; returns its port.
pub async fn host_http_server(body: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    port
}
