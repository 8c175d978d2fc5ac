//! `/_admin/*`: fault rules, the request record and server info (key-protected,
//! outside `/v1`). See [`crate::faults`] for the rule format.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::envelope::{ok, success};
use crate::faults::FaultRule;
use crate::http::error::{parse_json, ApiError};
use crate::http::state::Shared;

/// `GET /_admin/faults`.
pub async fn list_faults(State(state): State<Shared>) -> Response {
    ok(json!({ "rules": state.faults.rules() }))
}

/// `POST /_admin/faults` with a [`FaultRule`].
pub async fn add_fault(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let rule: FaultRule = parse_json(&body)?;
    state.faults.add(rule.clone());
    Ok(success(StatusCode::CREATED, json!({ "rule": rule })))
}

/// `DELETE /_admin/faults`.
pub async fn clear_faults(State(state): State<Shared>) -> Response {
    state.faults.clear();
    ok(json!({ "rules": [] }))
}

/// `GET /_admin/requests`.
pub async fn list_requests(State(state): State<Shared>) -> Response {
    ok(json!({ "requests": state.faults.requests() }))
}

/// `DELETE /_admin/requests`.
pub async fn clear_requests(State(state): State<Shared>) -> Response {
    state.faults.clear_requests();
    ok(json!({ "requests": [] }))
}

/// `GET /_admin/info`: isolation mode, data directory, sandbox counts and
/// the Daytona `toolboxProxyUrl`.
pub async fn info(State(state): State<Shared>) -> Response {
    ok(json!({
        "isolation": state.mode.as_str(),
        "bwrap": state.bwrap.as_ref().map(|p| p.display().to_string()),
        "data_dir": state.data_dir.display().to_string(),
        "sandboxes": state.store.all().len(),
        "daytona": {
            "sandboxes": state.daytona.all().len(),
            "toolbox_url": state.toolbox_url,
        },
        "rate_limit": state.rate_limit.as_ref().map(|l| l.stats()),
    }))
}
