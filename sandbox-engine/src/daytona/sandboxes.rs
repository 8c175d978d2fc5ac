//! The Daytona main API face: `/daytona/api/sandbox[/{id}[/start|/stop]]`.
//!
//! Create answers `started` at once (the real API waits up to 30 s for
//! `started` before it answers too). Stop terminates every process tree of
//! the sandbox with verification and answers only then (the real stop is
//! asynchronous: `stopping`, then `stopped`); a survivor makes it 500 with
//! the sandbox in `error`. Delete does the same and then removes the
//! sandbox's files; a deleted sandbox is 404.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::DaytonaError;
use crate::http::error::parse_json;
use crate::http::limits;
use crate::http::state::{AppState, Shared};
use crate::sandboxes::daytona_registry::{
    terminate_verified, CreateSpec, DaytonaSandbox, State as SbState,
};
use crate::sandboxes::store::{Sandbox, SandboxSpec, Status};

/// Body of `POST /sandbox` (camelCase, as the real API).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateBody {
    name: Option<String>,
    snapshot: Option<String>,
    user: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    public: bool,
    class: Option<String>,
    target: Option<String>,
    cpu: Option<f64>,
    gpu: Option<f64>,
    memory: Option<f64>,
    disk: Option<f64>,
    auto_stop_interval: Option<i64>,
    auto_archive_interval: Option<i64>,
    auto_delete_interval: Option<i64>,
    #[serde(default)]
    volumes: Vec<Value>,
    build_info: Option<Value>,
    network_block_all: Option<bool>,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
}

/// Body of `POST /sandbox/{id}/network-settings`: each field given
/// replaces the sandbox's, the others stay.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSettings {
    network_block_all: Option<bool>,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
}

/// A sandbox's network settings as the service shows them: whether it
/// blocks everything, its address ranges and its domains.
struct Network {
    block_all: bool,
    ranges: Vec<String>,
    domains: Vec<String>,
}

impl Network {
    /// The settings of the sandbox at `root` now.
    fn of(egress: &crate::network::egress::Policies, root: &std::path::Path) -> Self {
        let own = egress.sandbox(root);
        let entries = own.as_ref().map(|p| p.entries()).unwrap_or_default();
        let (ranges, domains) = entries.into_iter().partition(|e| e.contains('/'));
        Network {
            block_all: own.is_some_and(|p| !p.enabled()),
            ranges,
            domains,
        }
    }

    /// These settings with `change` applied, checked: address ranges in
    /// `networkAllowList`, host patterns in `domainAllowList`.
    fn with(mut self, change: NetworkSettings) -> Result<Self, DaytonaError> {
        let list = |text: &str, field: &str, ranges: bool| -> Result<Vec<String>, DaytonaError> {
            let items: Vec<String> = text
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(bad) = items.iter().find(|e| e.contains('/') != ranges) {
                return Err(DaytonaError::bad_request(format!(
                    "{field} entry {bad:?} is not {}",
                    if ranges {
                        "an address range (10.0.0.0/24)"
                    } else {
                        "a domain (example.com, *.example.com)"
                    }
                )));
            }
            crate::network::egress::Policy::parse_sandbox_list(&items)
                .map_err(|e| DaytonaError::bad_request(format!("{field}: {e}")))?;
            Ok(items)
        };
        if let Some(text) = &change.network_allow_list {
            self.ranges = list(text, "networkAllowList", true)?;
        }
        if let Some(text) = &change.domain_allow_list {
            self.domains = list(text, "domainAllowList", false)?;
        }
        if let Some(block) = change.network_block_all {
            self.block_all = block;
        }
        Ok(self)
    }

    /// The sandbox's own egress list these settings make.
    fn policy(&self) -> Result<Option<crate::network::egress::Policy>, DaytonaError> {
        if self.block_all {
            return Ok(Some(crate::network::egress::Policy::nothing()));
        }
        let items: Vec<&String> = self.ranges.iter().chain(&self.domains).collect();
        let items: Vec<&str> = items.into_iter().map(String::as_str).collect();
        crate::network::egress::Policy::parse_sandbox_list(&items)
            .map_err(|e| DaytonaError::bad_request(format!("network settings: {e}")))
    }
}

