//! A target: one provider component and how to get a backend for it. The
//! kit drives the component only through the host ([`SandboxRuntime`](sandbox_host::SandboxRuntime)), so
//! any component built for the contract can be a target.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use sandbox_host::{shared_engine, ProviderComponent};
use serde_json::Value;

use crate::backend::Backend;

/// Starts a fresh backend for one scenario.
pub type StartBackend = Arc<dyn Fn() -> Result<Box<dyn Backend>> + Send + Sync>;

/// One provider component and its backend.
#[derive(Clone)]
pub struct Target {
    name: String,
    component: PathBuf,
    start: StartBackend,
    reuse: Option<Value>,
    declared_rate_limit: bool,
}

impl Target {
    /// A target called `name` (used in messages) for the component at
    /// `component`, whose scenarios each get a backend from `start`.
    pub fn new(
        name: impl Into<String>,
        component: impl Into<PathBuf>,
        start: StartBackend,
    ) -> Self {
        Target {
            name: name.into(),
            component: component.into(),
            start,
            reuse: None,
            declared_rate_limit: false,
        }
    }

    /// The config fields (merged over the backend's config) that make
    /// release keep the sandbox for a later resume, for example
    /// `{"reuseLease": true}`. Without it the reuse scenario is not
    /// applicable.
    pub fn with_reuse(mut self, patch: Value) -> Self {
        self.reuse = Some(patch);
        self
    }

    /// Spends the provider's declared rate limit (for a real service)
    /// instead of none (a local backend has no limit).
    pub fn with_declared_rate_limit(mut self) -> Self {
        self.declared_rate_limit = true;
        self
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the component is.
    pub fn component_path(&self) -> &Path {
        &self.component
    }

    /// The config patch that makes leases reusable, if the target has one.
    pub fn reuse_patch(&self) -> Option<&Value> {
        self.reuse.as_ref()
    }

    /// The component, compiled once per process.
    pub fn component(&self) -> Result<ProviderComponent> {
        static COMPILED: OnceLock<Mutex<HashMap<PathBuf, ProviderComponent>>> = OnceLock::new();
        let mut compiled = COMPILED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(component) = compiled.get(&self.component) {
            return Ok(component.clone());
        }
        if !self.component.is_file() {
            anyhow::bail!(
                "the {} provider component {} does not exist: build it first (./build.sh)",
                self.name,
                self.component.display()
            );
        }
        let engine = shared_engine()?;
        let component = ProviderComponent::load(&engine, &self.component)
            .with_context(|| format!("cannot load {}", self.component.display()))?;
        compiled.insert(self.component.clone(), component.clone());
        Ok(component)
    }

    /// Whether scenarios spend the provider's declared rate limit (see
    /// [`with_declared_rate_limit`](Self::with_declared_rate_limit)).
    pub fn declared_rate_limit(&self) -> bool {
        self.declared_rate_limit
    }

    /// Starts a fresh backend for one scenario.
    pub fn start_backend(&self) -> Result<Box<dyn Backend>> {
        (self.start)().with_context(|| format!("the {} backend did not start", self.name))
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}
