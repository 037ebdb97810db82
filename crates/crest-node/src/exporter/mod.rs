//! `/metrics`: what a node measures, encoded by the `prometheus-client` crate at each scrape.
//!
//! The engine keeps its counters, gauges and HDR histograms as it always did (recording costs
//! nothing more); a scrape takes a snapshot of them ([`Scrape`]) and a [`Collector`] encodes
//! it. Names follow Prometheus's conventions: base units (`_seconds`, `_bytes`), counters
//! ending in `_total`, histograms cumulative since the node started.
//!
//! Each series comes from one node, so that a Prometheus scraping every node counts nothing
//! twice: every node serves its own counters, gauges, histograms, QUIC links, log disk and
//! process; the root alone serves the tree-wide series (each node's connection, topics,
//! namespaces, quotas), which it knows from the leaves' reports. The answer is OpenMetrics
//! when the scraper asks for it (Prometheus does), else the classic text format 0.0.4 (what
//! `curl` and `promtool check metrics` read).

use crate::actor::Links;
use crate::replica::ReplicaStatus;
use crest_core::metrics::{Hist, LAG_BOUNDS_MS, LagSeries, Metric, Report};
use crest_core::quota::ScopeStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, LabelValueEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Write as _};
use std::path::Path;
use std::time::Duration;

/// The content type of each answer.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub(crate) const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of the latency histograms, seconds.
const SECONDS_BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];
/// Bucket bounds of the batch-size histograms, messages.
const MESSAGES_BOUNDS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// What one scrape shows, taken when it came.
#[derive(Debug, Default)]
pub(crate) struct Scrape {
    /// The node's name and role.
    pub(crate) node: String,
    pub(crate) role: String,
    /// Its subtree report (`None`: a replica that does not serve its leaf).
    pub(crate) report: Option<Report>,
    /// Its QUIC links.
    pub(crate) links: Option<crate::actor::Links>,
    /// Where a replica stands in its group.
    pub(crate) replica: Option<ReplicaStatus>,
    /// Its log directory and file system (a leaf with a log).
    pub(crate) disk: Option<DiskUse>,
    /// The process it runs in.
    pub(crate) process: ProcessUse,
    /// The wall clock, µs since the Unix epoch (ages are measured from it).
    pub(crate) now_micros: u64,
}

/// A leaf's log on its disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DiskUse {
    /// Bytes of the files in its log directory.
    pub(crate) used_bytes: u64,
    /// Bytes free on the file system that holds it (for an unprivileged process).
    pub(crate) free_bytes: u64,
    /// Size of that file system.
    pub(crate) size_bytes: u64,
}

impl DiskUse {
    /// Reads `dir`'s files (and its subdirectories', a replica's log among them) and its file
    /// system (`None` if it cannot be read).
    pub(crate) fn read(dir: &Path) -> Option<DiskUse> {
        let fs = rustix::fs::statvfs(dir).ok()?;
        Some(DiskUse {
            used_bytes: files_bytes(dir, DISK_DEPTH_MAX),
            free_bytes: fs.f_bavail.saturating_mul(fs.f_frsize),
            size_bytes: fs.f_blocks.saturating_mul(fs.f_frsize),
        })
    }
}

/// How deep under a leaf's directory its files are counted (a replica keeps its Raft log one
/// level down).
const DISK_DEPTH_MAX: usize = 3;

/// Bytes of the files under `dir`, `depth` levels of directories down.
fn files_bytes(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut bytes = 0_u64;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() {
            bytes = bytes.saturating_add(meta.len());
        } else if meta.is_dir() && depth > 0 {
            bytes = bytes.saturating_add(files_bytes(&entry.path(), depth - 1));
        }
    }
    bytes
}

