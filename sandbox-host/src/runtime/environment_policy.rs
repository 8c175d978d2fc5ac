//! The operations of contract 0.7.0's environment policy, with the host's
//! usual bookkeeping: the egress policy of a live lease (`set-egress`), a
//! port made reachable from outside (`open-port`), and templates
//! (`capture-template`, `list-templates`, `delete-template`). Each is
//! refused by the host, before any instance runs, when the provider's
//! capabilities do not claim it; so is an acquire request asking for a
//! policy, an image or a template the provider does not claim.

use anyhow::Result;

use super::{Environment, SandboxRuntime};
use crate::leases::backend::LeaseRecord;
use crate::leases::rules::{LeaseState, Operation};
use crate::wasm::bindings::types::{
    AcquireRequest, Capabilities, EgressPolicy, Lease, PortEndpoint, ProviderError,
    TemplateDeletion, TemplateInfo,
};
use crate::wasm::cancel::CancelToken;
use crate::wasm::instance::ProviderInstance;

/// The WIT name of each capability of 0.7.0 (for messages).
const CAPABILITY_NAMES: [(Capabilities, &str); 6] = [
    (Capabilities::EGRESS_POLICY, "egress-policy"),
    (Capabilities::IMAGES, "images"),
    (Capabilities::TEMPLATES, "templates"),
    (Capabilities::IDLE_PAUSE, "idle-pause"),
    (Capabilities::PORTS, "ports"),
    (Capabilities::CONCURRENT_SYNC, "concurrent-sync"),
];

impl SandboxRuntime {
    /// `unsupported` unless the provider claims `capability`; `what` says
    /// what was asked for ("an egress policy").
    fn unclaimed(&self, capability: Capabilities, what: &str) -> Option<ProviderError> {
        if self.description.capabilities.contains(capability) {
            return None;
        }
        let name = CAPABILITY_NAMES
            .iter()
            .find(|(flag, _)| *flag == capability)
            .map_or("?", |(_, name)| *name);
        Some(ProviderError::Unsupported(format!(
            "provider {} does not claim the capability `{name}`, so it cannot carry {what}; \
             nothing was asked of it (`sandbox describe` lists what it supports)",
            self.description.driver_key
        )))
    }

    /// Runs `operation` (the WIT name `name`) on the active lease
    /// `lease_id` as a use of kind `kind`, in an instance held to the
    /// lifecycle deadline; a trap or `cleanup-failed` poisons the lease.
    fn on_active_lease<T>(
        &self,
        env: &Environment,
        lease_id: &str,
        kind: Operation,
        name: &str,
        operation: impl FnOnce(&mut ProviderInstance, &Lease) -> Result<Result<T, ProviderError>>,
    ) -> Result<Result<T, ProviderError>> {
        let cancel = CancelToken::new();
        let (_, lease, _using) = self.begin_use(env, lease_id, kind, cancel.clone())?;
        let outcome = self
            .instance(env, env.deadlines.lifecycle_deadline(), cancel, None)
            .and_then(|mut i| operation(&mut i, &lease));
        self.poison_on_failure(lease_id, name, &outcome)?;
        outcome
    }

    /// An instance for an operation on no lease, held to the lifecycle
    /// deadline.
    fn lifecycle_instance(&self, env: &Environment) -> Result<ProviderInstance> {
        self.instance(
            env,
            env.deadlines.lifecycle_deadline(),
            CancelToken::new(),
            None,
        )
    }

    /// Why the provider cannot carry `request`, before anything is
    /// recorded or created: an egress policy other than `unrestricted`
    /// without `egress-policy`, an image without `images`, a template
    /// without `templates`. The adapter type needs nothing: without
    /// `images` the sandbox starts from the config's image.
    pub(super) fn acquire_refusal(&self, request: &AcquireRequest) -> Option<ProviderError> {
        let egress = matches!(
            request.egress,
            Some(EgressPolicy::BlockAll | EgressPolicy::Allow(_))
        )
        .then(|| self.unclaimed(Capabilities::EGRESS_POLICY, "an egress policy"));
        let image = request
            .image
            .as_ref()
            .map(|_| self.unclaimed(Capabilities::IMAGES, "an image choice"));
        let template = request
            .template
            .as_ref()
            .map(|_| self.unclaimed(Capabilities::TEMPLATES, "a template to start from"));
        [egress, image, template]
            .into_iter()
            .flatten()
            .flatten()
            .next()
    }

