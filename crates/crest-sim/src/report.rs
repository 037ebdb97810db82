//! What a run measured: the report, its time series, and the ground truth it is measured
//! against (which acknowledged messages wait, by priority).

use super::*;
use crest_core::id::MessageId;
use crest_core::time::Time;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, u64::MAX / 4, 3).expect("valid bounds")
}

/// One point of the time series.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Milliseconds since the start.
    pub at_ms: u64,
    /// Pushes acknowledged by leaves in the interval.
    pub pushed: u64,
    /// Deliveries in the interval.
    pub delivered: u64,
    /// Messages waiting (acknowledged, not delivered) at the end of the interval.
    pub waiting: u64,
    /// Largest rank error in the interval.
    pub rank_error_max: u64,
    /// Entries held above the leaves (all windows) at the end of the interval.
    pub window_entries: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Nodes simulated.
    pub nodes: usize,
    /// Virtual milliseconds producers ran.
    pub duration_ms: u64,
    /// Virtual milliseconds simulated in all (with the drain).
    pub simulated_ms: u64,
    /// Messages acknowledged by leaves.
    pub pushed: u64,
    /// Messages delivered (first deliveries).
    pub delivered: u64,
    /// Deliveries of a message already delivered.
    pub duplicates: u64,
    /// Acknowledged messages never delivered by the end.
    pub undelivered: u64,
    /// Pushes refused by a leaf (errors).
    pub push_errors: u64,
    /// Pushes acknowledged per virtual second while producers ran.
    pub push_rate: f64,
    /// Deliveries per virtual second over the run.
    pub delivery_rate: f64,
    /// Rank error of pops (messages), one sample per delivery.
    pub rank_error: Percentiles,
    /// Inversion time of delivered messages, µs.
    pub inversion_time_us: Percentiles,
    /// Bubble-up to an aggregator's window, µs (every entry added).
    pub bubble_up_to_aggregator_us: Percentiles,
    /// Bubble-up to the root's window, µs.
    pub bubble_up_to_root_us: Percentiles,
    /// Pop latency at the consumer (request to answer, pops that delivered), µs.
    pub pop_latency_us: Percentiles,
    /// Push-ack latency at the producer, µs.
    pub push_ack_us: Percentiles,
    /// Most entries any one aggregator or root held in its windows.
    pub window_entries_max: u64,
    /// The bound on that: credits × children × windows of the widest node (a window per
    /// strict topic, one per tier of a weighted one), and the root's reserve-ahead buffers.
    pub window_entries_bound: u64,
    /// Node crashes injected.
    pub crashes: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Connections ended by partitions that outlasted the idle timeout.
    pub partition_disconnects: u64,
    /// Packets lost (and retransmitted).
    pub packets_lost: u64,
    /// Appends and checkpoints the disk model failed.
    pub disk_failures: u64,
    /// Records that survived a crash from appends not yet durable (torn writes).
    pub torn_records: u64,
    /// Leaders of replica groups elected after one was lost.
    pub failovers: u64,
    /// Replica logs read back corrupt and thrown away (the replica rejoined empty).
    pub corrupt_logs: u64,
    /// Elections of a replica lacking an entry committed before: must be 0.
    pub group_violations: u64,
    /// The first of those, described.
    pub group_violation: Option<String>,
    /// Leases granted while another lease of the same message was live: must be 0.
    pub lease_violations: u64,
    /// The first of those, described.
    pub lease_violation: Option<String>,
    /// Duplicate deliveries of messages that were not delivered-and-unconfirmed when a node
    /// crashed (at-least-once allows duplicates only of those): must be 0.
    pub unexpected_duplicates: u64,
    /// Events processed.
    pub events: u64,
    /// Per topic, what its producers and consumers saw (with more than one topic).
    pub topics: BTreeMap<String, TopicReport>,
    /// Time series, one sample per `sample_ms`.
    pub series: Vec<Sample>,
    /// The text shows each topic's priorities (the workload sets topic settings).
    #[serde(skip)]
    pub by_priority: bool,
}

