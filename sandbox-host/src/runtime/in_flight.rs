//! The operations in flight on each lease: the store mark and the cancel
//! token one operation holds until it ends.

use std::sync::Arc;

use super::SandboxRuntime;
use crate::wasm::cancel::CancelToken;

/// One operation using a lease: drops the store mark (if taken) and the
/// cancel token when it ends.
pub(super) struct UseGuard<'a> {
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
