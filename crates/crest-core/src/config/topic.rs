//! Per-topic settings: the overrides of a topic's delivery policy, and topic names.

use super::Settings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most priorities one topic's aging names.
pub const AGING_PRIORITIES_MAX: usize = 64;

/// A topic's aging: per priority, how long a message waits ready at that priority before it
/// moves one priority up (one lower number), never above the topic's `aging_floor`. A promoted
/// message goes ahead of the messages given its new priority (by ready time among the
/// promoted) and waits its new priority's threshold too before the next step. Written as a table of priority = duration: `aging = { 3 = "30m", 4 = "1h" }`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Aging {
    /// Threshold per priority.
    pub thresholds: BTreeMap<u32, Duration>,
}

impl Aging {
    /// How long a message of priority `origin` has waited in all when it is due to leave
    /// `priority` (it waited each threshold from `origin` down to `priority`).
    pub fn due_after(&self, priority: u32, origin: u32) -> Duration {
        self.thresholds
            .range(priority..=origin.max(priority))
            .map(|(_, threshold)| *threshold)
            .sum()
    }
}

impl Serialize for Aging {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.thresholds.iter().map(|(priority, threshold)| {
            (
                priority.to_string(),
                humantime::format_duration(*threshold).to_string(),
            )
        }))
    }
}

impl<'de> Deserialize<'de> for Aging {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Aging, D::Error> {
        use serde::de::Error;
        let table = BTreeMap::<String, String>::deserialize(deserializer)?;
        let mut thresholds = BTreeMap::new();
        for (priority, threshold) in table {
            let priority: u32 = priority.trim().parse().map_err(|_| {
                D::Error::custom(format!(
                    "aging: {priority:?} is not a priority (0..=4294967295)"
                ))
            })?;
            let threshold = humantime::parse_duration(&threshold).map_err(|e| {
                D::Error::custom(format!("aging: {threshold:?} for priority {priority}: {e}"))
            })?;
            thresholds.insert(priority, threshold);
        }
        Ok(Aging { thresholds })
    }
}

/// Most tiers one topic's `weights` names.
pub const TIERS_MAX: usize = 64;

/// The largest weight of a tier (a weight is kept in thousandths: 0.001 is the smallest).
pub const WEIGHT_MAX: f64 = 1_000_000.0;

/// How pops share a topic among its priorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheduling {
    /// The most urgent ready message first, always: a lower priority waits while a higher one
    /// has anything ready.
    #[default]
    Strict,
    /// Tiers share pops by their weights (see [`Weights`]); within a tier, the key order.
    Weighted,
}

/// The tiers of a `weighted` topic and their shares of pops: each named priority starts a
/// tier that holds it and every priority after it up to the next named one (priorities before
/// the first named one join the first tier). A tier with ready messages gets pops in
/// proportion to its weight among the tiers with ready messages. Written as a table of
/// priority = weight: `weights = { 0 = 8, 1 = 4, 2 = 2, 3 = 1, 4 = 0.5 }` (the default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weights {
    /// Weight per tier's first priority, in thousandths.
    pub milli: BTreeMap<u32, u32>,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            milli: [(0, 8000), (1, 4000), (2, 2000), (3, 1000), (4, 500)].into(),
        }
    }
}

impl Weights {
    /// The first priority of the tier that holds `priority`.
    pub fn tier_of(&self, priority: u32) -> u32 {
        self.milli
            .range(..=priority)
            .next_back()
            .or_else(|| self.milli.iter().next())
            .map_or(0, |(tier, _)| *tier)
    }

    /// A tier's weight, in thousandths (0: not a tier).
    pub fn weight_of(&self, tier: u32) -> u32 {
        self.milli.get(&tier).copied().unwrap_or(0)
    }
}

impl Serialize for Weights {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.milli
                .iter()
                .map(|(tier, milli)| (tier.to_string(), f64::from(*milli) / 1000.0)),
        )
    }
}

impl<'de> Deserialize<'de> for Weights {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Weights, D::Error> {
        use serde::de::Error;
        let table = BTreeMap::<String, f64>::deserialize(deserializer)?;
        let mut milli = BTreeMap::new();
        for (tier, weight) in table {
            let tier: u32 = tier.trim().parse().map_err(|_| {
                D::Error::custom(format!(
                    "weights: {tier:?} is not a priority (0..=4294967295)"
                ))
            })?;
            if !(0.001..=WEIGHT_MAX).contains(&weight) {
                return Err(D::Error::custom(format!(
                    "weights: {weight} for priority {tier} is outside 0.001..={WEIGHT_MAX}"
                )));
            }
            milli.insert(tier, (weight * 1000.0).round() as u32);
        }
        Ok(Weights { milli })
    }
}

