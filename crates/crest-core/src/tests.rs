//! State-machine tests of the whole tree with no network: a harness connects machines by
//! in-memory, ordered links, completes storage at once, and moves a virtual clock.

use crate::aggregator::{Aggregator, AggregatorConfig};
use crate::config::Settings;
use crate::id::{LeafId, MessageId, Receipt};
use crate::leaf::{Leaf, LeafConfig};
use crate::machine::{ConnId, Link, Machine, StorageDone};
use crate::record::LogRecord;
use crate::root::{Root, RootConfig};
use crate::time::Time;
use crate::wire::*;
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

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
    shuffle: Option<Lcg>,
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
        let (c, n) = self.pair(Owner::Client, Owner::Node(node));
        self.inbox.insert(c, VecDeque::new());
        self.nodes[node].handle_connected(self.now, n, Link::Incoming);
        self.send(
            c,
            Wire::Hello(Hello {
                protocol: PROTOCOL_VERSION,
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
        let Some((owner, other)) = self.ends.remove(&end) else {
            return;
        };
        let (other_owner, _) = self.ends.remove(&other).unwrap();
        self.queue.retain(|(to, _)| *to != end && *to != other);
        for (owner, conn) in [(owner, end), (other_owner, other)] {
            if let Owner::Node(index) = owner {
                self.nodes[index].handle_disconnected(self.now, conn);
            }
        }
        self.run();
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
        let (_, index) = heads[rng.next(heads.len() as u32) as usize];
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
        seed: u64::from(id),
        first_seq: 1,
    }))
}

/// A root over the leaves `subtree`.
fn root_node(settings: Settings, subtree: Vec<LeafId>) -> Box<dyn Machine> {
    Box::new(Root::new(RootConfig {
        name: "root".into(),
        settings,
        subtree,
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

/// A small deterministic generator for test data.
#[derive(Debug)]
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(bound)) as u32
    }
}

#[test]
fn push_pop_ack_across_the_tree_in_key_order_with_zero_rank_error() {
    // Goal: pushes spread over four leaves come out of the root in exact global key order,
    // whether the pop path goes through the aggregators or on direct links.
    // Method: random priorities, small credits so windows refill constantly, pops of one.
    in_key_order(tree(3));
    let mut t = in_key_order(direct_tree(3));
    for agg in t.aggs {
        // Nothing of the pop path passed through the aggregators (they took what the root
        // took on its notices): their windows are empty.
        assert_eq!(counter(&mut t.h, agg, "reserves_forwarded"), 0);
        assert!(
            counter(&mut t.h, agg, "reserve_notices") > 0,
            "taken on notice"
        );
        assert_eq!(t.h.nodes[agg].stats().window_entries, 0);
    }
    for (index, node) in t.h.nodes.iter().enumerate() {
        assert_eq!(node.stats().violations, 0, "node {index}");
    }
}

fn in_key_order(mut t: Tree) -> Tree {
    let mut rng = Lcg(7);
    let mut pushed = Vec::new();
    for round in 0..20 {
        let producer = t.producers[round % 4];
        let priorities: Vec<u32> = (0..5).map(|_| rng.next(10)).collect();
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

#[test]
fn batch_pops_are_sorted_and_never_exceed_max() {
    let mut t = tree(4);
    for (i, producer) in t.producers.into_iter().enumerate() {
        t.h.push(producer, "jobs", &[9, 1 + i as u32, 5]);
    }
    let first = t.h.pop(t.consumer, "jobs", 5);
    assert_eq!(first.len(), 5);
    let priorities: Vec<u32> = first.iter().map(|d| d.priority).collect();
    assert_eq!(priorities, vec![1, 2, 3, 4, 5]);
    let rest = t.h.pop(t.consumer, "jobs", 100);
    assert_eq!(rest.len(), 7);
    assert!(rest.windows(2).all(|w| w[0].priority <= w[1].priority));
}

#[test]
fn an_urgent_message_pushed_later_to_another_leaf_overtakes_full_windows() {
    // Goal: credits never block a more urgent entry (swap). Method: fill every window with
    // priority-5 entries, push one priority-0 entry to another leaf, pop once.
    let mut t = tree(2);
    for producer in &t.producers[..3] {
        t.h.push(*producer, "jobs", &[5; 10]);
    }
    let urgent = t.h.push(t.producers[3], "jobs", &[9, 9, 9, 0]);
    let popped = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(popped[0].id, urgent[3]);
    for agg in t.aggs {
        assert!(
            t.h.nodes[agg].stats().window_entries <= 2 * 2,
            "credits bound the window"
        );
    }
    assert!(t.h.nodes[t.root].stats().window_entries <= 2 * 2);
}

#[test]
fn windows_above_the_leaves_stay_within_credits_whatever_the_depth() {
    let mut t = tree(5);
    for producer in t.producers {
        for _ in 0..10 {
            t.h.push(producer, "deep", &[3; 100]);
        }
    }
    assert_eq!(t.h.nodes[t.leaves[0]].stats().messages, 1000);
    for agg in t.aggs {
        assert!(t.h.nodes[agg].stats().window_entries <= 2 * 5);
    }
    assert!(t.h.nodes[t.root].stats().window_entries <= 2 * 5);
}

#[test]
fn an_expired_lease_redelivers_and_the_late_ack_is_stale() {
    let mut t = tree(4);
    t.h.push(t.producers[0], "jobs", &[1]);
    let request = t.h.request();
    let pop = Pop {
        request,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 0,
        lease_ms: Some(100),
        ..Pop::default()
    };
    t.h.send(t.consumer, Wire::Pop(pop));
    let Wire::PopReply(first) = t.h.recv(t.consumer) else {
        panic!()
    };
    let first = first.deliveries[0].clone();
    assert_eq!(first.attempt, 1);
    assert!(
        t.h.pop(t.consumer, "jobs", 1).is_empty(),
        "leased: not delivered twice"
    );
    t.h.advance(Duration::from_millis(150));
    let second = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(second[0].id, first.id);
    assert_eq!(second[0].attempt, 2);
    assert_eq!(
        t.h.ack(t.consumer, vec![first.receipt()]),
        vec![Err(ReceiptError::Stale)]
    );
    assert_eq!(t.h.ack(t.consumer, vec![second[0].receipt()]), vec![Ok(())]);
    assert_eq!(
        t.h.ack(t.consumer, vec![second[0].receipt()]),
        vec![Err(ReceiptError::UnknownMessage)]
    );
}

#[test]
fn bad_receipts_get_typed_errors_and_good_ones_in_the_same_ack_succeed() {
    let mut t = tree(4);
    t.h.push(t.producers[2], "jobs", &[1]);
    let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
    let forged = Receipt {
        id: delivery.id,
        token: delivery.token ^ 1,
    };
    let unknown_leaf = Receipt {
        id: MessageId::new(LeafId(77), 1),
        token: 1,
    };
    let results =
        t.h.ack(t.consumer, vec![forged, unknown_leaf, delivery.receipt()]);
    assert_eq!(
        results,
        vec![
            Err(ReceiptError::Stale),
            Err(ReceiptError::UnknownLeaf),
            Ok(())
        ]
    );
}

#[test]
fn invalid_requests_are_refused_with_a_named_problem() {
    let mut t = tree(4);
    let request = t.h.request();
    let too_big = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        metadata: vec![],
        payload: Bytes::from(vec![
            0u8;
            Settings::default().payload_bytes_max as usize + 1
        ]),
        ..PushMessage::default()
    };
    t.h.send(
        t.producers[0],
        Wire::Push(Push {
            request,
            messages: vec![too_big],
        }),
    );
    let Wire::Error(error) = t.h.recv(t.producers[0]) else {
        panic!()
    };
    assert_eq!(
        (error.request, error.code),
        (Some(request), ErrorCode::PayloadTooLarge)
    );
    assert!(error.message.contains("message 0"), "{}", error.message);

    let pop = Pop {
        request: 5,
        topic: "jobs".into(),
        max: 0,
        wait_ms: 0,
        lease_ms: None,
        ..Pop::default()
    };
    t.h.send(t.consumer, Wire::Pop(pop));
    let Wire::Error(error) = t.h.recv(t.consumer) else {
        panic!()
    };
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert!(error.message.contains("max 0"), "{}", error.message);

    let pop = Pop {
        request: 6,
        topic: "bad topic".into(),
        max: 1,
        wait_ms: 0,
        lease_ms: None,
        ..Pop::default()
    };
    t.h.send(t.consumer, Wire::Pop(pop));
    let Wire::Error(error) = t.h.recv(t.consumer) else {
        panic!()
    };
    assert!(error.message.contains("whitespace"), "{}", error.message);

    // A producer may not pop, and the connection keeps working afterwards.
    let pop = Pop {
        request: 7,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 0,
        lease_ms: None,
        ..Pop::default()
    };
    t.h.send(t.producers[0], Wire::Pop(pop));
    let Wire::Error(error) = t.h.recv(t.producers[0]) else {
        panic!()
    };
    assert_eq!(
        (error.request, error.code),
        (Some(7), ErrorCode::UnexpectedMessage)
    );
    assert_eq!(t.h.push(t.producers[0], "jobs", &[1]).len(), 1);
}

#[test]
fn a_restarted_root_gets_everything_offered_again() {
    // Goal: the root's window is soft state. Method: pop some, replace the root with a fresh
    // one (both aggregators reconnect), then pop the rest: nothing is lost, order holds.
    let mut t = tree(3);
    for producer in t.producers {
        t.h.push(producer, "jobs", &[4, 2, 8, 6]);
    }
    let first = t.h.pop(t.consumer, "jobs", 2);
    t.h.ack(t.consumer, first.iter().map(Delivery::receipt).collect());

    let agg_ends: Vec<ConnId> =
        t.h.ends
            .iter()
            .filter(|(_, (owner, _))| t.aggs.iter().any(|a| *owner == Owner::Node(*a)))
            .filter(|(_, (_, other))| t.h.ends[other].0 == Owner::Node(t.root))
            .map(|(end, _)| *end)
            .collect();
    for end in agg_ends {
        t.h.disconnect(end);
    }
    t.h.disconnect(t.consumer);
    let all: Vec<LeafId> = (1..=4).map(LeafId).collect();
    let root = t.h.add(root_node(settings(3), all));
    for agg in t.aggs {
        t.h.link(agg, root);
    }
    let consumer = t.h.client(root, PeerKind::Consumer);
    let mut rest = Vec::new();
    loop {
        let batch = t.h.pop(consumer, "jobs", 1);
        if batch.is_empty() {
            break;
        }
        t.h.ack(consumer, batch.iter().map(Delivery::receipt).collect());
        rest.extend(batch);
    }
    assert_eq!(first.len() + rest.len(), 16);
    assert!(rest.windows(2).all(|w| w[0].priority <= w[1].priority));
}

#[test]
fn a_long_poll_is_answered_when_a_message_arrives_and_times_out_empty_otherwise() {
    let mut t = tree(4);
    let pop = Pop {
        request: 1,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 5_000,
        lease_ms: None,
        ..Pop::default()
    };
    t.h.send(t.consumer, Wire::Pop(pop));
    assert!(t.h.try_recv(t.consumer).is_none(), "waits");
    t.h.advance(Duration::from_millis(10));
    let ids = t.h.push(t.producers[1], "jobs", &[3]);
    let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
        panic!()
    };
    assert_eq!(reply.deliveries[0].id, ids[0]);

    let pop = Pop {
        request: 2,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 200,
        lease_ms: None,
        ..Pop::default()
    };
    t.h.send(t.consumer, Wire::Pop(pop));
    t.h.advance(Duration::from_millis(199));
    assert!(t.h.try_recv(t.consumer).is_none());
    t.h.advance(Duration::from_millis(2));
    let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
        panic!()
    };
    assert!(reply.deliveries.is_empty());
}

