//! Output at real volume on the engine itself (issue 23 item 1): while a
//! `/connect` reader is attached, nothing it has not received is evicted
//! and the command waits for it; a reader that never reads does not keep
//! a process beyond its deletion.

mod common;

use std::time::Duration;

use common::{exit_frame, stream_bytes, Harness};
use reqwest::StatusCode;
use sandbox_engine::{FaultAction, FaultRule};
use serde_json::Value;

/// Reads a `/connect` body to its end and parses its frames.
async fn frames(mut resp: reqwest::Response) -> Vec<Value> {
    let mut body = Vec::new();
    while let Some(c) = resp.chunk().await.expect("chunk") {
        body.extend_from_slice(&c);
    }
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json line"))
        .collect()
}

async fn open(h: &Harness, sb: &str, pid: &str, after: u64) -> reqwest::Response {
    let resp = h.connect_response(sb, pid, after).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp
}

/// The process's leader is still running (checked without waiting).
async fn still_running(h: &Harness, sb: &str, pid: &str) -> bool {
    let (st, _) = h
        .get(&format!(
            "/v1/sandboxes/{sb}/processes/{pid}/wait?scope=process&timeout_ms=10"
        ))
        .await;
    st == StatusCode::REQUEST_TIMEOUT
}

/// At the default journal (1 MiB), a reader that connects late (after the
/// command already printed far more than the journal holds) and then
/// sleeps 3 s before reading still gets every byte, stdout and stderr
/// apart: the output is held for the reader expected after the process's
/// creation, and then for the attached one.
#[tokio::test]
async fn a_late_and_sleepy_reader_gets_every_byte_at_the_default_journal() {
    let (h, sb) = Harness::with_sandbox().await;
    // 6 MiB on stdout and 2 MiB on stderr, at the same time.
    let pid = h
        .spawn(
            &sb,
            "head -c 6291456 /dev/zero | tr '\\0' o & head -c 2097152 /dev/zero | tr '\\0' e >&2; wait",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(still_running(&h, &sb, &pid).await, "held for its reader");
    let resp = open(&h, &sb, &pid, 0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(still_running(&h, &sb, &pid).await, "held by its reader");
    let frames = frames(resp).await;
    let out = stream_bytes(&frames, "stdout", 0);
    let err = stream_bytes(&frames, "stderr", 0);
    assert_eq!(out.len(), 6 * 1024 * 1024);
    assert!(out.iter().all(|b| *b == b'o'));
    assert_eq!(err.len(), 2 * 1024 * 1024);
    assert!(err.iter().all(|b| *b == b'e'));
    assert_eq!(exit_frame(&frames)["exit_code"], 0);
    // What the engine keeps stays bounded meanwhile (at most about twice
    // the journal: the unread part and the replayable part).
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}/processes/{pid}")).await;
    assert!(
        v["data"]["output"]["bytes"].as_u64().unwrap() <= 2 * 1024 * 1024 + 128 * 1024,
        "{v}"
    );
    assert!(h.server.shutdown().await.all_exited());
}

/// A reader whose connection is reset mid-stream (after 3 frames) and
/// that reconnects from its cursor a second later gets the rest exactly
/// once: what it had not received was held for it meanwhile, although the
/// command printed far more than the journal holds.
#[tokio::test]
async fn a_reset_reader_resumes_from_its_cursor_without_loss() {
    let h = Harness::start().await;
    h.server.faults().add(FaultRule::new(
        "GET",
        "/v1/sandboxes/*/processes/*/connect",
        FaultAction::ResetAfterFrames { frames: 3 },
    ));
    let sb = h.sandbox().await;
    let pid = h.spawn(&sb, "seq 1 1000000").await;
    let mut resp = open(&h, &sb, &pid, 0).await;
    let mut body = Vec::new();
    while let Ok(Some(c)) = resp.chunk().await {
        body.extend_from_slice(&c);
    }
    let first: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json line"))
        .collect();
    assert_eq!(first.len(), 3, "the reset came after 3 frames");
    let cursor = first.last().unwrap()["seq"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rest = frames(open(&h, &sb, &pid, cursor).await).await;
    let mut all = stream_bytes(&first, "stdout", 0);
    all.extend(stream_bytes(&rest, "stdout", cursor));
    let want: String = (1..=1_000_000).map(|i| format!("{i}\n")).collect();
    assert!(
        all == want.as_bytes(),
        "{} of {} bytes",
        all.len(),
        want.len()
    );
    assert_eq!(exit_frame(&rest)["exit_code"], 0);
    assert!(h.server.shutdown().await.all_exited());
}

/// Bad input: a reader that never reads keeps the command blocked on
/// write, but not beyond its deletion (what a client's timeout does): the
/// tree is verified gone.
#[tokio::test]
async fn a_reader_that_never_reads_does_not_keep_the_command_past_its_deletion() {
    let (h, sb) = Harness::with_sandbox().await;
    let pid = h.spawn(&sb, "yes").await;
    let resp = open(&h, &sb, &pid, 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(still_running(&h, &sb, &pid).await);
    let (st, v) = h.delete_process(&sb, &pid, 200).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    drop(resp);
    assert!(h.server.shutdown().await.all_exited());
}

/// A command that writes a fast stream in small pieces (4000 lines of 101
/// bytes, one `write` each) reaches its follower in far fewer frames than
/// writes, every byte in order: after short reads the engine's reader
/// lets the output gather instead of handing on one chunk per write
/// (issue 41 item 3). Chunk by chunk, such a stream cost every step after
/// the pipe (the journal, `/connect`, the client) a wake-up per write.
#[tokio::test]
async fn a_fast_stream_of_small_writes_reaches_the_reader_in_large_chunks() {
    let (h, sb) = Harness::with_sandbox().await;
    let line = "x".repeat(100);
    let pid = h
        .spawn(
            &sb,
            &format!("for i in $(seq 1 4000); do echo {line}; done"),
        )
        .await;
    let frames = frames(open(&h, &sb, &pid, 0).await).await;
    let out = stream_bytes(&frames, "stdout", 0);
    assert_eq!(out, format!("{line}\n").repeat(4000).into_bytes());
    assert_eq!(exit_frame(&frames)["exit_code"], 0);
    let data = frames.iter().filter(|f| f["type"] == "data").count();
    assert!(data <= 400, "{data} output frames for 4000 writes");
    assert!(h.server.shutdown().await.all_exited());
}
