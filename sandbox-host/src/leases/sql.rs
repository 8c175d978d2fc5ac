//! The lease operations of both SQL stores, written once over a small
//! [`Dialect`]: what a store does to apply a decision of
//! [`leases::rules`](crate::leases::rules) (check and mark in one transaction,
//! end an operation, poison, list), the one schema both keep
//! ([`MIGRATIONS`]), and how that schema is brought up to date.
//!
//! A dialect says only what differs between databases: how to open a
//! transaction that serialises check-and-mark (SQLite: `BEGIN IMMEDIATE`;
//! PostgreSQL: a transaction that locks the lease row with `FOR UPDATE`),
//! which clock heartbeats are measured by, and how lease ids are made.
//! Statements are written with `$1`-style parameters.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::leases::backend::{judge, LeaseRecord, LeaseRefused, LeaseStore, Liveness};
use crate::leases::rules::{decide, Change, HostSeen, LeaseState, LeaseView, Operation, Owner};
use crate::wasm::bindings::types::{EnvironmentContext, Lease};

/// The schema of both stores, one step per version: version `n` is reached
/// by applying `MIGRATIONS[n - 1]`. Append only; never edit a released
/// step. (SQLite reads the types by affinity: `BIGINT` is an integer.)
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

/// A value bound to a `$n` parameter.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    /// Text.
    Text(&'a str),
    /// Text or `NULL`.
    MaybeText(Option<&'a str>),
    /// A 64-bit integer.
    Int(i64),
}

/// One row of a result, read by column name.
pub trait Columns {
    /// A text column (`None` for `NULL`).
    fn text(&self, column: &str) -> Result<Option<String>>;
    /// An integer column that is never `NULL`.
    fn int(&self, column: &str) -> Result<i64>;
}

/// A connection, or a transaction on one.
pub trait Session {
    /// Runs statements without parameters (a schema step).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// Runs one statement; returns how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Value<'_>]) -> Result<u64>;
    /// Runs one query and hands each row to `each`.
    fn rows(
        &mut self,
        sql: &str,
        args: &[Value<'_>],
        each: &mut dyn FnMut(&dyn Columns) -> Result<()>,
    ) -> Result<()>;
}

/// What a SQL database adds to the shared lease operations. Every type
/// that implements it is a [`LeaseStore`].
pub trait Dialect: Send + Sync + std::fmt::Debug {
    /// What makes a `SELECT` in a [`transaction`](Self::transaction) lock
    /// the row it read until the transaction ends (empty where the
    /// transaction already holds the whole store).
    const LOCK_ROW: &'static str;
    /// Whether the leases outlive this process.
    fn durable(&self) -> bool;
    /// A SQL expression for the time now, in milliseconds since the Unix
    /// epoch, by the clock every host sharing the store is judged by.
    fn now(&self) -> String;
    /// A new lease id, unique among every host sharing the store.
    fn new_id(&self) -> Result<String>;
    /// Runs `body` on a connection, each statement on its own.
    fn session<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<T>) -> Result<T>;
    /// Runs `body` in one transaction that serialises check-and-mark. It
    /// commits when `body` returns `Ok` (even an `Ok(Err(refusal))`, so a
    /// poison decided on the way is kept) and rolls back on `Err`. What it
    /// commits is on disk when it returns.
    fn transaction<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>)
        -> Result<T>;
    /// Runs `body` like [`transaction`](Self::transaction), but its commit
    /// may return before it is on disk. Only for a write whose loss in a
    /// crash of the whole machine leaves the store as cautious as before:
    /// another use by this host of a lease whose flushed mark already says
    /// this host is using it.
    fn unflushed_transaction<T>(
        &self,
        body: impl FnOnce(&mut dyn Session) -> Result<Result<T>>,
    ) -> Result<T> {
        self.transaction(body)
    }
    /// Runs `body` like [`session`](Self::session), for writes whose loss
    /// in a crash of the whole machine leaves the store more cautious,
    /// never less: host records and heartbeats (every host of the store
    /// died with the machine), and the end of a use (the lease then reads
    /// as busy by a dead host, which sweep treats as possibly running). A
    /// dialect may leave them unflushed; the next [`transaction`](Self::transaction)
    /// flushes them with its own. Never for a poison, a
    /// busy mark or a lease's state.
    fn lazy<T>(&self, body: impl FnOnce(&mut dyn Session) -> Result<T>) -> Result<T> {
        self.session(body)
    }
}

