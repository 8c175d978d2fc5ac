//! Small, read-only views of `/proc` used to find and verify process trees.
//!
//! Every function here takes a *fresh* look at `/proc`; nothing is cached.
//! A process can appear or vanish between two reads; callers that need a
//! verdict ("nothing is left") repeat the scan after killing.

use std::fs;

/// What we need to know about one live process.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    /// Host pid.
    pub pid: i32,
    /// Parent pid.
    pub ppid: i32,
    /// Process group id.
    pub pgid: i32,
    /// Session id.
    pub sid: i32,
    /// Single-letter state from `/proc/PID/stat` (`Z` = zombie).
    pub state: char,
    /// Start time in clock ticks since boot; with `pid` it names a process
    /// unambiguously (pids are reused, start times are not).
    pub starttime: u64,
}

impl ProcInfo {
    /// A zombie has exited; it only waits to be reaped.
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Parses `/proc/PID/stat`. `None` when the process is gone.
pub fn stat(pid: i32) -> Option<ProcInfo> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces or ')'.
    let close = text.rfind(')')?;
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgid = rest.next()?.parse().ok()?;
    let sid = rest.next()?.parse().ok()?;
    // Fields 7..=21 are skipped; field 22 (starttime) follows.
    let starttime = rest.nth(15)?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        pgid,
        sid,
        state,
        starttime,
    })
}

/// All pids currently listed in `/proc` (none when `/proc` cannot be
/// read: a verdict of "nothing is left" needs [`try_all_pids`]).
pub fn all_pids() -> Vec<i32> {
    try_all_pids().unwrap_or_default()
}

/// All pids currently listed in `/proc`, or why the listing could not be
/// made (out of descriptors): never an empty list for a failed read.
pub fn try_all_pids() -> std::io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc")? {
        if let Some(pid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Whether an error reading `/proc/PID/...` means the process is gone
/// (rather than that the read could not be made).
pub fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// A snapshot of every live process.
pub fn snapshot() -> Vec<ProcInfo> {
    all_pids().into_iter().filter_map(stat).collect()
}

/// The processes of `snap` descended from `seeds` through parent pids, at
/// any depth, and the seeds themselves when `keep_seeds` (their entries in
/// `snap`). A process whose parent is not in `snap` is not reached: take
/// the snapshot once, then ask.
pub fn descendants(
    snap: Vec<ProcInfo>,
    seeds: std::collections::HashSet<i32>,
    keep_seeds: bool,
) -> Vec<ProcInfo> {
    let mut found = if keep_seeds {
        seeds.clone()
    } else {
        std::collections::HashSet::new()
    };
    let mut parents = seeds;
    loop {
        let mut grew = false;
        for p in &snap {
            if parents.contains(&p.ppid) && found.insert(p.pid) {
                parents.insert(p.pid);
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    snap.into_iter()
        .filter(|p| found.contains(&p.pid))
        .collect()
}

/// The pid-namespace inode of a process (`/proc/PID/ns/pid`).
pub fn pid_namespace(pid: i32) -> Option<u64> {
    let link = fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// Whether the initial environment of `pid` contains the exact `KEY=VALUE`
/// entry. Processes can replace their environment on `exec`; this is a hint,
/// not a proof.
pub fn environ_contains(pid: i32, entry: &[u8]) -> bool {
    match fs::read(format!("/proc/{pid}/environ")) {
        Ok(bytes) => bytes.split(|b| *b == 0).any(|e| e == entry),
        Err(_) => false,
    }
}

/// Whether `pid`'s command line binds `root` as `/` (`--bind ROOT /`): a
/// sandbox machine's bwrap, before and after it made the machine.
pub fn binds_as_root(pid: i32, root: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(bytes) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
    args.windows(3)
        .any(|w| w[0] == b"--bind" && w[1] == root.as_os_str().as_bytes() && w[2] == b"/")
}

/// Live (non-zombie) processes whose pid namespace is `ns`: every pid in
/// `/proc` is looked at, its namespace first (one `readlink`), and only
/// the members' `stat` is read.
pub fn live_in_namespace(ns: u64) -> Vec<ProcInfo> {
    all_pids()
        .into_iter()
        .filter(|pid| pid_namespace(*pid) == Some(ns))
        .filter_map(stat)
        .filter(|p| !p.is_zombie())
        .collect()
}

/// [`live_in_namespace`] as a proof: `Err` when a process could not be
/// looked at (out of descriptors), never a shorter list.
pub fn try_live_in_namespace(ns: u64) -> std::io::Result<Vec<ProcInfo>> {
    let mut live = Vec::new();
    for pid in try_all_pids()? {
        if pid_namespace(pid) != Some(ns) {
            continue;
        }
        if !is_dead(pid) {
            match stat(pid) {
                Some(p) => live.push(p),
                None => {
                    return Err(std::io::Error::other(format!(
                        "process {pid} could not be read"
                    )))
                }
            }
        }
    }
    Ok(live)
}

/// Whether `pid` runs no more: a zombie, or gone from `/proc`. A process
/// whose `stat` cannot be read while `/proc/PID` is still there (out of
/// descriptors) counts as alive.
pub fn is_dead(pid: i32) -> bool {
    match stat(pid) {
        Some(p) => p.is_zombie(),
        None => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// The children of every thread of `pid` (`/proc/PID/task/*/children`).
/// `None` when the process is gone or the list cannot be read.
pub fn children(pid: i32) -> Option<Vec<i32>> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let path = task.path().join("children");
        let list = fs::read_to_string(path).ok()?;
        out.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    fn proc(pid: i32, ppid: i32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            state: 'S',
            starttime: 1,
        }
    }

    /// A tree of 1 → 2 → 3 → 4 (listed child first, so one pass is not
    /// enough) beside an unrelated 9: the descendants of 2 are 3 and 4,
    /// and with the seed, 2 as well; 9 is never reached.
    #[test]
    fn descendants_follow_parent_pids_at_any_depth() {
        let snap = vec![proc(4, 3), proc(3, 2), proc(2, 1), proc(1, 0), proc(9, 0)];
        let pids = |keep| {
            let mut v: Vec<i32> = descendants(snap.clone(), [2].into(), keep)
                .into_iter()
                .map(|p| p.pid)
                .collect();
            v.sort();
            v
        };
        assert_eq!(pids(false), vec![3, 4]);
        assert_eq!(pids(true), vec![2, 3, 4]);
    }

    use super::*;

    #[test]
    fn lists_the_children_of_a_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .expect("spawn sleep");
        let me = std::process::id() as i32;
        let listed = children(me).expect("own children");
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed.contains(&(child.id() as i32)), "{listed:?}");
    }

    #[test]
    fn reads_own_stat_and_namespace() {
        let me = std::process::id() as i32;
        let info = stat(me).expect("own stat");
        assert_eq!(info.pid, me);
        assert!(!info.is_zombie());
        assert!(pid_namespace(me).is_some());
    }
}
