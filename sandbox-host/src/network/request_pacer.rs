//! The request pacer of each API origin: at most N request starts in any
//! sliding window of W ms (and optionally at most M in any one second), as
//! the provider declares it (`describe`'s `rate-limit`).
//!
//! A request starts at once while the budget allows it; otherwise it waits
//! exactly until the oldest start leaves the window. Waiters of one process
//! are served first in, first out, except that cleanup requests (DELETE) go
//! ahead of new work; a waiter that gives up (its deadline, its instance
//! dropped) leaves the queue without holding anyone up.
//!
//! The starts are kept in a [`RateLedger`]: in this process's memory
//! ([`RequestPacer::in_memory`]), or in an SQLite file every host process on
//! the machine opens ([`RequestPacer::open`]), so that two `sandbox` processes
//! share one budget. Each start is one short SQLite transaction; only the
//! waiter at the head of a process's queue reads the ledger, the others
//! sleep until it moves.
//!
//! A request occupies the window from its start until its answer came
//! (its [`Grant`] is settled then): the API counts a request when it
//! arrives, somewhere between the two, so counting it until the answer
//! keeps the host within the limit however the network or a busy machine
//! delays a request. Time is wall-clock milliseconds, the one clock
//! processes share; a small [`margin`] covers its granularity.
//!
//! A declared budget protects the provider's real service. An origin whose
//! answers say they come from our embedded engine ([`ENGINE_HEADER`]) is
//! not that service: the pacer remembers, per exact origin and in this
//! process only, what its latest answer said ([`RequestPacer::note_answer`]),
//! and the guard then spends the engine's own budget
//! ([`ENGINE_RATE_LIMIT_HEADER`]) or none instead of the declared one. The
//! first request to an origin is always paced (nothing is known yet), and
//! an answer without the header takes the claim back. A real service that
//! sent the header would only give up the pacing of its own origin.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::shared_sqlite;

/// An API's request budget (the WIT `rate-limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// At most this many starts in any window.
    pub requests: u32,
    /// The sliding window.
    pub window: Duration,
    /// At most this many starts in any one second, when set.
    pub per_second: Option<u32>,
}

impl RateLimit {
    /// `requests` per `window`, no per-second cap. Zero values are raised to
    /// one (a limit always lets some request through).
    pub fn new(requests: u32, window: Duration) -> Self {
        RateLimit {
            requests: requests.max(1),
            window: window.max(Duration::from_millis(1)),
            per_second: None,
        }
    }

    /// Adds a per-second cap (at least one).
    pub fn with_per_second(mut self, cap: u32) -> Self {
        self.per_second = Some(cap.max(1));
        self
    }

    /// Parses `N/MS` (for example `300/60000`) or `N/MS/PER_SECOND`.
    pub fn parse(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('/').collect();
        let number = |part: &str, what: &str| -> Result<u32> {
            part.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| {
                    format!("invalid rate limit {text:?}: {what} must be a positive whole number")
                })
        };
        match parts.as_slice() {
            [requests, window] => Ok(RateLimit::new(
                number(requests, "the request count")?,
                Duration::from_millis(u64::from(number(window, "the window (ms)")?)),
            )),
            [requests, window, per_second] => Ok(RateLimit::new(
                number(requests, "the request count")?,
                Duration::from_millis(u64::from(number(window, "the window (ms)")?)),
            )
            .with_per_second(number(per_second, "the per-second cap")?)),
            _ => anyhow::bail!(
                "invalid rate limit {text:?}: expected REQUESTS/WINDOW_MS, for example 300/60000"
            ),
        }
    }

    fn window_ms(&self) -> i64 {
        i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The header every answer of the embedded engine (`createos-local`)
/// carries; its value names the engine (`sandbox_engine::ENGINE_HEADER`).
pub const ENGINE_HEADER: &str = "x-sandbox-engine";
/// The engine's own budget, `REQUESTS/WINDOW_MS`, on the answers of the
/// paths it limits (`sandbox_engine::ENGINE_RATE_LIMIT_HEADER`).
pub const ENGINE_RATE_LIMIT_HEADER: &str = "x-sandbox-engine-rate-limit";

/// Who is asking: cleanup goes ahead of new work when the budget is short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Priority {
    /// A request that ends something (a process or sandbox DELETE).
    Cleanup,
    /// Everything else.
    Work,
}

