//! What an operation's outcome is called: a trap in words, a declared
//! rate limit in the host's form, a termination action's name.

use std::time::Duration;

use crate::network::request_pacer::RateLimit;
use crate::wasm::bindings::types::TerminationAction;
use crate::wasm::instance::trap_of;

/// A trap or host failure in words (the trap's name, else the error chain).
pub(super) fn host_failure(error: &anyhow::Error) -> String {
    match trap_of(error) {
        Some(trap) => format!("the provider component trapped: {trap}"),
        None => format!("{error:#}"),
    }
}

/// The host's form of a provider's declared `rate-limit`.
pub(super) fn declared_limit(limit: crate::wasm::bindings::types::RateLimit) -> RateLimit {
    let declared = RateLimit::new(
        limit.requests,
        Duration::from_millis(u64::from(limit.window_ms)),
    );
    match limit.per_second {
        Some(cap) => declared.with_per_second(cap),
        None => declared,
    }
}

/// `paused`, `deleted`, `already gone` or `left running until idle, then paused`.
pub fn action_name(action: TerminationAction) -> &'static str {
    match action {
        TerminationAction::Paused => "paused",
        TerminationAction::IdlePause => "left running until idle, then paused",
        TerminationAction::Deleted => "deleted",
        TerminationAction::AlreadyGone => "already gone",
    }
}
