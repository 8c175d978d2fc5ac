//! The provider's operations ([`CreateOs`], the SDK's `Provider`): acquire,
//! resume, release, destroy, probe, realize, sync and execute (the command
//! itself runs in [`crate::execute`]).
//!
//! Sandbox state transitions are asynchronous: they are observed by polling
//! `GET /sandboxes/{id}` every 250 ms, bounded by the operation's deadline
//! (the config's `timeoutMs`).

use crate::config::Config;
use crate::lease::{self, LeaseMetadata, MARKER_PATH, WORKSPACE_ROOT};
use crate::{api, execute, expiry, policy};
use provider_sdk::acquire::AcquirePolicy;
use provider_sdk::egress::Egress;
use provider_sdk::errors::{
    cleanup_cause, invalid_response as invalid, probe_report, receipt, ApiError, DeleteSandbox,
};
use provider_sdk::http::{self, call_bytes, created_id};
use provider_sdk::platform::{random_hex, Method, Request};
use provider_sdk::templates;
use provider_sdk::types::{
    AcquireRequest, CleanupCause, CleanupPhase, ExecuteRequest, ExecuteResult, FileDownload,
    FileUpload, InteractionRequest, Lease, PortEndpoint, ProbeReport, ProviderDescription,
    ProviderError, ResumeOutcome, SyncReport, TemplateDeletion, TemplateInfo, TerminationAction,
    TerminationReceipt, WorkspaceRequest,
};
use provider_sdk::{Operation, Provider};
use serde_json::{json, Map, Value};

/// How often a transition is polled.
pub const POLL_INTERVAL_MS: u64 = 250;

/// States that prove the sandbox is gone (as a 404 does).
const GONE_STATES: &[&str] = &["destroyed", "failed"];

/// States in which the sandbox cannot be used, paused or resumed, but may
/// still exist: they prove nothing about absence.
const UNUSABLE_STATES: &[&str] = &["error", "destroying"];

/// The CreateOS provider: one operation's state (its budget the config's
/// `timeoutMs`).
///
/// The state, its `new` and `describe` have the shape of every provider's
/// (the SDK's `Provider`): alike in both providers, nothing left to share.
pub struct CreateOs<'a> {
    op: Operation<'a, Config>,
}

provider_sdk::export_provider!(CreateOs);

