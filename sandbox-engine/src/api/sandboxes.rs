//! `POST/GET/DELETE /v1/sandboxes[/{id}]` and pause / resume.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::envelope::{ok, success};
use super::sandbox;
use crate::http::error::{over_budget, parse_json, ApiError};
use crate::http::limits;
use crate::http::state::{
    detached, make_root, prove_gone, record_created, record_deleted, remove_root, retry_unproven,
    Shared,
};
use crate::sandboxes::store::{finish_later, Sandbox, SandboxSpec, Status, SHAPES};

/// Body of `POST /sandboxes`.
#[derive(Debug, Deserialize)]
pub struct CreateBody {
    shape: Option<String>,
    rootfs: Option<String>,
    region: Option<String>,
    #[serde(default)]
    ingress_enabled: bool,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// A hard expiry (RFC 3339, in the future): the sandbox is deleted, with
    /// proof, by then ([`reap_expired`]); the answer's `expires_at` is the
    /// expiry kept (whole seconds, never later than asked).
    expires_at: Option<String>,
    /// The sandbox's own egress allow-list (host patterns and address
    /// ranges); missing, `null`, `[]` and `["*"]` leave it at the
    /// engine's list, which any list can only narrow.
    egress: Option<serde_json::Value>,
    /// A template's name (`POST /v1/templates`): the sandbox starts with
    /// a copy of its files.
    template: Option<String>,
    /// The service's native idle pause: the engine pauses the sandbox
    /// once no command has started or run for this long (60–86 400 s).
    auto_pause_after_seconds: Option<u64>,
}

/// The shortest and longest idle window the service accepts.
pub const AUTO_PAUSE_RANGE: std::ops::RangeInclusive<u64> = 60..=86_400;

/// Body of `PUT /sandboxes/{id}/egress`.
#[derive(Debug, Deserialize)]
pub struct EgressBody {
    egress: Option<serde_json::Value>,
}

/// A sandbox's own egress list from the request's `egress` (see
/// [`crate::network::egress::Policy::parse_sandbox_list`]), or a 400
/// naming what is wrong.
fn egress_list(
    value: Option<&serde_json::Value>,
) -> Result<Option<crate::network::egress::Policy>, ApiError> {
    let items: Vec<&str> = match value {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    ApiError::bad_request(format!("egress entries must be strings, not {v}"))
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "egress must be a list of host patterns and address ranges, not {other}"
            )))
        }
    };
    crate::network::egress::Policy::parse_sandbox_list(&items)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// How long before its expiry a sandbox's delete starts, so that it is
/// gone by the time the answer's `expires_at` names.
pub const EXPIRY_LEAD: std::time::Duration = std::time::Duration::from_secs(3);

fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `POST /sandboxes`.
pub async fn create(
    State(state): State<Shared>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: CreateBody = parse_json(&body)?;
    limits::name("shape", body.shape.as_deref())?;
    limits::name("rootfs", body.rootfs.as_deref())?;
    limits::name("region", body.region.as_deref())?;
    limits::env("env", &body.env)?;
    let shape = body
        .shape
        .ok_or_else(|| ApiError::bad_request("shape is required"))?;
    if !SHAPES.contains(&shape.as_str()) {
        return Err(ApiError::bad_request(format!("unknown shape {shape:?}"))
            .with_extra(json!({ "shapes": SHAPES })));
    }
    if let Some(bad) = body
        .env
        .iter()
        .find(|(k, v)| !valid_env_name(k) || v.contains('\0'))
    {
        return Err(ApiError::bad_request(format!(
            "invalid env entry {:?}",
            bad.0
        )));
    }
    let expiry = match body.expires_at.as_deref() {
        None => None,
        Some(text) => {
            let secs = crate::util::parse_rfc3339(text).ok_or_else(|| {
                ApiError::bad_request(format!("expires_at {text:?} is not an RFC 3339 time"))
            })?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            if secs <= (now + EXPIRY_LEAD).as_secs() {
                return Err(ApiError::bad_request(format!(
                    "expires_at {text:?} is not far enough in the future (at least {} s)",
                    EXPIRY_LEAD.as_secs() + 1
                )));
            }
            Some(secs)
        }
    };
    let egress = egress_list(body.egress.as_ref())?;
    let fill = match body.template {
        None => Fill::Nothing,
        Some(name) if crate::storage::templates::exists(&state.data_dir, &name) => {
            Fill::Template(name)
        }
        Some(name) => {
            return Err(ApiError::bad_request(format!(
                "no template named {name:?} (GET /v1/templates lists them)"
            )))
        }
    };
    let least = state.min_auto_pause.as_secs().max(1);
    let auto_pause = match body.auto_pause_after_seconds {
        None => None,
        Some(secs) if (least..=*AUTO_PAUSE_RANGE.end()).contains(&secs) => {
            Some(std::time::Duration::from_secs(secs))
        }
        Some(secs) => {
            return Err(ApiError::bad_request(format!(
                "auto_pause_after_seconds {secs} is outside {least}-{} seconds",
                AUTO_PAUSE_RANGE.end()
            )))
        }
    };
    let spec = SandboxSpec {
        shape,
        rootfs: body.rootfs,
        region: body.region,
        ingress_enabled: body.ingress_enabled,
        env: body.env,
    };
    let kept = Kept {
        egress,
        expiry,
        auto_pause,
        forked_from: None,
    };
    make_sandbox(&state, spec, kept, fill).await
}

