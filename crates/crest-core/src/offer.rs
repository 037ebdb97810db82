//! The offered set of one topic: what a child (leaf or aggregator) lets its parent hold.
//!
//! A child keeps its candidates (available messages at a leaf, window entries at an
//! aggregator) split in two: `offered`, held by the parent, and `unoffered`. The rule is that
//! `offered` is always the `credits` most urgent candidates:
//! - it fills up to `credits` with the most urgent unoffered candidates;
//! - when an unoffered candidate is strictly more urgent than the least urgent offered one,
//!   the two swap: the worst is retracted and the better one offered. Credits therefore never
//!   let a less urgent entry block a more urgent one (ARCHITECTURE.md, "Bubble-up").
//!
//! Changes accumulate as a diff (adds and retracts that cancel each other out) until the
//! owner polls them into an [`Offer`]. The parent holds exactly the union of the adds minus
//! the retracts it received, minus what it took itself (by reserving); both sides apply the
//! same operations in stream order, so their views converge and the parent never holds more
//! than `credits` entries of this child.
//!
//! One race needs care: the parent takes an entry (its `Reserve` is on the way down) while the
//! child, having retracted and re-offered the same entry, has a new add of it on the way up.
//! The parent would then hold the re-added entry after taking it: a ghost that uses a credit
//! for ever. Offers are therefore numbered, and a `Reserve` carries the last number the parent
//! applied; when the entry's latest add is newer than that, [`OfferSet::take`] retracts it
//! instead of dropping it silently.

use crate::key::Key;
use crate::sorted::SortedMap;
use crate::time::Time;
use crate::wire::{Offer, OfferEntry};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// When a child sends the offer changes it gathered for a topic (see the settings
/// `offer_linger_us`, `offer_batch_entries`, `offer_urgent_flush`).
///
/// Changes go at once when they are urgent ([`OfferSet::is_urgent`]), when `batch` of them
/// are waiting, or when the caller forces it (the linger ran out, or a reserve took entries
/// and the parent must be refilled before the answer); otherwise they wait up to `linger`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlushPolicy {
    linger: std::time::Duration,
    batch: usize,
    urgent: bool,
}

impl FlushPolicy {
    pub(crate) fn new(settings: &crate::config::Settings) -> FlushPolicy {
        FlushPolicy {
            linger: std::time::Duration::from_micros(settings.offer_linger_us),
            batch: settings.offer_batch_entries.max(1) as usize,
            urgent: settings.offer_urgent_flush,
        }
    }

    /// Whether `set`'s diff (with the child's whole frontier now `frontier`) goes now.
    pub(crate) fn due<V: Offerable>(
        &self,
        set: &OfferSet<V>,
        frontier: Option<Key>,
        force: bool,
    ) -> bool {
        force
            || self.linger.is_zero()
            || set.pending_len() >= self.batch
            || (self.urgent && set.is_urgent(frontier))
    }

    /// When changes that start waiting at `now` must be sent at the latest.
    pub(crate) fn deadline(&self, now: Time) -> Time {
        now + self.linger
    }
}

/// What a candidate carries besides its key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Candidate {
    /// Payload size in bytes.
    pub(crate) size: u32,
    /// When the leaf offered the message (start of bubble-up latency).
    pub(crate) since: Time,
    /// When this node got it.
    pub(crate) entered: Time,
}

/// What an offer set holds per candidate: tells what the parent is told of it.
pub(crate) trait Offerable: Copy + std::fmt::Debug {
    /// The candidate as offered at `now`.
    fn candidate(&self, now: Time) -> Candidate;
}

