//! The operations in flight on each lease: the store mark and the cancel
//! token one operation holds until it ends, and cancelling them (a release
//! or destroy of the lease, Ctrl-C).

use std::sync::Arc;

use anyhow::{Context, Result};

use super::{Environment, SandboxRuntime};
use crate::leases::backend::LeaseRecord;
use crate::leases::rules::Operation;
use crate::wasm::bindings::types::Lease;
use crate::wasm::cancel::CancelToken;

/// One operation using a lease: drops the store mark (if taken) and the
/// cancel token when it ends.
pub struct UseGuard<'a> {
    pub(super) runtime: &'a SandboxRuntime,
    pub(super) id: String,
    pub(super) token: CancelToken,
    pub(super) marked: bool,
}

impl Drop for UseGuard<'_> {
    fn drop(&mut self) {
        if self.marked {
            // If this fails the mark stays; when this host is gone, the lease
            // is poisoned (the safe direction).
            let _ = self.runtime.store.end_use(&self.id, self.runtime.host.id());
        }
        let mut running = self
            .runtime
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = running.get_mut(&self.id) {
            if let Some(at) = tokens
                .iter()
                .position(|t| Arc::ptr_eq(t.shared(), self.token.shared()))
            {
                tokens.swap_remove(at);
            }
            if tokens.is_empty() {
                running.remove(&self.id);
            }
        }
        self.runtime.finished.notify_all();
    }
}

impl SandboxRuntime {
    /// Holds lease `id` in use for `operation` until the guard drops, as
    /// an operation does: a release or destroy of the lease meanwhile
    /// cancels `token` and waits for the guard. The operations run while it
    /// is held (the CLI's `realize-workspace` and `execute` of one command)
    /// find this host's mark on the lease and add to it without another
    /// flush of the lease store.
    pub fn hold(
        &self,
        env: &Environment,
        id: &str,
        operation: Operation,
        token: CancelToken,
    ) -> Result<UseGuard<'_>> {
        self.begin_use(env, id, operation, token)
            .map(|(_, _, guard)| guard)
    }

    /// Cancels every running command of this runtime (for example on Ctrl-C).
    pub fn cancel_all(&self) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for token in running.values().flatten() {
            token.cancel();
        }
    }

    /// Registers `token` (so a release or destroy of this runtime cancels
    /// it), then checks and marks the lease in the store. The token comes
    /// first: a release that moves the lease to `closing` after that cancels
    /// it, and one that did so before makes the mark fail.
    pub(super) fn begin_use(
        &self,
        env: &Environment,
        id: &str,
        operation: Operation,
        token: CancelToken,
    ) -> Result<(LeaseRecord, Lease, UseGuard<'_>)> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default()
            .push(token.clone());
        let mut guard = UseGuard {
            runtime: self,
            id: id.to_owned(),
            token,
            marked: false,
        };
        let record = self.store.begin(id, operation, &env.ctx, self.host.id())?;
        guard.marked = true;
        let lease = record
            .lease
            .clone()
            .with_context(|| format!("lease {id} has no provider lease"))?;
        Ok((record, lease, guard))
    }

    /// Cancels the lease's running operations and waits until they returned.
    pub(super) fn stop_running(&self, id: &str) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = running.get(id) {
            for token in tokens {
                token.cancel();
            }
        }
        while running.get(id).is_some_and(|t| !t.is_empty()) {
            running = self
                .finished
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}
