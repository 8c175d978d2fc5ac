//! The host as the tree backends see it (issue 42 item 6): the few facts
//! and actions the cgroup logic of [`crate::trees::process_limits`],
//! [`crate::trees::cgroup_v1`] and [`crate::trees::cgroup_v2`] needs
//! (reading and writing the control files, making and removing groups,
//! who the server is and whether a process still runs), behind one narrow
//! trait, [`Host`].
//!
//! [`RealHost`] is the host itself: each method is the system call the
//! backends made directly before the seam, nothing more. Under
//! `#[cfg(test)]`, `FakeHost` is a programmable double: a small in-memory
//! file tree (with the control files a kernel would put in each new
//! group), the answers a test gives it (root or not, which mounts are
//! cgroup2, which paths the server may write, which pids run, which
//! writes the kernel refuses and with what error), and a log of every
//! change it was asked for, in order. With it the backends' choices (which
//! backend a host gets and why, which controllers are enabled before a
//! group is made, what a group's proof says) are tested without root and
//! on any kind of host; the real paths stay covered by the integration
//! tests (`tests/trees.rs`, `tests/machine_cgroup_v2*.rs`).
//!
//! The paths themselves (where the cgroup mounts are, which file is which)
//! stay in the backends: this file knows none of them.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// What the tree backends ask of the host. Paths are absolute; the
/// meaning of each file is the caller's.
pub(crate) trait Host: Send + Sync + std::fmt::Debug {
    /// The whole text of the file at `path`.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes `value` to the file at `path` in one write (a control file:
    /// the kernel acts on it, or refuses it with an error).
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// The file at `path`, opened for writing only (a control file a
    /// launcher writes to between fork and exec).
    fn open_for_writing(&self, path: &Path) -> io::Result<File>;
    /// Makes the directory `path` (`AlreadyExists` when it is there).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory `path` and any missing parent.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes a new directory in `parent` whose name starts with
    /// `prefix-`, unique there.
    fn create_unique_dir(&self, parent: &Path, prefix: &str) -> io::Result<PathBuf>;
    /// Removes the (empty, or cgroup) directory `path`.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// The directories directly in `path`.
    fn subdirs(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Whether `path` is a regular file.
    fn is_file(&self, path: &Path) -> bool;
    /// Whether anything is at `path`.
    fn exists(&self, path: &Path) -> bool;
    /// Whether the server may write the file at `path`.
    fn may_write_file(&self, path: &Path) -> bool;
    /// Whether the server may make and remove entries in the directory
    /// `path` (write and search access).
    fn may_write_dir(&self, path: &Path) -> bool;
    /// Whether `path` is the root of a cgroup2 file system.
    fn is_cgroup2_mount(&self, path: &Path) -> bool;
    /// Whether the server is the host's root
    /// ([`crate::trees::id_map::ranges_here`]).
    fn is_host_root(&self) -> bool;
    /// The server's own pid.
    fn own_pid(&self) -> u32;
    /// The parent pid of `pid`, while it runs.
    fn parent_of(&self, pid: i32) -> Option<i32>;
    /// Whether `pid` runs no more (see [`crate::trees::procfs::is_dead`]).
    fn is_dead(&self, pid: i32) -> bool;
}

/// The host itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RealHost;

/// The one [`RealHost`] the backends use outside tests.
pub(crate) static REAL: RealHost = RealHost;

impl Host for RealHost {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        std::fs::write(path, value)
    }

    fn open_for_writing(&self, path: &Path) -> io::Result<File> {
        std::fs::OpenOptions::new().write(true).open(path)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn create_unique_dir(&self, parent: &Path, prefix: &str) -> io::Result<PathBuf> {
        crate::util::new_unique_dir(parent, prefix)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn subdirs(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(std::fs::read_dir(path)?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect())
    }

    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn may_write_file(&self, path: &Path) -> bool {
        rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok()
    }

    fn may_write_dir(&self, path: &Path) -> bool {
        use rustix::fs::{access, Access};
        access(path, Access::WRITE_OK | Access::EXEC_OK).is_ok()
    }

    fn is_cgroup2_mount(&self, path: &Path) -> bool {
        /// `statfs` magic of a cgroup2 file system.
        const CGROUP2_MAGIC: i64 = 0x6367_7270;
        // `f_type` is `i64` here, another integer type on other targets.
        #[allow(clippy::unnecessary_cast)]
        rustix::fs::statfs(path).is_ok_and(|s| s.f_type as i64 == CGROUP2_MAGIC)
    }

    fn is_host_root(&self) -> bool {
        crate::trees::id_map::ranges_here()
    }

    fn own_pid(&self) -> u32 {
        std::process::id()
    }

    fn parent_of(&self, pid: i32) -> Option<i32> {
        crate::trees::procfs::stat(pid).map(|p| p.ppid)
    }

    fn is_dead(&self, pid: i32) -> bool {
        crate::trees::procfs::is_dead(pid)
    }
}
