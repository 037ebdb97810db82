//! `crest bench`: a load generator that measures a real tree over real QUIC sockets.
//!
//! N producers (each its own [`Producer`], connected to every leaf) push messages of a fixed
//! payload size with priorities drawn from a [`PriorityMix`]; M consumers (each its own
//! [`Consumer`] connection to the root) pop in batches and acknowledge. Two phases:
//! [`Phase::FillThenDrain`] (push everything, wait for every acknowledgement, then pop it all)
//! and [`Phase::Mixed`] (push and pop at once, a steady load).
//!
//! Every payload starts with a stamp: the run's nonce, a sequence number and the send time, so
//! the bench knows, for every pop, which message it is (duplicates and losses are counted), how
//! long it took from push to pop, and — since it knows what it pushed and what was already
//! popped — the **rank error** of the pop (ARCHITECTURE.md, "Measuring ordering"): how many messages whose push was
//! acknowledged and which were not yet popped were strictly more urgent than the popped one.
//!
//! Latencies are HDR histograms in microseconds: push-ack (send to the leaf's durable ack),
//! pop (request to answer, for pops asked while a pushed message was known to be waiting),
//! ack (consumer ack round trip), push-to-pop (send to delivery).

use crate::core::config::Durability;
use crate::core::metrics::Metric;
pub use crate::core::metrics::Percentiles;
use crate::core::topology::Topology;
use crate::node::LocalTree;
use crate::sdk::{
    ClientTls, Consumer, ConsumerConfig, Delivery, Message, PopOptions, Producer, ProducerConfig,
};
use anyhow::{Context, Result, bail};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of the stamp at the start of every payload: nonce, sequence number, send time.
pub const STAMP_BYTES: usize = 24;

/// Priorities the bench can track (0..=63).
pub const PRIORITY_LEVELS: usize = 64;

/// How priorities are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PriorityMix {
    /// Uniform over `0..levels`.
    Uniform {
        /// Number of priorities.
        levels: u32,
    },
    /// Priorities 0–9, 70% in the least urgent tiers (7–9), 20% in 3–6, 10% in the most urgent
    /// (0–2): the reference workload.
    Skewed,
    /// Always this priority.
    Fixed {
        /// The priority.
        priority: u32,
    },
}

impl std::str::FromStr for PriorityMix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{text:?}: expected `skewed`, `uniform`, `uniform:N` (1..=64) or `fixed:P` (0..=63)"
            )
        };
        let (kind, arg) = match text.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg.parse::<u32>().map_err(|_| bad())?)),
            None => (text, None),
        };
        match (kind, arg) {
            ("skewed", None) => Ok(PriorityMix::Skewed),
            ("uniform", None) => Ok(PriorityMix::Uniform { levels: 10 }),
            ("uniform", Some(levels)) if (1..=PRIORITY_LEVELS as u32).contains(&levels) => {
                Ok(PriorityMix::Uniform { levels })
            }
            ("fixed", Some(priority)) if (priority as usize) < PRIORITY_LEVELS => {
                Ok(PriorityMix::Fixed { priority })
            }
            _ => Err(bad()),
        }
    }
}

impl PriorityMix {
    fn draw(self, rng: &mut SmallRng) -> u32 {
        match self {
            PriorityMix::Uniform { levels } => rng.random_range(0..levels),
            PriorityMix::Fixed { priority } => priority,
            PriorityMix::Skewed => {
                let roll = rng.random_range(0..100u32);
                if roll < 10 {
                    rng.random_range(0..3)
                } else if roll < 30 {
                    rng.random_range(3..7)
                } else {
                    rng.random_range(7..10)
                }
            }
        }
    }
}

/// The bench's phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Push every message and wait for every acknowledgement, then pop them all.
    FillThenDrain,
    /// Producers and consumers run at once.
    Mixed,
}

/// Which tree the bench drives.
#[derive(Clone, Debug)]
pub enum Target {
    /// A tree the bench starts in this process from a topology (ephemeral ports), its leaves
    /// logging to `data_dir` (fsync before ack) or keeping messages in memory (`None`).
    Local {
        /// The tree.
        topology: Topology,
        /// Where leaves log; removed afterwards.
        data_dir: Option<PathBuf>,
    },
    /// A running tree.
    Remote {
        /// Leaf addresses producers push to.
        leaves: Vec<String>,
        /// Root address consumers pop from.
        root: String,
        /// Trust.
        tls: ClientTls,
    },
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The tree.
    pub target: Target,
    /// Producer connections.
    pub producers: usize,
    /// Consumer connections.
    pub consumers: usize,
    /// Messages to push (the run stops at this count or at `duration`, whichever is first).
    pub messages: u64,
    /// How long producers push (`None`: until `messages`).
    pub duration: Option<Duration>,
    /// Payload bytes per message (at least [`STAMP_BYTES`]).
    pub payload_bytes: usize,
    /// Priority distribution.
    pub priorities: PriorityMix,
    /// Most deliveries per pop.
    pub pop_batch: u32,
    /// Acknowledge deliveries (otherwise they stay leased until their visibility timeout).
    pub ack: bool,
    /// Total target push rate in messages/s (`None`: open loop, as fast as acknowledged).
    pub rate: Option<f64>,
    /// The phases.
    pub phase: Phase,
    /// The topic.
    pub topic: String,
    /// Messages each producer may have sent but not yet seen acknowledged.
    pub producer_window: usize,
    /// Most messages a producer hands the SDK at once (`Producer::send_batch`). A paced
    /// producer sends only the messages already due, so at low rates batches are single
    /// messages and push latency is not inflated by waiting for company.
    pub push_batch: usize,
    /// Ack requests each consumer may have in flight while it pops on.
    pub acks_in_flight: usize,
    /// How long the drain may go without popping anything before the bench gives up and
    /// reports the messages it never saw as missing.
    pub drain_idle_timeout: Duration,
    /// Print a progress line every this often on stderr (`None`: quiet).
    pub progress: Option<Duration>,
    /// Seed of the priority draws.
    pub seed: u64,
}

