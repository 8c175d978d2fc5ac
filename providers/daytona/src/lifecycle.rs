//! The provider's operations on Daytona ([`Daytona`], the SDK's
//! `Provider`): acquire (create, wait until `started`, workspace), resume
//! (start a stopped sandbox), release (stop or delete), destroy, probe,
//! realize and execute (the command itself runs in [`crate::execute`]).
//!
//! State changes are observed by polling `GET /sandbox/{id}` every 250 ms,
//! bounded by the operation's deadline (the config's `timeoutMs`). Only a
//! 404 or the `destroyed` state prove a sandbox gone.

use crate::api::{self, Face};
use crate::config::Config;
use crate::execute;
use crate::lease::{self, LeaseMetadata, ENVIRONMENT_LABEL, MARKER_LABEL, PROVIDER};
use crate::policy::{self, Network};
use crate::snapshots;
use provider_sdk::acquire::AcquirePolicy;
use provider_sdk::egress::Egress;
use provider_sdk::errors::{
    cleanup_cause, encode_query_value, invalid_response as invalid, probe_report, receipt,
    ApiError, DeleteSandbox,
};
use provider_sdk::http;
use provider_sdk::platform::{random_hex, Method, Wait, MS};
use provider_sdk::templates;
use provider_sdk::types::{
    AcquireRequest, CleanupCause, CleanupPhase, ExecuteRequest, ExecuteResult, InteractionRequest,
    Lease, PortEndpoint, ProbeReport, ProviderDescription, ProviderError, ResumeOutcome,
    TemplateDeletion, TemplateInfo, TerminationAction, TerminationReceipt, WorkspaceRequest,
};
use provider_sdk::{Operation, Provider};
use serde_json::{json, Map, Value};

/// The header a preview URL's token travels in.
pub const PREVIEW_TOKEN_HEADER: &str = "X-Daytona-Preview-Token";

/// How often a state change is polled.
pub const POLL_INTERVAL_MS: u64 = 250;

/// States from which a sandbox becomes `started` by itself.
const STARTING_STATES: &[&str] = &[
    "creating",
    "restoring",
    "starting",
    "pending_build",
    "building_snapshot",
    "pulling_snapshot",
    "unknown",
];

/// States of an operation under way (stop, archive, pause, resume, resize,
/// snapshot, fork) after which the sandbox settles by itself: waited
/// through, never taken for a final answer.
const BUSY_STATES: &[&str] = &[
    "stopping",
    "archiving",
    "pausing",
    "paused",
    "resuming",
    "resizing",
    "snapshotting",
    "forking",
];

/// States from which a sandbox returns to `started` by itself after an
/// operation on it (resume waits through them).
const RETURNING_STATES: &[&str] = &["resuming", "resizing", "snapshotting", "forking"];

/// The Daytona provider: one operation's state (its budget the config's
/// `timeoutMs`).
///
/// The state, its `new` and `describe` have the shape of every provider's
/// (the SDK's `Provider`): alike in both providers, nothing left to share.
pub struct Daytona<'a> {
    op: Operation<'a, Config>,
}

provider_sdk::export_provider!(Daytona);

