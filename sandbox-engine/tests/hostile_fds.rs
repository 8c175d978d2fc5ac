//! Issue 24 item 7: when the server itself runs out of descriptors, a
//! process creation was answered 400 "invalid cwd" and an exec 200 with
//! exit code 127: server failures reported as the command's result. Now
//! both are 5xx with a message. A file of its own: the test exhausts the
//! descriptors of its whole process (the server runs in it), which would
//! disturb any test running beside it.

mod common;

use common::{Harness, KEY};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_exhaustion_is_a_5xx_not_a_command_result() {
    let (h, sb) = Harness::with_sandbox().await;
    // Warm the client's connection: no new descriptor is needed below.
    let out = h.exec(&sb, "true").await;
    assert_eq!(out["exit_code"], 0, "{out}");
    // The second request goes on a connection of its own, also opened
    // before the descriptors run out: the server may close the first one
    // after its 5xx, and this process (the client's too) could not open
    // another (the test failed with the client's EMFILE, not the server's).
    let second = reqwest::Client::new();
    let warm = second
        .get(format!("{}/v1/sandboxes/{sb}", h.base))
        .header("X-Api-Key", KEY)
        .send()
        .await
        .expect("second connection");
    assert_eq!(warm.status(), StatusCode::OK);
    let _ = warm.bytes().await;
    let mut held = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        held.push(f);
        if held.len() > 1_000_000 {
            break;
        }
    }
    let (st_create, create) = h
        .post(
            &format!("/v1/sandboxes/{sb}/processes"),
            json!({"cmd": "/bin/true"}),
        )
        .await;
    let answer = second
        .post(format!("{}/v1/sandboxes/{sb}/exec", h.base))
        .header("X-Api-Key", KEY)
        .json(&json!({"cmd": "/bin/true"}))
        .send()
        .await
        .expect("the exec request was answered");
    let st_exec = answer.status();
    let exec = answer.text().await.unwrap_or_default();
    drop(held);
    assert!(st_create.is_server_error(), "{st_create} {create}");
    assert!(
        create["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{create}"
    );
    assert!(st_exec.is_server_error(), "{st_exec} {exec}");
    // Descriptors back: the server serves again.
    let out = h.exec(&sb, "echo back").await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let (st, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
}
