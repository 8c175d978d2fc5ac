//! The SQLite lease store ([`LeaseBackend`]): every lease the host made,
//! its state, and why; and the host instances that may hold a lease, with
//! their heartbeats. One file; a poisoned lease stays poisoned across
//! restarts until it is destroyed.
//!
//! Every check-and-mark runs in one `BEGIN IMMEDIATE` transaction that
//! applies a decision of [`lease_rules`](crate::lease_rules), so two
//! processes can neither both take a lease nor clear each other's mark.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};

use crate::bindings::types::{EnvironmentContext, Lease};
use crate::lease_backend::{HostInstance, LeaseBackend, LeaseRecord, LeaseRefused, Liveness};
use crate::lease_rules::{decide, Change, HostSeen, LeaseState, LeaseView, Operation, Owner};

/// The lease store. Safe to share between threads; several processes (and
/// several hosts on one machine) may open the same file (SQLite locking,
/// 5 s busy timeout).
pub struct LeaseStore {
    conn: Mutex<Connection>,
    durable: bool,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS leases (
    id                TEXT PRIMARY KEY,
    provider          TEXT NOT NULL,
    company_id        TEXT NOT NULL,
    environment_id    TEXT NOT NULL,
    run_id            TEXT NOT NULL,
    config            TEXT NOT NULL,
    state             TEXT NOT NULL,
    reason            TEXT,
    provider_lease_id TEXT,
    metadata          TEXT,
    expires_at        TEXT,
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE TABLE IF NOT EXISTS hosts (
    id           TEXT PRIMARY KEY,
    pid          INTEGER NOT NULL,
    hostname     TEXT NOT NULL,
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    expiry_ms    INTEGER NOT NULL
);
";

/// Columns added after the first release of the store, with their types.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("busy_pid", "INTEGER"),
    ("busy_owner", "TEXT"),
    ("busy_count", "INTEGER NOT NULL DEFAULT 0"),
    ("closing_owner", "TEXT"),
];

impl LeaseStore {
    /// Opens (creating if needed) the store file at `path` and its parents.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let conn = Connection::open(path)
            .with_context(|| format!("opening the lease store {}", path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        Self::init(conn, true)
    }

    /// A store that lives only in memory (tests, and the CLI's embedded
    /// backend whose sandboxes end with the process).
    pub fn open_in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?, false)
    }

