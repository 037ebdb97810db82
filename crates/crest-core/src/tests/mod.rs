//! State-machine tests of the whole tree with no network: a harness connects machines by
//! in-memory, ordered links, completes storage at once, and moves a virtual clock.

use crate::aggregator::{Aggregator, AggregatorConfig};
use crate::config::Settings;
use crate::id::{LeafId, MessageId, Receipt};
use crate::leaf::{Leaf, LeafConfig, token_key_from_seed};
use crate::machine::{ConnId, Link, Machine, StorageDone};
use crate::record::LogRecord;
use crate::rng::SplitMix64;
use crate::root::{Root, RootConfig};
use crate::time::Time;
use crate::wire::*;
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

/// The [`Machine`] inputs a test wrapper hands to its `inner` machine after noting the time
/// in its `now` (for the storage completions it makes up itself).
macro_rules! inputs_noting_now {
    () => {
        fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link) {
            self.now = now;
            self.inner.handle_connected(now, conn, link)
        }
        fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
            self.now = now;
            self.inner.handle_disconnected(now, conn)
        }
        fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
            self.now = now;
            self.inner.handle_message(now, conn, msg)
        }
        fn handle_timeout(&mut self, now: Time) {
            self.now = now;
            self.inner.handle_timeout(now)
        }
    };
}

/// The [`Machine`] methods a test wrapper hands to its `inner` machine unchanged.
macro_rules! pass_through {
    () => {
        fn check_invariants(&self) {
            self.inner.check_invariants()
        }
        fn poll_transmit(&mut self) -> Option<crate::machine::Transmit> {
            self.inner.poll_transmit()
        }
        fn poll_close(&mut self) -> Option<(ConnId, String)> {
            self.inner.poll_close()
        }
        fn poll_timeout(&self) -> Option<Time> {
            self.inner.poll_timeout()
        }
        fn stats(&self) -> crate::machine::NodeStats {
            self.inner.stats()
        }
        fn report(&mut self, now: Time) -> crate::metrics::Report {
            self.inner.report(now)
        }
        fn histogram_totals(
            &self,
        ) -> std::collections::BTreeMap<crate::metrics::Metric, crate::metrics::Hist> {
            self.inner.histogram_totals()
        }
        fn handle_principal(
            &mut self,
            conn: ConnId,
            principal: std::sync::Arc<crate::access::Principal>,
        ) {
            self.inner.handle_principal(conn, principal)
        }
    };
}

mod access;
mod bodies;
mod configs;
mod delivery;
mod escalation;
mod fifo;
mod flow;
mod grants;
mod hostile;
mod order;
mod quotas;
mod races;
mod rates;
mod scheduling;
mod storage;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Owner {
    Node(usize),
    Client,
}

