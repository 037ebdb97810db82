//! A message to push, as a producer builds it.

use bytes::Bytes;
use crest_core::time::Time;
use crest_core::wire::PushMessage;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A message to push.
#[derive(Clone, Debug)]
pub struct Message {
    pub(super) message: PushMessage,
    /// What picks its leaf, if not the dedup key nor round-robin (see [`Message::group`]).
    route: Option<String>,
}

impl Message {
    /// A message of `topic` with the default priority ([`crest_core::tier::NORMAL`]).
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Message {
        Message {
            message: PushMessage {
                topic: topic.into(),
                priority: crest_core::tier::NORMAL,
                payload: payload.into(),
                ..PushMessage::default()
            },
            route: None,
        }
    }

    /// Sets the priority (lower is more urgent).
    pub fn priority(mut self, priority: u32) -> Message {
        self.message.priority = priority;
        self
    }

    /// Adds a metadata entry.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Message {
        self.message.metadata.push((key.into(), value.into()));
        self
    }

    /// Not delivered before `delay` after its leaf accepts it.
    pub fn deliver_after(mut self, delay: Duration) -> Message {
        self.message.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Not delivered before `at` (by the leaf's clock).
    pub fn deliver_at(mut self, at: SystemTime) -> Message {
        let micros = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.message.deliver_at = Some(Time(micros));
        self
    }

    /// Dropped if not consumed within `ttl` after it is ready (`Duration::ZERO`: never, even
    /// if the topic has a default time to live).
    pub fn ttl(mut self, ttl: Duration) -> Message {
        self.message.ttl_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// A second push of this topic with the same key within the topic's dedup window is
    /// acknowledged with the first message's id and not enqueued again. The producer sends
    /// every message with a key to the leaf the key hashes to, so this holds across producers
    /// that list the same leaves.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Message {
        self.message.dedup_key = Some(key.into());
        self
    }

    /// The message's fairness key (a tenant, a customer; SQS's message group): within its
    /// tier of a `weighted` topic, pops rotate among the keys with ready messages (by the
    /// topic's `fairness_weights`, equal by default), so one key's backlog cannot starve
    /// another's. Kept and delivered with the message; a `strict` topic does not use it.
    pub fn fairness_key(mut self, key: impl Into<String>) -> Message {
        self.message.fairness_key = Some(key.into());
        self
    }

    /// The message's group in a FIFO topic (`fifo = true`; SQS's `MessageGroupId`): its
    /// fairness key, and the key its leaf is chosen by, so that every message of the group
    /// reaches the same leaf, which delivers them in order, none while an earlier one is
    /// leased. A group's messages stay with their leaf if it cannot be reached (they wait
    /// for it, or its replicas, up to `leaf_wait_max`), as messages with a dedup key do.
    pub fn group(self, group: impl Into<String>) -> Message {
        let group = group.into();
        let mut message = self.fairness_key(group.clone());
        message.route = Some(group);
        message
    }

    /// Sends the message to the leaf `key` hashes to (as [`Message::group`] does with its
    /// group): a FIFO topic whose deduplication spans every group routes all its messages by
    /// one key, so its dedup keys meet at one leaf.
    pub fn route(mut self, key: impl Into<String>) -> Message {
        self.route = Some(key.into());
        self
    }

    /// The key its leaf is chosen by, if any.
    pub(super) fn routed_by(&self) -> Option<&str> {
        self.route.as_deref().or(self.message.dedup_key.as_deref())
    }
}
