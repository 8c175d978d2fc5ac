//! The instance factory: one fresh provider instance per operation, with
//! the environment's guarded transport, its deadline, cancellation, the
//! output sink, and for a creating operation the sandbox recorder.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::{Environment, SandboxRuntime};
use crate::leases::rules::LeaseState;
use crate::network::transport::Transport;
use crate::wasm::bindings::types::Lease;
use crate::wasm::cancel::CancelToken;
use crate::wasm::instance::ProviderInstance;
use crate::wasm::options::{ChunkSink, HostOptions, SandboxRecorder};

impl SandboxRuntime {
    pub(super) fn plain_instance(&self, deadline: Duration) -> Result<ProviderInstance> {
        self.component.instantiate(
            HostOptions::new()
                .with_deadline(deadline)
                .with_guest_stderr(self.stderr),
        )
    }

    pub(super) fn instance(
        &self,
        env: &Environment,
        deadline: Duration,
        cancel: CancelToken,
        output: Option<ChunkSink>,
    ) -> Result<ProviderInstance> {
        self.component
            .instantiate(self.options(env, deadline, cancel, output))
    }

    /// An instance for an acquire or probe recorded as lease `record_id`:
    /// each sandbox id the provider reports (`host.record-sandbox`) is
    /// written to that record before the provider goes on, so a host that
    /// dies from then on leaves a lease that sweep destroys.
    pub(super) fn creating_instance(
        &self,
        env: &Environment,
        record_id: &str,
        output: Option<ChunkSink>,
    ) -> Result<ProviderInstance> {
        let store = self.store.clone();
        let id = record_id.to_owned();
        let recorder: SandboxRecorder = Arc::new(move |sandbox_id| {
            let lease = Lease {
                provider_lease_id: sandbox_id.to_owned(),
                metadata: "{}".into(),
                expires_at: None,
            };
            store.record_lease(&id, &lease, LeaseState::Acquiring)
        });
        let options = self
            .options(
                env,
                env.deadlines.lifecycle_deadline(),
                CancelToken::new(),
                output,
            )
            .with_sandbox_recorder(recorder);
        self.component.instantiate(options)
    }

    pub(super) fn options(
        &self,
        env: &Environment,
        deadline: Duration,
        cancel: CancelToken,
        output: Option<ChunkSink>,
    ) -> HostOptions {
        let transport: Arc<dyn Transport> =
            Arc::new(env.policy.clone().guard(self.transport.clone()));
        let mut options = HostOptions::new()
            .with_transport(transport)
            .with_deadline(deadline)
            .with_cancel(cancel)
            .with_guest_stderr(self.stderr);
        if let Some(output) = output {
            options = options.with_chunk_sink(output);
        }
        options
    }
}