/// What one topic's producers and consumers saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopicReport {
    /// Messages acknowledged by leaves.
    pub pushed: u64,
    /// Messages of push batches refused by a leaf (quota, rate, or any other reason).
    pub refused: u64,
    /// First deliveries.
    pub delivered: u64,
    /// Push-ack latency at its producers, µs.
    pub push_ack_us: Percentiles,
    /// Pop latency at its consumers (pops that delivered), µs.
    pub pop_latency_us: Percentiles,
    /// Per priority (as pushed), what its messages saw.
    pub priorities: BTreeMap<u32, PriorityReport>,
    /// Per fairness key (producers' `fairness_key`), what its messages saw.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub fairness_keys: BTreeMap<String, PriorityReport>,
}

/// What the messages of one priority (or one fairness key) of a topic saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PriorityReport {
    /// First deliveries.
    pub delivered: u64,
    /// First deliveries while producers ran (a share of pops under load).
    pub delivered_in_load: u64,
    /// Wait from the push's acknowledgement to the first delivery, µs.
    pub wait_us: Percentiles,
}

impl PriorityReport {
    fn of((delivered, in_load, waits): &(u64, u64, Histogram<u64>)) -> PriorityReport {
        PriorityReport {
            delivered: *delivered,
            delivered_in_load: *in_load,
            wait_us: Percentiles::of(waits),
        }
    }
}

/// A topic's counts and latencies as the run goes.
pub(super) struct TopicTally {
    pub(super) pushed: u64,
    pub(super) refused: u64,
    pub(super) delivered: u64,
    pub(super) push_ack: Histogram<u64>,
    pub(super) pop_latency: Histogram<u64>,
    /// Per priority: (deliveries, deliveries in the load, waits).
    pub(super) priorities: BTreeMap<u32, (u64, u64, Histogram<u64>)>,
    /// The same per fairness key.
    pub(super) keys: BTreeMap<String, (u64, u64, Histogram<u64>)>,
}

impl TopicTally {
    pub(super) fn new() -> TopicTally {
        TopicTally {
            pushed: 0,
            refused: 0,
            delivered: 0,
            push_ack: histogram(),
            pop_latency: histogram(),
            priorities: BTreeMap::new(),
            keys: BTreeMap::new(),
        }
    }

    /// A first delivery of a message of `priority` (and fairness key `key`) that waited
    /// `wait_us`.
    pub(super) fn delivered(
        &mut self,
        priority: u32,
        key: Option<&str>,
        wait_us: u64,
        in_load: bool,
    ) {
        self.delivered += 1;
        let count = |(all, load, waits): &mut (u64, u64, Histogram<u64>)| {
            *all += 1;
            *load += u64::from(in_load);
            waits.saturating_record(wait_us.max(1));
        };
        count(
            self.priorities
                .entry(priority)
                .or_insert_with(|| (0, 0, histogram())),
        );
        if let Some(key) = key {
            if !self.keys.contains_key(key) {
                self.keys.insert(key.to_string(), (0, 0, histogram()));
            }
            count(self.keys.get_mut(key).expect("inserted"));
        }
    }

    pub(super) fn report(&self) -> TopicReport {
        TopicReport {
            pushed: self.pushed,
            refused: self.refused,
            delivered: self.delivered,
            push_ack_us: Percentiles::of(&self.push_ack),
            pop_latency_us: Percentiles::of(&self.pop_latency),
            priorities: self
                .priorities
                .iter()
                .map(|(priority, tally)| (*priority, PriorityReport::of(tally)))
                .collect(),
            fairness_keys: self
                .keys
                .iter()
                .map(|(key, tally)| (key.clone(), PriorityReport::of(tally)))
                .collect(),
        }
    }
}