/// What a new sandbox keeps beside its spec.
struct Kept {
    egress: Option<crate::network::egress::Policy>,
    expiry: Option<u64>,
    auto_pause: Option<std::time::Duration>,
    forked_from: Option<String>,
}

/// What a new sandbox's files start as.
enum Fill {
    /// The empty root every sandbox gets.
    Nothing,
    /// A copy of a template's files.
    Template(String),
    /// A copy of the files of the paused sandbox at this root.
    Fork(std::path::PathBuf),
}

/// Makes a sandbox of `spec` with its own egress list and expiry, its
/// files as `fill` says, and answers 201 with it; nothing is left of it
/// on any failure.
async fn make_sandbox(
    state: &Shared,
    spec: SandboxSpec,
    kept: Kept,
    fill: Fill,
) -> Result<Response, ApiError> {
    crate::trees::budgets::admit_sandbox(&state.budgets, state.store.len()).map_err(over_budget)?;
    crate::trees::budgets::admit_by_descriptors("sandbox").map_err(over_budget)?;
    let id = format!("sb-{}", crate::util::random_hex(8));
    let root = state.data_dir.join(&id);
    make_root(state, root.clone()).await?;
    if let Err(e) = record_created(state, &id, crate::storage::records::Face::CreateOs, &root).await
    {
        let _ = remove_root(state, &id, root).await;
        return Err(e);
    }
    let filled = {
        let (data_dir, root) = (state.data_dir.clone(), root.clone());
        match fill {
            Fill::Nothing => Ok(()),
            Fill::Template(name) => {
                crate::http::state::blocking(state, move || {
                    match crate::storage::templates::instantiate(&data_dir, &name, &root) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!("template {name:?} was deleted meanwhile")),
                        Err(e) => Err(format!("template {name:?} could not be copied: {e}")),
                    }
                })
                .await?
            }
            Fill::Fork(source) => {
                crate::http::state::blocking(state, move || {
                    crate::storage::templates::fork_into(&source, &root)
                        .map_err(|e| format!("the sandbox's files could not be copied: {e}"))
                })
                .await?
            }
        }
    };
    if let Err(why) = filled {
        record_deleted(state, &id);
        let _ = remove_root(state, &id, root).await;
        return Err(ApiError::internal(format!("{why}; nothing was created")));
    }
    let sb = Arc::new(Sandbox::new(id, spec, root));
    state.registries.egress.set_sandbox(&sb.root, kept.egress);
    if let Some(window) = kept.auto_pause {
        sb.set_auto_pause(window);
    }
    if let Some(source) = kept.forked_from {
        let _ = sb.forked_from.set(source);
    }
    if let Err(existing) = state
        .store
        .insert_within(sb.clone(), state.budgets.max_sandboxes)
    {
        record_deleted(state, &sb.id);
        let _ = remove_root(state, &sb.id, sb.root.clone()).await;
        return Err(over_budget(crate::trees::budgets::sandbox_refusal(
            &state.budgets,
            existing,
        )));
    }
    if let Some(secs) = kept.expiry {
        sb.set_expiry(secs);
    }
    // `creating` → `running` after the transition delay; without one, at
    // once (the answer already says `running`).
    if state.transition_delay.is_zero() {
        sb.complete(0, Status::Running);
    }
    let data = sb.to_json(&state.mode, &state.registries.egress);
    if !state.transition_delay.is_zero() {
        finish_later(sb, 0, state.transition_delay, Status::Running, |_| {});
    }
    Ok(success(StatusCode::CREATED, data))
}

