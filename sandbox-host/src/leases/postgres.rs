//! The PostgreSQL lease store ([`LeaseBackend`]), for several hosts on
//! several machines sharing one database.
//!
//! Every check-and-mark is one transaction that locks the lease row
//! (`SELECT … FOR UPDATE`) and applies a decision of
//! [`lease_rules`](crate::lease_rules), so two hosts can neither both take
//! a lease nor clear each other's mark. Heartbeats and their ages use the
//! database server's clock, so hosts on machines whose clocks disagree
//! still judge each other alike. The schema is versioned
//! ([`MIGRATIONS`]) and brought up to date when the store is opened; a
//! schema newer than this program is refused before anything is written.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use postgres::{Client, Config, NoTls, Row, Transaction};

use crate::bindings::types::{EnvironmentContext, Lease};
use crate::lease_backend::{
    HostInstance, LeaseBackend, LeaseRecord, LeaseRefused, Liveness, StoreUnavailable,
};
use crate::lease_rules::{decide, Change, HostSeen, LeaseState, LeaseView, Operation, Owner};

/// The schema, one step per version: version `n` is reached by applying
/// `MIGRATIONS[n - 1]`. Append only; never edit a released step.
pub const MIGRATIONS: &[&str] = &[
    // 1: leases and host instances.
    "CREATE TABLE sandbox_leases (
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
        created_ms        BIGINT NOT NULL,
        updated_ms        BIGINT NOT NULL,
        busy_owner        TEXT,
        busy_count        INTEGER NOT NULL DEFAULT 0,
        closing_owner     TEXT
     );
     CREATE INDEX sandbox_leases_state ON sandbox_leases(state);
     CREATE TABLE sandbox_hosts (
        id           TEXT PRIMARY KEY,
        pid          BIGINT NOT NULL,
        hostname     TEXT NOT NULL,
        started_ms   BIGINT NOT NULL,
        heartbeat_ms BIGINT NOT NULL,
        expiry_ms    BIGINT NOT NULL
     );",
];

/// The database server's clock, in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Serialises migrations of hosts starting at the same time.
const MIGRATION_LOCK: i64 = 0x0053_414e_4442_4f58; // "SANDBOX" in ASCII

/// The lease store in a PostgreSQL database. One connection per store,
/// shared by the threads of this process; a connection lost (database
/// restarted, network down) fails the operation with [`StoreUnavailable`]
/// and is opened again by the next one.
pub struct PgLeaseStore {
    config: Config,
    place: String,
    client: Mutex<Option<Client>>,
}

