//! The sandbox store: sandboxes, their status machine and their processes.
//!
//! Status transitions follow the spec's vocabulary. `POST /sandboxes` answers
//! `creating` and becomes `running` after the configured transition delay;
//! pause goes `pausing` → `paused` (every process tree of the sandbox is then
//! stopped with `SIGSTOP`), resume goes `resuming` → `running` (`SIGCONT`).
//! A pause or resume that does not start from `running` / `paused` is a 409
//! conflict. Delete is synchronous: the sandbox is `destroying` while its
//! process trees are terminated and its root is removed, and is gone (404)
//! afterwards.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::machine::isolation::IsolationMode;
use crate::sandboxes::supervisor::Process;

/// Sandbox status values from the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Being created.
    Creating,
    /// Ready for commands.
    Running,
    /// Pause accepted, not finished.
    Pausing,
    /// Processes stopped.
    Paused,
    /// Resume accepted, not finished.
    Resuming,
    /// Never produced by this server (no fork support).
    #[allow(dead_code)] // part of the spec's vocabulary
    Forking,
    /// Never produced by this server.
    Error,
    /// Delete in progress.
    Destroying,
    /// Deleted (only visible in the delete answer).
    Destroyed,
    /// Never produced by this server.
    #[allow(dead_code)] // part of the spec's vocabulary
    Failed,
}

/// The shapes of the spec's catalog (as of 2026-09).
pub const SHAPES: &[&str] = &[
    "s-1vcpu-256mb",
    "s-0.25vcpu-512mb",
    "s-0.5vcpu-1gb",
    "s-1vcpu-1gb",
    "s-1vcpu-2gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-8vcpu-8gb",
    "s-8vcpu-16gb",
];

/// What a client asked for when creating a sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// One of [`SHAPES`].
    pub shape: String,
    /// Echoed back; the local server always uses the host's system files.
    pub rootfs: Option<String>,
    /// Echoed back.
    pub region: Option<String>,
    /// Echoed back; there is no ingress locally.
    pub ingress_enabled: bool,
    /// Environment declared for the sandbox; processes may override only
    /// these keys.
    pub env: BTreeMap<String, String>,
}

/// One sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// `sb-<hex>`.
    pub id: String,
    /// The creation request.
    pub spec: SandboxSpec,
    /// The sandbox's root directory on the host.
    pub root: PathBuf,
    /// Creation time (RFC 3339).
    pub created_at: String,
    status: Mutex<(Status, u64)>,
    processes: Mutex<HashMap<String, Arc<Process>>>,
    /// Set once a delete (or shutdown) begins: no new process is admitted.
    closed: Mutex<bool>,
    /// Process creations admitted and not yet registered.
    starting: tokio::sync::watch::Sender<usize>,
    /// When each finished process (leader and tree gone) was first seen
    /// finished, for [`Sandbox::prune_finished`].
    finished_seen: Mutex<HashMap<String, Instant>>,
    /// The hard expiry asked at creation (seconds since the epoch): the
    /// engine deletes the sandbox, with proof, by then
    /// ([`crate::api::sandboxes::reap_expired`]).
    expires_at: std::sync::OnceLock<u64>,
    /// The idle window after which the engine pauses the sandbox
    /// (`auto_pause_after_seconds`), when one was asked.
    auto_pause: std::sync::OnceLock<Duration>,
    /// When the sandbox last had a command starting or running, or was
    /// made or resumed (see [`Sandbox::idle_for`]).
    last_active: Mutex<Instant>,
    /// The sandbox this one was forked from, if it was.
    pub forked_from: std::sync::OnceLock<String>,
}

/// How long and how many finished processes a sandbox keeps (their exit,
/// output journal and `/connect` replay), see [`Sandbox::prune_finished`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A finished process is dropped this long after it finished.
    pub ttl: Duration,
    /// At most this many finished processes are kept per sandbox (the most
    /// recently finished ones).
    pub keep: usize,
}

/// Default [`Retention::ttl`]: 60 s.
pub const DEFAULT_FINISHED_TTL: Duration = Duration::from_secs(60);

/// Default [`Retention::keep`]: 16 finished processes per sandbox.
pub const DEFAULT_FINISHED_KEEP: usize = 16;

