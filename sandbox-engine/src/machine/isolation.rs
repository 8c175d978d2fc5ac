//! How commands are confined: bubblewrap with user, PID, network, IPC and
//! UTS namespaces, or (only as an explicit opt-in) unconfined process
//! groups.
//!
//! # `bwrap` mode
//! Each managed process (and each one-shot exec) runs as
//! `bwrap --unshare-user --uid 0 --unshare-pid --unshare-net ... --bind
//! <sandbox root> / --ro-bind /usr /usr ...`, started as the sandbox's own
//! unprivileged host uid when the server is root (see [`crate::storage::rootfs`]).
//! The command sees the sandbox root as `/`: its own `/tmp`,
//! `/paperclip-workspace`, `/root` and minimal `/etc`, with the host's
//! `/usr`, `/opt` (and the `/bin`, `/lib*`, `/sbin` links) read-only. It is
//! uid 0 without capabilities inside, an unprivileged uid outside; it has
//! only its own loopback network. bubblewrap's init is PID 1 of the new
//! namespace; the command is PID 2. `RLIMIT_NPROC` bounds forks; where the
//! host has a memory controller, the sandbox's memory group bounds the
//! memory it uses (never the address space it reserves, see
//! [`crate::trees::process_limits`]).
//!
//! The *leader* is the command; bwrap's outer process exits with the
//! leader's status, which bwrap folds into `128 + N` for a signal (see
//! the supervisor module for how that is reported). The *tree* is every
//! process in the PID namespace; processes cannot leave a PID namespace, so
//! `setsid`, double forks and daemons stay visible. When the namespace's init
//! is killed the kernel kills everything left in it, which makes the final
//! SIGKILL and its verification (a fresh `/proc` scan finding nothing in the
//! namespace) reliable.
//!
//! # One machine per sandbox
//! Where the host allows it (a root server with a writable cgroup v1 `pids`
//! hierarchy), commands do not get namespaces of their own:
//! they join their sandbox's long-lived machine, and a command's tree is
//! its own pids group ([`Tree::Cgroup`]); see [`crate::machine`]. The
//! namespace tree described above applies elsewhere.
//!
//! # `process-group` mode: no isolation
//! Only when asked for ([`IsolationPreference::ProcessGroup`], or `Auto`
//! with `allow_unconfined` where bwrap cannot run). The command runs
//! directly on the host in a new session (`setsid`), **not** confined:
//! absolute paths such as `/tmp` or `/paperclip-workspace` refer to the
//! host's file system. The server does not rewrite command lines. It only
//! maps the requested `cwd` to the same path under the sandbox root
//! (`<root>/paperclip-workspace` for `/paperclip-workspace`), and exports
//! `CREATEOS_LOCAL_ISOLATION=process-group` and `CREATEOS_LOCAL_ROOT=<root>`
//! so that scripts can tell. The mode is logged at start-up, exposed by
//! [`crate::RunningServer::isolation`], `GET /_admin/info` and in every
//! sandbox as `local_isolation`.
//!
//! The tree is found by a fresh `/proc` scan of: the leader's session and
//! process group, descendants of every process seen in the tree before
//! (`pid` + start time, so reused pids are not mistaken), and processes
//! whose initial environment carries the per-process marker variable. A
//! process that calls `setsid`, clears its environment *and* is reparented
//! before any scan saw it cannot be found: in this mode `tree_exited: true`
//! means "no member could be found", which is weaker than in `bwrap` mode.

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use rustix::process::Signal;
use serde::Serialize;

use crate::machine::bwrap_args::{bwrap_args, launcher_env};
use crate::trees::fds::mark_cloexec_from;
use crate::trees::host_processes::{sandbox_uid, signal_verified, MARKER_VAR};
use crate::trees::process_limits::{join_groups, set_limits, CommandGroup, SandboxGroups};
use crate::trees::procfs::{self, ProcInfo};
use crate::util::find_in_path;

/// Which isolation the server uses for every command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// bubblewrap with a PID namespace per process.
    Bwrap,
    /// Unconfined process groups (see the module docs for what that means).
    ProcessGroup,
}

impl IsolationMode {
    /// Stable name used in logs and JSON: `bwrap` or `process-group`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Bwrap => "bwrap",
            Self::ProcessGroup => "process-group",
        }
    }
}

impl IsolationMode {
    /// The network a command gets: `none` (bwrap: a network namespace with
    /// only its own loopback interface, so no host port is reachable and
    /// there is no outbound network) or `host` (process groups: the host's
    /// network, unconfined).
    pub fn network(&self) -> &'static str {
        match self {
            Self::Bwrap => "none",
            Self::ProcessGroup => "host",
        }
    }

    /// How resources are bounded: `prlimit` (bwrap: `RLIMIT_NPROC`
    /// [`crate::trees::process_limits::MAX_PROCESSES`] for the sandbox uid; memory
    /// by the sandbox's memory group where the host has one, see
    /// [`crate::trees::process_limits::memory_cgroup_base`]) or `none`.
    pub fn limits(&self) -> &'static str {
        match self {
            Self::Bwrap => "prlimit",
            Self::ProcessGroup => "none",
        }
    }
}