impl Offerable for Candidate {
    fn candidate(&self, _now: Time) -> Candidate {
        *self
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pending {
    Add(Candidate),
    Retract,
}

/// See the module doc.
#[derive(Debug)]
pub(crate) struct OfferSet<V = Candidate> {
    /// Candidates the parent holds.
    offered: BTreeMap<Key, V>,
    /// Candidates the parent does not hold (at a leaf, most of its queued messages).
    unoffered: SortedMap<Key, V>,
    /// Candidates kept back: never offered until released (a FIFO topic's messages whose
    /// group has one leased), nor counted in the frontier, as they cannot be served now.
    held: BTreeMap<Key, V>,
    /// Changes not yet sent (sorted when sent).
    pending: HashMap<Key, Pending>,
    /// The frontier last sent on the current session (`None`: nothing sent yet).
    sent_frontier: Option<Option<Key>>,
    /// Number of the last offer polled on the current session.
    seq: u64,
    /// For entries whose last change sent to the parent was an add: the offer that carried it.
    sent_in: HashMap<Key, u64>,
    /// Swaps made (a better candidate displaced an offered one), for the node's counters.
    pub(crate) swaps: u64,
    /// Rebalances that left candidates unoffered for want of credit.
    pub(crate) credit_stalls: u64,
}

impl<V> Default for OfferSet<V> {
    fn default() -> Self {
        OfferSet {
            offered: BTreeMap::new(),
            unoffered: SortedMap::default(),
            held: BTreeMap::new(),
            pending: HashMap::default(),
            sent_frontier: None,
            seq: 0,
            sent_in: HashMap::default(),
            swaps: 0,
            credit_stalls: 0,
        }
    }
}

impl<V> OfferSet<V> {
    /// An empty set whose offers are numbered on from `seq`: a stream that takes over the name
    /// of one dropped before, so that the parent's view of the name's numbers never goes back
    /// (see [`OfferSet::take`]).
    pub(crate) fn numbered_from(seq: u64) -> OfferSet<V> {
        OfferSet {
            seq,
            ..OfferSet::default()
        }
    }

    /// The number of the last offer polled.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }
}

impl<V: Offerable> OfferSet<V> {
    /// A set whose candidates are all unoffered (recovery), built in bulk from `entries`
    /// sorted by key.
    pub(crate) fn from_sorted(entries: Vec<(Key, V)>) -> OfferSet<V> {
        OfferSet {
            unoffered: SortedMap::from_sorted(entries),
            ..OfferSet::default()
        }
    }

    /// The candidate of `key`, offered or not.
    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        self.offered
            .get(key)
            .or_else(|| self.unoffered.get(key))
            .or_else(|| self.held.get(key))
    }

    /// The candidate of `key`, offered or not, to change in place (not its key).
    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        match self.offered.get_mut(key) {
            Some(value) => Some(value),
            None => match self.unoffered.get_mut(key) {
                Some(value) => Some(value),
                None => self.held.get_mut(key),
            },
        }
    }

