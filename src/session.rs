//! One scenario's world: a fresh backend, a runtime on a lease store of its
//! own, and an environment on the backend's config. Every lease the
//! session acquires is destroyed when it ends, and the backend is stopped
//! with its survivor report checked.

use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use sandbox_host::types::{AcquireRequest, ExecuteRequest, ExecuteResult, ProviderError};
use sandbox_host::{
    error_text, CancelToken, Environment, HostOptions, LeaseRecord, LeaseState, NetworkTransport,
    OutputSink, ProviderComponent, ProviderInstance, RequestPacer, SandboxRuntime, Secrets,
    SqliteLeases,
};
use serde_json::Value;

use crate::backend::Backend;
use crate::procs;
use crate::target::Target;

/// The company every scenario's environment belongs to.
pub const COMPANY: &str = "conformance";

/// A backend, a runtime and an environment for one scenario.
pub struct Session {
    component: ProviderComponent,
    runtime: SandboxRuntime,
    env: Environment,
    config: Value,
    backend: Option<Box<dyn Backend>>,
    leases: Mutex<Vec<String>>,
}

impl Session {
    /// A fresh backend of `target` and a runtime with an environment on
    /// it; `patch` fields are merged over the backend's config.
    pub fn open(target: &Target, patch: Option<&Value>) -> Result<Session> {
        let backend = target.start_backend()?;
        let declared_rate_limit = target.declared_rate_limit();
        let mut config = backend.config();
        if let (Some(object), Some(Value::Object(patch))) = (config.as_object_mut(), patch) {
            for (field, value) in patch {
                object.insert(field.clone(), value.clone());
            }
        }
        let store = Arc::new(SqliteLeases::open_in_memory()?);
        let component = target.component()?;
        let mut runtime =
            SandboxRuntime::new(component.clone(), store, Arc::new(NetworkTransport::new()))?
                .with_request_pacer(RequestPacer::in_memory());
        if !declared_rate_limit {
            runtime = runtime.with_rate_limit(None);
        }
        let env = environment(&runtime, &config)?;
        Ok(Session {
            component,
            runtime,
            env,
            config,
            backend: Some(backend),
            leases: Mutex::new(Vec::new()),
        })
    }

    /// The runtime (and through it the lease store and the description).
    pub fn runtime(&self) -> &SandboxRuntime {
        &self.runtime
    }

    /// The environment on the backend's config.
    pub fn env(&self) -> &Environment {
        &self.env
    }