impl<'a> Provider<'a> for CreateOs<'a> {
    type Config = Config;

    fn new(op: Operation<'a, Config>) -> CreateOs<'a> {
        CreateOs { op }
    }

    fn describe() -> ProviderDescription {
        crate::describe::description()
    }

    /// Creates a sandbox, runs `/bin/echo <marker>`, and always deletes it.
    fn probe(&mut self) -> Result<ProbeReport, ProviderError> {
        let mut diagnostics = Vec::new();
        let mut body = Map::new();
        if let Some(rootfs) = &self.op.config.rootfs {
            body.insert("rootfs".into(), Value::String(rootfs.clone()));
        }
        let (id, _) = self.create_sandbox(body)?;
        diagnostics.push(format!(
            "created sandbox {id} (shape {})",
            self.op.config.shape
        ));
        let marker = format!("paperclip-probe-{}", random_hex(self.op.platform, 8));
        let outcome = self.probe_run(&id, &marker, &mut diagnostics);
        self.destroy_sandbox(&id)?;
        diagnostics.push(format!("deleted sandbox {id}"));
        let ok = outcome?.trim_end() == marker;
        let origin = &self.op.config.api_origin;
        Ok(probe_report(ok, "CreateOS", origin, diagnostics))
    }

    /// Creates a sandbox, waits until it runs, creates the workspace and
    /// writes the marker. On a failure after creation the sandbox is
    /// deleted; if that fails too, the result is `cleanup-failed`.
    fn acquire_lease(&mut self, request: &AcquireRequest) -> Result<Lease, ProviderError> {
        // Paperclip asks for one where a sandbox must be bounded (its
        // login terminal) and fails closed without it: honoured only where
        // the backend attests one, refused before any request elsewhere.
        let asked =
            match &request.requested_expires_at {
                None => None,
                Some(_) if !self.op.config.hard_expiry => return Err(ProviderError::Unsupported(
                    "the CreateOS service cannot give a sandbox an expiry time (`hardExpiry` is \
                     for a backend that attests one, such as createos-local)"
                        .into(),
                )),
                Some(at) => match expiry::millis(at, false) {
                    Some(ms) => Some((at.as_str(), ms)),
                    None => {
                        return Err(ProviderError::InvalidRequest(
                            "requested-expires-at is not an RFC 3339 time".into(),
                        ))
                    }
                },
            };
        let cwd = match &request.requested_cwd {
            Some(cwd) => workspace_path(cwd)?,
            None => WORKSPACE_ROOT.to_string(),
        };
        let start = policy::start(&self.op.config, &AcquirePolicy::of(self.op.ctx, request)?)?;
        let mut body = Map::new();
        if let Some((at, _)) = asked {
            body.insert("expires_at".into(), Value::String(at.into()));
        }
        if let Some(rootfs) = &start.rootfs {
            body.insert("rootfs".into(), Value::String(rootfs.clone()));
        }
        if let Some(template) = &start.template {
            body.insert("template".into(), Value::String(template.clone()));
        }
        if let Some(rules) = &start.egress_rules {
            body.insert("egress".into(), json!(rules));
        }
        let auto_pause = self.op.config.auto_pause_after_seconds;
        if let Some(seconds) = auto_pause {
            body.insert("auto_pause_after_seconds".into(), json!(seconds));
        }
        let (sandbox_id, attested) = self.create_sandbox(body)?;
        if let Some((_, limit)) = asked {
            // Kept only when the backend attests it, at or before the time asked.
            if attested
                .as_deref()
                .and_then(|at| expiry::millis(at, true))
                .is_none_or(|ms| ms > limit)
            {
                let error = invalid(
                    "create-sandbox",
                    "the backend attested no expiry at or before the one asked",
                );
                return Err(self.undo_sandbox(error, &sandbox_id, CleanupPhase::LeaseSetup));
            }
        }
        let marker = random_hex(self.op.platform, 16);
        let metadata = LeaseMetadata {
            provider: lease::PROVIDER.into(),
            sandbox_id: sandbox_id.clone(),
            environment_id: self.op.ctx.environment_id.clone(),
            api_origin: self.op.config.api_origin.clone(),
            shape: self.op.config.shape.clone(),
            rootfs: start.rootfs,
            region: self.op.config.region.clone(),
            workspace_root: WORKSPACE_ROOT.into(),
            cwd,
            marker,
            reusable: self.op.config.reuse_lease,
            adapter_type: request.adapter_type.clone(),
            image_asked: start.image_asked,
            template: start.template,
            egress: start.egress.as_ref().map(Egress::to_entries),
            base_egress: self.op.config.egress_allowlist_entries(),
            auto_pause_after_seconds: auto_pause,
            ingress: self.op.config.ingress,
        };
        match self.prepare(&metadata) {
            Ok(()) => Ok(Lease {
                expires_at: attested,
                ..metadata.to_lease()
            }),
            Err(error) => Err(self.undo_sandbox(error, &sandbox_id, CleanupPhase::LeaseSetup)),
        }
    }

    /// Resumes a released lease: `expired` only with proof that it is not
    /// usable — the sandbox is gone (404, `destroyed`, `failed`), is not the
    /// leased one (marker), or no longer matches the current config or its
    /// own lease (shape, rootfs, region). `error` and `destroying` prove
    /// nothing and are errors.
    fn resume_lease(&mut self, lease: &Lease) -> Result<ResumeOutcome, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let id = &metadata.sandbox_id;
        // The config may have changed since the lease was acquired: a lease
        // on another shape, image, region or base egress list is not what
        // the caller asks for. Decided before any request.
        let config = &self.op.config;
        let image = if metadata.image_asked {
            metadata.rootfs.as_deref()
        } else {
            config.rootfs_for(metadata.adapter_type.as_deref())
        };
        let base_egress = config.egress_allowlist_entries();
        for (field, same) in [
            ("shape", metadata.shape == config.shape),
            ("image (rootfs)", metadata.rootfs.as_deref() == image),
            ("region", metadata.region == config.region),
            ("egressAllowlist", metadata.base_egress == base_egress),
        ] {
            if !same {
                return Ok(expired(&format!(
                    "the config's {field} is not the one the sandbox was created with"
                )));
            }
        }
        let egress_rules = match &metadata.egress {
            None => None,
            Some(kept) => match Egress::from_entries(kept) {
                Some(egress) => Some(policy::egress_rules(&egress)?),
                None => {
                    return Err(ProviderError::ForeignLease(
                        "the lease's egress policy is not one this provider wrote".into(),
                    ))
                }
            },
        };
        let data = match self.get_sandbox(id) {
            Err(ApiError::Status(404)) => return Ok(expired("the sandbox no longer exists")),
            other => other.map_err(|e| e.into_provider_error("get-sandbox"))?,
        };
        for (field, want) in [
            ("shape", Some(&metadata.shape)),
            ("rootfs", metadata.rootfs.as_ref()),
            ("region", metadata.region.as_ref()),
        ] {
            if let (Some(want), Some(have)) = (want, data.get(field).and_then(Value::as_str)) {
                if want != have {
                    return Ok(expired(&format!("the sandbox's {field} changed")));
                }
            }
        }
        let status = http::string_field(&data, "status")
            .map_err(|e| e.into_provider_error("get-sandbox"))?
            .to_string();
        if GONE_STATES.contains(&status.as_str()) {
            return Ok(expired(&format!("the sandbox is {status}")));
        }
        if UNUSABLE_STATES.contains(&status.as_str()) {
            return Err(unusable("resume", &status, "resumed"));
        }
        // The lease's policy again, before the sandbox runs anything.
        if let Some(rules) = egress_rules {
            self.put_egress(id, rules)?;
        }
        if status != "running" {
            if status == "pausing" {
                // A pause still in progress cannot be resumed yet.
                match self.wait_for_state(id, &["paused"], "resume")? {
                    State::Reached => {}
                    State::Gone(state) => return Ok(expired(&format!("the sandbox is {state}"))),
                    State::Unusable(state) => return Err(unusable("resume", &state, "resumed")),
                }
            }
            if matches!(status.as_str(), "paused" | "pausing") {
                self.transition(id, "resume", "paused")?;
            }
            match self.wait_for_state(id, &["running"], "resume")? {
                State::Reached => {}
                State::Gone(state) => return Ok(expired(&format!("the sandbox is {state}"))),
                State::Unusable(state) => return Err(unusable("resume", &state, "resumed")),
            }
        }
        let read = Request::new(Method::Get, api::file_path(id, MARKER_PATH));
        let wait = self.op.wait(true);
        match call_bytes(self.op.platform, &read, wait) {
            Ok(bytes) if bytes == metadata.marker.as_bytes() => {
                // The same sandbox: the same expiry, if it has one.
                Ok(ResumeOutcome::Resumed(Lease {
                    expires_at: lease.expires_at.clone(),
                    ..metadata.to_lease()
                }))
            }
            Ok(_) => Ok(expired(
                "the workspace marker does not match: another sandbox",
            )),
            Err(ApiError::Status(404)) => Ok(expired("the workspace marker is missing")),
            Err(error) => Err(error.into_provider_error("read-marker")),
        }
    }

    /// Pauses a reusable lease (config `reuseLease` and the lease agree), or
    /// deletes the sandbox.
    fn release_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let id = metadata.sandbox_id.clone();
        if !(metadata.reusable && self.op.config.reuse_lease) {
            return self.destroy_sandbox(&id);
        }
        let data = match self.get_sandbox(&id) {
            Err(ApiError::Status(404)) => return Ok(receipt(&id, TerminationAction::AlreadyGone)),
            Err(error) => return Err(error.into_provider_error("get-sandbox")),
            Ok(data) => data,
        };
        let status = http::string_field(&data, "status")
            .map_err(|e| e.into_provider_error("get-sandbox"))?;
        if GONE_STATES.contains(&status) {
            return Ok(receipt(&id, TerminationAction::AlreadyGone));
        }
        if UNUSABLE_STATES.contains(&status) {
            return Err(unusable("pause", status, "paused"));
        }
        // The service pauses it once idle, when the sandbox (as it says)
        // has the window the lease was created with.
        let window = data.get("auto_pause_after_seconds").and_then(Value::as_u64);
        if metadata.auto_pause_after_seconds.is_some()
            && window == metadata.auto_pause_after_seconds
        {
            let action = if status == "paused" {
                TerminationAction::Paused
            } else {
                TerminationAction::IdlePause
            };
            return Ok(receipt(&id, action));
        }
        self.transition(&id, "pause", "running")?;
        match self.wait_for_state(&id, &["paused"], "pause")? {
            State::Reached => Ok(receipt(&id, TerminationAction::Paused)),
            State::Gone(_) => Ok(receipt(&id, TerminationAction::AlreadyGone)),
            State::Unusable(state) => Err(unusable("pause", &state, "paused")),
        }
    }

    /// Deletes the sandbox of a lease; 404 is success.
    fn destroy_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        // A host that recorded a failed setup (`cleanup-failed` in phase
        // `lease-setup`) has only the sandbox id, never metadata: destroying
        // by that id is the only way to clear it.
        let setup_record = matches!(lease.metadata.trim(), "" | "{}");
        if setup_record && http::is_valid_id(&lease.provider_lease_id) {
            let id = &lease.provider_lease_id;
            return self.destroy_sandbox(id);
        }
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let id = &metadata.sandbox_id;
        self.destroy_sandbox(id)
    }

    /// Makes sure the remote working directory exists and returns its
    /// path. For the workspace root, the lease's marker file (written
    /// there at acquire) is the proof: one file read, no process (a
    /// one-shot `exec` was most of the cost of a short `lease exec` on the
    /// local engine). Otherwise, or when the marker is gone, `mkdir -p`.
    fn realize_workspace(
        &mut self,
        lease: &Lease,
        request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let path = match &request.remote_path {
            Some(path) => workspace_path(path)?,
            None => metadata.cwd.clone(),
        };
        if MARKER_PATH.rsplit_once('/').map(|(dir, _)| dir) == Some(path.as_str()) {
            let read = Request::new(
                Method::Get,
                api::file_path(&metadata.sandbox_id, MARKER_PATH),
            );
            let wait = self.op.wait(true);
            match call_bytes(self.op.platform, &read, wait) {
                Ok(_) => return Ok(path),
                // Gone (a command removed the workspace): made again below.
                Err(ApiError::Status(404)) => {}
                Err(error) => return Err(error.into_provider_error("realize-workspace")),
            }
        }
        self.exec_checked(
            &metadata.sandbox_id,
            "/bin/mkdir",
            &["-p", "--", &path],
            "realize-workspace",
        )?;
        Ok(path)
    }

    /// Writes files into the sandbox with `PUT /files` (parents are created
    /// by the API). Every path is checked before the first request.
    fn sync_in(
        &mut self,
        lease: &Lease,
        files: &[FileUpload],
    ) -> Result<SyncReport, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let paths = files
            .iter()
            .map(|f| workspace_path(&f.remote_path))
            .collect::<Result<Vec<_>, _>>()?;
        let mut report = SyncReport { files: 0, bytes: 0 };
        for (file, path) in files.iter().zip(paths) {
            let write = Request::new(Method::Put, api::file_path(&metadata.sandbox_id, &path))
                .with_body("application/octet-stream", file.contents.clone());
            self.call(&write)
                .map_err(|e| e.into_provider_error("sync-in"))?;
            report.files += 1;
            report.bytes += file.contents.len() as u64;
        }
        Ok(report)
    }

    /// Reads files out of the sandbox with `GET /files`.
    fn sync_out(
        &mut self,
        lease: &Lease,
        remote_paths: &[String],
    ) -> Result<Vec<FileDownload>, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let paths = remote_paths
            .iter()
            .map(|p| workspace_path(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let read = Request::new(Method::Get, api::file_path(&metadata.sandbox_id, &path));
            let wait = self.op.wait(true);
            let contents = call_bytes(self.op.platform, &read, wait)
                .map_err(|e| e.into_provider_error("sync-out"))?;
            files.push(FileDownload {
                remote_path: path,
                contents,
            });
        }
        Ok(files)
    }

    fn execute(
        &mut self,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let op = &mut self.op;
        execute::execute(op.platform, &op.config, &metadata.sandbox_id, request)
    }

    fn interact(
        &mut self,
        lease: &Lease,
        request: &InteractionRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let op = &mut self.op;
        crate::interact::interact(op.platform, &op.config, &metadata.sandbox_id, request)
    }

    /// `PUT /v1/sandboxes/{id}/egress`; the lease records the new policy.
    fn set_egress(&mut self, lease: &Lease, egress: &Egress) -> Result<Lease, ProviderError> {
        let mut metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let rules = policy::egress_rules(egress)?;
        self.put_egress(&metadata.sandbox_id, rules)?;
        metadata.egress = Some(egress.to_entries());
        Ok(Lease {
            expires_at: lease.expires_at.clone(),
            ..metadata.to_lease()
        })
    }

    /// `POST /v1/sandboxes/{id}/ports/{port}`: its URL, and the token
    /// header each request must carry. Only for a sandbox created with
    /// `ingress_enabled` (config `ingress`), else `unsupported`.
    fn open_port(&mut self, lease: &Lease, port: u16) -> Result<PortEndpoint, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        if !(self.op.config.ingress && metadata.ingress) {
            return Err(ProviderError::Unsupported(
                "ports need ingress: set `ingress: true` in the config; only leases acquired after that can open a port".into(),
            ));
        }
        let open = api::json_request(
            Method::Post,
            format!("{}/ports/{port}", api::sandbox_path(&metadata.sandbox_id)),
            None,
        );
        let data = self
            .call(&open)
            .map_err(|e| e.into_provider_error("open-port"))?;
        let field = |name: &str| {
            http::string_field(&data, name)
                .map(str::to_string)
                .map_err(|e| e.into_provider_error("open-port"))
        };
        let (url, token, header) = (field("url")?, field("token")?, field("token_header")?);
        let header_ok = !header.is_empty()
            && header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !(url.starts_with("http://") || url.starts_with("https://")) || !header_ok {
            return Err(invalid(
                "open-port",
                "the answer has no http(s) url or no valid token header",
            ));
        }
        Ok(PortEndpoint {
            port,
            url,
            headers: vec![(header, token)],
        })
    }

    /// Pauses the sandbox (left paused), then `POST /v1/templates` under
    /// the name bound to this company and environment.
    fn capture_template(
        &mut self,
        lease: &Lease,
        name: &str,
    ) -> Result<TemplateInfo, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx, &self.op.config)?;
        let template_ref = templates::reference(self.op.ctx, name)?;
        let id = &metadata.sandbox_id;
        let data = self
            .get_sandbox(id)
            .map_err(|e| e.into_provider_error("capture-template"))?;
        let status = http::string_field(&data, "status")
            .map_err(|e| e.into_provider_error("capture-template"))?;
        if status != "paused" {
            if status == "running" {
                self.transition(id, "pause", "running")?;
            }
            match self.wait_for_state(id, &["paused"], "capture-template")? {
                State::Reached => {}
                State::Gone(state) | State::Unusable(state) => {
                    return Err(unusable("capture-template", &state, "paused"))
                }
            }
        }
        let create = api::json_request(
            Method::Post,
            "/v1/templates".into(),
            Some(json!({ "name": template_ref, "sandbox_id": id })),
        );
        let data = self
            .call(&create)
            .map_err(|e| e.into_provider_error("capture-template"))?;
        Ok(TemplateInfo {
            name: name.into(),
            template_ref,
            created_at: created_at(&data),
        })
    }

    /// `GET /v1/templates`, only those of this company and environment.
    fn list_templates(&mut self) -> Result<Vec<TemplateInfo>, ProviderError> {
        let list = Request::new(Method::Get, "/v1/templates");
        let wait = self.op.wait(true);
        let data = api::call_data(self.op.platform, &list, wait)
            .map_err(|e| e.into_provider_error("list-templates"))?;
        let Value::Array(items) = data else {
            return Err(invalid("list-templates", "the answer is not a list"));
        };
        let mut out = Vec::new();
        for item in &items {
            let Some(service_name) = item.get("name").and_then(Value::as_str) else {
                return Err(invalid("list-templates", "a template has no name"));
            };
            if let Some(name) = templates::listed_name(self.op.ctx, service_name) {
                out.push(TemplateInfo {
                    name: name.into(),
                    template_ref: service_name.into(),
                    created_at: item.as_object().and_then(created_at),
                });
            }
        }
        Ok(out)
    }

    /// `DELETE /v1/templates/{name}`; 404 is `already-gone`.
    fn delete_template(&mut self, template_ref: &str) -> Result<TemplateDeletion, ProviderError> {
        let delete = Request::new(Method::Delete, format!("/v1/templates/{template_ref}"));
        match self.call(&delete) {
            Ok(_) => Ok(TemplateDeletion::Deleted),
            Err(ApiError::Status(404)) => Ok(TemplateDeletion::AlreadyGone),
            Err(error) => Err(error.into_provider_error("delete-template")),
        }
    }
}