    /// Every candidate, offered ones first, then unoffered and held ones, each part in key
    /// order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.offered
            .iter()
            .chain(self.unoffered.iter())
            .chain(self.held.iter())
    }

    /// Up to `max` keys from `from` on, offered or not (held ones too), in key order.
    pub(crate) fn keys_from(&self, from: &Key, max: usize) -> Vec<Key> {
        if !self.held.is_empty() {
            let mut keys: Vec<Key> = self
                .offered
                .range(from..)
                .map(|(k, _)| *k)
                .take(max)
                .collect();
            keys.extend(self.unoffered.range_from(from).map(|(k, _)| *k).take(max));
            keys.extend(self.held.range(from..).map(|(k, _)| *k).take(max));
            keys.sort_unstable();
            keys.truncate(max);
            return keys;
        }
        let mut offered = self.offered.range(from..).map(|(k, _)| *k).peekable();
        let mut unoffered = self.unoffered.range_from(from).map(|(k, _)| *k).peekable();
        let mut keys = Vec::new();
        while keys.len() < max {
            let next = match (offered.peek(), unoffered.peek()) {
                (Some(a), Some(b)) if a < b => offered.next(),
                (Some(_), None) => offered.next(),
                (_, Some(_)) => unoffered.next(),
                (None, None) => None,
            };
            let Some(key) = next else { break };
            keys.push(key);
        }
        keys
    }

    /// Adds a candidate (not offered until the next [`OfferSet::rebalance`]).
    pub(crate) fn insert(&mut self, key: Key, candidate: V) {
        let previous = self.unoffered.insert(key, candidate);
        debug_assert!(
            previous.is_none() && !self.offered.contains_key(&key),
            "{key:?} twice"
        );
    }

    /// Removes a candidate the child itself gave up; retracts it if the parent holds it.
    /// Returns it, if it was a candidate.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        if let Some(value) = self.unoffered.remove(key) {
            return Some(value);
        }
        if let Some(value) = self.offered.remove(key) {
            self.note(*key, Pending::Retract);
            return Some(value);
        }
        self.sent_in.remove(key);
        self.held.remove(key)
    }

    /// Removes a candidate the parent reserved, having applied our offers up to `applied`
    /// (see the module doc). Returns it, if it was a candidate.
    pub(crate) fn take(&mut self, key: &Key, applied: u64) -> Option<V> {
        if let Some(value) = self.offered.remove(key) {
            match (self.pending.get(key), self.sent_in.remove(key)) {
                // Its latest add is unsent: the parent held an older copy or none, and will
                // not hear of this one.
                (Some(Pending::Add(_)), _) => {
                    self.pending.remove(key);
                }
                // The parent applied our latest add of it, so it held it and took it.
                (_, Some(seq)) if seq <= applied => {}
                // Our latest add of it is on the way: the parent will hold it again.
                _ => self.note(*key, Pending::Retract),
            }
            return Some(value);
        }
        self.sent_in.remove(key);
        if let Some(value) = self.held.remove(key) {
            // The parent took it before the retract of its hold reached it: nothing is left
            // there to retract.
            if matches!(self.pending.get(key), Some(Pending::Retract)) {
                self.pending.remove(key);
            }
            return Some(value);
        }
        self.unoffered.remove(key)
    }

    /// Keeps candidate `key` back (retracted if the parent holds it) until
    /// [`OfferSet::release`]. Whether it was a candidate not held already.
    pub(crate) fn hold(&mut self, key: &Key) -> bool {
        let value = match self.unoffered.remove(key) {
            Some(value) => value,
            None => match self.offered.remove(key) {
                Some(value) => {
                    self.note(*key, Pending::Retract);
                    value
                }
                None => return false,
            },
        };
        self.held.insert(*key, value);
        true
    }

    /// Makes held candidate `key` a candidate again (offered at the next
    /// [`OfferSet::rebalance`]). Whether it was held.
    pub(crate) fn release(&mut self, key: &Key) -> bool {
        let Some(value) = self.held.remove(key) else {
            return false;
        };
        self.unoffered.insert(*key, value);
        true
    }

    /// The candidates held back.
    pub(crate) fn held_keys(&self) -> impl Iterator<Item = &Key> {
        self.held.keys()
    }

    /// Restores the rule of the module doc for `credits` (0 when there is no parent session);
    /// without `swap`, offered entries stay until taken or retracted, whatever arrives.
    /// Entries offered now are offered as of `now` (see [`Offerable`]).
    pub(crate) fn rebalance(&mut self, credits: u32, swap: bool, now: Time) {
        let credits = credits as usize;
        while self.offered.len() > credits {
            let (key, candidate) = self.offered.pop_last().expect("non-empty");
            self.unoffered.insert(key, candidate);
            self.note(key, Pending::Retract);
        }
        while self.offered.len() < credits {
            let Some((key, candidate)) = self.unoffered.pop_first() else {
                break;
            };
            self.offered.insert(key, candidate);
            self.note(key, Pending::Add(candidate.candidate(now)));
        }
        if !self.unoffered.is_empty() && credits > 0 {
            self.credit_stalls += 1;
        }
        // Swap while the best unoffered beats the worst offered; at most `credits` swaps.
        while swap
            && let (Some((&best, _)), Some((&worst, _))) = (
                self.unoffered.first_key_value(),
                self.offered.last_key_value(),
            )
        {
            if best >= worst {
                break;
            }
            let best_candidate = self.unoffered.remove(&best).expect("present");
            let worst_candidate = self.offered.remove(&worst).expect("present");
            self.offered.insert(best, best_candidate);
            self.unoffered.insert(worst, worst_candidate);
            self.note(worst, Pending::Retract);
            self.note(best, Pending::Add(best_candidate.candidate(now)));
            self.swaps += 1;
        }
    }

    fn note(&mut self, key: Key, op: Pending) {
        match (self.pending.get(&key), op) {
            // An add and a retract of one key in one diff cancel out.
            (Some(Pending::Add(_)), Pending::Retract)
            | (Some(Pending::Retract), Pending::Add(_)) => {
                self.pending.remove(&key);
            }
            _ => {
                self.pending.insert(key, op);
            }
        }
    }

    /// Whether the unsent diff must go at once rather than linger, for a child whose whole
    /// frontier is now `frontier`:
    /// - nothing was sent yet on the current session (the parent knows nothing of this child);
    /// - the frontier moved down (more urgent): the parent's certainty depends on it;
    /// - an add would enter the front of what the parent holds from this child: it is more
    ///   urgent than every entry the parent already holds from it (or it holds none).
    pub(crate) fn is_urgent(&self, frontier: Option<Key>) -> bool {
        let Some(sent) = self.sent_frontier else {
            return true;
        };
        // `None` is "nothing unoffered": above every key.
        let lower = match (frontier, sent) {
            (Some(now), Some(before)) => now < before,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if lower {
            return true;
        }
        let best_add = self
            .pending
            .iter()
            .filter_map(|(key, op)| matches!(op, Pending::Add(_)).then_some(*key))
            .min();
        let Some(best_add) = best_add else {
            return false;
        };
        // The parent's best entry from us: the first offered one whose add was sent.
        let held_best = self
            .offered
            .keys()
            .find(|key| !matches!(self.pending.get(key), Some(Pending::Add(_))));
        held_best.is_none_or(|held| best_add < *held)
    }

    /// Number of changes waiting to be sent.
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The most urgent candidate the parent does not hold.
    pub(crate) fn best_unoffered(&self) -> Option<Key> {
        self.unoffered.first_key_value().map(|(key, _)| *key)
    }

    /// Takes the pending diff as an [`Offer`] for `topic`, if there is anything to send.
    /// `frontier` is the child's whole frontier (see [`Offer::frontier`]).
    pub(crate) fn poll(&mut self, topic: &str, frontier: Option<Key>) -> Option<Offer> {
        if self.pending.is_empty() && self.sent_frontier == Some(frontier) {
            return None;
        }
        self.seq += 1;
        let mut adds = Vec::new();
        let mut retracts = Vec::new();
        let mut pending: Vec<(Key, Pending)> = self.pending.drain().collect();
        pending.sort_unstable_by_key(|(key, _)| *key);
        for (key, op) in pending {
            match op {
                Pending::Add(candidate) => {
                    self.sent_in.insert(key, self.seq);
                    adds.push(OfferEntry {
                        key,
                        size: candidate.size,
                        since: candidate.since,
                        entered: candidate.entered,
                    });
                }
                Pending::Retract => {
                    self.sent_in.remove(&key);
                    retracts.push(key);
                }
            }
        }
        self.sent_frontier = Some(frontier);
        Some(Offer {
            topic: topic.to_string(),
            adds,
            retracts,
            frontier,
            seq: self.seq,
        })
    }

    /// The parent session ended: nothing is held by a parent any more.
    pub(crate) fn reset(&mut self) {
        let offered = std::mem::take(&mut self.offered);
        self.unoffered.extend(offered);
        self.pending.clear();
        self.sent_frontier = None;
        self.seq = 0;
        self.sent_in.clear();
    }

    /// Number of candidates, offered or not, held ones included.
    pub(crate) fn len(&self) -> usize {
        self.offered.len() + self.unoffered.len() + self.held.len()
    }

    /// Number of candidates the parent holds.
    pub(crate) fn offered_len(&self) -> usize {
        self.offered.len()
    }

    /// Whether nothing is a candidate and nothing is left to send.
    pub(crate) fn is_idle(&self) -> bool {
        self.len() == 0
            && self.pending.is_empty()
            && matches!(self.sent_frontier, None | Some(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::MessageId;

    fn c(size: u32) -> Candidate {
        Candidate {
            size,
            since: Time(0),
            entered: Time(0),
        }
    }

    fn key(priority: u32, id: u64) -> Key {
        Key::new(priority, Time(0), MessageId(id))
    }

    #[test]
    fn offers_the_most_urgent_within_credits_and_swaps_in_better_entries() {
        let mut set: OfferSet = OfferSet::default();
        for id in 1..=5 {
            set.insert(key(5, id), c(10));
        }
        set.rebalance(3, true, Time(0));
        let offer = set.poll("t", set.best_unoffered()).unwrap();
        let added: Vec<u64> = offer.adds.iter().map(|e| e.key.id.0).collect();
        assert_eq!(added, vec![1, 2, 3]);
        assert_eq!(offer.frontier, Some(key(5, 4)));

        // A more urgent arrival displaces the least urgent offered entry.
        set.insert(key(0, 9), c(10));
        set.rebalance(3, true, Time(0));
        let offer = set.poll("t", set.best_unoffered()).unwrap();
        assert_eq!(
            offer.adds.iter().map(|e| e.key).collect::<Vec<_>>(),
            vec![key(0, 9)]
        );
        assert_eq!(offer.retracts, vec![key(5, 3)]);
        assert_eq!(set.offered_len(), 3);
    }

    #[test]
    fn add_then_retract_in_one_diff_cancels() {
        let mut set: OfferSet = OfferSet::default();
        set.insert(key(1, 1), c(1));
        set.rebalance(1, true, Time(0));
        assert!(set.remove(&key(1, 1)).is_some());
        let offer = set.poll("t", None).unwrap();
        assert!(offer.adds.is_empty() && offer.retracts.is_empty());
        assert!(set.poll("t", None).is_none(), "nothing new to say");
    }

    #[test]
    fn taken_entries_free_credit_without_a_retract() {
        let mut set: OfferSet = OfferSet::default();
        for id in 1..=3 {
            set.insert(key(1, id), c(1));
        }
        set.rebalance(2, true, Time(0));
        set.poll("t", set.best_unoffered());
        assert!(set.take(&key(1, 1), 1).is_some());
        set.rebalance(2, true, Time(0));
        let offer = set.poll("t", set.best_unoffered()).unwrap();
        assert!(offer.retracts.is_empty());
        assert_eq!(offer.adds[0].key, key(1, 3));
        assert_eq!(offer.frontier, None);
    }

    #[test]
    fn reset_makes_everything_unoffered_and_reoffers_on_the_next_session() {
        let mut set: OfferSet = OfferSet::default();
        set.insert(key(1, 1), c(1));
        set.rebalance(4, true, Time(0));
        set.poll("t", None);
        set.reset();
        assert_eq!(set.offered_len(), 0);
        set.rebalance(4, true, Time(0));
        let offer = set.poll("t", None).unwrap();
        assert_eq!(offer.adds.len(), 1);
    }
}
