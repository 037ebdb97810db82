//! Recovery: a leaf rebuilt from its log, streamed in one storage operation at a time.

use super::*;
use crate::id::{MESSAGE_SEQ_MAX, MessageId};
use crate::key::Key;
use crate::lanes::Lanes;
use crate::record::{Location, LogRecord, MessageBody, MessageHead};
use crate::sorted::SortedMap;
use crate::time::Time;
use std::time::Duration;

impl Leaf {
    /// Rebuilds a leaf from its log: every storage operation it ever emitted, in order, as of
    /// `now`: [`Leaf::recovering`], [`Leaf::replay_operation`] for each operation, then
    /// [`Leaf::recovered`].
    pub fn recover(
        config: LeafConfig,
        now: Time,
        operations: impl IntoIterator<Item = Vec<LogRecord>>,
    ) -> Leaf {
        let mut leaf = Leaf::recovering(config);
        for records in operations {
            leaf.replay_operation(records);
        }
        leaf.recovered(now)
    }

    /// An empty leaf about to be rebuilt from its log, one operation at a time (so that a log
    /// far larger than the leaf's index is never held in memory at once).
    pub fn recovering(config: LeafConfig) -> Leaf {
        let mut leaf = Leaf::new(config);
        leaf.recovery = Some(Box::default());
        leaf
    }

    /// Recovery: applies one storage operation of the log, in log order.
    pub fn replay_operation(&mut self, records: Vec<LogRecord>) {
        let mut recovery = self.recovery.take().unwrap_or_default();
        // A checkpoint comes as one operation of every message at once: room for all of them
        // in one step rather than by doubling (a no-op while there is room).
        recovery.messages.reserve(records.len());
        for record in records {
            self.replay(&mut recovery, record);
        }
        self.recovery = Some(recovery);
    }

