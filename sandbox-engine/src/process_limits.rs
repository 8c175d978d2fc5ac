//! How many processes and how much memory a sandbox's commands may hold:
//! `RLIMIT_NPROC` and `RLIMIT_AS` set between fork and exec, and, where
//! the host lets the server use it, the kernel's cgroup v1 `pids`
//! controller (a group per sandbox uid, and one per command inside it in
//! a sandbox machine, see [`crate::machine`]).

use std::path::{Path, PathBuf};

/// Most processes (threads included) one sandbox's uid may have at once,
/// set with `RLIMIT_NPROC` on every bwrap tree: a fork bomb stops there.
pub const MAX_PROCESSES: u64 = 2048;

/// Largest address space of one sandboxed process (`RLIMIT_AS`), 8 GiB.
pub const MAX_ADDRESS_SPACE: u64 = 8 << 30;

/// `RLIMIT_NPROC` and `RLIMIT_AS` of a confined command (async-signal-safe:
/// runs between fork and exec).
pub(crate) fn set_limits() -> std::io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let limit = |n: u64| Rlimit {
        current: Some(n),
        maximum: Some(n),
    };
    setrlimit(Resource::Nproc, limit(MAX_PROCESSES))?;
    setrlimit(Resource::As, limit(MAX_ADDRESS_SPACE))?;
    Ok(())
}

/// Where the kernel's pids controller bounds sandboxes, when the host lets
/// the server use it: a cgroup v1 `pids` hierarchy the server (root) can
/// write, `/sys/fs/cgroup/pids`. Under it, `createos-local/` caps the
/// tasks of every sandbox of every server on the host together at
/// [`total_tasks`], and `createos-local/sandbox-<uid>/` caps one sandbox at
/// [`MAX_PROCESSES`] (nested namespaces and threads included). `None`
/// elsewhere (not root, cgroup v2 only, no pids controller): then only
/// `RLIMIT_NPROC` per sandbox uid applies. Empty groups stay (one per
/// sandbox uid, reused when the uid is).
pub fn pids_cgroup_base() -> Option<&'static Path> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        let v1 = Path::new("/sys/fs/cgroup/pids");
        if !v1.join("cgroup.procs").is_file() {
            return None;
        }
        let base = v1.join("createos-local");
        match std::fs::create_dir(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
        std::fs::write(base.join("pids.max"), total_tasks().to_string()).ok()?;
        Some(base)
    })
    .as_deref()
}

/// The most tasks all sandboxes on this host may hold together where the
/// pids controller is used: half the host's `kernel.pid_max`, so that
/// fork bombs in any number of sandboxes leave the host the other half.
pub fn total_tasks() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(16384, |max| (max / 2).max(MAX_PROCESSES))
}

/// The [`JOIN_FILE`] of the sandbox uid's pids group (created with its
/// `pids.max` on first use), opened for writing: the launcher writes `0`
/// to it between fork and exec, so bwrap and everything it starts are
/// counted. `None` without a pids hierarchy (see [`pids_cgroup_base`]).
pub(crate) fn pids_cgroup_procs(uid: u32) -> Option<std::fs::File> {
    let dir = pids_cgroup_base()?.join(format!("sandbox-{uid}"));
    match std::fs::create_dir(&dir) {
        Ok(()) => std::fs::write(dir.join("pids.max"), MAX_PROCESSES.to_string()).ok()?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(JOIN_FILE))
        .ok()
}

/// The file a launcher writes `0` to, between fork and exec, to join a
/// pids group: `tasks` (the calling thread), not `cgroup.procs` (its
/// whole thread group). The forked launcher has one thread, so both move
/// the same process, and everything it starts is counted; but moving the
/// current thread alone skips the kernel's global threadgroup lock, whose
/// write side waits for an RCU grace period: about 10 ms per command
/// through `cgroup.procs` (unless another move happened a few ms before),
/// 0.3 ms through `tasks` (measured on this host, BENCHMARKS.md).
const JOIN_FILE: &str = "tasks";

/// A new pids group for one command under its sandbox's group, and its
/// [`JOIN_FILE`] opened for writing.
pub(crate) fn command_cgroup(uid: u32, marker: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
    let sandbox = pids_cgroup_procs(uid)
        .and_then(|_| pids_cgroup_base().map(|b| b.join(format!("sandbox-{uid}"))))
        .ok_or_else(|| std::io::Error::other("no pids group for the sandbox"))?;
    // Unique even when a marker repeats (the start-up probe's) or a group
    // of an earlier server with the same sandbox uid was left behind.
    let mut attempt = 0;
    let dir = loop {
        let dir = sandbox.join(format!("cmd-{marker}-{}", crate::util::random_hex(4)));
        match std::fs::create_dir(&dir) {
            Ok(()) => break dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(JOIN_FILE))?;
    Ok((dir, procs))
}
