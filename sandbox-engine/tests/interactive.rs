//! Interactive managed processes on the CreateOS face (issue 38, item 3),
//! through the `createos-local` binary and real processes: a terminal
//! (`kind: "pty"`) allocated inside the sandbox's machine, input written
//! while the command runs, a terminal resized, `^C` through the line
//! discipline, a pipe kept open until `stdin/close`, and the same tree
//! DELETE with its `tree_exited` proof. Bad input gets a typed 4xx.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{marked_pids, marker};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const KEY: &str = "interactive-key";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("padded base64")
}

/// The `createos-local` binary, ended (SIGTERM, then waited for) on drop.
struct Engine {
    child: std::process::Child,
    base: String,
    http: reqwest::Client,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
    }
}

impl Engine {
    fn launch() -> Engine {
        let mut args = vec!["--port", "0"];
        if std::env::var("CREATEOS_LOCAL_TEST_ISOLATION").as_deref() == Ok("process-group") {
            args.extend(["--isolation", "process-group"]);
        }
        let (child, base) =
            test_support::local::start_binary(env!("CARGO_BIN_EXE_createos-local"), args, KEY);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Engine { child, base, http }
    }

    async fn req(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Api-Key", KEY);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.expect("request sent");
        let status = resp.status();
        let bytes = resp.bytes().await.expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.req(Method::POST, path, Some(body)).await
    }

    /// A running sandbox whose processes carry `mark` in their environment.
    async fn sandbox(&self, mark: &str) -> String {
        let (st, v) = self
            .post(
                "/v1/sandboxes",
                json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false,
                       "env": {"TEST_MARKER": mark}}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, v) = self
                .req(Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await;
            if v["data"]["status"] == "running" {
                return id;
            }
            assert!(Instant::now() < deadline, "never running: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `POST .../processes` with `body`: the answer.
    async fn create(&self, sb: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/v1/sandboxes/{sb}/processes"), body)
            .await
    }

    /// Starts a process and follows its output from the first frame.
    async fn start(&self, sb: &str, body: Value) -> Live {
        let (st, v) = self.create(sb, body).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let pid = v["data"]["process_id"].as_str().expect("id").to_string();
        self.follow(sb, &pid, v["data"].clone()).await
    }

    async fn follow(&self, sb: &str, pid: &str, created: Value) -> Live {
        let resp = self
            .http
            .get(format!(
                "{}/v1/sandboxes/{sb}/processes/{pid}/connect?after=0",
                self.base
            ))
            .header("X-Api-Key", KEY)
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .expect("connect");
        assert_eq!(resp.status(), StatusCode::OK);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut resp = resp;
            let mut pending = Vec::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                pending.extend_from_slice(&chunk);
                while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=at).collect();
                    let v: Value = serde_json::from_slice(&line).expect("a JSON frame");
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
        });
        Live {
            sb: sb.to_string(),
            pid: pid.to_string(),
            created,
            rx,
            out: Vec::new(),
            streams: Vec::new(),
            exit: None,
            seq: 0,
        }
    }

    async fn input(&self, live: &Live, bytes: &[u8]) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/sandboxes/{}/processes/{}/input", live.sb, live.pid),
            json!({ "data_base64": b64(bytes) }),
        )
        .await
    }

    async fn resize(&self, live: &Live, cols: u64, rows: u64) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/sandboxes/{}/processes/{}/resize", live.sb, live.pid),
            json!({ "cols": cols, "rows": rows }),
        )
        .await
    }

    async fn close_stdin(&self, live: &Live) -> (StatusCode, Value) {
        self.post(
            &format!(
                "/v1/sandboxes/{}/processes/{}/stdin/close",
                live.sb, live.pid
            ),
            json!({}),
        )
        .await
    }

    async fn delete(&self, live: &Live) -> (StatusCode, Value) {
        self.req(
            Method::DELETE,
            &format!(
                "/v1/sandboxes/{}/processes/{}?grace_ms=500",
                live.sb, live.pid
            ),
            None,
        )
        .await
    }
}

/// A process's `/connect` stream as it arrives.
struct Live {
    sb: String,
    pid: String,
    created: Value,
    rx: mpsc::UnboundedReceiver<Value>,
    /// Every data byte so far, all streams together.
    out: Vec<u8>,
    /// The stream name of every data frame so far.
    streams: Vec<String>,
    exit: Option<Value>,
    seq: u64,
}

/// How long a test waits for what a live command is expected to print: a
/// bound on a hang, not a measure of speed.
const PATIENCE: Duration = Duration::from_secs(60);