impl SimReport {
    /// The invariants that must hold at the end of every run, violated ones described: every
    /// acknowledged message delivered, duplicates only of deliveries a crash left
    /// unconfirmed, memory above the leaves within its bound.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.undelivered > 0 {
            out.push(format!(
                "{} acknowledged messages were never delivered (lengthen drain_ms if leases cut by a crash had not expired yet)",
                self.undelivered
            ));
        }
        if self.unexpected_duplicates > 0 {
            out.push(format!(
                "{} duplicate deliveries not explained by a crash",
                self.unexpected_duplicates
            ));
        }
        if self.lease_violations > 0 {
            out.push(format!(
                "{} leases granted while another lease of the message was live (first: {})",
                self.lease_violations,
                self.lease_violation.as_deref().unwrap_or("?")
            ));
        }
        if self.group_violations > 0 {
            out.push(format!(
                "{} elections of a replica lacking a committed entry (first: {})",
                self.group_violations,
                self.group_violation.as_deref().unwrap_or("?")
            ));
        }
        if self.window_entries_max > self.window_entries_bound {
            out.push(format!(
                "windows above the leaves held {} entries, over their bound {}",
                self.window_entries_max, self.window_entries_bound
            ));
        }
        out
    }

    /// The report as text (deterministic).
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "crest sim: seed {}, {} nodes, {} ms of load ({} ms simulated), {} events",
            self.seed, self.nodes, self.duration_ms, self.simulated_ms, self.events
        );
        let _ = writeln!(
            out,
            "  pushed {} ({:.0}/s)  delivered {} ({:.0}/s)  duplicates {}  undelivered {}  push errors {}",
            self.pushed,
            self.push_rate,
            self.delivered,
            self.delivery_rate,
            self.duplicates,
            self.undelivered,
            self.push_errors
        );
        let _ = writeln!(
            out,
            "  windows above the leaves: at most {} entries (bound {})",
            self.window_entries_max, self.window_entries_bound
        );
        if self.crashes + self.partitions + self.packets_lost + self.disk_failures > 0 {
            let _ = writeln!(
                out,
                "  faults: crashes {}  partitions {} ({} connections ended)  packets lost {}  \
                 disk failures {}  torn records {}  unexpected duplicates {}  lease violations {}",
                self.crashes,
                self.partitions,
                self.partition_disconnects,
                self.packets_lost,
                self.disk_failures,
                self.torn_records,
                self.unexpected_duplicates,
                self.lease_violations
            );
        }
        if self.failovers + self.corrupt_logs > 0 {
            let _ = writeln!(
                out,
                "  replica groups: failovers {}  corrupt logs {}  elections lacking a committed entry {}",
                self.failovers, self.corrupt_logs, self.group_violations
            );
        }
        let _ = writeln!(
            out,
            "  {:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "", "count", "p50", "p90", "p99", "p99.9", "max"
        );
        for (name, p) in [
            ("rank error (msgs)", &self.rank_error),
            ("inversion time (us)", &self.inversion_time_us),
            (
                "bubble-up to aggregator (us)",
                &self.bubble_up_to_aggregator_us,
            ),
            ("bubble-up to root (us)", &self.bubble_up_to_root_us),
            ("pop latency (us)", &self.pop_latency_us),
            ("push-ack latency (us)", &self.push_ack_us),
        ] {
            let _ = writeln!(
                out,
                "  {:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                name, p.count, p.p50, p.p90, p.p99, p.p999, p.max
            );
        }
        if self.topics.len() > 1 {
            let _ = writeln!(
                out,
                "  {:<20} {:>9} {:>9} {:>9} {:>14} {:>14} {:>14} {:>14}",
                "topic",
                "pushed",
                "refused",
                "delivered",
                "push-ack p50",
                "push-ack p99",
                "pop p50",
                "pop p99"
            );
            for (topic, t) in &self.topics {
                let _ = writeln!(
                    out,
                    "  {:<20} {:>9} {:>9} {:>9} {:>14} {:>14} {:>14} {:>14}",
                    topic,
                    t.pushed,
                    t.refused,
                    t.delivered,
                    t.push_ack_us.p50,
                    t.push_ack_us.p99,
                    t.pop_latency_us.p50,
                    t.pop_latency_us.p99
                );
            }
        }
        if self.by_priority {
            let _ = writeln!(
                out,
                "  {:<20} {:>8} {:>9} {:>13} {:>13} {:>13} {:>13}",
                "topic priority",
                "share",
                "delivered",
                "wait p50 us",
                "wait p99 us",
                "wait max us",
                "in load"
            );
            for (topic, t) in &self.topics {
                let in_load: u64 = t.priorities.values().map(|p| p.delivered_in_load).sum();
                let priorities = t.priorities.iter().map(|(p, r)| (p.to_string(), r));
                let keys = t.fairness_keys.iter().map(|(k, r)| (format!("key {k}"), r));
                for (name, p) in priorities.chain(keys) {
                    let share = 100.0 * p.delivered_in_load as f64 / in_load.max(1) as f64;
                    let _ = writeln!(
                        out,
                        "  {:<20} {:>7.2}% {:>9} {:>13} {:>13} {:>13} {:>13}",
                        format!("{topic} {name}"),
                        share,
                        p.delivered,
                        p.wait_us.p50,
                        p.wait_us.p99,
                        p.wait_us.max,
                        p.delivered_in_load
                    );
                }
            }
        }
        out
    }
}