impl PgLeaseStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`,
    /// connect timeout 5 s unless the URL sets one) and applies the
    /// missing schema migrations. Fails before writing anything when the
    /// URL is wrong, the database cannot be reached, or its schema is newer
    /// than this program knows.
    pub fn open(url: &str) -> Result<Self> {
        let mut config: Config = url.parse().map_err(|e| {
            anyhow::anyhow!(
                "the lease store URL is not a valid PostgreSQL URL ({e}); expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
            )
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        let place = describe(&config);
        let store = PgLeaseStore {
            config,
            place,
            client: Mutex::new(None),
        };
        store.migrate()?;
        Ok(store)
    }

    /// Where the store is, for people (no password).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// The schema version the database is at.
    pub fn schema_version(&self) -> Result<usize> {
        self.with_client(|client| {
            let row = client.query_one("SELECT version FROM sandbox_schema", &[])?;
            Ok(usize::try_from(row.try_get::<_, i32>(0)?).unwrap_or(0))
        })
    }

    /// Registers a host instance in this store and starts its heartbeat
    /// (see [`HostInstance::register`]).
    pub fn register_host(self: &Arc<Self>, liveness: Liveness) -> Result<HostInstance> {
        HostInstance::register(self.clone(), liveness)
    }

    fn migrate(&self) -> Result<()> {
        let place = self.place.clone();
        self.transaction(|tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS sandbox_schema (version INTEGER NOT NULL);",
            )?;
            let found: Option<i32> = tx
                .query_opt("SELECT version FROM sandbox_schema", &[])?
                .map(|row| row.try_get(0))
                .transpose()?;
            let known = MIGRATIONS.len();
            let version = usize::try_from(found.unwrap_or(0)).unwrap_or(0);
            if version > known {
                return Ok(Err(anyhow::anyhow!(
                    "the lease store {place} has schema version {version}, newer than this \
                     sandbox program knows ({known}): a newer sandbox wrote it. Upgrade sandbox \
                     on this machine; nothing was changed"
                )));
            }
            for (step, sql) in MIGRATIONS.iter().enumerate().skip(version) {
                tx.batch_execute(sql)
                    .with_context(|| format!("applying lease store migration {}", step + 1))?;
            }
            let known = i32::try_from(known).unwrap_or(i32::MAX);
            if found.is_none() {
                tx.execute(
                    "INSERT INTO sandbox_schema (version) VALUES ($1)",
                    &[&known],
                )?;
            } else {
                tx.execute("UPDATE sandbox_schema SET version = $1", &[&known])?;
            }
            Ok(Ok(()))
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<Client>> {
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `body` with a connection, opening one if needed. A lost
    /// connection is dropped (the next call opens a new one) and reported
    /// as [`StoreUnavailable`].
    fn with_client<T>(&self, body: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        let mut slot = self.lock();
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = None;
            let client = self
                .config
                .connect(NoTls)
                .map_err(|e| self.unavailable(&e))?;
            *slot = Some(client);
        }
        let client = slot.as_mut().expect("connected above");
        match body(client) {
            Ok(value) => Ok(value),
            Err(error) => {
                let lost = error
                    .chain()
                    .filter_map(|e| e.downcast_ref::<postgres::Error>())
                    .find(|e| connection_lost(e));
                match lost {
                    Some(lost) => {
                        let typed = self.unavailable(lost);
                        *slot = None;
                        Err(typed)
                    }
                    None => Err(error),
                }
            }
        }
    }

    /// Runs `body` in one transaction. It commits when `body` returns `Ok`
    /// (even an `Ok(Err(refusal))`, so a poison decided on the way is
    /// kept) and rolls back on `Err`.
    fn transaction<T>(
        &self,
        body: impl FnOnce(&mut Transaction<'_>) -> Result<Result<T>>,
    ) -> Result<T> {
        self.with_client(|client| {
            let mut tx = client.transaction()?;
            let outcome = body(&mut tx)?;
            tx.commit()?;
            outcome
        })
    }

    fn unavailable(&self, error: &postgres::Error) -> anyhow::Error {
        StoreUnavailable(format!(
            "the lease store {} cannot be reached ({error}); nothing was changed by this \
             operation. Check that PostgreSQL runs and the store URL (--store or SANDBOX_STORE) \
             is right, then retry",
            self.place
        ))
        .into()
    }

    fn owner(tx: &mut Transaction<'_>, owner: Option<String>, me: &str) -> Result<Option<Owner>> {
        let Some(owner) = owner else { return Ok(None) };
        if owner == me {
            return Ok(Some(Owner::Me));
        }
        let seen = tx
            .query_opt(
                &format!(
                    "SELECT pid, hostname, {NOW_MS} - heartbeat_ms, expiry_ms
                     FROM sandbox_hosts WHERE id = $1"
                ),
                &[&owner],
            )?
            .map(|row| -> Result<HostSeen> {
                Ok(HostSeen {
                    id: owner.clone(),
                    pid: u32::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0),
                    hostname: row.try_get(1)?,
                    silent_ms: row.try_get(2)?,
                    expiry_ms: row.try_get(3)?,
                    exited_here: false,
                })
            })
            .transpose()?;
        Ok(Some(match seen {
            Some(seen) => crate::lease_backend::judge(seen),
            None => Owner::Gone(None),
        }))
    }

    fn read(tx: &mut Transaction<'_>, id: &str, lock: bool) -> Result<Option<LeaseRecord>> {
        let sql = if lock {
            "SELECT * FROM sandbox_leases WHERE id = $1 FOR UPDATE"
        } else {
            "SELECT * FROM sandbox_leases WHERE id = $1"
        };
        tx.query_opt(sql, &[&id])?.map(|r| record(&r)).transpose()
    }

    fn check_transition(tx: &mut Transaction<'_>, id: &str, next: LeaseState) -> Result<()> {
        let Some(record) = Self::read(tx, id, true)? else {
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

    fn query(&self, sql: &str) -> Result<Vec<LeaseRecord>> {
        self.with_client(|client| client.query(sql, &[])?.iter().map(record).collect())
    }
}

impl LeaseBackend for PgLeaseStore {
    fn is_durable(&self) -> bool {
        true
    }

    fn add_host(&self, id: &str, liveness: Liveness) -> Result<()> {
        let pid = i64::from(std::process::id());
        let host = hostname();
        let expiry = millis(liveness.expiry);
        self.with_client(|client| {
            // Records of hosts silent for a day past their expiry: a mark
            // they still own reads as a host with no record, gone as well.
            client.execute(
                &format!("DELETE FROM sandbox_hosts WHERE heartbeat_ms + expiry_ms + 86400000 < {NOW_MS}"),
                &[],
            )?;
            client.execute(
                &format!(
                    "INSERT INTO sandbox_hosts (id, pid, hostname, started_ms, heartbeat_ms, expiry_ms)
                     VALUES ($1, $2, $3, {NOW_MS}, {NOW_MS}, $4)"
                ),
                &[&id, &pid, &host, &expiry],
            )?;
            Ok(())
        })
    }

    fn beat(&self, id: &str) -> Result<()> {
        self.with_client(|client| {
            client.execute(
                &format!("UPDATE sandbox_hosts SET heartbeat_ms = {NOW_MS} WHERE id = $1"),
                &[&id],
            )?;
            Ok(())
        })
    }

    fn set_host_liveness(&self, id: &str, liveness: Liveness) -> Result<()> {
        let expiry = millis(liveness.expiry);
        self.with_client(|client| {
            client.execute(
                &format!(
                    "UPDATE sandbox_hosts SET expiry_ms = $2, heartbeat_ms = {NOW_MS} WHERE id = $1"
                ),
                &[&id, &expiry],
            )?;
            Ok(())
        })
    }

    fn remove_host(&self, id: &str) -> Result<()> {
        self.with_client(|client| {
            client.execute("DELETE FROM sandbox_hosts WHERE id = $1", &[&id])?;
            Ok(())
        })
    }

    fn begin(
        &self,
        id: &str,
        operation: Operation,
        ctx: &EnvironmentContext,
        me: &str,
    ) -> Result<LeaseRecord> {
        self.transaction(|tx| {
            let Some(record) = Self::read(tx, id, true)? else {
                return Ok(Err(
                    LeaseRefused(format!("no lease {id} in the lease store")).into()
                ));
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
            if let Some(reason) = &decision.poison {
                tx.execute(
                    &format!(
                        "UPDATE sandbox_leases SET state = 'poisoned', reason = $2, busy_owner = NULL,
                                busy_count = 0, closing_owner = NULL, updated_ms = {NOW_MS}
                         WHERE id = $1"
                    ),
                    &[&id, reason],
                )?;
            }
            if let Some(reason) = &decision.unknown {
                tx.execute(
                    &format!(
                        "UPDATE sandbox_leases SET state = 'unknown', reason = $2, busy_owner = NULL,
                                busy_count = 0, updated_ms = {NOW_MS}
                         WHERE id = $1"
                    ),
                    &[&id, reason],
                )?;
            }
            if let Some(message) = decision.refuse {
                return Ok(Err(LeaseRefused(message).into()));
            }
            match decision.change {
                Change::None => {}
                Change::MarkBusy => {
                    tx.execute(
                        "UPDATE sandbox_leases SET busy_owner = $2, busy_count = busy_count + 1
                         WHERE id = $1",
                        &[&id, &me],
                    )?;
                }
                Change::Close => {
                    tx.execute(
                        &format!(
                            "UPDATE sandbox_leases SET state = 'closing', closing_owner = $2,
                                    updated_ms = {NOW_MS}
                             WHERE id = $1"
                        ),
                        &[&id, &me],
                    )?;
                }
                Change::CloseKeepingPoison => {
                    tx.execute(
                        "UPDATE sandbox_leases SET closing_owner = $2 WHERE id = $1",
                        &[&id, &me],
                    )?;
                }
            }
            let record = Self::read(tx, id, false)?.context("the lease vanished")?;
            Ok(Ok(record))
        })
    }

    fn end_use(&self, id: &str, me: &str) -> Result<()> {
        self.with_client(|client| {
            // One conditional update: only the owner's mark is touched.
            client.execute(
                "UPDATE sandbox_leases
                 SET busy_count = GREATEST(busy_count - 1, 0),
                     busy_owner = CASE WHEN busy_count <= 1 THEN NULL ELSE busy_owner END
                 WHERE id = $1 AND busy_owner = $2",
                &[&id, &me],
            )?;
            Ok(())
        })
    }

    fn end_close(&self, id: &str, me: &str, state: LeaseState, reason: &str) -> Result<()> {
        self.transaction(|tx| {
            let record = Self::read(tx, id, true)?.with_context(|| format!("no lease {id}"))?;
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
                &format!(
                    "UPDATE sandbox_leases SET state = $2, reason = $3, closing_owner = NULL,
                            updated_ms = {NOW_MS}
                     WHERE id = $1"
                ),
                &[&id, &state.as_str(), &reason],
            )?;
            Ok(Ok(()))
        })
    }

    fn begin_acquire(
        &self,
        ctx: &EnvironmentContext,
        run_id: &str,
        me: &str,
    ) -> Result<LeaseRecord> {
        let id = new_id()?;
        self.with_client(|client| {
            let row = client.query_one(
                &format!(
                    "INSERT INTO sandbox_leases (id, provider, company_id, environment_id, run_id,
                            config, state, reason, created_ms, updated_ms, busy_owner, busy_count)
                     VALUES ($1, $2, $3, $4, $5, $6, 'acquiring', 'acquire in progress',
                             {NOW_MS}, {NOW_MS}, $7, 1)
                     RETURNING *"
                ),
                &[
                    &id,
                    &ctx.driver_key,
                    &ctx.company_id,
                    &ctx.environment_id,
                    &run_id,
                    &ctx.config,
                    &me,
                ],
            )?;
            record(&row)
        })
    }

    fn record_lease(&self, id: &str, lease: &Lease, state: LeaseState) -> Result<()> {
        self.transaction(|tx| {
            Self::check_transition(tx, id, state)?;
            tx.execute(
                &format!(
                    "UPDATE sandbox_leases SET provider_lease_id = $2, metadata = $3,
                            expires_at = $4, state = $5, reason = NULL, updated_ms = {NOW_MS}
                     WHERE id = $1"
                ),
                &[
                    &id,
                    &lease.provider_lease_id,
                    &lease.metadata,
                    &lease.expires_at,
                    &state.as_str(),
                ],
            )?;
            Ok(Ok(()))
        })
    }

    fn set_state(&self, id: &str, state: LeaseState, reason: Option<&str>) -> Result<()> {
        self.transaction(|tx| {
            Self::check_transition(tx, id, state)?;
            tx.execute(
                &format!(
                    "UPDATE sandbox_leases SET state = $2, reason = $3, updated_ms = {NOW_MS}
                     WHERE id = $1"
                ),
                &[&id, &state.as_str(), &reason],
            )?;
            if state.is_final() {
                tx.execute(
                    "UPDATE sandbox_leases SET busy_owner = NULL, busy_count = 0,
                            closing_owner = NULL
                     WHERE id = $1",
                    &[&id],
                )?;
            }
            Ok(Ok(()))
        })
    }

    fn poison(&self, id: &str, reason: &str) -> Result<()> {
        self.with_client(|client| {
            // One conditional update: a poisoned or final lease stays as it is.
            let changed = client.execute(
                &format!(
                    "UPDATE sandbox_leases SET state = 'poisoned', reason = $2, updated_ms = {NOW_MS}
                     WHERE id = $1 AND state NOT IN ('poisoned', 'destroyed', 'unknown')"
                ),
                &[&id, &reason],
            )?;
            if changed == 0
                && client
                    .query_opt("SELECT 1 FROM sandbox_leases WHERE id = $1", &[&id])?
                    .is_none()
            {
                bail!("no lease {id}");
            }
            Ok(())
        })
    }

    fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        self.with_client(|client| {
            client
                .query_opt("SELECT * FROM sandbox_leases WHERE id = $1", &[&id])?
                .map(|r| record(&r))
                .transpose()
        })
    }

    fn list(&self) -> Result<Vec<LeaseRecord>> {
        self.query("SELECT * FROM sandbox_leases ORDER BY created_ms, id")
    }

    fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        self.query(
            "SELECT * FROM sandbox_leases
             WHERE state IN ('poisoned', 'acquiring', 'closing')
                OR (state NOT IN ('destroyed', 'unknown')
                    AND (busy_owner IS NOT NULL OR closing_owner IS NOT NULL))
             ORDER BY created_ms, id",
        )
    }
}

impl fmt::Debug for PgLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLeaseStore")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

/// Whether `error` means the connection is gone or the server is not
/// taking work (restart, shutdown), rather than a fault of the statement.
fn connection_lost(error: &postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        // No SQLSTATE and no server error: the socket or the protocol failed.
        None => error.as_db_error().is_none(),
        // Connection exceptions, and the server shutting down or starting.
        Some(code) => code.code().starts_with("08") || code.code().starts_with("57P"),
    }
}

/// `user@host:port/database`, never the password.
fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        Some(postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("(default user)");
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

fn record(row: &Row) -> Result<LeaseRecord> {
    let provider_lease_id: Option<String> = row.try_get("provider_lease_id")?;
    let lease = match provider_lease_id {
        Some(provider_lease_id) => Some(Lease {
            provider_lease_id,
            metadata: row
                .try_get::<_, Option<String>>("metadata")?
                .unwrap_or_default(),
            expires_at: row.try_get("expires_at")?,
        }),
        None => None,
    };
    Ok(LeaseRecord {
        id: row.try_get("id")?,
        provider: row.try_get("provider")?,
        company_id: row.try_get("company_id")?,
        environment_id: row.try_get("environment_id")?,
        run_id: row.try_get("run_id")?,
        config: row.try_get("config")?,
        state: row.try_get::<_, String>("state")?.parse()?,
        reason: row.try_get("reason")?,
        lease,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
        busy_owner: row.try_get("busy_owner")?,
        closing_owner: row.try_get("closing_owner")?,
    })
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

/// `lease-<random hex>`: unique across hosts sharing the database (the
/// SQLite store's time-pid-counter ids are unique on one machine only).
fn new_id() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for a lease id")?;
    Ok(format!(
        "lease-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}
