//! One machine per sandbox (issue 25): every command of a sandbox joins
//! one long-lived set of namespaces, so a background server one command
//! leaves behind answers the next command on `localhost` and shows in its
//! `ps`.
//!
//! # Where it applies
//! Wherever user namespaces work, root or not (issue 37); which tree proof
//! a host gives is [`tree_proof_here`]:
//!
//! | host | tree proof | limits |
//! |---|---|---|
//! | root, cgroup v1 `pids` | a pids group per command ([`TreeProof::PidsGroup`]) | pids and memory groups, `RLIMIT_NPROC`, a range of ids per sandbox |
//! | a cgroup v2 group the server may write (delegated to an ordinary user, or root on a pure v2 host) | a group per command ([`TreeProof::DelegatedGroup`], see [`crate::trees::cgroup_v2`]) | `pids.max`, `memory.max`, `cpu.max` per sandbox where offered (each named enforced or not), `RLIMIT_NPROC` |
//! | anything else with user namespaces (an ordinary user) | an anchor per command ([`TreeProof::Anchor`], see [`crate::trees::anchor`]) | `RLIMIT_NPROC` per sandbox; memory NOT limited |
//! | user namespaces refused | none: every command keeps namespaces of its own (the fallback, named in the startup line with its fix, [`describe_model`]) | `RLIMIT_NPROC` |
//!
//! Without a uid per sandbox (not root) a sandbox's processes are those
//! of its machine's PID namespace and the namespaces nested in it
//! ([`processes_of`]): pause ([`Machines::freeze_sandbox`]) and the delete's proof
//! ([`Machines::take_ended`]) rest on that, never on the uid.
//!
//! # The machine
//! The sandbox's usual bwrap command line (user, PID, network, IPC, UTS
//! namespaces, its root, its uid, the sandbox's pids group) running a
//! holder (`sleep infinity`) under bwrap's init, which is PID 1 of the
//! machine. It starts with the first command and ends (SIGKILL to its
//! init: the kernel ends everything in its PID namespace) [`IDLE_GRACE`]
//! after the last command tree of the sandbox is verified gone, unless a
//! command joined meanwhile: a background process
//! keeps its command's tree, and so the machine, alive until the process
//! is deleted, the sandbox is deleted or the server shuts down. A delete,
//! a stop or a shutdown ends it at once ([`Machines::end_now`]) and proves it gone
//! before answering ([`crate::sandboxes::teardown`]). The SIGKILL goes through a
//! pidfd opened when the machine started, so it needs no new descriptor.
//! The death guard kills it if the server dies (and keeps watching a
//! machine whose SIGKILL could not be sent).
//!
//! # A command
//! A launcher forked by the server (run as the sandbox uid as root, as
//! the server's own uid otherwise: either owns the machine's user
//! namespace) joins the machine's namespaces and root, drops every
//! capability but the sandbox root's few and forks the command, exec'd
//! there with its own environment and nothing of the server's (see
//! [`mod@crate::machine::join`]: one step, no helper executable). Its tree:
//! - as root with a cgroup v1 `pids` hierarchy, the launcher first joins
//!   a pids group of its own, `sandbox-<uid>/cmd-<marker>`, and the tree
//!   is exactly that group's members. The sandbox uid cannot write the
//!   root-owned `cgroup.procs` and `tasks` files, so no process can leave
//!   it (`setsid`, double forks and nested namespaces stay in);
//!   terminating writes `pids.max` 0 (no more forks) and sends SIGKILL to
//!   every member until the kernel lists none, and `tree_exited: true` is
//!   that empty list;
//! - elsewhere the launcher forks an anchor in the machine that forks the
//!   command and proves its tree empty ([`crate::trees::anchor`]); a killed anchor
//!   leaves the tree unproven until the machine ends.
//!
//! # This folder
//! The machine and everything that confines a command: how commands are
//! confined ([`isolation`]: bubblewrap, or unconfined process groups only
//! when asked), bubblewrap's command line ([`bwrap_args`]), joining a
//! sandbox's machine in one step ([`mod@join`]), the terminals of
//! interactive processes ([`pty`]) and the thread that starts machines so
//! that they end with the server's process ([`lasting_spawner`]).
//!
//! Uses [`crate::network`] (a machine's egress proxy), [`crate::storage`]
//! (the root it mounts, the record of each tree it starts),
//! [`crate::trees`] (the ids, limits and proof of its trees) and
//! [`crate::util`]; never the sandbox core, the HTTP layer, the faces or
//! the server.

