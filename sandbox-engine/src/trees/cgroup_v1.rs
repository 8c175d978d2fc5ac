//! The cgroup v1 tree backend (a root server with the v1 `pids`
//! hierarchy, this CI kind of host): a `pids` group per sandbox
//! (`createos-local/sandbox-<uid>`, capped at its task limit) with a group
//! per command inside it (`cmd-<marker>-<random>`), whose member list is
//! the command's tree, and a `memory` group per sandbox under the server's
//! own. The sandbox uid cannot write root's `tasks` and `cgroup.procs`, so
//! no process can leave. Only [`crate::trees::process_limits`] (the seam)
//! uses this file; the limits it applies are the seam's, passed in.

use std::path::{Path, PathBuf};

use crate::trees::host::{self, Host};

/// The cgroup v1 `pids` hierarchy.
const PIDS: &str = "/sys/fs/cgroup/pids";
/// The cgroup v1 `memory` hierarchy.
const MEMORY: &str = "/sys/fs/cgroup/memory";
/// Where the server reads its own cgroups.
const OWN_CGROUP: &str = "/proc/self/cgroup";

/// Why a root server has no cgroup v1 pids groups here (then another
/// backend is chosen: see [`crate::trees::process_limits`]).
#[derive(Debug, thiserror::Error)]
pub enum NoPidsGroup {
    /// Only the host's root may make cgroup v1 groups for sandboxes.
    #[error("the server is not the host's root, and cgroup v1 groups are root's to make")]
    NotRoot,
    /// No v1 `pids` hierarchy is mounted.
    #[error("the host has no cgroup v1 pids hierarchy (no {})", .looked.display())]
    NoHierarchy {
        /// The file looked for.
        looked: PathBuf,
    },
    /// The engine's group could not be made or capped.
    #[error("the cgroup v1 pids group {} could not be made ({source})", .path.display())]
    NotMade {
        /// The group or control file that failed.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Where the kernel's memory controller bounds sandboxes, when the host
/// lets the server use it: `createos-local/` under the server's own group
/// of a cgroup v1 `memory` hierarchy it (root) can write, so that whatever
/// bounds the server bounds its sandboxes too. Under it,
/// `sandbox-<uid>/` holds one sandbox at the sandbox memory limit. `None`
/// elsewhere (not root, cgroup v2 only, no memory controller): then
/// nothing bounds a sandbox's memory, and the startup line says so.
pub fn memory_cgroup_base() -> Option<&'static Path> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| memory_base_on(&host::REAL)).as_deref()
}

/// [`memory_cgroup_base`] on `host` (made there).
pub(crate) fn memory_base_on(host: &dyn Host) -> Option<PathBuf> {
    if !host.is_host_root() {
        return None;
    }
    let v1 = Path::new(MEMORY);
    if !host.is_file(&v1.join("cgroup.procs")) {
        return None;
    }
    let own = host.read(Path::new(OWN_CGROUP)).ok()?;
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
    // A path that climbs out of the hierarchy is no group of the server's.
    if Path::new(&path)
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    let base = v1.join(path).join("createos-local");
    host.create_dir_all(&base).ok().map(|()| base)
}

/// The `tasks` file of the memory group of the sandbox owned by `uid`
/// (created with its limit on first use), opened for writing: a launcher
/// writes `0` to it between fork and exec, so everything it starts is
/// charged to the sandbox. `None` without a memory hierarchy (see
/// [`memory_cgroup_base`]).
pub(crate) fn memory_cgroup_tasks(uid: u32, memory: u64) -> Option<std::fs::File> {
    memory_tasks_on(&host::REAL, memory_cgroup_base()?, uid, memory)
}

/// [`memory_cgroup_tasks`] on `host`, under the memory base `base`.
pub(crate) fn memory_tasks_on(
    host: &dyn Host,
    base: &Path,
    uid: u32,
    memory: u64,
) -> Option<std::fs::File> {
    let dir = base.join(format!("sandbox-{uid}"));
    match host.create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    // Written at every join: a group left by an earlier server with the
    // same range may hold another limit. Swap counts toward the same
    // limit where the host accounts it (memory + swap), so a sandbox
    // cannot spill into swap; memsw may never be below the memory limit,
    // so the order of the two writes follows the direction of the change.
    let limit = memory.to_string();
    let memory = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if host.write(&memory, &limit).is_ok() {
        let _ = host.write(&memsw, &limit);
    } else {
        let _ = host.write(&memsw, &limit);
        host.write(&memory, &limit).ok()?;
    }
    host.open_for_writing(&dir.join(JOIN_FILE)).ok()
}

/// Removes the pids and memory groups of the sandbox owned by `uid` (and
/// any command group left in it), once every process of the sandbox is
/// proven gone: a group per sandbox ever made would otherwise stay on the
/// host (thousands after a day of short sandboxes, each a kernel object
/// the memory controller keeps statistics for). A group that still has a
/// member cannot be removed (the kernel refuses) and stays.
pub(crate) fn remove_sandbox_groups(uid: u32) {
    let host = &host::REAL;
    let name = format!("sandbox-{uid}");
    if let Some(base) = pids_cgroup_base() {
        let dir = base.join(&name);
        for command in host.subdirs(&dir).unwrap_or_default() {
            let _ = host.remove_dir(&command);
        }
        let _ = host.remove_dir(&dir);
    }
    if let Some(base) = memory_cgroup_base() {
        let _ = host.remove_dir(&base.join(&name));
    }
}

/// Where the kernel's pids controller bounds sandboxes, when the host lets
/// the server use it: a cgroup v1 `pids` hierarchy the server (root) can
/// write, `/sys/fs/cgroup/pids`. Under it, `createos-local/` caps the
/// tasks of every sandbox of every server on the host together at
/// [`total_tasks`], and `createos-local/sandbox-<uid>/` caps one sandbox at
/// its task limit (nested namespaces and threads included). `None`
/// elsewhere (not root, cgroup v2 only, no pids controller): then only
/// `RLIMIT_NPROC` per sandbox uid applies. A sandbox's group is removed
/// once its processes are proven gone (its delete; the start-up probe's
/// end for the probe's).
pub fn pids_cgroup_base() -> Option<&'static Path> {
    pids_base_here().ok()
}

