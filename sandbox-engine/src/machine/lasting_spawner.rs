//! The one thread that starts every machine's outer `bwrap`, and lives as
//! long as the server's process.
//!
//! A machine's bwrap runs with `--die-with-parent`: the kernel sends it
//! (and, through bwrap, its init) SIGKILL when its parent ends, however
//! the parent ends, SIGKILL included. Its "parent" for that signal is the
//! *thread* that forked it, not the process: started from a pool thread
//! that retires when idle (tokio's blocking threads leave after 10 s), a
//! machine would die with that thread. Started from this thread, which
//! never returns, it dies exactly when the server's process does.
//!
//! This closes the window the death guard ([`crate::trees::deathguard`])
//! leaves: the guard learns of a machine only once its init is known, so
//! a server killed between the fork and that moment used to leave the
//! machine running, unrecorded, for a successor that could not know it.

use std::process::{Child, Command};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

/// A command to start, and where its outcome goes.
type Job = (Command, Sender<std::io::Result<Child>>);

/// The lasting thread's queue, made with the thread on first use.
fn queue() -> std::io::Result<Sender<Job>> {
    // Process-wide: one thread per process, the parent every machine dies with.
    static QUEUE: OnceLock<Mutex<Option<Sender<Job>>>> = OnceLock::new();
    let mut slot = QUEUE
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(tx) = slot.as_ref() {
        return Ok(tx.clone());
    }
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name("createos-local-machines".into())
        .spawn(move || {
            // The queue's sender is kept in a static, so this loop (and
            // the thread) ends only with the process.
            for (mut cmd, outcome) in rx {
                let _ = outcome.send(cmd.spawn());
            }
        })?;
    *slot = Some(tx.clone());
    Ok(tx)
}

/// Starts `cmd` from the lasting thread; its child, or why it did not
/// start.
pub fn spawn(cmd: Command) -> std::io::Result<Child> {
    let lost = || std::io::Error::other("the thread that starts sandbox machines has ended");
    let (tx, rx) = channel();
    queue()?.send((cmd, tx)).map_err(|_| lost())?;
    rx.recv().map_err(|_| lost())?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child started here has the lasting thread as its parent thread:
    /// it outlives the thread that asked for it, and it is a child of
    /// this process (waited for here).
    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("0.3");
            // PR_SET_PDEATHSIG as `--die-with-parent` sets it: the child
            // would die at once if its parent thread were this one.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    rustix::process::set_parent_process_death_signal(Some(
                        rustix::process::Signal::KILL,
                    ))
                    .map_err(std::io::Error::from)
                });
            }
            spawn(cmd).expect("spawned")
        })
        .join()
        .expect("the asking thread ended");
        let mut child = child;
        let status = child.wait().expect("waited");
        assert!(
            status.success(),
            "the child was killed when the thread that asked for it ended: {status}"
        );
    }
}
