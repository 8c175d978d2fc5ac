//! The CreateOS sandbox provider: its API knowledge only, over the
//! provider SDK (`crates/provider-sdk`), compiled to a `wasm32-wasip2`
//! component that implements the `sandbox-provider` WIT world
//! (`wit/since_v0.7.0`).
//!
//! The protocol is plain Rust over the SDK's [`provider_sdk::Platform`]
//! trait, so its logic runs natively in unit tests; [`lifecycle::CreateOs`]
//! is the SDK's [`provider_sdk::Provider`], exported as the component.
//!
//! Modules, in the order a request flows through them:
//! - [`config`]: the provider config and API URL rules;
//! - [`api`]: CreateOS requests, the JSend envelope and error mapping;
//! - [`frames`]: the NDJSON `/connect` frame parser;
//! - [`execute`]: running one command, with cleanup;
//! - [`interact`]: running one interactive process (a terminal or pipes),
//!   the host's events carried out while its output is followed;
//! - [`lifecycle`]: the provider's operations (acquire, resume, release,
//!   destroy, probe, realize, sync, execute, interact, set-egress,
//!   open-port, capture/list/delete-template);
//! - [`lease`]: the lease metadata the provider writes and checks;
//! - [`policy`]: egress rules and the image or template a sandbox starts
//!   from (contract 0.7.0), decided before any request;
//! - [`expiry`]: RFC 3339 times of a requested and an attested expiry;
//! - [`describe`]: the provider description.
//!
//! The platform, output, script and contract types are the SDK's, named
//! by their one path (`provider_sdk::platform`, ...).

#![deny(missing_docs)]
// `ProviderError` is the WIT variant itself (its cleanup case carries the
// partial output); it is returned once per call, so its size is no concern.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod config;
pub mod describe;
pub mod execute;
pub mod expiry;
pub mod frames;
pub mod interact;
pub mod lease;
pub mod lifecycle;
pub mod policy;

/// JSend answers for the unit tests' scripted platform.
#[cfg(test)]
mod testing {
    use provider_sdk::testing::Answer;

    /// A JSend success answer.
    pub fn ok(data: serde_json::Value) -> Answer {
        Answer::Full(
            200,
            serde_json::json!({"status": "success", "data": data})
                .to_string()
                .into_bytes(),
        )
    }
}