impl Default for Retention {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_FINISHED_TTL,
            keep: DEFAULT_FINISHED_KEEP,
        }
    }
}

/// Permission to start one process in a sandbox, taken before the spawn
/// and held until the process is registered (or the start failed). A
/// delete waits for every outstanding admission before it looks at the
/// sandbox's processes, so no process can be started behind its back.
#[derive(Debug)]
pub struct Admission {
    sb: Arc<Sandbox>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.sb.starting.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sandbox {
    /// A new sandbox in state `creating`.
    pub fn new(id: String, spec: SandboxSpec, root: PathBuf) -> Self {
        Self {
            id,
            spec,
            root,
            created_at: crate::util::now_rfc3339(),
            expires_at: std::sync::OnceLock::new(),
            status: Mutex::new((Status::Creating, 0)),
            processes: Mutex::new(HashMap::new()),
            closed: Mutex::new(false),
            starting: tokio::sync::watch::channel(0).0,
            finished_seen: Mutex::new(HashMap::new()),
            auto_pause: std::sync::OnceLock::new(),
            last_active: Mutex::new(Instant::now()),
            forked_from: std::sync::OnceLock::new(),
        }
    }

    /// Sets the idle window after which the engine pauses the sandbox.
    pub fn set_auto_pause(&self, window: Duration) {
        let _ = self.auto_pause.set(window);
    }

    /// The idle window, when one was asked.
    pub fn auto_pause(&self) -> Option<Duration> {
        self.auto_pause.get().copied()
    }

    /// Marks the sandbox active now (a command starts, a resume ends).
    pub fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    /// How long the sandbox has been idle at `now`: no command starting,
    /// none whose process or tree still runs, for that long. `None` (and
    /// the sandbox marked active) while one does.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        let busy =
            *self.starting.borrow() > 0 || lock(&self.processes).values().any(|p| !p.exited().1);
        if busy {
            *lock(&self.last_active) = now;
            return None;
        }
        Some(now.saturating_duration_since(*lock(&self.last_active)))
    }

    /// Drops finished processes (leader exited and tree verified gone: the
    /// client has, or can no longer get, anything else from them) once
    /// they finished longer than `retention.ttl` ago, and beyond the
    /// `retention.keep` most recently finished. A dropped process answers
    /// 404 like any unknown one. Returns the ids dropped.
    pub fn prune_finished(&self, retention: Retention, now: Instant) -> Vec<String> {
        // (finished at, id) of every finished process.
        let finished: Vec<(String, String)> = lock(&self.processes)
            .values()
            .filter(|p| p.exited() == (true, true))
            .map(|p| (p.finished_at().unwrap_or_default(), p.id.clone()))
            .collect();
        let mut seen = lock(&self.finished_seen);
        seen.retain(|id, _| finished.iter().any(|(_, f)| f == id));
        for (_, id) in &finished {
            seen.entry(id.clone()).or_insert(now);
        }
        let mut by_age = finished;
        // Most recently finished first: the first `keep` young enough stay.
        by_age.sort_by(|a, b| b.cmp(a));
        let drop: Vec<String> = by_age
            .into_iter()
            .enumerate()
            .filter(|(i, (_, id))| {
                *i >= retention.keep
                    || seen
                        .get(id)
                        .is_some_and(|at| now.duration_since(*at) >= retention.ttl)
            })
            .map(|(_, (_, id))| id)
            .collect();
        if drop.is_empty() {
            return drop;
        }
        let mut processes = lock(&self.processes);
        for id in &drop {
            seen.remove(id);
            processes.remove(id);
        }
        drop
    }

    /// Admits one process start, or `None` once the sandbox is being
    /// deleted.
    pub fn admit(self: &Arc<Self>) -> Option<Admission> {
        let closed = lock(&self.closed);
        if *closed {
            return None;
        }
        self.starting.send_modify(|n| *n += 1);
        Some(Admission { sb: self.clone() })
    }