/// What the process this node runs in uses: its processor time (user and system, every thread,
/// those ended included, from the process's CPU clock) and its resident memory (from Linux's
/// `/proc/self/status`; `None` where that is not available), and which process it is (its id
/// and start time: in `crest local` every node shares one process and reports the same
/// figures, which a reader tells by these).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessUse {
    pub(crate) cpu_seconds: Option<f64>,
    pub(crate) resident_bytes: Option<u64>,
    pub(crate) id: u32,
    /// Seconds since the Unix epoch.
    pub(crate) start_seconds: Option<f64>,
}

impl ProcessUse {
    pub(crate) fn read() -> ProcessUse {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        ProcessUse {
            cpu_seconds: Some(cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9),
            resident_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| resident_bytes(&status)),
            id: std::process::id(),
            start_seconds: *START_SECONDS.get_or_init(start_seconds),
        }
    }
}

/// The process's start time, read once.
static START_SECONDS: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();

/// When this process started, in seconds since the Unix epoch: the boot time (`btime` in
/// `/proc/stat`) plus the process's start in clock ticks after boot (`/proc/self/stat`).
fn start_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    started_at(&stat, &boot, rustix::param::clock_ticks_per_second())
}

/// `started_at` of a `/proc/PID/stat` and a `/proc/stat` text, with `ticks` clock ticks a
/// second.
pub(crate) fn started_at(stat: &str, boot: &str, ticks: u64) -> Option<f64> {
    // Fields after the command (which may hold spaces, within parentheses): the start time is
    // field 22 of the line, the 20th after the command.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks_after_boot: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let btime: u64 = boot
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime as f64 + ticks_after_boot as f64 / ticks.max(1) as f64)
}

/// `VmRSS` in a `/proc/PID/status` text, in bytes.
pub(crate) fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Encodes `scrape`: OpenMetrics when `openmetrics`, else the classic text format.
pub(crate) fn render(scrape: Scrape, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    // Writing to a String cannot fail; a collector's error would leave a partial answer.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    if openmetrics { text } else { classic(&text) }
}

/// The classic text format (0.0.4) of an OpenMetrics text: a counter family is named with its
/// `_total` (as its samples are), and the `UNIT` and `EOF` lines go.
pub(crate) fn classic(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + counters.len() * 16);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|head| Some((head, line.strip_prefix(head)?)));
        match meta {
            Some((head, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let total = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                let _ = writeln!(out, "{head}{name}{total} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A label value, escaped as the text formats require (`prometheus-client` writes values as
/// given, and a child's report or a topic name is not trusted to be plain).
#[derive(Clone, Debug)]
struct Value(String);

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

type Labels = Vec<(&'static str, Value)>;

/// A sample's value: counts are written as integers, times and ratios as decimals.
#[derive(Clone, Copy, Debug)]
enum Number {
    Count(u64),
    Real(f64),
}

impl From<u64> for Number {
    fn from(value: u64) -> Number {
        Number::Count(value)
    }
}

impl From<f64> for Number {
    fn from(value: f64) -> Number {
        Number::Real(value)
    }
}

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs
        .into_iter()
        .map(|(key, value)| (key, Value(value.to_string())))
        .collect()
}

/// The encoder of one scrape.
struct Families<'a, 'e> {
    encoder: &'a mut DescriptorEncoder<'e>,
}

impl Families<'_, '_> {
    fn family(
        &mut self,
        kind: MetricType,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, impl Into<Number>)>,
    ) -> fmt::Result {
        let mut metric = self.encoder.encode_descriptor(name, help, None, kind)?;
        for (labels, value) in samples {
            let value = value.into();
            if labels.is_empty() {
                // `encode_family` would write an empty `{}`.
                write_value(&mut metric, &kind, value)?;
            } else {
                write_value(&mut metric.encode_family(&labels)?, &kind, value)?;
            }
        }
        Ok(())
    }

    fn gauges(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, impl Into<Number>)>,
    ) -> fmt::Result {
        self.family(MetricType::Gauge, name, help, samples)
    }

    fn counters(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, impl Into<Number>)>,
    ) -> fmt::Result {
        self.family(MetricType::Counter, name, help, samples)
    }

    fn histograms(
        &mut self,
        name: &str,
        help: &str,
        unit: &Unit,
        samples: &[(Labels, HistogramSample)],
    ) -> fmt::Result {
        let mut metric =
            self.encoder
                .encode_descriptor(name, help, Some(unit), MetricType::Histogram)?;
        for (labels, h) in samples {
            metric
                .encode_family(labels)?
                .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
        }
        Ok(())
    }
}

fn write_value(sample: &mut MetricEncoder, kind: &MetricType, value: Number) -> fmt::Result {
    match (kind, value) {
        (MetricType::Counter, Number::Count(v)) => {
            sample.encode_counter::<NoLabelSet, u64, u64>(&v, None)
        }
        (MetricType::Counter, Number::Real(v)) => {
            sample.encode_counter::<NoLabelSet, f64, f64>(&v, None)
        }
        (_, Number::Count(v)) => sample.encode_gauge(&v),
        (_, Number::Real(v)) => sample.encode_gauge(&v),
    }
}

/// A histogram as the encoder takes it: per-bucket counts (the last one `+Inf`), sum, count.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HistogramSample {
    pub(crate) sum: f64,
    pub(crate) count: u64,
    pub(crate) buckets: Vec<(f64, u64)>,
}

