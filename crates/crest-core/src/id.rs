//! Message and leaf identifiers.
//!
//! A [`MessageId`] is one `u64`: the upper 16 bits are the [`LeafId`] of the leaf that accepted
//! the message and owns it; the lower 48 bits are that leaf's sequence number. Any node can
//! therefore route a reserve, confirm or release for a message to its owning leaf without a
//! lookup table of messages, only a table of which child leads to which leaf.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::str::FromStr;

/// A connection, named by the driver. Ids are never reused within one driver.
pub type ConnId = u64;

/// How a connection came to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Link {
    /// This node connected to its parent.
    Parent,
    /// Someone connected to this node (a child, a producer or a consumer); it says who in its
    /// `Hello`.
    Incoming,
    /// The root connected to this leaf for its pop path (setting `direct_pop_path`): reserves,
    /// settles and admin requests for the leaf travel on it and skip the aggregators, which
    /// learn of taken entries from the leaf's retracts instead.
    Leaf(LeafId),
}

/// Identifies a leaf in the topology (`1..=65535`; 0 is reserved and never valid).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct LeafId(pub u16);

impl fmt::Display for LeafId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Globally unique message id; encodes the owning leaf (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MessageId(pub u64);

/// Number of bits of a [`MessageId`] that hold the leaf's sequence number.
pub const MESSAGE_SEQ_BITS: u32 = 48;
/// The largest sequence number a leaf may assign.
pub const MESSAGE_SEQ_MAX: u64 = (1 << MESSAGE_SEQ_BITS) - 1;

impl MessageId {
    /// Composes an id from the owning leaf and its sequence number.
    ///
    /// # Panics
    /// If `seq` exceeds [`MESSAGE_SEQ_MAX`]: leaves stop accepting pushes before that.
    pub fn new(leaf: LeafId, seq: u64) -> MessageId {
        assert!(
            seq <= MESSAGE_SEQ_MAX,
            "message sequence {seq} out of range"
        );
        MessageId((u64::from(leaf.0) << MESSAGE_SEQ_BITS) | seq)
    }

    /// The leaf that owns this message.
    pub fn leaf(self) -> LeafId {
        LeafId((self.0 >> MESSAGE_SEQ_BITS) as u16)
    }

    /// The owning leaf's sequence number.
    pub fn seq(self) -> u64 {
        self.0 & MESSAGE_SEQ_MAX
    }

    /// The id as a UUID (RFC 9562 version 8, whose bits are the user's to define), the form
    /// the SQS API answers with: the id's top 48 bits, the version, its next 12, the variant,
    /// zeros, its last 4. [`MessageId::from_str`] reads it back.
    pub fn to_uuid(self) -> String {
        let (high, low) = self.uuid_halves();
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0xffff,
            low >> 48,
            low & 0xffff_ffff_ffff
        )
    }

    fn uuid_halves(self) -> (u64, u64) {
        let high = (self.0 & !0xffff) | UUID_VERSION | ((self.0 >> 4) & 0xfff);
        (high, UUID_VARIANT | (self.0 & 0xf))
    }

    /// The id a UUID of [`MessageId::to_uuid`] stands for.
    fn from_uuid(text: &str) -> Option<MessageId> {
        let groups: Vec<&str> = text.split('-').collect();
        let lengths = groups.iter().map(|g| g.len()).collect::<Vec<_>>();
        if lengths != [8, 4, 4, 4, 12] || !text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        {
            return None;
        }
        let hex: String = groups.concat();
        let high = u64::from_str_radix(&hex[..16], 16).ok()?;
        let low = u64::from_str_radix(&hex[16..], 16).ok()?;
        let id = (high & !0xffff) | ((high & 0xfff) << 4) | (low & 0xf);
        let id = MessageId(id);
        (id.uuid_halves() == (high, low)).then_some(id)
    }
}

