//! The Raft log on disk: [`raft_log::RaftLog`] behind openraft's log storage API.
//!
//! Appends, the vote and truncations are flushed (fsync) before Raft is told they are done;
//! purges and the commit index ride along with the next flush. Values are encoded with
//! MessagePack, each behind its length; a batch's bytes are written as they are
//! ([`Payload`]).

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
    fn decode<R: io::Read>(r: R) -> Result<Self, io::Error> {
        let bytes = read_value(r)?;
        rmp_serde::from_slice(&bytes)
            .map(Coded)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// The first byte of a [`Payload`] holding a batch's bytes as they are. MessagePack never uses
/// it, so a payload written as MessagePack (every other kind, and batches of logs written
/// before) still decodes.
const RAW_BATCH: u8 = 0xc1;

/// An entry's payload in the log. A batch (nearly every entry) is written as its length, a
/// marker and its bytes, straight into raft-log's record: encoding it as MessagePack first
/// copied each entry once more per replica, about 2 % of a replicated fill's CPU time
/// (`perf`). Decoding hands out the bytes read, not a copy.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Payload(pub(crate) EntryPayload<TypeConfig>);

impl Encode for Payload {
    fn encode<W: io::Write>(&self, mut w: W) -> Result<usize, io::Error> {
        let EntryPayload::Normal(batch) = &self.0 else {
            return Coded(&self.0).encode(w);
        };
        let len = u32::try_from(batch.0.len() + 1)
            .ok()
            .filter(|len| *len <= ENCODED_BYTES_MAX)
            .ok_or_else(|| io::Error::other("a log entry over 256 MiB"))?;
        w.write_all(&len.to_le_bytes())?;
        w.write_all(&[RAW_BATCH])?;
        w.write_all(&batch.0)?;
        Ok(4 + len as usize)
    }
}

impl Decode for Payload {
    fn decode<R: io::Read>(r: R) -> Result<Self, io::Error> {
        let bytes = read_value(r)?;
        if bytes.first() == Some(&RAW_BATCH) {
            let batch = bytes::Bytes::from(bytes).slice(1..);
            return Ok(Payload(EntryPayload::Normal(crate::Batch(batch))));
        }
        rmp_serde::from_slice(&bytes)
            .map(Payload)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Reads a value's length and then its bytes (a length past the bound is refused).
fn read_value<R: io::Read>(mut r: R) -> Result<Vec<u8>, io::Error> {
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
    Ok(bytes)
}

/// The types raft-log stores.
#[derive(Debug, Default, PartialEq, Eq, Clone)]
pub(crate) struct LogTypes;

impl raft_log::Types for LogTypes {
    type LogId = Coded<LogId<ReplicaId>>;
    type LogPayload = Payload;
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
                .map(|entry| (Coded(entry.log_id), Payload(entry.payload))),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(payload: &Payload) -> (Vec<u8>, Payload) {
        let mut bytes = Vec::new();
        let written = payload.encode(&mut bytes).unwrap();
        assert_eq!(written, bytes.len());
        let decoded = Payload::decode(bytes.as_slice()).unwrap();
        (bytes, decoded)
    }

    #[test]
    fn a_batch_is_written_as_its_bytes_and_read_back_without_a_copy() {
        let batch = Payload(EntryPayload::Normal(crate::Batch(
            bytes::Bytes::from_static(b"records"),
        )));
        let (bytes, decoded) = round_trip(&batch);
        assert_eq!(
            bytes,
            [&8u32.to_le_bytes()[..], &[RAW_BATCH], b"records"].concat()
        );
        assert_eq!(decoded, batch);
    }

    #[test]
    fn other_payloads_and_batches_of_older_logs_are_messagepack() {
        let blank = Payload(EntryPayload::Blank);
        let (bytes, decoded) = round_trip(&blank);
        assert_ne!(bytes[4], RAW_BATCH);
        assert_eq!(decoded, blank);
        // A batch as logs written before the raw form hold it.
        let batch = EntryPayload::Normal(crate::Batch(bytes::Bytes::from_static(b"older")));
        let mut older = Vec::new();
        Coded(batch.clone()).encode(&mut older).unwrap();
        assert_eq!(Payload::decode(older.as_slice()).unwrap(), Payload(batch));
    }

    #[test]
    fn a_length_past_the_bound_is_refused_before_anything_is_allocated() {
        let mut bytes = (ENCODED_BYTES_MAX + 1).to_le_bytes().to_vec();
        bytes.push(RAW_BATCH);
        let error = Payload::decode(bytes.as_slice()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }
}