/// Default auto-stop interval of the real API (minutes).
const DEFAULT_AUTO_STOP: i64 = 15;

/// Default auto-archive interval of the real API (minutes, 7 days).
const DEFAULT_AUTO_ARCHIVE: i64 = 10_080;

pub(crate) fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Looks a Daytona sandbox up (by id or name) or answers 404.
pub fn daytona_sandbox(state: &AppState, id: &str) -> Result<Arc<DaytonaSandbox>, DaytonaError> {
    state
        .daytona
        .get(id)
        .ok_or_else(|| match crate::http::state::unproven(state, id) {
            Some(e) => DaytonaError(e),
            None => DaytonaError::not_found("sandbox"),
        })
}

/// The Sandbox object of the real API (the fields a provider reads, plus
/// `local*` fields that say what the local backend really does).
pub fn to_json(state: &AppState, sb: &DaytonaSandbox) -> Value {
    let (st, error_reason, updated_at) = sb.state_detail();
    let spec = &sb.spec;
    let network = Network::of(&state.registries.egress, &sb.core.root);
    let mut v = json!({
        "id": sb.id(),
        "organizationId": "local",
        "name": spec.name,
        "snapshot": spec.snapshot,
        "user": spec.user,
        "env": spec.env,
        "labels": spec.labels,
        "public": spec.public,
        "networkBlockAll": network.block_all
            || (state.mode.network() == "none"
                && state.registries.egress.ceiling().is_none()),
        "networkAllowList": (!network.ranges.is_empty()).then(|| network.ranges.join(",")),
        "domainAllowList": (!network.domains.is_empty()).then(|| network.domains.join(",")),
        "localEgress": state.registries.egress.describe_for(&sb.core.root),
        "target": spec.target,
        "cpu": spec.resources[0],
        "gpu": spec.resources[1],
        "memory": spec.resources[2],
        "disk": spec.resources[3],
        "state": st,
        "desiredState": match st {
            SbState::Stopped | SbState::Stopping => "stopped",
            SbState::Destroying => "destroyed",
            _ => "started",
        },
        "backupState": "None",
        "autoStopInterval": spec.intervals[0],
        "autoArchiveInterval": spec.intervals[1],
        "autoDeleteInterval": spec.intervals[2],
        "volumes": [],
        "createdAt": sb.core.created_at,
        "updatedAt": updated_at,
        "daemonVersion": concat!("createos-local ", env!("CARGO_PKG_VERSION")),
        "toolboxProxyUrl": state.toolbox_url,
        "localIsolation": state.mode.as_str(),
        "localNetwork": state.mode.network(),
        "localLimits": state.mode.limits(),
    });
    if let Value::Object(map) = &mut v {
        if let Some(reason) = error_reason {
            map.insert("errorReason".into(), json!(reason));
            map.insert("recoverable".into(), json!(true));
        }
        if let Some(class) = &spec.class {
            map.insert("class".into(), json!(class));
        }
        if let Some(b) = &spec.build_info {
            map.insert("buildInfo".into(), b.clone());
        }
    }
    v
}

fn answer(state: &AppState, sb: &DaytonaSandbox) -> Response {
    (StatusCode::OK, Json(to_json(state, sb))).into_response()
}

