//! The tree proof without a cgroup (issue 37 item 4): an *anchor* per
//! command inside the sandbox's machine, where the server has no cgroup it
//! can write ([`crate::trees::process_limits::TreeBackend::NoCgroup`]: not
//! root, and no cgroup v2 group delegated to it). Honestly weaker than a
//! group: see "A killed anchor". This file is the server's side of the
//! proof; the anchor process itself is forked by the launcher
//! (`crate::machine::join`).
//!
//! # The anchor
//! The launcher (`crate::machine::join`), once inside the machine's
//! namespaces, forks the anchor (in the machine's PID namespace) and
//! writes its host pid on the command's *proof pipe*, whose read end the
//! server holds ([`Proof`]). The anchor makes itself a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`) and not dumpable (it is a copy of the
//! server's memory: with its memory belonging to the host's user
//! namespace, no sandbox process may read or trace it), forks the
//! command, hands the command's wait status to the launcher (which exits
//! with it, so the server sees the command end as elsewhere) and reaps
//! until `waitpid` says `ECHILD`. Every process the command starts
//! (`setsid`, double forks, daemons, nested subreapers' orphans once they
//! end) is re-parented below it, since the kernel hands an orphan to its
//! nearest subreaper ancestor in the same PID namespace; so `ECHILD` means
//! nothing of the command's tree is left. The anchor then writes
//! [`GONE_TAG`] on the proof pipe and exits: that byte is the proof.
//!
//! # A killed anchor
//! A sandbox process may kill the anchor (same uid). Its orphans then go
//! to the machine's init, and nothing tells them apart from other
//! commands' processes: the pipe ends without [`GONE_TAG`] and the tree
//! is *lost*. A lost tree is never called gone while the machine lives:
//! deleting the process answers `tree_exited: false` (the processes that
//! still carry the command's marker are signalled, as a hint, never as a
//! proof); only the end of the whole machine (the sandbox's delete, stop
//! or the server's shutdown: SIGKILL to its init, and the kernel ends its
//! PID namespace) proves it gone.
//!
//! # A stopped anchor
//! A sandbox process may also stop the anchor (`kill -STOP`). Each check
//! of the tree (every 100 ms while the command runs) continues an anchor
//! found stopped, so its command's exit and proof still arrive.
//!
//! # Members
//! The anchor's descendants (a `/proc` walk by parent pid from its host
//! pid and start time); the anchor itself is never signalled, so that it
//! reports once the rest is gone.

use std::collections::HashSet;
use std::os::fd::OwnedFd;

use crate::trees::procfs::{self, ProcInfo};

/// Tag of the launcher's message on the proof pipe: the anchor's host pid
/// follows (4 bytes, little-endian).
pub const PID_TAG: u8 = b'P';
/// The anchor's proof that nothing is left of its command's tree.
pub const GONE_TAG: u8 = b'G';

/// What the proof pipe has said so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The anchor holds the tree.
    Holding,
    /// The anchor reaped everything below it and said so.
    Gone,
    /// The pipe ended without the proof: the anchor was killed.
    Lost,
}

/// The server's end of one command's proof pipe, and what it learnt.
#[derive(Debug)]
pub struct Proof {
    pipe: Option<OwnedFd>,
    buf: Vec<u8>,
    state: State,
    /// The anchor, as (host pid, start time).
    anchor: Option<(i32, u64)>,
    /// The machine: its init's host pid and its PID namespace.
    machine: (i32, u64),
    /// `MARKER=value`, for a lost tree's processes.
    marker: Vec<u8>,
}

impl Proof {
    /// Takes the read end of a proof pipe (made non-blocking here) of a
    /// command of the machine `machine` (init pid, PID namespace), marked
    /// `marker` (`KEY=VALUE`). Reads what is there already: the launcher
    /// wrote the anchor's pid before the spawn returned.
    pub fn new(pipe: OwnedFd, machine: (i32, u64), marker: Vec<u8>) -> Proof {
        if let Ok(flags) = rustix::fs::fcntl_getfl(&pipe) {
            let _ = rustix::fs::fcntl_setfl(&pipe, flags | rustix::fs::OFlags::NONBLOCK);
        }
        let mut proof = Proof {
            pipe: Some(pipe),
            buf: Vec::new(),
            state: State::Holding,
            anchor: None,
            machine,
            marker,
        };
        proof.poll();
        proof
    }

