//! Issue 43 item 3: egress per sandbox. The engine's `--egress` list is
//! the default and the ceiling; a sandbox's own list, given at create on
//! either face and replaced later (`PUT /v1/sandboxes/{id}/egress`,
//! Daytona's `POST /sandbox/{id}/network-settings`), can only narrow it,
//! holds across pause and resume, and bad lists are refused before
//! anything is made. Every destination is a server this test starts on
//! the host's loopback.

mod common;

use common::{marker, Harness};
use reqwest::{Method, StatusCode};
use sandbox_engine::{IsolationMode, IsolationPreference, Server};
use serde_json::{json, Value};

/// A confined server whose ceiling is the host's 127.0.0.1 (any port),
/// where this host gives sandboxes machines; `None` (skipped, and said)
/// elsewhere.
async fn engine_allowing_loopback(tag: &str) -> Option<Harness> {
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no sandbox machines on this host (user namespaces refused)");
        return None;
    }
    let dir = std::env::temp_dir().join(marker(tag));
    std::fs::create_dir_all(&dir).expect("data dir");
    let h = Harness::start_builder(
        Server::builder()
            .data_dir(&dir)
            .isolation(IsolationPreference::RequireBwrap)
            .egress(
                sandbox_engine::network::egress::Policy::parse(&["127.0.0.1"]).expect("policy"),
            ),
    )
    .await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    Some(h)
}

