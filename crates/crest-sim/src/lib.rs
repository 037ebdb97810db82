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

pub use workload::{
    ConsumerSpec, DiskModel, FaultSpec, LinkModel, PartitionSpec, PriorityMix, ProducerSpec,
    RandomFaults, Workload,
};

use bytes::Bytes;
use crest_core::aggregator::{Aggregator, AggregatorConfig};
use crest_core::id::{MessageId, Receipt};
use crest_core::leaf::{Leaf, LeafConfig};
use crest_core::machine::{ConnId, Link, Machine, StorageDone};
pub use crest_core::metrics::Percentiles;
use crest_core::root::{Root, RootConfig};
use crest_core::time::Time;
use crest_core::topology::Topology;
use crest_core::wire::{
    Ack, Hello, PROTOCOL_VERSION, PeerKind, Pop, Push, PushMessage, ReceiptError, Role, Settle,
    Wire,
};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

/// What can stop a simulation before it runs.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The workload names a leaf the topology does not have, or is otherwise invalid.
    #[error("workload: {0}")]
    Workload(String),
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 { 0 } else { self.next() % bound }
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A partition in force.
struct Cut {
    index: usize,
    nodes: Vec<usize>,
    heal_at: Time,
    /// Whether it outlasted the idle timeout (its connections ended).
    timed_out: bool,
}

impl Cut {
    fn separates(&self, a: Owner, b: Owner) -> bool {
        let inside = |owner: Owner| matches!(owner, Owner::Node(n) if self.nodes.contains(&n));
        inside(a) != inside(b)
    }
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
    /// A node crashes.
    Crash {
        node: usize,
        restart_after: Duration,
    },
    /// A crashed node starts again.
    Restart { node: usize },
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
}

/// How often a simulated consumer sends an ack that found its leaf unreachable.
const ACK_TRIES_MAX: u32 = 10;
/// How long it waits between two tries.
const ACK_RETRY_AFTER: Duration = Duration::from_millis(20);

fn histogram() -> Histogram<u64> {
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
    /// The bound on that: credits × children of the widest node.
    pub window_entries_bound: u64,
    /// Node crashes injected.
    pub crashes: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Connections ended by partitions that outlasted the idle timeout.
    pub partition_disconnects: u64,
    /// Packets lost (and retransmitted).
    pub packets_lost: u64,
    /// Leases granted while another lease of the same message was live: must be 0.
    pub lease_violations: u64,
    /// The first of those, described.
    pub lease_violation: Option<String>,
    /// Duplicate deliveries of messages that were not delivered-and-unconfirmed when a node
    /// crashed (at-least-once allows duplicates only of those): must be 0.
    pub unexpected_duplicates: u64,
    /// Events processed.
    pub events: u64,
    /// Time series, one sample per `sample_ms`.
    pub series: Vec<Sample>,
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
        if self.crashes + self.partitions + self.packets_lost > 0 {
            let _ = writeln!(
                out,
                "  faults: crashes {}  partitions {} ({} connections ended)  packets lost {}  \
                 unexpected duplicates {}  lease violations {}",
                self.crashes,
                self.partitions,
                self.partition_disconnects,
                self.packets_lost,
                self.unexpected_duplicates,
                self.lease_violations
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
        out
    }
}

/// Ground truth about messages: which are waiting, their priorities, their inversion marks.
#[derive(Default)]
struct Truth {
    /// Waiting messages per priority (acknowledged, not delivered).
    waiting: BTreeMap<u32, u64>,
    /// Per priority: messages in acknowledgement order and the time each was first passed
    /// over by the delivery of a less urgent message (`None`: not yet).
    levels: BTreeMap<u32, Level>,
    /// Where each waiting message sits: (priority, index in its level).
    index: HashMap<MessageId, (u32, usize)>,
    delivered: HashMap<MessageId, ()>,
    duplicates: u64,
    duplicate_ids: Vec<MessageId>,
}

#[derive(Default)]
struct Level {
    marks: Vec<Option<Time>>,
    /// Messages before this index are marked (or gone).
    unmarked_from: usize,
}

impl Truth {
    fn acked(&mut self, id: MessageId, priority: u32) {
        *self.waiting.entry(priority).or_default() += 1;
        let level = self.levels.entry(priority).or_default();
        level.marks.push(None);
        self.index.insert(id, (priority, level.marks.len() - 1));
    }

    /// A delivery at `now`: (rank error, inversion time) if it is a first delivery.
    fn delivered(&mut self, id: MessageId, priority: u32, now: Time) -> Option<(u64, u64)> {
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
        let inversion = match self.index.remove(&id) {
            Some((level, at)) => {
                if let Some(count) = self.waiting.get_mut(&level) {
                    *count = count.saturating_sub(1);
                }
                self.levels[&level].marks[at]
                    .map_or(0, |mark| now.saturating_since(mark).as_micros() as u64)
            }
            // Delivered before the sim saw its acknowledgement leave the leaf: impossible in
            // order, counted as no inversion.
            None => 0,
        };
        Some((rank_error, inversion))
    }

    fn waiting_total(&self) -> u64 {
        self.waiting.values().sum()
    }
}

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
}