impl<'a> Provider<'a> for Daytona<'a> {
    type Config = Config;

    fn new(op: Operation<'a, Config>) -> Daytona<'a> {
        Daytona { op }
    }

    fn describe() -> ProviderDescription {
        crate::describe::description()
    }

    /// Creates a sandbox, runs `echo <marker>` in it (one-shot
    /// `process/execute`), and always deletes it.
    fn probe(&mut self) -> Result<ProbeReport, ProviderError> {
        let marker = random_hex(self.op.platform, 8);
        let mut body = Map::new();
        if let Some(snapshot) = &self.op.config.snapshot {
            body.insert("snapshot".into(), Value::String(snapshot.clone()));
        }
        let id = self.create_sandbox(&marker, body)?;
        let mut diagnostics = vec![format!("created sandbox {id}")];
        let outcome = self.probe_run(&id, &marker, &mut diagnostics);
        self.destroy_sandbox(&id)?;
        diagnostics.push(format!("deleted sandbox {id}"));
        let ok = outcome?;
        let origin = &self.op.config.api.origin;
        Ok(probe_report(ok, "Daytona", origin, diagnostics))
    }

    /// Creates a sandbox labelled for this lease, waits until it is
    /// `started` and prepares the workspace. A setup failure deletes the
    /// sandbox (or raises `cleanup-failed` when that delete fails).
    fn acquire_lease(&mut self, request: &AcquireRequest) -> Result<Lease, ProviderError> {
        if request.requested_expires_at.is_some() {
            return Err(ProviderError::Unsupported(
                "Daytona leases have no expiry; leave requested-expires-at unset".into(),
            ));
        }
        let start = policy::start(&self.op.config, &AcquirePolicy::of(self.op.ctx, request)?)?;
        let mut body = Map::new();
        if let Some(snapshot) = &start.snapshot {
            body.insert("snapshot".into(), Value::String(snapshot.clone()));
        }
        if let Some(network) = &start.network {
            network.create_fields(&mut body);
        }
        let marker = random_hex(self.op.platform, 16);
        let sandbox_id = self.create_sandbox(&marker, body)?;
        let setup = self
            .wait_for(&sandbox_id, "started")
            .and_then(|()| self.workspace(&sandbox_id, request.requested_cwd.as_deref()));
        match setup {
            Ok((workspace, cwd)) => {
                let metadata = LeaseMetadata {
                    provider: PROVIDER.into(),
                    sandbox_id: sandbox_id.clone(),
                    environment_id: self.op.ctx.environment_id.clone(),
                    company_id: self.op.ctx.company_id.clone(),
                    marker,
                    cwd,
                    workspace: Some(workspace),
                    snapshot: start.snapshot,
                    adapter_type: request.adapter_type.clone(),
                    image_asked: start.image_asked,
                    egress: start.egress.as_ref().map(Egress::to_entries),
                    base_egress: self.op.config.egress_allowlist_entries(),
                };
                Ok(Lease {
                    provider_lease_id: sandbox_id,
                    metadata: metadata.to_json(),
                    expires_at: None,
                })
            }
            Err(error) => Err(self.undo_sandbox(error, &sandbox_id, CleanupPhase::LeaseSetup)),
        }
    }

    /// Resumes a released lease: a `stopped` sandbox is started. `expired`
    /// only with proof: gone (404, `destroyed`), not the leased one (its
    /// marker label differs), or no longer what the config asks for
    /// (snapshot, target). States that prove nothing are errors.
    fn resume_lease(&mut self, lease: &Lease) -> Result<ResumeOutcome, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let id = metadata.sandbox_id.clone();
        // A changed image or base egress list in the config expires the
        // lease before any request.
        let config = &self.op.config;
        let snapshot = if metadata.image_asked {
            metadata.snapshot.as_deref()
        } else {
            config.snapshot_for(metadata.adapter_type.as_deref())
        };
        if metadata.snapshot.as_deref() != snapshot {
            return Ok(ResumeOutcome::Expired(
                "the config's snapshot for this lease is not the one the sandbox was created from"
                    .into(),
            ));
        }
        if metadata.base_egress != config.egress_allowlist_entries() {
            return Ok(ResumeOutcome::Expired(
                "the config's egressAllowlist is not the one the sandbox was created with".into(),
            ));
        }
        let network = match &metadata.egress {
            None => None,
            Some(kept) => match Egress::from_entries(kept) {
                Some(egress) => Some(Network::of(&egress)?),
                None => {
                    return Err(ProviderError::ForeignLease(
                        "the lease's egress policy is not one this provider wrote".into(),
                    ))
                }
            },
        };
        let Some(data) = self.sandbox(&id)? else {
            return Ok(ResumeOutcome::Expired(
                "the sandbox no longer exists".into(),
            ));
        };
        let labels = data.get("labels").and_then(Value::as_object);
        if labels
            .and_then(|l| l.get(MARKER_LABEL))
            .and_then(Value::as_str)
            != Some(metadata.marker.as_str())
        {
            return Ok(ResumeOutcome::Expired(
                "the sandbox is not the leased one (its lease label differs)".into(),
            ));
        }
        for (field, wanted) in [
            ("snapshot", &metadata.snapshot),
            ("target", &self.op.config.target),
        ] {
            if let Some(wanted) = wanted {
                if data.get(field).and_then(Value::as_str) != Some(wanted.as_str()) {
                    return Ok(ResumeOutcome::Expired(format!(
                        "the sandbox's {field} is not the one the config asks for"
                    )));
                }
            }
        }
        // The lease's policy again, before the sandbox runs anything.
        if let Some(network) = network {
            self.network_settings(&id, &network)?;
        }
        match state_of(&data).unwrap_or("unknown") {
            "started" => {}
            "stopped" | "archived" => {
                self.call(
                    Face::Api,
                    Method::Post,
                    &format!("{}/start", api::sandbox_path(&id)),
                    None,
                )
                .map_err(|e| e.into_provider_error("start-sandbox"))?;
                self.wait_for(&id, "started")?;
            }
            state if STARTING_STATES.contains(&state) || RETURNING_STATES.contains(&state) => {
                self.wait_for(&id, "started")?
            }
            state => {
                return Err(invalid(
                    "resume",
                    &format!("the sandbox is `{}`; destroy the lease", printable(state)),
                ))
            }
        }
        Ok(ResumeOutcome::Resumed(lease.clone()))
    }

    /// `POST /sandbox/{id}/network-settings` with all three fields; the
    /// lease records the new policy.
    fn set_egress(&mut self, lease: &Lease, egress: &Egress) -> Result<Lease, ProviderError> {
        let mut metadata = lease::check(lease, self.op.ctx)?;
        let network = Network::of(egress)?;
        self.network_settings(&metadata.sandbox_id, &network)?;
        metadata.egress = Some(egress.to_entries());
        Ok(Lease {
            metadata: metadata.to_json(),
            ..lease.clone()
        })
    }

    /// `GET /sandbox/{id}/ports/{port}/preview-url`: the URL, and the
    /// token in `X-Daytona-Preview-Token` (the sandboxes are never
    /// `public`).
    fn open_port(&mut self, lease: &Lease, port: u16) -> Result<PortEndpoint, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let path = format!(
            "{}/ports/{port}/preview-url",
            api::sandbox_path(&metadata.sandbox_id)
        );
        let data = self
            .call(Face::Api, Method::Get, &path, None)
            .and_then(http::object)
            .map_err(|e| e.into_provider_error("open-port"))?;
        let field = |name: &str| {
            http::string_field(&data, name)
                .map(str::to_string)
                .map_err(|e| e.into_provider_error("open-port"))
        };
        let (url, token) = (field("url")?, field("token")?);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid("open-port", "the preview URL is not http(s)"));
        }
        Ok(PortEndpoint {
            port,
            url,
            headers: vec![(PREVIEW_TOKEN_HEADER.into(), token)],
        })
    }

    /// Stops the sandbox (left stopped), then `POST /sandbox/{id}/snapshot`
    /// under the name bound to this company and environment.
    fn capture_template(
        &mut self,
        lease: &Lease,
        name: &str,
    ) -> Result<TemplateInfo, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let template_ref = templates::reference(self.op.ctx, name)?;
        let id = &metadata.sandbox_id;
        if self.sandbox(id)?.as_ref().and_then(state_of) != Some("stopped") {
            self.call(
                Face::Api,
                Method::Post,
                &format!("{}/stop", api::sandbox_path(id)),
                None,
            )
            .map_err(|e| e.into_provider_error("capture-template"))?;
            self.wait_for(id, "stopped")?;
        }
        self.call(
            Face::Api,
            Method::Post,
            &format!("{}/snapshot", api::sandbox_path(id)),
            Some(json!({ "name": template_ref })),
        )
        .map_err(|e| e.into_provider_error("capture-template"))?;
        Ok(TemplateInfo {
            name: name.into(),
            template_ref,
            created_at: None,
        })
    }

    /// `GET /snapshots`, page after page ([`crate::snapshots`]): the
    /// snapshots of this company and environment, oldest first.
    fn list_templates(&mut self) -> Result<Vec<TemplateInfo>, ProviderError> {
        let scope = templates::scope(self.op.ctx);
        let mut listed = Vec::new();
        for page in 1..=snapshots::MAX_PAGES {
            let found = self
                .call(
                    Face::Api,
                    Method::Get,
                    &snapshots::page_path(&scope, page),
                    None,
                )
                .and_then(|answer| snapshots::read_page(self.op.ctx, page, answer))
                .map_err(|e| e.into_provider_error("list-templates"))?;
            snapshots::add_page(&mut listed, found.templates);
            if !found.more {
                return Ok(listed);
            }
        }
        Err(invalid(
            "list-templates",
            &format!(
                "the snapshot list goes on past {} pages of {}",
                snapshots::MAX_PAGES,
                snapshots::PAGE_SIZE
            ),
        ))
    }

    /// `GET /snapshots/{name}` for the snapshot's id, then `DELETE
    /// /snapshots/{id}` (the service deletes by id; a name there is a 404
    /// that would read as `already-gone` while the snapshot stays). A 404
    /// at either step is `already-gone`.
    fn delete_template(&mut self, template_ref: &str) -> Result<TemplateDeletion, ProviderError> {
        let found = self
            .call(
                Face::Api,
                Method::Get,
                &format!("/snapshots/{template_ref}"),
                None,
            )
            .and_then(http::object)
            .and_then(|snapshot| http::id_field(&snapshot, "id"));
        let id = match found {
            Ok(id) => id,
            Err(ApiError::Status(404)) => return Ok(TemplateDeletion::AlreadyGone),
            Err(error) => return Err(error.into_provider_error("delete-template")),
        };
        match self.call(Face::Api, Method::Delete, &format!("/snapshots/{id}"), None) {
            Ok(_) => Ok(TemplateDeletion::Deleted),
            Err(ApiError::Status(404)) => Ok(TemplateDeletion::AlreadyGone),
            Err(error) => Err(error.into_provider_error("delete-template")),
        }
    }

    /// Stops a reusable lease (`paused`), or deletes it otherwise.
    /// `already-gone` only on a 404 or `destroyed`.
    fn release_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let id = metadata.sandbox_id;
        if !self.op.config.reuse_lease {
            return self.destroy_sandbox(&id);
        }
        let stop = api::request(
            &self.op.config,
            Face::Api,
            Method::Post,
            &format!("{}/stop", api::sandbox_path(&id)),
            None,
        );
        let wait = self.op.wait(false);
        match api::call(self.op.platform, &stop, wait) {
            Ok(_) => {}
            Err(ApiError::Status(404)) => return Ok(receipt(&id, TerminationAction::AlreadyGone)),
            Err(error) => return Err(error.into_provider_error("stop-sandbox")),
        }
        match self.sandbox(&id)? {
            None => Ok(receipt(&id, TerminationAction::AlreadyGone)),
            Some(_) => {
                self.wait_for(&id, "stopped")?;
                Ok(receipt(&id, TerminationAction::Paused))
            }
        }
    }

    /// Deletes the lease's sandbox; one already gone is success.
    fn destroy_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        let id = lease::sandbox_for_destroy(lease, self.op.ctx)?;
        self.destroy_sandbox(&id)
    }

    /// Makes sure `remote-path` (relative to the workspace root, or
    /// absolute) exists and returns it.
    fn realize_workspace(
        &mut self,
        lease: &Lease,
        request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let path = match &request.remote_path {
            Some(path) => resolve_path(&metadata.workspace_root(), path)?,
            None => metadata.cwd.clone(),
        };
        self.make_dir(&metadata.sandbox_id, &path)?;
        Ok(path)
    }

    fn execute(
        &mut self,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let mut request = request.clone();
        request.cwd = Some(match &request.cwd {
            None => metadata.cwd.clone(),
            Some(cwd) => resolve_path(&metadata.workspace_root(), cwd)?,
        });
        let op = &mut self.op;
        execute::execute(op.platform, &op.config, &metadata.sandbox_id, &request)
    }

    fn interact(
        &mut self,
        lease: &Lease,
        request: &InteractionRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, self.op.ctx)?;
        let mut request = request.clone();
        request.cwd = Some(match &request.cwd {
            None => metadata.cwd.clone(),
            Some(cwd) => resolve_path(&metadata.workspace_root(), cwd)?,
        });
        let op = &mut self.op;
        crate::interact::interact(op.platform, &op.config, &metadata.sandbox_id, &request)
    }
}

