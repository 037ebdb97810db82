//! Admin requests at the leaf: dead-letter listings, redrive, purge and stats.

use super::*;
use crate::id::MessageId;
use crate::key::Key;
use crate::machine::{ConnId, SyncWait};
use crate::record::{Location, LogRecord};
use crate::time::Time;
use crate::wire::{
    AdminOp, AdminResult, DeadLetter, LeafAdmin, LeafAdminReply, Stats, TopicConfig, TopicStats,
    Wire,
};

impl Leaf {
    pub(super) fn handle_admin(&mut self, now: Time, conn: ConnId, admin: LeafAdmin) {
        let mut records = Vec::new();
        let mut more = false;
        let result = match &admin.op {
            AdminOp::DeadLetters {
                topic,
                limit,
                after,
            } => {
                // Bodies in the log are read first; the reply waits for them.
                let (letters, more, missing, locations) =
                    self.dead_letters(topic, *limit as usize, *after);
                let waiting = Waiting::DeadLetters {
                    tag: admin.tag,
                    letters,
                    more,
                };
                self.answer(conn, waiting, missing, locations, None);
                return;
            }
            AdminOp::Redrive { topic, ids } => {
                let ids = self.dead_ids(topic, ids);
                let topic = self
                    .topics
                    .get_key_value(topic.as_str())
                    .map(|(topic, _)| topic.clone());
                for id in &ids {
                    let topic = topic.clone().expect("dead letters have a topic");
                    let leaf_topic = self.topics.get_mut(&topic).expect("present");
                    let at = leaf_topic.dead_at.remove(id).expect("listed");
                    let dead = leaf_topic.dead.remove(&(at, *id)).expect("listed");
                    leaf_topic.age_add(*id, dead.enqueued_at);
                    let key = self.key_of(dead.priority, dead.ready_at, *id);
                    self.track_expiry(dead.expires_at, &topic, key);
                    let slot = Slot {
                        attempt: 0,
                        ..dead.slot
                    };
                    records.push(LogRecord::Redrive { id: *id });
                    self.place(now, topic, key, slot);
                }
                AdminResult::Count(ids.len() as u64)
            }
            AdminOp::Purge { topic, ids } => {
                let ids = self.dead_ids(topic, ids);
                let topic = self
                    .topics
                    .get_key_value(topic.as_str())
                    .map(|(topic, _)| topic.clone());
                for id in &ids {
                    let topic = topic.clone().expect("dead letters have a topic");
                    let leaf_topic = self.topics.get_mut(&topic).expect("present");
                    let at = leaf_topic.dead_at.remove(id).expect("listed");
                    let dead = leaf_topic.dead.remove(&(at, *id)).expect("listed");
                    self.forget(&topic, *id, &dead.slot, true);
                    records.push(LogRecord::Delete { id: *id });
                }
                AdminResult::Count(ids.len() as u64)
            }
            AdminOp::PurgeTopic { topic } => {
                AdminResult::Count(self.purge_topic(topic, &mut records))
            }
            AdminOp::MoveTopic { topic, to } => {
                AdminResult::Count(self.move_topic(now, topic, to, &mut records))
            }
            AdminOp::Configure { topic, config } => {
                let kept = self.configure(topic, config, &mut records);
                self.sync_allowances(now);
                self.refresh_topic_settings(Some(now));
                AdminResult::Count(kept)
            }
            AdminOp::Configs {
                prefix,
                limit,
                after,
                within,
            } => {
                let (configs, cut) =
                    self.configs_page(prefix, *limit as usize, after.as_deref(), within.as_ref());
                more = cut;
                let next = cut
                    .then(|| configs.last().map(|(name, _)| name.clone()))
                    .flatten();
                AdminResult::Configs { configs, next }
            }
            AdminOp::Stats { topic } => AdminResult::Stats(self.topic_stats(topic.as_deref())),
            AdminOp::Reprioritize { .. } => {
                AdminResult::Reprioritized(self.reprioritize(now, &admin.op, &mut records))
            }
            AdminOp::SetMetadata {
                topic,
                id,
                metadata,
            } => AdminResult::MetadataSet(self.set_metadata(topic, *id, metadata, &mut records)),
            AdminOp::Settle { topic, op, ids } => {
                let receipts = self.live_receipts(topic, ids);
                let (results, records, outcomes) = self.settle(now, op, &receipts, None);
                let answer = SettleReply::Admin {
                    tag: admin.tag,
                    settled: results.iter().filter(|r| r.is_ok()).count() as u64,
                };
                self.log_settlement(now, conn, answer, records, outcomes);
                return;
            }
        };
        self.log(now, None, SyncWait::Linger, records);
        self.send(
            conn,
            Wire::LeafAdminReply(LeafAdminReply {
                tag: admin.tag,
                result: Some(result),
                more,
            }),
        );
    }

