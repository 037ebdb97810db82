//! A leaf's log kept by a replica group.
//!
//! The leader's leaf emits its storage operations as a single-replica leaf does; a
//! [`ReplicatedStore`] gathers those waiting into one entry of the group's Raft log (group
//! commit across producers: under load many operations share an entry and its syncs) and
//! sends it. Once a majority holds the entry in its Raft log, synced, it is committed: the
//! Raft log is each replica's write-ahead log. Every replica's [`LeafJournal`] (the leader's
//! too) then writes the committed operations to its own crest log, in that same order and
//! without a sync of their own, so every replica's log holds the same records and the same
//! checkpoints: a follower that becomes leader recovers its leaf from its own log exactly as a
//! restarted leaf does. An append is complete for the leaf once committed and written to the
//! leader's crest log; the bodies' locations come from the leader's log.
//!
//! Why nothing acknowledged is lost with one sync per replica per entry: ARCHITECTURE.md,
//! "Replica groups".

mod journal;
mod snapshot;
mod store;

pub use journal::{JournalLimits, LeafJournal};
pub use store::{Acks, Gathering, Outcome, ReplicatedStore};

use crest_core::machine::StorageOp;
use crest_core::record::{Location, LogRecord};
use crest_replica::{Applied, Batch};
use crest_storage::wal::approximate_bytes;

/// One storage operation of the leader's leaf as it travels in the group's log. Reads stay
/// local: every replica's log holds the bodies.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Operation {
    /// [`StorageOp::Append`]; the token is the leader's, echoed to its leaf.
    Append {
        /// The leader's token, if its leaf waits for the append.
        token: Option<u64>,
        /// The records.
        records: Vec<LogRecord>,
    },
    /// [`StorageOp::Append`] as the leader sends it: the records already encoded as the body
    /// of a crest log record, so that every replica writes them without decoding them.
    Encoded {
        /// The leader's token, if its leaf waits for the append.
        token: Option<u64>,
        /// The record's body ([`crest_storage::format::encode_record_body`]).
        body: bytes::Bytes,
        /// Each message body in it: start, length and checksum, 12 bytes little-endian.
        spans: bytes::Bytes,
    },
    /// [`StorageOp::Checkpoint`], its `includes` in the leader's tokens. Always the last
    /// operation of its entry: a replica records the checkpoint's entry as applied and synced
    /// before it deletes what the checkpoint replaces.
    Checkpoint {
        /// The snapshot.
        records: Vec<LogRecord>,
        /// The leader's tokens of the appends the snapshot does not reflect.
        includes: Vec<u64>,
        /// Segments that must outlive the checkpoint.
        segments: Vec<u32>,
    },
}

impl Operation {
    /// The operation that carries `op` through the log; `None` for a read.
    pub fn of(op: StorageOp) -> Option<Operation> {
        match op {
            StorageOp::Append { token, records, .. } => Some(Operation::Append { token, records }),
            StorageOp::Checkpoint {
                records,
                includes,
                segments,
            } => Some(Operation::Checkpoint {
                records,
                includes,
                segments,
            }),
            StorageOp::Read { .. } => None,
        }
    }

    /// The leader's token of an append its leaf waits for.
    pub fn token(&self) -> Option<u64> {
        match self {
            Operation::Append { token, .. } | Operation::Encoded { token, .. } => *token,
            Operation::Checkpoint { .. } => None,
        }
    }

    /// Roughly how many bytes it takes in an entry (what bounds an entry's size).
    pub fn bytes(&self) -> usize {
        match self {
            Operation::Append { records, .. } | Operation::Checkpoint { records, .. } => {
                records.iter().map(approximate_bytes).sum::<usize>() + 16
            }
            Operation::Encoded { body, spans, .. } => body.len() + spans.len() + 16,
        }
    }

