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
use crate::key::Key;
use crate::offer::{OfferSet, Offerable};

/// Separates a weighted topic's name from its lane's tier and weight (a control character:
/// never in a topic's name).
pub(crate) const SEPARATOR: char = '\u{1}';

/// A lane's name, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneName<'a> {
    /// The topic the lane belongs to.
    pub(crate) topic: &'a str,
    /// The tier's first priority (`None`: the one lane of a strict topic).
    pub(crate) tier: Option<u32>,
    /// The tier's weight in thousandths (0 for a strict topic's lane).
    pub(crate) weight_milli: u32,
}

/// The name of `topic`'s lane for `tier` of weight `weight_milli`.
pub(crate) fn lane_name(topic: &str, tier: u32, weight_milli: u32) -> String {
    format!("{topic}{SEPARATOR}{tier}:{weight_milli}")
}

/// Reads a lane's name (a topic's name is its strict lane's). `None`: a malformed suffix.
pub(crate) fn parse(name: &str) -> Option<LaneName<'_>> {
    let Some((topic, suffix)) = name.split_once(SEPARATOR) else {
        return Some(LaneName {
            topic: name,
            tier: None,
            weight_milli: 0,
        });
    };
    let (tier, weight) = suffix.split_once(':')?;
    let weight_milli: u32 = weight.parse().ok()?;
    (weight_milli > 0).then_some(())?;
    Some(LaneName {
        topic,
        tier: Some(tier.parse().ok()?),
        weight_milli,
    })
}

/// The topic a lane belongs to.
pub(crate) fn topic_of(name: &str) -> &str {
    name.split_once(SEPARATOR).map_or(name, |(topic, _)| topic)
}

/// Checks a lane's name as offers carry it: a valid topic, and a well-formed suffix.
///
/// # Errors
/// A sentence naming the problem.
pub(crate) fn check(settings: &Settings, name: &str) -> Result<(), String> {
    let lane = parse(name).ok_or_else(|| format!("{name:?} is not a topic nor a lane of one"))?;
    settings.check_topic(lane.topic)
}

/// One lane of a topic at a leaf.
#[derive(Debug)]
struct Lane<V> {
    /// Tier and weight (`None`: the strict lane).
    tier: Option<(u32, u32)>,
    set: OfferSet<V>,
}

impl<V: Offerable> Lane<V> {
    fn name<'a>(&self, topic: &'a str) -> std::borrow::Cow<'a, str> {
        match self.tier {
            None => topic.into(),
            Some((tier, weight)) => lane_name(topic, tier, weight).into(),
        }
    }
}

/// A topic's available messages at a leaf, in lanes (see the module doc): each lane an
/// [`OfferSet`] of its own.
#[derive(Debug)]
pub(crate) struct Lanes<V> {
    /// The tiers (`None`: strict, one lane).
    weights: Option<Weights>,
    /// One lane per tier, in tier order.
    live: Vec<Lane<V>>,
    /// Lanes of tiers no longer in use (the topic's tiers changed) with retracts still to
    /// send: they hold no candidate, and go once idle.
    retired: Vec<Lane<V>>,
    /// Swaps and credit stalls of retired lanes.
    swaps_before: u64,
    stalls_before: u64,
}

impl<V> Default for Lanes<V> {
    fn default() -> Self {
        Lanes {
            weights: None,
            live: vec![Lane {
                tier: None,
                set: OfferSet::default(),
            }],
            retired: Vec::new(),
            swaps_before: 0,
            stalls_before: 0,
        }
    }
}

impl<V: Offerable> Lanes<V> {
    /// Empty lanes for `weights` (`None`: strict).
    pub(crate) fn new(weights: Option<Weights>) -> Lanes<V> {
        let mut lanes = Lanes::default();
        if weights.is_some() {
            lanes.set_weights(weights);
        }
        lanes
    }

    /// Strict lanes whose candidates are all unoffered, built in bulk from `entries` sorted by
    /// key (recovery).
    pub(crate) fn from_sorted(entries: Vec<(Key, V)>) -> Lanes<V> {
        let mut lanes = Lanes::default();
        lanes.live[0].set = OfferSet::from_sorted(entries);
        lanes
    }

    /// The tiers in use (`None`: strict).
    pub(crate) fn weights(&self) -> Option<&Weights> {
        self.weights.as_ref()
    }

    fn route(&self, priority: u32) -> usize {
        match &self.weights {
            None => 0,
            Some(weights) => weights.milli.range(..=priority).count().saturating_sub(1),
        }
    }

