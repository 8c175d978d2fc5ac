//! Joining a sandbox's machine in one step (issue 25): the server forks a
//! launcher that enters the machine's namespaces and root, drops every
//! capability and forks the command, which is exec'd with its own
//! environment. No helper executable runs on the way (it took `nsenter`,
//! `setpriv` and `env`, three execs of about 1 ms each, before the
//! command's own).
//!
//! # The two processes
//! The *launcher* is the server's direct child (a fork of the server that
//! never execs, named [`LAUNCHER_NAME`]). Before anything else it runs as
//! the sandbox's host uid (set by `std::process::Command`; the server's
//! own uid when it is not root), starts a session, joins the command's
//! pids group (where there is one) and takes the sandbox's resource
//! limits. It then enters the machine's user namespace first
//! (the sandbox uid owns it, which gives the launcher every capability in
//! it and in the namespaces it owns), then IPC, UTS, network, PID and
//! mount; its root becomes the machine's root. It sets `no_new_privs`,
//! cuts its capability bounding, permitted and effective sets to
//! [`SANDBOX_CAPABILITIES`] and empties its ambient and inheritable sets,
//! so the command is uid 0 of the machine holding those few capabilities,
//! before and after its exec, and a command that changes to another uid
//! of the machine holds none (see [`SANDBOX_CAPABILITIES`] for why they
//! reach nothing outside the sandbox), changes to
//! the working directory and forks: entering a PID namespace only places
//! the launcher's *children* in it. The launcher then waits for the
//! command and exits with its status (or dies of the same signal), like
//! `nsenter` did. Without a pids group it forks an *anchor* instead,
//! which forks the command and reports its status and the proof of its
//! tree ([`crate::trees::anchor`]).
//!
//! The *command* closes every descriptor but 0, 1 and 2 and is exec'd with
//! exactly the environment given ([`Launch`] prepares the argument and
//! environment arrays and the `PATH` search in the server, before the
//! fork: between fork and exec only system calls run, nothing allocates).
//! A program that cannot be exec'd prints `createos-local: cannot start
//! CMD: REASON` on its stderr and exits 127 (not found) or 126, as a shell
//! would; a file without `#!` that the kernel cannot run is run by
//! `/bin/sh`, as `execvp` does.
//!
//! # Failures of the launcher
//! A step that fails before the command is forked (entering a namespace,
//! the working directory, the fork itself in a sandbox at its task limit)
//! makes the spawn itself fail with that error (the standard library
//! reports an error of the child before its exec): nothing ran, and the
//! server answers 503 `start_failed`, never a command result.

