//! Simulation mode: the production leaf, aggregator and root state machines of `crest-core`,
//! driven under virtual time by a discrete-event loop, with simulated links (latency and
//! jitter, in order per connection, as a QUIC stream) and simulated disks (`fsync` latency),
//! and a workload of producers and consumers.
//!
//! Same topology, workload and seed → the same report, byte for byte: events are ordered by
//! `(time, sequence number)`, every random draw comes from one seeded generator, and the state
//! machines take time only from the events.
//!
//! What it measures (definitions in ARCHITECTURE.md, "Measuring ordering"), from ground truth the simulator holds:
//! - **rank error** of each pop: at the moment the root answers it, how many messages acknowledged
//!   by their leaf and not yet delivered were strictly more urgent;
//! - **inversion time** of each message: from the first delivery of a strictly less urgent
//!   message while it was waiting (acknowledged, not delivered) to its own delivery (0 if never);
//! - **bubble-up latency** per level: from the leaf making the message available to its entry
//!   reaching an aggregator's window, and the root's;
//! - **pop latency** (consumer request to answer, pops that delivered) and **push-ack latency**;
//! - the largest window held above the leaves (memory bound), throughput, and a time series.
//!
//! Faults: scripted or seed-drawn node crashes (a leaf keeps the durable prefix of its log and
//! recovers from it; an aggregator or the root restarts empty) and partitions (traffic across
//! the cut waits, or the connections end at the idle timeout and reconnect at the heal), and
//! lost packets (QUIC retransmits: delay with head-of-line blocking; see [`LinkModel`]).
//!
//! Invariant checkers: one runs throughout — no message is ever granted a lease while another
//! lease of it is live (watched on every `Reserved` a leaf sends and every `Confirm` and
//! `Release` it receives) —, the others at the end ([`SimReport::violations`]): every
//! acknowledged message delivered once the faults stopped (liveness), duplicates only of
//! deliveries a crash left unconfirmed, memory above the leaves within its bound.

mod workload;

pub use crest_core::metrics::Percentiles;
pub use report::{PriorityReport, Sample, SimReport, TopicReport};
pub use run::run;
pub use workload::{
    ConsumerSpec, DiskModel, FaultSpec, LimitSpec, LinkModel, PartitionSpec, PriorityMix,
    ProducerSpec, RandomFaults, ReplicationModel, Workload,
};

mod clients;
mod faults;
mod group;
mod net;
mod report;
mod run;

use net::Cut;
use report::{TopicTally, Truth, histogram};

use crest_core::aggregator::{Aggregator, AggregatorConfig};
use crest_core::id::{MessageId, Receipt};
use crest_core::leaf::{Leaf, LeafConfig};
use crest_core::machine::{ConnId, Machine};
use crest_core::rng::SplitMix64 as Rng;
use crest_core::root::{Root, RootConfig};
use crest_core::time::Time;
use crest_core::wire::{Role, Wire};
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// What can stop a simulation before it runs.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The workload names a leaf the topology does not have, or is otherwise invalid.
    #[error("workload: {0}")]
    Workload(String),
    /// The topology has what the simulator does not model.
    #[error("topology: {0}")]
    Topology(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Node(usize),
    Producer(usize),
    Consumer(usize),
}

