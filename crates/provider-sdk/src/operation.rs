//! One operation's state, set up once before the provider sees it: the
//! platform pointed at the config's API origin, the call's context, the
//! parsed config and the operation's deadline.

use crate::config::{ProviderConfig, DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_TIMEOUT_MS};
use crate::errors::ApiError;
use crate::origin::Origin;
use crate::platform::{Instant, Platform, Wait, MS};
use crate::types::{EnvironmentContext, ProviderError};

/// One operation of a provider (see [`crate::Provider`]).
pub struct Operation<'a, C> {
    /// HTTP, clocks and output, requests without an origin going to the
    /// config's first API origin.
    pub platform: &'a mut dyn Platform,
    /// The call's environment.
    pub ctx: &'a EnvironmentContext,
    /// The parsed config.
    pub config: C,
    /// When the operation's budget (the config's, or the SDK's default)
    /// runs out.
    pub deadline: Instant,
    request_ms: u64,
}

impl<'a, C: ProviderConfig> Operation<'a, C> {
    /// Parses the context's config (any problem is `invalid-config`, before
    /// any request) and points the platform at its first API origin.
    // Once in the component, not in each of the export's operations.
    #[inline(never)]
    pub fn start(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
    ) -> Result<Operation<'a, C>, ProviderError> {
        let config = C::parse(&ctx.config).map_err(ProviderError::InvalidConfig)?;
        let origin = config
            .api_origins()
            .first()
            .and_then(|origin| Origin::parse(origin))
            .ok_or_else(|| {
                ProviderError::InvalidConfig(vec!["the config names no valid API origin".into()])
            })?;
        platform.set_default_origin(origin);
        Ok(Operation::new(platform, ctx, config))
    }

    /// An operation on a config already parsed (the platform's default
    /// origin as it is); its deadline starts now.
    pub fn new(
        platform: &'a mut dyn Platform,
        ctx: &'a EnvironmentContext,
        config: C,
    ) -> Operation<'a, C> {
        let (operation_ms, request_ms) = match config.budget() {
            Some(budget) => (budget.operation_ms, budget.request_ms),
            None => (DEFAULT_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS),
        };
        let deadline = platform
            .now()
            .saturating_add(operation_ms.saturating_mul(MS));
        Operation {
            platform,
            ctx,
            config,
            deadline,
            request_ms,
        }
    }
}

impl<C> Operation<'_, C> {
    /// A wait until the operation's deadline.
    pub fn wait(&self, cancellable: bool) -> Wait {
        Wait {
            deadline: self.deadline,
            cancellable,
        }
    }

    /// A cleanup request's wait: the request budget afresh, not
    /// cancellable (a cleanup must be able to finish after a cancel).
    pub fn cleanup_wait(&self) -> Wait {
        Wait::from_now(self.platform, self.request_ms, false)
    }

    /// Sleeps `ms` (a poll's pause) within the operation's deadline; a
    /// deadline or cancellation is `operation`'s error.
    pub fn pause(&mut self, ms: u64, operation: &str) -> Result<(), ProviderError> {
        let until = self.platform.now().saturating_add(ms * MS);
        let wait = self.wait(true);
        self.platform
            .sleep_until(until, wait)
            .map_err(|e| ApiError::Transport(e).into_provider_error(operation))
    }
}