/// How a store shows itself in `{:?}`: its type and where it is (the
/// place never holds a password), nothing of its connection.
pub(super) fn debug_store(
    f: &mut std::fmt::Formatter<'_>,
    store: &str,
    place: &str,
) -> std::fmt::Result {
    f.debug_struct(store)
        .field("place", &place)
        .finish_non_exhaustive()
}

/// The schema version a store is at (`None`: a store without one yet).
pub(crate) fn schema_version(session: &mut dyn Session) -> Result<Option<usize>> {
    let mut found = None;
    session.rows(
        "SELECT CAST(version AS BIGINT) AS version FROM sandbox_schema",
        &[],
        &mut |row| {
            found = Some(usize::try_from(row.int("version")?).unwrap_or(0));
            Ok(())
        },
    )?;
    Ok(found)
}

/// Brings the schema up to date inside the caller's transaction (which
/// must keep other hosts from migrating at the same time). A schema newer
/// than this program is refused (`Ok(Err(..))`) before anything is changed.
pub(crate) fn migrate(session: &mut dyn Session, place: &str) -> Result<Result<()>> {
    session.batch("CREATE TABLE IF NOT EXISTS sandbox_schema (version INTEGER NOT NULL);")?;
    let found = schema_version(session)?;
    let known = MIGRATIONS.len();
    let version = found.unwrap_or(0);
    if version > known {
        return Ok(Err(anyhow::anyhow!(
            "the lease store {place} has schema version {version}, newer than this sandbox \
             program knows ({known}): a newer sandbox wrote it. Upgrade sandbox on this \
             machine; nothing was changed"
        )));
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        session
            .batch(sql)
            .with_context(|| format!("applying lease store migration {}", step + 1))?;
    }
    // A literal: the column is a 32-bit integer in PostgreSQL.
    if found.is_none() {
        session.execute(
            &format!("INSERT INTO sandbox_schema (version) VALUES ({known})"),
            &[],
        )?;
    } else {
        session.execute(&format!("UPDATE sandbox_schema SET version = {known}"), &[])?;
    }
    Ok(Ok(()))
}

