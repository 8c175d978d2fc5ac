//! The tree proof and limits on a cgroup v2 group delegated to the
//! server (issue 37 item 3): the server's own group (the `0::` line of
//! `/proc/self/cgroup`) on the cgroup2 mount (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` on a hybrid host), where the server may make
//! groups and move its own processes (systemd's `Delegate=yes`, or root).
//!
//! # The layout
//! ```text
//! <delegated>/createos-local-<server pid>/   this server's subtree
//!     server/                                the server itself (a leaf)
//!     sandbox-<id>-<hash of its root>/       one sandbox: pids.max, memory.max, cpu.max
//!         machine/                           its machine (bwrap, init, holder)
//!         cmd-<marker>-<random>/             one command: its launcher and whole tree
//! ```
//! The server first moves itself into `server/` (cgroup v2 allows
//! processes only in leaves of a subtree whose controllers are enabled:
//! the "no internal processes" rule), then enables the `pids`, `memory`
//! and `cpu` controllers the delegated group offers for its subtree, so
//! each sandbox group gets its limits. A controller that cannot be
//! enabled (not offered, or the delegated group still holds processes of
//! others) is listed as not enforced, with why ([`Delegated::why_not`]), in the
//! startup line and `describe`.
//!
//! # A command
//! The launcher (`crate::machine::join`) writes itself into its
//! command's group (`cgroup.procs`) before it enters the machine, forks
//! or execs anything: the server's own code is the only thing that ever
//! runs outside the group, and a launcher that cannot move fails the
//! spawn (nothing ran). `clone3` with `CLONE_INTO_CGROUP` would spare
//! the move, but the launcher is forked by the standard library's spawn;
//! the move before anything of the command exists leaves no window
//! either. Everything the command starts (`setsid`, double forks, nested
//! namespaces) stays in the group: leaving needs write access to
//! `cgroup.procs` of a common ancestor, which the sandbox's processes do
//! not have (they run in the machine's user namespace, with no cgroup
//! mounted or bound). The end: `cgroup.kill` (the kernel kills every
//! member, racing forks included), proven by `populated 0` in
//! `cgroup.events`, which no process of the sandbox can fake. A pause is
//! `cgroup.freeze`.
//!
//! Only [`crate::trees::process_limits`] (the seam) uses this file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::trees::host::{self, Host};

/// The controllers a sandbox group is limited by, where offered.
pub(crate) const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// Where the server reads its own cgroup.
const OWN_CGROUP: &str = "/proc/self/cgroup";

/// Where a cgroup2 file system is looked for: a pure v2 host, then a
/// hybrid one.
const MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The files a kernel new enough for this backend has in every group:
/// `cgroup.kill` (5.14), `cgroup.freeze` (5.2) and `cgroup.events`.
const NEEDED: [&str; 3] = ["cgroup.kill", "cgroup.freeze", "cgroup.events"];