impl Daytona<'_> {
    fn call(
        &mut self,
        face: Face,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let request = api::request(&self.op.config, face, method, path, body);
        let wait = self.op.wait(true);
        api::call(self.op.platform, &request, wait)
    }

    /// `POST /sandbox`. Any outcome but a definite rejection, a request
    /// that never reached the server, or a valid id leaves a sandbox that
    /// may exist and cannot be found: `cleanup-failed` without an id. The
    /// id is reported to the host (`record-sandbox`) before anything else.
    fn create_sandbox(
        &mut self,
        marker: &str,
        mut body: Map<String, Value>,
    ) -> Result<String, ProviderError> {
        let mut labels = Map::new();
        labels.insert(
            ENVIRONMENT_LABEL.into(),
            Value::String(self.op.ctx.environment_id.clone()),
        );
        labels.insert(MARKER_LABEL.into(), Value::String(marker.into()));
        body.insert("labels".into(), Value::Object(labels));
        // Never stopped, archived or deleted behind the lease's back.
        body.insert("autoStopInterval".into(), json!(0));
        body.insert("autoArchiveInterval".into(), json!(0));
        body.insert("autoDeleteInterval".into(), json!(-1));
        if let Some(target) = &self.op.config.target {
            body.insert("target".into(), Value::String(target.clone()));
        }
        let body = Value::Object(body);
        let create = api::request(
            &self.op.config,
            Face::Api,
            Method::Post,
            "/sandbox",
            Some(body),
        );
        // Not cancellable: once sent, only the answer says whether it exists.
        let wait = self.op.wait(false);
        let unconfirmed = |error: ApiError| {
            error.into_creation_error("create-sandbox", None, CleanupPhase::LeaseSetup)
        };
        let data = api::call_object(self.op.platform, &create, wait).map_err(unconfirmed)?;
        let id = http::id_field(&data, "id").map_err(unconfirmed)?;
        self.op.platform.record_sandbox(&id);
        if let Err(error) = self.check_toolbox(&data) {
            return Err(self.undo_sandbox(error, &id, CleanupPhase::LeaseSetup));
        }
        Ok(id)
    }

    /// The toolbox the API names for a sandbox must be the configured one:
    /// the host allows only the configured origins, so a sandbox whose
    /// toolbox lives elsewhere cannot be used (set `toolboxUrl` to it).
    fn check_toolbox(&self, data: &Map<String, Value>) -> Result<(), ProviderError> {
        let Some(url) = data.get("toolboxProxyUrl").and_then(Value::as_str) else {
            return Ok(());
        };
        match provider_sdk::origin::split_url(url) {
            Ok((origin, path))
                if origin == self.op.config.toolbox.origin
                    && path == self.op.config.toolbox.path =>
            {
                Ok(())
            }
            _ => Err(invalid(
                "create-sandbox",
                "the API names a toolbox proxy other than the configured `toolboxUrl`; \
                 set `toolboxUrl` to the sandbox's toolboxProxyUrl",
            )),
        }
    }

    /// `GET /sandbox/{id}`: the sandbox, or `None` when it is gone (404 or
    /// `destroyed`).
    fn sandbox(&mut self, id: &str) -> Result<Option<Map<String, Value>>, ProviderError> {
        match self.call(Face::Api, Method::Get, &api::sandbox_path(id), None) {
            Ok(Value::Object(data)) => {
                if state_of(&data) == Some("destroyed") {
                    Ok(None)
                } else {
                    Ok(Some(data))
                }
            }
            Ok(_) => Err(invalid("get-sandbox", "the sandbox is not a JSON object")),
            Err(ApiError::Status(404)) => Ok(None),
            Err(error) => Err(error.into_provider_error("get-sandbox")),
        }
    }

    /// `POST /sandbox/{id}/network-settings`.
    fn network_settings(&mut self, id: &str, network: &Network) -> Result<(), ProviderError> {
        self.call(
            Face::Api,
            Method::Post,
            &format!("{}/network-settings", api::sandbox_path(id)),
            Some(network.settings()),
        )
        .map(drop)
        .map_err(|e| e.into_provider_error("set-egress"))
    }

    /// Polls until the sandbox is in `wanted`.
    fn wait_for(&mut self, id: &str, wanted: &str) -> Result<(), ProviderError> {
        loop {
            let Some(data) = self.sandbox(id)? else {
                return Err(invalid("wait-sandbox", "the sandbox disappeared"));
            };
            let state = state_of(&data).unwrap_or("unknown");
            if state == wanted {
                return Ok(());
            }
            let transitional = STARTING_STATES.contains(&state)
                || BUSY_STATES.contains(&state)
                || (wanted == "stopped" && state == "started");
            if !transitional {
                return Err(invalid(
                    "wait-sandbox",
                    &format!("the sandbox is `{}`, not `{wanted}`", printable(state)),
                ));
            }
            self.op.pause(POLL_INTERVAL_MS, "wait-sandbox")?;
        }
    }

    /// Creates the workspace root `{home}/paperclip-workspace` and the
    /// requested cwd (relative to that root, or absolute); returns both.
    fn workspace(
        &mut self,
        id: &str,
        cwd: Option<&str>,
    ) -> Result<(String, String), ProviderError> {
        let home = match self.call(
            Face::Toolbox,
            Method::Get,
            &format!("/{id}/user-home-dir"),
            None,
        ) {
            Ok(Value::Object(data)) => http::string_field(&data, "dir")
                .map(|d| d.trim_end_matches('/').to_string())
                .map_err(|e| e.into_provider_error("home-dir"))?,
            Ok(_) => return Err(invalid("home-dir", "the answer is not a JSON object")),
            Err(error) => return Err(error.into_provider_error("home-dir")),
        };
        if !home.starts_with('/') {
            return Err(invalid(
                "home-dir",
                "the home directory is not an absolute path",
            ));
        }
        let root = format!("{home}/{}", lease::WORKSPACE_DIR);
        let cwd = match cwd {
            Some(cwd) => resolve_path(&root, cwd)?,
            None => root.clone(),
        };
        // Creating a directory creates its parents: the root needs its own
        // request only when the cwd is elsewhere.
        if !cwd.starts_with(&format!("{root}/")) {
            self.make_dir(id, &root)?;
        }
        self.make_dir(id, &cwd)?;
        Ok((root, cwd))
    }

    fn make_dir(&mut self, id: &str, path: &str) -> Result<(), ProviderError> {
        let folder = format!(
            "/{id}/files/folder?path={}&mode=755",
            encode_query_value(path)
        );
        self.call(Face::Toolbox, Method::Post, &folder, None)
            .map(|_| ())
            .map_err(|e| e.into_provider_error("create-folder"))
    }

    fn probe_run(
        &mut self,
        id: &str,
        marker: &str,
        diagnostics: &mut Vec<String>,
    ) -> Result<bool, ProviderError> {
        self.wait_for(id, "started")?;
        diagnostics.push("sandbox is started".into());
        let run = self
            .call(
                Face::Toolbox,
                Method::Post,
                &format!("/{id}/process/execute"),
                Some(json!({ "command": format!("echo {marker}"), "timeout": 60 })),
            )
            .map_err(|e| e.into_provider_error("probe-execute"))?;
        let exit = run.get("exitCode").and_then(Value::as_i64);
        let printed = run
            .get("result")
            .and_then(Value::as_str)
            .unwrap_or_default();
        diagnostics.push(format!(
            "echo exited {}",
            exit.map_or("?".into(), |c| c.to_string())
        ));
        Ok(exit == Some(0) && printed.trim() == marker)
    }
}

