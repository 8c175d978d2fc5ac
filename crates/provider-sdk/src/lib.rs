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
//! - [`config`]: config objects, budgets and what `validate-config` says;
//! - [`operation`]: one operation's state, set up once by the export;
//! - [`http`]: 2xx answers, JSON, string and id fields;
//! - [`errors`]: API failures as the contract's error cases, receipts;
//! - [`origin`]: API URL rules (https, or http on loopback) and origins;
//! - [`output`]: per-stream UTF-8 decoding and the bounded output tail;
//! - [`script`]: command validation and the single-quoted bash script.
//!
//! ```ignore
//! struct Echo;
//! impl provider_sdk::Provider for Echo {
//!     type Config = EchoConfig; // a provider_sdk::config::ProviderConfig
//!     /* describe, acquire_lease, destroy_lease, execute, ... */
//! }
//! provider_sdk::export_provider!(Echo);
//! ```

#![deny(missing_docs)]
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

pub mod config;
pub mod errors;
pub mod http;
pub mod operation;
pub mod origin;
pub mod output;
pub mod platform;
pub mod script;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(all(target_os = "wasi", target_env = "p2"))]
#[doc(hidden)]
pub mod wasi_platform;

pub use operation::Operation;
pub use platform::Platform;

use config::ProviderConfig;
use types::*;

/// A sandbox provider in plain Rust: the operations of the WIT `provider`
/// interface (see `wit/since_v0.3.0/provider.wit` for what each must
/// prove).
///
/// The export ([`export_provider!`]) sets every operation up once before
/// the provider sees it: it parses the context's config as
/// [`Provider::Config`] (a bad one is `invalid-config`, before any
/// request), points a fresh platform at the config's first API origin,
/// and starts the operation's deadline ([`Operation::start`]). Before
/// `execute` it also checks the command ([`script::validate`]), so bad
/// input never causes a request.
///
/// A provider keeps no state between calls. Everything it knows comes from
/// the operation (config, context) and the lease's metadata.
pub trait Provider {
    /// The provider's config.
    type Config: ProviderConfig;

    /// Who the provider is, its config schema, capabilities, secrets and
    /// rate limit. Makes no request and cannot fail.
    fn describe() -> ProviderDescription;

    /// Checks and normalises a config without any request. Default:
    /// [`ProviderConfig::validate`] as the contract reports it.
    fn validate_config(config: &str) -> ConfigValidation {
        Self::Config::validate(config).into_contract()
    }

    /// Creates a sandbox, runs a marker command in it, and always deletes it.
    /// Default: `unsupported`.
    fn probe(_op: Operation<'_, Self::Config>) -> Result<ProbeReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no probe".into(),
        ))
    }

    /// Creates and prepares a sandbox.
    fn acquire_lease(
        op: Operation<'_, Self::Config>,
        request: &AcquireRequest,
    ) -> Result<Lease, ProviderError>;

    /// Resumes a released lease, or proves it expired. Default (a provider
    /// without `reusable-leases`): `unsupported`.
    fn resume_lease(
        _op: Operation<'_, Self::Config>,
        _lease: &Lease,
    ) -> Result<ResumeOutcome, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no reusable leases".into(),
        ))
    }

    /// Pauses (reusable) or deletes a lease. Default: [`destroy_lease`](Self::destroy_lease).
    fn release_lease(
        op: Operation<'_, Self::Config>,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        Self::destroy_lease(op, lease)
    }

    /// Deletes a lease's sandbox; a sandbox already gone is success.
    fn destroy_lease(
        op: Operation<'_, Self::Config>,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError>;

    /// Makes sure the remote working directory exists; returns its path.
    /// Default: `unsupported`.
    fn realize_workspace(
        _op: Operation<'_, Self::Config>,
        _lease: &Lease,
        _request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no workspace directories".into(),
        ))
    }

    /// Copies files into the sandbox. Without `native-sync`: `unsupported`.
    fn sync_in(
        _op: Operation<'_, Self::Config>,
        _lease: &Lease,
        _files: &[FileUpload],
    ) -> Result<SyncReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no file API (native-sync)".into(),
        ))
    }

    /// Reads files out of the sandbox. Without `native-sync`: `unsupported`.
    fn sync_out(
        _op: Operation<'_, Self::Config>,
        _lease: &Lease,
        _remote_paths: &[String],
    ) -> Result<Vec<FileDownload>, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no file API (native-sync)".into(),
        ))
    }

    /// Runs one command (already checked with [`script::validate`]) and
    /// returns its confirmed result.
    fn execute(
        op: Operation<'_, Self::Config>,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError>;
}

/// What [`export_provider!`] expands to: each WIT call as one operation of
/// `P` on a platform, set up once here.
#[doc(hidden)]
pub mod export {
    use super::*;

    /// Runs `f` as one operation of `P` ([`Operation::start`]).
    pub fn run<P: Provider, T>(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        f: impl FnOnce(Operation<'_, P::Config>) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        f(Operation::start(platform, ctx)?)
    }

    /// `execute`: the command is checked before the provider sees it.
    pub fn execute<P: Provider>(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        run::<P, _>(platform, ctx, |op| {
            script::validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
            P::execute(op, lease, request)
        })
    }
}

/// Exports a [`Provider`] as the component's `sandbox:provider/provider`
/// implementation: each call is one operation on a fresh WASI platform
/// ([`Provider`] says what is set up). Outside a `wasm32-wasip2` build it
/// expands to nothing, so the provider's protocol still builds and tests
/// natively and on `wasm32-unknown-unknown`.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        #[cfg(all(target_os = "wasi", target_env = "p2"))]
        const _: () = {
            use $crate::bindings::exports::sandbox::provider::provider::Guest;
            use $crate::export::run;
            use $crate::types::*;
            use $crate::wasi_platform::WasiPlatform;
            use $crate::Provider as _;

            type P = $provider;
            struct Export;

            impl Guest for Export {
                fn describe() -> ProviderDescription {
                    P::describe()
                }
                fn validate_config(config: String) -> ConfigValidation {
                    P::validate_config(&config)
                }
                fn probe(ctx: EnvironmentContext) -> Result<ProbeReport, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, P::probe)
                }
                fn acquire_lease(
                    ctx: EnvironmentContext,
                    request: AcquireRequest,
                ) -> Result<Lease, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::acquire_lease(op, &request)
                    })
                }
                fn resume_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<ResumeOutcome, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::resume_lease(op, &lease)
                    })
                }
                fn release_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::release_lease(op, &lease)
                    })
                }
                fn destroy_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::destroy_lease(op, &lease)
                    })
                }
                fn realize_workspace(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: WorkspaceRequest,
                ) -> Result<String, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::realize_workspace(op, &lease, &request)
                    })
                }
                fn sync_in(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    files: Vec<FileUpload>,
                ) -> Result<SyncReport, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::sync_in(op, &lease, &files)
                    })
                }
                fn sync_out(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    remote_paths: Vec<String>,
                ) -> Result<Vec<FileDownload>, ProviderError> {
                    run::<P, _>(&mut WasiPlatform::new(), &ctx, |op| {
                        P::sync_out(op, &lease, &remote_paths)
                    })
                }
                fn execute(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: ExecuteRequest,
                ) -> Result<ExecuteResult, ProviderError> {
                    $crate::export::execute::<P>(&mut WasiPlatform::new(), &ctx, &lease, &request)
                }
            }

    $crate::bindings::export_world!(Export with_types_in $crate::bindings);
        };
    };
}