/// Machines joined by ordered in-memory links, driven under virtual time.
struct Harness {
    now: Time,
    nodes: Vec<Box<dyn Machine>>,
    /// Each connection end: who owns it and the other end.
    ends: HashMap<ConnId, (Owner, ConnId)>,
    queue: VecDeque<(ConnId, Wire)>,
    inbox: HashMap<ConnId, VecDeque<Wire>>,
    next_conn: ConnId,
    next_request: u64,
    /// When set, `run` delivers the next message of a randomly chosen connection instead of
    /// the oldest message overall: each connection stays in order (as a QUIC stream), but
    /// connections interleave arbitrarily.
    shuffle: Option<SplitMix64>,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            now: Time::from_millis(1_000_000),
            nodes: Vec::new(),
            ends: HashMap::new(),
            queue: VecDeque::new(),
            inbox: HashMap::new(),
            next_conn: 1,
            next_request: 1,
            shuffle: None,
        }
    }

    fn add(&mut self, machine: Box<dyn Machine>) -> usize {
        self.nodes.push(machine);
        self.nodes.len() - 1
    }

    fn pair(&mut self, a: Owner, b: Owner) -> (ConnId, ConnId) {
        let (x, y) = (self.next_conn, self.next_conn + 1);
        self.next_conn += 2;
        self.ends.insert(x, (a, y));
        self.ends.insert(y, (b, x));
        (x, y)
    }

    /// Connects `child` to `parent` as a tree link; returns the child's end.
    fn link(&mut self, child: usize, parent: usize) -> ConnId {
        let (c, p) = self.pair(Owner::Node(child), Owner::Node(parent));
        self.nodes[parent].handle_connected(self.now, p, Link::Incoming);
        self.nodes[child].handle_connected(self.now, c, Link::Parent);
        self.run();
        c
    }

    /// Links the root `root` to leaf node `leaf` (id `id`) directly, as the node driver does
    /// with `direct_pop_path`; returns the root's end.
    fn direct(&mut self, root: usize, leaf: usize, id: LeafId) -> ConnId {
        let (r, l) = self.pair(Owner::Node(root), Owner::Node(leaf));
        self.nodes[leaf].handle_connected(self.now, l, Link::Incoming);
        self.nodes[root].handle_connected(self.now, r, Link::Leaf(id));
        self.run();
        r
    }

    /// Delivers messages one at a time until one in flight matches `stop` (it is not
    /// delivered); panics if the tree goes quiet first.
    fn run_until(&mut self, stop: impl Fn(ConnId, &Wire) -> bool) {
        loop {
            for index in 0..self.nodes.len() {
                self.drain(index);
            }
            if self.queue.iter().any(|(to, msg)| stop(*to, msg)) {
                return;
            }
            let (to, msg) = self
                .queue
                .pop_front()
                .expect("the awaited message never came");
            match self.ends.get(&to) {
                Some((Owner::Node(index), _)) => {
                    self.nodes[*index].handle_message(self.now, to, msg)
                }
                Some((Owner::Client, _)) => self.inbox.get_mut(&to).unwrap().push_back(msg),
                None => {}
            }
        }
    }

    /// Connects a client that says `peer` in its Hello; returns the client's end.
    fn client(&mut self, node: usize, peer: PeerKind) -> ConnId {
        self.client_as(node, peer, None)
    }

    /// [`Harness::client`], authenticated by the host as `principal` if one is given.
    fn client_as(
        &mut self,
        node: usize,
        peer: PeerKind,
        principal: Option<crate::access::Principal>,
    ) -> ConnId {
        let (c, n) = self.pair(Owner::Client, Owner::Node(node));
        self.inbox.insert(c, VecDeque::new());
        self.nodes[node].handle_connected(self.now, n, Link::Incoming);
        if let Some(principal) = principal {
            self.nodes[node].handle_principal(n, std::sync::Arc::new(principal));
        }
        self.send(
            c,
            Wire::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                token: None,
                peer,
            }),
        );
        let reply = self.recv(c);
        assert!(matches!(reply, Wire::Welcome(_)), "{reply:?}");
        c
    }

    fn send(&mut self, from: ConnId, msg: Wire) {
        let (_, to) = self.ends[&from];
        self.queue.push_back((to, msg));
        self.run();
    }

    fn recv(&mut self, client: ConnId) -> Wire {
        self.inbox
            .get_mut(&client)
            .unwrap()
            .pop_front()
            .expect("a message for the client")
    }

    fn try_recv(&mut self, client: ConnId) -> Option<Wire> {
        self.inbox.get_mut(&client).unwrap().pop_front()
    }

    /// Tears down a connection: both ends see it go.
    fn disconnect(&mut self, end: ConnId) {
        self.end_connection(end, false);
    }

    /// Ends a connection as its idle timeout does when its peer went silent: both sides are
    /// told [`Machine::handle_went_silent`].
    fn went_silent(&mut self, end: ConnId) {
        self.end_connection(end, true);
    }

    fn end_connection(&mut self, end: ConnId, silent: bool) {
        let Some((owner, other)) = self.ends.remove(&end) else {
            return;
        };
        let (other_owner, _) = self.ends.remove(&other).unwrap();
        self.queue.retain(|(to, _)| *to != end && *to != other);
        for (owner, conn) in [(owner, end), (other_owner, other)] {
            if let Owner::Node(index) = owner {
                if silent {
                    self.nodes[index].handle_went_silent(self.now, conn);
                } else {
                    self.nodes[index].handle_disconnected(self.now, conn);
                }
            }
        }
        self.run();
    }

    /// Tears down every connection of node `node`, as when its process is killed.
    fn kill(&mut self, node: usize) {
        self.kill_telling_late(node, &[]);
    }

    /// Tears down every connection of node `node` like [`Harness::kill`], except that the nodes
    /// in `late` are not told yet: returns their ends, for the test to report the loss later
    /// (the node driver reports a lost connection from a task of its own).
    fn kill_telling_late(&mut self, node: usize, late: &[usize]) -> Vec<(usize, ConnId)> {
        let mut untold = Vec::new();
        let mut ends: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(_, (owner, _))| *owner == Owner::Node(node))
            .map(|(end, _)| *end)
            .collect();
        ends.sort_unstable();
        for end in ends {
            let (_, other) = self.ends[&end];
            match self.ends[&other].0 {
                Owner::Node(far) if late.contains(&far) => {
                    self.ends.remove(&end);
                    self.ends.remove(&other);
                    self.queue.retain(|(to, _)| *to != end && *to != other);
                    self.nodes[node].handle_disconnected(self.now, end);
                    untold.push((far, other));
                }
                _ => self.disconnect(end),
            }
        }
        self.run();
        untold
    }

    /// Delivers everything in flight, in order, until the tree is quiet (bounded).
    fn run(&mut self) {
        for _ in 0..1_000_000 {
            for index in 0..self.nodes.len() {
                self.drain(index);
            }
            let Some((to, msg)) = self.next_delivery() else {
                return;
            };
            match self.ends.get(&to) {
                Some((Owner::Node(index), _)) => {
                    self.nodes[*index].handle_message(self.now, to, msg)
                }
                Some((Owner::Client, _)) => self.inbox.get_mut(&to).unwrap().push_back(msg),
                None => {} // The connection is gone: in-flight data is lost.
            }
        }
        panic!("tree did not go quiet");
    }

    /// The next message to deliver: the oldest, or with `shuffle` the oldest of a random
    /// connection.
    fn next_delivery(&mut self) -> Option<(ConnId, Wire)> {
        let Some(rng) = &mut self.shuffle else {
            return self.queue.pop_front();
        };
        let mut heads: Vec<(ConnId, usize)> = Vec::new();
        for (index, (to, _)) in self.queue.iter().enumerate() {
            if !heads.iter().any(|(conn, _)| conn == to) {
                heads.push((*to, index));
            }
        }
        if heads.is_empty() {
            return None;
        }
        let (_, index) = heads[rng.below(heads.len() as u64) as usize];
        self.queue.remove(index)
    }

    /// Queues a message from a client without delivering anything yet.
    fn send_later(&mut self, from: ConnId, msg: Wire) {
        let (_, to) = self.ends[&from];
        self.queue.push_back((to, msg));
    }

    fn drain(&mut self, index: usize) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.nodes[index].poll_storage() {
                progressed = true;
                if let Some(token) = op.token() {
                    self.nodes[index].handle_storage_done(self.now, StorageDone::new(token));
                }
            }
            while let Some(transmit) = self.nodes[index].poll_transmit() {
                progressed = true;
                if let Some((_, to)) = self.ends.get(&transmit.conn) {
                    self.queue.push_back((*to, transmit.msg));
                }
            }
            while let Some((conn, _reason)) = self.nodes[index].poll_close() {
                progressed = true;
                self.disconnect(conn);
            }
            if !progressed {
                self.nodes[index].check_invariants();
                return;
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        let target = self.now + by;
        loop {
            let next = self
                .nodes
                .iter()
                .filter_map(|n| n.poll_timeout())
                .filter(|t| *t <= target)
                .min();
            let Some(at) = next else { break };
            self.now = self.now.max(at);
            for index in 0..self.nodes.len() {
                if self.nodes[index]
                    .poll_timeout()
                    .is_some_and(|t| t <= self.now)
                {
                    self.nodes[index].handle_timeout(self.now);
                }
            }
            self.run();
        }
        self.now = target;
        self.run();
    }

    fn request(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn push(&mut self, producer: ConnId, topic: &str, priorities: &[u32]) -> Vec<MessageId> {
        let messages = priorities
            .iter()
            .map(|&priority| PushMessage {
                topic: topic.into(),
                priority,
                metadata: vec![],
                payload: Bytes::from(format!("p{priority}")),
                ..PushMessage::default()
            })
            .collect();
        self.push_messages(producer, messages)
    }

    fn push_messages(&mut self, producer: ConnId, messages: Vec<PushMessage>) -> Vec<MessageId> {
        let request = self.request();
        self.send(producer, Wire::Push(Push { request, messages }));
        match self.recv(producer) {
            Wire::PushAck(ack) => {
                assert_eq!(ack.request, request);
                ack.ids
            }
            other => panic!("push failed: {other:?}"),
        }
    }

    fn pop(&mut self, consumer: ConnId, topic: &str, max: u32) -> Vec<Delivery> {
        let request = self.request();
        let pop = Pop {
            request,
            topic: topic.into(),
            max,
            wait_ms: 0,
            lease_ms: None,
            ..Pop::default()
        };
        self.send(consumer, Wire::Pop(pop));
        match self.recv(consumer) {
            Wire::PopReply(reply) => reply.deliveries,
            other => panic!("pop failed: {other:?}"),
        }
    }

    fn ack(&mut self, consumer: ConnId, receipts: Vec<Receipt>) -> Vec<Result<(), ReceiptError>> {
        self.settle(consumer, Settle::Ack, receipts)
    }

    fn settle(
        &mut self,
        consumer: ConnId,
        op: Settle,
        receipts: Vec<Receipt>,
    ) -> Vec<Result<(), ReceiptError>> {
        let request = self.request();
        self.send(
            consumer,
            Wire::Ack(Ack {
                request,
                op,
                receipts,
            }),
        );
        match self.recv(consumer) {
            Wire::AckReply(reply) => reply.results,
            other => panic!("ack failed: {other:?}"),
        }
    }
}