/// RFC 9562's version 8 in a UUID's high half.
const UUID_VERSION: u64 = 0x8000;
/// RFC 9562's variant (binary 10) in a UUID's low half.
const UUID_VARIANT: u64 = 0x8000_0000_0000_0000;

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.leaf().0, self.seq())
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A fast hasher for maps keyed by [`MessageId`]. Ids are minted by the leaf itself (a client
/// can look one up but never choose the keys a map holds), so a multiplicative mix is enough;
/// the default SipHash costs several times more per lookup on the leaf's hottest map.
#[derive(Default, Clone, Copy, Debug)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// A hash map keyed by message id, with [`IdHasher`].
pub type IdMap<V> =
    std::collections::HashMap<MessageId, V, std::hash::BuildHasherDefault<IdHasher>>;

/// A map keyed by message id for values that mostly arrive in ascending id order, as a
/// leaf's bodies do (it mints ids in arrival order and they become durable in that order).
/// Those sit in a deque in id order, found by binary search: no hashing, no rehash as the map
/// grows, and neighbours in memory. A removed entry leaves a hole until the holes are more
/// than half the deque (then it is compacted) or reach its front. Values that arrive out of
/// order go to a hash map beside it.
#[derive(Debug)]
pub(crate) struct AscendingIdMap<V> {
    ordered: VecDeque<(MessageId, Option<V>)>,
    holes: usize,
    others: IdMap<V>,
}

impl<V> Default for AscendingIdMap<V> {
    fn default() -> Self {
        AscendingIdMap {
            ordered: VecDeque::new(),
            holes: 0,
            others: IdMap::default(),
        }
    }
}

/// Holes below this many are never compacted (a small deque is cheap to keep).
const HOLES_KEPT: usize = 1024;

impl<V> AscendingIdMap<V> {
    /// Where `id` is (or would go) in the deque. Ids are unique and ascending, so an id sits at
    /// most as far from the front as its distance in ids: with no gap before it (the common
    /// case: holes keep their places) it is exactly there, found without a search.
    fn position(&self, id: MessageId) -> Result<usize, usize> {
        let Some(&(front, _)) = self.ordered.front() else {
            return Err(0);
        };
        let Some(distance) = id.0.checked_sub(front.0) else {
            return Err(0);
        };
        let bound = usize::try_from(distance).unwrap_or(usize::MAX);
        if let Some((at, _)) = self.ordered.get(bound)
            && *at == id
        {
            return Ok(bound);
        }
        // Entries from `bound` on hold ids beyond `id` (each at least one above the last).
        let (mut low, mut high) = (0, bound.saturating_add(1).min(self.ordered.len()));
        while low < high {
            let middle = low + (high - low) / 2;
            match self.ordered[middle].0.cmp(&id) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return Ok(middle),
            }
        }
        Err(low)
    }

    /// Inserts `value` under `id`; the value it replaces.
    pub(crate) fn insert(&mut self, id: MessageId, value: V) -> Option<V> {
        if self.ordered.back().is_none_or(|(last, _)| *last < id) {
            let old = match self.others.is_empty() {
                true => None,
                false => self.others.remove(&id),
            };
            self.ordered.push_back((id, Some(value)));
            return old;
        }
        match self.position(id) {
            Ok(index) => {
                let old = self.ordered[index].1.replace(value);
                if old.is_none() {
                    self.holes -= 1;
                }
                old
            }
            Err(_) => self.others.insert(id, value),
        }
    }

    /// Every value held, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.ordered
            .iter()
            .filter_map(|(_, value)| value.as_ref())
            .chain(self.others.values())
    }

    /// The value of `id`, if held.
    pub(crate) fn get(&self, id: &MessageId) -> Option<&V> {
        if !self.others.is_empty()
            && let Some(value) = self.others.get(id)
        {
            return Some(value);
        }
        let index = self.position(*id).ok()?;
        self.ordered[index].1.as_ref()
    }

    /// Removes the value under `id`.
    pub(crate) fn remove(&mut self, id: &MessageId) -> Option<V> {
        if !self.others.is_empty()
            && let Some(value) = self.others.remove(id)
        {
            return Some(value);
        }
        let index = self.position(*id).ok()?;
        let value = self.ordered[index].1.take()?;
        self.holes += 1;
        while self.ordered.front().is_some_and(|(_, v)| v.is_none()) {
            self.ordered.pop_front();
            self.holes -= 1;
        }
        while self.ordered.back().is_some_and(|(_, v)| v.is_none()) {
            self.ordered.pop_back();
            self.holes -= 1;
        }
        if self.holes > HOLES_KEPT && self.holes * 2 > self.ordered.len() {
            self.ordered.retain(|(_, v)| v.is_some());
            self.ordered.shrink_to(self.ordered.len() * 2);
            self.holes = 0;
        }
        Some(value)
    }

    /// How many values it holds.
    pub(crate) fn len(&self) -> usize {
        self.ordered.len() - self.holes + self.others.len()
    }
}

/// Ids per block of [`LiveIds`].
const LIVE_BLOCK_IDS: u64 = 4096;

/// The sequence numbers of a leaf's live messages, as a bitmap in blocks of 4096 ids that
/// exist only while one of their ids is live. A leaf mints ids in arrival order, so live ids
/// cluster: this costs about one bit per id of a live block, where a hash set would cost ~16
/// bytes per message. It answers "does this message still exist" for receipts, which only
/// name an id.
#[derive(Debug, Default)]
pub(crate) struct LiveIds {
    blocks: HashMap<u64, Box<LiveBlock>, BuildHasherDefault<IdHasher>>,
    len: u64,
}

#[derive(Debug)]
struct LiveBlock {
    bits: [u64; (LIVE_BLOCK_IDS / 64) as usize],
    count: u32,
}

