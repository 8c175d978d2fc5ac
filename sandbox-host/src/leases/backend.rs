//! What a lease store is, whatever keeps it: the stored lease, the host
//! instance that proves it is alive by heartbeat, and the [`LeaseStore`]
//! trait a store implements (SQLite: [`SqliteLeases`](crate::SqliteLeases)).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::leases::rules::{HostSeen, LeaseState, Operation, Owner};
use crate::wasm::bindings::types::{EnvironmentContext, Lease};

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
    /// The host instance running an operation on the sandbox (a command,
    /// the workspace, a resume, the acquire itself), if any. If that host's
    /// heartbeat expires, the lease is poisoned before anything else
    /// touches it.
    pub busy_owner: Option<String>,
    /// The host instance releasing or destroying the lease, if any.
    pub closing_owner: Option<String>,
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
}

/// The store refused an operation on a lease before anything ran (its
/// state, another host's mark, a dead host's mark that just poisoned it).
/// The message says why and what fixes it.
#[derive(Debug)]
pub struct LeaseRefused(pub String);

impl fmt::Display for LeaseRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LeaseRefused {}

/// The lease store could not be reached (database down, connection lost):
/// the operation changed nothing and may be retried once the store is back.
#[derive(Debug)]
pub struct StoreUnavailable(pub String);

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreUnavailable {}

/// How a host instance proves it is alive: it refreshes its heartbeat every
/// `heartbeat`, and any host may treat it as gone once its last heartbeat
/// is older than `expiry`. Each instance stores its own expiry, so hosts
/// with different settings can share a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// How often the heartbeat is refreshed.
    pub heartbeat: Duration,
    /// After how long without a heartbeat the instance counts as gone.
    pub expiry: Duration,
}

impl Liveness {
    /// Heartbeat every 2 s, gone after 10 s.
    pub const DEFAULT: Liveness = Liveness {
        heartbeat: Duration::from_secs(2),
        expiry: Duration::from_secs(10),
    };

