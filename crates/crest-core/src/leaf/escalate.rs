//! What changes of a message while it waits: its priority (an admin's `Reprioritize`, and
//! each topic's aging: a message ready longer than its priority's threshold moves one
//! priority up) and its metadata (an admin's `SetMetadata`).
//!
//! Either way the message is taken out of its index and placed again under its new key: a
//! ready one the parent holds is retracted and offered again, so the tree sees the change
//! with its next offer. Each change is logged (`LogRecord::Reprioritize`) with who, when and
//! why and the priority the message was pushed with, and checkpoints log the latest change of
//! each message, so that a restart keeps it.
//!
//! Aging needs no scan of every message: within a priority the index is in ready-time order,
//! so the oldest ready messages of a tier come first and a check stops at the first one that
//! has not waited the tier's threshold. A promoted message keeps its ready time but its key
//! is marked aged (`Key::aged`): it goes ahead of the messages given its new tier, so a flood
//! of that tier cannot hold it back, and among the promoted ones the oldest goes first. It is
//! due again once it has waited the thresholds of every tier it went through; each check
//! walks a tier's promoted run, then its native run, each from its oldest.

use super::*;
use crate::config::Aging;
use crate::machine::SyncWait;
use crate::wire::{AdminOp, Escalation, NotWaiting};

impl Leaf {
    /// Rebuilds the tables of aging and of weighted topics from the topology's topic settings
    /// and those set at run time (which win), moves the available messages of topics whose
    /// tiers changed into their new lanes, and schedules an aging check at `now` if one is not
    /// due.
    pub(super) fn refresh_topic_settings(&mut self, now: Option<Time>) {
        let s = &self.config.settings;
        let mut aging = BTreeMap::new();
        let mut weighted = std::collections::HashMap::new();
        let mut fifo = HashSet::new();
        let names = s.topics.keys().chain(self.configs.keys());
        for name in names {
            let runtime = self.runtime(name);
            let topology = s.topics.get(name);
            let merged = match (runtime, topology) {
                (Some(runtime), Some(topology)) => runtime.over(topology),
                (Some(one), None) | (None, Some(one)) => one.clone(),
                (None, None) => continue,
            };
            if merged.is_fifo() {
                fifo.insert(name.clone());
            }
            if let Some(weights) = merged.weighted() {
                let keys = merged.fairness_weights.iter().flat_map(|w| &w.milli);
                let keys = keys.map(|(key, milli)| (Arc::from(key.as_str()), *milli));
                weighted.insert(name.clone(), (weights, keys.collect()));
            }
            if let Some(thresholds) = merged.aging.filter(|a| !a.thresholds.is_empty()) {
                aging.insert(name.clone(), (thresholds, merged.aging_floor.unwrap_or(0)));
            }
        }
        self.aging = aging;
        for (name, topic) in &mut self.topics {
            let policy = weighted.get(&**name);
            if topic.offers.policy() != policy {
                topic.offers.set_policy(policy.cloned());
                self.dirty.insert(name.clone());
            }
        }
        self.weighted = weighted;
        for (name, topic) in &mut self.topics {
            let leased = self
                .leases
                .by_id
                .values()
                .filter(|leased| leased.topic == *name)
                .map(|leased| leased.key);
            if topic.set_fifo(fifo.contains(&**name), leased) {
                self.dirty.insert(name.clone());
            }
        }
        self.fifo = fifo;
        if let Some(now) = now {
            self.schedule_aging(now);
        }
    }

    /// Makes sure a check is due while some topic ages (checks go on while one does: each
    /// costs a look at the oldest ready messages of its aging priorities).
    pub(super) fn schedule_aging(&mut self, now: Time) {
        if self.aging_due.is_none() && !self.aging.is_empty() {
            let every = Duration::from_millis(self.config.settings.aging_check_ms);
            self.aging_due = Some(now + every);
        }
    }

    /// When the next aging check is due.
    pub(super) fn aging_due(&self) -> Option<Time> {
        self.aging_due
    }

