//! The CreateOS provider as the SDK's [`Provider`]: the SDK sets each
//! operation up (config parsed, platform pointed at the API origin); each
//! operation here runs the protocol modules.

use crate::config::Config;
use crate::lifecycle::Lifecycle;
use crate::{execute, lease};
use provider_sdk::types::*;
use provider_sdk::{Operation, Provider};

/// The CreateOS provider.
pub struct CreateOs;

provider_sdk::export_provider!(CreateOs);

type Op<'a> = Operation<'a, Config>;

impl Provider for CreateOs {
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

    fn sync_in(op: Op, lease: &Lease, files: &[FileUpload]) -> Result<SyncReport, ProviderError> {
        Lifecycle::new(op).sync_in(lease, files)
    }

    fn sync_out(
        op: Op,
        lease: &Lease,
        remote_paths: &[String],
    ) -> Result<Vec<FileDownload>, ProviderError> {
        Lifecycle::new(op).sync_out(lease, remote_paths)
    }

    fn execute(
        op: Op,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let metadata = lease::check(lease, op.ctx, &op.config)?;
        execute::execute(op.platform, &op.config, &metadata.sandbox_id, request)
    }
}
