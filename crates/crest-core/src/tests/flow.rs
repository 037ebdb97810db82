//! Flow control: lingering offers, reserve-ahead, aggregators answering for vanished children,
//! the visibility timeout of reserved-ahead grants.

use super::*;

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
    queue_ack_and_pop(&mut t, first.receipt(), 0);
    let leaf_end = leaf_parent_end(&t);
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
fn requests_a_connected_leaf_does_not_answer_are_given_up_after_the_request_timeout() {
    // Goal: a leaf whose link is up but which does not answer (stuck, say, on a failing disk)
    // holds a pop and an ack for `request_timeout_ms`, not until the link dies; its late
    // answers are then handled: the late grant goes back, the late ack stands. Method: hold
    // back the reserve and the confirm on their way to the leaf, move the clock past the
    // timeout, then deliver them.
    let mut t = tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[1, 2]);
    let first = t.h.pop(t.consumer, "jobs", 1).remove(0);
    queue_ack_and_pop(&mut t, first.receipt(), 10_000);
    let leaf_end = leaf_parent_end(&t);
    // Deliver everything but the reserve and the confirm, which the leaf never sees.
    let mut held = Vec::new();
    loop {
        for index in 0..t.h.nodes.len() {
            t.h.drain(index);
        }
        let Some((to, msg)) = t.h.queue.pop_front() else {
            break;
        };
        match t.h.ends.get(&to) {
            _ if to == leaf_end && matches!(msg, Wire::Reserve(_) | Wire::Confirm(_)) => {
                held.push((to, msg))
            }
            Some((Owner::Node(index), _)) => t.h.nodes[*index].handle_message(t.h.now, to, msg),
            _ => t.h.inbox.get_mut(&to).unwrap().push_back(msg),
        }
    }
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(t.h.try_recv(t.consumer).is_none(), "both wait for the leaf");

    let timeout = Duration::from_millis(Settings::default().request_timeout_ms);
    t.h.advance(timeout + timeout / 4);
    let mut replies = Vec::new();
    while let Some(msg) = t.h.try_recv(t.consumer) {
        replies.push(msg);
    }
    assert!(
        replies.iter().any(|m| matches!(m,
            Wire::AckReply(r) if r.request == 90 && r.results == vec![Err(ReceiptError::TimedOut)])),
        "{replies:?}"
    );
    assert!(
        !replies.iter().any(|m| matches!(m, Wire::PopReply(_))),
        "the pop waits on for its long-poll: {replies:?}"
    );
    assert_eq!(root_counter(&mut t, "requests_timed_out"), 2);

    // The leaf answers at last: the ack is applied (a retry says so), the late grant is given
    // back and delivered to the waiting pop on its first attempt.
    for message in held {
        t.h.queue.push_back(message);
    }
    t.h.run();
    let Wire::PopReply(reply) = t.h.recv(t.consumer) else {
        panic!("the waiting pop is answered")
    };
    assert_eq!(reply.request, 91);
    assert_eq!(
        reply
            .deliveries
            .iter()
            .map(|d| (d.id, d.attempt))
            .collect::<Vec<_>>(),
        vec![(ids[1], 1)]
    );
    assert_eq!(
        t.h.ack(t.consumer, vec![first.receipt()]),
        vec![Err(ReceiptError::Settled)]
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

/// Queues, from the consumer, an ack of `receipt` (request 90) and then a pop of one "jobs"
/// message waiting up to `wait_ms` (request 91), without delivering them yet.
fn queue_ack_and_pop(t: &mut Tree, receipt: Receipt, wait_ms: u64) {
    let (_, root_end) = t.h.ends[&t.consumer];
    let ack = Ack {
        request: 90,
        op: Settle::Ack,
        receipts: vec![receipt],
    };
    t.h.queue.push_back((root_end, Wire::Ack(ack)));
    let pop = Pop {
        request: 91,
        topic: "jobs".into(),
        max: 1,
        wait_ms,
        ..Pop::default()
    };
    t.h.queue.push_back((root_end, Wire::Pop(pop)));
}

/// The first leaf's end of its link to its aggregator.
fn leaf_parent_end(t: &Tree) -> ConnId {
    *t.h.ends
        .iter()
        .find(|(_, (owner, peer))| {
            *owner == Owner::Node(t.leaves[0]) && t.h.ends[peer].0 == Owner::Node(t.aggs[0])
        })
        .map(|(end, _)| end)
        .expect("the leaf's parent link")
}