/// A template's `created_at`, when the answer has one.
fn created_at(data: &Map<String, Value>) -> Option<String> {
    data.get("created_at")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl CreateOs<'_> {
    fn call(&mut self, request: &Request) -> Result<Map<String, Value>, ApiError> {
        let wait = self.op.wait(true);
        api::call(self.op.platform, request, wait)
    }

    /// `POST /sandboxes`. The API has no idempotency key, so an answer that
    /// is not a definite rejection or a valid id leaves a sandbox that may
    /// exist and cannot be found: `cleanup-failed` without a sandbox id.
    /// A request that never reached the server is `transport-failed`.
    /// `body` holds the request's own fields (`rootfs`, `template`,
    /// `egress`, ...); with `expires_at` (a backend with `hardExpiry`), also
    /// the expiry its answer attests.
    fn create_sandbox(
        &mut self,
        mut body: Map<String, Value>,
    ) -> Result<(String, Option<String>), ProviderError> {
        let config = &self.op.config;
        body.insert("shape".into(), Value::String(config.shape.clone()));
        body.insert("ingress_enabled".into(), Value::Bool(config.ingress));
        if let Some(region) = &config.region {
            body.insert("region".into(), Value::String(region.clone()));
        }
        let create = api::json_request(
            Method::Post,
            "/v1/sandboxes".into(),
            Some(Value::Object(body)),
        );
        // Not cancellable: once sent, only the answer says whether it exists.
        let wait = self.op.wait(false);
        let answer = api::call(self.op.platform, &create, wait);
        let attested = answer
            .as_ref()
            .ok()
            .and_then(|data| data.get("expires_at")?.as_str())
            .map(str::to_owned);
        let id = created_id(
            answer,
            "id",
            "create-sandbox",
            None,
            CleanupPhase::LeaseSetup,
        )?;
        // Before anything else: a host that dies from here on can still
        // find and delete it.
        self.op.platform.record_sandbox(&id);
        Ok((id, attested))
    }

    /// `PUT /v1/sandboxes/{id}/egress` (`[]` allows everything).
    fn put_egress(&mut self, id: &str, rules: Vec<String>) -> Result<(), ProviderError> {
        let put = api::json_request(
            Method::Put,
            format!("{}/egress", api::sandbox_path(id)),
            Some(json!({ "egress": rules })),
        );
        self.call(&put)
            .map(drop)
            .map_err(|e| e.into_provider_error("set-egress"))
    }

    fn prepare(&mut self, metadata: &LeaseMetadata) -> Result<(), ProviderError> {
        let id = &metadata.sandbox_id;
        match self.wait_for_state(id, &["running"], "wait-running")? {
            State::Reached => {}
            State::Gone(state) | State::Unusable(state) => {
                return Err(invalid(
                    "wait-running",
                    &format!("the sandbox became {state} while starting"),
                ))
            }
        }
        // Writing the marker makes its directory (the Files API creates a
        // file's parents): where that is both the workspace root and the
        // working directory, the one-shot `mkdir` was a command run for
        // nothing (about 5 ms of every acquire on the local engine).
        let marker_dir = MARKER_PATH.rsplit_once('/').map(|(dir, _)| dir);
        let made_by_marker = [&metadata.workspace_root, &metadata.cwd]
            .iter()
            .all(|dir| Some(dir.as_str()) == marker_dir);
        if !made_by_marker {
            self.exec_checked(
                id,
                "/bin/mkdir",
                &["-p", "--", &metadata.workspace_root, &metadata.cwd],
                "create-workspace",
            )?;
        }
        let write = Request::new(Method::Put, api::file_path(id, MARKER_PATH)).with_body(
            "application/octet-stream",
            metadata.marker.clone().into_bytes(),
        );
        self.call(&write)
            .map_err(|e| e.into_provider_error("write-marker"))?;
        Ok(())
    }

    fn probe_run(
        &mut self,
        id: &str,
        marker: &str,
        diagnostics: &mut Vec<String>,
    ) -> Result<String, ProviderError> {
        match self.wait_for_state(id, &["running"], "wait-running")? {
            State::Reached => diagnostics.push("sandbox is running".into()),
            State::Gone(state) | State::Unusable(state) => {
                return Err(invalid(
                    "wait-running",
                    &format!("the sandbox became {state}"),
                ))
            }
        }
        let result = self.exec(id, "/bin/echo", &[marker], "probe-exec")?;
        diagnostics.push(format!("/bin/echo exited {}", result.exit_code));
        Ok(result.stdout)
    }

    fn get_sandbox(&mut self, id: &str) -> Result<Map<String, Value>, ApiError> {
        let get = Request::new(Method::Get, api::sandbox_path(id));
        let data = self.call(&get)?;
        if data.get("id").and_then(Value::as_str) != Some(id) {
            return Err(ApiError::Invalid(
                "the sandbox in the response is another one".into(),
            ));
        }
        Ok(data)
    }

    /// Polls until the sandbox is in one of `wanted`, gone (404, a gone
    /// state) or in an unusable state.
    fn wait_for_state(
        &mut self,
        id: &str,
        wanted: &[&str],
        operation: &str,
    ) -> Result<State, ProviderError> {
        loop {
            let data = match self.get_sandbox(id) {
                Err(ApiError::Status(404)) => return Ok(State::Gone("deleted".into())),
                other => other.map_err(|e| e.into_provider_error(operation))?,
            };
            let status = http::string_field(&data, "status")
                .map_err(|e| e.into_provider_error(operation))?;
            if wanted.contains(&status) {
                return Ok(State::Reached);
            }
            if GONE_STATES.contains(&status) {
                return Ok(State::Gone(status.to_string()));
            }
            if UNUSABLE_STATES.contains(&status) {
                return Ok(State::Unusable(status.to_string()));
            }
            self.op.pause(POLL_INTERVAL_MS, operation)?;
        }
    }

    /// `POST /sandboxes/{id}/{verb}`; a 409 (conflicting state) is re-read by
    /// the caller's wait, unless the sandbox is not in `from` at all.
    fn transition(&mut self, id: &str, verb: &str, from: &str) -> Result<(), ProviderError> {
        let post = api::json_request(
            Method::Post,
            format!("{}/{verb}", api::sandbox_path(id)),
            None,
        );
        match self.call(&post) {
            Ok(_) => Ok(()),
            Err(ApiError::Status(409)) => {
                let data = self
                    .get_sandbox(id)
                    .map_err(|e| e.into_provider_error(verb))?;
                let status =
                    http::string_field(&data, "status").map_err(|e| e.into_provider_error(verb))?;
                if status == from {
                    Err(ApiError::Status(409).into_provider_error(verb))
                } else {
                    Ok(())
                }
            }
            Err(error) => Err(error.into_provider_error(verb)),
        }
    }

    fn exec(
        &mut self,
        id: &str,
        cmd: &str,
        args: &[&str],
        operation: &str,
    ) -> Result<ExecOutput, ProviderError> {
        let exec = api::json_request(
            Method::Post,
            format!("{}/exec", api::sandbox_path(id)),
            Some(json!({ "cmd": cmd, "args": args })),
        );
        let data = self
            .call(&exec)
            .map_err(|e| e.into_provider_error(operation))?;
        let result = data
            .get("result")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(operation, "the response has no `result` object"))?;
        let exit_code = result
            .get("exit_code")
            .and_then(Value::as_i64)
            .ok_or_else(|| invalid(operation, "the result has no integer `exit_code`"))?;
        let stdout = result
            .get("stdout")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Ok(ExecOutput { exit_code, stdout })
    }

    fn exec_checked(
        &mut self,
        id: &str,
        cmd: &str,
        args: &[&str],
        operation: &str,
    ) -> Result<(), ProviderError> {
        let result = self.exec(id, cmd, args, operation)?;
        if result.exit_code == 0 {
            Ok(())
        } else {
            Err(invalid(
                operation,
                &format!("{cmd} exited {}", result.exit_code),
            ))
        }
    }
}

