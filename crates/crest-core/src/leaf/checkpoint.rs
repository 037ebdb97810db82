//! What a leaf logs, and when it replaces its log with a checkpoint of its index.

use super::*;
use crate::machine::{StorageOp, SyncWait};
use crate::record::LogRecord;
use crate::time::Time;
use std::time::Duration;

impl Leaf {
    /// Appends records to the log (through `poll_storage`) and counts log growth.
    pub(super) fn log(
        &mut self,
        now: Time,
        token: Option<u64>,
        wait: SyncWait,
        records: Vec<LogRecord>,
    ) {
        if records.is_empty() && token.is_none() {
            return;
        }
        self.checkpoints.logged_bytes += records.iter().map(record_bytes).sum::<u64>();
        if self.checkpoints.due.is_none() {
            let interval = Duration::from_millis(self.config.settings.checkpoint_interval_ms);
            self.checkpoints.due = Some(now + interval);
        }
        self.storage.push_back(StorageOp::Append {
            token,
            records,
            wait,
        });
    }

    /// Approximate bytes a checkpoint of the live state would take.
    pub(super) fn live_bytes(&self) -> u64 {
        // Pending batches count too: the log replays them after the snapshot.
        let configs: u64 = self
            .configs
            .iter()
            .map(|(topic, config)| config.frame_bytes(topic))
            .sum();
        (self.live.len() + self.writes.messages) * INDEX_RECORD_BYTES
            + self.bodies.unlogged_bytes
            + self.dedup_len() as u64 * 64
            + configs
    }

    /// Takes a checkpoint when the log has grown by `checkpoint_log_bytes` and a snapshot would
    /// be at most half its size, or when `checkpoint_interval_ms` passed since the first record
    /// logged after the last checkpoint.
    pub(super) fn maybe_checkpoint(&mut self, now: Time) {
        let by_growth = self.checkpoints.logged_bytes >= self.config.settings.checkpoint_log_bytes
            && self.live_bytes().saturating_mul(2) <= self.checkpoints.logged_bytes;
        let by_time = self.checkpoints.due.is_some_and(|due| due <= now);
        if !(by_growth || by_time) {
            return;
        }
        let records = self.snapshot();
        let compaction = self.compactor.step.as_ref().filter(|c| c.writing);
        let includes = self
            .writes
            .batches
            .keys()
            .chain(self.writes.settlements.keys())
            .copied()
            .chain(compaction.map(|c| c.token))
            .collect();
        let segments = self.bodies.segments.keys().copied().collect();
        self.checkpoints.logged_bytes = 0;
        self.checkpoints.due = None;
        self.storage.push_back(StorageOp::Checkpoint {
            records,
            includes,
            segments,
        });
    }

    /// The leaf's state as log records, except the batches still pending (the log replays
    /// their appends after the snapshot: see [`StorageOp::Checkpoint`]). Replaying them
    /// rebuilds the leaf (see `recover`). Bodies in the log are referred to, not copied.
    pub(super) fn snapshot(&self) -> Vec<LogRecord> {
        let mut records = Vec::with_capacity(self.live.len() as usize + self.dedup_len());
        for (name, topic) in &self.topics {
            for (key, slot) in topic.offers.iter() {
                let head = Leaf::head(
                    name,
                    topic,
                    key,
                    topic.enqueued_at(key.id),
                    self.expires_at(key.id),
                );
                self.message_records(&mut records, head, slot, None);
            }
            for (&(at, id), dead) in &topic.dead {
                let key = self.key_of(dead.priority, dead.ready_at, id);
                let head = Leaf::head(name, topic, &key, dead.enqueued_at, dead.expires_at);
                self.message_records(&mut records, head, &dead.slot, Some((at, &dead.reason)));
            }
        }
        for (&(ready_at, id), delayed) in self.delayed.iter() {
            let key = self.key_of(delayed.priority, ready_at, id);
            let topic = &self.topics[&delayed.topic];
            let head = Leaf::head(
                &delayed.topic,
                topic,
                &key,
                topic.enqueued_at(id),
                self.expires_at(id),
            );
            self.message_records(&mut records, head, &delayed.slot, None);
        }
        for (&id, leased) in &self.leases.by_id {
            let topic = &self.topics[&leased.topic];
            let head = Leaf::head(
                &leased.topic,
                topic,
                &leased.key,
                topic.enqueued_at(id),
                self.expires_at(id),
            );
            self.message_records(&mut records, head, &leased.slot, None);
            // The lease itself, so that it outlives the log it replaces.
            records.push(LogRecord::Lease {
                id,
                attempt: leased.slot.attempt,
                deadline: leased.deadline,
                token: leased.token,
            });
        }
        for (topic, config) in &self.configs {
            records.push(LogRecord::Configure {
                topic: topic.clone(),
                config: Box::new(config.clone()),
            });
        }
        for ((until, id), (topic, key)) in &self.dedup.by_expiry {
            records.push(LogRecord::Dedup {
                topic: topic.to_string(),
                key: key.to_string(),
                id: *id,
                until: *until,
            });
        }
        records
    }
}
