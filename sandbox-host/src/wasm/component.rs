//! Loading a provider component: compile once, link WASI p2 + wasi-http +
//! our `host` interface, check the export, pre-instantiate.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store};

use crate::wasm::bindings::{
    host, v0_2, v0_3, v0_4, v0_5, v0_6, SandboxProviderPre, PROVIDER_INTERFACE, SERVED_INTERFACES,
    TYPES_INTERFACE,
};
use crate::wasm::cache::ArtifactCache;
use crate::wasm::engine::ticks_for;
use crate::wasm::instance::{Bindings, ProviderInstance};
use crate::wasm::options::HostOptions;
use crate::wasm::state::HostState;

/// A compiled, linked, pre-instantiated provider component. Cheap to clone
/// and shareable across threads; [`instantiate`](Self::instantiate) makes a
/// fresh, isolated instance per operation.
#[derive(Clone)]
pub struct ProviderComponent {
    component: Component,
    pre: Pre,
}

/// The pre-instantiated world of the contract version the component was
/// built for.
#[derive(Clone)]
enum Pre {
    Current(SandboxProviderPre<HostState>),
    V0_6(v0_6::SandboxProviderPre<HostState>),
    V0_5(v0_5::SandboxProviderPre<HostState>),
    V0_4(v0_4::SandboxProviderPre<HostState>),
    V0_3(v0_3::SandboxProviderPre<HostState>),
    V0_2(v0_2::SandboxProviderPre<HostState>),
}

impl ProviderComponent {
    /// Compiles the component at `path` (made by [`new_engine`](crate::new_engine)).
    pub fn load(engine: &Engine, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading provider component {}", path.display()))?;
        Self::from_bytes(engine, &bytes)
            .with_context(|| format!("loading provider component {}", path.display()))
    }

