//! The CreateOS face: the API under `/v1` (JSend envelope, `X-Api-Key`)
//! and the admin API under `/_admin`, on the shared HTTP layer
//! ([`crate::http`]).
//!
//! Uses the sandbox core ([`crate::sandboxes`]), the machine
//! ([`crate::machine`]: isolation modes, terminals), storage
//! ([`crate::storage`]: paths inside a root, journals, records), the
//! trees ([`crate::trees`]: budgets, freezing a sandbox), the network
//! ([`crate::network`]: a sandbox's own egress list, its opened ports), the fault rules
//! ([`crate::faults`]) and [`crate::util`]. Never the Daytona face (what
//! both answer alike is in the HTTP layer) or the server.

pub mod admin;
pub mod envelope;
pub mod files;
pub mod interactive;
pub mod processes;
pub mod sandboxes;

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use serde_json::Value;

use crate::http::error::ApiError;
use crate::http::middleware::Face;
use crate::http::state::{AppState, Shared};

/// Where the CreateOS API lives.
pub const API_PREFIX: &str = "/v1";

/// The CreateOS face as the shared middleware sees it. It also answers the
/// admin API and every path no other face owns.
pub struct CreateOs;

impl Face for CreateOs {
    fn owns(&self, path: &str) -> bool {
        path == API_PREFIX || path.starts_with("/v1/")
    }

    fn presented_key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers.get("x-api-key").and_then(|v| v.to_str().ok())
    }

    fn unauthorized_message(&self) -> &'static str {
        "missing or wrong X-Api-Key"
    }

    fn rate_limited(&self, path: &str) -> bool {
        path.starts_with("/v1/")
    }

    fn render(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
        extra: Option<Value>,
    ) -> Response {
        envelope::envelope_for(status, code, message, extra)
    }
}

/// The CreateOS API routes (nested under [`API_PREFIX`]).
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/sandboxes", post(sandboxes::create))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_one).delete(sandboxes::delete),
        )
        .route("/sandboxes/{id}/egress", put(sandboxes::put_egress))
        .route("/sandboxes/{id}/fork", post(sandboxes::fork))
        .route(
            "/templates",
            post(sandboxes::create_template).get(sandboxes::list_templates),
        )
        .route(
            "/templates/{name}",
            axum::routing::delete(sandboxes::delete_template),
        )
        .route("/sandboxes/{id}/ports/{port}", post(sandboxes::open_port))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route(
            "/sandboxes/{id}/files",
            put(files::put_file).get(files::get_file),
        )
        .route("/sandboxes/{id}/exec", post(processes::exec))
        .route("/sandboxes/{id}/processes", post(processes::create))
        .route(
            "/sandboxes/{id}/processes/{pid}",
            get(processes::get_one).delete(processes::delete),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/stdin/close",
            post(processes::close_stdin),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/connect",
            get(processes::connect),
        )
        .route("/sandboxes/{id}/processes/{pid}/wait", get(processes::wait))
        .route(
            "/sandboxes/{id}/processes/{pid}/signal",
            post(processes::signal),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/input",
            post(interactive::input),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/resize",
            post(interactive::resize),
        )
        .fallback(|| async { ApiError::not_found("route") })
}

/// The admin API routes (nested under
/// [`crate::http::middleware::ADMIN_PREFIX`]).
pub fn admin_routes() -> Router<Shared> {
    Router::new()
        .route(
            "/faults",
            get(admin::list_faults)
                .post(admin::add_fault)
                .delete(admin::clear_faults),
        )
        .route(
            "/requests",
            get(admin::list_requests).delete(admin::clear_requests),
        )
        .route("/info", get(admin::info))
}

/// Looks up a sandbox or answers 404.
pub fn sandbox(
    state: &AppState,
    id: &str,
) -> Result<Arc<crate::sandboxes::store::Sandbox>, ApiError> {
    // A Daytona sandbox is not part of the CreateOS face.
    if state.daytona.contains(id) {
        return Err(ApiError::not_found("sandbox"));
    }
    state.store.get(id).ok_or_else(|| {
        crate::http::state::unproven(state, id).unwrap_or_else(|| ApiError::not_found("sandbox"))
    })
}

/// Looks up a process or answers 404.
pub fn process(
    state: &AppState,
    id: &str,
    pid: &str,
) -> Result<
    (
        Arc<crate::sandboxes::store::Sandbox>,
        Arc<crate::sandboxes::supervisor::Process>,
    ),
    ApiError,
> {
    let sb = sandbox(state, id)?;
    let p = sb
        .process(pid)
        .ok_or_else(|| ApiError::not_found("process"))?;
    Ok((sb, p))
}
