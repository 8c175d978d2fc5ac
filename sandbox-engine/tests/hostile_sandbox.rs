//! The engine under attack from inside its own sandboxes and through the
//! API's own fields (issue 24, the server, API and storage side): trees
//! deeper than any stack, host-wide budgets, bounded retention of finished
//! processes, server failures answered as 5xx, and slow or unauthenticated
//! clients. Every test names the defect it pins; each failed on the code
//! before the fix.

mod common;

use std::time::{Duration, Instant};

use common::{Harness, KEY};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Directory levels a sandbox builds below its cwd (the server
/// crashed from 15 000 on).
const DEPTH: usize = 100_000;

/// A Perl one-liner (no shell quoting inside) that builds [`DEPTH`]
/// nested directories `d` in the cwd and prints `deep`.
fn deep_script() -> String {
    format!(
        "for(1..{DEPTH}){{mkdir q(d) or die q(mkdir);chdir q(d) or die q(chdir)}} print qq(deep)"
    )
}

/// Issue 24 item 1 (CreateOS face): deleting a sandbox whose command built
/// a directory chain 100 000 levels deep aborted the whole server (stack
/// overflow in the recursive removal). Now the delete succeeds, the root
/// is gone from disk, and the server keeps serving other sandboxes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_100000_level_tree_does_not_crash_the_server() {
    let h = Harness::start().await;
    let other = h.sandbox().await;
    let sb = h.sandbox().await;
    let (st, v) = build_deep_tree(&h, &sb).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["result"]["exit_code"], 0, "{v}");
    let root = h.server.data_dir().join(&sb);
    assert!(root.exists());
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(!root.exists(), "the sandbox root is left on disk");
    let (st, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let out = h.exec(&other, "echo alive").await;
    assert_eq!(out["exit_code"], 0, "{out}");
}

/// Issue 24 item 1: a deep tree still present at shutdown (never deleted)
/// is removed by the shutdown without aborting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_a_100000_level_tree() {
    let (h, sb) = Harness::with_sandbox().await;
    let (st, v) = build_deep_tree(&h, &sb).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let root = h.server.data_dir().join(&sb);
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
    assert!(!root.exists(), "the sandbox root is left on disk");
}

/// Issue 24 item 1 (Daytona face): the same 100 000-level tree built
/// through `process/execute`, then `DELETE /sandbox/{id}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_deep_tree_through_the_daytona_face_does_not_crash_the_server() {
    let h = Harness::start().await;
    let sb = h.daytona_sandbox().await;
    let (st, v) = h
        .daytona_execute(&sb, &format!("/usr/bin/perl -e '{}'", deep_script()))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 0, "{v}");
    let root = h.server.data_dir().join(format!("daytona-{sb}"));
    assert!(root.exists());
    let (st, v) = h.daytona_delete(&sb).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(!root.exists(), "the sandbox root is left on disk");
    let other = h.daytona_sandbox().await;
    let (st, v) = h.daytona_execute(&other, "echo alive").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 0, "{v}");
}

/// Issue 24 item 6: finished processes kept their output journal until
/// the sandbox went (300 commands of 1 MB grew the server by 290 MB). Now
/// at most `keep` finished processes stay per sandbox: the older ones
/// answer 404, the newest still answer with their exit, on both faces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_processes_beyond_the_count_are_dropped() {
    const KEEP: usize = 3;
    let h = Harness::start_builder(
        sandbox_engine::Server::builder().finished_retention(Duration::from_secs(3600), KEEP),
    )
    .await;
    let sb = h.sandbox().await;
    let mut ids = Vec::new();
    for _ in 0..KEEP + 4 {
        let pid = h.spawn(&sb, "head -c 100000 /dev/zero").await;
        h.wait_tree(&sb, &pid).await;
        ids.push(pid);
    }
    let (old, new) = ids.split_at(ids.len() - KEEP);
    let until = deadline(60);
    for pid in old {
        let what = format!("finished process {pid}");
        forgotten_by(until, &what, async || {
            h.get(&format!("/v1/sandboxes/{sb}/processes/{pid}")).await
        })
        .await;
    }
    for pid in new {
        let (st, v) = h.get(&format!("/v1/sandboxes/{sb}/processes/{pid}")).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }

    // The Daytona face: session commands beyond the count are forgotten.
    let dsb = h.daytona_sandbox().await;
    let tb = format!("{}/{dsb}", h.server.toolbox_url());
    let (st, v) = h.daytona_session(&dsb, "s").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let mut cmds = Vec::new();
    for _ in 0..KEEP + 3 {
        let (st, v) = h
            .daytona_session_exec(&dsb, "s", json!({"command": "true"}))
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        cmds.push(v["cmdId"].as_str().expect("cmdId").to_string());
    }
    forgotten_by(deadline(60), "the finished command", async || {
        let url = format!("{tb}/process/session/s/command/{}", cmds[0]);
        h.daytona(Method::GET, url, None).await
    })
    .await;
    let last = cmds.last().expect("a command");
    let (st, v) = h
        .daytona(
            Method::GET,
            &format!("{tb}/process/session/s/command/{last}"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 0, "{v}");
}

