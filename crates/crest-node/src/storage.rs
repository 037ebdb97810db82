//! Where a leaf's log records go.
//!
//! - [`WalStore`]: the durable log of `crest-storage`. Operations go to its group-commit
//!   writer thread; completions come back to the node actor as messages. Reads of message
//!   bodies go to a reader thread of their own (a read never waits behind a sync), and come
//!   back as messages too.
//! - [`ReplicaStore`]: a replicated leaf's leader: appends and checkpoints go through the
//!   group's log ([`crate::replica::ReplicatedStore`]); bodies are read from this replica's
//!   own log, as [`WalStore`] reads them.
//! - [`MemoryStore`]: keeps nothing and completes every operation at once. The leaf's
//!   messages then live only in its memory and a leaf crash loses them: for tests and for
//!   `crest local --memory`.

use crest_core::machine::{StorageDone, StorageOp};
use crest_core::record::{Location, MessageBody};
use crest_storage::wal::{BodyReader, WalHandle};
use std::sync::mpsc;

/// What became of a submitted operation.
pub(crate) enum Submitted {
    /// Complete now.
    Done(StorageDone),
    /// Failed now; nothing of it is stored.
    Failed { token: u64, reason: String },
    /// Completion (if it has a token) arrives later as a node message.
    Pending,
    /// A read answered now.
    Read {
        token: u64,
        bodies: Vec<Result<MessageBody, String>>,
    },
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
        if let StorageOp::Read { token, locations } = op {
            // A leaf without a log keeps every body in memory and never asks.
            let bodies = locations
                .iter()
                .map(|_| Err("this leaf has no log to read bodies from".to_string()))
                .collect();
            return Submitted::Read { token, bodies };
        }
        match op.token() {
            Some(token) => Submitted::Done(StorageDone::new(token)),
            None => Submitted::Pending,
        }
    }
}

/// See the module doc.
pub(crate) struct WalStore {
    pub(crate) handle: WalHandle,
    pub(crate) reads: mpsc::SyncSender<(u64, Vec<Location>)>,
}

/// The sending side of the body reader's queue, and the reader thread (it ends once every
/// sender is gone).
pub(crate) type Reader = (
    mpsc::SyncSender<(u64, Vec<Location>)>,
    std::thread::JoinHandle<()>,
);

/// Starts the thread that reads bodies from the log in `dir`; `on_read` receives each read's
/// bodies. At most `queue` reads wait for it (then the node waits: reads are not dropped).
pub(crate) fn start_reader(
    dir: std::path::PathBuf,
    queue: usize,
    on_read: impl Fn(u64, Vec<Result<MessageBody, String>>) + Send + 'static,
) -> std::io::Result<Reader> {
    let (tx, rx) = mpsc::sync_channel::<(u64, Vec<Location>)>(queue);
    let thread = std::thread::Builder::new()
        .name("crest-read".into())
        .spawn(move || {
            let mut reader = BodyReader::new(dir);
            while let Ok((token, locations)) = rx.recv() {
                let bodies = locations.iter().map(|l| reader.read(l)).collect();
                on_read(token, bodies);
            }
        })?;
    Ok((tx, thread))
}

/// Hands a read to the body reader.
fn read(
    reads: &mpsc::SyncSender<(u64, Vec<Location>)>,
    token: u64,
    locations: Vec<Location>,
) -> Submitted {
    let count = locations.len();
    if reads.send((token, locations)).is_err() {
        let bodies = (0..count)
            .map(|_| Err("the log reader has stopped".to_string()))
            .collect();
        return Submitted::Read { token, bodies };
    }
    Submitted::Pending
}

/// See the module doc.
pub(crate) struct ReplicaStore {
    pub(crate) store: crate::replica::ReplicatedStore,
    pub(crate) reads: mpsc::SyncSender<(u64, Vec<Location>)>,
}

impl Storage for ReplicaStore {
    fn submit(&mut self, op: StorageOp) -> Submitted {
        if let StorageOp::Read { token, locations } = op {
            return read(&self.reads, token, locations);
        }
        let token = op.token();
        match (self.store.submit(op), token) {
            (Ok(()), _) => Submitted::Pending,
            (Err(reason), Some(token)) => Submitted::Failed { token, reason },
            (Err(reason), None) => {
                tracing::error!(%reason, "a log record could not be replicated");
                Submitted::Pending
            }
        }
    }
}

impl Storage for WalStore {
    fn submit(&mut self, op: StorageOp) -> Submitted {
        let (records, token, wait) = match op {
            StorageOp::Append {
                records,
                token,
                wait,
            } => (records, token, wait),
            StorageOp::Checkpoint {
                records,
                includes,
                segments,
            } => {
                if let Err(error) = self.handle.checkpoint(records, includes, segments) {
                    tracing::error!(%error, "a checkpoint could not be queued; the log stays whole");
                }
                return Submitted::Pending;
            }
            StorageOp::Read { token, locations } => return read(&self.reads, token, locations),
        };
        match self.handle.submit_with(records, token, wait) {
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
