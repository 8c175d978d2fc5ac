//! What every accept loop of the engine (the API and toolbox listeners in
//! [`crate::network::connections`], each sandbox's egress proxy in
//! [`crate::network::egress`]) does when `accept` fails.
//!
//! A failure that belongs to one connection (it was reset or aborted
//! before it was taken) is skipped at once: the next connection is a new
//! one. Any other failure — the engine is out of descriptors (`EMFILE`),
//! the host is (`ENFILE`), the kernel has no memory or buffers for the
//! socket (`ENOMEM`, `ENOBUFS`) — leaves the connection in the queue, and
//! the listener stays readable: retrying at once spins a core until the
//! condition clears (issue 40: 8.6 s of CPU in 8 s with connections
//! waiting on a sandbox's proxy). The loop sleeps [`BACKOFF`] instead,
//! as hyper's and tokio's servers do.
//!
//! Out of descriptors, a waiting client would get no answer at all. The
//! API listeners keep one descriptor in [`Reserve`]: released, it lets
//! one waiting connection be taken and told that the engine is out of
//! descriptors (a 503), then it is taken back as soon as a descriptor is
//! free again.

use std::io;
use std::time::Duration;

/// How long an accept loop waits after a failure that leaves the queue
/// as it was.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// Whether `e` ended one connection only (reset or aborted before it was
/// accepted, an interrupted call): the loop goes on at once.
pub fn connection_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Whether `e` says the process or the host is out of descriptors.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Waits as a failed accept calls for: nothing for a failure of one
/// connection, [`BACKOFF`] for anything else.
pub async fn after_failure(e: &io::Error) {
    if !connection_only(e) {
        tokio::time::sleep(BACKOFF).await;
    }
}

/// One descriptor held back so that a listener out of descriptors can
/// still take a connection to answer it (see the module docs).
pub struct Reserve(Option<std::fs::File>);

impl Reserve {
    /// Holds a descriptor now (on `/dev/null`), if one can be had.
    pub fn new() -> Reserve {
        Reserve(std::fs::File::open("/dev/null").ok())
    }

    /// Gives the descriptor back to the process; whether there was one.
    pub fn release(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// Takes a descriptor back if none is held (fails quietly while the
    /// process is still out of them; the next call tries again).
    pub fn refill(&mut self) {
        if self.0.is_none() {
            self.0 = std::fs::File::open("/dev/null").ok();
        }
    }
}

impl Default for Reserve {
    fn default() -> Self {
        Self::new()
    }
}
