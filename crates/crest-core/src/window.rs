//! The window of one topic at a parent (aggregator or root): the entries its children offered.
//!
//! Each entry remembers the child it came from. Each child's latest frontier is kept too: a
//! lower bound on every entry of the topic in that child's subtree that the parent does not
//! hold. An entry more urgent than every child's frontier is *certain*: no entry anywhere below
//! can beat it. The root serves certain entries at once and gives a child whose window is
//! being refilled a short, bounded time before it serves an uncertain one.

use crate::id::ConnId;
use crate::key::Key;
use crate::time::Time;
use crate::wire::{Offer, OfferEntry};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// Where an entry came from and how big its payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The child connection that offered it.
    pub(crate) child: ConnId,
    /// Payload size in bytes.
    pub(crate) size: u32,
    /// When the leaf offered the message.
    pub(crate) since: Time,
}

#[derive(Debug, Default)]
struct ChildView {
    /// Entries of this child in the window.
    held: u32,
    /// The child's latest frontier.
    frontier: Option<Key>,
    /// The number of the child's latest offer applied.
    applied: u64,
}

/// What applying an offer changed.
#[derive(Debug, Default)]
pub(crate) struct WindowDelta {
    /// Entries removed by retracts.
    pub(crate) removed: Vec<Key>,
    /// Entries added.
    pub(crate) added: Vec<OfferEntry>,
    /// Adds refused because the child was over its credit (a protocol violation).
    pub(crate) refused: usize,
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Window {
    entries: BTreeMap<Key, Slot>,
    children: HashMap<ConnId, ChildView>,
}

impl Window {
    /// Applies a child's offer: retracts first, then adds within `credits`, then the frontier.
    pub(crate) fn apply(&mut self, child: ConnId, offer: &Offer, credits: u32) -> WindowDelta {
        let mut delta = WindowDelta::default();
        let view = self.children.entry(child).or_default();
        for key in &offer.retracts {
            // A retract of an entry the parent already took (reserved) finds nothing: fine.
            if self
                .entries
                .get(key)
                .is_some_and(|slot| slot.child == child)
            {
                self.entries.remove(key);
                view.held -= 1;
                delta.removed.push(*key);
            }
        }
        for entry in &offer.adds {
            if view.held >= credits || self.entries.contains_key(&entry.key) {
                delta.refused += 1;
                continue;
            }
            self.entries.insert(
                entry.key,
                Slot {
                    child,
                    size: entry.size,
                    since: entry.since,
                },
            );
            view.held += 1;
            delta.added.push(*entry);
        }
        view.frontier = offer.frontier;
        view.applied = offer.seq;
        delta
    }

    /// Removes an entry (the parent reserved it); returns where it came from.
    pub(crate) fn take(&mut self, key: &Key) -> Option<Slot> {
        let slot = self.entries.remove(key)?;
        if let Some(view) = self.children.get_mut(&slot.child) {
            view.held -= 1;
        }
        Some(slot)
    }

    /// Puts back an entry taken from it (see the aggregator's notices) unless it is here
    /// again; its child must still be connected.
    pub(crate) fn restore(&mut self, key: Key, slot: Slot) -> bool {
        if self.entries.contains_key(&key) {
            return false;
        }
        self.children.entry(slot.child).or_default().held += 1;
        self.entries.insert(key, slot);
        true
    }

    /// The number of the latest offer applied from `child` (0: none).
    pub(crate) fn applied(&self, child: ConnId) -> u64 {
        self.children.get(&child).map_or(0, |view| view.applied)
    }

    /// Drops everything a child offered (its session ended); returns the removed keys.
    pub(crate) fn remove_child(&mut self, child: ConnId) -> Vec<Key> {
        if self.children.remove(&child).is_none() {
            return Vec::new();
        }
        let removed: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, slot)| slot.child == child)
            .map(|(key, _)| *key)
            .collect();
        for key in &removed {
            self.entries.remove(key);
        }
        removed
    }

    /// The lowest frontier of all children (`None`: no child has anything unoffered).
    pub(crate) fn min_frontier(&self) -> Option<Key> {
        self.children
            .values()
            .filter_map(|view| view.frontier)
            .min()
    }

    /// Whether `key` is more urgent than everything not in the window.
    pub(crate) fn is_certain(&self, key: &Key) -> bool {
        self.min_frontier().is_none_or(|frontier| *key < frontier)
    }

    /// The most urgent entry.
    pub(crate) fn first(&self) -> Option<(Key, Slot)> {
        self.entries
            .first_key_value()
            .map(|(key, slot)| (*key, *slot))
    }

    /// Number of entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Checks that each child holds at most `credits` entries and that the per-child counts add
    /// up to the entries held; panics naming what does not hold.
    pub(crate) fn check(&self, credits: u32) {
        let mut held: HashMap<ConnId, u32> = HashMap::default();
        for slot in self.entries.values() {
            *held.entry(slot.child).or_default() += 1;
        }
        for (child, view) in &self.children {
            let counted = held.remove(child).unwrap_or(0);
            assert_eq!(view.held, counted, "child {child}: entries held miscounted");
            assert!(
                view.held <= credits,
                "child {child} holds {} entries over {credits} credits",
                view.held
            );
        }
        assert!(
            held.is_empty(),
            "entries of children the window does not know: {held:?}"
        );
    }

    /// Whether the window holds nothing and knows of nothing below.
    pub(crate) fn is_idle(&self) -> bool {
        self.entries.is_empty() && self.min_frontier().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{LeafId, MessageId};
    use crate::wire::OfferEntry;

    fn offer(seqs: &[u64]) -> Offer {
        let entry = |seq: u64| OfferEntry {
            key: Key::new(1, Time(seq), MessageId::new(LeafId(1), seq)),
            size: 10,
            since: Time(seq),
            entered: Time(seq),
        };
        Offer {
            topic: "jobs".into(),
            adds: seqs.iter().copied().map(entry).collect(),
            retracts: Vec::new(),
            frontier: None,
            seq: 1,
        }
    }

    #[test]
    fn a_window_within_its_credits_passes_its_check() {
        let mut window = Window::default();
        let delta = window.apply(7, &offer(&[1, 2, 3]), 2);
        assert_eq!((delta.added.len(), delta.refused), (2, 1));
        window.check(2);
        window.take(&delta.added[0].key).expect("held");
        window.check(2);
    }

    #[test]
    #[should_panic(expected = "over 1 credits")]
    fn a_child_over_its_credits_is_caught() {
        let mut window = Window::default();
        window.apply(7, &offer(&[1, 2]), 2);
        window.check(1);
    }

    #[test]
    #[should_panic(expected = "entries held miscounted")]
    fn a_miscounted_child_is_caught() {
        let mut window = Window::default();
        window.apply(7, &offer(&[1, 2]), 2);
        window.children.get_mut(&7).expect("child").held = 1;
        window.check(2);
    }
}
