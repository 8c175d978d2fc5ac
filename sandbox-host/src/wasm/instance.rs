//! One provider instance (one store): the WIT operations as methods.

use anyhow::{bail, Result};
use wasmtime::Store;

use crate::wasm::bindings::types::{
    AcquireRequest, ConfigValidation, EgressPolicy, EnvironmentContext, ExecuteRequest,
    ExecuteResult, FileDownload, FileUpload, InteractionRequest, Lease, PortEndpoint, ProbeReport,
    ProviderDescription, ProviderError, ResumeOutcome, SyncReport, TemplateDeletion, TemplateInfo,
    TerminationReceipt, WorkspaceRequest,
};
use crate::wasm::bindings::SandboxProvider;
use crate::wasm::bindings::{v0_2, v0_3, v0_4, v0_5, v0_6};
use crate::wasm::cancel::CancelToken;
use crate::wasm::conv::Conv;
use crate::wasm::options::HostOptions;
use crate::wasm::result_text;
use crate::wasm::state::HostState;

/// Calls one operation on the contract the component was built for: the
/// first expression on a current component, the second (written once,
/// expanded for each older contract's bindings, converting the inputs and
/// the answer) on a 0.6.0, 0.5.0, 0.4.0, 0.3.0 or 0.2.0 one. A trap makes
/// the instance refuse further calls.
macro_rules! dispatch {
    (
        $self:ident, $operation:literal,
        |$g:ident, $s:ident| $current:expr,
        |$og:ident, $os:ident| $older:expr $(,)?
    ) => {{
        $self.enter()?;
        let store = &mut $self.store;
        let answer = match &$self.bindings {
            Bindings::Current(b) => {
                let ($g, $s) = (b.sandbox_provider_provider(), &mut *store);
                $current
            }
            Bindings::V0_6(b) => dispatch!(@older b, store, |$og, $os| $older),
            Bindings::V0_5(b) => dispatch!(@older b, store, |$og, $os| $older),
            Bindings::V0_4(b) => dispatch!(@older b, store, |$og, $os| $older),
            Bindings::V0_3(b) => dispatch!(@older b, store, |$og, $os| $older),
            Bindings::V0_2(b) => dispatch!(@older b, store, |$og, $os| $older),
        };
        $self.finish($operation, answer)
    }};
    (@older $b:ident, $store:ident, |$og:ident, $os:ident| $older:expr) => {{
        let ($og, $os) = ($b.sandbox_provider_provider(), &mut *$store);
        $older
    }};
}

/// The methods of the operations every contract version exports, each one
/// line: its arguments, its answer, its WIT name and the bindings' call.
/// On an older component each argument is converted to that contract's
/// copy of its type ([`older`]) and the answer back.
macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        $wit:literal via $call:ident:
        fn $method:ident($($arg:ident: &$ty:ty),*) -> $answer:ty;
    )*) => {$(
        $(#[$doc])*
        pub fn $method(&mut self, $($arg: &$ty),*) -> Result<$answer> {
            dispatch!(
                self,
                $wit,
                |g, s| g.$call(s, $($arg),*),
                |g, s| g.$call(s, $(&older($arg)),*).map(Conv::conv),
            )
        }
    )*};
}

