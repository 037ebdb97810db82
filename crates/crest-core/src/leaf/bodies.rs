//! Message bodies in the log: where each lies, which segments hold live ones, and compaction
//! of mostly-dead segments.

use super::*;
use crate::downstream::Topic;
use crate::id::MessageId;
use crate::key::Key;
use crate::machine::{StorageOp, SyncWait};
use crate::record::{Location, LogRecord, MessageBody};
use crate::time::Time;

impl Leaf {
    /// Places a message that is in no index: delayed or available, as its ready time says.
    pub(super) fn place(&mut self, now: Time, topic: Topic, key: Key, slot: Slot) {
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let Some(topic) = place_in(leaf_topic, &mut self.delayed, now, topic, key, slot) else {
            return;
        };
        self.dirty.insert(topic);
        // Aging set in the topology starts with the first ready message.
        if self.aging_due().is_none() {
            self.schedule_aging(now);
        }
    }

    /// Forgets a message that is in no index any more (acked, expired, purged).
    pub(super) fn forget(&mut self, topic: &Topic, id: MessageId, slot: &Slot, dead: bool) {
        let leaf_topic = self.topics.get_mut(topic).expect("topic exists");
        leaf_topic.messages -= 1;
        leaf_topic.bytes -= u64::from(slot.size);
        if !dead {
            leaf_topic.age_remove(id);
        }
        leaf_topic.offers.forget_key(id);
        self.dirty.insert(topic.clone());
        self.live.remove(id.seq());
        if !self.escalations.is_empty() {
            self.escalations.remove(&id);
        }
        if !self.metadata.is_empty() {
            self.metadata.remove(&id);
        }
        if let Some(ttl) = self.ttl.by_id.remove(&id) {
            self.ttl.by_expiry.remove(&(ttl.expires_at, id));
        }
        if let Some(body) = self.bodies.cached.remove(&id) {
            self.bodies.bytes -= body.cached_bytes();
            if slot.logged().is_none() {
                self.bodies.unlogged_bytes -= body.bytes();
            }
        }
        if let Some(location) = slot.logged() {
            self.unplace_body(&location);
        }
    }

    /// A body left `location` (its message is gone, or its body moved).
    pub(super) fn unplace_body(&mut self, location: &Location) {
        let Some(segment) = self.bodies.segments.get_mut(&location.segment) else {
            return;
        };
        segment.live -= 1;
        segment.live_bytes -= u64::from(location.len);
        if segment.live == 0 {
            self.bodies.segments.remove(&location.segment);
            self.compactor.candidates.remove(&location.segment);
            self.compactor.stuck.remove(&location.segment);
        } else {
            self.check_compactable(location.segment);
        }
    }

    /// Marks a sealed segment for compaction once its live bodies are few enough.
    pub(super) fn check_compactable(&mut self, segment: u32) {
        let s = &self.config.settings;
        let Some(used) = self.bodies.segments.get(&segment) else {
            return;
        };
        let sparse = used.live_bytes * 100 < used.placed_bytes * u64::from(s.compaction_live_pct);
        if segment < self.bodies.newest_segment
            && sparse
            && !self.compactor.stuck.contains(&segment)
            && self.compactor.current.is_none_or(|(at, _)| at != segment)
        {
            self.compactor.candidates.insert(segment);
        }
    }

    /// A body is durable at `location`: counts it in its segment.
    pub(super) fn body_placed(&mut self, location: &Location) {
        self.bodies_placed(location.segment, 1, u64::from(location.len));
    }

    /// `count` bodies of `bytes` in all are durable in `segment`: counts them.
    pub(super) fn bodies_placed(&mut self, segment: u32, count: u64, bytes: u64) {
        if segment > self.bodies.newest_segment {
            let sealed = self.bodies.newest_segment;
            self.bodies.newest_segment = segment;
            self.check_compactable(sealed);
        }
        self.bodies
            .segments
            .entry(segment)
            .or_default()
            .add(count, bytes);
    }

    /// Ends a run of durable messages of one topic accepted at one time, from id `first`
    /// (see `handle_storage_done`): the topic goes back in its map, counted and dirty.
    pub(super) fn end_run(
        &mut self,
        (topic, mut leaf_topic, age, first): (Topic, LeafTopic, Age, MessageId),
    ) {
        leaf_topic.ages_add(first, age);
        self.topics.insert(topic.clone(), leaf_topic);
        self.dirty.insert(topic);
    }

