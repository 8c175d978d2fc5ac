//! The live output of one `execute`, handed to the embedder's sink on a
//! thread of its own through a bounded queue.
//!
//! A sink that is slow slows the command (the queue fills, the provider
//! waits in `emit-output`, stops reading the stream, and the server stops
//! reading the command's pipes): backpressure, never loss. A sink that never
//! returns (a reader that is never resumed) cannot hold the command past
//! its own timeout: once that has passed, a chunk the full queue cannot
//! take is counted instead of waited for (unless the sink took a chunk in
//! the last [`GRACE`]), so the provider gets control back and ends the
//! command as timed out. What the sink did not consume makes the outcome an
//! `output-lost` with the operation [`OUTPUT_SINK`], never a clean result.
//! A sink that fails (panics) can take nothing more: the command is
//! cancelled at once (as a pipeline's writer ends when its reader is
//! gone), and the `cancelled` it ends with is that same `output-lost`.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::messages::OUTPUT_SINK;
use crate::wasm::bindings::types::{
    ExecuteResult, OutputLoss, OutputStream, PartialOutput, ProviderError,
};
use crate::wasm::cancel::CancelToken;
use crate::wasm::options::{ChunkSink, OutputSink};

/// Chunks queued ahead of the sink before `emit-output` waits.
const QUEUE: usize = 16;
/// Past the command's timeout, how long a sink may take over one chunk and
/// still count as reading.
const GRACE: Duration = Duration::from_secs(1);
/// The longest command timeout the relay waits for (the deadlines' cap).
const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// The sink's side of one `execute` (see the module docs).
pub(crate) struct Relay {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// The command's timeout.
    limit: Instant,
    /// The operation's cancellation, pulled when the sink fails.
    cancel: CancelToken,
}

struct State {
    queue: VecDeque<(OutputStream, Vec<u8>)>,
    /// Bytes of the chunk the sink is inside (0 when it is not).
    in_sink: u64,
    /// When the sink last returned (or the relay started).
    progress: Instant,
    /// Bytes counted as not consumed.
    unconsumed: u64,
    /// `execute` returned: nothing more comes.
    closed: bool,
    /// The sink panicked: it takes nothing more.
    failed: bool,
}

impl Relay {
    /// Starts the thread that calls `sink`; returns the sink to give the
    /// instance. `timeout` is the command's own; `cancel` is the
    /// operation's, pulled when the sink fails.
    pub(crate) fn start(
        sink: OutputSink,
        timeout: Duration,
        cancel: CancelToken,
    ) -> (ChunkSink, Relay) {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(QUEUE),
                in_sink: 0,
                progress: now,
                unconsumed: 0,
                closed: false,
                failed: false,
            }),
            changed: Condvar::new(),
            limit: now + timeout.min(MAX_WAIT),
            cancel,
        });
        {
            let shared = shared.clone();
            // Not joined: a sink that never returns keeps this thread, not
            // the command.
            let _ = std::thread::Builder::new()
                .name("output-relay".into())
                .spawn(move || shared.deliver(&sink));
        }
        let emit: ChunkSink = {
            let shared = shared.clone();
            Arc::new(move |stream, chunk: Vec<u8>| shared.push(stream, chunk))
        };
        (emit, Relay { shared })
    }

    /// Waits until the sink took everything queued (or, once the command's
    /// timeout has passed, gives up on a sink that stopped taking chunks)
    /// and returns how many bytes it did not consume, and whether the sink
    /// failed.
    pub(crate) fn finish(self) -> Unconsumed {
        let shared = &self.shared;
        let mut state = shared.lock();
        state.closed = true;
        shared.changed.notify_all();
        while !state.queue.is_empty() || state.in_sink > 0 {
            let Some(wait) = shared.wait_left(&state) else {
                let queued: u64 = state.queue.iter().map(|(_, c)| c.len() as u64).sum();
                state.unconsumed += queued + state.in_sink;
                state.queue.clear();
                // What the sink may still finish is counted already.
                state.in_sink = 0;
                break;
            };
            state = shared.wait(state, wait);
        }
        Unconsumed {
            bytes: state.unconsumed,
            sink_failed: state.failed,
        }
    }
}

