//! The middleware chain both origins share (the engine's name on every
//! answer → request recording → fault injection → API-key check → rate limit → error rendering → panic
//! catching → handler). What differs between the faces (which paths are
//! theirs, how a request presents the key, how an error reads, whether the
//! rate limit applies) is asked of the [`Face`] that owns the path.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::early_answer;
use super::limits::MAX_BODY;
use super::state::Shared;
use crate::faults::{FaultAction, RecordedRequest};

/// Where the admin API lives: never recorded, never faulted.
pub const ADMIN_PREFIX: &str = "/_admin";

/// The header every answer of the engine carries, on both faces and both
/// origins, naming it ([`ENGINE_NAME`]): a host stops spending a
/// provider's declared budget on an origin whose answers carry it (the
/// budget protects the real service; the engine has none unless it says
/// so). A real service that sent it would only give up its own pacing.
pub const ENGINE_HEADER: &str = "x-sandbox-engine";
/// The value of [`ENGINE_HEADER`].
pub const ENGINE_NAME: &str = "createos-local";
/// The engine's own budget (`REQUESTS/WINDOW_MS`, as `--rate-limit`
/// takes it), on the answers of the paths it limits; absent where it
/// limits nothing.
pub const ENGINE_RATE_LIMIT_HEADER: &str = "x-sandbox-engine-rate-limit";

/// What the shared middleware asks of a face.
pub trait Face: Send + Sync + 'static {
    /// `true` for the paths this face answers.
    fn owns(&self, path: &str) -> bool;

    /// The key a request presents in this face's form, if any.
    fn presented_key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str>;

    /// What a 401 tells the client (how to send the key).
    fn unauthorized_message(&self) -> &'static str;

    /// `true` when the server's rate limit (if one is set) applies to
    /// `path`.
    fn rate_limited(&self, path: &str) -> bool;

    /// The error body for any non-success status, in this face's words.
    fn render(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
        extra: Option<Value>,
    ) -> Response;
}

/// The faces an origin serves: a path goes to the first of `others` that
/// owns it, else to `default` (which also answers the admin API and
/// unknown paths).
#[derive(Clone, Copy)]
pub struct Faces {
    /// The face of every path no other face owns.
    pub default: &'static dyn Face,
    /// The faces that own their own paths.
    pub others: &'static [&'static dyn Face],
}

impl Faces {
    /// The face that answers `path`.
    pub fn of(&self, path: &str) -> &'static dyn Face {
        self.others
            .iter()
            .copied()
            .find(|f| f.owns(path))
            .unwrap_or(self.default)
    }

    fn all(&self) -> impl Iterator<Item = &'static dyn Face> + '_ {
        std::iter::once(self.default).chain(self.others.iter().copied())
    }
}

/// What the middleware that needs the state gets.
#[derive(Clone)]
pub(super) struct Chain {
    pub(super) state: Shared,
    pub(super) faces: Faces,
}

/// The fault (if any) that a handler must apply itself (stream faults and
/// `tree_exited` overrides).
#[derive(Debug, Clone)]
pub struct InjectedFault(pub FaultAction);

/// Names the engine on every answer (see [`ENGINE_HEADER`]), and its own
/// budget on the answers of the paths that budget applies to.
pub(super) async fn identify(State(chain): State<Chain>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let budget = chain
        .state
        .rate_limit
        .as_ref()
        .filter(|_| chain.faces.of(path).rate_limited(path))
        .map(|limiter| {
            let stats = limiter.stats();
            format!("{}/{}", stats.requests, stats.window_ms)
        });
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    headers.insert(ENGINE_HEADER, HeaderValue::from_static(ENGINE_NAME));
    if let Some(value) = budget.and_then(|b| HeaderValue::from_str(&b).ok()) {
        headers.insert(ENGINE_RATE_LIMIT_HEADER, value);
    }
    resp
}

/// Records every request but the admin API's (method, path, status and
/// the fault applied).
pub(super) async fn record(State(chain): State<Chain>, req: Request, next: Next) -> Response {
    let state = chain.state;
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let mut resp = next.run(req).await;
    let fault = resp.extensions_mut().remove::<InjectedFault>().map(|f| f.0);
    if !path.starts_with(ADMIN_PREFIX) {
        state.faults.record(RecordedRequest {
            method,
            path,
            status: resp.status().as_u16(),
            fault,
        });
    }
    resp
}