fn settings(credits: u32) -> Settings {
    Settings {
        credits_per_topic: credits,
        ..Settings::default()
    }
}

fn leaf(id: u16, credits: u32) -> Box<dyn Machine> {
    Box::new(Leaf::new(LeafConfig {
        name: format!("leaf-{id}"),
        id: LeafId(id),
        settings: settings(credits),
        token_key: token_key_from_seed(u64::from(id)),
        first_seq: 1,
    }))
}

/// A root over the leaves `subtree`.
fn root_node(settings: Settings, subtree: Vec<LeafId>) -> Box<dyn Machine> {
    Box::new(Root::new(RootConfig {
        name: "root".into(),
        settings,
        subtree,
        standby: false,
    }))
}

/// A root, two aggregators, four leaves (ids 1..=4): the shape of `topology/local.toml`.
struct Tree {
    h: Harness,
    root: usize,
    aggs: [usize; 2],
    leaves: [usize; 4],
    /// The root's ends of its direct links to the leaves (empty: the pop path goes through
    /// the aggregators).
    direct: Vec<ConnId>,
    producers: [ConnId; 4],
    consumer: ConnId,
}

fn tree(credits: u32) -> Tree {
    tree_with(settings(credits))
}

fn in_key_order(mut t: Tree) -> Tree {
    let mut rng = SplitMix64::new(7);
    let mut pushed = Vec::new();
    for round in 0..20 {
        let producer = t.producers[round % 4];
        let priorities: Vec<u32> = (0..5).map(|_| rng.below(10) as u32).collect();
        let ids = t.h.push(producer, "jobs", &priorities);
        pushed.extend(ids.into_iter().zip(priorities));
    }
    let mut popped = Vec::new();
    loop {
        let deliveries = t.h.pop(t.consumer, "jobs", 1);
        let Some(delivery) = deliveries.into_iter().next() else {
            break;
        };
        let results = t.h.ack(t.consumer, vec![delivery.receipt()]);
        assert_eq!(results, vec![Ok(())]);
        popped.push(delivery);
    }
    assert_eq!(popped.len(), pushed.len(), "every message delivered once");
    // Expected order: priority, then arrival (ready_at is the same virtual instant, so id).
    let mut expected = pushed.clone();
    expected.sort_by_key(|(id, priority)| (*priority, *id));
    let got: Vec<(MessageId, u32)> = popped.iter().map(|d| (d.id, d.priority)).collect();
    assert_eq!(got, expected);
    for leaf in t.leaves {
        assert_eq!(
            t.h.nodes[leaf].stats().messages,
            0,
            "acked messages are deleted"
        );
    }
    t
}

