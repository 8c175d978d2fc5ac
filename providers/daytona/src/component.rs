//! The Daytona provider as the SDK's [`Provider`]: the SDK sets each
//! operation up (config parsed, platform pointed at the API origin;
//! toolbox requests name their own origin); each operation here runs the
//! protocol modules.

use crate::config::Config;
use crate::lifecycle::{resolve_path, Lifecycle};
use crate::{execute, lease};
use provider_sdk::types::*;
use provider_sdk::{Operation, Provider};

/// The Daytona provider.
pub struct Daytona;

provider_sdk::export_provider!(Daytona);

type Op<'a> = Operation<'a, Config>;

impl Provider for Daytona {
    type Config = Config;

    fn describe() -> ProviderDescription {
        crate::describe::description()
    }

    fn probe(op: Op) -> Result<ProbeReport, ProviderError> {
        Lifecycle::new(op).probe()
    }

    fn acquire_lease(op: Op, request: &AcquireRequest) -> Result<Lease, ProviderError> {
        Lifecycle::new(op).acquire(request)
    }

    fn resume_lease(op: Op, lease: &Lease) -> Result<ResumeOutcome, ProviderError> {
        Lifecycle::new(op).resume(lease)
    }

    fn release_lease(op: Op, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        Lifecycle::new(op).release(lease)
    }

    fn destroy_lease(op: Op, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        Lifecycle::new(op).destroy(lease)
    }

    fn realize_workspace(
        op: Op,
        lease: &Lease,
        request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        Lifecycle::new(op).realize(lease, request)
    }

    fn execute(
        op: Op,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, op.ctx)?;
        let mut request = request.clone();
        request.cwd = Some(match &request.cwd {
            None => metadata.cwd.clone(),
            Some(cwd) => resolve_path(&metadata.workspace_root(), cwd)?,
        });
        execute::execute(op.platform, &op.config, &metadata.sandbox_id, &request)
    }
}