impl LiveIds {
    /// Adds `seq`; false if it was there.
    pub(crate) fn insert(&mut self, seq: u64) -> bool {
        let block = self.blocks.entry(seq / LIVE_BLOCK_IDS).or_insert_with(|| {
            Box::new(LiveBlock {
                bits: [0; (LIVE_BLOCK_IDS / 64) as usize],
                count: 0,
            })
        });
        let (word, bit) = (((seq % LIVE_BLOCK_IDS) / 64) as usize, seq % 64);
        if block.bits[word] & (1 << bit) != 0 {
            return false;
        }
        block.bits[word] |= 1 << bit;
        block.count += 1;
        self.len += 1;
        true
    }

    /// Removes `seq`; false if it was not there.
    pub(crate) fn remove(&mut self, seq: u64) -> bool {
        let key = seq / LIVE_BLOCK_IDS;
        let Some(block) = self.blocks.get_mut(&key) else {
            return false;
        };
        let (word, bit) = (((seq % LIVE_BLOCK_IDS) / 64) as usize, seq % 64);
        if block.bits[word] & (1 << bit) == 0 {
            return false;
        }
        block.bits[word] &= !(1 << bit);
        block.count -= 1;
        self.len -= 1;
        if block.count == 0 {
            self.blocks.remove(&key);
        }
        true
    }

    /// Whether `seq` is live.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.blocks
            .get(&(seq / LIVE_BLOCK_IDS))
            .is_some_and(|block| {
                block.bits[((seq % LIVE_BLOCK_IDS) / 64) as usize] & (1 << (seq % 64)) != 0
            })
    }

    /// Number of live ids.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

/// Why a textual message id or receipt could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {text:?}: expected {expected}")]
pub struct ParseIdError {
    /// What was being parsed ("message id" or "receipt").
    pub what: &'static str,
    /// The text that was rejected.
    pub text: String,
    /// The accepted form.
    pub expected: &'static str,
}

impl FromStr for MessageId {
    type Err = ParseIdError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseIdError {
            what: "message id",
            text: text.to_string(),
            expected: "LEAF.SEQ, e.g. 3.1024, or the UUID the SQS API gives",
        };
        if let Some(id) = MessageId::from_uuid(text) {
            return (id.leaf().0 != 0).then_some(id).ok_or_else(error);
        }
        let (leaf, seq) = text.split_once('.').ok_or_else(error)?;
        let leaf: u16 = leaf.parse().map_err(|_| error())?;
        let seq: u64 = seq.parse().map_err(|_| error())?;
        if leaf == 0 || seq > MESSAGE_SEQ_MAX {
            return Err(error());
        }
        Ok(MessageId::new(LeafId(leaf), seq))
    }
}

/// A receipt handle: proof of one delivery, needed to ack, nack or extend it.
///
/// The token is the lease token the owning leaf minted when it granted the lease; a receipt whose
/// token no longer matches the leaf's live lease is stale and is rejected.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// The delivered message.
    pub id: MessageId,
    /// The lease token of this delivery.
    pub token: u64,
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:016x}", self.id, self.token)
    }
}

