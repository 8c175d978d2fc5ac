//! Conversions between the types of two contract versions whose records,
//! variants and enums have the same shape ([`v0_2`](super::v0_2),
//! [`v0_3`](super::v0_3), [`v0_4`](super::v0_4), [`v0_5`](super::v0_5)
//! and [`v0_6`](super::v0_6) against the current contract). A module using
//! the macros here names the older contract's types `old` and the current
//! ones `new`.

/// A lossless conversion between two contracts' copies of a type.
pub(crate) trait Conv<T> {
    fn conv(self) -> T;
}

macro_rules! same {
    ($($t:ty),*) => { $(impl Conv<$t> for $t { fn conv(self) -> $t { self } })* };
}
same!(String, bool, u8, u16, u32, u64, i32);

impl<A: Conv<B>, B> Conv<Vec<B>> for Vec<A> {
    fn conv(self) -> Vec<B> {
        self.into_iter().map(Conv::conv).collect()
    }
}

impl<A: Conv<B>, B> Conv<Option<B>> for Option<A> {
    fn conv(self) -> Option<B> {
        self.map(Conv::conv)
    }
}

impl<A: Conv<B>, B, C: Conv<D>, D> Conv<(B, D)> for (A, C) {
    fn conv(self) -> (B, D) {
        (self.0.conv(), self.1.conv())
    }
}

impl<A: Conv<B>, B, E: Conv<F>, F> Conv<Result<B, F>> for Result<A, E> {
    fn conv(self) -> Result<B, F> {
        match self {
            Ok(value) => Ok(value.conv()),
            Err(error) => Err(error.conv()),
        }
    }
}

/// A record with the same fields in both contracts: both directions.
macro_rules! record {
    ($($name:ident { $($field:ident),* $(,)? })*) => {$(
        impl Conv<new::$name> for old::$name {
            fn conv(self) -> new::$name {
                new::$name { $($field: self.$field.conv()),* }
            }
        }
        impl Conv<old::$name> for new::$name {
            fn conv(self) -> old::$name {
                old::$name { $($field: self.$field.conv()),* }
            }
        }
    )*};
}
pub(crate) use record;

/// A record a component answers with, with the same fields in both
/// contracts but a field whose type the current contract widened: only
/// the older contract's value to the current one (a host never sends it).
macro_rules! answer_record {
    ($($name:ident { $($field:ident),* $(,)? })*) => {$(
        impl Conv<new::$name> for old::$name {
            fn conv(self) -> new::$name {
                new::$name { $($field: self.$field.conv()),* }
            }
        }
    )*};
}
pub(crate) use answer_record;

/// An enum (or variant) with the same cases in both contracts: both
/// directions. Cases with a payload are listed after `;`.
macro_rules! cases {
    ($($name:ident { $($unit:ident),* $(,)? ; $($case:ident),* $(,)? })*) => {$(
        impl Conv<new::$name> for old::$name {
            fn conv(self) -> new::$name {
                match self {
                    $(old::$name::$unit => new::$name::$unit,)*
                    $(old::$name::$case(value) => new::$name::$case(value.conv()),)*
                }
            }
        }
        impl Conv<old::$name> for new::$name {
            fn conv(self) -> old::$name {
                match self {
                    $(new::$name::$unit => old::$name::$unit,)*
                    $(new::$name::$case(value) => old::$name::$case(value.conv()),)*
                }
            }
        }
    )*};
}
pub(crate) use cases;

