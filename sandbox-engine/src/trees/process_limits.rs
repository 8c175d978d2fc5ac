//! How a command's process tree is held and proven gone, and how many
//! processes, how much memory and CPU a sandbox may use: the seam of the
//! tree backends (issue 42 item 2). [`TreeBackend::here`] chooses, in this
//! one place, how this host holds trees:
//!
//! | backend | where | tree proof | limits |
//! |---|---|---|---|
//! | [`TreeBackend::CgroupV1Pids`] | root with a cgroup v1 `pids` hierarchy (this file) | a pids group per command: its member list | `pids` and `memory` groups per sandbox |
//! | [`TreeBackend::CgroupV2Delegated`] | a cgroup v2 group the server may write: delegated to it, or root on a pure v2 host ([`cgroup_v2`]) | a group per command: `cgroup.kill`, `populated 0` | `pids.max`, `memory.max`, `cpu.max` where offered |
//! | [`TreeBackend::NoCgroup`] | anything else | a subreaper per command inside the machine ([`crate::trees::anchor`]) | `RLIMIT_NPROC` only |
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

use crate::trees::cgroup_v1;
use crate::trees::cgroup_v2;
use crate::trees::host::{self, Host};

pub(crate) use crate::trees::cgroup_v1::remove_sandbox_groups;
pub use crate::trees::cgroup_v1::{
    memory_cgroup_base, pids_cgroup_base, pids_offered_here, total_tasks, NoPidsGroup,
};
pub use crate::trees::cgroup_v2::{ControllerNotEnabled, NoDelegatedGroup};

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
        chosen_here().0
    }

    /// Why [`TreeBackend::here`] is the backend in force, in words: what
    /// this host offered, and what it lacked for the backends before it.
    pub fn why_here() -> &'static str {
        &chosen_here().1
    }

    /// The choice of [`TreeBackend::here`], from the answers of the two
    /// cgroup backends: the v1 pids base (made already), and the v2
    /// subtree, made only when v1 is not there (making it moves the
    /// server). With why, in words.
    fn choose<'a>(
        v1: Result<&Path, &NoPidsGroup>,
        v2: impl FnOnce() -> Result<&'static cgroup_v2::Delegated, &'a NoDelegatedGroup>,
    ) -> (TreeBackend, String) {
        let no_v1 = match v1 {
            Ok(base) => {
                return (
                    TreeBackend::CgroupV1Pids,
                    format!(
                        "a cgroup v1 pids group per command under {}: the server is the host's \
                         root and the host has a v1 pids hierarchy",
                        base.display()
                    ),
                )
            }
            Err(why) => why.to_string(),
        };
        match v2() {
            Ok(d) => (
                TreeBackend::CgroupV2Delegated(d),
                format!(
                    "a cgroup v2 group per command in {}, which the server may write (no v1 \
                     pids groups: {no_v1})",
                    d.group().display()
                ),
            ),
            Err(no_v2) => (
                TreeBackend::NoCgroup,
                format!("a subreaper per command, no cgroup: {no_v1}; and {no_v2}"),
            ),
        }
    }

    /// The backend a server started here would choose, as far as can be
    /// told without touching the host (no group is made, nothing moved).
    /// For descriptions (`sandbox describe`, `sandbox doctor`).
    pub fn offered_here() -> Offered {
        if pids_offered_here() {
            Offered::CgroupV1Pids
        } else if let Some(d) = cgroup_v2::here_if_made() {
            // This process runs an engine already (`sandbox doctor`'s
            // probe): it moved into its own leaf, so its group now is that
            // leaf, not the one delegated to it.
            Offered::CgroupV2Delegated(d.group().to_path_buf())
        } else if let Some(group) = cgroup_v2::own_writable_group() {
            Offered::CgroupV2Delegated(group)
        } else {
            Offered::NoCgroup
        }
    }
}

/// The backend in force and why, chosen once (see [`TreeBackend::here`]).
fn chosen_here() -> &'static (TreeBackend, String) {
    static CHOSEN: std::sync::OnceLock<(TreeBackend, String)> = std::sync::OnceLock::new();
    CHOSEN.get_or_init(|| TreeBackend::choose(cgroup_v1::pids_base_here(), cgroup_v2::here))
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
    host: &'static dyn Host,
}

/// What a look at a command group decided ([`CommandGroup::is_empty`]).
enum Look {
    /// Proven empty.
    Empty,
    /// Something may run in it; the member list read, if it was.
    Held(Option<Vec<i32>>),
    /// Its member list could not be read: nothing is proven.
    Unread(std::io::Error),
}

