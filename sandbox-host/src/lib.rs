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
//! request pacer), `leases/` (the store trait, its SQLite and PostgreSQL
//! backends, the state machine), and the runtime (`runtime`, `deadline`,
//! `messages`).
//!
//! On top of that, [`SandboxRuntime`] keeps leases in a durable
//! [`SqliteLeases`] (poisoned on `cleanup-failed`, a trap, or the death of
//! the host using them, judged by heartbeat; destroyed by `sweep`), with
//! the state machine of [`LeaseState`] and [`Operation`]; [`Secrets`] holds the operator's
//! secret rules and [`Deadlines`] the deadlines; [`ArtifactCache`] keeps
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
mod leases;
mod network;
mod wasm;

mod deadline;
mod messages;
mod runtime;
#[cfg(test)]
mod secret_routing_table;
mod shared_sqlite;
#[cfg(any(test, feature = "testing"))]
mod testing;

pub use deadline::Deadlines;
pub use leases::backend::{
    HostInstance, LeaseRecord, LeaseRefused, LeaseStore, Liveness, StoreUnavailable,
};
pub use leases::postgres::PostgresLeases;
pub use leases::rules::{LeaseState, Operation};
pub use leases::sql::MIGRATIONS;
pub use leases::sqlite::SqliteLeases;
pub use leases::url::open_store;
pub use messages::{cleanup_text, error_text, loss_text, OUTPUT_SINK};
pub use network::client::NetworkTransport;
pub use network::policy::{Guard, Origin, Policy};
pub use network::request_pacer::{PacerStats, RateLimit, RequestPacer};
pub use network::secrets::{Secrets, KEY_ORIGIN_VAR};
pub use network::transport::{
    BodySender, ErrorCode, OutgoingRequest, ResponseBody, Transport, TransportFuture,
    TransportResponse,
};
pub use runtime::{action_name, policy_capabilities, Environment, SandboxRuntime, UseGuard};
#[cfg(any(test, feature = "testing"))]
pub use testing::postgres::ThrowawayPostgres;
#[cfg(any(test, feature = "testing"))]
pub use testing::scripted::{RecordedRequest, ScriptedChunk, ScriptedResponse, ScriptedTransport};
pub use wasm::bindings::{types, PROVIDER_INTERFACE, SERVED_INTERFACES};
pub use wasm::cache::ArtifactCache;
pub use wasm::cancel::CancelToken;
pub use wasm::component::ProviderComponent;
pub use wasm::engine::{new_engine, shared_engine};
pub use wasm::instance::{trap_of, ProviderInstance};
pub use wasm::interaction::{EventRefused, Interaction};
pub use wasm::options::{GuestStderr, HostOptions, OutputCapture, OutputSink};
/// The wasmtime trap codes, for matching [`trap_of`].
pub use wasmtime::Trap;