/// The types every served contract shares, field by field and case by
/// case (all but `output-loss` and `provider-error`, which 0.2.0 lacks or
/// has without `output-lost`, and `execute-request`, which has
/// `result-chars` only from 0.5.0: see [`execute_request_before_0_5`]),
/// and the ones 0.7.0 widened, one way: `acquire-request` (see
/// [`acquire_request_before_0_7`]), `termination-action` (no `idle-pause`
/// before 0.7.0) and `termination-receipt`, which holds it.
macro_rules! shared_types {
    () => {
        $crate::wasm::conv::record! {
            EnvironmentContext { driver_key, company_id, environment_id, issue_id, config }
            SecretField { config_field, header, scheme, env_var }
            OriginField { config_field, default_url, secrets }
            ProviderDescription {
                driver_key, display_name, config_schema, capabilities, secrets, origin_fields,
                rate_limit,
            }
            RateLimit { requests, window_ms, per_second }
            ConfigValidation { ok, warnings, errors, normalized_config, api_origins, budget }
            OperationBudget { operation_ms, request_ms }
            Lease { provider_lease_id, metadata, expires_at }
            WorkspaceRequest { remote_path }
            FileUpload { remote_path, contents }
            FileDownload { remote_path, contents }
            SyncReport { files, bytes }
            ProbeReport { ok, summary, diagnostics }
            ExecuteResult {
                exit_code, signal, timed_out, stdout, stderr, process_id, output_truncated,
            }
            PartialOutput { stdout, stderr, timed_out, output_truncated }
            CleanupFailure { sandbox_id, process_id, phase, cause, partial }
            ApiRejection { operation, status, partial }
            TransportFailure { operation, kind, detail, partial }
            InvalidResponse { operation, reason, partial }
        }

        $crate::wasm::conv::cases! {
            ResumeOutcome { ; Resumed, Expired }
            CleanupPhase { ProcessCreation, ProcessTermination, LeaseSetup, SandboxDeletion ; }
            CleanupCause { Deadline, TreeStillRunning ; HttpStatus, Transport, InvalidResponse }
            TransportKind { Denied, Unreachable, Connection, Deadline, Other ; }
        }

        $crate::wasm::conv::answer_record! {
            TerminationReceipt { sandbox_id, action }
        }

        /// Only this direction: `idle-pause` came with 0.7.0.
        impl Conv<new::TerminationAction> for old::TerminationAction {
            fn conv(self) -> new::TerminationAction {
                match self {
                    old::TerminationAction::Paused => new::TerminationAction::Paused,
                    old::TerminationAction::Deleted => new::TerminationAction::Deleted,
                    old::TerminationAction::AlreadyGone => new::TerminationAction::AlreadyGone,
                }
            }
        }

        $crate::wasm::conv::acquire_request_before_0_7!();
    };
}
pub(crate) use shared_types;

/// `acquire-request` to a contract before 0.7.0, which has no `egress`,
/// `adapter-type`, `image` or `template`. Only this direction (a host
/// sends requests), and only after
/// [`ProviderInstance::acquire_lease`](crate::ProviderInstance::acquire_lease)
/// refused a request that asks for an egress policy other than
/// `unrestricted`, an image or a template (see `instance.rs`): what is dropped here is
/// `adapter-type`, which only picks among the config's images, and an
/// `unrestricted` egress, which is what such a provider gives anyway.
macro_rules! acquire_request_before_0_7 {
    () => {
        impl Conv<old::AcquireRequest> for new::AcquireRequest {
            fn conv(self) -> old::AcquireRequest {
                let new::AcquireRequest {
                    run_id,
                    requested_cwd,
                    workspace_mode,
                    requested_expires_at,
                    egress: _,
                    adapter_type: _,
                    image: _,
                    template: _,
                } = self;
                old::AcquireRequest {
                    run_id,
                    requested_cwd,
                    workspace_mode,
                    requested_expires_at,
                }
            }
        }
    };
}
pub(crate) use acquire_request_before_0_7;

/// `capabilities` of an older contract: only the flags listed, both
/// directions. A flag left out is one the older contract lacks, or one
/// whose operation it lacks: such a component never claims it here,
/// whatever it declares.
macro_rules! carried_capabilities {
    ($($flag:ident),* $(,)?) => {
        impl Conv<new::Capabilities> for old::Capabilities {
            fn conv(self) -> new::Capabilities {
                let mut out = new::Capabilities::empty();
                $(
                    if self.contains(old::Capabilities::$flag) {
                        out |= new::Capabilities::$flag;
                    }
                )*
                out
            }
        }
        impl Conv<old::Capabilities> for new::Capabilities {
            fn conv(self) -> old::Capabilities {
                let mut out = old::Capabilities::empty();
                $(
                    if self.contains(new::Capabilities::$flag) {
                        out |= old::Capabilities::$flag;
                    }
                )*
                out
            }
        }
    };
}
pub(crate) use carried_capabilities;