    fn init(mut conn: Connection, durable: bool) -> Result<Self> {
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        // One writer at a time: processes opening a new file together
        // would otherwise both see a column missing and both add it.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)
            .context("creating the lease store schema")?;
        for (column, kind) in ADDED_COLUMNS {
            let present: bool = tx
                .prepare("SELECT 1 FROM pragma_table_info('leases') WHERE name = ?1")?
                .exists([column])?;
            if !present {
                tx.execute_batch(&format!("ALTER TABLE leases ADD COLUMN {column} {kind}"))?;
            }
        }
        // A busy mark of a store made before host instances existed names a
        // pid only: its host is unknown, so the mark counts as a dead host's.
        tx.execute(
            "UPDATE leases SET busy_owner = 'pid-' || busy_pid, busy_count = 1, busy_pid = NULL
             WHERE busy_pid IS NOT NULL AND busy_owner IS NULL",
            [],
        )?;
        tx.commit().context("creating the lease store schema")?;
        Ok(LeaseStore {
            conn: Mutex::new(conn),
            durable,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction. The transaction
    /// commits when `body` returns `Ok` (even an `Ok(Err(refusal))`, so a
    /// poison decided on the way is kept) and rolls back on `Err`.
    fn immediate<T>(&self, body: impl FnOnce(&Transaction<'_>) -> Result<Result<T>>) -> Result<T> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outcome = body(&tx)?;
        tx.commit()?;
        outcome
    }

    /// The lease with host id `id` (also [`LeaseBackend::get`]).
    pub fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        <Self as LeaseBackend>::get(self, id)
    }

    /// Every lease, oldest first (also [`LeaseBackend::list`]).
    pub fn list(&self) -> Result<Vec<LeaseRecord>> {
        <Self as LeaseBackend>::list(self)
    }

    /// Leases a sweep may have to handle (also [`LeaseBackend::needing_sweep`]).
    pub fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        <Self as LeaseBackend>::needing_sweep(self)
    }

    /// Registers a host instance in this store and starts its heartbeat
    /// (see [`HostInstance::register`]).
    pub fn register_host(self: &Arc<Self>, liveness: Liveness) -> Result<HostInstance> {
        HostInstance::register(self.clone(), liveness)
    }

    fn owner(tx: &Transaction<'_>, owner: Option<String>, me: &str) -> Result<Option<Owner>> {
        let Some(owner) = owner else { return Ok(None) };
        if owner == me {
            return Ok(Some(Owner::Me));
        }
        let seen = tx
            .query_row(
                "SELECT pid, hostname, heartbeat_ms, expiry_ms FROM hosts WHERE id = ?1",
                [&owner],
                |row| {
                    Ok(HostSeen {
                        id: owner.clone(),
                        pid: row.get(0)?,
                        hostname: row.get(1)?,
                        silent_ms: now_ms() - row.get::<_, i64>(2)?,
                        expiry_ms: row.get(3)?,
                        exited_here: false,
                    })
                },
            )
            .optional()?;
        Ok(Some(match seen {
            Some(seen) => crate::lease_backend::judge(seen),
            None => Owner::Gone(None),
        }))
    }

    fn read(tx: &Transaction<'_>, id: &str) -> Result<Option<LeaseRecord>> {
        tx.query_row("SELECT * FROM leases WHERE id = ?1", [id], record_from_row)
            .optional()?
            .map(with_state)
            .transpose()
    }

    fn check_transition(tx: &Transaction<'_>, id: &str, next: LeaseState) -> Result<()> {
        let Some(record) = Self::read(tx, id)? else {
            bail!("no lease {id}");
        };
        if !record.state.may_become(next) {
            bail!(
                "lease {id} is {}{}; it cannot become {next}",
                record.state,
                record
                    .reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
        }
        Ok(())
    }

    fn query(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<LeaseRecord>> {
        let conn = self.conn();
        let mut statement = conn.prepare(sql)?;
        let rows = statement.query_map(args, record_from_row)?;
        rows.map(|row| with_state(row?)).collect()
    }
}

impl LeaseBackend for LeaseStore {
    /// Whether the store is a file that outlives this process (false for
    /// [`open_in_memory`](Self::open_in_memory)).
    fn is_durable(&self) -> bool {
        self.durable
    }

    fn add_host(&self, id: &str, liveness: Liveness) -> Result<()> {
        let now = now_ms();
        // Records of hosts silent for a day past their expiry: a mark they
        // still own reads as a host with no record, which is gone as well.
        self.conn().execute(
            "DELETE FROM hosts WHERE heartbeat_ms + expiry_ms + 86400000 < ?1",
            [now],
        )?;
        self.conn().execute(
            "INSERT INTO hosts (id, pid, hostname, started_ms, heartbeat_ms, expiry_ms)
             VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
            params![
                id,
                std::process::id(),
                hostname(),
                now,
                millis(liveness.expiry)
            ],
        )?;
        Ok(())
    }

    fn beat(&self, id: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE hosts SET heartbeat_ms = ?2 WHERE id = ?1",
            params![id, now_ms()],
        )?;
        Ok(())
    }

    fn set_host_liveness(&self, id: &str, liveness: Liveness) -> Result<()> {
        self.conn().execute(
            "UPDATE hosts SET expiry_ms = ?2, heartbeat_ms = ?3 WHERE id = ?1",
            params![id, millis(liveness.expiry), now_ms()],
        )?;
        Ok(())
    }

    fn remove_host(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM hosts WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Checks and marks the lease for `operation` by host instance `me`, in
    /// one transaction (see [`lease_rules`](crate::lease_rules)):
    /// - a mark left by a host whose heartbeat expired poisons the lease
    ///   durably (even if the operation is then refused);
    /// - `execute`, `realize` and `resume` take a busy mark;
    /// - `release` and `destroy` move the lease to `closing` (a poisoned
    ///   lease stays poisoned) and own the close;
    /// - `inspect` only applies the poison.
    ///
    /// `ctx` must be the lease's provider and environment. Returns the
    /// record as it is after the change.
    fn begin(
        &self,
        id: &str,
        operation: Operation,
        ctx: &EnvironmentContext,
        me: &str,
    ) -> Result<LeaseRecord> {
        self.immediate(|tx| {
            let Some(record) = Self::read(tx, id)? else {
                return Ok(Err(LeaseRefused(format!(
                    "no lease {id} in the lease store"
                ))
                .into()));
            };
            if record.environment_id != ctx.environment_id
                || record.company_id != ctx.company_id
                || record.provider != ctx.driver_key
            {
                return Ok(Err(LeaseRefused(format!(
                    "lease {id} belongs to another provider or environment"
                ))
                .into()));
            }
            let mut busy = Self::owner(tx, record.busy_owner.clone(), me)?;
            if busy.is_none() && record.state == LeaseState::Acquiring {
                // An acquire recorded without an owner (an older store).
                busy = Some(Owner::Gone(None));
            }
            let closing = Self::owner(tx, record.closing_owner.clone(), me)?;
            let decision = decide(
                operation,
                &LeaseView {
                    id,
                    state: record.state,
                    reason: record.reason.as_deref(),
                    busy,
                    closing,
                    sandbox_recorded: record.lease.is_some(),
                },
            );
            let now = now_ms();
            if let Some(reason) = &decision.poison {
                tx.execute(
                    "UPDATE leases SET state = 'poisoned', reason = ?2, busy_owner = NULL,
                                       busy_count = 0, closing_owner = NULL, updated_ms = ?3
                     WHERE id = ?1",
                    params![id, reason, now],
                )?;
            }
            if let Some(reason) = &decision.unknown {
                tx.execute(
                    "UPDATE leases SET state = 'unknown', reason = ?2, busy_owner = NULL,
                                       busy_count = 0, updated_ms = ?3
                     WHERE id = ?1",
                    params![id, reason, now],
                )?;
            }
            if let Some(message) = decision.refuse {
                return Ok(Err(LeaseRefused(message).into()));
            }
            match decision.change {
                Change::None => {}
                Change::MarkBusy => {
                    tx.execute(
                        "UPDATE leases SET busy_owner = ?2, busy_count = busy_count + 1
                         WHERE id = ?1",
                        params![id, me],
                    )?;
                }
                Change::Close => {
                    tx.execute(
                        "UPDATE leases SET state = 'closing', closing_owner = ?2, updated_ms = ?3
                         WHERE id = ?1",
                        params![id, me, now],
                    )?;
                }
                Change::CloseKeepingPoison => {
                    tx.execute(
                        "UPDATE leases SET closing_owner = ?2 WHERE id = ?1",
                        params![id, me],
                    )?;
                }
            }
            let record = Self::read(tx, id)?.context("the lease vanished")?;
            Ok(Ok(record))
        })
    }

    /// Ends one busy operation of `me` on the lease (the mark goes when the
    /// last one ends). Another host's mark is never touched.
    fn end_use(&self, id: &str, me: &str) -> Result<()> {
        self.immediate(|tx| {
            tx.execute(
                "UPDATE leases SET busy_count = MAX(busy_count - 1, 0),
                                   busy_owner = CASE WHEN busy_count <= 1 THEN NULL ELSE busy_owner END
                 WHERE id = ?1 AND busy_owner = ?2",
                params![id, me],
            )?;
            Ok(Ok(()))
        })
    }

    /// Ends the close `me` owns: moves the lease to `state` with `reason`
    /// and drops the close mark. A lease that became poisoned meanwhile
    /// stays poisoned unless `state` is `destroyed`.
    fn end_close(&self, id: &str, me: &str, state: LeaseState, reason: &str) -> Result<()> {
        self.immediate(|tx| {
            let record = Self::read(tx, id)?.with_context(|| format!("no lease {id}"))?;
            if record.closing_owner.as_deref() != Some(me) {
                bail!("lease {id} is not being closed by this host");
            }
            let (state, reason) =
                if record.state == LeaseState::Poisoned && state != LeaseState::Destroyed {
                    let before = record.reason.unwrap_or_default();
                    (LeaseState::Poisoned, format!("{reason}; before: {before}"))
                } else {
                    (state, reason.to_owned())
                };
            if !record.state.may_become(state) {
                bail!("lease {id} is {}; it cannot become {state}", record.state);
            }
            tx.execute(
                "UPDATE leases SET state = ?2, reason = ?3, closing_owner = NULL, updated_ms = ?4
                 WHERE id = ?1",
                params![id, state.as_str(), reason, now_ms()],
            )?;
            Ok(Ok(()))
        })
    }

    /// Records a lease about to be acquired (state `acquiring`, owned by
    /// host instance `me`), before any sandbox exists. `ctx.config` must
    /// not hold a secret.
    fn begin_acquire(
        &self,
        ctx: &EnvironmentContext,
        run_id: &str,
        me: &str,
    ) -> Result<LeaseRecord> {
        let id = new_id();
        let now = now_ms();
        self.conn().execute(
            "INSERT INTO leases (id, provider, company_id, environment_id, run_id, config, state,
                                 reason, created_ms, updated_ms, busy_owner, busy_count)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'acquiring', 'acquire in progress', ?7, ?7, ?8, 1)",
            params![
                id,
                ctx.driver_key,
                ctx.company_id,
                ctx.environment_id,
                run_id,
                ctx.config,
                now,
                me
            ],
        )?;
        self.get(&id)?.context("the lease just recorded is missing")
    }

    /// Stores the provider's lease and moves to `state` (for example
    /// `active` after acquire or resume).
    fn record_lease(&self, id: &str, lease: &Lease, state: LeaseState) -> Result<()> {
        self.immediate(|tx| {
            Self::check_transition(tx, id, state)?;
            tx.execute(
                "UPDATE leases SET provider_lease_id = ?2, metadata = ?3, expires_at = ?4,
                                   state = ?5, reason = NULL, updated_ms = ?6
                 WHERE id = ?1",
                params![
                    id,
                    lease.provider_lease_id,
                    lease.metadata,
                    lease.expires_at,
                    state.as_str(),
                    now_ms()
                ],
            )?;
            Ok(Ok(()))
        })
    }

    /// Moves the lease to `state` with `reason`. Refuses transitions the
    /// state machine forbids (leaving `poisoned` except for `destroyed`,
    /// leaving a final state). A final state drops every mark.
    fn set_state(&self, id: &str, state: LeaseState, reason: Option<&str>) -> Result<()> {
        self.immediate(|tx| {
            Self::check_transition(tx, id, state)?;
            tx.execute(
                "UPDATE leases SET state = ?2, reason = ?3, updated_ms = ?4 WHERE id = ?1",
                params![id, state.as_str(), reason, now_ms()],
            )?;
            if state.is_final() {
                tx.execute(
                    "UPDATE leases SET busy_owner = NULL, busy_count = 0, closing_owner = NULL
                     WHERE id = ?1",
                    [id],
                )?;
            }
            Ok(Ok(()))
        })
    }

    /// Poisons the lease (a no-op when it is already poisoned or final).
    /// Marks stay: their owners drop them when their operations end.
    fn poison(&self, id: &str, reason: &str) -> Result<()> {
        self.immediate(|tx| {
            let Some(record) = Self::read(tx, id)? else {
                bail!("no lease {id}");
            };
            if record.state == LeaseState::Poisoned || record.state.is_final() {
                return Ok(Ok(()));
            }
            tx.execute(
                "UPDATE leases SET state = 'poisoned', reason = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, reason, now_ms()],
            )?;
            Ok(Ok(()))
        })
    }

    /// The lease with host id `id`.
    fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        let found = self
            .conn()
            .query_row("SELECT * FROM leases WHERE id = ?1", [id], record_from_row)
            .optional()?;
        found.map(with_state).transpose()
    }

    /// Every lease, oldest first.
    fn list(&self) -> Result<Vec<LeaseRecord>> {
        self.query("SELECT * FROM leases ORDER BY created_ms, id", [])
    }

    /// Leases a sweep may have to handle: `poisoned` ones, `acquiring` ones
    /// (an acquire whose host may have died), and any lease with a busy or
    /// close mark (an operation whose host may have died).
    fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        self.query(
            "SELECT * FROM leases
             WHERE state IN ('poisoned', 'acquiring', 'closing')
                OR (state NOT IN ('destroyed', 'unknown')
                    AND (busy_owner IS NOT NULL OR closing_owner IS NOT NULL))
             ORDER BY created_ms, id",
            [],
        )
    }
}

