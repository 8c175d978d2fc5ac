//! A validated environment: what every call of the provider gets.

use crate::deadline::Deadlines;
use crate::network::policy::Policy;
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