use std::ffi::{c_char, c_int, CString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The capabilities the root of a sandbox machine holds (issue 44 item 1),
/// as the root of the service's VM (and of a container) would: `chown`,
/// `tar -x` keeping owners, reading and fixing files of the machine's
/// other users, switching to them (`su`, package managers' build users),
/// signalling them, binding ports below 1024, `chroot`:
/// `CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`,
/// `CAP_KILL`, `CAP_SETGID`, `CAP_SETUID`, `CAP_NET_BIND_SERVICE`,
/// `CAP_SYS_CHROOT` (a subset of the set container engines give).
///
/// Each counts only in the sandbox's own user namespace: on files whose
/// owner and group are ids of the sandbox's range (the host's `/usr`,
/// `/opt` and `/etc` copy belong to ids the namespace does not map, and
/// are mounted read-only), on the ids of that range (`setuid` to nothing
/// else), on processes of its own PID namespace, on its own network
/// namespace. Nothing that administers the machine itself
/// (`CAP_SYS_ADMIN`: mounts; `CAP_NET_ADMIN`, `CAP_NET_RAW`, `CAP_MKNOD`,
/// `CAP_SYS_PTRACE`, ...) is given.
pub const SANDBOX_CAPABILITIES: u64 = {
    // Their numbers in `linux/capability.h`.
    const CHOWN: u32 = 0;
    const DAC_OVERRIDE: u32 = 1;
    const FOWNER: u32 = 3;
    const FSETID: u32 = 4;
    const KILL: u32 = 5;
    const SETGID: u32 = 6;
    const SETUID: u32 = 7;
    const NET_BIND_SERVICE: u32 = 10;
    const SYS_CHROOT: u32 = 18;
    let mut set = 0u64;
    let caps = [
        CHOWN,
        DAC_OVERRIDE,
        FOWNER,
        FSETID,
        KILL,
        SETGID,
        SETUID,
        NET_BIND_SERVICE,
        SYS_CHROOT,
    ];
    let mut i = 0;
    while i < caps.len() {
        set |= 1 << caps[i];
        i += 1;
    }
    set
};

/// The name (`comm`) of a launcher on the host.
pub const LAUNCHER_NAME: &str = "sandbox-join";
const LAUNCHER_CNAME: &std::ffi::CStr = c"sandbox-join";

/// Descriptors of one machine, opened by the server (root) when the
/// machine starts and kept while it lives: its namespaces in the order
/// they are entered, and its root directory.
#[derive(Debug)]
pub struct Door {
    /// user, ipc, uts, net, pid, mnt.
    namespaces: Vec<OwnedFd>,
    root: OwnedFd,
}

const NAMESPACES: [(&str, c_int); 6] = [
    ("user", libc::CLONE_NEWUSER),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("net", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
];

impl Door {
    /// Opens the namespaces and root of process `pid` (the machine's
    /// init). The caller checks afterwards that `pid` is still that init.
    pub fn open(pid: i32) -> std::io::Result<Door> {
        use rustix::fs::{open, Mode, OFlags};
        let mut namespaces = Vec::with_capacity(NAMESPACES.len());
        for (name, _) in NAMESPACES {
            let fd = open(
                format!("/proc/{pid}/ns/{name}"),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            namespaces.push(fd);
        }
        let root = open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Door { namespaces, root })
    }
}

/// Everything the launcher and the command need between fork and exec,
/// prepared in the server (see the module docs).
struct Launch {
    namespaces: Vec<(RawFd, c_int)>,
    root: RawFd,
    /// The `tasks` file of the command's pids group (a root server with a
    /// cgroup v1 `pids` hierarchy), or none: then `anchor` is set.
    group: Option<RawFd>,
    /// The write end of the command's proof pipe: the launcher forks an
    /// anchor (see [`crate::trees::anchor`]) that holds the command's tree.
    anchor: Option<RawFd>,
    /// The `tasks` file of the sandbox's memory group, where it has one.
    memory: Option<RawFd>,
    cwd: CString,
    /// Paths to try, in `PATH` order (or the one path given).
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv: Vec<*const c_char>,
    _envp: Vec<CString>,
    envp: Vec<*const c_char>,
    /// `/bin/sh <path> args…` for a file the kernel cannot execute; slot 1
    /// is set to the candidate in the child.
    sh: CString,
    sh_argv: Vec<*const c_char>,
    last_cap: c_int,
    /// `createos-local: cannot start CMD: `.
    failure: Vec<u8>,
    /// A terminal for the command (see [`crate::machine::pty`]).
    terminal: Option<crate::machine::pty::Setup>,
}

// SAFETY: the raw pointers point into the CStrings the same value owns;
// they are only read, in the forked child.
unsafe impl Send for Launch {}
// SAFETY: as above; nothing is written through them in the server.
unsafe impl Sync for Launch {}

/// The highest capability number of this kernel.
fn last_cap() -> c_int {
    // Process-wide: a fact of the kernel, read once.
    static LAST: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

fn c_string(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{s:?} holds a NUL byte"),
        )
    })
}