#[derive(Debug)]
enum Event {
    /// A message reaches the connection end `to`.
    Deliver { to: ConnId, msg: Wire },
    /// A node's timer (for one incarnation of it).
    Timer { node: usize, life: u32 },
    /// A leaf's storage operation is durable.
    Stored { node: usize, life: u32, token: u64 },
    /// A node's storage operation failed (the disk model's `append_failures`).
    StoreFailed { node: usize, life: u32, token: u64 },
    /// A node crashes.
    Crash {
        node: usize,
        restart_after: Duration,
        /// Of a replicated leaf: which replica (drawn if `None`), and whether its log reads
        /// back corrupt.
        replica: Option<usize>,
        corrupt: bool,
    },
    /// A crashed node starts again.
    Restart { node: usize },
    /// A replicated leaf's leader has been cut off by partition `index` for an election
    /// timeout: the followers elect another.
    Depose { node: usize, index: usize },
    /// A replicated leaf's new leader serves, after the election that chose it.
    Elected { node: usize, election: u64 },
    /// A replicated leaf's waiting entries may have reached a majority's disks.
    GroupCheck { node: usize },
    /// A replica of a replicated leaf restarts.
    ReplicaBack {
        node: usize,
        replica: usize,
        corrupt: bool,
    },
    /// A consumer acknowledges again receipts whose leaf was unreachable.
    Reack {
        consumer: usize,
        receipts: Vec<Receipt>,
        tries: u32,
    },
    /// A partition starts.
    PartitionStart { index: usize },
    /// A partition has lasted the idle timeout: connections across it end.
    PartitionTimeout { index: usize },
    /// A partition heals.
    PartitionHeal { index: usize },
    /// A producer may send.
    Produce { producer: usize },
    /// A consumer pops (when it paces itself).
    Consume { consumer: usize },
    /// Every node reports to its parent (subtree measurements), as the driver does each second.
    Report,
    /// A time-series sample.
    Sample,
    /// The workload's limits are set (through the first consumer's connection to the root).
    Configure,
}

/// How often a simulated consumer sends an ack that found its leaf unreachable.
const ACK_TRIES_MAX: u32 = 10;
/// How long it waits between two tries.
const ACK_RETRY_AFTER: Duration = Duration::from_millis(20);

/// What a node is made from.
#[derive(Clone)]
enum NodeConfig {
    Root(RootConfig),
    Aggregator(AggregatorConfig),
    Leaf(LeafConfig),
}

impl NodeConfig {
    fn build(&self) -> Box<dyn Machine> {
        match self {
            NodeConfig::Root(c) => Box::new(Root::new(c.clone())),
            NodeConfig::Aggregator(c) => Box::new(Aggregator::new(c.clone())),
            NodeConfig::Leaf(c) => Box::new(Leaf::new(c.clone())),
        }
    }
}

struct ProducerState {
    spec: ProducerSpec,
    /// The leaves it pushes to.
    targets: Vec<usize>,
    /// The producer's connection end to each of its leaves that is up.
    ends: Vec<ConnId>,
    next_end: usize,
    /// Messages owed by the rate but not yet sent (fractional).
    owed: f64,
    last_tick: Time,
    /// Push requests in flight: request → (sent at, on which end).
    in_flight: HashMap<u64, (Time, ConnId)>,
    /// The topic it pushes to.
    topic: String,
}

struct ConsumerState {
    spec: ConsumerSpec,
    end: ConnId,
    /// The pop in flight: (request, sent at).
    pending: Option<(u64, Time)>,
    /// Ack requests in flight: request → the receipts and how many times they were sent.
    acks: HashMap<u64, (Vec<Receipt>, u32)>,
    /// The topic it pops from.
    topic: String,
}

