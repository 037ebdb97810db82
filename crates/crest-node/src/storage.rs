//! Where a leaf's log records go.
//!
//! - [`WalStore`]: the durable log of `crest-storage`. Operations go to its group-commit
//!   writer thread; completions come back to the node actor as messages.
//! - [`MemoryStore`]: keeps nothing and completes every operation at once. The leaf's
//!   messages then live only in its memory and a leaf crash loses them: for tests and for
//!   `crest local --memory`.

use crest_core::machine::{StorageDone, StorageOp};
use crest_storage::wal::WalHandle;

/// What became of a submitted operation.
pub(crate) enum Submitted {
    /// Complete now.
    Done(StorageDone),
    /// Failed now; nothing of it is stored.
    Failed { token: u64, reason: String },
    /// Completion (if it has a token) arrives later as a node message.
    Pending,
}

/// Accepts storage operations.
pub(crate) trait Storage: Send {
    /// Submits an operation.
    fn submit(&mut self, op: StorageOp) -> Submitted;
}

/// See the module doc.
#[derive(Default)]
pub(crate) struct MemoryStore;

impl Storage for MemoryStore {
    fn submit(&mut self, op: StorageOp) -> Submitted {
        match op.token() {
            Some(token) => Submitted::Done(StorageDone { token }),
            None => Submitted::Pending,
        }
    }
}

/// See the module doc.
pub(crate) struct WalStore {
    pub(crate) handle: WalHandle,
}

impl Storage for WalStore {
    fn submit(&mut self, op: StorageOp) -> Submitted {
        let (records, token) = match op {
            StorageOp::Append { records, token } => (records, token),
            StorageOp::Checkpoint { records, includes } => {
                if let Err(error) = self.handle.checkpoint(records, includes) {
                    tracing::error!(%error, "a checkpoint could not be queued; the log stays whole");
                }
                return Submitted::Pending;
            }
        };
        match self.handle.submit(records, token) {
            Ok(()) => Submitted::Pending,
            Err(error) => match token {
                Some(token) => Submitted::Failed {
                    token,
                    reason: error.to_string(),
                },
                None => {
                    // A lease, delete or release record that cannot be logged: after a crash
                    // the message would come back in an older state. The writer only stops
                    // when the process is going down, so say so loudly.
                    tracing::error!(%error, "a log record could not be written");
                    Submitted::Pending
                }
            },
        }
    }
}
