//! The guest side of the `sandbox-provider` WIT world (`wit/since_v0.7.0`),
//! shared by every provider component.
//!
//! A provider holds only its API knowledge: it implements [`Provider`] in
//! plain Rust over the [`Platform`] trait and exports it with
//! [`export_provider!`]. The SDK owns everything else:
//! - [`bindings`]: the world's bindings, generated once;
//! - [`types`]: the contract's data types, used as the provider's own;
//! - [`platform`]: HTTP, clocks, randomness, live output, cancellation and
//!   the host's interaction events as a trait, so a provider's protocol runs natively in unit tests
//!   (`testing::FakePlatform` with the `testing` feature);
//! - `wasi_platform`: that trait over the WASI imports (in the component);
//! - [`config`]: config objects, budgets and what `validate-config` says;
//! - [`Operation`]: one operation's state, set up once by the export;
//! - [`http`]: 2xx answers, JSON, string and id fields;
//! - [`errors`]: API failures as the contract's error cases, receipts;
//! - [`origin`]: API URL rules (https, or http on loopback) and origins;
//! - [`output`]: live output as the bytes the command printed, and the
//!   bounded output tail (text, lossy UTF-8);
//! - [`script`]: command validation and the single-quoted bash script;
//! - [`interaction`]: signal names and base64 input for `interact`;
//! - [`egress`], [`templates`], [`acquire`]: the environment policy of
//!   contract 0.7.0 (egress allow-lists normalised and parsed, template
//!   names and references bound to the company and environment, adapter
//!   types and images), checked once here for every provider.
//!
//! ```ignore
//! struct Echo<'a>(provider_sdk::Operation<'a, EchoConfig>);
//! impl<'a> provider_sdk::Provider<'a> for Echo<'a> {
//!     type Config = EchoConfig; // a provider_sdk::config::ProviderConfig
//!     fn new(op: provider_sdk::Operation<'a, EchoConfig>) -> Self { Echo(op) }
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
        path: "../../wit/since_v0.7.0",
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
        ConfigValidation, EgressPolicy, EnvironmentContext, ExecuteRequest, ExecuteResult,
        FileDownload, FileUpload, InteractionEvent, InteractionRequest, InteractionSignal,
        InvalidResponse, Lease, OperationBudget, OriginField, OutputLoss, PartialOutput,
        PortEndpoint, ProbeReport, ProviderDescription, ProviderError, RateLimit, ResumeOutcome,
        SecretField, SyncReport, TemplateDeletion, TemplateInfo, TerminalSize, TerminationAction,
        TerminationReceipt, TransportFailure, TransportKind, WorkspaceRequest,
    };
}

