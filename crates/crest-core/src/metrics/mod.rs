//! Measurements of a node, and the reports that carry them up the tree.
//!
//! Every node records latency and size histograms ([`Metric`]) in a [`Recorder`] that keeps
//! the *recent* past (the current window and the one before: between one and two
//! [`RECENT_WINDOW`]s), plus counters and gauges. Every `report_interval_ms` a leaf or
//! aggregator sends its parent a [`Report`] of its whole subtree: one [`NodeReport`] per node
//! (counters, gauges, its own percentiles), the histograms merged over the subtree, and the
//! subtree's topic stats merged. The root's report is therefore the whole tree; every node
//! serves its own subtree's report (HTTP `/stats`, `/metrics`, the dashboard).
//!
//! Sizes are bounded: histograms travel as their non-empty buckets at two significant digits
//! (at most a few hundred pairs each), a report names at most the nodes of the topology, and
//! its topic list is capped by `report_topics_max` (the deepest topics are kept). A parent
//! decodes a child's report with each list bounded (the `*_MAX` constants here and
//! [`REPORT_TOPICS_MAX`]), refusing a longer one before building it.

use crate::config::{REPORT_TOPICS_MAX, Settings};
use crate::id::{ConnId, LeafId};
use crate::time::Time;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::HashMap;

mod lag;
pub(crate) use lag::ConsumerLag;
pub use lag::{LAG_BOUNDS_MS, LagSeries};
use std::time::Duration;

/// How long one recording window lasts; "recent" is the current window and the previous one.
pub const RECENT_WINDOW: Duration = Duration::from_secs(10);

/// Largest value a histogram records (one hour in microseconds; larger values saturate).
const VALUE_MAX: u64 = 3_600_000_000;

/// What a histogram measures.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum Metric {
    /// From a leaf making a message available (durable ack, delay over, release) to its entry
    /// reaching an aggregator's window, µs.
    BubbleToAggregator,
    /// From a leaf making a message available to its entry reaching the root's window, µs.
    BubbleToRoot,
    /// The last hop alone: from the entry reaching the root's child (an aggregator's window,
    /// or a leaf directly below the root) to the root's window, µs.
    HopToRoot,
    /// At a leaf: push batch received to acknowledged (durable), µs.
    PushAck,
    /// At the root: pop received to answered, for pops that delivered something, µs.
    Pop,
    /// At the root: reserve sent to its answer from the leaf, µs.
    ReserveRoundTrip,
    /// At a leaf: messages per push batch.
    PushBatch,
    /// At the root: deliveries per answered pop.
    PopBatch,
    /// At a leaf: the `fdatasync` of a log group that pushes or acks waited for, µs (the
    /// floor under a durable push's acknowledgement).
    LogSync,
}

impl Metric {
    /// Every metric, in order.
    pub const ALL: [Metric; 9] = [
        Metric::BubbleToAggregator,
        Metric::BubbleToRoot,
        Metric::HopToRoot,
        Metric::PushAck,
        Metric::Pop,
        Metric::ReserveRoundTrip,
        Metric::PushBatch,
        Metric::PopBatch,
        Metric::LogSync,
    ];

    /// A stable snake_case name (Prometheus, JSON, the dashboard).
    pub fn name(self) -> &'static str {
        match self {
            Metric::BubbleToAggregator => "bubble_up_to_aggregator",
            Metric::BubbleToRoot => "bubble_up_to_root",
            Metric::HopToRoot => "hop_to_root",
            Metric::PushAck => "push_ack",
            Metric::Pop => "pop",
            Metric::ReserveRoundTrip => "reserve_round_trip",
            Metric::PushBatch => "push_batch",
            Metric::PopBatch => "pop_batch",
            Metric::LogSync => "log_sync",
        }
    }

    /// What it measures, in a line (`/metrics`'s help).
    pub fn help(self) -> &'static str {
        match self {
            Metric::BubbleToAggregator => {
                "from a leaf making a message available to its entry reaching an aggregator"
            }
            Metric::BubbleToRoot => {
                "from a leaf making a message available to its entry reaching the root"
            }
            Metric::HopToRoot => "the last hop alone: the root's child to the root's window",
            Metric::PushAck => "at a leaf: push batch received to acknowledged (durable)",
            Metric::Pop => "at the root: pop received to answered, for pops that delivered",
            Metric::ReserveRoundTrip => "at the root: reserve sent to the leaf's answer",
            Metric::PushBatch => "at a leaf: messages per push batch",
            Metric::PopBatch => "at the root: deliveries per answered pop",
            Metric::LogSync => {
                "at a leaf: the fdatasync of a log group that pushes or acks waited for"
            }
        }
    }

    /// The unit of the values.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::PushBatch | Metric::PopBatch => "messages",
            _ => "microseconds",
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, VALUE_MAX, 2).expect("valid bounds")
}