/// `POST /sandbox`: 200 with the Sandbox in state `started`.
pub async fn create(State(state): State<Shared>, body: Bytes) -> Result<Response, DaytonaError> {
    let body: CreateBody = parse_json(&body)?;
    for (field, value) in [
        ("name", &body.name),
        ("snapshot", &body.snapshot),
        ("user", &body.user),
        ("class", &body.class),
        ("target", &body.target),
    ] {
        limits::name(field, value.as_deref())?;
    }
    limits::env("env", &body.env)?;
    limits::env("labels", &body.labels)?;
    if let Some(bad) = body
        .env
        .iter()
        .find(|(k, v)| !valid_env_name(k) || v.contains('\0'))
    {
        return Err(DaytonaError::bad_request(format!(
            "invalid env entry {:?}: names are letters, digits and _ (not first a digit), values contain no NUL",
            bad.0
        )));
    }
    let resources = [body.cpu, body.gpu, body.memory, body.disk];
    if body.build_info.is_none() && resources.iter().any(Option::is_some) {
        return Err(DaytonaError::bad_request(
            "Cannot specify Sandbox resources when using a snapshot",
        ));
    }
    if body.build_info.is_some() && body.snapshot.is_some() {
        return Err(DaytonaError::bad_request(
            "Cannot specify a snapshot when using a build info entry",
        ));
    }
    // Another name is taken as it is (an image this engine does not
    // have), but not one of its own snapshots that was deleted: that
    // sandbox would start without the files it was asked for.
    if let Some(name) = body
        .snapshot
        .as_deref()
        .filter(|n| crate::storage::templates::was_deleted(&state.data_dir, n))
    {
        return Err(DaytonaError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("Snapshot {name} not found: it was deleted; nothing was created"),
        ));
    }
    if resources
        .iter()
        .flatten()
        .any(|r| !r.is_finite() || *r < 0.0)
    {
        return Err(DaytonaError::bad_request(
            "cpu, gpu, memory and disk must be non-negative numbers",
        ));
    }
    if !body.volumes.is_empty() {
        return Err(DaytonaError::bad_request(
            "volumes are not supported by createos-local",
        ));
    }
    let network = Network {
        block_all: false,
        ranges: Vec::new(),
        domains: Vec::new(),
    }
    .with(NetworkSettings {
        network_block_all: body.network_block_all,
        network_allow_list: body.network_allow_list.clone(),
        domain_allow_list: body.domain_allow_list.clone(),
    })?
    .policy()?;
    if let Some(name) = &body.name {
        if name.is_empty() || state.daytona.name_taken(name) {
            return Err(DaytonaError::conflict(format!(
                "a sandbox named {name:?} already exists (or the name is empty)"
            )));
        }
    }
    crate::trees::budgets::admit_sandbox(&state.budgets, state.store.len())
        .map_err(crate::http::error::over_budget)?;
    crate::trees::budgets::admit_by_descriptors("sandbox")
        .map_err(crate::http::error::over_budget)?;
    let id = uuid();
    let root = state.data_dir.join(format!("daytona-{id}"));
    crate::http::state::make_root(&state, root.clone()).await?;
    if let Err(e) = crate::http::state::record_created(
        &state,
        &id,
        crate::storage::records::Face::Daytona,
        &root,
    )
    .await
    {
        let _ = crate::http::state::remove_root(&state, &id, root).await;
        return Err(e.into());
    }
    // A snapshot this engine captured (`POST /sandbox/{id}/snapshot`):
    // the sandbox starts with its files. Any other name is echoed only.
    if let Some(name) = body
        .snapshot
        .clone()
        .filter(|n| crate::storage::templates::exists(&state.data_dir, n))
    {
        let (data_dir, r) = (state.data_dir.clone(), root.clone());
        let filled = crate::http::state::blocking(&state, move || {
            crate::storage::templates::instantiate(&data_dir, &name, &r)
        })
        .await?;
        if !matches!(filled, Ok(true)) {
            crate::http::state::record_deleted(&state, &id);
            let _ = crate::http::state::remove_root(&state, &id, root).await;
            return Err(crate::http::error::ApiError::internal(format!(
                "the snapshot's files could not be copied ({}); nothing was created",
                match filled {
                    Err(e) => e.to_string(),
                    _ => "it was deleted meanwhile".to_string(),
                }
            ))
            .into());
        }
    }
    let core = Arc::new(Sandbox::new(
        id.clone(),
        SandboxSpec {
            shape: "daytona".to_string(),
            rootfs: body.snapshot.clone(),
            region: body.target.clone(),
            ingress_enabled: body.public,
            env: body.env.clone(),
        },
        root,
    ));
    core.force(Status::Running);
    let spec = CreateSpec {
        name: body.name.unwrap_or_else(|| id.clone()),
        snapshot: body.snapshot,
        user: body.user.unwrap_or_else(|| "root".to_string()),
        env: body.env,
        labels: body.labels,
        public: body.public,
        target: body.target.unwrap_or_else(|| "local".to_string()),
        resources: [
            body.cpu.unwrap_or(1.0),
            body.gpu.unwrap_or(0.0),
            body.memory.unwrap_or(1.0),
            body.disk.unwrap_or(3.0),
        ],
        intervals: [
            body.auto_stop_interval.unwrap_or(DEFAULT_AUTO_STOP),
            body.auto_archive_interval.unwrap_or(DEFAULT_AUTO_ARCHIVE),
            body.auto_delete_interval.unwrap_or(-1),
        ],
        class: body.class,
        build_info: body.build_info,
    };
    let sb = Arc::new(DaytonaSandbox::new(core.clone(), spec));
    state.registries.egress.set_sandbox(&core.root, network);
    if let Err(existing) = state
        .store
        .insert_within(core.clone(), state.budgets.max_sandboxes)
    {
        crate::http::state::record_deleted(&state, &core.id);
        let _ = crate::http::state::remove_root(&state, &core.id, core.root.clone()).await;
        return Err(
            crate::http::error::over_budget(crate::trees::budgets::sandbox_refusal(
                &state.budgets,
                existing,
            ))
            .into(),
        );
    }
    state.daytona.insert(sb.clone());
    Ok(answer(&state, &sb))
}

