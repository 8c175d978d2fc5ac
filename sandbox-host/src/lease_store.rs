//! The durable lease store: every lease the host made, its state, and why.
//! One SQLite file; a poisoned lease stays poisoned across restarts until
//! it is destroyed.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::bindings::types::{EnvironmentContext, Lease};

/// Where a lease is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Recorded before `acquire-lease` ran; if it stays here the host died
    /// (or trapped) mid-acquire and the sandbox may exist: sweep it.
    Acquiring,
    /// Acquired and usable.
    Active,
    /// Released (paused or deleted by the provider).
    Released,
    /// Something may still run in the sandbox: never reuse, only destroy.
    Poisoned,
    /// Destroyed; final.
    Destroyed,
    /// The acquire's outcome is unknown and there is no id to clean up
    /// with; kept so a person can look. Final.
    Unknown,
}

impl LeaseState {
    /// The stored name (`acquiring`, `active`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Acquiring => "acquiring",
            LeaseState::Active => "active",
            LeaseState::Released => "released",
            LeaseState::Poisoned => "poisoned",
            LeaseState::Destroyed => "destroyed",
            LeaseState::Unknown => "unknown",
        }
    }

    fn may_become(self, next: LeaseState) -> bool {
        use LeaseState::*;
        match self {
            Destroyed | Unknown => false,
            Poisoned => next == Destroyed,
            Acquiring => true,
            Active | Released => next != Acquiring && next != Unknown,
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseState {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        Ok(match text {
            "acquiring" => LeaseState::Acquiring,
            "active" => LeaseState::Active,
            "released" => LeaseState::Released,
            "poisoned" => LeaseState::Poisoned,
            "destroyed" => LeaseState::Destroyed,
            "unknown" => LeaseState::Unknown,
            other => bail!("unknown lease state {other:?}"),
        })
    }
}

/// One stored lease.
#[derive(Clone, Debug)]
pub struct LeaseRecord {
    /// The host's id of the lease (not the provider's).
    pub id: String,
    /// The provider's driver key.
    pub provider: String,
    /// The company (tenant).
    pub company_id: String,
    /// The environment.
    pub environment_id: String,
    /// The run the lease was acquired for.
    pub run_id: String,
    /// The normalised provider config (never with a secret).
    pub config: String,
    /// The state.
    pub state: LeaseState,
    /// Why it is in this state (for poisoned: what failed).
    pub reason: Option<String>,
    /// The provider's lease, once acquired.
    pub lease: Option<Lease>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Last change, milliseconds since the Unix epoch.
    pub updated_ms: i64,
    /// The host process running a command on the lease right now, if any.
    /// If that process is gone, it died mid-command: sweep poisons and
    /// destroys the lease.
    pub busy_pid: Option<u32>,
}

impl LeaseRecord {
    /// The environment context to call the provider with for this lease.
    pub fn context(&self) -> EnvironmentContext {
        EnvironmentContext {
            driver_key: self.provider.clone(),
            company_id: self.company_id.clone(),
            environment_id: self.environment_id.clone(),
            issue_id: None,
            config: self.config.clone(),
        }
    }

    fn from_row(row: &Row<'_>) -> rusqlite::Result<(LeaseRecord, String)> {
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
                busy_pid: row.get("busy_pid")?,
            },
            state,
        ))
    }
}