    /// Ends recovery as of `now`.
    ///
    /// Messages come back delayed, available or dead; those that were leased at the crash come
    /// back available with their attempt counts (their leases are gone with the root that held
    /// them). Messages whose time to live passed and dedup keys whose window ended are dropped.
    /// Sequence numbers continue above both the highest recovered and `config.first_seq`.
    pub fn recovered(self, now: Time) -> Leaf {
        let mut leaf = self;
        let Some(recovery) = leaf.recovery.take() else {
            return leaf;
        };
        let Recovery {
            messages,
            mut expiring,
            mut dead,
            mut leases,
            mut escalations,
            mut metadata,
            mut fairness,
            topics,
            ..
        } = *recovery;
        // Leases still live: restored once the topics' indexes are built.
        let mut live_leases = Vec::new();
        // Settle every message as of `now`, gathering each topic's index to build in bulk
        // (sorting once beats a million ordered inserts), told apart by index, not by name.
        #[derive(Default)]
        struct Gathered {
            messages: u64,
            bytes: u64,
            delayed: u64,
            available: Vec<(Key, Slot)>,
            ages: Vec<(MessageId, Time)>,
            dead: Vec<((Time, MessageId), Dead)>,
            keys: Vec<(MessageId, Arc<str>)>,
        }
        let mut gathered: Vec<Gathered> = topics.iter().map(|_| Gathered::default()).collect();
        if let Some(first) = gathered.first_mut() {
            // Most leaves hold one topic: it gets room for all.
            first.available.reserve(messages.len());
            first.ages.reserve(messages.len());
        }
        let mut delayed = Vec::new();
        for (id, message) in messages {
            let Recovered {
                topic: index,
                priority,
                ready_at,
                enqueued_at,
                slot,
            } = message;
            let expires_at = match expiring.is_empty() {
                true => Time::MAX,
                false => expiring.remove(&id).unwrap_or(Time::MAX),
            };
            let death = match dead.is_empty() {
                true => None,
                false => dead.remove(&id),
            };
            if expires_at <= now && death.is_none() {
                if let Some(body) = leaf.bodies.cached.remove(&id) {
                    leaf.bodies.bytes -= body.cached_bytes();
                }
                leaf.counters.expired += 1;
                continue;
            }
            leaf.live.insert(id.seq());
            if !escalations.is_empty()
                && let Some(escalation) = escalations.remove(&id)
            {
                leaf.escalations.insert(id, escalation);
            }
            if !metadata.is_empty()
                && let Some(pairs) = metadata.remove(&id)
            {
                leaf.metadata.insert(id, pairs);
            }
            let key = leaf.key_of(priority, ready_at, id);
            leaf.last_enqueued_at = leaf.last_enqueued_at.max(enqueued_at);
            match slot.logged() {
                Some(location) => place_body(&mut leaf.bodies.segments, &location),
                None => {
                    let bytes = leaf.bodies.cached.get(&id).map_or(0, MessageBody::bytes);
                    leaf.bodies.unlogged_bytes += bytes;
                }
            }
            let gather = &mut gathered[index as usize];
            if !fairness.is_empty()
                && let Some(key) = fairness.remove(&id)
            {
                gather.keys.push((id, key));
            }
            gather.messages += 1;
            gather.bytes += u64::from(slot.size);
            if let Some((at, reason)) = death {
                let dead = Dead {
                    priority: key.priority(),
                    ready_at: key.ready_at,
                    enqueued_at,
                    expires_at,
                    slot,
                    reason,
                };
                gather.dead.push(((at, id), dead));
                continue;
            }
            gather.ages.push((id, enqueued_at));
            let name = &topics[index as usize];
            leaf.track_expiry(expires_at, name, key);
            if key.ready_at > now {
                gather.delayed += 1;
                let entry = Delayed {
                    topic: name.clone(),
                    priority: key.priority(),
                    slot,
                };
                delayed.push(((key.ready_at, id), entry));
            } else {
                if let Some((token, deadline)) = leases.remove(&id)
                    && deadline > now
                {
                    live_leases.push((name.clone(), key, token, deadline));
                }
                gather.available.push((key, slot));
            }
        }
        for (name, gather) in topics.iter().zip(gathered) {
            let topic = leaf.topics.get_mut(name).expect("interned by replay");
            topic.messages = gather.messages;
            topic.bytes = gather.bytes;
            topic.delayed = gather.delayed;
            let mut available = gather.available;
            available.sort_unstable_by_key(|(key, _)| *key);
            // Sorted by key, priorities come in runs.
            for chunk in available.chunk_by(|a, b| a.0.priority() == b.0.priority()) {
                topic
                    .ready
                    .insert(chunk[0].0.priority(), chunk.len() as u64);
            }
            let keys_max = leaf.config.settings.fairness_keys_max;
            topic.offers = Lanes::from_sorted(available, gather.keys, keys_max);
            // A FIFO topic's groups were made empty with the topic: they are rebuilt from the
            // recovered messages and leases once the topic settings are refreshed.
            topic.groups = None;
            let mut ages = gather.ages;
            ages.sort_unstable_by_key(|(id, _)| *id);
            for (id, at) in ages {
                match topic.ages.last_entry() {
                    Some(mut last) if last.get().at == at => last.get_mut().live += 1,
                    _ => {
                        topic.ages.insert(id, Age { at, live: 1 });
                    }
                }
            }
            for ((at, id), dead) in gather.dead {
                topic.dead_at.insert(id, at);
                topic.dead.insert((at, id), dead);
            }
        }
        for (topic, key, token, deadline) in live_leases {
            leaf.restore_lease(topic, key, token, deadline);
        }
        delayed.sort_unstable_by_key(|(at, _)| *at);
        leaf.delayed = SortedMap::from_sorted(delayed);
        leaf.bodies.newest_segment = leaf.bodies.segments.keys().last().copied().unwrap_or(0);
        let segments: Vec<u32> = leaf.bodies.segments.keys().copied().collect();
        for segment in segments {
            leaf.check_compactable(segment);
        }
        leaf.expire_dedup(now);
        leaf.topics
            .retain(|name, topic| topic.messages > 0 || leaf.dedup.keys.contains_key(name));
        leaf.dirty.clear();
        leaf.dirty.extend(leaf.topics.keys().cloned());
        leaf.sync_allowances(now);
        leaf.refresh_topic_settings(Some(now));
        leaf
    }

    /// Recovery: a message's record. A message already recovered only moves its body
    /// (compaction rewrote it elsewhere).
    pub(super) fn recover_message(
        &mut self,
        recovery: &mut Recovery,
        head: MessageHead,
        size: u32,
        place: Result<Location, MessageBody>,
    ) {
        let id = head.id;
        let location = match place {
            Ok(location) => {
                if let Some(body) = self.bodies.cached.remove(&id) {
                    self.bodies.bytes -= body.cached_bytes();
                }
                location
            }
            Err(body) => {
                self.bodies.bytes += body.cached_bytes();
                if let Some(old) = self.bodies.cached.insert(id, body) {
                    self.bodies.bytes -= old.cached_bytes();
                }
                NO_LOCATION
            }
        };
        if let Some(message) = recovery.messages.get_mut(&id) {
            message.slot.location = location;
            return;
        }
        let index = self.topic_index(recovery, &head.topic);
        // Ids are never reused, not even those of messages deleted since.
        self.next_seq = self.next_seq.max(id.seq() + 1).min(MESSAGE_SEQ_MAX);
        if let Some(key) = head.dedup_key {
            let topic = recovery.topics[index as usize].clone();
            let window = self.policy(&topic).dedup_window_ms;
            let until = head.enqueued_at + Duration::from_millis(window);
            self.remember_dedup(&topic, key.into(), DedupEntry { id, until });
        }
        if let Some(expires_at) = head.expires_at {
            recovery.expiring.insert(id, expires_at);
        }
        if let Some(key) = head.fairness_key {
            recovery.fairness.insert(id, key.into());
        }
        recovery.messages.insert(
            id,
            Recovered {
                topic: index,
                priority: head.priority,
                ready_at: head.ready_at,
                enqueued_at: head.enqueued_at,
                slot: Slot {
                    location,
                    size,
                    attempt: 0,
                },
            },
        );
    }