type SharedLog = std::sync::Arc<std::sync::Mutex<Vec<crate::machine::StorageOp>>>;

/// A root (4 credits) and leaf 1 whose log is recorded, not yet linked: (root, leaf, log).
fn recorded_leaf_and_root(h: &mut Harness) -> (usize, usize, SharedLog) {
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let log = SharedLog::default();
    let node = h.add(Box::new(Recording {
        inner: leaf(1, 4),
        log: log.clone(),
        checkpoints: Default::default(),
    }));
    (root, node, log)
}

/// A root and leaf 1 on `leaf_settings` whose log is recorded, linked: the leaf's config (to
/// rebuild it from the log), the root, the leaf and the link's end to disconnect.
fn recorded_leaf_with(
    h: &mut Harness,
    leaf_settings: Settings,
) -> (LeafConfig, usize, usize, ConnId, SharedLog) {
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let log = SharedLog::default();
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings,
        token_key: token_key_from_seed(1),
        first_seq: 1,
    };
    let leaf = h.add(Box::new(Recording {
        inner: Box::new(Leaf::new(config.clone())),
        log: log.clone(),
        checkpoints: Default::default(),
    }));
    let leaf_end = h.link(leaf, root);
    (config, root, leaf, leaf_end, log)
}

/// Cuts a recorded leaf off at `leaf_end`, rebuilds it from its log (`config` as given by
/// [`recorded_leaf_with`]) and links the rebuilt leaf to `root`; whether the log held a
/// checkpoint.
fn restart_from_log(
    h: &mut Harness,
    config: LeafConfig,
    root: usize,
    leaf_end: ConnId,
    log: &SharedLog,
) -> bool {
    h.disconnect(leaf_end);
    let log = log.lock().unwrap();
    let checkpointed = log
        .iter()
        .any(|op| matches!(op, crate::machine::StorageOp::Checkpoint { .. }));
    let operations = crate::machine::replay(&log);
    drop(log);
    let rebuilt = h.add(Box::new(Leaf::recover(config, h.now, operations)));
    h.link(rebuilt, root);
    checkpointed
}

