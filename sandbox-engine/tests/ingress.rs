//! Issue 43 item 3, "a way in": a sandbox's port as a loopback URL behind
//! a secret token (the preview-URL model), on both faces; off unless the
//! operator enables it; never a way to the host's own loopback.

mod common;

use common::{marker, Harness};
use reqwest::{Method, StatusCode};
use sandbox_engine::{IsolationMode, IsolationPreference, Server};
use serde_json::{json, Value};

/// A confined server with ingress as asked, where this host gives
/// sandboxes machines; `None` (skipped, and said) elsewhere.
async fn engine(ingress: bool) -> Option<Harness> {
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no sandbox machines on this host (user namespaces refused)");
        return None;
    }
    let h = Harness::start_builder(
        Server::builder()
            .isolation(IsolationPreference::RequireBwrap)
            .ingress(ingress),
    )
    .await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    Some(h)
}

/// A plain HTTP GET of `url` from the host, with `token` in `header`:
/// the status and body (`None` when nothing accepts the connection).
async fn get(url: &str, header: &str, token: Option<&str>) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .expect("client");
    let mut rb = client.get(url);
    if let Some(token) = token {
        rb = rb.header(header, token);
    }
    let r = rb.send().await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.unwrap_or_default()))
}

/// A CreateOS sandbox made with `ingress_enabled`.
async fn ingress_sandbox(h: &Harness) -> String {
    let (st, v) = h
        .post(
            "/v1/sandboxes",
            json!({ "shape": "s-1vcpu-1gb", "ingress_enabled": true }),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    v["data"]["id"].as_str().expect("id").to_string()
}

/// Starts `python3 -m http.server PORT` in the background of CreateOS
/// sandbox `sb` (a file `hello.txt` in its directory) and waits until it
/// answers inside the sandbox.
async fn serve_in(h: &Harness, sb: &str, port: u16) {
    h.spawn(
        sb,
        &format!(
            "mkdir -p /tmp/www && cd /tmp/www && echo hello from inside > hello.txt && \
             exec python3 -m http.server {port}"
        ),
    )
    .await;
    let r = h
        .exec(
            sb,
            &format!(
                "for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && \
                 echo up && break; sleep 0.1; done"
            ),
        )
        .await;
    assert_eq!(r["stdout"], "up\n", "{r}");
}

#[tokio::test]
async fn an_opened_port_answers_with_its_token_only() {
    let Some(h) = engine(true).await else {
        return;
    };
    let sb = ingress_sandbox(&h).await;
    h.wait_status(&sb, "running").await;
    serve_in(&h, &sb, 8765).await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/ports/8765"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let url = v["data"]["url"].as_str().expect("url").to_string();
    let token = v["data"]["token"].as_str().expect("token").to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{v}");
    assert_eq!(token.len(), 32, "{v}");
    // Asked again: the same door.
    let (_, again) = h
        .post(&format!("/v1/sandboxes/{sb}/ports/8765"), json!({}))
        .await;
    assert_eq!(again["data"]["url"], v["data"]["url"], "{again}");
    let header = "X-Sandbox-Preview-Token";
    let file = format!("{url}/hello.txt");
    assert_eq!(
        get(&file, header, Some(&token)).await,
        Some((200, "hello from inside\n".to_string()))
    );
    let (status, body) = get(&file, header, None).await.expect("an answer");
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("hello from inside"), "{body}");
    let (status, _) = get(&file, header, Some("0123456789abcdef0123456789abcdef"))
        .await
        .expect("an answer");
    assert_eq!(status, 401);
    // A port nothing in the sandbox listens on is a 502, even when the
    // host's own loopback has a server on that very port.
    let host_port = common::host_http_server("the host itself\n").await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/ports/{host_port}"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (status, body) = get(
        v["data"]["url"].as_str().expect("url"),
        header,
        v["data"]["token"].as_str(),
    )
    .await
    .expect("an answer");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("nothing answers"), "{body}");
    assert!(!body.contains("the host itself"), "{body}");
    // Bad ports.
    for bad in ["0", "65536", "http"] {
        let (st, v) = h
            .post(&format!("/v1/sandboxes/{sb}/ports/{bad}"), json!({}))
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    // Deleted: the door is closed.
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(get(&file, header, Some(&token)).await, None);
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn ports_stay_closed_without_ingress() {
    let Some(h) = engine(false).await else {
        return;
    };
    let sb = ingress_sandbox(&h).await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/ports/8765"), json!({}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(v.to_string().contains("--ingress"), "{v}");
    let url = format!(
        "{}/sandbox/{sb}/ports/8765/preview-url",
        h.server.daytona_api_url()
    );
    let dsb = h.daytona_sandbox().await;
    let url = url.replace(&sb, &dsb);
    let (st, v) = h.daytona(Method::GET, &url, None).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(h.server.shutdown().await.all_exited());
    // With ingress on, a CreateOS sandbox made without ingress_enabled
    // keeps its ports closed.
    let Some(h) = engine(true).await else {
        return;
    };
    let sb = h.sandbox().await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/ports/8765"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(v.to_string().contains("ingress_enabled"), "{v}");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn daytona_preview_urls_follow_public() {
    let Some(h) = engine(true).await else {
        return;
    };
    let m = marker("preview");
    for public in [false, true] {
        let (st, v) = h
            .daytona_create(
                json!({ "public": public, "autoStopInterval": 0, "labels": { "m": m } }),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let sb = v["id"].as_str().expect("id").to_string();
        let (st, v) = h.daytona_session(&sb, "web").await;
        assert!(st.is_success(), "{v}");
        let (st, v) = h
            .daytona_session_exec(
                &sb,
                "web",
                json!({ "command": "cd /tmp && echo daytona inside > d.txt && python3 -m http.server 8766", "runAsync": true }),
            )
            .await;
        assert!(st.is_success(), "{v}");
        let (_, v) = h
            .daytona_execute(
                &sb,
                "bash -c 'for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8766) 2>/dev/null && echo up && break; sleep 0.1; done'",
            )
            .await;
        assert_eq!(v["result"], "up\n", "{v}");
        let url = format!(
            "{}/sandbox/{sb}/ports/8766/preview-url",
            h.server.daytona_api_url()
        );
        let (st, v) = h.daytona(Method::GET, &url, None).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["sandboxId"], Value::String(sb.clone()), "{v}");
        let file = format!("{}/d.txt", v["url"].as_str().expect("url"));
        let header = "X-Daytona-Preview-Token";
        assert_eq!(
            get(&file, header, v["token"].as_str()).await,
            Some((200, "daytona inside\n".to_string())),
            "public {public}"
        );
        let (status, _) = get(&file, header, None).await.expect("an answer");
        assert_eq!(status, if public { 200 } else { 401 }, "public {public}");
        let (st, v) = h.daytona_delete(&sb).await;
        assert!(st.is_success(), "{v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}