/// A histogram as it travels: `(value, count)` of each non-empty bucket, values ascending.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hist(
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, HIST_BUCKETS_MAX>")] pub Vec<(u64, u64)>,
);

/// Most buckets a [`Hist`] holds: every bucket of a histogram, so any real one fits.
pub const HIST_BUCKETS_MAX: usize = 4096;

impl Hist {
    fn of(histogram: &Histogram<u64>) -> Hist {
        Hist(
            histogram
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        )
    }

    fn to_histogram(&self) -> Histogram<u64> {
        let mut histogram = histogram();
        self.add_to(&mut histogram);
        histogram
    }

    fn add_to(&self, histogram: &mut Histogram<u64>) {
        for &(value, count) in &self.0 {
            let _ = histogram.record_n(value.clamp(1, VALUE_MAX), count);
        }
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Hist) {
        let mut histogram = self.to_histogram();
        other.add_to(&mut histogram);
        *self = Hist::of(&histogram);
    }

    /// Number of values recorded (saturating: a child's counts are not trusted to be sane).
    pub fn count(&self) -> u64 {
        self.0
            .iter()
            .map(|(_, count)| *count)
            .fold(0, u64::saturating_add)
    }

    /// Percentiles of the values.
    pub fn percentiles(&self) -> Percentiles {
        Percentiles::of(&self.to_histogram())
    }

    /// Cumulative counts at or below each bound (Prometheus buckets), for `bounds` ascending.
    pub fn cumulative(&self, bounds: &[u64]) -> Vec<u64> {
        bounds
            .iter()
            .map(|bound| {
                self.0
                    .iter()
                    .filter(|(value, _)| value <= bound)
                    .map(|(_, count)| *count)
                    .fold(0, u64::saturating_add)
            })
            .collect()
    }

    /// Sum of the values (bucket values times counts; approximate within the precision).
    pub fn sum(&self) -> u64 {
        self.0
            .iter()
            .map(|(value, count)| value.saturating_mul(*count))
            .fold(0u64, u64::saturating_add)
    }
}

/// Percentiles of one histogram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest value.
    pub max: u64,
}

impl Percentiles {
    /// Percentiles of a histogram (all zero when it is empty).
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: histogram.len(),
            p50: histogram.value_at_quantile(0.5),
            p90: histogram.value_at_quantile(0.9),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
        }
    }
}

/// A node's histograms over the recent past (see the module doc).
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Per metric (indexed by `Metric as usize`: no map search per record).
    current: Windows,
    previous: Windows,
    /// Every window before the current one, since the node started: with the current window,
    /// the cumulative histograms `/metrics` serves (Prometheus histograms never go down).
    /// Added to once per window, so recording costs what it did.
    earlier: Windows,
    window_start: Time,
}

/// One histogram slot per metric.
type Windows = [Option<Histogram<u64>>; Metric::ALL.len()];

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            current: Default::default(),
            previous: Default::default(),
            earlier: Default::default(),
            window_start: Time(0),
        }
    }
}

impl Recorder {
    /// Starts a new window if the current one is over (on every record: the check stays
    /// inline, the fold out of line).
    #[inline]
    fn rotate(&mut self, now: Time) {
        if now.saturating_since(self.window_start) >= RECENT_WINDOW {
            self.next_window(now);
        }
    }

    #[cold]
    #[inline(never)]
    fn next_window(&mut self, now: Time) {
        for (window, total) in self.current.iter().zip(&mut self.earlier) {
            if let Some(window) = window {
                let _ = total.get_or_insert_with(histogram).add(window);
            }
        }
        self.previous = std::mem::take(&mut self.current);
        self.window_start = now;
    }