/// How a command's tree is held in the machine: its own pids group (the
/// `tasks` file, open for writing), or an anchor that reports on the
/// write end of a proof pipe (see [`crate::trees::anchor`]).
#[derive(Clone, Copy)]
pub enum Holder<'a> {
    /// A cgroup v1 pids group of the command's own.
    Group(&'a std::fs::File),
    /// A subreaper in the machine, writing to this descriptor.
    Anchor(RawFd),
}

/// The launcher of `cmd args` in the machine behind `door`, its tree held
/// by `holder`, with exactly `env` and working directory `cwd` (in the
/// machine). The caller sets the uid, gid and stdio; the program the
/// returned command names is never exec'd.
pub fn command(
    door: &Door,
    group: Holder<'_>,
    memory: Option<&std::fs::File>,
    cwd: &str,
    env: &[(String, String)],
    cmd: &str,
    args: &[String],
) -> std::io::Result<std::process::Command> {
    launcher(door, group, memory, cwd, env, cmd, args, None)
}

/// [`command`] with a terminal: after it entered the machine (its mount
/// namespace, so the machine's `/dev/pts`) and dropped its capabilities,
/// the launcher opens a terminal of `size`, sends its master on `socket`
/// (its end of a [`crate::machine::pty::socket_pair`]) and forks the command with
/// the terminal as its controlling terminal, stdin, stdout and stderr
/// (see [`crate::machine::pty`]). A terminal that cannot be opened fails the spawn.
#[allow(clippy::too_many_arguments)]
pub fn command_in_terminal(
    door: &Door,
    group: Holder<'_>,
    memory: Option<&std::fs::File>,
    cwd: &str,
    env: &[(String, String)],
    cmd: &str,
    args: &[String],
    size: crate::machine::pty::Winsize,
    socket: RawFd,
) -> std::io::Result<std::process::Command> {
    let setup = crate::machine::pty::Setup::new(size, socket);
    launcher(door, group, memory, cwd, env, cmd, args, Some(setup))
}

#[allow(clippy::too_many_arguments)]
fn launcher(
    door: &Door,
    group: Holder<'_>,
    memory: Option<&std::fs::File>,
    cwd: &str,
    env: &[(String, String)],
    cmd: &str,
    args: &[String],
    terminal: Option<crate::machine::pty::Setup>,
) -> std::io::Result<std::process::Command> {
    let mut argv_owned = vec![c_string(cmd)?];
    for a in args {
        argv_owned.push(c_string(a)?);
    }
    let mut env_owned = Vec::with_capacity(env.len());
    for (k, v) in env {
        env_owned.push(c_string(&format!("{k}={v}"))?);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    let candidates = if cmd.is_empty() {
        Vec::new()
    } else if cmd.contains('/') {
        vec![c_string(cmd)?]
    } else {
        let mut all = Vec::new();
        for dir in path.split(':') {
            let full = if dir.is_empty() {
                cmd.to_string()
            } else {
                format!("{}/{cmd}", dir.trim_end_matches('/'))
            };
            all.push(c_string(&full)?);
        }
        all
    };
    let ptrs = |v: &[CString]| {
        v.iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect::<Vec<_>>()
    };
    let argv = ptrs(&argv_owned);
    let envp = ptrs(&env_owned);
    let sh = c_string("/bin/sh")?;
    let mut sh_argv = vec![sh.as_ptr(), std::ptr::null()];
    sh_argv.extend(argv_owned[1..].iter().map(|c| c.as_ptr()));
    sh_argv.push(std::ptr::null());
    let mut launch = Launch {
        namespaces: door
            .namespaces
            .iter()
            .zip(NAMESPACES)
            .map(|(fd, (_, kind))| (fd.as_raw_fd(), kind))
            .collect(),
        root: door.root.as_raw_fd(),
        group: match group {
            Holder::Group(f) => Some(f.as_raw_fd()),
            Holder::Anchor(_) => None,
        },
        anchor: match group {
            Holder::Group(_) => None,
            Holder::Anchor(fd) => Some(fd),
        },
        memory: memory.map(|m| m.as_raw_fd()),
        cwd: c_string(cwd)?,
        candidates,
        _argv: argv_owned,
        argv,
        _envp: env_owned,
        envp,
        sh,
        sh_argv,
        last_cap: last_cap(),
        failure: format!("createos-local: cannot start {cmd}: ").into_bytes(),
        terminal,
    };
    let mut c = std::process::Command::new(Path::new("/bin/false"));
    c.current_dir("/").env_clear();
    // SAFETY: the closure runs in the forked child; it makes system calls
    // only (see `Launch::run`), on memory and descriptors it owns.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, move || launch.run());
    }
    Ok(c)
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn check(ret: c_int) -> std::io::Result<()> {
    if ret < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Closes every descriptor from `first` up (async-signal-safe).
fn close_from(first: u32) {
    // SAFETY: plain system calls on descriptor numbers.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) == 0 {
            return;
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as c_int
        } else {
            1 << 16
        };
        for fd in first as c_int..max {
            libc::close(fd);
        }
    }
}