/// The methods of the operations 0.7.0 added, each one line like
/// [`operations!`]'s: on a current component the bindings' call, on an
/// older one `unsupported` without entering it (nothing was asked of the
/// provider, nothing was made).
macro_rules! operations_since_0_7 {
    ($(
        $(#[$doc:meta])*
        $wit:literal via $call:ident:
        fn $method:ident($($arg:ident: $ty:ty),*) -> $answer:ty;
    )*) => {$(
        $(#[$doc])*
        ///
        /// A component built for a contract before 0.7.0 has no such
        /// operation: its answer is `unsupported`, and it was not entered.
        pub fn $method(&mut self, $($arg: $ty),*) -> Result<Result<$answer, ProviderError>> {
            self.enter()?;
            let Bindings::Current(b) = &self.bindings else {
                return Ok(Err(self.older_contract(concat!("`", $wit, "`"))));
            };
            let answer = b.sandbox_provider_provider().$call(&mut self.store, $($arg),*);
            self.finish($wit, answer)
        }
    )*};
}

/// An argument in an older contract's copy of its type.
fn older<T: ToOwned + ?Sized, O>(value: &T) -> O
where
    T::Owned: Conv<O>,
{
    value.to_owned().conv()
}

/// A live instance of a provider component, made by
/// [`ProviderComponent::instantiate`](crate::ProviderComponent::instantiate).
///
/// Every method returns `Err` for a trap or host failure (memory limit,
/// deadline, guest panic — see [`crate::trap_of`]); after one the
/// instance refuses further calls. The inner `Result` is the provider's
/// typed answer.
pub struct ProviderInstance {
    store: Store<HostState>,
    bindings: Bindings,
    options: HostOptions,
    trapped: bool,
}

impl ProviderInstance {
    pub(crate) fn new(store: Store<HostState>, bindings: Bindings, options: HostOptions) -> Self {
        ProviderInstance {
            store,
            bindings,
            options,
            trapped: false,
        }
    }

    /// Refuses to enter an instance that trapped.
    fn enter(&self) -> Result<()> {
        if self.trapped {
            bail!("the provider instance trapped earlier and cannot be entered again; instantiate a new one");
        }
        Ok(())
    }

    /// A call's answer; a trap makes the instance refuse further calls.
    fn finish<R>(&mut self, operation: &str, answer: wasmtime::Result<R>) -> Result<R> {
        answer.map_err(|error| {
            self.trapped = true;
            anyhow::Error::from(error).context(format!("provider {operation} failed"))
        })
    }

    /// `unsupported` for an operation (or a request) a component of an
    /// older contract cannot carry.
    fn older_contract(&self, what: &str) -> ProviderError {
        ProviderError::Unsupported(format!(
            "the provider component was built for contract {}, which has no {what}: \
             rebuild it with this release's provider SDK",
            self.contract_version()
        ))
    }

    operations! {
        /// `describe`: who the provider is. Cannot fail except by trapping.
        "describe" via call_describe:
        fn describe()
            -> ProviderDescription;
        /// `validate-config`: checks and normalises a config JSON object.
        "validate-config" via call_validate_config:
        fn validate_config(config: &str)
            -> ConfigValidation;
        /// `probe`: creates, exercises and deletes a sandbox.
        "probe" via call_probe:
        fn probe(ctx: &EnvironmentContext)
            -> Result<ProbeReport, ProviderError>;
        /// `resume-lease`.
        "resume-lease" via call_resume_lease:
        fn resume_lease(ctx: &EnvironmentContext, lease: &Lease)
            -> Result<ResumeOutcome, ProviderError>;
        /// `release-lease`.
        "release-lease" via call_release_lease:
        fn release_lease(ctx: &EnvironmentContext, lease: &Lease)
            -> Result<TerminationReceipt, ProviderError>;
        /// `destroy-lease`.
        "destroy-lease" via call_destroy_lease:
        fn destroy_lease(ctx: &EnvironmentContext, lease: &Lease)
            -> Result<TerminationReceipt, ProviderError>;
        /// `realize-workspace`: returns the remote working directory.
        "realize-workspace" via call_realize_workspace:
        fn realize_workspace(ctx: &EnvironmentContext, lease: &Lease, request: &WorkspaceRequest)
            -> Result<String, ProviderError>;
        /// `sync-in`: copies files into the sandbox.
        "sync-in" via call_sync_in:
        fn sync_in(ctx: &EnvironmentContext, lease: &Lease, files: &[FileUpload])
            -> Result<SyncReport, ProviderError>;
        /// `sync-out`: reads files out of the sandbox.
        "sync-out" via call_sync_out:
        fn sync_out(ctx: &EnvironmentContext, lease: &Lease, remote_paths: &[String])
            -> Result<Vec<FileDownload>, ProviderError>;
    }

    /// `execute`: runs one command. Live output goes to the options' sink;
    /// cancel with the options' [`CancelToken`].
    pub fn execute(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        let before_0_5 = !matches!(
            self.bindings,
            Bindings::Current(_) | Bindings::V0_6(_) | Bindings::V0_5(_)
        );
        let mut answer = dispatch!(
            self,
            "execute",
            |g, s| g.call_execute(s, ctx, lease, request),
            |g, s| g
                .call_execute(s, &older(ctx), &older(lease), &older(request))
                .map(Conv::conv),
        )?;
        // A component before 0.5.0 cannot be asked for less text: its
        // answer is cut here, so every component's result follows the
        // request's `result-chars`.
        if let (true, Some(chars)) = (before_0_5, request.result_chars) {
            result_text::keep_last_chars(&mut answer, chars);
        }
        Ok(answer)
    }

    /// `acquire-lease`. A component built for a contract before 0.7.0 is
    /// not entered for a request it cannot carry (an egress policy other
    /// than `unrestricted`, an image, a template): the answer is
    /// `unsupported`, and nothing was made. Its `adapter-type` is dropped
    /// (it only picks among the config's images, which such a provider
    /// does not have per adapter).
    pub fn acquire_lease(
        &mut self,
        ctx: &EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<Result<Lease, ProviderError>> {
        if !matches!(self.bindings, Bindings::Current(_)) {
            if let Some(what) = beyond_0_6(request) {
                self.enter()?;
                return Ok(Err(self.older_contract(what)));
            }
        }
        dispatch!(
            self,
            "acquire-lease",
            |g, s| g.call_acquire_lease(s, ctx, request),
            |g, s| g
                .call_acquire_lease(s, &older(ctx), &older(request))
                .map(Conv::conv),
        )
    }

    /// `interact` (contract 0.6.0): runs one interactive process until it
    /// ends, taking the events of the options' [`Interaction`](crate::Interaction)
    /// while it runs; live output goes to the options' sink (a terminal's
    /// as [`OutputStream::Terminal`](crate::types::OutputStream::Terminal)).
    /// A component built for an earlier contract has no such operation:
    /// its answer is `unsupported`, and nothing was started.
    pub fn interact(
        &mut self,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &InteractionRequest,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        self.enter()?;
        let answer = match &self.bindings {
            Bindings::Current(b) => {
                b.sandbox_provider_provider()
                    .call_interact(&mut self.store, ctx, lease, request)
            }
            Bindings::V0_6(b) => b
                .sandbox_provider_provider()
                .call_interact(&mut self.store, &older(ctx), &older(lease), &older(request))
                .map(Conv::conv),
            _ => return Ok(Err(self.older_contract("interactive processes (0.6.0)"))),
        };
        self.finish("interact", answer)
    }

    operations_since_0_7! {
        /// `set-egress`: replaces the egress policy of a live lease's
        /// sandbox and returns the lease recording it.
        "set-egress" via call_set_egress:
        fn set_egress(ctx: &EnvironmentContext, lease: &Lease, policy: &EgressPolicy)
            -> Lease;
        /// `open-port`: makes a port of the lease's sandbox reachable from
        /// outside; its URL and the (secret) headers that guard it.
        "open-port" via call_open_port:
        fn open_port(ctx: &EnvironmentContext, lease: &Lease, port: u16)
            -> PortEndpoint;
        /// `capture-template`: keeps the lease's sandbox's files as a
        /// template (the sandbox is left paused or stopped).
        "capture-template" via call_capture_template:
        fn capture_template(ctx: &EnvironmentContext, lease: &Lease, name: &str)
            -> TemplateInfo;
        /// `list-templates`: the context's templates, oldest first.
        "list-templates" via call_list_templates:
        fn list_templates(ctx: &EnvironmentContext)
            -> Vec<TemplateInfo>;
        /// `delete-template`: deletes one of the context's templates.
        "delete-template" via call_delete_template:
        fn delete_template(ctx: &EnvironmentContext, template_ref: &str)
            -> TemplateDeletion;
    }

    /// The contract version of the component (for messages).
    fn contract_version(&self) -> &'static str {
        match &self.bindings {
            Bindings::Current(_) => "0.7.0",
            Bindings::V0_6(_) => "0.6.0",
            Bindings::V0_5(_) => "0.5.0",
            Bindings::V0_4(_) => "0.4.0",
            Bindings::V0_3(_) => "0.3.0",
            Bindings::V0_2(_) => "0.2.0",
        }
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

/// The instantiated world of the contract version the component was built for.
pub(crate) enum Bindings {
    Current(SandboxProvider),
    V0_6(v0_6::SandboxProvider),
    V0_5(v0_5::SandboxProvider),
    V0_4(v0_4::SandboxProvider),
    V0_3(v0_3::SandboxProvider),
    V0_2(v0_2::SandboxProvider),
}

/// What an acquire request asks for that a contract before 0.7.0 cannot
/// carry, in words, if anything: an egress policy other than
/// `unrestricted` (what such a provider gives anyway), an image, a
/// template. Never dropped: the host refuses such a request.
fn beyond_0_6(request: &AcquireRequest) -> Option<&'static str> {
    if matches!(
        request.egress,
        Some(EgressPolicy::BlockAll | EgressPolicy::Allow(_))
    ) {
        Some("egress policy (0.7.0), so it cannot enforce the requested one")
    } else if request.image.is_some() {
        Some("image choice (0.7.0), so it cannot start from the requested image")
    } else if request.template.is_some() {
        Some("templates (0.7.0), so it cannot start from the requested template")
    } else {
        None
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
