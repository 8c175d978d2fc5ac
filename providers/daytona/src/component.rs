//! The Daytona provider as the SDK's [`Provider`]: each operation parses
//! the context's config, points the platform at the API origin (toolbox
//! requests name their own origin), and runs the protocol modules.

use crate::config::{self, Config};
use crate::execute;
use crate::lease;
use crate::lifecycle::Lifecycle;
use provider_sdk::types::*;
use provider_sdk::{Platform, Provider};

/// The Daytona provider.
pub struct Daytona;

provider_sdk::export_provider!(Daytona);

fn setup(ctx: &EnvironmentContext, platform: &mut dyn Platform) -> Result<Config, ProviderError> {
    let config = config::parse(&ctx.config).map_err(ProviderError::InvalidConfig)?;
    platform.set_default_origin(config.api.origin());
    Ok(config)
}

impl Provider for Daytona {
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
        Lifecycle::new(platform, &config).probe(ctx)
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

    fn execute(
        platform: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let config = setup(ctx, platform)?;
        // Bad input never causes a request, the lease check included.
        provider_sdk::script::validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
        let metadata = lease::check(lease, ctx)?;
        let mut request = request.clone();
        request.cwd = Some(match &request.cwd {
            None => metadata.cwd.clone(),
            Some(cwd) => crate::lifecycle::resolve_path(&metadata.workspace_root(), cwd)?,
        });
        execute::execute(platform, &config, &metadata.sandbox_id, &request)
    }
}