/// `POST /sandbox/{id}/network-settings`: replaces the fields given
/// (at least one, as the service requires); the sandbox's commands
/// follow the new settings for every connection they open from then on.
pub async fn network_settings(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let change: NetworkSettings = parse_json(&body)?;
    if change.network_block_all.is_none()
        && change.network_allow_list.is_none()
        && change.domain_allow_list.is_none()
    {
        return Err(DaytonaError::bad_request(
            "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided",
        ));
    }
    let sb = daytona_sandbox(&state, &id)?;
    let policy = Network::of(&state.registries.egress, &sb.core.root)
        .with(change)?
        .policy()?;
    state.registries.egress.set_sandbox(&sb.core.root, policy);
    Ok(answer(&state, &sb))
}

/// Body of `POST /sandbox/{id}/snapshot`.
#[derive(Debug, Deserialize)]
pub struct SnapshotBody {
    name: Option<String>,
}

/// `POST /sandbox/{id}/snapshot`: keeps the files of a stopped sandbox
/// as a snapshot `name` that `POST /sandbox` with `"snapshot": name`
/// starts from (the service snapshots a sandbox the same way). 409
/// unless the sandbox is stopped (nothing runs while it is copied), 400
/// for a bad name, 409 for a name in use.
pub async fn snapshot(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, DaytonaError> {
    let body: SnapshotBody = parse_json(&body)?;
    let name = body
        .name
        .ok_or_else(|| DaytonaError::bad_request("name is required"))?;
    crate::storage::templates::check_name(&name)
        .map_err(|e| DaytonaError::bad_request(e.to_string()))?;
    let sb = daytona_sandbox(&state, &id)?;
    if sb.state() != SbState::Stopped {
        return Err(DaytonaError::conflict(format!(
            "sandbox {id} is {}: stop it before taking a snapshot of it",
            json!(sb.state())
        )));
    }
    let (data_dir, root, n) = (state.data_dir.clone(), sb.core.root.clone(), name.clone());
    let captured = crate::http::state::blocking(&state, move || {
        crate::storage::templates::capture(&data_dir, &n, &root)
    })
    .await?;
    match captured {
        Ok(()) => Ok(answer(&state, &sb)),
        Err(crate::storage::templates::CaptureError::Refused(why)) => {
            Err(DaytonaError::bad_request(why))
        }
        Err(crate::storage::templates::CaptureError::Exists(why)) => {
            Err(DaytonaError::conflict(why))
        }
        Err(crate::storage::templates::CaptureError::Io(e)) => {
            Err(crate::http::error::ApiError::internal(format!(
                "snapshot {name:?} could not be taken: {e}; nothing was kept"
            ))
            .into())
        }
    }
}

/// `GET /sandbox/{id}/ports/{port}/preview-url`: the port as a loopback
/// URL and the token a request carries in `X-Daytona-Preview-Token` (a
/// public sandbox's port needs none), see [`crate::network::ingress`].
/// 403 while the operator has ingress off, 400 for a port outside
/// 1–65535.
pub async fn preview_url(
    State(state): State<Shared>,
    Path((id, port)): Path<(String, String)>,
) -> Result<Response, DaytonaError> {
    let port =
        crate::http::limits::port(&port).map_err(|e| DaytonaError::bad_request(e.to_string()))?;
    let sb = daytona_sandbox(&state, &id)?;
    if !state.ingress {
        return Err(
            crate::http::error::ApiError::forbidden(crate::http::limits::INGRESS_OFF).into(),
        );
    }
    let opened = state
        .ports
        .open(
            &sb.core.root,
            sb.id(),
            port,
            sb.spec.public,
            crate::machine::dial_into(&state.registries.machines, &sb.core.root),
        )
        .map_err(|e| {
            crate::http::error::ApiError::internal(format!("port {port} could not be opened: {e}"))
        })?;
    Ok((
        StatusCode::OK,
        Json(json!({
            "sandboxId": sb.id(),
            "url": opened.url,
            "token": opened.token,
        })),
    )
        .into_response())
}

/// `?labels=` of `GET /sandbox` (a JSON object).
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    labels: Option<String>,
    /// Where a page starts (the `nextCursor` of the page before).
    cursor: Option<String>,
    /// Page size (default and maximum 100).
    limit: Option<usize>,
}

