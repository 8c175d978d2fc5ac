//! The HTTP surface: router, shared state and the middleware chain
//! (request recording → fault injection → API-key check → handler).

pub mod admin;
mod early_answer;
pub mod envelope;
pub mod files;
pub mod limits;
pub mod processes;
pub mod sandboxes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use crate::budgets::Budgets;
use crate::faults::{FaultAction, Faults, RecordedRequest};
use crate::isolation::IsolationMode;
use crate::store::Store;
use envelope::{envelope_for, ApiError};

/// Everything handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The expected `X-Api-Key`.
    pub api_key: String,
    /// Fault rules and the request record.
    pub faults: Faults,
    /// Sandboxes.
    pub store: Store,
    /// Isolation in force.
    pub mode: IsolationMode,
    /// bwrap binary (bwrap mode only).
    pub bwrap: Option<PathBuf>,
    /// Where sandbox roots live.
    pub data_dir: PathBuf,
    /// Duration of the asynchronous sandbox transitions.
    pub transition_delay: Duration,
    /// Journal capacity per process.
    pub journal_capacity: usize,
    /// The request rate limit, when one is set.
    pub rate_limit: Option<crate::rate_limit::RateLimiter>,
    /// The runtime that starts, watches and terminates processes (its own
    /// threads: spawning and `/proc` scans are synchronous work that must
    /// not hold up the threads answering requests).
    pub supervision: tokio::runtime::Handle,
    /// Slots of the bounded pool for blocking file-system work.
    pub blocking: Arc<tokio::sync::Semaphore>,
    /// Slots for uploads in progress (each holds a writing thread).
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// The Daytona face's sandboxes and sessions.
    pub daytona: crate::daytona::registry::Registry,
    /// How long a request body may send nothing before the request is
    /// answered 408 and its slot is released.
    pub body_read_timeout: Duration,
    /// How long and how many finished processes are kept.
    pub retention: crate::store::Retention,
    /// Host-wide budgets (sandbox count, live processes).
    pub budgets: Budgets,
    /// Size of each sandbox's own disk, when sandboxes get one (see
    /// [`crate::disk`]).
    pub disk: Option<u64>,
    /// The Daytona `toolboxProxyUrl`: the toolbox listener's
    /// `http://127.0.0.1:<port>/toolbox`, or `<base>/daytona/toolbox`.
    pub toolbox_url: String,
}

/// Blocking file-system work (other than uploads) running at once.
pub const BLOCKING_SLOTS: usize = 16;

/// Uploads written at once.
pub const UPLOAD_SLOTS: usize = 8;

/// How long a request waits for a free slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(10);

/// Takes a slot of `pool` within [`SLOT_WAIT`], or answers 503 (nothing
/// was done).
pub async fn slot(
    pool: &Arc<tokio::sync::Semaphore>,
    what: &str,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    match tokio::time::timeout(SLOT_WAIT, pool.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!("the server is busy with other {what}; nothing was done, retry later"),
        )),
    }
}

/// Runs blocking file-system work on the bounded pool (see [`slot`]).
pub async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    let permit = slot(&state.blocking, "file-system work").await?;
    let out = tokio::task::spawn_blocking(move || {
        let out = f();
        drop(permit);
        out
    })
    .await
    .map_err(|e| ApiError::internal(format!("file-system task failed: {e}")))?;
    Ok(out)
}

/// Makes a new sandbox's root (with its own disk, see [`crate::disk`]):
/// 429 `disk_limit` over the host-wide disk budget, 500 when the server
/// failed.
pub async fn make_root(state: &AppState, root: PathBuf) -> Result<(), ApiError> {
    let disk = state.disk;
    match blocking(state, move || crate::disk::prepare(&root, disk)).await? {
        Ok(()) => Ok(()),
        Err(crate::disk::PrepareError::Refused(r)) => Err(over_budget(r)),
        Err(crate::disk::PrepareError::Io(e)) => Err(ApiError::internal(format!(
            "cannot create sandbox root: {e}"
        ))),
    }
}