/// `POST /sandboxes/{id}/fork` (a `createos-local` extension; the
/// service forks paused sandboxes too): a new sandbox with a copy of the
/// paused sandbox's files, its shape, env, ingress and egress list. 409
/// unless the sandbox is paused (nothing may write while it is copied).
pub async fn fork(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let source = sandbox(&state, &id)?;
    if source.status() != Status::Paused {
        return Err(conflict("fork", source.status()).with_extra(json!({
            "hint": "pause the sandbox first (POST /v1/sandboxes/{id}/pause)"
        })));
    }
    let kept = Kept {
        egress: state
            .registries
            .egress
            .sandbox(&source.root)
            .map(|p| (*p).clone()),
        expiry: None,
        auto_pause: source.auto_pause(),
        forked_from: Some(source.id.clone()),
    };
    make_sandbox(
        &state,
        source.spec.clone(),
        kept,
        Fill::Fork(source.root.clone()),
    )
    .await
}

/// Body of `POST /templates`.
#[derive(Debug, Deserialize)]
pub struct TemplateBody {
    name: Option<String>,
    sandbox_id: Option<String>,
}

/// `POST /templates` (a `createos-local` extension): keeps the files of
/// a paused sandbox under a name, for `POST /sandboxes` with
/// `"template"`. 400 for a bad name, 409 for a name in use or a sandbox
/// that is not paused, 429 past [`crate::storage::templates::MAX_TEMPLATES`].
pub async fn create_template(
    State(state): State<Shared>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: TemplateBody = parse_json(&body)?;
    let name = body
        .name
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    crate::storage::templates::check_name(&name)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let id = body
        .sandbox_id
        .ok_or_else(|| ApiError::bad_request("sandbox_id is required"))?;
    let source = sandbox(&state, &id)?;
    if source.status() != Status::Paused {
        return Err(conflict("capture a template of", source.status()));
    }
    let (data_dir, root, n) = (state.data_dir.clone(), source.root.clone(), name.clone());
    let captured = crate::http::state::blocking(&state, move || {
        crate::storage::templates::capture(&data_dir, &n, &root)
    })
    .await?;
    match captured {
        Ok(()) => Ok(success(
            StatusCode::CREATED,
            json!({ "name": name, "sandbox_id": id }),
        )),
        Err(crate::storage::templates::CaptureError::Refused(why)) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "template_limit",
            why,
        )),
        Err(crate::storage::templates::CaptureError::Exists(why)) => Err(ApiError::conflict(why)),
        Err(crate::storage::templates::CaptureError::Io(e)) => Err(ApiError::internal(format!(
            "template {name:?} could not be captured: {e}; nothing was kept"
        ))),
    }
}

/// `GET /templates`: the templates kept, oldest first.
pub async fn list_templates(State(state): State<Shared>) -> Result<Response, ApiError> {
    let data_dir = state.data_dir.clone();
    let list =
        crate::http::state::blocking(&state, move || crate::storage::templates::list(&data_dir))
            .await?;
    let items: Vec<_> = list
        .into_iter()
        .map(|(name, created, bytes)| {
            let secs = created
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            json!({ "name": name, "created_at": crate::util::rfc3339(secs as i64), "bytes": bytes })
        })
        .collect();
    Ok(ok(json!(items)))
}

