//! How many processes and how much memory a sandbox's commands may hold:
//! `RLIMIT_NPROC` set between fork and exec, and, where the host lets the
//! server use them, the kernel's cgroup v1 controllers: `pids` (a group
//! per sandbox, and one per command inside it in a sandbox machine, see
//! [`crate::machine`]) and `memory` (a group per sandbox, see
//! [`memory_cgroup_base`]).
//!
//! Memory is limited by what a sandbox *uses*, never by what its
//! processes *reserve*: no `RLIMIT_AS` (issue 44 item 2). V8 reserves
//! gigabytes of address space for one WebAssembly memory (Node's own
//! `fetch` makes one), a JVM reserves its whole heap ceiling, Go and
//! sanitizer runtimes reserve more; an address-space limit broke them all
//! while bounding nothing they used.
//!
//! The one file that knows where and how the host's cgroups are (cgroup
//! v1 today: the `pids` and `memory` hierarchies, the server's own group
//! in `/proc/self/cgroup`, the control files). The machine, the budgets
//! and the tree proof ask it ([`command_group_pids`], [`stop_forks`],
//! [`command_tasks`], [`pids_offered_here`]) and never read that layout
//! themselves; `tests/layers.rs` fails when another file names it.

use std::path::{Path, PathBuf};

/// Most processes (threads included) one sandbox's uid may have at once,
/// set with `RLIMIT_NPROC` on every bwrap tree: a fork bomb stops there.
pub const MAX_PROCESSES: u64 = 2048;

/// `RLIMIT_NPROC` of a confined command (async-signal-safe: runs between
/// fork and exec).
pub(crate) fn set_limits() -> std::io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let limit = |n: u64| Rlimit {
        current: Some(n),
        maximum: Some(n),
    };
    setrlimit(Resource::Nproc, limit(MAX_PROCESSES))?;
    Ok(())
}

/// The memory limit set by [`set_sandbox_memory`] (0: the default).
static SANDBOX_MEMORY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets the memory limit of every sandbox started from now on in this
/// process (`createos-local --sandbox-memory`,
/// `ServerBuilder::sandbox_memory`): process-wide, as the groups are.
pub fn set_sandbox_memory(bytes: u64) {
    SANDBOX_MEMORY.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// Most memory one sandbox may use (its processes' pages, page cache and
/// kernel memory charged to it, swap included), where the host has a
/// memory controller the server can use: as set ([`set_sandbox_memory`]),
/// else [`default_sandbox_memory`]. Past it the kernel reclaims, then
/// kills a process of that sandbox only (its OOM killer, scoped to the
/// group).
pub fn sandbox_memory() -> u64 {
    match SANDBOX_MEMORY.load(std::sync::atomic::Ordering::Relaxed) {
        0 => default_sandbox_memory(),
        set => set,
    }
}

/// Half the host's RAM, at most 8 GiB.
pub fn default_sandbox_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kib| kib * 1024);
    (total / 2).min(8 << 30)
}

/// Where the kernel's memory controller bounds sandboxes, when the host
/// lets the server use it: `createos-local/` under the server's own group
/// of a cgroup v1 `memory` hierarchy it (root) can write, so that whatever
/// bounds the server bounds its sandboxes too. Under it,
/// `sandbox-<uid>/` holds one sandbox at [`sandbox_memory`]. `None`
/// elsewhere (not root, cgroup v2 only, no memory controller): then
/// nothing bounds a sandbox's memory, and the startup line says so.
pub fn memory_cgroup_base() -> Option<&'static Path> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        if !crate::trees::id_map::ranges_here() {
            return None;
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        if !v1.join("cgroup.procs").is_file() {
            return None;
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.trim_start_matches('/').to_string())
        })?;
        let base = v1.join(path).join("createos-local");
        match std::fs::create_dir_all(&base) {
            Ok(()) => Some(base),
            Err(_) => None,
        }
    })
    .as_deref()
}

/// Whether a server started here would limit each sandbox's memory, as
/// far as can be told without touching the host (no group is created):
/// root and a cgroup v1 memory hierarchy. For descriptions (`sandbox
/// describe`, `sandbox doctor`); the server decides with
/// [`memory_cgroup_base`].
pub fn memory_limit_offered_here() -> bool {
    crate::trees::id_map::ranges_here() && Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file()
}

/// The `tasks` file of the memory group of the sandbox owned by `uid`
/// (created with its limit on first use), opened for writing: a launcher
/// writes `0` to it between fork and exec, so everything it starts is
/// charged to the sandbox. `None` without a memory hierarchy (see
/// [`memory_cgroup_base`]).
pub(crate) fn memory_cgroup_tasks(uid: u32) -> Option<std::fs::File> {
    let dir = memory_cgroup_base()?.join(format!("sandbox-{uid}"));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    // Written at every join: a group left by an earlier server with the
    // same range may hold another limit. Swap counts toward the same
    // limit where the host accounts it (memory + swap), so a sandbox
    // cannot spill into swap; memsw may never be below the memory limit,
    // so the order of the two writes follows the direction of the change.
    let limit = sandbox_memory().to_string();
    let memory = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if std::fs::write(&memory, &limit).is_ok() {
        let _ = std::fs::write(&memsw, &limit);
    } else {
        let _ = std::fs::write(&memsw, &limit);
        std::fs::write(&memory, &limit).ok()?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(JOIN_FILE))
        .ok()
}

/// The cgroup files a launcher of the sandbox owned by `uid` joins between
/// fork and exec: its pids group's and its memory group's `tasks` (each
/// where the host has that controller, see [`pids_cgroup_base`] and
/// [`memory_cgroup_base`]).
pub(crate) struct SandboxGroups {
    pids: Option<std::fs::File>,
    memory: Option<std::fs::File>,
}

