//! The host runtime: environments (config, secret, policy), leases recorded
//! durably, cleanup failures and traps poisoning leases, and cancellation of
//! running commands before a release or destroy.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::bindings::types::{
    AcquireRequest, ConfigValidation, EnvironmentContext, ExecuteRequest, ExecuteResult, Lease,
    ProbeReport, ProviderDescription, ProviderError, ResumeOutcome, TerminationAction,
    TerminationReceipt, WorkspaceRequest,
};
use crate::cancel::CancelToken;
use crate::component::ProviderComponent;
use crate::instance::{trap_of, ProviderInstance};
use crate::lease_store::{LeaseRecord, LeaseState, LeaseStore};
use crate::options::{GuestStderr, HostOptions, OutputSink};
use crate::policy::Policy;
use crate::rate_budget::{RateBudget, RateLimit};
use crate::transport::Transport;

/// Extra time the host allows beyond the provider's own timeouts.
const GRACE: Duration = Duration::from_secs(30);
/// The host's limit for `probe`.
const PROBE_DEADLINE: Duration = Duration::from_secs(120);
/// The timeout assumed when the config has no `timeoutMs`.
const DEFAULT_TIMEOUT_MS: u64 = 300_000;

/// Where secrets come from when the config does not hold them.
#[derive(Clone, Default)]
pub struct Secrets {
    values: HashMap<String, String>,
    use_env: bool,
}

impl Secrets {
    /// No secrets besides those in the config.
    pub fn none() -> Self {
        Self::default()
    }

    /// Also read the environment variable each secret field declares.
    pub fn from_env() -> Self {
        Secrets {
            values: HashMap::new(),
            use_env: true,
        }
    }

    /// Uses `value` for the secret of config field `config_field`.
    pub fn with(mut self, config_field: &str, value: impl Into<String>) -> Self {
        self.values.insert(config_field.to_owned(), value.into());
        self
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("fields", &self.values.keys().collect::<Vec<_>>())
            .field("use_env", &self.use_env)
            .finish()
    }
}

/// A validated environment: the context every call gets (normalised config
/// with the secret removed) and the HTTP policy for its API origin.
#[derive(Clone, Debug)]
pub struct Environment {
    ctx: EnvironmentContext,
    policy: Policy,
    timeout: Duration,
    validation: ConfigValidation,
}

impl Environment {
    /// The context passed to the provider.
    pub fn context(&self) -> &EnvironmentContext {
        &self.ctx
    }

    /// The HTTP policy of the environment.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What `validate-config` said (warnings included).
    pub fn validation(&self) -> &ConfigValidation {
        &self.validation
    }
}

/// Runs provider operations with durable lease bookkeeping.
///
/// - A lease is recorded (`acquiring`) before the provider creates anything.
/// - `cleanup-failed`, or a trap or limit hit during an operation that may
///   have left something running, poisons the lease; a poisoned lease
///   refuses execute, resume and release, and only destroy clears it.
/// - Release and destroy first cancel the lease's running commands (through
///   their cancel tokens) and wait for them to return.
pub struct SandboxRuntime {
    component: ProviderComponent,
    description: ProviderDescription,
    store: Arc<LeaseStore>,
    transport: Arc<dyn Transport>,
    budget: RateBudget,
    rate_limit: Option<RateLimit>,
    stderr: GuestStderr,
    grace: Duration,
    running: Mutex<HashMap<String, Vec<CancelToken>>>,
    finished: Condvar,
}

impl SandboxRuntime {
    /// A runtime for `component`, storing leases in `store`, sending allowed
    /// requests through `transport` (usually [`NetworkTransport`](crate::NetworkTransport)).
    pub fn new(
        component: ProviderComponent,
        store: Arc<LeaseStore>,
        transport: Arc<dyn Transport>,
    ) -> Result<Self> {
        let description = component.instantiate(HostOptions::new())?.describe()?;
        let rate_limit = description.rate_limit.map(declared_limit);
        Ok(SandboxRuntime {
            component,
            description,
            store,
            transport,
            budget: RateBudget::global(),
            rate_limit,
            stderr: GuestStderr::Discard,
            grace: GRACE,
            running: Mutex::new(HashMap::new()),
            finished: Condvar::new(),
        })
    }