    /// Deletes up to `purge_batch_messages` ready and delayed messages of `topic`, the most
    /// urgent ready ones first, then the delayed ones due first; answers how many.
    fn purge_topic(&mut self, topic: &str, records: &mut Vec<LogRecord>) -> u64 {
        let Some((topic, _)) = self.topics.get_key_value(topic) else {
            return 0;
        };
        let topic = topic.clone();
        let keys = self.waiting_keys(&topic, self.config.settings.purge_batch_messages as usize);
        for key in &keys {
            let slot = self.take_waiting(&topic, key);
            self.forget(&topic, key.id, &slot, false);
            records.push(LogRecord::Delete { id: key.id });
        }
        self.counters.purged += keys.len() as u64;
        keys.len() as u64
    }

    /// The ready and delayed messages of `topic`, the most urgent ready ones first, then the
    /// delayed ones due first, at most `max`.
    fn waiting_keys(&self, topic: &Topic, max: usize) -> Vec<Key> {
        let Some(leaf_topic) = self.topics.get(topic) else {
            return Vec::new();
        };
        let mut keys: Vec<Key> = leaf_topic
            .offers
            .iter()
            .map(|(key, _)| *key)
            .take(max)
            .collect();
        if keys.len() < max && leaf_topic.delayed > 0 {
            let delayed = self
                .delayed
                .iter()
                .filter(|(_, delayed)| delayed.topic == *topic)
                .map(|(&(ready_at, id), delayed)| self.key_of(delayed.priority, ready_at, id))
                .take(max - keys.len());
            keys.extend(delayed);
        }
        keys
    }

    /// Takes a ready or delayed message of `topic` out of its index.
    pub(super) fn take_waiting(&mut self, topic: &Topic, key: &Key) -> Slot {
        let leaf_topic = self.topics.get_mut(topic).expect("present");
        if let Some(slot) = leaf_topic.unavailable(key, None) {
            return slot;
        }
        leaf_topic.delayed -= 1;
        let delayed = self.delayed.remove(&(key.ready_at, key.id));
        delayed.expect("listed as delayed").slot
    }

    /// Moves up to `purge_batch_messages` ready and delayed messages of `topic` to `to`,
    /// attempts reset; answers how many (none when `to` would pass `topics_max`).
    fn move_topic(
        &mut self,
        now: Time,
        topic: &str,
        to: &str,
        records: &mut Vec<LogRecord>,
    ) -> u64 {
        let Some((topic, _)) = self.topics.get_key_value(topic) else {
            return 0;
        };
        let topic = topic.clone();
        let room = self.topics.contains_key(to) || self.room_for_topics(&[to]).is_ok();
        if !room || *topic == *to {
            return 0;
        }
        let keys = self.waiting_keys(&topic, self.config.settings.purge_batch_messages as usize);
        for key in &keys {
            let slot = self.take_waiting(&topic, key);
            records.push(LogRecord::Move {
                id: key.id,
                topic: to.to_string(),
            });
            self.retopic(now, &topic, to, *key, slot);
        }
        keys.len() as u64
    }

    /// Makes room for a configuration of `topic` the leaf does not have: within
    /// `topic_configs_max`, and within its namespace's share (`namespace_topic_configs_max`),
    /// a deleted configuration (the oldest, of the namespace when its share is full) giving
    /// way. `false`: no room.
    fn room_for_config(&mut self, topic: &str) -> bool {
        let s = &self.config.settings;
        let namespace = crate::access::namespace(topic);
        let share = s.namespace_topic_configs_max.min(s.topic_configs_max) as usize;
        let in_namespace = |name: &String| crate::access::namespace(name) == namespace;
        let held = self
            .configs
            .keys()
            .filter(|name| in_namespace(name))
            .count();
        let full = held >= share;
        if !full && self.configs.len() < s.topic_configs_max as usize {
            return true;
        }
        let deleted = self
            .configs
            .iter()
            .filter(|(name, c)| c.deleted && (!full || in_namespace(name)))
            .min_by_key(|(_, c)| c.version)
            .map(|(name, _)| name.clone());
        match deleted {
            Some(deleted) => {
                self.configs.remove(&deleted);
                true
            }
            None => false,
        }
    }

    /// Keeps `config` for `topic` unless the leaf's is as new; answers 1 if the leaf keeps
    /// it (or a newer one), 0 if it has no room (`topic_configs_max`: a deleted one makes room).
    fn configure(
        &mut self,
        topic: &str,
        config: &TopicConfig,
        records: &mut Vec<LogRecord>,
    ) -> u64 {
        let limits_one_more = !config.deleted
            && !config.limits.is_empty()
            && !self.allowances.limits(topic)
            && self.limited_configs() >= self.config.settings.quota_scopes_max as usize;
        match self.configs.get(topic) {
            Some(old) if old.version >= config.version => return 1,
            _ if limits_one_more => return 0,
            Some(_) => {}
            None => {
                if !self.room_for_config(topic) {
                    return 0;
                }
            }
        }
        self.configs.insert(topic.to_string(), config.clone());
        records.push(LogRecord::Configure {
            topic: topic.to_string(),
            config: Box::new(config.clone()),
        });
        1
    }

