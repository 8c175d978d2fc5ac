//! The generated bindings of the `sandbox-provider` WIT world, wrapped once.
//!
//! Only this module runs `bindgen!`: once for the current contract (0.7.0,
//! whose types the whole host uses) and once each for 0.6.0, 0.5.0, 0.4.0,
//! 0.3.0 and 0.2.0, whose components the host still loads (see
//! [`v0_6`](super::v0_6), [`v0_5`](super::v0_5), [`v0_4`](super::v0_4),
//! [`v0_3`](super::v0_3) and [`v0_2`](super::v0_2) for the conversions).
//! Everything WASI comes from `wasmtime-wasi` / `wasmtime-wasi-http`
//! (mapped with `with:`), so the only generated code is our own `types`,
//! `host` and `provider` interfaces.

/// The bindings of one contract version's world (its WIT folder): WASI
/// from `wasmtime-wasi` / `wasmtime-wasi-http`, imports that may trap.
macro_rules! contract_world {
    ($path:literal) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "sandbox:provider/sandbox-provider",
            imports: { default: trappable },
            with: {
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:random": wasmtime_wasi::p2::bindings::random,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
            require_store_data_send: true,
        });
    };
}

#[allow(missing_docs, clippy::all)]
mod generated {
    contract_world!("wit/since_v0.7.0");
}

/// The world of contract 0.6.0, for components built before 0.7.0 (no
/// environment policy: egress, images, templates, ports, idle pause).
#[allow(missing_docs, clippy::all)]
pub(crate) mod v0_6 {
    contract_world!("wit/since_v0.6.0");

    pub(crate) use sandbox::provider::host;
    pub(crate) use sandbox::provider::types;

    /// The interface a 0.6.0 component exports.
    pub(crate) const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.6.0";
    /// The (function-less) types interface a 0.6.0 component imports.
    pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.6.0";
}

/// The world of contract 0.5.0, for components built before 0.6.0 (no
/// interactive processes).
#[allow(missing_docs, clippy::all)]
pub(crate) mod v0_5 {
    contract_world!("wit/since_v0.5.0");

    pub(crate) use sandbox::provider::host;
    pub(crate) use sandbox::provider::types;

    /// The interface a 0.5.0 component exports.
    pub(crate) const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.5.0";
    /// The (function-less) types interface a 0.5.0 component imports.
    pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.5.0";
}

/// The world of contract 0.4.0, for components built before 0.5.0 (no
/// `execute-request.result-chars`).
#[allow(missing_docs, clippy::all)]
pub(crate) mod v0_4 {
    contract_world!("wit/since_v0.4.0");

    pub(crate) use sandbox::provider::host;
    pub(crate) use sandbox::provider::types;

    /// The interface a 0.4.0 component exports.
    pub(crate) const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.4.0";
    /// The (function-less) types interface a 0.4.0 component imports.
    pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.5.0";
}

/// The world of contract 0.3.0, for components built before 0.4.0 (live
/// output as text).
#[allow(missing_docs, clippy::all)]
pub(crate) mod v0_3 {
    contract_world!("wit/since_v0.3.0");

    pub(crate) use sandbox::provider::host;
    pub(crate) use sandbox::provider::types;

    /// The interface a 0.3.0 component exports.
    pub(crate) const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.3.0";
    /// The (function-less) types interface a 0.3.0 component imports.
    pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.3.0";
}

/// The world of contract 0.2.0, for components built before 0.3.0.
#[allow(missing_docs, clippy::all)]
pub(crate) mod v0_2 {
    contract_world!("wit/since_v0.2.0");

    pub(crate) use sandbox::provider::host;
    pub(crate) use sandbox::provider::types;

    /// The interface a 0.2.0 component exports.
    pub(crate) const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.2.0";
    /// The (function-less) types interface a 0.2.0 component imports.
    pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.2.0";
}

/// The records, variants and enums of the contract (`sandbox:provider/types`),
/// plus [`OutputStream`](types::OutputStream) from the `host` interface.
pub mod types {
    pub use super::generated::sandbox::provider::host::OutputStream;
    pub use super::generated::sandbox::provider::types::*;
}

pub(crate) use generated::sandbox::provider::host;
pub(crate) use generated::{SandboxProvider, SandboxProviderPre};

/// The fully qualified name of the interface a provider component of the
/// current contract exports.
pub const PROVIDER_INTERFACE: &str = "sandbox:provider/provider@0.7.0";

/// The (function-less) types interface a current component imports.
pub(crate) const TYPES_INTERFACE: &str = "sandbox:provider/types@0.7.0";

/// Every provider interface this host serves, newest first.
pub const SERVED_INTERFACES: [&str; 6] = [
    PROVIDER_INTERFACE,
    v0_6::PROVIDER_INTERFACE,
    v0_5::PROVIDER_INTERFACE,
    v0_4::PROVIDER_INTERFACE,
    v0_3::PROVIDER_INTERFACE,
    v0_2::PROVIDER_INTERFACE,
];

/// The secret rules' view of a description: which config fields hold
/// secrets and which name API origins (the rules in `network/secrets.rs`
/// take plain data, not the generated types).
impl From<&types::ProviderDescription> for crate::network::secrets::SecretLayout {
    fn from(description: &types::ProviderDescription) -> Self {
        crate::network::secrets::SecretLayout {
            secret_fields: description
                .secrets
                .iter()
                .map(|s| s.config_field.clone())
                .collect(),
            origin_fields: description
                .origin_fields
                .iter()
                .map(|o| crate::network::secrets::OriginFieldLayout {
                    config_field: o.config_field.clone(),
                    default_url: o.default_url.clone(),
                    secrets: o.secrets.clone(),
                })
                .collect(),
        }
    }
}