impl SandboxGroups {
    /// The groups of the sandbox owned by `uid` (created on first use);
    /// none for `None` (a sandbox without ids of its own).
    pub(crate) fn of(uid: Option<u32>) -> SandboxGroups {
        SandboxGroups {
            pids: uid.and_then(pids_cgroup_procs),
            memory: uid.and_then(memory_cgroup_tasks),
        }
    }

    /// Their descriptors, for [`join_groups`] in the forked child.
    pub(crate) fn raw(&self) -> [Option<std::os::fd::RawFd>; 2] {
        use std::os::fd::AsRawFd;
        [
            self.pids.as_ref().map(|f| f.as_raw_fd()),
            self.memory.as_ref().map(|f| f.as_raw_fd()),
        ]
    }
}

/// Moves the calling (forked, single-threaded) process into the groups
/// whose `tasks` descriptors are `raw` (a plain write(2) each:
/// async-signal-safe).
pub(crate) fn join_groups(raw: [Option<std::os::fd::RawFd>; 2]) -> std::io::Result<()> {
    for fd in raw.into_iter().flatten() {
        // SAFETY: the caller owns these descriptors until the spawn returns;
        // the forked child has its own copies.
        rustix::io::write(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }, b"0")?;
    }
    Ok(())
}

/// What bounds a sandbox on this host, for the startup line and
/// `describe`.
pub fn describe() -> String {
    let processes = match pids_cgroup_base() {
        Some(_) => format!("{MAX_PROCESSES} tasks per sandbox (its pids group and RLIMIT_NPROC)"),
        None => format!("{MAX_PROCESSES} processes per uid (RLIMIT_NPROC; no pids group here)"),
    };
    let memory = match memory_cgroup_base() {
        Some(_) => format!(
            "memory {} MiB per sandbox, swap included (its memory group)",
            sandbox_memory() >> 20
        ),
        None => "memory NOT limited (no cgroup memory controller this server can use)".to_string(),
    };
    format!("{processes}; {memory}")
}

/// Removes the pids and memory groups of the sandbox owned by `uid` (and
/// any command group left in it), once every process of the sandbox is
/// proven gone: a group per sandbox ever made would otherwise stay on the
/// host (thousands after a day of short sandboxes, each a kernel object
/// the memory controller keeps statistics for). A group that still has a
/// member cannot be removed (the kernel refuses) and stays.
pub(crate) fn remove_sandbox_groups(uid: u32) {
    let name = format!("sandbox-{uid}");
    if let Some(base) = pids_cgroup_base() {
        let dir = base.join(&name);
        if let Ok(commands) = std::fs::read_dir(&dir) {
            for command in commands.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(command.path());
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }
    if let Some(base) = memory_cgroup_base() {
        let _ = std::fs::remove_dir(base.join(&name));
    }
}

/// How many times the kernel's OOM killer has killed a process of the
/// sandbox owned by `uid` (its memory group's `oom_kill` count); `None`
/// without a memory group.
pub fn sandbox_oom_kills(uid: u32) -> Option<u64> {
    let dir = memory_cgroup_base()?.join(format!("sandbox-{uid}"));
    let control = std::fs::read_to_string(dir.join("memory.oom_control")).ok()?;
    control
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
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
        if !crate::trees::id_map::ranges_here() {
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

/// The pids the kernel lists in the command group at `dir`
/// (`cgroup.procs`). `Err` when the list cannot be read: `NotFound` once
/// the group is removed (no directory, no member), anything else proves
/// nothing.
pub(crate) fn command_group_pids(dir: &Path) -> std::io::Result<Vec<i32>> {
    let list = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect())
}

/// No more forks in the command group at `dir` (a tree being killed):
/// its `pids.max` becomes 0.
pub(crate) fn stop_forks(dir: &Path) {
    let _ = std::fs::write(dir.join("pids.max"), "0");
}

/// Removes a command's emptied pids group: at once, or (while its last
/// processes are still being reaped, which keeps the group busy) retried
/// from a short-lived thread for up to 2 s. `keep` (the command's lease
/// on its machine) is dropped after the group.
pub(crate) fn remove_command_group_soon<T: Send + 'static>(dir: PathBuf, keep: T) {
    if std::fs::remove_dir(&dir).is_ok() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("createos-local-cgroup-rm".into())
        .spawn(move || {
            for _ in 0..100 {
                std::thread::sleep(std::time::Duration::from_millis(20));
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
            }
            drop(keep);
        });
}

/// The tasks the command groups of the sandbox owned by `uid` hold now
/// (each group's `pids.current`, its launcher not counted); `None`
/// without a pids hierarchy (see [`pids_cgroup_base`]).
pub(crate) fn command_tasks(uid: u32) -> Option<usize> {
    let dir = pids_cgroup_base()?.join(format!("sandbox-{uid}"));
    let mut tasks = 0;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("cmd-") {
            continue;
        }
        let current: usize = std::fs::read_to_string(entry.path().join("pids.current"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        tasks += current.saturating_sub(1);
    }
    Some(tasks)
}

/// Whether a server started here would give each sandbox a pids group,
/// as far as can be told without touching the host (no group is
/// created): root and a cgroup v1 `pids` hierarchy. The server decides
/// with [`pids_cgroup_base`].
pub fn pids_offered_here() -> bool {
    crate::trees::id_map::ranges_here() && Path::new("/sys/fs/cgroup/pids/cgroup.procs").is_file()
}