impl fmt::Display for IsolationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the embedding host asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationPreference {
    /// bwrap when it works here; otherwise the server refuses to start
    /// (with [`INSTALL_HINT`]) unless
    /// [`crate::ServerBuilder::allow_unconfined`] allows the process-group
    /// fallback.
    #[default]
    Auto,
    /// bwrap or fail to start.
    RequireBwrap,
    /// Unconfined process groups: **no isolation**, an explicit opt-in.
    ProcessGroup,
}

/// What to do when commands cannot be confined here.
pub const INSTALL_HINT: &str = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), \
     or opt in to running commands with NO isolation (--isolation process-group)";

/// Why commands cannot be confined here (`why`: bubblewrap's failure), with
/// the fix: the same words whether the server refuses to start (its probe
/// failed) or refuses a sandbox's first command (see [`IsolationProof`]).
pub fn cannot_confine(why: &str) -> String {
    // bwrap is there but may not make namespaces: the fix is the host's,
    // not an install.
    let hint = match (
        find_in_path("bwrap"),
        crate::machine::user_namespaces_refused(),
    ) {
        (Some(_), Some(why)) => format!(
            "{why}; or opt in to running commands with NO isolation \
             (--isolation process-group)"
        ),
        _ => INSTALL_HINT.to_string(),
    };
    format!("commands cannot be confined here: {why}; {hint}")
}

/// Whether bubblewrap has confined a command for one server yet: its
/// start-up probe ([`probe_bwrap`]) proves it, or, for a server started
/// without one ([`crate::ServerBuilder::prove_isolation_at_start`]), the
/// first launcher that made its namespaces. Until then a launcher that
/// fails is reported as [`cannot_confine`] (and kept, for an embedder to
/// show), not as a passing failure to retry. Nothing runs unconfined either
/// way: in bwrap mode every command goes through bubblewrap, and one that
/// cannot start never runs.
#[derive(Debug, Default)]
pub struct IsolationProof {
    proven: std::sync::atomic::AtomicBool,
    refused: std::sync::Mutex<Option<String>>,
}