/// Largest page of `GET /sandbox`.
const MAX_PAGE: usize = 100;

/// `GET /sandbox?labels={"k":"v"}[&limit=N&cursor=C]`: the sandboxes
/// carrying every given label, oldest first, one page as the current API
/// answers: `{"items": [...], "nextCursor": "..."|null}`.
pub async fn list(
    State(state): State<Shared>,
    Query(q): Query<ListQuery>,
) -> Result<Response, DaytonaError> {
    let wanted: BTreeMap<String, String> = match q.labels.as_deref() {
        None | Some("") => BTreeMap::new(),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            DaytonaError::bad_request(format!(
                "labels must be a JSON object of strings, e.g. {{\"k\":\"v\"}}: {e}"
            ))
        })?,
    };
    let mut all: Vec<Value> = state
        .daytona
        .all()
        .iter()
        .filter(|sb| wanted.iter().all(|(k, v)| sb.spec.labels.get(k) == Some(v)))
        .map(|sb| to_json(&state, sb))
        .collect();
    all.sort_by(|a, b| a["createdAt"].as_str().cmp(&b["createdAt"].as_str()));
    let limit = match q.limit {
        None => MAX_PAGE,
        Some(n) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(DaytonaError::bad_request(format!(
                "limit must be from 1 to {MAX_PAGE}"
            )))
        }
    };
    let start = match q.cursor.as_deref() {
        None | Some("") => 0,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= all.len())
            .ok_or_else(|| DaytonaError::bad_request("cursor is not one this server gave"))?,
    };
    let end = (start + limit).min(all.len());
    let next = (end < all.len()).then(|| end.to_string());
    let items: Vec<Value> = all.drain(start..end).collect();
    Ok((
        StatusCode::OK,
        Json(json!({ "items": items, "nextCursor": next })),
    )
        .into_response())
}

