//! The priority key: the total order of ready messages.
//!
//! A key is `(priority, native, ready_at, id)` compared in that order, each ascending:
//! 1. `priority`: lower is more urgent (0 is the most urgent);
//! 2. `native`: `false` for a message that aging promoted into this priority, `true` for every
//!    other one, so that aged messages go ahead of the ones pushed (or reprioritized) at the
//!    priority they reached: aging then bounds a message's wait even while its new priority
//!    is flooded, since it waits behind the aged only, not behind the whole backlog;
//! 3. `ready_at`: the time the message became ready (`max(enqueued_at, deliver_after)`), so that
//!    messages of one priority leave in FIFO order;
//! 4. `id`: the message id, which breaks the remaining ties. Ids are unique, so two distinct
//!    messages never have equal keys, and within one leaf ids grow with arrival order.
//!
//! The derived `Ord` follows the field order, which is exactly this order (priority and
//! `native` are one field, `rank`).

use crate::id::MessageId;
use crate::time::Time;
use serde::{Deserialize, Serialize};

/// Named priority tiers. Any `u32` is a valid priority; these are conventions.
pub mod tier {
    /// The most urgent tier.
    pub const CRITICAL: u32 = 0;
    /// Urgent work.
    pub const HIGH: u32 = 1;
    /// The default tier.
    pub const NORMAL: u32 = 2;
    /// Work that can wait.
    pub const LOW: u32 = 3;
    /// Work done when nothing else is waiting.
    pub const BACKGROUND: u32 = 4;
}

/// The ordering key of a message (see the module doc for the order).
///
/// Priority and `native` are kept as one number, `rank` (`priority × 2 + native`), so that
/// the derived order compares three words, as it did before the flag: keys are compared on
/// every index and window operation. On the wire a key is `[rank, ready_at, id]`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(into = "(u64, Time, MessageId)", try_from = "(u64, Time, MessageId)")]
pub struct Key {
    rank: u64,
    /// When the message became ready.
    pub ready_at: Time,
    /// The message id: unique tie-break.
    pub id: MessageId,
}

impl From<Key> for (u64, Time, MessageId) {
    fn from(key: Key) -> Self {
        (key.rank, key.ready_at, key.id)
    }
}

impl TryFrom<(u64, Time, MessageId)> for Key {
    type Error = String;

    fn try_from((rank, ready_at, id): (u64, Time, MessageId)) -> Result<Key, String> {
        Key::from_rank(rank, ready_at, id).ok_or_else(|| format!("key rank {rank} out of range"))
    }
}

impl Key {
    /// The highest rank: priority `u32::MAX`, native.
    pub const RANK_MAX: u64 = (u32::MAX as u64) << 1 | 1;

    /// Lower is more urgent.
    pub fn priority(&self) -> u32 {
        (self.rank >> 1) as u32
    }

    /// `false` if aging promoted the message into its priority (it then goes ahead of the
    /// messages that were given that priority).
    pub fn native(&self) -> bool {
        self.rank & 1 == 1
    }

    /// Priority and `native` as one number (the wire's first field).
    pub fn rank(&self) -> u64 {
        self.rank
    }

    /// The key of rank `rank` (`None` past [`Key::RANK_MAX`]).
    pub fn from_rank(rank: u64, ready_at: Time, id: MessageId) -> Option<Key> {
        (rank <= Key::RANK_MAX).then_some(Key { rank, ready_at, id })
    }

    /// The key of a message given `priority` (not promoted into it by aging).
    pub fn new(priority: u32, ready_at: Time, id: MessageId) -> Key {
        Key {
            rank: u64::from(priority) << 1 | 1,
            ready_at,
            id,
        }
    }

    /// The key of a message that aging promoted into `priority`.
    pub fn aged(priority: u32, ready_at: Time, id: MessageId) -> Key {
        Key {
            rank: u64::from(priority) << 1,
            ready_at,
            id,
        }
    }

    /// The smallest key of `priority` (the first aged one, if any).
    pub fn first_of(priority: u32) -> Key {
        Key::aged(priority, Time::ZERO, MessageId(0))
    }