impl HistogramSample {
    /// `hist`'s values scaled by `scale` into buckets with upper bounds `bounds` (in the
    /// scaled unit, ascending).
    pub(crate) fn of(hist: &Hist, bounds: &[f64], scale: f64) -> HistogramSample {
        let mut buckets = Vec::with_capacity(bounds.len() + 1);
        let mut below = 0_u64;
        let mut values = hist.0.iter().peekable();
        for bound in bounds {
            let mut in_bucket = 0_u64;
            while let Some((value, count)) =
                values.next_if(|(value, _)| *value as f64 * scale <= *bound)
            {
                let _ = value;
                in_bucket = in_bucket.saturating_add(*count);
            }
            below = below.saturating_add(in_bucket);
            buckets.push((*bound, in_bucket));
        }
        let count = hist.count();
        buckets.push((f64::MAX, count.saturating_sub(below)));
        HistogramSample {
            sum: hist.sum() as f64 * scale,
            count,
            buckets,
        }
    }
}

impl HistogramSample {
    /// A topic's and priority's consumer lag, in seconds.
    fn of_lag(series: &LagSeries) -> HistogramSample {
        let mut buckets: Vec<(f64, u64)> = LAG_BOUNDS_MS
            .iter()
            .zip(&series.buckets)
            .map(|(bound, count)| (*bound as f64 / 1e3, *count))
            .collect();
        buckets.push((f64::MAX, series.buckets[LAG_BOUNDS_MS.len()]));
        HistogramSample {
            sum: series.sum_micros as f64 / 1e6,
            count: series.count,
            buckets,
        }
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut f = Families {
            encoder: &mut encoder,
        };
        let own = labels([("node", &self.node), ("role", &self.role)]);
        if !self.node.is_empty() {
            let protocol = crest_core::wire::PROTOCOL_VERSION.to_string();
            let mut build = own.clone();
            build.push(("version", Value(env!("CARGO_PKG_VERSION").to_string())));
            build.push(("protocol", Value(protocol)));
            f.gauges(
                "crest_build_info",
                "1, labelled with the node's crest version and wire protocol",
                [(build, 1_u64)],
            )?;
        }
        if let Some(report) = &self.report {
            self.encode_own(&mut f, report, &own)?;
            if self.role == "root" {
                self.encode_tree(&mut f, report)?;
            }
        }
        if let Some(links) = &self.links {
            encode_links(&mut f, &self.node, links)?;
        }
        if let Some(disk) = self.disk {
            for (name, help, value) in [
                (
                    "crest_log_disk_used_bytes",
                    "bytes of the files in the leaf's log directory",
                    disk.used_bytes,
                ),
                (
                    "crest_log_disk_free_bytes",
                    "bytes free on the file system of the leaf's log",
                    disk.free_bytes,
                ),
                (
                    "crest_log_disk_size_bytes",
                    "size of the file system of the leaf's log",
                    disk.size_bytes,
                ),
            ] {
                f.gauges(name, help, [(own.clone(), value)])?;
            }
        }
        if let Some(status) = &self.replica {
            encode_replica(&mut f, status)?;
        }
        if let Some(seconds) = self.process.cpu_seconds {
            let help = "user and system processor time of the process";
            f.counters("process_cpu_seconds", help, [(Labels::new(), seconds)])?;
        }
        let id = "the id of the process the node runs in (nodes of one `crest local` share it)";
        f.gauges(
            "crest_process_id",
            id,
            [(Labels::new(), u64::from(self.process.id))],
        )?;
        if let Some(start) = self.process.start_seconds {
            let help = "when the process started, in seconds since the Unix epoch";
            f.gauges("process_start_time_seconds", help, [(Labels::new(), start)])?;
        }
        if let Some(bytes) = self.process.resident_bytes {
            let help = "resident memory of the process";
            f.gauges(
                "process_resident_memory_bytes",
                help,
                [(Labels::new(), bytes)],
            )?;
        }
        Ok(())
    }
}

