//! What the Daytona face knows beyond the shared sandbox core: each
//! sandbox's Daytona metadata and state, its toolbox sessions and their
//! commands.
//!
//! A Daytona sandbox is a [`crate::sandboxes::store::Sandbox`] (root directory,
//! processes, admission) registered in the same [`crate::sandboxes::store::Store`] as
//! the CreateOS face's sandboxes, so that shutdown, `Drop` and the request
//! record treat both faces alike; this registry adds the Daytona view. The
//! CreateOS face answers 404 for Daytona sandbox ids (and the other way
//! round).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde_json::Value;

use crate::sandboxes::store::Sandbox;
use crate::sandboxes::supervisor::Process;
use crate::storage::journal::ExitStatus;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sandbox states, named as the real API names them (`SandboxState`). The
/// local face produces `started`, `starting`, `stopping`, `stopped`,
/// `destroying` and `error`; the others exist in the real API only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Ready: toolbox calls run commands.
    Started,
    /// A start is under way.
    Starting,
    /// A stop is under way (its processes are being terminated).
    Stopping,
    /// Every process was terminated (verified); the files are kept.
    Stopped,
    /// A delete is under way.
    Destroying,
    /// A stop or delete could not verify that every process is gone.
    Error,
}

/// The creation request, echoed in every sandbox answer.
#[derive(Debug, Clone, Default)]
pub struct CreateSpec {
    /// `name` (defaults to the id).
    pub name: String,
    /// `snapshot` (echoed; the local sandbox always uses the host's system
    /// files).
    pub snapshot: Option<String>,
    /// `user` (echoed; commands run as uid 0 inside the sandbox).
    pub user: String,
    /// `env`: set for every command of the sandbox.
    pub env: BTreeMap<String, String>,
    /// `labels`.
    pub labels: BTreeMap<String, String>,
    /// `public`.
    pub public: bool,
    /// `target`.
    pub target: String,
    /// `cpu`, `gpu`, `memory` (GiB), `disk` (GiB): echoed, not enforced.
    pub resources: [f64; 4],
    /// `autoStopInterval`, `autoArchiveInterval`, `autoDeleteInterval`
    /// (minutes): echoed, no timer acts on them.
    pub intervals: [i64; 3],
    /// `class`.
    pub class: Option<String>,
    /// `buildInfo` as given.
    pub build_info: Option<Value>,
}

/// One Daytona sandbox.
#[derive(Debug)]
pub struct DaytonaSandbox {
    /// The shared core: root, processes, admission.
    pub core: Arc<Sandbox>,
    /// The creation request.
    pub spec: CreateSpec,
    state: Mutex<(State, Option<String>, String)>,
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    /// Serialises start, stop and delete of this sandbox.
    pub lifecycle: tokio::sync::Mutex<()>,
}

impl DaytonaSandbox {
    /// A started sandbox around `core`.
    pub fn new(core: Arc<Sandbox>, spec: CreateSpec) -> Self {
        let now = core.created_at.clone();
        Self {
            core,
            spec,
            state: Mutex::new((State::Started, None, now)),
            sessions: Mutex::new(BTreeMap::new()),
            lifecycle: tokio::sync::Mutex::new(()),
        }
    }

    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.core.id
    }

    /// Current state.
    pub fn state(&self) -> State {
        lock(&self.state).0
    }

    /// `(state, errorReason, updatedAt)`.
    pub fn state_detail(&self) -> (State, Option<String>, String) {
        lock(&self.state).clone()
    }

    /// Sets the state (and the error reason, cleared unless given).
    pub fn set_state(&self, state: State, error_reason: Option<String>) {
        *lock(&self.state) = (state, error_reason, crate::util::now_rfc3339());
    }

    /// A session by id.
    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.sessions).get(id).cloned()
    }

    /// Adds a session; `false` when the id is taken.
    pub fn add_session(&self, session: Arc<Session>) -> bool {
        let mut sessions = lock(&self.sessions);
        if sessions.contains_key(&session.id) {
            return false;
        }
        sessions.insert(session.id.clone(), session);
        true
    }

    /// Forgets a session.
    pub fn remove_session(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// Every session, by id.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        lock(&self.sessions).values().cloned().collect()
    }

    /// Forgets the commands whose process the finished-process retention
    /// dropped (`dropped`: process ids), and every session left spent by
    /// that: one that started commands and now has none (each finished,
    /// its tree verified gone, and was dropped). A spent session answers
    /// 404 from then on, as a deleted session does on the service; a
    /// session with a live process, or in which nothing ran yet, stays.
    /// Without this the component's one session per command piled up as
    /// empty records over a long lease.
    pub fn retire_commands(&self, dropped: &[String]) {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, session| {
            session.retain_commands(|c| !dropped.contains(&c.process.id));
            // A command start under way holds the gate: the session stays.
            let Ok(mut gate) = session.gate.try_lock() else {
                return true;
            };
            let spent = session.used.load(std::sync::atomic::Ordering::SeqCst)
                && lock(&session.commands).is_empty();
            if spent {
                // A request that already looked the session up gets 404.
                *gate = true;
            }
            !spent
        });
    }

    /// Forgets every session (after a verified stop: a stopped sandbox has
    /// no running toolbox, so its sessions are gone as on the real service).
    pub fn clear_sessions(&self) {
        lock(&self.sessions).clear();
    }
}

