//! Host runtime for `sandbox-provider` WebAssembly components.
//!
//! This crate is the only place that knows wasmtime. It loads a provider
//! component ([`ProviderComponent`]), runs one fresh instance per operation
//! ([`ProviderInstance`]) with a memory cap and an epoch deadline, forwards
//! live output to a callback, offers cancellation as a `wasi:io` pollable,
//! and routes every `wasi:http` request through a pluggable [`Transport`]
//! — usually a [`Guard`] (one allowed origin, secret header, rate budget, limits)
//! in front of [`NetworkTransport`] or, in tests, [`ScriptedTransport`].
//!
//! On top of that, [`SandboxRuntime`] keeps leases in a durable
//! [`LeaseStore`] (poisoned on `cleanup-failed`, a trap, or the death of
//! the host using them, judged by heartbeat; destroyed by `sweep`), with
//! the state machine in [`lease_rules`]; [`Secrets`] holds the operator's
//! secret rules and [`Budget`] the deadlines; [`ArtifactCache`] keeps
//! compiled components on disk. The
//! `sandbox` binary is the command-line front end.
//!
//! ```no_run
//! use sandbox_host::{new_engine, HostOptions, ProviderComponent};
//! # fn main() -> anyhow::Result<()> {
//! let engine = new_engine()?;
//! let component = ProviderComponent::load(&engine, "createos_provider.wasm")?;
//! let description = component.instantiate(HostOptions::new())?.describe()?;
//! println!("{}", description.display_name);
//! # Ok(()) }
//! ```

mod bindings;
mod body;
mod budget;
mod cache;
mod cancel;
mod component;
mod engine;
mod host_impl;
mod http_hook;
mod instance;
mod lease_backend;
mod lease_postgres;
pub mod lease_rules;
mod lease_store;
mod lease_store_url;
mod messages;
mod network;
mod options;
mod policy;
mod rate_budget;
mod runtime;
mod scripted;
mod secrets;
mod state;
mod transport;

pub use bindings::{types, PROVIDER_INTERFACE};
pub use budget::Budget;
pub use cache::ArtifactCache;
pub use cancel::CancelToken;
pub use component::ProviderComponent;
pub use engine::{new_engine, shared_engine, EPOCH_TICK};
pub use instance::{trap_of, ProviderInstance};
pub use lease_backend::{
    HostInstance, LeaseBackend, LeaseRecord, LeaseRefused, Liveness, StoreUnavailable,
};
pub use lease_postgres::{PgLeaseStore, MIGRATIONS};
pub use lease_rules::{LeaseState, Operation};
pub use lease_store::LeaseStore;
pub use lease_store_url::{open_store, StoreUrl};
pub use messages::{cleanup_text, error_text};
pub use network::NetworkTransport;
pub use options::{GuestStderr, HostOptions, OutputCapture, OutputSink, SandboxRecorder};
pub use policy::{Guard, Origin, Policy};
pub use rate_budget::{BudgetStats, Grant, Priority, RateBudget, RateLimit};
pub use runtime::{action_name, Environment, SandboxRuntime};
pub use scripted::{RecordedRequest, ScriptedChunk, ScriptedResponse, ScriptedTransport};
pub use secrets::Secrets;
pub use transport::{
    BodySender, DenyAll, ErrorCode, OutgoingRequest, RequestTimeouts, ResponseBody, Transport,
    TransportFuture, TransportResponse,
};
/// The wasmtime trap codes, for matching [`trap_of`].
pub use wasmtime::Trap;
