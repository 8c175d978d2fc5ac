//! One engine-wide budget for the output that finished processes keep
//! (issue 40 item 4).
//!
//! A finished process (leader exited, tree gone) keeps its output journal
//! for a replay (`/connect?after=N`, Daytona logs) until the per-sandbox
//! retention drops it ([`crate::sandboxes::store::Retention`]: by count and age). That
//! alone let the engine grow from 7 to 301 MB of RSS with 300 finished
//! commands of 1 MB each before it pruned. Here every managed process
//! (and Daytona session command run in the background, the journals a
//! reader may come back to) is counted when it finishes, with the bytes
//! its journal holds; as soon as the total passes the budget, the output
//! of the oldest finished processes is evicted, their records (exit code,
//! times) stay. A replay of evicted output is the 410
//! `output_offset_expired` of any evicted offset. Never evicted: the
//! output of the process that just finished (so the budget is passed by
//! at most one journal, [`crate::storage::journal::DEFAULT_CAPACITY`] by
//! default), and output a reader is attached to (it is counted again at
//! the next finish). One-shot `exec` and synchronous commands answer
//! their output themselves and are not counted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

/// What the budget evicts: a finished process's kept output (a
/// supervised [`crate::sandboxes::supervisor::Process`]; passed in as this
/// trait so that the budget needs nothing of the supervisor, which uses
/// it).
pub(crate) trait KeepsOutput: Send + Sync {
    /// Evicts the output it keeps. `None`, nothing evicted, while a reader
    /// is attached.
    fn evict_output(&self) -> Option<usize>;
}

/// Default budget: 64 MiB of finished processes' output, engine-wide.
pub const DEFAULT_FINISHED_OUTPUT: usize = 64 << 20;

/// Parses a budget such as `64M`, `1G` or `1048576` (binary units).
pub fn parse_budget(text: &str) -> Result<u64, crate::util::InvalidSize> {
    crate::util::parse_bytes(text)
}

/// The budget and the finished processes it counts, oldest first.
#[derive(Debug)]
pub struct OutputBudget {
    limit: usize,
    finished: Mutex<Finished>,
}

#[derive(Debug, Default)]
struct Finished {
    queue: VecDeque<(Weak<dyn KeepsOutput>, usize)>,
    total: usize,
}

impl OutputBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> OutputBudget {
        OutputBudget {
            limit,
            finished: Mutex::new(Finished::default()),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Counts `process`, which just finished holding `bytes` of output,
    /// and evicts the output of the oldest finished processes while the
    /// total is over the budget.
    pub(crate) fn finished(&self, process: Weak<dyn KeepsOutput>, bytes: usize) {
        let victims = {
            let mut f = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            // Processes already dropped (retention, sandbox delete) free
            // their share.
            let mut freed = 0;
            f.queue.retain(|(p, b)| {
                let alive = p.strong_count() > 0;
                if !alive {
                    freed += b;
                }
                alive
            });
            f.total -= freed;
            f.queue.push_back((process, bytes));
            f.total += bytes;
            let mut victims = Vec::new();
            while f.total > self.limit && f.queue.len() > 1 {
                if let Some((p, b)) = f.queue.pop_front() {
                    f.total -= b;
                    victims.push((p, b));
                }
            }
            victims
        };
        if victims.is_empty() {
            return;
        }
        let mut kept = Vec::new();
        for (p, b) in victims {
            if let Some(p) = p.upgrade() {
                if p.evict_output().is_none() {
                    kept.push((Arc::downgrade(&p), b));
                }
            }
        }
        if !kept.is_empty() {
            // Read by an attached reader: counted again, newest last.
            let mut f = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            for (p, b) in kept {
                f.total += b;
                f.queue.push_back((p, b));
            }
        }
        // The journals just freed are many 64 KiB allocations that glibc
        // keeps in its arenas: give them back to the system.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `malloc_trim` only releases free memory of the allocator.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Bytes of finished output counted now.
    pub fn counted(&self) -> usize {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .total
    }
}