impl Scrape {
    /// The node's own counters, gauges and histograms.
    fn encode_own(&self, f: &mut Families, report: &Report, own: &Labels) -> fmt::Result {
        let Some(node) = report.nodes.first() else {
            return Ok(());
        };
        for (name, value) in &node.counters {
            let help = format!("this node's {name} since it started");
            f.counters(
                &format!("crest_{}", metric_name(name)),
                &help,
                [(own.clone(), *value)],
            )?;
        }
        for (name, value) in &node.gauges {
            let help = format!("this node's {name} now");
            f.gauges(
                &format!("crest_{}", metric_name(name)),
                &help,
                [(own.clone(), *value)],
            )?;
        }
        if self.role != "root" {
            f.gauges(
                "crest_parent_connected",
                "1 while the node's session with its parent is up",
                [(own.clone(), u64::from(node.connected))],
            )?;
        }
        for metric in Metric::ALL {
            let Some(hist) = report.totals.get(&metric) else {
                continue;
            };
            let (unit, bounds, scale): (Unit, &[f64], f64) = if metric.unit() == "messages" {
                (Unit::Other("messages".into()), &MESSAGES_BOUNDS, 1.0)
            } else {
                (Unit::Seconds, &SECONDS_BOUNDS, 1e-6)
            };
            let sample = HistogramSample::of(hist, bounds, scale);
            f.histograms(
                &format!("crest_{}", metric.name()),
                metric.help(),
                &unit,
                &[(own.clone(), sample)],
            )?;
        }
        Ok(())
    }

