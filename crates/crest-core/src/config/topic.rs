//! Per-topic settings: the overrides of a topic's delivery policy, and topic names.

use super::Settings;
use serde::{Deserialize, Serialize};

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
        }
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