impl BenchConfig {
    /// The reference workload (docs/performance.md) against `target`.
    pub fn reference(target: Target) -> BenchConfig {
        BenchConfig {
            target,
            producers: 4,
            consumers: 4,
            messages: 200_000,
            duration: None,
            payload_bytes: 100,
            priorities: PriorityMix::Skewed,
            pop_batch: 256,
            ack: true,
            rate: None,
            phase: Phase::FillThenDrain,
            topic: "bench".into(),
            producer_window: 4096,
            push_batch: 256,
            acks_in_flight: 4,
            drain_idle_timeout: Duration::from_secs(10),
            progress: Some(Duration::from_secs(1)),
            seed: 1,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.payload_bytes < STAMP_BYTES {
            bail!(
                "payload bytes must be at least {STAMP_BYTES}: every payload carries the bench's \
                 stamp (run nonce, sequence number, send time)"
            );
        }
        if self.producers == 0 || self.consumers == 0 || self.pop_batch == 0 {
            bail!("producers, consumers and pop batch must be at least 1");
        }
        if self.producer_window == 0 || self.push_batch == 0 {
            bail!("the producer window and the push batch must be at least 1");
        }
        if self
            .rate
            .is_some_and(|rate| !(rate > 0.0 && rate.is_finite()))
        {
            bail!("the target rate must be a positive number of messages per second");
        }
        if self.duration.is_none() && self.messages == 0 {
            bail!("give a message count or a duration");
        }
        Ok(())
    }
}

/// Latency percentiles, microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latencies {
    /// Send to the leaf's acknowledgement (durable when the leaf logs).
    pub push_ack_us: Percentiles,
    /// The same, per leaf (by leaf id): one slow log shows here when the whole does not
    /// say which. A batch split over leaves counts its slowest part for each of them.
    pub push_ack_by_leaf_us: BTreeMap<u16, Percentiles>,
    /// Pop request to answer, for pops that returned messages and were asked while the bench
    /// knew of a message pushed (acknowledged) and not yet popped: time to serve, not time
    /// spent waiting for a producer.
    pub pop_us: Percentiles,
    /// For every pop that returned messages: from the later of its request and the push of
    /// the first message it got, to its answer. Unlike `pop_us`, a pop that waited for a
    /// message to arrive (others having taken what was there) counts from that message's
    /// push, not from its request; counting from the push (not from the leaf's durable ack)
    /// errs on the long side.
    pub pop_wait_us: Percentiles,
    /// Consumer ack round trip (one per pop batch).
    pub ack_us: Percentiles,
    /// Send to delivery.
    pub push_to_pop_us: Percentiles,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The phases run.
    pub phase: Phase,
    /// Producers, consumers.
    pub producers: usize,
    /// Consumers.
    pub consumers: usize,
    /// Payload bytes.
    pub payload_bytes: usize,
    /// Priority mix.
    pub priorities: PriorityMix,
    /// Pop batch.
    pub pop_batch: u32,
    /// Whether deliveries were acknowledged.
    pub ack: bool,
    /// Target push rate, if any.
    pub target_rate: Option<f64>,
    /// Whether the leaves were durable (`None`: a remote tree, unknown).
    pub durable: Option<bool>,
    /// With durable leaves, how many of them sync before they acknowledge (the others' settings
    /// say `durability = "buffered"`), and of how many (`None`: a remote tree, unknown).
    pub syncing_leaves: Option<(usize, usize)>,
    /// Messages acknowledged by leaves.
    pub pushed: u64,
    /// Pushes that failed (their error counted, not retried).
    pub push_errors: u64,
    /// Distinct pushed messages popped.
    pub popped: u64,
    /// Deliveries of a message popped before (at-least-once redeliveries).
    pub duplicates: u64,
    /// Acknowledged pushes never popped by the end of the drain.
    pub missing: u64,
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries whose ack was refused (stale receipt).
    pub ack_rejected: u64,
    /// Deliveries carrying no stamp of this run (another user of the topic).
    pub foreign: u64,
    /// Pops that returned nothing.
    pub empty_pops: u64,
    /// Seconds from the first push to the last push acknowledgement.
    pub push_seconds: f64,
    /// Pushed messages per second.
    pub push_rate: f64,
    /// Payload megabytes per second pushed.
    pub push_mb_per_s: f64,
    /// Seconds from the first pop to the last message popped.
    pub pop_seconds: f64,
    /// Popped (and acknowledged, with ack on) messages per second.
    pub pop_rate: f64,
    /// Latencies.
    pub latency: Latencies,
    /// Rank error of pops (messages).
    pub rank_error: Percentiles,
    /// Pops with a rank error above zero.
    pub inverted_pops: u64,
    /// Rank error at lease time, a lower bound (see [`LEASE_RANK_MESSAGES_MAX`]): the more
    /// urgent messages certainly ready and unleased when the root served the pop, where
    /// `rank_error` (an upper bound with several consumers) also counts those in flight to
    /// another consumer. `None` for runs of more messages than the ledger keeps.
    pub lease_rank_error: Option<Percentiles>,
    /// Deliveries with a lease-time rank error above zero.
    pub lease_inverted_pops: Option<u64>,
    /// Protocol violations the tree's nodes counted (offers over credit, unexpected messages);
    /// `None` for a remote tree. Anything above 0 is a bug.
    pub protocol_violations: Option<u64>,
    /// QUIC packets the tree's nodes declared lost on their open links at the end of the run
    /// (both ends of every link between nodes; the clients' own ends not counted); `None` for
    /// a remote tree. Each loss cuts a link's congestion window.
    pub quic_lost_packets: Option<u64>,
    /// The local tree's leaves' log syncs (`fdatasync` of groups pushes and acks waited
    /// for), microseconds, over the leaves' recent past (their last 10–20 s: all of a short
    /// run); `None` for a remote tree or leaves in memory.
    pub log_sync_us: Option<Percentiles>,
    /// The same, per durable leaf (by node name).
    pub log_sync_by_leaf_us: BTreeMap<String, Percentiles>,
    /// Processor time this process spent over the run.
    pub cpu: CpuUse,
}

/// Processor time (user + system, all threads) of the bench's process while it ran: with a
/// local tree, the tree's nodes and the load generator together; with `--connect`, the load
/// generator alone. On a machine whose speed changes by the hour, CPU per message is the
/// steadier figure to compare builds by (rates also move with the machine).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuUse {
    /// Whether the tree ran in this process (and is counted).
    pub includes_tree: bool,
    /// Seconds over the whole run (from the first push to the last pop).
    pub seconds: f64,
    /// Microseconds per message over the whole run (per message pushed: each was also popped).
    pub us_per_message: f64,
    /// Fill then drain: seconds while the producers pushed.
    pub fill_seconds: Option<f64>,
    /// Fill then drain: microseconds per message pushed, while the producers pushed.
    pub fill_us_per_message: Option<f64>,
    /// Fill then drain: seconds while the consumers drained.
    pub drain_seconds: Option<f64>,
    /// Fill then drain: microseconds per message popped, while the consumers drained.
    pub drain_us_per_message: Option<f64>,
}

/// The median and range of one figure over repeated runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (`None` if there are none).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let middle = values.len() / 2;
        let median = if values.len() % 2 == 0 {
            (values[middle - 1] + values[middle]) / 2.0
        } else {
            values[middle]
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[values.len() - 1],
        })
    }
}

/// Repeated runs of one configuration (`crest bench --runs N`): each run's report, and the
/// median and range of the headline figures over them.
#[derive(Clone, Debug, Serialize)]
pub struct BenchSummary {
    /// Pushed messages per second.
    pub push_rate: Spread,
    /// Popped (and acknowledged) messages per second.
    pub pop_rate: Spread,
    /// Push-ack latency p50, microseconds.
    pub push_ack_p50_us: Spread,
    /// Push-ack latency p99, microseconds.
    pub push_ack_p99_us: Spread,
    /// The slowest leaf's push-ack latency p99, microseconds: what the producers of the
    /// worst-placed leaf see (never below the whole's p99).
    pub push_ack_p99_slowest_leaf_us: Spread,
    /// Pop latency p50, microseconds.
    pub pop_p50_us: Spread,
    /// Pop latency p99, microseconds.
    pub pop_p99_us: Spread,
    /// Rank error p99, messages.
    pub rank_error_p99: Spread,
    /// Pops with a rank error above zero.
    pub inverted_pops: Spread,
    /// Deliveries with a lease-time rank error above zero (`None`: not measured).
    pub lease_inverted_pops: Option<Spread>,
    /// Process CPU over the run, seconds.
    pub cpu_seconds: Spread,
    /// Process CPU per message, microseconds.
    pub cpu_us_per_message: Spread,
    /// Fill then drain: CPU per message pushed while filling, microseconds.
    pub fill_us_per_message: Option<Spread>,
    /// Fill then drain: CPU per message popped while draining, microseconds.
    pub drain_us_per_message: Option<Spread>,
    /// Missing messages, summed over the runs (anything but 0 fails the command).
    pub missing: u64,
    /// Duplicate deliveries, summed over the runs.
    pub duplicates: u64,
    /// Protocol violations, summed over the runs (`None`: a remote tree).
    pub protocol_violations: Option<u64>,
    /// Every run's report, in order.
    pub runs: Vec<BenchReport>,
}

impl BenchSummary {
    /// Summarizes `runs` (at least one).
    ///
    /// # Panics
    /// If `runs` is empty.
    pub fn of(runs: Vec<BenchReport>) -> BenchSummary {
        assert!(!runs.is_empty(), "a summary needs a run");
        let spread = |figure: fn(&BenchReport) -> f64| {
            Spread::of(runs.iter().map(figure)).expect("non-empty")
        };
        let optional =
            |figure: fn(&BenchReport) -> Option<f64>| Spread::of(runs.iter().filter_map(figure));
        BenchSummary {
            push_rate: spread(|r| r.push_rate),
            pop_rate: spread(|r| r.pop_rate),
            push_ack_p50_us: spread(|r| r.latency.push_ack_us.p50 as f64),
            push_ack_p99_us: spread(|r| r.latency.push_ack_us.p99 as f64),
            push_ack_p99_slowest_leaf_us: spread(|r| r.slowest_leaf_push_ack_p99_us() as f64),
            pop_p50_us: spread(|r| r.latency.pop_us.p50 as f64),
            pop_p99_us: spread(|r| r.latency.pop_us.p99 as f64),
            rank_error_p99: spread(|r| r.rank_error.p99 as f64),
            inverted_pops: spread(|r| r.inverted_pops as f64),
            lease_inverted_pops: optional(|r| r.lease_inverted_pops.map(|n| n as f64)),
            cpu_seconds: spread(|r| r.cpu.seconds),
            cpu_us_per_message: spread(|r| r.cpu.us_per_message),
            fill_us_per_message: optional(|r| r.cpu.fill_us_per_message),
            drain_us_per_message: optional(|r| r.cpu.drain_us_per_message),
            missing: runs.iter().map(|r| r.missing).sum(),
            duplicates: runs.iter().map(|r| r.duplicates).sum(),
            protocol_violations: runs
                .iter()
                .map(|r| r.protocol_violations)
                .sum::<Option<u64>>(),
            runs,
        }
    }

