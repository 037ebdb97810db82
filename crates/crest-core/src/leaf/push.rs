//! Pushes: validation, dedup keys, ids and times, and the records a push batch logs.

use super::*;
use crate::downstream::Topic;
use crate::id::{MESSAGE_SEQ_MAX, MessageId};
use crate::key::Key;
use crate::machine::{ConnId, SyncWait};
use crate::metrics::Metric;
use crate::record::{LogRecord, MessageBody, MessageHead};
use crate::time::Time;
use crate::validate::validate_message;
use crate::wire::{ErrorCode, Push, Wire};
use std::collections::HashSet;
use std::time::Duration;

impl Leaf {
    /// Whether the leaf may hold `new` topics (none of which it holds) besides its own: within
    /// `topics_max`, and each namespace within its share, `namespace_topics_max`. The refusal
    /// names the bound.
    pub(super) fn room_for_topics(&self, new: &[&str]) -> Result<(), String> {
        let s = &self.config.settings;
        if self.topics.len() + new.len() > s.topics_max as usize {
            return Err(format!(
                "leaf holds {} topics; topics_max is {}",
                self.topics.len(),
                s.topics_max
            ));
        }
        let share = s.namespace_topics_max.min(s.topics_max) as usize;
        let mut adding: BTreeMap<&str, usize> = BTreeMap::new();
        for topic in new {
            *adding.entry(crate::access::namespace(topic)).or_default() += 1;
        }
        for (namespace, more) in adding {
            let held = self
                .topics
                .keys()
                .filter(|topic| crate::access::namespace(topic) == namespace)
                .count();
            if held + more > share {
                return Err(format!(
                    "namespace {namespace:?} holds {held} topics at this leaf; \
                     namespace_topics_max is {share}"
                ));
            }
        }
        Ok(())
    }

    /// The live dedup entry of `key` in `topic`, if its window is open at `now`.
    pub(super) fn find_dedup(&self, topic: &str, key: &str, now: Time) -> Option<DedupEntry> {
        self.dedup
            .keys
            .get(topic)
            .and_then(|keys| keys.get(key))
            .filter(|entry| entry.until > now)
            .copied()
    }

    pub(super) fn remember_dedup(&mut self, topic: &Topic, key: Box<str>, entry: DedupEntry) {
        let keys = self.dedup.keys.entry(topic.clone()).or_default();
        if let Some(old) = keys.insert(key.clone(), entry) {
            self.dedup.by_expiry.remove(&(old.until, old.id));
        }
        self.dedup
            .by_expiry
            .insert((entry.until, entry.id), (topic.clone(), key));
    }

    pub(super) fn forget_dedup(&mut self, topic: &Topic, key: &str) {
        if let Some(keys) = self.dedup.keys.get_mut(topic) {
            if let Some(old) = keys.remove(key) {
                self.dedup.by_expiry.remove(&(old.until, old.id));
            }
            if keys.is_empty() {
                self.dedup.keys.remove(topic);
            }
        }
    }

