//! The lease operations with their store bookkeeping: probe, acquire,
//! execute, realize, resume, release, destroy and sweep, each recorded,
//! marked and poisoned in the lease store as [`SandboxRuntime`] describes.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::outcome::{action_name, host_failure};
use super::relay::{with_unconsumed, Relay};
use super::{Environment, SandboxRuntime};
use crate::leases::backend::LeaseRecord;
use crate::leases::rules::{LeaseState, Operation};
use crate::messages::{cleanup_text, error_text, loss_text};
use crate::wasm::bindings::types::{
    AcquireRequest, CleanupFailure, ExecuteRequest, ExecuteResult, InteractionRequest, Lease,
    ProbeReport, ProviderError, ResumeOutcome, TerminationReceipt, WorkspaceRequest,
};
use crate::wasm::cancel::CancelToken;
use crate::wasm::interaction::Interaction;
use crate::wasm::options::{chunk_sink, OutputSink};

impl SandboxRuntime {
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
            .creating_instance(env, &record.id, output.map(chunk_sink))
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
    /// trap or an unconfirmed creation without an id. A request asking for
    /// an egress policy, an image or a template the provider's
    /// capabilities do not claim is refused (`unsupported`) before
    /// anything is recorded or asked of the provider.
    pub fn acquire(
        &self,
        env: &Environment,
        request: &AcquireRequest,
    ) -> Result<Result<LeaseRecord, ProviderError>> {
        if let Some(refused) = self.acquire_refusal(request) {
            return Ok(Err(refused));
        }
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
    /// [`crate::messages::OUTPUT_SINK`]. `cancel` (or a release/destroy of the lease)
    /// stops it. A trap, `cleanup-failed`, or `output-lost` without a
    /// confirmed deletion of the command's tree poisons the lease.
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
            .deadlines
            .execute_deadline(request.timeout_ms.map(Duration::from_millis));
        let timeout = request
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(env.deadlines.timeout);
        let (output, relay) = output
            .map(|sink| Relay::start(sink, timeout, cancel.clone()))
            .unzip();
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

    /// `interact` (contract 0.6.0) on an active lease: runs one
    /// interactive process until it ends, taking `interaction`'s events
    /// (the caller sends them from any thread; it decides what may be
    /// sent, see [`crate::Interaction`]). Live output, the
    /// timeout, cancellation and poisoning are `execute`'s: a trap,
    /// `cleanup-failed`, or `output-lost` without a confirmed deletion of
    /// the process's tree poisons the lease.
    pub fn interact(
        &self,
        env: &Environment,
        lease_id: &str,
        request: &InteractionRequest,
        interaction: Interaction,
        output: Option<OutputSink>,
        cancel: CancelToken,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        let (_, lease, _using) =
            self.begin_use(env, lease_id, Operation::Execute, cancel.clone())?;
        let deadline = env
            .deadlines
            .execute_deadline(request.timeout_ms.map(Duration::from_millis));
        let timeout = request
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(env.deadlines.timeout);
        let (output, relay) = output
            .map(|sink| Relay::start(sink, timeout, cancel.clone()))
            .unzip();
        let options = self
            .options(env, deadline, cancel, output)
            .with_interaction(interaction);
        let outcome = self
            .component
            .instantiate(options)
            .and_then(|mut instance| instance.interact(&env.ctx, &lease, request));
        let outcome = match relay {
            Some(relay) => with_unconsumed(outcome, relay.finish()),
            None => outcome,
        };
        self.poison_on_failure(lease_id, "interact", &outcome)?;
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
            .instance(env, env.deadlines.lifecycle_deadline(), cancel, None)
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
            .instance(env, env.deadlines.lifecycle_deadline(), cancel, None)
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
                env.deadlines.lifecycle_deadline(),
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
                env.deadlines.lifecycle_deadline(),
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

    pub(super) fn record(&self, id: &str) -> Result<LeaseRecord> {
        self.store
            .get(id)?
            .with_context(|| format!("no lease {id} in the lease store"))
    }

    pub(super) fn poison_on_failure<T>(
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
}