struct Sim {
    now: Time,
    start: Time,
    seq: u64,
    events: BTreeMap<(Time, u64), Event>,
    rng: Rng,
    link: LinkModel,
    disk: DiskModel,
    nodes: Vec<Box<dyn Machine>>,
    roles: Vec<Role>,
    armed: Vec<Option<Time>>,
    /// Incarnation of each node (events of an earlier one are dropped).
    lives: Vec<u32>,
    /// Whether each node is up.
    up: Vec<bool>,
    /// Each leaf's log: (durable at, is a checkpoint, records) per operation, in order.
    /// Each leaf's log: every storage operation with the time it is durable.
    logs: Vec<Vec<(Time, crest_core::machine::StorageOp)>>,
    /// How to rebuild each node.
    configs: Vec<NodeConfig>,
    /// Each node's parent index.
    parents: Vec<Option<usize>>,
    /// Delivered messages whose acknowledgement has not been confirmed to their consumer.
    unconfirmed: std::collections::BTreeSet<MessageId>,
    /// Messages that were unconfirmed when some node crashed: at-least-once may deliver
    /// them again.
    exposed: std::collections::HashSet<MessageId>,
    crashes: u64,
    /// Partitions by index: the nodes cut off and how long.
    partition_specs: Vec<(Vec<usize>, Duration)>,
    /// Partitions in force.
    cuts: Vec<Cut>,
    partitions: u64,
    partition_disconnects: u64,
    packets_lost: u64,
    /// Appends and checkpoints the disk model failed.
    disk_failures: u64,
    /// Records that survived a crash from appends not yet durable (torn writes).
    torn_records: u64,
    /// Replicated leaves.
    replication: ReplicationModel,
    /// Each leaf's replica group (replicated leaves only).
    groups: Vec<Option<group::Group>>,
    /// The leaves' `replica_election_timeout_ms`.
    election_timeout: Duration,
    /// Leaders of replica groups elected after one was lost.
    failovers: u64,
    /// Replica logs read back corrupt and thrown away.
    corrupt_logs: u64,
    /// Elections of a replica lacking a committed entry: must be 0.
    group_violations: u64,
    /// The first of those, described.
    group_violation: Option<String>,
    /// Links of the tree idle this long end (the nodes' `link_idle_timeout_ms`).
    idle_timeout: Duration,
    /// The root's index.
    root: usize,
    /// Each node's leaf id (leaves only).
    leaf_ids: Vec<Option<crest_core::id::LeafId>>,
    /// The leaves the root links to directly (`direct_pop_path`), by index.
    direct: Vec<usize>,
    /// The lease checker: the latest lease granted of each message, `(token, deadline)`,
    /// until it ends (ack, nack, release, or its leaf's crash).
    leases: HashMap<MessageId, (u64, Time)>,
    lease_violations: u64,
    lease_violation: Option<String>,
    ends: HashMap<ConnId, (Owner, ConnId)>,
    /// Last arrival time scheduled per receiving end (links keep order).
    last_arrival: HashMap<ConnId, Time>,
    next_conn: ConnId,
    next_request: u64,
    producers: Vec<ProducerState>,
    consumers: Vec<ConsumerState>,
    /// Push requests at leaves: (leaf end, request) → the batch's topic and the priorities
    /// of its messages.
    pushes: HashMap<(ConnId, u64), (String, Vec<u32>)>,
    /// Ground truth per topic (rank error and inversion are within a topic).
    truth: BTreeMap<String, Truth>,
    /// What each topic's producers and consumers saw.
    by_topic: BTreeMap<String, TopicTally>,
    /// When producers stop (deliveries before it are the load's: shares of pops).
    load_end: Time,
    // Measurements.
    pushed: u64,
    push_errors: u64,
    rank_error: Histogram<u64>,
    inversion: Histogram<u64>,
    bubble_aggregator: Histogram<u64>,
    bubble_root: Histogram<u64>,
    pop_latency: Histogram<u64>,
    push_ack: Histogram<u64>,
    window_max: u64,
    processed: u64,
    series: Vec<Sample>,
    current: Sample,
}

impl Sim {
    /// Messages acknowledged and not yet delivered, over every topic.
    fn waiting_total(&self) -> u64 {
        self.truth.values().map(Truth::waiting_total).sum()
    }

    /// What `topic`'s producers and consumers saw so far.
    fn tally(&mut self, topic: &str) -> &mut TopicTally {
        if !self.by_topic.contains_key(topic) {
            self.by_topic.insert(topic.to_string(), TopicTally::new());
        }
        self.by_topic.get_mut(topic).expect("inserted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_counts_rank_error_and_inversion_time() {
        let mut truth = Truth::default();
        let id = |n| MessageId(n);
        let t = |ms| Time::from_millis(ms);
        truth.acked(id(1), 0, t(1));
        truth.acked(id(2), 5, t(2));
        truth.acked(id(3), 1, t(3));
        let measured = |rank_error, inversion_us, wait_us| {
            Some(report::Measured {
                rank_error,
                inversion_us,
                wait_us,
            })
        };
        // Delivering the priority-5 message passes over the two more urgent ones.
        assert_eq!(truth.delivered(id(2), 5, t(10)), measured(2, 0, 8_000));
        assert_eq!(truth.delivered(id(1), 0, t(15)), measured(0, 5_000, 14_000));
        assert_eq!(
            truth.delivered(id(3), 1, t(30)),
            measured(0, 20_000, 27_000)
        );
        assert_eq!(truth.delivered(id(3), 1, t(31)), None, "a duplicate");
        assert_eq!(truth.duplicates, 1);
        assert_eq!(truth.waiting_total(), 0);
    }
}