impl fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseStore").finish_non_exhaustive()
    }
}

fn record_from_row(row: &Row<'_>) -> rusqlite::Result<(LeaseRecord, String)> {
    let state: String = row.get("state")?;
    let provider_lease_id: Option<String> = row.get("provider_lease_id")?;
    let lease = match provider_lease_id {
        Some(provider_lease_id) => Some(Lease {
            provider_lease_id,
            metadata: row
                .get::<_, Option<String>>("metadata")?
                .unwrap_or_default(),
            expires_at: row.get("expires_at")?,
        }),
        None => None,
    };
    Ok((
        LeaseRecord {
            id: row.get("id")?,
            provider: row.get("provider")?,
            company_id: row.get("company_id")?,
            environment_id: row.get("environment_id")?,
            run_id: row.get("run_id")?,
            config: row.get("config")?,
            state: LeaseState::Active,
            reason: row.get("reason")?,
            lease,
            created_ms: row.get("created_ms")?,
            updated_ms: row.get("updated_ms")?,
            busy_owner: row.get("busy_owner")?,
            closing_owner: row.get("closing_owner")?,
        },
        state,
    ))
}

fn with_state((mut record, state): (LeaseRecord, String)) -> Result<LeaseRecord> {
    record.state = state.parse()?;
    Ok(record)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this machine".to_owned())
}