/// `DELETE /templates/{name}`: sandboxes made from it keep their files.
pub async fn delete_template(
    State(state): State<Shared>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let (data_dir, n) = (state.data_dir.clone(), name.clone());
    let deleted = crate::http::state::blocking(&state, move || {
        crate::storage::templates::delete(&data_dir, &n)
    })
    .await?;
    match deleted {
        Ok(true) => Ok(ok(json!({ "name": name, "deleted": true }))),
        Ok(false) => Err(ApiError::not_found("template")),
        Err(e) => Err(ApiError::internal(format!(
            "template {name:?} could not be deleted: {e}"
        ))),
    }
}

/// `GET /sandboxes/{id}`.
pub async fn get_one(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    Ok(ok(sb.to_json(&state.mode, &state.registries.egress)))
}

/// `PUT /sandboxes/{id}/egress`: replaces the sandbox's own egress list
/// (`[]` or `["*"]`: none, the engine's list alone); connections its
/// commands open from then on follow it, whatever state it is in.
pub async fn put_egress(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: EgressBody = parse_json(&body)?;
    let egress = egress_list(body.egress.as_ref())?;
    let sb = sandbox(&state, &id)?;
    if sb.status() == Status::Destroying {
        return Err(conflict("change the egress of", Status::Destroying));
    }
    state.registries.egress.set_sandbox(&sb.root, egress);
    Ok(ok(sb.to_json(&state.mode, &state.registries.egress)))
}

/// `POST /sandboxes/{id}/ports/{port}` (a `createos-local` extension):
/// opens `port` of a sandbox made with `ingress_enabled` as a loopback
/// URL behind a secret token ([`crate::network::ingress`]), or answers
/// the one opened before. 403 while the operator has ingress off, 409 for
/// a sandbox made without `ingress_enabled`, 400 for a port outside
/// 1–65535.
pub async fn open_port(
    State(state): State<Shared>,
    Path((id, port)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let port =
        crate::http::limits::port(&port).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let sb = sandbox(&state, &id)?;
    if !state.ingress {
        return Err(ApiError::forbidden(crate::http::limits::INGRESS_OFF));
    }
    if !sb.spec.ingress_enabled {
        return Err(ApiError::conflict(format!(
            "sandbox {id} was created without ingress_enabled: its ports cannot be opened \
             (create it with \"ingress_enabled\": true)"
        )));
    }
    require_running(&sb)?;
    let opened = state
        .ports
        .open(
            &sb.root,
            &id,
            port,
            false,
            crate::machine::dial_into(&state.registries.machines, &sb.root),
        )
        .map_err(|e| ApiError::internal(format!("port {port} could not be opened: {e}")))?;
    Ok(ok(json!({
        "port": port,
        "url": opened.url,
        "token": opened.token,
        "token_header": crate::network::ingress::TOKEN_HEADER,
    })))
}

/// `DELETE /sandboxes/{id}`: terminates every process tree, removes the
/// root. Answers 500 (and keeps the sandbox, status `error`) if a process
/// survived, so that a retry can try again.
pub async fn delete(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if state.store.get(&id).is_none() && retry_unproven(&state, &id).await? {
        // A sandbox of an engine before this one, proven gone just now.
        return Ok(ok(json!({ "id": id, "status": Status::Destroyed })));
    }
    destroy(&state, &id).await?;
    Ok(ok(json!({ "id": id, "status": Status::Destroyed })))
}

/// Deletes sandbox `id` with proof: every process tree terminated, its
/// machine and disk proven gone; otherwise it stays (status `error`) for
/// a retry.
async fn destroy(state: &Shared, id: &str) -> Result<(), ApiError> {
    let sb = sandbox(state, id)?;
    sb.force(Status::Destroying);
    let sbc = sb.clone();
    let survivors = detached(&state.supervision, async move {
        // Creations already under way finish first (their processes are
        // then terminated below); later ones are refused.
        sbc.close().await;
        let mut survivors = Vec::new();
        let terminations = sbc.processes().into_iter().map(|p| async move {
            let t = p.terminate(std::time::Duration::from_millis(500)).await;
            (p, t)
        });
        for (p, t) in futures_util::future::join_all(terminations).await {
            survivors.extend(t.survivors);
            if t.verified {
                sbc.remove_process(&p.id);
            }
        }
        Ok(survivors)
    })
    .await?;
    if !survivors.is_empty() {
        sb.force(Status::Error);
        return Err(ApiError::internal(format!(
            "{} process(es) survived termination",
            survivors.len()
        )));
    }
    // Its machine and disk are proven gone before "destroyed"; otherwise
    // the sandbox and its record stay (a retry tries again).
    if let Err(why) = prove_gone(state, sb.root.clone(), true).await {
        sb.force(Status::Error);
        return Err(ApiError::internal(format!(
            "sandbox {id} could not be proven gone: {why}"
        )));
    }
    record_deleted(state, id);
    state.store.remove(id);
    remove_root(state, id, sb.root.clone())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(())
}

/// Deletes, with proof, every sandbox whose hard expiry is at most
/// [`EXPIRY_LEAD`] away (the server's reaper calls it every second). A
/// delete that cannot prove the end is tried again at the next call.
pub async fn reap_expired(state: &Shared) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let due = (now + EXPIRY_LEAD).as_secs();
    for sb in state.store.all() {
        let expired = sb.expiry().is_some_and(|secs| secs <= due);
        if expired && sb.status() != Status::Destroying {
            if let Err(why) = destroy(state, &sb.id).await {
                eprintln!(
                    "createos-local: sandbox {} reached its expiry but could not be deleted yet ({}); trying again",
                    sb.id,
                    why.message
                );
            }
        }
    }
}

