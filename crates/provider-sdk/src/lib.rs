//! The guest side of the `sandbox-provider` WIT world (`wit/since_v0.3.0`),
//! shared by every provider component.
//!
//! A provider holds only its API knowledge: it implements [`Provider`] in
//! plain Rust over the [`Platform`] trait and exports it with
//! [`export_provider!`]. The SDK owns everything else:
//! - [`bindings`]: the world's bindings, generated once;
//! - [`types`]: the contract's data types, used as the provider's own;
//! - [`platform`]: HTTP, clocks, randomness, live output and cancellation as
//!   a trait, so a provider's protocol runs natively in unit tests
//!   ([`testing::FakePlatform`] with the `testing` feature);
//! - `wasi_platform`: that trait over the WASI imports (in the component);
//! - [`errors`]: API failures as the contract's error cases;
//! - [`origin`]: API URL rules (https, or http on loopback) and origins;
//! - [`output`]: per-stream UTF-8 decoding and the bounded output tail;
//! - [`script`]: command validation and the single-quoted bash script.
//!
//! ```ignore
//! struct Echo;
//! impl provider_sdk::Provider for Echo { /* describe, validate_config, ... */ }
//! provider_sdk::export_provider!(Echo);
//! ```

// `ProviderError` is the WIT variant itself (its cleanup case carries the
// partial output); it is returned once per call, so its size is no concern.
#![allow(clippy::result_large_err)]

/// The world's generated bindings. Providers use [`types`] and the
/// [`Provider`] trait; the raw WASI imports are for the SDK's platform.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/since_v0.3.0",
        world: "sandbox-provider",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "provider_sdk::bindings",
    });
}

/// The contract's types (`sandbox:provider/types`), used as every
/// provider's own data types so the WIT stays the single source.
pub mod types {
    pub use crate::bindings::sandbox::provider::host::OutputStream;
    pub use crate::bindings::sandbox::provider::types::{
        AcquireRequest, ApiRejection, Capabilities, CleanupCause, CleanupFailure, CleanupPhase,
        ConfigValidation, EnvironmentContext, ExecuteRequest, ExecuteResult, FileDownload,
        FileUpload, InvalidResponse, Lease, OperationBudget, OriginField, OutputLoss,
        PartialOutput, ProbeReport, ProviderDescription, ProviderError, RateLimit, ResumeOutcome,
        SecretField, SyncReport, TerminationAction, TerminationReceipt, TransportFailure,
        TransportKind, WorkspaceRequest,
    };
}

pub mod errors;
pub mod origin;
pub mod output;
pub mod platform;
pub mod script;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(all(target_os = "wasi", target_env = "p2"))]
#[doc(hidden)]
pub mod wasi_platform;

pub use platform::Platform;

use types::*;

/// A sandbox provider in plain Rust: the operations of the WIT `provider`
/// interface (see `wit/since_v0.3.0/provider.wit` for what each must
/// prove), each given a fresh [`Platform`] for the call.
///
/// A provider keeps no state between calls. Everything it knows comes from
/// the call's arguments (the config inside the environment context, the
/// lease's metadata).
pub trait Provider {
    /// Who the provider is, its config schema, capabilities, secrets and
    /// rate limit. Makes no request and cannot fail.
    fn describe() -> ProviderDescription;

    /// Checks and normalises a config without any request.
    fn validate_config(config: &str) -> ConfigValidation;