    /// Every value recorded since the node started, per metric.
    pub(crate) fn totals(&self) -> BTreeMap<Metric, Hist> {
        let mut out = BTreeMap::new();
        for metric in Metric::ALL {
            let mut merged = histogram();
            let at = metric as usize;
            for part in [&self.earlier[at], &self.current[at]].into_iter().flatten() {
                let _ = merged.add(part);
            }
            out.insert(metric, Hist::of(&merged));
        }
        out
    }

    /// Records one value.
    pub(crate) fn record(&mut self, now: Time, metric: Metric, value: u64) {
        self.rotate(now);
        self.current[metric as usize]
            .get_or_insert_with(histogram)
            .saturating_record(value.clamp(1, VALUE_MAX));
    }

    /// Records the time from `since` to `now`, in microseconds.
    pub(crate) fn record_since(&mut self, now: Time, metric: Metric, since: Time) {
        let micros = now.saturating_since(since).as_micros() as u64;
        self.record(now, metric, micros);
    }

    /// The recent histograms.
    pub(crate) fn recent(&mut self, now: Time) -> BTreeMap<Metric, Hist> {
        self.rotate(now);
        // Rotation happens on use: a window older than two windows is stale.
        let stale = now.saturating_since(self.window_start) >= RECENT_WINDOW * 2;
        let mut out = BTreeMap::new();
        for metric in Metric::ALL {
            let mut merged = histogram();
            if !stale {
                let at = metric as usize;
                for part in [&self.current[at], &self.previous[at]]
                    .into_iter()
                    .flatten()
                {
                    let _ = merged.add(part);
                }
            }
            if !merged.is_empty() {
                out.insert(metric, Hist::of(&merged));
            }
        }
        out
    }
}

/// One node's summary in a [`Report`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node's name.
    pub name: String,
    /// Its role (`leaf`, `aggregator`, `root`).
    pub role: String,
    /// Its parent's name, if any.
    pub parent: Option<String>,
    /// Whether its parent session is up (always true at the root).
    pub connected: bool,
    /// When it made this summary.
    pub at: Time,
    /// Monotonic counters since the node started (pushes, pops, acks, …).
    #[serde(deserialize_with = "crate::bounded::map::<_, _, _, NAMED_MAX>")]
    pub counters: BTreeMap<String, u64>,
    /// Current levels (messages held, leased, window entries, …).
    #[serde(deserialize_with = "crate::bounded::map::<_, _, _, NAMED_MAX>")]
    pub gauges: BTreeMap<String, u64>,
    /// Its own recent percentiles, per metric.
    #[serde(deserialize_with = "crate::bounded::map::<_, _, _, METRICS_MAX>")]
    pub latency: BTreeMap<Metric, Percentiles>,
    /// A replicated leaf's group, as its leader sees it.
    #[serde(default)]
    pub group: Option<GroupReport>,
}

/// A replica group as its leader sees it (in a replicated leaf's [`NodeReport`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupReport {
    /// The leading replica's node name.
    pub leader: String,
    /// The term it leads in.
    pub term: u64,
    /// How far behind each follower is (at most [`FOLLOWERS_MAX`]).
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, FOLLOWERS_MAX>")]
    pub followers: Vec<FollowerReport>,
}

/// One follower in a [`GroupReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowerReport {
    /// Its node name.
    pub name: String,
    /// Entries of the leader's log it does not hold yet.
    pub lag_entries: u64,
    /// Their bytes, if the leader still knows them.
    pub lag_bytes: Option<u64>,
}

/// A subtree's measurements (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// One summary per node of the subtree, this node first.
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, NODES_MAX>")]
    pub nodes: Vec<NodeReport>,
    /// Recent histograms merged over the subtree.
    #[serde(deserialize_with = "crate::bounded::map::<_, _, _, METRICS_MAX>")]
    pub histograms: BTreeMap<Metric, Hist>,
    /// Topic depths and event counters merged over the subtree's leaves.
    pub stats: Stats,
    /// Leaves of the subtree whose session below its sender ended and that are waited for
    /// (`absent_child_wait_ms`): the parent treats them as unknown, so that it does not serve
    /// a less urgent message while one of them may hold a more urgent one. Sorted.
    #[serde(default, deserialize_with = "crate::bounded::vec::<_, _, LEAVES_MAX>")]
    pub absent: Vec<LeafId>,
    /// This node's own histograms since it started, every metric (empty ones too): what its
    /// `/metrics` serves (filled by the driver at a scrape: [`crate::machine::Machine::histogram_totals`]).
    /// Not sent up the tree.
    #[serde(skip)]
    pub totals: BTreeMap<Metric, Hist>,
    /// At the root: consumer lag per topic and priority since it started (see [`LagSeries`]).
    /// Not sent up the tree.
    #[serde(skip)]
    pub consumer_lag: Vec<LagSeries>,
}