/// Why the server has no cgroup v2 group to hold command trees in (then
/// another backend is chosen: see [`crate::trees::process_limits`]).
#[derive(Debug, thiserror::Error)]
pub enum NoDelegatedGroup {
    /// The server's own cgroup could not be read.
    #[error("the server's own cgroup could not be read from {} ({source})", .path.display())]
    OwnGroupUnread {
        /// The file read (`/proc/self/cgroup`).
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server is in no cgroup v2 group (a cgroup v1 only host).
    #[error("{} names no cgroup v2 group for the server (no `0::` line)", .path.display())]
    NotInV2 {
        /// The file read (`/proc/self/cgroup`).
        path: PathBuf,
    },
    /// The server's cgroup v2 line is not a path inside the hierarchy.
    #[error(
        "{} names the server's cgroup v2 group as `{line}`, which is not an absolute path \
         inside the hierarchy; it is not used",
        .path.display()
    )]
    Malformed {
        /// The file read (`/proc/self/cgroup`).
        path: PathBuf,
        /// The line as read.
        line: String,
    },
    /// No cgroup2 file system where one is looked for.
    #[error("no cgroup2 file system is mounted at {}", .tried.join(" or "))]
    NoMount {
        /// The places looked at.
        tried: Vec<String>,
    },
    /// The server may not make groups in its own or move processes.
    #[error(
        "the server may not write its cgroup {} (make groups in it, move processes through its \
         cgroup.procs); run it in a group delegated to it (`systemd-run --user --scope -p \
         Delegate=yes ...`)",
        .group.display()
    )]
    NotWritable {
        /// The server's group.
        group: PathBuf,
    },
    /// The kernel is too old for this backend.
    #[error(
        "{} has no {file}: the kernel is older than this backend needs (cgroup.kill came with \
         Linux 5.14, cgroup.freeze with 5.2)",
        .group.display()
    )]
    KernelTooOld {
        /// The group looked at (the server's new subtree, removed again).
        group: PathBuf,
        /// The missing control file.
        file: &'static str,
    },
    /// The server's subtree could not be made, or the server not moved
    /// into it.
    #[error("the server's cgroup subtree {} could not be made ({source})", .path.display())]
    NotMade {
        /// The group or control file that failed.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a controller does not limit the sandbox groups of a delegated
/// group (listed as not enforced in the startup line and `describe`).
#[derive(Debug, thiserror::Error)]
pub enum ControllerNotEnabled {
    /// The delegated group does not offer it.
    #[error(
        "the delegated group {} offers no {controller} controller (its cgroup.controllers)",
        .group.display()
    )]
    NotOffered {
        /// The delegated group.
        group: PathBuf,
        /// The controller.
        controller: &'static str,
    },
    /// The group holds processes that are not the server's, and cgroup
    /// v2 enables no controller below a group that holds processes.
    #[error(
        "{} holds processes of others, so no controller can be enabled below it (cgroup v2's \
         no-internal-processes rule); start the engine alone in its group (`systemd-run --user \
         --scope -p Delegate=yes ...`)",
        .group.display()
    )]
    HoldsOthers {
        /// The group whose `cgroup.subtree_control` refused it.
        group: PathBuf,
        /// The controller.
        controller: &'static str,
    },
    /// The kernel refused it for another reason.
    #[error("enabling {controller} in {} failed: {source}", .group.display())]
    Refused {
        /// The group whose `cgroup.subtree_control` refused it.
        group: PathBuf,
        /// The controller.
        controller: &'static str,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// A server's subtree in its delegated group.
#[derive(Debug)]
pub struct Delegated {
    /// The host it lives on.
    host: &'static dyn Host,
    /// The delegated group (the server's own when it started).
    group: PathBuf,
    /// This server's subtree in it.
    engine: PathBuf,
    /// Each of [`CONTROLLERS`]: enabled for sandbox groups, or why not.
    controllers: Vec<(&'static str, Result<(), ControllerNotEnabled>)>,
}

/// The server's own group on the cgroup2 mount, when it may write it
/// (make groups in it, move processes through it). Reads only.
pub fn own_writable_group() -> Option<PathBuf> {
    writable_group_on(&host::REAL).ok()
}

/// [`own_writable_group`] on `host`, or why there is none.
pub(crate) fn writable_group_on(host: &dyn Host) -> Result<PathBuf, NoDelegatedGroup> {
    let path = PathBuf::from(OWN_CGROUP);
    let own = host
        .read(&path)
        .map_err(|source| NoDelegatedGroup::OwnGroupUnread {
            path: path.clone(),
            source,
        })?;
    let line = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| NoDelegatedGroup::NotInV2 { path: path.clone() })?;
    let relative = Path::new(line.trim());
    let inside = relative.is_absolute()
        && relative.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
    if !inside {
        return Err(NoDelegatedGroup::Malformed {
            path,
            line: line.to_string(),
        });
    }
    let mount = MOUNTS
        .into_iter()
        .map(Path::new)
        .find(|m| host.is_cgroup2_mount(m))
        .ok_or_else(|| NoDelegatedGroup::NoMount {
            tried: MOUNTS.iter().map(|m| m.to_string()).collect(),
        })?;
    let group = mount.join(relative.strip_prefix("/").unwrap_or(relative));
    let writable = host.may_write_dir(&group) && host.may_write_file(&group.join("cgroup.procs"));
    if !writable {
        return Err(NoDelegatedGroup::NotWritable { group });
    }
    Ok(group)
}

/// Whether the group at `group` offers `controller` (its
/// `cgroup.controllers`).
pub fn offers(group: &Path, controller: &str) -> bool {
    offers_on(&host::REAL, group, controller)
}

fn offers_on(host: &dyn Host, group: &Path, controller: &str) -> bool {
    host.read(&group.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == controller))
}