impl IsolationProof {
    /// Whether a command has been confined.
    pub fn is_proven(&self) -> bool {
        self.proven.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Notes that bubblewrap made a command's namespaces.
    pub fn note(&self) {
        self.proven
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// A launcher failed before any command was confined: the refusal
    /// ([`cannot_confine`] of bubblewrap's words), kept and returned.
    pub fn refuse(&self, why: &str) -> String {
        let text = cannot_confine(why);
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(text.clone());
        text
    }

    /// The refusal of the first command, when bubblewrap could not confine
    /// it and none was confined before.
    pub fn refused(&self) -> Option<String> {
        if self.is_proven() {
            return None;
        }
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub use crate::storage::rootfs::prepare_root;

/// Everything needed to start one command.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The sandbox root on the host.
    pub root: PathBuf,
    /// Program (resolved through `PATH` inside the sandbox).
    pub cmd: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory as the sandbox sees it (absolute).
    pub cwd: String,
    /// In fallback mode: the host directory that `cwd` maps to.
    pub host_cwd: PathBuf,
    /// The complete environment (the server's own is never inherited).
    pub env: Vec<(String, String)>,
    /// Value of [`MARKER_VAR`] for this process.
    pub marker: String,
    /// A terminal of this size instead of pipes (see [`crate::machine::pty`]).
    pub terminal: Option<crate::machine::pty::Winsize>,
    /// What the server that starts it owns: its machines' egress
    /// policies.
    pub registries: crate::machine::ServerRegistries,
}

/// A spawned command before its tree identity is known.
pub struct Spawned {
    /// The direct child (bwrap's outer process, or the command itself).
    pub child: tokio::process::Child,
    /// bwrap's `--json-status-fd` read end (bwrap mode only).
    pub status_pipe: Option<OwnedFd>,
    /// In a sandbox machine (see [`crate::machine`]): what holds the
    /// command's tree and its lease on the machine.
    pub machine: Option<(Holder, crate::machine::Lease)>,
    /// The master of the command's terminal (a `terminal` spawn); the
    /// child's stdio pipes are then absent.
    pub terminal: Option<OwnedFd>,
}

/// What holds a machine command's tree (see [`crate::machine::TreeProof`]).
#[derive(Debug)]
pub enum Holder {
    /// Its own group (cgroup v1 pids or cgroup v2).
    Group(CommandGroup),
    /// An anchor in the machine, and the server's end of its proof pipe.
    Anchor(crate::trees::anchor::Proof),
}

/// The minimal environment every command starts from.
pub fn base_env(mode: &IsolationMode, root: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
        ("HOME".to_string(), "/root".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        (
            "CREATEOS_LOCAL_ISOLATION".to_string(),
            mode.as_str().to_string(),
        ),
    ];
    if *mode == IsolationMode::ProcessGroup {
        env.push((
            "CREATEOS_LOCAL_ROOT".to_string(),
            root.display().to_string(),
        ));
        env.retain(|(k, _)| k != "HOME");
        env.push(("HOME".to_string(), root.join("root").display().to_string()));
    }
    env
}

/// Starts the command with piped stdio in a new session.
///
/// Whatever the mode, the command starts with exactly descriptors 0, 1 and
/// 2: every other descriptor of the server (inherited from whoever started
/// it, or opened without close-on-exec by a library) is marked close-on-exec
/// in the child before `exec` (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`);
/// in bwrap mode only bwrap's status pipe is let through, and bwrap does
/// not hand it to the command.
///
/// Nothing outlives the server: the supervisor announces every tree to the
/// [`crate::trees::deathguard`], and in fallback mode the leader also gets
/// `PR_SET_PDEATHSIG(SIGKILL)`.
pub fn spawn(bwrap: Option<&Path>, spec: &SpawnSpec) -> std::io::Result<Spawned> {
    if let Some(bwrap) = bwrap {
        if crate::machine::available(&spec.root) {
            return spawn_in_machine(bwrap, spec);
        }
        if spec.terminal.is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                crate::machine::pty::NO_MACHINE,
            ));
        }
    }
    let mut env_memfd = None;
    // As root, the sandbox's whole range of ids is mapped by the server
    // once bwrap has made the user namespace (see [`crate::trees::id_map`]).
    let gate = match bwrap {
        Some(_) => crate::trees::host_processes::sandbox_ids(&spec.root)
            .map(crate::trees::id_map::MapGate::new)
            .transpose()?,
        None => None,
    };
    let gate_fds = gate.as_ref().map(|g| g.child_fds());
    let (mut cmd, status_pipe, status_raw) = match bwrap {
        Some(bwrap) => {
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            let raw = write.as_raw_fd();
            // The command's environment travels to bwrap in a memfd
            // (`--args FD`), never on bwrap's own environment or command
            // line: see [`launcher_env`].
            let envfd = env_args_memfd(spec)?;
            let mut cmd = std::process::Command::new(bwrap);
            cmd.arg("--args").arg(envfd.as_raw_fd().to_string());
            configure_bwrap(&mut cmd, spec, Some(raw), gate.as_ref());
            cmd.env_clear().envs(launcher_env());
            env_memfd = Some(envfd);
            (cmd, Some((read, write)), Some(raw))
        }
        None => {
            let mut cmd = std::process::Command::new(&spec.cmd);
            cmd.args(&spec.args).current_dir(&spec.host_cwd);
            cmd.env_clear();
            for (k, v) in &spec.env {
                cmd.env(k, v);
            }
            (cmd, None, None)
        }
    };
    cmd.env(MARKER_VAR, &spec.marker);
    let env_raw = env_memfd.as_ref().map(|fd| fd.as_raw_fd());
    let groups = SandboxGroups::v1_of(bwrap.and_then(|_| sandbox_uid(&spec.root)));
    let groups_raw = groups.raw();
    // Unconfined (bwrap commands without a machine have none): a terminal
    // of the host's, which the command makes its controlling terminal.
    let terminal = match spec.terminal {
        Some(size) => {
            let (master, slave) = crate::machine::pty::open_here(size)?;
            cmd.stdin(slave.try_clone()?)
                .stdout(slave.try_clone()?)
                .stderr(slave);
            Some(master)
        }
        None => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
    };
    let controlling_terminal = terminal.is_some();
    let confined = bwrap.is_some();
    let server_pid = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (setsid, close_range, fcntl, write,
    // setrlimit, prctl, getppid) on memory it owns; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid()?;
            if controlling_terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            mark_cloexec_from(3);
            // Let exactly this child (bwrap) inherit the status pipe and
            // the environment memfd (bwrap closes the latter once read).
            let gated = gate_fds.into_iter().flatten();
            for raw in [status_raw, env_raw].into_iter().flatten().chain(gated) {
                let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            // Join the sandbox's pids and memory groups.
            join_groups(groups_raw)?;
            crate::trees::process_limits::first_for_the_oom_killer();
            if confined {
                set_limits()?;
            } else {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                // The server may have died between fork and prctl.
                if rustix::process::getppid() != Some(server_pid) {
                    return Err(std::io::Error::other("the server exited"));
                }
            }
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(false)
        .spawn()?;
    drop(env_memfd);
    drop(groups);
    if let Some(gate) = gate {
        if let Err(e) = gate.open() {
            let _ = child.start_kill();
            return Err(e);
        }
    }
    // The write end must close in the parent, or the pipe never ends.
    let status_pipe = status_pipe.map(|(read, write)| {
        drop(write);
        read
    });
    Ok(Spawned {
        child,
        status_pipe,
        machine: None,
        terminal,
    })
}

/// Starts a command in its sandbox's machine (see [`crate::machine`]), in
/// a pids group of its own or under an anchor ([`crate::machine::TreeProof`]).
fn spawn_in_machine(bwrap: &Path, spec: &SpawnSpec) -> std::io::Result<Spawned> {
    let uid = sandbox_uid(&spec.root);
    let (door, lease) = crate::machine::join(bwrap, &spec.root, &spec.registries)?;
    let group = CommandGroup::create(&spec.root, uid, &spec.marker).transpose()?;
    let (command_group, group) = match group {
        Some((g, file)) => (Some(g), Some(file)),
        None => (None, None),
    };
    let forget_group = || {
        if let Some(g) = &command_group {
            g.forget();
        }
    };
    // The proof pipe of an anchored command: the launcher and the anchor
    // write, the server reads.
    let proof = match group {
        Some(_) => None,
        None => Some(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?),
    };
    // Egress proxy variables first: the sandbox's own env may override.
    let mut env = match spec.registries.egress.ceiling() {
        Some(_) => crate::network::egress::proxy_env(),
        None => Vec::new(),
    };
    env.extend(spec.env.iter().cloned());
    env.push((MARKER_VAR.to_string(), spec.marker.clone()));
    if let Some((k, _)) = env
        .iter()
        .find(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
    {
        forget_group();
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid environment variable name {k:?}"),
        ));
    }
    let sockets = match spec
        .terminal
        .map(|_| crate::machine::pty::socket_pair())
        .transpose()
    {
        Ok(s) => s,
        Err(e) => {
            forget_group();
            return Err(e);
        }
    };
    let memory = uid.and_then(crate::trees::process_limits::memory_cgroup_tasks);
    let holder = match (&group, &proof) {
        (Some(procs), _) => crate::machine::join::Holder::Group(procs),
        (None, Some((_, write))) => crate::machine::join::Holder::Anchor(write.as_raw_fd()),
        (None, None) => unreachable!("a command holds its tree by a group or an anchor"),
    };
    let launcher = match (spec.terminal, &sockets) {
        (Some(size), Some((_, theirs))) => crate::machine::join::command_in_terminal(
            &door,
            holder,
            memory.as_ref(),
            &spec.cwd,
            &env,
            &spec.cmd,
            &spec.args,
            size,
            theirs.as_raw_fd(),
        ),
        _ => crate::machine::join::command(
            &door,
            holder,
            memory.as_ref(),
            &spec.cwd,
            &env,
            &spec.cmd,
            &spec.args,
        ),
    };
    let mut cmd = match launcher {
        Ok(c) => c,
        Err(e) => {
            forget_group();
            return Err(e);
        }
    };
    if let Some((uid, gid)) = crate::trees::id_map::sandbox_owner(&spec.root) {
        cmd.uid(uid).gid(gid);
    }
    if sockets.is_some() {
        // The command's stdio is its terminal; the launcher's is nothing.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    } else {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    let spawned = tokio::process::Command::from(cmd)
        .kill_on_drop(false)
        .spawn();
    drop(group);
    drop(memory);
    drop(door);
    // Only the launcher and the anchor hold the write end now.
    let proof = proof.map(|(read, write)| {
        drop(write);
        read
    });
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            forget_group();
            return Err(e);
        }
    };
    // The spawn returned once the launcher had forked the command, after
    // it sent the master: it is queued on the socket. (Should it not
    // arrive, the supervisor ends the tree: see `Process::start`.)
    let terminal = sockets.and_then(|(ours, _)| crate::machine::pty::recv_fd(ours.as_fd()).ok());
    let holder = match (command_group, proof) {
        (Some(g), _) => Holder::Group(g),
        (None, Some(read)) => Holder::Anchor(crate::trees::anchor::Proof::new(
            read,
            lease.machine(),
            format!("{MARKER_VAR}={}", spec.marker).into_bytes(),
        )),
        (None, None) => unreachable!("a command holds its tree by a group or an anchor"),
    };
    Ok(Spawned {
        child,
        status_pipe: None,
        machine: Some((holder, lease)),
        terminal,
    })
}

