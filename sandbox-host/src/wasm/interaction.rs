//! The input of an interactive process (contract 0.6.0,
//! `provider.interact`): the events a host queues while the call runs, the
//! `wasi:io/poll` pollable the guest waits on (`host.interaction-events`),
//! and the guest's word that the process has started
//! (`host.interaction-started`).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use wasmtime_wasi::p2::Pollable;

use crate::wasm::bindings::types::InteractionEvent;

#[derive(Default)]
struct Shared {
    queue: Mutex<VecDeque<InteractionEvent>>,
    /// Bumped by every event queued (the pollable's wake-up).
    queued: watch::Sender<u64>,
    /// Set once by the guest's `interaction-started`.
    started: watch::Sender<bool>,
}

/// The events of one interactive process, shared between whoever talks to
/// it (any thread) and the instance running `interact`. Cloneable; give a
/// clone to [`HostOptions::with_interaction`](crate::HostOptions::with_interaction).
///
/// Events are handed to the guest in the order they were sent, each once.
/// The host decides what may be sent (no `resize` to a provider without
/// `terminal-resize` or to pipes, no `close-input` to a terminal): the
/// guest carries out what it takes.
#[derive(Clone, Default)]
pub struct Interaction {
    shared: Arc<Shared>,
}

impl Interaction {
    /// An interaction with no event queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues an event for the guest.
    pub fn send(&self, event: InteractionEvent) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(event);
        self.shared.queued.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// How many events wait for the guest.
    pub fn pending(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether the guest said its process started (`interaction-started`).
    pub fn has_started(&self) -> bool {
        *self.shared.started.borrow()
    }

    /// Waits until the guest says its process started; returns at once if
    /// it did.
    pub async fn started(&self) {
        let mut rx = self.shared.started.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The next event for the guest (`next-interaction-event`).
    pub(crate) fn next(&self) -> Option<InteractionEvent> {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// The guest's `interaction-started`.
    pub(crate) fn mark_started(&self) {
        self.shared.started.send_replace(true);
    }

    /// The pollable of `interaction-events`: ready while an event waits.
    pub(crate) fn pollable(&self) -> EventsPollable {
        EventsPollable {
            shared: self.shared.clone(),
            receiver: self.shared.queued.subscribe(),
        }
    }
}

impl fmt::Debug for Interaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interaction")
            .field("pending", &self.pending())
            .field("started", &self.has_started())
            .finish()
    }
}

/// The resource behind the guest's `interaction-events` pollable.
pub(crate) struct EventsPollable {
    shared: Arc<Shared>,
    receiver: watch::Receiver<u64>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for EventsPollable {
    async fn ready(&mut self) {
        loop {
            self.receiver.borrow_and_update();
            let waiting = !self
                .shared
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
            if waiting {
                return;
            }
            if self.receiver.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