pub mod acquire;
pub mod config;
pub mod egress;
pub mod errors;
pub mod http;
pub mod interaction;
mod operation;
pub mod origin;
pub mod output;
pub mod platform;
pub mod script;
pub mod templates;

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
/// interface (see `wit/since_v0.7.0/provider.wit` for what each must
/// prove), as methods of one operation's state.
///
/// The export ([`export_provider!`]) sets every operation up once before
/// the provider sees it: it parses the context's config as
/// [`Provider::Config`] (a bad one is `invalid-config`, before any
/// request), points a fresh platform at the config's first API origin,
/// starts the operation's deadline ([`Operation::start`]) and makes the
/// provider's state of it with [`Provider::new`]. Before `execute` it also
/// checks the command ([`script::validate`], and
/// [`script::validate_interaction`] before `interact`), so bad input never
/// causes a request.
///
/// The state lives for one operation: a provider keeps nothing between
/// calls. Everything it knows comes from the operation (config, context)
/// and the lease's metadata.
pub trait Provider<'a>: Sized {
    /// The provider's config.
    type Config: ProviderConfig;

    /// The provider's state for one operation.
    fn new(op: Operation<'a, Self::Config>) -> Self;

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
    fn probe(&mut self) -> Result<ProbeReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no probe".into(),
        ))
    }

    /// Creates and prepares a sandbox. The request's environment policy
    /// was already checked ([`acquire::AcquirePolicy::of`]); a provider
    /// refuses what it does not support (`unsupported`) before any request.
    fn acquire_lease(&mut self, request: &AcquireRequest) -> Result<Lease, ProviderError>;

    /// Resumes a released lease, or proves it expired. Default (a provider
    /// without `reusable-leases`): `unsupported`.
    fn resume_lease(&mut self, _lease: &Lease) -> Result<ResumeOutcome, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no reusable leases".into(),
        ))
    }

    /// Pauses (reusable) or deletes a lease. Default: [`destroy_lease`](Self::destroy_lease).
    fn release_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        self.destroy_lease(lease)
    }

    /// Deletes a lease's sandbox; a sandbox already gone is success.
    fn destroy_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError>;

    /// Makes sure the remote working directory exists; returns its path.
    /// Default: `unsupported`.
    fn realize_workspace(
        &mut self,
        _lease: &Lease,
        _request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no workspace directories".into(),
        ))
    }

    /// Copies files into the sandbox. Without `native-sync`: `unsupported`.
    fn sync_in(
        &mut self,
        _lease: &Lease,
        _files: &[FileUpload],
    ) -> Result<SyncReport, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no file API (native-sync)".into(),
        ))
    }

    /// Reads files out of the sandbox. Without `native-sync`: `unsupported`.
    fn sync_out(
        &mut self,
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
        &mut self,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError>;

    /// Runs one interactive process (already checked with
    /// [`script::validate_interaction`]) until it ends: it calls
    /// [`Platform::interaction_started`] once the process exists, carries
    /// out the host's events ([`Platform::next_interaction_event`], waited
    /// for with [`platform::BodyReader::next_chunk_or_event`]) and forwards
    /// the output live (a terminal's as [`platform::StreamId::Terminal`]).
    /// Default (a provider without `login-pty` or `duplex-channels`):
    /// `unsupported`, before any request.
    fn interact(
        &mut self,
        _lease: &Lease,
        _request: &InteractionRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider cannot run interactive processes".into(),
        ))
    }

    /// Replaces a live lease's egress policy (already normalised) and
    /// returns the lease recording it. Default (a provider without
    /// `egress-policy`): `unsupported`, before any request.
    fn set_egress(
        &mut self,
        _lease: &Lease,
        _policy: &egress::Egress,
    ) -> Result<Lease, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider cannot set a sandbox's egress policy".into(),
        ))
    }

    /// Makes a port (1-65535, already checked) of the lease's sandbox
    /// reachable from outside. Default (a provider without `ports`):
    /// `unsupported`, before any request.
    fn open_port(&mut self, _lease: &Lease, _port: u16) -> Result<PortEndpoint, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider cannot open a sandbox's ports".into(),
        ))
    }

    /// Keeps the lease's sandbox's files as template `name` (already
    /// checked with [`templates::check_name`]). Default (a provider without
    /// `templates`): `unsupported`, before any request.
    fn capture_template(
        &mut self,
        _lease: &Lease,
        _name: &str,
    ) -> Result<TemplateInfo, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no templates".into(),
        ))
    }

    /// The templates of the context's company and environment, oldest
    /// first. Default: `unsupported`, before any request.
    fn list_templates(&mut self) -> Result<Vec<TemplateInfo>, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no templates".into(),
        ))
    }

    /// Deletes a template of the context's company and environment (its
    /// reference already checked with [`templates::name_of`]). Default:
    /// `unsupported`, before any request.
    fn delete_template(&mut self, _template_ref: &str) -> Result<TemplateDeletion, ProviderError> {
        Err(ProviderError::Unsupported(
            "this provider has no templates".into(),
        ))
    }
}

/// What [`export_provider!`] expands to: each WIT call as one operation of
/// `P` on a platform, set up once here.
#[doc(hidden)]
pub mod export {
    use super::*;