/// Removes the root of a deleted sandbox. The root is first renamed to
/// `.removing-<id>` beside it (one step: the sandbox's files are gone from
/// their path when the delete answers), then removed on a thread of its
/// own, iteratively whatever the depth of the tree (see [`crate::fstree`]):
/// a tree of 100 000 levels takes a minute on a slow disk, longer than a
/// client waits for a DELETE. Shutdown waits for these removals. A
/// failure is logged and the path is removed again at shutdown; `Err` only
/// when no removal could be started.
pub async fn remove_root(state: &AppState, id: &str, root: PathBuf) -> Result<(), String> {
    let trash = state.data_dir.join(format!(".removing-{id}"));
    // Its own disk goes first (a mount point cannot be renamed).
    let r = root.clone();
    let _ = tokio::task::spawn_blocking(move || crate::disk::detach(&r)).await;
    let target = match std::fs::rename(&root, &trash) {
        Ok(()) => trash,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // Could not rename: remove it where it is.
        Err(_) => root,
    };
    let path = target.clone();
    let label = id.to_string();
    let spawned = std::thread::Builder::new()
        .name("createos-local-remove".into())
        .spawn(move || match crate::fstree::remove_tree(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => {
                eprintln!(
                    "createos-local: could not remove the files of sandbox {label}: {e}; \
                     they are removed again at shutdown"
                );
                false
            }
        });
    match spawned {
        Ok(handle) => {
            state.store.removing(target, handle);
            Ok(())
        }
        Err(e) => {
            state.store.leave(target);
            Err(format!(
                "removing the files of sandbox {id} could not start ({e}); its processes are gone \
                 and its files are removed at shutdown"
            ))
        }
    }
}

/// Drops finished processes beyond the retention (both faces: a Daytona
/// session forgets the commands whose process was dropped, and goes once
/// all of its commands have).
pub fn prune_finished(state: &AppState) {
    let pruned = state.store.prune_finished(state.retention);
    if pruned.is_empty() {
        return;
    }
    for (id, dropped) in pruned {
        if let Some(sb) = state.daytona.get(&id) {
            sb.retire_commands(&dropped);
        }
    }
    // The journals just freed are many small allocations that glibc keeps
    // in its arenas: give them back to the system, so that the server's
    // memory returns to its baseline (see BENCHMARKS.md).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// 503 for a process the server could not start (see
/// [`crate::supervisor::Process::server_failure`]).
pub fn start_failed(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "start_failed", message)
}

/// The answer to a path the server could not resolve as the process's
/// cwd: 400 when the path itself is wrong, 500 when the server failed
/// (out of descriptors, I/O error).
pub fn cwd_error(cwd: &str, e: crate::confine::PathError) -> ApiError {
    match e {
        crate::confine::PathError::Io(msg) => ApiError::internal(format!(
            "the server could not open the working directory {cwd:?} ({msg}); nothing was started"
        )),
        other => ApiError::bad_request(format!("invalid cwd {cwd:?}: {other}")),
    }
}

/// A budget refusal as the CreateOS face answers it (429).
pub fn over_budget(r: crate::budgets::Refusal) -> ApiError {
    ApiError::new(crate::budgets::Refusal::STATUS, r.code, r.message)
}

/// Shared state handle.
pub type Shared = Arc<AppState>;

/// The fault (if any) that a handler must apply itself (stream faults and
/// `tree_exited` overrides).
#[derive(Debug, Clone)]
pub struct InjectedFault(pub FaultAction);

/// Largest file upload: 256 MiB, enforced by [`files::put_file`] while the
/// body streams to disk (every other body: [`limits::MAX_JSON_BODY`]).
pub const MAX_BODY: usize = 256 * 1024 * 1024;

/// Builds the router of the server's origin: the CreateOS face under `/v1`,
/// the admin API, the Daytona API under `/daytona/api`, and, unless the
/// toolbox has a listener of its own (`toolbox_listener`), the Daytona
/// toolbox under `/daytona/toolbox`.
pub fn router(state: Shared, toolbox_listener: bool) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(sandboxes::create))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_one).delete(sandboxes::delete),
        )
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
        .fallback(|| async { ApiError::not_found("route") });
    let admin = Router::new()
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
        .route("/info", get(admin::info));
    let mut app = Router::new()
        .nest("/v1", v1)
        .nest("/_admin", admin)
        .nest(crate::daytona::API_PREFIX, crate::daytona::api_routes());
    if !toolbox_listener {
        app = app.nest(
            crate::daytona::TOOLBOX_PREFIX,
            crate::daytona::toolbox_routes(),
        );
    }
    layers(
        app.fallback(|| async { ApiError::not_found("route") }),
        state,
    )
}

/// Builds the router of the toolbox listener's origin: the Daytona toolbox
/// under `/toolbox` (as the real `toolboxProxyUrl`), nothing else.
pub fn toolbox_router(state: Shared) -> Router {
    let app = Router::new()
        .nest(
            crate::daytona::TOOLBOX_LISTENER_PREFIX,
            crate::daytona::toolbox_routes(),
        )
        .fallback(|| async { crate::daytona::error::DaytonaError::not_found("route") });
    layers(app, state)
}

/// The middleware chain of both origins.
fn layers(app: Router<Shared>, state: Shared) -> Router {
    app.layer(DefaultBodyLimit::max(limits::MAX_JSON_BODY))
        .layer(middleware::from_fn(catch_panic))
        .layer(middleware::from_fn(envelope_errors))
        .layer(middleware::from_fn_with_state(state.clone(), rate_limit))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), faults))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .with_state(state)
}

