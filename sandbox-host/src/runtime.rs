//! The host runtime: environments (config, secret, policy, budgets), leases
//! recorded durably and fenced by host instance, cleanup failures and traps
//! poisoning leases, and cancellation of running commands before a release
//! or destroy.

mod environment;
mod in_flight;
mod outcome;
mod relay;

pub use environment::Environment;
use in_flight::UseGuard;
pub use outcome::action_name;
use outcome::{declared_limit, host_failure};
pub use relay::OUTPUT_SINK;
use relay::{with_unconsumed, Relay};

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::bindings::types::{
    AcquireRequest, CleanupFailure, ConfigValidation, EnvironmentContext, ExecuteRequest,
    ExecuteResult, Lease, ProbeReport, ProviderDescription, ProviderError, ResumeOutcome,
    TerminationReceipt, WorkspaceRequest,
};
use crate::budget::{Budget, DEFAULT_MARGIN};
use crate::cancel::CancelToken;
use crate::component::ProviderComponent;
use crate::instance::ProviderInstance;
use crate::leases::backend::{HostInstance, LeaseRecord, LeaseStore, Liveness};
use crate::leases::rules::{LeaseState, Operation};
use crate::messages::{cleanup_text, error_text, loss_text};
use crate::options::{GuestStderr, HostOptions, OutputSink, SandboxRecorder};
use crate::policy::{Origin, Policy};
use crate::rate_budget::{RateBudget, RateLimit};
use crate::secrets::{check_secret_origin, Secrets, SplitConfig};
use crate::transport::Transport;

/// The deadline of `validate-config` (no network; a pure function).
const VALIDATE_DEADLINE: Duration = Duration::from_secs(30);

/// Runs provider operations with durable lease bookkeeping.
///
/// - A lease is recorded (`acquiring`, owned by this host instance) before
///   the provider creates anything; `probe` is recorded the same way.
/// - Each operation checks and marks the lease in one store transaction
///   (see [`leases::rules`](crate::leases::rules)): a mark left by a host whose
///   heartbeat expired poisons the lease first, whatever the operation.
/// - `cleanup-failed`, or a trap or limit hit during an operation that may
///   have left something running, poisons the lease; a poisoned lease
///   refuses execute, resume and release, and only destroy clears it.
/// - Release and destroy first move the lease to `closing` (nothing new may
///   start), then cancel the lease's running commands and wait for them.
/// - `expired` on resume destroys the sandbox before the lease is recorded
///   as destroyed (poisoned if the delete is not confirmed).
pub struct SandboxRuntime {
    component: ProviderComponent,
    description: ProviderDescription,
    store: Arc<dyn LeaseStore>,
    host: HostInstance,
    transport: Arc<dyn Transport>,
    budget: RateBudget,
    rate_limit: Option<RateLimit>,
    stderr: GuestStderr,
    margin: Duration,
    running: Mutex<HashMap<String, Vec<CancelToken>>>,
    finished: Condvar,
}