/// How much the host's counted window exceeds the declared one: 1% of it,
/// at least 25 ms (clock granularity and skew between the host's and the
/// API's clocks).
pub fn margin(window: Duration) -> Duration {
    (window / 100).max(Duration::from_millis(25))
}

/// What a [`RequestPacer`] did so far (for tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacerStats {
    /// Requests that started.
    pub started: u64,
    /// Of those, how many found the budget spent and had to wait for it.
    pub waited: u64,
    /// 429 answers that shrank the budget.
    pub throttled: u64,
}

/// The per-origin pacing of request starts, shared by everything holding a clone of it.
#[derive(Clone)]
pub struct RequestPacer {
    shared: Arc<Shared>,
}

struct Shared {
    ledger: RateLedger,
    queues: Mutex<HashMap<String, Arc<OriginQueue>>>,
    /// Origins whose latest answer came from the engine, and the budget it named.
    engines: Mutex<HashMap<String, Option<RateLimit>>>,
    started: AtomicU64,
    waited: AtomicU64,
    throttled: AtomicU64,
}

impl std::fmt::Debug for RequestPacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestPacer")
            .field("ledger", &self.shared.ledger.kind())
            .finish_non_exhaustive()
    }
}

impl RequestPacer {
    /// A budget kept in this process's memory only.
    pub fn in_memory() -> Self {
        Self::with_ledger(RateLedger::Memory(Mutex::new(HashMap::new())))
    }

    /// The process-wide in-memory budget (the default of a runtime).
    pub fn global() -> Self {
        static GLOBAL: OnceLock<RequestPacer> = OnceLock::new();
        GLOBAL.get_or_init(RequestPacer::in_memory).clone()
    }

