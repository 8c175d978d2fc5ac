//! The Daytona sandbox provider: Daytona API knowledge only, over the
//! provider SDK (`crates/provider-sdk`), compiled to a `wasm32-wasip2`
//! component implementing the `sandbox-provider` WIT world
//! (`wit/since_v0.7.0`). The API subset it uses is recorded in
//! `docs/daytona-api.md`.
//!
//! It talks to two origins: the API (`apiUrl`: sandboxes) and the toolbox
//! proxy (`toolboxUrl`: sessions, commands, logs, files), both with the
//! host-injected `Authorization: Bearer` key.
//!
//! Modules, in the order a request flows through them:
//! - [`config`]: the config, both URLs and the budgets;
//! - [`api`]: requests to either face, plain JSON answers, ids;
//! - [`lease`]: the lease metadata and the labels that tie a sandbox to it;
//! - [`lifecycle`]: the provider's operations ([`lifecycle::Daytona`], the
//!   SDK's `Provider`): acquire, resume, release, destroy, probe, realize,
//!   execute, set-egress, open-port, capture/list/delete-template;
//! - [`snapshots`]: snapshots as templates, the listing a page at a time;
//! - [`policy`]: egress as Daytona's network settings and the snapshot a
//!   sandbox starts from (contract 0.7.0), decided before any request;
//! - [`logs`]: the labelled stdout/stderr log stream;
//! - [`execute`]: one command in its own session, with cleanup;
//! - [`interact`]: an interactive process (a terminal or pipes) in its own
//!   session, driven by a controller in the sandbox;
//! - [`describe`]: the provider description.

#![deny(missing_docs)]
// `ProviderError` is the WIT variant itself; returned once per call.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod config;
pub mod describe;
pub mod execute;
pub mod interact;
pub mod lease;
pub mod lifecycle;
pub mod logs;
pub mod policy;
pub mod snapshots;
