//! Components built for contract 0.2.0: their `host` imports, and the
//! conversions between their types and the current (0.7.0) ones.
//!
//! 0.3.0 added the `provider-error.output-lost` case, 0.4.0 made live
//! output bytes (`host.emit-output`), and 0.5.0 added
//! `execute-request.result-chars` (which a 0.2.0 component does not get:
//! see `result_text.rs`), so every 0.2.0 value has exactly one
//! current counterpart (field by field, case by case), every current value
//! a host sends (requests, leases, contexts) has exactly one 0.2.0
//! counterpart, and a 0.2.0 text chunk is its UTF-8 bytes.

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_2::{host, types as old};
use crate::wasm::conv::{
    capabilities_before_0_6, execute_request_before_0_5, shared_types, text_output_host, Conv,
};

shared_types!();
capabilities_before_0_6!();
execute_request_before_0_5!();

/// Only this direction: a 0.2.0 provider never reports `output-lost`.
impl Conv<new::ProviderError> for old::ProviderError {
    fn conv(self) -> new::ProviderError {
        match self {
            old::ProviderError::InvalidConfig(v) => new::ProviderError::InvalidConfig(v),
            old::ProviderError::InvalidRequest(v) => new::ProviderError::InvalidRequest(v),
            old::ProviderError::ForeignLease(v) => new::ProviderError::ForeignLease(v),
            old::ProviderError::Unsupported(v) => new::ProviderError::Unsupported(v),
            old::ProviderError::ApiRejected(v) => new::ProviderError::ApiRejected(v.conv()),
            old::ProviderError::TransportFailed(v) => new::ProviderError::TransportFailed(v.conv()),
            old::ProviderError::InvalidResponse(v) => new::ProviderError::InvalidResponse(v.conv()),
            old::ProviderError::Cancelled(v) => new::ProviderError::Cancelled(v.conv()),
            old::ProviderError::CleanupFailed(v) => new::ProviderError::CleanupFailed(v.conv()),
        }
    }
}

text_output_host!();
