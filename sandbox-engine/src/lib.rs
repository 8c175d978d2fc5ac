//! `createos-local`: a local, CreateOS-compatible sandbox server ("LocalStack
//! for CreateOS") that runs commands as real Linux processes.
//!
//! It implements the server side of the API in `docs/createos-api.md`
//! under `/v1`, with the JSend envelope and `X-Api-Key` auth. Each sandbox is
//! a directory; commands run in it under bubblewrap with a PID namespace per
//! process, or — where bubblewrap cannot run — as plain process groups (see
//! [`machine::isolation`] for exactly what each mode guarantees).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use sandbox_engine::{FaultAction, FaultRule, Server};
//! let server = Server::builder().api_key("test-key").start().await?;
//! println!("{} ({})", server.base_url(), server.isolation());
//! server.faults().add(
//!     FaultRule::new("DELETE", "/v1/sandboxes/*/processes/*", FaultAction::TreeNotExited).always(),
//! );
//! let report = server.shutdown().await;
//! assert!(report.all_exited());
//! # Ok(()) }
//! ```
//!
//! The same core also serves a Daytona-compatible face: the sandbox API
//! under `/daytona/api` and the toolbox API (sessions, commands, labelled
//! logs, `process/execute`, files) under `/daytona/toolbox`, or on a second
//! loopback origin with [`ServerBuilder::toolbox_port`]; the subset is
//! recorded in `docs/daytona-api.md`.
//!
//! What one server owns is handed down from the composition root
//! ([`server`]) through its shared state: the machines of its sandboxes
//! ([`machine::Machines`]), its egress policies
//! ([`network::egress::Policies`]), its records
//! ([`storage::records::Records`]) and its disk budget
//! ([`storage::disk_budget::DiskBudget`]), so two servers in one process
//! share none of them. What stays process-wide is a fact of the host or of
//! the process: the host's tree proof, namespaces, kernel capabilities,
//! `/etc` entries and shell, each read once; the one thread every machine
//! dies with ([`machine::lasting_spawner`]); the fuse2fs daemons, children
//! of this process by mount point; the lock that admits disks against a
//! file system's free room; the cursor of the host-wide id ranges; the
//! fallback counter of random ids. ([`trees`] keeps its own process-wide
//! facts, the death guard among them.)
//!
//! Limits worth knowing: no PTYs (`kind` is always `process`), no fork, no
//! ingress, rate limiting only when asked for ([`ServerBuilder::rate_limit`]),
//! no outbound network in bwrap mode, and the `shape` is only validated and
//! echoed (the same `prlimit` bounds apply to every shape).

#![deny(missing_docs)]

pub(crate) mod api;
pub(crate) mod daytona;
pub mod faults;
pub(crate) mod http;
pub mod machine;
pub mod network;
pub mod sandboxes;
pub mod server;
pub mod storage;
pub mod trees;
pub mod util;

/// Defaults of the retention of finished processes (see
/// [`ServerBuilder::finished_retention`]).
pub mod store_defaults {
    /// Seconds a finished process is kept.
    pub const FINISHED_TTL_SECS: u64 = crate::sandboxes::store::DEFAULT_FINISHED_TTL.as_secs();
    /// Finished processes kept per sandbox.
    pub const FINISHED_KEEP: usize = crate::sandboxes::store::DEFAULT_FINISHED_KEEP;
}

pub use daytona::toolbox::{STDERR_PREFIX, STDOUT_PREFIX};
pub use faults::{FaultAction, FaultRule, Faults, RecordedRequest, Times};
pub use http::middleware::{ENGINE_HEADER, ENGINE_NAME, ENGINE_RATE_LIMIT_HEADER};
pub use machine::isolation::{IsolationMode, IsolationPreference};
pub use network::rate_limit::{RateLimitStats, RateLimiter};
pub use server::{
    BackgroundServer, RunningServer, Server, ServerBuilder, ShutdownReport, StartingServer,
};
