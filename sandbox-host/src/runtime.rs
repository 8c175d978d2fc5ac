//! The host runtime: environments (config, secret, policy, deadlines), leases
//! recorded durably and fenced by host instance, cleanup failures and traps
//! poisoning leases, and cancellation of running commands before a release
//! or destroy.
//!
//! This file holds [`SandboxRuntime`] and its settings; by concern:
//! `environment` (building an environment), `origin_policy` (which origin
//! receives which secret), `operations` (the lease operations and their
//! store bookkeeping), `instances` (one provider instance per operation,
//! the sandbox recorder), `in_flight` (the operations running on each lease
//! and their cancellation), `outcome` (names of outcomes, the declared rate
//! limit in the host's form).

mod environment;
mod environment_policy;
mod in_flight;
mod instances;
mod operations;
pub(crate) mod origin_policy;
mod outcome;
mod relay;

pub use environment::Environment;
pub use environment_policy::policy_capabilities;
pub use in_flight::UseGuard;
pub use outcome::action_name;
use outcome::declared_limit;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::Result;

use crate::deadline::DEFAULT_MARGIN;
use crate::leases::backend::{HostInstance, LeaseStore, Liveness};
use crate::network::request_pacer::{RateLimit, RequestPacer};
use crate::network::transport::Transport;
use crate::wasm::bindings::types::ProviderDescription;
use crate::wasm::cancel::CancelToken;
use crate::wasm::component::ProviderComponent;
use crate::wasm::options::{GuestStderr, HostOptions};

/// Runs provider operations with durable lease bookkeeping.
///
/// - A lease is recorded (`acquiring`, owned by this host instance) before
///   the provider creates anything; `probe` is recorded the same way.
/// - Each operation checks and marks the lease in one store transaction
///   (see [`leases::rules`](crate::leases::rules)): a mark left by a host whose
///   heartbeat expired poisons the lease first, whatever the operation.
/// - `cleanup-failed`, or a trap or limit hit during an operation that may
///   have left something running, poisons the lease; a poisoned lease
///   refuses execute, resume and release, and only destroy clears it.
/// - Release and destroy first move the lease to `closing` (nothing new may
///   start), then cancel the lease's running commands and wait for them.
/// - `expired` on resume destroys the sandbox before the lease is recorded
///   as destroyed (poisoned if the delete is not confirmed).
pub struct SandboxRuntime {
    component: ProviderComponent,
    description: ProviderDescription,
    store: Arc<dyn LeaseStore>,
    host: HostInstance,
    transport: Arc<dyn Transport>,
    pacer: RequestPacer,
    rate_limit: Option<RateLimit>,
    /// `rate_limit` is `describe`'s (not the operator's): not spent on the engine.
    rate_limit_declared: bool,
    stderr: GuestStderr,
    margin: Duration,
    running: Mutex<HashMap<String, Vec<CancelToken>>>,
    finished: Condvar,
}

impl SandboxRuntime {
    /// A runtime for `component`, storing leases in `store` (for example a
    /// [`SqliteLeases`](crate::SqliteLeases)), sending allowed
    /// requests through `transport` (usually [`NetworkTransport`](crate::NetworkTransport)).
    /// Registers a host instance in the store whose heartbeat runs while
    /// the runtime lives ([`Liveness::DEFAULT`]).
    pub fn new(
        component: ProviderComponent,
        store: Arc<dyn LeaseStore>,
        transport: Arc<dyn Transport>,
    ) -> Result<Self> {
        let description = component.instantiate(HostOptions::new())?.describe()?;
        let rate_limit = description.rate_limit.map(declared_limit);
        let host = HostInstance::register(store.clone(), Liveness::DEFAULT)?;
        Ok(SandboxRuntime {
            component,
            description,
            store,
            host,
            transport,
            pacer: RequestPacer::global(),
            rate_limit,
            rate_limit_declared: true,
            stderr: GuestStderr::Discard,
            margin: DEFAULT_MARGIN,
            running: Mutex::new(HashMap::new()),
            finished: Condvar::new(),
        })
    }

    /// Keeps the request budget in `budget` instead of this process's
    /// memory (for example [`RequestPacer::open`] on a file every host
    /// process of the machine shares).
    pub fn with_request_pacer(mut self, pacer: RequestPacer) -> Self {
        self.pacer = pacer;
        self
    }

    /// Spends `limit` instead of the provider's declared `rate-limit`: `None`
    /// for a backend without a limit (a local backend), or the limit of the
    /// operator's account. Never raise it above what the API allows.
    pub fn with_rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.rate_limit = limit;
        self.rate_limit_declared = false;
        self
    }

    /// The rate limit this runtime spends per API origin.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.rate_limit.as_ref()
    }

    /// The margin an instance may run past the provider's own plan and its
    /// cleanup reserve before the host stops it (default 5 s; see
    /// [`Deadlines`](crate::Deadlines)); a stopped `execute` poisons its lease.
    pub fn with_grace(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// What happens to the guest's stderr.
    pub fn with_guest_stderr(mut self, stderr: GuestStderr) -> Self {
        self.stderr = stderr;
        self
    }

    /// Changes how this host proves it is alive to other hosts sharing the
    /// store.
    pub fn set_liveness(&self, liveness: Liveness) -> Result<()> {
        self.host.set_liveness(liveness)
    }

    /// This host's instance id (the owner of its marks in the store).
    pub fn host_id(&self) -> &str {
        self.host.id()
    }

    /// What the provider said about itself.
    pub fn description(&self) -> &ProviderDescription {
        &self.description
    }

    /// The component this runtime runs (for example to ask which contract
    /// it was built for).
    pub fn component(&self) -> &ProviderComponent {
        &self.component
    }

    /// The lease store.
    pub fn store(&self) -> &dyn LeaseStore {
        &*self.store
    }
}

impl fmt::Debug for SandboxRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxRuntime")
            .field("provider", &self.description.driver_key)
            .field("host", &self.host.id())
            .finish_non_exhaustive()
    }
}
