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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{ConfigObject, Validation};
    use crate::testing::{context, Answer, FakePlatform};
    use wasm_bindgen_test::wasm_bindgen_test;

    pub(crate) struct Origins(Vec<String>);

    impl ProviderConfig for Origins {
        fn validate(json: &str) -> Validation<Origins> {
            let mut object = ConfigObject::parse(json, &["apiUrl"]);
            let url = object.string("apiUrl").unwrap_or_default();
            object.finish(Origins(vec![url]), serde_json::json!({}), "apiKey")
        }

        fn api_origins(&self) -> Vec<String> {
            self.0.clone()
        }
    }

    /// The export's setup: a bad config (or one naming no usable origin)
    /// is `invalid-config` before any request; a good one points the
    /// platform at its first origin and starts the default budget.
    #[wasm_bindgen_test(unsupported = test)]
    fn setup_rejects_a_bad_config_before_any_request() {
        let mut platform = FakePlatform::new(|_| -> Answer { panic!("no request expected") });
        for (config, problem) in [
            ("[]", "config must be a JSON object"),
            (
                r#"{"apiUrl":"not an origin"}"#,
                "the config names no valid API origin",
            ),
        ] {
            let ctx = context(config);
            match Operation::<Origins>::start(&mut platform, &ctx) {
                Err(ProviderError::InvalidConfig(errors)) => assert_eq!(errors, [problem]),
                _ => panic!("{config} was accepted"),
            }
        }
        let ctx = context(r#"{"apiUrl":"http://127.0.0.1:9"}"#);
        let now = platform.now();
        let op = Operation::<Origins>::start(&mut platform, &ctx).unwrap();
        assert_eq!(op.deadline, now + DEFAULT_TIMEOUT_MS * MS);
        assert_eq!(op.wait(true).deadline, op.deadline);
        assert!(!op.cleanup_wait().cancellable);
        let origin = platform.default_origin.unwrap();
        assert_eq!(
            (origin.https, origin.authority.as_str()),
            (false, "127.0.0.1:9")
        );
        assert!(platform.requests.is_empty());
    }
}
