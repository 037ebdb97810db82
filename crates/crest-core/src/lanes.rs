//! Lanes: how the tiers of a `weighted` topic travel up the tree, each as a topic of its own.
//!
//! A `strict` topic is one lane named as the topic. A `weighted` topic (see
//! [`crate::config::Weights`]) is one lane per tier, named `TOPIC` + `\u{1}` + `TIER:WEIGHT`
//! (the weight in thousandths). Each lane has the offered set, credits, frontier, window and
//! certainty of a topic, so:
//! - a flood in one tier cannot take the credits of another: every tier with ready messages
//!   has its most urgent ones at the root;
//! - an entry is *certain* within its tier when it is more urgent than every child's frontier
//!   of that tier's lane — the tree's ordering guarantee, per tier;
//! - aggregators relay lanes as topics without knowing of them.
//!
//! The root serves a weighted topic's pops from its lanes: it picks the lane by stride
//! scheduling among the lanes whose best entry it may serve (see `root::pop`), then that
//! lane's best entry.

use crate::config::{Settings, Weights};
use crate::id::MessageId;
use crate::key::Key;
use crate::offer::{OfferSet, Offerable};
use crate::time::Time;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Separates a weighted topic's name from its lane's tier and weight, and those from a
/// fairness key's weight and name (a control character: never in a topic's name nor a key).
pub(crate) const SEPARATOR: char = '\u{1}';

/// The weight of a fairness key that has none set, in thousandths (all keys equal).
pub(crate) const KEY_WEIGHT_MILLI: u32 = 1000;

/// A lane's name, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneName<'a> {
    /// The topic the lane belongs to.
    pub(crate) topic: &'a str,
    /// The tier's first priority (`None`: the one lane of a strict topic).
    pub(crate) tier: Option<u32>,
    /// The tier's weight in thousandths (0 for a strict topic's lane).
    pub(crate) weight_milli: u32,
    /// The fairness key whose messages of the tier the lane holds, with its weight in
    /// thousandths (`None`: the tier's lane for messages without a key of their own).
    pub(crate) key: Option<(&'a str, u32)>,
}

/// The name of `topic`'s lane for `tier` of weight `weight_milli`.
pub(crate) fn lane_name(topic: &str, tier: u32, weight_milli: u32) -> String {
    format!("{topic}{SEPARATOR}{tier}:{weight_milli}")
}

/// The name of `topic`'s lane for the messages of fairness key `key` (of weight
/// `key_weight_milli`) in `tier` of weight `weight_milli`.
pub(crate) fn key_lane_name(
    topic: &str,
    tier: u32,
    weight_milli: u32,
    key: &str,
    key_weight_milli: u32,
) -> String {
    format!("{topic}{SEPARATOR}{tier}:{weight_milli}{SEPARATOR}{key_weight_milli}:{key}")
}

/// Reads `TIER:WEIGHT` (or `WEIGHT:KEY`): a number and a positive weight.
fn pair(text: &str) -> Option<(&str, &str)> {
    text.split_once(':')
}

/// Reads a lane's name (a topic's name is its strict lane's). `None`: a malformed suffix.
pub(crate) fn parse(name: &str) -> Option<LaneName<'_>> {
    let Some((topic, suffix)) = name.split_once(SEPARATOR) else {
        return Some(LaneName {
            topic: name,
            tier: None,
            weight_milli: 0,
            key: None,
        });
    };
    let (tier, key) = match suffix.split_once(SEPARATOR) {
        Some((tier, key)) => (tier, Some(key)),
        None => (suffix, None),
    };
    let (tier, weight) = pair(tier)?;
    let weight_milli: u32 = weight.parse().ok()?;
    (weight_milli > 0).then_some(())?;
    let key = match key {
        None => None,
        Some(key) => {
            let (weight, key) = pair(key)?;
            let weight: u32 = weight.parse().ok()?;
            (weight > 0 && !key.is_empty() && !key.contains(SEPARATOR)).then_some(())?;
            Some((key, weight))
        }
    };
    Some(LaneName {
        topic,
        tier: Some(tier.parse().ok()?),
        weight_milli,
        key,
    })
}

/// The topic a lane belongs to.
pub(crate) fn topic_of(name: &str) -> &str {
    name.split_once(SEPARATOR).map_or(name, |(topic, _)| topic)
}