/// Ground truth about messages: which are waiting, their priorities, their inversion marks.
#[derive(Default)]
pub(super) struct Truth {
    /// Waiting messages per priority (acknowledged, not delivered).
    pub(super) waiting: BTreeMap<u32, u64>,
    /// Per priority: messages in acknowledgement order and the time each was first passed
    /// over by the delivery of a less urgent message (`None`: not yet).
    pub(super) levels: BTreeMap<u32, Level>,
    /// Where each waiting message sits: (priority, index in its level).
    pub(super) index: HashMap<MessageId, (u32, usize)>,
    pub(super) delivered: HashMap<MessageId, ()>,
    pub(super) duplicates: u64,
    pub(super) duplicate_ids: Vec<MessageId>,
}

/// A first delivery, measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Measured {
    /// Messages more urgent than it that were waiting.
    pub(super) rank_error: u64,
    /// Since the first delivery of a less urgent message passed it over, µs.
    pub(super) inversion_us: u64,
    /// Since its push was acknowledged, µs.
    pub(super) wait_us: u64,
}

#[derive(Default)]
pub(super) struct Level {
    pub(super) marks: Vec<Option<Time>>,
    /// When each message was acknowledged.
    pub(super) acked: Vec<Time>,
    /// Messages before this index are marked (or gone).
    pub(super) unmarked_from: usize,
}

impl Truth {
    pub(super) fn acked(&mut self, id: MessageId, priority: u32, now: Time) {
        *self.waiting.entry(priority).or_default() += 1;
        let level = self.levels.entry(priority).or_default();
        level.marks.push(None);
        level.acked.push(now);
        self.index.insert(id, (priority, level.marks.len() - 1));
    }

    /// A delivery at `now`, measured if it is a first delivery.
    pub(super) fn delivered(
        &mut self,
        id: MessageId,
        priority: u32,
        now: Time,
    ) -> Option<Measured> {
        if self.delivered.insert(id, ()).is_some() {
            self.duplicates += 1;
            self.duplicate_ids.push(id);
            return None;
        }
        let rank_error = self.waiting.range(..priority).map(|(_, n)| n).sum();
        // Every waiting message more urgent than this one is now passed over.
        for (_, level) in self.levels.range_mut(..priority) {
            for mark in &mut level.marks[level.unmarked_from..] {
                mark.get_or_insert(now);
            }
            level.unmarked_from = level.marks.len();
        }
        let since = |at: Time| now.saturating_since(at).as_micros() as u64;
        let (inversion_us, wait_us) = match self.index.remove(&id) {
            Some((level, at)) => {
                if let Some(count) = self.waiting.get_mut(&level) {
                    *count = count.saturating_sub(1);
                }
                let level = &self.levels[&level];
                (level.marks[at].map_or(0, since), since(level.acked[at]))
            }
            // Delivered before the sim saw its acknowledgement leave the leaf: impossible in
            // order, counted as no inversion and no wait.
            None => (0, 0),
        };
        Some(Measured {
            rank_error,
            inversion_us,
            wait_us,
        })
    }

    pub(super) fn waiting_total(&self) -> u64 {
        self.waiting.values().sum()
    }
}