/// A reason for people, without allocating (`strerror` is not
/// async-signal-safe).
fn reason(errno: c_int) -> &'static [u8] {
    match errno {
        libc::ENOENT => b"No such file or directory",
        libc::EACCES => b"Permission denied",
        libc::ENOEXEC => b"Exec format error",
        libc::ENOTDIR => b"Not a directory",
        libc::EISDIR => b"Is a directory",
        libc::ELOOP => b"Too many levels of symbolic links",
        libc::ENAMETOOLONG => b"File name too long",
        libc::E2BIG => b"Argument list too long",
        libc::ENOMEM => b"Cannot allocate memory",
        libc::ETXTBSY => b"Text file busy",
        libc::EPERM => b"Operation not permitted",
        libc::EAGAIN => b"Resource temporarily unavailable (the sandbox is at its limit of tasks)",
        _ => b"cannot execute",
    }
}

fn write_all(fd: c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

impl Launch {
    /// The launcher (see the module docs). Returns only an error (before
    /// the command was forked); otherwise it exits with the command.
    fn run(&mut self) -> std::io::Result<()> {
        rustix::process::setsid()?;
        crate::trees::fds::mark_cloexec_from(3);
        // Join the command's own pids group and the sandbox's memory
        // group before anything forks.
        crate::trees::process_limits::join_groups([self.group, self.memory])?;
        crate::trees::process_limits::set_limits()?;
        crate::trees::process_limits::first_for_the_oom_killer();
        // SAFETY: system calls on descriptors and memory this child owns.
        unsafe {
            check(libc::prctl(
                libc::PR_SET_NAME,
                LAUNCHER_CNAME.as_ptr() as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            for (fd, kind) in &self.namespaces {
                check(libc::setns(*fd, *kind))?;
            }
            check(libc::fchdir(self.root))?;
            check(libc::chroot(c".".as_ptr()))?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            for cap in 0..=self.last_cap {
                if SANDBOX_CAPABILITIES & (1 << cap) != 0 {
                    continue;
                }
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                    let e = last_error();
                    if e.raw_os_error() == Some(libc::EINVAL) {
                        break;
                    }
                    return Err(e);
                }
            }
            // Ambient capabilities need the inheritable ones; clear both.
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            );
            let header = CapHeader {
                version: CAP_VERSION_3,
                pid: 0,
            };
            // Kept across the exec of a uid-0 command (its bounding set);
            // `no_new_privs` keeps it from gaining more than these.
            let caps = [
                SANDBOX_CAPABILITIES as u32,
                (SANDBOX_CAPABILITIES >> 32) as u32,
            ];
            let kept = caps.map(|set| CapData {
                effective: set,
                permitted: set,
                inheritable: 0,
            });
            check(libc::syscall(libc::SYS_capset, &header, kept.as_ptr()) as c_int)?;
            check(libc::chdir(self.cwd.as_ptr()))?;
            let terminal = match &self.terminal {
                Some(setup) => Some(setup.open()?),
                None => None,
            };
            if let Some(proof) = self.anchor {
                return self.anchored(proof, terminal);
            }
            let pid = fork();
            if pid < 0 {
                return Err(last_error());
            }
            if pid == 0 {
                if let Some(slave) = terminal {
                    crate::machine::pty::attach(slave);
                }
                self.exec();
            }
            self.relay(pid as libc::pid_t)
        }
    }

    /// The launcher with an anchor (see [`crate::trees::anchor`]): forks
    /// the anchor (in the machine's PID namespace), tells the server its
    /// host pid on the proof pipe, and relays the command's status the
    /// anchor reports.
    fn anchored(&mut self, proof: RawFd, terminal: Option<RawFd>) -> std::io::Result<()> {
        let mut status = [0 as c_int; 2];
        // SAFETY: system calls on descriptors and memory this child owns.
        unsafe {
            check(libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC))?;
            let anchor = fork();
            if anchor < 0 {
                return Err(last_error());
            }
            if anchor == 0 {
                libc::close(status[0]);
                self.anchor_run(proof, status[1], terminal);
            }
            libc::close(status[1]);
            let mut told = [0u8; 5];
            told[0] = crate::trees::anchor::PID_TAG;
            told[1..].copy_from_slice(&(anchor as i32).to_le_bytes());
            write_all(proof, &told);
            libc::close(proof);
            self.relay_anchored(anchor as libc::pid_t, status[0])
        }
    }

    /// The anchor: a subreaper in the machine that forks the command,
    /// reports its wait status on `status` and reaps until nothing is
    /// left below it, then writes the proof byte on `proof`.
    fn anchor_run(&mut self, proof: RawFd, status: RawFd, terminal: Option<RawFd>) -> ! {
        // SAFETY: system calls on descriptors and memory this child owns.
        unsafe {
            // A copy of the server's memory: never readable or traceable
            // by the sandbox's processes (its memory belongs to the host's
            // user namespace, so this takes CAP_SYS_PTRACE there).
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 {
                libc::_exit(127);
            }
            let command = fork();
            if command < 0 {
                // Nothing ran (the sandbox at its limit of tasks): said
                // on the command's stderr, as a shell would, and reported
                // as its exit; nothing is left below the anchor.
                let errno = *libc::__errno_location();
                write_all(2, &self.failure);
                write_all(2, reason(errno));
                write_all(2, b"\n");
                write_all(status, &((126 as c_int) << 8).to_le_bytes());
                write_all(proof, &[crate::trees::anchor::GONE_TAG]);
                libc::_exit(0);
            }
            if command == 0 {
                if let Some(slave) = terminal {
                    crate::machine::pty::attach(slave);
                }
                self.exec();
            }
            // Nothing of the server's, nor the command's stdio, stays
            // open here: only the two pipes.
            for fd in 0..3 {
                libc::close(fd);
            }
            close_except(3, [proof, status]);
            let mut status = Some(status);
            loop {
                let mut st: c_int = 0;
                let r = libc::waitpid(-1, &mut st, libc::__WALL);
                if r < 0 {
                    match *libc::__errno_location() {
                        libc::EINTR => continue,
                        // Nothing left below it: the tree is gone.
                        libc::ECHILD => break,
                        _ => libc::_exit(1),
                    }
                }
                if r == command as libc::pid_t {
                    if let Some(fd) = status.take() {
                        write_all(fd, &st.to_le_bytes());
                        libc::close(fd);
                    }
                }
            }
            write_all(proof, &[crate::trees::anchor::GONE_TAG]);
            libc::_exit(0);
        }
    }

    /// The launcher after forking the anchor: lets the server's spawn
    /// return, reads the command's wait status from the anchor and ends
    /// the way the command ended. Should the anchor die first (a sandbox
    /// process killed it), the command's end is unknown: the launcher says
    /// so on the command's stderr and ends the way the anchor did.
    fn relay_anchored(&self, anchor: libc::pid_t, status: RawFd) -> ! {
        close_except(3, [status, status]);
        let mut buf = [0u8; 4];
        let mut got = 0;
        // SAFETY: read, waitpid and exit calls on this process's own
        // descriptors and child.
        unsafe {
            while got < buf.len() {
                let n = libc::read(status, buf[got..].as_mut_ptr().cast(), buf.len() - got);
                if n > 0 {
                    got += n as usize;
                } else if n == 0 || *libc::__errno_location() != libc::EINTR {
                    break;
                }
            }
            if got == buf.len() {
                self.end_as(c_int::from_le_bytes(buf));
            }
            write_all(
                2,
                b"createos-local: the process holding this command's tree in the sandbox \
                  was killed: the command's end is unknown and its processes may still run\n",
            );
            let mut st: c_int = 0;
            while libc::waitpid(anchor, &mut st, 0) < 0 && *libc::__errno_location() == libc::EINTR
            {
            }
            if libc::WIFSIGNALED(st) {
                libc::_exit(128 + libc::WTERMSIG(st));
            }
            libc::_exit(127);
        }
    }

    /// The command: exec'd like `execvp` with its own environment.
    fn exec(&mut self) -> ! {
        close_from(3);
        let mut error = libc::ENOENT;
        let mut denied = false;
        // SAFETY: exec with NUL-terminated arrays of pointers into owned
        // CStrings; write and _exit.
        unsafe {
            for i in 0..self.candidates.len() {
                let path = self.candidates[i].as_ptr();
                libc::execve(path, self.argv.as_ptr(), self.envp.as_ptr());
                let e = *libc::__errno_location();
                match e {
                    libc::ENOEXEC => {
                        self.sh_argv[1] = path;
                        libc::execve(self.sh.as_ptr(), self.sh_argv.as_ptr(), self.envp.as_ptr());
                        error = *libc::__errno_location();
                        denied = false;
                        break;
                    }
                    libc::EACCES => denied = true,
                    libc::ENOENT
                    | libc::ENOTDIR
                    | libc::ESTALE
                    | libc::ENODEV
                    | libc::ETIMEDOUT => {}
                    other => {
                        error = other;
                        denied = false;
                        break;
                    }
                }
            }
            if denied {
                error = libc::EACCES;
            }
            write_all(2, &self.failure);
            write_all(2, reason(error));
            write_all(2, b"\n");
            libc::_exit(if error == libc::ENOENT { 127 } else { 126 });
        }
    }

    /// The launcher after the fork: lets the server's spawn return, waits
    /// for the command and ends the way it ended.
    fn relay(&self, pid: libc::pid_t) -> ! {
        // The standard library's error pipe (the server waits for it to
        // close) and every other descriptor but stdio.
        close_from(3);
        let mut status: c_int = 0;
        // SAFETY: waitpid, signal and exit calls on this process and its
        // child.
        unsafe {
            loop {
                let r = libc::waitpid(pid, &mut status, 0);
                if r == pid {
                    break;
                }
                if r < 0 && *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
        }
        self.end_as(status)
    }

    /// Ends this launcher the way wait status `status` says its command
    /// ended.
    fn end_as(&self, status: c_int) -> ! {
        // SAFETY: signal and exit calls on this process.
        unsafe {
            if libc::WIFEXITED(status) {
                libc::_exit(libc::WEXITSTATUS(status));
            }
            let sig = libc::WTERMSIG(status);
            // Die of the same signal, without a core dump of this copy of
            // the server.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
    }
}

/// A plain fork (no `atfork` handlers: this is the child of a threaded
/// process).
fn fork() -> libc::c_long {
    // SAFETY: clone with only SIGCHLD is fork.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// Closes every descriptor from `first` up but the two in `keep`
/// (async-signal-safe).
fn close_except(first: c_int, keep: [RawFd; 2]) {
    let (lo, hi) = (keep[0].min(keep[1]), keep[0].max(keep[1]));
    let span = |from: c_int, to: c_int| {
        if from <= to {
            // SAFETY: plain system calls on descriptor numbers.
            unsafe {
                if libc::syscall(libc::SYS_close_range, from as u32, to as u32, 0) != 0 {
                    for fd in from..=to.min(1 << 16) {
                        libc::close(fd);
                    }
                }
            }
        }
    };
    span(first, lo - 1);
    span(lo + 1, hi - 1);
    if hi < c_int::MAX {
        span(hi + 1, c_int::MAX);
    }
}

/// A socket made inside the network namespace of the machine behind
/// `door` by `make` (which returns its descriptor), run in a forked
/// single-threaded helper that joins the machine's user namespace, then
/// its network namespace, and sends the socket back over a socket pair
/// (`SCM_RIGHTS`). A server that is not root cannot join the network
/// namespace from one of its own threads (that takes `CAP_SYS_ADMIN` in
/// the server's own user namespace too); the helper has every capability
/// in the machine's. The same path serves root. `make` runs in the
/// forked child: system calls only, on its own stack.
fn socket_made_in(
    door: &Door,
    make: impl Fn() -> std::io::Result<c_int> + Send + Sync + 'static,
) -> std::io::Result<OwnedFd> {
    let (ours, theirs) = crate::machine::pty::socket_pair()?;
    let user = door.namespaces[0].as_raw_fd();
    let net = door.namespaces[3].as_raw_fd();
    let socket = theirs.as_raw_fd();
    let mut c = std::process::Command::new(Path::new("/bin/false"));
    c.current_dir("/")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child and makes system calls
    // only, on descriptors it owns and stack memory.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
            check(libc::setns(user, libc::CLONE_NEWUSER))?;
            check(libc::setns(net, libc::CLONE_NEWNET))?;
            let fd = make()?;
            crate::machine::pty::send_fd(socket, fd)?;
            libc::_exit(0);
        });
    }
    let mut child = c.spawn()?;
    drop(theirs);
    let _ = child.wait();
    crate::machine::pty::recv_fd(ours.as_fd())
}