    /// Encodes the key as 21 big-endian bytes whose lexicographic order equals the key order.
    pub fn to_bytes(&self) -> [u8; 21] {
        let mut bytes = [0u8; 21];
        bytes[..4].copy_from_slice(&self.priority().to_be_bytes());
        bytes[4] = u8::from(self.native());
        bytes[5..13].copy_from_slice(&self.ready_at.0.to_be_bytes());
        bytes[13..].copy_from_slice(&self.id.0.to_be_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(priority: u32, ready_at: u64, id: u64) -> Key {
        Key::new(priority, Time(ready_at), MessageId(id))
    }

    fn key_of(priority: u32, native: bool, ready_at: u64, id: u64) -> Key {
        match native {
            true => key(priority, ready_at, id),
            false => Key::aged(priority, Time(ready_at), MessageId(id)),
        }
    }

    #[test]
    fn priority_then_ready_time_then_id() {
        assert!(
            key(0, 9, 9) < key(1, 0, 0),
            "lower priority value is more urgent"
        );
        assert!(
            key(1, 1, 9) < key(1, 2, 0),
            "same priority: earlier ready first (FIFO)"
        );
        assert!(key(1, 1, 1) < key(1, 1, 2), "id breaks ties");
    }

    #[test]
    fn aged_messages_go_ahead_of_their_new_priority_only() {
        let aged = Key::aged(1, Time(9), MessageId(9));
        assert!(aged < key(1, 0, 0), "ahead of the natives of its priority");
        assert!(key(0, 9, 9) < aged, "behind every more urgent priority");
        assert!(aged < key(2, 0, 0));
        assert!(
            Key::aged(1, Time(1), MessageId(9)) < aged,
            "aged among aged: FIFO"
        );
        assert!(Key::first_of(1) <= aged && Key::first_of(1) < key(1, 0, 0));
        assert_eq!((aged.priority(), aged.native()), (1, false));
    }

    #[test]
    fn a_rank_past_the_highest_priority_is_refused() {
        let max = Key::new(u32::MAX, Time(1), MessageId(1));
        let want = (u32::MAX, true, Key::RANK_MAX);
        assert_eq!((max.priority(), max.native(), max.rank()), want);
        assert_eq!(
            Key::from_rank(Key::RANK_MAX, Time(1), MessageId(1)),
            Some(max)
        );
        assert_eq!(
            Key::from_rank(Key::RANK_MAX + 1, Time(1), MessageId(1)),
            None
        );
        let wire = rmp_serde::to_vec(&(Key::RANK_MAX + 1, 1u64, 1u64)).unwrap();
        assert!(
            rmp_serde::from_slice::<Key>(&wire).is_err(),
            "refused when decoded"
        );
        let wire = rmp_serde::to_vec(&max).unwrap();
        assert_eq!(rmp_serde::from_slice::<Key>(&wire).unwrap(), max);
    }

    proptest! {
        #[test]
        fn byte_encoding_preserves_the_order(
            a in (any::<u32>(), any::<bool>(), any::<u64>(), any::<u64>()),
            b in (any::<u32>(), any::<bool>(), any::<u64>(), any::<u64>()),
        ) {
            let (ka, kb) = (key_of(a.0, a.1, a.2, a.3), key_of(b.0, b.1, b.2, b.3));
            prop_assert_eq!(ka.cmp(&kb), ka.to_bytes().cmp(&kb.to_bytes()));
        }

        #[test]
        fn order_is_total_and_antisymmetric(
            a in (0u32..4, any::<bool>(), 0u64..4, 0u64..4),
            b in (0u32..4, any::<bool>(), 0u64..4, 0u64..4),
        ) {
            let (ka, kb) = (key_of(a.0, a.1, a.2, a.3), key_of(b.0, b.1, b.2, b.3));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), kb.cmp(&ka).reverse());
        }

        #[test]
        fn order_is_the_fields_order(
            a in (any::<u32>(), any::<bool>(), any::<u64>(), any::<u64>()),
            b in (any::<u32>(), any::<bool>(), any::<u64>(), any::<u64>()),
        ) {
            let (ka, kb) = (key_of(a.0, a.1, a.2, a.3), key_of(b.0, b.1, b.2, b.3));
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }
    }
}