/// `GET /sandbox/{id}`.
pub async fn get_one(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    Ok(answer(&state, &sb))
}

/// `GET /sandbox/{id}/toolbox-proxy-url`: `{"url": ...}`.
pub async fn toolbox_proxy_url(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    daytona_sandbox(&state, &id)?;
    Ok((StatusCode::OK, Json(json!({ "url": state.toolbox_url }))).into_response())
}

/// `POST /sandbox/{id}/start`: `stopped` (or `error` after a failed stop,
/// once its processes are verified gone) → `started`; 200 with the Sandbox.
/// Starting a started sandbox is a no-op.
pub async fn start(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let _lifecycle = sb.lifecycle.lock().await;
    match sb.state() {
        SbState::Started => {}
        SbState::Stopped => {
            sb.set_state(SbState::Starting, None);
            sb.core.reopen();
            sb.set_state(SbState::Started, None);
        }
        SbState::Error if sb.core.status() == Status::Destroying => {
            return Err(DaytonaError::conflict(
                "the sandbox's delete could not be proven (see its errorReason); only a delete \
                 may follow, which tries again",
            )
            .with_state(SbState::Error));
        }
        SbState::Error => {
            // A failed stop left processes behind: try again before starting.
            let survivors = terminate_everything(&state, &sb).await?;
            if !survivors.is_empty() {
                return Err(survived(&sb, "start", &survivors));
            }
            sb.clear_sessions();
            sb.core.reopen();
            sb.set_state(SbState::Started, None);
        }
        other => {
            return Err(DaytonaError::conflict(format!(
                "cannot start a sandbox that is {}",
                json!(other)
            ))
            .with_state(other))
        }
    }
    Ok(answer(&state, &sb))
}

/// `POST /sandbox/{id}/stop`: terminates every process tree (SIGTERM, a
/// short grace, SIGKILL, a fresh scan), forgets the sessions, answers 200
/// with the Sandbox in `stopped`. A survivor: 500, state `error`.
pub async fn stop(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let sb = daytona_sandbox(&state, &id)?;
    let _lifecycle = sb.lifecycle.lock().await;
    match sb.state() {
        SbState::Stopped => return Ok(answer(&state, &sb)),
        SbState::Started | SbState::Error => {}
        other => {
            return Err(DaytonaError::conflict(format!(
                "cannot stop a sandbox that is {}",
                json!(other)
            ))
            .with_state(other))
        }
    }
    sb.set_state(SbState::Stopping, None);
    let survivors = terminate_everything(&state, &sb).await?;
    if !survivors.is_empty() {
        return Err(survived(&sb, "stop", &survivors));
    }
    // "stopped" only once its machine is proven gone too (files and disk
    // stay for a start).
    if let Err(why) = crate::http::state::prove_gone(&state, sb.core.root.clone(), false).await {
        return Err(unproven(&sb, "stop", &why));
    }
    sb.clear_sessions();
    sb.set_state(SbState::Stopped, None);
    Ok(answer(&state, &sb))
}

