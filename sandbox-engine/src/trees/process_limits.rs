//! How a command's process tree is held and proven gone, and how many
//! processes, how much memory and CPU a sandbox may use: the seam of the
//! tree backends (issue 42 item 2). [`TreeBackend::here`] chooses, in this
//! one place, how this host holds trees:
//!
//! | backend | where | tree proof | limits |
//! |---|---|---|---|
//! | [`TreeBackend::CgroupV1Pids`] | root with a cgroup v1 `pids` hierarchy (this file) | a pids group per command: its member list | `pids` and `memory` groups per sandbox |
//! | [`TreeBackend::CgroupV2Delegated`] | a cgroup v2 group the server may write: delegated to it, or root on a pure v2 host ([`cgroup_v2`]) | a group per command: `cgroup.kill`, `populated 0` | `pids.max`, `memory.max`, `cpu.max` where offered |
//! | [`TreeBackend::NoCgroup`] | anything else | a subreaper per command inside the machine (`crate::machine::anchor`) | `RLIMIT_NPROC` only |
//!
//! Every backend takes `RLIMIT_NPROC` set between fork and exec.
//!
//! Memory is limited by what a sandbox *uses*, never by what its
//! processes *reserve*: no `RLIMIT_AS` (issue 44 item 2). V8 reserves
//! gigabytes of address space for one WebAssembly memory (Node's own
//! `fetch` makes one), a JVM reserves its whole heap ceiling, Go and
//! sanitizer runtimes reserve more; an address-space limit broke them all
//! while bounding nothing they used.
//!
//! This file and [`cgroup_v2`] are the only ones that know where and how
//! the host's cgroups are (the v1 hierarchies, the server's own group in
//! `/proc/self/cgroup`, the control files). The machine, the budgets and
//! the tree proof ask them ([`CommandGroup`], [`SandboxGroups`],
//! [`TreeBackend`]) and never read that layout themselves;
//! `tests/layers.rs` fails when another file names it.

use std::path::{Path, PathBuf};

use crate::trees::cgroup_v2;

/// How this host holds a sandbox machine's command trees (see the
/// module docs).
#[derive(Debug, Clone, Copy)]
pub enum TreeBackend {
    /// A cgroup v1 pids group per command, under a root server's
    /// [`pids_cgroup_base`].
    CgroupV1Pids,
    /// A cgroup v2 group per command in the server's delegated group.
    CgroupV2Delegated(&'static cgroup_v2::Delegated),
    /// No cgroup this server can write.
    NoCgroup,
}

impl TreeBackend {
    /// The backend in force, chosen once: cgroup v1 `pids` where the server
    /// is root and has it (as before: this CI kind of host keeps it), else
    /// a writable cgroup v2 group (the server moves itself into a leaf of
    /// it the first time this is asked), else none.
    pub fn here() -> TreeBackend {
        if pids_cgroup_base().is_some() {
            TreeBackend::CgroupV1Pids
        } else if let Some(d) = cgroup_v2::here() {
            TreeBackend::CgroupV2Delegated(d)
        } else {
            TreeBackend::NoCgroup
        }
    }

    /// The backend a server started here would choose, as far as can be
    /// told without touching the host (no group is made, nothing moved).
    /// For descriptions (`sandbox describe`, `sandbox doctor`).
    pub fn offered_here() -> Offered {
        if pids_offered_here() {
            Offered::CgroupV1Pids
        } else if let Some(group) = cgroup_v2::own_writable_group() {
            Offered::CgroupV2Delegated(group)
        } else {
            Offered::NoCgroup
        }
    }
}

/// [`TreeBackend::offered_here`]: a backend without touching the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// See [`TreeBackend::CgroupV1Pids`].
    CgroupV1Pids,
    /// See [`TreeBackend::CgroupV2Delegated`]: the group found.
    CgroupV2Delegated(PathBuf),
    /// See [`TreeBackend::NoCgroup`].
    NoCgroup,
}

/// The most a sandbox group may use on cgroup v2.
fn v2_limits() -> cgroup_v2::Limits {
    cgroup_v2::Limits {
        tasks: MAX_PROCESSES,
        memory: sandbox_memory(),
        cpus: sandbox_cpus(),
    }
}

/// How many CPUs one sandbox may keep busy where the host's cgroup `cpu`
/// controller is used (cgroup v2 `cpu.max`): every CPU of the host but
/// one, at least one, so that no sandbox takes the whole host from the
/// engine and the other sandboxes.
pub fn sandbox_cpus() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    cpus.saturating_sub(1).max(1)
}

/// Which kind of group a [`CommandGroup`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    V1Pids,
    V2,
}

/// One command's own group (cgroup v1 pids or cgroup v2): its members are
/// exactly the command's tree, its launcher included.
#[derive(Debug)]
pub struct CommandGroup {
    dir: PathBuf,
    kind: Kind,
}