/// This server's subtree, made on first use (the server moved into its
/// `server/` leaf, controllers enabled), or why there is none: no
/// writable cgroup v2 group, or a kernel without `cgroup.kill` (5.14) or
/// `cgroup.freeze` (5.2).
pub(crate) fn here() -> Result<&'static Delegated, &'static NoDelegatedGroup> {
    MADE.get_or_init(|| Delegated::make(&host::REAL)).as_ref()
}

/// This server's subtree if [`here`] has made it already (never makes
/// it: for cleanups, which have nothing to do otherwise).
pub(crate) fn here_if_made() -> Option<&'static Delegated> {
    MADE.get().and_then(|made| made.as_ref().ok())
}

static MADE: OnceLock<Result<Delegated, NoDelegatedGroup>> = OnceLock::new();

impl Delegated {
    /// Makes the server's subtree on `host` (see the module docs).
    pub(crate) fn make(host: &'static dyn Host) -> Result<Delegated, NoDelegatedGroup> {
        let group = writable_group_on(host)?;
        remove_stale(host, &group);
        let own = host.own_pid();
        let engine = group.join(format!("createos-local-{own}"));
        if host.exists(&engine) {
            // A server of an earlier boot or pid namespace with our pid.
            remove_tree(host, &engine);
        }
        let not_made = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NoDelegatedGroup::NotMade { path, source }
        };
        host.create_dir(&engine).map_err(not_made(&engine))?;
        let made = (|| {
            for file in NEEDED {
                if !host.is_file(&engine.join(file)) {
                    return Err(NoDelegatedGroup::KernelTooOld {
                        group: engine.clone(),
                        file,
                    });
                }
            }
            let server = engine.join("server");
            host.create_dir(&server).map_err(not_made(&server))?;
            // The whole server (every thread) into its leaf.
            let procs = server.join("cgroup.procs");
            host.write(&procs, &own.to_string())
                .map_err(not_made(&procs))?;
            // And its helpers already forked in the delegated group (the
            // death guard): a process left there blocks every controller
            // (v2's no-internal-processes rule: enabling one is EBUSY).
            for pid in members_on(host, &group).unwrap_or_default() {
                if host.parent_of(pid).is_some_and(|p| p as u32 == own) {
                    host.write(&procs, &pid.to_string())
                        .map_err(not_made(&procs))?;
                }
            }
            Ok(())
        })();
        if let Err(e) = made {
            remove_tree(host, &engine);
            return Err(e);
        }
        let offered = host
            .read(&group.join("cgroup.controllers"))
            .unwrap_or_default();
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let controllers = CONTROLLERS
            .into_iter()
            .map(|controller| {
                let enabled = if !offered.contains(&controller) {
                    Err(ControllerNotEnabled::NotOffered {
                        group: group.clone(),
                        controller,
                    })
                } else {
                    enable(host, &group, controller)
                        .and_then(|()| enable(host, &engine, controller))
                };
                (controller, enabled)
            })
            .collect();
        Ok(Delegated {
            host,
            group,
            engine,
            controllers,
        })
    }

    /// The delegated group.
    pub fn group(&self) -> &Path {
        &self.group
    }

    /// The host it lives on.
    pub(crate) fn host(&self) -> &'static dyn Host {
        self.host
    }

    /// Whether `controller` limits each sandbox group.
    pub fn enforces(&self, controller: &str) -> bool {
        self.controllers
            .iter()
            .any(|(c, r)| *c == controller && r.is_ok())
    }

    /// Why `controller` does not limit sandbox groups (`None` when it does).
    pub fn why_not(&self, controller: &str) -> Option<&ControllerNotEnabled> {
        self.controllers
            .iter()
            .find(|(c, _)| *c == controller)
            .and_then(|(_, r)| r.as_ref().err())
    }

    /// The group of the sandbox whose root is `root`.
    pub(crate) fn sandbox_dir(&self, root: &Path) -> PathBuf {
        self.engine.join(format!("sandbox-{}", key(root)))
    }

    /// The sandbox's group (made, with its limits, on first use).
    pub(crate) fn sandbox(&self, root: &Path, limits: &Limits) -> std::io::Result<PathBuf> {
        let host = self.host;
        let dir = self.sandbox_dir(root);
        match host.create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(dir),
            Err(e) => return Err(e),
        }
        let write = |file: &str, value: String| host.write(&dir.join(file), &value);
        let set = (|| {
            if self.enforces("pids") {
                write("pids.max", limits.tasks.to_string())?;
            }
            if self.enforces("memory") {
                write("memory.max", limits.memory.to_string())?;
                // Swap counts toward the limit, as on cgroup v1: none.
                if host.is_file(&dir.join("memory.swap.max")) {
                    write("memory.swap.max", "0".to_string())?;
                }
                // An OOM kill ends the sandbox's process that grew, not
                // the whole group.
                let _ = write("memory.oom.group", "0".to_string());
            }
            if self.enforces("cpu") {
                write("cpu.max", format!("{} {PERIOD}", limits.cpus * PERIOD))?;
            }
            Ok(())
        })();
        if let Err(e) = set {
            let _ = host.remove_dir(&dir);
            return Err(e);
        }
        Ok(dir)
    }

    /// The `cgroup.procs` of the sandbox's machine leaf, opened for
    /// writing (the machine's bwrap writes itself into it before exec).
    pub(crate) fn machine_procs(
        &self,
        root: &Path,
        limits: &Limits,
    ) -> std::io::Result<std::fs::File> {
        let dir = self.sandbox(root, limits)?.join("machine");
        match self.host.create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.host.open_for_writing(&dir.join("cgroup.procs"))
    }

    /// A new group for one command of the sandbox, and its `cgroup.procs`
    /// opened for writing.
    pub(crate) fn command(
        &self,
        root: &Path,
        marker: &str,
        limits: &Limits,
    ) -> std::io::Result<(PathBuf, std::fs::File)> {
        let sandbox = self.sandbox(root, limits)?;
        let dir = self
            .host
            .create_unique_dir(&sandbox, &format!("cmd-{marker}"))?;
        match self.host.open_for_writing(&dir.join("cgroup.procs")) {
            Ok(procs) => Ok((dir, procs)),
            Err(e) => {
                let _ = self.host.remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// Stops (`cgroup.freeze` 1) or thaws the sandbox's machine and every
    /// command group in it; a stop waits up to 2 s for the kernel to report
    /// each `frozen 1`. The sandbox's own group is never frozen: a command
    /// started while the pause is under way makes its group below it and
    /// must not freeze its launcher in the middle of its spawn (the pause
    /// freezes each registered command's group, as it stops each command
    /// elsewhere). `false` when the sandbox has no group.
    pub(crate) fn freeze_sandbox(&self, root: &Path, stop: bool) -> bool {
        let Ok(groups) = self.host.subdirs(&self.sandbox_dir(root)) else {
            return false;
        };
        for g in &groups {
            let _ = self
                .host
                .write(&g.join("cgroup.freeze"), if stop { "1" } else { "0" });
        }
        if stop {
            for g in &groups {
                wait_frozen(self.host, g);
            }
        }
        true
    }

    /// The kernel's count of OOM kills in the sandbox's group
    /// (`memory.events`), where memory is limited.
    pub(crate) fn oom_kills(&self, root: &Path) -> Option<u64> {
        if !self.enforces("memory") {
            return None;
        }
        let events = self
            .host
            .read(&self.sandbox_dir(root).join("memory.events"))
            .ok()?;
        events
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }

    /// The tasks (threads) the sandbox's command groups hold, launchers
    /// not counted.
    pub(crate) fn command_tasks(&self, root: &Path) -> Option<usize> {
        let mut tasks = 0;
        for group in self.host.subdirs(&self.sandbox_dir(root)).ok()? {
            if !group
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cmd-"))
            {
                continue;
            }
            let threads = self
                .host
                .read(&group.join("cgroup.threads"))
                .map(|t| t.split_whitespace().count())
                .unwrap_or(0);
            tasks += threads.saturating_sub(1);
        }
        Some(tasks)
    }

    /// Removes the sandbox's groups once its processes are proven gone
    /// (retried for up to 2 s while the last members are reaped).
    pub(crate) fn remove_sandbox(&self, root: &Path) {
        let dir = self.sandbox_dir(root);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            remove_tree(self.host, &dir);
            if !self.host.exists(&dir) || std::time::Instant::now() > deadline {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// What one sandbox group is limited to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// `pids.max`.
    pub tasks: u64,
    /// `memory.max`, bytes.
    pub memory: u64,
    /// `cpu.max`, whole CPUs.
    pub cpus: u64,
}

/// `cpu.max`'s period, microseconds.
const PERIOD: u64 = 100_000;

/// The file-name-safe key of a sandbox root: its directory name (the
/// sandbox's id) and a hash of its whole path, so that sandboxes of two
/// servers of one process (tests), or two data directories, that share a
/// name never share a group.
fn key(root: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let name: String = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // FNV-1a, 32 bits: a name, not a secret.
    let hash = root
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        });
    format!("{name}-{hash:08x}")
}

/// Enables `controller` for the groups below `dir` (its
/// `cgroup.subtree_control`), or says why the kernel refused.
fn enable(
    host: &dyn Host,
    dir: &Path,
    controller: &'static str,
) -> Result<(), ControllerNotEnabled> {
    host.write(
        &dir.join("cgroup.subtree_control"),
        &format!("+{controller}"),
    )
    .map_err(|source| {
        let group = dir.to_path_buf();
        if source.raw_os_error() == Some(libc::EBUSY) {
            ControllerNotEnabled::HoldsOthers { group, controller }
        } else {
            ControllerNotEnabled::Refused {
                group,
                controller,
                source,
            }
        }
    })
}

/// The pids the kernel lists in the group at `dir`. `Err` when it cannot
/// be read: `NotFound` once the group is removed.
pub(crate) fn members_on(host: &dyn Host, dir: &Path) -> std::io::Result<Vec<i32>> {
    let list = host.read(&dir.join("cgroup.procs"))?;
    Ok(list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect())
}

/// Whether the group at `dir` is empty, as the kernel says it
/// (`populated 0` in `cgroup.events`, which counts its descendants too),
/// or gone. A file that cannot be read proves nothing.
pub(crate) fn is_empty_on(host: &dyn Host, dir: &Path) -> bool {
    match host.read(&dir.join("cgroup.events")) {
        Ok(events) => events.lines().any(|l| l == "populated 0"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound && !host.exists(dir),
    }
}

/// Kills every process of the group at `dir` and its descendants
/// (`cgroup.kill`: forks racing the kill included).
pub(crate) fn kill_on(host: &dyn Host, dir: &Path) -> bool {
    host.write(&dir.join("cgroup.kill"), "1").is_ok()
}

/// Freezes (`cgroup.freeze` 1) or thaws the group at `dir`; on a freeze,
/// waits up to 2 s for `frozen 1`. `false` when it cannot be written.
pub(crate) fn freeze_on(host: &dyn Host, dir: &Path, stop: bool) -> bool {
    if host
        .write(&dir.join("cgroup.freeze"), if stop { "1" } else { "0" })
        .is_err()
    {
        return false;
    }
    if stop {
        wait_frozen(host, dir);
    }
    true
}

/// Waits up to 2 s for `frozen 1` in the `cgroup.events` of the group at
/// `dir` (the kernel freezes its members asynchronously).
fn wait_frozen(host: &dyn Host, dir: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match host.read(&dir.join("cgroup.events")) {
            Ok(events) if !events.lines().any(|l| l == "frozen 1") => {}
            _ => return,
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Removes the group at `dir` and every group below it (deepest first);
/// a group that still has members stays.
fn remove_tree(host: &dyn Host, dir: &Path) {
    for below in host.subdirs(dir).unwrap_or_default() {
        remove_tree(host, &below);
    }
    let _ = host.remove_dir(dir);
}

/// Subtrees of servers that are gone (`createos-local-<pid>` with no
/// process of that pid, and `populated 0` in its `cgroup.events`):
/// removed. A live pid's subtree is never touched (a server that made it
/// a moment ago has not moved in yet).
fn remove_stale(host: &dyn Host, group: &Path) {
    for path in host.subdirs(group).unwrap_or_default() {
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("createos-local-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if !host.exists(Path::new(&format!("/proc/{pid}"))) && is_empty_on(host, &path) {
            remove_tree(host, &path);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::trees::host::{Change, FakeHost};

    /// The server's delegated group on the double.
    pub(crate) const GROUP: &str = "/sys/fs/cgroup/user.slice/engine.scope";
    /// This server's subtree in it (the double's pid is 4242).
    const ENGINE: &str = "/sys/fs/cgroup/user.slice/engine.scope/createos-local-4242";

    /// The control files a kernel puts in every new cgroup v2 group.
    pub(crate) const KERNEL_FILES: [(&str, &str); 12] = [
        ("cgroup.procs", ""),
        ("cgroup.threads", ""),
        ("cgroup.kill", ""),
        ("cgroup.freeze", "0"),
        ("cgroup.events", "populated 0\nfrozen 0\n"),
        ("cgroup.controllers", ""),
        ("cgroup.subtree_control", ""),
        ("pids.max", "max"),
        ("memory.max", "max"),
        ("memory.swap.max", "max"),
        ("memory.oom.group", "0"),
        ("cpu.max", "max 100000"),
    ];

    /// A host where the server (pid 4242, not root) runs in [`GROUP`] on
    /// a pure cgroup v2 host, the group delegated to it (writable) and
    /// offering `offered`; in it too: its death guard (4300, its child)
    /// and a process of someone else (4400).
    pub(crate) fn delegated_host(offered: &str) -> &'static FakeHost {
        let h = FakeHost::new().leak();
        h.file("/proc/self/cgroup", "0::/user.slice/engine.scope\n")
            .cgroup2_mount("/sys/fs/cgroup")
            .file(&format!("{GROUP}/cgroup.procs"), "4242\n4300\n4400\n")
            .file(&format!("{GROUP}/cgroup.controllers"), offered)
            .file(&format!("{GROUP}/cgroup.subtree_control"), "")
            .writable(GROUP)
            .writable(&format!("{GROUP}/cgroup.procs"))
            .process(4242, 1)
            .process(4300, 4242)
            .process(4400, 1)
            .new_group_files(&KERNEL_FILES);
        h
    }

    fn write(path: &str, value: &str) -> Change {
        Change::Write(PathBuf::from(path), value.to_string())
    }

    fn limits() -> Limits {
        Limits {
            tasks: 2048,
            memory: 256 << 20,
            cpus: 1,
        }
    }

    /// cgroup v2 allows processes only in leaves of a subtree with
    /// controllers: the server (and its death guard, never another's
    /// process) must be in its `server/` leaf before a controller is
    /// enabled, each controller enabled in the delegated group and then
    /// in the server's subtree, all before the first sandbox group is
    /// made; then that group gets its limits.
    #[test]
    fn the_server_moves_into_its_leaf_and_enables_its_controllers_before_any_sandbox_group() {
        let h = delegated_host("cpu memory pids io\n");
        let d = Delegated::make(h).expect("a delegated group");
        assert_eq!(d.group(), Path::new(GROUP));
        let procs = format!("{ENGINE}/server/cgroup.procs");
        let moved = h.position(&write(&procs, "4242"));
        h.position(&write(&procs, "4300"));
        assert!(
            !h.changes().contains(&write(&procs, "4400")),
            "another's process was moved into the server's leaf: {:#?}",
            h.changes()
        );
        let root = Path::new("/data/sandboxes/sb-1");
        let sandbox = d.sandbox(root, &limits()).expect("the sandbox group");
        let made = h.position(&Change::CreateDir(sandbox.clone()));
        for c in ["pids", "memory", "cpu"] {
            assert!(d.enforces(c), "{c}: {:?}", d.why_not(c));
            let in_group = h.position(&write(
                &format!("{GROUP}/cgroup.subtree_control"),
                &format!("+{c}"),
            ));
            let in_engine = h.position(&write(
                &format!("{ENGINE}/cgroup.subtree_control"),
                &format!("+{c}"),
            ));
            assert!(moved < in_group, "{c} enabled before the server moved");
            assert!(in_group < in_engine, "{c} enabled below before above");
            assert!(
                in_engine < made,
                "the sandbox group was made before {c} was enabled"
            );
        }
        assert!(!d.enforces("io"), "io is not one of ours");
        let text = |f: &str| h.text(&sandbox.join(f).to_string_lossy());
        assert_eq!(text("pids.max").as_deref(), Some("2048"));
        assert_eq!(text("memory.max").as_deref(), Some("268435456"));
        assert_eq!(text("memory.swap.max").as_deref(), Some("0"));
        assert_eq!(text("cpu.max").as_deref(), Some("100000 100000"));
        // A command's group is made below the sandbox's, and its launcher
        // joins through its cgroup.procs.
        let (cmd, _procs) = d.command(root, "m1", &limits()).expect("a command group");
        assert_eq!(cmd.parent(), Some(sandbox.as_path()));
        h.position(&Change::Open(cmd.join("cgroup.procs")));
    }

    /// A controller the delegated group does not offer is not enforced,
    /// says why (naming the group), and its limit is never written.
    #[test]
    fn a_controller_not_offered_says_why_and_is_never_written() {
        let h = delegated_host("pids\n");
        let d = Delegated::make(h).expect("a delegated group");
        assert!(d.enforces("pids"));
        let why = d.why_not("memory").expect("memory is not offered");
        assert!(
            matches!(why, ControllerNotEnabled::NotOffered { group, controller: "memory" } if group == Path::new(GROUP)),
            "{why:?}"
        );
        let said = why.to_string();
        assert!(said.contains(GROUP) && said.contains("memory"), "{said}");
        let sandbox = d
            .sandbox(Path::new("/data/sb-2"), &limits())
            .expect("the sandbox group");
        let written: Vec<Change> = h
            .changes()
            .into_iter()
            .filter(|c| matches!(c, Change::Write(p, _) if p.starts_with(&sandbox)))
            .collect();
        assert_eq!(
            written,
            vec![write(&sandbox.join("pids.max").to_string_lossy(), "2048")]
        );
    }

    /// The kernel's refusals become typed answers in words: `EBUSY` (a
    /// group that holds processes of others) says so with the command
    /// that fixes it; another errno is passed on. No Rust names.
    #[test]
    fn a_refused_controller_is_a_typed_answer_in_words() {
        let h = delegated_host("pids memory cpu\n");
        h.refuse_writes(&format!("{GROUP}/cgroup.subtree_control"), libc::EBUSY);
        let d = Delegated::make(h).expect("a delegated group");
        let why = d.why_not("pids").expect("pids refused");
        assert!(
            matches!(why, ControllerNotEnabled::HoldsOthers { group, controller: "pids" } if group == Path::new(GROUP)),
            "{why:?}"
        );
        let said = why.to_string();
        assert!(said.contains(GROUP), "{said}");
        assert!(said.contains("Delegate=yes"), "{said}");

        let h = delegated_host("pids memory cpu\n");
        h.refuse_writes(&format!("{ENGINE}/cgroup.subtree_control"), libc::EACCES);
        let d = Delegated::make(h).expect("a delegated group");
        let why = d.why_not("memory").expect("memory refused");
        assert!(
            matches!(why, ControllerNotEnabled::Refused { group, controller: "memory", source } if group == Path::new(ENGINE) && source.raw_os_error() == Some(libc::EACCES)),
            "{why:?}"
        );
        let said = why.to_string();
        assert!(said.contains(ENGINE) && said.contains("memory"), "{said}");
        for debug_name in ["Refused", "Os {", "kind:", "Some("] {
            assert!(!said.contains(debug_name), "{said}");
        }
    }

    /// What `/proc/self/cgroup` says is input: a missing file, no cgroup
    /// v2 line, or a path that is not inside the hierarchy (`..` would
    /// climb out of the mount) is a typed answer, never a panic or a
    /// group outside the mount; nothing is made.
    #[test]
    fn a_malformed_own_cgroup_is_a_typed_error_and_nothing_is_made() {
        type Expected = fn(&NoDelegatedGroup) -> bool;
        let cases: [(&str, Expected); 6] = [
            ("", |e| matches!(e, NoDelegatedGroup::NotInV2 { .. })),
            ("12:pids:/user.slice\n", |e| {
                matches!(e, NoDelegatedGroup::NotInV2 { .. })
            }),
            (
                "0::user.slice\n",
                |e| matches!(e, NoDelegatedGroup::Malformed { line, .. } if line == "user.slice"),
            ),
            ("0::/../../etc\n", |e| {
                matches!(e, NoDelegatedGroup::Malformed { .. })
            }),
            ("0::/user.slice/../..\n", |e| {
                matches!(e, NoDelegatedGroup::Malformed { .. })
            }),
            ("0::\n", |e| matches!(e, NoDelegatedGroup::Malformed { .. })),
        ];
        for (own, expected) in cases {
            let h = delegated_host("pids\n");
            h.file("/proc/self/cgroup", own);
            let e = Delegated::make(h).expect_err(own);
            assert!(expected(&e), "{own:?}: {e:?}");
            assert!(e.to_string().contains("/proc/self/cgroup"), "{e}");
            assert!(
                !h.changes()
                    .iter()
                    .any(|c| matches!(c, Change::CreateDir(_))),
                "{own:?} made a group: {:#?}",
                h.changes()
            );
        }

        let h = FakeHost::new().leak();
        let e = writable_group_on(h).expect_err("no /proc/self/cgroup");
        assert!(
            matches!(e, NoDelegatedGroup::OwnGroupUnread { .. }),
            "{e:?}"
        );
    }

    /// A group that is fine but not this server's to write, or a host
    /// without a cgroup2 mount, says which.
    #[test]
    fn no_mount_and_no_write_access_say_which() {
        let h = FakeHost::new().leak();
        h.file("/proc/self/cgroup", "0::/user.slice/engine.scope\n")
            .file(&format!("{GROUP}/cgroup.procs"), "4242\n");
        let e = writable_group_on(h).expect_err("no cgroup2 mount");
        assert!(matches!(e, NoDelegatedGroup::NoMount { .. }), "{e:?}");
        assert!(e.to_string().contains("/sys/fs/cgroup/unified"), "{e}");
        h.cgroup2_mount("/sys/fs/cgroup");
        let e = writable_group_on(h).expect_err("not writable");
        assert!(
            matches!(&e, NoDelegatedGroup::NotWritable { group } if group == Path::new(GROUP)),
            "{e:?}"
        );
        // The directory alone is not enough: moving processes needs its
        // cgroup.procs.
        h.writable(GROUP);
        assert!(writable_group_on(h).is_err());
        h.writable(&format!("{GROUP}/cgroup.procs"));
        assert_eq!(writable_group_on(h).expect("writable"), Path::new(GROUP));
    }

    /// A kernel without `cgroup.kill` (older than 5.14) cannot prove a
    /// tree gone this way: the backend is refused, saying which file is
    /// missing, and the subtree it began is removed.
    #[test]
    fn a_kernel_without_cgroup_kill_is_refused_and_its_subtree_removed() {
        let h = delegated_host("pids\n");
        let old: Vec<(&str, &str)> = KERNEL_FILES
            .iter()
            .copied()
            .filter(|(f, _)| *f != "cgroup.kill")
            .collect();
        h.new_group_files(&old);
        let e = Delegated::make(h).expect_err("no cgroup.kill");
        assert!(
            matches!(&e, NoDelegatedGroup::KernelTooOld { file: "cgroup.kill", group } if group == Path::new(ENGINE)),
            "{e:?}"
        );
        assert!(
            h.position(&Change::CreateDir(ENGINE.into()))
                < h.position(&Change::RemoveDir(ENGINE.into()))
        );
        assert!(!h.has_dir(ENGINE), "the subtree was left");
    }

    /// The subtree of a server that is gone (no such pid, the kernel says
    /// it is empty) is removed at start; a live server's, or one still
    /// populated, is kept.
    #[test]
    fn only_a_dead_servers_empty_subtree_is_removed() {
        let h = delegated_host("pids\n");
        let dead = format!("{GROUP}/createos-local-777");
        let busy = format!("{GROUP}/createos-local-778");
        let live = format!("{GROUP}/createos-local-888");
        h.file(&format!("{dead}/cgroup.events"), "populated 0\n")
            .file(&format!("{dead}/sandbox-x/cgroup.events"), "populated 0\n")
            .file(&format!("{busy}/cgroup.events"), "populated 1\n")
            .file(&format!("{live}/cgroup.events"), "populated 0\n")
            .dir("/proc/888");
        Delegated::make(h).expect("a delegated group");
        assert!(!h.has_dir(&dead), "a dead server's subtree stayed");
        assert!(h.has_dir(&busy), "a populated subtree was removed");
        assert!(h.has_dir(&live), "a live server's subtree was removed");
    }

    #[test]
    fn a_sandboxs_key_is_its_name_and_its_whole_path() {
        let a = super::key(std::path::Path::new("/data/one/sb-1"));
        let b = super::key(std::path::Path::new("/data/two/sb-1"));
        assert!(a.starts_with("sb-1-") && b.starts_with("sb-1-"), "{a} {b}");
        assert_ne!(a, b, "two roots of one name share a group");
        let odd = super::key(std::path::Path::new("/data/a b/../x.y"));
        assert!(odd.starts_with("x_y-"), "{odd}");
        assert!(!odd.contains(['/', '.', ' ']), "{odd}");
    }
}