/// The bwrap invocation of `spec`: bwrap's arguments, the command, `/` as
/// the working directory and, when the server is root, the sandbox's own
/// uid and gid (bwrap itself runs unprivileged: the sandbox's uid 0 maps to
/// that uid, never to the host's root). `status_fd` adds
/// `--json-status-fd`.
fn bwrap_command(bwrap: &Path, spec: &SpawnSpec, status_fd: Option<i32>) -> std::process::Command {
    let mut cmd = std::process::Command::new(bwrap);
    configure_bwrap(&mut cmd, spec, status_fd, None);
    cmd
}

/// Adds bwrap's arguments, the command, the working directory and the
/// sandbox's uid and gid to `cmd` (see [`bwrap_command`]).
fn configure_bwrap(
    cmd: &mut std::process::Command,
    spec: &SpawnSpec,
    status_fd: Option<i32>,
    gate: Option<&crate::trees::id_map::MapGate>,
) {
    cmd.args(bwrap_args(&spec.root, &spec.cwd, status_fd));
    cmd.args(gate.iter().flat_map(|g| g.bwrap_args()));
    cmd.arg("--").arg(&spec.cmd).args(&spec.args);
    cmd.current_dir("/");
    if let Some((uid, gid)) = crate::trees::id_map::sandbox_owner(&spec.root) {
        cmd.uid(uid).gid(gid);
    }
}

