//! Issue 44 item 4: every answer of both faces says that the embedded
//! engine gave it (`x-sandbox-engine: createos-local`), so a host can stop
//! spending a provider's declared budget on it; where the engine itself
//! limits requests (`--rate-limit`, the CreateOS face's `/v1` only), the
//! answer names that budget (`x-sandbox-engine-rate-limit: N/WINDOW_MS`),
//! and nowhere else.

mod common;

use std::time::Duration;

use common::{Harness, KEY};
use reqwest::{Method, StatusCode};
use sandbox_engine::{
    FaultAction, FaultRule, Server, ENGINE_HEADER, ENGINE_NAME, ENGINE_RATE_LIMIT_HEADER,
};

/// The two headers of an answer.
fn identity(response: &reqwest::Response) -> (Option<String>, Option<String>) {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    (header(ENGINE_HEADER), header(ENGINE_RATE_LIMIT_HEADER))
}

async fn send(
    h: &Harness,
    method: Method,
    url: &str,
    auth: &[(&str, String)],
) -> reqwest::Response {
    let mut request = h.http.request(method, url);
    for (name, value) in auth {
        request = request.header(*name, value);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_of_both_faces_says_it_came_from_the_engine() {
    let h = Harness::start_builder(Server::builder().toolbox_port(0)).await;
    let api = h.server.daytona_api_url();
    let toolbox = h.server.toolbox_url().to_string();
    let createos_key = [("x-api-key", KEY.to_string())];
    let bearer = [("authorization", format!("Bearer {KEY}"))];
    let cases = [
        (
            Method::GET,
            format!("{}/_admin/info", h.base),
            &createos_key[..],
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{}/v1/sandboxes/sb-missing", h.base),
            &createos_key[..],
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("{}/v1/sandboxes/sb-missing", h.base),
            &[][..],
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::GET,
            format!("{}/no/such/path", h.base),
            &createos_key[..],
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("{api}/sandbox"),
            &bearer[..],
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{api}/sandbox"),
            &[][..],
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::GET,
            format!("{toolbox}/no-such-sandbox/process/session"),
            &[][..],
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (method, url, auth, status) in cases {
        let response = send(&h, method.clone(), &url, auth).await;
        assert_eq!(response.status(), status, "{method} {url}");
        assert_eq!(
            identity(&response),
            (Some(ENGINE_NAME.to_string()), None),
            "{method} {url}: the engine names itself and, without a limit of its own, no budget"
        );
    }
    // An injected fault is an answer of the engine too.
    h.server.faults().add(
        FaultRule::new(
            "GET",
            "/v1/sandboxes/*",
            FaultAction::Status { status: 503 },
        )
        .times(1),
    );
    let url = format!("{}/v1/sandboxes/sb-missing", h.base);
    let response = send(&h, Method::GET, &url, &createos_key).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(identity(&response).0.as_deref(), Some(ENGINE_NAME));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_with_a_rate_limit_names_it_on_the_paths_it_limits() {
    let h = Harness::start_builder(
        Server::builder()
            .toolbox_port(0)
            .rate_limit(2, Duration::from_secs(3600)),
    )
    .await;
    let key = [("x-api-key", KEY.to_string())];
    let url = format!("{}/v1/sandboxes/sb-missing", h.base);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = send(&h, Method::GET, &url, &key).await;
        statuses.push(response.status());
        assert_eq!(
            identity(&response),
            (Some(ENGINE_NAME.to_string()), Some("2/3600000".to_string())),
            "a /v1 answer, admitted or refused, names the engine's own budget"
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::NOT_FOUND,
            StatusCode::NOT_FOUND,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let bearer = [("authorization", format!("Bearer {KEY}"))];
    let response = send(
        &h,
        Method::GET,
        &format!("{}/sandbox", h.server.daytona_api_url()),
        &bearer,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        identity(&response),
        (Some(ENGINE_NAME.to_string()), None),
        "the Daytona face is not limited, so it names no budget"
    );
}
