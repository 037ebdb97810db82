//! Key order across the tree: pops, batches, urgent arrivals, credits, topics, interleavings
//! and the reports that climb the tree.

use super::*;

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
        t.h.shuffle = Some(SplitMix64::new(seed));
        let mut rng = SplitMix64::new(seed * 7919);
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
            for _ in 0..1 + rng.below(4) {
                let producer = t.producers[rng.below(4) as usize];
                let messages = (0..1 + rng.below(6) as u32)
                    .map(|_| PushMessage {
                        topic: "jobs".into(),
                        priority: rng.below(10) as u32,
                        payload: Bytes::from_static(b"x"),
                        ..PushMessage::default()
                    })
                    .collect();
                let request = t.h.request();
                t.h.send_later(producer, Wire::Push(Push { request, messages }));
            }
            for &consumer in &consumers {
                if rng.below(2) == 0 {
                    let request = t.h.request();
                    let pop = Pop {
                        request,
                        topic: "jobs".into(),
                        max: 1 + rng.below(4) as u32,
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

#[test]
fn a_restarted_root_serves_the_tree_s_most_urgent_message_not_the_first_child_s() {
    // Goal: a root that starts (or restarts) does not serve a less urgent message of the
    // children that came back first while a child with a more urgent one is still coming;
    // and it waits for an absent child only `absent_child_wait_ms`. Method: two leaves linked
    // straight to a fresh root, the urgent one last; a pop (long-poll: a pop that may not
    // wait is answered empty) asked in between.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1), LeafId(2)]));
    let leaves = [leaf(1, 4), leaf(2, 4)].map(|machine| h.add(machine));
    let producers = leaves.map(|node| h.client(node, PeerKind::Producer));
    let urgent = h.push(producers[0], "jobs", &[0])[0];
    let later = h.push(producers[1], "jobs", &[5]);
    let consumer = h.client(root, PeerKind::Consumer);
    h.link(leaves[1], root);
    h.send(consumer, long_poll(7));
    h.advance(Duration::from_millis(
        Settings::default().pop_order_wait_ms * 4,
    ));
    assert!(
        h.try_recv(consumer).is_none(),
        "held while leaf-1 has not come back"
    );
    h.link(leaves[0], root);
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("the held pop is answered")
    };
    assert_eq!(reply.deliveries[0].id, urgent, "the tree's most urgent");

    // A child that does not come back is waited for only so long: then what is there is
    // served (availability).
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1), LeafId(2)]));
    let node = h.add(leaf(2, 4));
    let producer = h.client(node, PeerKind::Producer);
    h.push(producer, "jobs", &[5]);
    let consumer = h.client(root, PeerKind::Consumer);
    h.link(node, root);
    h.send(consumer, long_poll(8));
    let reply = answered_after_the_absent_wait(&mut h, consumer);
    assert_eq!(reply.deliveries[0].id, later[0]);
}

#[test]
fn a_restarted_aggregator_makes_its_parent_wait_for_its_leaves() {
    // Goal: a restarted aggregator does not present part of its subtree as the whole, and its
    // parent stops trusting what its predecessor reported as soon as it is back: the parent
    // would serve a less urgent message of another subtree meanwhile. Method: an urgent
    // message on leaf-1, a less urgent one on leaf-3; a fresh agg-0 linked to the root before
    // its leaves; a long-poll pop asked in between.
    let mut t = tree(4);
    let urgent = t.h.push(t.producers[0], "jobs", &[0])[0];
    t.h.push(t.producers[2], "jobs", &[5]);
    let fresh = t.h.add(Box::new(Aggregator::new(AggregatorConfig {
        name: "agg-0".into(),
        settings: settings(4),
        subtree: vec![LeafId(1), LeafId(2)],
    })));
    t.h.link(fresh, t.root);
    assert!(t.h.nodes[fresh].stats().parent_connected, "Hello at once");
    assert_eq!(
        t.h.nodes[t.root].stats().children,
        2,
        "the fresh agg-0 superseded the old one"
    );
    t.h.kill(t.aggs[0]);
    t.h.send(t.consumer, long_poll(1));
    t.h.link(t.leaves[0], fresh);
    assert!(
        t.h.try_recv(t.consumer).is_none(),
        "held while leaf-2 has not reported to agg-0"
    );
    t.h.link(t.leaves[1], fresh);
    let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
        panic!("the held pop is answered")
    };
    assert_eq!(reply.deliveries[0].id, urgent, "the tree's most urgent");

    // One leaf missing: the parent waits `absent_child_wait_ms`, then serves what is there.
    let lone = t.h.add(Box::new(Aggregator::new(AggregatorConfig {
        name: "agg-1".into(),
        settings: settings(4),
        subtree: vec![LeafId(3), LeafId(4)],
    })));
    t.h.link(lone, t.root);
    t.h.kill(t.aggs[1]);
    t.h.link(t.leaves[2], lone);
    t.h.send(t.consumer, long_poll(2));
    let reply = answered_after_the_absent_wait(&mut t.h, t.consumer);
    assert_eq!(reply.deliveries[0].priority, 5);
}

