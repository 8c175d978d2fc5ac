//! The `sandbox:provider/host` interface: live output and cancellation.

use wasmtime::component::Resource;
use wasmtime_wasi::p2::{subscribe, DynPollable};

use crate::bindings::host;
use crate::bindings::types::OutputStream;
use crate::state::HostState;

impl host::Host for HostState {
    fn emit_output(&mut self, stream: OutputStream, chunk: String) -> wasmtime::Result<()> {
        (self.output)(stream, &chunk);
        Ok(())
    }

    fn cancellation(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let pollable = self.table.push(self.cancel.pollable())?;
        subscribe(&mut self.table, pollable)
    }
}