impl DeleteSandbox for Daytona<'_> {
    /// `DELETE /sandbox/{id}` with a fresh budget, then polls until a 404 or
    /// `destroyed` proves it gone.
    fn delete_sandbox(&mut self, id: &str) -> Result<TerminationAction, CleanupCause> {
        let delete = api::request(
            &self.op.config,
            Face::Api,
            Method::Delete,
            &api::sandbox_path(id),
            None,
        );
        let wait = self.op.cleanup_wait();
        match api::call(self.op.platform, &delete, wait) {
            Ok(_) => {}
            Err(ApiError::Status(404)) => return Ok(TerminationAction::AlreadyGone),
            Err(error) => return Err(cleanup_cause(error)),
        }
        let deadline = self.op.cleanup_wait().deadline;
        loop {
            let get = api::request(
                &self.op.config,
                Face::Api,
                Method::Get,
                &api::sandbox_path(id),
                None,
            );
            let wait = Wait {
                deadline,
                cancellable: false,
            };
            match api::call_object(self.op.platform, &get, wait) {
                Err(ApiError::Status(404)) => return Ok(TerminationAction::Deleted),
                Ok(data) if state_of(&data) == Some("destroyed") => {
                    return Ok(TerminationAction::Deleted)
                }
                Ok(data) if state_of(&data) == Some("error") => {
                    return Err(CleanupCause::InvalidResponse(
                        "the sandbox is in `error` after its delete".into(),
                    ))
                }
                Ok(_) => {}
                Err(error) => return Err(cleanup_cause(error)),
            }
            let until = self.op.platform.now().saturating_add(POLL_INTERVAL_MS * MS);
            if self.op.platform.sleep_until(until, wait).is_err() {
                return Err(CleanupCause::Deadline);
            }
        }
    }
}