    /// Promotes the ready messages of aging topics that waited past their thresholds, if a
    /// check is due.
    pub(super) fn age(&mut self, now: Time) {
        if self.aging_due.is_none_or(|due| due > now) {
            return;
        }
        self.aging_due = None;
        let scan = self.config.settings.aging_scan_messages as usize;
        let mut records = Vec::new();
        let topics: Vec<(String, Aging, u32)> = self
            .aging
            .iter()
            .map(|(name, (aging, floor))| (name.clone(), aging.clone(), *floor))
            .collect();
        for (name, aging, floor) in topics {
            let Some((topic, leaf_topic)) = self.topics.get_key_value(name.as_str()) else {
                continue;
            };
            let topic = topic.clone();
            let mut promote = Vec::new();
            for (&priority, &threshold) in &aging.thresholds {
                if priority <= floor || !leaf_topic.ready.contains_key(&priority) {
                    continue;
                }
                // The aged (promoted into `priority` already) come first, then the natives:
                // each in ready-time order, so each check stops at its first young message.
                let aged = leaf_topic.offers.keys_from(&Key::first_of(priority), scan);
                let natives = Key::new(priority, Time::ZERO, MessageId(0));
                let natives = leaf_topic.offers.keys_from(&natives, scan);
                let aged = aged.into_iter().take_while(|key| !key.native());
                for key in aged.chain(natives) {
                    if key.priority() != priority || key.ready_at + threshold > now {
                        if key.native() {
                            break;
                        }
                        continue;
                    }
                    // An admin's priority stands; aging goes on from where aging left it.
                    let origin = match self.escalations.get(&key.id) {
                        Some(e) if !e.aged => continue,
                        Some(e) => e.original_priority,
                        None => priority,
                    };
                    if key.ready_at + aging.due_after(priority, origin) <= now {
                        promote.push((key, origin, threshold));
                    }
                }
            }
            for (key, origin, threshold) in promote {
                let escalation = Escalation {
                    original_priority: origin,
                    escalated_at: now,
                    escalated_by: None,
                    reason: format!(
                        "aged: ready for more than {} at priority {}",
                        humantime::format_duration(threshold),
                        key.priority()
                    ),
                    aged: true,
                };
                self.rekey(
                    now,
                    &topic,
                    key,
                    key.priority() - 1,
                    escalation,
                    &mut records,
                );
                self.counters.aged += 1;
            }
        }
        self.schedule_aging(now);
        self.log(now, None, SyncWait::Linger, records);
    }

    /// The key of message `id` at `priority`, ready since `ready_at`: an aged one (ahead of
    /// the messages given `priority`) if aging moved it there, else a native one. Every place
    /// that rebuilds a waiting message's key asks here, so a promotion's place survives a
    /// delay, a nack, a redrive and a restart.
    pub(super) fn key_of(&self, priority: u32, ready_at: Time, id: MessageId) -> Key {
        match !self.escalations.is_empty() && self.escalations.get(&id).is_some_and(|e| e.aged) {
            true => Key::aged(priority, ready_at, id),
            false => Key::new(priority, ready_at, id),
        }
    }

    /// An admin's change of message `id`'s priority (see [`AdminOp::Reprioritize`]).
    ///
    /// [`AdminOp::Reprioritize`]: crate::wire::AdminOp::Reprioritize
    pub(super) fn reprioritize(
        &mut self,
        now: Time,
        op: &AdminOp,
        records: &mut Vec<LogRecord>,
    ) -> Result<Escalation, NotWaiting> {
        let AdminOp::Reprioritize {
            topic,
            id,
            priority,
            reason,
            by,
        } = op
        else {
            return Err(NotWaiting::Unknown);
        };
        let (id, priority) = (*id, *priority);
        let (topic, key) = self.waiting_key(topic, id)?;
        let original_priority = self
            .escalations
            .get(&id)
            .map_or(key.priority(), |e| e.original_priority);
        let escalation = Escalation {
            original_priority,
            escalated_at: now,
            escalated_by: by.clone(),
            reason: reason.clone(),
            aged: false,
        };
        self.rekey(now, &topic, key, priority, escalation.clone(), records);
        self.counters.reprioritized += 1;
        Ok(escalation)
    }