/// What the sink of one `execute` did not take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unconsumed {
    /// Bytes it did not consume.
    pub(crate) bytes: u64,
    /// It failed (panicked), and the command was cancelled for it.
    pub(crate) sink_failed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>, wait: Duration) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// How much longer a full queue is waited for: until the command's
    /// timeout, then while the sink keeps taking chunks; `None` to give up.
    fn wait_left(&self, state: &State) -> Option<Duration> {
        if state.failed {
            return None;
        }
        let now = Instant::now();
        let until = if now < self.limit {
            self.limit
        } else {
            state.progress + GRACE
        };
        until.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// `emit-output`: queues the chunk, waiting while the queue is full.
    fn push(&self, stream: OutputStream, chunk: Vec<u8>) {
        let mut state = self.lock();
        loop {
            if state.failed {
                state.unconsumed += chunk.len() as u64;
                return;
            }
            if state.queue.len() < QUEUE {
                state.queue.push_back((stream, chunk));
                self.changed.notify_all();
                return;
            }
            match self.wait_left(&state) {
                Some(wait) => state = self.wait(state, wait),
                None => {
                    state.unconsumed += chunk.len() as u64;
                    return;
                }
            }
        }
    }

    /// The relay thread: hands queued chunks to `sink`, in order.
    fn deliver(&self, sink: &OutputSink) {
        loop {
            let (stream, chunk) = {
                let mut state = self.lock();
                loop {
                    if let Some(item) = state.queue.pop_front() {
                        state.in_sink = item.1.len() as u64;
                        break item;
                    }
                    if state.closed || state.failed {
                        return;
                    }
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.changed.notify_all();
            let taken = catch_unwind(AssertUnwindSafe(|| sink(stream, &chunk))).is_ok();
            let mut state = self.lock();
            if !taken {
                let queued: u64 = state.queue.iter().map(|(_, c)| c.len() as u64).sum();
                state.unconsumed += queued + state.in_sink;
                state.queue.clear();
                state.failed = true;
                // Nothing can take the output any more: stop the command.
                self.cancel.cancel();
            }
            state.in_sink = 0;
            state.progress = Instant::now();
            self.changed.notify_all();
        }
    }
}

/// `outcome` with `unconsumed` bytes the sink did not take: a result
/// becomes an `output-lost` of [`OUTPUT_SINK`] (the provider confirmed the
/// command ended, so its tree is gone); an error stays as it is (it is not
/// clean already).
pub(crate) fn with_unconsumed(
    outcome: Result<Result<ExecuteResult, ProviderError>>,
    unconsumed: Unconsumed,
) -> Result<Result<ExecuteResult, ProviderError>> {
    let loss = |process_id, partial| {
        Ok(Err(ProviderError::OutputLost(OutputLoss {
            operation: OUTPUT_SINK.to_owned(),
            process_id,
            lost_bytes: Some(unconsumed.bytes),
            lost_chunks: None,
            tree_deleted: true,
            partial,
        })))
    };
    match outcome {
        Ok(Ok(result)) if unconsumed.bytes > 0 => loss(
            Some(result.process_id),
            PartialOutput {
                stdout: result.stdout,
                stderr: result.stderr,
                timed_out: result.timed_out,
                output_truncated: result.output_truncated,
            },
        ),
        // Cancelled for the failed sink (`cancelled` comes only once the
        // command's tree is confirmed gone).
        Ok(Err(ProviderError::Cancelled(partial))) if unconsumed.sink_failed => loss(
            None,
            partial.unwrap_or(PartialOutput {
                stdout: String::new(),
                stderr: String::new(),
                timed_out: false,
                output_truncated: false,
            }),
        ),
        other => other,
    }
}