/// The lease store. Safe to share between threads; several processes may
/// open the same file (SQLite locking, 5 s busy timeout).
pub struct LeaseStore {
    conn: Mutex<Connection>,
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
    updated_ms        INTEGER NOT NULL,
    busy_pid          INTEGER
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
";

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
        Self::init(conn)
    }

    /// A store that lives only in memory (tests).
    pub fn open_in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)
            .context("creating the lease store schema")?;
        // Stores made before `busy_pid` existed.
        let has_busy: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('leases') WHERE name = 'busy_pid'")?
            .exists([])?;
        if !has_busy {
            conn.execute_batch("ALTER TABLE leases ADD COLUMN busy_pid INTEGER")?;
        }
        Ok(LeaseStore {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a lease about to be acquired (state `acquiring`), before any
    /// sandbox exists. `ctx.config` must not hold a secret.
    pub fn begin_acquire(&self, ctx: &EnvironmentContext, run_id: &str) -> Result<LeaseRecord> {
        let id = new_id();
        let now = now_ms();
        self.conn().execute(
            "INSERT INTO leases (id, provider, company_id, environment_id, run_id, config, state,
                                 reason, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'acquiring', 'acquire in progress', ?7, ?7)",
            params![
                id,
                ctx.driver_key,
                ctx.company_id,
                ctx.environment_id,
                run_id,
                ctx.config,
                now
            ],
        )?;
        self.get(&id)?.context("the lease just recorded is missing")
    }

    /// Stores the provider's lease and moves to `state` (for example
    /// `active` after acquire or resume).
    pub fn record_lease(&self, id: &str, lease: &Lease, state: LeaseState) -> Result<()> {
        self.check_transition(id, state)?;
        self.conn().execute(
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
        Ok(())
    }

    /// Moves the lease to `state` with `reason`. Refuses to leave
    /// `poisoned` except for `destroyed`, and to leave a final state.
    pub fn set_state(&self, id: &str, state: LeaseState, reason: Option<&str>) -> Result<()> {
        self.check_transition(id, state)?;
        self.conn().execute(
            "UPDATE leases SET state = ?2, reason = ?3, updated_ms = ?4 WHERE id = ?1",
            params![id, state.as_str(), reason, now_ms()],
        )?;
        Ok(())
    }

    /// Poisons the lease (a no-op when it is already poisoned or final).
    pub fn poison(&self, id: &str, reason: &str) -> Result<()> {
        match self.get(id)?.map(|r| r.state) {
            Some(LeaseState::Poisoned | LeaseState::Destroyed | LeaseState::Unknown) => Ok(()),
            Some(_) => self.set_state(id, LeaseState::Poisoned, Some(reason)),
            None => bail!("no lease {id}"),
        }
    }

    fn check_transition(&self, id: &str, next: LeaseState) -> Result<()> {
        let Some(record) = self.get(id)? else {
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

    /// Marks the lease busy with a command of this process.
    pub fn mark_busy(&self, id: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE leases SET busy_pid = ?2 WHERE id = ?1",
            params![id, std::process::id()],
        )?;
        Ok(())
    }

    /// Clears the busy mark once no command of this process runs on the lease.
    pub fn clear_busy(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("UPDATE leases SET busy_pid = NULL WHERE id = ?1", [id])?;
        Ok(())
    }

    /// The lease with host id `id`.
    pub fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        let found = self
            .conn()
            .query_row(
                "SELECT * FROM leases WHERE id = ?1",
                [id],
                LeaseRecord::from_row,
            )
            .optional()?;
        found.map(with_state).transpose()
    }

    /// Every lease, oldest first.
    pub fn list(&self) -> Result<Vec<LeaseRecord>> {
        self.query("SELECT * FROM leases ORDER BY created_ms, id", [])
    }

    /// Leases a sweep may have to handle: `poisoned` ones, `acquiring` ones
    /// (an acquire that may never have finished), and busy `active` ones (a
    /// command whose host may have died).
    pub fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        self.query(
            "SELECT * FROM leases
             WHERE state IN ('poisoned', 'acquiring')
                OR (state = 'active' AND busy_pid IS NOT NULL)
             ORDER BY created_ms, id",
            [],
        )
    }

    fn query(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<LeaseRecord>> {
        let conn = self.conn();
        let mut statement = conn.prepare(sql)?;
        let rows = statement.query_map(args, LeaseRecord::from_row)?;
        rows.map(|row| with_state(row?)).collect()
    }
}

impl fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseStore").finish_non_exhaustive()
    }
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
