//! The process supervisor: starts managed processes, journals their output,
//! tracks leader and tree exit, and terminates trees with verification.
//!
//! Lifecycle of one process:
//! 1. spawn (see [`crate::machine::isolation`]); in bwrap mode the create request is
//!    answered as soon as bwrap's status pipe tells the host pid of the
//!    namespace's init and the namespace inode (no timer, no `/proc` scan:
//!    the command itself may not have been forked yet). The process's `pid`
//!    is that init's host pid, and a pidfd of it announces the tree's end;
//! 2. two reader tasks append stdout / stderr chunks to the [`Journal`];
//! 3. when the leader has been reaped, each reader takes what is left in its
//!    pipe without waiting (all the leader wrote is there by then, see
//!    [`spawn_reader`]); only then is the exit recorded, so the exit frame
//!    follows the last byte of the command's output. Output orphans write
//!    later is read and dropped;
//! 4. a watcher sets `tree_exited` once a fresh `/proc` scan finds the tree
//!    gone. In bwrap mode it scans when the init's pidfd reports its exit
//!    (the init exits only when nothing is left in its namespace); in
//!    process-group mode there is no such event and it polls every 100 ms.
//!
//! Exit status in bwrap mode: bwrap reports a leader killed by signal N as
//! exit code `128 + N`. The server reports `signal` instead of `exit_code`
//! only when the status is `128 + N` *and* the server itself delivered
//! signal N to that tree; otherwise the code is reported as is. In fallback
//! mode the leader is the server's direct child and the status is exact.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustix::process::Signal;
use serde_json::{json, Value};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, watch};

use crate::machine::isolation::{self, IsolationMode, SpawnSpec, Tree};
use crate::machine::pty::{Terminal, Winsize};
use crate::storage::journal::{ExitStatus, Journal, ReaderId, Retention, Room, StreamKind};

mod interactive;

pub use interactive::{InputError, ResizeError};

/// Process states from the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Spawned, tree not yet known.
    Starting,
    /// Leader alive.
    Running,
    /// A delete is terminating the tree.
    Terminating,
    /// Leader exited.
    Exited,
    /// Could not be started.
    Failed,
}

impl ProcState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Terminating => "terminating",
            Self::Exited => "exited",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: ProcState,
    pid: i32,
    leader_exited: bool,
    tree_exited: bool,
    finished_at: Option<String>,
    exit: Option<ExitStatus>,
    delivered: HashSet<i32>,
    journal: Journal,
}

/// One managed process (or one-shot exec).
#[derive(Debug)]
pub struct Process {
    /// `proc-<hex>`.
    pub id: String,
    /// Program.
    pub cmd: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory as the sandbox sees it.
    pub cwd: String,
    /// Creation time (RFC 3339).
    pub created_at: String,
    inner: Mutex<Inner>,
    tree: Mutex<Tree>,
    stdin: Mutex<Option<tokio::process::ChildStdin>>,
    stdin_closed: AtomicBool,
    changed: watch::Sender<u64>,
    version: AtomicU64,
    terminate_lock: tokio::sync::Mutex<()>,
    /// The tree's end is announced by an event (the init's pidfd), so
    /// waiting for `tree_exited` needs no polling.
    init_exit: AtomicBool,
    /// The command has been seen forked (see [`Process::command_forked`]).
    command_seen: AtomicBool,
    /// Set when the process could not be started for a reason of the
    /// server's, not the command's (see [`Process::server_failure`]).
    server_failure: Mutex<Option<String>>,
    /// Itself, for the output budget's list of finished processes.
    me: std::sync::Weak<Process>,
    /// The engine-wide budget its output counts against once it finished
    /// (streamed journals only, see [`crate::sandboxes::output_budget`]).
    output_budget: Option<Arc<crate::sandboxes::output_budget::OutputBudget>>,
    /// Counted against the budget already.
    counted: AtomicBool,
    /// A `pty` process: the size its terminal was asked with.
    terminal_size: Option<Winsize>,
    /// A `pty` process's terminal, once started.
    terminal: std::sync::OnceLock<Arc<Terminal>>,
    /// One input request writes at a time, in the order they came.
    input_lock: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Out of descriptors, processes or memory: the host's state, not the
/// command's.
fn is_resource_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM)
    )
}

/// The 5xx message of a command the server could not start: nothing ran.
fn start_failure(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::EAGAIN) {
        return format!(
            "the server could not start the command ({e}); nothing ran. A sandbox at its \
             limit of {} tasks cannot start more: end some of its processes, then retry",
            crate::trees::process_limits::MAX_PROCESSES
        );
    }
    format!("the server could not start the command ({e}); nothing ran, retry later")
}