/// Issue 24 item 4 (server side): sandboxes and live processes were
/// unlimited host-wide (2 000 sandboxes in 1.7 s). Now one over the
/// budget is a 429 naming the limit, on both faces, and a slot freed by a
/// delete can be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_wide_budgets_refuse_creation_with_429() {
    let h = Harness::start_builder(
        sandbox_engine::Server::builder()
            .max_sandboxes(2)
            .max_processes(2),
    )
    .await;
    let a = h.sandbox().await;
    let b = h.daytona_sandbox().await;
    let (st, v) = h.create_sandbox(json!({})).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["data"]["reason"], "sandbox_limit", "{v}");
    let (st, v) = h.daytona_create(json!({"snapshot": "daytona-small"})).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["code"], "sandbox_limit", "{v}");

    let p1 = h.spawn(&a, "sleep 60").await;
    let p2 = h.spawn(&a, "sleep 60").await;
    h.assert_process_limit(&a).await;
    // The other sandbox still gets its fair share (2 / 2 sandboxes = 1):
    // one sandbox at the budget does not starve another.
    let (st, v) = h.daytona_execute(&b, "true").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let url = format!("{}/{b}/process/session", h.server.toolbox_url());
    let (st, v) = h
        .daytona(Method::POST, url, Some(json!({ "sessionId": "hold" })))
        .await;
    assert!(st.is_success(), "{v}");
    let (st, v) = h
        .daytona_session_exec(
            &b,
            "hold",
            json!({ "command": "sleep 60", "runAsync": true }),
        )
        .await;
    assert!(st.is_success(), "{v}");
    let (st, v) = h.daytona_execute(&b, "true").await;
    assert_eq!(
        st,
        StatusCode::TOO_MANY_REQUESTS,
        "past its share and the budget: {v}"
    );
    for p in [p1, p2] {
        let (st, v) = h.delete_process(&a, &p, 100).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let out = h.exec(&a, "echo again").await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let (st, v) = h.delete(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    h.sandbox().await;
}

/// Issue 24 item 8: a request body that stalls was never timed out, so 8
/// stalled `PUT /files` held every upload slot (503 `busy` for all uploads,
/// on both faces, still after 137 s). Now a body that sends nothing for
/// the body-read timeout is answered 408 and its slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upload_bodies_give_their_slots_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start_builder(
        sandbox_engine::Server::builder().body_read_timeout(Duration::from_millis(1500)),
    )
    .await;
    let sb = h.sandbox().await;
    let addr = h.server.addr();
    let mut stalled = Vec::new();
    for i in 0..12 {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "PUT /v1/sandboxes/{sb}/files?path=/tmp/stalled-{i} HTTP/1.1\r\nHost: x\r\n\
             X-Api-Key: {KEY}\r\nContent-Length: 100000\r\n\r\n0123456789"
        );
        s.write_all(head.as_bytes()).await.expect("write");
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = h
        .http
        .put(format!("{}/v1/sandboxes/{sb}/files", h.base))
        .query(&[("path", "/tmp/fresh")])
        .header("X-Api-Key", KEY)
        .body(vec![7u8; 4096])
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.text().await);
    for mut s in stalled {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
    let (st, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

/// Issue 24 item 8: unauthenticated half-sent requests held every
/// connection slot (512 of them made every API request 503 for each 120 s
/// window). Now a connection that has not sent the key (for 2 s) is
/// evicted, oldest first, when a new client needs its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_half_sent_requests_cannot_starve_authenticated_ones() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start_builder(sandbox_engine::Server::builder().max_connections(8)).await;
    let addr = h.server.addr();
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /v1/sandboxes/sb-x HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        held.push(s);
    }
    // Eviction takes connections at least 2 s old without the key.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Fresh connections each time (no pooled connection from before).
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    for _ in 0..3 {
        let resp = fresh
            .post(format!("{}/v1/sandboxes", h.base))
            .header("X-Api-Key", KEY)
            .json(&json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false}))
            .send()
            .await
            .expect("request");
        assert_eq!(
            resp.status(),
            StatusCode::CREATED,
            "{:?}",
            resp.text().await
        );
    }
    drop(held);
}

/// Asks `fetch` until it answers 404 (anything but 200 before fails), by
/// `until`: `what` is then forgotten.
async fn forgotten_by(
    until: Instant,
    what: &str,
    mut fetch: impl AsyncFnMut() -> (StatusCode, Value),
) {
    loop {
        let (st, v) = fetch().await;
        if st == StatusCode::NOT_FOUND {
            return;
        }
        assert_eq!(st, StatusCode::OK, "{v}");
        assert!(Instant::now() < until, "{what} is still kept: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs [`deep_script`] in `sb` through `exec`.
async fn build_deep_tree(h: &Harness, sb: &str) -> (StatusCode, Value) {
    h.post(
        &format!("/v1/sandboxes/{sb}/exec"),
        json!({"cmd": "/usr/bin/perl", "args": ["-e", deep_script()]}),
    )
    .await
}

fn deadline(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}