impl DeleteSandbox for CreateOs<'_> {
    /// `DELETE /sandboxes/{id}` with a fresh deadline, not cancellable.
    fn delete_sandbox(&mut self, id: &str) -> Result<TerminationAction, CleanupCause> {
        let delete = Request::new(Method::Delete, api::sandbox_path(id));
        let wait = self.op.cleanup_wait();
        match api::call(self.op.platform, &delete, wait) {
            Ok(_) => Ok(TerminationAction::Deleted),
            Err(ApiError::Status(404)) => Ok(TerminationAction::AlreadyGone),
            Err(error) => Err(cleanup_cause(error)),
        }
    }
}

/// The state a wait ended in.
enum State {
    /// One of the wanted states.
    Reached,
    /// Proven gone: deleted (404), `destroyed` or `failed`.
    Gone(String),
    /// Not usable, but it may still exist: `error` or `destroying`.
    Unusable(String),
}

struct ExecOutput {
    exit_code: i64,
    stdout: String,
}

/// Resolves a requested directory inside the workspace: relative paths go
/// under the workspace root; `..`, NUL and empty paths are refused.
pub fn workspace_path(path: &str) -> Result<String, ProviderError> {
    if path.is_empty() || path.contains('\0') || path.split('/').any(|part| part == "..") {
        return Err(ProviderError::InvalidRequest(
            "the workspace path must be non-empty, without `..` or NUL".into(),
        ));
    }
    Ok(if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKSPACE_ROOT}/{path}")
    })
}

