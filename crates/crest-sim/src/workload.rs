//! Workload files: links, disks, producers and consumers of a simulation.
//!
//! ```toml
//! duration_ms = 2000          # producers run this long (virtual time)
//! warmup_ms = 50              # handshakes settle before the load starts
//! drain_ms = 2000             # consumers go on this long after producers stop
//! sample_ms = 100             # time-series interval
//! topic = "jobs"
//!
//! [link]                      # every connection of the tree and of the clients
//! latency_us = 1000
//! jitter_us = 200             # uniform in latency ± jitter, order kept per connection
//! loss = 0.01                 # a message's packet is lost with this probability: QUIC
//! retransmit_us = 3000        #   resends it this much later (default 3 × latency), and
//!                             #   everything behind it on the stream waits (head of line)
//!
//! [disk]
//! fsync_us = 500              # a leaf's append is durable this long after it is issued
//!
//! [[producer]]                # one per producer; `leaf` pins it to one leaf (else all)
//! rate = 25000                # messages per second
//! batch_max = 64              # messages per push at most
//! priorities = "skewed"       # skewed | uniform[:N] | fixed:P
//! payload_bytes = 100
//! start_ms = 0                # relative to the end of the warm-up
//! # stop_ms = 1000
//!
//! [[fault]]                   # optional, scripted
//! node = "leaf-3"
//! at_ms = 400                 # crash (unsynced writes lost), then restart and recover
//! restart_after_ms = 100
//!
//! [[partition]]               # optional, scripted: these nodes are cut off from the rest
//! nodes = ["agg-2"]           #   (clients are outside every partition)
//! at_ms = 300
//! heal_after_ms = 200         # under the nodes' link_idle_timeout_ms, traffic waits and flows at
//!                             # the heal; at or over it, connections across the cut close
//!                             # at the idle timeout and reconnect at the heal
//!
//! [random_faults]             # optional, drawn from the seed within the load's duration
//! crashes = 2                 # node crashes (any node), each down for 10..=down_ms_max
//! partitions = 2              # one node cut off, for 10..=down_ms_max
//! down_ms_max = 300
//!
//! [[consumer]]
//! max = 16                    # messages per pop
//! wait_ms = 100               # long-poll
//! rate = 0                    # pops per second; 0 pops again as soon as answered
//! # topic = "orders/eu"       # a producer's or consumer's own topic (default `topic`)
//!
//! [topics.jobs]               # optional: a topic's settings, set during the warm-up as
//! scheduling = "weighted"     #   `crest topic set` does (any field of a topology's
//! weights = { 0 = 8, 4 = 0.5 } #  `[settings.topics.NAME]`)
//!
//! [[limits]]                  # optional: quotas and rates set during the warm-up
//! scope = "noisy/"            # a namespace (`NS/`) or a topic
//! push_rate = 1000            # also messages_max, bytes_max, message_bytes_max,
//! push_burst = 100            #   push_bytes_rate, push_bytes_burst, pop_rate, pop_burst,
//!                             #   in_flight_max, topics_max (burst: 1 s's worth)
//! ```

use serde::Deserialize;

/// Link model: what a QUIC stream between two nodes looks like to them.
///
/// Links carry crest's frames on long-lived QUIC streams, so packet-level duplication and
/// reordering never reach a node: QUIC delivers each stream's bytes once and in order. What
/// does reach it is delay — latency, jitter, and a lost packet's retransmission, which holds
/// back everything behind it on the stream — and connections that end (crashes, partitions
/// longer than the idle timeout), after which both sides resynchronise on a new session.
/// Reordering *across* connections (an offer from one child overtaking another's) comes from
/// jitter.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LinkModel {
    /// One-way latency, µs.
    pub latency_us: u64,
    /// Uniform jitter around it, µs.
    pub jitter_us: u64,
    /// Probability that a message's packet is lost (and retransmitted), 0 to 0.5.
    pub loss: f64,
    /// Delay a loss adds, µs (0: three times the latency, about QUIC's probe timeout).
    pub retransmit_us: u64,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel {
            latency_us: 1_000,
            jitter_us: 0,
            loss: 0.0,
            retransmit_us: 0,
        }
    }
}

/// A scripted partition: `nodes` are cut off from every other node and client.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PartitionSpec {
    /// The nodes on one side of the cut.
    pub nodes: Vec<String>,
    /// When the cut starts, ms after the warm-up.
    pub at_ms: u64,
    /// How long it lasts.
    #[serde(default = "restart_after_ms")]
    pub heal_after_ms: u64,
}

