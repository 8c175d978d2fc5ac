//! A sandbox's files and what the engine keeps on disk: each sandbox's
//! root directory and its minimal `/etc` ([`rootfs`]), its own
//! fixed-size file system ([`disk`]; without root [`fuse_disk`]; where
//! none can be mounted, the budget its usage is measured against,
//! [`disk_budget`]), paths of the Files API resolved
//! inside a root ([`sandbox_paths`]), removing a tree a sandbox shaped
//! ([`fstree`]), the durable records a successor engine reads
//! ([`records`]), each process's output journal ([`journal`]) and
//! forks and templates of a paused sandbox's files ([`templates`]).
//!
//! Uses [`crate::trees`] (the ids that own a root, the death guard that
//! unmounts and removes what a dead server left, the proof that a
//! recorded sandbox's processes are gone) and [`crate::util`]. It never
//! uses the machine, the network, the sandbox core or the faces.

pub mod disk;
pub mod disk_budget;
pub(crate) mod fstree;
pub mod fuse_disk;
pub mod journal;
pub mod records;
pub mod rootfs;
pub(crate) mod sandbox_paths;
pub mod templates;