fn expired(reason: &str) -> ResumeOutcome {
    ResumeOutcome::Expired(reason.to_string())
}

/// A sandbox in a state that neither allows the operation nor proves it
/// gone: the sandbox may still exist, so only destroying the lease ends it.
fn unusable(operation: &str, state: &str, wanted: &str) -> ProviderError {
    invalid(
        operation,
        &format!(
            "the sandbox is in state `{state}` and cannot be {wanted}; it may still exist: destroy the lease"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ok;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::export::run;
    use provider_sdk::testing::{context, Answer, FakePlatform};
    use provider_sdk::types::{EgressPolicy, EnvironmentContext};
    use wasm_bindgen_test::wasm_bindgen_test;

    const LOCAL: &str = r#""apiUrl":"http://127.0.0.1:9""#;

    fn ctx(fields: &str) -> EnvironmentContext {
        context(&format!("{{{LOCAL}{fields}}}"))
    }

    fn request() -> AcquireRequest {
        provider_sdk::testing::acquire_request("run")
    }

    fn silent() -> FakePlatform {
        FakePlatform::new(|_| -> Answer { panic!("no request expected") })
    }

    /// A lease as acquire writes it under `ctx`, changed by `edit`.
    fn lease(ctx: &EnvironmentContext, edit: impl FnOnce(&mut LeaseMetadata)) -> Lease {
        let config = Config::parse(&ctx.config).unwrap();
        let mut metadata = LeaseMetadata {
            provider: lease::PROVIDER.into(),
            sandbox_id: "sb".into(),
            environment_id: ctx.environment_id.clone(),
            api_origin: config.api_origin.clone(),
            shape: config.shape.clone(),
            rootfs: None,
            region: None,
            workspace_root: WORKSPACE_ROOT.into(),
            cwd: WORKSPACE_ROOT.into(),
            marker: "m".into(),
            reusable: true,
            adapter_type: None,
            image_asked: false,
            template: None,
            egress: None,
            base_egress: config.egress_allowlist_entries(),
            auto_pause_after_seconds: None,
            ingress: config.ingress,
        };
        edit(&mut metadata);
        metadata.to_lease()
    }

    fn body(request: &Request) -> Value {
        serde_json::from_slice(&request.body.as_ref().unwrap().1).unwrap()
    }

    /// What CreateOS cannot carry, or what this lease cannot do, is refused
    /// before any request.
    #[wasm_bindgen_test(unsupported = test)]
    fn refusals_come_before_any_request() {
        let mut platform = silent();
        let plain = ctx("");
        let block_all = AcquireRequest {
            egress: Some(EgressPolicy::BlockAll),
            ..request()
        };
        let result = run(&mut platform, &plain, |p: &mut CreateOs| {
            p.acquire_lease(&block_all)
        });
        assert!(matches!(result, Err(ProviderError::Unsupported(m)) if m.contains("deny-all")));
        let lease = lease(&plain, |_| {});
        let result = run(&mut platform, &plain, |p: &mut CreateOs| {
            p.set_egress(&lease, &Egress::BlockAll)
        });
        assert!(matches!(result, Err(ProviderError::Unsupported(_))));
        // Ports need the config's ingress and a lease made with it.
        let result = run(&mut platform, &plain, |p: &mut CreateOs| {
            p.open_port(&lease, 80)
        });
        assert!(matches!(result, Err(ProviderError::Unsupported(m)) if m.contains("ingress")));
        let ingress = ctx(r#","ingress":true"#);
        let old_lease = self::lease(&ingress, |m| m.ingress = false);
        let result = run(&mut platform, &ingress, |p: &mut CreateOs| {
            p.open_port(&old_lease, 80)
        });
        assert!(matches!(result, Err(ProviderError::Unsupported(_))));
        assert!(platform.requests.is_empty());
    }

    /// A changed image for the lease's adapter or a changed base egress
    /// list expires the lease before any request that could wake it.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_changed_image_or_base_list_expires_the_lease_before_any_request() {
        let mut platform = silent();
        let before =
            ctx(r#","rootfsByAdapter":{"claude_local":"one"},"egressAllowlist":["a.com"]"#);
        let leased = lease(&before, |m| {
            m.adapter_type = Some("claude_local".into());
            m.rootfs = Some("one".into());
        });
        for (after, says) in [
            (
                r#","rootfsByAdapter":{"claude_local":"two"},"egressAllowlist":["a.com"]"#,
                "image",
            ),
            (
                r#","rootfsByAdapter":{"claude_local":"one"},"egressAllowlist":["b.com"]"#,
                "egressAllowlist",
            ),
            (
                r#","rootfsByAdapter":{"claude_local":"one"}"#,
                "egressAllowlist",
            ),
        ] {
            let after = ctx(after);
            let outcome = run(&mut platform, &after, |p: &mut CreateOs| {
                p.resume_lease(&leased)
            });
            match outcome {
                Ok(ResumeOutcome::Expired(reason)) => assert!(reason.contains(says), "{reason}"),
                other => panic!("{:?}", other.err()),
            }
        }
        assert!(platform.requests.is_empty());
    }

    /// Acquire sends the policy: the request's egress list, the image for
    /// the adapter, the idle window and ingress; the lease records them.
    #[wasm_bindgen_test(unsupported = test)]
    fn acquire_sends_and_records_the_policy() {
        let mut platform = FakePlatform::new(|req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes") => ok(json!({"id": "sb", "status": "creating"})),
            (Method::Get, "/v1/sandboxes/sb") => ok(json!({"id": "sb", "status": "running"})),
            (Method::Post, "/v1/sandboxes/sb/exec") => {
                ok(json!({"result": {"exit_code": 0, "stdout": ""}}))
            }
            _ => ok(json!({})),
        });
        let ctx = ctx(
            r#","rootfs":"base","rootfsByAdapter":{"claude_local":"claude"},"egressAllowlist":["base.com"],"autoPauseAfterSeconds":120,"ingress":true,"reuseLease":true"#,
        );
        let asked = AcquireRequest {
            egress: Some(EgressPolicy::Allow(vec![
                " A.com:443".into(),
                "10.0.0.0/8".into(),
            ])),
            adapter_type: Some("claude_local".into()),
            ..request()
        };
        let lease = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.acquire_lease(&asked)
        })
        .unwrap();
        let create = &platform.requests[0].0;
        assert_eq!(
            body(create),
            json!({
                "shape": "s-1vcpu-1gb",
                "ingress_enabled": true,
                "rootfs": "claude",
                "egress": ["a.com:443", "10.0.0.0/8"],
                "auto_pause_after_seconds": 120,
            })
        );
        let metadata: LeaseMetadata = serde_json::from_str(&lease.metadata).unwrap();
        assert_eq!(metadata.rootfs.as_deref(), Some("claude"));
        assert_eq!(
            metadata.egress,
            Some(vec!["a.com:443".to_string(), "10.0.0.0/8".to_string()])
        );
        assert_eq!(metadata.base_egress, Some(vec!["base.com".to_string()]));
        assert_eq!(metadata.auto_pause_after_seconds, Some(120));
        assert!(metadata.ingress && !metadata.image_asked);

        // No policy of its own: the config's base list; a template: no rootfs.
        let mut platform = FakePlatform::new(|req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes") => ok(json!({"id": "sb", "status": "running"})),
            (Method::Get, "/v1/sandboxes/sb") => ok(json!({"id": "sb", "status": "running"})),
            (Method::Post, "/v1/sandboxes/sb/exec") => {
                ok(json!({"result": {"exit_code": 0, "stdout": ""}}))
            }
            _ => ok(json!({})),
        });
        let template = AcquireRequest {
            template: Some(templates::reference(&ctx, "setup").unwrap()),
            ..request()
        };
        run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.acquire_lease(&template)
        })
        .unwrap();
        let sent = body(&platform.requests[0].0);
        assert_eq!(sent["egress"], json!(["base.com"]));
        assert_eq!(
            sent["template"],
            json!(templates::reference(&ctx, "setup").unwrap())
        );
        assert!(sent.get("rootfs").is_none());
    }

    /// Resume puts the lease's egress back before the sandbox is resumed.
    #[wasm_bindgen_test(unsupported = test)]
    fn resume_reapplies_the_egress_before_waking_the_sandbox() {
        let paused = std::rc::Rc::new(std::cell::Cell::new(true));
        let state = paused.clone();
        let mut platform = FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Get, "/v1/sandboxes/sb") => {
                let status = if state.get() { "paused" } else { "running" };
                ok(json!({"id": "sb", "status": status}))
            }
            (Method::Post, "/v1/sandboxes/sb/resume") => {
                state.set(false);
                ok(json!({"status": "resuming"}))
            }
            (Method::Get, p) if p.starts_with("/v1/sandboxes/sb/files") => {
                Answer::Full(200, b"m".to_vec())
            }
            _ => ok(json!({})),
        });
        let ctx = ctx("");
        let leased = lease(&ctx, |m| m.egress = Some(vec!["a.com".into()]));
        let outcome = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.resume_lease(&leased)
        })
        .unwrap();
        assert!(matches!(outcome, ResumeOutcome::Resumed(_)));
        let calls = platform.calls();
        let put = calls
            .iter()
            .position(|c| c == "PUT /V1/SANDBOXES/SB/EGRESS")
            .unwrap();
        let resume = calls
            .iter()
            .position(|c| c == "POST /V1/SANDBOXES/SB/RESUME")
            .unwrap();
        assert!(put < resume, "{calls:?}");
        assert_eq!(
            body(&platform.requests[put].0),
            json!({"egress": ["a.com"]})
        );
    }

    /// With an idle window the sandbox is left running (`idle-pause`) when
    /// the service says it has that window; otherwise it is paused now.
    #[wasm_bindgen_test(unsupported = test)]
    fn release_leaves_an_idle_window_to_the_service() {
        let ctx = ctx(r#","reuseLease":true,"autoPauseAfterSeconds":60"#);
        let leased = lease(&ctx, |m| m.auto_pause_after_seconds = Some(60));
        let mut platform = FakePlatform::new(|_| {
            ok(json!({"id": "sb", "status": "running", "auto_pause_after_seconds": 60}))
        });
        let receipt = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.release_lease(&leased)
        })
        .unwrap();
        assert_eq!(receipt.action, TerminationAction::IdlePause);
        assert_eq!(platform.calls(), ["GET /V1/SANDBOXES/SB"]);
        // The service does not say it has the window: paused at once.
        let paused = std::rc::Rc::new(std::cell::Cell::new(false));
        let state = paused.clone();
        let mut platform = FakePlatform::new(move |req| match req.method {
            Method::Post => {
                state.set(true);
                ok(json!({"status": "pausing"}))
            }
            _ => {
                let status = if state.get() { "paused" } else { "running" };
                ok(json!({"id": "sb", "status": status, "auto_pause_after_seconds": null}))
            }
        });
        let receipt = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.release_lease(&leased)
        })
        .unwrap();
        assert_eq!(receipt.action, TerminationAction::Paused);
    }

    /// Templates: captured under the scoped name after a pause, listed
    /// only for this company and environment, a 404 delete is already gone.
    #[wasm_bindgen_test(unsupported = test)]
    fn templates_are_scoped_to_the_company_and_environment() {
        let ctx = ctx("");
        let mine = templates::reference(&ctx, "setup").unwrap();
        let other = templates::reference(
            &EnvironmentContext {
                environment_id: "other".into(),
                ..ctx.clone()
            },
            "setup",
        )
        .unwrap();
        let (listed_mine, listed_other) = (mine.clone(), other.clone());
        let mut platform = FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Get, "/v1/templates") => ok_list(json!([
                {"name": listed_other, "created_at": "2026-12-07T00:00:00Z"},
                {"name": listed_mine, "created_at": "2026-12-07T00:00:01Z"},
                {"name": "unscoped"},
            ])),
            (Method::Get, "/v1/sandboxes/sb") => ok(json!({"id": "sb", "status": "paused"})),
            (Method::Delete, _) => Answer::Full(404, b"{}".to_vec()),
            _ => ok(json!({"name": "x", "sandbox_id": "sb"})),
        });
        let list = run(&mut platform, &ctx, |p: &mut CreateOs| p.list_templates()).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(
            (list[0].name.as_str(), &list[0].template_ref),
            ("setup", &mine)
        );
        let leased = lease(&ctx, |_| {});
        let info = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.capture_template(&leased, "setup")
        })
        .unwrap();
        assert_eq!(info.template_ref, mine);
        let sent = body(&platform.requests.last().unwrap().0);
        assert_eq!(sent, json!({"name": mine, "sandbox_id": "sb"}));
        let deleted = run(&mut platform, &ctx, |p: &mut CreateOs| {
            p.delete_template(&mine)
        })
        .unwrap();
        assert_eq!(deleted, TemplateDeletion::AlreadyGone);
    }

    fn ok_list(data: Value) -> Answer {
        Answer::Full(
            200,
            json!({"status": "success", "data": data})
                .to_string()
                .into_bytes(),
        )
    }
}
