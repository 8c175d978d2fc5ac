//! The SQLite lease store: every lease the host made, its state, and why;
//! and the host instances that may hold a lease, with their heartbeats.
//! One file; a poisoned lease stays poisoned across restarts until it is
//! destroyed. The lease operations are [`super::sql`]'s; this file
//! holds the connection, the dialect and the move of older stores' tables.
//!
//! Every check-and-mark runs in one `BEGIN IMMEDIATE` transaction, so two
//! processes can neither both take a lease nor clear each other's mark.
//! Heartbeats are measured by this machine's clock (every host sharing a
//! file runs on it).

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rusqlite::config::DbConfig;
use rusqlite::types::ToSqlOutput;
use rusqlite::{params_from_iter, Connection, Row, TransactionBehavior};

use super::sql::{self, Columns, Dialect, Session, Value};
use crate::leases::backend::{HostInstance, LeaseRecord, LeaseStore, Liveness};
use crate::shared_sqlite;

/// The lease store. Safe to share between threads; several processes (and
/// several hosts on one machine) may open the same file (SQLite locking,
/// 5 s busy timeout).
pub struct SqliteLeases {
    conn: Mutex<Connection>,
    place: String,
    durable: bool,
}

/// Columns the `leases` table of older stores gained after its first
/// release, with their types.
const LEGACY_ADDED_COLUMNS: &[(&str, &str)] = &[
    ("busy_pid", "INTEGER"),
    ("busy_owner", "TEXT"),
    ("busy_count", "INTEGER NOT NULL DEFAULT 0"),
    ("closing_owner", "TEXT"),
];

/// The columns the older `leases` and `hosts` tables share with today's.
const LEASE_COLUMNS: &str = "id, provider, company_id, environment_id, run_id, config, state, \
     reason, provider_lease_id, metadata, expires_at, created_ms, updated_ms, busy_owner, \
     busy_count, closing_owner";
const HOST_COLUMNS: &str = "id, pid, hostname, started_ms, heartbeat_ms, expiry_ms";

impl SqliteLeases {
    /// Opens (creating if needed) the store file at `path` and its parents.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(parent) = parent {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let wal = wal_path(path);
        let wal_was_there = wal.exists();
        let conn = shared_sqlite::open_shared(path, "the lease store")?;
        // The WAL stays when the last connection closes, unmerged: what it
        // holds was flushed at its commits (lazy writes aside, see
        // `lazy`), and SQLite merges it at its automatic checkpoints.
        // Merging at every close cost each short-lived `sandbox` process
        // three flushes (the WAL, the store, and the directory when the
        // next process made the WAL again).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        // Merged into the store once it holds this many pages (SQLite's
        // default is 1000): every `sandbox` process that opens the store
        // when no other has it open reads the whole WAL to rebuild its
        // index, and a command writes about eight pages, so a WAL left to
        // grow to 4 MiB cost each of them up to a thousand reads. A merge
        // flushes twice, about once every eight commands.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_PAGES)?;
        let store = Self::init(conn, path.display().to_string(), true)?;
        // SQLite's own directory flush is compiled out (it flushed the
        // directory in every process, `.cargo/config.toml`): the WAL's
        // name is made durable here, once, by the process that created it
        // (the schema's transaction above wrote it). Every commit flushed
        // into the WAL after this survives a machine crash.
        if !wal_was_there {
            sync_directory(parent.unwrap_or(Path::new(".")))?;
        }
        Ok(store)
    }

    /// A store that lives only in memory (tests, and the CLI's embedded
    /// backend whose sandboxes end with the process).
    pub fn open_in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?, "(in memory)".into(), false)
    }

    fn init(mut conn: Connection, place: String, durable: bool) -> Result<Self> {
        conn.busy_timeout(shared_sqlite::BUSY_WAIT)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        // One writer at a time: processes opening a new file together would
        // otherwise both migrate it.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let migrated = sql::migrate(&mut SqliteSession(&tx), &place)
            .context("creating the lease store schema")?;
        if migrated.is_ok() {
            absorb_older_tables(&tx).context("moving the leases of an older lease store")?;
        }
        tx.commit().context("creating the lease store schema")?;
        migrated?;
        Ok(SqliteLeases {
            conn: Mutex::new(conn),
            place,
            durable,
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lease with host id `id` (also [`LeaseStore::get`]).
    pub fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        <Self as LeaseStore>::get(self, id)
    }

    /// Every lease, oldest first (also [`LeaseStore::list`]).
    pub fn list(&self) -> Result<Vec<LeaseRecord>> {
        <Self as LeaseStore>::list(self)
    }

    /// Leases a sweep may have to handle (also [`LeaseStore::needing_sweep`]).
    pub fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        <Self as LeaseStore>::needing_sweep(self)
    }

    /// Registers a host instance in this store and starts its heartbeat
    /// (see [`HostInstance::register`]).
    pub fn register_host(self: &Arc<Self>, liveness: Liveness) -> Result<HostInstance> {
        HostInstance::register(self.clone(), liveness)
    }
}

