//! Issue 25 (loose end): the Daytona component keeps each command's
//! session after a normal exit (what the command left in the background
//! lives on), so over a long lease the engine's Daytona face held one
//! empty session record per command ever run: the finished-process
//! retention dropped the commands, never their sessions. A session whose
//! every command finished (exited, tree verified gone) and was dropped by
//! that retention is now dropped with them and answers 404, as a deleted
//! session does on the service. Sessions with a live process, or never
//! used, stay.

mod common;

use std::time::{Duration, Instant};

use common::{Harness, KEY};
use reqwest::{Method, StatusCode};
use sandbox_engine::Server;
use serde_json::{json, Value};

async fn call(h: &Harness, method: Method, url: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut rb = h
        .http
        .request(method, url)
        .header("Authorization", format!("Bearer {KEY}"));
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.expect("request sent");
    let st = resp.status();
    let bytes = resp.bytes().await.expect("body");
    (st, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Creates the session `sid` in sandbox `sb` through the toolbox at `tb`.
async fn create_session(h: &Harness, tb: &str, sb: &str, sid: &str) {
    let (st, v) = call(
        h,
        Method::POST,
        &format!("{tb}/{sb}/process/session"),
        Some(json!({ "sessionId": sid })),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

/// Session ids the toolbox lists, sorted.
async fn listed(h: &Harness, tb: &str, sb: &str) -> Vec<String> {
    let (st, v) = call(h, Method::GET, &format!("{tb}/{sb}/process/session"), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let mut ids: Vec<String> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["sessionId"].as_str().expect("sessionId").to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_whose_commands_all_finished_and_were_dropped_go_with_them() {
    let h = Harness::start_builder(
        Server::builder()
            .toolbox_port(0)
            .finished_retention(Duration::from_secs(1), 2),
    )
    .await;
    let (st, v) = call(
        &h,
        Method::POST,
        &format!("{}/sandbox", h.server.daytona_api_url()),
        Some(json!({"snapshot": "daytona-small", "autoStopInterval": 0})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let sb = v["id"].as_str().expect("id").to_string();
    let tb = h.server.toolbox_url().to_string();
    let session = |sid: &str| format!("{tb}/{sb}/process/session/{sid}");
    // One command per session, as the Daytona component runs them.
    let mut commands = Vec::new();
    let tag = format!("4000.{}", std::process::id());
    for (sid, command) in [
        ("done-1", "echo one".to_string()),
        ("done-2", "echo two".to_string()),
        ("done-3", "true".to_string()),
        ("done-4", "exit 3".to_string()),
        // Exits, and leaves a process behind: its tree is not gone.
        (
            "background",
            format!("sleep {tag} > /dev/null 2>&1 & echo started"),
        ),
    ] {
        create_session(&h, &tb, &sb, sid).await;
        let (st, v) = call(
            &h,
            Method::POST,
            &format!("{}/exec", session(sid)),
            Some(json!({ "command": command, "runAsync": true })),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        commands.push((sid, v["cmdId"].as_str().expect("cmdId").to_string()));
    }
    // A session nothing ran in yet.
    let (st, v) = call(
        &h,
        Method::POST,
        &format!("{tb}/{sb}/process/session"),
        Some(json!({ "sessionId": "unused" })),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    // Every command exits, and its logs are read.
    for (sid, cid) in &commands {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (st, v) = call(
                &h,
                Method::GET,
                &format!("{}/command/{cid}", session(sid)),
                None,
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{v}");
            if v["exitCode"].is_number() {
                break;
            }
            assert!(Instant::now() < deadline, "{sid} never exited: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (st, _) = call(
            &h,
            Method::GET,
            &format!("{}/command/{cid}/logs", session(sid)),
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
    }
    // Past the retention (1 s, 2 kept) the spent sessions are gone.
    let want = vec!["background".to_string(), "unused".to_string()];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = listed(&h, &tb, &sb).await;
        if now == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spent sessions were never dropped: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A dropped session answers 404 everywhere, as a deleted one.
    let (sid, cid) = &commands[0];
    for (method, url, body) in [
        (Method::GET, session(sid), None),
        (Method::GET, format!("{}/command/{cid}", session(sid)), None),
        (
            Method::GET,
            format!("{}/command/{cid}/logs", session(sid)),
            None,
        ),
        (
            Method::POST,
            format!("{}/exec", session(sid)),
            Some(json!({"command": "true", "runAsync": true})),
        ),
        (Method::DELETE, session(sid), None),
    ] {
        let (st, v) = call(&h, method.clone(), &url, body).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{method} {url}: {v}");
    }
    // Its id can be taken again.
    create_session(&h, &tb, &sb, sid).await;
    // The unused session still runs commands; the background one still
    // holds its process, and its delete still ends it.
    let (st, v) = call(
        &h,
        Method::POST,
        &format!("{}/exec", session("unused")),
        Some(json!({"command": "echo still"})),
    )
    .await;
    assert_eq!(
        (st, v["stdout"].clone()),
        (StatusCode::OK, json!("still\n")),
        "{v}"
    );
    let (st, v) = call(&h, Method::GET, &session("background"), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["commands"].as_array().map(Vec::len), Some(1), "{v}");
    let (st, v) = call(&h, Method::DELETE, &session("background"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{v}");
    let (st, v) = call(
        &h,
        Method::DELETE,
        &format!("{}/sandbox/{sb}", h.server.daytona_api_url()),
        None,
    )
    .await;
    assert!(st.is_success(), "{st} {v}");
    assert!(h.server.shutdown().await.all_exited());
}