    /// Configurations of topics starting with `prefix`, after `after`, by name: at most
    /// `limit`, within a frame's room (`true`: it stopped short).
    fn configs_page(
        &self,
        prefix: &str,
        limit: usize,
        after: Option<&str>,
        within: Option<&crate::access::Grants>,
    ) -> (Vec<(String, TopicConfig)>, bool) {
        use std::ops::Bound;
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let s = &self.config.settings;
        let budget = u64::from(s.frame_bytes_max - crate::config::FRAME_OVERHEAD_BYTES) / 2;
        let mut bytes = 0;
        let mut out = Vec::new();
        for (name, config) in self
            .configs
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(name, _)| within.is_none_or(|g| g.any_in(crate::access::namespace(name))))
        {
            bytes += config.frame_bytes(name);
            if out.len() == limit || (!out.is_empty() && bytes > budget) {
                return (out, true);
            }
            out.push((name.clone(), config.clone()));
        }
        (out, false)
    }

    /// The dead letters of `topic` among `ids` (empty: all of them).
    pub(super) fn dead_ids(&self, topic: &str, ids: &[MessageId]) -> Vec<MessageId> {
        let Some(leaf_topic) = self.topics.get(topic) else {
            return Vec::new();
        };
        if ids.is_empty() {
            return leaf_topic.dead.keys().map(|(_, id)| *id).collect();
        }
        let mut wanted: Vec<MessageId> = ids
            .iter()
            .copied()
            .filter(|id| leaf_topic.dead_at.contains_key(id))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// Up to `limit` dead letters of `topic`, oldest death first, within a frame's room; which
    /// of them miss their bodies, and where those are in the log.
    pub(super) fn dead_letters(
        &self,
        topic: &str,
        limit: usize,
        after: Option<(Time, MessageId)>,
    ) -> (Vec<DeadLetter>, bool, Vec<usize>, Vec<Location>) {
        use std::ops::Bound;
        let Some(leaf_topic) = self.topics.get(topic) else {
            return (Vec::new(), false, Vec::new(), Vec::new());
        };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut more = false;
        let s = &self.config.settings;
        let budget = u64::from(s.frame_bytes_max - crate::config::FRAME_OVERHEAD_BYTES);
        let mut bytes = 0;
        let mut out = Vec::new();
        let mut missing = Vec::new();
        let mut locations = Vec::new();
        for (&(dead_at, id), dead) in leaf_topic.dead.range((from, Bound::Unbounded)).take(limit) {
            let body = self.bodies.cached.get(&id);
            let body_bytes = match (body, dead.slot.logged()) {
                (Some(body), _) => body.bytes(),
                (None, Some(location)) => u64::from(location.len),
                (None, None) => 0,
            };
            let cost =
                INDEX_RECORD_BYTES + topic.len() as u64 + body_bytes + dead.reason.len() as u64;
            if !out.is_empty() && bytes + cost > budget {
                more = true;
                break;
            }
            bytes += cost;
            if body.is_none()
                && let Some(location) = dead.slot.logged()
            {
                missing.push(out.len());
                locations.push(location);
            }
            let body = body.cloned().unwrap_or_default();
            out.push(DeadLetter {
                id,
                topic: topic.to_string(),
                priority: dead.priority,
                attempts: dead.slot.attempt,
                reason: dead.reason.to_string(),
                enqueued_at: dead.enqueued_at,
                dead_at,
                metadata: self.metadata_of(id, body.metadata),
                payload: body.payload,
                escalation: self.escalations.get(&id).cloned(),
            });
        }
        (out, more, missing, locations)
    }

    /// Depths per topic and the leaf's counters (from counts kept as messages move: no scan).
    pub(super) fn topic_stats(&self, only: Option<&str>) -> Stats {
        let mut topics: Vec<TopicStats> = self
            .topics
            .iter()
            .filter(|(name, topic)| only.is_none_or(|only| only == &***name) && topic.messages > 0)
            .map(|(name, topic)| TopicStats {
                topic: name.to_string(),
                ready: crate::metrics::ready_pairs(topic.ready.iter().map(|(p, n)| (*p, *n))),
                delayed: topic.delayed,
                in_flight: topic.leased,
                dead: topic.dead.len() as u64,
                oldest_enqueued_at: topic.ages.first_key_value().map(|(_, age)| age.at),
                bytes: topic.bytes,
                // A lookup per ready priority, per report (not per message).
                oldest_ready: crate::metrics::oldest_pairs(
                    topic
                        .ready
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .filter_map(|(p, _)| Some((*p, topic.offers.oldest_ready(*p)?))),
                ),
            })
            .collect();
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        Stats {
            topics,
            expired: self.counters.expired,
            dead_lettered: self.counters.dead_lettered,
            deduplicated: self.counters.deduplicated,
            limits: Vec::new(),
        }
    }
}