    /// Creates a sandbox, runs a marker command in it, and always deletes it.
    /// Default: `unsupported`.
    fn probe(
        _platform: &mut dyn Platform,
        _ctx: &EnvironmentContext,
    ) -> Result<ProbeReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no probe".into(),
        ))
    }

    /// Creates and prepares a sandbox.
    fn acquire_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<Lease, ProviderError>;

    /// Resumes a released lease, or proves it expired. Default (a provider
    /// without `reusable-leases`): `unsupported`.
    fn resume_lease(
        _platform: &mut dyn Platform,
        _ctx: &EnvironmentContext,
        _lease: &Lease,
    ) -> Result<ResumeOutcome, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no reusable leases".into(),
        ))
    }

    /// Pauses (reusable) or deletes a lease. Default: [`destroy_lease`](Self::destroy_lease).
    fn release_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        Self::destroy_lease(platform, ctx, lease)
    }

    /// Deletes a lease's sandbox; a sandbox already gone is success.
    fn destroy_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError>;

    /// Makes sure the remote working directory exists; returns its path.
    /// Default: `unsupported`.
    fn realize_workspace(
        _platform: &mut dyn Platform,
        _ctx: &EnvironmentContext,
        _lease: &Lease,
        _request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no workspace directories".into(),
        ))
    }

    /// Copies files into the sandbox. Without `native-sync`: `unsupported`.
    fn sync_in(
        _platform: &mut dyn Platform,
        _ctx: &EnvironmentContext,
        _lease: &Lease,
        _files: &[FileUpload],
    ) -> Result<SyncReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no file API (native-sync)".into(),
        ))
    }

    /// Reads files out of the sandbox. Without `native-sync`: `unsupported`.
    fn sync_out(
        _platform: &mut dyn Platform,
        _ctx: &EnvironmentContext,
        _lease: &Lease,
        _remote_paths: &[String],
    ) -> Result<Vec<FileDownload>, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no file API (native-sync)".into(),
        ))
    }

    /// Runs one command and returns its confirmed result.
    fn execute(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError>;
}

/// Exports a [`Provider`] as the component's `sandbox:provider/provider`
/// implementation: each call gets a fresh WASI platform. Outside a
/// `wasm32-wasip2` build it expands to nothing, so the provider's protocol
/// still builds and tests natively and on `wasm32-unknown-unknown`.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        #[cfg(all(target_os = "wasi", target_env = "p2"))]
        const _: () = {
            use $crate::bindings::exports::sandbox::provider::provider::Guest;
            use $crate::types::*;
            use $crate::wasi_platform::WasiPlatform;
            use $crate::Provider as _;

            struct Export;

            impl Guest for Export {
                fn describe() -> ProviderDescription {
                    <$provider>::describe()
                }
                fn validate_config(config: String) -> ConfigValidation {
                    <$provider>::validate_config(&config)
                }
                fn probe(ctx: EnvironmentContext) -> Result<ProbeReport, ProviderError> {
                    <$provider>::probe(&mut WasiPlatform::new(), &ctx)
                }
                fn acquire_lease(
                    ctx: EnvironmentContext,
                    request: AcquireRequest,
                ) -> Result<Lease, ProviderError> {
                    <$provider>::acquire_lease(&mut WasiPlatform::new(), &ctx, &request)
                }
                fn resume_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<ResumeOutcome, ProviderError> {
                    <$provider>::resume_lease(&mut WasiPlatform::new(), &ctx, &lease)
                }
                fn release_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    <$provider>::release_lease(&mut WasiPlatform::new(), &ctx, &lease)
                }
                fn destroy_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    <$provider>::destroy_lease(&mut WasiPlatform::new(), &ctx, &lease)
                }
                fn realize_workspace(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: WorkspaceRequest,
                ) -> Result<String, ProviderError> {
                    <$provider>::realize_workspace(&mut WasiPlatform::new(), &ctx, &lease, &request)
                }
                fn sync_in(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    files: Vec<FileUpload>,
                ) -> Result<SyncReport, ProviderError> {
                    <$provider>::sync_in(&mut WasiPlatform::new(), &ctx, &lease, &files)
                }
                fn sync_out(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    remote_paths: Vec<String>,
                ) -> Result<Vec<FileDownload>, ProviderError> {
                    <$provider>::sync_out(&mut WasiPlatform::new(), &ctx, &lease, &remote_paths)
                }
                fn execute(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: ExecuteRequest,
                ) -> Result<ExecuteResult, ProviderError> {
                    <$provider>::execute(&mut WasiPlatform::new(), &ctx, &lease, &request)
                }
            }

    $crate::bindings::export_world!(Export with_types_in $crate::bindings);
        };
    };
}