    /// What the root knows of the whole tree.
    fn encode_tree(&self, f: &mut Families, report: &Report) -> fmt::Result {
        f.gauges(
            "crest_node_connected",
            "per node of the tree that reports: 1 while its session with its parent is up",
            report.nodes.iter().map(|n| {
                (
                    labels([("node", &n.name), ("role", &n.role)]),
                    u64::from(n.connected),
                )
            }),
        )?;
        f.gauges(
            "crest_leaves_absent",
            "leaves whose session ended and that the tree waits for (absent_child_wait_ms)",
            [(Labels::new(), report.absent.len() as u64)],
        )?;
        let topics = &report.stats.topics;
        f.gauges(
            "crest_topic_ready",
            "ready messages per topic and priority, over the tree",
            topics.iter().flat_map(|t| {
                t.ready.iter().map(|(priority, count)| {
                    let priority = priority.to_string();
                    (
                        labels([("topic", &t.topic), ("priority", &priority)]),
                        *count,
                    )
                })
            }),
        )?;
        type Field = fn(&crest_core::wire::TopicStats) -> u64;
        let fields: [(&str, &str, Field); 4] = [
            (
                "crest_topic_delayed",
                "messages waiting for their delivery time, per topic",
                |t| t.delayed,
            ),
            (
                "crest_topic_in_flight",
                "messages leased to consumers, per topic",
                |t| t.in_flight,
            ),
            (
                "crest_topic_dead",
                "messages in the topic's dead-letter queue",
                |t| t.dead,
            ),
            (
                "crest_topic_bytes",
                "payload bytes of the topic's messages in every state",
                |t| t.bytes,
            ),
        ];
        for (name, help, field) in fields {
            f.gauges(
                name,
                help,
                topics
                    .iter()
                    .map(|t| (labels([("topic", &t.topic)]), field(t))),
            )?;
        }
        f.gauges(
            "crest_topic_oldest_age_seconds",
            "age of the topic's oldest message not dead-lettered",
            topics.iter().filter_map(|t| {
                let oldest = t.oldest_enqueued_at?;
                let age = Duration::from_micros(self.now_micros.saturating_sub(oldest.0));
                Some((labels([("topic", &t.topic)]), age.as_secs_f64()))
            }),
        )?;
        f.gauges(
            "crest_topic_oldest_ready_age_seconds",
            "time since the longest-waiting ready message of the topic and priority became ready",
            topics.iter().flat_map(|t| {
                t.oldest_ready.iter().map(|(priority, ready_at)| {
                    let priority = priority.to_string();
                    let age = Duration::from_micros(self.now_micros.saturating_sub(ready_at.0));
                    (
                        labels([("topic", &t.topic), ("priority", &priority)]),
                        age.as_secs_f64(),
                    )
                })
            }),
        )?;
        // Each namespace's messages and payload bytes, over the topics the report carries.
        let mut namespaces: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for topic in topics {
            let sum = namespaces
                .entry(crest_core::access::namespace(&topic.topic))
                .or_default();
            sum.0 = sum.0.saturating_add(topic.messages());
            sum.1 = sum.1.saturating_add(topic.bytes);
        }
        f.gauges(
            "crest_namespace_messages",
            "messages of the namespace's topics in every state",
            namespaces
                .iter()
                .map(|(ns, (messages, _))| (labels([("namespace", ns)]), *messages)),
        )?;
        f.gauges(
            "crest_namespace_bytes",
            "payload bytes of the namespace's messages",
            namespaces
                .iter()
                .map(|(ns, (_, bytes))| (labels([("namespace", ns)]), *bytes)),
        )?;
        let lag: Vec<(Labels, HistogramSample)> = report
            .consumer_lag
            .iter()
            .map(|series| {
                let priority = series.priority.to_string();
                let labels = labels([("topic", &series.topic), ("priority", &priority)]);
                (labels, HistogramSample::of_lag(series))
            })
            .collect();
        f.histograms(
            "crest_consumer_lag",
            "from a message being ready to its delivery, per topic and priority (its count is \
             the deliveries)",
            &Unit::Seconds,
            &lag,
        )?;
        encode_limits(f, &report.stats.limits)?;
        let stats = &report.stats;
        for (name, help, value) in [
            (
                "crest_messages_expired",
                "messages dropped because their time to live passed, over the tree",
                stats.expired,
            ),
            (
                "crest_messages_dead_lettered",
                "messages moved to a dead-letter queue, over the tree",
                stats.dead_lettered,
            ),
            (
                "crest_pushes_deduplicated",
                "pushes dropped as duplicates, over the tree",
                stats.deduplicated,
            ),
        ] {
            f.counters(name, help, [(Labels::new(), value)])?;
        }
        Ok(())
    }
}

