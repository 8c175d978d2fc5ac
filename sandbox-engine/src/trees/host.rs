//! The host as the tree backends see it (issue 42 item 6): the few facts
//! and actions the cgroup logic of [`crate::trees::process_limits`],
//! [`crate::trees::cgroup_v1`] and [`crate::trees::cgroup_v2`] needs
//! (reading and writing the control files, making and removing groups,
//! who the server is and whether a process still runs), and the `/proc`
//! scan that proves a sandbox's processes gone
//! ([`crate::trees::host_processes::live_of_ids_checked`]), behind one
//! narrow trait, [`Host`].
//!
//! [`RealHost`] is the host itself: each method is the system call the
//! backends made directly before the seam, nothing more. Under
//! `#[cfg(test)]`, `FakeHost` is a programmable double: a small in-memory
//! file tree (with the control files a kernel would put in each new
//! group), the answers a test gives it (root or not, which mounts are
//! cgroup2, which paths the server may write, which pids run, which
//! writes the kernel refuses and with what error), and a log of every
//! change it was asked for, in order; its `/proc` lists the processes a
//! test gives it (uid, state, a `stat` that can or cannot be read) and
//! fails a listing or a read when told. With it the backends' choices
//! (which backend a host gets and why, which controllers are enabled
//! before a group is made, what a group's proof says) and the scan's
//! verdicts are tested without root and on any kind of host; the real paths stay covered by the integration
//! tests (`tests/trees.rs`, `tests/machine_cgroup_v2*.rs`).
//!
//! The paths themselves (where the cgroup mounts are, which file is which)
//! stay in the backends: this file knows none of them.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::trees::procfs::ProcInfo;

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
    /// Every pid `/proc` lists now, or why it could not be listed (see
    /// [`crate::trees::procfs::try_all_pids`]).
    fn pids(&self) -> io::Result<Vec<i32>>;
    /// What `/proc/PID/stat` says of `pid`; `None` when it cannot be read.
    fn stat(&self, pid: i32) -> Option<ProcInfo>;
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

    fn pids(&self) -> io::Result<Vec<i32>> {
        crate::trees::procfs::try_all_pids()
    }

    fn stat(&self, pid: i32) -> Option<ProcInfo> {
        crate::trees::procfs::stat(pid)
    }
}

#[cfg(test)]
pub(crate) use fake::{Change, FakeHost};