/// [`pids_cgroup_base`], or why there is none (made once).
pub(crate) fn pids_base_here() -> Result<&'static Path, &'static NoPidsGroup> {
    static BASE: std::sync::OnceLock<Result<PathBuf, NoPidsGroup>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| pids_base_on(&host::REAL))
        .as_ref()
        .map(PathBuf::as_path)
}

/// [`pids_cgroup_base`] on `host` (made there), or why there is none.
pub(crate) fn pids_base_on(host: &dyn Host) -> Result<PathBuf, NoPidsGroup> {
    if !host.is_host_root() {
        return Err(NoPidsGroup::NotRoot);
    }
    let v1 = Path::new(PIDS);
    let looked = v1.join("cgroup.procs");
    if !host.is_file(&looked) {
        return Err(NoPidsGroup::NoHierarchy { looked });
    }
    let base = v1.join("createos-local");
    match host.create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(NoPidsGroup::NotMade { path: base, source }),
    }
    let max = base.join("pids.max");
    host.write(&max, &total_tasks_on(host).to_string())
        .map_err(|source| NoPidsGroup::NotMade { path: max, source })?;
    Ok(base)
}

/// The most tasks all sandboxes on this host may hold together where the
/// pids controller is used: half the host's `kernel.pid_max`, so that
/// fork bombs in any number of sandboxes leave the host the other half.
pub fn total_tasks() -> u64 {
    total_tasks_on(&host::REAL)
}

