//! Terminals of interactive managed processes (issue 38): a real
//! pseudo-terminal for a process created with `kind: "pty"`.
//!
//! # Where the terminal is allocated
//! In a sandbox machine ([`crate::machine`]) the launcher ([`mod@crate::machine::join`])
//! opens `/dev/ptmx` *after* it entered the machine's mount namespace and
//! root and dropped every capability: the terminal belongs to the
//! machine's own `devpts` instance (the one bubblewrap's `--dev` mounts at
//! `/dev/pts`, with `/dev/ptmx` a link to its `ptmx`), is owned by the
//! sandbox's user, and `tty` in the command names `/dev/pts/N` as the
//! sandbox sees it. The launcher takes the terminal's other side with
//! `TIOCGPTPEER` (no path lookup), sets the size asked for, hands the
//! master to the server over a socket (`SCM_RIGHTS`, [`send_fd`]) and
//! forks the command, which starts a session of its own with the
//! terminal as its controlling terminal and as its stdin, stdout and
//! stderr. Only the server then holds the master; only the command's tree
//! holds the terminal.
//!
//! In `process-group` mode (no isolation) the server allocates the
//! terminal on the host the same way. A bwrap sandbox without a machine
//! (each command in namespaces of its own) has no place to allocate one
//! before the command runs: terminals are refused there (501), never
//! faked with a terminal of the host.
//!
//! # The master in the server
//! Non-blocking and registered with the runtime: the supervisor's reader
//! task reads it into the journal (one stream, `pty`), input requests write
//! it, a resize sets its window size (the kernel sends `SIGWINCH` to the
//! terminal's foreground process group).

use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Why a terminal is refused in a bwrap sandbox without a machine.
pub const NO_MACHINE: &str = "terminals need the sandbox machine model (a server running as root \
     with a cgroup v1 pids hierarchy); this server runs each command in namespaces of its own, \
     where no terminal can be allocated inside the sandbox";

/// The largest number of columns or rows a terminal may have.
pub const MAX_SIDE: u64 = 4096;

/// A terminal's window size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Winsize {
    /// Columns, 1 to [`MAX_SIDE`].
    pub cols: u16,
    /// Rows, 1 to [`MAX_SIDE`].
    pub rows: u16,
}

/// A terminal size a request asked for that no terminal has (a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{side} is {value}; a terminal has 1 to {MAX_SIDE} {side}")]
pub struct BadTerminalSize {
    /// Which side: `cols` or `rows`.
    pub side: &'static str,
    /// The number asked for.
    pub value: u64,
}

impl Winsize {
    /// The size of a terminal created without one: 80 columns, 24 rows.
    pub const DEFAULT: Winsize = Winsize { cols: 80, rows: 24 };

    /// A size from request fields, or why it is refused (a message for
    /// people).
    pub fn new(cols: u64, rows: u64) -> Result<Winsize, BadTerminalSize> {
        let check = |side: &'static str, value: u64| {
            if (1..=MAX_SIDE).contains(&value) {
                Ok(value as u16)
            } else {
                Err(BadTerminalSize { side, value })
            }
        };
        Ok(Winsize {
            cols: check("cols", cols)?,
            rows: check("rows", rows)?,
        })
    }

    fn to_libc(self) -> libc::winsize {
        libc::winsize {
            ws_row: self.rows,
            ws_col: self.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }
    }
}

/// A terminal as the launcher sets it up between fork and exec (system
/// calls only, nothing allocates).
#[derive(Clone, Copy)]
pub(crate) struct Setup {
    /// Its size at start.
    pub size: libc::winsize,
    /// Where the master goes: the launcher's end of a socket pair.
    pub socket: RawFd,
}

impl Setup {
    /// A setup for a terminal of `size` whose master is sent on `socket`.
    pub fn new(size: Winsize, socket: RawFd) -> Setup {
        Setup {
            size: size.to_libc(),
            socket,
        }
    }