    /// Keeps the request budget in `budget` instead of this process's
    /// memory (for example [`RateBudget::open`] on a file every host
    /// process of the machine shares).
    pub fn with_rate_budget(mut self, budget: RateBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Spends `limit` instead of the provider's declared `rate-limit`: `None`
    /// for a backend without a limit (a local backend), or the limit of the
    /// operator's account. Never raise it above what the API allows.
    pub fn with_rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.rate_limit = limit;
        self
    }

    /// The rate limit this runtime spends per API origin.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.rate_limit.as_ref()
    }

    /// How long an instance may run past an operation's own timeout before
    /// the epoch deadline stops it (default 30 s, as the contract's host
    /// timing says); a stopped `execute` poisons its lease.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What happens to the guest's stderr.
    pub fn with_guest_stderr(mut self, stderr: GuestStderr) -> Self {
        self.stderr = stderr;
        self
    }

    /// What the provider said about itself.
    pub fn description(&self) -> &ProviderDescription {
        &self.description
    }

    /// The lease store.
    pub fn store(&self) -> &LeaseStore {
        &self.store
    }

    /// `validate-config` on `config` with the secret fields removed.
    pub fn validate_config(&self, config: &str) -> Result<ConfigValidation> {
        let (stripped, _) = self.split_secrets(config, &Secrets::none())?;
        self.plain_instance(Duration::from_secs(30))?
            .validate_config(&stripped)
    }

    /// Validates `config`, resolves its secret (the config value, then
    /// `secrets`, then the declared environment variable) and builds the
    /// environment's policy. Fails when the config is invalid.
    pub fn environment(
        &self,
        company_id: &str,
        environment_id: &str,
        config: &str,
        secrets: &Secrets,
    ) -> Result<Environment> {
        let (stripped, resolved) = self.split_secrets(config, secrets)?;
        let validation = self
            .plain_instance(Duration::from_secs(30))?
            .validate_config(&stripped)?;
        if !validation.ok {
            bail!("invalid provider config: {}", validation.errors.join("; "));
        }
        let normalized = validation
            .normalized_config
            .clone()
            .context("the provider accepted the config but returned no normalized config")?;
        let origin = validation
            .api_origin
            .clone()
            .context("the provider returned no api-origin for the config")?;
        let mut policy = Policy::for_origin(&origin)?
            .with_rate_budget(self.budget.clone())
            .with_rate_limit(self.rate_limit);
        for (header, value) in &resolved {
            policy = policy.with_secret_header(header, value)?;
        }
        let timeout_ms = serde_json::from_str::<Value>(&normalized)
            .ok()
            .and_then(|v| v.get("timeoutMs").and_then(Value::as_u64))
            .unwrap_or(DEFAULT_TIMEOUT_MS);
        Ok(Environment {
            ctx: EnvironmentContext {
                driver_key: self.description.driver_key.clone(),
                company_id: company_id.to_owned(),
                environment_id: environment_id.to_owned(),
                issue_id: None,
                config: normalized,
            },
            policy,
            timeout: Duration::from_millis(timeout_ms),
            validation,
        })
    }

    /// `probe` (deadline 120 s).
    pub fn probe(
        &self,
        env: &Environment,
        output: Option<OutputSink>,
    ) -> Result<Result<ProbeReport, ProviderError>> {
        let mut instance = self.instance(env, PROBE_DEADLINE, CancelToken::new(), output)?;
        instance.probe(&env.ctx)
    }

    /// Records a lease, then `acquire-lease`. The record ends `active` on
    /// success, `destroyed` on a definite failure (nothing was left),
    /// `poisoned` on `cleanup-failed`, and `unknown` on a trap.
    pub fn acquire(
        &self,
        env: &Environment,
        request: &AcquireRequest,
    ) -> Result<Result<LeaseRecord, ProviderError>> {
        let record = self.store.begin_acquire(&env.ctx, &request.run_id)?;
        let outcome = self
            .instance(env, env.timeout + self.grace, CancelToken::new(), None)
            .and_then(|mut instance| instance.acquire_lease(&env.ctx, request));
        match outcome {
            Ok(Ok(lease)) => {
                self.store
                    .record_lease(&record.id, &lease, LeaseState::Active)?;
            }
            Ok(Err(ProviderError::CleanupFailed(failure))) => {
                let reason = format!(
                    "acquire: cleanup failed: {:?} ({:?})",
                    failure.phase, failure.cause
                );
                match &failure.sandbox_id {
                    // Destroy needs a lease; the provider's metadata is
                    // unknown here, so sweep tries with an empty object.
                    Some(sandbox_id) => {
                        let lease = Lease {
                            provider_lease_id: sandbox_id.clone(),
                            metadata: "{}".into(),
                            expires_at: None,
                        };
                        self.store
                            .record_lease(&record.id, &lease, LeaseState::Acquiring)?;
                        self.store.poison(&record.id, &reason)?;
                    }
                    None => self.store.set_state(
                        &record.id,
                        LeaseState::Unknown,
                        Some(&format!("{reason}; no sandbox id to clean up with")),
                    )?,
                }
                return Ok(Err(ProviderError::CleanupFailed(failure)));
            }
            Ok(Err(error)) => {
                self.store.set_state(
                    &record.id,
                    LeaseState::Destroyed,
                    Some(&format!("acquire failed: {error:?}")),
                )?;
                return Ok(Err(error));
            }
            Err(error) => {
                self.store.set_state(
                    &record.id,
                    LeaseState::Unknown,
                    Some(&format!("acquire trapped: {error:#}")),
                )?;
                return Err(error);
            }
        }
        Ok(Ok(self.record(&record.id)?))
    }

    /// `execute` on an active lease. Live output goes to `output`;
    /// `cancel` (or a release/destroy of the lease) stops it. A trap or
    /// `cleanup-failed` poisons the lease.
    pub fn execute(
        &self,
        env: &Environment,
        lease_id: &str,
        request: &ExecuteRequest,
        output: Option<OutputSink>,
        cancel: CancelToken,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        let (record, lease) = self.usable(env, lease_id, "execute on")?;
        let timeout = request
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(env.timeout);
        let _running = self.register(&record.id, cancel.clone())?;
        let outcome = self
            .instance(env, timeout + self.grace, cancel, output)
            .and_then(|mut instance| instance.execute(&env.ctx, &lease, request));
        self.poison_on_failure(&record.id, "execute", &outcome)?;
        outcome
    }

    /// `realize-workspace` on an active lease.
    pub fn realize_workspace(
        &self,
        env: &Environment,
        lease_id: &str,
        request: &WorkspaceRequest,
    ) -> Result<Result<String, ProviderError>> {
        let (record, lease) = self.usable(env, lease_id, "realize a workspace on")?;
        let outcome = self
            .instance(env, env.timeout + self.grace, CancelToken::new(), None)
            .and_then(|mut i| i.realize_workspace(&env.ctx, &lease, request));
        self.poison_on_failure(&record.id, "realize-workspace", &outcome)?;
        outcome
    }

    /// `resume-lease` on a released (or active) lease; `expired` marks it destroyed.
    pub fn resume(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<ResumeOutcome, ProviderError>> {
        let (record, lease) = self.lease_for(
            env,
            lease_id,
            &[LeaseState::Active, LeaseState::Released],
            "resume",
        )?;
        let outcome = self
            .instance(env, env.timeout + self.grace, CancelToken::new(), None)
            .and_then(|mut i| i.resume_lease(&env.ctx, &lease));
        match &outcome {
            Ok(Ok(ResumeOutcome::Resumed(lease))) => {
                self.store
                    .record_lease(&record.id, lease, LeaseState::Active)?
            }
            Ok(Ok(ResumeOutcome::Expired(reason))) => self.store.set_state(
                &record.id,
                LeaseState::Destroyed,
                Some(&format!("expired: {reason}")),
            )?,
            _ => self.poison_on_failure(&record.id, "resume-lease", &outcome)?,
        }
        outcome
    }

    /// Cancels the lease's running commands, waits for them, then
    /// `release-lease`. Refused for a poisoned lease (destroy it).
    pub fn release(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        // Stop running commands first: one may poison the lease meanwhile.
        self.stop_running(lease_id);
        let (record, lease) = self.lease_for(env, lease_id, &[LeaseState::Active], "release")?;
        let outcome = self
            .instance(env, env.timeout + self.grace, CancelToken::new(), None)
            .and_then(|mut i| i.release_lease(&env.ctx, &lease));
        if let Ok(Ok(receipt)) = &outcome {
            self.store.set_state(
                &record.id,
                LeaseState::Released,
                Some(&format!("released: {}", action_name(receipt.action))),
            )?;
        }
        self.poison_on_failure(&record.id, "release-lease", &outcome)?;
        outcome
    }

    /// Cancels the lease's running commands, waits for them, then
    /// `destroy-lease`. The only way out of `poisoned`; a failure keeps (or
    /// makes) the lease poisoned.
    pub fn destroy(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        self.stop_running(lease_id);
        let (record, lease) = self.lease_for(
            env,
            lease_id,
            &[
                LeaseState::Active,
                LeaseState::Released,
                LeaseState::Poisoned,
            ],
            "destroy",
        )?;
        let outcome = self
            .instance(env, env.timeout + self.grace, CancelToken::new(), None)
            .and_then(|mut i| i.destroy_lease(&env.ctx, &lease));
        match &outcome {
            Ok(Ok(receipt)) => self.store.set_state(
                &record.id,
                LeaseState::Destroyed,
                Some(&format!("destroyed: {}", action_name(receipt.action))),
            )?,
            Ok(Err(error)) => self
                .store
                .poison(&record.id, &format!("destroy failed: {error:?}"))?,
            Err(error) => self
                .store
                .poison(&record.id, &format!("destroy trapped: {error:#}"))?,
        }
        outcome
    }

    /// Destroys every poisoned lease of `env`'s environment; poisons and
    /// destroys active leases whose command's host process died; marks
    /// `unknown` those stuck in `acquiring` for longer than the
    /// environment's timeout plus a minute. Returns each lease handled and
    /// what happened to it.
    pub fn sweep(&self, env: &Environment) -> Result<Vec<(LeaseRecord, Result<(), String>)>> {
        let stale_before = now_ms()
            - i64::try_from((env.timeout + self.grace * 2).as_millis()).unwrap_or(i64::MAX);
        let mut report = Vec::new();
        for record in self.store.needing_sweep()? {
            if record.environment_id != env.ctx.environment_id
                || record.provider != env.ctx.driver_key
            {
                continue;
            }
            let outcome = match record.state {
                LeaseState::Acquiring if record.updated_ms < stale_before => {
                    self.store.set_state(
                        &record.id,
                        LeaseState::Unknown,
                        Some("the acquire never finished (host killed?); nothing to destroy by id"),
                    )?;
                    Err("acquire never finished; marked unknown".to_owned())
                }
                LeaseState::Acquiring => continue,
                LeaseState::Active => {
                    let Some(pid) = record.busy_pid.filter(|pid| !process_alive(*pid)) else {
                        continue;
                    };
                    self.store.poison(
                        &record.id,
                        &format!(
                            "the host (pid {pid}) died while a command ran; termination unknown"
                        ),
                    )?;
                    match self.destroy(env, &record.id) {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(error)) => Err(format!("{error:?}")),
                        Err(error) => Err(format!("{error:#}")),
                    }
                }
                _ => match self.destroy(env, &record.id) {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(format!("{error:?}")),
                    Err(error) => Err(format!("{error:#}")),
                },
            };
            let record = self.record(&record.id)?;
            report.push((record, outcome));
        }
        Ok(report)
    }

    /// Cancels every running command of this runtime (for example on Ctrl-C).
    pub fn cancel_all(&self) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for token in running.values().flatten() {
            token.cancel();
        }
    }

    fn record(&self, id: &str) -> Result<LeaseRecord> {
        self.store
            .get(id)?
            .with_context(|| format!("no lease {id} in the lease store"))
    }

    fn usable(&self, env: &Environment, id: &str, what: &str) -> Result<(LeaseRecord, Lease)> {
        self.lease_for(env, id, &[LeaseState::Active], what)
    }

    fn lease_for(
        &self,
        env: &Environment,
        id: &str,
        allowed: &[LeaseState],
        what: &str,
    ) -> Result<(LeaseRecord, Lease)> {
        let record = self.record(id)?;
        if record.environment_id != env.ctx.environment_id
            || record.company_id != env.ctx.company_id
            || record.provider != env.ctx.driver_key
        {
            bail!("lease {id} belongs to another provider or environment");
        }
        if let Some(pid) = record
            .busy_pid
            .filter(|pid| *pid != std::process::id() && process_alive(*pid))
        {
            bail!(
                "cannot {what} lease {id}: a command runs on it in process {pid}; stop that first"
            );
        }
        if !allowed.contains(&record.state) {
            let why = record
                .reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            let hint = if record.state == LeaseState::Poisoned {
                "; a poisoned lease may still run something: destroy it"
            } else {
                ""
            };
            bail!(
                "cannot {what} lease {id}: it is {}{why}{hint}",
                record.state
            );
        }
        let lease = record
            .lease
            .clone()
            .with_context(|| format!("lease {id} has no provider lease"))?;
        Ok((record, lease))
    }

    fn poison_on_failure<T>(
        &self,
        id: &str,
        operation: &str,
        outcome: &Result<Result<T, ProviderError>>,
    ) -> Result<()> {
        match outcome {
            Ok(Err(ProviderError::CleanupFailed(failure))) => self.store.poison(
                id,
                &format!(
                    "{operation}: cleanup failed: {:?} ({:?})",
                    failure.phase, failure.cause
                ),
            ),
            Err(error) => {
                let what = match trap_of(error) {
                    Some(trap) => format!("{operation}: trapped ({trap}); termination unknown"),
                    None => format!("{operation}: host failure; termination unknown: {error:#}"),
                };
                self.store.poison(id, &what)
            }
            Ok(_) => Ok(()),
        }
    }

    fn plain_instance(&self, deadline: Duration) -> Result<ProviderInstance> {
        self.component.instantiate(
            HostOptions::new()
                .with_deadline(deadline)
                .with_guest_stderr(self.stderr),
        )
    }

    fn instance(
        &self,
        env: &Environment,
        deadline: Duration,
        cancel: CancelToken,
        output: Option<OutputSink>,
    ) -> Result<ProviderInstance> {
        let transport: Arc<dyn Transport> =
            Arc::new(env.policy.clone().guard(self.transport.clone()));
        let mut options = HostOptions::new()
            .with_transport(transport)
            .with_deadline(deadline)
            .with_cancel(cancel)
            .with_guest_stderr(self.stderr);
        if let Some(output) = output {
            options = options.with_output_sink(output);
        }
        self.component.instantiate(options)
    }

    /// Removes the secret fields from `config`; returns the rest and the
    /// `(header, secret)` pairs resolved.
    fn split_secrets(
        &self,
        config: &str,
        secrets: &Secrets,
    ) -> Result<(String, Vec<(String, String)>)> {
        let mut value: Value = serde_json::from_str(config).context("the config is not JSON")?;
        let object = value
            .as_object_mut()
            .context("the config is not a JSON object")?;
        let mut resolved = Vec::new();
        for field in &self.description.secrets {
            let in_config = object.remove(&field.config_field);
            let secret = match in_config {
                Some(Value::Null) | None => None,
                Some(reference) => Some(resolve_secret(&field.config_field, &reference)?),
            }
            .or_else(|| secrets.values.get(&field.config_field).cloned())
            .or_else(|| {
                field
                    .env_var
                    .as_ref()
                    .filter(|_| secrets.use_env)
                    .and_then(|var| std::env::var(var).ok())
            });
            if let Some(secret) = secret {
                resolved.push((field.header.clone(), secret));
            }
        }
        Ok((value.to_string(), resolved))
    }

    fn register(&self, id: &str, token: CancelToken) -> Result<RunningGuard<'_>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let tokens = running.entry(id.to_owned()).or_default();
        if tokens.is_empty() {
            self.store.mark_busy(id)?;
        }
        tokens.push(token.clone());
        Ok(RunningGuard {
            runtime: self,
            id: id.to_owned(),
            token,
        })
    }

    /// Cancels the lease's running commands and waits until they returned.
    fn stop_running(&self, id: &str) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = running.get(id) {
            for token in tokens {
                token.cancel();
            }
        }
        while running.get(id).is_some_and(|t| !t.is_empty()) {
            running = self
                .finished
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl fmt::Debug for SandboxRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxRuntime")
            .field("provider", &self.description.driver_key)
            .finish_non_exhaustive()
    }
}