    /// Like [`load`](Self::load), but reuses the compiled artifact from
    /// `cache` when the same bytes were compiled before.
    pub fn load_cached(
        engine: &Engine,
        path: impl AsRef<Path>,
        cache: &ArtifactCache,
    ) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading provider component {}", path.display()))?;
        let component = cache
            .load(engine, &bytes)
            .with_context(|| format!("loading provider component {}", path.display()))?;
        Self::from_component(engine, component)
            .with_context(|| format!("loading provider component {}", path.display()))
    }

    /// Compiles a component from its binary.
    pub fn from_bytes(engine: &Engine, bytes: &[u8]) -> Result<Self> {
        let component = Component::new(engine, bytes)
            .map_err(anyhow::Error::from)
            .context("compiling the provider component")?;
        Self::from_component(engine, component)
    }

    /// Links and pre-instantiates an already compiled component.
    pub fn from_component(engine: &Engine, component: Component) -> Result<Self> {
        let served = check_exports(engine, &component)?;
        let linker = linker(engine)?;
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .context("the component imports something this host does not provide")?;
        let pre = if served == PROVIDER_INTERFACE {
            SandboxProviderPre::new(instance_pre).map(Pre::Current)
        } else if served == v0_6::PROVIDER_INTERFACE {
            v0_6::SandboxProviderPre::new(instance_pre).map(Pre::V0_6)
        } else if served == v0_5::PROVIDER_INTERFACE {
            v0_5::SandboxProviderPre::new(instance_pre).map(Pre::V0_5)
        } else if served == v0_4::PROVIDER_INTERFACE {
            v0_4::SandboxProviderPre::new(instance_pre).map(Pre::V0_4)
        } else if served == v0_3::PROVIDER_INTERFACE {
            v0_3::SandboxProviderPre::new(instance_pre).map(Pre::V0_3)
        } else {
            v0_2::SandboxProviderPre::new(instance_pre).map(Pre::V0_2)
        }
        .map_err(anyhow::Error::from)
        .context("the component's exports do not match the sandbox-provider world")?;
        Ok(ProviderComponent { component, pre })
    }

    /// The compiled component (for example to serialize it).
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// The engine it was compiled with.
    pub fn engine(&self) -> &Engine {
        match &self.pre {
            Pre::Current(pre) => pre.engine(),
            Pre::V0_6(pre) => pre.engine(),
            Pre::V0_5(pre) => pre.engine(),
            Pre::V0_4(pre) => pre.engine(),
            Pre::V0_3(pre) => pre.engine(),
            Pre::V0_2(pre) => pre.engine(),
        }
    }

    /// The provider interface (with its contract version) the component
    /// exports, one of [`SERVED_INTERFACES`].
    pub fn contract(&self) -> &'static str {
        match &self.pre {
            Pre::Current(_) => PROVIDER_INTERFACE,
            Pre::V0_6(_) => v0_6::PROVIDER_INTERFACE,
            Pre::V0_5(_) => v0_5::PROVIDER_INTERFACE,
            Pre::V0_4(_) => v0_4::PROVIDER_INTERFACE,
            Pre::V0_3(_) => v0_3::PROVIDER_INTERFACE,
            Pre::V0_2(_) => v0_2::PROVIDER_INTERFACE,
        }
    }

    /// True when the component was built for a contract before 0.4.0,
    /// whose `host.emit-output` carries text: the bytes a command printed
    /// that were not UTF-8 reached the host as U+FFFD, so its live output
    /// is not byte for byte what the command printed. From 0.4.0 live
    /// output is the exact bytes.
    pub fn live_output_is_text(&self) -> bool {
        matches!(self.pre, Pre::V0_3(_) | Pre::V0_2(_))
    }

    /// A fresh store and instance for one operation.
    pub fn instantiate(&self, options: HostOptions) -> Result<ProviderInstance> {
        let deadline = Instant::now() + options.deadline;
        let mut store = Store::new(self.engine(), HostState::new(&options, deadline));
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(ticks_for(options.deadline));
        store.epoch_deadline_trap();
        let bindings = match &self.pre {
            Pre::Current(pre) => pre.instantiate(&mut store).map(Bindings::Current),
            Pre::V0_6(pre) => pre.instantiate(&mut store).map(Bindings::V0_6),
            Pre::V0_5(pre) => pre.instantiate(&mut store).map(Bindings::V0_5),
            Pre::V0_4(pre) => pre.instantiate(&mut store).map(Bindings::V0_4),
            Pre::V0_3(pre) => pre.instantiate(&mut store).map(Bindings::V0_3),
            Pre::V0_2(pre) => pre.instantiate(&mut store).map(Bindings::V0_2),
        }
        .map_err(anyhow::Error::from)
        .context("instantiating the provider component")?;
        Ok(ProviderInstance::new(store, bindings, options))
    }
}

fn linker(engine: &Engine) -> Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)?;
    host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    v0_6::host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    v0_5::host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    v0_4::host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    v0_3::host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    v0_2::host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    // `types` holds only types, but a component still imports it.
    linker.instance(TYPES_INTERFACE)?;
    linker.instance(v0_6::TYPES_INTERFACE)?;
    linker.instance(v0_5::TYPES_INTERFACE)?;
    linker.instance(v0_4::TYPES_INTERFACE)?;
    linker.instance(v0_3::TYPES_INTERFACE)?;
    linker.instance(v0_2::TYPES_INTERFACE)?;
    Ok(linker)
}

/// The served provider interface the component exports, or why it exports none.
fn check_exports(engine: &Engine, component: &Component) -> Result<&'static str> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    if let Some(served) = SERVED_INTERFACES
        .into_iter()
        .find(|served| exports.iter().any(|name| name == served))
    {
        return Ok(served);
    }
    let served = match SERVED_INTERFACES.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    };
    let (unversioned, _) = PROVIDER_INTERFACE
        .split_once('@')
        .expect("the interface name has a version");
    if let Some(other) = exports
        .iter()
        .find(|name| name.split_once('@').map(|(n, _)| n) == Some(unversioned))
    {
        bail!(
            "the component exports {other}, but this host serves only {served}: \
             it was built for another version of the sandbox-provider contract; rebuild it \
             with the provider SDK of this release (wit/since_v0.7.0), or use a host that \
             serves its version"
        );
    }
    let listed = if exports.is_empty() {
        "nothing".to_owned()
    } else {
        exports.join(", ")
    };
    bail!("the component does not export {PROVIDER_INTERFACE} (it exports {listed}); is it a sandbox-provider component?")
}
