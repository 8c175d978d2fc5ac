//! What the kit needs of a provider's backend, whoever runs it: the config
//! that points the provider at it (secret included), the faults it can
//! inject, whether its commands run on this machine (so `/proc` can prove
//! that nothing survived), and an orderly stop that reports survivors.

use anyhow::Result;
use serde_json::Value;

use crate::fault::FaultPoint;

/// A running backend for one scenario.
pub trait Backend: Send + Sync {
    /// The provider config that names this backend, with its secret in the
    /// provider's secret field (the host removes it before the component
    /// sees the config).
    fn config(&self) -> Value;

    /// Whether [`inject`](Self::inject) can produce `point`.
    fn supports(&self, point: FaultPoint) -> bool;

    /// Makes `point` happen to every matching request from now on, until
    /// [`clear_faults`](Self::clear_faults). An error when the backend
    /// cannot produce it.
    fn inject(&self, point: FaultPoint) -> Result<()>;

    /// Removes every fault; the backend answers normally again.
    fn clear_faults(&self);

    /// Whether the backend's commands run as processes of this machine, so
    /// that a scan of `/proc` for a command's marker proves it gone.
    fn processes_on_this_machine(&self) -> bool;

    /// Stops the backend (a no-op for one the kit did not start). An error
    /// when a process it started could not be verified gone.
    fn stop(self: Box<Self>) -> Result<()>;
}

/// A backend the kit did not start (a third party's service, named by the
/// config alone): no fault injection; `/proc` checks only when the operator
/// says its commands run on this machine.
#[derive(Clone, Debug)]
pub struct LiveBackend {
    config: Value,
    same_machine: bool,
}

impl LiveBackend {
    /// A backend named by `config` (secret included, or a reference
    /// `{"env": "VAR"}` / `{"file": "/path"}` the host resolves).
    pub fn new(config: Value) -> Self {
        LiveBackend {
            config,
            same_machine: false,
        }
    }

    /// Says that the backend's commands run as processes of this machine.
    pub fn on_this_machine(mut self, yes: bool) -> Self {
        self.same_machine = yes;
        self
    }
}

impl Backend for LiveBackend {
    fn config(&self) -> Value {
        self.config.clone()
    }

    fn supports(&self, _point: FaultPoint) -> bool {
        false
    }

    fn inject(&self, point: FaultPoint) -> Result<()> {
        anyhow::bail!(
            "a live backend named by the config cannot produce the fault {}",
            point.name()
        )
    }

    fn clear_faults(&self) {}

    fn processes_on_this_machine(&self) -> bool {
        self.same_machine
    }

    fn stop(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