/// Whether `name` is a fairness key's lane (whose credit is `credits_per_key`).
pub(crate) fn is_key_lane(name: &str) -> bool {
    name.split(SEPARATOR).nth(2).is_some()
}

/// The credit of lane `name` at a parent that grants `per_topic` per topic and `per_key` per
/// fairness key's lane.
pub(crate) fn credit(name: &str, per_topic: u32, per_key: u32) -> u32 {
    if is_key_lane(name) {
        per_key.min(per_topic)
    } else {
        per_topic
    }
}

/// Checks a lane's name as offers carry it: a valid topic, and a well-formed suffix.
///
/// # Errors
/// A sentence naming the problem.
pub(crate) fn check(settings: &Settings, name: &str) -> Result<(), String> {
    let lane = parse(name).ok_or_else(|| format!("{name:?} is not a topic nor a lane of one"))?;
    if let Some((key, _)) = lane.key {
        settings.check_fairness_key(key)?;
    }
    settings.check_topic(lane.topic)
}

/// The weights of fairness keys that have one set, in thousandths (others weigh
/// [`KEY_WEIGHT_MILLI`]).
pub(crate) type KeyWeights = BTreeMap<Arc<str>, u32>;

/// One lane of a topic at a leaf.
#[derive(Debug)]
struct Lane<V> {
    /// Tier and weight (`None`: the strict lane).
    tier: Option<(u32, u32)>,
    /// The fairness key and its weight (`None`: the tier's lane for messages without one).
    key: Option<(Arc<str>, u32)>,
    set: OfferSet<V>,
}

impl<V: Offerable> Lane<V> {
    fn name<'a>(&self, topic: &'a str) -> std::borrow::Cow<'a, str> {
        match (&self.tier, &self.key) {
            (None, _) => topic.into(),
            (Some((tier, weight)), None) => lane_name(topic, *tier, *weight).into(),
            (Some((tier, weight)), Some((key, key_weight))) => {
                key_lane_name(topic, *tier, *weight, key, *key_weight).into()
            }
        }
    }
}

/// A lane as [`Lanes::lanes_mut`] hands it out.
pub(crate) struct LaneMut<'a, V> {
    /// Its name (what its offers carry).
    pub(crate) name: std::borrow::Cow<'a, str>,
    /// Whether it is a fairness key's lane (its credit is `credits_per_key`).
    pub(crate) keyed: bool,
    /// Its candidates.
    pub(crate) set: &'a mut OfferSet<V>,
}

/// A topic's available messages at a leaf, in lanes (see the module doc): each lane an
/// [`OfferSet`] of its own.
#[derive(Debug)]
pub(crate) struct Lanes<V> {
    /// The tiers and the weights of fairness keys (`None`: strict, one lane).
    policy: Option<(Weights, KeyWeights)>,
    /// One lane per tier, in tier order: the messages without a fairness key (and those of
    /// keys past `keys_max`).
    live: Vec<Lane<V>>,
    /// The lanes of fairness keys with ready messages, by tier (its index in `live`) and key.
    keyed: BTreeMap<(usize, Arc<str>), Lane<V>>,
    /// Most lanes in `keyed`.
    keys_max: usize,
    /// The fairness key of each of the topic's live messages that has one (any state: a
    /// message that becomes ready again goes back to its key's lane).
    keys: HashMap<MessageId, Arc<str>>,
    /// Each key in `keys`, shared, with the number of messages that have it.
    key_names: HashMap<Arc<str>, u64>,
    /// Lanes of tiers no longer in use (the topic's tiers changed) with retracts still to
    /// send: they hold no candidate, and go once idle.
    retired: Vec<Lane<V>>,
    /// The highest offer number of a lane dropped: a lane made later numbers on from it.
    seq_floor: u64,
    /// Swaps and credit stalls of dropped lanes.
    swaps_before: u64,
    stalls_before: u64,
}

impl<V> Default for Lanes<V> {
    fn default() -> Self {
        Lanes {
            policy: None,
            live: vec![Lane {
                tier: None,
                key: None,
                set: OfferSet::default(),
            }],
            keyed: BTreeMap::new(),
            keys_max: 0,
            keys: HashMap::default(),
            key_names: HashMap::default(),
            retired: Vec::new(),
            seq_floor: 0,
            swaps_before: 0,
            stalls_before: 0,
        }
    }
}

