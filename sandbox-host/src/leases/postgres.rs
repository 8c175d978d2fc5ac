//! The PostgreSQL lease store, for several hosts on several machines
//! sharing one database. The lease operations are [`super::sql`]'s;
//! this file holds the connection, the dialect and the migration lock.
//!
//! Every check-and-mark is one transaction that locks the lease row
//! (`SELECT … FOR UPDATE`), so two hosts can neither both take a lease nor
//! clear each other's mark. Heartbeats and their ages use the database
//! server's clock, so hosts on machines whose clocks disagree still judge
//! each other alike. The schema is versioned
//! ([`MIGRATIONS`](super::sql::MIGRATIONS)) and brought up to date when the
//! store is opened; a schema newer than this program is refused before
//! anything is written.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, NoTls, Row};

use super::sql::{self, Columns, Dialect, Session, Value};
use crate::leases::backend::{HostInstance, Liveness, StoreUnavailable};

/// Serialises migrations of hosts starting at the same time.
const MIGRATION_LOCK: i64 = 0x0053_414e_4442_4f58; // "SANDBOX" in ASCII

/// The lease store in a PostgreSQL database. One connection per store,
/// shared by the threads of this process; a connection lost (database
/// restarted, network down) fails the operation with [`StoreUnavailable`]
/// and is opened again by the next one.
pub struct PostgresLeases {
    config: Config,
    place: String,
    client: Mutex<Option<Client>>,
}

impl PostgresLeases {
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
        let store = PostgresLeases {
            config,
            place,
            client: Mutex::new(None),
        };
        store.transaction(|s| {
            s.execute(
                "SELECT pg_advisory_xact_lock($1)",
                &[Value::Int(MIGRATION_LOCK)],
            )?;
            sql::migrate(s, &store.place)
        })?;
        Ok(store)
    }

    /// Where the store is, for people (no password).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// The schema version the database is at.
    pub fn schema_version(&self) -> Result<usize> {
        self.session(|s| Ok(sql::schema_version(s)?.unwrap_or(0)))
    }

    /// Registers a host instance in this store and starts its heartbeat
    /// (see [`HostInstance::register`]).
    pub fn register_host(self: &Arc<Self>, liveness: Liveness) -> Result<HostInstance> {
        HostInstance::register(self.clone(), liveness)
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

    fn unavailable(&self, error: &postgres::Error) -> anyhow::Error {
        StoreUnavailable(format!(
            "the lease store {} cannot be reached ({error}); nothing was changed by this \
             operation. Check that PostgreSQL runs and the store URL (--store or SANDBOX_STORE) \
             is right, then retry",
            self.place
        ))
        .into()
    }
}

impl Dialect for PostgresLeases {
    const LOCK_ROW: &'static str = " FOR UPDATE";

    fn durable(&self) -> bool {
        true
    }

    /// The database server's clock.
    fn now(&self) -> String {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint".to_owned()
    }

    /// `lease-<random hex>`: unique across hosts sharing the database (the
    /// SQLite store's time-pid-counter ids are unique on one machine only).
    fn new_id(&self) -> Result<String> {
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

    fn session<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<T>) -> Result<T> {
        self.with_client(|client| body(&mut PgSession(client)))
    }

    fn transaction<T>(
        &self,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        self.transaction_with("", body)
    }

    /// For this transaction only (`SET LOCAL`): the server answers the
    /// commit before its WAL record is flushed.
    fn unflushed_transaction<T>(
        &self,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        self.transaction_with("SET LOCAL synchronous_commit = off", body)
    }
}

impl PostgresLeases {
    /// One transaction that runs `setting` (SQL, or nothing when empty)
    /// before `body`.
    fn transaction_with<T>(
        &self,
        setting: &str,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        self.with_client(|client| {
            let mut tx = client.transaction()?;
            if !setting.is_empty() {
                tx.batch_execute(setting)?;
            }
            let outcome = body(&mut PgSession(&mut tx))?;
            tx.commit()?;
            outcome
        })
    }
}

impl fmt::Debug for PostgresLeases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        sql::debug_store(f, "PostgresLeases", &self.place)
    }
}

/// A client or a transaction as a [`Session`].
struct PgSession<'a, C>(&'a mut C);

impl<C: GenericClient> Session for PgSession<'_, C> {
    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.0.batch_execute(sql)?)
    }

    fn execute(&mut self, sql: &str, args: &[Value<'_>]) -> Result<u64> {
        Ok(self.0.execute(sql, &parameters(args))?)
    }

    fn rows(
        &mut self,
        sql: &str,
        args: &[Value<'_>],
        each: &mut dyn FnMut(&dyn Columns) -> Result<()>,
    ) -> Result<()> {
        for row in self.0.query(sql, &parameters(args))? {
            each(&row)?;
        }
        Ok(())
    }
}

fn parameters<'a>(args: &'a [Value<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter()
        .map(|arg| -> &(dyn ToSql + Sync) {
            match arg {
                Value::Text(text) => text,
                Value::MaybeText(text) => text,
                Value::Int(number) => number,
            }
        })
        .collect()
}

impl Columns for Row {
    fn text(&self, column: &str) -> Result<Option<String>> {
        Ok(self.try_get(column)?)
    }

    fn int(&self, column: &str) -> Result<i64> {
        Ok(self.try_get(column)?)
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