impl dyn Session + '_ {
    fn leases(&mut self, sql: &str, args: &[Value<'_>]) -> Result<Vec<LeaseRecord>> {
        let mut found = Vec::new();
        self.rows(sql, args, &mut |row| {
            found.push(record(row)?);
            Ok(())
        })?;
        Ok(found)
    }

    /// The lease `id`; `lock` (a dialect's [`Dialect::LOCK_ROW`]) holds
    /// its row until the transaction ends.
    fn lease(&mut self, id: &str, lock: &str) -> Result<Option<LeaseRecord>> {
        let sql = format!("SELECT * FROM sandbox_leases WHERE id = $1{lock}");
        Ok(self.leases(&sql, &[Value::Text(id)])?.into_iter().next())
    }

    /// Whether the host instance that owns a mark is `me`, alive or gone.
    fn owner(&mut self, owner: Option<String>, me: &str, now: &str) -> Result<Option<Owner>> {
        let Some(owner) = owner else { return Ok(None) };
        if owner == me {
            return Ok(Some(Owner::Me));
        }
        let mut seen = None;
        self.rows(
            &format!(
                "SELECT pid, hostname, {now} - heartbeat_ms AS silent_ms, expiry_ms
                 FROM sandbox_hosts WHERE id = $1"
            ),
            &[Value::Text(&owner)],
            &mut |row| {
                seen = Some(HostSeen {
                    id: owner.clone(),
                    pid: u32::try_from(row.int("pid")?).unwrap_or(0),
                    hostname: row.text("hostname")?.unwrap_or_default(),
                    silent_ms: row.int("silent_ms")?,
                    expiry_ms: row.int("expiry_ms")?,
                    exited_here: false,
                });
                Ok(())
            },
        )?;
        Ok(Some(match seen {
            Some(seen) => judge(seen),
            None => Owner::Gone(None),
        }))
    }

    /// Refuses (with an error) a move of lease `id` to `next` that the
    /// state machine forbids.
    fn check_transition(&mut self, id: &str, next: LeaseState, lock: &str) -> Result<()> {
        let Some(record) = self.lease(id, lock)? else {
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
}

/// Leases a sweep may have to handle: `poisoned` ones, `acquiring` ones
/// (an acquire whose host may have died), and any lease with a busy or
/// close mark (an operation whose host may have died).
const NEEDING_SWEEP: &str = "SELECT * FROM sandbox_leases
     WHERE state IN ('poisoned', 'acquiring', 'closing')
        OR (state NOT IN ('destroyed', 'unknown')
            AND (busy_owner IS NOT NULL OR closing_owner IS NOT NULL))
     ORDER BY created_ms, id";

impl<D: Dialect> LeaseStore for D {
    fn is_durable(&self) -> bool {
        self.durable()
    }

    fn add_host(&self, id: &str, liveness: Liveness) -> Result<()> {
        let now = self.now();
        let pid = i64::from(std::process::id());
        let host = hostname();
        self.lazy(|s| {
            // Records of hosts silent for a day past their expiry: a mark
            // they still own reads as a host with no record, gone as well.
            s.execute(
                &format!(
                    "DELETE FROM sandbox_hosts WHERE heartbeat_ms + expiry_ms + 86400000 < {now}"
                ),
                &[],
            )?;
            s.execute(
                &format!(
                    "INSERT INTO sandbox_hosts (id, pid, hostname, started_ms, heartbeat_ms, expiry_ms)
                     VALUES ($1, $2, $3, {now}, {now}, $4)"
                ),
                &[
                    Value::Text(id),
                    Value::Int(pid),
                    Value::Text(&host),
                    Value::Int(millis(liveness.expiry)),
                ],
            )?;
            Ok(())
        })
    }

    fn beat(&self, id: &str) -> Result<()> {
        let now = self.now();
        self.lazy(|s| {
            s.execute(
                &format!("UPDATE sandbox_hosts SET heartbeat_ms = {now} WHERE id = $1"),
                &[Value::Text(id)],
            )?;
            Ok(())
        })
    }

    fn set_host_liveness(&self, id: &str, liveness: Liveness) -> Result<()> {
        let now = self.now();
        self.lazy(|s| {
            s.execute(
                &format!(
                    "UPDATE sandbox_hosts SET expiry_ms = $2, heartbeat_ms = {now} WHERE id = $1"
                ),
                &[Value::Text(id), Value::Int(millis(liveness.expiry))],
            )?;
            Ok(())
        })
    }

    fn remove_host(&self, id: &str) -> Result<()> {
        self.lazy(|s| {
            s.execute(
                "DELETE FROM sandbox_hosts WHERE id = $1",
                &[Value::Text(id)],
            )?;
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
        let now = self.now();
        // `only_on_mine`: take another use of a lease this host is using
        // already, and nothing else (`Ok(Ok(None))` before any write).
        let check_and_mark = |s: &mut dyn Session,
                              only_on_mine: bool|
         -> Result<Result<Option<LeaseRecord>>> {
            let Some(record) = s.lease(id, D::LOCK_ROW)? else {
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
            let mut busy = s.owner(record.busy_owner.clone(), me, &now)?;
            if busy.is_none() && record.state == LeaseState::Acquiring {
                // An acquire recorded without an owner (an older store).
                busy = Some(Owner::Gone(None));
            }
            let closing = s.owner(record.closing_owner.clone(), me, &now)?;
            let mine_already = busy == Some(Owner::Me);
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
            let another_use = mine_already
                && decision.change == Change::MarkBusy
                && decision.poison.is_none()
                && decision.unknown.is_none()
                && decision.refuse.is_none();
            if only_on_mine && !another_use {
                return Ok(Ok(None));
            }
            if let Some(reason) = &decision.poison {
                s.execute(
                    &format!(
                        "UPDATE sandbox_leases SET state = 'poisoned', reason = $2, busy_owner = NULL,
                                busy_count = 0, closing_owner = NULL, updated_ms = {now}
                         WHERE id = $1"
                    ),
                    &[Value::Text(id), Value::Text(reason)],
                )?;
            }
            if let Some(reason) = &decision.unknown {
                s.execute(
                    &format!(
                        "UPDATE sandbox_leases SET state = 'unknown', reason = $2, busy_owner = NULL,
                                busy_count = 0, updated_ms = {now}
                         WHERE id = $1"
                    ),
                    &[Value::Text(id), Value::Text(reason)],
                )?;
            }
            if let Some(message) = decision.refuse {
                return Ok(Err(LeaseRefused(message).into()));
            }
            let mark = match decision.change {
                Change::None => None,
                Change::MarkBusy => Some(
                    "UPDATE sandbox_leases SET busy_owner = $2, busy_count = busy_count + 1
                     WHERE id = $1"
                        .to_owned(),
                ),
                Change::Close => Some(format!(
                    "UPDATE sandbox_leases SET state = 'closing', closing_owner = $2,
                            updated_ms = {now}
                     WHERE id = $1"
                )),
                Change::CloseKeepingPoison => {
                    Some("UPDATE sandbox_leases SET closing_owner = $2 WHERE id = $1".to_owned())
                }
            };
            if let Some(mark) = mark {
                s.execute(&mark, &[Value::Text(id), Value::Text(me)])?;
            }
            let record = s.lease(id, "")?.context("the lease vanished")?;
            Ok(Ok(Some(record)))
        };
        // This host's mark is on the lease already (an operation it holds
        // open, such as the CLI's workspace and command). That mark was
        // flushed when the lease went from no use to one (every such mark
        // is), so another use need not be: losing its count in a crash of
        // the machine still leaves the lease busy by a host that died,
        // which sweep treats as possibly running. Checked again inside the
        // transaction; if the mark went meanwhile, the flushed way runs.
        let peeked = self.session(|s| s.lease(id, ""))?;
        if peeked.is_some_and(|r| r.busy_owner.as_deref() == Some(me)) {
            if let Some(record) = self.unflushed_transaction(|s| check_and_mark(s, true))? {
                return Ok(record);
            }
        }
        self.transaction(|s| check_and_mark(s, false))?
            .with_context(|| format!("lease {id} was checked but not marked"))
    }

    fn end_use(&self, id: &str, me: &str) -> Result<()> {
        self.lazy(|s| {
            // One conditional update: only the owner's mark is touched.
            s.execute(
                "UPDATE sandbox_leases
                 SET busy_count = CASE WHEN busy_count > 1 THEN busy_count - 1 ELSE 0 END,
                     busy_owner = CASE WHEN busy_count <= 1 THEN NULL ELSE busy_owner END
                 WHERE id = $1 AND busy_owner = $2",
                &[Value::Text(id), Value::Text(me)],
            )?;
            Ok(())
        })
    }

    fn end_close(&self, id: &str, me: &str, state: LeaseState, reason: &str) -> Result<()> {
        let now = self.now();
        self.transaction(|s| {
            let record = s
                .lease(id, D::LOCK_ROW)?
                .with_context(|| format!("no lease {id}"))?;
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
            s.execute(
                &format!(
                    "UPDATE sandbox_leases SET state = $2, reason = $3, closing_owner = NULL,
                            updated_ms = {now}
                     WHERE id = $1"
                ),
                &[
                    Value::Text(id),
                    Value::Text(state.as_str()),
                    Value::Text(&reason),
                ],
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
        let id = self.new_id()?;
        let now = self.now();
        self.session(|s| {
            s.execute(
                &format!(
                    "INSERT INTO sandbox_leases (id, provider, company_id, environment_id, run_id,
                            config, state, reason, created_ms, updated_ms, busy_owner, busy_count)
                     VALUES ($1, $2, $3, $4, $5, $6, 'acquiring', 'acquire in progress',
                             {now}, {now}, $7, 1)"
                ),
                &[
                    Value::Text(&id),
                    Value::Text(&ctx.driver_key),
                    Value::Text(&ctx.company_id),
                    Value::Text(&ctx.environment_id),
                    Value::Text(run_id),
                    Value::Text(&ctx.config),
                    Value::Text(me),
                ],
            )?;
            s.lease(&id, "")?
                .context("the lease just recorded is missing")
        })
    }

    fn record_lease(&self, id: &str, lease: &Lease, state: LeaseState) -> Result<()> {
        let now = self.now();
        self.transaction(|s| {
            s.check_transition(id, state, D::LOCK_ROW)?;
            s.execute(
                &format!(
                    "UPDATE sandbox_leases SET provider_lease_id = $2, metadata = $3,
                            expires_at = $4, state = $5, reason = NULL, updated_ms = {now}
                     WHERE id = $1"
                ),
                &[
                    Value::Text(id),
                    Value::Text(&lease.provider_lease_id),
                    Value::Text(&lease.metadata),
                    Value::MaybeText(lease.expires_at.as_deref()),
                    Value::Text(state.as_str()),
                ],
            )?;
            Ok(Ok(()))
        })
    }

    fn set_state(&self, id: &str, state: LeaseState, reason: Option<&str>) -> Result<()> {
        let now = self.now();
        self.transaction(|s| {
            s.check_transition(id, state, D::LOCK_ROW)?;
            s.execute(
                &format!(
                    "UPDATE sandbox_leases SET state = $2, reason = $3, updated_ms = {now}
                     WHERE id = $1"
                ),
                &[
                    Value::Text(id),
                    Value::Text(state.as_str()),
                    Value::MaybeText(reason),
                ],
            )?;
            if state.is_final() {
                s.execute(
                    "UPDATE sandbox_leases SET busy_owner = NULL, busy_count = 0,
                            closing_owner = NULL
                     WHERE id = $1",
                    &[Value::Text(id)],
                )?;
            }
            Ok(Ok(()))
        })
    }

    fn poison(&self, id: &str, reason: &str) -> Result<()> {
        let now = self.now();
        self.session(|s| {
            // One conditional update: a poisoned or final lease stays as it
            // is; marks stay too (their owners drop them when they end).
            let changed = s.execute(
                &format!(
                    "UPDATE sandbox_leases SET state = 'poisoned', reason = $2, updated_ms = {now}
                     WHERE id = $1 AND state NOT IN ('poisoned', 'destroyed', 'unknown')"
                ),
                &[Value::Text(id), Value::Text(reason)],
            )?;
            if changed == 0 && s.lease(id, "")?.is_none() {
                bail!("no lease {id}");
            }
            Ok(())
        })
    }

    fn get(&self, id: &str) -> Result<Option<LeaseRecord>> {
        self.session(|s| s.lease(id, ""))
    }

    fn list(&self) -> Result<Vec<LeaseRecord>> {
        self.session(|s| s.leases("SELECT * FROM sandbox_leases ORDER BY created_ms, id", &[]))
    }

    fn needing_sweep(&self) -> Result<Vec<LeaseRecord>> {
        self.session(|s| s.leases(NEEDING_SWEEP, &[]))
    }
}

fn record(row: &dyn Columns) -> Result<LeaseRecord> {
    let text = |column: &str| -> Result<String> {
        row.text(column)?
            .with_context(|| format!("a lease in the store has no {column}"))
    };
    let lease = match row.text("provider_lease_id")? {
        Some(provider_lease_id) => Some(Lease {
            provider_lease_id,
            metadata: row.text("metadata")?.unwrap_or_default(),
            expires_at: row.text("expires_at")?,
        }),
        None => None,
    };
    Ok(LeaseRecord {
        id: text("id")?,
        provider: text("provider")?,
        company_id: text("company_id")?,
        environment_id: text("environment_id")?,
        run_id: text("run_id")?,
        config: text("config")?,
        state: text("state")?.parse()?,
        reason: row.text("reason")?,
        lease,
        created_ms: row.int("created_ms")?,
        updated_ms: row.int("updated_ms")?,
        busy_owner: row.text("busy_owner")?,
        closing_owner: row.text("closing_owner")?,
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