/// `DELETE /sandbox/{id}`: terminates every process tree with verification,
/// removes the files, answers 200 with the Sandbox in `destroyed`; later
/// requests get 404. A survivor: 500, state `error`, the sandbox is kept
/// (a retry tries again).
pub async fn delete(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    if state.daytona.get(&id).is_none() && crate::http::state::retry_unproven(&state, &id).await? {
        // A sandbox of an engine before this one, proven gone just now.
        return Ok((
            StatusCode::OK,
            Json(json!({ "id": id, "state": "destroyed", "desiredState": "destroyed" })),
        )
            .into_response());
    }
    let sb = daytona_sandbox(&state, &id)?;
    let _lifecycle = sb.lifecycle.lock().await;
    if state.daytona.get(sb.id()).is_none() {
        return Err(DaytonaError::not_found("sandbox"));
    }
    sb.set_state(SbState::Destroying, None);
    // Marks the core for good: a delete that fails from here on leaves a
    // sandbox that only a delete may follow (its disk may be unmounted).
    sb.core.force(Status::Destroying);
    let survivors = terminate_everything(&state, &sb).await?;
    if !survivors.is_empty() {
        return Err(survived(&sb, "delete", &survivors));
    }
    // Its machine and disk are proven gone before "destroyed"; otherwise
    // the sandbox and its record stay (a retry tries again).
    if let Err(why) = crate::http::state::prove_gone(&state, sb.core.root.clone(), true).await {
        return Err(unproven(&sb, "delete", &why));
    }
    sb.clear_sessions();
    crate::http::state::record_deleted(&state, sb.id());
    state.daytona.remove(sb.id());
    state.store.remove(sb.id());
    crate::http::state::remove_root(&state, sb.id(), sb.core.root.clone())
        .await
        .map_err(|e| DaytonaError::internal(e.to_string()))?;
    let mut v = to_json(&state, &sb);
    v["state"] = json!("destroyed");
    v["desiredState"] = json!("destroyed");
    Ok((StatusCode::OK, Json(v)).into_response())
}

/// Refuses new commands, waits for starts under way, terminates every
/// process tree of the sandbox concurrently and forgets the verified ones.
/// Returns the pids that survived (empty = every tree verified gone).
async fn terminate_everything(
    state: &AppState,
    sb: &Arc<DaytonaSandbox>,
) -> Result<Vec<i32>, DaytonaError> {
    let core = sb.core.clone();
    let sessions = sb.sessions();
    let survivors = crate::http::state::detached(&state.supervision, async move {
        // No session starts a command after this (each waits for a start
        // under way), and the sandbox admits no new process.
        for s in &sessions {
            *s.gate.lock().await = true;
        }
        core.close().await;
        let terminations = core.processes().into_iter().map(|p| async move {
            let t = terminate_verified(&p, std::time::Duration::from_millis(500)).await;
            (p, t)
        });
        let mut survivors = Vec::new();
        for (p, t) in futures_util::future::join_all(terminations).await {
            if t.verified {
                core.remove_process(&p.id);
            } else {
                survivors.extend(t.survivors);
            }
        }
        Ok(survivors)
    })
    .await?;
    Ok(survivors)
}

fn survived(sb: &DaytonaSandbox, op: &str, survivors: &[i32]) -> DaytonaError {
    let reason = format!(
        "{op}: {} process(es) survived termination (host pids {survivors:?}); they may still run",
        survivors.len()
    );
    sb.set_state(SbState::Error, Some(reason.clone()));
    DaytonaError::internal(reason)
}

/// A sandbox whose end could not be proven (see [`crate::sandboxes::teardown`]): it
/// stays, in `error`, with the reason.
fn unproven(sb: &DaytonaSandbox, op: &str, why: &dyn std::fmt::Display) -> DaytonaError {
    let reason = format!("{op}: the sandbox could not be proven gone: {why}");
    sb.set_state(SbState::Error, Some(reason.clone()));
    DaytonaError::internal(reason)
}

impl DaytonaError {
    fn with_state(mut self, st: SbState) -> Self {
        self.0.extra = Some(json!({ "state": st }));
        self
    }
}

/// A random version-4 UUID (the real API's sandbox and command ids).
pub fn uuid() -> String {
    let hex = crate::util::random_hex(16);
    let b = hex.as_bytes();
    let s = |r: std::ops::Range<usize>| std::str::from_utf8(&b[r]).unwrap_or("0");
    let variant = ["8", "9", "a", "b"][usize::from(b[16] % 4)];
    format!(
        "{}-{}-4{}-{}{}-{}",
        s(0..8),
        s(8..12),
        s(13..16),
        variant,
        s(17..20),
        s(20..32)
    )
}