#[test]
fn a_consumer_that_vanishes_with_a_pending_reserve_loses_nothing() {
    // The root releases grants nobody waits for, so the message is available at once.
    let mut t = tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[1]);
    let consumer = t.consumer;
    // Pop but cut the consumer before the tree is quiet: queue the pop, disconnect at once.
    let (_, to) = t.h.ends[&consumer];
    t.h.queue.push_back((
        to,
        Wire::Pop(Pop {
            request: 1,
            topic: "jobs".into(),
            max: 1,
            wait_ms: 0,
            lease_ms: None,
            max_priority: None,
        }),
    ));
    // Deliver only the pop (the root sends Reserve), then drop the consumer.
    let (to, msg) = t.h.queue.pop_front().unwrap();
    t.h.nodes[t.root].handle_message(t.h.now, to, msg);
    t.h.disconnect(consumer);
    let other = t.h.client(t.root, PeerKind::Consumer);
    let popped = t.h.pop(other, "jobs", 1);
    // Popped at the same instant: the abandoned lease was released, not waited out (30 s).
    assert_eq!(popped[0].id, ids[0]);
    assert_eq!(
        popped[0].attempt, 1,
        "a grant no consumer received gives its attempt back"
    );
}

#[test]
fn topics_are_ordered_independently() {
    let mut t = tree(2);
    t.h.push(t.producers[0], "a", &[5, 1]);
    t.h.push(t.producers[1], "b", &[0]);
    let a = t.h.pop(t.consumer, "a", 10);
    assert_eq!(a.iter().map(|d| d.priority).collect::<Vec<_>>(), vec![1, 5]);
    assert!(a.iter().all(|d| d.topic == "a"));
    assert_eq!(t.h.pop(t.consumer, "b", 10).len(), 1);
    assert!(t.h.pop(t.consumer, "c", 10).is_empty());
}

