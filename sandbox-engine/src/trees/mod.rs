//! Process trees and their proof: who a sandbox's processes are on the
//! host (its own range of host ids, [`id_map`]), finding and signalling
//! them through fresh looks at `/proc` ([`procfs`], [`host_processes`]),
//! how many tasks and how much memory they may hold ([`process_limits`],
//! the host-wide [`budgets`]), nothing outliving the server
//! ([`deathguard`]) and the descriptors a child must not inherit
//! ([`fds`]).
//!
//! Two of its files are the seams through which the engine asks what
//! this host allows: [`id_map`] whether sandboxes get ids of their own
//! ([`id_map::ranges_here`]), [`process_limits`] how command trees are
//! held and proven and what limits a sandbox (its
//! [`process_limits::TreeBackend`], chosen there once). Each tree backend
//! is one file behind it: [`cgroup_v1`] (root with the v1 `pids`
//! hierarchy), [`cgroup_v2`] (a cgroup v2 group delegated to the server,
//! or root on a pure v2 host), [`anchor`] (no cgroup: a subreaper per
//! command). No other file reads the server's uid or the cgroup layout
//! (`tests/layers.rs` checks it).
//!
//! The host seam, [`host`]: the backends (and the `/proc` scan that
//! proves a sandbox's processes gone, [`host_processes`]) read and write
//! the cgroup file systems and `/proc`, make and remove groups, and ask
//! who the server is and which processes run only through the narrow
//! [`host::Host`] trait (as youki's `libcontainer` keeps its system calls
//! behind a `Syscall` trait). [`host::RealHost`] does what the backends
//! did directly before;
//! under `#[cfg(test)]` a double, `host::FakeHost`, plays any kind of
//! host (root or not, cgroup v1 or v2, a delegated group or none, a
//! kernel that refuses a write) and logs every change asked of it, so
//! each folder's unit tests beside the code prove the backend choice, the
//! order of a group's set-up and the typed answers without root.
//!
//! The lowest folder of the engine: it uses only [`crate::util`]. Every
//! other folder may use it.

pub mod anchor;
pub mod budgets;
pub mod cgroup_v1;
pub mod cgroup_v2;
pub mod deathguard;
pub mod fds;
pub(crate) mod host;
pub mod host_processes;
pub mod id_map;
pub mod process_limits;
pub(crate) mod procfs;