#[test]
fn a_leaf_lost_below_an_aggregator_makes_the_root_wait_for_it() {
    // Goal: when a leaf's session with its aggregator ends (its process killed, say), the root
    // does not serve a less urgent message of another leaf while the lost one, which may hold
    // a more urgent message, is coming back; and it waits only `absent_child_wait_ms`.
    // Method: an aggregator over leaf-1 (urgent) and leaf-2; leaf-1's link cut; a long-poll
    // pop asked in between; leaf-1 linked again.
    let TwoBelow {
        mut h,
        root,
        agg,
        leaves,
        lost,
        producers,
    } = two_leaves_below_an_aggregator();
    let urgent = h.push(producers[0], "jobs", &[0])[0];
    h.push(producers[1], "jobs", &[5]);
    let consumer = h.client(root, PeerKind::Consumer);
    h.disconnect(lost);
    h.send(consumer, long_poll(1));
    h.advance(Duration::from_millis(
        Settings::default().absent_child_wait_ms / 2,
    ));
    assert!(h.try_recv(consumer).is_none(), "held while leaf-1 is away");
    let lost = h.link(leaves[0], agg);
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("the held pop is answered once leaf-1 is back")
    };
    assert_eq!(reply.deliveries[0].id, urgent, "the tree's most urgent");

    // Lost for good: after the wait, what is there is served.
    h.disconnect(lost);
    h.send(consumer, long_poll(2));
    let reply = answered_after_the_absent_wait(&mut h, consumer);
    assert_eq!(reply.deliveries[0].priority, 5);
}

#[test]
fn a_leaf_that_went_silent_is_not_waited_for_beyond_the_time_it_took_to_notice() {
    // Goal: a session that ended because its peer went silent (its host cut off or gone:
    // nothing heard for `link_idle_timeout_ms`) costs the rest of the tree no further wait:
    // the leaves behind it were unknown since it was last heard, and the wait counts from
    // then; a session that ended otherwise (a restart resets its connections) keeps the
    // whole wait. Method: as above, an aggregator over leaf-1 (urgent) and leaf-2; leaf-1's
    // link goes silent, then a long poll at the root is answered at once with leaf-2's
    // message; leaf-1 linked again and then reset, and the next long poll is held.
    let TwoBelow {
        mut h,
        root,
        agg,
        leaves,
        lost,
        producers,
    } = two_leaves_below_an_aggregator();
    h.push(producers[0], "jobs", &[0]);
    h.push(producers[1], "jobs", &[5, 5]);
    let consumer = h.client(root, PeerKind::Consumer);
    h.went_silent(lost);
    h.send(consumer, long_poll(1));
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("answered at once: leaf-1 went silent a link idle timeout ago")
    };
    assert_eq!(reply.deliveries[0].priority, 5);

    // Back, then reset: a restart, maybe, which the parent waits for.
    let back = h.link(leaves[0], agg);
    h.disconnect(back);
    h.send(consumer, long_poll(2));
    let reply = answered_after_the_absent_wait(&mut h, consumer);
    assert_eq!(reply.deliveries[0].priority, 5);
}

/// A root over an aggregator over leaf-1 and leaf-2.
struct TwoBelow {
    h: Harness,
    root: usize,
    agg: usize,
    leaves: [usize; 2],
    /// Leaf-1's end of its link to the aggregator.
    lost: ConnId,
    /// A producer at each leaf.
    producers: [ConnId; 2],
}

fn two_leaves_below_an_aggregator() -> TwoBelow {
    let mut h = Harness::new();
    let leaves_below = vec![LeafId(1), LeafId(2)];
    let root = h.add(root_node(settings(4), leaves_below.clone()));
    let agg = h.add(Box::new(Aggregator::new(AggregatorConfig {
        name: "agg-0".into(),
        settings: settings(4),
        subtree: leaves_below,
    })));
    let leaves = [leaf(1, 4), leaf(2, 4)].map(|machine| h.add(machine));
    h.link(agg, root);
    let lost = h.link(leaves[0], agg);
    h.link(leaves[1], agg);
    let producers = leaves.map(|node| h.client(node, PeerKind::Producer));
    TwoBelow {
        h,
        root,
        agg,
        leaves,
        lost,
        producers,
    }
}

/// A pop of one that may wait 5 s.
fn long_poll(request: u64) -> Wire {
    Wire::Pop(Pop {
        request,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 5_000,
        ..Pop::default()
    })
}

/// Checks that the pop `consumer` asked is held through half of `absent_child_wait_ms`, then
/// answered once it has passed; returns the answer.
fn answered_after_the_absent_wait(h: &mut Harness, consumer: ConnId) -> PopReply {
    h.advance(Duration::from_millis(
        Settings::default().absent_child_wait_ms / 2,
    ));
    assert!(h.try_recv(consumer).is_none(), "held while a leaf is away");
    h.advance(Duration::from_millis(
        Settings::default().absent_child_wait_ms,
    ));
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("answered once the wait is over")
    };
    reply
}