    /// `set-egress` on an active lease (capability `egress-policy`): the
    /// lease the provider returns, recording the policy, replaces the
    /// stored one. A trap or `cleanup-failed` poisons the lease.
    pub fn set_egress(
        &self,
        env: &Environment,
        lease_id: &str,
        policy: &EgressPolicy,
    ) -> Result<Result<LeaseRecord, ProviderError>> {
        if let Some(refused) = self.unclaimed(Capabilities::EGRESS_POLICY, "an egress policy") {
            return Ok(Err(refused));
        }
        let outcome = self.on_active_lease(
            env,
            lease_id,
            Operation::Configure,
            "set-egress",
            |i, lease| i.set_egress(&env.ctx, lease, policy),
        );
        match outcome? {
            Ok(lease) => {
                self.store
                    .record_lease(lease_id, &lease, LeaseState::Active)?;
                Ok(Ok(self.record(lease_id)?))
            }
            Err(error) => Ok(Err(error)),
        }
    }

    /// `open-port` on an active lease (capability `ports`): the URL of
    /// `port` and the headers that guard it. The header values are secrets:
    /// give them only to whoever the port is opened for, never log them.
    /// Port 0 is refused before the provider is asked.
    pub fn open_port(
        &self,
        env: &Environment,
        lease_id: &str,
        port: u16,
    ) -> Result<Result<PortEndpoint, ProviderError>> {
        if let Some(refused) = self.unclaimed(Capabilities::PORTS, "a port reachable from outside")
        {
            return Ok(Err(refused));
        }
        if port == 0 {
            return Ok(Err(ProviderError::InvalidRequest(
                "port 0 is not a port a server can listen on; give one from 1 to 65535".into(),
            )));
        }
        self.on_active_lease(
            env,
            lease_id,
            Operation::Configure,
            "open-port",
            |i, lease| i.open_port(&env.ctx, lease, port),
        )
    }

    /// `capture-template` on an active lease (capability `templates`): the
    /// provider pauses (or stops) the sandbox and keeps its files under
    /// `name`. The sandbox is left paused: release or destroy the lease
    /// afterwards (the lease stays active until then). A trap or
    /// `cleanup-failed` poisons the lease.
    pub fn capture_template(
        &self,
        env: &Environment,
        lease_id: &str,
        name: &str,
    ) -> Result<Result<TemplateInfo, ProviderError>> {
        if let Some(refused) = self.unclaimed(Capabilities::TEMPLATES, "templates") {
            return Ok(Err(refused));
        }
        self.on_active_lease(
            env,
            lease_id,
            Operation::Capture,
            "capture-template",
            |i, lease| i.capture_template(&env.ctx, lease, name),
        )
    }

    /// `list-templates` (capability `templates`): the environment's
    /// templates, oldest first.
    pub fn list_templates(
        &self,
        env: &Environment,
    ) -> Result<Result<Vec<TemplateInfo>, ProviderError>> {
        if let Some(refused) = self.unclaimed(Capabilities::TEMPLATES, "templates") {
            return Ok(Err(refused));
        }
        self.lifecycle_instance(env)?.list_templates(&env.ctx)
    }

    /// `delete-template` (capability `templates`): sandboxes started from
    /// the template are left alone.
    pub fn delete_template(
        &self,
        env: &Environment,
        template_ref: &str,
    ) -> Result<Result<TemplateDeletion, ProviderError>> {
        if let Some(refused) = self.unclaimed(Capabilities::TEMPLATES, "templates") {
            return Ok(Err(refused));
        }
        self.lifecycle_instance(env)?
            .delete_template(&env.ctx, template_ref)
    }
}

/// The capabilities of contract 0.7.0 a description claims, by their WIT
/// names (for `sandbox describe`).
pub fn policy_capabilities(capabilities: Capabilities) -> Vec<(&'static str, bool)> {
    CAPABILITY_NAMES
        .iter()
        .map(|(flag, name)| (*name, capabilities.contains(*flag)))
        .collect()
}