impl<V: Offerable> Lanes<V> {
    /// Empty lanes for `policy` (tiers and keys' weights; `None`: strict), giving at most
    /// `keys_max` fairness keys a lane of their own.
    pub(crate) fn new(policy: Option<(Weights, KeyWeights)>, keys_max: u32) -> Lanes<V> {
        let mut lanes = Lanes {
            keys_max: keys_max as usize,
            ..Lanes::default()
        };
        if policy.is_some() {
            lanes.set_policy(policy);
        }
        lanes
    }

    /// Strict lanes whose candidates are all unoffered, built in bulk from `entries` sorted by
    /// key (recovery), with the fairness keys of the topic's live messages.
    pub(crate) fn from_sorted(
        entries: Vec<(Key, V)>,
        keys: Vec<(MessageId, Arc<str>)>,
        keys_max: u32,
    ) -> Lanes<V> {
        let mut lanes = Lanes {
            keys_max: keys_max as usize,
            ..Lanes::default()
        };
        lanes.live[0].set = OfferSet::from_sorted(entries);
        for (id, key) in keys {
            lanes.set_key(id, &key);
        }
        lanes
    }

    /// The tiers and keys' weights in use (`None`: strict).
    pub(crate) fn policy(&self) -> Option<&(Weights, KeyWeights)> {
        self.policy.as_ref()
    }

    /// Gives message `id` fairness key `key` (before it is first inserted).
    pub(crate) fn set_key(&mut self, id: MessageId, key: &str) {
        let shared = match self.key_names.get_key_value(key) {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(key),
        };
        *self.key_names.entry(shared.clone()).or_default() += 1;
        if let Some(former) = self.keys.insert(id, shared) {
            self.unname(&former);
        }
    }

    /// Message `id` is gone: forgets its fairness key.
    pub(crate) fn forget_key(&mut self, id: MessageId) {
        if self.keys.is_empty() {
            return;
        }
        if let Some(key) = self.keys.remove(&id) {
            self.unname(&key);
        }
    }