/// A toolbox session: a named group of commands. Deleting it terminates
/// every command it started.
#[derive(Debug)]
pub struct Session {
    /// The client-chosen `sessionId`.
    pub id: String,
    /// `true` once a delete began: no command is started after that. Held
    /// across a command's start so that a delete waits for it.
    pub gate: tokio::sync::Mutex<bool>,
    commands: Mutex<Vec<Arc<Command>>>,
    /// A command was started in it.
    used: std::sync::atomic::AtomicBool,
}

impl Session {
    /// An empty session.
    pub fn new(id: String) -> Self {
        Self {
            id,
            gate: tokio::sync::Mutex::new(false),
            commands: Mutex::new(Vec::new()),
            used: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Adds a command.
    pub fn add_command(&self, c: Arc<Command>) {
        self.used.store(true, std::sync::atomic::Ordering::SeqCst);
        lock(&self.commands).push(c);
    }

    /// A command by id.
    pub fn command(&self, id: &str) -> Option<Arc<Command>> {
        lock(&self.commands).iter().find(|c| c.id == id).cloned()
    }

    /// Every command, in the order they were started.
    pub fn commands(&self) -> Vec<Arc<Command>> {
        lock(&self.commands).clone()
    }

    /// Keeps only the commands for which `keep` holds (retention of
    /// finished commands, see [`crate::sandboxes::store::Sandbox::prune_finished`]).
    pub fn retain_commands(&self, keep: impl Fn(&Command) -> bool) {
        lock(&self.commands).retain(|c| keep(c));
    }
}

/// One command executed in a session.
#[derive(Debug)]
pub struct Command {
    /// `cmdId` (a UUID).
    pub id: String,
    /// The command text as given.
    pub command: String,
    /// The process running it (`shell -c command`).
    pub process: Arc<Process>,
}

impl Command {
    /// The exit code, once the command exited *and* its output was read to
    /// the end (the supervisor records the exit only after draining). A
    /// command killed by signal N reports `128 + N`, as a shell would.
    pub fn exit_code(&self) -> Option<i32> {
        self.process.exit().map(|e| exit_code(&e))
    }
}

/// How many times a termination is attempted before a tree is reported as
/// surviving. Each attempt signals what a fresh scan finds and verifies
/// with another fresh scan, so a retry only helps a tree that was slow to
/// go (a loaded host), never hides one that is still there.
const TERMINATION_ATTEMPTS: usize = 3;

/// Terminates `p`'s tree (SIGTERM, `grace`, SIGKILL, fresh scan), trying
/// again while it is not verified gone, up to [`TERMINATION_ATTEMPTS`].
pub async fn terminate_verified(
    p: &Process,
    grace: std::time::Duration,
) -> crate::sandboxes::supervisor::Termination {
    let mut t = p.terminate(grace).await;
    for _ in 1..TERMINATION_ATTEMPTS {
        if t.verified {
            break;
        }
        t = p.terminate(grace).await;
    }
    t
}

/// Maps an exit to a shell-style exit code.
pub fn exit_code(e: &ExitStatus) -> i32 {
    match e {
        ExitStatus::Code(c) => *c,
        ExitStatus::Signal(s) => {
            128 + crate::machine::isolation::signal_from_name(s).map_or(0, |s| s.as_raw())
        }
    }
}

/// Every Daytona sandbox of one server.
#[derive(Debug, Default)]
pub struct Registry {
    sandboxes: Mutex<HashMap<String, Arc<DaytonaSandbox>>>,
}

impl Registry {
    /// Adds a sandbox.
    pub fn insert(&self, sb: Arc<DaytonaSandbox>) {
        lock(&self.sandboxes).insert(sb.id().to_string(), sb);
    }

    /// Looks a sandbox up by id, then by name.
    pub fn get(&self, id_or_name: &str) -> Option<Arc<DaytonaSandbox>> {
        let all = lock(&self.sandboxes);
        all.get(id_or_name)
            .or_else(|| all.values().find(|s| s.spec.name == id_or_name))
            .cloned()
    }

    /// `true` when `id` is a Daytona sandbox.
    pub fn contains(&self, id: &str) -> bool {
        lock(&self.sandboxes).contains_key(id)
    }

    /// `true` when a sandbox already has this name.
    pub fn name_taken(&self, name: &str) -> bool {
        lock(&self.sandboxes)
            .values()
            .any(|s| s.spec.name == name || s.id() == name)
    }

    /// Removes a sandbox.
    pub fn remove(&self, id: &str) {
        lock(&self.sandboxes).remove(id);
    }

    /// Every sandbox.
    pub fn all(&self) -> Vec<Arc<DaytonaSandbox>> {
        lock(&self.sandboxes).values().cloned().collect()
    }
}
