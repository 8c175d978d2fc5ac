//! Process trees and their proof: who a sandbox's processes are on the
//! host (its own range of host ids, [`id_map`]), finding and signalling
//! them through fresh looks at `/proc` ([`procfs`], [`host_processes`]),
//! how many tasks and how much memory they may hold ([`process_limits`],
//! the host-wide [`budgets`]), nothing outliving the server
//! ([`deathguard`]) and the descriptors a child must not inherit
//! ([`fds`]).
//!
//! The lowest folder of the engine: it uses only [`crate::util`]. Every
//! other folder may use it.

pub mod budgets;
pub mod deathguard;
pub mod fds;
pub mod host_processes;
pub mod id_map;
pub mod process_limits;
pub(crate) mod procfs;
