//! A sandbox's processes as the host sees them: the sandbox's own host
//! ids, every live process of those ids, freezing and thawing them, and
//! signals sent only to the very process a `/proc` scan saw.

use std::path::Path;

use rustix::process::{Pid, Signal};

use crate::trees::id_map::IdRange;
use crate::trees::procfs::{self, ProcInfo};

/// The environment variable that marks every process the server starts.
pub const MARKER_VAR: &str = "CREATEOS_LOCAL_MARKER";

/// The host uid that owns the sandbox at `root`: the first of its own ids
/// when the server runs as root (see [`crate::trees::id_map::sandbox_owner`]); `None` when
/// commands run as the server's own uid (a server that is not root).
pub fn sandbox_uid(root: &Path) -> Option<u32> {
    crate::trees::id_map::sandbox_owner(root).map(|(uid, _)| uid)
}

/// The host ids of the sandbox at `root` (see [`crate::trees::id_map`]): the
/// range its owner starts; `None` as for [`sandbox_uid`].
pub fn sandbox_ids(root: &Path) -> Option<IdRange> {
    sandbox_uid(root).map(IdRange::of_owner)
}

/// Every live (non-zombie) process whose real host uid is in `ids` (a
/// fresh `/proc` scan). For a sandbox's ids that is every process of the
/// sandbox, nested user and PID namespaces included: a process cannot
/// leave them (the sandbox's user namespace maps nothing else, and its
/// nested namespaces map only what it maps).
pub fn live_of_ids(ids: IdRange) -> Vec<ProcInfo> {
    procfs::all_pids()
        .into_iter()
        .filter(|pid| real_uid(*pid).is_some_and(|uid| ids.contains(uid)))
        .filter_map(procfs::stat)
        .filter(|p| !p.is_zombie())
        .collect()
}

/// [`live_of_ids`] as a proof: a scan that could not be made (out of
/// descriptors, `/proc` unreadable) is an error, never an empty list.
pub fn live_of_ids_checked(ids: IdRange) -> std::io::Result<Vec<ProcInfo>> {
    let mut live = Vec::new();
    for pid in procfs::try_all_pids()? {
        let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(s) => s,
            Err(e) if procfs::gone(&e) => continue,
            Err(e) => return Err(e),
        };
        if !uid_in_status(&status).is_some_and(|uid| ids.contains(uid)) {
            continue;
        }
        let state = status
            .lines()
            .find_map(|l| l.strip_prefix("State:"))
            .and_then(|v| v.trim_start().chars().next());
        if matches!(state, Some('Z') | Some('X')) {
            continue;
        }
        if let Some(p) = procfs::stat(pid) {
            if !p.is_zombie() {
                live.push(p);
            }
        } else if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(std::io::Error::other(format!(
                "process {pid} of the sandbox could not be read"
            )));
        }
    }
    Ok(live)
}

fn uid_in_status(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().next()?.parse().ok()
}

fn real_uid(pid: i32) -> Option<u32> {
    uid_in_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Stops (`SIGSTOP`) or continues (`SIGCONT`) every process of the host
/// ids `ids` (a paused sandbox: issue 24 item 5). A command that entered
/// a nested PID namespace (`unshare -Upf`) is not in its tree's namespace
/// but still has one of the sandbox's ids. Stopping repeats the scan until every
/// process found is stopped (a stopped process cannot fork; bounded at 100
/// rounds). Returns how many processes are stopped (or were continued).
pub fn freeze_ids(ids: IdRange, stop: bool) -> usize {
    if !stop {
        return live_of_ids(ids)
            .iter()
            .filter(|p| signal_verified(p, Signal::CONT))
            .count();
    }
    // The launchers (bwrap's outer process, the machine join) run as the sandbox's
    // uid but on the host, in the server's PID namespace: they are not the
    // sandbox's processes, and a launcher left stopped could never reap
    // its child (a sandbox deleted while paused).
    let host_ns = procfs::pid_namespace(rustix::process::getpid().as_raw_nonzero().get());
    let mut stopped = 0;
    for _ in 0..100 {
        let all: Vec<ProcInfo> = live_of_ids(ids)
            .into_iter()
            .filter(|p| host_ns.is_none() || procfs::pid_namespace(p.pid) != host_ns)
            .collect();
        let running: Vec<&ProcInfo> = all
            .iter()
            .filter(|p| !matches!(p.state, 'T' | 't'))
            .collect();
        stopped = all.len() - running.len();
        if running.is_empty() {
            break;
        }
        for p in running {
            signal_verified(p, Signal::STOP);
        }
    }
    stopped
}

/// Sends `sig` to the process a scan saw as `p`, never to a process that
/// reused its pid: a pidfd pins the process, and the signal goes out only
/// if the pinned process still has the start time the scan recorded
/// (`pidfd_open` + `/proc` check + `pidfd_send_signal`). `false` when the
/// process is gone, was replaced, or the signal failed.
pub fn signal_verified(p: &ProcInfo, sig: Signal) -> bool {
    let Some(pid) = Pid::from_raw(p.pid) else {
        return false;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    match procfs::stat(p.pid) {
        Some(now) if now.starttime == p.starttime => {
            rustix::process::pidfd_send_signal(&pidfd, sig).is_ok()
        }
        _ => false,
    }
}
