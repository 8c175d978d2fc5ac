//! Components built for contract 0.4.0: their `host` imports, and the
//! conversions between their types and the current (0.5.0) ones.
//!
//! 0.5.0 only added `execute-request.result-chars`, which a 0.4.0
//! component does not get (the host cuts its answer instead: see
//! `result_text.rs`): every other type has the same shape, so every value
//! has exactly one counterpart both ways (field by field, case by case),
//! and its `host` imports are the current ones.

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_4::{host, types as old};
use crate::wasm::conv::{execute_request_before_0_5, output_lost_types, shared_types, Conv};

shared_types!();
execute_request_before_0_5!();

output_lost_types!();

impl host::Host for crate::wasm::state::HostState {
    fn emit_output(&mut self, stream: host::OutputStream, chunk: Vec<u8>) -> wasmtime::Result<()> {
        let stream = match stream {
            host::OutputStream::Stdout => new::OutputStream::Stdout,
            host::OutputStream::Stderr => new::OutputStream::Stderr,
        };
        crate::wasm::bindings::host::Host::emit_output(self, stream, chunk)
    }

    fn record_sandbox(&mut self, sandbox_id: String) -> wasmtime::Result<()> {
        crate::wasm::bindings::host::Host::record_sandbox(self, sandbox_id)
    }

    fn cancellation(
        &mut self,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>> {
        crate::wasm::bindings::host::Host::cancellation(self)
    }
}