/// How many pages the lease store's WAL holds before SQLite merges it
/// into the store (`PRAGMA wal_autocheckpoint`).
const WAL_PAGES: i64 = 64;

/// The write-ahead log SQLite keeps beside the store at `path`.
fn wal_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// Flushes `dir`'s entries (the names of the files in it) to the disk.
fn sync_directory(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| {
            format!(
                "flushing the directory {} of the lease store",
                dir.display()
            )
        })
}

/// Stores written before both SQL stores shared one schema keep their
/// leases in `leases` and their hosts in `hosts`. Their rows move into
/// today's tables, and the old tables go; an older `sandbox` that opens
/// the file afterwards recreates them, so this runs at every open and
/// merges whatever is there (a lease is never dropped).
fn absorb_older_tables(conn: &Connection) -> Result<()> {
    let exists = |table: &str| -> Result<bool> {
        Ok(conn
            .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?
            .exists([table])?)
    };
    if exists("leases")? {
        for (column, kind) in LEGACY_ADDED_COLUMNS {
            let present = conn
                .prepare("SELECT 1 FROM pragma_table_info('leases') WHERE name = ?1")?
                .exists([column])?;
            if !present {
                conn.execute_batch(&format!("ALTER TABLE leases ADD COLUMN {column} {kind}"))?;
            }
        }
        // A busy mark of a store made before host instances existed names
        // a pid only: its host is unknown, so the mark counts as a dead
        // host's.
        conn.execute_batch(&format!(
            "UPDATE leases SET busy_owner = 'pid-' || busy_pid, busy_count = 1
             WHERE busy_pid IS NOT NULL AND busy_owner IS NULL;
             INSERT OR IGNORE INTO sandbox_leases ({LEASE_COLUMNS})
                 SELECT {LEASE_COLUMNS} FROM leases;
             DROP TABLE leases;"
        ))?;
    }
    if exists("hosts")? {
        conn.execute_batch(&format!(
            "INSERT OR IGNORE INTO sandbox_hosts ({HOST_COLUMNS}) SELECT {HOST_COLUMNS} FROM hosts;
             DROP TABLE hosts;"
        ))?;
    }
    Ok(())
}

impl Dialect for SqliteLeases {
    const LOCK_ROW: &'static str = "";

    /// Whether the store is a file that outlives this process (false for
    /// [`open_in_memory`](Self::open_in_memory)).
    fn durable(&self) -> bool {
        self.durable
    }

    fn now(&self) -> String {
        now_ms().to_string()
    }

    /// `lease-<ms>-<pid>-<n>` in hex: unique per process and store (every
    /// host sharing the file runs on this machine), and in creation order.
    fn new_id(&self) -> Result<String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        Ok(format!(
            "lease-{:x}-{:x}-{:x}",
            now_ms(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn session<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<T>) -> Result<T> {
        let conn = self.conn();
        conn.pragma_update(None, "synchronous", "FULL")?;
        body(&mut SqliteSession(&conn))
    }

    /// In WAL mode, `synchronous = NORMAL` commits without flushing the
    /// WAL: the write survives a crash of this process (it is in the
    /// system's cache), and reaches the disk with the next flushed commit
    /// or checkpoint. Two to four fewer flushes per command (a lease
    /// exec's host record, heartbeat and ends of use).
    fn lazy<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<T>) -> Result<T> {
        let conn = self.conn();
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        body(&mut SqliteSession(&conn))
    }

    fn transaction<T>(
        &self,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        // Flushed at commit (with any lazy write before it), whatever the
        // last `lazy` left.
        self.transaction_at("FULL", body)
    }

    /// `NORMAL`: in WAL mode the commit is not flushed (SQLite refuses to
    /// change the level inside a transaction, so it is set before).
    fn unflushed_transaction<T>(
        &self,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        self.transaction_at("NORMAL", body)
    }
}

impl SqliteLeases {
    /// One immediate transaction committed at flush level `synchronous`.
    fn transaction_at<T>(
        &self,
        synchronous: &str,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        let mut conn = self.conn();
        conn.pragma_update(None, "synchronous", synchronous)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outcome = body(&mut SqliteSession(&tx))?;
        tx.commit()?;
        outcome
    }
}

impl fmt::Debug for SqliteLeases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        sql::debug_store(f, "SqliteLeases", &self.place)
    }
}