    /// The summary table: median and range of each figure.
    pub fn table(&self) -> String {
        let mut out = format!(
            "crest bench: median (min - max) of {} runs\n",
            self.runs.len()
        );
        let mut row = |name: &str, spread: &Spread, unit: &str| {
            out.push_str(&format!(
                "  {name:<30} {:>12.1} ({:.1} - {:.1}) {unit}\n",
                spread.median, spread.min, spread.max
            ));
        };
        row("pushes", &self.push_rate, "msgs/s");
        row("pops", &self.pop_rate, "msgs/s");
        row("push-ack latency p50", &self.push_ack_p50_us, "us");
        row("push-ack latency p99", &self.push_ack_p99_us, "us");
        row(
            "push-ack p99, slowest leaf",
            &self.push_ack_p99_slowest_leaf_us,
            "us",
        );
        row("pop latency p50", &self.pop_p50_us, "us");
        row("pop latency p99", &self.pop_p99_us, "us");
        row("rank error p99", &self.rank_error_p99, "msgs");
        row("inverted pops", &self.inverted_pops, "");
        if let Some(lease) = &self.lease_inverted_pops {
            row("inverted at lease time", lease, "");
        }
        row("CPU", &self.cpu_seconds, "s");
        row("CPU per message", &self.cpu_us_per_message, "us");
        if let Some(fill) = &self.fill_us_per_message {
            row("CPU per message, fill", fill, "us");
        }
        if let Some(drain) = &self.drain_us_per_message {
            row("CPU per message, drain", drain, "us");
        }
        out.push_str(&format!(
            "  missing {}  duplicates {}{}\n",
            self.missing,
            self.duplicates,
            match self.protocol_violations {
                Some(violations) => format!("  protocol violations {violations}"),
                None => String::new(),
            }
        ));
        out
    }
}

/// One figure of an A/B comparison (`crest bench --against`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Versus {
    /// A's median.
    pub a: f64,
    /// B's median.
    pub b: f64,
    /// B's median over A's (0 when A's is 0).
    pub ratio: f64,
    /// Pairs (runs of A and B back to back) in which B did better: higher for rates, lower
    /// for latencies and CPU.
    pub b_better: usize,
    /// Pairs compared.
    pub pairs: usize,
}

/// Two configurations run in interleaved pairs (`crest bench --runs N --against T`): each
/// one's summary and, per headline figure, their medians, ratio and pair-by-pair wins. On a
/// machine whose speed changes while it runs, only interleaved pairs compare fairly.
#[derive(Clone, Debug, Serialize)]
pub struct BenchComparison {
    /// Pushed messages per second.
    pub push_rate: Versus,
    /// Popped (and acknowledged) messages per second.
    pub pop_rate: Versus,
    /// Push-ack latency p99, microseconds.
    pub push_ack_p99_us: Versus,
    /// The slowest leaf's push-ack latency p99, microseconds.
    pub push_ack_p99_slowest_leaf_us: Versus,
    /// Pop latency p99, microseconds.
    pub pop_p99_us: Versus,
    /// Process CPU per message, microseconds.
    pub cpu_us_per_message: Versus,
    /// A: the first configuration.
    pub a: BenchSummary,
    /// B: the one it is compared against.
    pub b: BenchSummary,
}

impl BenchComparison {
    /// Compares `a` and `b`, whose runs were made in pairs (run i of each back to back).
    pub fn of(a: BenchSummary, b: BenchSummary) -> BenchComparison {
        let versus = |median: fn(&BenchSummary) -> f64,
                      figure: fn(&BenchReport) -> f64,
                      higher_is_better: bool| {
            let (a_median, b_median) = (median(&a), median(&b));
            let pairs = a.runs.len().min(b.runs.len());
            let b_better = a
                .runs
                .iter()
                .zip(&b.runs)
                .filter(|(a, b)| {
                    let (a, b) = (figure(a), figure(b));
                    if higher_is_better { b > a } else { b < a }
                })
                .count();
            Versus {
                a: a_median,
                b: b_median,
                ratio: if a_median == 0.0 {
                    0.0
                } else {
                    b_median / a_median
                },
                b_better,
                pairs,
            }
        };
        BenchComparison {
            push_rate: versus(|s| s.push_rate.median, |r| r.push_rate, true),
            pop_rate: versus(|s| s.pop_rate.median, |r| r.pop_rate, true),
            push_ack_p99_us: versus(
                |s| s.push_ack_p99_us.median,
                |r| r.latency.push_ack_us.p99 as f64,
                false,
            ),
            push_ack_p99_slowest_leaf_us: versus(
                |s| s.push_ack_p99_slowest_leaf_us.median,
                |r| r.slowest_leaf_push_ack_p99_us() as f64,
                false,
            ),
            pop_p99_us: versus(
                |s| s.pop_p99_us.median,
                |r| r.latency.pop_us.p99 as f64,
                false,
            ),
            cpu_us_per_message: versus(
                |s| s.cpu_us_per_message.median,
                |r| r.cpu.us_per_message,
                false,
            ),
            a,
            b,
        }
    }

    /// The comparison table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "crest bench: A against B, {} interleaved pairs (medians)\n  {:<24} {:>12} {:>12} {:>7}  B better in\n",
            self.push_rate.pairs, "", "A", "B", "B/A"
        );
        let mut row = |name: &str, versus: &Versus| {
            out.push_str(&format!(
                "  {name:<24} {:>12.1} {:>12.1} {:>7.3}  {} of {}\n",
                versus.a, versus.b, versus.ratio, versus.b_better, versus.pairs
            ));
        };
        row("pushes (msgs/s)", &self.push_rate);
        row("pops (msgs/s)", &self.pop_rate);
        row("push-ack p99 (us)", &self.push_ack_p99_us);
        row("  slowest leaf (us)", &self.push_ack_p99_slowest_leaf_us);
        row("pop p99 (us)", &self.pop_p99_us);
        row("CPU per message (us)", &self.cpu_us_per_message);
        out
    }
}

impl BenchReport {
    /// The highest of the leaves' push-ack p99s (the whole's when no leaf is known).
    pub fn slowest_leaf_push_ack_p99_us(&self) -> u64 {
        self.latency
            .push_ack_by_leaf_us
            .values()
            .map(|p| p.p99)
            .max()
            .unwrap_or(self.latency.push_ack_us.p99)
    }

    /// One line of a repeated run.
    pub fn line(&self) -> String {
        format!(
            "pushes {:.0}/s  pops {:.0}/s  push-ack p99 {} us  pop p99 {} us  CPU {:.2} s  missing {}  duplicates {}\n",
            self.push_rate,
            self.pop_rate,
            self.latency.push_ack_us.p99,
            self.latency.pop_us.p99,
            self.cpu.seconds,
            self.missing,
            self.duplicates
        )
    }
}

impl CpuUse {
    /// The table's CPU line.
    fn line(&self) -> String {
        let whose = if self.includes_tree {
            "tree + load generator"
        } else {
            "load generator"
        };
        let mut line = format!(
            "  CPU ({whose}): {:.2} s = {:.1} us/msg",
            self.seconds, self.us_per_message
        );
        if let (Some(fill), Some(fill_us), Some(drain), Some(drain_us)) = (
            self.fill_seconds,
            self.fill_us_per_message,
            self.drain_seconds,
            self.drain_us_per_message,
        ) {
            line.push_str(&format!(
                "; fill {fill:.2} s = {fill_us:.1} us/msg, drain {drain:.2} s = {drain_us:.1} us/msg"
            ));
        }
        line.push('\n');
        line
    }
}

/// The processor time this process has used so far (all threads, user + system).
fn process_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Process CPU readings at the run's marks.
#[derive(Clone, Copy)]
struct CpuMarks {
    start: Duration,
    producers_done: Duration,
    end: Duration,
}

impl CpuMarks {
    fn usage(&self, phase: Phase, pushed: u64, popped: u64) -> CpuUse {
        let per = |cpu: Duration, count: u64| {
            if count == 0 {
                0.0
            } else {
                cpu.as_secs_f64() * 1e6 / count as f64
            }
        };
        let total = self.end.saturating_sub(self.start);
        let fill = self.producers_done.saturating_sub(self.start);
        let drain = self.end.saturating_sub(self.producers_done);
        let split = phase == Phase::FillThenDrain;
        CpuUse {
            includes_tree: false,
            seconds: total.as_secs_f64(),
            us_per_message: per(total, pushed),
            fill_seconds: split.then_some(fill.as_secs_f64()),
            fill_us_per_message: split.then(|| per(fill, pushed)),
            drain_seconds: split.then_some(drain.as_secs_f64()),
            drain_us_per_message: split.then(|| per(drain, popped)),
        }
    }
}

