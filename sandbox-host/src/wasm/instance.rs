//! One provider instance (one store): the WIT operations as methods.

use anyhow::{bail, Result};
use wasmtime::Store;

use crate::bindings::exports_provider::Guest;
use crate::bindings::types::{
    AcquireRequest, ConfigValidation, EnvironmentContext, ExecuteRequest, ExecuteResult,
    FileDownload, FileUpload, Lease, ProbeReport, ProviderDescription, ProviderError,
    ResumeOutcome, SyncReport, TerminationReceipt, WorkspaceRequest,
};
use crate::bindings::SandboxProvider;
use crate::cancel::CancelToken;
use crate::options::HostOptions;
use crate::state::HostState;

/// A live instance of a provider component, made by
/// [`ProviderComponent::instantiate`](crate::ProviderComponent::instantiate).
///
/// Every method returns `Err` for a trap or host failure (memory limit,
/// deadline, guest panic — see [`trap_of`](crate::trap_of)); after one the
/// instance refuses further calls. The inner `Result` is the provider's
/// typed answer.
pub struct ProviderInstance {
    store: Store<HostState>,
    bindings: SandboxProvider,
    options: HostOptions,
    trapped: bool,
}

impl ProviderInstance {
    pub(crate) fn new(
        store: Store<HostState>,
        bindings: SandboxProvider,
        options: HostOptions,
    ) -> Self {
        ProviderInstance {
            store,
            bindings,
            options,
            trapped: false,
        }
    }

    fn call<R>(
        &mut self,
        operation: &str,
        f: impl FnOnce(&Guest, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R> {
        if self.trapped {
            bail!("the provider instance trapped earlier and cannot be entered again; instantiate a new one");
        }
        let guest = self.bindings.sandbox_provider_provider();
        match f(guest, &mut self.store) {
            Ok(value) => Ok(value),
            Err(error) => {
                self.trapped = true;
                Err(anyhow::Error::from(error).context(format!("provider {operation} failed")))
            }
        }
    }

    /// `describe`: who the provider is. Cannot fail except by trapping.
    pub fn describe(&mut self) -> Result<ProviderDescription> {
        self.call("describe", |g, s| g.call_describe(s))
    }

    /// `validate-config`: checks and normalises a config JSON object.
    pub fn validate_config(&mut self, config: &str) -> Result<ConfigValidation> {
        self.call("validate-config", |g, s| g.call_validate_config(s, config))
    }

    /// `probe`: creates, exercises and deletes a sandbox.
    pub fn probe(
        &mut self,
        ctx: &EnvironmentContext,
    ) -> Result<Result<ProbeReport, ProviderError>> {
        self.call("probe", |g, s| g.call_probe(s, ctx))
    }

    /// `acquire-lease`.
    pub fn acquire_lease(
        &mut self,
        ctx: &EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<Result<Lease, ProviderError>> {
        self.call("acquire-lease", |g, s| {
            g.call_acquire_lease(s, ctx, request)
        })
    }

    /// `resume-lease`.
    pub fn resume_lease(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<Result<ResumeOutcome, ProviderError>> {
        self.call("resume-lease", |g, s| g.call_resume_lease(s, ctx, lease))
    }

    /// `release-lease`.
    pub fn release_lease(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        self.call("release-lease", |g, s| g.call_release_lease(s, ctx, lease))
    }

    /// `destroy-lease`.
    pub fn destroy_lease(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<Result<TerminationReceipt, ProviderError>> {
        self.call("destroy-lease", |g, s| g.call_destroy_lease(s, ctx, lease))
    }

    /// `realize-workspace`: returns the remote working directory.
    pub fn realize_workspace(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &WorkspaceRequest,
    ) -> Result<Result<String, ProviderError>> {
        self.call("realize-workspace", |g, s| {
            g.call_realize_workspace(s, ctx, lease, request)
        })
    }

    /// `sync-in`: copies files into the sandbox.
    pub fn sync_in(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        files: &[FileUpload],
    ) -> Result<Result<SyncReport, ProviderError>> {
        self.call("sync-in", |g, s| g.call_sync_in(s, ctx, lease, files))
    }

    /// `sync-out`: reads files out of the sandbox.
    pub fn sync_out(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        remote_paths: &[String],
    ) -> Result<Result<Vec<FileDownload>, ProviderError>> {
        self.call("sync-out", |g, s| {
            g.call_sync_out(s, ctx, lease, remote_paths)
        })
    }

    /// `execute`: runs one command. Live output goes to the options' sink;
    /// cancel with the options' [`CancelToken`].
    pub fn execute(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        self.call("execute", |g, s| g.call_execute(s, ctx, lease, request))
    }

    /// The cancel token of this instance; cancelling it (from any thread)
    /// makes the guest's `host.cancellation()` pollable ready.
    pub fn cancel_token(&self) -> CancelToken {
        self.options.cancel.clone()
    }

    /// What the guest wrote to stderr, with [`GuestStderr::Capture`](crate::GuestStderr::Capture).
    pub fn guest_stderr(&self) -> Option<String> {
        self.store.data().stderr.as_ref().map(|s| s.contents())
    }

    /// Whether a previous call trapped (the instance is then unusable).
    pub fn has_trapped(&self) -> bool {
        self.trapped
    }
}

/// The wasmtime trap behind an error from a [`ProviderInstance`] method,
/// if it was one (for example `Trap::Interrupt` for the deadline,
/// `Trap::UnreachableCodeReached` for a guest panic).
pub fn trap_of(error: &anyhow::Error) -> Option<wasmtime::Trap> {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<wasmtime::Trap>())
        .copied()
}