    /// Moves every candidate into the lanes of `weights`; the parent is told to drop what it
    /// held of lanes no longer in use, and offered the new ones. A lane whose name stays (or
    /// comes back while its retracts are unsent) keeps its offer stream: one stream per name,
    /// numbered on (see [`OfferSet::take`]).
    pub(crate) fn set_weights(&mut self, weights: Option<Weights>) {
        if self.weights == weights {
            return;
        }
        let tiers: Vec<Option<(u32, u32)>> = match &weights {
            None => vec![None],
            Some(weights) => weights
                .milli
                .iter()
                .map(|(tier, weight)| Some((*tier, *weight)))
                .collect(),
        };
        let mut former: Vec<Lane<V>> = std::mem::take(&mut self.live);
        former.append(&mut self.retired);
        self.live = tiers
            .into_iter()
            .map(
                |tier| match former.iter().position(|lane| lane.tier == tier) {
                    Some(at) => former.swap_remove(at),
                    None => Lane {
                        tier,
                        set: OfferSet::default(),
                    },
                },
            )
            .collect();
        self.weights = weights;
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
                .filter(|key| self.route(key.priority) != at)
                .collect();
            for key in keys {
                moving.push((key, self.live[at].set.remove(&key).expect("listed")));
            }
        }
        for (key, value) in moving {
            self.insert(key, value);
        }
        self.drop_idle_retired();
    }

    /// The candidate of `key`.
    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        self.live[self.route(key.priority)].set.get(key)
    }

    /// The candidate of `key`, to change in place (not its key).
    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        let lane = self.route(key.priority);
        self.live[lane].set.get_mut(key)
    }

    /// Every candidate, lane by lane in tier order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.live.iter().flat_map(|lane| lane.set.iter())
    }

    /// Up to `max` keys from `from` on in `from`'s lane, in key order.
    pub(crate) fn keys_from(&self, from: &Key, max: usize) -> Vec<Key> {
        self.live[self.route(from.priority)]
            .set
            .keys_from(from, max)
    }

    /// Adds a candidate to its lane.
    pub(crate) fn insert(&mut self, key: Key, candidate: V) {
        let lane = self.route(key.priority);
        self.live[lane].set.insert(key, candidate);
    }

    /// See [`OfferSet::remove`].
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        let lane = self.route(key.priority);
        self.live[lane].set.remove(key)
    }

    /// See [`OfferSet::take`].
    pub(crate) fn take(&mut self, key: &Key, applied: u64) -> Option<V> {
        let lane = self.route(key.priority);
        self.live[lane].set.take(key, applied)
    }

    /// Each lane with its name, retired lanes last (their retracts go before a new lane of
    /// the same name offers anything, as they are polled first on the next flush otherwise).
    pub(crate) fn lanes_mut<'a>(
        &'a mut self,
        topic: &'a str,
    ) -> impl Iterator<Item = (std::borrow::Cow<'a, str>, &'a mut OfferSet<V>)> {
        self.retired
            .iter_mut()
            .chain(self.live.iter_mut())
            .map(move |lane| (lane.name(topic), &mut lane.set))
    }

    /// Drops the retired lanes that have nothing left to send.
    pub(crate) fn drop_idle_retired(&mut self) {
        let (mut swaps, mut stalls) = (0, 0);
        self.retired.retain(|lane| {
            let idle = lane.set.is_idle();
            if idle {
                swaps += lane.set.swaps;
                stalls += lane.set.credit_stalls;
            }
            !idle
        });
        self.swaps_before += swaps;
        self.stalls_before += stalls;
    }

    /// The parent session ended: nothing is held by a parent any more.
    pub(crate) fn reset(&mut self) {
        for lane in &mut self.live {
            lane.set.reset();
        }
        for lane in self.retired.drain(..) {
            self.swaps_before += lane.set.swaps;
            self.stalls_before += lane.set.credit_stalls;
        }
    }

    /// Number of candidates, offered or not.
    pub(crate) fn len(&self) -> usize {
        self.live.iter().map(|lane| lane.set.len()).sum()
    }

    /// Number of candidates the parent holds.
    pub(crate) fn offered_len(&self) -> usize {
        self.live.iter().map(|lane| lane.set.offered_len()).sum()
    }

    /// Whether nothing is a candidate and nothing is left to send.
    pub(crate) fn is_idle(&self) -> bool {
        self.live
            .iter()
            .chain(&self.retired)
            .all(|lane| lane.set.is_idle())
    }

    /// Swaps made (see [`OfferSet::swaps`]).
    pub(crate) fn swaps(&self) -> u64 {
        self.swaps_before
            + self
                .live
                .iter()
                .chain(&self.retired)
                .map(|lane| lane.set.swaps)
                .sum::<u64>()
    }

    /// Rebalances that left candidates unoffered for want of credit.
    pub(crate) fn credit_stalls(&self) -> u64 {
        self.stalls_before
            + self
                .live
                .iter()
                .chain(&self.retired)
                .map(|lane| lane.set.credit_stalls)
                .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::MessageId;
    use crate::offer::Candidate;
    use crate::time::Time;

    fn key(priority: u32, id: u64) -> Key {
        Key {
            priority,
            ready_at: Time(0),
            id: MessageId(id),
        }
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
        let mut lanes: Lanes<Candidate> = Lanes::new(Some(Weights::default()));
        // A flood of priority 0 and a few of priority 4 (and 7, which joins tier 4).
        for id in 0..10 {
            lanes.insert(key(0, id), c());
        }
        lanes.insert(key(4, 100), c());
        lanes.insert(key(7, 101), c());
        let mut offers = Vec::new();
        for (name, set) in lanes.lanes_mut("t") {
            set.rebalance(2, true, Time(0));
            let frontier = set.best_unoffered();
            offers.extend(set.poll(&name, frontier));
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
        for (name, set) in lanes.lanes_mut("t") {
            set.rebalance(8, true, Time(0));
            set.poll(&name, None);
        }
        lanes.set_weights(Some(Weights::default()));
        let mut offers = Vec::new();
        for (name, set) in lanes.lanes_mut("t") {
            set.rebalance(8, true, Time(0));
            let frontier = set.best_unoffered();
            offers.extend(set.poll(&name, frontier));
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