/// Most fairness keys one topic's `fairness_weights` names.
pub const FAIRNESS_WEIGHTS_MAX: usize = 256;

/// The weights of fairness keys within their tier of a `weighted` topic: among the keys with
/// ready messages of a tier, each gets that tier's pops in proportion to its weight; a key not
/// named weighs 1. Written as a table of key = weight:
/// `fairness_weights = { "tenant-42" = 2, "batch" = 0.25 }`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KeyWeights {
    /// Weight per key, in thousandths.
    pub milli: BTreeMap<String, u32>,
}

impl Serialize for KeyWeights {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.milli
                .iter()
                .map(|(key, milli)| (key, f64::from(*milli) / 1000.0)),
        )
    }
}

impl<'de> Deserialize<'de> for KeyWeights {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<KeyWeights, D::Error> {
        use serde::de::Error;
        let table = BTreeMap::<String, f64>::deserialize(deserializer)?;
        let mut milli = BTreeMap::new();
        for (key, weight) in table {
            if !(0.001..=WEIGHT_MAX).contains(&weight) {
                return Err(D::Error::custom(format!(
                    "fairness_weights: {weight} for key {key:?} is outside 0.001..={WEIGHT_MAX}"
                )));
            }
            milli.insert(key, (weight * 1000.0).round() as u32);
        }
        Ok(KeyWeights { milli })
    }
}

/// Per-topic overrides of [`Settings`]; unset fields take the node's value.
///
/// In a topology file: `[settings.topics.orders]` then e.g. `max_attempts = 3`.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicSettings {
    /// Default visibility timeout, in milliseconds.
    pub lease_timeout_ms: Option<u64>,
    /// Deliveries before the dead-letter queue.
    pub max_attempts: Option<u32>,
    /// Dedup window, in milliseconds.
    pub dedup_window_ms: Option<u64>,
    /// Default time to live, in milliseconds (0: forever).
    pub message_ttl_ms: Option<u64>,
    /// Where a message goes when a delivery fails for the `max_attempts`-th time: a topic of
    /// the same namespace, where it becomes ready again with its attempts reset (SQS's
    /// dead-letter queue). Unset: the topic's own dead-letter queue.
    pub dead_letter_topic: Option<String>,
    /// How long a ready message waits at each priority before it is promoted one priority
    /// (see [`Aging`]). Unset: never.
    pub aging: Option<Aging>,
    /// The most urgent priority aging promotes a message to (default 0).
    pub aging_floor: Option<u32>,
    /// How pops share the topic among priorities (default `strict`).
    pub scheduling: Option<Scheduling>,
    /// The tiers of a `weighted` topic and their weights (default [`Weights::default`]).
    pub weights: Option<Weights>,
    /// The weights of fairness keys within their tier of a `weighted` topic (default: every
    /// key weighs 1; see [`KeyWeights`]).
    pub fairness_weights: Option<KeyWeights>,
    /// Delivers the topic's message groups in order (default `false`): a message's group is
    /// its fairness key (messages without one form one group), a group's messages go in key
    /// order, and none of a group is delivered while one of it is leased, except several in
    /// one reserve (one pop). A group's messages must reach one leaf: the SDK's
    /// `Message::group` routes them so.
    pub fifo: Option<bool>,
}

impl TopicSettings {
    /// These overrides over `base` (each field set here wins).
    pub fn over(&self, base: &TopicSettings) -> TopicSettings {
        TopicSettings {
            lease_timeout_ms: self.lease_timeout_ms.or(base.lease_timeout_ms),
            max_attempts: self.max_attempts.or(base.max_attempts),
            dedup_window_ms: self.dedup_window_ms.or(base.dedup_window_ms),
            message_ttl_ms: self.message_ttl_ms.or(base.message_ttl_ms),
            dead_letter_topic: self
                .dead_letter_topic
                .clone()
                .or_else(|| base.dead_letter_topic.clone()),
            aging: self.aging.clone().or_else(|| base.aging.clone()),
            aging_floor: self.aging_floor.or(base.aging_floor),
            scheduling: self.scheduling.or(base.scheduling),
            weights: self.weights.clone().or_else(|| base.weights.clone()),
            fairness_weights: self
                .fairness_weights
                .clone()
                .or_else(|| base.fairness_weights.clone()),
            fifo: self.fifo.or(base.fifo),
        }
    }

    /// Whether the topic delivers its message groups in order.
    pub fn is_fifo(&self) -> bool {
        self.fifo == Some(true)
    }

    /// The tiers pops share the topic by, for a `weighted` topic (`None`: strict).
    pub fn weighted(&self) -> Option<Weights> {
        (self.scheduling == Some(Scheduling::Weighted))
            .then(|| self.weights.clone().unwrap_or_default())
    }