    pub(super) fn expire_dedup(&mut self, now: Time) {
        while let Some((&(until, _), _)) = self.dedup.by_expiry.first_key_value() {
            if until > now {
                break;
            }
            let (_, (topic, key)) = self.dedup.by_expiry.pop_first().expect("present");
            if let Some(keys) = self.dedup.keys.get_mut(&topic) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.dedup.keys.remove(&topic);
                    self.dirty.insert(topic);
                }
            }
        }
    }

    pub(super) fn dedup_len(&self) -> usize {
        self.dedup.by_expiry.len()
    }

    /// Checks a push batch; the error names the first problem found.
    pub(super) fn validate_push(&self, now: Time, push: &Push) -> Result<(), (ErrorCode, String)> {
        let s = &self.config.settings;
        let count = push.messages.len();
        if count == 0 {
            return Err((ErrorCode::InvalidArgument, "empty push batch".into()));
        }
        if count > s.push_batch_messages_max as usize {
            return Err((
                ErrorCode::BatchTooLarge,
                format!(
                    "batch of {count} messages exceeds push_batch_messages_max {}",
                    s.push_batch_messages_max
                ),
            ));
        }
        let bytes: usize = push.messages.iter().map(|m| m.payload.len()).sum();
        if bytes > s.push_batch_bytes_max as usize {
            return Err((
                ErrorCode::BatchTooLarge,
                format!(
                    "batch of {bytes} payload bytes exceeds push_batch_bytes_max {}",
                    s.push_batch_bytes_max
                ),
            ));
        }
        let mut new_topics = HashSet::new();
        let mut keyed = 0;
        for (index, message) in push.messages.iter().enumerate() {
            validate_message(s, now, message)
                .map_err(|(code, why)| (code, format!("message {index}: {why}")))?;
            if !self.topics.contains_key(message.topic.as_str()) {
                new_topics.insert(message.topic.as_str());
            }
            keyed += usize::from(message.dedup_key.is_some());
        }
        if !new_topics.is_empty() {
            let new_topics: Vec<&str> = new_topics.into_iter().collect();
            self.room_for_topics(&new_topics)
                .map_err(|why| (ErrorCode::TopicLimit, why))?;
        }
        let held = self.live.len() + self.writes.messages;
        if held + count as u64 > s.leaf_messages_max {
            return Err((
                ErrorCode::QueueFull,
                format!(
                    "leaf holds {held} messages; leaf_messages_max is {}",
                    s.leaf_messages_max
                ),
            ));
        }
        if (self.dedup_len() + keyed) as u64 > s.dedup_keys_max {
            return Err((
                ErrorCode::Overloaded,
                format!(
                    "leaf remembers {} dedup keys; dedup_keys_max is {}; retry later",
                    self.dedup_len(),
                    s.dedup_keys_max
                ),
            ));
        }
        if self.writes.batches.len() >= s.leaf_pending_batches_max as usize {
            return Err((
                ErrorCode::Overloaded,
                "too many push batches waiting for storage; retry".into(),
            ));
        }
        if self.next_seq + count as u64 > MESSAGE_SEQ_MAX {
            return Err((
                ErrorCode::QueueFull,
                "message sequence space of this leaf is exhausted".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn handle_push(&mut self, now: Time, conn: ConnId, push: Push) {
        self.push_batch(now, conn, push, None);
    }

    /// Takes a push batch, new or held since `held` for an allowance.
    pub(super) fn push_batch(&mut self, now: Time, conn: ConnId, push: Push, held: Option<Time>) {
        let refused = self.principals.get(&conn).and_then(|principal| {
            let permission = crate::access::Permission::Produce;
            // A batch is mostly one topic: each run of equal topics is checked once.
            let mut allowed: Option<&str> = None;
            push.messages
                .iter()
                .find(|m| {
                    if allowed == Some(m.topic.as_str()) {
                        return false;
                    }
                    allowed = Some(&m.topic);
                    !principal.may(&m.topic, permission)
                })
                .map(|m| {
                    (
                        ErrorCode::Forbidden,
                        principal.refusal(&m.topic, permission),
                    )
                })
        });
        if let Some((code, message)) = refused {
            self.counters.pushes_refused += 1;
            self.send(conn, Wire::error(Some(push.request), code, message));
            return;
        }
        if let Err((code, message)) = self.validate_push(now, &push) {
            self.counters.pushes_refused += 1;
            self.send(conn, Wire::error(Some(push.request), code, message));
            return;
        }
        let Some(push) = self.admit_within_quotas(now, conn, push, held) else {
            return;
        };
        let principal = self.principals.get(&conn).map(|p| p.name.clone());
        let max = self.config.settings.principal_requests_max;
        if !self.push_tally.take(principal.as_ref(), max) {
            self.counters.pushes_refused += 1;
            let name = principal.as_deref().unwrap_or_default();
            let text = crate::access::over_cap(name, "push batches", "principal_requests_max", max);
            self.send(
                conn,
                Wire::error(Some(push.request), ErrorCode::Overloaded, text),
            );
            return;
        }
        self.counters.push_batches += 1;
        self.reporter
            .recorder
            .record(now, Metric::PushBatch, push.messages.len() as u64);
        let token = self.writes.next_token;
        self.writes.next_token += 1;
        // Acceptance times never go back as ids grow, whatever the clock does (see `Age`).
        let enqueued_at = now.max(self.last_enqueued_at);
        self.last_enqueued_at = enqueued_at;
        let mut records = Vec::with_capacity(push.messages.len());
        let mut messages = Vec::with_capacity(push.messages.len());
        let mut ids = Vec::with_capacity(push.messages.len());
        // Consecutive messages mostly share a topic: looked up once per run.
        let mut last: Option<Topic> = None;
        for message in push.messages {
            let topic = match &last {
                Some(topic) if **topic == *message.topic => topic.clone(),
                _ => {
                    let topic = self.topic(&message.topic);
                    last = Some(topic.clone());
                    topic
                }
            };
            if let Some(key) = &message.dedup_key
                && let Some(first) = self.find_dedup(&topic, key, now)
            {
                self.counters.deduplicated += 1;
                ids.push(first.id);
                continue;
            }
            let id = MessageId::new(self.config.id, self.next_seq);
            self.next_seq += 1;
            ids.push(id);
            let policy = self.policy(&topic);
            let ready_at = ready_time(now, &message);
            let ttl_ms = message.ttl_ms.unwrap_or(policy.message_ttl_ms);
            let expires_at = (ttl_ms > 0).then(|| ready_at + Duration::from_millis(ttl_ms));
            if let Some(key) = &message.dedup_key {
                let until = now + Duration::from_millis(policy.dedup_window_ms);
                self.remember_dedup(&topic, key.as_str().into(), DedupEntry { id, until });
            }
            let head = MessageHead {
                id,
                topic: message.topic,
                priority: message.priority,
                ready_at,
                enqueued_at,
                expires_at,
                dedup_key: message.dedup_key,
                fairness_key: message.fairness_key.clone(),
            };
            records.push(LogRecord::Enqueue {
                head,
                metadata: message.metadata.clone(),
                payload: message.payload.clone(),
            });
            messages.push(PendingMessage {
                id,
                topic,
                key: Key::new(message.priority, ready_at, id),
                enqueued_at,
                expires_at: expires_at.unwrap_or(Time::MAX),
                size: message.payload.len() as u32,
                body: MessageBody {
                    metadata: message.metadata,
                    payload: message.payload,
                },
                fairness_key: message.fairness_key,
            });
        }
        self.writes.messages += messages.len() as u64;
        self.writes.batches.insert(
            token,
            PendingBatch {
                conn,
                request: push.request,
                ids,
                messages,
                failed: None,
                received_at: now,
                principal,
            },
        );
        // A batch of duplicates only still goes through the log: its acknowledgement must not
        // overtake that of a batch it duplicates, and the log completes in order.
        self.log(now, Some(token), SyncWait::Now, records);
    }

    /// What the log keeps of message `key` of topic `name` (whose state is `topic`: it knows
    /// the message's fairness key) besides its body (no dedup key: checkpoints log keys apart,
    /// and a rewritten body must not open a new window).
    pub(super) fn head(
        name: &Topic,
        topic: &LeafTopic,
        key: &Key,
        enqueued_at: Time,
        expires_at: Time,
    ) -> MessageHead {
        MessageHead {
            id: key.id,
            topic: name.to_string(),
            priority: key.priority(),
            ready_at: key.ready_at,
            enqueued_at,
            expires_at: (expires_at != Time::MAX).then_some(expires_at),
            dedup_key: None,
            fairness_key: topic.offers.key_of(key.id).map(|key| key.to_string()),
        }
    }

    /// Watches the time to live of message `key` of `topic` (none if `expires_at` is
    /// `Time::MAX`).
    pub(super) fn track_expiry(&mut self, expires_at: Time, topic: &Topic, key: Key) {
        if expires_at == Time::MAX {
            return;
        }
        self.ttl.by_expiry.insert((expires_at, key.id));
        let ttl = Ttl {
            expires_at,
            topic: topic.clone(),
            key,
        };
        self.ttl.by_id.insert(key.id, ttl);
    }

    /// When message `id` (not dead) expires (`Time::MAX`: never).
    pub(super) fn expires_at(&self, id: MessageId) -> Time {
        if self.ttl.by_id.is_empty() {
            return Time::MAX;
        }
        self.ttl
            .by_id
            .get(&id)
            .map_or(Time::MAX, |ttl| ttl.expires_at)
    }

    /// The records that rebuild one message: its body (referred to when in the log), its
    /// attempts, its death.
    pub(super) fn message_records(
        &self,
        records: &mut Vec<LogRecord>,
        head: MessageHead,
        slot: &Slot,
        dead: Option<(Time, &str)>,
    ) {
        let (id, priority) = (head.id, head.priority);
        records.push(match slot.logged() {
            Some(location) => LogRecord::Index {
                head,
                size: slot.size,
                location,
            },
            None => {
                let body = self.bodies.cached.get(&id).cloned().unwrap_or_default();
                LogRecord::Enqueue {
                    head,
                    metadata: body.metadata,
                    payload: body.payload,
                }
            }
        });
        if slot.attempt > 0 {
            records.push(LogRecord::Lease {
                id,
                attempt: slot.attempt,
                deadline: Time::ZERO,
                token: 0,
            });
        }
        if let Some(escalation) = self.escalations.get(&id) {
            records.push(LogRecord::Reprioritize {
                id,
                priority,
                escalation: escalation.clone(),
            });
        }
        if let Some(metadata) = self.metadata.get(&id) {
            records.push(LogRecord::SetMetadata {
                id,
                metadata: metadata.clone(),
            });
        }
        if let Some((at, reason)) = dead {
            records.push(LogRecord::Dead {
                id,
                reason: reason.to_string(),
                at,
            });
        }
    }
}