#[test]
fn a_leaf_rebuilt_from_its_log_holds_exactly_what_it_held() {
    // Goal: replaying the storage operations a leaf emitted rebuilds its state. Method: run a
    // leaf in the tree, record its log, then recover a second leaf from that log and pop.
    let mut h = Harness::new();
    let (root, first, log) = recorded_leaf_and_root(&mut h);
    let leaf_end = h.link(first, root);
    let producer = h.client(first, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let ids = h.push(producer, "jobs", &[3, 1, 2, 4]);
    let acked = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!(h.ack(consumer, vec![acked.receipt()]), vec![Ok(())]);
    let leased = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!((leased.id, leased.attempt), (ids[2], 1));

    // "Crash": the leaf's session ends; a new leaf is rebuilt from the log alone.
    h.disconnect(leaf_end);
    let operations = crate::machine::replay(&log.lock().unwrap());
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: settings(4),
        seed: 9,
        first_seq: 1,
    };
    let rebuilt = h.add(Box::new(Leaf::recover(config, h.now, operations)));
    assert_eq!(
        h.nodes[rebuilt].stats().messages,
        3,
        "the acked message stays deleted"
    );
    h.link(rebuilt, root);
    let rest: Vec<Delivery> = h.pop(consumer, "jobs", 10);
    let got: Vec<(MessageId, u32)> = rest.iter().map(|d| (d.id, d.attempt)).collect();
    assert_eq!(
        got,
        vec![(ids[2], 2), (ids[0], 1), (ids[3], 1)],
        "leased comes back with its attempt"
    );
    let producer = h.client(rebuilt, PeerKind::Producer);
    let new = h.push(producer, "jobs", &[1]);
    assert!(new[0] > ids[3], "ids continue above the recovered ones");
}

#[test]
fn a_batch_storage_refuses_is_answered_with_an_error_and_nothing_is_kept() {
    let mut h = Harness::new();
    let machine = leaf(1, 4);
    let node = h.add(machine);
    let producer = h.client(node, PeerKind::Producer);
    let request = h.request();
    let message = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        metadata: vec![],
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    // Deliver the push by hand so the storage operation can be failed instead of completed.
    let (_, to) = h.ends[&producer];
    h.nodes[node].handle_message(
        h.now,
        to,
        Wire::Push(Push {
            request,
            messages: vec![message],
        }),
    );
    let op = h.nodes[node].poll_storage().unwrap();
    h.nodes[node].handle_storage_failed(h.now, op.token().unwrap(), "No space left on device");
    h.run();
    let Wire::Error(error) = h.recv(producer) else {
        panic!()
    };
    assert_eq!(
        (error.request, error.code),
        (Some(request), ErrorCode::StorageFailed)
    );
    assert!(error.message.contains("No space left"), "{}", error.message);
    assert_eq!(h.nodes[node].stats().messages, 0);
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

/// Wraps a machine and keeps a copy of every storage operation it emits: its log.
struct Recording {
    inner: Box<dyn Machine>,
    log: SharedLog,
    checkpoints: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Machine for Recording {
    fn check_invariants(&self) {
        self.inner.check_invariants()
    }
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
    fn report_tick(&mut self, now: Time) {
        self.inner.report_tick(now)
    }
}

#[test]
fn a_push_asks_for_a_sync_at_once_and_an_ack_s_delete_may_linger_for_one() {
    use crate::machine::{StorageOp, SyncWait};
    let mut h = Harness::new();
    let (root, node, log) = recorded_leaf_and_root(&mut h);
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1, 2]);
    let delivery = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!(h.ack(consumer, vec![delivery.receipt()]), vec![Ok(())]);
    let waited: Vec<(bool, SyncWait)> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|op| match op {
            StorageOp::Append {
                token: Some(_),
                records,
                wait,
            } => Some((matches!(records[0], LogRecord::Enqueue { .. }), *wait)),
            _ => None,
        })
        .collect();
    assert_eq!(
        waited,
        vec![(true, SyncWait::Now), (false, SyncWait::Linger)],
        "the push, then the ack"
    );
}

#[test]
fn an_extend_is_answered_at_once_and_logs_nothing() {
    // Leases do not survive a restart of their leaf, so a new deadline has nothing to make
    // durable: the extend must not wait for a sync, nor write a record a crash could lose.
    let mut h = Harness::new();
    let (root, node, log) = recorded_leaf_and_root(&mut h);
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1]);
    let delivery = h.pop(consumer, "jobs", 1).remove(0);
    let logged = log.lock().unwrap().len();
    let extend = Settle::Extend { lease_ms: 60_000 };
    assert_eq!(
        h.settle(consumer, extend, vec![delivery.receipt()]),
        vec![Ok(())]
    );
    assert_eq!(
        log.lock().unwrap().len(),
        logged,
        "the extend wrote nothing"
    );
    // It did move the deadline: past the default timeout the lease still holds.
    h.advance(Duration::from_millis(
        Settings::default().lease_timeout_ms + 1,
    ));
    assert!(h.pop(consumer, "jobs", 1).is_empty(), "still leased");
    assert_eq!(h.ack(consumer, vec![delivery.receipt()]), vec![Ok(())]);
}

#[test]
fn checkpoints_come_by_log_growth_and_by_time_and_alone_rebuild_the_leaf() {
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let leaf_settings = Settings {
        checkpoint_log_bytes: 2000,
        checkpoint_interval_ms: 1000,
        ..settings(4)
    };
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings.clone(),
        seed: 1,
        first_seq: 1,
    };
    let log = SharedLog::default();
    let checkpoints = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = || checkpoints.load(std::sync::atomic::Ordering::SeqCst);
    let node = h.add(Box::new(Recording {
        inner: Box::new(Leaf::new(config)),
        log: log.clone(),
        checkpoints: checkpoints.clone(),
    }));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1; 50]);
    assert_eq!(
        count(),
        0,
        "a snapshot of everything would not shrink the log yet"
    );
    // Pops of the window's size (the credits): each takes exactly what the window holds.
    for _ in 0..10 {
        let batch = h.pop(consumer, "jobs", 4);
        assert_eq!(batch.len(), 4);
        h.ack(consumer, batch.iter().map(Delivery::receipt).collect());
    }
    assert_eq!(
        count(),
        1,
        "40 of 50 deleted: the log is more than twice the live state"
    );
    let kept = h.push(producer, "jobs", &[0, 0]);
    h.advance(Duration::from_millis(999));
    assert_eq!(count(), 1);
    h.advance(Duration::from_millis(2));
    assert_eq!(
        count(),
        2,
        "the time trigger fires after checkpoint_interval_ms"
    );

    let operations = crate::machine::replay(&log.lock().unwrap());
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings,
        seed: 2,
        first_seq: 1,
    };
    let rebuilt = Leaf::recover(config, h.now, operations);
    assert_eq!(
        rebuilt.stats().messages,
        12,
        "10 left of the first 50, and 2 more"
    );
    let mut h2 = Harness::new();
    let root2 = h2.add(root_node(settings(4), vec![LeafId(1)]));
    let node2 = h2.add(Box::new(rebuilt));
    h2.link(node2, root2);
    let consumer2 = h2.client(root2, PeerKind::Consumer);
    let first_two: Vec<MessageId> = h2.pop(consumer2, "jobs", 2).iter().map(|d| d.id).collect();
    assert_eq!(
        first_two, kept,
        "the priority-0 messages pushed after the first checkpoint come first"
    );
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

