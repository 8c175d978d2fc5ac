//! Issue 38 (the engine's Daytona face): an asynchronous session command
//! takes input while it runs, through
//! `POST …/process/session/{sid}/command/{cmdId}/input {"data"}` as on the
//! real service; a command whose stdin is closed (a synchronous one) or
//! that has exited refuses it with a typed 409, and bad bodies get a 400.

mod common;

use std::time::{Duration, Instant};

use common::Harness;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Waits for command `cid` of session `sid` to exit: its status.
async fn finished(h: &Harness, base: &str, cid: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (st, v) = h
            .daytona(Method::GET, format!("{base}/command/{cid}"), None)
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        if v["exitCode"].is_number() {
            return v;
        }
        assert!(Instant::now() < deadline, "{cid} never exited: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_session_command_reads_input_sent_while_it_runs() {
    let h = Harness::start().await;
    let sb = h.daytona_sandbox().await;
    let (st, v) = h.daytona_session(&sb, "talk").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let base = format!("{}/{sb}/process/session/talk", h.server.toolbox_url());
    let (st, v) = h
        .daytona_session_exec(
            &sb,
            "talk",
            json!({"command": "read a; read b; echo \"got:$a:$b\"", "runAsync": true}),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let cid = v["cmdId"].as_str().expect("cmdId").to_string();
    let input = format!("{base}/command/{cid}/input");
    for (part, pause) in [("first\n", 300), ("sec", 0), ("ond\n", 0)] {
        let (st, v) = h
            .daytona(Method::POST, &input, Some(json!({ "data": part })))
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let status = finished(&h, &base, &cid).await;
    assert_eq!(status["exitCode"], 0, "{status}");
    let (st, _, logs) = h
        .daytona_raw(Method::GET, format!("{base}/command/{cid}/logs"), None, false)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&logs).trim(), "got:first:second");

    // Input to a command that has exited.
    let (st, v) = h
        .daytona(Method::POST, &input, Some(json!({ "data": "late\n" })))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["code"], "process_exited", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_to_a_command_without_open_stdin_or_with_a_bad_body_is_refused() {
    let h = Harness::start().await;
    let sb = h.daytona_sandbox().await;
    let (st, v) = h.daytona_session(&sb, "s").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let base = format!("{}/{sb}/process/session/s", h.server.toolbox_url());
    // An asynchronous command that waits on its (open) stdin.
    let (st, v) = h
        .daytona_session_exec(&sb, "s", json!({"command": "cat >/dev/null", "runAsync": true}))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let cid = v["cmdId"].as_str().expect("cmdId").to_string();
    let input = format!("{base}/command/{cid}/input");
    for body in [json!({}), json!({"data": 5}), json!({"data": "x".repeat(1024 * 1024 + 1)})] {
        let (st, v) = h.daytona(Method::POST, &input, Some(body)).await;
        assert!(
            st == StatusCode::BAD_REQUEST || st == StatusCode::PAYLOAD_TOO_LARGE,
            "{st} {v}"
        );
        assert!(v["message"].is_string(), "{v}");
    }
    let (st, v) = h
        .daytona(
            Method::POST,
            format!("{base}/command/unknown/input"),
            Some(json!({"data": "x"})),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");

    // A synchronous command reads end-of-file: its stdin takes nothing.
    let (st, v) = h
        .daytona_session_exec(&sb, "s", json!({"command": "echo done"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let sync_id = v["cmdId"].as_str().expect("cmdId").to_string();
    let (st, v) = h
        .daytona(
            Method::POST,
            format!("{base}/command/{sync_id}/input"),
            Some(json!({"data": "x"})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(
        v["code"] == "stdin_closed" || v["code"] == "process_exited",
        "{v}"
    );

    let (st, v) = h
        .daytona(Method::POST, format!("{base}/command/{cid}/terminate"), None)
        .await;
    assert!(st.is_success(), "{v}");
}
