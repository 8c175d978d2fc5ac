//! The wasm embedding: the engine, a compiled component and its artifact
//! cache, one instance per operation with its limits, and the
//! `sandbox:provider/host` interface.

pub(crate) mod bindings;
pub(crate) mod cache;
pub(crate) mod cancel;
pub(crate) mod component;
pub(crate) mod conv;
pub(crate) mod engine;
pub(crate) mod host_impl;
pub(crate) mod instance;
pub(crate) mod interaction;
pub(crate) mod options;
pub(crate) mod result_text;
pub(crate) mod state;
pub(crate) mod v0_2;
pub(crate) mod v0_3;
pub(crate) mod v0_4;
pub(crate) mod v0_5;
pub(crate) mod v0_6;