    /// Recovery: the index of topic `name` in `recovery.topics`, interned.
    fn topic_index(&mut self, recovery: &mut Recovery, name: &str) -> u32 {
        // Consecutive records mostly share a topic: reuse the last one instead of hashing its
        // name for every record.
        if let Some((last, index)) = &recovery.last
            && **last == *name
        {
            return *index;
        }
        let interned = self.topic(name);
        let index = match recovery.topics.iter().position(|t| *t == interned) {
            Some(index) => index as u32,
            None => {
                recovery.topics.push(interned.clone());
                (recovery.topics.len() - 1) as u32
            }
        };
        recovery.last = Some((interned, index));
        index
    }

    /// Recovery: one record of the log.
    pub(super) fn replay(&mut self, recovery: &mut Recovery, record: LogRecord) {
        let messages = &mut recovery.messages;
        match record {
            LogRecord::Enqueue {
                head,
                metadata,
                payload,
            } => {
                let size = payload.len() as u32;
                let body = MessageBody { metadata, payload };
                self.recover_message(recovery, head, size, Err(body));
            }
            LogRecord::Index {
                head,
                size,
                location,
            } => self.recover_message(recovery, head, size, Ok(location)),
            LogRecord::Lease {
                id,
                attempt,
                deadline,
                token,
            } => {
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = attempt;
                    if token == 0 {
                        recovery.leases.remove(&id);
                    } else {
                        recovery.leases.insert(id, (token, deadline));
                    }
                }
            }
            LogRecord::Release {
                id,
                attempt,
                ready_at,
            } => {
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = attempt;
                    message.ready_at = ready_at;
                }
                recovery.leases.remove(&id);
            }
            LogRecord::Dead { id, reason, at } => {
                if messages.contains_key(&id) {
                    recovery.dead.insert(id, (at, reason.into()));
                }
                recovery.leases.remove(&id);
            }
            LogRecord::Reprioritize {
                id,
                priority,
                escalation,
            } => {
                if let Some(message) = messages.get_mut(&id) {
                    message.priority = priority;
                    recovery.escalations.insert(id, escalation);
                }
            }
            LogRecord::SetMetadata { id, metadata } => {
                if messages.contains_key(&id) {
                    recovery.metadata.insert(id, metadata);
                }
            }
            LogRecord::Redrive { id } => {
                recovery.dead.remove(&id);
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = 0;
                }
            }
            LogRecord::Delete { id } => {
                messages.remove(&id);
                if !recovery.escalations.is_empty() {
                    recovery.escalations.remove(&id);
                }
                if !recovery.metadata.is_empty() {
                    recovery.metadata.remove(&id);
                }
                if !recovery.fairness.is_empty() {
                    recovery.fairness.remove(&id);
                }
                recovery.leases.remove(&id);
                if !recovery.expiring.is_empty() {
                    recovery.expiring.remove(&id);
                }
                if !recovery.dead.is_empty() {
                    recovery.dead.remove(&id);
                }
                if let Some(body) = self.bodies.cached.remove(&id) {
                    self.bodies.bytes -= body.cached_bytes();
                }
            }
            LogRecord::Move { id, topic } => {
                if recovery.messages.contains_key(&id) {
                    let index = self.topic_index(recovery, &topic);
                    let message = recovery.messages.get_mut(&id).expect("present");
                    message.topic = index;
                    message.slot.attempt = 0;
                }
                recovery.leases.remove(&id);
            }
            LogRecord::Configure { topic, config } => {
                let newer = self
                    .configs
                    .get(&topic)
                    .is_none_or(|old| old.version < config.version);
                if newer {
                    self.configs.insert(topic, *config);
                }
            }
            LogRecord::Dedup {
                topic,
                key,
                id,
                until,
            } => {
                let topic = self.topic(&topic);
                self.remember_dedup(&topic, key.into(), DedupEntry { id, until });
            }
        }
    }
}