    /// Refuses further process starts and waits until every start already
    /// admitted has registered its process (or failed). After this,
    /// [`Sandbox::processes`] holds everything that will ever run here.
    pub async fn close(&self) {
        *lock(&self.closed) = true;
        let mut rx = self.starting.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Admits process starts again after [`Sandbox::close`] (a Daytona
    /// sandbox started after a verified stop).
    pub fn reopen(&self) {
        *lock(&self.closed) = false;
    }

    /// Current status.
    pub fn status(&self) -> Status {
        lock(&self.status).0
    }

    /// Moves from `from` to `to`; returns the transition's generation, or
    /// the current status on conflict.
    pub fn transition(&self, from: &[Status], to: Status) -> Result<u64, Status> {
        let mut s = lock(&self.status);
        if from.contains(&s.0) {
            s.0 = to;
            s.1 += 1;
            Ok(s.1)
        } else {
            Err(s.0)
        }
    }

    /// Finishes an asynchronous transition if nothing else happened since.
    pub fn complete(&self, generation: u64, to: Status) -> bool {
        let mut s = lock(&self.status);
        if s.1 == generation {
            s.0 = to;
            s.1 += 1;
            true
        } else {
            false
        }
    }

    /// Sets the status unconditionally.
    pub fn force(&self, to: Status) {
        let mut s = lock(&self.status);
        s.0 = to;
        s.1 += 1;
    }

    /// Registers a process.
    pub fn add_process(&self, p: Arc<Process>) {
        self.touch();
        lock(&self.processes).insert(p.id.clone(), p);
    }

    /// Looks a process up.
    pub fn process(&self, id: &str) -> Option<Arc<Process>> {
        lock(&self.processes).get(id).cloned()
    }

    /// Forgets a process (after a verified delete).
    pub fn remove_process(&self, id: &str) {
        lock(&self.processes).remove(id);
    }

    /// All processes.
    pub fn processes(&self) -> Vec<Arc<Process>> {
        lock(&self.processes).values().cloned().collect()
    }

    /// The `data` object of GET/POST answers.
    /// Gives the sandbox its hard expiry (once, at creation).
    pub fn set_expiry(&self, secs: u64) {
        let _ = self.expires_at.set(secs);
    }

    /// The hard expiry, if it has one (seconds since the epoch).
    pub fn expiry(&self) -> Option<u64> {
        self.expires_at.get().copied()
    }

    pub fn to_json(
        &self,
        mode: &IsolationMode,
        egress: &crate::network::egress::Policies,
    ) -> Value {
        json!({
            "id": self.id,
            "expires_at": self.expiry().map(|secs| crate::util::rfc3339(secs as i64)),
            "status": self.status(),
            "shape": self.spec.shape,
            "rootfs": self.spec.rootfs,
            "region": self.spec.region,
            "ingress_enabled": self.spec.ingress_enabled,
            "env_keys": self.spec.env.keys().collect::<Vec<_>>(),
            "egress": egress.sandbox(&self.root).map(|p| p.entries()),
            "local_egress": egress.describe_for(&self.root),
            "auto_pause_after_seconds": self.auto_pause().map(|d| d.as_secs()),
            "forked_from": self.forked_from.get(),
            "created_at": self.created_at,
            "local_isolation": mode.as_str(),
            "local_network": mode.network(),
            "local_limits": mode.limits(),
        })
    }
}

/// All sandboxes of one server.
#[derive(Debug, Default)]
pub struct Store {
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Roots of deleted sandboxes whose removal failed: removed again at
    /// shutdown.
    leftovers: Mutex<Vec<PathBuf>>,
    /// Removals of deleted sandboxes' roots under way (see
    /// [`crate::http::state::remove_root`]): `true` from a thread that succeeded.
    removals: Mutex<Vec<(PathBuf, std::thread::JoinHandle<bool>)>>,
    /// Held while a process start is counted against the budget and
    /// admitted, so that two starts cannot both take the last slot.
    admitting: Mutex<()>,
}

impl Store {
    /// Looks a sandbox up.
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        lock(&self.sandboxes).get(id).cloned()
    }

    /// Adds a sandbox unless `max` sandboxes exist already (then `Err`
    /// with their number): the check and the insertion are one step.
    pub fn insert_within(&self, sb: Arc<Sandbox>, max: usize) -> Result<(), usize> {
        let mut all = lock(&self.sandboxes);
        if all.len() >= max {
            return Err(all.len());
        }
        all.insert(sb.id.clone(), sb);
        Ok(())
    }

    /// How many sandboxes exist.
    pub fn len(&self) -> usize {
        lock(&self.sandboxes).len()
    }

    /// What the process budget counts, across every sandbox: managed
    /// processes whose tree is not yet verified gone (processes being
    /// started included) or, where the kernel counts them (see
    /// [`crate::trees::budgets::sandbox_tasks`]) or a machine's scan finds
    /// them ([`crate::machine::Machines::anchored_tasks`]), every task those
    /// processes started, whichever is more.
    /// Returns the count across every sandbox, and that of `sandbox`.
    pub fn live_processes(
        &self,
        sandbox: &str,
        machines: &crate::machine::Machines,
    ) -> (usize, usize) {
        let anchored = machines.anchored_tasks();
        let mut total = 0;
        let mut own = 0;
        for sb in self.all() {
            let starting = *sb.starting.borrow();
            let live = lock(&sb.processes)
                .values()
                .filter(|p| !p.exited().1)
                .count();
            let tasks = crate::trees::budgets::sandbox_tasks(&sb.root)
                .or_else(|| anchored.get(&sb.root).copied())
                .unwrap_or(0);
            let count = live.max(tasks) + starting;
            total += count;
            if sb.id == sandbox {
                own = count;
            }
        }
        (total, own)
    }

    /// Admits one process start in `sb` within the host-wide process
    /// budget: counting and admitting are one step (two starts at once
    /// cannot both take the last slot). `Ok(None)` when the sandbox is
    /// being deleted.
    pub fn admit_process(
        &self,
        sb: &Arc<Sandbox>,
        budgets: &crate::trees::budgets::Budgets,
        disk_budget: Option<&crate::storage::disk_budget::DiskBudget>,
        machines: &crate::machine::Machines,
    ) -> Result<Option<Admission>, crate::trees::budgets::Refusal> {
        crate::trees::budgets::admit_by_descriptors("process")?;
        if let Some(disk_budget) = disk_budget {
            disk_budget.admit(&sb.root)?;
        }
        let _one_at_a_time = lock(&self.admitting);
        let (live, own) = self.live_processes(&sb.id, machines);
        crate::trees::budgets::admit_process(budgets, live, own)?;
        Ok(sb.admit())
    }

    /// Removes a sandbox.
    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        lock(&self.sandboxes).remove(id)
    }