struct ConsumerState {
    spec: ConsumerSpec,
    end: ConnId,
    /// The pop in flight: (request, sent at).
    pending: Option<(u64, Time)>,
    /// Ack requests in flight: request → the receipts and how many times they were sent.
    acks: HashMap<u64, (Vec<Receipt>, u32)>,
}

struct Sim {
    now: Time,
    start: Time,
    seq: u64,
    events: BTreeMap<(Time, u64), Event>,
    rng: Rng,
    link: LinkModel,
    disk: DiskModel,
    topic: String,
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
    /// Connections idle this long end (the nodes' `idle_timeout_ms`).
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
    /// Push requests at leaves: (leaf end, request) → priorities of the messages.
    pushes: HashMap<(ConnId, u64), Vec<u32>>,
    truth: Truth,
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
    fn schedule(&mut self, at: Time, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    fn pair(&mut self, a: Owner, b: Owner) -> (ConnId, ConnId) {
        let (x, y) = (self.next_conn, self.next_conn + 1);
        self.next_conn += 2;
        self.ends.insert(x, (a, y));
        self.ends.insert(y, (b, x));
        (x, y)
    }

    /// Sends `msg` from the end `from` across its link.
    fn send(&mut self, from: ConnId, msg: Wire) {
        let Some(&(from_owner, to)) = self.ends.get(&from) else {
            return;
        };
        let jitter = self.rng.below(self.link.jitter_us * 2 + 1);
        let mut latency = (self.link.latency_us + jitter).saturating_sub(self.link.jitter_us);
        if self.link.loss > 0.0 {
            let retransmit = match self.link.retransmit_us {
                0 => self.link.latency_us * 3,
                us => us,
            };
            // Lost again with the same probability; bounded like QUIC's own probes.
            for _ in 0..8 {
                if self.rng.unit() >= self.link.loss {
                    break;
                }
                self.packets_lost += 1;
                latency += retransmit;
            }
        }
        let mut at = self.now + Duration::from_micros(latency);
        // Across a partition, QUIC keeps retransmitting: the message arrives after the heal.
        let to_owner = self.ends.get(&to).map(|(owner, _)| *owner);
        if let Some(to_owner) = to_owner
            && let Some(heal) = self
                .cuts
                .iter()
                .filter(|cut| cut.separates(from_owner, to_owner))
                .map(|cut| cut.heal_at)
                .max()
        {
            at = at.max(heal + Duration::from_micros(self.link.latency_us));
        }
        if let Some(last) = self.last_arrival.get(&to) {
            at = at.max(*last);
        }
        self.last_arrival.insert(to, at);
        self.schedule(at, Event::Deliver { to, msg });
    }

    /// Hands a node's outputs to the links, the disk and its timer.
    fn drain(&mut self, node: usize) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.nodes[node].poll_storage() {
                progressed = true;
                let at = self.now + Duration::from_micros(self.disk.fsync_us);
                if let Some(token) = op.token() {
                    let life = self.lives[node];
                    self.schedule(at, Event::Stored { node, life, token });
                }
                if let crest_core::machine::StorageOp::Read { token, locations } = &op {
                    // The simulated leaves keep bodies in memory and never ask; answer anyway.
                    let bodies = locations
                        .iter()
                        .map(|_| Err("the simulator keeps no bodies on disk".to_string()))
                        .collect();
                    let now = self.now;
                    self.nodes[node].handle_storage_read(now, *token, bodies);
                    continue;
                }
                self.logs[node].push((at, op));
            }
            while let Some(transmit) = self.nodes[node].poll_transmit() {
                progressed = true;
                self.observe_transmit(node, transmit.conn, &transmit.msg);
                self.send(transmit.conn, transmit.msg);
            }
            while self.nodes[node].poll_close().is_some() {
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        // The simulator runs the machines' own invariant checks after every event.
        self.nodes[node].check_invariants();
        if let Some(at) = self.nodes[node].poll_timeout()
            && self.armed[node].is_none_or(|armed| at < armed)
        {
            self.armed[node] = Some(at);
            let life = self.lives[node];
            self.schedule(at.max(self.now), Event::Timer { node, life });
        }
    }

    /// Ground truth taken where it happens: a leaf acknowledging a push, the root answering
    /// a pop.
    fn observe_transmit(&mut self, node: usize, conn: ConnId, msg: &Wire) {
        match (self.roles[node], msg) {
            (Role::Leaf, Wire::PushAck(ack)) => {
                if let Some(priorities) = self.pushes.remove(&(conn, ack.request)) {
                    for (id, priority) in ack.ids.iter().zip(priorities) {
                        self.truth.acked(*id, priority);
                        self.pushed += 1;
                        self.current.pushed += 1;
                    }
                }
            }
            (Role::Leaf, Wire::Error(error)) => {
                if let Some(request) = error.request
                    && self.pushes.remove(&(conn, request)).is_some()
                {
                    self.push_errors += 1;
                }
            }
            (Role::Leaf, Wire::Reserved(reserved)) => {
                for outcome in &reserved.items {
                    let Ok(delivery) = &outcome.result else {
                        continue;
                    };
                    let grant = (delivery.token, delivery.lease_deadline);
                    if let Some((token, deadline)) = self.leases.insert(delivery.id, grant)
                        && deadline > self.now
                    {
                        self.lease_violations += 1;
                        self.lease_violation.get_or_insert_with(|| {
                            format!(
                                "message {} leased with token {:x} at {:?} while its lease {:x} \
                                 was live until {:?}",
                                delivery.id, delivery.token, self.now, token, deadline
                            )
                        });
                    }
                }
            }
            (Role::Root, Wire::PopReply(reply)) => {
                for delivery in &reply.deliveries {
                    self.unconfirmed.insert(delivery.id);
                    if let Some((rank, inversion)) =
                        self.truth
                            .delivered(delivery.id, delivery.priority, self.now)
                    {
                        self.rank_error.saturating_record(rank);
                        self.inversion.saturating_record(inversion.max(1));
                        self.current.delivered += 1;
                        self.current.rank_error_max = self.current.rank_error_max.max(rank);
                    }
                }
            }
            _ => {}
        }
    }

    /// The lease checker's view of a settle reaching a leaf: a receipt with the live token
    /// ends (ack, nack, release) or moves (extend) the lease, exactly as the leaf judges it.
    fn observe_settle(&mut self, msg: &Wire) {
        let (receipts, extend) = match msg {
            Wire::Confirm(confirm) => match confirm.op {
                Settle::Extend { lease_ms } => (&confirm.receipts, Some(lease_ms)),
                _ => (&confirm.receipts, None),
            },
            Wire::Release(release) => (&release.receipts, None),
            _ => return,
        };
        for receipt in receipts {
            let Some(&(token, deadline)) = self.leases.get(&receipt.id) else {
                continue;
            };
            if token != receipt.token || deadline <= self.now {
                continue;
            }
            match extend {
                None => {
                    self.leases.remove(&receipt.id);
                }
                Some(lease_ms) => {
                    let deadline = self.now + Duration::from_millis(lease_ms);
                    self.leases.insert(receipt.id, (token, deadline));
                }
            }
        }
    }

    fn deliver(&mut self, to: ConnId, msg: Wire) {
        let Some(&(owner, _)) = self.ends.get(&to) else {
            return;
        };
        match owner {
            Owner::Node(node) => {
                if let Wire::Offer(offer) = &msg {
                    let histogram = match self.roles[node] {
                        Role::Root => Some(&mut self.bubble_root),
                        Role::Aggregator => Some(&mut self.bubble_aggregator),
                        Role::Leaf => None,
                    };
                    if let Some(histogram) = histogram {
                        for entry in &offer.adds {
                            let micros = self.now.saturating_since(entry.since).as_micros() as u64;
                            histogram.saturating_record(micros.max(1));
                        }
                    }
                }
                if let Wire::Push(push) = &msg {
                    let priorities = push.messages.iter().map(|m| m.priority).collect();
                    self.pushes.insert((to, push.request), priorities);
                }
                if self.roles[node] == Role::Leaf {
                    self.observe_settle(&msg);
                }
                self.nodes[node].handle_message(self.now, to, msg);
                self.drain(node);
                if matches!(self.roles[node], Role::Root | Role::Aggregator) {
                    let stats = self.nodes[node].stats();
                    let entries = stats.window_entries + stats.ahead_entries;
                    self.window_max = self.window_max.max(entries);
                }
            }
            Owner::Producer(producer) => match msg {
                Wire::PushAck(ack) => {
                    if let Some((sent, _)) = self.producers[producer].in_flight.remove(&ack.request)
                    {
                        let micros = self.now.saturating_since(sent).as_micros() as u64;
                        for _ in &ack.ids {
                            self.push_ack.saturating_record(micros.max(1));
                        }
                    }
                }
                Wire::Error(error) => {
                    if let Some(request) = error.request {
                        self.producers[producer].in_flight.remove(&request);
                    }
                }
                _ => {}
            },
            Owner::Consumer(consumer) => {
                if let Wire::AckReply(reply) = &msg
                    && let Some((receipts, tries)) =
                        self.consumers[consumer].acks.remove(&reply.request)
                {
                    let mut retry = Vec::new();
                    for (receipt, result) in receipts.iter().zip(&reply.results) {
                        match result {
                            Ok(()) => {
                                self.unconfirmed.remove(&receipt.id);
                            }
                            // The leaf cannot be reached right now (a node on the way
                            // restarts); the lease is still live: a consumer retries.
                            Err(ReceiptError::Unavailable) if tries < ACK_TRIES_MAX => {
                                retry.push(*receipt);
                            }
                            Err(_) => {}
                        }
                    }
                    if !retry.is_empty() {
                        let at = self.now + ACK_RETRY_AFTER;
                        self.schedule(
                            at,
                            Event::Reack {
                                consumer,
                                receipts: retry,
                                tries: tries + 1,
                            },
                        );
                    }
                }
                if let Wire::PopReply(reply) = msg {
                    let state = &mut self.consumers[consumer];
                    let Some((request, sent)) = state.pending else {
                        return;
                    };
                    if request != reply.request {
                        return;
                    }
                    state.pending = None;
                    if !reply.deliveries.is_empty() {
                        let micros = self.now.saturating_since(sent).as_micros() as u64;
                        self.pop_latency.saturating_record(micros.max(1));
                        let receipts: Vec<Receipt> =
                            reply.deliveries.iter().map(|d| d.receipt()).collect();
                        self.ack(consumer, receipts, 1);
                    }
                    if self.consumers[consumer].spec.rate <= 0.0 {
                        self.pop(consumer);
                    }
                }
            }
        }
    }

    /// Consumer `consumer` acknowledges `receipts` (the `tries`-th time).
    fn ack(&mut self, consumer: usize, receipts: Vec<Receipt>, tries: u32) {
        let request = self.request();
        self.consumers[consumer]
            .acks
            .insert(request, (receipts.clone(), tries));
        let end = self.consumers[consumer].end;
        self.send(
            end,
            Wire::Ack(Ack {
                request,
                op: Settle::Ack,
                receipts,
            }),
        );
    }

    /// Connects `child` to `parent` (both up).
    fn link(&mut self, child: usize, parent: usize) {
        let (c, p) = self.pair(Owner::Node(child), Owner::Node(parent));
        let now = self.now;
        self.nodes[parent].handle_connected(now, p, Link::Incoming);
        self.nodes[child].handle_connected(now, c, Link::Parent);
        self.drain(parent);
        self.drain(child);
    }

    /// Makes the root's missing direct links to leaves that are up and reachable.
    fn link_direct(&mut self) {
        let root = self.root;
        if !self.up[root] {
            return;
        }
        for leaf in self.direct.clone() {
            let id = self.leaf_ids[leaf].expect("a leaf");
            let (r, l) = (Owner::Node(root), Owner::Node(leaf));
            if !self.up[leaf] || self.cut_off(r, l) || self.connected(r, l) {
                continue;
            }
            let (r_end, l_end) = self.pair(r, l);
            let now = self.now;
            self.nodes[leaf].handle_connected(now, l_end, Link::Incoming);
            self.nodes[root].handle_connected(now, r_end, Link::Leaf(id));
            self.drain(leaf);
            self.drain(root);
        }
    }

    fn hello(peer: PeerKind) -> Wire {
        Wire::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            peer,
        })
    }

    /// Connects producer `p` to `leaf`.
    fn connect_producer(&mut self, p: usize, leaf: usize) {
        let (client, node) = self.pair(Owner::Producer(p), Owner::Node(leaf));
        let now = self.now;
        self.nodes[leaf].handle_connected(now, node, Link::Incoming);
        self.send(client, Sim::hello(PeerKind::Producer));
        self.producers[p].ends.push(client);
    }

    /// Connects consumer `c` to the root.
    fn connect_consumer(&mut self, c: usize, root: usize) {
        let (client, node) = self.pair(Owner::Consumer(c), Owner::Node(root));
        let now = self.now;
        self.nodes[root].handle_connected(now, node, Link::Incoming);
        self.send(client, Sim::hello(PeerKind::Consumer));
        self.consumers[c].end = client;
        self.consumers[c].pending = None;
    }

    /// Ends the connection with the end `end`: both ends vanish with what is in flight on them,
    /// and the owners that are up (but `skip`) are told.
    fn close_conn(&mut self, end: ConnId, skip: Option<usize>) {
        let Some((owner, peer)) = self.ends.remove(&end) else {
            return;
        };
        let Some((peer_owner, _)) = self.ends.remove(&peer) else {
            return;
        };
        self.last_arrival.remove(&end);
        self.last_arrival.remove(&peer);
        let now = self.now;
        for (owner, end) in [(owner, end), (peer_owner, peer)] {
            match owner {
                Owner::Node(node) => {
                    if Some(node) != skip && self.up[node] {
                        self.nodes[node].handle_disconnected(now, end);
                        self.drain(node);
                    }
                }
                Owner::Producer(p) => {
                    self.producers[p].ends.retain(|e| *e != end);
                    self.producers[p].in_flight.retain(|_, (_, e)| *e != end);
                }
                Owner::Consumer(c) => {
                    self.consumers[c].pending = None;
                    self.consumers[c].acks.clear();
                }
            }
        }
        let ends = &self.ends;
        self.pushes.retain(|(end, _), _| ends.contains_key(end));
    }

    /// Whether a connection joins `a` and `b`.
    fn connected(&self, a: Owner, b: Owner) -> bool {
        self.ends
            .values()
            .any(|(owner, peer)| *owner == a && self.ends.get(peer).is_some_and(|(o, _)| *o == b))
    }

    /// Whether a partition whose connections ended still separates `a` and `b`.
    fn cut_off(&self, a: Owner, b: Owner) -> bool {
        self.cuts
            .iter()
            .any(|cut| cut.timed_out && cut.separates(a, b))
    }

    /// A partition starts: traffic across it waits for the heal (see [`Sim::send`]).
    fn partition_start(&mut self, index: usize) {
        let (nodes, lasts) = self.partition_specs[index].clone();
        self.partitions += 1;
        self.cuts.push(Cut {
            index,
            nodes,
            heal_at: self.now + lasts,
            timed_out: false,
        });
        if lasts >= self.idle_timeout {
            let at = self.now + self.idle_timeout;
            self.schedule(at, Event::PartitionTimeout { index });
        }
        let at = self.now + lasts;
        self.schedule(at, Event::PartitionHeal { index });
    }

    /// A partition outlasted the idle timeout: every connection across it ends.
    fn partition_timeout(&mut self, index: usize) {
        let Some(cut) = self.cuts.iter_mut().find(|cut| cut.index == index) else {
            return;
        };
        cut.timed_out = true;
        let cut = &self
            .cuts
            .iter()
            .find(|cut| cut.index == index)
            .expect("found");
        let mut across: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(end, (owner, peer))| {
                *end < peer
                    && self
                        .ends
                        .get(peer)
                        .is_some_and(|(o, _)| cut.separates(*owner, *o))
            })
            .map(|(end, _)| *end)
            .collect();
        across.sort_unstable();
        // Deliveries on their way may be lost with their connection: at-least-once may
        // deliver them again.
        self.exposed.extend(self.unconfirmed.iter().copied());
        for end in across {
            self.partition_disconnects += 1;
            self.close_conn(end, None);
        }
    }

    /// A partition heals: connections it ended are made again.
    fn partition_heal(&mut self, index: usize) {
        self.cuts.retain(|cut| cut.index != index);
        for child in 0..self.nodes.len() {
            let Some(parent) = self.parents[child] else {
                continue;
            };
            let (c, p) = (Owner::Node(child), Owner::Node(parent));
            if self.up[child] && self.up[parent] && !self.cut_off(c, p) && !self.connected(c, p) {
                self.link(child, parent);
            }
        }
        for producer in 0..self.producers.len() {
            for leaf in self.producers[producer].targets.clone() {
                let (a, b) = (Owner::Producer(producer), Owner::Node(leaf));
                if self.up[leaf] && !self.cut_off(a, b) && !self.connected(a, b) {
                    self.connect_producer(producer, leaf);
                    self.drain(leaf);
                }
            }
        }
        self.link_direct();
        let root = self.root;
        for consumer in 0..self.consumers.len() {
            let (a, b) = (Owner::Consumer(consumer), Owner::Node(root));
            if self.up[root] && !self.cut_off(a, b) && !self.connected(a, b) {
                self.connect_consumer(consumer, root);
                self.drain(root);
                let at = self.now + Duration::from_millis(1);
                self.schedule(at, Event::Consume { consumer });
            }
        }
    }

    /// A node crashes: its connections drop, a leaf keeps only what its disk made durable.
    fn crash(&mut self, node: usize) {
        if !self.up[node] {
            return;
        }
        self.crashes += 1;
        self.exposed.extend(self.unconfirmed.iter().copied());
        self.lives[node] += 1;
        self.up[node] = false;
        self.armed[node] = None;
        let mut ends: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(_, (owner, _))| *owner == Owner::Node(node))
            .map(|(end, _)| *end)
            .collect();
        ends.sort_unstable();
        for end in ends {
            self.close_conn(end, Some(node));
        }
        // Its leases die with it (a leaf's) or stay with their leaf (the others'). A message
        // leased when its leaf crashed comes back available: at-least-once may deliver it
        // again, whether its grant had reached a consumer yet or not.
        if let Some(leaf) = self.leaf_ids[node] {
            let now = self.now;
            for (id, (_, deadline)) in &self.leases {
                if id.leaf() == leaf && *deadline > now {
                    self.exposed.insert(*id);
                }
            }
            self.leases.retain(|id, _| id.leaf() != leaf);
        }
        let now = self.now;
        // What survives: the durable prefix of the log, from its last durable checkpoint.
        let config = self.configs[node].clone();
        self.nodes[node] = match config {
            NodeConfig::Leaf(config) => {
                let log = &mut self.logs[node];
                log.retain(|(durable_at, _)| *durable_at <= now);
                let ops: Vec<_> = log.drain(..).map(|(_, op)| op).collect();
                let operations = crest_core::machine::replay(&ops);
                // What survives is the log as recovery sees it.
                log.extend(operations.iter().map(|records| {
                    let records = records.clone();
                    (
                        now,
                        crest_core::machine::StorageOp::Append {
                            token: None,
                            records,
                            wait: crest_core::machine::SyncWait::Now,
                        },
                    )
                }));
                Box::new(Leaf::recover(config, now, operations))
            }
            other => other.build(),
        };
    }

    /// A crashed node starts again and reconnects.
    fn restart(&mut self, node: usize, root: usize) {
        if self.up[node] {
            return;
        }
        self.up[node] = true;
        if let Some(parent) = self.parents[node]
            && self.up[parent]
        {
            self.link(node, parent);
        }
        let children: Vec<usize> = (0..self.nodes.len())
            .filter(|&c| self.parents[c] == Some(node) && self.up[c])
            .collect();
        for child in children {
            self.link(child, node);
        }
        for p in 0..self.producers.len() {
            if self.producers[p].targets.contains(&node) {
                self.connect_producer(p, node);
            }
        }
        self.link_direct();
        if node == root {
            for c in 0..self.consumers.len() {
                self.connect_consumer(c, root);
                let at = self.now + Duration::from_millis(1);
                self.schedule(at, Event::Consume { consumer: c });
            }
        }
        self.drain(node);
    }

    fn request(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn pop(&mut self, consumer: usize) {
        if self.consumers[consumer].pending.is_some() {
            return;
        }
        let request = self.request();
        let spec = &self.consumers[consumer].spec;
        let pop = Pop {
            request,
            topic: self.topic.clone(),
            max: spec.max,
            wait_ms: spec.wait_ms,
            ..Pop::default()
        };
        self.consumers[consumer].pending = Some((request, self.now));
        let end = self.consumers[consumer].end;
        self.send(end, Wire::Pop(pop));
    }

    fn produce(&mut self, producer: usize, until: Time) {
        let tick = Duration::from_millis(1);
        let state = &mut self.producers[producer];
        let elapsed = self.now.saturating_since(state.last_tick).as_secs_f64();
        state.last_tick = self.now;
        state.owed = (state.owed + elapsed * state.spec.rate).min(1e6);
        let mut batches = Vec::new();
        while state.owed >= 1.0 && !state.ends.is_empty() {
            let count = (state.owed.floor() as u32).min(state.spec.batch_max.max(1));
            state.owed -= f64::from(count);
            let end = state.ends[state.next_end % state.ends.len()];
            state.next_end += 1;
            batches.push((end, count));
        }
        let spec = self.producers[producer].spec.clone();
        for (end, count) in batches {
            let messages: Vec<PushMessage> = (0..count)
                .map(|_| PushMessage {
                    topic: self.topic.clone(),
                    priority: spec.priorities.draw(&mut self.rng),
                    payload: Bytes::from(vec![0u8; spec.payload_bytes]),
                    ..PushMessage::default()
                })
                .collect();
            let request = self.request();
            self.producers[producer]
                .in_flight
                .insert(request, (self.now, end));
            self.send(end, Wire::Push(Push { request, messages }));
        }
        if self.now + tick < until {
            self.schedule(self.now + tick, Event::Produce { producer });
        }
    }
}

