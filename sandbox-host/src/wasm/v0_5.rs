//! Components built for contract 0.5.0: their `host` imports, and the
//! conversions between their types and the current (0.7.0) ones.
//!
//! 0.6.0 added interactive processes (`provider.interact`, the
//! `interaction-*` host imports, `output-stream.terminal`, the capability
//! `terminal-resize`) and gave `login-pty` and `duplex-channels` an
//! operation: a 0.5.0 component has no `interact` (the host answers
//! `unsupported` for it) and claims neither capability (see
//! `capabilities_before_0_6`). Every other type has the same shape, so
//! every value has exactly one counterpart both ways.

use crate::wasm::bindings::types as new;
use crate::wasm::bindings::v0_5::{host, types as old};
use crate::wasm::conv::{
    bytes_output_host, capabilities_before_0_6, output_lost_types, shared_types, Conv,
};

shared_types!();
capabilities_before_0_6!();
output_lost_types!();

crate::wasm::conv::record! {
    ExecuteRequest { command, args, cwd, env, stdin, timeout_ms, result_chars }
}

bytes_output_host!();