    /// All sandboxes.
    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        lock(&self.sandboxes).values().cloned().collect()
    }

    /// Marks the root of a deleted sandbox for removal at shutdown (its
    /// removal failed).
    pub fn leave(&self, root: PathBuf) {
        lock(&self.leftovers).push(root);
    }

    /// Applies `retention` to every sandbox (see
    /// [`Sandbox::prune_finished`]); returns the ids of the processes
    /// dropped, per sandbox id.
    pub fn prune_finished(&self, retention: Retention) -> Vec<(String, Vec<String>)> {
        let now = Instant::now();
        self.all()
            .into_iter()
            .map(|sb| (sb.id.clone(), sb.prune_finished(retention, now)))
            .filter(|(_, dropped)| !dropped.is_empty())
            .collect()
    }

    /// Records a removal under way.
    pub fn removing(&self, root: PathBuf, handle: std::thread::JoinHandle<bool>) {
        let mut removals = lock(&self.removals);
        removals.retain(|(_, h)| !h.is_finished());
        removals.push((root, handle));
    }

    /// Waits for every removal under way (blocking); the roots whose
    /// removal failed (or panicked) are marked by [`Store::leave`].
    pub fn finish_removals(&self) {
        let removals = std::mem::take(&mut *lock(&self.removals));
        for (root, handle) in removals {
            if !handle.join().unwrap_or(false) {
                self.leave(root);
            }
        }
    }

    /// The roots marked by [`Store::leave`], taken.
    pub fn take_leftovers(&self) -> Vec<PathBuf> {
        std::mem::take(&mut *lock(&self.leftovers))
    }
}

/// Runs an asynchronous transition: after `delay`, applies `effect` and
/// moves to `to` unless something else changed the status meanwhile.
pub fn finish_later(
    sb: Arc<Sandbox>,
    generation: u64,
    delay: Duration,
    to: Status,
    effect: impl FnOnce(&Sandbox) + Send + 'static,
) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        if sb.status() != Status::Destroying {
            effect(&sb);
            sb.complete(generation, to);
        }
    });
}