/// A metric name made of `[a-zA-Z0-9_]` only.
fn metric_name(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// This node's QUIC links, summed per kind. The sums cover the links open now, so they fall
/// when a link closes: gauges, not counters.
fn encode_links(f: &mut Families, node: &str, links: &Links) -> fmt::Result {
    type Field = fn(&crate::actor::LinkTotals) -> Number;
    let families: [(&str, &str, Field); 5] = [
        ("crest_quic_links", "open QUIC connections", |t| {
            t.links.into()
        }),
        (
            "crest_quic_sent_packets",
            "packets sent on the open connections",
            |t| t.sent_packets.into(),
        ),
        (
            "crest_quic_lost_packets",
            "packets lost on the open connections",
            |t| t.lost_packets.into(),
        ),
        (
            "crest_quic_congestion_events",
            "congestion window cuts on the open connections",
            |t| t.congestion_events.into(),
        ),
        (
            "crest_quic_rtt_max_seconds",
            "largest smoothed round trip among the open connections",
            |t| (t.rtt_max_us as f64 / 1e6).into(),
        ),
    ];
    for (name, help, field) in families {
        f.gauges(
            name,
            help,
            links
                .totals
                .iter()
                .map(|t| (labels([("node", node), ("kind", t.kind)]), field(t))),
        )?;
    }
    Ok(())
}

/// Where a replica stands in its group: on every replica its term, whether it serves the
/// leaf, its applied and last log index; on the leader each follower's lag.
fn encode_replica(f: &mut Families, status: &ReplicaStatus) -> fmt::Result {
    let own = labels([("node", &status.name), ("group", &status.group)]);
    let values: [(&str, &str, Option<u64>); 4] = [
        (
            "crest_replica_term",
            "the group's term as the replica knows it",
            Some(status.term),
        ),
        (
            "crest_replica_serving",
            "1 while the replica leads its group and serves the leaf",
            Some(u64::from(status.serving.is_some())),
        ),
        (
            "crest_replica_applied_index",
            "the last log entry it applied",
            status.applied,
        ),
        (
            "crest_replica_last_log_index",
            "the last entry of its Raft log",
            status.last_log,
        ),
    ];
    for (name, help, value) in values {
        f.gauges(name, help, value.map(|v| (own.clone(), v)))?;
    }
    let rounds: [(&str, &str, u64); 2] = [
        (
            "crest_replica_pre_votes",
            "pre-vote rounds the replica ran: it heard no leader for an election timeout",
            status.pre_votes,
        ),
        (
            "crest_replica_pre_votes_granted",
            "pre-vote rounds a majority granted, after which the replica stood for election",
            status.pre_votes_granted,
        ),
    ];
    for (name, help, value) in rounds {
        f.counters(name, help, Some((own.clone(), value)))?;
    }
    type Lag = fn(&crate::replica::FollowerLag) -> Option<u64>;
    let lags: [(&str, &str, Lag); 2] = [
        (
            "crest_replica_follower_lag_entries",
            "on the leader: entries of its log a follower does not hold yet",
            |l| Some(l.lag_entries),
        ),
        (
            "crest_replica_follower_lag_bytes",
            "on the leader: the bytes of those entries (within replica_lag_window_entries)",
            |l| l.lag_bytes,
        ),
    ];
    for (name, help, value) in lags {
        f.gauges(
            name,
            help,
            status.followers.iter().filter_map(|follower| {
                let mut with = own.clone();
                with.push(("follower", Value(follower.name.clone())));
                Some((with, value(follower)?))
            }),
        )?;
    }
    Ok(())
}

/// Each limited scope's limits, admissions and refusals: a namespace's (scope `NS/`) as
/// `crest_namespace_*{namespace="NS"}`, a topic's as `crest_topic_*{topic="T"}`, a
/// principal's (`@NAME`) as `crest_principal_*{principal="NAME"}`.
fn encode_limits(f: &mut Families, limits: &[ScopeStats]) -> fmt::Result {
    type Pick = fn(&ScopeStats) -> Option<u64>;
    // (name, counter, help, pick); a family none of the scopes has is left out.
    let families: [(&str, bool, &str, Pick); 13] = [
        ("messages_max", false, "its messages_max quota", |s| {
            s.limits.messages_max
        }),
        ("bytes_max", false, "its bytes_max quota", |s| {
            s.limits.bytes_max
        }),
        (
            "message_bytes_max",
            false,
            "its largest message payload",
            |s| s.limits.message_bytes_max,
        ),
        (
            "push_rate_max",
            false,
            "its push rate, messages per second",
            |s| s.limits.push_rate.map(|r| r.per_second),
        ),
        (
            "push_bytes_rate_max",
            false,
            "its push rate, payload bytes per second",
            |s| s.limits.push_bytes_rate.map(|r| r.per_second),
        ),
        (
            "pushed_messages",
            true,
            "messages it admitted since the root started",
            |s| Some(s.pushed.messages),
        ),
        (
            "pushed_bytes",
            true,
            "payload bytes it admitted since the root started",
            |s| Some(s.pushed.bytes),
        ),
        (
            "pop_rate_max",
            false,
            "its pop rate, messages per second",
            |s| s.limits.pop_rate.map(|r| r.per_second),
        ),
        // Pops are counted in scopes with a pop rate only (the root meters those alone).
        (
            "popped_messages",
            true,
            "messages delivered to its pops since the root started",
            |s| s.limits.pop_rate.map(|_| s.popped),
        ),
        ("in_flight_max", false, "its in-flight quota", |s| {
            s.limits.in_flight_max
        }),
        ("topics_max", false, "its topics quota", |s| {
            s.limits.topics_max
        }),
        ("topics", false, "its topics holding messages", |s| {
            s.limits.topics_max.map(|_| s.topics)
        }),
        ("in_flight", false, "its messages in flight", |s| {
            s.limits.in_flight_max.map(|_| s.in_flight)
        }),
    ];
    for kind in ["namespace", "topic", "principal"] {
        let scopes: Vec<(&str, &ScopeStats)> = limits
            .iter()
            .filter_map(|s| {
                let (of, name) = match (s.scope.strip_suffix('/'), s.scope.strip_prefix('@')) {
                    (Some(namespace), _) => ("namespace", namespace),
                    (_, Some(principal)) => ("principal", principal),
                    _ => ("topic", s.scope.as_str()),
                };
                (of == kind).then_some((name, s))
            })
            .collect();
        if scopes.is_empty() {
            continue;
        }
        for (name, counter, help, pick) in families {
            if scopes.iter().all(|(_, s)| pick(s).is_none()) {
                continue;
            }
            let samples = scopes
                .iter()
                .filter_map(|(scope, stats)| Some((labels([(kind, scope)]), pick(stats)?)));
            let family = format!("crest_{kind}_{name}");
            let help = format!("per limited {kind}: {help}");
            if counter {
                f.counters(&family, &help, samples)?;
            } else {
                f.gauges(&family, &help, samples)?;
            }
        }
        let reasons = scopes.iter().flat_map(|(scope, stats)| {
            let r = stats.refused;
            [
                ("over_quota", r.over_quota),
                ("rate_limited", r.rate_limited),
                ("awaiting_allowance", r.awaiting_allowance),
            ]
            .map(|(reason, value)| (labels([(kind, scope), ("reason", reason)]), value))
        });
        f.counters(
            &format!("crest_{kind}_refused_messages"),
            &format!(
                "per limited {kind}: messages of pushes refused since the root started, by reason"
            ),
            reasons,
        )?;
        let pop_limited =
            |s: &ScopeStats| s.limits.pop_rate.is_some() || s.limits.in_flight_max.is_some();
        if scopes.iter().any(|(_, s)| pop_limited(s)) {
            let pops = scopes
                .iter()
                .filter(|(_, s)| pop_limited(s))
                .flat_map(|(scope, stats)| {
                    let r = stats.refused;
                    [
                        ("rate_limited", r.pops_rate_limited),
                        ("over_in_flight", r.pops_over_in_flight),
                    ]
                    .map(|(reason, value)| (labels([(kind, scope), ("reason", reason)]), value))
                });
            f.counters(
                &format!("crest_{kind}_refused_pops"),
                &format!("per limited {kind}: pops refused since the root started, by reason"),
                pops,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