async fn record(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let mut resp = next.run(req).await;
    let fault = resp.extensions_mut().remove::<InjectedFault>().map(|f| f.0);
    if !path.starts_with("/_admin") {
        state.faults.record(RecordedRequest {
            method,
            path,
            status: resp.status().as_u16(),
            fault,
        });
    }
    resp
}

async fn faults(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if path.starts_with("/_admin") {
        return next.run(req).await;
    }
    let Some(action) = state.faults.take(req.method().as_str(), &path) else {
        return next.run(req).await;
    };
    let daytona = crate::daytona::is_daytona_path(&path);
    let mut resp = match &action {
        FaultAction::Status { status } => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let extra = Some(serde_json::json!({ "injected": true }));
            let answer = if daytona {
                crate::daytona::error::body(code, "injected", "injected fault", extra)
            } else {
                envelope_for(code, "injected", "injected fault", extra)
            };
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
async fn catch_panic(req: Request, next: Next) -> Response {
    use futures_util::FutureExt;
    let daytona = crate::daytona::is_daytona_path(req.uri().path());
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(_) => {
            let message = "the server failed while handling this request (an internal error); \
                           other requests are not affected";
            if daytona {
                crate::daytona::error::body(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    message,
                    None,
                )
            } else {
                envelope_for(StatusCode::INTERNAL_SERVER_ERROR, "internal", message, None)
            }
        }
    }
}

/// Wraps axum's own rejections (bad query, wrong method, body too large …),
/// which are plain text, into the JSend envelope (the Daytona face's error
/// body on its paths). Answers that are already JSON, and successes, pass
/// unchanged.
async fn envelope_errors(req: Request, next: Next) -> Response {
    let daytona = crate::daytona::is_daytona_path(req.uri().path());
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
    if daytona {
        return crate::daytona::error::body(status, "rejected", &message, None);
    }
    envelope_for(status, "rejected", &message, None)
}

/// Refuses a `/v1` request beyond the rate limit with 429 and `Retry-After`
/// (whole seconds, rounded up), before it does anything.
async fn rate_limit(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let Some(limiter) = &state.rate_limit else {
        return next.run(req).await;
    };
    if !req.uri().path().starts_with("/v1/") {
        return next.run(req).await;
    }
    match limiter.admit() {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            let body = req.into_body();
            let seconds = wait.as_millis().div_ceil(1000).max(1);
            let mut response = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("rate limit exceeded; retry in {seconds} s"),
            )
            .into_response();
            if let Ok(value) = seconds.to_string().parse() {
                response
                    .headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, value);
            }
            early_answer::after_reading(body, response).await
        }
    }
}

/// The CreateOS face (and the admin API) take the key in `X-Api-Key`, the
/// Daytona face as `Authorization: Bearer <key>`; anything else is 401.
async fn auth(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if crate::daytona::is_daytona_path(req.uri().path()) {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), state.api_key.as_bytes()) {
            return crate::daytona::error::DaytonaError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong API key (send Authorization: Bearer <key>)",
            )
            .into_response();
        }
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), state.api_key.as_bytes()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong X-Api-Key",
        )
        .into_response();
    }
    next.run(req).await
}

/// `true` when `headers` carry the key, in either face's form
/// (`X-Api-Key`, or `Authorization: Bearer`). The accept loop uses it to
/// tell authenticated connections from ones that may be evicted.
pub fn carries_key(headers: &axum::http::HeaderMap, key: &str) -> bool {
    let x_api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| constant_time_eq(v.as_bytes(), key.as_bytes()));
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .is_some_and(|t| constant_time_eq(t.as_bytes(), key.as_bytes()));
    x_api_key || bearer
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Looks up a sandbox or answers 404.
pub fn sandbox(state: &AppState, id: &str) -> Result<Arc<crate::store::Sandbox>, ApiError> {
    // A Daytona sandbox is not part of the CreateOS face.
    if state.daytona.contains(id) {
        return Err(ApiError::not_found("sandbox"));
    }
    state
        .store
        .get(id)
        .ok_or_else(|| ApiError::not_found("sandbox"))
}

/// Looks up a process or answers 404.
pub fn process(
    state: &AppState,
    id: &str,
    pid: &str,
) -> Result<(Arc<crate::store::Sandbox>, Arc<crate::supervisor::Process>), ApiError> {
    let sb = sandbox(state, id)?;
    let p = sb
        .process(pid)
        .ok_or_else(|| ApiError::not_found("process"))?;
    Ok((sb, p))
}