    /// The config the environment was made from, secret included.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &dyn Backend {
        self.backend
            .as_deref()
            .expect("the backend runs until finish")
    }

    /// A provider instance behind the environment's policy (its origins,
    /// its secret headers) and deadline, for a call the runtime would
    /// refuse from its records (a second destroy of a destroyed lease).
    pub fn instance(&self) -> Result<ProviderInstance> {
        let guard = self
            .env
            .policy()
            .clone()
            .guard(Arc::new(NetworkTransport::new()));
        self.component.instantiate(
            HostOptions::new()
                .with_transport(Arc::new(guard))
                .with_deadline(self.env.deadlines().lifecycle_deadline()),
        )
    }

    /// Another environment on `config` (for example with a wrong key).
    pub fn environment_for(&self, config: &Value) -> Result<Environment> {
        environment(&self.runtime, config)
    }

    /// `acquire` through the runtime; the lease is destroyed when the
    /// session ends.
    pub fn try_acquire(
        &self,
        env: &Environment,
        run_id: &str,
    ) -> Result<Result<LeaseRecord, ProviderError>> {
        let request = AcquireRequest {
            run_id: run_id.to_owned(),
            requested_cwd: None,
            workspace_mode: None,
            requested_expires_at: None,
            egress: None,
            adapter_type: None,
            image: None,
            template: None,
        };
        let outcome = self.runtime.acquire(env, &request)?;
        if let Ok(record) = &outcome {
            self.leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record.id.clone());
        }
        Ok(outcome)
    }

    /// A lease that must be acquired.
    pub fn acquire(&self) -> Result<LeaseRecord> {
        match self.try_acquire(&self.env, "conformance")? {
            Ok(record) => {
                if record.state != LeaseState::Active {
                    bail!(
                        "acquire succeeded but the lease is {}, not active",
                        record.state
                    );
                }
                Ok(record)
            }
            Err(error) => bail!("acquire failed: {}", error_text(&error)),
        }
    }

    /// `execute` through the runtime.
    pub fn execute(
        &self,
        lease_id: &str,
        request: &ExecuteRequest,
        output: Option<OutputSink>,
        cancel: CancelToken,
    ) -> Result<Result<ExecuteResult, ProviderError>> {
        self.runtime
            .execute(&self.env, lease_id, request, output, cancel)
    }

    /// A command that must give a confirmed result (exited or timed out).
    pub fn run(&self, lease_id: &str, request: &ExecuteRequest) -> Result<ExecuteResult> {
        match self.execute(lease_id, request, None, CancelToken::new())? {
            Ok(result) => Ok(result),
            Err(error) => bail!(
                "`{} {:?}` gave no result: {}",
                request.command,
                request.args,
                error_text(&error)
            ),
        }
    }

    /// The lease's record in the store.
    pub fn record(&self, lease_id: &str) -> Result<LeaseRecord> {
        self.runtime
            .store()
            .get(lease_id)?
            .ok_or_else(|| anyhow!("lease {lease_id} is not in the lease store"))
    }

    /// The lease's state in the store.
    pub fn state(&self, lease_id: &str) -> Result<LeaseState> {
        Ok(self.record(lease_id)?.state)
    }

    /// Processes of this machine carrying `marker`, or `None` when the
    /// backend's commands do not run on this machine.
    pub fn survivors(&self, marker: &str) -> Option<Vec<String>> {
        self.backend()
            .processes_on_this_machine()
            .then(|| procs::survivors(marker))
    }

    /// Destroys every lease the session acquired that is not final, then
    /// stops the backend. An error when a destroy or the backend's survivor
    /// report failed.
    pub fn finish(mut self) -> Result<()> {
        let cleanup = self.destroy_leftovers();
        let stop = match self.backend.take() {
            Some(backend) => backend.stop(),
            None => Ok(()),
        };
        cleanup.and(stop)
    }

    fn destroy_leftovers(&self) -> Result<()> {
        if let Some(backend) = &self.backend {
            backend.clear_faults();
        }
        let leases = std::mem::take(&mut *self.leases.lock().unwrap_or_else(|e| e.into_inner()));
        let mut failures = Vec::new();
        for id in leases {
            let Ok(record) = self.record(&id) else {
                continue;
            };
            if matches!(record.state, LeaseState::Destroyed | LeaseState::Unknown) {
                continue;
            }
            match self.runtime.destroy(&self.env, &id) {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => failures.push(format!("{id}: {}", error_text(&error))),
                Err(error) => failures.push(format!("{id}: {error:#}")),
            }
        }
        if !failures.is_empty() {
            bail!(
                "leases left by the scenario could not be destroyed: {}",
                failures.join("; ")
            );
        }
        Ok(())
    }
}

impl Drop for Session {
    /// A scenario that failed early still destroys its leases and stops its
    /// backend (best effort; the failure is already reported).
    fn drop(&mut self) {
        if self.backend.is_some() {
            let _ = self.destroy_leftovers();
            if let Some(backend) = self.backend.take() {
                let _ = backend.stop();
            }
        }
    }
}

fn environment(runtime: &SandboxRuntime, config: &Value) -> Result<Environment> {
    let environment_id = format!("env-{}", procs::unique_marker());
    runtime
        .environment(
            COMPANY,
            &environment_id,
            &config.to_string(),
            &Secrets::none(),
        )
        .context("the environment was refused")
}