/// Wraps a machine and keeps a copy of every storage operation it emits: its log.
struct Recording {
    inner: Box<dyn Machine>,
    log: SharedLog,
    checkpoints: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Machine for Recording {
    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link) {
        self.inner.handle_connected(now, conn, link)
    }
    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
        self.inner.handle_disconnected(now, conn)
    }
    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        self.inner.handle_message(now, conn, msg)
    }
    fn handle_timeout(&mut self, now: Time) {
        self.inner.handle_timeout(now)
    }
    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        self.inner.handle_storage_done(now, done)
    }
    fn poll_storage(&mut self) -> Option<crate::machine::StorageOp> {
        let op = self.inner.poll_storage()?;
        if let crate::machine::StorageOp::Checkpoint { .. } = &op {
            self.checkpoints
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.log.lock().unwrap().push(op.clone());
        Some(op)
    }
    pass_through!();
    fn report_tick(&mut self, now: Time) {
        self.inner.report_tick(now)
    }
}

/// Sends an admin request to the root and returns its answer.
fn admin(h: &mut Harness, client: ConnId, op: AdminOp) -> AdminResult {
    let request = h.request();
    h.send(client, Wire::Admin(Admin { request, op }));
    match h.recv(client) {
        Wire::AdminReply(reply) => {
            assert!(reply.unreachable.is_empty(), "{reply:?}");
            reply.result
        }
        other => panic!("admin failed: {other:?}"),
    }
}

fn stats_of(h: &mut Harness, client: ConnId, topic: &str) -> (TopicStats, Stats) {
    let AdminResult::Stats(stats) = admin(
        h,
        client,
        AdminOp::Stats {
            topic: Some(topic.into()),
        },
    ) else {
        panic!("stats answer")
    };
    (stats.topic(topic).cloned().unwrap_or_default(), stats)
}

/// A tree whose nodes all use `settings`.
fn tree_with(settings: Settings) -> Tree {
    let mut h = Harness::new();
    let all: Vec<LeafId> = (1..=4).map(LeafId).collect();
    let root = h.add(root_node(settings.clone(), all.clone()));
    let aggs = [0, 1].map(|i| {
        h.add(Box::new(Aggregator::new(AggregatorConfig {
            name: format!("agg-{i}"),
            settings: settings.clone(),
            subtree: all[i * 2..i * 2 + 2].to_vec(),
        })))
    });
    let leaves = [1u16, 2, 3, 4].map(|id| {
        h.add(Box::new(Leaf::new(LeafConfig {
            name: format!("leaf-{id}"),
            id: LeafId(id),
            settings: settings.clone(),
            token_key: token_key_from_seed(u64::from(id)),
            first_seq: 1,
        })))
    });
    for agg in aggs {
        h.link(agg, root);
    }
    for (i, leaf) in leaves.iter().enumerate() {
        h.link(*leaf, aggs[i / 2]);
    }
    let producers = leaves.map(|leaf| h.client(leaf, PeerKind::Producer));
    let consumer = h.client(root, PeerKind::Consumer);
    Tree {
        h,
        root,
        aggs,
        leaves,
        direct: Vec::new(),
        producers,
        consumer,
    }
}