/// A TCP socket of the machine's network namespace, `SOCK_CLOEXEC`.
fn tcp_socket() -> std::io::Result<c_int> {
    // SAFETY: a system call with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    check(fd)?;
    Ok(fd)
}

/// A TCP listener on `127.0.0.1:port` in the network namespace of the
/// machine behind `door` (its egress proxy's, see
/// [`crate::network::egress`]), made there by [`socket_made_in`].
pub fn listener_in(door: &Door, port: u16) -> std::io::Result<std::net::TcpListener> {
    let fd = socket_made_in(door, move || {
        let fd = tcp_socket()?;
        let one: c_int = 1;
        // SAFETY: system calls on the socket just made, with pointers to
        // values on this stack.
        unsafe {
            check(libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const c_int).cast(),
                std::mem::size_of::<c_int>() as libc::socklen_t,
            ))?;
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
                },
                sin_zero: [0; 8],
            };
            check(libc::bind(
                fd,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ))?;
            check(libc::listen(fd, 128))?;
        }
        Ok(fd)
    })?;
    Ok(std::net::TcpListener::from(fd))
}

/// A TCP socket, not connected, made in the machine's network namespace
/// by [`socket_made_in`]: a connection the server makes on it reaches
/// the sandbox's own loopback, never the host's (ingress,
/// [`crate::network::ingress`]).
pub fn socket_in(door: &Door) -> std::io::Result<OwnedFd> {
    socket_made_in(door, tcp_socket)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_launcher_name_is_one_name() {
        assert_eq!(super::LAUNCHER_CNAME.to_str(), Ok(super::LAUNCHER_NAME));
        // `comm` holds at most 15 bytes.
        assert!(super::LAUNCHER_NAME.len() <= 15);
    }
}
