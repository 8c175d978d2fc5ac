//! Spacing of request starts per API origin, shared by every instance and
//! thread that uses the same [`Pacer`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The start of the last request to one key, behind a fair async lock.
type LastStart = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// Spaces the *actual* starts of requests at least `spacing` apart per key
/// (an origin). Cloning shares the schedule.
///
/// Each key has a fair (FIFO) lock holding the instant its last request
/// started. A caller takes the lock, sleeps until that instant plus the
/// spacing, records its own start and lets the next caller in. Spacing is
/// measured from when a request really went, so a caller that wakes late
/// (a busy machine) pushes the next one back instead of crowding it. A
/// caller that gives up while waiting (its deadline) just leaves the queue.
#[derive(Clone, Debug, Default)]
pub struct Pacer {
    keys: Arc<Mutex<HashMap<String, LastStart>>>,
}

impl Pacer {
    /// A pacer with its own schedule (tests that must not share the global one).
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide pacer [`Policy`](crate::Policy) uses by default.
    pub fn global() -> Pacer {
        static GLOBAL: OnceLock<Pacer> = OnceLock::new();
        GLOBAL.get_or_init(Pacer::new).clone()
    }

    /// Waits until a request to `key` may start, and records that it does.
    pub async fn wait_turn(&self, key: &str, spacing: Duration) {
        if spacing.is_zero() {
            return;
        }
        let last_start = {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            keys.entry(key.to_owned()).or_default().clone()
        };
        let mut last = last_start.lock().await;
        if let Some(at) = *last {
            tokio::time::sleep_until((at + spacing).into()).await;
        }
        *last = Some(Instant::now());
    }
}