/// Applies the first fault rule matching the request (see
/// [`crate::faults`]); a rule the handler must apply itself travels as an
/// [`InjectedFault`].
pub(super) async fn faults(State(chain): State<Chain>, mut req: Request, next: Next) -> Response {
    let state = chain.state;
    let path = req.uri().path().to_string();
    if path.starts_with(ADMIN_PREFIX) {
        return next.run(req).await;
    }
    let Some(action) = state.faults.take(req.method().as_str(), &path) else {
        return next.run(req).await;
    };
    let face = chain.faces.of(&path);
    let mut resp = match &action {
        FaultAction::Status { status } => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let extra = Some(serde_json::json!({ "injected": true }));
            let answer = face.render(code, "injected", "injected fault", extra);
            early_answer::after_reading(req.into_body(), answer).await
        }
        FaultAction::Respond { status, body } => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
            let answer = (
                code,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body.clone(),
            )
                .into_response();
            early_answer::after_reading(req.into_body(), answer).await
        }
        FaultAction::DropResponse => {
            let handled = next.run(req).await;
            // Consume the real answer so that its work is complete, then
            // fail the body before anything useful reaches the client.
            let _ = axum::body::to_bytes(handled.into_body(), MAX_BODY).await;
            let failing = futures_util::stream::once(async {
                Err::<axum::body::Bytes, _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "injected dropped response",
                ))
            });
            (StatusCode::OK, axum::body::Body::from_stream(failing)).into_response()
        }
        FaultAction::Delay { ms } => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            next.run(req).await
        }
        other => {
            req.extensions_mut().insert(InjectedFault(other.clone()));
            next.run(req).await
        }
    };
    resp.extensions_mut().insert(InjectedFault(action));
    resp
}

/// A panic in one request's handler answers that request 500 (with a
/// message) instead of dropping its connection; the server and every
/// other request go on.
pub(super) async fn catch_panic(State(faces): State<Faces>, req: Request, next: Next) -> Response {
    use futures_util::FutureExt;
    let face = faces.of(req.uri().path());
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(_) => {
            let message = "the server failed while handling this request (an internal error); \
                           other requests are not affected";
            face.render(StatusCode::INTERNAL_SERVER_ERROR, "internal", message, None)
        }
    }
}

/// Wraps axum's own rejections (bad query, wrong method, body too large …),
/// which are plain text, into the error body of the face that owns the path
/// (the JSend envelope, the Daytona face's error body). Answers that are
/// already JSON, and successes, pass unchanged.
pub(super) async fn render_errors(
    State(faces): State<Faces>,
    req: Request,
    next: Next,
) -> Response {
    let face = faces.of(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let body = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let message = if text.trim().is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string()
    } else {
        text.trim().to_string()
    };
    face.render(status, "rejected", &message, None)
}

/// Refuses a request beyond the rate limit, on the paths where its face
/// applies it (the CreateOS face's `/v1`), with 429 and `Retry-After`
/// (whole seconds, rounded up), before it does anything.
pub(super) async fn rate_limit(State(chain): State<Chain>, req: Request, next: Next) -> Response {
    let Some(limiter) = &chain.state.rate_limit else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    let face = chain.faces.of(path);
    if !face.rate_limited(path) {
        return next.run(req).await;
    }
    match limiter.admit() {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            let body = req.into_body();
            let seconds = wait.as_millis().div_ceil(1000).max(1);
            let mut response = face.render(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                &format!("rate limit exceeded; retry in {seconds} s"),
                None,
            );
            if let Ok(value) = seconds.to_string().parse() {
                response
                    .headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, value);
            }
            early_answer::after_reading(body, response).await
        }
    }
}

/// Answers 401 to a request that does not present the key in the form of
/// the face that owns its path (the CreateOS face and the admin API:
/// `X-Api-Key`; the Daytona face: `Authorization: Bearer <key>`).
pub(super) async fn auth(State(chain): State<Chain>, req: Request, next: Next) -> Response {
    let face = chain.faces.of(req.uri().path());
    let given = face.presented_key(req.headers()).unwrap_or("");
    if !constant_time_eq(given.as_bytes(), chain.state.api_key.as_bytes()) {
        return face.render(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            face.unauthorized_message(),
            None,
        );
    }
    next.run(req).await
}

/// `true` when `headers` carry the key, in either face's form
/// (`X-Api-Key`, or `Authorization: Bearer`). The accept loop uses it to
/// tell authenticated connections from ones that may be evicted.
pub fn carries_key(headers: &HeaderMap, key: &str, faces: Faces) -> bool {
    faces.all().any(|face| {
        face.presented_key(headers)
            .is_some_and(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
