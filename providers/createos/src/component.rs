//! The CreateOS provider as the SDK's [`Provider`]: each operation parses
//! the context's config, points the platform at its API origin, and runs
//! the protocol modules.

use crate::config::{self, Config};
use crate::execute;
use crate::lease;
use crate::lifecycle::Lifecycle;
use crate::types::*;
use provider_sdk::origin::Origin;
use provider_sdk::{Platform, Provider};

/// The CreateOS provider.
pub struct CreateOs;

provider_sdk::export_provider!(CreateOs);

/// Parses the context's config and points the platform at its API origin.
fn setup(ctx: &EnvironmentContext, platform: &mut dyn Platform) -> Result<Config, ProviderError> {
    let config = config::parse(&ctx.config).map_err(ProviderError::InvalidConfig)?;
    let origin = Origin::parse(&config.api_origin)
        .ok_or_else(|| ProviderError::InvalidConfig(vec!["apiUrl: invalid origin".into()]))?;
    platform.set_default_origin(origin);
    Ok(config)
}

impl Provider for CreateOs {
    fn describe() -> ProviderDescription {
        crate::describe::description()
    }

    fn validate_config(config: &str) -> ConfigValidation {
        config::validate(config).into_contract()
    }

    fn probe(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
    ) -> Result<ProbeReport, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).probe()
    }

    fn acquire_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<Lease, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).acquire(ctx, request)
    }

    fn resume_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<ResumeOutcome, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).resume(ctx, lease)
    }

    fn release_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).release(ctx, lease)
    }

    fn destroy_lease(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).destroy(ctx, lease)
    }

    fn realize_workspace(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).realize(ctx, lease, request)
    }

    fn sync_in(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        files: &[FileUpload],
    ) -> Result<SyncReport, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).sync_in(ctx, lease, files)
    }

    fn sync_out(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        remote_paths: &[String],
    ) -> Result<Vec<FileDownload>, ProviderError> {
        let config = setup(ctx, platform)?;
        Lifecycle::new(platform, &config).sync_out(ctx, lease, remote_paths)
    }

    fn execute(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let config = setup(ctx, platform)?;
        // Validation comes before anything else, the lease check included,
        // so bad input never causes a request.
        crate::script::validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
        let metadata = lease::check(lease, ctx, &config)?;
        execute::execute(platform, &config, &metadata.sandbox_id, request)
    }
}