    /// Checks that the expiry leaves room for at least two missed beats.
    pub fn new(heartbeat: Duration, expiry: Duration) -> Result<Liveness> {
        if heartbeat.is_zero() || expiry < heartbeat * 2 {
            bail!(
                "the host expiry ({expiry:?}) must be at least twice the heartbeat interval ({heartbeat:?}), which must not be zero"
            );
        }
        Ok(Liveness { heartbeat, expiry })
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Where leases and host instances are kept. The state machine is
/// [`leases::rules`](crate::leases::rules); a backend applies its decisions
/// atomically (SQLite: one `BEGIN IMMEDIATE` transaction; a server
/// database: one transaction with the lease row locked), judges host
/// liveness by heartbeat age against each host's own expiry, and keeps a
/// poison durable.
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// Whether the leases outlive this process.
    fn is_durable(&self) -> bool;

    /// Records host instance `id` (with this process's pid and machine
    /// name, for people) and a first heartbeat.
    fn add_host(&self, id: &str, liveness: Liveness) -> Result<()>;
    /// Refreshes the heartbeat of host `id`.
    fn beat(&self, id: &str) -> Result<()>;
    /// Changes the expiry host `id` is judged by (and beats).
    fn set_host_liveness(&self, id: &str, liveness: Liveness) -> Result<()>;
    /// Forgets host `id`; marks it still owns then count as a dead host's.
    fn remove_host(&self, id: &str) -> Result<()>;

    /// Checks and marks lease `id` for `operation` by host `me` in one
    /// transaction, as [`leases::rules::decide`](crate::leases::rules::decide)
    /// says: a mark of a host whose heartbeat expired poisons the lease
    /// durably (even when the operation is then refused with
    /// [`LeaseRefused`]); execute, realize and resume take a busy mark;
    /// release and destroy move the lease to `closing` (a poisoned lease
    /// stays poisoned) and own the close. `ctx` must be the lease's
    /// provider and environment. Returns the record after the change.
    fn begin(
        &self,
        id: &str,
        operation: Operation,
        ctx: &EnvironmentContext,
        me: &str,
    ) -> Result<LeaseRecord>;
    /// Ends one busy operation of `me` (the mark goes with the last one);
    /// never touches another host's mark.
    fn end_use(&self, id: &str, me: &str) -> Result<()>;
    /// Ends the close `me` owns, moving the lease to `state`; a lease
    /// poisoned meanwhile stays poisoned unless `state` is `destroyed`.
    fn end_close(&self, id: &str, me: &str, state: LeaseState, reason: &str) -> Result<()>;
    /// Records a lease about to be acquired (`acquiring`, busy by `me`).
    fn begin_acquire(
        &self,
        ctx: &EnvironmentContext,
        run_id: &str,
        me: &str,
    ) -> Result<LeaseRecord>;
    /// Stores the provider's lease and moves to `state`.
    fn record_lease(&self, id: &str, lease: &Lease, state: LeaseState) -> Result<()>;
    /// Moves to `state` if the state machine allows it; a final state
    /// drops every mark.
    fn set_state(&self, id: &str, state: LeaseState, reason: Option<&str>) -> Result<()>;
    /// Poisons the lease (no-op when poisoned or final).
    fn poison(&self, id: &str, reason: &str) -> Result<()>;
    /// The lease with host id `id`.
    fn get(&self, id: &str) -> Result<Option<LeaseRecord>>;
    /// Every lease, oldest first.
    fn list(&self) -> Result<Vec<LeaseRecord>>;
    /// Poisoned, acquiring and closing leases, and any lease with a mark.
    fn needing_sweep(&self) -> Result<Vec<LeaseRecord>>;
}

/// Whether a host instance another one found in the store is alive: its
/// process, when it ran on this machine, is checked directly (a holder
/// killed here is gone at once, see [`local`](super::local)); otherwise,
/// and for hosts elsewhere, its heartbeat must be younger than its expiry.
pub(crate) fn judge(mut seen: HostSeen) -> Owner {
    if super::local::has_exited(&seen.id) {
        seen.exited_here = true;
        return Owner::Gone(Some(seen));
    }
    if seen.silent_ms <= seen.expiry_ms {
        Owner::Alive(seen)
    } else {
        Owner::Gone(Some(seen))
    }
}

/// One running host, registered in a [`LeaseStore`]: a random instance id
/// (never a pid, which another process may get later) and a heartbeat
/// refreshed by a background thread while this value lives.
pub struct HostInstance {
    id: String,
    store: Arc<dyn LeaseStore>,
    interval: Arc<AtomicU64>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The lock that tells processes on this machine this one is alive.
    _local: Option<super::local::LocalHold>,
}

impl HostInstance {
    /// Registers a new host instance (random id) in `store` and starts its
    /// heartbeat thread. The instance owns every mark this host takes;
    /// dropping it stops the heartbeat and removes its record.
    pub fn register(store: Arc<dyn LeaseStore>, liveness: Liveness) -> Result<HostInstance> {
        let id = format!("host-{}", random_hex(16)?);
        store.add_host(&id, liveness)?;
        let interval = Arc::new(AtomicU64::new(millis_u64(liveness.heartbeat)));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = {
            let store = Arc::downgrade(&store);
            let id = id.clone();
            let interval = interval.clone();
            std::thread::Builder::new()
                .name("sandbox-heartbeat".into())
                .spawn(move || loop {
                    let wait = Duration::from_millis(interval.load(Ordering::Relaxed));
                    match stopped.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let Some(store) = store.upgrade() else { return };
                    // A failed beat (store busy) is retried at the next one;
                    // the expiry leaves room for missed beats.
                    let _ = store.beat(&id);
                })
                .context("starting the heartbeat thread")?
        };
        Ok(HostInstance {
            _local: super::local::hold(&id),
            id,
            store,
            interval,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The instance id that owns this host's marks.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Changes the heartbeat interval and the expiry other hosts judge
    /// this instance by.
    pub fn set_liveness(&self, liveness: Liveness) -> Result<()> {
        self.interval
            .store(millis_u64(liveness.heartbeat), Ordering::Relaxed);
        self.store.set_host_liveness(&self.id, liveness)
    }

    /// Stops heartbeating without removing the record, as a host that
    /// froze or died would (for tests of what other hosts then do).
    pub fn stop_heartbeat_for_test(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HostInstance {
    fn drop(&mut self) {
        let alive = self.thread.is_some();
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if alive {
            // Any mark still owned now belongs to an operation that did not
            // end: without the record, other hosts treat it as a dead host's.
            let _ = self.store.remove_host(&self.id);
        }
    }
}

impl fmt::Debug for HostInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostInstance")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn millis_u64(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buffer))
        .context("reading /dev/urandom for a host instance id")?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}
