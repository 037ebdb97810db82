//! The priority key: the total order of ready messages.
//!
//! A key is `(priority, ready_at, id)` compared in that order, each ascending:
//! 1. `priority`: lower is more urgent (0 is the most urgent);
//! 2. `ready_at`: the time the message became ready (`max(enqueued_at, deliver_after)`), so that
//!    messages of one priority leave in FIFO order;
//! 3. `id`: the message id, which breaks the remaining ties. Ids are unique, so two distinct
//!    messages never have equal keys, and within one leaf ids grow with arrival order.
//!
//! The derived `Ord` follows the field order, which is exactly this order.

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
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct Key {
    /// Lower is more urgent.
    pub priority: u32,
    /// When the message became ready.
    pub ready_at: Time,
    /// The message id: unique tie-break.
    pub id: MessageId,
}

impl Key {
    /// Encodes the key as 20 big-endian bytes whose lexicographic order equals the key order.
    pub fn to_bytes(&self) -> [u8; 20] {
        let mut bytes = [0u8; 20];
        bytes[..4].copy_from_slice(&self.priority.to_be_bytes());
        bytes[4..12].copy_from_slice(&self.ready_at.0.to_be_bytes());
        bytes[12..].copy_from_slice(&self.id.0.to_be_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(priority: u32, ready_at: u64, id: u64) -> Key {
        Key {
            priority,
            ready_at: Time(ready_at),
            id: MessageId(id),
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

    proptest! {
        #[test]
        fn byte_encoding_preserves_the_order(
            a in (any::<u32>(), any::<u64>(), any::<u64>()),
            b in (any::<u32>(), any::<u64>(), any::<u64>()),
        ) {
            let (ka, kb) = (key(a.0, a.1, a.2), key(b.0, b.1, b.2));
            prop_assert_eq!(ka.cmp(&kb), ka.to_bytes().cmp(&kb.to_bytes()));
        }

        #[test]
        fn order_is_total_and_antisymmetric(
            a in (0u32..4, 0u64..4, 0u64..4),
            b in (0u32..4, 0u64..4, 0u64..4),
        ) {
            let (ka, kb) = (key(a.0, a.1, a.2), key(b.0, b.1, b.2));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), kb.cmp(&ka).reverse());
        }
    }
}