/// A connection (or the transaction it derefs from) as a [`Session`]; the
/// `$n` parameters are SQLite's `?n`.
struct SqliteSession<'a>(&'a Connection);

impl Session for SqliteSession<'_> {
    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.0.execute_batch(sql)?)
    }

    fn execute(&mut self, sql: &str, args: &[Value<'_>]) -> Result<u64> {
        let changed = self
            .0
            .execute(&sql.replace('$', "?"), params_from_iter(args))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    fn rows(
        &mut self,
        sql: &str,
        args: &[Value<'_>],
        each: &mut dyn FnMut(&dyn Columns) -> Result<()>,
    ) -> Result<()> {
        let mut statement = self.0.prepare(&sql.replace('$', "?"))?;
        let mut rows = statement.query(params_from_iter(args))?;
        while let Some(row) = rows.next()? {
            each(row)?;
        }
        Ok(())
    }
}

impl Columns for Row<'_> {
    fn text(&self, column: &str) -> Result<Option<String>> {
        Ok(self.get(column)?)
    }

    fn int(&self, column: &str) -> Result<i64> {
        Ok(self.get(column)?)
    }
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Value::Text(text) => text.to_sql(),
            Value::MaybeText(text) => text.to_sql(),
            Value::Int(number) => number.to_sql(),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leases::backend::LeaseRefused;
    use crate::leases::rules::{LeaseState, Operation};
    use crate::wasm::bindings::types::{EnvironmentContext, Lease};

    fn ctx() -> EnvironmentContext {
        EnvironmentContext {
            driver_key: "test".into(),
            company_id: "co".into(),
            environment_id: "env".into(),
            issue_id: None,
            config: "{}".into(),
        }
    }

    /// The store's flush level now (`PRAGMA synchronous`: 1 `NORMAL`, 2
    /// `FULL`), which is what its last commit used.
    fn flush_level(store: &SqliteLeases) -> i64 {
        store
            .conn()
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap()
    }

    /// A new active lease of sandbox `sb-1`, acquired by `me` and no
    /// longer in use.
    fn idle_lease(store: &SqliteLeases, me: &str) -> String {
        let id = store.begin_acquire(&ctx(), "run", me).unwrap().id;
        let lease = Lease {
            provider_lease_id: "sb-1".into(),
            metadata: "{}".into(),
            expires_at: None,
        };
        store.record_lease(&id, &lease, LeaseState::Active).unwrap();
        store.end_use(&id, me).unwrap();
        id
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
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let me = store.register_host(Liveness::DEFAULT).unwrap();
        let refused = store
            .begin("L", Operation::Execute, &ctx(), me.id())
            .unwrap_err();
        assert!(refused.downcast_ref::<LeaseRefused>().is_some());
        assert_eq!(store.get("L").unwrap().unwrap().state, LeaseState::Poisoned);
        std::fs::remove_file(&path).unwrap();
    }

    /// SQLite's own directory flush (one per process) is compiled out, so
    /// the store must flush the directory itself when it makes the WAL:
    /// the WAL exists when `open` returns, before any lease is written.
    #[test]
    fn the_store_makes_its_wal_at_open_with_sqlites_directory_flush_compiled_out() {
        let dir = std::env::temp_dir().join(format!("sandbox-dirsync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("leases.sqlite");
        let store = SqliteLeases::open(&path).unwrap();
        assert!(
            wal_path(&path).exists(),
            "the WAL is made (and its name flushed) by open"
        );
        let options: Vec<String> = store
            .conn()
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DISABLE_DIRSYNC"),
            "built without LIBSQLITE3_FLAGS from .cargo/config.toml: {options:?}"
        );
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Host records and ends of use skip the flush (`synchronous =
    /// NORMAL`); a poison, a busy mark and every transaction are flushed
    /// (`FULL`) whatever came before them.
    #[test]
    fn only_writes_that_leave_the_store_more_cautious_skip_the_flush() {
        use crate::leases::sql::Dialect;
        let path =
            std::env::temp_dir().join(format!("sandbox-lazy-store-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let level = flush_level;
        let mut me = store.register_host(Liveness::DEFAULT).unwrap();
        // No heartbeat (a lazy write) between the checks below.
        me.stop_heartbeat_for_test();
        assert_eq!(level(&store), 1, "a host record is written lazily");
        store.poison("no-such-lease", "test").unwrap_err();
        assert_eq!(level(&store), 2, "a poison is flushed");
        store.end_use("no-such-lease", me.id()).unwrap();
        assert_eq!(level(&store), 1, "an end of use is written lazily");
        let seen = store
            .transaction(|s| {
                let mut level = 0;
                s.rows("PRAGMA synchronous", &[], &mut |row| {
                    level = row.int("synchronous")?;
                    Ok(())
                })?;
                Ok(Ok(level))
            })
            .unwrap();
        assert_eq!(seen, 2, "a transaction is flushed");
        drop(me);
        std::fs::remove_file(&path).unwrap();
    }

    /// Each process that opens the store alone rebuilds the WAL's index by
    /// reading every page the WAL holds: it is merged into the store long
    /// before SQLite's default of a thousand pages.
    #[test]
    fn the_wal_stays_short() {
        let path =
            std::env::temp_dir().join(format!("sandbox-short-wal-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let mut me = store.register_host(Liveness::DEFAULT).unwrap();
        me.stop_heartbeat_for_test();
        let id = idle_lease(&store, me.id());
        let mut longest = 0;
        for _ in 0..300 {
            store
                .begin(&id, Operation::Execute, &ctx(), me.id())
                .unwrap();
            store.end_use(&id, me.id()).unwrap();
            // The pages in the WAL, as its index in the `-shm` file says
            // (`mxFrame`, bytes 16..20 of the index's header, in this
            // machine's byte order): read without merging anything.
            let mut shm = std::ffi::OsString::from(path.as_os_str());
            shm.push("-shm");
            let header = std::fs::read(&shm).unwrap();
            let pages = u32::from_ne_bytes(header[16..20].try_into().unwrap());
            longest = longest.max(i64::from(pages));
        }
        assert!(longest <= WAL_PAGES + 16, "the WAL grew to {longest} pages");
        drop(me);
        std::fs::remove_file(&path).unwrap();
    }

    /// The first use of a lease flushes its busy mark; another use by the
    /// same host while that mark stands (the CLI's command inside the use
    /// it holds) commits without a flush, and once the last use ended the
    /// next first use flushes again. A use by another host is always a
    /// first use.
    #[test]
    fn only_the_first_of_a_hosts_uses_of_a_lease_is_flushed() {
        let path =
            std::env::temp_dir().join(format!("sandbox-nested-use-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let level = flush_level;
        let mut me = store.register_host(Liveness::DEFAULT).unwrap();
        me.stop_heartbeat_for_test();
        let mut other = store.register_host(Liveness::DEFAULT).unwrap();
        other.stop_heartbeat_for_test();
        let id = idle_lease(&store, me.id());

        store
            .begin(&id, Operation::Execute, &ctx(), me.id())
            .unwrap();
        assert_eq!(level(&store), 2, "the first use is flushed");
        let nested = store
            .begin(&id, Operation::Execute, &ctx(), me.id())
            .unwrap();
        assert_eq!(level(&store), 1, "another use of this host's is not");
        assert_eq!(nested.busy_owner.as_deref(), Some(me.id()));
        let count: i64 = store
            .conn()
            .query_row(
                "SELECT busy_count FROM sandbox_leases WHERE id = ?1",
                [&id],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(count, 2, "both uses are counted");
        store.end_use(&id, me.id()).unwrap();
        store.end_use(&id, me.id()).unwrap();
        assert_eq!(store.get(&id).unwrap().unwrap().busy_owner, None);

        store
            .begin(&id, Operation::Execute, &ctx(), me.id())
            .unwrap();
        assert_eq!(
            level(&store),
            2,
            "a first use after the last ended is flushed"
        );
        store.end_use(&id, me.id()).unwrap();
        store
            .begin(&id, Operation::Execute, &ctx(), other.id())
            .unwrap();
        assert_eq!(level(&store), 2, "another host's first use is flushed");
        drop((me, other));
        std::fs::remove_file(&path).unwrap();
    }
}