/// What to start.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// Program.
    pub cmd: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Sandbox-visible cwd (absolute, already validated).
    pub cwd: String,
    /// Host path of the cwd (fallback mode).
    pub host_cwd: PathBuf,
    /// Full environment.
    pub env: Vec<(String, String)>,
    /// Sandbox root.
    pub root: PathBuf,
    /// What the output journal keeps.
    pub journal: Retention,
    /// The engine-wide budget of finished output (counted only for a
    /// [`Retention::Streamed`] journal).
    pub output_budget: Option<Arc<crate::sandboxes::output_budget::OutputBudget>>,
    /// A terminal of this size instead of pipes (a `pty` process).
    pub terminal: Option<Winsize>,
    /// What the server that starts it owns (see
    /// [`crate::machine::ServerRegistries`]).
    pub registries: crate::machine::ServerRegistries,
}

/// The outcome of a terminate call.
#[derive(Debug, Clone)]
pub struct Termination {
    /// A fresh scan found no process of the tree.
    pub verified: bool,
    /// Pids found alive by the final scan.
    pub survivors: Vec<i32>,
}

impl Process {
    /// Starts a process and its supervision tasks.
    pub async fn start(
        id: String,
        bwrap: Option<PathBuf>,
        mode: &IsolationMode,
        req: StartRequest,
    ) -> Arc<Process> {
        let marker = format!("{}-{}", id, crate::util::random_hex(4));
        let (changed, _) = watch::channel(0);
        let output_budget = req
            .output_budget
            .clone()
            .filter(|_| matches!(req.journal, Retention::Streamed(_)));
        let proc = Arc::new_cyclic(|me| Process {
            id,
            cmd: req.cmd.clone(),
            args: req.args.clone(),
            cwd: req.cwd.clone(),
            created_at: crate::util::now_rfc3339(),
            inner: Mutex::new(Inner {
                state: ProcState::Starting,
                pid: 0,
                leader_exited: false,
                tree_exited: false,
                finished_at: None,
                exit: None,
                delivered: HashSet::new(),
                journal: Journal::with_retention(req.journal),
            }),
            tree: Mutex::new(Tree::Empty),
            stdin: Mutex::new(None),
            stdin_closed: AtomicBool::new(false),
            changed,
            version: AtomicU64::new(0),
            terminate_lock: tokio::sync::Mutex::new(()),
            init_exit: AtomicBool::new(false),
            command_seen: AtomicBool::new(false),
            server_failure: Mutex::new(None),
            me: me.clone(),
            output_budget,
            counted: AtomicBool::new(false),
            terminal_size: req.terminal,
            terminal: std::sync::OnceLock::new(),
            input_lock: tokio::sync::Mutex::new(()),
        });
        let spec = SpawnSpec {
            root: req.root.clone(),
            cmd: req.cmd.clone(),
            args: req.args.clone(),
            cwd: req.cwd.clone(),
            host_cwd: req.host_cwd.clone(),
            env: req.env.clone(),
            marker: marker.clone(),
            terminal: req.terminal,
            registries: req.registries.clone(),
        };
        // The sandbox's OOM kills so far: one more by the time the command
        // ends by SIGKILL means the sandbox reached its memory limit. A
        // sandbox whose memory group does not exist yet (cgroup v2 makes
        // it at its first command's start) has had none.
        let sandbox_root = bwrap.as_ref().map(|_| req.root.clone());
        let oom_kills_before = sandbox_root
            .as_deref()
            .map(|root| crate::trees::process_limits::sandbox_oom_kills(root).unwrap_or(0));
        let spawned = match isolation::spawn(bwrap.as_deref(), &spec) {
            Ok(s) => s,
            Err(e) => {
                if bwrap.is_some()
                    && !req.registries.isolation.is_proven()
                    && !is_resource_error(&e)
                {
                    // No command was confined yet: bubblewrap may not
                    // work here at all (a host out of descriptors,
                    // processes or memory says so below instead).
                    *lock(&proc.server_failure) =
                        Some(req.registries.isolation.refuse(&e.to_string()));
                } else if bwrap.is_some() || is_resource_error(&e) {
                    // The launcher itself could not run: the server's
                    // failure, never the command's result.
                    *lock(&proc.server_failure) = Some(start_failure(&e));
                }
                // Like a shell: report the failure on stderr, exit 127.
                let msg = format!("createos-local: cannot start {}: {e}\n", req.cmd);
                proc.push(StreamKind::Stderr, Bytes::from(msg));
                proc.finish_leader(ExitStatus::Code(127), ProcState::Failed);
                proc.set_tree_exited();
                return proc;
            }
        };
        let confined = bwrap.is_some();
        let master = spawned.terminal;
        let mut child = spawned.child;
        let outer_pid = child.id().map_or(0, |p| p as i32);
        let (tree, init_exit) = match (mode, spawned.status_pipe, spawned.machine) {
            (_, _, Some((isolation::Holder::Group(group), lease))) => (
                Tree::Cgroup {
                    group,
                    lease: Some(lease),
                    launcher: crate::trees::procfs::stat(outer_pid)
                        .map(|p| (outer_pid, p.starttime)),
                },
                None,
            ),
            (_, _, Some((isolation::Holder::Anchor(proof), lease))) => (
                Tree::Anchored {
                    proof,
                    lease: Some(lease),
                },
                None,
            ),
            (IsolationMode::Bwrap, Some(pipe), None) => {
                namespace_tree(pipe, outer_pid, &marker).await
            }
            _ => (Tree::group(outer_pid, &marker), None),
        };
        // A machine joined, or bwrap's namespace reported: bubblewrap
        // confines commands here.
        if matches!(
            tree,
            Tree::Cgroup { .. } | Tree::Anchored { .. } | Tree::Namespace { .. }
        ) {
            req.registries.isolation.note();
        }
        let shown_pid = match &tree {
            Tree::Namespace { init_pid, .. } => *init_pid,
            _ => outer_pid,
        };
        proc.init_exit.store(init_exit.is_some(), Ordering::SeqCst);
        if let Some(guarded) = tree.guarded() {
            crate::trees::deathguard::watch(guarded);
            if let Some(records) = &req.registries.records {
                records.note_tree(&req.root, &guarded, Some(&marker));
            }
        }
        *lock(&proc.tree) = tree;
        if lock(&proc.tree).wake_holder() {
            // An anchor stopped by a sandbox process would hold the
            // command's exit back for ever: continue it while it runs.
            let p = proc.clone();
            tokio::spawn(async move {
                while !lock(&p.inner).leader_exited {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    lock(&p.tree).wake_holder();
                }
            });
        }
        *lock(&proc.stdin) = child.stdin.take();
        {
            let mut inner = lock(&proc.inner);
            inner.pid = shown_pid;
            inner.state = ProcState::Running;
        }
        // Both readers learn when the leader has been reaped; each answers
        // once it holds every byte written before that moment.
        let (reaped_tx, reaped_rx) = watch::channel(false);
        if let Some(size) = req.terminal {
            let drained = proc.start_terminal(master, size, reaped_rx).await;
            let p = proc.clone();
            tokio::spawn(async move {
                let status = child.wait().await;
                let _ = reaped_tx.send(true);
                let _ = drained.await;
                let exit = match status {
                    Ok(st) => p.map_status(st),
                    Err(_) => ExitStatus::Code(-1),
                };
                p.finish_leader(exit, ProcState::Exited);
                p.watch_tree(init_exit).await;
            });
            return proc;
        }
        let drained: Vec<_> = [
            child
                .stdout
                .take()
                .and_then(|s| s.into_owned_fd().ok())
                .map(|fd| spawn_reader(proc.clone(), StreamKind::Stdout, fd, reaped_rx.clone())),
            child
                .stderr
                .take()
                .and_then(|s| s.into_owned_fd().ok())
                .map(|fd| spawn_reader(proc.clone(), StreamKind::Stderr, fd, reaped_rx.clone())),
        ]
        .into_iter()
        .flatten()
        .collect();
        let p = proc.clone();
        let proof = req.registries.isolation.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = reaped_tx.send(true);
            for d in drained {
                let _ = d.await;
            }
            let mut exit = match status {
                Ok(st) => p.map_status(st),
                Err(_) => ExitStatus::Code(-1),
            };
            if let Some(before) = oom_kills_before {
                if p.killed_for_memory(&mut exit, before, sandbox_root.as_deref()) {
                    let note = format!(
                        "createos-local: the sandbox reached its memory limit ({} MiB): the \
                         kernel killed a process of it (SIGKILL)\n",
                        crate::trees::process_limits::sandbox_memory() >> 20
                    );
                    p.push(StreamKind::Stderr, Bytes::from(note));
                }
            }
            if confined {
                if let Some(line) = p.launcher_failure(&exit) {
                    let why = if proof.is_proven() {
                        format!(
                            "the server could not start the command in the sandbox ({line}); \
                             nothing ran. A sandbox at its limit of {} tasks cannot start \
                             more: end some of its processes, then retry",
                            crate::trees::process_limits::MAX_PROCESSES
                        )
                    } else {
                        // No command was confined yet: bubblewrap may not
                        // work here at all.
                        proof.refuse(&line)
                    };
                    *lock(&p.server_failure) = Some(why);
                }
            }
            p.finish_leader(exit, ProcState::Exited);
            p.watch_tree(init_exit).await;
        });
        proc
    }

    fn bump(&self) {
        let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        self.changed.send_replace(v);
    }

    fn push(&self, stream: StreamKind, data: Bytes) {
        lock(&self.inner).journal.push(stream, data);
        self.bump();
    }

    fn map_status(&self, st: std::process::ExitStatus) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = st.signal() {
            return ExitStatus::Signal(isolation::signal_name(sig));
        }
        let code = st.code().unwrap_or(-1);
        let delivered = lock(&self.inner).delivered.clone();
        let in_namespace = matches!(*lock(&self.tree), Tree::Namespace { .. });
        if in_namespace && code > 128 && delivered.contains(&(code - 128)) {
            return ExitStatus::Signal(isolation::signal_name(code - 128));
        }
        ExitStatus::Code(code)
    }

    /// Whether the command ended because its sandbox reached its memory
    /// limit: the sandbox's OOM kills grew from `before` while it ran, and
    /// it ended by SIGKILL, or with `128 + 9` (a shell whose child was
    /// killed, or bwrap's report of its own command, which then becomes
    /// the signal).
    fn killed_for_memory(&self, exit: &mut ExitStatus, before: u64, root: Option<&Path>) -> bool {
        let killed = match exit {
            ExitStatus::Signal(s) => s == "SIGKILL",
            ExitStatus::Code(code) => *code == 128 + libc::SIGKILL,
        };
        let grew = root
            .and_then(crate::trees::process_limits::sandbox_oom_kills)
            .is_some_and(|now| now > before);
        if killed && grew && matches!(*lock(&self.tree), Tree::Namespace { .. }) {
            *exit = ExitStatus::Signal(isolation::signal_name(libc::SIGKILL));
        }
        killed && grew
    }

    fn finish_leader(&self, exit: ExitStatus, state: ProcState) {
        {
            let mut inner = lock(&self.inner);
            inner.journal.set_exit(exit.clone());
            inner.exit = Some(exit);
            inner.leader_exited = true;
            inner.finished_at = Some(crate::util::now_rfc3339());
            inner.state = state;
        }
        self.bump();
        self.count_if_finished();
    }

    /// Once leader and tree have exited: counts the output it keeps
    /// against the engine-wide budget (once).
    fn count_if_finished(&self) {
        let Some(budget) = &self.output_budget else {
            return;
        };
        let bytes = {
            let inner = lock(&self.inner);
            if !(inner.leader_exited && inner.tree_exited) {
                return;
            }
            inner.journal.retained_bytes()
        };
        if !self.counted.swap(true, Ordering::SeqCst) {
            budget.finished(self.me.clone(), bytes);
        }
    }

    fn set_tree_exited(&self) {
        {
            let mut tree = lock(&self.tree);
            if let Some(guarded) = tree.guarded() {
                crate::trees::deathguard::release(guarded);
            }
            tree.release();
        }
        lock(&self.inner).tree_exited = true;
        self.bump();
        self.count_if_finished();
    }

    /// Sets `tree_exited` once a fresh scan finds the tree gone: right
    /// after `init_exit` (a pidfd of the namespace's init) reports the
    /// init's exit, or (without one) by polling.
    async fn watch_tree(&self, init_exit: Option<OwnedFd>) {
        if let Some(fd) = init_exit {
            // SAFETY: the AsyncFd owns the pidfd; nothing else closes or
            // replaces it while it is registered.
            let registered = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
            if let Ok(fd) = registered {
                // The init exits only once its namespace is empty (it waits
                // for every orphan, and its exit takes any straggler down).
                let _ = fd.readable().await;
            }
        }
        loop {
            if lock(&self.inner).tree_exited {
                return;
            }
            if lock(&self.tree).is_gone() {
                self.set_tree_exited();
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A receiver that changes whenever output, exit or tree state changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Runs `f` on the journal.
    pub fn with_journal<R>(&self, f: impl FnOnce(&Journal) -> R) -> R {
        f(&lock(&self.inner).journal)
    }

    /// Attaches a reader (a `/connect` stream or a log follower) to a
    /// streamed journal, if `check` (which sees the journal as the reader
    /// starts) accepts; `check` also names the seq the reader has received
    /// up to. Atomic, so nothing is evicted in between. The guard is `None` for other journals.
    /// While attached, nothing the reader has not received is evicted and
    /// the pipes wait for it (see [`crate::storage::journal`]); it detaches when the
    /// guard drops.
    pub fn attach_reader<R, E>(
        self: &Arc<Self>,
        check: impl FnOnce(&Journal) -> Result<(u64, R), E>,
    ) -> Result<(Option<ReaderGuard>, R), E> {
        let mut inner = lock(&self.inner);
        let (after, r) = check(&inner.journal)?;
        let guard = inner.journal.attach(after).map(|id| ReaderGuard {
            proc: self.clone(),
            id,
        });
        Ok((guard, r))
    }

    /// `(leader_exited, tree_exited)`.
    pub fn exited(&self) -> (bool, bool) {
        let inner = lock(&self.inner);
        (inner.leader_exited, inner.tree_exited)
    }

    /// Why the server (not the command) failed to start this process: the
    /// launcher could not be spawned (bwrap mode), or the host was out of
    /// descriptors, processes or memory. Such a process never ran; the API
    /// answers 503 instead of a command result.
    pub fn server_failure(&self) -> Option<String> {
        lock(&self.server_failure).clone()
    }

    /// Whether the launcher failed before the command ran (issue 24 item
    /// 7): bwrap exits 1 after printing its own error (`bwrap: ...`). Such
    /// an exit is the server's failure, not the command's result: bwrap's
    /// line, for the 5xx answer. A command that prints such a line
    /// itself and exits the same way is taken for one; that can only
    /// misreport its own result. In a sandbox machine the launcher is the
    /// server's own fork ([`mod@crate::machine::join`]): its failures before the
    /// command was forked fail the spawn itself, and an exit is always the
    /// command's.
    fn launcher_failure(&self, exit: &ExitStatus) -> Option<String> {
        const LAUNCHERS: &[(i32, &str)] = &[(1, "bwrap: ")];
        if matches!(
            *lock(&self.tree),
            Tree::Cgroup { .. } | Tree::Anchored { .. }
        ) {
            return None;
        }
        let ExitStatus::Code(code) = exit else {
            return None;
        };
        if !LAUNCHERS.iter().any(|(c, _)| c == code) {
            return None;
        }
        let (stderr, dropped) = self.collect(StreamKind::Stderr);
        if dropped > 0 || stderr.len() > 4096 {
            return None;
        }
        let text = String::from_utf8_lossy(&stderr);
        LAUNCHERS
            .iter()
            .any(|(c, prefix)| c == code && text.starts_with(prefix))
            .then(|| text.lines().next().unwrap_or("").trim().to_string())
    }

    /// When the leader's exit was recorded (RFC 3339, millisecond
    /// precision, so the strings sort in time order).
    pub fn finished_at(&self) -> Option<String> {
        lock(&self.inner).finished_at.clone()
    }

    /// The recorded exit of the leader.
    pub fn exit(&self) -> Option<ExitStatus> {
        lock(&self.inner).exit.clone()
    }

    /// Closes stdin; `false` when it was already closed.
    pub fn close_stdin(&self) -> bool {
        if self.stdin_closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        drop(lock(&self.stdin).take());
        true
    }

    /// Sends a signal to every process of the tree. Returns how many were
    /// hit. In bwrap mode it first waits until the command has been forked
    /// (see [`Process::command_forked`]): before that, the namespace holds
    /// only bwrap's init, which ignores every signal but SIGKILL and
    /// SIGSTOP, and the signal would be lost.
    pub async fn signal(&self, sig: Signal) -> usize {
        if sig != Signal::KILL && sig != Signal::STOP {
            self.command_forked().await;
        }
        self.signal_now(sig)
    }

    /// Sends a signal to every process of the tree found now (without
    /// waiting for the command to be forked). Returns how many were hit.
    pub fn signal_now(&self, sig: Signal) -> usize {
        lock(&self.inner).delivered.insert(sig.as_raw());
        lock(&self.tree).signal(sig)
    }

    /// Returns once bwrap's init has forked the command (it has a child),
    /// or the command has exited, or the init is gone or stopped (a paused
    /// sandbox); at once outside bwrap mode. `POST /processes` answers as
    /// soon as the namespace exists, a few milliseconds before bwrap forks
    /// the command, and no event announces that fork; so only a signal
    /// sent in that window waits here, re-reading the init's list of
    /// children (`/proc/PID/task/*/children`) every millisecond, for at
    /// most 5 s. Nothing on the way of a command's start or output waits
    /// here.
    pub async fn command_forked(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        if matches!(
            *lock(&self.tree),
            Tree::Cgroup { .. } | Tree::Anchored { .. }
        ) {
            // A machine command: until the launcher has forked, a signal
            // would reach nobody (the launcher itself is spared).
            while !self.command_seen.load(Ordering::SeqCst) {
                let started = lock(&self.tree).command_started();
                if started || self.exited().0 || Instant::now() > deadline {
                    self.command_seen.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            return;
        }
        let Tree::Namespace { init_pid, ns } = *lock(&self.tree) else {
            return;
        };
        while !self.command_seen.load(Ordering::SeqCst) {
            // Unreadable: the init is gone (checked below either way).
            let forked = crate::trees::procfs::children(init_pid).is_none_or(|c| !c.is_empty());
            let init_cannot_fork = crate::trees::procfs::stat(init_pid)
                .is_none_or(|p| p.is_zombie() || matches!(p.state, 'T' | 't'))
                || crate::trees::procfs::pid_namespace(init_pid) != Some(ns);
            if forked || init_cannot_fork || self.exited().0 || Instant::now() > deadline {
                self.command_seen.store(true, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Stops or continues the whole tree (sandbox pause / resume). A tree
    /// whose command has not been forked yet is stopped too: its init stops
    /// before it forks.
    pub fn freeze(&self, stop: bool) {
        lock(&self.tree).freeze(stop);
    }

    /// Waits until the leader (or, with `tree`, the whole tree) has exited.
    /// Returns `false` on timeout.
    pub async fn wait(&self, tree: bool, timeout: Duration) -> bool {
        let mut rx = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let (leader, whole) = self.exited();
            if (tree && whole) || (!tree && leader) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }

    /// Terminates the tree: SIGTERM to every member, up to `grace` for it to
    /// go, then SIGKILL, then a fresh scan decides `verified`.
    pub async fn terminate(&self, grace: Duration) -> Termination {
        let _guard = self.terminate_lock.lock().await;
        if !self.tree_gone() {
            {
                let mut inner = lock(&self.inner);
                if !inner.leader_exited {
                    inner.state = ProcState::Terminating;
                }
            }
            self.signal(Signal::TERM).await;
            self.wait_gone(grace).await;
            // SIGKILL until nothing is found (forking loops need repeats).
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.tree_gone() && Instant::now() < deadline {
                self.signal_now(Signal::KILL);
                self.wait_gone(Duration::from_millis(50)).await;
            }
        }
        // Give the leader's exit a moment to be recorded for the answer.
        let _ = self.wait(false, Duration::from_secs(2)).await;
        let verified = self.tree_gone();
        let survivors: Vec<i32> = if verified {
            Vec::new()
        } else {
            lock(&self.tree).members().iter().map(|p| p.pid).collect()
        };
        if verified {
            self.set_tree_exited();
        }
        Termination {
            verified,
            survivors,
        }
    }

    /// SIGKILL to the whole tree at once, without waiting or verifying (for
    /// `Drop` paths that cannot await).
    pub fn kill_now(&self) {
        lock(&self.inner).delivered.insert(Signal::KILL.as_raw());
        lock(&self.tree).signal(Signal::KILL);
    }

    /// Whether the tree is gone: already verified (`tree_exited` is set
    /// only after a scan found nothing, and a gone tree cannot come back),
    /// or found gone by a fresh scan now.
    fn tree_gone(&self) -> bool {
        lock(&self.inner).tree_exited || lock(&self.tree).is_gone()
    }

    /// Waits up to `limit` for the tree to be gone. With an exit event (a
    /// bwrap tree whose init has a pidfd) this is the `tree_exited` change
    /// the watcher makes; otherwise a `/proc` scan every 25 ms.
    async fn wait_gone(&self, limit: Duration) {
        if self.init_exit.load(Ordering::SeqCst) {
            self.wait(true, limit).await;
            return;
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.tree_gone() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The ManagedProcess object of the spec.
    pub fn to_json(&self) -> Value {
        let inner = lock(&self.inner);
        let mut v = json!({
            "process_id": self.id,
            "kind": if self.terminal_size.is_some() { "pty" } else { "process" },
            "pid": inner.pid,
            "state": inner.state.as_str(),
            "leader_exited": inner.leader_exited,
            "tree_exited": inner.tree_exited,
            "created_at": self.created_at,
            "finished_at": inner.finished_at,
            "cmd": self.cmd,
            "args": self.args,
            "cwd": self.cwd,
            "output": {
                "oldest_seq": inner.journal.oldest_seq(),
                "newest_seq": inner.journal.newest_seq(),
                "bytes": inner.journal.retained_bytes(),
            },
        });
        if let Value::Object(map) = &mut v {
            match &inner.exit {
                Some(ExitStatus::Code(c)) => {
                    map.insert("exit_code".into(), json!(c));
                }
                Some(ExitStatus::Signal(s)) => {
                    map.insert("signal".into(), json!(s));
                }
                None => {}
            }
            if let Some(size) = self.terminal_size() {
                map.insert(
                    "terminal".into(),
                    json!({ "cols": size.cols, "rows": size.rows }),
                );
            }
        }
        v
    }

    /// The retained tail of one stream and how many bytes before it were
    /// dropped (for one-shot exec).
    pub fn collect(&self, stream: StreamKind) -> (Vec<u8>, u64) {
        let inner = lock(&self.inner);
        (
            inner.journal.stream_tail(stream),
            inner.journal.dropped_bytes(stream),
        )
    }
}

impl crate::sandboxes::output_budget::KeepsOutput for Process {
    /// Evicts the output it keeps (the engine-wide budget): a replay is
    /// then the 410 of an expired offset. `None`, nothing evicted, while a
    /// reader is attached.
    fn evict_output(&self) -> Option<usize> {
        let freed = lock(&self.inner).journal.evict_all();
        self.bump();
        freed
    }
}

/// An attached reader of a process's output (see
/// [`Process::attach_reader`]); detaches on drop.
#[derive(Debug)]
pub struct ReaderGuard {
    proc: Arc<Process>,
    id: ReaderId,
}

impl ReaderGuard {
    /// The reader has received every frame up to `seq`: those may be
    /// evicted, and the pipes may be read again.
    pub fn advance(&self, seq: u64) {
        lock(&self.proc.inner).journal.advance(self.id, seq);
        self.proc.bump();
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        lock(&self.proc.inner).journal.detach(self.id);
        self.proc.bump();
    }
}

/// Waits until the journal has room for more output (see
/// [`crate::storage::journal::Room`]), or the leader has been reaped. Returns
/// `false` when the leader was reaped.
async fn room(proc: &Process, reaped: &mut watch::Receiver<bool>) -> bool {
    if lock(&proc.inner).journal.room() == Room::Open {
        return true;
    }
    let mut changed = proc.subscribe();
    loop {
        changed.borrow_and_update();
        let until = match lock(&proc.inner).journal.room() {
            Room::Open => return true,
            Room::Full(until) => until,
        };
        let lapse = async {
            match until {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => futures_util::future::pending::<()>().await,
            }
        };
        tokio::select! {
            biased;
            _ = reaped.wait_for(|r| *r) => return false,
            _ = changed.changed() => {}
            _ = lapse => {}
        }
    }
}

/// The buffer of a command's output pipe, and the most one read takes.
const OUTPUT_PIPE_BYTES: usize = 256 * 1024;
/// A read shorter than this is short (see [`spawn_reader`]).
const SMALL_READ: usize = 16 * 1024;
/// After this many short reads in a row, the reader pauses
/// [`SMALL_READ_PAUSE`].
const SHORT_READS_BEFORE_PAUSE: u32 = 2;
/// How long the reader lets output gather after a short read.
const SMALL_READ_PAUSE: Duration = Duration::from_millis(1);

/// Reads one output pipe into the journal.
///
/// Until the leader is reaped, chunks are read as they come. Once it is
/// reaped, every byte the leader (and whatever it waited for) wrote is
/// already in the pipe: a write to a pipe has completed before the writer
/// can exit, and at most one pipe buffer of it can be unread. The reader
/// then reads, without waiting, until the pipe is empty, at end-of-file, or
/// one pipe buffer has been read, and only then reports `drained`: the exit
/// is recorded after that, so no output of the command is lost and an
/// orphan that keeps the pipe open cannot delay the exit. Output read later
/// (written by orphans after the exit) is discarded, but still read to the
/// end so that those writers do not die of `SIGPIPE`.
///
/// Pacing: what a read returns is handed on at once, so a line printed
/// alone reaches a follower without delay; but after two short reads in a
/// row (less than [`SMALL_READ`] each) the reader pauses
/// [`SMALL_READ_PAUSE`] before the next, so a command writing a fast stream
/// in small pieces is read (and
/// sent, and written by the client) in large chunks, not in one chunk per
/// write. Read as it came, such a stream stayed in small chunks at every
/// step after the pipe and cost its readers up to three times the CPU per
/// byte (BENCHMARKS.md, issue 41 item 3). A pipe that fills in the pause
/// makes the command wait, as any full pipe does.
///
/// Backpressure: before each read the reader waits for room in the
/// journal (see [`room`]); meanwhile the pipe fills and the command blocks
/// on write. Once the leader is reaped, what is left is drained anyway (at
/// most one pipe buffer beyond the journal's capacity).
fn spawn_reader(
    proc: Arc<Process>,
    stream: StreamKind,
    fd: OwnedFd,
    mut reaped: watch::Receiver<bool>,
) -> oneshot::Receiver<()> {
    let (drained_tx, drained_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = rustix::pipe::fcntl_setpipe_size(&fd, OUTPUT_PIPE_BYTES);
        let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
            let _ = drained_tx.send(());
            return;
        };
        let mut buf = vec![0u8; OUTPUT_PIPE_BYTES];
        // Short reads in a row.
        let mut short = 0;
        let at_eof = loop {
            if short >= SHORT_READS_BEFORE_PAUSE {
                short = 0;
                tokio::select! {
                    biased;
                    _ = reaped.wait_for(|r| *r) => break false,
                    _ = tokio::time::sleep(SMALL_READ_PAUSE) => {}
                }
            }
            if !room(&proc, &mut reaped).await {
                break false;
            }
            tokio::select! {
                biased;
                _ = reaped.wait_for(|r| *r) => break false,
                ready = pipe.readable() => {
                    if ready.is_err() {
                        break true;
                    }
                    match pipe.try_read(&mut buf) {
                        Ok(0) => break true,
                        Ok(n) => {
                            proc.push(stream, Bytes::copy_from_slice(&buf[..n]));
                            short = if n < SMALL_READ { short + 1 } else { 0 };
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break true,
                    }
                }
            }
        };
        let at_eof = at_eof || drain_written(&proc, stream, &pipe, &mut buf);
        let _ = drained_tx.send(());
        if !at_eof {
            while pipe.readable().await.is_ok() {
                match pipe.try_read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        }
    });
    drained_rx
}

/// Reads what is in the pipe right now (see [`spawn_reader`]): plain
/// non-blocking `read(2)` calls, not tokio's readiness cache, which may not
/// have seen the last write yet. Returns `true` at end-of-file.
fn drain_written(
    proc: &Process,
    stream: StreamKind,
    pipe: &tokio::net::unix::pipe::Receiver,
    buf: &mut [u8],
) -> bool {
    let mut budget = rustix::pipe::fcntl_getpipe_size(pipe).unwrap_or(1024 * 1024);
    while budget > 0 {
        match rustix::io::read(pipe, &mut *buf) {
            Ok(0) => return true,
            Ok(n) => {
                proc.push(stream, Bytes::copy_from_slice(&buf[..n]));
                budget = budget.saturating_sub(n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Reads bwrap's `--json-status-fd` first line: `{"child-pid": N, ...,
/// "pid-namespace": M}`, which bwrap writes as soon as the namespace
/// exists, before its init runs. Returns the tree and a pidfd of the init
/// (see [`init_pidfd`]). When bwrap fails before that (bad cwd, …) the
/// tree is the outer process alone, tracked as a group.
async fn namespace_tree(
    pipe: std::os::fd::OwnedFd,
    outer_pid: i32,
    marker: &str,
) -> (Tree, Option<OwnedFd>) {
    let fallback = || (Tree::group(outer_pid, marker), None);
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return fallback();
    };
    let mut reader = tokio::io::BufReader::new(rx);
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(n)) if n > 0) {
        return fallback();
    }
    // Keep reading: bwrap writes its exit status later and would die of
    // SIGPIPE if the pipe were closed.
    tokio::spawn(async move {
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut reader, &mut sink).await;
    });
    let v: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    match (v["child-pid"].as_i64(), v["pid-namespace"].as_u64()) {
        (Some(init), Some(ns)) => {
            let init_pid = init as i32;
            (Tree::Namespace { init_pid, ns }, init_pidfd(init_pid, ns))
        }
        _ => fallback(),
    }
}

/// A pidfd of the namespace's init, only if the process it pins is still
/// the init of namespace `ns` (checked after opening, so a reused pid is
/// never taken for it). `None` when the init is already gone (the watcher
/// then scans at once).
fn init_pidfd(init_pid: i32, ns: u64) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(init_pid)?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK).ok()?;
    (crate::trees::procfs::pid_namespace(init_pid) == Some(ns)).then_some(fd)
}

/// Builds the environment of a process: base, then the sandbox's declared
/// values, then per-process overrides (only for declared keys).
pub fn build_env(
    mode: &IsolationMode,
    root: &std::path::Path,
    declared: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, String> {
    if let Some(bad) = overrides.keys().find(|k| !declared.contains_key(*k)) {
        return Err(format!(
            "env key {bad:?} was not declared when the sandbox was created"
        ));
    }
    let mut env = isolation::base_env(mode, root);
    let mut merged = declared.clone();
    merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(merged);
    Ok(env)
}
