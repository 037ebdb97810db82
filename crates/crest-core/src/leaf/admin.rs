//! Admin requests at the leaf: dead-letter listings, redrive, purge and stats.

use super::*;
use crate::id::MessageId;
use crate::key::Key;
use crate::machine::{ConnId, SyncWait};
use crate::record::{Location, LogRecord};
use crate::time::Time;
use crate::wire::{
    AdminOp, AdminResult, DeadLetter, LeafAdmin, LeafAdminReply, Stats, TopicStats, Wire,
};

impl Leaf {
    pub(super) fn handle_admin(&mut self, now: Time, conn: ConnId, admin: LeafAdmin) {
        let mut records = Vec::new();
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
                    let key = Key {
                        priority: dead.priority,
                        ready_at: dead.ready_at,
                        id: *id,
                    };
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
            AdminOp::Stats { topic } => AdminResult::Stats(self.topic_stats(topic.as_deref())),
            AdminOp::Settle { topic, op, ids } => {
                let receipts = self.live_receipts(topic, ids);
                let (results, records, outcomes) = self.settle(now, op, &receipts);
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
                more: false,
            }),
        );
    }

    /// Deletes up to `purge_batch_messages` ready and delayed messages of `topic`, the most
    /// urgent ready ones first, then the delayed ones due first; answers how many.
    fn purge_topic(&mut self, topic: &str, records: &mut Vec<LogRecord>) -> u64 {
        let Some((topic, leaf_topic)) = self.topics.get_key_value(topic) else {
            return 0;
        };
        let topic = topic.clone();
        let max = self.config.settings.purge_batch_messages as usize;
        let ready: Vec<Key> = leaf_topic
            .offers
            .iter()
            .map(|(key, _)| *key)
            .take(max)
            .collect();
        let mut purged = 0;
        for key in ready {
            let leaf_topic = self.topics.get_mut(&topic).expect("present");
            let slot = leaf_topic.unavailable(&key, None).expect("listed");
            self.forget(&topic, key.id, &slot, false);
            records.push(LogRecord::Delete { id: key.id });
            purged += 1;
        }
        let room = max - purged;
        let delayed: Vec<(Time, MessageId)> =
            if room > 0 && self.topics.get(&topic).is_some_and(|t| t.delayed > 0) {
                self.delayed
                    .iter()
                    .filter(|(_, delayed)| delayed.topic == topic)
                    .map(|(at_id, _)| *at_id)
                    .take(room)
                    .collect()
            } else {
                Vec::new()
            };
        for at_id in delayed {
            let delayed = self.delayed.remove(&at_id).expect("listed");
            self.topics.get_mut(&topic).expect("present").delayed -= 1;
            self.forget(&topic, at_id.1, &delayed.slot, false);
            records.push(LogRecord::Delete { id: at_id.1 });
            purged += 1;
        }
        self.counters.purged += purged as u64;
        purged as u64
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
                metadata: body.metadata,
                payload: body.payload,
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
            })
            .collect();
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        Stats {
            topics,
            expired: self.counters.expired,
            dead_lettered: self.counters.dead_lettered,
            deduplicated: self.counters.deduplicated,
        }
    }
}
