//! Issue 43 item 3, idle pause: a sandbox made with
//! `auto_pause_after_seconds` is paused by the engine once no command has
//! started or run for that long, never while one runs; a resume brings it
//! back with its files and background processes; a window outside the
//! service's range is a 400 before anything is made.

mod common;

use std::time::Duration;

use common::Harness;
use reqwest::StatusCode;
use sandbox_engine::Server;
use serde_json::json;

async fn engine() -> Harness {
    Harness::start_builder(Server::builder().min_auto_pause(Duration::from_secs(1))).await
}

async fn status(h: &Harness, sb: &str) -> String {
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    v["data"]["status"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn an_idle_sandbox_is_paused_after_its_window_and_never_while_a_command_runs() {
    let h = engine().await;
    let (st, v) = h
        .post(
            "/v1/sandboxes",
            json!({ "shape": "s-1vcpu-1gb", "auto_pause_after_seconds": 2 }),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["data"]["auto_pause_after_seconds"], 2, "{v}");
    let sb = v["data"]["id"].as_str().expect("id").to_string();
    h.wait_status(&sb, "running").await;
    // A command that runs longer than the window keeps it running.
    let long = h
        .spawn(&sb, "echo kept > /paperclip-workspace/file; sleep 4")
        .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(status(&h, &sb).await, "running");
    let (st, v) = h
        .get(&format!(
            "/v1/sandboxes/{sb}/processes/{long}/wait?scope=process&timeout_ms=20000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // Idle now: paused within its window and the reaper's second.
    h.wait_status(&sb, "paused").await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/resume"), json!({}))
        .await;
    assert!(st.is_success(), "{v}");
    h.wait_status(&sb, "running").await;
    let r = h.exec(&sb, "cat /paperclip-workspace/file").await;
    assert_eq!(r["stdout"], "kept\n", "{r}");
    // A sandbox without a window is never paused by the engine.
    let plain = h.sandbox().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(&h, &plain).await, "running");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn a_window_outside_the_range_is_refused() {
    let h = Harness::start().await;
    for secs in [0, 59, 86_401] {
        let (st, v) = h
            .post(
                "/v1/sandboxes",
                json!({ "shape": "s-1vcpu-1gb", "auto_pause_after_seconds": secs }),
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{secs}: {v}");
        assert!(v.to_string().contains("auto_pause_after_seconds"), "{v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}