    /// A budget kept in the SQLite file at `path` (created if missing), shared
    /// by every process that opens the same file.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let conn = shared_sqlite::open_shared(path, "the request pacer's ledger")?;
        // The ledger only matters while requests run: no fsync needed.
        conn.pragma_update(None, "synchronous", "OFF")?;
        // The WAL stays when the last connection closes (SQLite merges it
        // at its automatic checkpoints). Merging and deleting it at every
        // close made each short-lived `sandbox` process write the ledger
        // twice more and make its WAL and index files again.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS request_starts (
                 origin TEXT NOT NULL,
                 at_ms INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS request_starts_by_origin
                 ON request_starts (origin, at_ms);
             CREATE TABLE IF NOT EXISTS origin_pauses (
                 origin TEXT PRIMARY KEY,
                 until_ms INTEGER NOT NULL
             );",
        )
        .with_context(|| format!("cannot set up the request pacer {}", path.display()))?;
        Ok(Self::with_ledger(RateLedger::File(Mutex::new(conn))))
    }

    fn with_ledger(ledger: RateLedger) -> Self {
        RequestPacer {
            shared: Arc::new(Shared {
                ledger,
                queues: Mutex::new(HashMap::new()),
                engines: Mutex::new(HashMap::new()),
                started: AtomicU64::new(0),
                waited: AtomicU64::new(0),
                throttled: AtomicU64::new(0),
            }),
        }
    }

    /// Counters since this budget was made.
    pub fn stats(&self) -> PacerStats {
        PacerStats {
            started: self.shared.started.load(Ordering::Relaxed),
            waited: self.shared.waited.load(Ordering::Relaxed),
            throttled: self.shared.throttled.load(Ordering::Relaxed),
        }
    }

    /// Waits until a request to `origin` may start under `limit`, and
    /// records its start; settle the returned [`Grant`] when the answer
    /// came. Dropping the future leaves the queue. Fails only when the
    /// ledger cannot be read or written.
    pub(crate) async fn acquire(
        &self,
        origin: &str,
        limit: &RateLimit,
        priority: Priority,
    ) -> Result<Grant> {
        let queue = self.queue(origin);
        let ticket = queue.enter(priority);
        let mut waited = false;
        loop {
            let notified = queue.moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if queue.is_head(&ticket) {
                match self.shared.ledger.try_start(origin, limit, now_ms())? {
                    Ok(entry) => {
                        drop(ticket);
                        self.shared.started.fetch_add(1, Ordering::Relaxed);
                        if waited {
                            self.shared.waited.fetch_add(1, Ordering::Relaxed);
                        }
                        return Ok(Grant {
                            pacer: self.clone(),
                            origin: origin.to_owned(),
                            entry,
                        });
                    }
                    Err(wait) => {
                        waited = true;
                        // A cleanup request entering the queue wakes the head,
                        // so it can go first.
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = &mut notified => {}
                        }
                    }
                }
            } else {
                // Behind other waiters of this process (first come, first
                // served); only a spent budget counts as waiting.
                notified.await;
            }
        }
    }

    /// Remembers what an answer from `origin` said about who gave it: from
    /// the engine (with the budget it named, if it could be read), or not
    /// (which takes back an earlier claim). A claim with a budget that
    /// cannot be read counts as no claim.
    pub(crate) fn note_answer(&self, origin: &str, headers: &http::HeaderMap) {
        let claim =
            headers
                .get(ENGINE_HEADER)
                .and_then(|_| match headers.get(ENGINE_RATE_LIMIT_HEADER) {
                    None => Some(None),
                    Some(value) => value
                        .to_str()
                        .ok()
                        .and_then(|text| RateLimit::parse(text).ok())
                        .map(Some),
                });
        let mut engines = lock(&self.shared.engines);
        match claim {
            Some(budget) => {
                engines.insert(origin.to_owned(), budget);
            }
            None => {
                engines.remove(origin);
            }
        }
    }

    /// `Some(budget)` when the latest answer from `origin` came from the
    /// engine (`budget`: the one it named, or none); `None` otherwise.
    pub(crate) fn engine_budget(&self, origin: &str) -> Option<Option<RateLimit>> {
        lock(&self.shared.engines).get(origin).copied()
    }

    /// Records a 429 from `origin`: no request starts there before `pause`
    /// has passed.
    pub(crate) fn throttled(&self, origin: &str, pause: Duration) -> Result<()> {
        self.shared.throttled.fetch_add(1, Ordering::Relaxed);
        let until = now_ms().saturating_add(i64::try_from(pause.as_millis()).unwrap_or(i64::MAX));
        self.shared.ledger.pause(origin, until)?;
        self.queue(origin).moved.notify_waiters();
        Ok(())
    }

    fn queue(&self, origin: &str) -> Arc<OriginQueue> {
        lock(&self.shared.queues)
            .entry(origin.to_owned())
            .or_default()
            .clone()
    }
}

/// A request's place in the window. Dropping it (tests say
/// `Grant::settle`) moves the place to the moment the answer came.
pub(crate) struct Grant {
    pacer: RequestPacer,
    origin: String,
    entry: i64,
}

impl Grant {
    /// The request was answered (or failed): it counts until now + window.
    #[cfg(test)]
    pub(crate) fn settle(self) {}
}

impl Drop for Grant {
    fn drop(&mut self) {
        // An unwritable ledger keeps the start time: the request then
        // counts from its start, which the margin covers in most cases.
        let _ = self
            .pacer
            .shared
            .ledger
            .settle(&self.origin, self.entry, now_ms());
    }
}

/// One origin's waiters in this process, in order: cleanup first, then
/// first come, first served.
#[derive(Default)]
struct OriginQueue {
    waiting: Mutex<(u64, BTreeSet<(Priority, u64)>)>,
    moved: tokio::sync::Notify,
}

