//! Builds an origin: the routes its faces mount, a fallback for unknown
//! paths, and the shared middleware chain (see [`super::middleware`]).
//! Which face mounts where is decided by the server
//! ([`crate::server`]), the only place that knows both faces.

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::Router;

use super::limits::MAX_JSON_BODY;
use super::middleware::{
    auth, catch_panic, faults, identify, rate_limit, record, render_errors, Chain,
};
use super::middleware::{Face, Faces};
use super::state::Shared;

/// An origin serving `mounts` (each a path prefix and the routes nested
/// under it), with `fallback` answering 404 to any other path, under the
/// middleware chain that asks `faces` what differs between the faces.
pub fn origin(
    state: Shared,
    faces: Faces,
    fallback: &'static dyn Face,
    mounts: Vec<(&'static str, Router<Shared>)>,
) -> Router {
    let mut app = Router::new();
    for (prefix, routes) in mounts {
        app = app.nest(prefix, routes);
    }
    let app = app.fallback(move || async move {
        fallback.render(StatusCode::NOT_FOUND, "not_found", "route not found", None)
    });
    let chain = Chain {
        state: state.clone(),
        faces,
    };
    app.layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn_with_state(faces, catch_panic))
        .layer(middleware::from_fn_with_state(faces, render_errors))
        .layer(middleware::from_fn_with_state(chain.clone(), rate_limit))
        .layer(middleware::from_fn_with_state(chain.clone(), auth))
        .layer(middleware::from_fn_with_state(chain.clone(), faults))
        .layer(middleware::from_fn_with_state(chain.clone(), record))
        .layer(middleware::from_fn_with_state(chain, identify))
        .with_state(state)
}
