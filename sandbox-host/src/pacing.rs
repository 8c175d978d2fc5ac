//! Spacing of request starts per API origin, shared by every instance and
//! thread that uses the same [`Pacer`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Hands out request start times at least `spacing` apart per key (an
/// origin). Cloning shares the schedule.
///
/// Slots are reserved in call order: a caller that reserved a slot and then
/// gave up leaves a gap, which is harmless (spacing only ever grows).
#[derive(Clone, Debug, Default)]
pub struct Pacer {
    next_start: Arc<Mutex<HashMap<String, Instant>>>,
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

    /// Reserves the next start slot for `key` and returns when it is.
    pub fn reserve(&self, key: &str, spacing: Duration) -> Instant {
        let now = Instant::now();
        let mut next = self.next_start.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match next.get(key) {
            Some(&at) if at > now => at,
            _ => now,
        };
        next.insert(key.to_owned(), slot + spacing);
        slot
    }

    /// Waits until a reserved start slot for `key` has come.
    pub async fn wait_turn(&self, key: &str, spacing: Duration) {
        if spacing.is_zero() {
            return;
        }
        let slot = self.reserve(key, spacing);
        tokio::time::sleep_until(slot.into()).await;
    }
}