pub mod bwrap_args;
pub mod isolation;
pub mod join;
pub mod lasting_spawner;
pub mod pty;

use std::collections::HashMap;
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::machine::join::Door;
use crate::trees::deathguard::Guarded;
use crate::trees::procfs;
use std::sync::Arc;

struct Machine {
    init_pid: i32,
    ns: u64,
    leases: usize,
    /// Bumped by every join: an idle timer only ends the machine if no
    /// command joined since it was armed.
    generation: u64,
    /// The egress proxy serving this machine (see [`crate::network::egress`]).
    proxy: Option<tokio::task::JoinHandle<()>>,
    /// Its namespaces and root, for commands to join.
    door: Arc<Door>,
    /// A pidfd of its init, opened when it started: ending the machine
    /// needs no new descriptor (the engine may be out of them).
    pidfd: Option<std::os::fd::OwnedFd>,
    /// Set once its outer bwrap (the init's parent on the host) is reaped.
    outer_reaped: Arc<AtomicBool>,
}

impl Machine {
    fn alive(&self) -> bool {
        procfs::stat(self.init_pid).is_some_and(|p| !p.is_zombie())
            && procfs::pid_namespace(self.init_pid) == Some(self.ns)
    }

    fn kill(&self) {
        if let Some(p) = &self.proxy {
            p.abort();
        }
        match &self.pidfd {
            Some(fd) => {
                let sent = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
                // ESRCH: the init is gone already.
                if sent.is_ok() || !self.alive() {
                    crate::trees::deathguard::release(Guarded::Namespace {
                        init_pid: self.init_pid,
                        ns: self.ns,
                    });
                }
            }
            None => end(self.init_pid, self.ns),
        }
    }
}

/// Kills the machine whose init is `init_pid` in PID namespace `ns` (the
/// kernel ends everything in the namespace with it). The death guard
/// keeps watching it unless the SIGKILL went out or the init is gone: a
/// kill that failed (no descriptor for the pidfd) must not leave a
/// machine that nothing ends.
fn end(init_pid: i32, ns: u64) {
    let mut ended = true;
    if let Some(info) = procfs::stat(init_pid) {
        if procfs::pid_namespace(init_pid) == Some(ns) {
            ended =
                crate::trees::host_processes::signal_verified(&info, rustix::process::Signal::KILL);
        }
    }
    if ended {
        crate::trees::deathguard::release(Guarded::Namespace { init_pid, ns });
    }
}

/// What one server owns that its sandboxes' machines and commands use:
/// made by the composition root ([`crate::server`]), kept in the server's
/// state and handed down with each spawn ([`isolation::SpawnSpec`]). Two
/// servers in one process never share one.
#[derive(Debug, Clone, Default)]
pub struct ServerRegistries {
    /// The egress policies: the operator's ceiling and each sandbox's own
    /// list.
    pub egress: Arc<crate::network::egress::Policies>,
    /// The durable records the trees of its sandboxes are noted in, when
    /// it keeps them.
    pub records: Option<Arc<crate::storage::records::Records>>,
    /// The machines of its sandboxes (its start-up probe's included).
    pub machines: Arc<Machines>,
    /// Whether bubblewrap has confined a command for it yet.
    pub isolation: Arc<crate::machine::isolation::IsolationProof>,
}

/// The machines of one server's sandboxes: those running, by sandbox
/// root, and those ended and not yet proven gone. The server owns it
/// ([`ServerRegistries`]); a lease holds it until the lease is dropped.
#[derive(Default)]
pub struct Machines {
    running: Mutex<HashMap<PathBuf, Machine>>,
    /// Machines of each sandbox that were ended (SIGKILL sent) and not yet
    /// proven gone by the sandbox's delete or stop, as (init pid, PID
    /// namespace): where a sandbox's processes share the server's uid,
    /// its machines are what proves them gone, an idle one ended a moment
    /// before the delete included.
    ended: Mutex<Ended>,
}