/// `capabilities` of a contract before 0.6.0. Its `login-pty` and
/// `duplex-channels` had no operation behind them (`interact` came with
/// 0.6.0), so such a component claims neither here, whatever it declares;
/// and it has no `terminal-resize` nor any flag of 0.7.0.
macro_rules! capabilities_before_0_6 {
    () => {
        $crate::wasm::conv::carried_capabilities!(REUSABLE_LEASES, INCREMENTAL_OUTPUT, NATIVE_SYNC);
    };
}
pub(crate) use capabilities_before_0_6;

/// The `host` imports of a contract whose `emit-output` carries bytes but
/// that has no interactive processes (0.4.0, 0.5.0): the current ones.
/// Expanded in a module that names that contract's `host` interface `host`
/// and the current types `new`.
macro_rules! bytes_output_host {
    () => {
        impl host::Host for $crate::wasm::state::HostState {
            fn emit_output(
                &mut self,
                stream: host::OutputStream,
                chunk: Vec<u8>,
            ) -> wasmtime::Result<()> {
                let stream = match stream {
                    host::OutputStream::Stdout => new::OutputStream::Stdout,
                    host::OutputStream::Stderr => new::OutputStream::Stderr,
                };
                $crate::wasm::bindings::host::Host::emit_output(self, stream, chunk)
            }

            fn record_sandbox(&mut self, sandbox_id: String) -> wasmtime::Result<()> {
                $crate::wasm::bindings::host::Host::record_sandbox(self, sandbox_id)
            }

            fn cancellation(
                &mut self,
            ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>>
            {
                $crate::wasm::bindings::host::Host::cancellation(self)
            }
        }
    };
}
pub(crate) use bytes_output_host;

/// `output-loss` and every `provider-error` case, both directions: the
/// same in every contract from 0.3.0 on (0.2.0 has neither).
macro_rules! output_lost_types {
    () => {
        $crate::wasm::conv::record! {
            OutputLoss { operation, process_id, lost_bytes, lost_chunks, tree_deleted, partial }
        }

        $crate::wasm::conv::cases! {
            ProviderError {
                ;
                InvalidConfig, InvalidRequest, ForeignLease, Unsupported, ApiRejected,
                TransportFailed, InvalidResponse, Cancelled, CleanupFailed, OutputLost,
            }
        }
    };
}
pub(crate) use output_lost_types;

/// `execute-request` to a contract before 0.5.0, which has no
/// `result-chars`: the host cuts such a component's answer instead (see
/// `result_text.rs`). Only this direction: a host sends requests.
macro_rules! execute_request_before_0_5 {
    () => {
        impl Conv<old::ExecuteRequest> for new::ExecuteRequest {
            fn conv(self) -> old::ExecuteRequest {
                let new::ExecuteRequest {
                    command,
                    args,
                    cwd,
                    env,
                    stdin,
                    timeout_ms,
                    result_chars: _,
                } = self;
                old::ExecuteRequest {
                    command,
                    args,
                    cwd,
                    env: env.conv(),
                    stdin,
                    timeout_ms,
                }
            }
        }
    };
}
pub(crate) use execute_request_before_0_5;

/// The `host` imports of a contract whose `emit-output` carries text
/// (before 0.4.0): a text chunk reaches the sink as its UTF-8 bytes, and
/// the other imports are the current ones. Expanded in a module that names
/// that contract's `host` interface `host` and the current types `new`.
macro_rules! text_output_host {
    () => {
        impl host::Host for $crate::wasm::state::HostState {
            fn emit_output(
                &mut self,
                stream: host::OutputStream,
                chunk: String,
            ) -> wasmtime::Result<()> {
                let stream = match stream {
                    host::OutputStream::Stdout => new::OutputStream::Stdout,
                    host::OutputStream::Stderr => new::OutputStream::Stderr,
                };
                $crate::wasm::bindings::host::Host::emit_output(self, stream, chunk.into_bytes())
            }

            fn record_sandbox(&mut self, sandbox_id: String) -> wasmtime::Result<()> {
                $crate::wasm::bindings::host::Host::record_sandbox(self, sandbox_id)
            }

            fn cancellation(
                &mut self,
            ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>>
            {
                $crate::wasm::bindings::host::Host::cancellation(self)
            }
        }
    };
}
pub(crate) use text_output_host;