    /// Runs `f` on the state of one operation of `P` ([`Operation::start`]).
    pub fn run<'a, P: Provider<'a>, T>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        f: impl FnOnce(&mut P) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        f(&mut P::new(Operation::start(platform, ctx)?))
    }

    /// `execute`: the command is checked before the provider sees it.
    pub fn execute<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            script::validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
            provider.execute(lease, request)
        })
    }

    /// `acquire-lease`: the request's environment policy is checked before
    /// the provider sees it.
    pub fn acquire<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<Lease, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            acquire::AcquirePolicy::of(ctx, request)?;
            provider.acquire_lease(request)
        })
    }

    /// `set-egress`: the policy is normalised before the provider sees it.
    pub fn set_egress<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        lease: &Lease,
        policy: &EgressPolicy,
    ) -> Result<Lease, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            provider.set_egress(lease, &egress::normalize(policy)?)
        })
    }

    /// `open-port`: port 0 is refused before the provider sees it.
    pub fn open_port<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        lease: &Lease,
        port: u16,
    ) -> Result<PortEndpoint, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            if port == 0 {
                return Err(ProviderError::InvalidRequest(
                    "a port is from 1 to 65535".into(),
                ));
            }
            provider.open_port(lease, port)
        })
    }

    /// `capture-template`: the name is checked before the provider sees it.
    pub fn capture_template<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        lease: &Lease,
        name: &str,
    ) -> Result<TemplateInfo, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            templates::check_name(name)?;
            provider.capture_template(lease, name)
        })
    }

    /// `delete-template`: a reference of another company or environment is
    /// refused before the provider sees it.
    pub fn delete_template<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        template_ref: &str,
    ) -> Result<TemplateDeletion, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            templates::name_of(ctx, template_ref)?;
            provider.delete_template(template_ref)
        })
    }

    /// `interact`: the request is checked before the provider sees it.
    pub fn interact<'a, P: Provider<'a>>(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        lease: &Lease,
        request: &InteractionRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        run(platform, ctx, |provider: &mut P| {
            script::validate_interaction(request)
                .map_err(|e| ProviderError::InvalidRequest(e.0))?;
            provider.interact(lease, request)
        })
    }
}