    /// Checks these overrides of `topic` against the node's `settings`.
    ///
    /// # Errors
    /// A sentence naming the field and the rule it breaks.
    pub fn check(&self, settings: &Settings, topic: &str) -> Result<(), String> {
        if self.max_attempts == Some(0) {
            return Err(format!("{topic}: max_attempts must be at least 1"));
        }
        if let Some(lease) = self.lease_timeout_ms
            && (lease == 0 || lease > settings.lease_timeout_max_ms)
        {
            return Err(format!(
                "{topic}: lease_timeout_ms {lease} is outside 1..={} (lease_timeout_max_ms)",
                settings.lease_timeout_max_ms
            ));
        }
        if let Some(dead) = &self.dead_letter_topic {
            settings
                .check_topic(dead)
                .map_err(|e| format!("{topic}: dead_letter_topic: {e}"))?;
            if dead == topic {
                return Err(format!("{topic}: dead_letter_topic names the topic itself"));
            }
            let (ours, theirs) = (
                crate::access::namespace(topic),
                crate::access::namespace(dead),
            );
            if ours != theirs {
                return Err(format!(
                    "{topic}: dead_letter_topic {dead} is in namespace {theirs}, not {ours}"
                ));
            }
        }
        if let Some(aging) = &self.aging {
            if aging.thresholds.len() > AGING_PRIORITIES_MAX {
                return Err(format!(
                    "{topic}: aging names {} priorities, more than {AGING_PRIORITIES_MAX}",
                    aging.thresholds.len()
                ));
            }
            for (priority, threshold) in &aging.thresholds {
                if threshold.as_millis() == 0
                    || *threshold > Duration::from_millis(settings.delay_max_ms)
                {
                    return Err(format!(
                        "{topic}: aging threshold of priority {priority} is outside 1 ms..={} ms (delay_max_ms)",
                        settings.delay_max_ms
                    ));
                }
            }
        }
        if let Some(weights) = &self.weights {
            if weights.milli.is_empty() || weights.milli.len() > TIERS_MAX {
                return Err(format!(
                    "{topic}: weights names {} tiers, not 1..={TIERS_MAX}",
                    weights.milli.len()
                ));
            }
            if let Some((tier, _)) = weights
                .milli
                .iter()
                .find(|(_, milli)| **milli == 0 || f64::from(**milli) > WEIGHT_MAX * 1000.0)
            {
                return Err(format!(
                    "{topic}: the weight of tier {tier} is outside 0.001..={WEIGHT_MAX}"
                ));
            }
        }
        if let Some(weights) = &self.fairness_weights {
            if weights.milli.len() > FAIRNESS_WEIGHTS_MAX {
                return Err(format!(
                    "{topic}: fairness_weights names {} keys, more than {FAIRNESS_WEIGHTS_MAX}",
                    weights.milli.len()
                ));
            }
            for (key, milli) in &weights.milli {
                settings
                    .check_fairness_key(key)
                    .map_err(|e| format!("{topic}: {e}"))?;
                if *milli == 0 || f64::from(*milli) > WEIGHT_MAX * 1000.0 {
                    return Err(format!(
                        "{topic}: the weight of fairness key {key:?} is outside 0.001..={WEIGHT_MAX}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The delivery policy of one topic: [`Settings`] with that topic's overrides applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicPolicy {
    /// Default visibility timeout, in milliseconds.
    pub lease_timeout_ms: u64,
    /// Deliveries before the dead-letter queue.
    pub max_attempts: u32,
    /// Dedup window, in milliseconds.
    pub dedup_window_ms: u64,
    /// Default time to live, in milliseconds (0: forever).
    pub message_ttl_ms: u64,
}

impl Settings {
    /// Checks a topic's name: 1 to `topic_bytes_max` bytes, no whitespace nor control
    /// characters.
    ///
    /// # Errors
    /// A sentence naming the problem.
    pub fn check_topic(&self, topic: &str) -> Result<(), String> {
        if topic.is_empty() {
            return Err("topic is empty".into());
        }
        if topic.len() > self.topic_bytes_max as usize {
            return Err(format!(
                "topic of {} bytes exceeds topic_bytes_max {}",
                topic.len(),
                self.topic_bytes_max
            ));
        }
        if topic.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!(
                "topic {topic:?} contains whitespace or control characters"
            ));
        }
        if topic.ends_with('/') {
            return Err(format!(
                "topic {topic:?} ends in '/': such a name is a namespace's (its quotas)"
            ));
        }
        if topic.starts_with('@') {
            return Err(format!(
                "topic {topic:?} starts with '@': such a name is a principal's (its rates)"
            ));
        }
        Ok(())
    }

    /// Checks a fairness key: 1 to `fairness_key_bytes_max` bytes, no control characters.
    ///
    /// # Errors
    /// A sentence naming the problem.
    pub fn check_fairness_key(&self, key: &str) -> Result<(), String> {
        let max = self.fairness_key_bytes_max as usize;
        if key.is_empty() || key.len() > max {
            return Err(format!(
                "fairness key of {} bytes is outside 1..={max} (fairness_key_bytes_max)",
                key.len()
            ));
        }
        if key.chars().any(char::is_control) {
            return Err(format!("fairness key {key:?} holds a control character"));
        }
        Ok(())
    }

    /// Checks the name of what a configuration configures: a topic, a namespace scope
    /// (`NS/`, the namespace `NS`'s quotas) or a principal scope (`@NAME`, its rates).
    ///
    /// # Errors
    /// A sentence naming the problem.
    pub fn check_scope(&self, scope: &str) -> Result<(), String> {
        if let Some(principal) = crate::quota::scope_principal(scope) {
            return crate::access::check_principal_name(principal);
        }
        match scope.strip_suffix('/') {
            Some(namespace) if namespace.is_empty() || namespace.contains('/') => Err(format!(
                "{scope:?} is neither a topic nor a namespace (NS/, one '/', at the end)"
            )),
            Some(namespace) => self.check_topic(namespace),
            None => self.check_topic(scope),
        }
    }

    /// The delivery policy of `topic`: these settings with the topic's overrides applied.
    pub fn topic_policy(&self, topic: &str) -> TopicPolicy {
        self.policy_of(self.topics.get(topic))
    }

    /// The delivery policy of `topic` with `runtime` (a configuration the tree keeps, see
    /// [`crate::wire::TopicConfig`]) over the topic's overrides in these settings.
    pub fn topic_policy_with(&self, topic: &str, runtime: Option<&TopicSettings>) -> TopicPolicy {
        match (runtime, self.topics.get(topic)) {
            (None, overrides) => self.policy_of(overrides),
            (Some(runtime), None) => self.policy_of(Some(runtime)),
            (Some(runtime), Some(overrides)) => self.policy_of(Some(&runtime.over(overrides))),
        }
    }

    fn policy_of(&self, overrides: Option<&TopicSettings>) -> TopicPolicy {
        let pick = |f: fn(&TopicSettings) -> Option<u64>, default: u64| {
            overrides.and_then(f).unwrap_or(default)
        };
        TopicPolicy {
            lease_timeout_ms: pick(|t| t.lease_timeout_ms, self.lease_timeout_ms),
            max_attempts: overrides
                .and_then(|t| t.max_attempts)
                .unwrap_or(self.max_attempts),
            dedup_window_ms: pick(|t| t.dedup_window_ms, self.dedup_window_ms),
            message_ttl_ms: pick(|t| t.message_ttl_ms, self.message_ttl_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_reads_as_a_table_of_priority_and_duration_and_travels_as_it_reads() {
        let text = "aging = { 3 = \"30m\", 4 = \"1h\" }\naging_floor = 1\n";
        let settings: TopicSettings = toml::from_str(text).expect("parses");
        let aging = settings.aging.clone().expect("aging");
        let minutes = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(
            aging.thresholds.into_iter().collect::<Vec<_>>(),
            vec![(3, minutes(30)), (4, minutes(60))]
        );
        assert_eq!(settings.aging_floor, Some(1));
        let packed = rmp_serde::to_vec(&settings).expect("encodes");
        let back: TopicSettings = rmp_serde::from_slice(&packed).expect("decodes");
        assert_eq!(back, settings);
        // Due after every threshold from its first priority down to the one it is at.
        let aging = settings.aging.expect("aging");
        assert_eq!(aging.due_after(3, 4), minutes(90));
        assert_eq!(aging.due_after(4, 4), minutes(60));
        assert_eq!(aging.due_after(3, 3), minutes(30));
        for (bad, says) in [
            ("aging = { x = \"30m\" }", "not a priority"),
            ("aging = { 3 = \"soon\" }", "for priority 3"),
        ] {
            let error = toml::from_str::<TopicSettings>(bad)
                .expect_err(bad)
                .to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let zero = TopicSettings {
            aging: Some(Aging {
                thresholds: [(3, Duration::ZERO)].into_iter().collect(),
            }),
            ..TopicSettings::default()
        };
        let error = zero.check(&Settings::default(), "jobs").expect_err("0 ms");
        assert!(error.contains("aging threshold of priority 3"), "{error}");
    }
}
