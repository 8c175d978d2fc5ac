//! The CreateOS provider component under wasmtime, against a scripted fake
//! CreateOS served through the host's HTTP hook. Every test records the
//! requests the component made and checks their method, path and body.

// Results carry the WIT's `provider-error` as it is.
#![allow(clippy::result_large_err)]

mod support;

mod cleanup;
mod contract;
mod execute;
mod lifecycle;
