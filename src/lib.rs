//! The CreateOS sandbox provider, compiled to a `wasm32-wasip2` component
//! that implements the `sandbox-provider` WIT world (`wit/`).
//!
//! The protocol is plain Rust over the [`platform::Platform`] trait, so its
//! logic runs natively in unit tests; [`wasi_platform`] is the one place
//! that calls the raw WASI imports, and `component` the one place that
//! implements the generated export trait.
//!
//! Modules, in the order a request flows through them:
//! - [`config`]: the provider config and API URL rules;
//! - [`platform`]: the HTTP, clock, random and host capabilities as a trait;
//! - [`api`]: CreateOS requests, the JSend envelope and error mapping;
//! - [`script`]: validation and the quoted bash script of a command;
//! - [`frames`]: the NDJSON `/connect` frame parser;
//! - [`output`]: per-stream UTF-8 decoding and the capped output tail;
//! - [`execute`]: running one command, with cleanup;
//! - [`lifecycle`]: acquire, resume, release, destroy, probe, realize;
//! - [`lease`]: the lease metadata the provider writes and checks.

// `ProviderError` is the WIT variant itself (its cleanup case carries the
// partial output); it is returned once per call, so its size is no concern.
#![allow(clippy::result_large_err)]

#[allow(missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "sandbox-provider",
        generate_all,
    });
}

/// The WIT contract's types (`sandbox:provider/types`), used as the
/// protocol's own data types so the WIT stays the single source.
pub mod types {
    pub use crate::bindings::sandbox::provider::host::OutputStream;
    pub use crate::bindings::sandbox::provider::types::*;
}

pub mod api;
pub mod config;
pub mod describe;
pub mod execute;
pub mod frames;
pub mod lease;
pub mod lifecycle;
pub mod output;
pub mod platform;
pub mod script;

// The export glue and the WASI platform exist only in the component
// (`wasm32-wasip2`); any other wasm build (`wasm32-unknown-unknown`,
// `wasm32-wasip1`) holds the protocol alone, with no import of the world,
// so its unit tests run under Node.
#[cfg(all(target_os = "wasi", target_env = "p2"))]
mod component;
#[cfg(all(target_os = "wasi", target_env = "p2"))]
mod wasi_platform;