/// Why a command group is not proven empty: what may still run in it.
#[derive(Debug, thiserror::Error)]
pub enum GroupNotEmpty {
    /// Processes are still in the group.
    #[error(
        "{} process(es) still run in the command group {} (host pids {pids:?}): the command's \
         tree is not proven gone",
        .pids.len(),
        .group.display()
    )]
    Survivors {
        /// The group's directory.
        group: PathBuf,
        /// The live pids the kernel lists in it (cgroup v2: empty when
        /// only groups below it are populated).
        pids: Vec<i32>,
    },
    /// The group could not be read: nothing is proven.
    #[error(
        "the command group {} could not be read ({source}); its processes may still run",
        .group.display()
    )]
    Unread {
        /// The group's directory.
        group: PathBuf,
        /// Why.
        source: std::io::Error,
    },
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
            (TreeBackend::CgroupV1Pids, Some(uid)) => Some(
                cgroup_v1::command_cgroup(uid, marker, MAX_PROCESSES).map(|(dir, file)| {
                    (
                        CommandGroup {
                            dir,
                            kind: Kind::V1Pids,
                            host: &host::REAL,
                        },
                        file,
                    )
                }),
            ),
            (TreeBackend::CgroupV2Delegated(d), _) => {
                Some(d.command(root, marker, &v2_limits()).map(|(dir, file)| {
                    (
                        CommandGroup {
                            dir,
                            kind: Kind::V2,
                            host: d.host(),
                        },
                        file,
                    )
                }))
            }
            _ => None,
        }
    }

    /// A cgroup v1 pids group at `dir` (for tests of the proof).
    #[cfg(test)]
    pub(crate) fn v1_at(dir: PathBuf) -> CommandGroup {
        CommandGroup {
            dir,
            kind: Kind::V1Pids,
            host: &host::REAL,
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
            Kind::V1Pids => cgroup_v1::command_group_pids_on(self.host, &self.dir),
            Kind::V2 => cgroup_v2::members_on(self.host, &self.dir),
        }
    }

    /// Whether the group is proven empty now (see [`CommandGroup::proof`]):
    /// asked every 100 ms while a command's tree lives, so it stops at
    /// what decides (the first live member on cgroup v1, the kernel's
    /// `populated` on cgroup v2) and never lists the survivors.
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.look(), Look::Empty)
    }

    /// The proof that the group is empty now, or what may still run in
    /// it (the live pids the kernel lists in it): cgroup v1, a fresh
    /// member list with no live process (or the group removed); cgroup
    /// v2, the kernel's `populated 0` (or the group removed). A list that
    /// cannot be read proves nothing.
    pub fn proof(&self) -> Result<(), GroupNotEmpty> {
        let unread = |source| GroupNotEmpty::Unread {
            group: self.dir.clone(),
            source,
        };
        match self.look() {
            Look::Empty => Ok(()),
            Look::Unread(source) => Err(unread(source)),
            Look::Held(listed) => match listed.map_or_else(|| self.pids(), Ok) {
                Ok(pids) => Err(GroupNotEmpty::Survivors {
                    group: self.dir.clone(),
                    pids: pids
                        .into_iter()
                        .filter(|p| !self.host.is_dead(*p))
                        .collect(),
                }),
                Err(source) => Err(unread(source)),
            },
        }
    }

    /// What a fresh look at the group decides, as cheaply as it can.
    fn look(&self) -> Look {
        let host = self.host;
        match self.kind {
            Kind::V1Pids => match cgroup_v1::command_group_pids_on(host, &self.dir) {
                Ok(pids) if pids.iter().all(|p| host.is_dead(*p)) => Look::Empty,
                Ok(pids) => Look::Held(Some(pids)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Look::Empty,
                Err(e) => Look::Unread(e),
            },
            Kind::V2 if cgroup_v2::is_empty_on(host, &self.dir) => Look::Empty,
            Kind::V2 => Look::Held(None),
        }
    }

    /// The kernel's part of killing the tree: cgroup v1, no more forks
    /// (`pids.max` 0; the caller signals every member); cgroup v2,
    /// `cgroup.kill` (every member, racing forks included).
    pub(crate) fn kill(&self) {
        match self.kind {
            Kind::V1Pids => cgroup_v1::stop_forks_on(self.host, &self.dir),
            Kind::V2 => {
                cgroup_v2::kill_on(self.host, &self.dir);
            }
        }
    }

    /// Freezes or thaws the group through the kernel (cgroup v2
    /// `cgroup.freeze`); `false` where the caller must stop its members
    /// with signals (cgroup v1 pids has no freezer).
    pub(crate) fn freeze(&self, stop: bool) -> bool {
        self.kind == Kind::V2 && cgroup_v2::freeze_on(self.host, &self.dir, stop)
    }

    /// Removes the emptied group (see [`remove_command_group_soon`]).
    pub(crate) fn remove_soon<T: Send + 'static>(&self, keep: T) {
        remove_command_group_soon(self.dir.clone(), keep);
    }

    /// Removes the group now (a spawn that failed: nothing joined it).
    pub(crate) fn forget(&self) {
        let _ = self.host.remove_dir(&self.dir);
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

/// What every sandbox process has in `/proc/self/oom_score_adj`: the
/// most the kernel allows, so that when the host runs out of memory (all
/// sandboxes' memory limits together may pass it, and where no memory
/// group is offered nothing limits a sandbox) the OOM killer takes a
/// sandbox's processes before the server, whose proofs must outlive
/// them, and before anything else of the host.
pub const SANDBOX_OOM_SCORE_ADJ: i32 = 1000;

/// Puts the calling process (and what it forks) first in the OOM killer's
/// choice ([`SANDBOX_OOM_SCORE_ADJ`]); async-signal-safe: runs between
/// fork and exec. Raising one's own score needs no privilege; where the
/// host still refuses it (no `/proc`, a seccomp filter) the process keeps
/// the server's score: a weaker defence, not a reason to refuse the start.
///
/// A process whose uid was just changed (std's `Command::uid` does it
/// before `pre_exec`) is not dumpable, which makes its `/proc/self` files
/// root's: it is made dumpable only for the write and put back as it was,
/// so that nothing of the sandbox's uid can attach to it before its
/// `execve` (which then sets dumpability from the credentials, as always).
pub(crate) fn first_for_the_oom_killer() {
    use rustix::fs::{open, Mode, OFlags};
    use rustix::process::{dumpable_behavior, set_dumpable_behavior, DumpableBehavior};
    let was = dumpable_behavior().unwrap_or(DumpableBehavior::NotDumpable);
    let _ = set_dumpable_behavior(DumpableBehavior::Dumpable);
    if let Ok(fd) = open(
        c"/proc/self/oom_score_adj",
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        let _ = rustix::io::write(&fd, b"1000");
    }
    let _ = set_dumpable_behavior(was);
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

/// Whether a server started here would limit each sandbox's memory, as
/// far as can be told without touching the host (no group is created):
/// root and a cgroup v1 memory hierarchy, or a writable cgroup v2 group
/// that offers the memory controller (the server still needs to be alone
/// in it to enable it, see [`cgroup_v2`]). For descriptions (`sandbox
/// describe`, `sandbox doctor`); the server decides with
/// [`memory_cgroup_base`] and [`TreeBackend::here`].
pub fn memory_limit_offered_here() -> bool {
    match TreeBackend::offered_here() {
        Offered::CgroupV2Delegated(group) => cgroup_v2::offers(&group, "memory"),
        _ => cgroup_v1::memory_offered_here(),
    }
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
            pids: uid.and_then(|uid| cgroup_v1::pids_cgroup_procs(uid, MAX_PROCESSES)),
            memory: uid.and_then(memory_cgroup_tasks),
        })
    }

    /// The cgroup v1 groups of the sandbox owned by `uid` (a command with
    /// namespaces of its own: no machine, so no cgroup v2 leaf).
    pub(crate) fn v1_of(uid: Option<u32>) -> SandboxGroups {
        SandboxGroups {
            pids: uid.and_then(|uid| cgroup_v1::pids_cgroup_procs(uid, MAX_PROCESSES)),
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
        let limit = |controller: &str, enforced: String, instead: &str| match d.why_not(controller)
        {
            None => format!("{enforced} (enforced)"),
            Some(why) => format!("{instead}: NOT enforced ({why})"),
        };
        return format!(
            "{}; {}; {}; command trees held by {}",
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
            TreeBackend::why_here(),
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
    format!(
        "{processes}; {memory}; cpu NOT limited (no cgroup cpu controller in use); command trees \
         held by {}",
        TreeBackend::why_here()
    )
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

/// How many times the kernel's OOM killer has killed a process of the
/// sandbox at `root` (its memory group's `oom_kill` count); `None`
/// without a memory group.
pub fn sandbox_oom_kills(root: &Path) -> Option<u64> {
    if let TreeBackend::CgroupV2Delegated(d) = TreeBackend::here() {
        return d.oom_kills(root);
    }
    cgroup_v1::oom_kills(crate::trees::host_processes::sandbox_uid(root)?)
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
            cgroup_v1::command_tasks(crate::trees::host_processes::sandbox_uid(root)?)
        }
        TreeBackend::NoCgroup => None,
    }
}

/// The `tasks` file of the cgroup v1 memory group of the sandbox owned by
/// `uid`, limited to [`sandbox_memory`] (made on first use), opened for
/// writing: a launcher writes `0` to it between fork and exec. `None`
/// without a v1 memory hierarchy (see [`memory_cgroup_base`]).
pub(crate) fn memory_cgroup_tasks(uid: u32) -> Option<std::fs::File> {
    cgroup_v1::memory_cgroup_tasks(uid, sandbox_memory())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::trees::cgroup_v2::tests::{delegated_host, GROUP};
    use crate::trees::host::{Change, FakeHost};

    /// The choice [`TreeBackend::here`] makes, made on `h`.
    fn chosen_on(h: &'static FakeHost) -> (TreeBackend, String) {
        let v1 = cgroup_v1::pids_base_on(h);
        TreeBackend::choose(v1.as_deref(), || {
            let made: &'static Result<cgroup_v2::Delegated, NoDelegatedGroup> =
                Box::leak(Box::new(cgroup_v2::Delegated::make(h)));
            made.as_ref()
        })
    }

    /// Whether anything was made or moved in the delegated cgroup v2
    /// group.
    fn touched_v2(h: &FakeHost) -> bool {
        h.changes().iter().any(|c| match c {
            Change::Write(p, _) | Change::CreateDir(p) | Change::Open(p) => p.starts_with(GROUP),
            Change::RemoveDir(_) => false,
        })
    }

    /// A hybrid host: the cgroup v1 pids hierarchy beside the delegated
    /// v2 group of [`delegated_host`].
    fn hybrid_host() -> &'static FakeHost {
        let h = delegated_host("pids memory cpu\n");
        h.file("/sys/fs/cgroup/pids/cgroup.procs", "")
            .file("/proc/sys/kernel/pid_max", "4194304\n")
            .writable("/sys/fs/cgroup/pids");
        h
    }

    /// Root with a cgroup v1 pids hierarchy: pids groups, capped together
    /// at half of `pid_max`, and the v2 group is never touched (making
    /// it would move the server).
    #[test]
    fn root_with_a_v1_pids_hierarchy_gets_pids_groups() {
        let h = hybrid_host();
        h.root(true);
        let (backend, why) = chosen_on(h);
        assert!(
            matches!(backend, TreeBackend::CgroupV1Pids),
            "{backend:?}: {why}"
        );
        assert!(why.contains("/sys/fs/cgroup/pids/createos-local"), "{why}");
        assert_eq!(
            h.text("/sys/fs/cgroup/pids/createos-local/pids.max")
                .as_deref(),
            Some("2097152")
        );
        assert!(
            !touched_v2(h),
            "the v2 group was touched: {:#?}",
            h.changes()
        );
    }

    /// Root on a pure cgroup v2 host: its own group, and the reason says
    /// why not v1.
    #[test]
    fn root_on_pure_v2_gets_its_own_group() {
        let h = delegated_host("pids memory cpu\n");
        h.root(true);
        let (backend, why) = chosen_on(h);
        let TreeBackend::CgroupV2Delegated(d) = backend else {
            panic!("{backend:?}: {why}");
        };
        assert_eq!(d.group(), Path::new(GROUP));
        assert!(why.contains(GROUP), "{why}");
        assert!(why.contains("no cgroup v1 pids hierarchy"), "{why}");
    }

    /// An ordinary user never gets cgroup v1 groups (they are root's),
    /// even where the host has the hierarchy: its delegated v2 group.
    #[test]
    fn an_ordinary_user_with_a_delegated_group_gets_it() {
        let h = hybrid_host();
        let (backend, why) = chosen_on(h);
        let TreeBackend::CgroupV2Delegated(d) = backend else {
            panic!("{backend:?}: {why}");
        };
        assert_eq!(d.group(), Path::new(GROUP));
        assert!(why.contains("not the host's root"), "{why}");
        assert!(
            !h.changes()
                .iter()
                .any(|c| matches!(c, Change::CreateDir(p) if p.starts_with("/sys/fs/cgroup/pids"))),
            "a v1 group was made: {:#?}",
            h.changes()
        );
    }

    /// An ordinary user whose group it may not write: no cgroup, the
    /// anchor, and the reason names the group and the fix.
    #[test]
    fn an_ordinary_user_without_a_writable_group_gets_the_anchor() {
        let h = FakeHost::new().leak();
        h.file("/proc/self/cgroup", "0::/user.slice/session-2.scope\n")
            .cgroup2_mount("/sys/fs/cgroup")
            .file(
                "/sys/fs/cgroup/user.slice/session-2.scope/cgroup.procs",
                "4242\n",
            );
        let (backend, why) = chosen_on(h);
        assert!(
            matches!(backend, TreeBackend::NoCgroup),
            "{backend:?}: {why}"
        );
        assert!(why.contains("not the host's root"), "{why}");
        assert!(
            why.contains("may not write its cgroup /sys/fs/cgroup/user.slice/session-2.scope"),
            "{why}"
        );
        assert!(why.contains("Delegate=yes"), "{why}");
        assert!(h.changes().is_empty(), "{:#?}", h.changes());
    }

    fn group_on(h: &'static FakeHost, dir: &str, kind: Kind) -> CommandGroup {
        CommandGroup {
            dir: PathBuf::from(dir),
            kind,
            host: h,
        }
    }

    /// cgroup v1: after the kill (no more forks: `pids.max` 0) a group
    /// whose member list still has a live process is not proven empty,
    /// and the answer names the live pids (a dead member does not count);
    /// a list that cannot be read proves nothing; a removed group is
    /// empty.
    #[test]
    fn a_v1_group_with_a_live_member_after_the_kill_is_not_proven_empty() {
        let dir = "/sys/fs/cgroup/pids/createos-local/sandbox-1/cmd-m-1";
        let h = FakeHost::new().leak();
        h.file(&format!("{dir}/cgroup.procs"), "12\n34\n")
            .file(&format!("{dir}/pids.max"), "2048")
            .process(12, 1);
        let group = group_on(h, dir, Kind::V1Pids);
        group.kill();
        assert_eq!(h.text(&format!("{dir}/pids.max")).as_deref(), Some("0"));
        let e = group.proof().expect_err("12 still runs");
        assert!(
            matches!(&e, GroupNotEmpty::Survivors { pids, group } if pids == &[12] && group == Path::new(dir)),
            "{e:?}"
        );
        let said = e.to_string();
        assert!(said.contains("[12]") && said.contains(dir), "{said}");
        assert!(!group.is_empty());

        h.file(&format!("{dir}/cgroup.procs"), "34\n");
        assert!(group.proof().is_ok(), "only a dead member is left");

        h.dir(&format!("{dir}/cgroup.procs"));
        let e = group.proof().expect_err("a list that cannot be read");
        assert!(matches!(e, GroupNotEmpty::Unread { .. }), "{e:?}");
        assert!(!group.is_empty());

        let gone = group_on(
            h,
            "/sys/fs/cgroup/pids/createos-local/sandbox-1/cmd-gone",
            Kind::V1Pids,
        );
        assert!(gone.proof().is_ok(), "a removed group holds nothing");
    }

    /// cgroup v2: the kill is `cgroup.kill`; the kernel's `populated`
    /// decides, and a populated group's answer names its members.
    #[test]
    fn a_v2_group_still_populated_after_the_kill_is_not_proven_empty() {
        let dir = "/sys/fs/cgroup/user.slice/engine.scope/createos-local-4242/sandbox-a/cmd-m-1";
        let h = FakeHost::new().leak();
        h.file(&format!("{dir}/cgroup.procs"), "55\n")
            .file(&format!("{dir}/cgroup.kill"), "")
            .file(&format!("{dir}/cgroup.events"), "populated 1\nfrozen 0\n")
            .process(55, 1);
        let group = group_on(h, dir, Kind::V2);
        group.kill();
        h.position(&Change::Write(
            format!("{dir}/cgroup.kill").into(),
            "1".into(),
        ));
        let e = group.proof().expect_err("the kernel says populated");
        assert!(
            matches!(&e, GroupNotEmpty::Survivors { pids, .. } if pids == &[55]),
            "{e:?}"
        );
        // The kernel's word is the proof, not the member list: a group
        // whose own list is empty but whose descendants are populated is
        // not empty.
        h.file(&format!("{dir}/cgroup.procs"), "");
        assert!(!group.is_empty());
        h.file(&format!("{dir}/cgroup.events"), "populated 0\nfrozen 0\n");
        assert!(group.proof().is_ok());
    }
}