impl FromStr for Receipt {
    type Err = ParseIdError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseIdError {
            what: "receipt",
            text: text.to_string(),
            expected: "LEAF.SEQ:TOKEN (token in hex), as printed by `crest pop`",
        };
        let (id, token) = text.split_once(':').ok_or_else(error)?;
        let id: MessageId = id.parse().map_err(|_| error())?;
        let token = u64::from_str_radix(token, 16).map_err(|_| error())?;
        Ok(Receipt { id, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_id_and_its_uuid_map_both_ways() {
        for id in [
            MessageId::new(LeafId(1), 0),
            MessageId::new(LeafId(3), 1024),
            MessageId::new(LeafId(u16::MAX), MESSAGE_SEQ_MAX),
        ] {
            let uuid = id.to_uuid();
            assert_eq!(uuid.len(), 36, "{uuid}");
            assert_eq!(&uuid[14..15], "8", "version 8: {uuid}");
            assert!(
                matches!(&uuid[19..20], "8" | "9" | "a" | "b"),
                "variant: {uuid}"
            );
            assert_eq!(uuid.parse::<MessageId>(), Ok(id), "{uuid}");
            assert_eq!(id.to_string().parse::<MessageId>(), Ok(id));
        }
        assert_eq!(
            MessageId::new(LeafId(3), 1024).to_uuid(),
            "00030000-0000-8040-8000-000000000000"
        );
        for bad in [
            "00030000-0000-4040-8000-000000000000",
            "00030000-0000-8040-8000-000000000010",
            "00000000-0000-8040-8000-000000000000",
            "0003000000008040-8000-000000000000",
            "0003000g-0000-8040-8000-000000000000",
        ] {
            assert!(bad.parse::<MessageId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn id_round_trips_through_parts_and_text() {
        let id = MessageId::new(LeafId(7), 123_456_789);
        assert_eq!(id.leaf(), LeafId(7));
        assert_eq!(id.seq(), 123_456_789);
        assert_eq!(id.to_string().parse::<MessageId>().unwrap(), id);
        let receipt = Receipt {
            id,
            token: 0xdead_beef,
        };
        assert_eq!(receipt.to_string().parse::<Receipt>().unwrap(), receipt);
    }

    #[test]
    fn bad_text_is_rejected_with_the_expected_form() {
        let error = "nonsense".parse::<Receipt>().unwrap_err();
        assert!(error.to_string().contains("LEAF.SEQ:TOKEN"), "{error}");
        assert!("0.5".parse::<MessageId>().is_err(), "leaf 0 is reserved");
        assert!("1.x".parse::<MessageId>().is_err());
    }

    #[test]
    fn live_ids_track_membership_and_free_empty_blocks() {
        let mut live = LiveIds::default();
        for seq in [0, 1, 63, 64, 4095, 4096, 1 << 40] {
            assert!(live.insert(seq));
        }
        assert!(!live.insert(64), "already there");
        assert_eq!(live.len(), 7);
        assert!(live.contains(4095) && !live.contains(4094) && !live.contains(2));
        assert!(live.remove(1 << 40) && !live.remove(1 << 40));
        assert_eq!(live.blocks.len(), 2, "the emptied block is freed");
        for seq in [0, 1, 63, 64, 4095] {
            live.remove(seq);
        }
        assert_eq!((live.len(), live.blocks.len()), (1, 1));
    }

    #[derive(Debug, Clone)]
    enum MapOp {
        /// Inserts the next id (ascending), skipping `gap` ids.
        Append(u8),
        /// Inserts an id anywhere below the next one.
        Insert(u16),
        Remove(u16),
        Get(u16),
    }

    fn map_op() -> impl proptest::strategy::Strategy<Value = MapOp> {
        use proptest::prelude::*;
        prop_oneof![
            6 => any::<u8>().prop_map(|gap| MapOp::Append(gap % 4)),
            1 => any::<u16>().prop_map(MapOp::Insert),
            5 => any::<u16>().prop_map(MapOp::Remove),
            2 => any::<u16>().prop_map(MapOp::Get),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn an_ascending_id_map_behaves_like_a_hash_map(
            ops in proptest::collection::vec(map_op(), 1..6000)
        ) {
            let mut map = AscendingIdMap::default();
            let mut model = HashMap::new();
            let mut next = 1u64;
            let id = |seq: u64| MessageId::new(LeafId(1), seq);
            for (value, op) in ops.into_iter().enumerate() {
                match op {
                    MapOp::Append(gap) => {
                        next += u64::from(gap);
                        proptest::prop_assert_eq!(map.insert(id(next), value), model.insert(next, value));
                        next += 1;
                    }
                    MapOp::Insert(at) => {
                        let seq = 1 + u64::from(at) % next;
                        proptest::prop_assert_eq!(map.insert(id(seq), value), model.insert(seq, value));
                        next = next.max(seq + 1);
                    }
                    MapOp::Remove(at) => {
                        let seq = 1 + u64::from(at) % next;
                        proptest::prop_assert_eq!(map.remove(&id(seq)), model.remove(&seq));
                    }
                    MapOp::Get(at) => {
                        let seq = 1 + u64::from(at) % next;
                        proptest::prop_assert_eq!(map.get(&id(seq)), model.get(&seq));
                    }
                }
                proptest::prop_assert_eq!(map.len(), model.len());
            }
            for (seq, value) in &model {
                proptest::prop_assert_eq!(map.get(&id(*seq)), Some(value));
            }
        }
    }

    #[test]
    fn an_ascending_id_map_compacts_its_holes() {
        let mut map = AscendingIdMap::default();
        for seq in 1..=10_000u64 {
            map.insert(MessageId::new(LeafId(1), seq), seq);
        }
        // Two values in three go, but the first and last stay: holes in the middle.
        for seq in (2..10_000u64).filter(|seq| seq % 3 != 0) {
            assert_eq!(map.remove(&MessageId::new(LeafId(1), seq)), Some(seq));
        }
        assert_eq!(map.len(), 3335);
        assert!(
            map.ordered.len() < 10_000,
            "holes were compacted: {}",
            map.ordered.len()
        );
        assert!(map.holes <= map.ordered.len() / 2 + 1);
        assert_eq!(map.get(&MessageId::new(LeafId(1), 9_999)), Some(&9_999));
        assert!(map.others.is_empty(), "appends in order use the deque only");
    }
}