#[test]
fn delays_of_days_are_exact_and_delivery_state_survives_a_rebuild_from_the_log() {
    // Goal: under virtual time, a delay of days ends exactly when asked; a rebuild from the
    // log keeps delayed, dead and time-to-live state. Method: one leaf under a root, its log
    // recorded; a second leaf rebuilt from that log replaces it.
    let day = Duration::from_secs(24 * 3600);
    let mut leaf_settings = settings(4);
    leaf_settings.topics.insert(
        "flaky".into(),
        crate::config::TopicSettings {
            max_attempts: Some(2),
            ..Default::default()
        },
    );
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let log = SharedLog::default();
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings,
        seed: 1,
        first_seq: 1,
    };
    let first = h.add(Box::new(Recording {
        inner: Box::new(Leaf::new(config.clone())),
        log: log.clone(),
        checkpoints: Default::default(),
    }));
    let leaf_end = h.link(first, root);
    let producer = h.client(first, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let message = |topic: &str| PushMessage {
        topic: topic.into(),
        priority: 1,
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    let three_days = h.push_messages(
        producer,
        vec![PushMessage {
            delay_ms: (3 * day).as_millis() as u64,
            ..message("later")
        }],
    )[0];
    h.advance(3 * day - Duration::from_millis(1));
    assert!(
        h.pop(consumer, "later", 1).is_empty(),
        "not a millisecond early"
    );
    h.advance(Duration::from_millis(1));
    let got = h.pop(consumer, "later", 1);
    assert_eq!(got[0].id, three_days);
    assert_eq!(h.ack(consumer, vec![got[0].receipt()]), vec![Ok(())]);

    // State to carry over: a delayed message, one with a time to live, a dead letter.
    let delayed = h.push_messages(
        producer,
        vec![PushMessage {
            delay_ms: (2 * day).as_millis() as u64,
            ..message("later")
        }],
    )[0];
    h.push_messages(
        producer,
        vec![PushMessage {
            ttl_ms: Some(3_600_000),
            ..message("brief")
        }],
    );
    let dead = h.push_messages(producer, vec![message("flaky")])[0];
    for attempt in 1..=2 {
        let got = h.pop(consumer, "flaky", 1);
        assert_eq!((got[0].id, got[0].attempt), (dead, attempt));
        let nack = Settle::Nack {
            delay_ms: 0,
            reason: Some(format!("failure {attempt}")),
        };
        assert_eq!(
            h.settle(consumer, nack, vec![got[0].receipt()]),
            vec![Ok(())]
        );
    }
    assert!(
        h.pop(consumer, "flaky", 1).is_empty(),
        "dead after 2 attempts"
    );

    h.disconnect(leaf_end);
    let operations = crate::machine::replay(&log.lock().unwrap());
    let rebuilt = h.add(Box::new(Leaf::recover(config, h.now, operations)));
    h.link(rebuilt, root);
    let (later, _) = stats_of(&mut h, consumer, "later");
    assert_eq!(later.delayed, 1);
    let (brief, _) = stats_of(&mut h, consumer, "brief");
    assert_eq!(brief.ready_total(), 1);
    let AdminResult::DeadLetters(letters) = admin(
        &mut h,
        consumer,
        AdminOp::DeadLetters {
            topic: "flaky".into(),
            limit: 10,
        },
    ) else {
        panic!("dead letters answer")
    };
    assert_eq!(letters.len(), 1);
    assert_eq!((letters[0].id, letters[0].attempts), (dead, 2));
    assert_eq!(letters[0].reason, "failure 2");

    h.advance(Duration::from_secs(3600));
    assert!(
        h.pop(consumer, "brief", 1).is_empty(),
        "expired after its ttl"
    );
    let (_, stats) = stats_of(&mut h, consumer, "brief");
    assert_eq!(stats.expired, 1);
    h.advance(2 * day);
    assert_eq!(h.pop(consumer, "later", 1)[0].id, delayed);
}

#[test]
fn concurrent_pushes_pops_and_acks_in_any_interleaving_deliver_everything_once() {
    // Goal: whatever the interleaving of connections (each in order, as a QUIC stream), the
    // parents' windows stay in step with what their children think they offered: no offer is
    // refused, no message is stranded, every pushed message is delivered exactly once.
    // Method: small credits, several consumers, rounds of concurrent pushes / pops / acks
    // delivered by a seeded random scheduler; then drain. Both ways of the pop path: through
    // the aggregators, and on direct links (the aggregators then learn of taken entries only
    // from the leaves' retracts, racing the root's offers).
    for seed in 1..=80u64 {
        let mut t = if seed % 2 == 0 {
            direct_tree(3)
        } else {
            tree(3)
        };
        let consumers: Vec<ConnId> = (0..3)
            .map(|_| t.h.client(t.root, PeerKind::Consumer))
            .collect();
        t.h.shuffle = Some(Lcg(seed));
        let mut rng = Lcg(seed * 7919);
        let mut pushed = std::collections::HashSet::new();
        let mut delivered = std::collections::HashSet::new();
        let mut receipts: Vec<(ConnId, Receipt)> = Vec::new();
        let collect = |t: &mut Tree,
                       pushed: &mut std::collections::HashSet<MessageId>,
                       receipts: &mut Vec<(ConnId, Receipt)>,
                       delivered: &mut std::collections::HashSet<MessageId>| {
            for &conn in t.producers.iter().chain(consumers.iter()) {
                while let Some(msg) = t.h.try_recv(conn) {
                    match msg {
                        Wire::PushAck(ack) => pushed.extend(ack.ids),
                        Wire::PopReply(reply) => {
                            for d in reply.deliveries {
                                assert!(delivered.insert(d.id), "seed {seed}: {} twice", d.id);
                                receipts.push((conn, d.receipt()));
                            }
                        }
                        Wire::AckReply(reply) => {
                            assert!(reply.results.iter().all(Result::is_ok), "seed {seed}");
                        }
                        other => panic!("seed {seed}: unexpected {other:?}"),
                    }
                }
            }
        };
        for _round in 0..30 {
            for _ in 0..1 + rng.next(4) {
                let producer = t.producers[rng.next(4) as usize];
                let messages = (0..1 + rng.next(6))
                    .map(|_| PushMessage {
                        topic: "jobs".into(),
                        priority: rng.next(10),
                        payload: Bytes::from_static(b"x"),
                        ..PushMessage::default()
                    })
                    .collect();
                let request = t.h.request();
                t.h.send_later(producer, Wire::Push(Push { request, messages }));
            }
            for &consumer in &consumers {
                if rng.next(2) == 0 {
                    let request = t.h.request();
                    let pop = Pop {
                        request,
                        topic: "jobs".into(),
                        max: 1 + rng.next(4),
                        ..Pop::default()
                    };
                    t.h.send_later(consumer, Wire::Pop(pop));
                }
            }
            for (consumer, receipt) in std::mem::take(&mut receipts) {
                let request = t.h.request();
                let ack = Ack {
                    request,
                    op: Settle::Ack,
                    receipts: vec![receipt],
                };
                t.h.send_later(consumer, Wire::Ack(ack));
            }
            t.h.run();
            collect(&mut t, &mut pushed, &mut receipts, &mut delivered);
        }
        // Drain one pop at a time, in order.
        t.h.shuffle = None;
        loop {
            let mut got = t.h.pop(t.consumer, "jobs", 16);
            if got.is_empty() {
                // A pop may wait briefly for a window being refilled.
                t.h.advance(Duration::from_millis(50));
                got = t.h.pop(t.consumer, "jobs", 16);
                if got.is_empty() {
                    break;
                }
            }
            for d in got {
                assert!(delivered.insert(d.id), "seed {seed}: {} twice", d.id);
            }
        }
        let missing: Vec<&MessageId> = pushed.difference(&delivered).collect();
        assert!(
            missing.is_empty(),
            "seed {seed}: {} of {} pushed messages stranded",
            missing.len(),
            pushed.len()
        );
        for (index, node) in t.h.nodes.iter().enumerate() {
            assert_eq!(node.stats().violations, 0, "seed {seed}: node {index}");
        }
    }
}

#[test]
fn reports_bubble_up_so_the_root_knows_the_whole_tree() {
    // Goal: each node summarises its subtree to its parent; the root's report covers every
    // node, the bubble-up latency of both levels, and topic depths that match what was pushed
    // and popped. Method: push 40, advance 5 ms, pop 10, then report leaves, then aggregators.
    let mut t = tree(4);
    for producer in t.producers {
        t.h.push(producer, "jobs", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
    }
    t.h.advance(Duration::from_millis(5));
    let popped = t.h.pop(t.consumer, "jobs", 10);
    assert_eq!(popped.len(), 10);
    let now = t.h.now;
    for index in t.leaves.into_iter().chain(t.aggs) {
        t.h.nodes[index].report_tick(now);
        t.h.run();
    }
    let report = t.h.nodes[t.root].report(now);
    let mut names: Vec<&str> = report.nodes.iter().map(|n| n.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec![
            "agg-0", "agg-1", "leaf-1", "leaf-2", "leaf-3", "leaf-4", "root"
        ]
    );
    use crate::metrics::Metric;
    assert_eq!(
        report.histograms[&Metric::PushAck].count(),
        4,
        "one per batch"
    );
    assert!(
        report.histograms[&Metric::BubbleToAggregator].count() >= 16,
        "4 leaves x 4 credits"
    );
    assert!(
        report.histograms[&Metric::BubbleToRoot].count() >= 8,
        "2 aggregators x 4 credits"
    );
    assert_eq!(
        report.histograms[&Metric::HopToRoot].count(),
        report.histograms[&Metric::BubbleToRoot].count(),
        "the last hop of every entry the root received"
    );
    assert_eq!(report.histograms[&Metric::PopBatch].percentiles().max, 10);
    let jobs = report.stats.topic("jobs").expect("the topic");
    let ready: u64 = jobs.ready.iter().map(|(_, n)| n).sum();
    assert_eq!((ready, jobs.in_flight), (30, 10));
    let leaf = report.nodes.iter().find(|n| n.name == "leaf-1").unwrap();
    assert_eq!(leaf.counters["pushed"], 10);
    assert_eq!(leaf.parent.as_deref(), Some("agg-0"));
    let root = report.nodes.iter().find(|n| n.name == "root").unwrap();
    assert_eq!(root.counters["deliveries"], 10);
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
            seed: u64::from(id),
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

#[test]
fn offers_linger_unless_urgent_and_go_when_the_linger_ends() {
    // Goal: a change that would not enter the front of what the root holds from a leaf waits
    // up to the linger (fewer offers), an urgent one goes at once and takes the waiting ones
    // along. Method: watch the root's window while pushing to one leaf under virtual time.
    let linger = |urgent: bool| {
        tree_with(Settings {
            offer_linger_us: 2_000,
            offer_urgent_flush: urgent,
            ..Settings::default()
        })
    };
    let window = |t: &Tree| t.h.nodes[t.root].stats().window_entries;
    let mut t = linger(true);
    t.h.push(t.producers[0], "jobs", &[3]);
    assert_eq!(window(&t), 1, "the first entry of a leaf is urgent");
    t.h.push(t.producers[0], "jobs", &[5]);
    assert_eq!(
        window(&t),
        1,
        "less urgent than what the root holds: it waits"
    );
    t.h.advance(Duration::from_micros(1_000));
    assert_eq!(window(&t), 1, "still within the linger");
    t.h.push(t.producers[0], "jobs", &[1]);
    assert_eq!(
        window(&t),
        3,
        "an urgent entry goes at once, with what waited"
    );
    t.h.push(t.producers[0], "jobs", &[7]);
    t.h.advance(Duration::from_micros(2_000));
    assert_eq!(
        window(&t),
        3,
        "the leaf's linger ran out; the aggregator's runs"
    );
    t.h.advance(Duration::from_micros(2_000));
    assert_eq!(window(&t), 4, "each level lingers at most once");

    // Without the urgency rule, every change waits for the linger, the first one included.
    let mut t = linger(false);
    t.h.push(t.producers[0], "jobs", &[3]);
    t.h.push(t.producers[0], "jobs", &[0]);
    assert_eq!(window(&t), 0);
    t.h.advance(Duration::from_micros(4_000));
    assert_eq!(window(&t), 2);
}

#[test]
fn reserve_ahead_serves_pops_without_a_round_trip_and_a_more_urgent_arrival_still_wins() {
    // Goal: a topic popped steadily gets its next entries reserved ahead, so a pop is answered
    // from the buffer without a reserve; an entry more urgent than everything buffered,
    // arriving later, is still popped first. Method: pops of one every 5 ms (virtual) build
    // demand; count the root's reserves; then push an urgent message to another leaf.
    let mut t = tree_with(ahead_settings());
    t.h.push(t.producers[0], "jobs", &[5; 20]);
    pop_steadily(&mut t, 10);
    assert!(
        t.h.nodes[t.root].stats().ahead_entries >= 1,
        "entries reserved ahead"
    );
    let reserves = root_counter(&mut t, "reserves");
    let hits = root_counter(&mut t, "ahead_hits");
    let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!(delivery.priority, 5);
    assert_eq!(
        root_counter(&mut t, "ahead_hits"),
        hits + 1,
        "served from the buffer"
    );
    assert_eq!(
        root_counter(&mut t, "reserves"),
        reserves + 1,
        "the only reserve refills the buffer: the pop itself did not wait for one"
    );
    assert_eq!(t.h.ack(t.consumer, vec![delivery.receipt()]), vec![Ok(())]);

    // Something more urgent than every buffered entry arrives at another leaf.
    let urgent = t.h.push(t.producers[3], "jobs", &[0]);
    let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!(delivery.id, urgent[0], "the urgent arrival goes first");
    let next = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!(next.priority, 5, "then the buffer, in order");
    assert_eq!(
        t.h.ack(t.consumer, vec![delivery.receipt(), next.receipt()]),
        vec![Ok(()), Ok(())],
        "buffered grants carry live leases"
    );
}

#[test]
fn reserved_ahead_entries_nobody_pops_go_back_to_their_leaf() {
    // Goal: a buffer whose consumers stopped does not keep messages leased. Method: build
    // demand, stop popping, advance past reserve_ahead_hold_ms: the leaf holds no lease and
    // the messages are popped later with their first attempt.
    let mut t = tree_with(ahead_settings());
    let ids = t.h.push(t.producers[0], "jobs", &[5; 10]);
    pop_steadily(&mut t, 5);
    assert!(t.h.nodes[t.root].stats().ahead_entries >= 1);
    assert!(t.h.nodes[t.leaves[0]].stats().leased >= 1);
    t.h.advance(Duration::from_millis(
        Settings::default().reserve_ahead_hold_ms + 1,
    ));
    assert_eq!(t.h.nodes[t.root].stats().ahead_entries, 0);
    assert_eq!(t.h.nodes[t.leaves[0]].stats().leased, 0, "given back");
    assert!(root_counter(&mut t, "ahead_released") >= 1);
    let rest = t.h.pop(t.consumer, "jobs", 10);
    assert_eq!(rest.len(), 5);
    assert_eq!(
        rest.iter().map(|d| d.id).collect::<Vec<_>>(),
        ids[5..].to_vec()
    );
    assert!(
        rest.iter().all(|d| d.attempt == 1),
        "the attempt was given back"
    );
}

#[test]
fn an_aggregator_answers_for_a_child_that_vanished_with_requests_in_flight() {
    // Goal: a leaf that goes away below an aggregator while a reserve and an ack are on their
    // way to it does not leave the root waiting: the aggregator answers both `Unavailable`.
    // Method: queue a pop and an ack, deliver until both reach the leaf's link, cut the link.
    let mut t = tree(4);
    t.h.push(t.producers[0], "jobs", &[1, 2]);
    let first = t.h.pop(t.consumer, "jobs", 1).remove(0);
    let (_, root_end) = t.h.ends[&t.consumer];
    t.h.queue.push_back((
        root_end,
        Wire::Ack(Ack {
            request: 90,
            op: Settle::Ack,
            receipts: vec![first.receipt()],
        }),
    ));
    t.h.queue.push_back((
        root_end,
        Wire::Pop(Pop {
            request: 91,
            topic: "jobs".into(),
            max: 1,
            ..Pop::default()
        }),
    ));
    // The leaf's end of its link to the aggregator.
    let leaf_end =
        *t.h.ends
            .iter()
            .find(|(_, (owner, peer))| {
                *owner == Owner::Node(t.leaves[0]) && t.h.ends[peer].0 == Owner::Node(t.aggs[0])
            })
            .map(|(end, _)| end)
            .expect("the leaf's parent link");
    // Deliver until the confirm and the reserve wait on the leaf's link, then cut it.
    for _ in 0..100 {
        for index in 0..t.h.nodes.len() {
            t.h.drain(index);
        }
        let waiting = |m: &Wire| matches!(m, Wire::Reserve(_) | Wire::Confirm(_));
        if t.h
            .queue
            .iter()
            .filter(|(to, m)| *to == leaf_end && waiting(m))
            .count()
            == 2
        {
            break;
        }
        let (to, msg) =
            t.h.queue
                .pop_front()
                .expect("traffic until both are queued");
        if let Some((Owner::Node(index), _)) = t.h.ends.get(&to) {
            t.h.nodes[*index].handle_message(t.h.now, to, msg);
        } else {
            t.h.inbox.get_mut(&to).unwrap().push_back(msg);
        }
    }
    t.h.disconnect(leaf_end);
    let mut replies = Vec::new();
    while let Some(msg) = t.h.try_recv(t.consumer) {
        replies.push(msg);
    }
    assert!(
        replies.iter().any(|m| matches!(m,
            Wire::AckReply(r) if r.request == 90 && r.results == vec![Err(ReceiptError::Unavailable)])),
        "{replies:?}"
    );
    assert!(
        replies
            .iter()
            .any(|m| matches!(m, Wire::PopReply(r) if r.request == 91)),
        "the pop was answered, not left waiting: {replies:?}"
    );
}

#[test]
fn a_pop_never_passes_over_a_grant_reserved_ahead_that_is_still_on_its_way() {
    // Goal: exact order with reserve-ahead. A pop that arrives while a reserve-ahead grant is
    // on its way must not serve a less urgent entry from the window before it, nor answer
    // empty because only grants on their way are left. Method: one leaf holds 21 messages of
    // one priority (key order is id order); 5 pops of one build demand; then pops are queued
    // back to back (each arrives while the previous one's top-up reserve is in flight) until
    // the leaf is empty: ids must come out strictly increasing, none missing, none empty
    // before the end.
    let mut t = tree_with(ahead_settings());
    let ids = t.h.push(t.producers[0], "jobs", &[5; 21]);
    let mut popped = Vec::new();
    popped.extend(pop_steadily(&mut t, 5));
    assert!(t.h.nodes[t.root].stats().ahead_entries >= 1);
    while popped.len() < ids.len() {
        for request in [1_000, 1_001] {
            t.h.send_later(
                t.consumer,
                Wire::Pop(Pop {
                    request: request + popped.len() as u64,
                    topic: "jobs".into(),
                    max: 1,
                    ..Pop::default()
                }),
            );
        }
        t.h.run();
        let mut receipts = Vec::new();
        for _ in 0..2 {
            let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
                panic!("a pop reply");
            };
            let delivery = reply.deliveries.into_iter().next();
            let delivery = delivery.expect("never empty while the leaf holds messages");
            receipts.push(delivery.receipt());
            popped.push(delivery.id);
        }
        assert_eq!(t.h.ack(t.consumer, receipts), vec![Ok(()), Ok(())]);
    }
    assert_eq!(popped, ids, "every message, in key order");
    assert!(
        root_counter(&mut t, "ahead_hits") >= 8,
        "the buffer served most pops"
    );
}

#[test]
fn grants_reserved_ahead_get_the_visibility_timeout_the_pop_asked_for() {
    // Goal: a pop that asks for its own visibility timeout gets it on deliveries from the
    // reserve-ahead buffer and on grants it claims while they are on their way. Method: build
    // demand, then queue pops back to back asking for 60 s (the topic default is 30 s); ack
    // 40 s later: only leases extended to 60 s at their leaf accept the ack.
    let mut t = tree_with(ahead_settings());
    t.h.push(t.producers[0], "jobs", &[5; 12]);
    pop_steadily(&mut t, 5);
    let hits = root_counter(&mut t, "ahead_hits");
    for request in [2_000, 2_001, 2_002] {
        t.h.send_later(
            t.consumer,
            Wire::Pop(Pop {
                request,
                topic: "jobs".into(),
                max: 2,
                lease_ms: Some(60_000),
                ..Pop::default()
            }),
        );
    }
    t.h.run();
    let popped_at = t.h.now;
    let mut receipts = Vec::new();
    for _ in 0..3 {
        let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
            panic!("a pop reply");
        };
        for delivery in reply.deliveries {
            assert!(
                delivery.lease_deadline >= popped_at + Duration::from_secs(59),
                "{delivery:?}"
            );
            receipts.push(delivery.receipt());
        }
    }
    // A pop half filled from the buffer is answered at once: between 3 and 6 deliveries.
    assert!((3..=6).contains(&receipts.len()), "{receipts:?}");
    assert!(
        root_counter(&mut t, "ahead_hits") > hits,
        "some came from the buffer"
    );
    t.h.advance(Duration::from_secs(40));
    let count = receipts.len();
    assert_eq!(
        t.h.ack(t.consumer, receipts),
        vec![Ok(()); count],
        "every lease was extended to 60 s at its leaf"
    );
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
    fn check_invariants(&self) {
        self.inner.check_invariants()
    }
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
        seed: 1,
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

#[test]
fn bodies_beyond_the_cache_are_read_back_and_mostly_dead_segments_are_compacted() {
    let (mut h, leaf, producer, consumer, _, reads) = disk_leaf();
    for chunk in 0..4 {
        let messages = (chunk * 10..chunk * 10 + 10).map(numbered).collect();
        h.push_messages(producer, messages);
    }
    // Most urgent first; every body comes from the "disk", whole.
    let first = h.pop(consumer, "jobs", 36);
    let numbers: Vec<u32> = first.iter().map(|d| d.priority).collect();
    assert_eq!(numbers, (0..36).collect::<Vec<_>>());
    for delivery in &first {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
        assert_eq!(
            delivery.metadata,
            vec![("n".to_string(), delivery.priority.to_string())]
        );
    }
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 36);
    // Ack all but one of each segment (3, 13, 23, 33): the first three are then a tenth full,
    // below the half that triggers compaction, and their survivors move to the end; the
    // fourth still holds five live bodies (33 and the unpopped 36..40).
    let (kept, acked): (Vec<&Delivery>, Vec<&Delivery>) =
        first.iter().partition(|d| d.priority % 10 == 3);
    let receipts = acked.iter().map(|d| d.receipt()).collect();
    assert!(h.ack(consumer, receipts).iter().all(Result::is_ok));
    h.run();
    assert_eq!(counter(&mut h, leaf, "compacted"), 3);
    let now = h.now;
    let gauges = h.nodes[leaf].report(now).nodes[0].gauges.clone();
    assert_eq!(
        gauges["log_segments_live"], 2,
        "the fourth segment, and the one the moved bodies went to"
    );
    // The moved messages keep their leases and their bodies.
    let receipts = kept.iter().map(|d| d.receipt()).collect();
    let nacks = h.settle(
        consumer,
        Settle::Nack {
            delay_ms: 0,
            reason: None,
        },
        receipts,
    );
    assert!(nacks.iter().all(Result::is_ok));
    let rest = h.pop(consumer, "jobs", 10);
    let numbers: Vec<u32> = rest.iter().map(|d| d.priority).collect();
    assert_eq!(numbers, vec![3, 13, 23, 33, 36, 37, 38, 39]);
    for delivery in &rest {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
    }
}

#[test]
fn a_body_that_cannot_be_read_is_dead_lettered_with_the_reason_and_others_are_delivered() {
    let (mut h, _leaf, producer, consumer, unreadable, _) = disk_leaf();
    h.push_messages(producer, (0..10).map(numbered).collect());
    h.push_messages(producer, (10..20).map(numbered).collect());
    unreadable.lock().unwrap().insert(1);
    // The bodies of 0..10 are in the damaged segment 1: those reservations are denied and the
    // messages dead-lettered; the pop is answered from the rest.
    let got = h.pop(consumer, "jobs", 5);
    assert!(
        got.iter().all(|d| d.priority >= 10),
        "only readable bodies are delivered: {:?}",
        got.iter().map(|d| d.priority).collect::<Vec<_>>()
    );
    for delivery in &got {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
    }
    let request = h.request();
    h.send(
        consumer,
        Wire::Admin(crate::wire::Admin {
            request,
            op: AdminOp::DeadLetters {
                topic: "jobs".into(),
                limit: 100,
            },
        }),
    );
    let Wire::AdminReply(reply) = h.recv(consumer) else {
        panic!("admin reply")
    };
    let AdminResult::DeadLetters(letters) = reply.result else {
        panic!("dead letters")
    };
    assert!(!letters.is_empty());
    assert!(
        letters
            .iter()
            .all(|l| l.priority < 10 && l.reason.contains("segment 1 is damaged")),
        "{letters:?}"
    );
}

#[test]
fn a_late_answer_to_a_former_roots_reservation_is_not_taken_for_the_new_ones() {
    // A restarted root numbers its reservations from 1 again, and an aggregator may still
    // forward an answer to the former root's reservation 1. The new root must not deliver
    // that message for its own reservation 1 (of another key): it releases it and waits for
    // its own answer.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let leaf = h.add(leaf(1, 4));
    let leaf_end = h.link(leaf, root);
    let root_end = h.ends[&leaf_end].1;
    let producer = h.client(leaf, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let pushed_at = h.now;
    let ids = h.push(producer, "jobs", &[1, 5]);
    // The pop's reservation (number 1, of the priority-1 message) is on its way to the leaf.
    let request = h.request();
    h.send_later(
        consumer,
        Wire::Pop(Pop {
            request,
            topic: "jobs".into(),
            max: 1,
            wait_ms: 0,
            lease_ms: None,
            ..Pop::default()
        }),
    );
    let (to, pop) = h.queue.pop_back().unwrap();
    h.nodes[root].handle_message(h.now, to, pop);
    h.drain(root);
    // A stale answer numbered 1 arrives first, for the other message.
    let stale = Delivery {
        id: ids[1],
        token: 42,
        topic: "jobs".into(),
        priority: 5,
        attempt: 1,
        enqueued_at: pushed_at,
        lease_deadline: h.now + Duration::from_secs(30),
        metadata: vec![],
        payload: Bytes::from_static(b"p5"),
    };
    let key = crate::key::Key {
        priority: 5,
        ready_at: pushed_at,
        id: ids[1],
    };
    h.queue.push_front((
        root_end,
        Wire::Reserved(Reserved {
            items: vec![ReserveOutcome {
                reservation: 1,
                key,
                result: Ok(stale),
            }],
        }),
    ));
    h.run();
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("pop reply")
    };
    let got: Vec<MessageId> = reply.deliveries.iter().map(|d| d.id).collect();
    assert_eq!(got, vec![ids[0]], "the pop gets the message it reserved");
}

#[test]
fn a_time_to_live_follows_its_message_through_delays_releases_and_a_redrive() {
    // Goal: the leaf finds a message with a time to live wherever it is when the time comes,
    // though its key changes on a nack with delay and its state on each move (it keeps no map
    // from every id to its message). Method: virtual time, one leaf; the message is leased,
    // nacked with a delay (new key), leased again, nacked past its expiry, and must expire
    // while delayed; a second one expires after a dead-letter redrive; a third without a
    // time to live is untouched.
    let mut t = tree(4);
    let producer = t.producers[0];
    let consumer = t.consumer;
    let h = &mut t.h;
    let message = |ttl_ms: Option<u64>| PushMessage {
        topic: "ttl".into(),
        priority: 1,
        payload: Bytes::from_static(b"x"),
        ttl_ms,
        ..PushMessage::default()
    };
    let nack = |delay_ms: u64| Settle::Nack {
        delay_ms,
        reason: None,
    };
    let brief = h.push_messages(producer, vec![message(Some(1_000))])[0];
    let got = h.pop(consumer, "ttl", 1);
    assert_eq!(got[0].id, brief);
    assert_eq!(
        h.settle(consumer, nack(300), vec![got[0].receipt()]),
        vec![Ok(())]
    );
    assert!(h.pop(consumer, "ttl", 1).is_empty(), "delayed by the nack");
    h.advance(Duration::from_millis(301));
    let got = h.pop(consumer, "ttl", 1);
    assert_eq!(
        (got[0].id, got[0].attempt),
        (brief, 2),
        "found under its new key"
    );
    assert_eq!(
        h.settle(consumer, nack(5_000), vec![got[0].receipt()]),
        vec![Ok(())]
    );
    h.advance(Duration::from_millis(800));
    let (stats, totals) = stats_of(h, consumer, "ttl");
    assert_eq!(totals.expired, 1, "expired while delayed");
    assert_eq!((stats.delayed, stats.ready_total()), (0, 0));
    h.advance(Duration::from_millis(5_000));
    assert!(
        h.pop(consumer, "ttl", 1).is_empty(),
        "never delivered again"
    );

    // A dead letter keeps its time to live aside and gets it back when redriven.
    let attempts = Settings::default().max_attempts;
    let doomed = h.push_messages(producer, vec![message(Some(60_000))])[0];
    h.push_messages(producer, vec![message(None)]);
    for _ in 0..attempts {
        let got = h.pop(consumer, "ttl", 2);
        for delivery in &got {
            let op = if delivery.id == doomed {
                nack(0)
            } else {
                Settle::Extend { lease_ms: 120_000 }
            };
            assert_eq!(
                h.settle(consumer, op, vec![delivery.receipt()]),
                vec![Ok(())]
            );
        }
    }
    let (stats, _) = stats_of(h, consumer, "ttl");
    assert_eq!(
        (stats.dead, stats.in_flight),
        (1, 1),
        "doomed dead, plain held"
    );
    let redriven = admin(
        h,
        consumer,
        AdminOp::Redrive {
            topic: "ttl".into(),
            ids: vec![doomed],
        },
    );
    assert!(matches!(redriven, AdminResult::Count(1)));
    h.advance(Duration::from_millis(60_001));
    let (stats, totals) = stats_of(h, consumer, "ttl");
    assert_eq!(totals.expired, 2, "the redriven message expired on time");
    assert_eq!(
        (stats.dead, stats.ready_total(), stats.in_flight),
        (0, 0, 1)
    );
}

/// One entry of leaf `leaf` (priority 5, ready at `at` ms), as a child offers it.
fn entry(leaf: u16, seq: u64, at: u64) -> OfferEntry {
    let key = crate::key::Key {
        priority: 5,
        ready_at: Time::from_millis(at),
        id: MessageId::new(LeafId(leaf), seq),
    };
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
                priority: item.key.priority,
                attempt: 1,
                enqueued_at: item.key.ready_at,
                lease_deadline: item.key.ready_at + Duration::from_secs(30),
                metadata: vec![],
                payload: Bytes::from_static(b"x"),
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

#[test]
fn a_pop_granted_part_of_its_batch_takes_no_later_arrivals() {
    // Goal: a batch pop's latency is a reserve round trip, not the time it takes arrivals to
    // fill `max`. Under a steady trickle of arrivals a pop used to take every new entry while
    // any of its reserves was outstanding, and was answered only when it was full. Method: a
    // root with two scripted children; a pop of 10 reserves one entry from each; the first
    // grant comes back; a new entry arrives; the second grant comes back. The pop is answered
    // with the two entries it had reserved, and the new entry goes to the next pop.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(16), vec![LeafId(1), LeafId(2)]));
    let children = [1u16, 2].map(|leaf| {
        h.client(
            root,
            PeerKind::Node {
                name: format!("agg-{leaf}"),
                role: crate::wire::Role::Aggregator,
                leaves: vec![LeafId(leaf)],
            },
        )
    });
    let consumer = h.client(root, PeerKind::Consumer);
    h.send(children[0], offer(1, vec![entry(1, 1, 10)]));
    h.send(children[1], offer(1, vec![entry(2, 1, 20)]));
    h.send(consumer, jobs_pop(1, 10, 1_000));
    let first = expect_reserve(&mut h, children[0]);
    let second = expect_reserve(&mut h, children[1]);
    h.send(children[0], grant(&first));
    assert!(
        h.try_recv(consumer).is_none(),
        "one reserve still outstanding"
    );
    h.send(children[0], offer(2, vec![entry(1, 2, 30)]));
    assert!(
        h.try_recv(children[0]).is_none(),
        "a pop with a grant back takes no new entry"
    );
    h.send(children[1], grant(&second));
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("a pop reply");
    };
    let ids: Vec<u64> = reply.deliveries.iter().map(|d| d.id.seq()).collect();
    let leaves: Vec<u16> = reply.deliveries.iter().map(|d| d.id.leaf().0).collect();
    assert_eq!((ids, leaves), (vec![1, 1], vec![1, 2]), "the two reserved");
    h.send(consumer, jobs_pop(2, 10, 1_000));
    let third = expect_reserve(&mut h, children[0]);
    assert_eq!(third.items.len(), 1);
    assert_eq!(third.items[0].key.id, MessageId::new(LeafId(1), 2));
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

#[test]
fn reserves_on_a_lost_direct_link_go_again_through_the_tree_and_strand_nothing() {
    // Goal: a direct link that ends with reserves on it strands no message. The leaf may not
    // have seen them (its aggregator still thinks the root holds the entries), or may have
    // granted them with the grants lost.
    // Method: a pop's reserve is on the link, or its grant is on the way back, when the link
    // ends; then drain everything, past the visibility timeout.
    let mut t = direct_tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[1, 2, 3, 4, 5, 6]);
    let agg = t.aggs[0];

    // 1. The reserve never reached the leaf: it goes again through the aggregator, granted.
    let link = t.direct[0];
    let (_, leaf_end) = t.h.ends[&link];
    pop_later(&mut t, 2);
    t.h.run_until(|to, msg| to == leaf_end && matches!(msg, Wire::Reserve(_)));
    t.h.disconnect(link);
    let first = popped(&mut t);
    assert_eq!(first.iter().map(|d| d.id).collect::<Vec<_>>(), ids[..2]);
    let receipts = first.iter().map(Delivery::receipt).collect();
    assert!(t.h.ack(t.consumer, receipts).iter().all(Result::is_ok));
    assert_eq!(counter(&mut t.h, agg, "reserves_forwarded"), 1);
    assert_eq!(gauge(&mut t.h, t.root, "direct_links"), 3);

    // 2. The leaf granted, and the grant is lost with the link: the reserve sent again is
    //    refused (leased), and the messages come back when their lease expires.
    let link = t.h.direct(t.root, t.leaves[0], LeafId(1));
    pop_later(&mut t, 2);
    t.h.run_until(|to, msg| to == link && matches!(msg, Wire::Reserved(_)));
    t.h.disconnect(link);
    let mut delivered: Vec<Delivery> = popped(&mut t);
    loop {
        let more = t.h.pop(t.consumer, "jobs", 8);
        if more.is_empty() {
            break;
        }
        delivered.extend(more);
    }
    let lost: Vec<MessageId> = ids[2..]
        .iter()
        .copied()
        .filter(|id| !delivered.iter().any(|d| d.id == *id))
        .collect();
    assert_eq!(lost, ids[2..4], "the grants lost with the link");
    let receipts = delivered.iter().map(Delivery::receipt).collect();
    assert!(t.h.ack(t.consumer, receipts).iter().all(Result::is_ok));
    t.h.advance(Duration::from_millis(
        Settings::default().lease_timeout_ms + 1_000,
    ));
    let again = t.h.pop(t.consumer, "jobs", 8);
    assert_eq!(again.iter().map(|d| d.id).collect::<Vec<_>>(), lost);
    assert!(again.iter().all(|d| d.attempt == 2), "{again:?}");
    let receipts = again.iter().map(Delivery::receipt).collect();
    assert!(t.h.ack(t.consumer, receipts).iter().all(Result::is_ok));
    assert_eq!(t.h.nodes[t.leaves[0]].stats().messages, 0);
    for node in [t.root, agg] {
        assert_eq!(t.h.nodes[node].stats().window_entries, 0, "node {node}");
    }
    for (index, node) in t.h.nodes.iter().enumerate() {
        assert_eq!(node.stats().violations, 0, "node {index}");
    }
}