impl Report {
    /// Adds a child's report.
    pub fn merge(&mut self, child: &Report) {
        self.nodes.extend(child.nodes.iter().cloned());
        for (metric, hist) in &child.histograms {
            self.histograms.entry(*metric).or_default().merge(hist);
        }
        self.stats.merge(&child.stats);
        self.absent.extend_from_slice(&child.absent);
    }

    /// Keeps the `max` deepest topics (ready + delayed + in flight + dead).
    pub fn cap_topics(&mut self, max: usize) {
        if self.stats.topics.len() <= max {
            return;
        }
        let depth = |t: &TopicStats| {
            t.ready_total()
                .saturating_add(t.delayed)
                .saturating_add(t.in_flight)
                .saturating_add(t.dead)
        };
        let mut topics = std::mem::take(&mut self.stats.topics);
        topics.sort_by_key(|t| std::cmp::Reverse(depth(t)));
        topics.truncate(max);
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        self.stats.topics = topics;
    }
}

/// What a node says about itself in its report.
pub(crate) struct OwnReport {
    pub(crate) name: String,
    pub(crate) role: &'static str,
    pub(crate) parent: Option<String>,
    pub(crate) connected: bool,
    pub(crate) counters: BTreeMap<String, u64>,
    pub(crate) gauges: BTreeMap<String, u64>,
    pub(crate) stats: Stats,
    /// Leaves below it that it waits for (see [`Report::absent`]).
    pub(crate) absent: Vec<LeafId>,
    /// Its replica group, if it is a replicated leaf's leader.
    pub(crate) group: Option<GroupReport>,
}

/// A node's measurements and its children's latest reports, and when to report next.
#[derive(Debug)]
pub(crate) struct Reporter {
    pub(crate) recorder: Recorder,
    children: HashMap<ConnId, Report>,
    topics_max: usize,
}

impl Reporter {
    pub(crate) fn new(settings: &Settings) -> Reporter {
        Reporter {
            recorder: Recorder::default(),
            children: HashMap::new(),
            topics_max: settings.report_topics_max as usize,
        }
    }

    /// A child's latest report (replacing its previous one).
    pub(crate) fn child_report(&mut self, child: ConnId, mut report: Report) {
        report.nodes.truncate(NODES_MAX);
        self.children.insert(child, report);
    }

    /// A child is gone: its report goes too.
    pub(crate) fn child_gone(&mut self, child: ConnId) {
        self.children.remove(&child);
    }

    /// The subtree's report: this node's own summary, then its children's reports merged.
    pub(crate) fn report(&mut self, now: Time, own: OwnReport) -> Report {
        let recent = self.recorder.recent(now);
        let node = NodeReport {
            name: own.name,
            role: own.role.to_string(),
            parent: own.parent,
            connected: own.connected,
            at: now,
            counters: own.counters,
            gauges: own.gauges,
            latency: recent
                .iter()
                .map(|(metric, hist)| (*metric, hist.percentiles()))
                .collect(),
            group: own.group,
        };
        let mut report = Report {
            nodes: vec![node],
            histograms: recent,
            stats: own.stats,
            absent: own.absent,
            totals: BTreeMap::new(),
            consumer_lag: Vec::new(),
        };
        let mut children: Vec<&Report> = self.children.values().collect();
        children.sort_by(|a, b| {
            let name = |r: &Report| r.nodes.first().map(|n| n.name.clone());
            name(a).cmp(&name(b))
        });
        for child in children {
            report.merge(child);
        }
        report.nodes.truncate(NODES_MAX);
        report.cap_topics(self.topics_max);
        report.absent.sort_unstable();
        report.absent.dedup();
        report
    }
}

/// Counters or gauges as a report carries them.
pub(crate) fn named(values: &[(&str, u64)]) -> BTreeMap<String, u64> {
    values
        .iter()
        .map(|(name, value)| ((*name).to_string(), *value))
        .collect()
}