/// Faults drawn from the seed (a swarm: every seed a different mix of times and nodes).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RandomFaults {
    /// Node crashes (any node, restarted after 10 to `down_ms_max` ms).
    pub crashes: u32,
    /// Partitions cutting one node off, for 10 to `down_ms_max` ms.
    pub partitions: u32,
    /// Longest a drawn fault lasts, ms.
    pub down_ms_max: u64,
}

/// Replicated leaves: each leaf of the tree is a group of `replicas` (1: no group). A group
/// is modelled by what its Raft guarantees (see `crest-sim/src/group.rs`): the leader's
/// writes are durable once a majority holds them, and a new leader is the most up-to-date
/// replica of a majority that is up.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationModel {
    /// Replicas per leaf (1 to 7).
    pub replicas: u32,
    /// Extra one-way delay to the group's last replica, µs (a slow follower).
    pub slow_follower_us: u64,
    /// Share of replica restarts whose log reads back corrupt: the replica throws it away
    /// and rejoins empty, taking every entry from the leader again (in `[0, 1]`). At most
    /// ⌊(n − 1) / 2⌋ replicas of a group of n are without their log at once, the most a
    /// majority quorum survives.
    pub corrupt_reads: f64,
    /// A replica back with an empty log votes at once, as in Raft without crest's rule that
    /// it first catch up (`crest-replica`'s `rejoin.rs`): only to show what the rule is worth.
    pub votes_when_empty: bool,
}

impl Default for ReplicationModel {
    fn default() -> Self {
        ReplicationModel {
            replicas: 1,
            slow_follower_us: 0,
            corrupt_reads: 0.0,
            votes_when_empty: false,
        }
    }
}

/// Disk model.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DiskModel {
    /// Time from an append to its durability, µs.
    pub fsync_us: u64,
    /// Share of appends (and checkpoints) that fail, as a full or failing disk does: nothing
    /// of a failed one is stored, and the leaf is told of those it waits for (in `[0, 0.5]`).
    pub append_failures: f64,
    /// A crash tears the write under way: of the appends not yet durable, the records before
    /// a point drawn at random survive (as a torn tail of the log leaves whole records before
    /// the tear), instead of none of them.
    pub torn_writes: bool,
}

impl Default for DiskModel {
    fn default() -> Self {
        DiskModel {
            fsync_us: 500,
            append_failures: 0.0,
            torn_writes: false,
        }
    }
}

/// How priorities are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorityMix {
    /// 0–9: 10 % in 0–2, 20 % in 3–6, 70 % in 7–9 (the least urgent).
    Skewed,
    /// Uniform over `0..n`.
    Uniform(u32),
    /// Always this one.
    Fixed(u32),
}

impl<'de> Deserialize<'de> for PriorityMix {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for PriorityMix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("priorities {text:?}: expected skewed, uniform[:N] or fixed:P");
        match text.split_once(':') {
            None if text == "skewed" => Ok(PriorityMix::Skewed),
            None if text == "uniform" => Ok(PriorityMix::Uniform(10)),
            Some(("uniform", n)) => match n.parse() {
                Ok(n) if n > 0 => Ok(PriorityMix::Uniform(n)),
                _ => Err(bad()),
            },
            Some(("fixed", p)) => p.parse().map(PriorityMix::Fixed).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl PriorityMix {
    pub(crate) fn draw(self, rng: &mut crate::Rng) -> u32 {
        match self {
            PriorityMix::Fixed(p) => p,
            PriorityMix::Uniform(n) => rng.below(u64::from(n)) as u32,
            PriorityMix::Skewed => match rng.below(100) {
                0..10 => rng.below(3) as u32,
                10..30 => 3 + rng.below(4) as u32,
                _ => 7 + rng.below(3) as u32,
            },
        }
    }
}

fn skewed() -> PriorityMix {
    PriorityMix::Skewed
}

fn batch_max() -> u32 {
    64
}

fn payload_bytes() -> usize {
    100
}

/// One producer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProducerSpec {
    /// The leaf it pushes to; every leaf in turn if absent.
    #[serde(default)]
    pub leaf: Option<String>,
    /// Messages per second.
    pub rate: f64,
    /// Messages per push at most.
    #[serde(default = "batch_max")]
    pub batch_max: u32,
    /// Priority distribution.
    #[serde(default = "skewed")]
    pub priorities: PriorityMix,
    /// Payload size.
    #[serde(default = "payload_bytes")]
    pub payload_bytes: usize,
    /// When it starts, ms after the warm-up.
    #[serde(default)]
    pub start_ms: u64,
    /// When it stops, ms after the warm-up (default: the end of the load).
    #[serde(default)]
    pub stop_ms: Option<u64>,
    /// The topic it pushes to (default: the workload's).
    #[serde(default)]
    pub topic: Option<String>,
    /// The fairness key of its messages (default: none).
    #[serde(default)]
    pub fairness_key: Option<String>,
}

/// Quotas and rates set on a scope (a topic, or a namespace's `NS/`) during the warm-up, as
/// `crest policy set` / `crest topic set` do. A rate's burst defaults to one second's worth.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// The scope.
    pub scope: String,
    /// Most messages held.
    #[serde(default)]
    pub messages_max: Option<u64>,
    /// Most payload bytes held.
    #[serde(default)]
    pub bytes_max: Option<u64>,
    /// Largest payload.
    #[serde(default)]
    pub message_bytes_max: Option<u64>,
    /// Messages pushed per second.
    #[serde(default)]
    pub push_rate: Option<u64>,
    /// Its burst.
    #[serde(default)]
    pub push_burst: Option<u64>,
    /// Payload bytes pushed per second.
    #[serde(default)]
    pub push_bytes_rate: Option<u64>,
    /// Its burst.
    #[serde(default)]
    pub push_bytes_burst: Option<u64>,
    /// Messages popped per second.
    #[serde(default)]
    pub pop_rate: Option<u64>,
    /// Its burst.
    #[serde(default)]
    pub pop_burst: Option<u64>,
    /// Most messages in flight.
    #[serde(default)]
    pub in_flight_max: Option<u64>,
    /// Most topics (a namespace's).
    #[serde(default)]
    pub topics_max: Option<u64>,
}

