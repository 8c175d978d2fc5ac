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

/// `statfs` magic of a cgroup2 file system.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

/// The controllers a sandbox group is limited by, where offered.
pub(crate) const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// A server's subtree in its delegated group.
#[derive(Debug)]
pub struct Delegated {
    /// The delegated group (the server's own when it started).
    group: PathBuf,
    /// This server's subtree in it.
    engine: PathBuf,
    /// Each of [`CONTROLLERS`]: enabled for sandbox groups, or why not.
    controllers: Vec<(&'static str, Result<(), String>)>,
}

fn is_cgroup2(dir: &Path) -> bool {
    // `f_type` is `i64` here, another integer type on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as i64 == CGROUP2_MAGIC)
}

/// The server's own group on the cgroup2 mount, when it may write it
/// (make groups in it, move processes through it). Reads only.
pub fn own_writable_group() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(Path::new)
        .find(|m| is_cgroup2(m))?;
    let group = mount.join(path.trim().trim_start_matches('/'));
    use rustix::fs::{access, Access};
    let writable = access(&group, Access::WRITE_OK | Access::EXEC_OK).is_ok()
        && access(group.join("cgroup.procs"), Access::WRITE_OK).is_ok();
    writable.then_some(group)
}

/// Whether the group at `group` offers `controller` (its
/// `cgroup.controllers`).
pub fn offers(group: &Path, controller: &str) -> bool {
    std::fs::read_to_string(group.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == controller))
}

/// This server's subtree, made on first use (the server moved into its
/// `server/` leaf, controllers enabled); `None` where the server has no
/// writable cgroup v2 group, or the kernel lacks `cgroup.kill` (5.14) or
/// `cgroup.freeze` (5.2).
pub fn here() -> Option<&'static Delegated> {
    MADE.get_or_init(|| Delegated::make().ok()).as_ref()
}

/// This server's subtree if [`here`] has made it already (never makes
/// it: for cleanups, which have nothing to do otherwise).
pub(crate) fn here_if_made() -> Option<&'static Delegated> {
    MADE.get().and_then(Option::as_ref)
}

static MADE: OnceLock<Option<Delegated>> = OnceLock::new();

impl Delegated {
    fn make() -> std::io::Result<Delegated> {
        let group = own_writable_group().ok_or_else(|| std::io::Error::other("none"))?;
        remove_stale(&group);
        let engine = group.join(format!("createos-local-{}", std::process::id()));
        if engine.exists() {
            // A server of an earlier boot or pid namespace with our pid.
            remove_tree(&engine);
        }
        std::fs::create_dir(&engine)?;
        let made = (|| {
            for file in ["cgroup.kill", "cgroup.freeze", "cgroup.events"] {
                if !engine.join(file).is_file() {
                    return Err(std::io::Error::other(format!("no {file}")));
                }
            }
            let server = engine.join("server");
            std::fs::create_dir(&server)?;
            // The whole server (every thread) into its leaf.
            let own = std::process::id();
            std::fs::write(server.join("cgroup.procs"), own.to_string())?;
            // And its helpers already forked in the delegated group (the
            // death guard): a process left there blocks every controller
            // (v2's no-internal-processes rule: enabling one is EBUSY).
            for pid in members(&group).unwrap_or_default() {
                let child = crate::trees::procfs::stat(pid).is_some_and(|p| p.ppid as u32 == own);
                if child {
                    std::fs::write(server.join("cgroup.procs"), pid.to_string())?;
                }
            }
            Ok(())
        })();
        if let Err(e) = made {
            remove_tree(&engine);
            return Err(e);
        }
        let offered = std::fs::read_to_string(group.join("cgroup.controllers")).unwrap_or_default();
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let controllers = CONTROLLERS
            .into_iter()
            .map(|c| {
                let enabled = if !offered.contains(&c) {
                    Err(format!(
                        "the delegated group offers no {c} controller (its cgroup.controllers)"
                    ))
                } else {
                    enable(&group, c).and_then(|()| enable(&engine, c))
                };
                (c, enabled)
            })
            .collect();
        Ok(Delegated {
            group,
            engine,
            controllers,
        })
    }

    /// The delegated group.
    pub fn group(&self) -> &Path {
        &self.group
    }

    /// Whether `controller` limits each sandbox group.
    pub fn enforces(&self, controller: &str) -> bool {
        self.controllers
            .iter()
            .any(|(c, r)| *c == controller && r.is_ok())
    }

    /// Why `controller` does not limit sandbox groups (`None` when it does).
    pub fn why_not(&self, controller: &str) -> Option<String> {
        self.controllers
            .iter()
            .find(|(c, _)| *c == controller)
            .and_then(|(_, r)| r.clone().err())
    }