impl std::fmt::Debug for Machines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never waits for the lock: a Debug print must not deadlock a
        // thread that holds it.
        let running = self
            .running
            .try_lock()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .ok();
        f.debug_struct("Machines")
            .field("running", &running)
            .finish_non_exhaustive()
    }
}

impl Machines {
    fn machines(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Machine>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A command's hold on its sandbox's machine: the machine ends when the
/// last lease is dropped.
#[derive(Debug)]
pub struct Lease {
    /// The machines of the server that started it.
    machines: Arc<Machines>,
    root: PathBuf,
    /// The host pid of the machine's init.
    init_pid: i32,
    /// The PID namespace of the machine leased: a lease of a machine
    /// that was ended (a stopped or deleted sandbox) never counts against
    /// a later machine of the same sandbox.
    ns: u64,
}

/// How long a machine without commands stays up for the next command
/// (starting one costs a bwrap run; back-to-back commands reuse it).
pub const IDLE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl Lease {
    /// The machine leased: its init's host pid and its PID namespace.
    pub fn machine(&self) -> (i32, u64) {
        (self.init_pid, self.ns)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut machines = self.machines.machines();
        let armed = match machines.get_mut(&self.root) {
            Some(m) if m.ns == self.ns => {
                m.leases = m.leases.saturating_sub(1);
                (m.leases == 0).then_some(m.generation)
            }
            _ => None,
        };
        drop(machines);
        let Some(generation) = armed else { return };
        let root = self.root.clone();
        let all = self.machines.clone();
        let end_if_idle = move || {
            let mut machines = all.machines();
            let idle = machines
                .get(&root)
                .is_some_and(|m| m.leases == 0 && m.generation == generation);
            if idle {
                if let Some(m) = machines.remove(&root) {
                    all.retire(&root, m);
                }
            }
        };
        let timer = std::thread::Builder::new()
            .name("createos-local-machine-idle".into())
            .spawn(move || {
                std::thread::sleep(IDLE_GRACE);
                end_if_idle();
            });
        if timer.is_err() {
            // No thread for the timer: end the machine now.
            let mut machines = self.machines.machines();
            if machines
                .get(&self.root)
                .is_some_and(|m| m.leases == 0 && m.generation == generation)
            {
                if let Some(m) = machines.remove(&self.root) {
                    self.machines.retire(&self.root, m);
                }
            }
        }
    }
}

/// Whether commands of the sandbox at `root` share a machine here (see the
/// module docs): as root, a sandbox with its own range of ids.
pub fn available(root: &Path) -> bool {
    enabled_here()
        && (!crate::trees::id_map::ranges_here()
            || crate::trees::host_processes::sandbox_uid(root).is_some())
}

/// How a command's tree is held, and proven gone, in a sandbox machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeProof {
    /// A cgroup v1 `pids` group per command, which no process can leave
    /// (a root server with a writable `pids` hierarchy).
    PidsGroup,
    /// A cgroup v2 group per command in the server's delegated group (the
    /// path), which no process of the sandbox can leave: killed with
    /// `cgroup.kill`, proven empty by `populated 0`, paused with
    /// `cgroup.freeze`.
    DelegatedGroup(PathBuf),
    /// A subreaper per command inside the machine ([`crate::trees::anchor`]): weaker, a
    /// sandbox process that kills it leaves its command's end unproven.
    Anchor,
}

impl TreeProof {
    /// The proof in words, for the startup line and `describe`.
    pub fn describe(&self) -> String {
        match self {
            TreeProof::PidsGroup => {
                "a cgroup v1 pids group per command (no process can leave it)".to_string()
            }
            TreeProof::DelegatedGroup(group) => format!(
                "cgroup v2 delegated: a group per command in {} (no process can leave it; \
                 the kernel kills the whole group, says when it is empty, and freezes it on \
                 pause)",
                group.display()
            ),
            TreeProof::Anchor => "a subreaper per command inside the machine (no cgroup this \
                 server can write: a command that kills it leaves its end unproven until the \
                 sandbox's delete; `systemd-run --user --scope -p Delegate=yes createos-local \
                 ...` gives the engine a cgroup v2 group of its own)"
                .to_string(),
        }
    }
}

/// The tree proof sandbox machines use on this host
/// ([`crate::trees::process_limits::TreeBackend::here`]); `None` when
/// commands get namespaces of their own (the fallback: user namespaces
/// are refused here, see [`user_namespaces_refused`]).
pub fn tree_proof_here() -> Option<TreeProof> {
    use crate::trees::process_limits::TreeBackend;
    // Process-wide: a fact of the host (its cgroups and namespaces), read once.
    static PROOF: OnceLock<Option<TreeProof>> = OnceLock::new();
    PROOF
        .get_or_init(|| {
            if user_namespaces_refused().is_some() {
                return None;
            }
            Some(match TreeBackend::here() {
                TreeBackend::CgroupV1Pids if crate::trees::id_map::ranges_here() => {
                    TreeProof::PidsGroup
                }
                TreeBackend::CgroupV2Delegated(d) => {
                    TreeProof::DelegatedGroup(d.group().to_path_buf())
                }
                _ => TreeProof::Anchor,
            })
        })
        .clone()
}

/// Whether bwrap sandboxes get one machine each on this host: wherever
/// user namespaces work, root or not ([`tree_proof_here`]).
pub fn enabled_here() -> bool {
    tree_proof_here().is_some()
}

/// The capabilities a sandbox's uid-0 command holds on this host:
/// [`join::SANDBOX_CAPABILITIES`] where commands join a machine
/// ([`enabled_here`]), none where each command has
/// namespaces of its own (bwrap drops them all).
pub fn capabilities_here() -> u64 {
    if enabled_here() {
        join::SANDBOX_CAPABILITIES
    } else {
        0
    }
}

/// Whether a server started here would give each sandbox a machine, as
/// far as can be told without touching the host (no cgroup is created):
/// root and a cgroup v1 `pids` hierarchy, or user namespaces that work.
/// For descriptions (`sandbox describe`); the server itself decides with
/// [`enabled_here`].
pub fn offered_here() -> bool {
    crate::trees::process_limits::pids_offered_here() || user_namespaces_refused().is_none()
}

/// The tree proof a server started here would use, as far as can be told
/// without touching the host (see [`offered_here`]).
pub fn tree_proof_offered_here() -> TreeProof {
    use crate::trees::process_limits::{Offered, TreeBackend};
    match TreeBackend::offered_here() {
        Offered::CgroupV1Pids => TreeProof::PidsGroup,
        Offered::CgroupV2Delegated(group) => TreeProof::DelegatedGroup(group),
        Offered::NoCgroup => TreeProof::Anchor,
    }
}

/// Runs `/bin/true` in a forked child that first unshares `flags`.
fn probe_unshare(flags: libc::c_int) -> std::io::Result<std::process::ExitStatus> {
    let mut probe = std::process::Command::new("/bin/true");
    probe
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: one system call in the forked child.
    unsafe {
        probe.pre_exec(move || {
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    probe.status()
}

/// The namespaces besides the user namespace that a sandbox has.
const OTHER_NAMESPACES: libc::c_int = libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNS;

/// Whether commands get their namespaces without a user namespace of
/// their own here: user namespaces are refused (the fallback), the server
/// is not the host's root, yet it may make PID, network, IPC, UTS and
/// mount namespaces: it is uid 0 of a user namespace that refuses nested
/// ones (a container with `user.max_user_namespaces` 0, a server under
/// `bwrap --disable-userns`). Its commands then run as its own uid with
/// no capability (see [`crate::machine::bwrap_args`]).
pub fn namespaces_without_user_here() -> bool {
    // Process-wide: a fact of the host and of this process's namespaces, probed once.
    static HERE: OnceLock<bool> = OnceLock::new();
    *HERE.get_or_init(|| {
        user_namespaces_refused().is_some()
            && !crate::trees::id_map::ranges_here()
            && probe_unshare(OTHER_NAMESPACES).is_ok_and(|s| s.success())
    })
}

/// Why this process cannot make the namespaces a machine needs (user,
/// PID, network, IPC, UTS, mount), with what fixes it; `None` when it
/// can. Tried once, in a forked child that makes them and exits.
pub fn user_namespaces_refused() -> Option<String> {
    // Process-wide: a fact of the host and of this process's namespaces, probed once.
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(
        || match probe_unshare(libc::CLONE_NEWUSER | OTHER_NAMESPACES) {
            Ok(s) if s.success() => None,
            Ok(s) => Some(format!("a probe in new namespaces ended with {s}")),
            Err(e) => Some(format!(
                "user namespaces are refused here ({e}): allow them (`sysctl -w \
                 user.max_user_namespaces=15000`; on Ubuntu 23.10 and later enable AppArmor's \
                 `bwrap-userns-restrict` profile or `sysctl -w \
                 kernel.apparmor_restrict_unprivileged_userns=0`)"
            )),
        },
    )
    .clone()
}

/// The model sandboxes get on this host, as one short name (what CI's
/// host kinds expect, `.ci/host-kinds.sh` and `.ci/host-kind-v2.sh`):
/// `machine+pids-group`, `machine+cgroup-v2`, `machine+anchor`, or
/// `per-command` (the fallback; with `+no-userns` where commands get no
/// user namespace of their own).
pub fn model_name() -> &'static str {
    match tree_proof_here() {
        Some(TreeProof::PidsGroup) => "machine+pids-group",
        Some(TreeProof::DelegatedGroup(_)) => "machine+cgroup-v2",
        Some(TreeProof::Anchor) => "machine+anchor",
        None if namespaces_without_user_here() => "per-command+no-userns",
        None => "per-command",
    }
}

/// The model sandboxes get on this host, in words, for the engine's
/// startup line and `sandbox describe`.
pub fn describe_model() -> String {
    match tree_proof_here() {
        Some(proof) => format!(
            "one machine per sandbox that every command joins; tree proof: {}",
            proof.describe()
        ),
        None => format!(
            "FALLBACK: namespaces per command, nothing a command leaves running reaches the \
             next command ({})",
            user_namespaces_refused().unwrap_or_else(|| "no tree proof here".to_string())
        ),
    }
}

/// How the ingress ([`crate::network::ingress`]) reaches the sandbox at
/// `root`: a socket made in its machine's network namespace, from the
/// machine running at that moment; an error saying so when none runs
/// (nothing can listen in a sandbox without one).
pub fn dial_into(machines: &Arc<Machines>, root: &Path) -> crate::network::ingress::Dial {
    let root = root.to_path_buf();
    let machines = machines.clone();
    std::sync::Arc::new(move || {
        let door = {
            let machines = machines.machines();
            machines
                .get(&root)
                .filter(|m| m.alive())
                .map(|m| m.door.clone())
        };
        match door {
            Some(door) => join::socket_in(&door),
            None => Err(std::io::Error::other(
                "the sandbox's machine is not running: no command holds it",
            )),
        }
    })
}

/// The way into the machine of the sandbox at `root` (started now if it
/// is not running) and a lease on it.
pub fn join(
    bwrap: &Path,
    root: &Path,
    registries: &ServerRegistries,
) -> std::io::Result<(Arc<Door>, Lease)> {
    let all = &registries.machines;
    let mut machines = all.machines();
    if let Some(m) = machines.get_mut(root) {
        if m.alive() {
            m.leases += 1;
            m.generation += 1;
            return Ok((
                m.door.clone(),
                Lease {
                    machines: all.clone(),
                    root: root.to_path_buf(),
                    init_pid: m.init_pid,
                    ns: m.ns,
                },
            ));
        }
        if let Some(m) = machines.remove(root) {
            all.retire(root, m);
        }
    }
    let (init_pid, ns, outer_reaped) = start(bwrap, root)?;
    crate::trees::deathguard::watch(Guarded::Namespace { init_pid, ns });
    if let Some(records) = &registries.records {
        records.note_tree(root, &Guarded::Namespace { init_pid, ns }, None);
    }
    let door = Door::open(init_pid);
    let door = match door {
        // Opened by pid: only valid if that pid is still the machine's init.
        Ok(d) if procfs::pid_namespace(init_pid) == Some(ns) => Arc::new(d),
        other => {
            let why = match other {
                Err(e) => e.to_string(),
                Ok(_) => "its init exited".to_string(),
            };
            end(init_pid, ns);
            return Err(std::io::Error::other(format!(
                "the sandbox's machine could not be entered: {why}"
            )));
        }
    };
    // Pins the init: the pid is checked to be the machine's after the
    // pidfd is open.
    let pidfd = rustix::process::Pid::from_raw(init_pid)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok())
        .filter(|_| procfs::pid_namespace(init_pid) == Some(ns));
    let mut machine = Machine {
        init_pid,
        ns,
        leases: 1,
        generation: 0,
        proxy: None,
        door: door.clone(),
        pidfd,
        outer_reaped,
    };
    if let Some(policy) = registries.egress.ceiling() {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let listener = crate::machine::join::listener_in(&door, crate::network::egress::PROXY_PORT);
        match listener.and_then(|l| {
            crate::network::egress::start_proxy(
                l,
                name,
                root.to_path_buf(),
                policy,
                registries.egress.clone(),
            )
        }) {
            Ok(task) => machine.proxy = Some(task),
            Err(e) => {
                machine.kill();
                return Err(std::io::Error::other(format!(
                    "the sandbox's egress proxy did not start: {e}"
                )));
            }
        }
    }
    machines.insert(root.to_path_buf(), machine);
    Ok((
        door,
        Lease {
            machines: all.clone(),
            root: root.to_path_buf(),
            init_pid,
            ns,
        },
    ))
}

impl Machines {
    /// Ends the machine of the sandbox at `root` now, whatever its leases:
    /// the sandbox is being deleted or stopped and every command tree of it
    /// was verified gone. SIGKILL to its init (the kernel ends its PID
    /// namespace). Returns the init's pid, for the caller's proof
    /// ([`crate::sandboxes::teardown`]); `None` when no machine was running.
    pub fn end_now(&self, root: &Path) -> Option<(i32, u64)> {
        let m = self.machines().remove(root)?;
        let ended = (m.init_pid, m.ns);
        self.retire(root, m);
        Some(ended)
    }
}

/// A machine that was ended (SIGKILL sent) and is still to be proven gone.
#[derive(Debug, Clone)]
pub struct EndedMachine {
    /// The host pid of its init.
    pub init_pid: i32,
    /// Its PID namespace.
    pub ns: u64,
    outer_reaped: Arc<AtomicBool>,
}

impl EndedMachine {
    /// Whether nothing of it runs: its init and every process of its
    /// namespace gone (a fresh scan), and its outer bwrap reaped.
    pub fn is_gone(&self) -> bool {
        self.outer_reaped.load(Ordering::Acquire)
            && crate::machine::isolation::Tree::Namespace {
                init_pid: self.init_pid,
                ns: self.ns,
            }
            .is_gone()
    }
}

/// Ended machines by sandbox root.
type Ended = HashMap<PathBuf, Vec<EndedMachine>>;

impl Machines {
    /// Ends machine `m` of the sandbox at `root` and notes it for the proof.
    fn retire(&self, root: &Path, m: Machine) {
        // A paused sandbox's machine is frozen in its cgroup v2 group: its
        // init dies of the SIGKILL, but its outer bwrap, frozen, would never
        // run to exit (and a machine is gone only once that is reaped). The
        // group is thawed first; the kill follows at once.
        crate::trees::process_limits::freeze_sandbox(root, false);
        m.kill();
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        // Those already gone need no proof any more.
        for list in ended.values_mut() {
            list.retain(|e| {
                !e.outer_reaped.load(Ordering::Acquire)
                    || procfs::stat(e.init_pid).is_some_and(|p| !p.is_zombie())
                        && procfs::pid_namespace(e.init_pid) == Some(e.ns)
            });
        }
        ended.retain(|_, list| !list.is_empty());
        ended
            .entry(root.to_path_buf())
            .or_default()
            .push(EndedMachine {
                init_pid: m.init_pid,
                ns: m.ns,
                outer_reaped: m.outer_reaped.clone(),
            });
    }

    /// The machines of the sandbox at `root` ended so far and not yet taken,
    /// each to be proven gone by the caller ([`EndedMachine::is_gone`]).
    pub fn take_ended(&self, root: &Path) -> Vec<EndedMachine> {
        self.ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(root)
            .unwrap_or_default()
    }
}

/// Every live process of the machine whose PID namespace is `ns`: its
/// members and, through parent pids, those of namespaces nested in it
/// (each nested namespace's init is a child of a member). The identity
/// of a sandbox's processes where they share the server's uid (a server
/// that is not root).
pub fn processes_of(ns: u64) -> Vec<crate::trees::procfs::ProcInfo> {
    let snap: Vec<_> = procfs::snapshot()
        .into_iter()
        .filter(|p| !p.is_zombie())
        .collect();
    let members = snap
        .iter()
        .filter(|p| procfs::pid_namespace(p.pid) == Some(ns))
        .map(|p| p.pid)
        .collect();
    procfs::descendants(snap, members, true)
}

impl Machines {
    /// The tasks (processes and threads) each running machine holds besides
    /// its init and holder, by sandbox root, where commands' trees are held
    /// by anchors (no pids group counts them): one `/proc` scan for every
    /// machine. Empty elsewhere (a pids group counts them, see
    /// [`crate::trees::budgets::sandbox_tasks`]). The anchors themselves are
    /// not counted (the server cannot read their namespace).
    pub fn anchored_tasks(&self) -> HashMap<PathBuf, usize> {
        if tree_proof_here() != Some(TreeProof::Anchor) {
            return HashMap::new();
        }
        let machines: HashMap<u64, PathBuf> = self
            .machines()
            .iter()
            .map(|(root, m)| (m.ns, root.clone()))
            .collect();
        if machines.is_empty() {
            return HashMap::new();
        }
        let mut tasks: HashMap<PathBuf, usize> = HashMap::new();
        for ns in machines.keys() {
            let threads: usize = processes_of(*ns)
                .iter()
                .map(|p| {
                    std::fs::read_dir(format!("/proc/{}/task", p.pid))
                        .map(|d| d.count())
                        .unwrap_or(1)
                })
                .sum();
            tasks.insert(machines[ns].clone(), threads.saturating_sub(2));
        }
        tasks
    }

    /// Stops or continues everything of the sandbox at `root` (a pause or a
    /// resume): every process of its own ids where it has them (a root
    /// server, [`crate::trees::host_processes::freeze_ids`]), else every
    /// process of its machine ([`Machines::freeze`]).
    pub fn freeze_sandbox(&self, root: &Path, stop: bool) {
        // cgroup v2: the kernel freezes the sandbox's whole group.
        if crate::trees::process_limits::freeze_sandbox(root, stop) {
            return;
        }
        match crate::trees::host_processes::sandbox_ids(root) {
            Some(ids) => {
                crate::trees::host_processes::freeze_ids(ids, stop);
            }
            None => self.freeze(root, stop),
        }
    }

    /// Stops (`SIGSTOP`) or continues every process of the sandbox at `root`'s
    /// running machine ([`processes_of`]); stopping repeats until every one
    /// found is stopped (bounded at 100 rounds). Nothing when no machine runs.
    pub fn freeze(&self, root: &Path, stop: bool) {
        let Some(ns) = self.machines().get(root).map(|m| m.ns) else {
            return;
        };
        use crate::trees::host_processes::signal_verified;
        if !stop {
            for p in processes_of(ns) {
                signal_verified(&p, rustix::process::Signal::CONT);
            }
            return;
        }
        for _ in 0..100 {
            let running: Vec<_> = processes_of(ns)
                .into_iter()
                .filter(|p| !matches!(p.state, 'T' | 't'))
                .collect();
            if running.is_empty() {
                return;
            }
            for p in &running {
                signal_verified(p, rustix::process::Signal::STOP);
            }
        }
    }

    /// The roots of the sandboxes whose machine runs.
    pub fn running(&self) -> Vec<PathBuf> {
        self.machines().keys().cloned().collect()
    }
}

/// Starts the machine's bwrap and reads its init's host pid and PID
/// namespace from `--json-status-fd`; the flag is set once the outer
/// bwrap is reaped.
fn start(bwrap: &Path, root: &Path) -> std::io::Result<(i32, u64, Arc<AtomicBool>)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let raw = write.as_raw_fd();
    // As root, the sandbox's whole range of ids is mapped by the server
    // once bwrap has made its user namespace; otherwise its slice of the
    // user's subordinate ids, by `newuidmap` and `newgidmap`, where it has
    // one (see [`crate::trees::id_map`]).
    let gate = crate::trees::id_map::gate_for(root)?;
    let gate_fds = gate.as_ref().map(|g| g.child_fds());
    let mut cmd = std::process::Command::new(bwrap);
    cmd.args(crate::machine::bwrap_args::machine_bwrap_args(root, raw))
        .args(gate.iter().flat_map(|g| g.bwrap_args()))
        .arg("--")
        .args(["/usr/bin/sleep", "infinity"])
        .current_dir("/")
        .env_clear()
        .envs(crate::machine::bwrap_args::launcher_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some((uid, gid)) = crate::trees::id_map::sandbox_owner(root) {
        cmd.uid(uid).gid(gid);
    }
    let groups = crate::trees::process_limits::SandboxGroups::of(
        root,
        crate::trees::host_processes::sandbox_uid(root),
    )
    .map_err(|e| {
        std::io::Error::other(format!(
            "the sandbox's machine did not start: its cgroup could not be made ({e})"
        ))
    })?;
    let groups_raw = groups.raw();
    let as_root = crate::trees::id_map::ranges_here();
    let server = rustix::process::getpid();
    // SAFETY: only async-signal-safe system calls (prctl, getppid, setsid,
    // close_range, fcntl, write, setrlimit) on descriptors this process
    // owns.
    unsafe {
        cmd.pre_exec(move || {
            // The outer bwrap ends with the thread that forks it (see
            // `lasting_spawner`), set here, after the change of uid that
            // would clear it; bwrap's own `--die-with-parent` comes only
            // after its user namespace is mapped. A server already gone
            // by now is not waited for.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            if rustix::process::getppid() != Some(server) {
                return Err(std::io::Error::other("the server ended"));
            }
            rustix::process::setsid()?;
            crate::trees::fds::mark_cloexec_from(3);
            for raw in std::iter::once(raw).chain(gate_fds.into_iter().flatten()) {
                let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            crate::trees::process_limits::join_groups(groups_raw)?;
            crate::trees::process_limits::first_for_the_oom_killer();
            // Not for a server that is not root: the limit in force when
            // a user namespace is made also caps, at the host's level,
            // the processes of the user that made it, all sandboxes
            // together; set inside the machine (by each launcher, after it
            // joined) it counts that sandbox's processes only (per user
            // namespace and uid since Linux 5.14).
            if as_root {
                crate::trees::process_limits::set_limits()?;
            }
            Ok(())
        });
    }
    // From the lasting thread: the parent-death signal set above and
    // `--die-with-parent` (see `machine_bwrap_args`) then end the machine
    // with this process.
    // Until its init runs, bwrap's inner process does not die with the
    // outer one: the death guard kills it by its root if this process
    // ends first (withdrawn on return, the machine running or not).
    let _starting = crate::trees::deathguard::kill_starting_on_death(root);
    let mut child = crate::machine::lasting_spawner::spawn(cmd)?;
    drop(write);
    drop(groups);
    if let Some(gate) = gate {
        if let Err(e) = gate.open() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "the sandbox's machine did not start: {e}"
            )));
        }
    }
    let mut line = String::new();
    let _ = std::io::BufReader::new(std::fs::File::from(read)).read_line(&mut line);
    let status: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
    let parsed = match (
        status["child-pid"].as_i64(),
        status["pid-namespace"].as_u64(),
    ) {
        (Some(pid), Some(ns)) => Some((pid as i32, ns)),
        _ => None,
    };
    let Some((init_pid, ns)) = parsed else {
        let _ = child.kill();
        let out = child.wait_with_output();
        let err = out
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_default();
        return Err(std::io::Error::other(format!(
            "the sandbox's machine did not start: {err}"
        )));
    };
    // bwrap writes the status as soon as the namespaces exist, before its
    // init has set up the root; the init forks the holder only after that
    // (a few milliseconds, looked for every 0.1 ms: every sandbox's first
    // command waits for it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while procfs::children(init_pid).is_some_and(|c| c.is_empty()) {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err(std::io::Error::other(
                "the sandbox's machine did not finish starting",
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    if procfs::pid_namespace(init_pid) != Some(ns) {
        return Err(std::io::Error::other(
            "the sandbox's machine exited at start",
        ));
    }
    // The outer bwrap lives as long as the machine; reap it then. A
    // machine is gone only once it is (a server that is not root has no
    // uid to find it by).
    drop(child.stderr.take());
    let outer_reaped = Arc::new(AtomicBool::new(false));
    let reaped = outer_reaped.clone();
    std::thread::Builder::new()
        .name("createos-local-machine".into())
        .spawn(move || {
            let _ = child.wait();
            reaped.store(true, Ordering::Release);
        })?;
    Ok((init_pid, ns, outer_reaped))
}