impl OriginQueue {
    fn enter(self: &Arc<Self>, priority: Priority) -> TicketGuard {
        let mut waiting = lock(&self.waiting);
        waiting.0 += 1;
        let ticket = (priority, waiting.0);
        waiting.1.insert(ticket);
        drop(waiting);
        // A newcomer may now be the head (cleanup jumps ahead): wake the
        // current head so it re-checks.
        self.moved.notify_waiters();
        TicketGuard {
            queue: self.clone(),
            ticket,
        }
    }

    fn is_head(&self, ticket: &TicketGuard) -> bool {
        lock(&self.waiting).1.first() == Some(&ticket.ticket)
    }
}

/// A waiter's place in an [`OriginQueue`]; dropping it leaves the queue
/// and wakes the others.
struct TicketGuard {
    queue: Arc<OriginQueue>,
    ticket: (Priority, u64),
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        lock(&self.queue.waiting).1.remove(&self.ticket);
        self.queue.moved.notify_waiters();
    }
}

/// Where request starts are kept.
enum RateLedger {
    /// Per origin: recent starts, and the instant a 429 pause ends.
    Memory(Mutex<HashMap<String, MemoryWindow>>),
    /// The SQLite ledger file shared by the machine's host processes.
    File(Mutex<Connection>),
}

#[derive(Default)]
struct MemoryWindow {
    /// (entry id, start or answer time) of the requests in the window.
    starts: VecDeque<(i64, i64)>,
    next_entry: i64,
    paused_until: i64,
}

impl RateLedger {
    fn kind(&self) -> &'static str {
        match self {
            RateLedger::Memory(_) => "memory",
            RateLedger::File(_) => "file",
        }
    }

    /// Records a start at `now` and returns its entry if the budget allows
    /// it; otherwise returns how long to wait before asking again.
    fn try_start(
        &self,
        origin: &str,
        limit: &RateLimit,
        now: i64,
    ) -> Result<std::result::Result<i64, Duration>> {
        let window = limit.window_ms() + margin_ms(limit);
        match self {
            RateLedger::Memory(windows) => {
                let mut windows = lock(windows);
                let entry = windows.entry(origin.to_owned()).or_default();
                entry.starts.retain(|(_, at)| *at > now - window);
                let mut recent: Vec<i64> = entry.starts.iter().map(|(_, at)| *at).collect();
                recent.sort_unstable();
                if let Some(wait) = wait_for(&recent, entry.paused_until, limit, window, now) {
                    return Ok(Err(wait));
                }
                entry.next_entry += 1;
                entry.starts.push_back((entry.next_entry, now));
                Ok(Ok(entry.next_entry))
            }
            RateLedger::File(conn) => {
                let mut conn = lock(conn);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .context("the request pacer is busy or unreadable")?;
                tx.execute(
                    "DELETE FROM request_starts WHERE origin = ?1 AND at_ms <= ?2",
                    params![origin, now - window],
                )?;
                let paused_until: i64 = tx
                    .query_row(
                        "SELECT until_ms FROM origin_pauses WHERE origin = ?1",
                        params![origin],
                        |row| row.get(0),
                    )
                    .optional()?
                    .unwrap_or(0);
                let recent: Vec<i64> = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT at_ms FROM request_starts WHERE origin = ?1 ORDER BY at_ms",
                    )?;
                    let rows = stmt.query_map(params![origin], |row| row.get(0))?;
                    rows.collect::<rusqlite::Result<_>>()?
                };
                if let Some(wait) = wait_for(&recent, paused_until, limit, window, now) {
                    tx.commit()?;
                    return Ok(Err(wait));
                }
                tx.execute(
                    "INSERT INTO request_starts (origin, at_ms) VALUES (?1, ?2)",
                    params![origin, now],
                )?;
                let entry = tx.last_insert_rowid();
                tx.commit()?;
                Ok(Ok(entry))
            }
        }
    }

    /// Moves entry `entry` of `origin` to `at` (its answer came).
    fn settle(&self, origin: &str, entry: i64, at: i64) -> Result<()> {
        match self {
            RateLedger::Memory(windows) => {
                if let Some(window) = lock(windows).get_mut(origin) {
                    if let Some(place) = window.starts.iter_mut().find(|(id, _)| *id == entry) {
                        place.1 = place.1.max(at);
                    }
                }
            }
            RateLedger::File(conn) => {
                lock(conn).execute(
                    "UPDATE request_starts SET at_ms = max(at_ms, ?2) WHERE rowid = ?1",
                    params![entry, at],
                )?;
            }
        }
        Ok(())
    }

    fn pause(&self, origin: &str, until: i64) -> Result<()> {
        match self {
            RateLedger::Memory(windows) => {
                let mut windows = lock(windows);
                let entry = windows.entry(origin.to_owned()).or_default();
                entry.paused_until = entry.paused_until.max(until);
            }
            RateLedger::File(conn) => {
                lock(conn).execute(
                    "INSERT INTO origin_pauses (origin, until_ms) VALUES (?1, ?2)
                     ON CONFLICT (origin) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms)",
                    params![origin, until],
                )?;
            }
        }
        Ok(())
    }
}