/// Which sequence numbers were popped: a growable bitmap.
#[derive(Default)]
struct Seen {
    words: Vec<u64>,
    distinct: u64,
    duplicates: u64,
}

impl Seen {
    /// Marks `seq`; whether it was new.
    fn mark(&mut self, seq: u64) -> bool {
        let word = (seq / 64) as usize;
        if word >= self.words.len() {
            self.words.resize((word + 1).next_power_of_two(), 0);
        }
        let bit = 1u64 << (seq % 64);
        if self.words[word] & bit != 0 {
            self.duplicates += 1;
            false
        } else {
            self.words[word] |= bit;
            self.distinct += 1;
            true
        }
    }
}

/// Messages present per priority: acknowledged by a leaf and not yet popped. A message popped
/// before its producer saw the ack makes its level dip below zero for a moment; sums clamp.
struct Present([AtomicI64; PRIORITY_LEVELS]);

impl Present {
    fn new() -> Present {
        Present(std::array::from_fn(|_| AtomicI64::new(0)))
    }

    fn add(&self, priority: u32) {
        self.0[priority as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether any message is present.
    fn any(&self) -> bool {
        self.0.iter().any(|level| level.load(Ordering::Relaxed) > 0)
    }

    /// Rank error of popping a message of `priority`, and the pop itself.
    fn pop(&self, priority: u32) -> u64 {
        let ahead: i64 = self.0[..priority as usize]
            .iter()
            .map(|level| level.load(Ordering::Relaxed).max(0))
            .sum();
        self.0[priority as usize].fetch_sub(1, Ordering::Relaxed);
        ahead as u64
    }
}

/// Runs of at most this many messages also measure the lease-time rank error (its ledger
/// takes 17 bytes per message).
pub const LEASE_RANK_MESSAGES_MAX: u64 = 4_000_000;

/// What the lease-time rank error needs of each message, by sequence number.
struct Ledger {
    /// When its push was acknowledged (`u64::MAX`: never).
    acked_ns: Box<[AtomicU64]>,
    /// When the pop that first delivered it was asked (`u64::MAX`: never delivered).
    popped_asked_ns: Box<[AtomicU64]>,
    /// Its priority.
    priority: Box<[AtomicU8]>,
}

impl Ledger {
    fn new(messages: u64) -> Option<Ledger> {
        if messages > LEASE_RANK_MESSAGES_MAX {
            return None;
        }
        let never = |_| AtomicU64::new(u64::MAX);
        let count = messages as usize;
        Some(Ledger {
            acked_ns: (0..count).map(never).collect(),
            popped_asked_ns: (0..count).map(never).collect(),
            priority: (0..count).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    fn acked(&self, seq: u64, priority: u32, at_ns: u64) {
        if let (Some(acked), Some(level)) = (
            self.acked_ns.get(seq as usize),
            self.priority.get(seq as usize),
        ) {
            level.store(
                priority.min(PRIORITY_LEVELS as u32 - 1) as u8,
                Ordering::Relaxed,
            );
            acked.store(at_ns, Ordering::Relaxed);
        }
    }

    fn popped(&self, seq: u64, asked_ns: u64) {
        if let Some(popped) = self.popped_asked_ns.get(seq as usize) {
            popped.store(asked_ns, Ordering::Relaxed);
        }
    }

    /// Each message as (priority, acked, asked of its delivering pop).
    fn messages(&self) -> Vec<LedgerEntry> {
        (0..self.acked_ns.len())
            .map(|i| LedgerEntry {
                priority: self.priority[i].load(Ordering::Relaxed),
                acked_ns: self.acked_ns[i].load(Ordering::Relaxed),
                popped_asked_ns: self.popped_asked_ns[i].load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// One message of the ledger.
#[derive(Clone, Copy, Debug)]
struct LedgerEntry {
    priority: u8,
    acked_ns: u64,
    popped_asked_ns: u64,
}

/// One pop that delivered messages new to the run.
#[derive(Clone, Debug)]
struct PopRecord {
    asked_ns: u64,
    answered_ns: u64,
    /// The priorities of the messages it delivered first, in the order delivered.
    priorities: Vec<u8>,
}

/// A count of values below a bound, for values inserted one at a time (a Fenwick tree over
/// value ranks).
struct RankCounter(Vec<u32>);

impl RankCounter {
    fn new(len: usize) -> RankCounter {
        RankCounter(vec![0; len + 1])
    }

    /// Counts the value of rank `rank` (0-based).
    fn insert(&mut self, rank: usize) {
        let mut i = rank + 1;
        while i < self.0.len() {
            self.0[i] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// How many inserted values have a rank below `rank`.
    fn below(&self, rank: usize) -> u64 {
        let mut i = rank.min(self.0.len() - 1);
        let mut count = 0u64;
        while i > 0 {
            count += u64::from(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        count
    }
}

/// The lease-time rank error of every delivery, as a lower bound: for a message a pop
/// delivered, the strictly more urgent messages that were certainly ready and unleased when
/// the root served that pop — acknowledged before the pop was asked, and delivered only by a
/// pop asked after it was answered (or never). A more urgent message in flight to another
/// consumer at the time is not counted (the definition counts only unleased messages); the live
/// rank error counts it, so the truth lies between the two.
fn lease_rank_errors(messages: &[LedgerEntry], pops: &mut [PopRecord]) -> Histogram<u64> {
    let mut errors = Histogram::<u64>::new_with_bounds(1, u64::MAX / 4, 3).expect("bounds");
    // Per priority level: the acknowledged messages' ack times (sorted), and the same
    // messages as (asked of their delivering pop, rank of their ack time), by that time.
    struct Level {
        acks: Vec<u64>,
        by_popped: Vec<(u64, usize)>,
        next: usize,
        counter: RankCounter,
    }
    let mut levels: Vec<Level> = (0..PRIORITY_LEVELS)
        .map(|_| Level {
            acks: Vec::new(),
            by_popped: Vec::new(),
            next: 0,
            counter: RankCounter::new(0),
        })
        .collect();
    for entry in messages.iter().filter(|e| e.acked_ns != u64::MAX) {
        levels[entry.priority as usize].acks.push(entry.acked_ns);
    }
    for level in &mut levels {
        level.acks.sort_unstable();
        level.counter = RankCounter::new(level.acks.len());
    }
    for entry in messages.iter().filter(|e| e.acked_ns != u64::MAX) {
        let level = &mut levels[entry.priority as usize];
        let rank = level.acks.partition_point(|&a| a < entry.acked_ns);
        level.by_popped.push((entry.popped_asked_ns, rank));
    }
    for level in &mut levels {
        level.by_popped.sort_unstable();
    }
    pops.sort_unstable_by_key(|pop| pop.answered_ns);
    let mut ahead = vec![0u64; PRIORITY_LEVELS];
    for pop in pops.iter() {
        let top = pop.priorities.iter().copied().max().unwrap_or(0) as usize;
        for (index, level) in levels.iter_mut().enumerate().take(top) {
            // Messages delivered by pops asked by the time this one was answered: leased
            // (or possibly leased) when it was served.
            while let Some(&(popped, rank)) = level.by_popped.get(level.next)
                && popped <= pop.answered_ns
            {
                level.counter.insert(rank);
                level.next += 1;
            }
            let acked_before = level.acks.partition_point(|&a| a < pop.asked_ns);
            ahead[index] = acked_before as u64 - level.counter.below(acked_before);
        }
        for &priority in &pop.priorities {
            let error: u64 = ahead[..priority as usize].iter().sum();
            errors.saturating_record(error);
        }
    }
    errors
}

/// State shared by every task of a run.
struct Shared {
    started: Instant,
    nonce: u64,
    next_seq: AtomicU64,
    pushed: AtomicU64,
    push_errors: AtomicU64,
    popped: AtomicU64,
    producers_done: AtomicBool,
    present: Present,
    /// For the lease-time rank error (`None`: too many messages for it).
    ledger: Option<Ledger>,
    seen: Mutex<Seen>,
    last_push_ack_ns: AtomicU64,
    first_pop_ns: AtomicU64,
    last_pop_ns: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

/// The header line of a percentile table (`crest bench`, `crest wal bench`).
pub(crate) fn percentile_header() -> String {
    format!(
        "  {:<22} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "", "count", "p50", "p90", "p99", "p99.9", "max"
    )
}

/// One line of a percentile table.
pub(crate) fn percentile_row(name: &str, p: &Percentiles) -> String {
    format!(
        "  {:<22} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        name, p.count, p.p50, p.p90, p.p99, p.p999, p.max
    )
}

/// A latency histogram in microseconds, up to an hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

fn record(histogram: &mut Histogram<u64>, value: u64) {
    histogram.saturating_record(value.max(1));
}

fn stamp(payload_bytes: usize, nonce: u64, seq: u64, sent_ns: u64) -> Bytes {
    let mut payload = BytesMut::with_capacity(payload_bytes);
    payload.put_u64_le(nonce);
    payload.put_u64_le(seq);
    payload.put_u64_le(sent_ns);
    payload.resize(payload_bytes, 0x2a);
    payload.freeze()
}

fn read_stamp(payload: &[u8], nonce: u64) -> Option<(u64, u64)> {
    if payload.len() < STAMP_BYTES {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(payload[i * 8..i * 8 + 8].try_into().expect("8"));
    (word(0) == nonce).then(|| (word(1), word(2)))
}

/// Push-ack latencies, in all and per leaf.
struct PushAcks {
    all: Histogram<u64>,
    by_leaf: BTreeMap<u16, Histogram<u64>>,
}

impl PushAcks {
    fn new() -> PushAcks {
        PushAcks {
            all: histogram(),
            by_leaf: BTreeMap::new(),
        }
    }

    fn record(&mut self, leaf: u16, micros: u64) {
        record(&mut self.all, micros);
        record(self.by_leaf.entry(leaf).or_insert_with(histogram), micros);
    }

    fn merge(&mut self, other: PushAcks) {
        self.all.add(&other.all).expect("same bounds");
        for (leaf, hist) in other.by_leaf {
            self.by_leaf
                .entry(leaf)
                .or_insert_with(histogram)
                .add(&hist)
                .expect("same bounds");
        }
    }
}

struct ProducerResult {
    push_ack: PushAcks,
}

async fn run_producer(
    config: Arc<BenchConfig>,
    producer_config: ProducerConfig,
    shared: Arc<Shared>,
    index: usize,
) -> Result<ProducerResult> {
    let producer = Producer::connect(producer_config)
        .await
        .context("producer connecting to the leaves")?;
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(index as u64));
    let mut push_ack = PushAcks::new();
    let mut in_flight = FuturesUnordered::new();
    // Messages sent and not yet settled (the window counts messages, not batches).
    let mut unsettled = 0usize;
    let per_producer_rate = config.rate.map(|rate| rate / config.producers as f64);
    let deadline = config.duration.map(|d| shared.started + d);
    let mut sent = 0u64;
    let begun = Instant::now();
    let due = |sent: u64| {
        per_producer_rate.map(|rate| begun + Duration::from_secs_f64(sent as f64 / rate))
    };
    let mut done = false;
    while !done {
        // Acknowledgements are taken in while the producer waits (for its pace, its window,
        // or a full send queue), so a push-ack latency is measured when the ack arrives.
        if let Some(due) = due(sent) {
            let sleep = tokio::time::sleep_until(due.into());
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    biased;
                    () = &mut sleep => break,
                    Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                        unsettled -= settle_push(outcome, &shared, &mut push_ack);
                    }
                }
            }
        }
        while unsettled >= config.producer_window {
            let Some(outcome) = in_flight.next().await else {
                break;
            };
            unsettled -= settle_push(outcome, &shared, &mut push_ack);
        }
        // The batch: the first message, then those already due, within the batch and window.
        let mut messages = Vec::new();
        let mut stamps = Vec::new();
        loop {
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                done = true;
                break;
            }
            let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
            if seq >= config.messages {
                done = true;
                break;
            }
            let priority = config.priorities.draw(&mut rng);
            let sent_ns = shared.now_ns();
            let payload = stamp(config.payload_bytes, shared.nonce, seq, sent_ns);
            messages.push(Message::new(config.topic.clone(), payload).priority(priority));
            stamps.push((priority, sent_ns, seq));
            sent += 1;
            if messages.len() >= config.push_batch
                || unsettled + messages.len() >= config.producer_window
                || due(sent).is_some_and(|due| due > Instant::now())
            {
                break;
            }
        }
        if messages.is_empty() {
            break;
        }
        let count = messages.len();
        let send = producer.send_batch(messages);
        tokio::pin!(send);
        let sent_result = loop {
            tokio::select! {
                biased;
                result = &mut send => break result,
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    unsettled -= settle_push(outcome, &shared, &mut push_ack);
                }
            }
        };
        match sent_result {
            Ok(handle) => {
                unsettled += count;
                in_flight.push(async move { (handle.acked().await, stamps) });
            }
            Err(error) => {
                shared
                    .push_errors
                    .fetch_add(count as u64, Ordering::Relaxed);
                tracing::warn!("push failed: {error}");
            }
        }
        // Settle acknowledgements already in, without waiting.
        while let Some(Some(outcome)) = futures_util::FutureExt::now_or_never(in_flight.next()) {
            unsettled -= settle_push(outcome, &shared, &mut push_ack);
        }
    }
    while let Some(outcome) = in_flight.next().await {
        settle_push(outcome, &shared, &mut push_ack);
    }
    Ok(ProducerResult { push_ack })
}

/// A batch's outcome, and the priority, send time and sequence number of each of its
/// messages.
type PushOutcome = (
    Result<Vec<crate::core::id::MessageId>, crate::sdk::ClientError>,
    Vec<(u32, u64, u64)>,
);

/// Counts a batch's outcome; how many messages it settled.
fn settle_push(outcome: PushOutcome, shared: &Shared, push_ack: &mut PushAcks) -> usize {
    let (result, stamps) = outcome;
    match result {
        Ok(ids) => {
            let now = shared.now_ns();
            for (index, &(priority, sent_ns, seq)) in stamps.iter().enumerate() {
                // The SDK gives an id per message; were one missing, it would count as leaf 0,
                // which no leaf is.
                let leaf = ids.get(index).map_or(0, |id| id.leaf().0);
                push_ack.record(leaf, now.saturating_sub(sent_ns) / 1000);
                shared.present.add(priority);
                if let Some(ledger) = &shared.ledger {
                    ledger.acked(seq, priority, now);
                }
            }
            shared
                .pushed
                .fetch_add(stamps.len() as u64, Ordering::Relaxed);
            shared.last_push_ack_ns.fetch_max(now, Ordering::Relaxed);
        }
        Err(error) => {
            shared
                .push_errors
                .fetch_add(stamps.len() as u64, Ordering::Relaxed);
            tracing::warn!("push not acknowledged: {error}");
        }
    }
    stamps.len()
}

#[derive(Default)]
struct ConsumerResult {
    pop: Option<Histogram<u64>>,
    pop_wait: Option<Histogram<u64>>,
    ack: Option<Histogram<u64>>,
    push_to_pop: Option<Histogram<u64>>,
    rank_error: Option<Histogram<u64>>,
    /// Pops that delivered new messages (for the lease-time rank error).
    pops: Vec<PopRecord>,
    acked: u64,
    ack_rejected: u64,
    foreign: u64,
    empty_pops: u64,
    inverted_pops: u64,
}

async fn run_consumer(
    config: Arc<BenchConfig>,
    consumer: Consumer,
    shared: Arc<Shared>,
) -> Result<ConsumerResult> {
    let mut pop = histogram();
    let mut pop_wait = histogram();
    let mut ack = histogram();
    let mut push_to_pop = histogram();
    let mut rank_error = Histogram::<u64>::new_with_bounds(1, u64::MAX / 4, 3).expect("bounds");
    let mut result = ConsumerResult::default();
    let options = PopOptions {
        max: config.pop_batch,
        wait: Duration::from_millis(100),
        ..PopOptions::default()
    };
    let mut idle_since = Instant::now();
    let mut acks = tokio::task::JoinSet::new();
    loop {
        let producers_done = shared.producers_done.load(Ordering::Acquire);
        if producers_done
            && shared.popped.load(Ordering::Acquire) >= shared.pushed.load(Ordering::Acquire)
        {
            break;
        }
        if producers_done && idle_since.elapsed() >= config.drain_idle_timeout {
            break;
        }
        let asked = Instant::now();
        let asked_ns = shared.now_ns();
        let known_ready = shared.present.any();
        let deliveries: Vec<Delivery> = consumer
            .pop_with(&config.topic, options.clone())
            .await
            .context("pop")?;
        let answered = shared.now_ns();
        if deliveries.is_empty() {
            result.empty_pops += 1;
            continue;
        }
        idle_since = Instant::now();
        if known_ready {
            record(&mut pop, asked.elapsed().as_micros() as u64);
        }
        shared.first_pop_ns.fetch_min(answered, Ordering::Relaxed);
        let mut new = 0u64;
        let mut first_sent_ns = u64::MAX;
        let mut priorities = Vec::new();
        {
            let mut seen = shared.seen.lock().expect("not poisoned");
            for delivery in &deliveries {
                let Some((seq, sent_ns)) = read_stamp(&delivery.payload, shared.nonce) else {
                    result.foreign += 1;
                    continue;
                };
                first_sent_ns = first_sent_ns.min(sent_ns);
                if !seen.mark(seq) {
                    continue;
                }
                new += 1;
                if let Some(ledger) = &shared.ledger {
                    ledger.popped(seq, asked_ns);
                    priorities.push(delivery.priority.min(PRIORITY_LEVELS as u32 - 1) as u8);
                }
                record(&mut push_to_pop, answered.saturating_sub(sent_ns) / 1000);
                let error = shared
                    .present
                    .pop(delivery.priority.min(PRIORITY_LEVELS as u32 - 1));
                rank_error.saturating_record(error);
                if error > 0 {
                    result.inverted_pops += 1;
                }
            }
        }
        if !priorities.is_empty() {
            result.pops.push(PopRecord {
                asked_ns,
                answered_ns: answered,
                priorities,
            });
        }
        if let Some(wait) = pop_wait_ns(asked_ns, first_sent_ns, answered) {
            record(&mut pop_wait, wait / 1000);
        }
        shared.popped.fetch_add(new, Ordering::AcqRel);
        if config.ack {
            // Acks are pipelined behind the next pops (a few in flight), as a consumer that
            // processes one batch while the previous one's ack travels.
            while acks.len() >= config.acks_in_flight.max(1) {
                settle_ack(acks.join_next().await, &mut ack, &mut result)?;
            }
            let receipts: Vec<_> = deliveries.iter().map(Delivery::receipt).collect();
            let consumer = consumer.clone();
            let shared = shared.clone();
            acks.spawn(async move {
                let sent = Instant::now();
                let outcomes = consumer.ack_many(&receipts).await;
                shared
                    .last_pop_ns
                    .fetch_max(shared.now_ns(), Ordering::Relaxed);
                (sent.elapsed(), outcomes)
            });
        } else {
            shared
                .last_pop_ns
                .fetch_max(shared.now_ns(), Ordering::Relaxed);
        }
    }
    while let Some(done) = acks.join_next().await {
        settle_ack(Some(done), &mut ack, &mut result)?;
    }
    result.pop = Some(pop);
    result.pop_wait = Some(pop_wait);
    result.ack = Some(ack);
    result.push_to_pop = Some(push_to_pop);
    result.rank_error = Some(rank_error);
    Ok(result)
}

/// How long a pop asked at `asked_ns` and answered at `answered_ns` kept a consumer waiting
/// while something it got existed: from the later of the request and the first push among
/// its deliveries (`first_sent_ns`; `u64::MAX`: none of the bench's), in nanoseconds.
fn pop_wait_ns(asked_ns: u64, first_sent_ns: u64, answered_ns: u64) -> Option<u64> {
    (first_sent_ns != u64::MAX).then(|| answered_ns.saturating_sub(asked_ns.max(first_sent_ns)))
}

type AckOutcome = (
    Duration,
    Result<Vec<Result<(), crate::sdk::ReceiptError>>, crate::sdk::ClientError>,
);

fn settle_ack(
    done: Option<Result<AckOutcome, tokio::task::JoinError>>,
    histogram: &mut Histogram<u64>,
    result: &mut ConsumerResult,
) -> Result<()> {
    let Some(done) = done else {
        return Ok(());
    };
    let (took, outcomes) = done.context("ack task")?;
    record(histogram, took.as_micros() as u64);
    for outcome in outcomes.context("ack")? {
        match outcome {
            Ok(()) => result.acked += 1,
            Err(_) => result.ack_rejected += 1,
        }
    }
    Ok(())
}

fn spawn_progress(shared: Arc<Shared>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        let (mut last_pushed, mut last_popped) = (0u64, 0u64);
        loop {
            ticker.tick().await;
            let pushed = shared.pushed.load(Ordering::Relaxed);
            let popped = shared.popped.load(Ordering::Relaxed);
            let seconds = every.as_secs_f64();
            eprintln!(
                "[{:>6.1}s] pushed {pushed:>10} ({:>9.0}/s)  popped {popped:>10} ({:>9.0}/s)  errors {}",
                shared.started.elapsed().as_secs_f64(),
                (pushed - last_pushed) as f64 / seconds,
                (popped - last_popped) as f64 / seconds,
                shared.push_errors.load(Ordering::Relaxed),
            );
            let _ = std::io::stderr().flush();
            last_pushed = pushed;
            last_popped = popped;
        }
    })
}

/// A started or found tree: where to push and pop, and what to stop afterwards.
struct Running {
    leaves: Vec<String>,
    root: String,
    tls: ClientTls,
    local: Option<LocalTree>,
    durable: Option<bool>,
    syncing_leaves: Option<(usize, usize)>,
}

async fn start(target: &Target) -> Result<Running> {
    match target {
        Target::Remote { leaves, root, tls } => Ok(Running {
            leaves: leaves.clone(),
            root: root.clone(),
            tls: tls.clone(),
            local: None,
            durable: None,
            syncing_leaves: None,
        }),
        Target::Local { topology, data_dir } => {
            if let Some(dir) = data_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            let tree = LocalTree::start_with(&topology.with_ephemeral_ports(), data_dir.as_deref())
                .await
                .context("starting the local tree")?;
            if !tree.wait_connected(Duration::from_secs(10)).await {
                tree.shutdown().await;
                bail!("the local tree did not connect within 10 s");
            }
            Ok(Running {
                leaves: tree.topology.leaves().map(|l| l.address.clone()).collect(),
                root: tree.topology.root().address.clone(),
                tls: ClientTls {
                    ca_pem: tree.ca_pem.clone(),
                },
                durable: Some(data_dir.is_some()),
                syncing_leaves: data_dir.is_some().then(|| {
                    let leaves: Vec<_> = tree.topology.leaves().collect();
                    let syncing = leaves
                        .iter()
                        .filter(|leaf| leaf.settings.durability == Durability::Fsync)
                        .count();
                    (syncing, leaves.len())
                }),
                local: Some(tree),
            })
        }
    }
}

/// Runs the bench and returns its report.
///
/// # Errors
/// A bad configuration, a tree that cannot be started or reached, a pop or ack that fails.
pub async fn run(config: BenchConfig) -> Result<BenchReport> {
    config.validate()?;
    let running = start(&config.target).await?;
    let result = drive(&config, &running).await;
    let includes_tree = running.local.is_some();
    let mut violations = None;
    let mut lost = None;
    let mut log_sync = None;
    let mut log_sync_by_leaf = BTreeMap::new();
    if let Some(tree) = &running.local {
        let (mut violations_sum, mut lost_sum) = (0, 0);
        let mut syncs = crate::core::metrics::Hist::default();
        for node in &tree.nodes {
            if node.role() == crate::core::wire::Role::Leaf
                && let Ok(report) = node.report().await
                && let Some(hist) = report.histograms.get(&Metric::LogSync)
                && hist.count() > 0
            {
                syncs.merge(hist);
                log_sync_by_leaf.insert(node.name().to_string(), hist.percentiles());
            }
            if let Ok(stats) = node.stats().await {
                violations_sum += stats.violations;
            }
            if let Ok(links) = node.links().await {
                lost_sum += links.totals.iter().map(|t| t.lost_packets).sum::<u64>();
            }
        }
        violations = Some(violations_sum);
        lost = Some(lost_sum);
        log_sync = (syncs.count() > 0).then(|| syncs.percentiles());
    }
    if let Some(tree) = running.local {
        tree.shutdown().await;
    }
    if let Target::Local {
        data_dir: Some(dir),
        ..
    } = &config.target
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    let mut report = result?;
    report.durable = running.durable;
    report.syncing_leaves = running.syncing_leaves;
    report.protocol_violations = violations;
    report.quic_lost_packets = lost;
    report.log_sync_us = log_sync;
    report.log_sync_by_leaf_us = log_sync_by_leaf;
    report.cpu.includes_tree = includes_tree;
    Ok(report)
}

async fn drive(config: &BenchConfig, running: &Running) -> Result<BenchReport> {
    let config = Arc::new(config.clone());
    let cpu_start = process_cpu();
    let shared = Arc::new(Shared {
        started: Instant::now(),
        nonce: rand::rng().random(),
        next_seq: AtomicU64::new(0),
        pushed: AtomicU64::new(0),
        push_errors: AtomicU64::new(0),
        popped: AtomicU64::new(0),
        producers_done: AtomicBool::new(false),
        present: Present::new(),
        ledger: Ledger::new(config.messages),
        seen: Mutex::new(Seen::default()),
        last_push_ack_ns: AtomicU64::new(0),
        first_pop_ns: AtomicU64::new(u64::MAX),
        last_pop_ns: AtomicU64::new(0),
    });
    let mut consumers = Vec::new();
    for _ in 0..config.consumers {
        let consumer_config = ConsumerConfig::new(running.root.clone(), running.tls.clone());
        consumers.push(
            Consumer::connect(consumer_config)
                .await
                .context("consumer connecting to the root")?,
        );
    }
    let progress = config
        .progress
        .map(|every| spawn_progress(shared.clone(), every));
    let producer_config = ProducerConfig::new(running.leaves.clone(), running.tls.clone());
    let producers: Vec<_> = (0..config.producers)
        .map(|index| {
            tokio::spawn(run_producer(
                config.clone(),
                producer_config.clone(),
                shared.clone(),
                index,
            ))
        })
        .collect();
    let start_consumers = |consumers: Vec<Consumer>| -> Vec<_> {
        consumers
            .into_iter()
            .map(|consumer| tokio::spawn(run_consumer(config.clone(), consumer, shared.clone())))
            .collect()
    };
    let mut consumer_tasks = match config.phase {
        Phase::Mixed => start_consumers(std::mem::take(&mut consumers)),
        Phase::FillThenDrain => Vec::new(),
    };
    let mut push_ack = PushAcks::new();
    let mut failure = None;
    for task in producers {
        match task.await.context("producer task")? {
            Ok(result) => push_ack.merge(result.push_ack),
            Err(error) => failure = Some(error),
        }
    }
    shared.producers_done.store(true, Ordering::Release);
    let cpu_producers_done = process_cpu();
    if let Some(error) = failure {
        shared.popped.store(u64::MAX, Ordering::Release);
        for task in consumer_tasks {
            let _ = task.await;
        }
        return Err(error);
    }
    if config.phase == Phase::FillThenDrain {
        consumer_tasks = start_consumers(consumers);
    }
    let mut results = Vec::new();
    for task in consumer_tasks {
        results.push(task.await.context("consumer task")??);
    }
    let cpu = CpuMarks {
        start: cpu_start,
        producers_done: cpu_producers_done,
        end: process_cpu(),
    };
    if let Some(progress) = progress {
        progress.abort();
    }
    Ok(report(&config, &shared, push_ack, results, cpu))
}

fn report(
    config: &BenchConfig,
    shared: &Shared,
    push_ack: PushAcks,
    results: Vec<ConsumerResult>,
    cpu: CpuMarks,
) -> BenchReport {
    let mut pop = histogram();
    let mut pop_wait = histogram();
    let mut ack = histogram();
    let mut push_to_pop = histogram();
    let mut rank_error = Histogram::<u64>::new_with_bounds(1, u64::MAX / 4, 3).expect("bounds");
    let mut totals = ConsumerResult::default();
    for result in results {
        let merge = |into: &mut Histogram<u64>, from: Option<Histogram<u64>>| {
            if let Some(from) = from {
                into.add(from).expect("same bounds");
            }
        };
        merge(&mut pop, result.pop);
        merge(&mut pop_wait, result.pop_wait);
        merge(&mut ack, result.ack);
        merge(&mut push_to_pop, result.push_to_pop);
        merge(&mut rank_error, result.rank_error);
        totals.acked += result.acked;
        totals.ack_rejected += result.ack_rejected;
        totals.foreign += result.foreign;
        totals.empty_pops += result.empty_pops;
        totals.inverted_pops += result.inverted_pops;
        totals.pops.extend(result.pops);
    }
    let lease_rank_error = shared.ledger.as_ref().map(|ledger| {
        let errors = lease_rank_errors(&ledger.messages(), &mut totals.pops);
        let inverted = errors.count_between(1, u64::MAX / 4);
        (Percentiles::of(&errors), inverted)
    });
    let seen = shared.seen.lock().expect("not poisoned");
    let pushed = shared.pushed.load(Ordering::Relaxed);
    let push_seconds = shared.last_push_ack_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let first_pop = shared.first_pop_ns.load(Ordering::Relaxed);
    let pop_seconds = if first_pop == u64::MAX {
        0.0
    } else {
        shared
            .last_pop_ns
            .load(Ordering::Relaxed)
            .saturating_sub(first_pop) as f64
            / 1e9
    };
    let rate = |count: u64, seconds: f64| {
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    };
    let push_rate = rate(pushed, push_seconds);
    BenchReport {
        phase: config.phase,
        producers: config.producers,
        consumers: config.consumers,
        payload_bytes: config.payload_bytes,
        priorities: config.priorities,
        pop_batch: config.pop_batch,
        ack: config.ack,
        target_rate: config.rate,
        durable: None,
        syncing_leaves: None,
        pushed,
        push_errors: shared.push_errors.load(Ordering::Relaxed),
        popped: seen.distinct,
        duplicates: seen.duplicates,
        missing: pushed.saturating_sub(seen.distinct),
        acked: totals.acked,
        ack_rejected: totals.ack_rejected,
        foreign: totals.foreign,
        empty_pops: totals.empty_pops,
        push_seconds,
        push_rate,
        push_mb_per_s: push_rate * config.payload_bytes as f64 / 1e6,
        pop_seconds,
        pop_rate: rate(seen.distinct, pop_seconds),
        latency: Latencies {
            push_ack_us: Percentiles::of(&push_ack.all),
            push_ack_by_leaf_us: push_ack
                .by_leaf
                .iter()
                .map(|(leaf, hist)| (*leaf, Percentiles::of(hist)))
                .collect(),
            pop_us: Percentiles::of(&pop),
            pop_wait_us: Percentiles::of(&pop_wait),
            ack_us: Percentiles::of(&ack),
            push_to_pop_us: Percentiles::of(&push_to_pop),
        },
        rank_error: Percentiles::of(&rank_error),
        inverted_pops: totals.inverted_pops,
        lease_rank_error: lease_rank_error.map(|(percentiles, _)| percentiles),
        lease_inverted_pops: lease_rank_error.map(|(_, inverted)| inverted),
        protocol_violations: None,
        quic_lost_packets: None,
        log_sync_us: None,
        log_sync_by_leaf_us: BTreeMap::new(),
        cpu: cpu.usage(config.phase, pushed, seen.distinct),
    }
}

impl BenchReport {
    /// The final table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let tree = match (self.durable, self.syncing_leaves) {
            (Some(true), Some((syncing, leaves))) if syncing < leaves => format!(
                "local tree, leaves with logs: {syncing} of {leaves} fsync before ack, the \
                 others write without syncing"
            ),
            (Some(true), _) => "local tree, durable leaves (fsync before ack)".into(),
            (Some(false), _) => "local tree, in-memory leaves".into(),
            (None, _) => "remote tree".into(),
        };
        out.push_str(&format!(
            "crest bench: {:?}, {} producers x {} consumers, {} B payloads, {:?} priorities, pop batch {}, ack {}, {}\n",
            self.phase,
            self.producers,
            self.consumers,
            self.payload_bytes,
            self.priorities,
            self.pop_batch,
            if self.ack { "on" } else { "off" },
            tree
        ));
        out.push_str(&format!(
            "  pushed   {:>10}  in {:>7.3} s  = {:>10.0} msgs/s  ({:.1} MB/s){}\n",
            self.pushed,
            self.push_seconds,
            self.push_rate,
            self.push_mb_per_s,
            match self.target_rate {
                Some(rate) => format!("  target {rate:.0}/s"),
                None => String::new(),
            }
        ));
        out.push_str(&format!(
            "  popped   {:>10}  in {:>7.3} s  = {:>10.0} msgs/s{}\n",
            self.popped,
            self.pop_seconds,
            self.pop_rate,
            if self.ack { " (pop + ack)" } else { "" }
        ));
        out.push_str(&format!(
            "  errors: push {}  missing {}  duplicates {}  ack rejected {}  foreign {}  empty pops {}\n",
            self.push_errors,
            self.missing,
            self.duplicates,
            self.ack_rejected,
            self.foreign,
            self.empty_pops
        ));
        out.push_str(&percentile_header());
        let mut row = |name: &str, p: &Percentiles| out.push_str(&percentile_row(name, p));
        row("push-ack latency (us)", &self.latency.push_ack_us);
        if self.latency.push_ack_by_leaf_us.len() > 1 {
            for (leaf, p) in &self.latency.push_ack_by_leaf_us {
                row(&format!("  at leaf {leaf}"), p);
            }
        }
        row("pop latency (us)", &self.latency.pop_us);
        row("pop wait (us)", &self.latency.pop_wait_us);
        row("ack latency (us)", &self.latency.ack_us);
        row("push-to-pop (us)", &self.latency.push_to_pop_us);
        if let Some(syncs) = &self.log_sync_us {
            row("leaves' log syncs (us)", syncs);
            if self.log_sync_by_leaf_us.len() > 1 {
                for (leaf, p) in &self.log_sync_by_leaf_us {
                    row(&format!("  at {leaf}"), p);
                }
            }
        }
        row("rank error (msgs)", &self.rank_error);
        if let Some(lease) = &self.lease_rank_error {
            row("  at lease time (msgs)", lease);
        }
        out.push_str(&format!(
            "  pops with a rank error above 0: {} of {}{}\n",
            self.inverted_pops,
            self.rank_error.count,
            match self.lease_inverted_pops {
                Some(inverted) => format!(" ({inverted} at lease time)"),
                None => String::new(),
            }
        ));
        if let Some(violations) = self.protocol_violations {
            out.push_str(&format!(
                "  protocol violations in the tree: {violations}\n"
            ));
        }
        if let Some(lost) = self.quic_lost_packets {
            out.push_str(&format!(
                "  QUIC packets lost on the tree's links: {lost}\n"
            ));
        }
        out.push_str(&self.cpu.line());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_rank_error_counts_only_messages_certainly_ready_and_unleased() {
        let entry = |priority, acked_ns, popped_asked_ns| LedgerEntry {
            priority,
            acked_ns,
            popped_asked_ns,
        };
        let messages = [
            // More urgent, acked early, delivered by a pop asked after A answered: counts.
            entry(0, 10, 50),
            // A's own message.
            entry(1, 10, 20),
            // More urgent, but in flight to another consumer (asked before A answered).
            entry(0, 10, 25),
            // More urgent, but acked only after A was asked: maybe not ready yet.
            entry(0, 21, 60),
            // Less urgent: never counts against A.
            entry(2, 5, 70),
            // More urgent, acked early, never delivered: counts.
            entry(0, 10, u64::MAX),
            // Never acked: not a message of the run.
            entry(0, u64::MAX, u64::MAX),
        ];
        let pop = |asked_ns, answered_ns, priorities: &[u8]| PopRecord {
            asked_ns,
            answered_ns,
            priorities: priorities.to_vec(),
        };
        // Given out of answer order on purpose.
        let mut pops = [
            pop(50, 55, &[0]),
            pop(20, 30, &[1]),
            pop(25, 28, &[0]),
            pop(60, 65, &[0]),
            pop(70, 75, &[2]),
        ];
        let errors = lease_rank_errors(&messages, &mut pops);
        assert_eq!(errors.len(), 5, "one value per delivery");
        // A (answered at 30): the messages delivered at 50 and never: 2. The pop at 70
        // (priority 2): the never-delivered one only (the others were delivered before).
        assert_eq!(errors.max(), 2);
        assert_eq!(errors.count_between(1, u64::MAX / 4), 2);
        assert_eq!(errors.count_at(2), 1);
        assert_eq!(errors.count_at(1), 1);
    }

    #[test]
    fn rank_counters_count_values_below_a_rank() {
        let mut counter = RankCounter::new(5);
        assert_eq!(counter.below(5), 0);
        for rank in [0, 2, 2, 4] {
            counter.insert(rank);
        }
        assert_eq!(counter.below(0), 0);
        assert_eq!(counter.below(1), 1);
        assert_eq!(counter.below(3), 3);
        assert_eq!(counter.below(5), 4);
        assert_eq!(counter.below(99), 4);
    }

    #[test]
    fn spreads_take_the_median_and_range() {
        assert_eq!(Spread::of([]), None);
        let odd = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((odd.median, odd.min, odd.max), (2.0, 1.0, 3.0));
        let even = Spread::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
    }

    #[test]
    fn cpu_use_splits_fill_and_drain_and_divides_by_messages() {
        let marks = CpuMarks {
            start: Duration::from_millis(100),
            producers_done: Duration::from_millis(300),
            end: Duration::from_millis(900),
        };
        let fill_then_drain = marks.usage(Phase::FillThenDrain, 1000, 500);
        assert!((fill_then_drain.seconds - 0.8).abs() < 1e-9);
        assert!((fill_then_drain.us_per_message - 800.0).abs() < 1e-6);
        assert!((fill_then_drain.fill_seconds.unwrap() - 0.2).abs() < 1e-9);
        assert!((fill_then_drain.fill_us_per_message.unwrap() - 200.0).abs() < 1e-6);
        assert!((fill_then_drain.drain_seconds.unwrap() - 0.6).abs() < 1e-9);
        assert!((fill_then_drain.drain_us_per_message.unwrap() - 1200.0).abs() < 1e-6);
        let line = fill_then_drain.line();
        assert!(
            line.contains("CPU (load generator): 0.80 s = 800.0 us/msg"),
            "{line}"
        );
        assert!(
            line.contains("fill 0.20 s = 200.0 us/msg, drain 0.60 s"),
            "{line}"
        );
        // Mixed: no split; nothing pushed: no division by zero.
        let mixed = marks.usage(Phase::Mixed, 0, 0);
        assert_eq!(mixed.fill_seconds, None);
        assert_eq!(mixed.us_per_message, 0.0);
        assert!(!mixed.line().contains("fill"));
        // The clock reads this process's time: it moves when the process works.
        let before = process_cpu();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        assert!(process_cpu() > before);
    }

    #[test]
    fn priority_mixes_parse_and_draw_in_range() {
        assert_eq!("skewed".parse::<PriorityMix>(), Ok(PriorityMix::Skewed));
        assert_eq!(
            "uniform:4".parse::<PriorityMix>(),
            Ok(PriorityMix::Uniform { levels: 4 })
        );
        assert_eq!(
            "fixed:3".parse::<PriorityMix>(),
            Ok(PriorityMix::Fixed { priority: 3 })
        );
        for bad in [
            "",
            "uniform:0",
            "uniform:65",
            "fixed:64",
            "fixed",
            "zipf",
            "uniform:x",
        ] {
            assert!(bad.parse::<PriorityMix>().is_err(), "{bad}");
        }
        let mut rng = SmallRng::seed_from_u64(7);
        let mut tiers = [0u32; 3];
        for _ in 0..100_000 {
            match PriorityMix::Skewed.draw(&mut rng) {
                0..=2 => tiers[0] += 1,
                3..=6 => tiers[1] += 1,
                7..=9 => tiers[2] += 1,
                other => panic!("skewed drew {other}"),
            }
        }
        // 10 / 20 / 70 percent, within a percent.
        assert!((9_000..11_000).contains(&tiers[0]), "{tiers:?}");
        assert!((19_000..21_000).contains(&tiers[1]), "{tiers:?}");
        assert!((69_000..71_000).contains(&tiers[2]), "{tiers:?}");
        let uniform = PriorityMix::Uniform { levels: 4 };
        assert!((0..1000).all(|_| uniform.draw(&mut rng) < 4));
    }

    #[test]
    fn a_pop_waits_from_its_request_or_its_first_message_s_push_whichever_is_later() {
        // A message was there before the pop was asked: the whole request counts.
        assert_eq!(pop_wait_ns(1_000, 400, 3_000), Some(2_000));
        // Every message came after the request: from the first one's push.
        assert_eq!(pop_wait_ns(1_000, 2_500, 3_000), Some(500));
        // Nothing of the bench's was delivered: no figure.
        assert_eq!(pop_wait_ns(1_000, u64::MAX, 3_000), None);
    }

    #[test]
    fn stamps_round_trip_and_foreign_payloads_are_told_apart() {
        let payload = stamp(100, 42, 7, 123_456);
        assert_eq!(payload.len(), 100);
        assert_eq!(read_stamp(&payload, 42), Some((7, 123_456)));
        assert_eq!(read_stamp(&payload, 43), None, "another run's nonce");
        assert_eq!(read_stamp(b"short", 42), None);
    }

    #[test]
    fn rank_error_counts_more_urgent_present_messages() {
        let present = Present::new();
        for priority in [0, 0, 1, 3, 3, 5] {
            present.add(priority);
        }
        assert_eq!(present.pop(3), 3, "two of 0 and one of 1 were more urgent");
        assert_eq!(present.pop(0), 0);
        assert_eq!(present.pop(0), 0);
        assert_eq!(present.pop(5), 2, "1 and the other 3");
        // A message popped before its ack was seen: its level dips below zero, never
        // counted as negative.
        assert_eq!(present.pop(2), 1);
        assert_eq!(present.pop(4), 2, "level 2 at -1 counts as 0");
    }

    #[test]
    fn seen_counts_distinct_and_duplicate_sequence_numbers() {
        let mut seen = Seen::default();
        assert!(seen.mark(0));
        assert!(seen.mark(100_000));
        assert!(!seen.mark(0));
        assert!(seen.mark(63));
        assert!(seen.mark(64));
        assert_eq!((seen.distinct, seen.duplicates), (4, 1));
    }
}