/// A memfd (positioned at its start) holding bwrap's NUL-separated
/// `--clearenv --setenv K V …` arguments for `spec`'s environment and
/// marker.
fn env_args_memfd(spec: &SpawnSpec) -> std::io::Result<OwnedFd> {
    let mut data: Vec<u8> = b"--clearenv\0".to_vec();
    let marker = (MARKER_VAR.to_string(), spec.marker.clone());
    for (k, v) in spec.env.iter().chain(std::iter::once(&marker)) {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid environment variable name {k:?}"),
            ));
        }
        for part in ["--setenv", k.as_str(), v.as_str()] {
            data.extend_from_slice(part.as_bytes());
            data.push(0);
        }
    }
    let fd = rustix::fs::memfd_create("createos-local-env", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut written = 0;
    while written < data.len() {
        written += rustix::io::write(&fd, &data[written..])?;
    }
    rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0))?;
    Ok(fd)
}

/// The same bwrap command line the server runs for `cmd args` in the
/// sandbox whose root is `root` (same namespaces, mounts, uid and working
/// directory `/`), without the status pipe, the supervision and the
/// resource limits: the baseline the spawn benchmark compares
/// `POST /processes` with. Its environment is the server's base
/// environment; stdio is inherited unless the caller sets it.
pub fn bare_bwrap_command(
    bwrap: &Path,
    root: &Path,
    cmd: &str,
    args: &[&str],
) -> std::process::Command {
    let spec = SpawnSpec {
        root: root.to_path_buf(),
        cmd: cmd.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: "/".to_string(),
        host_cwd: root.to_path_buf(),
        env: base_env(&IsolationMode::Bwrap, root),
        marker: String::new(),
        terminal: None,
        registries: crate::machine::ServerRegistries::default(),
    };
    let mut command = bwrap_command(bwrap, &spec, None);
    command.env_clear().envs(spec.env);
    command
}