/// Pauses, as `POST /pause` would, every sandbox with an idle window
/// that has had no command starting or running for that long (the
/// server's reaper calls it every second).
pub async fn reap_idle(state: &Shared) {
    let now = std::time::Instant::now();
    for sb in state.store.all() {
        let Some(window) = sb.auto_pause() else {
            continue;
        };
        if sb.status() != Status::Running || sb.idle_for(now).is_none_or(|idle| idle < window) {
            continue;
        }
        if begin_pause(state, sb.clone()).is_ok() {
            eprintln!(
                "createos-local: sandbox {} paused after {} s without a command                  (auto_pause_after_seconds); POST /v1/sandboxes/{}/resume brings it back",
                sb.id,
                window.as_secs(),
                sb.id
            );
        }
    }
}

/// `running` → `pausing` → `paused`, its processes and machine frozen;
/// the current status when the sandbox is not running.
fn begin_pause(state: &Shared, sb: Arc<Sandbox>) -> Result<(), Status> {
    let generation = sb.transition(&[Status::Running], Status::Pausing)?;
    let machines = state.registries.machines.clone();
    finish_later(
        sb,
        generation,
        state.transition_delay,
        Status::Paused,
        move |sb| {
            for p in sb.processes() {
                p.freeze(true);
            }
            machines.freeze_sandbox(&sb.root, true);
        },
    );
    Ok(())
}

/// `POST /sandboxes/{id}/pause`.
pub async fn pause(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    begin_pause(&state, sb).map_err(|cur| conflict("pause", cur))?;
    Ok(ok(json!({ "id": id, "status": Status::Pausing })))
}

/// `POST /sandboxes/{id}/resume`.
pub async fn resume(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&state, &id)?;
    let generation = sb
        .transition(&[Status::Paused], Status::Resuming)
        .map_err(|cur| conflict("resume", cur))?;
    let machines = state.registries.machines.clone();
    finish_later(
        sb,
        generation,
        state.transition_delay,
        Status::Running,
        move |sb| {
            machines.freeze_sandbox(&sb.root, false);
            for p in sb.processes() {
                p.freeze(false);
            }
            // A resumed sandbox's idle window starts again.
            sb.touch();
        },
    );
    Ok(ok(json!({ "id": id, "status": Status::Resuming })))
}

fn conflict(op: &str, cur: Status) -> ApiError {
    ApiError::conflict(format!("cannot {op} a sandbox that is {}", json!(cur)))
        .with_extra(json!({ "current_status": cur }))
}

/// 409 unless the sandbox accepts commands (`running`).
pub fn require_running(sb: &Sandbox) -> Result<(), ApiError> {
    match sb.status() {
        Status::Running => Ok(()),
        other => Err(ApiError::conflict(format!("sandbox is {}", json!(other)))
            .with_extra(json!({ "current_status": other }))),
    }
}