/// [`tree`] with the root linked to every leaf directly (`direct_pop_path`).
fn direct_tree(credits: u32) -> Tree {
    let mut t = tree(credits);
    for (i, leaf) in t.leaves.into_iter().enumerate() {
        let end = t.h.direct(t.root, leaf, LeafId(i as u16 + 1));
        t.direct.push(end);
    }
    assert_eq!(gauge(&mut t.h, t.root, "direct_links"), 4);
    t
}

fn gauge(h: &mut Harness, node: usize, name: &str) -> u64 {
    let now = h.now;
    h.nodes[node].report(now).nodes[0].gauges[name]
}

/// Settings with reserve-ahead on (it is off by default).
fn ahead_settings() -> Settings {
    Settings {
        credits_per_topic: 16,
        reserve_ahead_max: 256,
        ..Settings::default()
    }
}

/// Pops and acks one message of "jobs" every 5 ms (virtual), `count` times, so the root
/// measures a steady demand; returns the ids in pop order.
fn pop_steadily(t: &mut Tree, count: usize) -> Vec<MessageId> {
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
        assert_eq!(t.h.ack(t.consumer, vec![delivery.receipt()]), vec![Ok(())]);
        ids.push(delivery.id);
        t.h.advance(Duration::from_millis(5));
    }
    ids
}

fn root_counter(t: &mut Tree, name: &str) -> u64 {
    let now = t.h.now;
    let report = t.h.nodes[t.root].report(now);
    report.nodes[0].counters.get(name).copied().unwrap_or(0)
}

/// A log store for a leaf that keeps bodies "on disk": each `Enqueue` gets a location (ten
/// per segment, 100 bytes each), and reads are answered from what was written, or fail for
/// locations in `unreadable`.
struct Disk {
    inner: Box<dyn Machine>,
    now: Time,
    segment: u32,
    placed: u32,
    bodies: HashMap<crate::record::Location, crate::record::MessageBody>,
    waiting: HashMap<u64, Vec<crate::record::Location>>,
    unreadable: std::sync::Arc<std::sync::Mutex<HashSet<u32>>>,
    reads: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Disk {
    fn new(inner: Box<dyn Machine>) -> Disk {
        Disk {
            inner,
            now: Time::ZERO,
            segment: 1,
            placed: 0,
            bodies: HashMap::new(),
            waiting: HashMap::new(),
            unreadable: Default::default(),
            reads: Default::default(),
        }
    }
}

impl Machine for Disk {
    inputs_noting_now!();
    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        self.now = now;
        let locations = self.waiting.remove(&done.token).unwrap_or_default();
        let done = StorageDone {
            token: done.token,
            locations,
        };
        self.inner.handle_storage_done(now, done)
    }
    fn poll_storage(&mut self) -> Option<crate::machine::StorageOp> {
        use crate::machine::StorageOp;
        loop {
            let op = self.inner.poll_storage()?;
            match &op {
                StorageOp::Read { token, locations } => {
                    let unreadable = self.unreadable.lock().unwrap().clone();
                    let bodies = locations
                        .iter()
                        .map(|l| {
                            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            if unreadable.contains(&l.segment) {
                                return Err(format!("segment {} is damaged", l.segment));
                            }
                            self.bodies
                                .get(l)
                                .cloned()
                                .ok_or("no such body".to_string())
                        })
                        .collect();
                    let now = self.now;
                    self.inner.handle_storage_read(now, *token, bodies);
                }
                StorageOp::Append {
                    token: Some(token),
                    records,
                    ..
                } => {
                    let mut locations = Vec::new();
                    for record in records {
                        if let LogRecord::Enqueue {
                            metadata, payload, ..
                        } = record
                        {
                            if self.placed == 10 {
                                self.segment += 1;
                                self.placed = 0;
                            }
                            let location = crate::record::Location {
                                segment: self.segment,
                                offset: self.placed * 100,
                                len: 100,
                                crc: 0,
                            };
                            self.placed += 1;
                            let body = crate::record::MessageBody {
                                metadata: metadata.clone(),
                                payload: payload.clone(),
                            };
                            self.bodies.insert(location, body);
                            locations.push(location);
                        }
                    }
                    self.waiting.insert(*token, locations);
                    return Some(op);
                }
                _ => return Some(op),
            }
        }
    }
    fn handle_storage_read(
        &mut self,
        now: Time,
        token: u64,
        bodies: Vec<Result<crate::record::MessageBody, String>>,
    ) {
        self.inner.handle_storage_read(now, token, bodies)
    }
    pass_through!();
}

