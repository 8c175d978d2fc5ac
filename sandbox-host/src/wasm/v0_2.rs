//! Components built for contract 0.2.0: their `host` imports, and the
//! conversions between their types and the current (0.3.0) ones.
//!
//! 0.3.0 only added the `provider-error.output-lost` case, so every 0.2.0
//! value has exactly one 0.3.0 counterpart (field by field, case by case),
//! and every 0.3.0 value a host sends (requests, leases, contexts) has
//! exactly one 0.2.0 counterpart.

use wasmtime::component::Resource;
use wasmtime_wasi::p2::DynPollable;

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_2::{host, types as old};
use crate::wasm::state::HostState;

/// A lossless conversion between the two contracts' copies of a type.
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

record! {
    EnvironmentContext { driver_key, company_id, environment_id, issue_id, config }
    SecretField { config_field, header, scheme, env_var }
    OriginField { config_field, default_url, secrets }
    ProviderDescription {
        driver_key, display_name, config_schema, capabilities, secrets, origin_fields, rate_limit,
    }
    RateLimit { requests, window_ms, per_second }
    ConfigValidation { ok, warnings, errors, normalized_config, api_origins, budget }
    OperationBudget { operation_ms, request_ms }
    Lease { provider_lease_id, metadata, expires_at }
    AcquireRequest { run_id, requested_cwd, workspace_mode, requested_expires_at }
    TerminationReceipt { sandbox_id, action }
    WorkspaceRequest { remote_path }
    FileUpload { remote_path, contents }
    FileDownload { remote_path, contents }
    SyncReport { files, bytes }
    ProbeReport { ok, summary, diagnostics }
    ExecuteRequest { command, args, cwd, env, stdin, timeout_ms }
    ExecuteResult {
        exit_code, signal, timed_out, stdout, stderr, process_id, output_truncated,
    }
    PartialOutput { stdout, stderr, timed_out, output_truncated }
    CleanupFailure { sandbox_id, process_id, phase, cause, partial }
    ApiRejection { operation, status, partial }
    TransportFailure { operation, kind, detail, partial }
    InvalidResponse { operation, reason, partial }
}

cases! {
    ResumeOutcome { ; Resumed, Expired }
    TerminationAction { Paused, Deleted, AlreadyGone ; }
    CleanupPhase { ProcessCreation, ProcessTermination, LeaseSetup, SandboxDeletion ; }
    CleanupCause { Deadline, TreeStillRunning ; HttpStatus, Transport, InvalidResponse }
    TransportKind { Denied, Unreachable, Connection, Deadline, Other ; }
}

impl Conv<new::Capabilities> for old::Capabilities {
    fn conv(self) -> new::Capabilities {
        let mut out = new::Capabilities::empty();
        for (from, to) in [
            (
                old::Capabilities::REUSABLE_LEASES,
                new::Capabilities::REUSABLE_LEASES,
            ),
            (
                old::Capabilities::INCREMENTAL_OUTPUT,
                new::Capabilities::INCREMENTAL_OUTPUT,
            ),
            (
                old::Capabilities::NATIVE_SYNC,
                new::Capabilities::NATIVE_SYNC,
            ),
            (old::Capabilities::LOGIN_PTY, new::Capabilities::LOGIN_PTY),
            (
                old::Capabilities::DUPLEX_CHANNELS,
                new::Capabilities::DUPLEX_CHANNELS,
            ),
        ] {
            if self.contains(from) {
                out |= to;
            }
        }
        out
    }
}

impl Conv<old::Capabilities> for new::Capabilities {
    fn conv(self) -> old::Capabilities {
        let mut out = old::Capabilities::empty();
        for (from, to) in [
            (
                new::Capabilities::REUSABLE_LEASES,
                old::Capabilities::REUSABLE_LEASES,
            ),
            (
                new::Capabilities::INCREMENTAL_OUTPUT,
                old::Capabilities::INCREMENTAL_OUTPUT,
            ),
            (
                new::Capabilities::NATIVE_SYNC,
                old::Capabilities::NATIVE_SYNC,
            ),
            (new::Capabilities::LOGIN_PTY, old::Capabilities::LOGIN_PTY),
            (
                new::Capabilities::DUPLEX_CHANNELS,
                old::Capabilities::DUPLEX_CHANNELS,
            ),
        ] {
            if self.contains(from) {
                out |= to;
            }
        }
        out
    }
}

/// Only this direction: a 0.2.0 provider never reports `output-lost`.
impl Conv<new::ProviderError> for old::ProviderError {
    fn conv(self) -> new::ProviderError {
        match self {
            old::ProviderError::InvalidConfig(v) => new::ProviderError::InvalidConfig(v),
            old::ProviderError::InvalidRequest(v) => new::ProviderError::InvalidRequest(v),
            old::ProviderError::ForeignLease(v) => new::ProviderError::ForeignLease(v),
            old::ProviderError::Unsupported(v) => new::ProviderError::Unsupported(v),
            old::ProviderError::ApiRejected(v) => new::ProviderError::ApiRejected(v.conv()),
            old::ProviderError::TransportFailed(v) => new::ProviderError::TransportFailed(v.conv()),
            old::ProviderError::InvalidResponse(v) => new::ProviderError::InvalidResponse(v.conv()),
            old::ProviderError::Cancelled(v) => new::ProviderError::Cancelled(v.conv()),
            old::ProviderError::CleanupFailed(v) => new::ProviderError::CleanupFailed(v.conv()),
        }
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

impl host::Host for HostState {
    fn emit_output(&mut self, stream: host::OutputStream, chunk: String) -> wasmtime::Result<()> {
        let stream = match stream {
            host::OutputStream::Stdout => new::OutputStream::Stdout,
            host::OutputStream::Stderr => new::OutputStream::Stderr,
        };
        crate::wasm::bindings::host::Host::emit_output(self, stream, chunk)
    }

    fn record_sandbox(&mut self, sandbox_id: String) -> wasmtime::Result<()> {
        crate::wasm::bindings::host::Host::record_sandbox(self, sandbox_id)
    }

    fn cancellation(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        crate::wasm::bindings::host::Host::cancellation(self)
    }
}