impl LimitSpec {
    /// The limits, as a topic configuration carries them.
    pub fn limits(&self) -> crest_core::quota::Limits {
        let rate = crest_core::quota::Rate::of;
        crest_core::quota::Limits {
            messages_max: self.messages_max,
            bytes_max: self.bytes_max,
            message_bytes_max: self.message_bytes_max,
            push_rate: rate(self.push_rate, self.push_burst),
            push_bytes_rate: rate(self.push_bytes_rate, self.push_bytes_burst),
            pop_rate: rate(self.pop_rate, self.pop_burst),
            in_flight_max: self.in_flight_max,
            topics_max: self.topics_max,
        }
    }
}

fn pop_max() -> u32 {
    16
}

fn wait_ms() -> u64 {
    100
}

/// One consumer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSpec {
    /// Messages per pop at most.
    #[serde(default = "pop_max")]
    pub max: u32,
    /// Long-poll wait, ms.
    #[serde(default = "wait_ms")]
    pub wait_ms: u64,
    /// Pops per second; 0 pops again as soon as answered.
    #[serde(default)]
    pub rate: f64,
    /// The topic it pops from (default: the workload's).
    #[serde(default)]
    pub topic: Option<String>,
}

fn duration_ms() -> u64 {
    1_000
}
fn warmup_ms() -> u64 {
    50
}
fn drain_ms() -> u64 {
    2_000
}
fn sample_ms() -> u64 {
    100
}
fn topic() -> String {
    "jobs".into()
}

/// A workload (see the module doc).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// How long producers run, virtual ms.
    #[serde(default = "duration_ms")]
    pub duration_ms: u64,
    /// Settling time before the load.
    #[serde(default = "warmup_ms")]
    pub warmup_ms: u64,
    /// How long consumers go on after producers stop.
    #[serde(default = "drain_ms")]
    pub drain_ms: u64,
    /// Time-series interval.
    #[serde(default = "sample_ms")]
    pub sample_ms: u64,
    /// The topic.
    #[serde(default = "topic")]
    pub topic: String,
    /// Links.
    #[serde(default)]
    pub link: LinkModel,
    /// Disks.
    #[serde(default)]
    pub disk: DiskModel,
    /// Replicated leaves.
    #[serde(default)]
    pub replication: ReplicationModel,
    /// Producers.
    #[serde(default, rename = "producer")]
    pub producers: Vec<ProducerSpec>,
    /// Consumers.
    #[serde(default, rename = "consumer")]
    pub consumers: Vec<ConsumerSpec>,
    /// Scripted faults.
    #[serde(default, rename = "fault")]
    pub faults: Vec<FaultSpec>,
    /// Scripted partitions.
    #[serde(default, rename = "partition")]
    pub partitions: Vec<PartitionSpec>,
    /// Faults drawn from the seed.
    #[serde(default)]
    pub random_faults: RandomFaults,
    /// Quotas and rates set during the warm-up.
    #[serde(default)]
    pub limits: Vec<LimitSpec>,
    /// Topic settings set during the warm-up (`[topics.NAME]`), as `crest topic set` does.
    #[serde(default)]
    pub topics: std::collections::BTreeMap<String, crest_core::config::TopicSettings>,
}

