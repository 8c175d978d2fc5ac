//! Cancellation: a token the host triggers from any thread, and the
//! `wasi:io/poll` pollable the guest receives from `host.cancellation`.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;
use wasmtime_wasi::p2::Pollable;

/// Asks a running operation to stop. Cloneable; [`cancel`](Self::cancel)
/// works from any thread, at any time, and is permanent.
///
/// Give a clone to [`HostOptions::with_cancel`](crate::HostOptions::with_cancel);
/// the guest sees it through `host.cancellation()`, a pollable that becomes
/// ready once the token is cancelled (also when it was cancelled before the
/// guest asked).
#[derive(Clone)]
pub struct CancelToken {
    state: Arc<watch::Sender<bool>>,
}

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        CancelToken {
            state: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Cancels the token: every pollable made from it becomes ready.
    pub fn cancel(&self) {
        self.state.send_replace(true);
    }

    /// Whether [`cancel`](Self::cancel) has been called.
    pub fn is_cancelled(&self) -> bool {
        *self.state.borrow()
    }

    /// The shared state; clones of one token share it.
    pub(crate) fn shared(&self) -> &Arc<watch::Sender<bool>> {
        &self.state
    }

    /// The host-side pollable the `cancellation` import hands to the guest.
    pub(crate) fn pollable(&self) -> CancelPollable {
        CancelPollable {
            receiver: self.state.subscribe(),
        }
    }
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// The resource behind the guest's cancellation pollable. It waits on the
/// token's watch channel, so `wasi:io/poll.poll` blocks without spinning.
pub(crate) struct CancelPollable {
    receiver: watch::Receiver<bool>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for CancelPollable {
    async fn ready(&mut self) {
        if self
            .receiver
            .wait_for(|cancelled| *cancelled)
            .await
            .is_err()
        {
            // The token can no longer be cancelled: never ready.
            std::future::pending::<()>().await;
        }
    }
}