fn total_tasks_on(host: &dyn Host) -> u64 {
    host.read(Path::new("/proc/sys/kernel/pid_max"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(16384, |max| (max / 2).max(2048))
}

/// The [`JOIN_FILE`] of the sandbox uid's pids group (created with its
/// `pids.max` on first use), opened for writing: the launcher writes `0`
/// to it between fork and exec, so bwrap and everything it starts are
/// counted. `None` without a pids hierarchy (see [`pids_cgroup_base`]).
pub(crate) fn pids_cgroup_procs(uid: u32, tasks: u64) -> Option<std::fs::File> {
    pids_procs_on(&host::REAL, pids_cgroup_base()?, uid, tasks)
}

/// [`pids_cgroup_procs`] on `host`, under the pids base `base`.
pub(crate) fn pids_procs_on(
    host: &dyn Host,
    base: &Path,
    uid: u32,
    tasks: u64,
) -> Option<std::fs::File> {
    let dir = base.join(format!("sandbox-{uid}"));
    match host.create_dir(&dir) {
        Ok(()) => host.write(&dir.join("pids.max"), &tasks.to_string()).ok()?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    host.open_for_writing(&dir.join(JOIN_FILE)).ok()
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
pub(crate) fn command_cgroup(
    uid: u32,
    marker: &str,
    tasks: u64,
) -> std::io::Result<(PathBuf, std::fs::File)> {
    let base =
        pids_cgroup_base().ok_or_else(|| std::io::Error::other("no pids group for the sandbox"))?;
    command_cgroup_on(&host::REAL, base, uid, marker, tasks)
}

/// [`command_cgroup`] on `host`, under the pids base `base`.
pub(crate) fn command_cgroup_on(
    host: &dyn Host,
    base: &Path,
    uid: u32,
    marker: &str,
    tasks: u64,
) -> std::io::Result<(PathBuf, std::fs::File)> {
    let sandbox = pids_procs_on(host, base, uid, tasks)
        .map(|_| base.join(format!("sandbox-{uid}")))
        .ok_or_else(|| std::io::Error::other("no pids group for the sandbox"))?;
    // Unique even when a marker repeats (the start-up probe's) or a group
    // of an earlier server with the same sandbox uid was left behind.
    let dir = host.create_unique_dir(&sandbox, &format!("cmd-{marker}"))?;
    let procs = host.open_for_writing(&dir.join(JOIN_FILE))?;
    Ok((dir, procs))
}

/// The pids the kernel lists in the command group at `dir`
/// (`cgroup.procs`). `Err` when the list cannot be read: `NotFound` once
/// the group is removed (no directory, no member), anything else proves
/// nothing.
pub(crate) fn command_group_pids_on(host: &dyn Host, dir: &Path) -> std::io::Result<Vec<i32>> {
    let list = host.read(&dir.join("cgroup.procs"))?;
    Ok(list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect())
}

/// No more forks in the command group at `dir` (a tree being killed):
/// its `pids.max` becomes 0.
pub(crate) fn stop_forks_on(host: &dyn Host, dir: &Path) {
    let _ = host.write(&dir.join("pids.max"), "0");
}

/// Each command group's `pids.current`, its launcher not
/// counted; `None` without a pids hierarchy.
pub(crate) fn command_tasks(uid: u32) -> Option<usize> {
    let host = &host::REAL;
    let dir = pids_cgroup_base()?.join(format!("sandbox-{uid}"));
    let mut tasks = 0;
    for group in host.subdirs(&dir).ok()? {
        if !group
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("cmd-"))
        {
            continue;
        }
        let current: usize = host
            .read(&group.join("pids.current"))
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
    pids_offered_on(&host::REAL)
}

pub(crate) fn pids_offered_on(host: &dyn Host) -> bool {
    host.is_host_root() && host.is_file(&Path::new(PIDS).join("cgroup.procs"))
}

/// How many times the kernel's OOM killer has killed a process of the
/// sandbox owned by `uid` (its memory group's `oom_kill` count); `None`
/// without a memory group.
pub(crate) fn oom_kills(uid: u32) -> Option<u64> {
    let dir = memory_cgroup_base()?.join(format!("sandbox-{uid}"));
    let control = host::REAL.read(&dir.join("memory.oom_control")).ok()?;
    control
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Whether a server started here would get a cgroup v1 memory group per
/// sandbox, without touching the host: root and a v1 memory hierarchy.
pub(crate) fn memory_offered_here() -> bool {
    host::REAL.is_host_root() && host::REAL.is_file(&Path::new(MEMORY).join("cgroup.procs"))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::trees::host::{Change, FakeHost};

    const BASE: &str = "/sys/fs/cgroup/pids/createos-local";

    /// A root server's host with the v1 pids hierarchy and the engine's
    /// base group made.
    fn pids_host() -> &'static FakeHost {
        let h = FakeHost::new().leak();
        h.root(true)
            .file(&format!("{BASE}/pids.max"), "max")
            .new_group_files(&[("tasks", ""), ("cgroup.procs", ""), ("pids.max", "max")]);
        h
    }

    /// A command's group is made in its sandbox's, which is capped at the
    /// sandbox's task limit before anything can join it; the launcher
    /// joins through `tasks` (see [`JOIN_FILE`]).
    #[test]
    fn a_sandbox_is_capped_before_its_first_command_joins() {
        let h = pids_host();
        let uid = 0x4000_0000;
        let (cmd, _tasks) =
            command_cgroup_on(h, Path::new(BASE), uid, "m1", 2048).expect("a command group");
        let sandbox = PathBuf::from(format!("{BASE}/sandbox-{uid}"));
        assert_eq!(cmd.parent(), Some(sandbox.as_path()));
        let capped = h.position(&Change::Write(sandbox.join("pids.max"), "2048".into()));
        let joined = h.position(&Change::Open(cmd.join("tasks")));
        assert!(capped < joined, "{:#?}", h.changes());
        assert_eq!(
            h.text(&sandbox.join("pids.max").to_string_lossy())
                .as_deref(),
            Some("2048")
        );
    }

    /// The memory base is the server's own memory group: what
    /// `/proc/self/cgroup` says is input, and a line that is not a path
    /// inside the hierarchy, or none, gives no base (never a group
    /// elsewhere, never a panic).
    #[test]
    fn the_memory_base_follows_the_servers_own_group_and_refuses_a_malformed_one() {
        let on = |own: &str, root: bool| {
            let h = FakeHost::new().leak();
            h.root(root)
                .file("/sys/fs/cgroup/memory/cgroup.procs", "")
                .file("/proc/self/cgroup", own);
            (memory_base_on(h), h)
        };
        let (base, _) = on("12:pids:/x\n5:memory:/system.slice/engine.service\n", true);
        assert_eq!(
            base.as_deref(),
            Some(Path::new(
                "/sys/fs/cgroup/memory/system.slice/engine.service/createos-local"
            ))
        );
        let (base, _) = on("5:cpu,memory:/\n", true);
        assert_eq!(
            base.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory/createos-local"))
        );
        for own in [
            "",
            "garbage",
            "5:memory",
            "5:memory:/../../../etc\n",
            "0::/x\n",
        ] {
            let (base, h) = on(own, true);
            assert_eq!(base, None, "{own:?}");
            assert!(h.changes().is_empty(), "{own:?}: {:#?}", h.changes());
        }
        let (base, _) = on("5:memory:/system.slice\n", false);
        assert_eq!(
            base, None,
            "a server that is not root got a v1 memory group"
        );
    }

    /// Why a host gives no pids groups, in words and typed.
    #[test]
    fn no_pids_group_says_why() {
        let h = FakeHost::new().leak();
        assert!(matches!(pids_base_on(h), Err(NoPidsGroup::NotRoot)));
        assert!(!pids_offered_on(h));
        h.root(true);
        let e = pids_base_on(h).expect_err("no hierarchy");
        assert!(matches!(e, NoPidsGroup::NoHierarchy { .. }), "{e:?}");
        assert!(
            e.to_string().contains("/sys/fs/cgroup/pids/cgroup.procs"),
            "{e}"
        );
        h.file("/sys/fs/cgroup/pids/cgroup.procs", "");
        assert!(pids_offered_on(h));
        // The kernel refuses the cap (no `pids.max` in the new group).
        let e = pids_base_on(h).expect_err("no pids.max");
        assert!(
            matches!(&e, NoPidsGroup::NotMade { path, .. } if path.ends_with("pids.max")),
            "{e:?}"
        );
    }
}