/// Most node summaries a report carries (a bound far above any topology's size).
pub const NODES_MAX: usize = 4096;

/// Most followers a [`GroupReport`] names (a group's leader reports its first ones).
pub const FOLLOWERS_MAX: usize = 64;

/// Most counters, or gauges, one [`NodeReport`] carries (a node has a few dozen).
pub const NAMED_MAX: usize = 256;

/// Most `(priority, count)` pairs a [`TopicStats`] carries: the most urgent priorities are
/// counted one by one, the last pair counts that priority and every less urgent one.
pub const READY_PRIORITIES_MAX: usize = 256;

/// Most leaves a tree has (a leaf id is 16 bits).
const LEAVES_MAX: usize = 1 << 16;

/// Most entries of a map keyed by [`Metric`] (each key once).
const METRICS_MAX: usize = Metric::ALL.len();

/// Depths of one topic.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct TopicStats {
    /// The topic.
    pub topic: String,
    /// Ready messages by priority: `(priority, count)`, most urgent first. At most
    /// [`READY_PRIORITIES_MAX`] pairs: when a topic holds more priorities, the last pair
    /// counts its priority and every less urgent one.
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, READY_PRIORITIES_MAX>")]
    pub ready: Vec<(u32, u64)>,
    /// Messages waiting for their delivery time.
    pub delayed: u64,
    /// Messages leased to consumers.
    pub in_flight: u64,
    /// Messages in the dead-letter queue.
    pub dead: u64,
    /// Enqueue time of the oldest message not in the dead-letter queue.
    pub oldest_enqueued_at: Option<Time>,
    /// Payload bytes of its messages in every state (dead letters included).
    #[serde(default)]
    pub bytes: u64,
    /// When the ready message of each priority that has waited longest became ready:
    /// `(priority, ready_at)`, most urgent first, as many pairs as [`TopicStats::ready`] (the
    /// last pair, when that one sums the less urgent priorities, holds their earliest).
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, READY_PRIORITIES_MAX>"
    )]
    pub oldest_ready: Vec<(u32, Time)>,
}

impl TopicStats {
    /// Messages in every state: ready, delayed, in flight and dead.
    pub fn messages(&self) -> u64 {
        [self.delayed, self.in_flight, self.dead]
            .into_iter()
            .fold(self.ready_total(), u64::saturating_add)
    }

    /// Ready messages of every priority.
    pub fn ready_total(&self) -> u64 {
        self.ready
            .iter()
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }

    /// Adds another part of the same topic (another leaf's). Sums saturate: what a child
    /// reports is not trusted to be sane.
    pub fn merge(&mut self, other: &TopicStats) {
        let mut ready: BTreeMap<u32, u64> = BTreeMap::new();
        for (priority, count) in self.ready.iter().chain(&other.ready) {
            let sum = ready.entry(*priority).or_default();
            *sum = sum.saturating_add(*count);
        }
        self.ready = ready_pairs(ready.into_iter());
        self.delayed = self.delayed.saturating_add(other.delayed);
        self.in_flight = self.in_flight.saturating_add(other.in_flight);
        self.dead = self.dead.saturating_add(other.dead);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.oldest_enqueued_at = match (self.oldest_enqueued_at, other.oldest_enqueued_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut oldest: BTreeMap<u32, Time> = BTreeMap::new();
        for (priority, at) in self.oldest_ready.iter().chain(&other.oldest_ready) {
            let earliest = oldest.entry(*priority).or_insert(*at);
            *earliest = (*earliest).min(*at);
        }
        self.oldest_ready = oldest_pairs(oldest.into_iter());
    }
}

/// `(priority, ready_at)` pairs from pairs sorted most urgent first, the pairs past
/// [`READY_PRIORITIES_MAX`] folded into the last one kept (the earliest time).
pub(crate) fn oldest_pairs(sorted: impl Iterator<Item = (u32, Time)>) -> Vec<(u32, Time)> {
    capped_pairs(sorted, Time::min)
}

/// `(priority, count)` pairs from pairs sorted most urgent first, the pairs past
/// [`READY_PRIORITIES_MAX`] summed into the last one kept.
pub(crate) fn ready_pairs(sorted: impl Iterator<Item = (u32, u64)>) -> Vec<(u32, u64)> {
    capped_pairs(sorted, u64::saturating_add)
}

/// The first [`READY_PRIORITIES_MAX`] of `sorted`, the rest folded into the last by `fold`.
fn capped_pairs<T: Copy>(
    sorted: impl Iterator<Item = (u32, T)>,
    fold: impl Fn(T, T) -> T,
) -> Vec<(u32, T)> {
    let mut out: Vec<(u32, T)> = Vec::new();
    for (priority, value) in sorted {
        if out.len() < READY_PRIORITIES_MAX {
            out.push((priority, value));
        } else if let Some(last) = out.last_mut() {
            last.1 = fold(last.1, value);
        }
    }
    out
}

/// Depths per topic and event counters (since each leaf started).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Per topic, sorted by name.
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, REPORT_TOPICS_MAX>")]
    pub topics: Vec<TopicStats>,
    /// Messages dropped because their time to live passed.
    pub expired: u64,
    /// Messages moved to a dead-letter queue.
    pub dead_lettered: u64,
    /// Pushes answered with an earlier message's id (dedup).
    pub deduplicated: u64,
    /// Each scope with limits: usage against them, push rate, refusals (from the root).
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, { crate::quota::QUOTA_SCOPES_MAX }>"
    )]
    pub limits: Vec<crate::quota::ScopeStats>,
}