/// Runs a trivial command under bwrap to see whether namespaces work here.
/// Returns the bwrap path on success, or a reason on failure.
pub async fn probe_bwrap(
    probe_root: &Path,
    registries: &crate::machine::ServerRegistries,
) -> Result<PathBuf, BwrapUnusable> {
    let bwrap = find_in_path("bwrap").ok_or(BwrapUnusable::NotFound)?;
    prepare_root(probe_root).map_err(|source| BwrapUnusable::ProbeRoot {
        root: probe_root.to_path_buf(),
        source,
    })?;
    let spec = SpawnSpec {
        root: probe_root.to_path_buf(),
        cmd: "/bin/sh".to_string(),
        args: vec!["-c".to_string(), "test -d /paperclip-workspace".to_string()],
        cwd: "/".to_string(),
        host_cwd: probe_root.to_path_buf(),
        env: base_env(&IsolationMode::Bwrap, probe_root),
        marker: "probe".to_string(),
        terminal: None,
        registries: registries.clone(),
    };
    let mut spawned = spawn(Some(&bwrap), &spec).map_err(|source| BwrapUnusable::NotRun {
        bwrap: bwrap.clone(),
        source,
    })?;
    // A machine command's group goes once the probe is done (the lease
    // with it, ending the probe's machine after its idle grace).
    let machine = spawned.machine.take();
    // bwrap must be able to write its status (a closed pipe kills it with
    // SIGPIPE before it lets the sandbox run).
    if let Some(pipe) = spawned.status_pipe {
        drain_pipe(pipe);
    }
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        spawned.child.wait_with_output(),
    )
    .await
    .map_err(|_| BwrapUnusable::TimedOut)?
    .map_err(BwrapUnusable::NotWaited)?;
    // Each wait below polls with pauses from 0.2 ms up to 10 ms: the
    // probe is on the start path of every `sandbox run`.
    let until = |seconds| std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let pauses = || crate::util::Backoff::up_to(std::time::Duration::from_millis(10));
    match machine {
        Some((Holder::Group(group), lease)) => {
            // The group empties as the command's last process exits.
            let (deadline, mut pause) = (until(1), pauses());
            while !group.is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(pause.next_pause()).await;
            }
            group.remove_soon(lease);
        }
        Some((Holder::Anchor(mut proof), lease)) => {
            // The anchor says so once the command's last process is reaped.
            let (deadline, mut pause) = (until(1), pauses());
            while !proof.is_gone() && std::time::Instant::now() < deadline {
                tokio::time::sleep(pause.next_pause()).await;
            }
            drop(lease);
        }
        None => {}
    }
    // The probe's machine ends now, not after the idle grace: nothing
    // records a probe, so an engine killed in those seconds would leave
    // its machine running for good.
    if registries.machines.end_now(probe_root).is_some() {
        let ended = registries.machines.take_ended(probe_root);
        let (deadline, mut pause) = (until(2), pauses());
        while !ended.iter().all(|m| m.is_gone()) && std::time::Instant::now() < deadline {
            tokio::time::sleep(pause.next_pause()).await;
        }
    }
    // Its groups go with it, as a deleted sandbox's do: every server start
    // left one empty cgroup v1 pids group behind (a group of a live
    // process is not removed).
    crate::trees::process_limits::remove_sandbox_groups_at(
        probe_root,
        crate::trees::host_processes::sandbox_ids(probe_root).map(|ids| ids.first),
    );
    if out.status.success() {
        Ok(bwrap)
    } else {
        Err(BwrapUnusable::Failed {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Why bubblewrap cannot isolate commands here (see [`probe_bwrap`]):
/// the server then runs them as plain process groups only when the
/// operator opted in, else it does not start.
#[derive(Debug, thiserror::Error)]
pub enum BwrapUnusable {
    /// No `bwrap` in the server's `PATH`.
    #[error("bwrap not found in PATH")]
    NotFound,
    /// The probe's root directory could not be made.
    #[error("cannot prepare probe root: {source}")]
    ProbeRoot {
        /// The probe's root.
        root: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// `bwrap` could not be started.
    #[error("cannot run bwrap: {source}")]
    NotRun {
        /// The `bwrap` found.
        bwrap: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The probe's command did not end within 20 s.
    #[error("bwrap probe timed out")]
    TimedOut,
    /// The probe's command could not be waited for.
    #[error("bwrap probe failed: {0}")]
    NotWaited(std::io::Error),
    /// The probe's command ran and failed: bwrap's own words.
    #[error("bwrap probe failed ({status}): {stderr}")]
    Failed {
        /// How it ended.
        status: std::process::ExitStatus,
        /// What bwrap wrote to its stderr.
        stderr: String,
    },
}

/// Reads a pipe to its end in the background and discards the bytes.
pub fn drain_pipe(pipe: OwnedFd) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return;
    };
    tokio::spawn(async move {
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut rx, &mut sink).await;
    });
}

/// Identity of a process tree, used to signal it and to verify it is gone.
#[derive(Debug)]
pub enum Tree {
    /// Everything in one PID namespace (bwrap mode).
    Namespace {
        /// Host pid of bwrap's init inside the namespace (its PID 1).
        init_pid: i32,
        /// The namespace inode.
        ns: u64,
    },
    /// Session, process group, descendants and marker (fallback mode).
    Group {
        /// The leader's host pid (also its session and group id).
        leader: i32,
        /// Start time of the leader, to tell a reused pid apart.
        leader_start: Option<u64>,
        /// `MARKER=value` bytes to look for in `/proc/PID/environ`.
        marker: Vec<u8>,
        /// Every member seen so far, as (pid, start time).
        known: HashSet<(i32, u64)>,
    },
    /// The members of one command's own group in a sandbox machine
    /// (cgroup v1 pids or cgroup v2, see [`crate::machine`]).
    Cgroup {
        /// The group.
        group: CommandGroup,
        /// The command's hold on the machine, released once the tree is
        /// verified gone.
        lease: Option<crate::machine::Lease>,
        /// The launcher (on the host, the leader the server waits for, see
        /// [`mod@crate::machine::join`]) as (pid, start time): it only relays its child's
        /// exit, so signals other than SIGKILL and SIGSTOP go to the
        /// command's processes only, as bwrap's processes are spared in a
        /// namespace tree.
        launcher: Option<(i32, u64)>,
    },
    /// One command of a sandbox machine held by an anchor (see
    /// [`crate::trees::anchor`]: where the server has no cgroup).
    Anchored {
        /// The server's end of the proof pipe.
        proof: crate::trees::anchor::Proof,
        /// The command's hold on the machine, released once the tree is
        /// verified gone.
        lease: Option<crate::machine::Lease>,
    },
    /// The process never started (spawn failed): the tree is empty.
    Empty,
}

impl Tree {
    /// How the [`crate::trees::deathguard`] names this tree.
    pub fn guarded(&self) -> Option<crate::trees::deathguard::Guarded> {
        use crate::trees::deathguard::Guarded;
        match self {
            Tree::Namespace { init_pid, ns } => Some(Guarded::Namespace {
                init_pid: *init_pid,
                ns: *ns,
            }),
            Tree::Group {
                leader,
                leader_start: Some(starttime),
                ..
            } => Some(Guarded::Group {
                leader: *leader,
                starttime: *starttime,
            }),
            _ => None,
        }
    }

    /// A fallback-mode tree rooted at `leader`.
    pub fn group(leader: i32, marker: &str) -> Self {
        let leader_start = procfs::stat(leader).map(|p| p.starttime);
        let mut known = HashSet::new();
        if let Some(start) = leader_start {
            known.insert((leader, start));
        }
        Tree::Group {
            leader,
            leader_start,
            marker: format!("{MARKER_VAR}={marker}").into_bytes(),
            known,
        }
    }

    /// Called once the tree is verified gone: a machine command's group is
    /// removed and its lease on the machine released.
    pub fn release(&mut self) {
        match self {
            Tree::Cgroup { group, lease, .. } => {
                if let Some(lease) = lease.take() {
                    group.remove_soon(lease);
                }
            }
            Tree::Anchored { lease, .. } => drop(lease.take()),
            _ => {}
        }
    }

    /// Where the tree is held by an anchor a sandbox process can stop:
    /// continues it if it is stopped, and says `true` (the caller repeats
    /// this while the command runs). `false` for trees held otherwise.
    pub fn wake_holder(&self) -> bool {
        match self {
            Tree::Anchored { proof, .. } => {
                proof.wake_if_stopped();
                true
            }
            _ => false,
        }
    }

    /// For a machine command: whether its group holds a process other
    /// than the launcher (the launcher has forked toward the command).
    /// `true` for every other kind of tree.
    pub fn command_started(&mut self) -> bool {
        let launcher = match self {
            Tree::Cgroup { launcher, .. } => launcher.map(|(pid, _)| pid),
            Tree::Anchored { proof, .. } => {
                return proof.poll() != crate::trees::anchor::State::Holding
                    || !proof.members().is_empty()
            }
            _ => return true,
        };
        self.members().iter().any(|p| Some(p.pid) != launcher)
    }

    /// A fresh scan of the live (non-zombie) members of the tree.
    pub fn members(&mut self) -> Vec<ProcInfo> {
        match self {
            Tree::Empty => Vec::new(),
            Tree::Anchored { proof, .. } => proof.members(),
            Tree::Cgroup { group, .. } => group
                .pids()
                .unwrap_or_default()
                .into_iter()
                .filter_map(procfs::stat)
                .filter(|p| !p.is_zombie())
                .collect(),
            Tree::Namespace { ns, .. } => procfs::live_in_namespace(*ns),
            Tree::Group {
                leader,
                leader_start,
                marker,
                known,
            } => {
                let snap: Vec<ProcInfo> = procfs::snapshot()
                    .into_iter()
                    .filter(|p| !p.is_zombie())
                    .collect();
                let mut found: HashSet<(i32, u64)> = HashSet::new();
                for p in &snap {
                    let is_leader = p.pid == *leader && Some(p.starttime) == *leader_start;
                    // A foreign process could reuse the leader's pid and
                    // become a session leader; only trust sid/pgid matches
                    // from processes other than that pid unless it is the
                    // real leader.
                    let by_session =
                        (p.sid == *leader || p.pgid == *leader) && (p.pid != *leader || is_leader);
                    if is_leader
                        || by_session
                        || known.contains(&(p.pid, p.starttime))
                        || procfs::environ_contains(p.pid, marker)
                    {
                        found.insert((p.pid, p.starttime));
                    }
                }
                // Descendants of known or found members (fixpoint).
                let mut parents: HashSet<i32> = found
                    .iter()
                    .chain(known.iter())
                    .map(|(pid, _)| *pid)
                    .collect();
                loop {
                    let mut grew = false;
                    for p in &snap {
                        if parents.contains(&p.ppid) && found.insert((p.pid, p.starttime)) {
                            parents.insert(p.pid);
                            grew = true;
                        }
                    }
                    if !grew {
                        break;
                    }
                }
                known.extend(found.iter().copied());
                snap.into_iter()
                    .filter(|p| found.contains(&(p.pid, p.starttime)))
                    .collect()
            }
        }
    }

    /// Whether the tree is gone according to a fresh scan. A scan that
    /// cannot be made (out of descriptors) says not gone: it proves
    /// nothing (issue 40).
    pub fn is_gone(&mut self) -> bool {
        match self {
            // Cheap check first: init exits only when its namespace is empty.
            Tree::Namespace { init_pid, ns } => {
                let init_alive = procfs::stat(*init_pid).is_some_and(|p| !p.is_zombie())
                    && procfs::pid_namespace(*init_pid) == Some(*ns);
                !init_alive && procfs::try_live_in_namespace(*ns).is_ok_and(|l| l.is_empty())
            }
            // The group's own word: see `CommandGroup::is_empty`.
            Tree::Cgroup { group, .. } => group.is_empty(),
            Tree::Group { .. } => procfs::try_all_pids().is_ok() && self.members().is_empty(),
            Tree::Anchored { proof, .. } => proof.is_gone(),
            Tree::Empty => true,
        }
    }

    /// Sends `sig` to every member. In a namespace bwrap's init is skipped
    /// (it ignores signals it has no handler for) except for SIGKILL, which
    /// takes the whole namespace down. Returns how many processes were hit.
    pub fn signal(&mut self, sig: Signal) -> usize {
        let init = match self {
            Tree::Namespace { init_pid, .. } => Some(*init_pid),
            Tree::Cgroup {
                launcher: Some((pid, _)),
                ..
            } if sig != Signal::STOP => Some(*pid),
            _ => None,
        };
        if sig != Signal::KILL && self.only_init_left() {
            return 0;
        }
        if let (Tree::Cgroup { group, .. }, Signal::KILL) = (&*self, sig) {
            // The kernel's part: no more forks (cgroup v1), or every
            // member killed (cgroup v2).
            group.kill();
        }
        let mut hit = 0;
        for p in self.members() {
            if Some(p.pid) == init && sig != Signal::KILL {
                continue;
            }
            if signal_verified(&p, sig) {
                hit += 1;
            }
            // A stopped process (paused sandbox) must be able to act on
            // the signal.
            if sig != Signal::KILL && sig != Signal::STOP {
                signal_verified(&p, Signal::CONT);
            }
        }
        hit
    }

    /// Whether the namespace holds nothing but bwrap's init, without a
    /// `/proc` scan: every other process of a PID namespace descends from
    /// its init (orphans are reparented to it, or to a subreaper that
    /// itself descends from it), so an init without children is alone,
    /// and stays alone (nothing else can fork into the namespace). The
    /// children are read before the init's namespace is checked, so a
    /// reused pid is never taken for the init. `false` when unsure.
    fn only_init_left(&self) -> bool {
        let Tree::Namespace { init_pid, ns } = self else {
            return false;
        };
        let alone = procfs::children(*init_pid).is_some_and(|c| c.is_empty());
        alone && procfs::pid_namespace(*init_pid) == Some(*ns)
    }

    /// Stops (`SIGSTOP`) or continues (`SIGCONT`) every member, bwrap's init
    /// included. Stopping repeats the scan until every member found is
    /// stopped, so a process forked after one scan (before its parent
    /// stopped) is stopped too; a stopped process cannot fork, so this ends
    /// (bounded at 100 rounds for a tree that keeps changing).
    pub fn freeze(&mut self, stop: bool) {
        if let Tree::Cgroup { group, .. } = self {
            if group.freeze(stop) {
                return;
            }
        }
        if !stop {
            for p in self.members() {
                signal_verified(&p, Signal::CONT);
            }
            return;
        }
        for _ in 0..100 {
            let running: Vec<ProcInfo> = self
                .members()
                .into_iter()
                .filter(|p| !matches!(p.state, 'T' | 't'))
                .collect();
            if running.is_empty() {
                return;
            }
            for p in &running {
                signal_verified(p, Signal::STOP);
            }
        }
    }
}

/// Signal names the API accepts, with the `SIG` prefix.
pub fn signal_from_name(name: &str) -> Option<Signal> {
    let short = name.strip_prefix("SIG").unwrap_or(name);
    Some(match short {
        "HUP" => Signal::HUP,
        "INT" => Signal::INT,
        "QUIT" => Signal::QUIT,
        "KILL" => Signal::KILL,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "TERM" => Signal::TERM,
        "CONT" => Signal::CONT,
        "STOP" => Signal::STOP,
        "ALRM" => Signal::ALARM,
        "ABRT" => Signal::ABORT,
        "PIPE" => Signal::PIPE,
        "WINCH" => Signal::WINCH,
        "TSTP" => Signal::TSTP,
        _ => return None,
    })
}

/// `SIGNAME` for a raw signal number (as reported by `wait`).
pub fn signal_name(raw: i32) -> String {
    let table = [
        (Signal::HUP, "SIGHUP"),
        (Signal::INT, "SIGINT"),
        (Signal::QUIT, "SIGQUIT"),
        (Signal::ILL, "SIGILL"),
        (Signal::TRAP, "SIGTRAP"),
        (Signal::ABORT, "SIGABRT"),
        (Signal::BUS, "SIGBUS"),
        (Signal::FPE, "SIGFPE"),
        (Signal::KILL, "SIGKILL"),
        (Signal::USR1, "SIGUSR1"),
        (Signal::SEGV, "SIGSEGV"),
        (Signal::USR2, "SIGUSR2"),
        (Signal::PIPE, "SIGPIPE"),
        (Signal::ALARM, "SIGALRM"),
        (Signal::TERM, "SIGTERM"),
        (Signal::CONT, "SIGCONT"),
        (Signal::STOP, "SIGSTOP"),
        (Signal::TSTP, "SIGTSTP"),
        (Signal::WINCH, "SIGWINCH"),
        (Signal::XCPU, "SIGXCPU"),
        (Signal::XFSZ, "SIGXFSZ"),
        (Signal::SYS, "SIGSYS"),
    ];
    table
        .iter()
        .find(|(s, _)| s.as_raw() == raw)
        .map_or_else(|| format!("SIG{raw}"), |(_, n)| (*n).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40: with the engine out of descriptors, a process DELETE
    /// answered `tree_exited: true` while the command ran: the pids
    /// group's member list could not be read, and a failed read counted
    /// as an empty group. A list that cannot be read proves nothing (here
    /// `cgroup.procs` is a directory, so reading it fails as it does
    /// without a descriptor); a group whose directory is gone is empty.
    #[test]
    fn a_tree_whose_members_cannot_be_read_is_not_gone() {
        let dir = std::env::temp_dir().join(format!(
            "cl-unreadable-group-{}-{}",
            std::process::id(),
            crate::util::random_hex(4)
        ));
        std::fs::create_dir_all(dir.join("cgroup.procs")).expect("a group that cannot be read");
        let mut unreadable = Tree::Cgroup {
            group: CommandGroup::v1_at(dir.clone()),
            lease: None,
            launcher: None,
        };
        assert!(!unreadable.is_gone(), "an unread group was called empty");
        let _ = std::fs::remove_dir_all(&dir);
        let mut removed = Tree::Cgroup {
            group: CommandGroup::v1_at(dir),
            lease: None,
            launcher: None,
        };
        assert!(removed.is_gone(), "a removed group holds nothing");
    }

    /// Issue 10 item 4: a kill must never reach a process that merely
    /// reused the pid a scan saw. A stale start time stands for the reuse.
    #[test]
    fn signals_go_only_to_the_process_the_scan_saw() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id() as i32;
        let seen = procfs::stat(pid).expect("stat");
        let mut stale = seen.clone();
        stale.starttime += 1;
        assert!(!signal_verified(&stale, Signal::KILL));
        assert!(child.try_wait().expect("try_wait").is_none(), "was killed");
        assert!(signal_verified(&seen, Signal::KILL));
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::KILL.as_raw()));
    }
}
