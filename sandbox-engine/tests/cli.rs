//! The `createos-local` binary: one `listening on` line, key from the
//! environment, and SIGTERM terminates every process tree it started.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{marked_pids, marker, wait_marked};
use serde_json::{json, Value};

#[tokio::test]
async fn binary_prints_address_and_cleans_up_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_createos-local"))
        .args(["--port", "0"])
        .env("CREATEOS_API_KEY", "cli-key")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn binary");
    // Its stdout stays open (as the test's reader kept it) until the end.
    let (base, _lines) = test_support::local::listening(&mut child);
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let port: u16 = base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    assert_ne!(port, 0);

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let call = |method: reqwest::Method, path: &str, body: Value| {
        http.request(method, format!("{base}{path}"))
            .header("X-Api-Key", "cli-key")
            .json(&body)
            .send()
    };
    let resp = call(reqwest::Method::GET, "/_admin/info", json!({}))
        .await
        .expect("info");
    assert_eq!(resp.status(), 200);
    let m = marker("cli");
    let resp = call(
        reqwest::Method::POST,
        "/v1/sandboxes",
        json!({"shape": "s-1vcpu-256mb", "ingress_enabled": false, "env": {"TEST_MARKER": m}}),
    )
    .await
    .expect("create");
    let v: Value = resp.json().await.expect("json");
    let sb = v["data"]["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v: Value = call(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{sb}"),
            json!({}),
        )
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
        if v["data"]["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resp = call(
        reqwest::Method::POST,
        &format!("/v1/sandboxes/{sb}/processes"),
        json!({"cmd": "/bin/bash", "args": ["-c", "trap '' TERM; sleep 60 & sleep 60; :"]}),
    )
    .await
    .expect("spawn");
    assert_eq!(resp.status(), 201);
    assert!(wait_marked(&m, 2).await.len() >= 2);

    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("sigterm");
    let status = tokio::task::spawn_blocking(move || child.wait().map(|s| (s, child)))
        .await
        .expect("join")
        .expect("wait");
    let (status, mut child) = status;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "exit {status}; stderr: {err}");
    assert!(err.contains("isolation mode"), "{err}");
    assert!(err.contains("none survived"), "{err}");
    assert!(marked_pids(&m).is_empty());
}

/// Issue 24: the key can come from a file (never on a command line, where
/// `/proc/<pid>/cmdline` shows it to every user); `--help` warns about
/// `--api-key` and states the host-wide budgets and the retention.
#[tokio::test]
async fn the_key_comes_from_a_file_and_help_states_budgets() {
    let help = Command::new(env!("CARGO_BIN_EXE_createos-local"))
        .arg("--help")
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "/proc/<pid>/cmdline",
        "--api-key-file",
        "--max-sandboxes",
        "--max-processes",
        "--finished-ttl",
        "--finished-keep",
        "--finished-output",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}: {text}");
    }
    let dir = std::env::temp_dir().join(format!("cl-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("key");
    std::fs::write(&file, "file-key\n").expect("write key");
    let mut child = Command::new(env!("CARGO_BIN_EXE_createos-local"))
        .args(["--port", "0", "--api-key-file"])
        .arg(&file)
        .env_remove("CREATEOS_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn binary");
    let (base, _) = test_support::local::listening(&mut child);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains("file-key"));
    let http = reqwest::Client::new();
    for (key, want) in [("file-key", 200), ("wrong", 401)] {
        let resp = http
            .get(format!("{base}/_admin/info"))
            .header("X-Api-Key", key)
            .send()
            .await
            .expect("info");
        assert_eq!(resp.status(), want);
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
