//! The interactive side of a managed process (issue 38): a terminal's
//! output, input written while the command runs (to its terminal or its
//! stdin pipe), and a terminal's size.

use std::io::ErrorKind;

use super::*;

/// After the leader of a terminal process has been reaped, how long the
/// reader waits for more of what it wrote when a background process still
/// holds the terminal (see [`drain_terminal`]).
const QUIET: Duration = Duration::from_millis(250);

/// Why input was not (wholly) written; `written` bytes of it were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputError {
    /// The process's stdin was closed (`stdin/close`).
    Closed,
    /// The command has exited, or no longer reads its input.
    Exited {
        /// Bytes written before.
        written: usize,
    },
    /// The command did not take the input in the time allowed.
    Blocked {
        /// Bytes written before.
        written: usize,
    },
    /// The server could not write (a message for people).
    Failed {
        /// Bytes written before.
        written: usize,
        /// What failed.
        reason: String,
    },
}

/// Why a resize was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeError {
    /// A pipe process has no terminal.
    NotATerminal,
    /// The command has exited.
    Exited,
    /// The kernel refused (a message for people).
    Failed(String),
}

impl Process {
    /// Whether this is a `pty` process.
    pub fn is_terminal(&self) -> bool {
        self.terminal_size.is_some()
    }

    /// A `pty` process's current window size.
    pub fn terminal_size(&self) -> Option<Winsize> {
        match self.terminal.get() {
            Some(t) => Some(t.size()),
            None => self.terminal_size,
        }
    }

    /// Sets a `pty` process's window size.
    pub fn resize(&self, size: Winsize) -> Result<(), ResizeError> {
        if !self.is_terminal() {
            return Err(ResizeError::NotATerminal);
        }
        if self.exited().0 {
            return Err(ResizeError::Exited);
        }
        let Some(term) = self.terminal.get() else {
            return Err(ResizeError::Exited);
        };
        term.resize(size)
            .map_err(|e| ResizeError::Failed(format!("the terminal could not be resized ({e})")))
    }

    /// Writes `data` to the command's terminal or stdin pipe, waiting at
    /// most `patience` for it to take everything. Requests write one at a
    /// time, in order. Input to a command that has exited is refused; a
    /// `stdin/close` while a write waits closes the pipe once that write
    /// is done.
    pub async fn write_input(&self, data: &[u8], patience: Duration) -> Result<(), InputError> {
        let _order = self.input_lock.lock().await;
        // Closed first: a command may exit because its stdin was closed,
        // and the caller's mistake is the input after the close.
        if !self.is_terminal() && self.stdin_closed.load(Ordering::SeqCst) {
            return Err(InputError::Closed);
        }
        if self.exited().0 {
            return Err(InputError::Exited { written: 0 });
        }
        let deadline = tokio::time::Instant::now() + patience;
        if self.is_terminal() {
            let Some(term) = self.terminal.get().cloned() else {
                return Err(InputError::Exited { written: 0 });
            };
            return write_all(data, deadline, |rest| {
                let term = term.clone();
                let rest = rest.to_vec();
                async move { term.write_some(&rest).await }
            })
            .await;
        }
        if self.stdin_closed.load(Ordering::SeqCst) {
            return Err(InputError::Closed);
        }
        let Some(stdin) = lock(&self.stdin).take() else {
            return Err(InputError::Closed);
        };
        let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
        let result = write_all(data, deadline, |rest| {
            let stdin = stdin.clone();
            let rest = rest.to_vec();
            async move {
                let mut pipe = stdin.lock().await;
                tokio::io::AsyncWriteExt::write(&mut *pipe, &rest).await
            }
        })
        .await;
        // Back for the next request, unless stdin was closed meanwhile (then
        // it closes here).
        if let Ok(pipe) = Arc::try_unwrap(stdin) {
            if !self.stdin_closed.load(Ordering::SeqCst) {
                *lock(&self.stdin) = Some(pipe.into_inner());
            }
        }
        result
    }

