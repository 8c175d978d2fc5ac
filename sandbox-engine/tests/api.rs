//! The HTTP API against real processes: envelope and auth, sandbox
//! lifecycle, files confinement, exec, the output stream and fault injection.

mod common;

use std::time::Duration;

use common::{exit_frame, marked_pids, marker, stream_bytes, Harness, KEY};
use reqwest::{Method, StatusCode};
use sandbox_engine::{FaultAction, FaultRule};
use serde_json::{json, Value};

#[tokio::test]
async fn auth_is_required_everywhere() {
    let h = Harness::start().await;
    for (method, path) in [
        (Method::POST, "/v1/sandboxes"),
        (Method::GET, "/v1/sandboxes/sb-x"),
        (Method::GET, "/_admin/requests"),
    ] {
        for key in [None, Some("wrong")] {
            let mut rb = h.http.request(method.clone(), format!("{}{path}", h.base));
            if let Some(k) = key {
                rb = rb.header("X-Api-Key", k);
            }
            let resp = rb.send().await.expect("send");
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{method} {path}");
            let v: Value = resp.json().await.expect("json");
            assert_eq!(v["status"], "fail");
            assert!(v["data"].is_object());
        }
    }
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn sandbox_lifecycle_and_validation() {
    let h = Harness::start().await;
    let (st, v) = h
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-3vcpu-1gb", "ingress_enabled": false}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["status"], "fail");
    let (st, v) = h
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-2vcpu-4gb", "rootfs": "ubuntu-24.04", "region": "eu", "ingress_enabled": false}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["status"], "success");
    let id = v["data"]["id"].as_str().expect("id").to_string();
    let id_ok = !id.is_empty()
        && id.len() <= 200
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    assert!(id_ok, "{id}");
    assert_eq!(v["data"]["shape"], "s-2vcpu-4gb");
    assert_eq!(v["data"]["rootfs"], "ubuntu-24.04");
    assert_eq!(v["data"]["region"], "eu");
    h.wait_status(&id, "running").await;
    let (_, v) = h.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(v["data"]["id"], id.as_str());

    // Pause / resume are asynchronous; conflicting transitions are 409.
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let pid = h.spawn(&id, "sleep 60").await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "pausing");
    let (st, _) = h
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT);
    h.wait_status(&id, "paused").await;
    // The process is really stopped while the sandbox is paused.
    let (_, v) = h.get(&format!("/v1/sandboxes/{id}/processes/{pid}")).await;
    let host_pid = v["data"]["pid"].as_i64().expect("pid");
    // (A stop takes effect when the process next runs: poll, a loaded
    // machine may take a moment.)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{host_pid}/stat")).expect("stat");
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .chars()
            .next();
        if state == Some('T') {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not stopped: {stat}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (st, _) = h
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "true", "args": []}),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "no new processes while paused");
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "resuming");
    h.wait_status(&id, "running").await;
    let (st, v) = h.get(&format!("/v1/sandboxes/{id}/processes/{pid}")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["data"]["state"], "running");

    // Delete kills the processes and removes the root.
    let root = h.server.data_dir().join(&id);
    assert!(root.exists());
    let (st, v) = h.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(!root.exists());
    let (st, v) = h.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(v["status"], "fail");
    let (st, _) = h.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = h.get("/v1/sandboxes/sb-nope/processes/proc-nope").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn files_round_trip_and_confinement() {
    let (h, sb) = Harness::with_sandbox().await;
    let root = h.server.data_dir().join(&sb);
    let url = |p: &str| format!("{}/v1/sandboxes/{sb}/files?path={p}", h.base);
    let put = |p: String, body: Vec<u8>| {
        h.http
            .put(url(&p))
            .header("X-Api-Key", KEY)
            .header("Content-Type", "application/octet-stream")
            .body(body)
            .send()
    };
    let get = |p: String| h.http.get(url(&p)).header("X-Api-Key", KEY).send();

    let data: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 7).collect();
    let resp = put("/paperclip-workspace/a/b/c.bin".into(), data.clone())
        .await
        .expect("put");
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.expect("envelope");
    assert_eq!(v["status"], "success");
    let resp = get("/paperclip-workspace/a/b/c.bin".into())
        .await
        .expect("get");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.bytes().await.expect("bytes").as_ref(), data.as_slice());
    assert_eq!(
        std::fs::read(root.join("paperclip-workspace/a/b/c.bin")).expect("on disk"),
        data
    );

    // Missing parameter, wrong method: still the JSend envelope (the
    // status named, or any 4xx where none is).
    for (method, path, want) in [
        (
            Method::GET,
            format!("/v1/sandboxes/{sb}/files"),
            Some(StatusCode::BAD_REQUEST),
        ),
        (
            Method::PATCH,
            format!("/v1/sandboxes/{sb}"),
            Some(StatusCode::METHOD_NOT_ALLOWED),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{sb}/processes/p/connect?after=x"),
            None,
        ),
    ] {
        let resp = h
            .http
            .request(method.clone(), format!("{}{path}", h.base))
            .header("X-Api-Key", KEY)
            .send()
            .await
            .expect("sent");
        match want {
            Some(want) => assert_eq!(resp.status(), want, "{method} {path}"),
            None => assert!(resp.status().is_client_error(), "{method} {path}"),
        }
        let v: Value = resp.json().await.expect("envelope");
        assert_eq!(v["status"], "fail", "{method} {path}");
    }

    // Lexically invalid paths.
    for bad in ["relative/x", "/tmp/../../etc/passwd", "/tmp/..", "/"] {
        let enc = bad.replace('/', "%2F");
        let resp = put(enc.clone(), b"x".to_vec()).await.expect("put");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "PUT {bad}");
        let resp = get(enc).await.expect("get");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "GET {bad}");
    }
    // Host system directories are read-only.
    let resp = put("/etc/evil".into(), b"x".to_vec()).await.expect("put");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    // Symlinks planted inside the sandbox cannot reach the host.
    let outside = std::env::temp_dir().join(marker("outside"));
    std::fs::create_dir_all(&outside).expect("mkdir outside");
    std::fs::write(outside.join("secret"), b"host secret").expect("write secret");
    let ws = root.join("paperclip-workspace");
    std::os::unix::fs::symlink(outside.join("secret"), ws.join("abs-link")).expect("ln");
    std::os::unix::fs::symlink("../../../../../../../..", ws.join("up-link")).expect("ln");
    std::os::unix::fs::symlink(&outside, ws.join("dir-link")).expect("ln");
    let resp = get("/paperclip-workspace/abs-link".into())
        .await
        .expect("get");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let escaped = format!(
        "/paperclip-workspace/up-link{}",
        outside.join("secret").display()
    );
    let resp = get(escaped.clone()).await.expect("get");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{escaped}");
    // The link's target does not exist inside the sandbox: 404, and above
    // all nothing is written on the host.
    let resp = put(
        "/paperclip-workspace/dir-link/planted".into(),
        b"x".to_vec(),
    )
    .await
    .expect("put");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(
        !outside.join("planted").exists(),
        "write escaped via symlinked dir"
    );
    let resp = put(escaped, b"overwrite".to_vec()).await.expect("put");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        std::fs::read(outside.join("secret")).expect("secret"),
        b"host secret"
    );
    let resp = put("/paperclip-workspace/abs-link".into(), b"replaced".to_vec())
        .await
        .expect("put");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        std::fs::read(outside.join("secret")).expect("secret"),
        b"host secret"
    );
    let _ = std::fs::remove_dir_all(&outside);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn exec_cwd_and_env() {
    let h = Harness::start().await;
    let sb = h.sandbox_with_env(json!({"GREETING": "hello"})).await;
    let r = h.exec(&sb, "echo out; echo err >&2; exit 5").await;
    assert_eq!(r["exit_code"], 5);
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");

    // cwd validation.
    for bad in ["relative", "/../..", "/does/not/exist"] {
        let (st, v) = h
            .post(
                &format!("/v1/sandboxes/{sb}/processes"),
                json!({"cmd": "pwd", "args": [], "cwd": bad}),
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "cwd {bad}: {v}");
    }
    let pid = h
        .spawn_body(
            &sb,
            json!({"cmd": "/bin/bash", "args": ["-c", "pwd; echo $GREETING"],
                   "cwd": "/paperclip-workspace", "env": {"GREETING": "bonjour"}}),
        )
        .await;
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    let out = String::from_utf8(stream_bytes(&frames, "stdout", 0)).expect("utf8");
    if h.bwrap() {
        assert_eq!(out, "/paperclip-workspace\nbonjour\n");
        // Each sandbox has its own /tmp.
        let r = h.exec(&sb, "echo mine > /tmp/own && cat /tmp/own").await;
        assert_eq!(r["stdout"], "mine\n");
        assert!(h.server.data_dir().join(&sb).join("tmp/own").exists());
        // System directories are read-only; the capabilities left are the
        // sandbox root's own (none without a machine).
        let r = h
            .exec(
                &sb,
                "touch /usr/cl-probe 2>/dev/null && echo wrote || echo ro",
            )
            .await;
        assert_eq!(r["stdout"], "ro\n");
        let r = h.exec(&sb, "grep CapEff /proc/self/status").await;
        let expected = format!("{:016x}", sandbox_engine::machine::capabilities_here());
        assert!(
            r["stdout"]
                .as_str()
                .is_some_and(|s| s.trim().ends_with(&expected)),
            "{r}"
        );
        // Its own PID namespace: the command does not see host processes.
        let r = h.exec(&sb, "ls /proc | grep -c '^[0-9]'").await;
        let n: u32 = r["stdout"]
            .as_str()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(999);
        assert!(n < 10, "sees {n} processes");
    } else {
        let host = h.server.data_dir().join(&sb).join("paperclip-workspace");
        assert_eq!(out, format!("{}\nbonjour\n", host.display()));
    }
    // Undeclared env keys are refused.
    let (st, v) = h
        .post(
            &format!("/v1/sandboxes/{sb}/processes"),
            json!({"cmd": "true", "args": [], "env": {"OTHER": "x"}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    // The server's own environment (and key) is not inherited.
    let r = h.exec(&sb, "env").await;
    assert!(!r["stdout"].as_str().unwrap_or("").contains(KEY));
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn output_stream_binary_utf8_and_seq() {
    let (h, sb) = Harness::with_sandbox().await;
    // Binary output (every byte value) via a staged file.
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let resp = h
        .http
        .put(format!("{}/v1/sandboxes/{sb}/files?path=/tmp/blob", h.base))
        .header("X-Api-Key", KEY)
        .body(data.clone())
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status(), StatusCode::OK);
    let script = if h.bwrap() {
        "cat /tmp/blob".to_string()
    } else {
        format!("cat {}/tmp/blob", h.server.data_dir().join(&sb).display())
    };
    let pid = h.spawn(&sb, &script).await;
    let (st, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(st, StatusCode::OK);
    assert_eq!(stream_bytes(&frames, "stdout", 0), data);
    assert_eq!(exit_frame(&frames)["exit_code"], 0);

    // A euro sign split across writes (and likely frames), interleaved
    // with stderr: bytes reconstruct exactly, seq is shared.
    let pid = h
        .spawn(
            &sb,
            r"printf '\xe2\x82'; sleep 0.3; printf 'x' >&2; sleep 0.3; printf '\xac\n'",
        )
        .await;
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(stream_bytes(&frames, "stdout", 0), "€\n".as_bytes());
    assert_eq!(stream_bytes(&frames, "stderr", 0), b"x");
    // Replay from a cursor gives exactly the later frames.
    let (_, later) = h.connect(&sb, &pid, 1).await.expect("connect");
    let n = frames.iter().filter(|f| f["type"] == "data").count();
    assert_eq!(later.iter().filter(|f| f["type"] == "data").count(), n - 1);
    let _ = stream_bytes(&later, "stdout", 1);

    // stdin: a reader ends when stdin is closed; closing twice is 409.
    let pid = h.spawn(&sb, "cat; echo eof").await;
    let path = format!("/v1/sandboxes/{sb}/processes/{pid}/stdin/close");
    let (st, _) = h.post(&path, json!({})).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = h.post(&path, json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(stream_bytes(&frames, "stdout", 0), b"eof\n");

    // Signals: SIGTERM ends a sleeping leader; the exit frame says so.
    let pid = h.spawn(&sb, "exec sleep 60").await;
    let (st, v) = h
        .post(
            &format!("/v1/sandboxes/{sb}/processes/{pid}/signal"),
            json!({"signal": "SIGTERM"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(exit_frame(&frames)["signal"], "SIGTERM", "{frames:?}");
    let mp = h.wait_tree(&sb, &pid).await;
    assert_eq!(mp["signal"], "SIGTERM");
    assert_eq!(mp["tree_exited"], true);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn journal_eviction_gives_410_to_late_readers() {
    let (h, sb) = Harness::with_sandbox().await;
    let (pid, mp) = h
        .spawn_finished(&sb, "head -c 5242880 /dev/zero | tr '\\0' a")
        .await;
    assert_eq!(mp["exit_code"], 0, "{mp}");
    let oldest = mp["output"]["oldest_seq"].as_u64().expect("oldest");
    let newest = mp["output"]["newest_seq"].as_u64().expect("newest");
    let bytes = mp["output"]["bytes"].as_u64().expect("bytes");
    assert!(oldest > 1, "{mp}");
    assert!(bytes <= 1024 * 1024 + 65_536, "{mp}");
    let (st, v) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(st, StatusCode::GONE, "{v:?}");
    assert_eq!(v[0]["status"], "fail");
    // A reader at the edge of the journal still gets everything retained.
    let (st, frames) = h.connect(&sb, &pid, oldest - 1).await.expect("connect");
    assert_eq!(st, StatusCode::OK);
    let data = stream_bytes(&frames, "stdout", oldest - 1);
    assert_eq!(data.len() as u64, bytes);
    assert!(data.iter().all(|b| *b == b'a'));
    assert_eq!(
        frames.iter().filter(|f| f["type"] == "data").count() as u64,
        newest - oldest + 1
    );
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn injected_status_delay_and_request_record() {
    let (h, sb) = Harness::with_sandbox().await;
    let faults = h.server.faults().clone();
    faults.add(
        FaultRule::new(
            "GET",
            "/v1/sandboxes/*",
            FaultAction::Status { status: 503 },
        )
        .times(2),
    );
    let path = format!("/v1/sandboxes/{sb}");
    for _ in 0..2 {
        let (st, v) = h.get(&path).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["status"], "error");
        assert!(v["message"].is_string());
    }
    let (st, _) = h.get(&path).await;
    assert_eq!(st, StatusCode::OK, "rule used up");
    assert!(faults.count("GET", "/v1/sandboxes/*") >= 3);
    let rec: Vec<_> = faults
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .collect();
    assert_eq!(rec.iter().filter(|r| r.status == 503).count(), 2);

    // Delay past a client deadline.
    faults.add(FaultRule::new(
        "GET",
        "/v1/sandboxes/*",
        FaultAction::Delay { ms: 3000 },
    ));
    let err = h
        .http
        .get(format!("{}{path}", h.base))
        .header("X-Api-Key", KEY)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(err.is_err_and(|e| e.is_timeout()));

    // The same over the admin endpoint, with a 4xx: a fail envelope.
    let (st, v) = h
        .post(
            "/_admin/faults",
            json!({"method": "POST", "path": "/v1/sandboxes/*/exec",
                   "action": {"kind": "status", "status": 429}, "times": "always"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for _ in 0..2 {
        let (st, v) = h
            .post(
                &format!("/v1/sandboxes/{sb}/exec"),
                json!({"cmd": "true", "args": []}),
            )
            .await;
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(v["status"], "fail");
    }
    let (st, _) = h.delete("/_admin/faults").await;
    assert_eq!(st, StatusCode::OK);
    let r = h.exec(&sb, "true").await;
    assert_eq!(r["exit_code"], 0);
    let (_, v) = h.get("/_admin/requests").await;
    assert!(v["data"]["requests"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let (_, v) = h.get("/_admin/info").await;
    assert!(v["data"]["isolation"].is_string());
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn injected_stream_faults() {
    let (h, sb) = Harness::with_sandbox().await;
    let pid = h
        .spawn(&sb, "for i in 1 2 3 4 5 6; do echo $i; sleep 0.05; done")
        .await;
    let _ = h.wait_tree(&sb, &pid).await;
    let connect = "/v1/sandboxes/*/processes/*/connect";
    let faults = h.server.faults();

    // Reset after two frames: the body errors after exactly two lines.
    faults.add(FaultRule::new(
        "GET",
        connect,
        FaultAction::ResetAfterFrames { frames: 2 },
    ));
    let mut resp = h.connect_response(&sb, &pid, 0).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut got = Vec::new();
    let mut failed = false;
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break,
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "body must end with a transport error");
    let lines: Vec<&[u8]> = got
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 2);

    // Malformed frame after one good frame.
    faults.add(FaultRule::new(
        "GET",
        connect,
        FaultAction::MalformedFrame { frames: 1 },
    ));
    let (st, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(st, StatusCode::OK);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0]["seq"], 1);
    assert!(frames[1].is_string(), "second line is not JSON: {frames:?}");

    // A 503 on connect, then a normal replay.
    faults.add(FaultRule::new(
        "GET",
        connect,
        FaultAction::Status { status: 503 },
    ));
    let (st, _) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(stream_bytes(&frames, "stdout", 0), b"1\n2\n3\n4\n5\n6\n");
    assert_eq!(faults.count("GET", connect), 4);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn injected_tree_not_exited_still_terminates() {
    let h = Harness::start().await;
    let m = marker("treefault");
    let sb = h.sandbox_with_env(json!({"TEST_MARKER": m})).await;
    let pid = h.spawn(&sb, "sleep 60 & sleep 60; :").await;
    assert!(common::wait_marked(&m, 2).await.len() >= 2);
    h.server.faults().add(FaultRule::new(
        "DELETE",
        "/v1/sandboxes/*/processes/*",
        FaultAction::TreeNotExited,
    ));
    let (st, v) = h.delete_process(&sb, &pid, 200).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["data"]["tree_exited"], false, "{v}");
    assert!(marked_pids(&m).is_empty(), "the tree is really gone");
    let rec = h.server.faults().requests();
    assert!(rec
        .iter()
        .any(|r| r.method == "DELETE" && r.fault == Some(FaultAction::TreeNotExited)));
    assert!(h.server.shutdown().await.all_exited());
}

#[test]
fn background_server_for_sync_hosts() {
    let bg = sandbox_engine::RunningServer::start_in_background(KEY).expect("start");
    assert!(bg.base_url().starts_with("http://127.0.0.1:"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let base = bg.base_url();
    let status = rt.block_on(async move {
        reqwest::Client::new()
            .get(format!("{base}/_admin/info"))
            .header("X-Api-Key", KEY)
            .send()
            .await
            .map(|r| r.status())
    });
    assert_eq!(status.ok(), Some(StatusCode::OK));
    assert!(bg.shutdown().all_exited());
}

/// Issue 23 item 1 (this test pinned the opposite before: a reader that
/// fell behind got `output_offset_expired`). A connected reader that does
/// not read holds the producer back instead: nothing it has not received
/// is evicted, the command blocks on write, and every byte arrives once
/// the reader reads.
#[tokio::test]
async fn slow_live_reader_holds_the_producer_back_and_gets_every_byte() {
    let h =
        Harness::start_builder(sandbox_engine::Server::builder().journal_capacity(64 * 1024)).await;
    let sb = h.sandbox().await;
    // 8 MiB: 128 times the journal.
    let pid = h.spawn(&sb, "head -c 8388608 /dev/zero | tr '\\0' b").await;
    let mut resp = h.connect_response(&sb, &pid, 0).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Not reading for 3 s: the command cannot finish meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let (st, _) = h
        .get(&format!(
            "/v1/sandboxes/{sb}/processes/{pid}/wait?scope=process&timeout_ms=10"
        ))
        .await;
    assert_eq!(
        st,
        StatusCode::REQUEST_TIMEOUT,
        "the producer was held back"
    );
    let mut body = Vec::new();
    while let Some(c) = resp.chunk().await.expect("chunk") {
        body.extend_from_slice(&c);
    }
    let frames: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json line"))
        .collect();
    let out = stream_bytes(&frames, "stdout", 0);
    assert_eq!(out.len(), 8 * 1024 * 1024);
    assert!(out.iter().all(|b| *b == b'b'));
    assert_eq!(exit_frame(&frames)["exit_code"], 0);
    assert!(h.server.shutdown().await.all_exited());
}

/// A `/connect` stream of a command silent for 6 s carries heartbeat
/// frames meanwhile, then the late output and the exit.
#[tokio::test]
async fn idle_stream_sends_heartbeats() {
    let (h, sb) = Harness::with_sandbox().await;
    let pid = h.spawn(&sb, "sleep 6; echo late").await;
    let (_, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert!(
        frames.iter().any(|f| f["type"] == "heartbeat"),
        "{frames:?}"
    );
    assert_eq!(stream_bytes(&frames, "stdout", 0), b"late\n");
    assert_eq!(exit_frame(&frames)["exit_code"], 0);
    let (st, v) = h
        .get(&format!(
            "/v1/sandboxes/{sb}/processes/{pid}/wait?scope=process&timeout_ms=30000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["data"]["leader_exited"], true);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn injected_dropped_response_and_raw_body() {
    let h = Harness::start().await;
    let m = marker("dropped");
    let sb = h.sandbox_with_env(json!({"TEST_MARKER": m})).await;
    let faults = h.server.faults();
    // The process is created, but the client only sees a transport error.
    faults.add(FaultRule::new(
        "POST",
        "/v1/sandboxes/*/processes",
        FaultAction::DropResponse,
    ));
    let sent = h
        .http
        .post(format!("{}/v1/sandboxes/{sb}/processes", h.base))
        .header("X-Api-Key", KEY)
        .json(&json!({"cmd": "/bin/bash", "args": ["-c", "sleep 60; :"]}))
        .send()
        .await;
    let outcome = match sent {
        Err(_) => Err(()),
        Ok(resp) => resp.bytes().await.map_err(|_| ()),
    };
    assert!(outcome.is_err(), "the client must see a transport error");
    assert!(!common::wait_marked(&m, 1).await.is_empty(), "it did start");

    // A raw, invalid answer.
    faults.add(FaultRule::new(
        "GET",
        "/v1/sandboxes/*",
        FaultAction::Respond {
            status: 200,
            body: r#"{"status":"success","data":{"id":"bad id!"}}"#.into(),
        },
    ));
    let (st, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["data"]["id"], "bad id!");

    // Deleting the sandbox (and shutdown) still finds the orphan.
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(marked_pids(&m).is_empty());
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 11 (`sandbox run` latency): with `transition_delay(0)` a created
/// sandbox still answered `creating` and became `running` only in a task
/// run later, so a client's first status read could still see `creating`
/// and wait a whole poll interval (250 ms in the provider). With no delay
/// the create answer is already `running`, and so is every read after it.
#[tokio::test]
async fn without_a_transition_delay_a_new_sandbox_runs_at_once() {
    let mut builder = sandbox_engine::Server::builder()
        .api_key(KEY)
        .transition_delay(Duration::ZERO)
        .quiet(true);
    if std::env::var("CREATEOS_LOCAL_TEST_ISOLATION").as_deref() == Ok("process-group") {
        builder = builder.isolation(sandbox_engine::IsolationPreference::ProcessGroup);
    }
    let server = builder.start().await.expect("server starts");
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/v1/sandboxes", server.base_url()))
        .header("X-Api-Key", KEY)
        .json(&json!({"shape": "s-1vcpu-256mb"}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["data"]["status"], "running", "{v}");
    assert!(server.shutdown().await.all_exited());
}