/// What `curl` through the sandbox's proxy gets from each port: the
/// body, or `403` when the proxy refuses.
async fn reach(h: &Harness, sb: &str, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
    let r = h
        .exec(
            sb,
            &format!(
                "for p in {}; do out=$(curl -s --max-time 10 --noproxy '' -w ' %{{http_code}}' \
                 http://127.0.0.1:$p/); case \"$out\" in *' 403') echo 403;; *) echo \"$out\";; esac; done",
                ports.join(" ")
            ),
        )
        .await;
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// Creates a sandbox and, when it was made, waits until it runs.
async fn create(h: &Harness, body: Value) -> (StatusCode, Value) {
    let (st, v) = h.post("/v1/sandboxes", body).await;
    if let Some(id) = v["data"]["id"].as_str() {
        h.wait_status(id, "running").await;
    }
    (st, v)
}

#[tokio::test]
async fn a_sandbox_list_narrows_the_engine_ceiling_and_can_be_replaced() {
    let Some(h) = engine_allowing_loopback("egress-own").await else {
        return;
    };
    let a = common::host_http_server("a").await;
    let b = common::host_http_server("b").await;
    // No list: the ceiling (both reachable).
    let (st, v) = create(&h, json!({ "shape": "s-1vcpu-1gb" })).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let open = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(v["data"]["egress"], Value::Null, "{v}");
    assert_eq!(reach(&h, &open, &[a, b]).await, "a 200\nb 200\n");
    // ["*"] is the service's allow-all: the ceiling again.
    let (st, v) = create(&h, json!({ "shape": "s-1vcpu-1gb", "egress": ["*"] })).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let star = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(reach(&h, &star, &[a, b]).await, "a 200\nb 200\n");
    // Its own list: only `a`.
    let (st, v) = create(
        &h,
        json!({ "shape": "s-1vcpu-1gb", "egress": [format!("127.0.0.1:{a}")] }),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let own = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(
        v["data"]["egress"],
        json!([format!("127.0.0.1:{a}")]),
        "{v}"
    );
    assert_eq!(reach(&h, &own, &[a, b]).await, "a 200\n403\n");
    // The sandbox without a list is not narrowed by its neighbour's.
    assert_eq!(reach(&h, &open, &[a, b]).await, "a 200\nb 200\n");
    // A list cannot widen the ceiling: 127.0.0.2 is outside it.
    let (st, v) = create(
        &h,
        json!({ "shape": "s-1vcpu-1gb", "egress": ["127.0.0.2", format!("127.0.0.1:{b}")] }),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let wider = v["data"]["id"].as_str().expect("id").to_string();
    let r = h
        .exec(
            &wider,
            "curl -s --max-time 10 --noproxy '' http://127.0.0.2:9/",
        )
        .await;
    assert!(
        r["stdout"]
            .as_str()
            .is_some_and(|s| s.contains("not in the engine's egress allow-list")),
        "{r}"
    );
    // A CIDR entry: 127.0.0.0/8 names the loopback range itself, so it
    // counts as naming the host's loopback; 0.0.0.0/0 does not.
    let (st, v) = create(
        &h,
        json!({ "shape": "s-1vcpu-1gb", "egress": ["127.0.0.0/8"] }),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let cidr = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(reach(&h, &cidr, &[a, b]).await, "a 200\nb 200\n");
    let (st, v) = create(
        &h,
        json!({ "shape": "s-1vcpu-1gb", "egress": ["0.0.0.0/0"] }),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let everything = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(reach(&h, &everything, &[a]).await, "403\n");
    // Replaced while running: now only `b`, for new connections at once.
    let (st, v) = h
        .req(
            Method::PUT,
            &format!("/v1/sandboxes/{own}/egress"),
            Some(json!({ "egress": [format!("127.0.0.1:{b}")] })),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v["data"]["egress"],
        json!([format!("127.0.0.1:{b}")]),
        "{v}"
    );
    assert_eq!(reach(&h, &own, &[a, b]).await, "403\nb 200\n");
    // The policy holds across pause and resume.
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{own}/pause"), json!({}))
        .await;
    assert!(st.is_success(), "{v}");
    h.wait_status(&own, "paused").await;
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{own}/resume"), json!({}))
        .await;
    assert!(st.is_success(), "{v}");
    h.wait_status(&own, "running").await;
    assert_eq!(reach(&h, &own, &[a, b]).await, "403\nb 200\n");
    let (_, v) = h.get(&format!("/v1/sandboxes/{own}")).await;
    assert_eq!(
        v["data"]["egress"],
        json!([format!("127.0.0.1:{b}")]),
        "{v}"
    );
    // An empty list on replace is allow-all again (the ceiling).
    let (st, v) = h
        .req(
            Method::PUT,
            &format!("/v1/sandboxes/{own}/egress"),
            Some(json!({ "egress": [] })),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(reach(&h, &own, &[a, b]).await, "a 200\nb 200\n");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn bad_egress_lists_are_refused_before_anything_is_made() {
    let h = Harness::start().await;
    let bad = [
        json!(["*", "example.com"]),
        json!(["a b"]),
        json!(["exa\u{7}mple.com"]),
        json!([""]),
        json!(["http://example.com/"]),
        json!(["10.0.0.0/33"]),
        json!("example.com"),
        json!([1]),
        Value::Array(
            (0..300)
                .map(|i| json!(format!("h{i}.example.com")))
                .collect(),
        ),
    ];
    for list in bad {
        let (st, v) = create(&h, json!({ "shape": "s-1vcpu-1gb", "egress": list })).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{list}: {v}");
        let said = v.to_string();
        assert!(said.contains("egress"), "the error names the field: {v}");
    }
    let made = std::fs::read_dir(h.server.data_dir())
        .expect("data dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("sb-"))
        .count();
    assert_eq!(made, 0, "nothing made");
    let sb = h.sandbox().await;
    let (st, v) = h
        .req(
            Method::PUT,
            &format!("/v1/sandboxes/{sb}/egress"),
            Some(json!({ "egress": ["*", "x.org"] })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = h
        .req(
            Method::PUT,
            "/v1/sandboxes/sb-0000000000000000/egress",
            Some(json!({ "egress": [] })),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn daytona_network_settings_narrow_the_ceiling() {
    let Some(h) = engine_allowing_loopback("egress-daytona").await else {
        return;
    };
    let a = common::host_http_server("a").await;
    let b = common::host_http_server("b").await;
    let (st, v) = h
        .daytona_create(json!({ "networkAllowList": "127.0.0.1/32", "domainAllowList": "" }))
        .await;
    assert!(st.is_success(), "{v}");
    assert_eq!(v["networkAllowList"], "127.0.0.1/32", "{v}");
    assert_eq!(v["networkBlockAll"], false, "{v}");
    let sb = v["id"].as_str().expect("id").to_string();
    let probe = format!(
        "for p in {a} {b}; do out=$(curl -s --max-time 10 --noproxy '' -w ' %{{http_code}}' \
         http://127.0.0.1:$p/); case \"$out\" in *' 403') echo 403;; *) echo \"$out\";; esac; done"
    );
    let (st, v) = h
        .daytona_execute(&sb, &format!("bash -c {}", quote(&probe)))
        .await;
    assert!(st.is_success(), "{v}");
    assert_eq!(v["result"], "a 200\nb 200\n", "{v}");
    // Block everything.
    let url = format!(
        "{}/sandbox/{sb}/network-settings",
        h.server.daytona_api_url()
    );
    let (st, v) = h
        .daytona(Method::POST, &url, Some(json!({ "networkBlockAll": true })))
        .await;
    assert!(st.is_success(), "{v}");
    assert_eq!(v["networkBlockAll"], true, "{v}");
    let (_, v) = h
        .daytona_execute(&sb, &format!("bash -c {}", quote(&probe)))
        .await;
    assert_eq!(v["result"], "403\n403\n", "{v}");
    // An allow-list of `b` only (lifting the block).
    let (st, v) = h
        .daytona(
            Method::POST,
            &url,
            Some(json!({ "networkBlockAll": false, "networkAllowList": "", "domainAllowList": "127.0.0.1" })),
        )
        .await;
    assert!(st.is_success(), "{v}");
    let (_, v) = h
        .daytona_execute(&sb, &format!("bash -c {}", quote(&probe)))
        .await;
    assert_eq!(v["result"], "a 200\nb 200\n", "{v}");
    // Nothing to change is a clear 400, as the service answers.
    let (st, v) = h.daytona(Method::POST, &url, Some(json!({}))).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = h
        .daytona(
            Method::POST,
            &url,
            Some(json!({ "networkAllowList": "300.1.1.1/8" })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(h.server.shutdown().await.all_exited());
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