    /// Takes over the master of a new `pty` process's terminal and starts
    /// reading it into the journal: the receiver answers once the reader
    /// holds every byte the leader wrote (see [`spawn_terminal_reader`]).
    /// Without a master (the launcher's could not be received) the tree is
    /// ended and the start is the server's failure.
    pub(super) async fn start_terminal(
        self: &Arc<Self>,
        master: Option<OwnedFd>,
        size: Winsize,
        reaped: watch::Receiver<bool>,
    ) -> oneshot::Receiver<()> {
        let term = master.map(|m| Terminal::new(m, size));
        match term {
            Some(Ok(term)) => {
                let term = Arc::new(term);
                let _ = self.terminal.set(term.clone());
                spawn_terminal_reader(self.clone(), term, reaped)
            }
            failed => {
                let why = match failed {
                    Some(Err(e)) => e.to_string(),
                    _ => "its descriptor did not arrive".to_string(),
                };
                let t = self.terminate(Duration::ZERO).await;
                let outcome = if t.verified {
                    "the command was ended; nothing runs"
                } else {
                    "the command could not be proven ended"
                };
                *lock(&self.server_failure) = Some(format!(
                    "the server could not take the command's terminal ({why}); {outcome}"
                ));
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(());
                rx
            }
        }
    }
}

/// Writes all of `data` through `write` (one write of some of the rest per
/// call) until `deadline`.
async fn write_all<F, Fut>(
    data: &[u8],
    deadline: tokio::time::Instant,
    write: F,
) -> Result<(), InputError>
where
    F: Fn(&[u8]) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<usize>>,
{
    let mut written = 0;
    while written < data.len() {
        let rest = &data[written..written + (data.len() - written).min(64 * 1024)];
        match tokio::time::timeout_at(deadline, write(rest)).await {
            Err(_) => return Err(InputError::Blocked { written }),
            Ok(Ok(0)) => return Err(InputError::Exited { written }),
            Ok(Ok(n)) => written += n,
            Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
            Ok(Err(e))
                if e.kind() == ErrorKind::BrokenPipe || e.raw_os_error() == Some(libc::EIO) =>
            {
                return Err(InputError::Exited { written })
            }
            Ok(Err(e)) => {
                return Err(InputError::Failed {
                    written,
                    reason: e.to_string(),
                })
            }
        }
    }
    Ok(())
}

/// Reads a terminal's master into the journal (as the pipe readers do,
/// [`spawn_reader`], with the same backpressure), all output as one
/// stream.
///
/// Once the leader is reaped: when nothing else holds the terminal, the
/// kernel hands the master everything written to it and then `EIO`, and
/// the reader reports `drained` at that end. A background process that
/// still holds the terminal gives no such end: the reader then takes what
/// comes until [`QUIET`] passes without output (the kernel moves terminal
/// output to the master in a worker of its own, a moment after the
/// write), at most 1 MiB, and reports `drained`. What comes later is read
/// and dropped.
fn spawn_terminal_reader(
    proc: Arc<Process>,
    term: Arc<Terminal>,
    mut reaped: watch::Receiver<bool>,
) -> oneshot::Receiver<()> {
    let (drained_tx, drained_rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let at_eof = loop {
            if !room(&proc, &mut reaped).await {
                break false;
            }
            tokio::select! {
                biased;
                _ = reaped.wait_for(|r| *r) => break false,
                read = term.read(&mut buf) => match read {
                    Ok(0) => break true,
                    Ok(n) => proc.push(StreamKind::Stdout, Bytes::copy_from_slice(&buf[..n])),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break true,
                },
            }
        };
        let at_eof = at_eof || drain_terminal(&proc, &term, &mut buf).await;
        let _ = drained_tx.send(());
        if !at_eof {
            while let Ok(n) = term.read(&mut buf).await {
                if n == 0 {
                    return;
                }
            }
        }
    });
    drained_rx
}

/// What is left of a reaped leader's terminal output (see
/// [`spawn_terminal_reader`]); `true` at the terminal's end.
async fn drain_terminal(proc: &Process, term: &Terminal, buf: &mut [u8]) -> bool {
    let mut budget = 1024 * 1024usize;
    while budget > 0 {
        match tokio::time::timeout(QUIET, term.read(buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(n)) => {
                proc.push(StreamKind::Stdout, Bytes::copy_from_slice(&buf[..n]));
                budget = budget.saturating_sub(n);
            }
        }
    }
    false
}