/// `lease-<ms>-<pid>-<n>` in hex: unique per process and store.
fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "lease-{:x}-{:x}-{:x}",
        now_ms(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> EnvironmentContext {
        EnvironmentContext {
            driver_key: "test".into(),
            company_id: "co".into(),
            environment_id: "env".into(),
            issue_id: None,
            config: "{}".into(),
        }
    }

    /// A store written before host instances existed keeps a mark as a
    /// bare pid; that mark must count as a dead host's, never as "mine".
    #[test]
    fn a_pid_mark_of_an_older_store_poisons_the_lease() {
        let path =
            std::env::temp_dir().join(format!("sandbox-old-store-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE leases (id TEXT PRIMARY KEY, provider TEXT NOT NULL,
                    company_id TEXT NOT NULL, environment_id TEXT NOT NULL, run_id TEXT NOT NULL,
                    config TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,
                    provider_lease_id TEXT, metadata TEXT, expires_at TEXT,
                    created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, busy_pid INTEGER);
                 INSERT INTO leases VALUES ('L', 'test', 'co', 'env', 'r', '{}', 'active', NULL,
                    'sb-1', '{}', NULL, 0, 0, 1);",
            )
            .unwrap();
        }
        let store = Arc::new(LeaseStore::open(&path).unwrap());
        let me = store.register_host(Liveness::DEFAULT).unwrap();
        let refused = store
            .begin("L", Operation::Execute, &ctx(), me.id())
            .unwrap_err();
        assert!(refused.downcast_ref::<LeaseRefused>().is_some());
        assert_eq!(store.get("L").unwrap().unwrap().state, LeaseState::Poisoned);
        std::fs::remove_file(&path).unwrap();
    }
}