#[cfg(test)]
mod fake {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs::File;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, MutexGuard};

    use crate::trees::procfs::ProcInfo;

    /// A change the code under test asked the host for, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Change {
        /// A write of the value to the file.
        Write(PathBuf, String),
        /// A directory made.
        CreateDir(PathBuf),
        /// A directory removed.
        RemoveDir(PathBuf),
        /// A file opened for writing.
        Open(PathBuf),
    }

    /// The double's state.
    #[derive(Debug, Default)]
    struct State {
        files: BTreeMap<PathBuf, String>,
        dirs: BTreeSet<PathBuf>,
        /// Files (by name) every new directory gets, with their text: the
        /// control files the kernel puts in a new group.
        new_group_files: Vec<(String, String)>,
        cgroup2_mounts: BTreeSet<PathBuf>,
        writable: BTreeSet<PathBuf>,
        refused: BTreeMap<PathBuf, i32>,
        root: bool,
        pid: u32,
        parents: BTreeMap<i32, i32>,
        running: BTreeSet<i32>,
        changes: Vec<Change>,
        unique: u32,
        stats: BTreeMap<i32, ProcInfo>,
        refused_reads: BTreeMap<PathBuf, i32>,
        unlisted: Option<i32>,
    }

    /// A programmable host: see the module docs.
    #[derive(Debug, Default)]
    pub(crate) struct FakeHost(Mutex<State>);

    fn missing(path: &Path) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} does not exist", path.display()),
        )
    }

    impl FakeHost {
        /// An empty host: no file, not root, pid 4242.
        pub(crate) fn new() -> FakeHost {
            let host = FakeHost::default();
            host.state().pid = 4242;
            host.state().dirs.insert(PathBuf::from("/"));
            host
        }

        /// The double, leaked: the backends keep `&'static dyn Host`.
        pub(crate) fn leak(self) -> &'static FakeHost {
            Box::leak(Box::new(self))
        }

        fn state(&self) -> MutexGuard<'_, State> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Whether the server is the host's root.
        pub(crate) fn root(&self, root: bool) -> &FakeHost {
            self.state().root = root;
            self
        }

        /// A directory (and its parents).
        pub(crate) fn dir(&self, path: &str) -> &FakeHost {
            let mut s = self.state();
            for a in Path::new(path).ancestors() {
                s.dirs.insert(a.to_path_buf());
            }
            drop(s);
            self
        }

        /// A file with `text` (its directory made too).
        pub(crate) fn file(&self, path: &str, text: &str) -> &FakeHost {
            if let Some(parent) = Path::new(path).parent() {
                self.dir(&parent.to_string_lossy());
            }
            self.state().files.insert(path.into(), text.into());
            self
        }

        /// Files every directory made from now on gets (name, text).
        pub(crate) fn new_group_files(&self, files: &[(&str, &str)]) -> &FakeHost {
            self.state().new_group_files = files
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect();
            self
        }

        /// `path` is the root of a cgroup2 file system.
        pub(crate) fn cgroup2_mount(&self, path: &str) -> &FakeHost {
            self.dir(path);
            self.state().cgroup2_mounts.insert(path.into());
            self
        }

        /// The server may write `path` (a directory or a file).
        pub(crate) fn writable(&self, path: &str) -> &FakeHost {
            self.state().writable.insert(path.into());
            self
        }

        /// Every write to `path` fails with `errno`.
        pub(crate) fn refuse_writes(&self, path: &str, errno: i32) -> &FakeHost {
            self.state().refused.insert(path.into(), errno);
            self
        }

        /// A running process `pid`, child of `parent`.
        pub(crate) fn process(&self, pid: i32, parent: i32) -> &FakeHost {
            let mut s = self.state();
            s.running.insert(pid);
            s.parents.insert(pid, parent);
            drop(s);
            self
        }

        /// A process as `/proc` shows it: listed (`/proc/PID`), its
        /// `status` with `uid` and `state`, and its `stat` (`None`: its
        /// `stat` cannot be read).
        pub(crate) fn proc_entry(&self, pid: i32, uid: u32, state: char, stat: bool) -> &FakeHost {
            self.file(
                &format!("/proc/{pid}/status"),
                &format!("Name:\tx\nState:\t{state} (x)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            );
            if stat {
                self.state().stats.insert(
                    pid,
                    ProcInfo {
                        pid,
                        ppid: 1,
                        pgid: pid,
                        sid: pid,
                        state,
                        starttime: 100,
                    },
                );
            }
            self
        }

        /// Every read of `path` fails with `errno`.
        pub(crate) fn refuse_reads(&self, path: &str, errno: i32) -> &FakeHost {
            self.state().refused_reads.insert(path.into(), errno);
            self
        }

        /// Listing `/proc` fails with `errno`.
        pub(crate) fn refuse_listing(&self, errno: i32) -> &FakeHost {
            self.state().unlisted = Some(errno);
            self
        }

        /// The text of the file at `path`, if any.
        pub(crate) fn text(&self, path: &str) -> Option<String> {
            self.state().files.get(Path::new(path)).cloned()
        }

        /// Whether the directory `path` is there.
        pub(crate) fn has_dir(&self, path: &str) -> bool {
            self.state().dirs.contains(Path::new(path))
        }

        /// Every change asked for so far, in order.
        pub(crate) fn changes(&self) -> Vec<Change> {
            self.state().changes.clone()
        }

        /// The position of `change` in [`FakeHost::changes`]; panics with
        /// the log when it was never asked for.
        pub(crate) fn position(&self, change: &Change) -> usize {
            let changes = self.changes();
            changes
                .iter()
                .position(|c| c == change)
                .unwrap_or_else(|| panic!("{change:?} was never asked for; changes: {changes:#?}"))
        }

        fn make_dir(s: &mut State, path: &Path) {
            s.dirs.insert(path.to_path_buf());
            let files = s.new_group_files.clone();
            for (name, text) in files {
                s.files.insert(path.join(name), text);
            }
            s.changes.push(Change::CreateDir(path.to_path_buf()));
        }
    }

    impl super::Host for FakeHost {
        fn read(&self, path: &Path) -> io::Result<String> {
            let s = self.state();
            if let Some(errno) = s.refused_reads.get(path) {
                return Err(io::Error::from_raw_os_error(*errno));
            }
            if s.dirs.contains(path) {
                return Err(io::Error::other(format!(
                    "{} is a directory",
                    path.display()
                )));
            }
            s.files.get(path).cloned().ok_or_else(|| missing(path))
        }

        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            let mut s = self.state();
            s.changes
                .push(Change::Write(path.to_path_buf(), value.to_string()));
            if let Some(errno) = s.refused.get(path) {
                return Err(io::Error::from_raw_os_error(*errno));
            }
            if !s.files.contains_key(path) {
                return Err(missing(path));
            }
            s.files.insert(path.to_path_buf(), value.to_string());
            Ok(())
        }

        fn open_for_writing(&self, path: &Path) -> io::Result<File> {
            let mut s = self.state();
            s.changes.push(Change::Open(path.to_path_buf()));
            if !s.files.contains_key(path) {
                return Err(missing(path));
            }
            std::fs::OpenOptions::new().write(true).open("/dev/null")
        }

        fn create_dir(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            if s.dirs.contains(path) || s.files.contains_key(path) {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            if !path.parent().is_some_and(|p| s.dirs.contains(p)) {
                return Err(missing(path));
            }
            FakeHost::make_dir(&mut s, path);
            Ok(())
        }

        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            let mut todo: Vec<&Path> = path
                .ancestors()
                .take_while(|a| !s.dirs.contains(*a))
                .collect();
            todo.reverse();
            for dir in todo {
                FakeHost::make_dir(&mut s, dir);
            }
            Ok(())
        }

        fn create_unique_dir(&self, parent: &Path, prefix: &str) -> io::Result<PathBuf> {
            let n = {
                let mut s = self.state();
                s.unique += 1;
                s.unique
            };
            let dir = parent.join(format!("{prefix}-{n:08x}"));
            self.create_dir(&dir)?;
            Ok(dir)
        }

        fn remove_dir(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            s.changes.push(Change::RemoveDir(path.to_path_buf()));
            if !s.dirs.contains(path) {
                return Err(missing(path));
            }
            if s.dirs.iter().any(|d| d.parent() == Some(path)) {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            s.dirs.remove(path);
            s.files.retain(|f, _| f.parent() != Some(path));
            Ok(())
        }

        fn subdirs(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
            let s = self.state();
            if !s.dirs.contains(path) {
                return Err(missing(path));
            }
            Ok(s.dirs
                .iter()
                .filter(|d| d.parent() == Some(path))
                .cloned()
                .collect())
        }

        fn is_file(&self, path: &Path) -> bool {
            self.state().files.contains_key(path)
        }

        fn exists(&self, path: &Path) -> bool {
            let s = self.state();
            s.files.contains_key(path) || s.dirs.contains(path)
        }

        fn may_write_file(&self, path: &Path) -> bool {
            let s = self.state();
            s.files.contains_key(path) && s.writable.contains(path)
        }

        fn may_write_dir(&self, path: &Path) -> bool {
            let s = self.state();
            s.dirs.contains(path) && s.writable.contains(path)
        }

        fn is_cgroup2_mount(&self, path: &Path) -> bool {
            self.state().cgroup2_mounts.contains(path)
        }

        fn is_host_root(&self) -> bool {
            self.state().root
        }

        fn own_pid(&self) -> u32 {
            self.state().pid
        }

        fn parent_of(&self, pid: i32) -> Option<i32> {
            let s = self.state();
            s.running
                .contains(&pid)
                .then(|| s.parents.get(&pid).copied())
                .flatten()
        }

        fn is_dead(&self, pid: i32) -> bool {
            !self.state().running.contains(&pid)
        }

        fn pids(&self) -> io::Result<Vec<i32>> {
            let s = self.state();
            if let Some(errno) = s.unlisted {
                return Err(io::Error::from_raw_os_error(errno));
            }
            Ok(s.dirs
                .iter()
                .filter(|d| d.parent() == Some(Path::new("/proc")))
                .filter_map(|d| d.file_name()?.to_str()?.parse().ok())
                .collect())
        }

        fn stat(&self, pid: i32) -> Option<ProcInfo> {
            self.state().stats.get(&pid).cloned()
        }
    }
}
