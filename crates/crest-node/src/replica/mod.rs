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

mod acks;
mod journal;
mod snapshot;
mod status;
mod store;

pub use acks::Acks;
pub use journal::{JournalLimits, LeafJournal};
pub use status::{FollowerLag, ReplicaStatus};
pub use store::{Gathering, Outcome, ReplicatedStore};

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
        /// The body's CRC-32, computed once by the leader (`None` in entries of replicas that
        /// did not send it: each replica computes it).
        #[serde(default)]
        crc: Option<u32>,
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
        let spans = span_bytes(bodies, 0);
        Ok(Operation::Encoded {
            token,
            crc: Some(crc32fast::hash(&body)),
            body: body.into(),
            spans: spans.into(),
        })
    }

    /// The entry that carries this operation alone.
    ///
    /// # Errors
    /// A record that cannot be encoded.
    pub fn encode(self) -> std::io::Result<Batch> {
        let mut entry = EntryWriter::with_capacity(self.bytes());
        entry.push(self, u32::MAX).map_err(std::io::Error::other)?;
        Ok(entry.finish())
    }
}

/// The spans of [`Operation::Encoded`] for message bodies at `bodies` of a buffer whose record
/// body starts at `body_start`.
fn span_bytes(bodies: Vec<(std::ops::Range<usize>, u32)>, body_start: usize) -> Vec<u8> {
    let mut spans = Vec::with_capacity(bodies.len() * SPAN_BYTES);
    for (span, crc) in bodies {
        spans.extend_from_slice(&((span.start - body_start) as u32).to_le_bytes());
        spans.extend_from_slice(&(span.len() as u32).to_le_bytes());
        spans.extend_from_slice(&crc.to_le_bytes());
    }
    spans
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

/// The first byte of an entry in the format [`EntryWriter`] writes: one MessagePack never
/// uses, so an entry of the older format (a MessagePack array or map) is never taken for one.
const ENTRY_FORMAT: u8 = 0xc1;
/// An operation of such an entry: an [`Operation::Encoded`], its parts as they are.
const OP_ENCODED: u8 = 1;
/// An operation of such an entry: any other, MessagePack behind its length.
const OP_OTHER: u8 = 2;

/// Writes an entry: each append encoded straight into the entry as a crest log record body
/// (once, on the leader) with its spans and checksum beside it, so that every replica slices
/// it out of the entry it received and writes it without decoding or copying it first.
///
/// Layout (integers little-endian): `0xc1`, then per operation either `1`, a token flag and
/// token (u8, u64), the body's CRC-32 (u32), the body (u32 length, bytes) and its spans
/// (u32 length, bytes); or `2` and a MessagePack [`Operation`] (u32 length, bytes).
pub struct EntryWriter {
    buf: Vec<u8>,
}

/// An append an entry carries, as the leader keeps it until the entry is answered: its token
/// and where its message bodies lie in its record body.
pub struct Sent {
    /// The leader's token.
    pub token: u64,
    /// The spans ([`Operation::Encoded`]), or `None` for an append sent as records.
    pub spans: Option<(bytes::Bytes, usize)>,
}

impl EntryWriter {
    /// An empty entry with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> EntryWriter {
        let mut buf = Vec::with_capacity(bytes + 1);
        buf.push(ENTRY_FORMAT);
        EntryWriter { buf }
    }

    /// Whether no operation was added.
    pub fn is_empty(&self) -> bool {
        self.buf.len() <= 1
    }

    /// Adds `op`; an append is encoded here. Answers what the leader keeps of an append its
    /// leaf waits for.
    ///
    /// # Errors
    /// Records that cannot be encoded or are past `record_bytes_max`: nothing is added.
    pub fn push(&mut self, op: Operation, record_bytes_max: u32) -> Result<Option<Sent>, String> {
        let start = self.buf.len();
        let added = self.push_inner(op, record_bytes_max);
        if added.is_err() {
            self.buf.truncate(start);
        }
        added
    }

    fn push_inner(&mut self, op: Operation, max: u32) -> Result<Option<Sent>, String> {
        let (token, records) = match op {
            Operation::Append { token, records } => (token, records),
            Operation::Encoded {
                token,
                body,
                spans,
                crc,
            } => {
                self.encoded_header(token, crc.unwrap_or_else(|| crc32fast::hash(&body)));
                self.part(&body)?;
                self.part(&spans)?;
                return Ok(token.map(|token| Sent {
                    token,
                    spans: Some((spans, body.len())),
                }));
            }
            other => {
                let bytes = rmp_serde::to_vec(&other).map_err(|e| e.to_string())?;
                self.buf.push(OP_OTHER);
                self.part(&bytes)?;
                return Ok(None);
            }
        };
        let crc_at = self.encoded_header(token, 0);
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        let body_start = self.buf.len();
        let mut bodies = Vec::with_capacity(records.len());
        crest_storage::format::encode_record_body(&records, max, &mut self.buf, &mut bodies)?;
        let body = &self.buf[body_start..];
        let body_len = body.len();
        let crc = crc32fast::hash(body);
        self.buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        self.buf[len_at..len_at + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
        let spans = span_bytes(bodies, body_start);
        self.part(&spans)?;
        Ok(token.map(|token| Sent {
            token,
            spans: Some((spans.into(), body_len)),
        }))
    }

    /// Writes an encoded append's tag, token and checksum; answers where the checksum is.
    fn encoded_header(&mut self, token: Option<u64>, crc: u32) -> usize {
        self.buf.push(OP_ENCODED);
        self.buf.push(u8::from(token.is_some()));
        self.buf
            .extend_from_slice(&token.unwrap_or_default().to_le_bytes());
        let at = self.buf.len();
        self.buf.extend_from_slice(&crc.to_le_bytes());
        at
    }

    fn part(&mut self, bytes: &[u8]) -> Result<(), String> {
        let len = u32::try_from(bytes.len()).map_err(|_| "an operation over 4 GiB".to_string())?;
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The entry.
    pub fn finish(self) -> Batch {
        Batch(self.buf.into())
    }
}

/// The operations an entry carries: one [`EntryWriter`] wrote (its bodies slices of the
/// entry, not copies), or one of the older formats: a MessagePack list of operations, or a
/// single operation (a map).
///
/// # Errors
/// Bytes that are none of these.
pub fn decode_entry(batch: &Batch) -> std::io::Result<Vec<Operation>> {
    let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    match batch.0.first() {
        Some(&ENTRY_FORMAT) => decode_written(&batch.0).map_err(invalid),
        // MessagePack's map markers: fixmap, map 16, map 32.
        Some(0x80..=0x8f | 0xde | 0xdf) => rmp_serde::from_slice(&batch.0)
            .map(|op| vec![op])
            .map_err(|e| invalid(e.to_string())),
        _ => rmp_serde::from_slice(&batch.0).map_err(|e| invalid(e.to_string())),
    }
}

fn decode_written(entry: &bytes::Bytes) -> Result<Vec<Operation>, String> {
    let mut at = 1;
    let take = |at: &mut usize, n: usize| -> Result<std::ops::Range<usize>, String> {
        let end = at
            .checked_add(n)
            .filter(|end| *end <= entry.len())
            .ok_or_else(|| format!("an entry cut short at byte {at}"))?;
        let range = *at..end;
        *at = end;
        Ok(range)
    };
    let word = |range: std::ops::Range<usize>| {
        let b = &entry[range];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let mut ops = Vec::new();
    while at < entry.len() {
        let tag = entry[take(&mut at, 1)?.start];
        match tag {
            OP_ENCODED => {
                let has_token = entry[take(&mut at, 1)?.start] != 0;
                let token = take(&mut at, 8)?;
                let token = u64::from_le_bytes(entry[token].try_into().unwrap_or_default());
                let crc = word(take(&mut at, 4)?);
                let len = word(take(&mut at, 4)?) as usize;
                let body = entry.slice(take(&mut at, len)?);
                let len = word(take(&mut at, 4)?) as usize;
                let spans = entry.slice(take(&mut at, len)?);
                ops.push(Operation::Encoded {
                    token: has_token.then_some(token),
                    body,
                    spans,
                    crc: Some(crc),
                });
            }
            OP_OTHER => {
                let len = word(take(&mut at, 4)?) as usize;
                let bytes = &entry[take(&mut at, len)?];
                ops.push(rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?);
            }
            other => return Err(format!("an operation of unknown kind {other}")),
        }
    }
    Ok(ops)
}

/// Where an append of an entry landed on the replica that applied it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Placement {
    /// An [`Operation::Encoded`]: its body was written at `offset` of segment `segment`; its
    /// message bodies are there plus their spans (which the leader kept).
    At {
        /// The segment.
        segment: u64,
        /// The file offset of the body.
        offset: u64,
    },
    /// An [`Operation::Append`]: where its message bodies are.
    Locations(Vec<Location>),
}

/// What an entry's appends became on the replica that applied it: for each append the
/// leader's leaf waits for, its token and where it landed.
pub type Placed = Vec<(u64, Placement)>;

/// The journal's answer for an entry.
///
/// # Errors
/// An answer that cannot be encoded.
pub(crate) fn encode_placed(placed: &Placed) -> std::io::Result<Applied> {
    if placed.is_empty() {
        return Ok(Applied::default());
    }
    rmp_serde::to_vec(placed)
        .map(|bytes| Applied(bytes.into()))
        .map_err(std::io::Error::other)
}

/// Where the journal that answered `applied` placed each append of its entry.
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
