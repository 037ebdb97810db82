//! Reserve-ahead at the root: keeping grants ready before pops ask, giving back the stale ones,
//! parking those whose leaf became unreachable.

use super::*;
use crate::downstream::Topic;
use crate::id::{LeafId, Receipt};
use crate::key::Key;
use crate::machine::ConnId;
use crate::time::Time;
use crate::wire::{Release, ReserveItem, Wire};
use std::collections::BTreeMap;
use std::time::Duration;

impl Root {
    /// Reserves the topic's next certain entries into its reserve-ahead buffer, up to what
    /// recent demand asks for (see [`crate::ahead`]).
    pub(super) fn top_up(&mut self, now: Time, topic: &Topic) {
        let s = &self.settings;
        let lease_ms = s.topic_policy(topic).lease_timeout_ms;
        // A topic whose leases are short gets none: a held entry must leave its consumer most
        // of its lease.
        if s.reserve_ahead_max == 0 || lease_ms < s.reserve_ahead_hold_ms.saturating_mul(2) {
            return;
        }
        let (Some(buffer), Some(window)) = (
            self.ahead.buffers.get_mut(topic),
            self.children.windows.get_mut(topic),
        ) else {
            return;
        };
        if buffer.in_order {
            return;
        }
        buffer.demand.roll(now);
        let target = buffer
            .demand
            .target(self.ahead.round_trip_us, s.reserve_ahead_max);
        let mut groups: BTreeMap<(ConnId, LeafId), Vec<ReserveItem>> = BTreeMap::new();
        while buffer.len() < target {
            let Some((key, slot)) = window.first() else {
                break;
            };
            if !window.is_certain(&key)
                || self.ahead.bytes + u64::from(slot.size) > s.reserve_ahead_bytes_max
            {
                break;
            }
            window.take(&key);
            self.ahead.bytes += u64::from(slot.size);
            let sent = Sent {
                now,
                conn: self.direct.or(key.id.leaf(), slot.child),
                lease_ms,
            };
            let reservation = self
                .reservations
                .add(ReservedFor::Ahead, topic, key, slot, sent);
            buffer.outstanding.insert(key, reservation);
            groups
                .entry((slot.child, key.id.leaf()))
                .or_default()
                .push(ReserveItem { reservation, key });
        }
        self.counters.reserves += groups.len() as u64;
        self.counters.reserved_ahead +=
            groups.values().map(|items| items.len() as u64).sum::<u64>();
        self.outbox.extend(reserves(
            topic,
            lease_ms,
            groups,
            Some(window),
            &self.direct,
            true,
        ));
    }

    /// Moves buffered grants whose leaf has no route any more to [`ReserveAhead::parked`].
    pub(super) fn park_unreachable(&mut self) {
        let hold = Duration::from_millis(self.settings.reserve_ahead_hold_ms);
        for (topic, buffer) in self.ahead.buffers.iter_mut() {
            let unreachable: Vec<Key> = buffer
                .held
                .keys()
                .filter(|key| {
                    let leaf = key.id.leaf();
                    !self.direct.by_leaf.contains_key(&leaf) && self.children.route(leaf).is_err()
                })
                .copied()
                .collect();
            for key in unreachable {
                let held = buffer.held.remove(&key).expect("listed");
                self.ahead.bytes -= held.delivery.payload.len() as u64;
                self.ahead
                    .expiry
                    .remove(&(held.reserved_at + hold, key, topic.clone()));
                self.ahead
                    .parked
                    .push_back((key.id.leaf(), held.delivery.receipt()));
            }
        }
        let bound = PARKED_PER_AHEAD_MAX * self.settings.reserve_ahead_max.max(1) as usize;
        while self.ahead.parked.len() > bound {
            self.ahead.parked.pop_front();
        }
    }

    /// Gives parked grants back to their leaves that are reachable again.
    pub(super) fn release_parked(&mut self) {
        let mut by_leaf: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        let (children, direct) = (&self.children, &self.direct);
        self.ahead.parked.retain(|(leaf, receipt)| {
            if !direct.by_leaf.contains_key(leaf) && children.route(*leaf).is_err() {
                return true;
            }
            by_leaf.entry(*leaf).or_default().push(*receipt);
            false
        });
        for (leaf, receipts) in by_leaf {
            self.counters.ahead_released += receipts.len() as u64;
            if let Ok(child) = self.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
        }
    }

    /// Gives back buffered entries held for `reserve_ahead_hold_ms` (available again at their
    /// leaf, attempt returned).
    pub(super) fn release_stale_ahead(&mut self, now: Time) {
        let mut by_leaf: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        while let Some((at, _, _)) = self.ahead.expiry.first() {
            if *at > now {
                break;
            }
            let (_, key, topic) = self.ahead.expiry.pop_first().expect("present");
            let Some(buffer) = self.ahead.buffers.get_mut(&topic) else {
                continue;
            };
            if let Some(held) = buffer.held.remove(&key) {
                // Held unused for the whole hold time: the demand that asked for it is gone,
                // and refilling now would only lease and release again.
                buffer.demand.reset();
                self.ahead.bytes -= held.delivery.payload.len() as u64;
                self.counters.ahead_released += 1;
                by_leaf
                    .entry(key.id.leaf())
                    .or_default()
                    .push(held.delivery.receipt());
            }
            self.dirty.insert(topic);
        }
        for (leaf, receipts) in by_leaf {
            if let Ok(child) = self.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
        }
    }
}
