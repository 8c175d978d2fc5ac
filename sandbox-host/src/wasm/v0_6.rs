//! Components built for contract 0.6.0: their `host` imports, and the
//! conversions between their types and the current (0.7.0) ones.
//!
//! 0.7.0 added the environment policy: `acquire-request.egress`,
//! `adapter-type`, `image` and `template`; the operations `set-egress`,
//! `open-port`, `capture-template`, `list-templates` and
//! `delete-template`; `termination-action.idle-pause`; and the
//! capabilities `egress-policy`, `images`, `templates`, `idle-pause`,
//! `ports` and `concurrent-sync`. A 0.6.0 component claims none of those
//! capabilities, whatever it declares; the host answers `unsupported` for
//! the new operations and refuses an acquire asking for what it cannot
//! carry before it runs (see `instance.rs`). Every other type has the same
//! shape, so every value has exactly one counterpart both ways, and its
//! `host` imports are the current ones.

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_6::{host, types as old};
use crate::wasm::conv::{carried_capabilities, output_lost_types, shared_types, Conv};

shared_types!();
output_lost_types!();
carried_capabilities!(
    REUSABLE_LEASES,
    INCREMENTAL_OUTPUT,
    NATIVE_SYNC,
    LOGIN_PTY,
    DUPLEX_CHANNELS,
    TERMINAL_RESIZE,
);

crate::wasm::conv::record! {
    ExecuteRequest { command, args, cwd, env, stdin, timeout_ms, result_chars }
    InteractionRequest { command, args, cwd, env, terminal, timeout_ms, result_chars }
    TerminalSize { columns, rows }
}

crate::wasm::conv::cases! {
    InteractionSignal { Interrupt, Terminate, Hangup, Quit, Kill ; }
    InteractionEvent { CloseInput, End ; Input, Resize, Signal }
}

/// The 0.6.0 `host` interface is the current one under another version.
impl host::Host for crate::wasm::state::HostState {
    fn emit_output(&mut self, stream: host::OutputStream, chunk: Vec<u8>) -> wasmtime::Result<()> {
        let stream = match stream {
            host::OutputStream::Stdout => new::OutputStream::Stdout,
            host::OutputStream::Stderr => new::OutputStream::Stderr,
            host::OutputStream::Terminal => new::OutputStream::Terminal,
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

    fn interaction_events(
        &mut self,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>> {
        crate::wasm::bindings::host::Host::interaction_events(self)
    }

    fn next_interaction_event(&mut self) -> wasmtime::Result<Option<old::InteractionEvent>> {
        crate::wasm::bindings::host::Host::next_interaction_event(self).map(Conv::conv)
    }

    fn interaction_started(&mut self) -> wasmtime::Result<()> {
        crate::wasm::bindings::host::Host::interaction_started(self)
    }
}
