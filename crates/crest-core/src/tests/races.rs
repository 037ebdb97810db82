//! Races at the root: late answers to a former root, partial grants, lost direct links.

use super::*;

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
        escalation: None,
        fairness_key: None,
    };
    let key = crate::key::Key::new(5, pushed_at, ids[1]);
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
                replica: None,
            },
        )
    });
    let consumer = h.client(root, PeerKind::Consumer);
    h.send(children[0], offer(1, vec![entry(1, 1, 10)]));
    h.send(children[1], offer(1, vec![entry(2, 1, 20)]));
    // As a child does once welcomed: its offers, then a report (its leaves are known then).
    for child in children {
        h.send(child, Wire::Report(crate::metrics::Report::default()));
    }
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

#[test]
fn a_root_lost_before_its_direct_reserve_reached_the_leaf_strands_nothing() {
    // Goal: the root sends a reserve on its direct link and the notice of it to the leaf's
    // aggregator, and is lost before the reserve reaches the leaf. The aggregator took the
    // entries on the notice; the leaf, which never saw the reserve, still counts them as
    // offered there. The next root must still be offered them. (The simulator's swarm of
    // failing disks and crashes found entries stranded so.)
    let mut t = direct_tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[1, 2, 3]);
    let agg = t.aggs[0];
    let (_, leaf_end) = t.h.ends[&t.direct[0]];
    pop_later(&mut t, 2);
    t.h.run_until(|to, msg| to == leaf_end && matches!(msg, Wire::Reserve(_)));
    // The reserve to the leaf is lost with the root; the notice reaches the aggregator.
    t.h.queue
        .retain(|(to, msg)| !(*to == leaf_end && matches!(msg, Wire::Reserve(_))));
    t.h.run();
    assert_eq!(counter(&mut t.h, agg, "reserve_notices"), 1);
    t.h.kill(t.root);
    t.h.nodes[t.root] = root_node(settings(4), (1..=4).map(LeafId).collect());
    for agg in t.aggs {
        t.h.link(agg, t.root);
    }
    for (i, leaf) in t.leaves.into_iter().enumerate() {
        t.h.direct(t.root, leaf, LeafId(i as u16 + 1));
    }
    t.consumer = t.h.client(t.root, PeerKind::Consumer);
    let mut delivered = Vec::new();
    loop {
        let more = t.h.pop(t.consumer, "jobs", 8);
        if more.is_empty() {
            break;
        }
        delivered.extend(more.iter().map(|d| d.id));
    }
    delivered.sort();
    assert_eq!(delivered, ids, "the next root is offered every message");
    for (index, node) in t.h.nodes.iter().enumerate() {
        assert_eq!(node.stats().violations, 0, "node {index}");
    }
}

#[test]
fn a_parent_session_whose_end_is_reported_after_the_next_began_strands_nothing() {
    // Goal: the node driver reports a lost connection from a task of its own, so a child that
    // reconnects at once may see its new parent connection before the old one's end. What it
    // had offered on the old session must be offered again on the new one. Method: an
    // aggregator, then the root, is replaced; its children connect to the new one and only
    // then learn that the old connection ended. (A process test that kills an aggregator found
    // a leaf's messages stranded so: offered on the old session, never again.)
    let mut t = tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[1, 2, 3]);
    let mut delivered: Vec<MessageId> =
        t.h.pop(t.consumer, "jobs", 1)
            .iter()
            .map(|d| d.id)
            .collect();
    let agg = t.aggs[0];
    let late = t.h.kill_telling_late(agg, &t.leaves);
    assert_eq!(late.len(), 2, "both leaves of the aggregator are told late");
    t.h.nodes[agg] = Box::new(Aggregator::new(AggregatorConfig {
        name: "agg-0".into(),
        settings: settings(4),
        subtree: vec![LeafId(1), LeafId(2)],
    }));
    t.h.link(agg, t.root);
    for leaf in &t.leaves[..2] {
        t.h.link(*leaf, agg);
    }
    for (leaf, end) in late {
        t.h.nodes[leaf].handle_disconnected(t.h.now, end);
    }
    t.h.run();
    delivered.extend(t.h.pop(t.consumer, "jobs", 1).iter().map(|d| d.id));
    assert_eq!(
        delivered.len(),
        2,
        "the new aggregator is offered the leaf's messages"
    );

    let late = t.h.kill_telling_late(t.root, &t.aggs);
    assert_eq!(late.len(), 2, "both aggregators are told late");
    t.h.nodes[t.root] = root_node(settings(4), (1..=4).map(LeafId).collect());
    for agg in t.aggs {
        t.h.link(agg, t.root);
    }
    for (agg, end) in late {
        t.h.nodes[agg].handle_disconnected(t.h.now, end);
    }
    t.h.run();
    t.consumer = t.h.client(t.root, PeerKind::Consumer);
    delivered.extend(t.h.pop(t.consumer, "jobs", 8).iter().map(|d| d.id));
    delivered.sort();
    assert_eq!(delivered, ids, "the new root is offered the rest");
    for (index, node) in t.h.nodes.iter().enumerate() {
        assert_eq!(node.stats().violations, 0, "node {index}");
    }
}
