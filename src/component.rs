//! The export glue: the generated `provider` trait implemented over the
//! protocol modules, with one [`WasiPlatform`] per call.

use crate::bindings::exports::sandbox::provider::provider::Guest;
use crate::config::{self, Config, Origin};
use crate::execute;
use crate::lease;
use crate::lifecycle::Lifecycle;
use crate::types::*;
use crate::wasi_platform::WasiPlatform;

struct Component;

crate::bindings::export!(Component with_types_in crate::bindings);

/// Parses the context's config and makes a platform for its API origin.
fn setup(ctx: &EnvironmentContext) -> Result<(Config, WasiPlatform), ProviderError> {
    let config = config::parse(&ctx.config).map_err(ProviderError::InvalidConfig)?;
    let origin = Origin::parse(&config.api_origin)
        .ok_or_else(|| ProviderError::InvalidConfig(vec!["apiUrl: invalid origin".into()]))?;
    Ok((config, WasiPlatform::new(origin)))
}

impl Guest for Component {
    fn describe() -> ProviderDescription {
        crate::describe::description()
    }

    fn validate_config(config: String) -> ConfigValidation {
        let validation = config::validate(&config);
        ConfigValidation {
            ok: validation.errors.is_empty() && validation.normalized.is_some(),
            api_origin: validation.config.as_ref().map(|c| c.api_origin.clone()),
            warnings: validation.warnings,
            errors: validation.errors,
            normalized_config: validation.normalized,
        }
    }

    fn probe(ctx: EnvironmentContext) -> Result<ProbeReport, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).probe()
    }

    fn acquire_lease(
        ctx: EnvironmentContext,
        request: AcquireRequest,
    ) -> Result<Lease, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).acquire(&ctx, &request)
    }

    fn resume_lease(ctx: EnvironmentContext, lease: Lease) -> Result<ResumeOutcome, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).resume(&ctx, &lease)
    }

    fn release_lease(
        ctx: EnvironmentContext,
        lease: Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).release(&ctx, &lease)
    }

    fn destroy_lease(
        ctx: EnvironmentContext,
        lease: Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).destroy(&ctx, &lease)
    }

    fn realize_workspace(
        ctx: EnvironmentContext,
        lease: Lease,
        request: WorkspaceRequest,
    ) -> Result<String, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).realize(&ctx, &lease, &request)
    }

    fn sync_in(
        ctx: EnvironmentContext,
        lease: Lease,
        files: Vec<FileUpload>,
    ) -> Result<SyncReport, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).sync_in(&ctx, &lease, &files)
    }

    fn sync_out(
        ctx: EnvironmentContext,
        lease: Lease,
        remote_paths: Vec<String>,
    ) -> Result<Vec<FileDownload>, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        Lifecycle::new(&mut platform, &config).sync_out(&ctx, &lease, &remote_paths)
    }

    fn execute(
        ctx: EnvironmentContext,
        lease: Lease,
        request: ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let (config, mut platform) = setup(&ctx)?;
        // Validation comes before anything else, the lease check included,
        // so bad input never causes a request.
        crate::script::validate(&request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
        let metadata = lease::check(&lease, &ctx, &config)?;
        execute::execute(&mut platform, &config, &metadata.sandbox_id, &request)
    }
}