    /// The group of the sandbox whose root is `root`.
    pub(crate) fn sandbox_dir(&self, root: &Path) -> PathBuf {
        self.engine.join(format!("sandbox-{}", key(root)))
    }

    /// The sandbox's group (made, with its limits, on first use).
    pub(crate) fn sandbox(&self, root: &Path, limits: &Limits) -> std::io::Result<PathBuf> {
        let dir = self.sandbox_dir(root);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(dir),
            Err(e) => return Err(e),
        }
        let write = |file: &str, value: String| std::fs::write(dir.join(file), value);
        let set = (|| {
            if self.enforces("pids") {
                write("pids.max", limits.tasks.to_string())?;
            }
            if self.enforces("memory") {
                write("memory.max", limits.memory.to_string())?;
                // Swap counts toward the limit, as on cgroup v1: none.
                if dir.join("memory.swap.max").is_file() {
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
            let _ = std::fs::remove_dir(&dir);
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
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        open_procs(&dir)
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
        let dir = crate::util::new_unique_dir(&sandbox, &format!("cmd-{marker}"))?;
        match open_procs(&dir) {
            Ok(procs) => Ok((dir, procs)),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
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
        let Ok(entries) = std::fs::read_dir(self.sandbox_dir(root)) else {
            return false;
        };
        let groups: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        for g in &groups {
            let _ = std::fs::write(g.join("cgroup.freeze"), if stop { "1" } else { "0" });
        }
        if stop {
            for g in &groups {
                wait_frozen(g);
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
        let events = std::fs::read_to_string(self.sandbox_dir(root).join("memory.events")).ok()?;
        events
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }

    /// The tasks (threads) the sandbox's command groups hold, launchers
    /// not counted.
    pub(crate) fn command_tasks(&self, root: &Path) -> Option<usize> {
        let dir = self.sandbox_dir(root);
        let mut tasks = 0;
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            if !entry.file_name().to_string_lossy().starts_with("cmd-") {
                continue;
            }
            let threads = std::fs::read_to_string(entry.path().join("cgroup.threads"))
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
            remove_tree(&dir);
            if !dir.exists() || std::time::Instant::now() > deadline {
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

fn enable(dir: &Path, controller: &str) -> Result<(), String> {
    std::fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}")).map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            format!(
                "{} holds processes of others, so no controller can be enabled below it (cgroup \
                 v2's no-internal-processes rule); start the engine alone in its group \
                 (`systemd-run --user --scope -p Delegate=yes ...`)",
                dir.display()
            )
        } else {
            format!("enabling {controller} in {} failed: {e}", dir.display())
        }
    })
}

fn open_procs(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
}

/// The pids the kernel lists in the group at `dir`. `Err` when it cannot
/// be read: `NotFound` once the group is removed.
pub(crate) fn members(dir: &Path) -> std::io::Result<Vec<i32>> {
    let list = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect())
}

/// Whether the group at `dir` is empty, as the kernel says it
/// (`populated 0` in `cgroup.events`, which counts its descendants too),
/// or gone. A file that cannot be read proves nothing.
pub(crate) fn is_empty(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => events.lines().any(|l| l == "populated 0"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound && !dir.exists(),
    }
}

/// Kills every process of the group at `dir` and its descendants
/// (`cgroup.kill`: forks racing the kill included).
pub(crate) fn kill(dir: &Path) -> bool {
    std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
}

/// Freezes (`cgroup.freeze` 1) or thaws the group at `dir`; on a freeze,
/// waits up to 2 s for `frozen 1`. `false` when it cannot be written.
pub(crate) fn freeze(dir: &Path, stop: bool) -> bool {
    if std::fs::write(dir.join("cgroup.freeze"), if stop { "1" } else { "0" }).is_err() {
        return false;
    }
    if stop {
        wait_frozen(dir);
    }
    true
}

/// Waits up to 2 s for `frozen 1` in the `cgroup.events` of the group at
/// `dir` (the kernel freezes its members asynchronously).
fn wait_frozen(dir: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match std::fs::read_to_string(dir.join("cgroup.events")) {
            Ok(events) if !events.lines().any(|l| l == "frozen 1") => {}
            _ => return,
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Removes the group at `dir` and every group below it (deepest first);
/// a group that still has members stays.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Subtrees of servers that are gone (`createos-local-<pid>` with no
/// process of that pid, and `populated 0` in its `cgroup.events`):
/// removed. A live pid's subtree is never touched (a server that made it
/// a moment ago has not moved in yet).
fn remove_stale(group: &Path) {
    let Ok(entries) = std::fs::read_dir(group) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("createos-local-")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let path = e.path();
        if !Path::new(&format!("/proc/{pid}")).exists() && is_empty(&path) {
            remove_tree(&path);
        }
    }
}

#[cfg(test)]
mod tests {
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