impl Live {
    /// Takes the next frame; `false` when the stream ended or `PATIENCE`
    /// passed.
    async fn next(&mut self) -> bool {
        let Ok(Some(f)) = tokio::time::timeout(PATIENCE, self.rx.recv()).await else {
            return false;
        };
        match f["type"].as_str() {
            Some("data") => {
                self.seq += 1;
                assert_eq!(f["seq"].as_u64(), Some(self.seq), "seq gap at {f}");
                self.streams
                    .push(f["stream"].as_str().unwrap_or_default().to_string());
                self.out
                    .extend(unb64(f["data_base64"].as_str().expect("data_base64")));
            }
            Some("exit") => self.exit = Some(f),
            Some("heartbeat") => {}
            _ => panic!("unexpected frame {f}"),
        }
        true
    }

    /// Reads until the output holds `needle`; panics with what came
    /// otherwise.
    async fn expect(&mut self, needle: &str) {
        while !contains(&self.out, needle.as_bytes()) {
            assert!(
                self.exit.is_none() && self.next().await,
                "{needle:?} never came; output: {:?}, exit: {:?}",
                String::from_utf8_lossy(&self.out),
                self.exit
            );
        }
    }

    /// Reads until the exit frame.
    async fn exit(&mut self) -> Value {
        while self.exit.is_none() {
            assert!(
                self.next().await,
                "no exit frame; output: {:?}",
                String::from_utf8_lossy(&self.out)
            );
        }
        self.exit.clone().unwrap_or_default()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn pty(cmd: &str, args: &[&str], cols: u64, rows: u64) -> Value {
    json!({"cmd": cmd, "args": args, "kind": "pty", "cols": cols, "rows": rows})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_answers_the_size_asked_and_then_the_new_size() {
    let e = Engine::launch();
    let mark = marker("pty-size");
    let sb = e.sandbox(&mark).await;
    let mut live = e
        .start(
            &sb,
            pty(
                "/bin/sh",
                &["-c", "stty size; echo ready; read line; stty size"],
                123,
                45,
            ),
        )
        .await;
    assert_eq!(live.created["kind"], "pty", "{}", live.created);
    live.expect("45 123").await;
    live.expect("ready").await;
    let (st, v) = e.resize(&live, 100, 20).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = e.input(&live, b"\n").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    live.expect("20 100").await;
    assert_eq!(live.exit().await["exit_code"], 0);
    assert!(
        live.streams.iter().all(|s| s == "pty"),
        "a terminal's frames are all `pty`: {:?}",
        live.streams
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_a_pts_of_the_sandbox() {
    let e = Engine::launch();
    let sb = e.sandbox(&marker("pty-tty")).await;
    // `tty` names the terminal only if that path, in the command's own
    // mount namespace, is the device on its stdin.
    let mut live = e.start(&sb, pty("tty", &[], 80, 24)).await;
    assert_eq!(live.exit().await["exit_code"], 0);
    let text = String::from_utf8_lossy(&live.out).trim().to_string();
    let n = text
        .strip_prefix("/dev/pts/")
        .unwrap_or_else(|| panic!("`tty` printed {text:?}"));
    assert!(
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_repl_reads_two_lines_typed_apart_and_answers_both() {
    let e = Engine::launch();
    let sb = e.sandbox(&marker("pty-repl")).await;
    let mut live = e.start(&sb, pty("python3", &["-q"], 120, 30)).await;
    live.expect(">>> ").await;
    let (st, v) = e.input(&live, b"print(6*7)\n").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    live.expect("42").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, v) = e.input(&live, b"print('ab' + 'cd')\n").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    live.expect("abcd").await;
    // ^D at the prompt ends the REPL.
    let (st, v) = e.input(&live, b"\x04").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(live.exit().await["exit_code"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_in_pipe_mode_echoes_10_mb_of_random_bytes_byte_exact() {
    let e = Engine::launch();
    let sb = e.sandbox(&marker("pipe-cat")).await;
    let mut data = vec![0u8; 10 * 1024 * 1024];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut data))
        .expect("random bytes");
    let mut live = e.start(&sb, json!({"cmd": "cat"})).await;
    assert_eq!(live.created["kind"], "process", "{}", live.created);
    let writer = {
        let http = e.http.clone();
        let url = format!(
            "{}/v1/sandboxes/{}/processes/{}/input",
            e.base, live.sb, live.pid
        );
        let data = data.clone();
        tokio::spawn(async move {
            for chunk in data.chunks(256 * 1024) {
                let resp = http
                    .post(&url)
                    .header("X-Api-Key", KEY)
                    .json(&json!({ "data_base64": b64(chunk) }))
                    .send()
                    .await
                    .expect("input sent");
                let st = resp.status();
                let v: Value = resp.json().await.unwrap_or_default();
                assert_eq!(st, StatusCode::OK, "{v}");
                assert_eq!(v["data"]["written"], chunk.len(), "{v}");
            }
        })
    };
    while live.out.len() < data.len() && live.exit.is_none() {
        assert!(live.next().await, "output stopped at {}", live.out.len());
    }
    writer.await.expect("writer");
    let (st, v) = e.close_stdin(&live).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(live.exit().await["exit_code"], 0);
    assert_eq!(live.out.len(), data.len());
    assert!(live.out == data, "the echo differs from the input");
    assert!(live.streams.iter().all(|s| s == "stdout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_a_terminal_ends_a_sleep() {
    let e = Engine::launch();
    let sb = e.sandbox(&marker("pty-intr")).await;
    let mut live = e
        .start(
            &sb,
            pty("/bin/sh", &["-c", "echo ready; exec sleep 1000"], 80, 24),
        )
        .await;
    live.expect("ready").await;
    // `exec` may not have replaced the shell yet; ^C ends either.
    let (st, v) = e.input(&live, b"\x03").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let exit = live.exit().await;
    assert!(
        exit["signal"] == "SIGINT" || exit["exit_code"] == 130,
        "{exit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_terminal_leaves_no_process() {
    let e = Engine::launch();
    let mark = marker("pty-delete");
    let sb = e.sandbox(&mark).await;
    let mut live = e
        .start(
            &sb,
            pty(
                "/bin/sh",
                &["-c", "sleep 1000 & sleep 1000 & tty; echo ready; wait"],
                80,
                24,
            ),
        )
        .await;
    assert_eq!(live.created["kind"], "pty", "{}", live.created);
    live.expect("ready").await;
    assert!(
        contains(&live.out, b"/dev/pts/"),
        "the tree runs in a terminal"
    );
    assert!(
        marked_pids(&mark).len() >= 3,
        "the shell and its sleeps run"
    );
    let (st, v) = e.delete(&live).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    assert_eq!(marked_pids(&mark), Vec::<i32>::new());
    live.exit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_interactive_requests_get_a_typed_4xx() {
    let e = Engine::launch();
    let mark = marker("pty-bad");
    let sb = e.sandbox(&mark).await;
    let procs = format!("/v1/sandboxes/{sb}/processes");

    // Refused before anything starts.
    for (body, why) in [
        (json!({"cmd": "cat", "kind": "vt100"}), "unknown kind"),
        (pty("cat", &[], 0, 24), "zero columns"),
        (pty("cat", &[], 80, 100_000), "too many rows"),
        (json!({"cmd": "cat", "cols": 80}), "a size for a pipe"),
    ] {
        let (st, v) = e.post(&procs, body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{why}: {v}");
        assert_eq!(v["status"], "fail", "{v}");
        assert!(v["data"]["message"].is_string(), "{why}: {v}");
    }

    // A pipe process: no resize; input ends with stdin/close.
    let pipe = e.start(&sb, json!({"cmd": "cat"})).await;
    let (st, v) = e.resize(&pipe, 80, 24).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["data"]["reason"], "not_a_terminal", "{v}");
    let (st, v) = e
        .post(
            &format!("{procs}/{}/input", pipe.pid),
            json!({"data_base64": "not base64!"}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = e
        .post(&format!("{procs}/{}/input", pipe.pid), json!({}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    // A paste over the per-request limit: nothing of it is written.
    let huge = vec![b'x'; 1024 * 1024 + 1];
    let (st, v) = e.input(&pipe, &huge).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["data"]["reason"], "input_too_large", "{v}");
    let (st, v) = e.close_stdin(&pipe).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = e.input(&pipe, b"late").await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["data"]["reason"], "stdin_closed", "{v}");

    // A terminal: split UTF-8 is only bytes; stdin/close has no meaning.
    let mut term = e
        .start(
            &sb,
            pty("/bin/sh", &["-c", "read a; echo \"[$a]\""], 80, 24),
        )
        .await;
    let euro = "€".as_bytes();
    for part in [&euro[..1], &euro[1..], b"\n"] {
        let (st, v) = e.input(&term, part).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    term.expect("[€]").await;
    term.exit().await;
    let (st, v) = e.close_stdin(&term).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["data"]["reason"], "not_a_pipe", "{v}");
    // Input to a terminal whose command has ended.
    let (st, v) = e.input(&term, b"more\n").await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["data"]["reason"], "process_exited", "{v}");

    let (st, v) = e
        .req(Method::DELETE, &format!("/v1/sandboxes/{sb}"), None)
        .await;
    assert!(st.is_success(), "{v}");
}
