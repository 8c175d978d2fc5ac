//! A sandbox's processes as the host sees them: the sandbox's own host
//! ids, every live process of those ids, freezing and thawing them, and
//! signals sent only to the very process a `/proc` scan saw.

use std::path::Path;

use rustix::process::{Pid, Signal};

use crate::trees::host::{self, Host};
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
    live_of_ids_on(&host::REAL, ids)
}

/// [`live_of_ids_checked`] on `host`.
pub(crate) fn live_of_ids_on(host: &dyn Host, ids: IdRange) -> std::io::Result<Vec<ProcInfo>> {
    let mut live = Vec::new();
    for pid in host.pids()? {
        let status = match host.read(Path::new(&format!("/proc/{pid}/status"))) {
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
        if let Some(p) = host.stat(pid) {
            if !p.is_zombie() {
                live.push(p);
            }
        } else if host.exists(Path::new(&format!("/proc/{pid}"))) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trees::host::FakeHost;

    /// A sandbox's range of host ids (the first range).
    const IDS: IdRange = IdRange {
        first: 0x4000_0000,
        count: 65_536,
    };

    fn pids(live: &[ProcInfo]) -> Vec<i32> {
        live.iter().map(|p| p.pid).collect()
    }

    /// The proof that a sandbox's processes are gone counts every live
    /// process of its ids and only those: not another uid's (one past
    /// the range included), not a zombie, not one that ended between the
    /// listing and the read of its status.
    #[test]
    fn the_scan_finds_the_live_processes_of_the_ids_and_only_those() {
        let h = FakeHost::new();
        h.proc_entry(10, IDS.first, 'S', true)
            .proc_entry(11, IDS.first + 65_535, 'R', true)
            .proc_entry(12, 1000, 'S', true)
            .proc_entry(13, IDS.first + 65_536, 'S', true)
            .proc_entry(14, IDS.first, 'Z', true)
            .dir("/proc/16");
        let live = live_of_ids_on(&h, IDS).expect("a scan");
        assert_eq!(pids(&live), vec![10, 11]);
    }

    /// A scan that could not be made proves nothing: `/proc` that cannot
    /// be listed, a status that cannot be read (out of descriptors), or a
    /// process of the ids whose `stat` cannot be read while it is still
    /// there are errors, never a shorter list. A status gone with its
    /// process (`ESRCH`) is no error.
    #[test]
    fn a_scan_that_cannot_be_made_is_an_error_never_a_shorter_list() {
        let h = FakeHost::new();
        h.proc_entry(10, IDS.first, 'S', true)
            .refuse_listing(libc::EMFILE);
        assert!(
            live_of_ids_on(&h, IDS).is_err(),
            "an unlisted /proc proved nothing gone"
        );

        let h = FakeHost::new();
        h.proc_entry(10, IDS.first, 'S', true)
            .proc_entry(11, IDS.first, 'S', true)
            .refuse_reads("/proc/11/status", libc::EMFILE);
        let e = live_of_ids_on(&h, IDS).expect_err("a status that cannot be read");
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        h.refuse_reads("/proc/11/status", libc::ESRCH);
        assert_eq!(pids(&live_of_ids_on(&h, IDS).expect("a scan")), vec![10]);

        let h = FakeHost::new();
        h.proc_entry(10, IDS.first, 'S', true)
            .proc_entry(12, IDS.first, 'S', false);
        let e = live_of_ids_on(&h, IDS).expect_err("a stat that cannot be read");
        assert!(e.to_string().contains("process 12"), "{e}");
    }
}