    /// An append with its records encoded once, here, for every replica (see
    /// [`Operation::Encoded`]); any other operation as it is.
    ///
    /// # Errors
    /// Records that cannot be encoded, or past `approximate_bytes_max`.
    pub fn encoded(self, approximate_bytes_max: u32) -> Result<Operation, String> {
        let Operation::Append { token, records } = self else {
            return Ok(self);
        };
        let mut body = Vec::with_capacity(records.iter().map(approximate_bytes).sum());
        let mut bodies = Vec::with_capacity(records.len());
        crest_storage::format::encode_record_body(
            &records,
            approximate_bytes_max,
            &mut body,
            &mut bodies,
        )?;
        let mut spans = Vec::with_capacity(bodies.len() * SPAN_BYTES);
        for (span, crc) in bodies {
            spans.extend_from_slice(&(span.start as u32).to_le_bytes());
            spans.extend_from_slice(&(span.len() as u32).to_le_bytes());
            spans.extend_from_slice(&crc.to_le_bytes());
        }
        Ok(Operation::Encoded {
            token,
            body: body.into(),
            spans: spans.into(),
        })
    }

    /// The entry that carries this operation alone.
    ///
    /// # Errors
    /// A record that cannot be encoded.
    pub fn encode(&self) -> std::io::Result<Batch> {
        encode_entry(std::slice::from_ref(self))
    }
}

/// Bytes of one span in [`Operation::Encoded`].
const SPAN_BYTES: usize = 12;

/// Where the bodies of an [`Operation::Encoded`] are, its body written at `offset` of segment
/// `segment`.
///
/// # Errors
/// Spans that are not whole, or outside the body.
pub(crate) fn locations_of(
    spans: &[u8],
    body_len: usize,
    segment: u64,
    offset: u64,
) -> std::io::Result<Vec<Location>> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad body spans");
    if spans.len() % SPAN_BYTES != 0 {
        return Err(invalid());
    }
    let segment = u32::try_from(segment).map_err(|_| invalid())?;
    let word = |bytes: &[u8]| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    spans
        .chunks_exact(SPAN_BYTES)
        .map(|span| {
            let (start, len, crc) = (word(&span[..4]), word(&span[4..8]), word(&span[8..]));
            if start as usize + len as usize > body_len {
                return Err(invalid());
            }
            let offset = u32::try_from(offset + u64::from(start)).map_err(|_| invalid())?;
            Ok(Location {
                segment,
                offset,
                len,
                crc,
            })
        })
        .collect()
}

/// The entry that carries `ops`, in order.
///
/// # Errors
/// A record that cannot be encoded.
pub fn encode_entry(ops: &[Operation]) -> std::io::Result<Batch> {
    rmp_serde::to_vec(ops)
        .map(|bytes| Batch(bytes.into()))
        .map_err(std::io::Error::other)
}

/// The operations an entry carries. An entry written by a replica that sent one operation
/// an entry (a map, where a list of operations is an array) is read as that one operation.
///
/// # Errors
/// Bytes that are neither.
pub fn decode_entry(batch: &Batch) -> std::io::Result<Vec<Operation>> {
    let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    match batch.0.first() {
        // MessagePack's map markers: fixmap, map 16, map 32.
        Some(0x80..=0x8f | 0xde | 0xdf) => rmp_serde::from_slice(&batch.0)
            .map(|op| vec![op])
            .map_err(invalid),
        _ => rmp_serde::from_slice(&batch.0).map_err(invalid),
    }
}

/// What an entry's appends became on the replica that applied it: for each append the
/// leader's leaf waits for, its token and where its bodies are.
pub type Placed = Vec<(u64, Vec<Location>)>;

/// The journal's answer for an entry.
///
/// # Errors
/// Locations that cannot be encoded.
pub(crate) fn encode_placed(placed: &Placed) -> std::io::Result<Applied> {
    if placed.is_empty() {
        return Ok(Applied::default());
    }
    rmp_serde::to_vec(placed)
        .map(|bytes| Applied(bytes.into()))
        .map_err(std::io::Error::other)
}

/// What the leader's leaf gets back for an entry: where the bodies of each of its appends
/// are in the leader's log.
///
/// # Errors
/// An answer that is not that.
pub fn placed(applied: &Applied) -> std::io::Result<Placed> {
    if applied.0.is_empty() {
        return Ok(Vec::new());
    }
    rmp_serde::from_slice(&applied.0)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