struct RunningGuard<'a> {
    runtime: &'a SandboxRuntime,
    id: String,
    token: CancelToken,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        let mut running = self
            .runtime
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = running.get_mut(&self.id) {
            if let Some(at) = tokens
                .iter()
                .position(|t| Arc::ptr_eq(t.shared(), self.token.shared()))
            {
                tokens.swap_remove(at);
            }
            if tokens.is_empty() {
                running.remove(&self.id);
                let _ = self.runtime.store.clear_busy(&self.id);
            }
        }
        self.runtime.finished.notify_all();
    }
}

/// Whether process `pid` still runs (this process counts as alive).
fn process_alive(pid: u32) -> bool {
    pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The host's form of a provider's declared `rate-limit`.
fn declared_limit(limit: crate::bindings::types::RateLimit) -> RateLimit {
    let declared = RateLimit::new(
        limit.requests,
        Duration::from_millis(u64::from(limit.window_ms)),
    );
    match limit.per_second {
        Some(cap) => declared.with_per_second(cap),
        None => declared,
    }
}

/// `paused`, `deleted` or `already gone`.
pub fn action_name(action: TerminationAction) -> &'static str {
    match action {
        TerminationAction::Paused => "paused",
        TerminationAction::Deleted => "deleted",
        TerminationAction::AlreadyGone => "already gone",
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Resolves a secret config value: the secret itself (a string), or a
/// reference `{"env": "VAR"}` (an environment variable of the host) or
/// `{"file": "/path"}` (a file's contents, trailing newline removed).
/// Errors name the field and the reference, never a secret.
fn resolve_secret(field: &str, value: &Value) -> Result<String> {
    let reference = match value {
        Value::String(secret) => return Ok(secret.clone()),
        Value::Object(reference) if reference.len() == 1 => reference,
        _ => bail!(
            "config field {field} must be the secret, {{\"env\": \"VAR\"}} or {{\"file\": \"/path\"}}"
        ),
    };
    match (reference.get("env"), reference.get("file")) {
        (Some(Value::String(var)), _) => std::env::var(var)
            .with_context(|| format!("config field {field}: environment variable {var} is not set")),
        (_, Some(Value::String(path))) => std::fs::read_to_string(path)
            .map(|text| text.trim_end_matches(['\n', '\r']).to_string())
            .with_context(|| format!("config field {field}: cannot read secret file {path}")),
        _ => bail!(
            "config field {field} must be the secret, {{\"env\": \"VAR\"}} or {{\"file\": \"/path\"}}"
        ),
    }
}

#[cfg(test)]
mod secret_tests {
    use super::resolve_secret;
    use serde_json::json;

    #[test]
    fn secrets_resolve_from_values_env_and_files() {
        assert_eq!(resolve_secret("apiKey", &json!("k1")).unwrap(), "k1");
        std::env::set_var("SANDBOX_HOST_TEST_SECRET", "k2");
        assert_eq!(
            resolve_secret("apiKey", &json!({"env": "SANDBOX_HOST_TEST_SECRET"})).unwrap(),
            "k2"
        );
        let file = std::env::temp_dir().join(format!("sandbox-host-secret-{}", std::process::id()));
        std::fs::write(&file, "k3\n").unwrap();
        assert_eq!(
            resolve_secret("apiKey", &json!({"file": file})).unwrap(),
            "k3"
        );
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn bad_references_are_clear_errors_without_secrets() {
        for bad in [
            json!(5),
            json!({"env": "SANDBOX_HOST_UNSET_VAR"}),
            json!({"file": "/nonexistent/x"}),
            json!({"vault": "x"}),
        ] {
            let error = resolve_secret("apiKey", &bad).unwrap_err();
            assert!(format!("{error:#}").contains("apiKey"), "{error:#}");
        }
    }
}