impl CommandGroup {
    /// A new group for one command of the sandbox at `root` (owned by
    /// `uid` where it has ids of its own), marked `marker`, and the file
    /// its launcher writes `0` to (opened for writing) between fork and
    /// exec. `None` where this host has no group for commands
    /// ([`TreeBackend::NoCgroup`], or cgroup v1 for a sandbox without a
    /// uid of its own).
    pub(crate) fn create(
        root: &Path,
        uid: Option<u32>,
        marker: &str,
    ) -> Option<std::io::Result<(CommandGroup, std::fs::File)>> {
        match (TreeBackend::here(), uid) {
            (TreeBackend::CgroupV1Pids, Some(uid)) => Some(command_cgroup(uid, marker).map(
                |(dir, file)| {
                    (
                        CommandGroup {
                            dir,
                            kind: Kind::V1Pids,
                        },
                        file,
                    )
                },
            )),
            (TreeBackend::CgroupV2Delegated(d), _) => Some(
                d.command(root, marker, &v2_limits())
                    .map(|(dir, file)| (CommandGroup { dir, kind: Kind::V2 }, file)),
            ),
            _ => None,
        }
    }

    /// A cgroup v1 pids group at `dir` (for tests of the proof).
    #[cfg(test)]
    pub(crate) fn v1_at(dir: PathBuf) -> CommandGroup {
        CommandGroup {
            dir,
            kind: Kind::V1Pids,
        }
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pids the kernel lists in the group now. `Err` when the list
    /// cannot be read: `NotFound` once the group is removed (no directory,
    /// no member), anything else proves nothing.
    pub(crate) fn pids(&self) -> std::io::Result<Vec<i32>> {
        match self.kind {
            Kind::V1Pids => command_group_pids(&self.dir),
            Kind::V2 => cgroup_v2::members(&self.dir),
        }
    }

    /// Whether the group is proven empty now: cgroup v1, a fresh member
    /// list with no live process (or the group removed); cgroup v2, the
    /// kernel's `populated 0`. A list that cannot be read proves nothing.
    pub(crate) fn is_empty(&self) -> bool {
        match self.kind {
            Kind::V1Pids => match command_group_pids(&self.dir) {
                Ok(pids) => pids.into_iter().all(crate::trees::procfs::is_dead),
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            },
            Kind::V2 => cgroup_v2::is_empty(&self.dir),
        }
    }

    /// The kernel's part of killing the tree: cgroup v1, no more forks
    /// (`pids.max` 0; the caller signals every member); cgroup v2,
    /// `cgroup.kill` (every member, racing forks included).
    pub(crate) fn kill(&self) {
        match self.kind {
            Kind::V1Pids => stop_forks(&self.dir),
            Kind::V2 => {
                cgroup_v2::kill(&self.dir);
            }
        }
    }

    /// Freezes or thaws the group through the kernel (cgroup v2
    /// `cgroup.freeze`); `false` where the caller must stop its members
    /// with signals (cgroup v1 pids has no freezer).
    pub(crate) fn freeze(&self, stop: bool) -> bool {
        self.kind == Kind::V2 && cgroup_v2::freeze(&self.dir, stop)
    }

    /// Removes the emptied group (see [`remove_command_group_soon`]).
    pub(crate) fn remove_soon<T: Send + 'static>(&self, keep: T) {
        remove_command_group_soon(self.dir.clone(), keep);
    }