/// A directory as the contract reads it: an absolute path as it is, a
/// relative one under the workspace `root`; `..`, NUL and empty paths are
/// refused (as the CreateOS provider does).
pub fn resolve_path(root: &str, path: &str) -> Result<String, ProviderError> {
    if path.is_empty() || path.contains('\0') || path.split('/').any(|segment| segment == "..") {
        return Err(ProviderError::InvalidRequest(
            "the path must be non-empty, without `..` or NUL".into(),
        ));
    }
    let relative = path.trim_end_matches('/');
    if path.starts_with('/') {
        return Ok(if relative.is_empty() { "/" } else { relative }.to_string());
    }
    let relative = relative.trim_start_matches("./");
    Ok(match relative {
        "" | "." => root.to_string(),
        _ => format!("{root}/{relative}"),
    })
}

fn state_of(data: &Map<String, Value>) -> Option<&str> {
    data.get("state").and_then(Value::as_str)
}

fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_sdk::testing::{Answer, FakePlatform};
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Pins issue 27 item 4 (states): `pausing`, `paused`, `resuming`,
    /// `resizing`, `snapshotting` and `forking` (states of the current
    /// API) made a wait fail at once as if the sandbox were unusable. They
    /// are operations under way: the wait goes on until the wanted state.
    #[wasm_bindgen_test(unsupported = test)]
    fn operations_under_way_are_waited_through() {
        let config = <Config as provider_sdk::config::ProviderConfig>::parse(
            r#"{"apiUrl":"http://127.0.0.1:1/api","toolboxUrl":"http://127.0.0.1:2/toolbox"}"#,
        )
        .unwrap();
        for busy in [
            "pausing",
            "paused",
            "resuming",
            "resizing",
            "snapshotting",
            "forking",
        ] {
            let mut reads = 0;
            let mut platform = FakePlatform::new(move |_| {
                reads += 1;
                let state = if reads < 3 { busy } else { "started" };
                Answer::Full(
                    200,
                    format!(r#"{{"id":"sb-1","state":"{state}"}}"#).into_bytes(),
                )
            });
            let ctx = provider_sdk::testing::context("{}");
            let mut lifecycle = Daytona::new(Operation::new(&mut platform, &ctx, config.clone()));
            assert!(lifecycle.wait_for("sb-1", "started").is_ok(), "{busy}");
            assert_eq!(platform.requests.len(), 3, "{busy}");
        }
    }

    fn local_config() -> Config {
        <Config as provider_sdk::config::ProviderConfig>::parse(
            r#"{"apiUrl":"http://127.0.0.1:1/api","toolboxUrl":"http://127.0.0.1:2/toolbox"}"#,
        )
        .unwrap()
    }

    /// The service's `DELETE /snapshots/{id}` takes the snapshot's id, not
    /// its name (a name there is a 404): the reference (the name) is
    /// resolved through `GET /snapshots/{name}` first, and a 404 at either
    /// step is `already-gone`; an answer without an id is
    /// `invalid-response`, with nothing deleted.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_template_is_deleted_by_the_id_its_name_resolves_to() {
        let ctx = provider_sdk::testing::context("{}");
        let template_ref = templates::reference(&ctx, "setup").unwrap();
        let delete = |found: Answer, deleted: u16| {
            let (name_path, id_path) = (
                format!("/api/snapshots/{template_ref}"),
                "/api/snapshots/3f2a9c1e-0000-4000-8000-00000000000a".to_string(),
            );
            let mut found = Some(found);
            let mut platform = FakePlatform::new(move |req| match (&req.method, &req.path) {
                (Method::Get, path) if *path == name_path => found.take().unwrap_or(Answer::Hang),
                (Method::Delete, path) if *path == id_path => Answer::Full(deleted, b"".to_vec()),
                (Method::Delete, _) => Answer::Full(404, br#"{"statusCode":404}"#.to_vec()),
                _ => Answer::Full(500, b"{}".to_vec()),
            });
            let mut lifecycle = Daytona::new(Operation::new(&mut platform, &ctx, local_config()));
            let outcome = lifecycle.delete_template(&template_ref);
            (outcome, platform.calls())
        };
        let snapshot = || {
            Answer::Full(
                200,
                format!(r#"{{"id":"3f2a9c1e-0000-4000-8000-00000000000a","name":"{template_ref}","state":"active"}}"#)
                    .into_bytes(),
            )
        };
        let (outcome, calls) = delete(snapshot(), 200);
        assert!(
            matches!(outcome, Ok(TemplateDeletion::Deleted)),
            "{outcome:?}"
        );
        assert_eq!(
            calls,
            [
                format!("GET /API/SNAPSHOTS/{}", template_ref.to_uppercase()),
                "DELETE /API/SNAPSHOTS/3F2A9C1E-0000-4000-8000-00000000000A".to_string()
            ]
        );
        let (outcome, calls) = delete(Answer::Full(404, br#"{"statusCode":404}"#.to_vec()), 200);
        assert!(
            matches!(outcome, Ok(TemplateDeletion::AlreadyGone)),
            "{outcome:?}"
        );
        assert_eq!(calls.len(), 1, "nothing deleted: {calls:?}");
        let (outcome, _) = delete(snapshot(), 404);
        assert!(
            matches!(outcome, Ok(TemplateDeletion::AlreadyGone)),
            "{outcome:?}"
        );
        for bad in [
            r#"{"name":"x"}"#,
            r#"{"id":7}"#,
            r#"{"id":""}"#,
            "[]",
            "not json",
        ] {
            let (outcome, calls) = delete(Answer::Full(200, bad.as_bytes().to_vec()), 200);
            assert!(
                matches!(outcome, Err(ProviderError::InvalidResponse(_))),
                "{bad}: {outcome:?}"
            );
            assert_eq!(calls.len(), 1, "{bad}: nothing deleted: {calls:?}");
        }
    }

    /// Pins issue 27 item 2: a relative cwd was joined to the lease's cwd
    /// (which already held it: `/root/paperclip-workspace/sub/dir/sub/dir`)
    /// and an absolute one outside the workspace was refused.
    #[wasm_bindgen_test(unsupported = test)]
    fn paths_resolve_against_the_workspace_root_or_stay_absolute() {
        let root = "/root/paperclip-workspace";
        assert_eq!(
            resolve_path(root, "sub/dir").unwrap(),
            "/root/paperclip-workspace/sub/dir"
        );
        assert_eq!(resolve_path(root, "sub/").unwrap(), format!("{root}/sub"));
        assert_eq!(resolve_path(root, ".").unwrap(), root);
        assert_eq!(resolve_path(root, "/tmp").unwrap(), "/tmp");
        assert_eq!(resolve_path(root, "/").unwrap(), "/");
        for bad in ["", "../x", "a/../../b", "a\0b"] {
            assert!(resolve_path(root, bad).is_err(), "{bad:?}");
        }
    }
}