    /// An admin's replacement of message `id`'s metadata (see [`AdminOp::SetMetadata`]).
    pub(super) fn set_metadata(
        &mut self,
        topic: &str,
        id: MessageId,
        metadata: &[(String, String)],
        records: &mut Vec<LogRecord>,
    ) -> Result<(), NotWaiting> {
        self.waiting_key(topic, id)?;
        records.push(LogRecord::SetMetadata {
            id,
            metadata: metadata.to_vec(),
        });
        self.metadata.insert(id, metadata.to_vec());
        Ok(())
    }

    /// The metadata of message `id`: what an admin set, else `pushed` (its body's).
    pub(super) fn metadata_of(
        &self,
        id: MessageId,
        pushed: Vec<(String, String)>,
    ) -> Vec<(String, String)> {
        match self.metadata.is_empty() {
            true => pushed,
            false => self.metadata.get(&id).cloned().unwrap_or(pushed),
        }
    }

    /// Where waiting (ready or delayed) message `id` of `topic` is, or why it is not waiting.
    /// A message ready since it was accepted (most are) is found at once, by its key at each
    /// priority the topic has ready messages of; one delayed or nacked since, by a scan of the
    /// topic's waiting messages.
    fn waiting_key(&self, topic: &str, id: MessageId) -> Result<(Topic, Key), NotWaiting> {
        if let Some(leased) = self.leases.by_id.get(&id) {
            return Err(match &*leased.topic == topic {
                true => NotWaiting::Leased,
                false => NotWaiting::Unknown,
            });
        }
        let Some((name, leaf_topic)) = self.topics.get_key_value(topic) else {
            return Err(NotWaiting::Unknown);
        };
        if leaf_topic.dead_at.contains_key(&id) {
            return Err(NotWaiting::Dead);
        }
        if id.leaf() != self.config.id || !self.live.contains(id.seq()) {
            return Err(NotWaiting::Unknown);
        }
        let enqueued_at = leaf_topic.enqueued_at(id);
        let tracked = self.ttl.by_id.get(&id).map(|ttl| ttl.key);
        let guesses = leaf_topic
            .ready
            .keys()
            .map(|&priority| self.key_of(priority, enqueued_at, id));
        for key in tracked.into_iter().chain(guesses) {
            let delayed = self
                .delayed
                .get(&(key.ready_at, id))
                .is_some_and(|d| d.topic == *name);
            if delayed || leaf_topic.offers.get(&key).is_some() {
                return Ok((name.clone(), key));
            }
        }
        if let Some((key, _)) = leaf_topic.offers.iter().find(|(key, _)| key.id == id) {
            return Ok((name.clone(), *key));
        }
        if leaf_topic.delayed > 0 {
            let found = self
                .delayed
                .iter()
                .find(|((_, delayed_id), delayed)| *delayed_id == id && delayed.topic == *name);
            if let Some((&(ready_at, _), delayed)) = found {
                let key = self.key_of(delayed.priority, ready_at, id);
                return Ok((name.clone(), key));
            }
        }
        Err(NotWaiting::Unknown)
    }

    /// Moves waiting message `key` of `topic` to `priority` (the parent's copy retracted and
    /// the new one offered), logging `escalation`.
    fn rekey(
        &mut self,
        now: Time,
        topic: &Topic,
        key: Key,
        priority: u32,
        escalation: Escalation,
        records: &mut Vec<LogRecord>,
    ) {
        records.push(LogRecord::Reprioritize {
            id: key.id,
            priority,
            escalation: escalation.clone(),
        });
        self.escalations.insert(key.id, escalation);
        let moved = self.key_of(priority, key.ready_at, key.id);
        if moved == key {
            return;
        }
        let slot = self.take_waiting(topic, &key);
        if let Some(ttl) = self.ttl.by_id.get_mut(&key.id) {
            ttl.key = moved;
        }
        self.place(now, topic.clone(), moved, slot);
    }
}
