//! Components built for contract 0.3.0: their `host` imports, and the
//! conversions between their types and the current (0.7.0) ones.
//!
//! 0.4.0 only changed `host.emit-output` to carry bytes (`list<u8>`)
//! instead of text, and 0.5.0 added `execute-request.result-chars` (which
//! a 0.3.0 component does not get: see `result_text.rs`): every other type
//! has the same shape, so every value has exactly one counterpart both
//! ways (field by field, case by case).
//! A 0.3.0 component's text chunk reaches the sink as its UTF-8 bytes;
//! that text already had U+FFFD where the command printed bytes that were
//! not UTF-8, which a host can tell with
//! [`ProviderComponent::live_output_is_text`](crate::ProviderComponent::live_output_is_text).

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_3::{host, types as old};
use crate::wasm::conv::{
    capabilities_before_0_6, execute_request_before_0_5, output_lost_types, shared_types,
    text_output_host, Conv,
};

shared_types!();
capabilities_before_0_6!();
execute_request_before_0_5!();

output_lost_types!();

text_output_host!();