impl SandboxRuntime {
    /// A runtime for `component`, storing leases in `store` (for example a
    /// [`SqliteLeases`](crate::SqliteLeases)), sending allowed
    /// requests through `transport` (usually [`NetworkTransport`](crate::NetworkTransport)).
    /// Registers a host instance in the store whose heartbeat runs while
    /// the runtime lives ([`Liveness::DEFAULT`]).
    pub fn new(
        component: ProviderComponent,
        store: Arc<dyn LeaseStore>,
        transport: Arc<dyn Transport>,
    ) -> Result<Self> {
        let description = component.instantiate(HostOptions::new())?.describe()?;
        let rate_limit = description.rate_limit.map(declared_limit);
        let host = HostInstance::register(store.clone(), Liveness::DEFAULT)?;
        Ok(SandboxRuntime {
            component,
            description,
            store,
            host,
            transport,
            budget: RateBudget::global(),
            rate_limit,
            stderr: GuestStderr::Discard,
            margin: DEFAULT_MARGIN,
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

    /// The margin an instance may run past the provider's own plan and its
    /// cleanup reserve before the host stops it (default 5 s; see
    /// [`Budget`]); a stopped `execute` poisons its lease.
    pub fn with_grace(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// What happens to the guest's stderr.
    pub fn with_guest_stderr(mut self, stderr: GuestStderr) -> Self {
        self.stderr = stderr;
        self
    }

    /// Changes how this host proves it is alive to other hosts sharing the
    /// store.
    pub fn set_liveness(&self, liveness: Liveness) -> Result<()> {
        self.host.set_liveness(liveness)
    }

    /// This host's instance id (the owner of its marks in the store).
    pub fn host_id(&self) -> &str {
        self.host.id()
    }

    /// What the provider said about itself.
    pub fn description(&self) -> &ProviderDescription {
        &self.description
    }

    /// The lease store.
    pub fn store(&self) -> &dyn LeaseStore {
        &*self.store
    }

    /// `validate-config` on `config` with the secret fields removed.
    pub fn validate_config(&self, config: &str) -> Result<ConfigValidation> {
        let split = Secrets::none().split(config, &self.description)?;
        self.plain_instance(VALIDATE_DEADLINE)?
            .validate_config(&split.config)
    }

    /// Validates `config`, resolves its secrets by the operator's rules in
    /// `secrets`, and builds the environment's policy. Fails when the
    /// config is invalid, when the origin the provider asks for is not the
    /// one the config's URL field names, or when a secret would go to an
    /// origin that is not `https:` (plain `http:` only on loopback).
    pub fn environment(
        &self,
        company_id: &str,
        environment_id: &str,
        config: &str,
        secrets: &Secrets,
    ) -> Result<Environment> {
        let split = secrets.split(config, &self.description)?;
        let validation = self
            .plain_instance(VALIDATE_DEADLINE)?
            .validate_config(&split.config)?;
        if !validation.ok {
            bail!("invalid provider config: {}", validation.errors.join("; "));
        }
        let normalized = validation
            .normalized_config
            .clone()
            .context("the provider accepted the config but returned no normalized config")?;
        let policy = self.policy_for(&split, secrets, &validation.api_origins)?;
        let budget = Budget::from_validation(validation.budget.as_ref()).with_margin(self.margin);
        Ok(Environment {
            ctx: EnvironmentContext {
                driver_key: self.description.driver_key.clone(),
                company_id: company_id.to_owned(),
                environment_id: environment_id.to_owned(),
                issue_id: None,
                config: normalized.clone(),
            },
            // A 429's pause is repeated only within one request's budget.
            policy: policy.with_max_throttle_wait(budget.request),
            budget,
            validation,
        })
    }

    /// `probe`, recorded in the store while its sandbox may exist (like an
    /// acquire): a host that dies mid-probe leaves a record that sweep
    /// reports, and a probe whose delete failed is poisoned for sweep.
    pub fn probe(
        &self,
        env: &Environment,
        output: Option<OutputSink>,
    ) -> Result<Result<ProbeReport, ProviderError>> {
        let record = self
            .store
            .begin_acquire(&env.ctx, "probe", self.host.id())?;
        let outcome = self
            .creating_instance(env, &record.id, output)
            .and_then(|mut instance| instance.probe(&env.ctx));
        match &outcome {
            Ok(Ok(_)) => self.store.set_state(
                &record.id,
                LeaseState::Destroyed,
                Some("probe: its sandbox was created, used and deleted"),
            )?,
            Ok(Err(ProviderError::CleanupFailed(failure))) => {
                self.creation_unconfirmed(&record.id, "probe", failure)?
            }
            Ok(Err(error)) => self.store.set_state(
                &record.id,
                LeaseState::Destroyed,
                Some(&format!(
                    "probe failed, nothing was left: {}",
                    error_text(error)
                )),
            )?,
            Err(error) => self.creation_stopped(&record.id, "probe", error)?,
        }
        outcome
    }

    /// Records a lease, then `acquire-lease`. The record ends `active` on
    /// success, `destroyed` on a definite failure (nothing was left),
    /// `poisoned` on `cleanup-failed` with a sandbox id, and `unknown` on a
    /// trap or an unconfirmed creation without an id.
    pub fn acquire(
        &self,
        env: &Environment,
        request: &AcquireRequest,
    ) -> Result<Result<LeaseRecord, ProviderError>> {
        let record = self
            .store
            .begin_acquire(&env.ctx, &request.run_id, self.host.id())?;
        let outcome = self
            .creating_instance(env, &record.id, None)
            .and_then(|mut instance| instance.acquire_lease(&env.ctx, request));
        match outcome {
            Ok(Ok(lease)) => {
                self.store
                    .record_lease(&record.id, &lease, LeaseState::Active)?;
                self.store.end_use(&record.id, self.host.id())?;
                Ok(Ok(self.record(&record.id)?))
            }
            Ok(Err(ProviderError::CleanupFailed(failure))) => {
                self.creation_unconfirmed(&record.id, "acquire", &failure)?;
                Ok(Err(ProviderError::CleanupFailed(failure)))
            }
            Ok(Err(error)) => {
                self.store.set_state(
                    &record.id,
                    LeaseState::Destroyed,
                    Some(&format!(
                        "acquire failed, nothing was left: {}",
                        error_text(&error)
                    )),
                )?;
                Ok(Err(error))
            }
            Err(error) => {
                self.creation_stopped(&record.id, "acquire", &error)?;
                Err(error)
            }
        }
    }

    /// An acquire or probe whose cleanup failed: poisoned with the sandbox
    /// id for sweep, or `unknown` when there is no id.
    fn creation_unconfirmed(&self, id: &str, what: &str, failure: &CleanupFailure) -> Result<()> {
        let reason = format!("{what}: {}", cleanup_text(failure));
        match &failure.sandbox_id {
            // Destroy needs a lease; the provider's metadata is unknown
            // here, so sweep tries with an empty object.
            Some(sandbox_id) => {
                let lease = Lease {
                    provider_lease_id: sandbox_id.clone(),
                    metadata: "{}".into(),
                    expires_at: None,
                };
                self.store.record_lease(id, &lease, LeaseState::Acquiring)?;
                self.store.poison(id, &reason)?;
                self.store.end_use(id, self.host.id())
            }
            // The provider may have recorded the sandbox before it failed.
            None if self.record(id)?.lease.is_some() => {
                self.store.poison(id, &reason)?;
                self.store.end_use(id, self.host.id())
            }
            None => self.store.set_state(
                id,
                LeaseState::Unknown,
                Some(&format!(
                    "{reason}; there is no sandbox id to clean up with"
                )),
            ),
        }
    }

    /// An acquire or probe that stopped in the host (trap, deadline, host
    /// error): poisoned for sweep when the provider had recorded its
    /// sandbox (`host.record-sandbox`), `unknown` otherwise.
    fn creation_stopped(&self, id: &str, what: &str, error: &anyhow::Error) -> Result<()> {
        match self.record(id)?.lease {
            Some(lease) => {
                self.store.poison(
                    id,
                    &format!(
                        "{what} stopped in the host ({}) after sandbox {} was created; \
                         `sandbox lease sweep` destroys it",
                        host_failure(error),
                        lease.provider_lease_id
                    ),
                )?;
                self.store.end_use(id, self.host.id())
            }
            None => self.store.set_state(
                id,
                LeaseState::Unknown,
                Some(&format!(
                    "{what} stopped in the host ({}); a sandbox may exist with no id to clean it up with",
                    host_failure(error)
                )),
            ),
        }
    }

    /// `execute` on an active lease. Live output goes to `output`, in
    /// order, from a thread of its own: a slow sink slows the command, and
    /// one that stops taking output cannot hold it past its timeout; output
    /// it did not consume makes the outcome an `output-lost` of operation
    /// [`OUTPUT_SINK`]. `cancel` (or a release/destroy of the lease) stops
    /// it. A trap, `cleanup-failed`, or `output-lost` without a confirmed
    /// deletion of the command's tree poisons the lease.
    pub fn execute(
        &self,
        env: &Environment,
        lease_id: &str,
        request: &ExecuteRequest,
        output: Option<OutputSink>,
        cancel: CancelToken,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        let (_, lease, _using) =
            self.begin_use(env, lease_id, Operation::Execute, cancel.clone())?;
        let deadline = env
            .budget
            .execute_deadline(request.timeout_ms.map(Duration::from_millis));
        let timeout = request
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(env.budget.timeout);
        let (output, relay) = output.map(|sink| Relay::start(sink, timeout)).unzip();
        let outcome = self
            .instance(env, deadline, cancel, output)
            .and_then(|mut instance| instance.execute(&env.ctx, &lease, request));
        let outcome = match relay {
            Some(relay) => with_unconsumed(outcome, relay.finish()),
            None => outcome,
        };
        self.poison_on_failure(lease_id, "execute", &outcome)?;
        outcome
    }

    /// `realize-workspace` on an active lease.
    pub fn realize_workspace(
        &self,
        env: &Environment,
        lease_id: &str,
        request: &WorkspaceRequest,
    ) -> Result<Result<String, ProviderError>> {
        let cancel = CancelToken::new();
        let (_, lease, _using) =
            self.begin_use(env, lease_id, Operation::Realize, cancel.clone())?;
        let outcome = self
            .instance(env, env.budget.lifecycle_deadline(), cancel, None)
            .and_then(|mut i| i.realize_workspace(&env.ctx, &lease, request));
        self.poison_on_failure(lease_id, "realize-workspace", &outcome)?;
        outcome
    }

    /// `resume-lease` on a released (or active) lease. `expired` means "not
    /// usable", not "gone": the sandbox is destroyed before the lease is
    /// recorded as destroyed, and a delete that is not confirmed leaves the
    /// lease poisoned (and its error is returned).
    pub fn resume(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<ResumeOutcome, ProviderError>> {
        let cancel = CancelToken::new();
        let (_, lease, using) = self.begin_use(env, lease_id, Operation::Resume, cancel.clone())?;
        let outcome = self
            .instance(env, env.budget.lifecycle_deadline(), cancel, None)
            .and_then(|mut i| i.resume_lease(&env.ctx, &lease));
        match &outcome {
            Ok(Ok(ResumeOutcome::Resumed(lease))) => {
                self.store
                    .record_lease(lease_id, lease, LeaseState::Active)?
            }
            Ok(Ok(ResumeOutcome::Expired(reason))) => {
                drop(using);
                let why = format!("resume found it expired ({reason})");
                return match self.destroy_because(env, lease_id, &why)? {
                    Ok(_) => outcome,
                    Err(error) => Ok(Err(error)),
                };
            }
            _ => self.poison_on_failure(lease_id, "resume-lease", &outcome)?,
        }
        outcome
    }

    /// Moves the lease to `closing` (refused for a poisoned or busy lease),
    /// cancels its running commands and waits for them, then
    /// `release-lease`. A definite failure leaves the lease active; an
    /// unconfirmed one poisons it.
    pub fn release(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        let me = self.host.id();
        let record = self
            .store
            .begin(lease_id, Operation::Release, &env.ctx, me)?;
        self.stop_running(lease_id);
        let current = self.record(lease_id)?;
        let lease = match (&current.state, &record.lease) {
            (LeaseState::Poisoned, _) | (_, None) => {
                let why = current.reason.clone().unwrap_or_default();
                self.store.end_close(
                    lease_id,
                    me,
                    LeaseState::Poisoned,
                    "release stopped: a command's cleanup failed while it was being stopped",
                )?;
                bail!(
                    "cannot release lease {lease_id}: it is poisoned ({why}); something may still \
                     run in it: `sandbox lease destroy {lease_id}` destroys it"
                );
            }
            (_, Some(lease)) => lease.clone(),
        };
        let outcome = self
            .instance(
                env,
                env.budget.lifecycle_deadline(),
                CancelToken::new(),
                None,
            )
            .and_then(|mut i| i.release_lease(&env.ctx, &lease));
        let (state, reason) = match &outcome {
            Ok(Ok(receipt)) => (
                LeaseState::Released,
                format!("released: {}", action_name(receipt.action)),
            ),
            Ok(Err(ProviderError::CleanupFailed(failure))) => (
                LeaseState::Poisoned,
                format!("release: {}", cleanup_text(failure)),
            ),
            Ok(Err(error)) => (
                LeaseState::Active,
                format!(
                    "release failed; the sandbox is still there: {}",
                    error_text(error)
                ),
            ),
            Err(error) => (
                LeaseState::Poisoned,
                format!(
                    "release stopped in the host ({}); termination unknown",
                    host_failure(error)
                ),
            ),
        };
        self.store.end_close(lease_id, me, state, &reason)?;
        outcome
    }

    /// Moves the lease to `closing` (a poisoned one stays poisoned),
    /// cancels its running commands and waits for them, then
    /// `destroy-lease`. The only way out of `poisoned`; a failure keeps (or
    /// makes) the lease poisoned.
    pub fn destroy(
        &self,
        env: &Environment,
        lease_id: &str,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        self.destroy_because(env, lease_id, "destroyed")
    }

    fn destroy_because(
        &self,
        env: &Environment,
        lease_id: &str,
        why: &str,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        let me = self.host.id();
        let record = self
            .store
            .begin(lease_id, Operation::Destroy, &env.ctx, me)?;
        self.stop_running(lease_id);
        let Some(lease) = record.lease.clone() else {
            self.store.end_close(
                lease_id,
                me,
                LeaseState::Poisoned,
                "destroy impossible: no sandbox id recorded",
            )?;
            bail!("lease {lease_id} has no sandbox id to destroy");
        };
        let outcome = self
            .instance(
                env,
                env.budget.lifecycle_deadline(),
                CancelToken::new(),
                None,
            )
            .and_then(|mut i| i.destroy_lease(&env.ctx, &lease));
        let (state, reason) = match &outcome {
            Ok(Ok(receipt)) => (
                LeaseState::Destroyed,
                format!("{why}: sandbox {}", action_name(receipt.action)),
            ),
            Ok(Err(error)) => (
                LeaseState::Poisoned,
                format!(
                    "{why}, but the delete was not confirmed; the sandbox may still exist: {}",
                    error_text(error)
                ),
            ),
            Err(error) => (
                LeaseState::Poisoned,
                format!(
                    "{why}, but the delete stopped in the host ({}); the sandbox may still exist",
                    host_failure(error)
                ),
            ),
        };
        self.store.end_close(lease_id, me, state, &reason)?;
        outcome
    }

    /// Handles every lease of `env`'s environment that needs it: a mark of a
    /// host whose heartbeat expired poisons its lease (or marks an acquire
    /// `unknown`), and every poisoned lease is destroyed. Leases whose
    /// owners are alive are left alone. Returns each lease handled and what
    /// happened to it.
    pub fn sweep(&self, env: &Environment) -> Result<Vec<(LeaseRecord, Result<(), String>)>> {
        let mut report = Vec::new();
        for record in self.store.needing_sweep()? {
            if record.environment_id != env.ctx.environment_id
                || record.company_id != env.ctx.company_id
                || record.provider != env.ctx.driver_key
            {
                continue;
            }
            let inspected =
                self.store
                    .begin(&record.id, Operation::Inspect, &env.ctx, self.host.id())?;
            let outcome = match inspected.state {
                LeaseState::Poisoned => match self.destroy(env, &record.id) {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(error_text(&error)),
                    Err(error) => Err(format!("{error:#}")),
                },
                LeaseState::Unknown if record.state != LeaseState::Unknown => Err(inspected
                    .reason
                    .clone()
                    .unwrap_or_else(|| "marked unknown".to_owned())),
                _ => continue,
            };
            report.push((self.record(&record.id)?, outcome));
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

    /// The HTTP policy of a config ([`route_policy`]) with this runtime's
    /// rate budget and limit.
    fn policy_for(
        &self,
        split: &SplitConfig,
        secrets: &Secrets,
        asked: &[String],
    ) -> Result<Policy> {
        Ok(route_policy(&self.description, split, secrets, asked)?
            .with_rate_budget(self.budget.clone())
            .with_rate_limit(self.rate_limit))
    }

    /// Registers `token` (so a release or destroy of this runtime cancels
    /// it), then checks and marks the lease in the store. The token comes
    /// first: a release that moves the lease to `closing` after that cancels
    /// it, and one that did so before makes the mark fail.
    fn begin_use(
        &self,
        env: &Environment,
        id: &str,
        operation: Operation,
        token: CancelToken,
    ) -> Result<(LeaseRecord, Lease, UseGuard<'_>)> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default()
            .push(token.clone());
        let mut guard = UseGuard {
            runtime: self,
            id: id.to_owned(),
            token,
            marked: false,
        };
        let record = self.store.begin(id, operation, &env.ctx, self.host.id())?;
        guard.marked = true;
        let lease = record
            .lease
            .clone()
            .with_context(|| format!("lease {id} has no provider lease"))?;
        Ok((record, lease, guard))
    }

    fn poison_on_failure<T>(
        &self,
        id: &str,
        operation: &str,
        outcome: &Result<Result<T, ProviderError>>,
    ) -> Result<()> {
        match outcome {
            Ok(Err(ProviderError::CleanupFailed(failure))) => self
                .store
                .poison(id, &format!("{operation}: {}", cleanup_text(failure))),
            // Output lost without proof that the command's tree is gone:
            // it may still run, like an unconfirmed termination.
            Ok(Err(ProviderError::OutputLost(loss))) if !loss.tree_deleted => self
                .store
                .poison(id, &format!("{operation}: {}", loss_text(loss))),
            Err(error) => self.store.poison(
                id,
                &format!(
                    "{operation} stopped in the host ({}); termination unknown",
                    host_failure(error)
                ),
            ),
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
        self.component
            .instantiate(self.options(env, deadline, cancel, output))
    }

    /// An instance for an acquire or probe recorded as lease `record_id`:
    /// each sandbox id the provider reports (`host.record-sandbox`) is
    /// written to that record before the provider goes on, so a host that
    /// dies from then on leaves a lease that sweep destroys.
    fn creating_instance(
        &self,
        env: &Environment,
        record_id: &str,
        output: Option<OutputSink>,
    ) -> Result<ProviderInstance> {
        let store = self.store.clone();
        let id = record_id.to_owned();
        let recorder: SandboxRecorder = Arc::new(move |sandbox_id| {
            let lease = Lease {
                provider_lease_id: sandbox_id.to_owned(),
                metadata: "{}".into(),
                expires_at: None,
            };
            store.record_lease(&id, &lease, LeaseState::Acquiring)
        });
        let options = self
            .options(
                env,
                env.budget.lifecycle_deadline(),
                CancelToken::new(),
                output,
            )
            .with_sandbox_recorder(recorder);
        self.component.instantiate(options)
    }

    fn options(
        &self,
        env: &Environment,
        deadline: Duration,
        cancel: CancelToken,
        output: Option<OutputSink>,
    ) -> HostOptions {
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
        options
    }

    /// Cancels the lease's running operations and waits until they returned.
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
            .field("host", &self.host.id())
            .finish_non_exhaustive()
    }
}

/// The HTTP policy of a config (no rate limit yet): exactly the origins its
/// fields name (the component must ask for those and no other), each with
/// the secrets its field lists, in the header and scheme `description`
/// declares, by the operator's rules (see [`Secrets`]). A pure decision:
/// the shared secret-routing table (`node/test/scenarios/secret-routing.json`)
/// holds it and the Node host's `splitConfig` / `checkAskedOrigins`.
pub(crate) fn route_policy(
    description: &ProviderDescription,
    split: &SplitConfig,
    secrets: &Secrets,
    asked: &[String],
) -> Result<Policy> {
    let Some(first) = split.origins.first() else {
        bail!(
            "the provider declares no API origin field, so the host cannot allow it any \
             request; it does not follow the sandbox-provider contract (0.2.0 or later)"
        );
    };
    if asked.len() != split.origins.len() {
        bail!(
            "the provider asks for {} API origins ({}), but declares {} origin fields ({}); \
             the host sends requests only to the origins the config names",
            asked.len(),
            asked.join(", "),
            split.origins.len(),
            split
                .origins
                .iter()
                .map(|o| o.field.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (text, named) in asked.iter().zip(&split.origins) {
        let origin = Origin::parse(text)
            .with_context(|| format!("the provider's API origin {text:?} is not a valid origin"))?;
        if origin != named.origin {
            bail!(
                "the provider asks to send its requests to {origin}, but the config names \
                 {} (field {}); the host sends requests (and API keys) only to the origins \
                 the config names",
                named.origin,
                named.field
            );
        }
    }
    let mut policy = Policy::new(first.origin.clone());
    for origin in &split.origins[1..] {
        policy = policy.also_allow(origin.origin.clone());
    }
    // Per origin field and header (lower-case), the secret field it carries:
    // two secrets in one header of one origin are refused, naming both.
    let mut carried: HashMap<(&str, String), &str> = HashMap::new();
    for (field, secret) in &split.resolved {
        let Some(declared) = description
            .secrets
            .iter()
            .find(|s| &s.config_field == field)
        else {
            // The provider takes no such secret: it goes nowhere.
            continue;
        };
        let value = match &declared.scheme {
            Some(scheme) => format!("{scheme} {secret}"),
            None => secret.clone(),
        };
        for receiver in split
            .origins
            .iter()
            .filter(|o| o.secret_fields.contains(field))
        {
            if !receiver.named_by_config && !secrets.trusts(&receiver.origin) {
                bail!(
                    "config field {field} holds a secret, but the config does not name the API \
                     URL in field {} and the host does not trust the provider's default {} with \
                     it; set {} in the config",
                    receiver.field,
                    receiver.origin,
                    receiver.field
                );
            }
            check_secret_origin(&receiver.origin)?;
            let header = declared.header.to_ascii_lowercase();
            if let Some(earlier) = carried.insert((&receiver.field, header), field) {
                bail!(
                    "{}: secret fields {earlier} and {field} would both be sent in header {} to \
                     {}; the provider must declare one header per secret for an origin, so \
                     neither was sent",
                    receiver.field,
                    declared.header,
                    receiver.origin
                );
            }
            policy = policy.with_origin_secret(&receiver.origin, &declared.header, &value)?;
        }
    }
    Ok(policy)
}