    /// Removes the group now (a spawn that failed: nothing joined it).
    pub(crate) fn forget(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Freezes (or thaws) everything of the sandbox at `root` through its
/// cgroup v2 group; `false` where it has none (the caller stops its
/// processes with signals).
pub(crate) fn freeze_sandbox(root: &Path, stop: bool) -> bool {
    match TreeBackend::here() {
        TreeBackend::CgroupV2Delegated(d) => d.freeze_sandbox(root, stop),
        _ => false,
    }
}


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
        if !rustix::process::geteuid().is_root() {
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
/// root and a cgroup v1 memory hierarchy, or a writable cgroup v2 group
/// that offers the memory controller (the server still needs to be alone
/// in it to enable it, see [`cgroup_v2`]). For descriptions (`sandbox
/// describe`, `sandbox doctor`); the server decides with
/// [`memory_cgroup_base`] and [`TreeBackend::here`].
pub fn memory_limit_offered_here() -> bool {
    match TreeBackend::offered_here() {
        Offered::CgroupV2Delegated(group) => {
            cgroup_v2::offers(&group, "memory")
        }
        _ => {
            rustix::process::geteuid().is_root()
                && Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file()
        }
    }
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

/// The cgroup files the machine of a sandbox (or a command with
/// namespaces of its own) joins between fork and exec: cgroup v1, the
/// pids group's and the memory group's `tasks` of the sandbox owned by
/// `uid` (each where the host has that controller, see
/// [`pids_cgroup_base`] and [`memory_cgroup_base`]); cgroup v2, the
/// `cgroup.procs` of the sandbox's `machine` leaf.
pub(crate) struct SandboxGroups {
    pids: Option<std::fs::File>,
    memory: Option<std::fs::File>,
}

impl SandboxGroups {
    /// The groups of the sandbox at `root`, owned by `uid` where it has
    /// ids of its own (created on first use). cgroup v1 needs the uid; a
    /// cgroup v2 machine leaf that cannot be made fails (a machine
    /// outside its sandbox's group would hold processes nothing proves).
    pub(crate) fn of(root: &Path, uid: Option<u32>) -> std::io::Result<SandboxGroups> {
        if let TreeBackend::CgroupV2Delegated(d) = TreeBackend::here() {
            return Ok(SandboxGroups {
                pids: Some(d.machine_procs(root, &v2_limits())?),
                memory: None,
            });
        }
        Ok(SandboxGroups {
            pids: uid.and_then(pids_cgroup_procs),
            memory: uid.and_then(memory_cgroup_tasks),
        })
    }

    /// The cgroup v1 groups of the sandbox owned by `uid` (a command with
    /// namespaces of its own: no machine, so no cgroup v2 leaf).
    pub(crate) fn v1_of(uid: Option<u32>) -> SandboxGroups {
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
/// `describe`: each limit and whether it is enforced.
pub fn describe() -> String {
    if let TreeBackend::CgroupV2Delegated(d) = TreeBackend::here() {
        let limit = |controller: &str, enforced: String, instead: &str| match d.why_not(controller) {
            None => format!("{enforced} (enforced)"),
            Some(why) => format!("{instead}: NOT enforced ({why})"),
        };
        return format!(
            "{}; {}; {}",
            limit(
                "pids",
                format!("pids.max {MAX_PROCESSES} tasks per sandbox, and RLIMIT_NPROC"),
                &format!("{MAX_PROCESSES} processes per sandbox by RLIMIT_NPROC only; pids.max"),
            ),
            limit(
                "memory",
                format!(
                    "memory.max {} MiB per sandbox, no swap",
                    sandbox_memory() >> 20
                ),
                "memory NOT limited; memory.max",
            ),
            limit(
                "cpu",
                format!("cpu.max {} CPU(s) per sandbox", sandbox_cpus()),
                "cpu NOT limited; cpu.max",
            ),
        );
    }
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
    format!("{processes}; {memory}; cpu NOT limited (no cgroup cpu controller in use)")
}

/// Removes the groups of the sandbox at `root` (its cgroup v2 groups, and
/// the cgroup v1 ones of `uid` where it has ids of its own) once every
/// process of it is proven gone.
pub(crate) fn remove_sandbox_groups_at(root: &Path, uid: Option<u32>) {
    if let Some(uid) = uid {
        remove_sandbox_groups(uid);
    }
    if let Some(d) = cgroup_v2::here_if_made() {
        d.remove_sandbox(root);
    }
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
/// sandbox at `root` (its memory group's `oom_kill` count); `None`
/// without a memory group.
pub fn sandbox_oom_kills(root: &Path) -> Option<u64> {
    if let TreeBackend::CgroupV2Delegated(d) = TreeBackend::here() {
        return d.oom_kills(root);
    }
    let uid = crate::trees::host_processes::sandbox_uid(root)?;
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
fn command_cgroup(uid: u32, marker: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
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
fn command_group_pids(dir: &Path) -> std::io::Result<Vec<i32>> {
    let list = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect())
}

/// No more forks in the command group at `dir` (a tree being killed):
/// its `pids.max` becomes 0.
fn stop_forks(dir: &Path) {
    let _ = std::fs::write(dir.join("pids.max"), "0");
}

/// Removes a command's emptied pids group: at once, or (while its last
/// processes are still being reaped, which keeps the group busy) retried
/// from a short-lived thread for up to 2 s. `keep` (the command's lease
/// on its machine) is dropped after the group.
fn remove_command_group_soon<T: Send + 'static>(dir: PathBuf, keep: T) {
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

/// The tasks the command groups of the sandbox at `root` hold now (its
/// launchers not counted); `None` where commands have no group.
pub(crate) fn command_tasks(root: &Path) -> Option<usize> {
    match TreeBackend::here() {
        TreeBackend::CgroupV2Delegated(d) => d.command_tasks(root),
        TreeBackend::CgroupV1Pids => {
            command_tasks_v1(crate::trees::host_processes::sandbox_uid(root)?)
        }
        TreeBackend::NoCgroup => None,
    }
}

/// cgroup v1: each command group's `pids.current`, its launcher not
/// counted; `None` without a pids hierarchy.
fn command_tasks_v1(uid: u32) -> Option<usize> {
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
    rustix::process::geteuid().is_root() && Path::new("/sys/fs/cgroup/pids/cgroup.procs").is_file()
}