/// A scripted fault: a node crashes (its connections drop; a leaf loses what its disk had not
/// made durable) and restarts after a while (a leaf recovers from its log; an aggregator or
/// the root starts empty, as its state is soft).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// The node.
    pub node: String,
    /// When it crashes, ms after the warm-up.
    pub at_ms: u64,
    /// How long it stays down.
    #[serde(default = "restart_after_ms")]
    pub restart_after_ms: u64,
    /// Of a replicated leaf, which replica crashes (from 0; the first leads at the start);
    /// drawn at random if not given.
    #[serde(default)]
    pub replica: Option<u32>,
    /// The replica's log reads back corrupt when it restarts (it rejoins empty).
    #[serde(default)]
    pub corrupt: bool,
}

fn restart_after_ms() -> u64 {
    100
}

impl Workload {
    /// Parses a workload file.
    ///
    /// # Errors
    /// The TOML error, or the first invalid value.
    pub fn parse(text: &str) -> Result<Workload, String> {
        let workload: Workload = toml::from_str(text).map_err(|e| e.to_string())?;
        workload.validate()?;
        Ok(workload)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.producers.is_empty() || self.consumers.is_empty() {
            return Err("needs at least one [[producer]] and one [[consumer]]".into());
        }
        if self.sample_ms == 0 || self.duration_ms == 0 {
            return Err("duration_ms and sample_ms must be at least 1".into());
        }
        if self.duration_ms > 3_600_000 {
            return Err("duration_ms is at most one hour of virtual time".into());
        }
        let settings = crest_core::config::Settings::default();
        for (topic, overrides) in &self.topics {
            settings
                .check_topic(topic)
                .and_then(|()| overrides.check(&settings, topic))
                .map_err(|e| format!("[topics.{topic}]: {e}"))?;
        }
        for (i, p) in self.producers.iter().enumerate() {
            if !(p.rate > 0.0 && p.rate <= 10_000_000.0) || p.batch_max == 0 {
                return Err(format!(
                    "producer {i}: rate must be in (0, 1e7] and batch_max at least 1"
                ));
            }
        }
        if !(0.0..=0.5).contains(&self.link.loss) {
            return Err("link.loss must be in [0, 0.5]".into());
        }
        if !(0.0..=0.5).contains(&self.disk.append_failures) {
            return Err("disk.append_failures must be in [0, 0.5]".into());
        }
        let replication = &self.replication;
        if !(1..=7).contains(&replication.replicas) {
            return Err("replication.replicas must be in 1..=7".into());
        }
        if !(0.0..=1.0).contains(&replication.corrupt_reads) {
            return Err("replication.corrupt_reads must be in [0, 1]".into());
        }
        for fault in &self.faults {
            if fault.replica.is_some_and(|r| r >= replication.replicas) {
                return Err(format!(
                    "fault on {:?}: replica {} of {} (replicas count from 0)",
                    fault.node,
                    fault.replica.unwrap_or_default(),
                    replication.replicas
                ));
            }
        }
        for (i, partition) in self.partitions.iter().enumerate() {
            if partition.nodes.is_empty() {
                return Err(format!("partition {i}: names no nodes"));
            }
        }
        let random = &self.random_faults;
        if random.crashes + random.partitions > 1000 {
            return Err("random_faults: at most 1000 faults".into());
        }
        if (random.crashes + random.partitions > 0) && random.down_ms_max < 10 {
            return Err("random_faults: down_ms_max must be at least 10".into());
        }
        let settings = crest_core::config::Settings::default();
        let topics = self.producers.iter().map(|p| &p.topic);
        for topic in topics
            .chain(self.consumers.iter().map(|c| &c.topic))
            .flatten()
        {
            settings
                .check_topic(topic)
                .map_err(|e| format!("topic {topic:?}: {e}"))?;
        }
        if self.limits.len() > 64 {
            return Err("at most 64 [[limits]]".into());
        }
        for limit in &self.limits {
            let scope = limit.scope.strip_suffix('/').unwrap_or(&limit.scope);
            settings
                .check_topic(scope)
                .map_err(|e| format!("limits scope {:?}: {e}", limit.scope))?;
            if limit.limits().is_empty() {
                return Err(format!("limits scope {:?}: sets no limit", limit.scope));
            }
        }
        for (i, c) in self.consumers.iter().enumerate() {
            if c.max == 0 || !(c.rate >= 0.0 && c.rate <= 1_000_000.0) {
                return Err(format!(
                    "consumer {i}: max must be at least 1 and rate in [0, 1e6]"
                ));
            }
        }
        Ok(())
    }
}
