//! What a run reports: latencies, rates, rank errors, CPU; medians and ranges of several runs;
//! the comparison of two trees run in interleaved pairs; and the tables printed.

use super::*;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

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
    /// Fairness keys drawn for the messages (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fairness_keys: u32,
    /// Pop batch.
    pub pop_batch: u32,
    /// Whether deliveries were acknowledged.
    pub ack: bool,
    /// Whether acknowledgements went through the root rather than to the owning leaves.
    #[serde(default)]
    pub acks_through_root: bool,
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
    /// Pops that failed after the consumer's own tries (the root out of reach).
    pub pop_errors: u64,
    /// Ack requests that failed as a whole after the consumer's own tries.
    pub ack_errors: u64,
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
    /// Push batches the local tree's leaves held for want of an allowance or rate tokens from
    /// the root (limits), and those they refused for it; `None` for a remote tree. Each held
    /// batch waited a round trip to the root.
    #[serde(default)]
    pub pushes_held: Option<(u64, u64)>,
    /// The local tree's leaves' log syncs (`fdatasync` of groups pushes and acks waited
    /// for), microseconds, over the leaves' recent past (their last 10–20 s: all of a short
    /// run); `None` for a remote tree or leaves in memory.
    pub log_sync_us: Option<Percentiles>,
    /// The same, per durable leaf (by node name).
    pub log_sync_by_leaf_us: BTreeMap<String, Percentiles>,
    /// Processor time this process spent over the run.
    pub cpu: CpuUse,
    /// With `--connect`: processor time of each node process that answered on `/metrics`.
    pub nodes_cpu: Vec<NodeCpu>,
    /// What a noisy neighbour running alongside was admitted and refused.
    pub noise: Option<crate::noise::NoiseReport>,
}

/// A node process's processor time over a run against a running tree (user + system, all its
/// threads), per message: its cost, and what one of its cores could carry at that cost.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeCpu {
    /// The node's name in the topology.
    pub name: String,
    /// The process it runs in: its id and start time (ms since the Unix epoch), when the node
    /// says; nodes of one `crest local` share it, and their figures are that process's.
    pub process: Option<(u64, u64)>,
    /// Seconds over the whole run.
    pub seconds: f64,
    /// Microseconds per message pushed, over the whole run.
    pub us_per_message: f64,
    /// Fill then drain: microseconds per message pushed, while the producers pushed.
    pub fill_us_per_message: Option<f64>,
    /// Fill then drain: microseconds per message popped, while the consumers drained.
    pub drain_us_per_message: Option<f64>,
}

impl NodeCpu {
    /// The table's lines: one per process, naming the nodes that share it.
    pub(crate) fn lines(nodes: &[NodeCpu]) -> String {
        let mut out = String::new();
        for (at, node) in nodes.iter().enumerate() {
            let shares = |other: &NodeCpu| node.process.is_some() && other.process == node.process;
            if nodes[..at].iter().any(shares) {
                continue;
            }
            let names: Vec<&str> = nodes[at..]
                .iter()
                .filter(|other| shares(other))
                .map(|other| other.name.as_str())
                .collect();
            if names.len() > 1 {
                out.push_str(&node.line(&format!("{} (one process)", names.join(", "))));
            } else {
                out.push_str(&node.line(&node.name));
            }
        }
        out
    }

    /// The table's line for the node (or the nodes of its process), named `name`.
    fn line(&self, name: &str) -> String {
        let ceiling = |us: f64| {
            if us > 0.0 {
                format!(" (one core: {:.0} k msgs/s)", 1e3 / us)
            } else {
                String::new()
            }
        };
        let mut line = format!(
            "  CPU of {name}: {:.2} s = {:.2} us/msg",
            self.seconds, self.us_per_message
        );
        if let (Some(fill), Some(drain)) = (self.fill_us_per_message, self.drain_us_per_message) {
            line.push_str(&format!(
                "; fill {fill:.2} us/msg{}, drain {drain:.2} us/msg{}",
                ceiling(fill),
                ceiling(drain)
            ));
        }
        line.push('\n');
        line
    }
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
        let held = match self.pushes_held {
            Some((held, refused)) if held + refused > 0 => {
                format!("  held {held} refused {refused}")
            }
            _ => String::new(),
        };
        format!(
            "pushes {:.0}/s  pops {:.0}/s  push-ack p99 {} us  pop p99 {} us  CPU {:.2} s  missing {}  duplicates {}{held}\n",
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
    pub(super) fn line(&self) -> String {
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
pub(super) fn process_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Process CPU readings at the run's marks.
#[derive(Clone, Copy)]
pub(super) struct CpuMarks {
    pub(super) start: Duration,
    pub(super) producers_done: Duration,
    pub(super) end: Duration,
}

impl CpuMarks {
    pub(super) fn usage(&self, phase: Phase, pushed: u64, popped: u64) -> CpuUse {
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

pub(super) fn report(
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
        totals.pop_errors += result.pop_errors;
        totals.ack_errors += result.ack_errors;
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
    let seen = shared.seen.lock().unwrap_or_else(PoisonError::into_inner);
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
        fairness_keys: config.fairness_keys,
        pop_batch: config.pop_batch,
        ack: config.ack,
        acks_through_root: config.acks_through_root,
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
        pop_errors: totals.pop_errors,
        ack_errors: totals.ack_errors,
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
        pushes_held: None,
        log_sync_us: None,
        log_sync_by_leaf_us: BTreeMap::new(),
        cpu: cpu.usage(config.phase, pushed, seen.distinct),
        nodes_cpu: Vec::new(),
        noise: None,
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
            match (self.ack, self.acks_through_root) {
                (false, _) => "off",
                (true, false) => "on (at the leaves)",
                (true, true) => "on (through the root)",
            },
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
            "  errors: push {}  pop {}  ack {}  missing {}  duplicates {}  ack rejected {}  foreign {}  empty pops {}\n",
            self.push_errors,
            self.pop_errors,
            self.ack_errors,
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
        if let Some((held, refused)) = self.pushes_held
            && held + refused > 0
        {
            out.push_str(&format!(
                "  push batches held for an allowance: {held}, refused for now: {refused}\n"
            ));
        }
        out.push_str(&self.cpu.line());
        out.push_str(&NodeCpu::lines(&self.nodes_cpu));
        out
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
