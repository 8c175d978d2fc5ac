//! Components built for contract 0.4.0: their `host` imports, and the
//! conversions between their types and the current (0.7.0) ones.
//!
//! 0.5.0 only added `execute-request.result-chars`, which a 0.4.0
//! component does not get (the host cuts its answer instead: see
//! `result_text.rs`): every other type has the same shape, so every value
//! has exactly one counterpart both ways (field by field, case by case),
//! and its `host` imports are the current ones.

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_4::{host, types as old};
use crate::wasm::conv::{
    bytes_output_host, capabilities_before_0_6, execute_request_before_0_5, output_lost_types,
    shared_types, Conv,
};

shared_types!();
capabilities_before_0_6!();
execute_request_before_0_5!();

output_lost_types!();

bytes_output_host!();
