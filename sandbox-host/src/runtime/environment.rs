//! A validated environment: what every call of the provider gets, and how
//! the runtime builds one (`validate-config`, the operator's secrets, the
//! HTTP policy of the config's origins, the deadlines).

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::origin_policy::route_policy;
use super::SandboxRuntime;
use crate::deadline::Deadlines;
use crate::network::policy::Policy;
use crate::network::secrets::{Secrets, SplitConfig};
use crate::wasm::bindings::types::{ConfigValidation, EnvironmentContext};

/// A validated environment: the context every call gets (normalised config
/// with the secret removed), the HTTP policy for its API origin, and the
/// deadlines derived from the budget the provider declared for that config.
#[derive(Clone, Debug)]
pub struct Environment {
    pub(super) ctx: EnvironmentContext,
    pub(super) policy: Policy,
    pub(super) deadlines: Deadlines,
    pub(super) validation: ConfigValidation,
}

impl Environment {
    /// The context passed to the provider.
    pub fn context(&self) -> &EnvironmentContext {
        &self.ctx
    }

    /// The HTTP policy of the environment.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The host's deadlines, derived from the budget the provider declared.
    pub fn deadlines(&self) -> &Deadlines {
        &self.deadlines
    }

    /// What `validate-config` said (warnings included).
    pub fn validation(&self) -> &ConfigValidation {
        &self.validation
    }
}

/// The deadline of `validate-config` (no network; a pure function).
const VALIDATE_DEADLINE: Duration = Duration::from_secs(30);

impl SandboxRuntime {
    /// `validate-config` on `config` with the secret fields removed.
    pub fn validate_config(&self, config: &str) -> Result<ConfigValidation> {
        let split = Secrets::none().split(config, &self.description)?;
        self.plain_instance(VALIDATE_DEADLINE)?
            .validate_config(&split.config)
    }

    /// Validates `config`, resolves its secrets by the operator's rules in
    /// `secrets`, and builds the environment's policy. Fails when the
    /// config is invalid, when the origin the provider asks for is not the
    /// one the config's URL field names, or when a secret would go to an
    /// origin that is not `https:` (plain `http:` only on loopback).
    pub fn environment(
        &self,
        company_id: &str,
        environment_id: &str,
        config: &str,
        secrets: &Secrets,
    ) -> Result<Environment> {
        let split = secrets.split(config, &self.description)?;
        let validation = self
            .plain_instance(VALIDATE_DEADLINE)?
            .validate_config(&split.config)?;
        if !validation.ok {
            bail!("invalid provider config: {}", validation.errors.join("; "));
        }
        let normalized = validation
            .normalized_config
            .clone()
            .context("the provider accepted the config but returned no normalized config")?;
        let policy = self.policy_for(&split, secrets, &validation.api_origins)?;
        let deadlines =
            Deadlines::from_validation(validation.budget.as_ref()).with_margin(self.margin);
        Ok(Environment {
            ctx: EnvironmentContext {
                driver_key: self.description.driver_key.clone(),
                company_id: company_id.to_owned(),
                environment_id: environment_id.to_owned(),
                issue_id: None,
                config: normalized.clone(),
            },
            // A 429's pause is repeated only within one request's budget.
            policy: policy.with_max_throttle_wait(deadlines.request),
            deadlines,
            validation,
        })
    }

    /// The HTTP policy of a config ([`route_policy`]) with this runtime's
    /// request pacer and limit.
    pub(super) fn policy_for(
        &self,
        split: &SplitConfig,
        secrets: &Secrets,
        asked: &[String],
    ) -> Result<Policy> {
        let policy = route_policy(&self.description, split, secrets, asked)?
            .with_request_pacer(self.pacer.clone());
        // The declared budget protects the real service; an origin that
        // answers as our engine does not spend it (see `RequestPacer`).
        Ok(if self.rate_limit_declared {
            policy.with_declared_rate_limit(self.rate_limit)
        } else {
            policy.with_rate_limit(self.rate_limit)
        })
    }
}
