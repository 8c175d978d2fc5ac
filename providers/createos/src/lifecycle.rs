//! The provider's operations ([`CreateOs`], the SDK's `Provider`): acquire,
//! resume, release, destroy, probe, realize, sync and execute (the command
//! itself runs in [`crate::execute`]).
//!
//! Sandbox state transitions are asynchronous: they are observed by polling
//! `GET /sandboxes/{id}` every 250 ms, bounded by the operation's deadline
//! (the config's `timeoutMs`).

use crate::config::Config;
use crate::lease::{self, LeaseMetadata, MARKER_PATH, WORKSPACE_ROOT};
use crate::{api, execute, expiry};
use provider_sdk::errors::{
    cleanup_cause, invalid_response as invalid, probe_report, receipt, ApiError, DeleteSandbox,
};
use provider_sdk::http::{self, call_bytes, created_id};
use provider_sdk::platform::{random_hex, Method, Request};
use provider_sdk::types::{
    AcquireRequest, CleanupCause, CleanupPhase, ExecuteRequest, ExecuteResult, FileDownload,
    FileUpload, InteractionRequest, Lease, ProbeReport, ProviderDescription, ProviderError,
    ResumeOutcome, SyncReport, TerminationAction, TerminationReceipt, WorkspaceRequest,
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
        let (id, _) = self.create_sandbox(None)?;
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
        let (sandbox_id, attested) = self.create_sandbox(asked.map(|(at, _)| at))?;
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
            rootfs: self.op.config.rootfs.clone(),
            region: self.op.config.region.clone(),
            workspace_root: WORKSPACE_ROOT.into(),
            cwd,
            marker,
            reusable: self.op.config.reuse_lease,
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
        // on another shape, image or region is not what the caller asks for.
        for (field, leased, current) in [
            ("shape", Some(&metadata.shape), Some(&self.op.config.shape)),
            (
                "rootfs",
                metadata.rootfs.as_ref(),
                self.op.config.rootfs.as_ref(),
            ),
            (
                "region",
                metadata.region.as_ref(),
                self.op.config.region.as_ref(),
            ),
        ] {
            if leased != current {
                return Ok(expired(&format!(
                    "the config's {field} is not the one the sandbox was created with"
                )));
            }
        }
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
    /// With `expires_at` (a backend with `hardExpiry`), also the expiry its
    /// answer attests.
    fn create_sandbox(
        &mut self,
        expires_at: Option<&str>,
    ) -> Result<(String, Option<String>), ProviderError> {
        let mut body = json!({ "shape": self.op.config.shape, "ingress_enabled": false });
        if let Some(at) = expires_at {
            body["expires_at"] = Value::String(at.into());
        }
        if let Some(rootfs) = &self.op.config.rootfs {
            body["rootfs"] = Value::String(rootfs.clone());
        }
        if let Some(region) = &self.op.config.region {
            body["region"] = Value::String(region.clone());
        }
        let create = api::json_request(Method::Post, "/v1/sandboxes".into(), Some(body));
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
        self.exec_checked(
            id,
            "/bin/mkdir",
            &["-p", "--", &metadata.workspace_root, &metadata.cwd],
            "create-workspace",
        )?;
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
