//! The Raft log on disk: [`raft_log::RaftLog`] behind openraft's log storage API.
//!
//! Appends, the vote and truncations are flushed (fsync) before Raft is told they are done;
//! purges and the commit index ride along with the next flush. Entries are encoded with
//! MessagePack, each behind its length.

use crate::{ReplicaId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, EntryPayload, LogId, RaftLogReader, StorageError, StorageIOError, Vote};
use raft_log::RaftLog;
use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::codeq::{Decode, Encode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

/// Most bytes one encoded entry, vote or id may take (a corrupt length is refused, not
/// allocated).
const ENCODED_BYTES_MAX: u32 = 256 << 20;

/// A value stored in the log: MessagePack behind its length.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Coded<T>(pub(crate) T);

thread_local! {
    /// Where a value is encoded before its length is known: kept from one value to the next,
    /// so that an entry of a megabyte is not encoded into a buffer that grows (and is copied)
    /// twenty times, in memory fresh from the system each time. What it keeps is bounded by
    /// the largest entry (`replica_entry_bytes_max`) once per thread that appends.
    static ENCODING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<T: Serialize> Encode for Coded<T> {
    fn encode<W: io::Write>(&self, mut w: W) -> Result<usize, io::Error> {
        ENCODING.with_borrow_mut(|bytes| {
            bytes.clear();
            rmp_serde::encode::write(bytes, &self.0).map_err(io::Error::other)?;
            let len = u32::try_from(bytes.len())
                .ok()
                .filter(|len| *len <= ENCODED_BYTES_MAX)
                .ok_or_else(|| io::Error::other("a log entry over 256 MiB"))?;
            w.write_all(&len.to_le_bytes())?;
            w.write_all(bytes)?;
            Ok(4 + bytes.len())
        })
    }
}

impl<T: DeserializeOwned> Decode for Coded<T> {
    fn decode<R: io::Read>(mut r: R) -> Result<Self, io::Error> {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len);
        if len > ENCODED_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a log entry of {len} bytes, over the limit"),
            ));
        }
        let mut bytes = vec![0u8; len as usize];
        r.read_exact(&mut bytes)?;
        rmp_serde::from_slice(&bytes)
            .map(Coded)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// The types raft-log stores.
#[derive(Debug, Default, PartialEq, Eq, Clone)]
pub(crate) struct LogTypes;

impl raft_log::Types for LogTypes {
    type LogId = Coded<LogId<ReplicaId>>;
    type LogPayload = Coded<EntryPayload<TypeConfig>>;
    type Vote = Coded<Vote<ReplicaId>>;
    type Callback = Flushed;
    type UserData = Coded<()>;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        match &payload.0 {
            EntryPayload::Normal(batch) => batch.0.len() as u64,
            _ => 64,
        }
    }
}

/// Who waits for a flush.
pub(crate) enum Flushed {
    /// Raft, for an append.
    Raft(LogFlushed<TypeConfig>),
    /// This store, for a vote or a truncation it must not answer before they are durable.
    Store(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl raft_log::Callback for Flushed {
    fn send(self, result: Result<(), io::Error>) {
        match self {
            Flushed::Raft(flushed) => flushed.log_io_completed(result),
            Flushed::Store(sender) => {
                let _ = sender.send(result);
            }
        }
    }
}

/// See the module doc. Clones share the log.
#[derive(Clone)]
pub(crate) struct LogStore {
    log: Arc<Mutex<RaftLog<LogTypes>>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, caching at most `cache_entries` entries and
    /// `cache_bytes` bytes of payload in memory, a flush waiting `flush_linger` for more
    /// appends to join it.
    pub(crate) fn open(
        dir: &std::path::Path,
        cache_entries: usize,
        cache_bytes: usize,
        flush_linger: std::time::Duration,
    ) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let mut config = raft_log::Config::new(dir.display());
        config.log_cache_max_items = Some(cache_entries);
        config.log_cache_capacity = Some(cache_bytes);
        config.wal.flush_batch_wait = Some(flush_linger);
        let log = RaftLog::open(Arc::new(config))?;
        Ok(LogStore {
            log: Arc::new(Mutex::new(log)),
        })
    }

    /// The id of the last entry in the log.
    pub(crate) fn last_log_id(&self) -> Option<LogId<ReplicaId>> {
        self.lock().log_state().last().map(|id| id.0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RaftLog<LogTypes>> {
        // A panic while holding the lock leaves the log as raft-log left it: still usable.
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Flushes everything written so far to disk and waits for it.
    async fn flush(&self) -> io::Result<()> {
        let (done, flushed) = tokio::sync::oneshot::channel();
        self.lock().flush(true, Some(Flushed::Store(done)))?;
        flushed
            .await
            .map_err(|_| io::Error::other("the log's flush worker stopped"))?
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<ReplicaId>> {
        let from = match range.start_bound() {
            Bound::Included(at) => *at,
            Bound::Excluded(at) => at.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(at) => at.saturating_add(1),
            Bound::Excluded(at) => *at,
            Bound::Unbounded => u64::MAX,
        };
        let log = self.lock();
        log.read(from, to)
            .map(|read| {
                read.map(|(log_id, payload)| Entry {
                    log_id: log_id.0,
                    payload: payload.0,
                })
                .map_err(|e| StorageIOError::read_logs(&e).into())
            })
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<ReplicaId>> {
        let log = self.lock();
        let state = log.log_state();
        let last_purged_log_id = state.purged().map(|id| id.0);
        Ok(LogState {
            last_purged_log_id,
            last_log_id: state.last().map(|id| id.0).or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<ReplicaId>) -> Result<(), StorageError<ReplicaId>> {
        self.lock()
            .save_vote(Coded(*vote))
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<ReplicaId>>, StorageError<ReplicaId>> {
        Ok(self.lock().log_state().vote().map(|vote| vote.0))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<ReplicaId>>,
    ) -> Result<(), StorageError<ReplicaId>> {
        if let Some(committed) = committed {
            self.lock()
                .commit(Coded(committed))
                .map_err(|e| StorageIOError::write(&e))?;
        }
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<ReplicaId>>, StorageError<ReplicaId>> {
        Ok(self.lock().log_state().committed().map(|id| id.0))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<ReplicaId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut log = self.lock();
        log.append(
            entries
                .into_iter()
                .map(|entry| (Coded(entry.log_id), Coded(entry.payload))),
        )
        .map_err(|e| StorageIOError::write_logs(&e))?;
        log.flush(true, Some(Flushed::Raft(callback)))
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn truncate(&mut self, log_id: LogId<ReplicaId>) -> Result<(), StorageError<ReplicaId>> {
        self.lock()
            .truncate(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<ReplicaId>) -> Result<(), StorageError<ReplicaId>> {
        self.lock()
            .purge(Coded(log_id))
            .map_err(|e| StorageIOError::write_logs(&e).into())
            .map(|_| ())
    }
}