    /// Every live body in log segment `segment`: one scan of the index (a segment is
    /// compacted once its live bodies are few, so this is rare next to the pushes that
    /// filled it).
    pub(super) fn bodies_in(&self, segment: u32) -> Vec<CompactItem> {
        let mut items = Vec::new();
        let mut keep = |topic: &Topic, key: Key, slot: &Slot| {
            if slot.location.segment == segment && slot.logged().is_some() {
                items.push(CompactItem {
                    topic: topic.clone(),
                    key,
                    location: slot.location,
                });
            }
        };
        for (name, topic) in &self.topics {
            for (key, slot) in topic.offers.iter() {
                keep(name, *key, slot);
            }
            for (&(_, id), dead) in &topic.dead {
                let key = self.key_of(dead.priority, dead.ready_at, id);
                keep(name, key, &dead.slot);
            }
        }
        for (&(ready_at, id), delayed) in self.delayed.iter() {
            let key = self.key_of(delayed.priority, ready_at, id);
            keep(&delayed.topic, key, &delayed.slot);
        }
        for leased in self.leases.by_id.values() {
            keep(&leased.topic, leased.key, &leased.slot);
        }
        items
    }

    /// Starts a compaction step when none is under way and a segment qualifies: reads up to
    /// `compaction_batch_messages` of the bodies still live in it.
    pub(super) fn maybe_compact(&mut self, _now: Time) {
        if self.compactor.step.is_some() || self.config.settings.compaction_live_pct == 0 {
            return;
        }
        let batch = self.config.settings.compaction_batch_messages.max(1) as usize;
        if self.compactor.queue.is_empty() {
            if let Some((segment, stuck)) = self.compactor.current.take() {
                // A pass is over: a segment it could not empty is not tried again (until its
                // bodies go); one whose bodies moved while queued qualifies again.
                if stuck {
                    self.compactor.stuck.insert(segment);
                } else {
                    self.check_compactable(segment);
                }
            }
            while let Some(segment) = self.compactor.candidates.pop_first() {
                if !self.bodies.segments.contains_key(&segment) {
                    continue;
                }
                let items = self.bodies_in(segment);
                if items.is_empty() {
                    continue;
                }
                let used = &self.bodies.segments[&segment];
                tracing::info!(
                    leaf = %self.config.name,
                    segment,
                    bodies = items.len(),
                    live_bytes = used.live_bytes,
                    "compacting a log segment"
                );
                self.compactor.queue = items;
                self.compactor.current = Some((segment, false));
                break;
            }
            if self.compactor.queue.is_empty() {
                return;
            }
        }
        let take = batch.min(self.compactor.queue.len());
        let items: Vec<CompactItem> = self.compactor.queue.drain(..take).collect();
        let token = self.writes.next_token;
        self.writes.next_token += 1;
        let locations = items.iter().map(|item| item.location).collect();
        self.storage.push_back(StorageOp::Read { token, locations });
        self.compactor.step = Some(Compaction {
            token,
            writing: false,
            items,
        });
    }

    /// A compaction step's bodies are read: those still live where they were are appended
    /// again at the end of the log.
    pub(super) fn compaction_read(&mut self, now: Time, bodies: Vec<Result<MessageBody, String>>) {
        let Some(mut step) = self.compactor.step.take() else {
            return;
        };
        let mut records = Vec::new();
        let mut moving = Vec::new();
        for (item, body) in step.items.into_iter().zip(bodies) {
            let Some(slot) = self.slot_mut(&item.topic, &item.key).copied() else {
                continue;
            };
            if slot.location != item.location {
                continue;
            }
            let body = match body {
                Ok(body) => body,
                Err(error) => {
                    // Left in place: its delivery will fail the same way and dead-letter it.
                    let id = item.key.id;
                    tracing::error!(%id, %error, "compaction cannot read a body; it stays");
                    if let Some((_, stuck)) = &mut self.compactor.current {
                        *stuck = true;
                    }
                    continue;
                }
            };
            let topic = &self.topics[&item.topic];
            let id = item.key.id;
            let (enqueued_at, expires_at) = match topic.dead_at.get(&id) {
                Some(at) => {
                    let dead = &topic.dead[&(*at, id)];
                    (dead.enqueued_at, dead.expires_at)
                }
                None => (topic.enqueued_at(id), self.expires_at(id)),
            };
            records.push(LogRecord::Enqueue {
                head: Leaf::head(&item.topic, topic, &item.key, enqueued_at, expires_at),
                metadata: body.metadata,
                payload: body.payload,
            });
            moving.push(item);
        }
        if records.is_empty() {
            return;
        }
        let token = self.writes.next_token;
        self.writes.next_token += 1;
        step.token = token;
        step.writing = true;
        step.items = moving;
        self.compactor.step = Some(step);
        self.log(now, Some(token), SyncWait::Linger, records);
    }

    /// A compaction step's bodies are in their new places.
    pub(super) fn compaction_written(&mut self, now: Time, locations: Vec<Location>) {
        let Some(step) = self.compactor.step.take() else {
            return;
        };
        if locations.len() == step.items.len() {
            for (item, new) in step.items.into_iter().zip(locations) {
                let Some(slot) = self.slot_mut(&item.topic, &item.key) else {
                    continue;
                };
                if slot.location != item.location {
                    continue;
                }
                slot.location = new;
                self.counters.compacted += 1;
                self.body_placed(&new);
                self.unplace_body(&item.location);
            }
        }
        self.maybe_compact(now);
    }
}