impl Stats {
    /// Adds another leaf's stats: O((n + m) log(n + m)) for n and m topics, in whatever order
    /// the other's come (a child's are not trusted to be sorted); sums saturate.
    pub fn merge(&mut self, other: &Stats) {
        let mut topics: BTreeMap<String, TopicStats> = std::mem::take(&mut self.topics)
            .into_iter()
            .map(|t| (t.topic.clone(), t))
            .collect();
        for theirs in &other.topics {
            match topics.get_mut(&theirs.topic) {
                Some(ours) => ours.merge(theirs),
                None => {
                    topics.insert(theirs.topic.clone(), theirs.clone());
                }
            }
        }
        self.topics = topics.into_values().collect();
        self.expired = self.expired.saturating_add(other.expired);
        self.dead_lettered = self.dead_lettered.saturating_add(other.dead_lettered);
        self.deduplicated = self.deduplicated.saturating_add(other.deduplicated);
        // Only the root knows the limits (its own stats come first): a child's are ignored.
    }

    /// One topic's stats, if it has any messages.
    pub fn topic(&self, topic: &str) -> Option<&TopicStats> {
        self.topics.iter().find(|t| t.topic == topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_keeps_the_recent_past_and_forgets_older_windows() {
        let mut recorder = Recorder::default();
        let t0 = Time::from_millis(1_000_000);
        for value in 1..=100 {
            recorder.record(t0, Metric::Pop, value);
        }
        let recent = recorder.recent(t0);
        let p = recent[&Metric::Pop].percentiles();
        assert_eq!(p.count, 100);
        assert!((49..=51).contains(&p.p50), "{p:?}");
        assert_eq!(p.max, 100);
        // One window later the values are still recent (previous window) …
        let t1 = t0 + RECENT_WINDOW;
        recorder.record(t1, Metric::Pop, 1_000);
        assert_eq!(recorder.recent(t1)[&Metric::Pop].count(), 101);
        // … two windows later only the newest window's values remain; then nothing.
        let t2 = t1 + RECENT_WINDOW;
        assert_eq!(recorder.recent(t2)[&Metric::Pop].count(), 1);
        assert!(recorder.recent(t2 + RECENT_WINDOW * 2).is_empty());
    }

    #[test]
    fn hists_merge_and_give_prometheus_buckets() {
        let mut recorder = Recorder::default();
        let now = Time::from_millis(5);
        for value in [10, 20, 30] {
            recorder.record(now, Metric::PushAck, value);
        }
        let mut a = recorder.recent(now)[&Metric::PushAck].clone();
        let b = a.clone();
        a.merge(&b);
        assert_eq!(a.count(), 6);
        assert_eq!(a.cumulative(&[5, 10, 25, 1000]), vec![0, 2, 4, 6]);
        assert_eq!(a.sum(), 120);
    }

    fn topic_names(report: &Report) -> Vec<&str> {
        report
            .stats
            .topics
            .iter()
            .map(|t| t.topic.as_str())
            .collect()
    }

    #[test]
    fn a_child_s_report_of_absurd_counts_in_any_order_merges_without_overflow() {
        // Goal: a report from a child is input like any other: counts at the top of the
        // range saturate (debug builds panic on overflow), topics in any order or repeated
        // merge into one sorted list.
        let huge = |topic: &str| TopicStats {
            topic: topic.into(),
            ready: vec![(3, u64::MAX), (1, u64::MAX)],
            delayed: u64::MAX,
            in_flight: u64::MAX,
            dead: u64::MAX,
            oldest_enqueued_at: Some(Time(5)),
            bytes: u64::MAX,
            oldest_ready: vec![(3, Time(9)), (1, Time(7)), (3, Time(2))],
        };
        let hostile = Report {
            histograms: [(Metric::Pop, Hist(vec![(u64::MAX, u64::MAX), (0, u64::MAX)]))].into(),
            stats: Stats {
                topics: vec![huge("z"), huge("a"), huge("z")],
                expired: u64::MAX,
                dead_lettered: u64::MAX,
                deduplicated: u64::MAX,
                limits: Vec::new(),
            },
            ..Report::default()
        };
        let mut parent = Report::default();
        parent.merge(&hostile);
        parent.merge(&hostile);
        assert_eq!(topic_names(&parent), vec!["a", "z"]);
        let z = parent.stats.topic("z").unwrap();
        assert_eq!(z.ready, vec![(1, u64::MAX), (3, u64::MAX)]);
        assert_eq!((z.delayed, z.ready_total()), (u64::MAX, u64::MAX));
        assert_eq!((z.bytes, z.messages()), (u64::MAX, u64::MAX));
        assert_eq!(z.oldest_ready, vec![(1, Time(7)), (3, Time(2))]);
        assert_eq!(parent.stats.expired, u64::MAX);
        let pops = &parent.histograms[&Metric::Pop];
        assert_eq!(pops.count(), u64::MAX);
        assert_eq!(pops.cumulative(&[VALUE_MAX]), vec![u64::MAX]);
        assert!(
            pops.percentiles().max >= VALUE_MAX,
            "clamped to the top bucket"
        );
        parent.cap_topics(1);
        assert_eq!(parent.stats.topics.len(), 1);
    }

    #[test]
    fn reports_merge_nodes_histograms_and_stats_and_cap_topics() {
        let topic = |name: &str, ready: u64| TopicStats {
            topic: name.into(),
            ready: vec![(1, ready)],
            ..TopicStats::default()
        };
        let mut parent = Report {
            nodes: vec![NodeReport {
                name: "agg".into(),
                ..NodeReport::default()
            }],
            ..Report::default()
        };
        let child = Report {
            nodes: vec![NodeReport {
                name: "leaf".into(),
                ..NodeReport::default()
            }],
            histograms: [(Metric::PushAck, Hist(vec![(7, 2)]))].into(),
            stats: Stats {
                topics: vec![topic("a", 1), topic("b", 5), topic("c", 3)],
                ..Stats::default()
            },
            absent: vec![LeafId(3)],
            ..Report::default()
        };
        parent.merge(&child);
        parent.merge(&child);
        assert_eq!(parent.nodes.len(), 3);
        assert_eq!(parent.histograms[&Metric::PushAck].count(), 4);
        assert_eq!(parent.stats.topic("b").unwrap().ready, vec![(1, 10)]);
        assert_eq!(
            parent.absent,
            vec![LeafId(3), LeafId(3)],
            "deduplicated by report()"
        );
        parent.cap_topics(2);
        assert_eq!(topic_names(&parent), vec!["b", "c"]);
    }

    #[test]
    fn a_report_s_lists_past_their_bounds_are_refused_while_decoding() {
        // Goal: a child's report cannot make its parent build more entries than the bounds
        // allow, whatever the frame's size: each list is refused once its length is read.
        // Method: reports at each bound decode; one entry more is refused, naming the bound.
        let decode = |report: &Report| {
            rmp_serde::from_slice::<Report>(&rmp_serde::to_vec(report).unwrap())
                .map_err(|error| error.to_string())
        };
        let node = |counters: usize| NodeReport {
            counters: (0..counters).map(|i| (format!("c{i}"), 1)).collect(),
            ..NodeReport::default()
        };
        let topic = |priorities: u32| TopicStats {
            topic: "t".into(),
            ready: (0..priorities).map(|p| (p, 1)).collect(),
            ..TopicStats::default()
        };
        let nodes = |n: usize| Report {
            nodes: vec![NodeReport::default(); n],
            ..Report::default()
        };
        let counters = |n: usize| Report {
            nodes: vec![node(n)],
            ..Report::default()
        };
        let ready = |n: usize| Report {
            stats: Stats {
                topics: vec![topic(n as u32)],
                ..Stats::default()
            },
            ..Report::default()
        };
        let buckets = |n: usize| Report {
            histograms: [(Metric::Pop, Hist((1..=n as u64).map(|v| (v, 1)).collect()))].into(),
            ..Report::default()
        };
        type Build<'a> = &'a dyn Fn(usize) -> Report;
        let cases: [(&str, Build, usize); 4] = [
            ("nodes", &nodes, NODES_MAX),
            ("counters", &counters, NAMED_MAX),
            ("ready", &ready, READY_PRIORITIES_MAX),
            ("buckets", &buckets, HIST_BUCKETS_MAX),
        ];
        for (what, report, max) in cases {
            assert_eq!(decode(&report(max)), Ok(report(max)), "{what} at the bound");
            let refused = decode(&report(max + 1)).unwrap_err();
            assert!(
                refused.contains(&format!("at most {max} entries")),
                "{what}: {refused}"
            );
        }
        assert!(
            histogram().distinct_values() <= HIST_BUCKETS_MAX,
            "every real histogram fits"
        );
    }

    #[test]
    fn a_topic_s_ready_counts_past_the_bound_sum_into_its_last_pair() {
        // Goal: a leaf holding more priorities than a report carries sends the most urgent
        // ones exactly and sums the rest into the last pair; merging keeps the bound and the
        // total.
        // The oldest ready time of priority p is 1000 - p: the less urgent, the older.
        let many = |from: u32| TopicStats {
            topic: "t".into(),
            ready: ready_pairs((from..from + 300).map(|p| (p, 2))),
            oldest_ready: oldest_pairs((from..from + 300).map(|p| (p, Time(u64::from(2000 - p))))),
            ..TopicStats::default()
        };
        let one = many(0);
        assert_eq!(one.ready.len(), READY_PRIORITIES_MAX);
        assert_eq!(one.ready[0], (0, 2));
        let last = READY_PRIORITIES_MAX as u32 - 1;
        assert_eq!(
            one.ready[READY_PRIORITIES_MAX - 1],
            (last, 2 * (300 - u64::from(last)))
        );
        assert_eq!(one.ready_total(), 600);
        assert_eq!(one.oldest_ready.len(), READY_PRIORITIES_MAX);
        assert_eq!(one.oldest_ready[0], (0, Time(2000)));
        // The last pair holds the earliest of the priorities it stands for (299's).
        assert_eq!(
            one.oldest_ready[READY_PRIORITIES_MAX - 1],
            (last, Time(1701))
        );
        let mut merged = one.clone();
        merged.merge(&many(1000));
        assert_eq!(merged.ready.len(), READY_PRIORITIES_MAX);
        assert_eq!(merged.ready_total(), 1200);
        assert_eq!(merged.ready[..3], one.ready[..3]);
        assert_eq!(merged.oldest_ready.len(), READY_PRIORITIES_MAX);
        // Priorities 1000.. fold into the last pair: their times are the earliest (701..1000).
        assert_eq!(
            merged.oldest_ready[READY_PRIORITIES_MAX - 1],
            (last, Time(701))
        );
    }

    #[test]
    fn each_metric_has_its_own_slot() {
        for (at, metric) in Metric::ALL.into_iter().enumerate() {
            assert_eq!(metric as usize, at, "{metric:?}");
        }
    }

    #[test]
    fn cumulative_histograms_keep_every_window_since_the_start() {
        let mut recorder = Recorder::default();
        let mut now = Time::from_millis(1);
        for round in 0..5_u64 {
            recorder.record(now, Metric::PushAck, 100 + round);
            now = now + RECENT_WINDOW;
        }
        let totals = recorder.totals();
        assert_eq!(totals[&Metric::PushAck].count(), 5);
        assert_eq!(
            totals[&Metric::Pop].count(),
            0,
            "every metric, empty ones too"
        );
        // The recent ones forget the windows before the last two.
        assert!(recorder.recent(now)[&Metric::PushAck].count() <= 2);
    }
}
