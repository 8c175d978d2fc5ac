//! Host runtime for `sandbox-provider` WebAssembly components.
//!
//! This crate is the only place that knows wasmtime. It loads a provider
//! component ([`ProviderComponent`]), runs one fresh instance per operation
//! ([`ProviderInstance`]) with a memory cap and an epoch deadline, forwards
//! live output to a callback, offers cancellation as a `wasi:io` pollable,
//! and routes every `wasi:http` request through a pluggable [`Transport`]
//! — usually a [`Guard`] (the allowed origins, their secret headers, rate
//! budget, limits) in front of [`NetworkTransport`] or, in tests (feature
//! `testing`), `ScriptedTransport`. The `testing` feature also offers
//! `ThrowawayPostgres`, a PostgreSQL cluster for the PostgreSQL lease
//! store's tests and benchmarks.
//!
//! Modules by concern: `wasm/` (engine, component, instance, the `host`
//! interface, limits), `network/` (transports, the policy guard, secrets,
//! rate budget), `leases/` (the store trait, its SQLite and PostgreSQL
//! backends, the state machine), and the runtime (`runtime`, `budget`,
//! `messages`).
//!
//! On top of that, [`SandboxRuntime`] keeps leases in a durable
//! [`SqliteLeases`] (poisoned on `cleanup-failed`, a trap, or the death of
//! the host using them, judged by heartbeat; destroyed by `sweep`), with
//! the state machine in [`leases::rules`]; [`Secrets`] holds the operator's
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

#![deny(missing_docs)]

// One concept per folder: the wasm embedding, the network policy, the
// lease store, and the runtime on top (this file's siblings).
pub mod leases;
mod network;
mod wasm;

mod budget;
mod messages;
mod runtime;
#[cfg(test)]
mod secret_routing_table;
#[cfg(any(test, feature = "testing"))]
mod testing;

// Short paths inside the crate (`crate::policy`, `crate::bindings`, ...).
use network::{body, http_hook, policy, rate_budget, secrets, transport};
use wasm::{bindings, cache, cancel, component, engine, instance, options, state, v0_2};

pub use bindings::{types, PROVIDER_INTERFACE, SERVED_INTERFACES};
pub use budget::Budget;
pub use cache::ArtifactCache;
pub use cancel::CancelToken;
pub use component::ProviderComponent;
pub use engine::{new_engine, shared_engine};
pub use instance::{trap_of, ProviderInstance};
pub use leases::backend::{
    HostInstance, LeaseRecord, LeaseRefused, LeaseStore, Liveness, StoreUnavailable,
};
pub use leases::postgres::PostgresLeases;
pub use leases::rules::{LeaseState, Operation};
pub use leases::sql::MIGRATIONS;
pub use leases::sqlite::SqliteLeases;
pub use leases::url::open_store;
pub use messages::{cleanup_text, error_text, loss_text};
pub use network::client::NetworkTransport;
pub use options::{GuestStderr, HostOptions, OutputCapture, OutputSink};
pub use policy::{Guard, Origin, Policy};
pub use rate_budget::{BudgetStats, RateBudget, RateLimit};
pub use runtime::{action_name, Environment, SandboxRuntime, OUTPUT_SINK};
pub use secrets::{Secrets, KEY_ORIGIN_VAR};
#[cfg(any(test, feature = "testing"))]
pub use testing::postgres::ThrowawayPostgres;
#[cfg(any(test, feature = "testing"))]
pub use testing::scripted::{RecordedRequest, ScriptedChunk, ScriptedResponse, ScriptedTransport};
pub use transport::{
    BodySender, ErrorCode, OutgoingRequest, ResponseBody, Transport, TransportFuture,
    TransportResponse,
};
/// The wasmtime trap codes, for matching [`trap_of`].
pub use wasmtime::Trap;