/// A leaf with no body cache over [`Disk`] (segments of ten 100-byte bodies, compacted below
/// half full), under a root; returns the harness, leaf, producer, consumer and the disk's
/// damage switch and read counter.
#[allow(clippy::type_complexity)]
fn disk_leaf() -> (
    Harness,
    usize,
    ConnId,
    ConnId,
    std::sync::Arc<std::sync::Mutex<HashSet<u32>>>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut h = Harness::new();
    let settings = Settings {
        leaf_body_cache_bytes: 0,
        wal_segment_bytes_max: 1000,
        compaction_live_pct: 50,
        compaction_batch_messages: 3,
        ..settings(64)
    };
    let root = h.add(root_node(settings.clone(), vec![LeafId(1)]));
    let disk = Disk::new(Box::new(Leaf::new(LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings,
        token_key: token_key_from_seed(1),
        first_seq: 1,
    })));
    let (unreadable, reads) = (disk.unreadable.clone(), disk.reads.clone());
    let leaf = h.add(Box::new(disk));
    h.link(leaf, root);
    let producer = h.client(leaf, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    (h, leaf, producer, consumer, unreadable, reads)
}

fn numbered(n: u32) -> PushMessage {
    PushMessage {
        topic: "jobs".into(),
        priority: n,
        metadata: vec![("n".into(), n.to_string())],
        payload: Bytes::from(format!("body of {n}")),
        ..PushMessage::default()
    }
}

fn counter(h: &mut Harness, node: usize, name: &str) -> u64 {
    let now = h.now;
    h.nodes[node].report(now).nodes[0].counters[name]
}

/// One entry of leaf `leaf` (priority 5, ready at `at` ms), as a child offers it.
fn entry(leaf: u16, seq: u64, at: u64) -> OfferEntry {
    let key = crate::key::Key::new(5, Time::from_millis(at), MessageId::new(LeafId(leaf), seq));
    OfferEntry {
        key,
        size: 1,
        since: key.ready_at,
        entered: key.ready_at,
    }
}

/// A child's offer of `adds` with nothing left unoffered behind them (all certain).
fn offer(seq: u64, adds: Vec<OfferEntry>) -> Wire {
    Wire::Offer(Offer {
        topic: "jobs".into(),
        adds,
        retracts: vec![],
        frontier: None,
        seq,
    })
}

/// The leaf's grant of every item of `reserve`.
fn grant(reserve: &Reserve) -> Wire {
    let items = reserve
        .items
        .iter()
        .map(|item| ReserveOutcome {
            reservation: item.reservation,
            key: item.key,
            result: Ok(Delivery {
                id: item.key.id,
                token: 7,
                topic: reserve.topic.clone(),
                priority: item.key.priority(),
                attempt: 1,
                enqueued_at: item.key.ready_at,
                lease_deadline: item.key.ready_at + Duration::from_secs(30),
                metadata: vec![],
                payload: Bytes::from_static(b"x"),
                escalation: None,
                fairness_key: None,
            }),
        })
        .collect();
    Wire::Reserved(Reserved { items })
}

fn expect_reserve(h: &mut Harness, child: ConnId) -> Reserve {
    loop {
        match h.recv(child) {
            Wire::Reserve(reserve) => return reserve,
            Wire::Welcome(_) | Wire::Report(_) => {}
            other => panic!("expected a reserve, got {other:?}"),
        }
    }
}

/// A pop of "jobs".
fn jobs_pop(request: u64, max: u32, wait_ms: u64) -> Wire {
    Wire::Pop(Pop {
        request,
        topic: "jobs".into(),
        max,
        wait_ms,
        ..Pop::default()
    })
}

fn pop_later(t: &mut Tree, max: u32) -> u64 {
    let request = t.h.request();
    t.h.send_later(t.consumer, jobs_pop(request, max, 0));
    request
}

fn popped(t: &mut Tree) -> Vec<Delivery> {
    match t.h.recv(t.consumer) {
        Wire::PopReply(reply) => reply.deliveries,
        other => panic!("pop failed: {other:?}"),
    }
}