/// How long to wait before a start is allowed, given the starts still in
/// the window (ascending), the end of a 429 pause, the limit and the
/// counted window length; `None` when a start is allowed now.
fn wait_for(
    recent: &[i64],
    paused_until: i64,
    limit: &RateLimit,
    window: i64,
    now: i64,
) -> Option<Duration> {
    let mut allowed_at = paused_until;
    let requests = limit.requests as usize;
    if recent.len() >= requests {
        // The start that must leave the window before one more fits.
        allowed_at = allowed_at.max(recent[recent.len() - requests] + window);
    }
    if let Some(cap) = limit.per_second {
        let second = 1_000 + margin_ms(limit).min(25);
        let in_second: Vec<i64> = recent
            .iter()
            .copied()
            .filter(|at| *at > now - second)
            .collect();
        let cap = cap as usize;
        if in_second.len() >= cap {
            allowed_at = allowed_at.max(in_second[in_second.len() - cap] + second);
        }
    }
    (allowed_at > now).then(|| Duration::from_millis(u64::try_from(allowed_at - now).unwrap_or(0)))
}

fn margin_ms(limit: &RateLimit) -> i64 {
    i64::try_from(margin(limit.window).as_millis()).unwrap_or(i64::MAX)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared decision table's request pacer starts
    /// (`node/test/scenarios/policy-decisions.json`, run by the Node host
    /// against its `waitFor` too).
    #[test]
    fn shared_decisions_start_wait() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../node/test/scenarios/policy-decisions.json");
        let table: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = table["startWait"].as_array().unwrap();
        assert!(cases.len() >= 6);
        for case in cases {
            let mut limit = RateLimit::new(
                case["limit"]["requests"].as_u64().unwrap() as u32,
                Duration::from_millis(case["limit"]["windowMs"].as_u64().unwrap()),
            );
            if let Some(cap) = case["limit"]["perSecond"].as_u64() {
                limit = limit.with_per_second(cap as u32);
            }
            let recent: Vec<i64> = case["recent"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            let window = limit.window_ms() + margin_ms(&limit);
            let wait = wait_for(
                &recent,
                case["pausedUntil"].as_i64().unwrap(),
                &limit,
                window,
                case["now"].as_i64().unwrap(),
            );
            let expected = case["waitMs"].as_u64().map(Duration::from_millis);
            assert_eq!(wait, expected, "{}", case["name"]);
        }
    }

    /// The ledger's WAL is left for the next process when the last
    /// connection closes, not merged and deleted (which cost every
    /// short-lived `sandbox` process two writes and two new files).
    #[test]
    fn the_ledgers_wal_stays_when_the_last_connection_closes() {
        let dir = std::env::temp_dir().join(format!("sandbox-pacer-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("rate-budget.sqlite");
        drop(RequestPacer::open(&path).unwrap());
        assert!(dir.join("rate-budget.sqlite-wal").exists());
        drop(RequestPacer::open(&path).unwrap());
        assert!(dir.join("rate-budget.sqlite-wal").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const TEN_PER_SECOND: RateLimit = RateLimit {
        requests: 10,
        window: Duration::from_secs(1),
        per_second: None,
    };

    #[test]
    fn a_start_waits_only_when_the_window_is_full() {
        let window = 1_025;
        let starts: Vec<i64> = (0..9).map(|i| 1_000 + i).collect();
        assert_eq!(wait_for(&starts, 0, &TEN_PER_SECOND, window, 1_010), None);
        let full: Vec<i64> = (0..10).map(|i| 1_000 + i).collect();
        // The oldest start (1000) leaves the counted window at 2025.
        assert_eq!(
            wait_for(&full, 0, &TEN_PER_SECOND, window, 1_500),
            Some(Duration::from_millis(525))
        );
        assert_eq!(wait_for(&full, 0, &TEN_PER_SECOND, window, 2_025), None);
    }

    #[test]
    fn a_pause_after_429_holds_every_start_until_it_ends() {
        assert_eq!(
            wait_for(&[], 5_000, &TEN_PER_SECOND, 1_025, 4_000),
            Some(Duration::from_secs(1))
        );
        assert_eq!(wait_for(&[], 5_000, &TEN_PER_SECOND, 1_025, 5_000), None);
    }

    #[test]
    fn the_per_second_cap_binds_below_the_window() {
        let limit = RateLimit::new(100, Duration::from_secs(60)).with_per_second(2);
        let window = limit.window_ms() + margin_ms(&limit);
        assert_eq!(wait_for(&[1_000], 0, &limit, window, 1_100), None);
        assert_eq!(
            wait_for(&[1_000, 1_050], 0, &limit, window, 1_100),
            Some(Duration::from_millis(925))
        );
    }

    #[test]
    fn limits_parse_and_bad_ones_are_clear_errors() {
        assert_eq!(
            RateLimit::parse("300/60000").unwrap(),
            RateLimit::new(300, Duration::from_secs(60))
        );
        assert_eq!(RateLimit::parse("20/2000/5").unwrap().per_second, Some(5));
        for bad in ["", "300", "0/100", "x/100", "1/2/3/4", "-1/5"] {
            let error = RateLimit::parse(bad).unwrap_err().to_string();
            assert!(error.contains("rate limit"), "{bad}: {error}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_window_makes_the_next_request_wait_and_cleanup_goes_first() {
        let budget = RequestPacer::in_memory();
        let limit = RateLimit::new(2, Duration::from_secs(3600));
        budget
            .acquire("o", &limit, Priority::Work)
            .await
            .unwrap()
            .settle();
        budget
            .acquire("o", &limit, Priority::Work)
            .await
            .unwrap()
            .settle();
        assert_eq!(budget.stats().waited, 0);
        // The window is now full for an hour: a pause shorter than that
        // lets nothing through; the cleanup waiter is at the head.
        let order = Arc::new(Mutex::new(Vec::new()));
        let work = {
            let (budget, order) = (budget.clone(), order.clone());
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_millis(50),
                    budget.acquire("o", &limit, Priority::Work),
                )
                .await;
                lock(&order).push("work gave up");
            })
        };
        tokio::task::yield_now().await;
        let queue = budget.queue("o");
        let cleanup = queue.enter(Priority::Cleanup);
        assert!(queue.is_head(&cleanup), "cleanup is ahead of waiting work");
        drop(cleanup);
        work.await.unwrap();
        assert_eq!(*lock(&order), ["work gave up"]);
        // The waiter that gave up left the queue.
        assert!(lock(&queue.waiting).1.is_empty());
    }
}
