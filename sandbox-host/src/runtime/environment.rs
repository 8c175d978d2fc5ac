//! A validated environment: what every call of the provider gets.

use crate::bindings::types::{ConfigValidation, EnvironmentContext};
use crate::budget::Budget;
use crate::policy::Policy;

/// A validated environment: the context every call gets (normalised config
/// with the secret removed), the HTTP policy for its API origin, and the
/// budgets read from the same config the provider uses.
#[derive(Clone, Debug)]
pub struct Environment {
    pub(super) ctx: EnvironmentContext,
    pub(super) policy: Policy,
    pub(super) budget: Budget,
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

    /// The budgets the host derives its deadlines from.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// What `validate-config` said (warnings included).
    pub fn validation(&self) -> &ConfigValidation {
        &self.validation
    }
}