    /// Reads what the pipe holds now and updates the state.
    pub fn poll(&mut self) -> State {
        while let Some(pipe) = &self.pipe {
            let mut chunk = [0u8; 64];
            match rustix::io::read(pipe, &mut chunk) {
                Ok(0) => {
                    self.pipe = None;
                    if self.state == State::Holding {
                        self.state = State::Lost;
                    }
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
            self.parse();
        }
        self.state
    }

    fn parse(&mut self) {
        loop {
            match self.buf.first() {
                Some(&PID_TAG) if self.buf.len() >= 5 => {
                    let pid =
                        i32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
                    self.buf.drain(..5);
                    // The launcher has not reaped it (it waits for the
                    // pipe first), so the pid is still the anchor's, a
                    // zombie at worst.
                    self.anchor = procfs::stat(pid).map(|p| (pid, p.starttime));
                }
                Some(&GONE_TAG) => {
                    self.buf.drain(..1);
                    self.state = State::Gone;
                }
                Some(&PID_TAG) | None => return,
                Some(_) => {
                    // Nothing else is ever written: a broken pipe proves
                    // nothing.
                    self.buf.clear();
                    return;
                }
            }
        }
    }

    /// Whether the machine this command ran in is gone (its init exited:
    /// the kernel ended everything in its PID namespace first).
    fn machine_gone(&self) -> bool {
        let (init_pid, ns) = self.machine;
        let alive = procfs::stat(init_pid).is_some_and(|p| !p.is_zombie())
            && procfs::pid_namespace(init_pid) == Some(ns);
        !alive && procfs::try_live_in_namespace(ns).is_ok_and(|l| l.is_empty())
    }

    /// Continues the anchor when a sandbox process stopped it (`SIGSTOP`,
    /// `SIGTSTP`: same uid, so it may): a stopped anchor neither hands the
    /// command's exit to the launcher nor reaps, so the command's request
    /// would wait for ever. Called while the command runs (see
    /// `Tree::wake_holder`) and on each check of the tree; a sandbox that
    /// keeps stopping it only delays its own command.
    pub fn wake_if_stopped(&self) {
        let Some((pid, start)) = self.anchor else {
            return;
        };
        let stopped =
            procfs::stat(pid).is_some_and(|p| p.starttime == start && matches!(p.state, 'T' | 't'));
        if let (true, Some(pid)) = (stopped, rustix::process::Pid::from_raw(pid)) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
        }
    }

    /// Whether the tree is proven gone: the anchor's byte, or the end of
    /// the whole machine.
    pub fn is_gone(&mut self) -> bool {
        self.wake_if_stopped();
        match self.poll() {
            State::Gone => true,
            State::Holding | State::Lost => self.machine_gone(),
        }
    }

    /// The anchor's host pid, while it is known.
    pub fn anchor_pid(&self) -> Option<i32> {
        self.anchor.map(|(pid, _)| pid)
    }

    /// The tree's live members found now: the anchor's descendants (the
    /// anchor excluded); for a lost tree, the processes of the machine
    /// that still carry the command's marker (a hint: others may have
    /// cleared it).
    pub fn members(&mut self) -> Vec<ProcInfo> {
        let state = self.poll();
        if state == State::Gone {
            return Vec::new();
        }
        let snap: Vec<ProcInfo> = procfs::snapshot()
            .into_iter()
            .filter(|p| !p.is_zombie())
            .collect();
        let anchor_alive = self
            .anchor
            .is_some_and(|(pid, start)| snap.iter().any(|p| p.pid == pid && p.starttime == start));
        let mut parents: HashSet<i32> = HashSet::new();
        if state == State::Holding && anchor_alive {
            if let Some((pid, _)) = self.anchor {
                parents.insert(pid);
            }
        } else {
            let ns = self.machine.1;
            for p in &snap {
                if procfs::pid_namespace(p.pid) == Some(ns)
                    && procfs::environ_contains(p.pid, &self.marker)
                {
                    parents.insert(p.pid);
                }
            }
        }
        procfs::descendants(snap, parents, !(anchor_alive && state == State::Holding))
    }
}
