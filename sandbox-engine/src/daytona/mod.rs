//! The Daytona-compatible face: the main API under `/daytona/api` on the
//! server's origin and the toolbox API on the toolbox origin, both over the
//! same process and isolation core as the CreateOS face. The subset served
//! and how it differs from the real service are recorded in
//! `docs/daytona-api.md`.
//!
//! - API: `{base}/daytona/api/sandbox[/{id}[/start|/stop|/snapshot|/network-settings|/ports/{port}/preview-url|/toolbox-proxy-url]]`,
//!   `{base}/daytona/api/snapshots` (list), `{base}/daytona/api/snapshots/{name}` (get, delete)
//! - toolbox: `{toolboxProxyUrl}/{sandboxId}/process/...` and `.../files/...`,
//!   where `toolboxProxyUrl` (in every Sandbox answer) is
//!   `http://127.0.0.1:<toolbox port>/toolbox` when the server has a toolbox
//!   listener ([`crate::ServerBuilder::toolbox_port`]), else
//!   `{base}/daytona/toolbox`.
//!
//! Auth on both: `Authorization: Bearer <api key>` (401 otherwise).
//!
//! Uses the shared HTTP layer ([`crate::http`]), the sandbox core
//! ([`crate::sandboxes`], its Daytona registry included), storage
//! ([`crate::storage`]: paths inside a root, journals, records), the
//! trees ([`crate::trees`]: budgets), the network ([`crate::network`]:
//! the connection cap a log socket holds its place under, a sandbox's
//! own egress list, its ports' preview URLs), the machine
//! ([`crate::machine`]: a way into a sandbox's network for those), the fault rules
//! ([`crate::faults`]) and [`crate::util`]. Never the CreateOS face or
//! the server.

pub mod error;
pub mod files;
pub mod interactive;
pub mod log_socket;
pub mod sandboxes;
pub mod snapshots;
pub mod toolbox;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;

use crate::http::limits::MAX_BODY;
use crate::http::middleware::Face;
use crate::http::state::Shared;
use error::DaytonaError;

/// Where the main API lives on the server's origin.
pub const API_PREFIX: &str = "/daytona/api";

/// Where the toolbox lives on the server's origin when there is no toolbox
/// listener.
pub const TOOLBOX_PREFIX: &str = "/daytona/toolbox";

/// Where the toolbox lives on the toolbox listener's origin.
pub const TOOLBOX_LISTENER_PREFIX: &str = "/toolbox";

/// The Daytona face as the shared middleware sees it: its paths take the
/// key as `Authorization: Bearer <key>` and answer errors in its body
/// ([`error::body`]).
pub struct Daytona;

impl Face for Daytona {
    fn owns(&self, path: &str) -> bool {
        path == "/daytona"
            || path.starts_with("/daytona/")
            || path == TOOLBOX_LISTENER_PREFIX
            || path.starts_with("/toolbox/")
    }

    fn presented_key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
    }

    fn unauthorized_message(&self) -> &'static str {
        "missing or wrong API key (send Authorization: Bearer <key>)"
    }

    fn rate_limited(&self, _path: &str) -> bool {
        false
    }

    fn render(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
        extra: Option<Value>,
    ) -> Response {
        error::body(status, code, message, extra)
    }
}

/// The main API routes (nested under [`API_PREFIX`]).
pub fn api_routes() -> Router<Shared> {
    Router::new()
        .route("/sandbox", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandbox/{id}",
            get(sandboxes::get_one).delete(sandboxes::delete),
        )
        .route("/sandbox/{id}/start", post(sandboxes::start))
        .route("/sandbox/{id}/stop", post(sandboxes::stop))
        .route(
            "/sandbox/{id}/network-settings",
            post(sandboxes::network_settings),
        )
        .route(
            "/sandbox/{id}/ports/{port}/preview-url",
            get(sandboxes::preview_url),
        )
        .route("/sandbox/{id}/snapshot", post(sandboxes::snapshot))
        .route("/snapshots", get(snapshots::list))
        .route(
            "/snapshots/{name}",
            get(snapshots::get_one).delete(snapshots::delete),
        )
        .route(
            "/sandbox/{id}/toolbox-proxy-url",
            get(sandboxes::toolbox_proxy_url),
        )
        .fallback(|| async { DaytonaError::not_found("route") })
}

/// The toolbox routes, per sandbox (nested under the toolbox prefix).
pub fn toolbox_routes() -> Router<Shared> {
    Router::new()
        .route(
            "/{id}/process/session",
            post(toolbox::create_session).get(toolbox::list_sessions),
        )
        .route(
            "/{id}/process/session/{sid}",
            get(toolbox::get_session).delete(toolbox::delete_session),
        )
        .route(
            "/{id}/process/session/{sid}/exec",
            post(toolbox::session_exec),
        )
        .route(
            "/{id}/process/session/{sid}/command/{cid}",
            get(toolbox::get_command),
        )
        .route(
            "/{id}/process/session/{sid}/command/{cid}/logs",
            get(toolbox::logs),
        )
        .route(
            "/{id}/process/session/{sid}/command/{cid}/terminate",
            post(toolbox::terminate_command),
        )
        .route(
            "/{id}/process/session/{sid}/command/{cid}/input",
            post(interactive::command_input),
        )
        .route("/{id}/process/execute", post(toolbox::execute))
        .route(
            "/{id}/files/upload",
            // The multipart extractor obeys the body limit: room for the
            // largest upload plus the multipart framing.
            post(files::upload).layer(DefaultBodyLimit::max(MAX_BODY + 64 * 1024)),
        )
        .route(
            "/{id}/files/upload-v2",
            post(files::upload_v2).layer(DefaultBodyLimit::max(MAX_BODY + 64 * 1024)),
        )
        .route(
            "/{id}/files/bulk-upload",
            post(files::bulk_upload).layer(DefaultBodyLimit::max(MAX_BODY + 64 * 1024)),
        )
        .route("/{id}/files/bulk-download", post(files::bulk_download))
        .route("/{id}/files", get(files::list))
        .route("/{id}/files/download", get(files::download))
        .route("/{id}/files/folder", post(files::create_folder))
        .route("/{id}/work-dir", get(toolbox::work_dir))
        .route("/{id}/user-home-dir", get(toolbox::work_dir))
        .route("/{id}/version", get(toolbox::version))
        .fallback(|| async { DaytonaError::not_found("route") })
}
