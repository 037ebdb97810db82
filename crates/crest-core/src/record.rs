//! The leaf's log records: what a leaf writes to its log and reads back at recovery, and what
//! it keeps of a message besides its place in the index. The storage crate frames these in
//! segments and checkpoints (`crest_storage::format`); their MessagePack encoding is
//! [`LogRecord::encode`] (in `codec`, beside the other hand-written encoders).

use crate::id::MessageId;
use crate::time::Time;
use bytes::Bytes;

/// Where a message's body lies in the log: the bytes of its `Enqueue` record (as encoded in
/// the record's body) in segment `segment`, and their crc32. A 32-bit offset is enough:
/// segments are bounded below 4 GiB (`wal_segment_bytes_max`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct Location {
    /// The segment's sequence number.
    pub segment: u32,
    /// Offset of the encoded `Enqueue` record in the segment file.
    pub offset: u32,
    /// Its length.
    pub len: u32,
    /// crc32 of those bytes: a read that does not match fails rather than deliver damage.
    pub crc: u32,
}

/// What a leaf does not need in memory to order and route a message: its producer metadata
/// and payload.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct MessageBody {
    /// Producer metadata.
    pub metadata: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
}

impl MessageBody {
    /// Bytes it takes (metadata strings and payload).
    pub fn bytes(&self) -> u64 {
        let metadata: usize = self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        (metadata + self.payload.len()) as u64
    }

    /// Bytes of memory it takes in the body cache: [`MessageBody::bytes`] plus the cache's
    /// slot and the payload's shared header ([`CACHED_BODY_OVERHEAD_BYTES`]), so that
    /// `leaf_body_cache_bytes` bounds memory, not only payload bytes, whatever their size.
    pub fn cached_bytes(&self) -> u64 {
        self.bytes() + CACHED_BODY_OVERHEAD_BYTES
    }
}

/// Memory a cached body takes besides its bytes: its slot in the id-ordered cache (id and
/// body) and the header `bytes::Bytes` shares a payload through.
pub const CACHED_BODY_OVERHEAD_BYTES: u64 =
    (std::mem::size_of::<(MessageId, Option<MessageBody>)>() + 32) as u64;

/// What the log keeps of a message besides its body.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct MessageHead {
    /// Its id.
    pub id: MessageId,
    /// Its topic.
    pub topic: String,
    /// Its priority.
    pub priority: u32,
    /// When it is ready.
    pub ready_at: Time,
    /// When it was accepted.
    pub enqueued_at: Time,
    /// When it expires (`None`: never).
    pub expires_at: Option<Time>,
    /// Its dedup key, if it has one (the key's window starts at `enqueued_at`).
    pub dedup_key: Option<String>,
    /// Its fairness key, if it has one (records written before fairness keys have none).
    #[serde(default)]
    pub fairness_key: Option<String>,
}

/// One record of the leaf's log.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum LogRecord {
    /// A message was accepted.
    Enqueue {
        /// What is kept of it besides its body.
        head: MessageHead,
        /// Producer metadata.
        metadata: Vec<(String, String)>,
        /// The payload (the last field: its bytes end the record's encoding).
        payload: Bytes,
    },
    /// A lease was granted.
    Lease {
        /// The message.
        id: MessageId,
        /// The attempt number this lease is.
        attempt: u32,
        /// The lease deadline.
        deadline: Time,
        /// The lease's token, so that whoever rebuilds the leaf from its log (a restart, or
        /// another replica of its group taking over) knows the lease and honours its receipt.
        /// 0: not known (logs written before tokens were logged, and the attempt counts a
        /// checkpoint keeps for messages not leased).
        #[serde(default)]
        token: u64,
    },
    /// A message was acknowledged, purged or expired: it is gone.
    Delete {
        /// The message.
        id: MessageId,
    },
    /// A lease ended without an ack (nack, expiry, or the root gave the grant back); the
    /// message is delayed or available again.
    Release {
        /// The message.
        id: MessageId,
        /// Its attempt count from now on.
        attempt: u32,
        /// Its ready time from now on (later than before after a nack with delay).
        ready_at: Time,
    },
    /// A message moved to its topic's dead-letter queue.
    Dead {
        /// The message.
        id: MessageId,
        /// Why its last delivery failed.
        reason: String,
        /// When it moved.
        at: Time,
    },
    /// A dead letter went back into its topic with its attempts reset.
    Redrive {
        /// The message.
        id: MessageId,
    },
    /// A message whose body is in the log: what checkpoints hold, and what recovery reads an
    /// `Enqueue` record as (with `location` where it found it). For a message the leaf already
    /// holds, it only moves the body (compaction rewrote it).
    Index {
        /// What is kept of it besides its body (`dedup_key` only when recovered from an
        /// `Enqueue`; checkpoints log keys as `Dedup`).
        head: MessageHead,
        /// Payload bytes.
        size: u32,
        /// Where its body is.
        location: Location,
    },
    /// A message whose delivery failed for the last time moved to its topic's
    /// `dead_letter_topic`, or a message move task moved it: it is ready in `topic` now,
    /// attempts reset.
    Move {
        /// The message.
        id: MessageId,
        /// The topic it is in from now on.
        topic: String,
    },
    /// A topic's configuration (checkpoints log every one the leaf keeps).
    Configure {
        /// The topic.
        topic: String,
        /// Its configuration.
        config: Box<crate::wire::TopicConfig>,
    },
    /// A waiting message's priority changed (an admin's `Reprioritize`, or aging); checkpoints
    /// log each changed message's latest change after its `Index` (which has its priority of
    /// now), so that its `Escalation` outlives the log it replaces.
    Reprioritize {
        /// The message.
        id: MessageId,
        /// Its priority from now on.
        priority: u32,
        /// Who, when and why, and the priority it was pushed with.
        escalation: crate::wire::Escalation,
    },
    /// A waiting message's metadata was replaced (`SetMetadata`): its body in the log keeps
    /// the pushed pairs, these stand for them; checkpoints log them again after the message.
    SetMetadata {
        /// The message.
        id: MessageId,
        /// Its metadata from now on.
        metadata: Vec<(String, String)>,
    },
    /// A dedup key whose window is still open (checkpoints only: it may outlive its message).
    Dedup {
        /// The topic.
        topic: String,
        /// The key.
        key: String,
        /// The first message pushed with it.
        id: MessageId,
        /// When its window ends.
        until: Time,
    },
}