    fn unname(&mut self, key: &Arc<str>) {
        if let Some(count) = self.key_names.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                self.key_names.remove(key);
            }
        }
    }

    /// The fairness key of message `id`, if it has one.
    pub(crate) fn key_of(&self, id: MessageId) -> Option<&Arc<str>> {
        if self.keys.is_empty() {
            return None;
        }
        self.keys.get(&id)
    }

    fn route(&self, priority: u32) -> usize {
        match &self.policy {
            None => 0,
            Some((weights, _)) => weights.milli.range(..=priority).count().saturating_sub(1),
        }
    }

    /// The fairness key lane that holds (or would hold) `key`'s candidate, if its message has
    /// a key and the topic is weighted.
    fn key_lane(&self, key: &Key) -> Option<(usize, Arc<str>)> {
        self.policy.as_ref()?;
        let name = self.key_of(key.id)?;
        Some((self.route(key.priority()), name.clone()))
    }

    /// Moves every candidate into the lanes of `policy` (tiers and keys' weights; `None`:
    /// strict); the parent is told to drop what it held of lanes no longer in use, and offered
    /// the new ones. A tier's lane whose name stays (or comes back while its retracts are
    /// unsent) keeps its offer stream: one stream per name, numbered on (see
    /// [`OfferSet::take`]). Keys' lanes are made anew (their names change with the weights).
    pub(crate) fn set_policy(&mut self, policy: Option<(Weights, KeyWeights)>) {
        if self.policy == policy {
            return;
        }
        self.policy = policy;
        // Held candidates stay held in their new lanes.
        let held: Vec<Key> = self
            .live
            .iter()
            .chain(self.keyed.values())
            .flat_map(|lane| lane.set.held_keys().copied())
            .collect();
        let tiers: Vec<Option<(u32, u32)>> = match &self.policy {
            None => vec![None],
            Some((weights, _)) => weights
                .milli
                .iter()
                .map(|(tier, weight)| Some((*tier, *weight)))
                .collect(),
        };
        let mut former: Vec<Lane<V>> = std::mem::take(&mut self.live);
        former.append(&mut self.retired);
        let floor = self.numbers_from(&former);
        self.live = tiers
            .into_iter()
            .map(|tier| {
                match former
                    .iter()
                    .position(|lane| lane.tier == tier && lane.key.is_none())
                {
                    Some(at) => former.swap_remove(at),
                    None => Lane {
                        tier,
                        key: None,
                        set: OfferSet::numbered_from(floor),
                    },
                }
            })
            .collect();
        // Every key's lane is renamed or goes: its candidates move like a retired tier's.
        former.extend(std::mem::take(&mut self.keyed).into_values());
        let mut moving = Vec::new();
        for mut lane in former {
            let keys: Vec<Key> = lane.set.iter().map(|(key, _)| *key).collect();
            for key in keys {
                moving.push((key, lane.set.remove(&key).expect("listed")));
            }
            self.retired.push(lane);
        }
        for at in 0..self.live.len() {
            let keys: Vec<Key> = self.live[at]
                .set
                .iter()
                .map(|(key, _)| *key)
                .filter(|key| self.route(key.priority()) != at || self.key_lane(key).is_some())
                .collect();
            for key in keys {
                moving.push((key, self.live[at].set.remove(&key).expect("listed")));
            }
        }
        for (key, value) in moving {
            self.insert(key, value);
        }
        for key in held {
            self.hold(&key);
        }
        self.drop_idle_retired();
    }

    /// The number a new lane's offers follow on from: past every lane dropped or about to be.
    fn numbers_from(&self, also: &[Lane<V>]) -> u64 {
        self.retired
            .iter()
            .chain(also)
            .map(|lane| lane.set.seq())
            .fold(self.seq_floor, u64::max)
    }

    /// The lanes that may hold `key`'s candidate: its key's lane first, then its tier's.
    fn holders(&self, key: &Key) -> (Option<(usize, Arc<str>)>, usize) {
        (self.key_lane(key), self.route(key.priority()))
    }

    /// The candidate of `key`.
    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        if self.keyed.is_empty() {
            return self.live[self.route(key.priority())].set.get(key);
        }
        let (keyed, tier) = self.holders(key);
        keyed
            .and_then(|at| self.keyed.get(&at))
            .and_then(|lane| lane.set.get(key))
            .or_else(|| self.live[tier].set.get(key))
    }

    /// The set that holds `key`'s candidate (its tier's when none does).
    fn holder_mut(&mut self, key: &Key) -> &mut OfferSet<V> {
        if self.keyed.is_empty() {
            let tier = self.route(key.priority());
            return &mut self.live[tier].set;
        }
        let (keyed, tier) = self.holders(key);
        if let Some(at) = keyed
            && self
                .keyed
                .get(&at)
                .is_some_and(|lane| lane.set.get(key).is_some())
        {
            return &mut self.keyed.get_mut(&at).expect("found").set;
        }
        &mut self.live[tier].set
    }

    /// Keeps `key`'s candidate back until [`Lanes::release`] (see [`OfferSet::hold`]).
    pub(crate) fn hold(&mut self, key: &Key) -> bool {
        self.holder_mut(key).hold(key)
    }

    /// Makes held candidate `key` a candidate again (see [`OfferSet::release`]).
    pub(crate) fn release(&mut self, key: &Key) -> bool {
        self.holder_mut(key).release(key)
    }

    /// The candidate of `key`, to change in place (not its key).
    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        self.holder_mut(key).get_mut(key)
    }

    /// Every candidate, lane by lane: tiers in order, then keys' lanes.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.live
            .iter()
            .chain(self.keyed.values())
            .flat_map(|lane| lane.set.iter())
    }

    /// Up to `max` keys from `from` on in `from`'s tier (its keys' lanes too), in key order.
    pub(crate) fn keys_from(&self, from: &Key, max: usize) -> Vec<Key> {
        let tier = self.route(from.priority());
        let mut keys = self.live[tier].set.keys_from(from, max);
        for ((at, _), lane) in &self.keyed {
            if *at == tier {
                keys.extend(lane.set.keys_from(from, max));
            }
        }
        keys.sort_unstable();
        keys.truncate(max);
        keys
    }

    /// When the candidate of `priority` that has been ready longest became ready: the first
    /// of its aged keys or of its native ones (one lookup in each lane of its tier).
    pub(crate) fn oldest_ready(&self, priority: u32) -> Option<Time> {
        let firsts = [
            Key::first_of(priority),
            Key::new(priority, Time::ZERO, MessageId(0)),
        ];
        firsts
            .iter()
            .filter_map(|from| self.keys_from(from, 1).first().copied())
            .filter(|key| key.priority() == priority)
            .map(|key| key.ready_at)
            .min()
    }

    /// Adds a candidate to its lane: its fairness key's (made if fewer than `keys_max` are),
    /// or its tier's.
    pub(crate) fn insert(&mut self, key: Key, candidate: V) {
        let tier = self.route(key.priority());
        if let Some(at) = self.key_lane(&key) {
            if let Some(lane) = self.keyed.get_mut(&at) {
                lane.set.insert(key, candidate);
                return;
            }
            if self.keyed.len() < self.keys_max {
                let weights = self.policy.as_ref().map(|(_, keys)| keys);
                let weight = weights.and_then(|keys| keys.get(&at.1)).copied();
                let mut lane = Lane {
                    tier: self.live[tier].tier,
                    key: Some((at.1.clone(), weight.unwrap_or(KEY_WEIGHT_MILLI))),
                    set: OfferSet::numbered_from(self.numbers_from(&[])),
                };
                lane.set.insert(key, candidate);
                self.keyed.insert(at, lane);
                return;
            }
        }
        self.live[tier].set.insert(key, candidate);
    }

    /// See [`OfferSet::remove`].
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        self.holder_mut(key).remove(key)
    }

    /// See [`OfferSet::take`].
    pub(crate) fn take(&mut self, key: &Key, applied: u64) -> Option<V> {
        self.holder_mut(key).take(key, applied)
    }

    /// Each lane with its name, retired lanes first (their retracts go before a new lane of
    /// the same name offers anything, as they are polled first on the next flush otherwise).
    pub(crate) fn lanes_mut<'a>(
        &'a mut self,
        topic: &'a str,
    ) -> impl Iterator<Item = LaneMut<'a, V>> {
        self.retired
            .iter_mut()
            .chain(self.live.iter_mut())
            .chain(self.keyed.values_mut())
            .map(move |lane| LaneMut {
                name: lane.name(topic),
                keyed: lane.key.is_some(),
                set: &mut lane.set,
            })
    }

    /// Drops the retired lanes, and the keys' lanes, that have nothing left to send.
    pub(crate) fn drop_idle_retired(&mut self) {
        let (mut swaps, mut stalls, mut seq) = (0, 0, self.seq_floor);
        let mut drop_idle = |lane: &Lane<V>| {
            let idle = lane.set.is_idle();
            if idle {
                swaps += lane.set.swaps;
                stalls += lane.set.credit_stalls;
                seq = seq.max(lane.set.seq());
            }
            !idle
        };
        self.retired.retain(&mut drop_idle);
        self.keyed.retain(|_, lane| drop_idle(lane));
        self.swaps_before += swaps;
        self.stalls_before += stalls;
        self.seq_floor = seq;
    }

    /// The parent session ended: nothing is held by a parent any more.
    pub(crate) fn reset(&mut self) {
        for lane in self.live.iter_mut().chain(self.keyed.values_mut()) {
            lane.set.reset();
        }
        for lane in self.retired.drain(..) {
            self.swaps_before += lane.set.swaps;
            self.stalls_before += lane.set.credit_stalls;
        }
        self.drop_idle_retired();
    }

    /// Number of candidates, offered or not.
    pub(crate) fn len(&self) -> usize {
        self.all().map(|lane| lane.set.len()).sum()
    }

    /// Number of candidates the parent holds.
    pub(crate) fn offered_len(&self) -> usize {
        self.all().map(|lane| lane.set.offered_len()).sum()
    }

    /// Every lane in use (not the retired).
    fn all(&self) -> impl Iterator<Item = &Lane<V>> {
        self.live.iter().chain(self.keyed.values())
    }

    /// Whether nothing is a candidate and nothing is left to send.
    pub(crate) fn is_idle(&self) -> bool {
        self.all()
            .chain(&self.retired)
            .all(|lane| lane.set.is_idle())
    }

    /// Swaps made (see [`OfferSet::swaps`]).
    pub(crate) fn swaps(&self) -> u64 {
        self.swaps_before + self.sum(|set| set.swaps)
    }

    /// Rebalances that left candidates unoffered for want of credit.
    pub(crate) fn credit_stalls(&self) -> u64 {
        self.stalls_before + self.sum(|set| set.credit_stalls)
    }

    /// A count summed over every lane's offered set, live or retired.
    fn sum(&self, count: impl Fn(&OfferSet<V>) -> u64) -> u64 {
        let lanes = self.all().chain(&self.retired);
        lanes.map(|lane| count(&lane.set)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::MessageId;
    use crate::offer::Candidate;
    use crate::time::Time;

    fn key(priority: u32, id: u64) -> Key {
        Key::new(priority, Time(0), MessageId(id))
    }

    fn weighted() -> (Weights, KeyWeights) {
        (Weights::default(), KeyWeights::new())
    }

    fn c() -> Candidate {
        Candidate {
            size: 1,
            since: Time(0),
            entered: Time(0),
        }
    }

    #[test]
    fn lane_names_round_trip_and_topics_are_their_own_lane() {
        let name = lane_name("orders", 4, 500);
        let lane = parse(&name).unwrap();
        assert_eq!(
            (lane.topic, lane.tier, lane.weight_milli),
            ("orders", Some(4), 500)
        );
        assert_eq!(topic_of(&name), "orders");
        assert_eq!(parse("orders").unwrap().tier, None);
        for bad in ["t\u{1}", "t\u{1}4", "t\u{1}x:1", "t\u{1}4:0", "t\u{1}4:-1"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let settings = Settings::default();
        assert!(check(&settings, &name).is_ok());
        assert!(check(&settings, "\u{1}1:1").is_err(), "empty topic");
    }

    #[test]
    fn each_tier_offers_within_its_own_credits_with_its_own_frontier() {
        let mut lanes: Lanes<Candidate> = Lanes::new(Some(weighted()), 64);
        // A flood of priority 0 and a few of priority 4 (and 7, which joins tier 4).
        for id in 0..10 {
            lanes.insert(key(0, id), c());
        }
        lanes.insert(key(4, 100), c());
        lanes.insert(key(7, 101), c());
        let mut offers = Vec::new();
        for lane in lanes.lanes_mut("t") {
            lane.set.rebalance(2, true, Time(0));
            let frontier = lane.set.best_unoffered();
            offers.extend(lane.set.poll(&lane.name, frontier));
        }
        let by_lane: Vec<(String, usize, Option<Key>)> = offers
            .iter()
            .filter(|o| !o.adds.is_empty())
            .map(|o| (o.topic.clone(), o.adds.len(), o.frontier))
            .collect();
        assert_eq!(
            by_lane,
            vec![
                (lane_name("t", 0, 8000), 2, Some(key(0, 2))),
                (lane_name("t", 4, 500), 2, None),
            ],
            "lanes without candidates offer nothing"
        );
        assert_eq!(lanes.len(), 12);
        assert_eq!(lanes.offered_len(), 4);
    }

    #[test]
    fn a_change_of_tiers_retracts_the_old_lanes_and_offers_the_new() {
        let mut lanes: Lanes<Candidate> = Lanes::default();
        lanes.insert(key(0, 1), c());
        lanes.insert(key(3, 2), c());
        for lane in lanes.lanes_mut("t") {
            lane.set.rebalance(8, true, Time(0));
            lane.set.poll(&lane.name, None);
        }
        lanes.set_policy(Some(weighted()));
        let mut offers = Vec::new();
        for lane in lanes.lanes_mut("t") {
            lane.set.rebalance(8, true, Time(0));
            let frontier = lane.set.best_unoffered();
            offers.extend(lane.set.poll(&lane.name, frontier));
        }
        lanes.drop_idle_retired();
        offers.retain(|o| !o.adds.is_empty() || !o.retracts.is_empty());
        assert_eq!(offers[0].topic, "t");
        assert_eq!(offers[0].retracts, vec![key(0, 1), key(3, 2)]);
        assert_eq!(offers[1].adds[0].key, key(0, 1));
        assert_eq!(offers[2].adds[0].key, key(3, 2));
        assert!(lanes.retired.is_empty(), "the retired lane said all it had");
        assert!(lanes.get(&key(3, 2)).is_some());
        assert_eq!(lanes.take(&key(3, 2), 1).map(|_| ()), Some(()));
        assert_eq!(lanes.len(), 1);
    }
}