/// Runs `workload` on `topology` under virtual time with `seed`.
///
/// # Errors
/// [`SimError::Workload`] if the workload does not fit the topology.
pub fn run(topology: &Topology, workload: &Workload, seed: u64) -> Result<SimReport, SimError> {
    workload.validate().map_err(SimError::Workload)?;
    let start = Time::from_millis(1_000_000);
    let mut sim = Sim {
        now: start,
        start,
        seq: 0,
        events: BTreeMap::new(),
        rng: Rng(seed),
        link: workload.link,
        disk: workload.disk,
        topic: workload.topic.clone(),
        nodes: Vec::new(),
        roles: Vec::new(),
        armed: Vec::new(),
        lives: Vec::new(),
        up: Vec::new(),
        logs: Vec::new(),
        configs: Vec::new(),
        parents: Vec::new(),
        unconfirmed: std::collections::BTreeSet::new(),
        exposed: std::collections::HashSet::new(),
        crashes: 0,
        partition_specs: Vec::new(),
        cuts: Vec::new(),
        partitions: 0,
        partition_disconnects: 0,
        packets_lost: 0,
        idle_timeout: Duration::from_millis(topology.root().settings.idle_timeout_ms),
        root: 0,
        leaf_ids: topology.nodes.iter().map(|n| n.leaf_id).collect(),
        direct: topology
            .direct_leaves()
            .map(|leaf| topology.nodes.iter().position(|n| n.name == leaf.name))
            .map(|index| index.expect("a node of the topology"))
            .collect(),
        leases: HashMap::new(),
        lease_violations: 0,
        lease_violation: None,
        ends: HashMap::new(),
        last_arrival: HashMap::new(),
        next_conn: 1,
        next_request: 0,
        producers: Vec::new(),
        consumers: Vec::new(),
        pushes: HashMap::new(),
        truth: Truth::default(),
        pushed: 0,
        push_errors: 0,
        rank_error: histogram(),
        inversion: histogram(),
        bubble_aggregator: histogram(),
        bubble_root: histogram(),
        pop_latency: histogram(),
        push_ack: histogram(),
        window_max: 0,
        processed: 0,
        series: Vec::new(),
        current: Sample::default(),
    };
    // The nodes, in topology order.
    let mut index = HashMap::new();
    let mut bound = 0u64;
    for (i, spec) in topology.nodes.iter().enumerate() {
        index.insert(spec.name.clone(), i);
        let subtree = topology.subtree_leaves(&spec.name);
        let settings = spec.settings.clone();
        let config = match spec.role {
            Role::Root => NodeConfig::Root(RootConfig {
                name: spec.name.clone(),
                settings: settings.clone(),
                subtree,
            }),
            Role::Aggregator => NodeConfig::Aggregator(AggregatorConfig {
                name: spec.name.clone(),
                settings: settings.clone(),
                subtree,
            }),
            Role::Leaf => NodeConfig::Leaf(LeafConfig {
                name: spec.name.clone(),
                id: spec.leaf_id.expect("validated: leaves have ids"),
                settings: settings.clone(),
                seed: seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9),
                first_seq: 1,
            }),
        };
        let machine = config.build();
        sim.configs.push(config);
        sim.lives.push(0);
        sim.up.push(true);
        sim.logs.push(Vec::new());
        if spec.role != Role::Leaf {
            let children = topology
                .nodes
                .iter()
                .filter(|n| n.parent.as_deref() == Some(&spec.name))
                .count() as u64;
            // The root also holds its reserve-ahead buffer (one topic here).
            let ahead = match spec.role {
                Role::Root => u64::from(settings.reserve_ahead_max),
                _ => 0,
            };
            bound = bound.max(u64::from(settings.credits_per_topic) * children + ahead);
        }
        sim.nodes.push(machine);
        sim.roles.push(spec.role);
        sim.armed.push(None);
    }
    sim.parents = topology
        .nodes
        .iter()
        .map(|n| n.parent.as_ref().map(|p| index[p]))
        .collect();
    // The tree's links.
    for child in 0..sim.nodes.len() {
        if let Some(parent) = sim.parents[child] {
            sim.link(child, parent);
        }
    }
    // Clients.
    let leaves: Vec<usize> = topology
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.role == Role::Leaf)
        .map(|(i, _)| i)
        .collect();
    let root = topology
        .nodes
        .iter()
        .position(|n| n.role == Role::Root)
        .expect("validated: one root");
    sim.root = root;
    sim.link_direct();
    let begin = start + Duration::from_millis(workload.warmup_ms);
    let end = begin + Duration::from_millis(workload.duration_ms);
    for (p, spec) in workload.producers.iter().enumerate() {
        let targets: Vec<usize> = match &spec.leaf {
            None => leaves.clone(),
            Some(name) => match index.get(name) {
                Some(&i) if sim.roles[i] == Role::Leaf => vec![i],
                _ => {
                    return Err(SimError::Workload(format!(
                        "producer {p}: {name:?} is not a leaf of the topology"
                    )));
                }
            },
        };
        let from = begin + Duration::from_millis(spec.start_ms);
        sim.producers.push(ProducerState {
            spec: spec.clone(),
            targets: targets.clone(),
            ends: Vec::new(),
            next_end: p,
            owed: 0.0,
            last_tick: from,
            in_flight: HashMap::new(),
        });
        for leaf in targets {
            sim.connect_producer(p, leaf);
        }
        sim.schedule(from, Event::Produce { producer: p });
    }
    for (c, spec) in workload.consumers.iter().enumerate() {
        sim.consumers.push(ConsumerState {
            spec: spec.clone(),
            end: 0,
            pending: None,
            acks: HashMap::new(),
        });
        sim.connect_consumer(c, root);
        sim.schedule(begin, Event::Consume { consumer: c });
    }
    let mut crashes: Vec<(usize, u64, u64)> = Vec::new();
    for fault in &workload.faults {
        let Some(&node) = index.get(&fault.node) else {
            return Err(SimError::Workload(format!(
                "fault: {:?} is not a node of the topology",
                fault.node
            )));
        };
        crashes.push((node, fault.at_ms, fault.restart_after_ms));
    }
    let mut partitions: Vec<(Vec<usize>, u64, u64)> = Vec::new();
    for partition in &workload.partitions {
        let mut nodes = Vec::new();
        for name in &partition.nodes {
            let Some(&node) = index.get(name) else {
                return Err(SimError::Workload(format!(
                    "partition: {name:?} is not a node of the topology"
                )));
            };
            nodes.push(node);
        }
        partitions.push((nodes, partition.at_ms, partition.heal_after_ms));
    }
    // Faults drawn from the seed, from a generator of their own (the links' draws stay put).
    let random = workload.random_faults;
    let mut chaos = Rng(seed ^ 0x5eed_fa17_c0de_0001);
    let draw = |chaos: &mut Rng| {
        let node = chaos.below(sim.nodes.len() as u64) as usize;
        let at = chaos.below(workload.duration_ms);
        let lasts = 10 + chaos.below(random.down_ms_max.saturating_sub(9));
        (node, at, lasts)
    };
    for _ in 0..random.crashes {
        crashes.push(draw(&mut chaos));
    }
    for _ in 0..random.partitions {
        let (node, at, lasts) = draw(&mut chaos);
        partitions.push((vec![node], at, lasts));
    }
    for (node, at_ms, down_ms) in crashes {
        sim.schedule(
            begin + Duration::from_millis(at_ms),
            Event::Crash {
                node,
                restart_after: Duration::from_millis(down_ms),
            },
        );
    }
    for (index, (nodes, at_ms, lasts_ms)) in partitions.into_iter().enumerate() {
        sim.partition_specs
            .push((nodes, Duration::from_millis(lasts_ms)));
        sim.schedule(
            begin + Duration::from_millis(at_ms),
            Event::PartitionStart { index },
        );
    }
    sim.schedule(start + Duration::from_secs(1), Event::Report);
    sim.schedule(
        begin + Duration::from_millis(workload.sample_ms),
        Event::Sample,
    );
    let finish = end + Duration::from_millis(workload.drain_ms);
    let producer_ends: Vec<Time> = workload
        .producers
        .iter()
        .map(|spec| {
            let stop = spec.stop_ms.unwrap_or(workload.duration_ms);
            begin + Duration::from_millis(stop.min(workload.duration_ms))
        })
        .collect();
    while let Some(((at, _), event)) = sim.events.pop_first() {
        if at > finish {
            break;
        }
        sim.now = sim.now.max(at);
        sim.processed += 1;
        match event {
            Event::Deliver { to, msg } => sim.deliver(to, msg),
            Event::Timer { node, life } => {
                if life != sim.lives[node] || !sim.up[node] {
                    continue;
                }
                if sim.armed[node] == Some(at) {
                    sim.armed[node] = None;
                }
                if sim.nodes[node]
                    .poll_timeout()
                    .is_some_and(|deadline| deadline <= sim.now)
                {
                    let now = sim.now;
                    sim.nodes[node].handle_timeout(now);
                }
                sim.drain(node);
            }
            Event::Stored { node, life, token } => {
                if life != sim.lives[node] || !sim.up[node] {
                    continue;
                }
                let now = sim.now;
                sim.nodes[node].handle_storage_done(now, StorageDone::new(token));
                sim.drain(node);
            }
            Event::Crash {
                node,
                restart_after,
            } => {
                sim.crash(node);
                let at = sim.now + restart_after;
                sim.schedule(at, Event::Restart { node });
            }
            Event::Restart { node } => sim.restart(node, root),
            Event::Reack {
                consumer,
                receipts,
                tries,
            } => sim.ack(consumer, receipts, tries),
            Event::PartitionStart { index } => sim.partition_start(index),
            Event::PartitionTimeout { index } => sim.partition_timeout(index),
            Event::PartitionHeal { index } => sim.partition_heal(index),
            Event::Produce { producer } => {
                let until = producer_ends[producer];
                if sim.now < until {
                    sim.produce(producer, until);
                }
            }
            Event::Consume { consumer } => {
                sim.pop(consumer);
                let rate = sim.consumers[consumer].spec.rate;
                if rate > 0.0 {
                    let every = Duration::from_secs_f64(1.0 / rate);
                    let next = sim.now + every;
                    sim.schedule(next, Event::Consume { consumer });
                }
            }
            Event::Report => {
                // Leaves first, then upward: each node reports what it knows.
                let now = sim.now;
                let mut order: Vec<usize> = (0..sim.nodes.len()).collect();
                order.sort_by_key(|&i| match sim.roles[i] {
                    Role::Leaf => 0,
                    Role::Aggregator => 1,
                    Role::Root => 2,
                });
                for node in order {
                    if sim.up[node] {
                        sim.nodes[node].report_tick(now);
                        sim.drain(node);
                    }
                }
                sim.schedule(now + Duration::from_secs(1), Event::Report);
            }
            Event::Sample => {
                let mut sample = std::mem::take(&mut sim.current);
                sample.at_ms = sim.now.saturating_since(begin).as_millis() as u64;
                sample.waiting = sim.truth.waiting_total();
                sample.window_entries = (0..sim.nodes.len())
                    .filter(|&i| sim.roles[i] != Role::Leaf)
                    .map(|i| sim.nodes[i].stats().window_entries)
                    .sum();
                sim.series.push(sample);
                let next = sim.now + Duration::from_millis(workload.sample_ms);
                if next <= finish {
                    sim.schedule(next, Event::Sample);
                }
            }
        }
        // Stop early once producers are done and everything acknowledged was delivered.
        if sim.now >= end
            && sim.truth.waiting_total() == 0
            && sim.pushes.is_empty()
            && sim.producers.iter().all(|p| p.in_flight.is_empty())
        {
            break;
        }
    }
    let delivered = sim.truth.delivered.len() as u64;
    let seconds = |d: Duration| d.as_secs_f64().max(1e-9);
    Ok(SimReport {
        seed,
        nodes: sim.nodes.len(),
        duration_ms: workload.duration_ms,
        simulated_ms: sim.now.saturating_since(sim.start).as_millis() as u64,
        pushed: sim.pushed,
        delivered,
        duplicates: sim.truth.duplicates,
        undelivered: sim.truth.waiting_total(),
        push_errors: sim.push_errors,
        push_rate: sim.pushed as f64 / seconds(Duration::from_millis(workload.duration_ms)),
        delivery_rate: delivered as f64 / seconds(sim.now.saturating_since(begin)),
        rank_error: Percentiles::of(&sim.rank_error),
        inversion_time_us: Percentiles::of(&sim.inversion),
        bubble_up_to_aggregator_us: Percentiles::of(&sim.bubble_aggregator),
        bubble_up_to_root_us: Percentiles::of(&sim.bubble_root),
        pop_latency_us: Percentiles::of(&sim.pop_latency),
        push_ack_us: Percentiles::of(&sim.push_ack),
        window_entries_max: sim.window_max,
        window_entries_bound: bound,
        crashes: sim.crashes,
        partitions: sim.partitions,
        partition_disconnects: sim.partition_disconnects,
        packets_lost: sim.packets_lost,
        lease_violations: sim.lease_violations,
        lease_violation: sim.lease_violation,
        unexpected_duplicates: sim
            .truth
            .duplicate_ids
            .iter()
            .filter(|id| !sim.exposed.contains(id))
            .count() as u64,
        events: sim.processed,
        series: sim.series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_counts_rank_error_and_inversion_time() {
        let mut truth = Truth::default();
        let id = |n| MessageId(n);
        truth.acked(id(1), 0);
        truth.acked(id(2), 5);
        truth.acked(id(3), 1);
        let t = |ms| Time::from_millis(ms);
        // Delivering the priority-5 message passes over the two more urgent ones.
        assert_eq!(truth.delivered(id(2), 5, t(10)), Some((2, 0)));
        assert_eq!(truth.delivered(id(1), 0, t(15)), Some((0, 5_000)));
        assert_eq!(truth.delivered(id(3), 1, t(30)), Some((0, 20_000)));
        assert_eq!(truth.delivered(id(3), 1, t(31)), None, "a duplicate");
        assert_eq!(truth.duplicates, 1);
        assert_eq!(truth.waiting_total(), 0);
    }
}