    /// Opens a terminal of the current mount namespace's `/dev/ptmx`
    /// (async-signal-safe), sets its size, sends the master on the socket
    /// and closes it here: the terminal's other side, not yet anyone's
    /// controlling terminal.
    pub fn open(&self) -> std::io::Result<RawFd> {
        let (master, slave) = open_pair(&self.size)?;
        let sent = send_fd(self.socket, master);
        // SAFETY: both descriptors were opened above and are owned here.
        unsafe {
            libc::close(master);
            if let Err(e) = sent {
                libc::close(slave);
                return Err(e);
            }
        }
        Ok(slave)
    }
}

/// A new terminal of `/dev/ptmx` of size `size` (async-signal-safe):
/// `(master, slave)`, both close-on-exec, the slave not yet anyone's
/// controlling terminal.
fn open_pair(size: &libc::winsize) -> std::io::Result<(RawFd, RawFd)> {
    // SAFETY: system calls on a C string literal, descriptors this process
    // owns and a winsize it borrows.
    unsafe {
        let master = check(libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?;
        let unlock: c_int = 0;
        let slave = check(libc::ioctl(master, libc::TIOCSPTLCK, &unlock))
            .and_then(|_| check(libc::ioctl(master, libc::TIOCSWINSZ, size)))
            .and_then(|_| {
                check(libc::ioctl(
                    master,
                    libc::TIOCGPTPEER,
                    libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
                ))
            });
        match slave {
            Ok(slave) => Ok((master, slave)),
            Err(e) => {
                libc::close(master);
                Err(e)
            }
        }
    }
}

/// In the forked command (async-signal-safe): a new session whose
/// controlling terminal is `slave`, which becomes stdin, stdout and
/// stderr. On failure it says so on the terminal and exits 126.
pub(crate) fn attach(slave: RawFd) {
    // SAFETY: system calls on descriptors this process owns.
    unsafe {
        let ok = libc::setsid() >= 0
            && (0..3).all(|fd| slave == fd || libc::dup2(slave, fd) == fd)
            && libc::ioctl(0, libc::TIOCSCTTY, 0) == 0;
        if !ok {
            let msg = b"createos-local: the terminal could not become the command's controlling terminal\n";
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(126);
        }
        if slave > 2 {
            libc::close(slave);
        }
    }
}

fn check(ret: c_int) -> std::io::Result<c_int> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Room for one descriptor's control message, 8-byte aligned.
type CmsgBuf = [u64; 4];

/// Sends descriptor `fd` over the Unix socket `socket` (async-signal-safe:
/// one `sendmsg`, buffers on the stack).
pub(crate) fn send_fd(socket: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut buf: CmsgBuf = [0; 4];
    // SAFETY: the message points at live stack buffers large enough for
    // one descriptor (checked against CMSG_SPACE).
    unsafe {
        let space = libc::CMSG_SPACE(size_of::<c_int>() as u32) as usize;
        if space > size_of::<CmsgBuf>() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>(), fd);
        loop {
            let n = libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

/// Takes a descriptor [`send_fd`] sent (already queued: the call does not
/// wait).
pub(crate) fn recv_fd(socket: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut buf: CmsgBuf = [0; 4];
    // SAFETY: as in `send_fd`; a received descriptor is owned from here.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<CmsgBuf>() as _;
        let n = libc::recvmsg(
            socket.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        );
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::other(
                "the launcher sent no terminal descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// A socket pair for handing a master from the launcher to the server:
/// `(server's end, launcher's end)`, both close-on-exec.
pub(crate) fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: socketpair fills the two-element array.
    unsafe {
        check(libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        ))?;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// A terminal allocated by the server itself (process-group mode):
/// `(master, slave)`, the slave not yet anyone's controlling terminal.
pub(crate) fn open_here(size: Winsize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (master, slave) = open_pair(&size.to_libc())?;
    // SAFETY: `open_pair` returned two descriptors this process owns.
    unsafe { Ok((OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave))) }
}

/// The server's side of a terminal: its master.
#[derive(Debug)]
pub struct Terminal {
    master: AsyncFd<OwnedFd>,
    size: Mutex<Winsize>,
}

impl Terminal {
    /// Takes over a master (made non-blocking here) of a terminal whose
    /// size is `size`.
    pub fn new(master: OwnedFd, size: Winsize) -> std::io::Result<Terminal> {
        let flags = rustix::fs::fcntl_getfl(&master)?;
        rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
        // SAFETY: the AsyncFd owns the master; nothing else closes or
        // replaces it while it is registered.
        let master = unsafe {
            AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE)
        }?;
        Ok(Terminal {
            master,
            size: Mutex::new(size),
        })
    }

    /// The current window size.
    pub fn size(&self) -> Winsize {
        *self.size.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the window size (the kernel tells the foreground process
    /// group with `SIGWINCH`).
    pub fn resize(&self, size: Winsize) -> std::io::Result<()> {
        let mut current = self.size.lock().unwrap_or_else(|p| p.into_inner());
        let ws = size.to_libc();
        // SAFETY: an ioctl on the master this value owns, with a winsize
        // on the stack.
        check(unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) })?;
        *current = size;
        Ok(())
    }

    /// Writes some of `data` once the terminal takes input: how many bytes
    /// were written.
    pub async fn write_some(&self, data: &[u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.master.writable().await?;
            match guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), data)?)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads some output, waiting for it: `Ok(0)` once no process holds
    /// the terminal any more (the kernel answers `EIO` then).
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            let read = guard.try_io(|fd| match rustix::io::read(fd.get_ref(), &mut *buf) {
                Ok(n) => Ok(n),
                Err(rustix::io::Errno::IO) => Ok(0),
                Err(e) => Err(e.into()),
            });
            match read {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_one_to_the_limit_are_refused_with_a_reason() {
        assert_eq!(
            Winsize::new(120, 30),
            Ok(Winsize {
                cols: 120,
                rows: 30
            })
        );
        for (c, r) in [(0, 24), (80, 0), (MAX_SIDE + 1, 24), (80, u64::MAX)] {
            let why = Winsize::new(c, r).expect_err("refused");
            assert!(why.to_string().contains("a terminal has 1 to"), "{why}");
        }
    }

    /// A bwrap sandbox without a machine has nowhere to open a terminal
    /// before its command starts: refused, never a terminal of the host.
    #[test]
    fn a_bwrap_command_without_a_machine_gets_no_terminal() {
        let root = std::env::temp_dir().join(format!("no-machine-{}", std::process::id()));
        let spec = crate::machine::isolation::SpawnSpec {
            root: root.clone(),
            cmd: "tty".into(),
            args: vec![],
            cwd: "/".into(),
            host_cwd: root,
            env: vec![],
            marker: "no-machine".into(),
            terminal: Some(Winsize::DEFAULT),
            registries: Default::default(),
        };
        let refused =
            crate::machine::isolation::spawn(Some(std::path::Path::new("/bin/false")), &spec)
                .err()
                .expect("refused");
        assert_eq!(refused.kind(), std::io::ErrorKind::Unsupported);
        assert!(refused.to_string().contains("machine"), "{refused}");
    }

    #[tokio::test]
    async fn a_terminal_opened_here_carries_bytes_and_its_size() {
        let (master, slave) = open_here(Winsize { cols: 77, rows: 11 }).expect("a terminal");
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: an ioctl on a descriptor owned here into a stack value.
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (77, 11));
        let term = Terminal::new(master, Winsize { cols: 77, rows: 11 }).expect("master");
        term.resize(Winsize { cols: 90, rows: 12 }).expect("resize");
        // SAFETY: as above.
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!((ws.ws_col, ws.ws_row), (90, 12));
        assert_eq!(term.write_some(b"hi\n").await.expect("write"), 3);
        let mut buf = [0u8; 16];
        let n = rustix::io::read(&slave, &mut buf).expect("read");
        assert_eq!(&buf[..n], b"hi\n");
    }
}