/// Exports a [`Provider`] as the component's `sandbox:provider/provider`
/// implementation: each call is one operation on a fresh WASI platform
/// ([`Provider`] says what is set up). Give the state's type without its
/// lifetime (`export_provider!(MyProvider)` for `MyProvider<'a>`).
/// Outside a `wasm32-wasip2` build it expands to nothing, so the
/// provider's protocol still builds and tests natively and on
/// `wasm32-unknown-unknown`.
#[macro_export]
macro_rules! export_provider {
    ($provider:ident) => {
        #[cfg(all(target_os = "wasi", target_env = "p2"))]
        const _: () = {
            use $crate::bindings::exports::sandbox::provider::provider::Guest;
            use $crate::export::run;
            use $crate::types::*;
            use $crate::wasi_platform::WasiPlatform;
            use $crate::Provider;

            struct Export;

            impl Guest for Export {
                fn describe() -> ProviderDescription {
                    <$provider<'_> as Provider<'_>>::describe()
                }
                fn validate_config(config: String) -> ConfigValidation {
                    <$provider<'_> as Provider<'_>>::validate_config(&config)
                }
                fn probe(ctx: EnvironmentContext) -> Result<ProbeReport, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.probe()
                    })
                }
                fn acquire_lease(
                    ctx: EnvironmentContext,
                    request: AcquireRequest,
                ) -> Result<Lease, ProviderError> {
                    $crate::export::acquire::<$provider>(&mut WasiPlatform::new(), &ctx, &request)
                }
                fn resume_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<ResumeOutcome, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.resume_lease(&lease)
                    })
                }
                fn release_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.release_lease(&lease)
                    })
                }
                fn destroy_lease(
                    ctx: EnvironmentContext,
                    lease: Lease,
                ) -> Result<TerminationReceipt, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.destroy_lease(&lease)
                    })
                }
                fn realize_workspace(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: WorkspaceRequest,
                ) -> Result<String, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.realize_workspace(&lease, &request)
                    })
                }
                fn sync_in(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    files: Vec<FileUpload>,
                ) -> Result<SyncReport, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.sync_in(&lease, &files)
                    })
                }
                fn sync_out(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    remote_paths: Vec<String>,
                ) -> Result<Vec<FileDownload>, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.sync_out(&lease, &remote_paths)
                    })
                }
                fn execute(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: ExecuteRequest,
                ) -> Result<ExecuteResult, ProviderError> {
                    $crate::export::execute::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &lease,
                        &request,
                    )
                }
                fn interact(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    request: InteractionRequest,
                ) -> Result<ExecuteResult, ProviderError> {
                    $crate::export::interact::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &lease,
                        &request,
                    )
                }
                fn set_egress(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    policy: EgressPolicy,
                ) -> Result<Lease, ProviderError> {
                    $crate::export::set_egress::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &lease,
                        &policy,
                    )
                }
                fn open_port(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    port: u16,
                ) -> Result<PortEndpoint, ProviderError> {
                    $crate::export::open_port::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &lease,
                        port,
                    )
                }
                fn capture_template(
                    ctx: EnvironmentContext,
                    lease: Lease,
                    name: String,
                ) -> Result<TemplateInfo, ProviderError> {
                    $crate::export::capture_template::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &lease,
                        &name,
                    )
                }
                fn list_templates(
                    ctx: EnvironmentContext,
                ) -> Result<Vec<TemplateInfo>, ProviderError> {
                    run(&mut WasiPlatform::new(), &ctx, |p: &mut $provider| {
                        p.list_templates()
                    })
                }
                fn delete_template(
                    ctx: EnvironmentContext,
                    template_ref: String,
                ) -> Result<TemplateDeletion, ProviderError> {
                    $crate::export::delete_template::<$provider>(
                        &mut WasiPlatform::new(),
                        &ctx,
                        &template_ref,
                    )
                }
            }

    $crate::bindings::export_world!(Export with_types_in $crate::bindings);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::tests::Origins;
    use crate::testing::{context, Answer, FakePlatform};
    use wasm_bindgen_test::wasm_bindgen_test;

    /// A provider that must never be reached.
    struct Unreached<'a>(#[allow(dead_code)] Operation<'a, Origins>);

    impl<'a> Provider<'a> for Unreached<'a> {
        type Config = Origins;
        fn new(op: Operation<'a, Origins>) -> Self {
            Unreached(op)
        }
        fn describe() -> ProviderDescription {
            unreachable!()
        }
        fn acquire_lease(&mut self, _: &AcquireRequest) -> Result<Lease, ProviderError> {
            unreachable!()
        }
        fn destroy_lease(&mut self, _: &Lease) -> Result<TerminationReceipt, ProviderError> {
            unreachable!()
        }
        fn execute(
            &mut self,
            _: &Lease,
            _: &ExecuteRequest,
        ) -> Result<ExecuteResult, ProviderError> {
            unreachable!()
        }
    }

    /// The export checks the config, then the command, before the
    /// provider's `execute` runs: bad input never causes a request.
    #[wasm_bindgen_test(unsupported = test)]
    fn bad_input_never_reaches_the_provider() {
        let mut platform = FakePlatform::new(|_| -> Answer { panic!("no request expected") });
        let lease = Lease {
            provider_lease_id: "sb".into(),
            metadata: "{}".into(),
            expires_at: None,
        };
        let mut request = ExecuteRequest {
            command: String::new(),
            args: vec![],
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms: None,
            result_chars: None,
        };
        let bad_config = context("{");
        let result = export::execute::<Unreached>(&mut platform, &bad_config, &lease, &request);
        assert!(matches!(result, Err(ProviderError::InvalidConfig(_))));
        let ctx = context(r#"{"apiUrl":"http://127.0.0.1:9"}"#);
        let result = export::execute::<Unreached>(&mut platform, &ctx, &lease, &request);
        assert!(matches!(result, Err(ProviderError::InvalidRequest(_))));
        request.command = "echo".into();
        request.env = vec![("BAD NAME".into(), "x".into())];
        let result = export::execute::<Unreached>(&mut platform, &ctx, &lease, &request);
        assert!(matches!(result, Err(ProviderError::InvalidRequest(_))));
        assert!(platform.requests.is_empty());
    }

    fn interaction(command: &str, terminal: Option<TerminalSize>) -> InteractionRequest {
        InteractionRequest {
            command: command.into(),
            args: vec![],
            cwd: None,
            env: vec![],
            terminal,
            timeout_ms: None,
            result_chars: None,
        }
    }

    /// `interact` is checked like `execute` before the provider sees it
    /// (an empty command, a terminal without columns or rows, a zero
    /// timeout), and a provider that does not override it says
    /// `unsupported`, all without a request.
    #[wasm_bindgen_test(unsupported = test)]
    fn interact_is_checked_and_unsupported_by_default() {
        let mut platform = FakePlatform::new(|_| -> Answer { panic!("no request expected") });
        let lease = Lease {
            provider_lease_id: "sb".into(),
            metadata: "{}".into(),
            expires_at: None,
        };
        let ctx = context(r#"{"apiUrl":"http://127.0.0.1:9"}"#);
        let size = |columns, rows| Some(TerminalSize { columns, rows });
        for bad in [
            interaction("", None),
            interaction("sh", size(0, 24)),
            interaction("sh", size(80, 0)),
            InteractionRequest {
                timeout_ms: Some(0),
                ..interaction("sh", None)
            },
        ] {
            let result = export::interact::<Unreached>(&mut platform, &ctx, &lease, &bad);
            assert!(
                matches!(result, Err(ProviderError::InvalidRequest(_))),
                "{:?}",
                bad.command
            );
        }
        let result = export::interact::<Unreached>(
            &mut platform,
            &ctx,
            &lease,
            &interaction("sh", size(80, 24)),
        );
        match result {
            Err(ProviderError::Unsupported(message)) => assert!(message.contains("interactive")),
            other => panic!("expected unsupported, got {:?}", other.is_ok()),
        }
        assert!(platform.requests.is_empty());
        assert!(platform.started.is_empty());
    }

    /// The operations of contract 0.7.0: bad input is `invalid-request`
    /// and a provider that does not override them says `unsupported`,
    /// all without a request.
    #[wasm_bindgen_test(unsupported = test)]
    fn environment_policy_is_checked_and_unsupported_by_default() {
        let mut platform = FakePlatform::new(|_| -> Answer { panic!("no request expected") });
        let lease = Lease {
            provider_lease_id: "sb".into(),
            metadata: "{}".into(),
            expires_at: None,
        };
        let ctx = context(r#"{"apiUrl":"http://127.0.0.1:9"}"#);
        let invalid = |result: Result<(), ProviderError>| {
            assert!(matches!(result, Err(ProviderError::InvalidRequest(_))))
        };
        let unsupported = |result: Result<(), ProviderError>| {
            assert!(matches!(result, Err(ProviderError::Unsupported(_))))
        };
        let request = AcquireRequest {
            adapter_type: Some("no spaces".into()),
            ..crate::acquire::tests::plain_request()
        };
        invalid(export::acquire::<Unreached>(&mut platform, &ctx, &request).map(drop));
        let bad_policy = EgressPolicy::Allow(vec!["a.com".into(), "".into()]);
        invalid(
            export::set_egress::<Unreached>(&mut platform, &ctx, &lease, &bad_policy).map(drop),
        );
        invalid(export::open_port::<Unreached>(&mut platform, &ctx, &lease, 0).map(drop));
        invalid(
            export::capture_template::<Unreached>(&mut platform, &ctx, &lease, "a/b").map(drop),
        );
        invalid(
            export::delete_template::<Unreached>(&mut platform, &ctx, "0123456789abcdef.x")
                .map(drop),
        );
        let good_ref = templates::reference(&ctx, "x").unwrap();
        unsupported(
            export::set_egress::<Unreached>(&mut platform, &ctx, &lease, &EgressPolicy::BlockAll)
                .map(drop),
        );
        unsupported(export::open_port::<Unreached>(&mut platform, &ctx, &lease, 80).map(drop));
        unsupported(
            export::capture_template::<Unreached>(&mut platform, &ctx, &lease, "x").map(drop),
        );
        unsupported(export::delete_template::<Unreached>(&mut platform, &ctx, &good_ref).map(drop));
        unsupported(
            export::run(&mut platform, &ctx, |p: &mut Unreached| p.list_templates()).map(drop),
        );
        assert!(platform.requests.is_empty());
    }
}
