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
    /// What [`Interaction::try_send`] lets through, and what it saw.
    checks: Mutex<Checks>,
    /// Bumped by every event queued (the pollable's wake-up).
    queued: watch::Sender<u64>,
    /// Set once by the guest's `interaction-started`.
    started: watch::Sender<bool>,
}

/// What a process can take, for [`Interaction::try_send`].
#[derive(Debug, Default, Clone, Copy)]
struct Checks {
    /// The process's kind, when known: `Some(true)` a terminal.
    terminal: Option<bool>,
    /// The provider claims `terminal-resize`.
    resizable: bool,
    /// `close-input` was sent.
    input_closed: bool,
    /// `end` was sent.
    ended: bool,
}

/// Why [`Interaction::try_send`] refused an event: the process could not
/// take it, so it was not sent (and the process runs on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRefused {
    /// A `resize` of a process with pipes, which has no terminal.
    ResizeOfPipes,
    /// A `resize` on a provider that does not claim `terminal-resize`:
    /// the terminal keeps the size it opened with.
    ResizeUnsupported,
    /// A `close-input` to a terminal, whose end of input is the byte
    /// `0x04` (`^D`).
    CloseOfTerminal,
    /// Input after `close-input`: the process's stdin is closed.
    InputClosed,
    /// An event after `end`.
    Ended,
}

impl fmt::Display for EventRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventRefused::ResizeOfPipes => {
                "a process with pipes has no terminal to resize; nothing was sent"
            }
            EventRefused::ResizeUnsupported => {
                "the provider cannot resize a terminal (it does not claim terminal-resize);                  the terminal keeps the size it opened with"
            }
            EventRefused::CloseOfTerminal => {
                "a terminal's input is not closed: send the byte 0x04 (^D) as input instead"
            }
            EventRefused::InputClosed => {
                "the process's input was closed (close-input); nothing more can reach it"
            }
            EventRefused::Ended => "the process was asked to end; it takes no more events",
        })
    }
}

impl std::error::Error for EventRefused {}

/// The events of one interactive process, shared between whoever talks to
/// it (any thread) and the instance running `interact`. Cloneable; give a
/// clone to [`HostOptions::with_interaction`](crate::HostOptions::with_interaction).
///
/// Events are handed to the guest in the order they were sent, each once.
/// The host decides what may be sent: [`try_send`](Self::try_send)
/// refuses what the process cannot take (a `resize` of pipes or on a
/// provider without `terminal-resize`, `close-input` to a terminal,
/// anything after the input's end or after `end`) with a typed
/// [`EventRefused`], and the process runs on; [`send`](Self::send) queues
/// as it is told. The guest carries out what it takes.
#[derive(Clone, Default)]
pub struct Interaction {
    shared: Arc<Shared>,
}

impl Interaction {
    /// An interaction with no event queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// An interaction for a process with a terminal (`terminal`) or pipes,
    /// on a provider that claims `terminal-resize` (`resizable`) or not:
    /// what [`try_send`](Self::try_send) checks.
    pub fn for_process(terminal: bool, resizable: bool) -> Self {
        let interaction = Self::default();
        *interaction.checks() = Checks {
            terminal: Some(terminal),
            resizable,
            ..Checks::default()
        };
        interaction
    }

    /// Queues `event` when the process can take it (see [`EventRefused`]);
    /// a refused event is not sent. Without a known kind
    /// ([`Interaction::new`]) only the order is checked (nothing after
    /// `end`, no input after `close-input`).
    pub fn try_send(&self, event: InteractionEvent) -> Result<(), EventRefused> {
        {
            let mut checks = self.checks();
            if checks.ended {
                return Err(EventRefused::Ended);
            }
            match &event {
                InteractionEvent::Resize(_) if checks.terminal == Some(false) => {
                    return Err(EventRefused::ResizeOfPipes)
                }
                InteractionEvent::Resize(_) if checks.terminal.is_some() && !checks.resizable => {
                    return Err(EventRefused::ResizeUnsupported)
                }
                InteractionEvent::CloseInput if checks.terminal == Some(true) => {
                    return Err(EventRefused::CloseOfTerminal)
                }
                InteractionEvent::Input(_) | InteractionEvent::CloseInput
                    if checks.input_closed =>
                {
                    return Err(EventRefused::InputClosed)
                }
                InteractionEvent::CloseInput => checks.input_closed = true,
                InteractionEvent::End => checks.ended = true,
                _ => {}
            }
        }
        self.send(event);
        Ok(())
    }

    fn checks(&self) -> std::sync::MutexGuard<'_, Checks> {
        self.shared.checks.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wasm::bindings::types::TerminalSize;

    const SIZE: TerminalSize = TerminalSize {
        columns: 100,
        rows: 40,
    };

    /// Events a process cannot take are refused, typed, and not queued;
    /// the ones it can take still go (issue 38 item 6).
    #[test]
    fn what_a_process_cannot_take_is_refused_and_not_sent() {
        let pipes = Interaction::for_process(false, true);
        assert_eq!(
            pipes.try_send(InteractionEvent::Resize(SIZE)),
            Err(EventRefused::ResizeOfPipes)
        );
        pipes
            .try_send(InteractionEvent::Input(b"a".to_vec()))
            .unwrap();
        pipes.try_send(InteractionEvent::CloseInput).unwrap();
        assert_eq!(
            pipes.try_send(InteractionEvent::Input(b"late".to_vec())),
            Err(EventRefused::InputClosed)
        );
        assert_eq!(
            pipes.try_send(InteractionEvent::CloseInput),
            Err(EventRefused::InputClosed)
        );
        assert_eq!(pipes.pending(), 2);

        let fixed = Interaction::for_process(true, false);
        assert_eq!(
            fixed.try_send(InteractionEvent::Resize(SIZE)),
            Err(EventRefused::ResizeUnsupported)
        );
        assert_eq!(
            fixed.try_send(InteractionEvent::CloseInput),
            Err(EventRefused::CloseOfTerminal)
        );
        fixed.try_send(InteractionEvent::Input(vec![0x04])).unwrap();
        fixed.try_send(InteractionEvent::End).unwrap();
        assert_eq!(
            fixed.try_send(InteractionEvent::Input(b"x".to_vec())),
            Err(EventRefused::Ended)
        );
        assert_eq!(fixed.pending(), 2);
        assert!(EventRefused::CloseOfTerminal.to_string().contains("^D"));

        let resizable = Interaction::for_process(true, true);
        resizable.try_send(InteractionEvent::Resize(SIZE)).unwrap();
        assert_eq!(resizable.pending(), 1);
    }
}
