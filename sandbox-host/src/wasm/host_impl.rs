//! The `sandbox:provider/host` interface: live output, cancellation, the
//! record of sandboxes an operation creates, and the input of an
//! interactive process.

use wasmtime::component::Resource;
use wasmtime_wasi::p2::{subscribe, DynPollable};

use crate::wasm::bindings::host;
use crate::wasm::bindings::types::{InteractionEvent, OutputStream};
use crate::wasm::state::HostState;

impl host::Host for HostState {
    fn emit_output(&mut self, stream: OutputStream, chunk: Vec<u8>) -> wasmtime::Result<()> {
        (self.output)(stream, chunk);
        Ok(())
    }

    fn record_sandbox(&mut self, sandbox_id: String) -> wasmtime::Result<()> {
        // A provider-chosen string: bounded before it reaches the store.
        if sandbox_id.is_empty() || sandbox_id.len() > 256 {
            return Err(wasmtime::Error::msg(format!(
                "the provider reported a sandbox id of {} bytes (1 to 256 allowed)",
                sandbox_id.len()
            )));
        }
        (self.sandbox_recorder)(&sandbox_id).map_err(|error| {
            wasmtime::Error::msg(format!("recording sandbox {sandbox_id}: {error:#}"))
        })
    }

    fn cancellation(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let pollable = self.table.push(self.cancel.pollable())?;
        subscribe(&mut self.table, pollable)
    }

    fn interaction_events(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let pollable = self.table.push(self.interaction.pollable())?;
        subscribe(&mut self.table, pollable)
    }

    fn next_interaction_event(&mut self) -> wasmtime::Result<Option<InteractionEvent>> {
        Ok(self.interaction.next())
    }

    fn interaction_started(&mut self) -> wasmtime::Result<()> {
        self.interaction.mark_started();
        Ok(())
    }
}
