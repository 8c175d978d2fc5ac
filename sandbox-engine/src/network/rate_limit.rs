//! An optional request rate limit, as CreateOS applies one per caller: at
//! most N `/v1` requests in any sliding window of W; beyond it a 429 with
//! `Retry-After` and nothing done. Off by default (the embedded backend has
//! no limit); tests and benchmarks set a small one to check that hosts
//! spend a declared budget without exceeding it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The limit and what it admitted and refused.
#[derive(Debug)]
pub struct RateLimiter {
    requests: usize,
    window: Duration,
    admitted_at: Mutex<VecDeque<Instant>>,
    admitted: AtomicU64,
    refused: AtomicU64,
}

/// Counters of a [`RateLimiter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RateLimitStats {
    /// The limit: requests per window.
    pub requests: u64,
    /// The window in milliseconds.
    pub window_ms: u64,
    /// Requests let through.
    pub admitted: u64,
    /// Requests answered 429.
    pub refused: u64,
}

impl RateLimiter {
    /// At most `requests` (at least 1) in any window of `window`.
    pub fn new(requests: u32, window: Duration) -> Self {
        RateLimiter {
            requests: requests.max(1) as usize,
            window: window.max(Duration::from_millis(1)),
            admitted_at: Mutex::new(VecDeque::new()),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Admits a request now, or says how long until one would be admitted.
    pub fn admit(&self) -> Result<(), Duration> {
        let now = Instant::now();
        let mut admitted = self.admitted_at.lock().unwrap_or_else(|e| e.into_inner());
        while admitted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= self.window)
        {
            admitted.pop_front();
        }
        if admitted.len() >= self.requests {
            self.refused.fetch_add(1, Ordering::Relaxed);
            let oldest = admitted[admitted.len() - self.requests];
            return Err(self.window.saturating_sub(now.duration_since(oldest)));
        }
        admitted.push_back(now);
        self.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The limit and its counters.
    pub fn stats(&self) -> RateLimitStats {
        RateLimitStats {
            requests: self.requests as u64,
            window_ms: u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX),
            admitted: self.admitted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_admits_n_then_refuses_with_the_time_left() {
        let limiter = RateLimiter::new(3, Duration::from_secs(3600));
        for _ in 0..3 {
            assert!(limiter.admit().is_ok());
        }
        let wait = limiter.admit().unwrap_err();
        assert!(wait > Duration::from_secs(3500), "{wait:?}");
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.refused), (3, 1));
    }

    #[test]
    fn starts_leave_the_window_after_it_passes() {
        let limiter = RateLimiter::new(1, Duration::from_millis(20));
        assert!(limiter.admit().is_ok());
        assert!(limiter.admit().is_err());
        std::thread::sleep(Duration::from_millis(25));
        assert!(limiter.admit().is_ok());
    }
}
