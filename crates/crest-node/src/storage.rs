//! Where a leaf's log records go.
//!
//! [`MemoryStore`] keeps nothing and completes every operation at once: the leaf's messages
//! then live only in its memory and a leaf crash loses them. It exists so the tree runs end to
//! end before the durable log (write-ahead log with group commit) replaces it behind the same
//! trait.

use crest_core::machine::{StorageDone, StorageOp};

/// Accepts storage operations; returns a completion at once, or later (for async stores).
pub(crate) trait Storage: Send {
    /// Submits an operation. An operation with a token is complete when `Some` is returned.
    fn submit(&mut self, op: StorageOp) -> Option<StorageDone>;
}

/// See the module doc.
#[derive(Default)]
pub(crate) struct MemoryStore;

impl Storage for MemoryStore {
    fn submit(&mut self, op: StorageOp) -> Option<StorageDone> {
        op.token.map(|token| StorageDone { token })
    }
}
