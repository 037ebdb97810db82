//! Delivery semantics at the machines: leases and stale receipts, typed refusals, long-poll,
//! vanished consumers, admin, delays of days and times to live.

use super::*;

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
        vec![Err(ReceiptError::Settled)]
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

    let root = replace_root(&mut t, settings(3));
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
    let (config, root, first, leaf_end, log) = recorded_leaf_with(&mut h, leaf_settings);
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
            after: None,
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

#[test]
fn lease_tokens_of_100_000_deliveries_show_no_relation() {
    // Goal: a receipt is the only proof of a lease, so no number of receipts may tell anything
    // about another. Method: 100,000 deliveries from one leaf; their tokens are all different,
    // each bit is set about half the time, and the attack that breaks a splitmix64 generator
    // (invert its output function to get its state, step it) predicts none of them.
    use std::collections::HashSet;
    let mut h = Harness::new();
    let root = h.add(root_node(settings(64), vec![LeafId(1)]));
    let node = h.add(leaf(1, 64));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let mut tokens = Vec::new();
    for _ in 0..100 {
        h.push(producer, "jobs", &[1; 1000]);
        loop {
            let deliveries = h.pop(consumer, "jobs", 1000);
            if deliveries.is_empty() {
                break;
            }
            tokens.extend(deliveries.iter().map(|d| d.token));
            let receipts = deliveries.iter().map(Delivery::receipt).collect();
            assert!(h.ack(consumer, receipts).iter().all(Result::is_ok));
        }
    }
    assert_eq!(tokens.len(), 100_000);
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), 100_000, "no two tokens equal");
    for bit in 0..64 {
        let set = tokens.iter().filter(|t| *t >> bit & 1 == 1).count();
        assert!(
            (49_000..=51_000).contains(&set),
            "bit {bit} set {set} times"
        );
    }
    let predicted = |tokens: &[u64]| {
        let next: HashSet<u64> = tokens
            .iter()
            .map(|t| SplitMix64::new(splitmix_state(*t)).next_u64())
            .collect();
        tokens.iter().filter(|t| next.contains(t)).count()
    };
    // The attack works: on a splitmix64 stream it predicts every token but the first.
    let mut weak = SplitMix64::new(7);
    let weak: Vec<u64> = (0..1000).map(|_| weak.next_u64()).collect();
    assert_eq!(predicted(&weak), 999);
    assert_eq!(predicted(&tokens), 0, "no token follows from another");
}

/// The state a splitmix64 generator holds once it drew `output` (its output function is a
/// bijection: each xor-shift and odd multiplier undone in turn).
fn splitmix_state(output: u64) -> u64 {
    fn inverse(odd: u64) -> u64 {
        // Newton's iteration: each step doubles the correct low bits (3 → 96).
        let mut x = odd;
        for _ in 0..5 {
            x = x.wrapping_mul(2u64.wrapping_sub(odd.wrapping_mul(x)));
        }
        x
    }
    let unshift = |z: u64, s: u32| {
        let mut x = z;
        let mut shift = s;
        while shift < 64 {
            x ^= z >> shift;
            shift += s;
        }
        x
    };
    let mut z = unshift(output, 31);
    z = z.wrapping_mul(inverse(0x94d0_49bb_1331_11eb));
    z = unshift(z, 27);
    z = z.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9));
    unshift(z, 30)
}

#[test]
fn a_dead_letter_listing_larger_than_a_frame_comes_in_pages_none_missing_or_repeated() {
    // Goal: an admin answer merged from several leaves never passes the frame limit (it was
    // dropped), and a client can page through all of it. Method: 1.25 MiB frames; 40 dead
    // letters of 60 KiB over four leaves (2.4 MiB); list them 100 at a time `after` the last.
    let mut settings = settings(4);
    settings.frame_bytes_max = 1280 * 1024;
    settings.push_batch_bytes_max = 256 * 1024;
    settings.payload_bytes_max = 64 * 1024;
    settings.max_attempts = 1;
    settings.validate().unwrap();
    let mut t = tree_with(settings.clone());
    let body = Bytes::from(vec![b'x'; 60 * 1024]);
    let mut dead = HashSet::new();
    for producer in t.producers {
        for _ in 0..10 {
            let message = PushMessage {
                topic: "jobs".into(),
                priority: 1,
                payload: body.clone(),
                ..PushMessage::default()
            };
            dead.insert(t.h.push_messages(producer, vec![message])[0]);
        }
    }
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: Some("broken".into()),
    };
    loop {
        let got = t.h.pop(t.consumer, "jobs", 8);
        if got.is_empty() {
            break;
        }
        let receipts = got.iter().map(Delivery::receipt).collect();
        assert!(
            t.h.settle(t.consumer, nack.clone(), receipts)
                .iter()
                .all(Result::is_ok)
        );
    }
    let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        let request = t.h.request();
        let op = AdminOp::DeadLetters {
            topic: "jobs".into(),
            limit: 100,
            after,
        };
        t.h.send(t.consumer, Wire::Admin(Admin { request, op }));
        let reply = t.h.recv(t.consumer);
        let mut frame = Vec::new();
        crate::frame::encode_frame(&reply, settings.frame_bytes_max, &mut frame)
            .expect("the answer fits one frame");
        let Wire::AdminReply(reply) = reply else {
            panic!("an admin answer")
        };
        let AdminResult::DeadLetters(page) = reply.result else {
            panic!("dead letters")
        };
        pages += 1;
        assert!(!page.is_empty() || !reply.more);
        after = page.last().map(|d| (d.dead_at, d.id));
        listed.extend(page);
        if !reply.more {
            break;
        }
    }
    assert!(pages >= 2, "2.4 MiB in 1.25 MiB frames: {pages} pages");
    let keys: Vec<(Time, MessageId)> = listed.iter().map(|d| (d.dead_at, d.id)).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
    let ids: HashSet<MessageId> = listed.iter().map(|d| d.id).collect();
    assert_eq!(ids, dead, "every dead letter listed");
    assert!(
        listed
            .iter()
            .all(|d| d.payload == body && d.reason == "broken")
    );
}

#[test]
fn purging_a_topic_deletes_its_ready_and_delayed_messages_in_bounded_steps_and_for_good() {
    // Goal: `PurgeTopic` deletes the ready and delayed messages of one topic (leased ones and
    // dead letters stay, other topics untouched), at most `purge_batch_messages` per request,
    // and a leaf rebuilt from its log does not bring them back. Method: one leaf with a
    // recorded log, a purge batch of 3; ready, delayed, leased and dead messages; purge until
    // a request deletes none; rebuild.
    let mut leaf_settings = settings(4);
    leaf_settings.purge_batch_messages = 3;
    leaf_settings.topics.insert(
        "jobs".into(),
        crate::config::TopicSettings {
            max_attempts: Some(1),
            ..Default::default()
        },
    );
    let mut h = Harness::new();
    let (config, root, first, leaf_end, log) = recorded_leaf_with(&mut h, leaf_settings);
    let producer = h.client(first, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let dead = h.push(producer, "jobs", &[0])[0];
    let got = h.pop(consumer, "jobs", 1);
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: None,
    };
    assert_eq!(
        h.settle(consumer, nack, vec![got[0].receipt()]),
        vec![Ok(())]
    );
    let leased = h.push(producer, "jobs", &[0])[0];
    let held = h.pop(consumer, "jobs", 1);
    assert_eq!(held[0].id, leased);
    h.push(producer, "jobs", &[1, 2, 3, 4]);
    let delayed = || PushMessage {
        topic: "jobs".into(),
        priority: 1,
        delay_ms: 60_000,
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    h.push_messages(producer, vec![delayed(), delayed()]);
    let kept = h.push(producer, "other", &[1, 2]);
    let (before, _) = stats_of(&mut h, consumer, "jobs");
    assert_eq!(
        (
            before.ready_total(),
            before.delayed,
            before.in_flight,
            before.dead
        ),
        (4, 2, 1, 1)
    );

    let mut counts = Vec::new();
    loop {
        let AdminResult::Count(count) = admin(
            &mut h,
            consumer,
            AdminOp::PurgeTopic {
                topic: "jobs".into(),
            },
        ) else {
            panic!("a count")
        };
        counts.push(count);
        if count == 0 {
            break;
        }
    }
    assert_eq!(
        counts,
        vec![3, 3, 0],
        "three at most per request, six in all"
    );
    let (after, totals) = stats_of(&mut h, consumer, "jobs");
    assert_eq!(
        (
            after.ready_total(),
            after.delayed,
            after.in_flight,
            after.dead
        ),
        (0, 0, 1, 1),
        "the lease and the dead letter stay"
    );
    assert_eq!(totals.expired, 0, "a purge is not an expiry");
    assert!(h.pop(consumer, "jobs", 10).is_empty());
    assert_eq!(h.ack(consumer, vec![held[0].receipt()]), vec![Ok(())]);
    h.advance(Duration::from_secs(61));
    assert!(
        h.pop(consumer, "jobs", 10).is_empty(),
        "the delayed are gone too"
    );

    h.disconnect(leaf_end);
    let operations = crate::machine::replay(&log.lock().unwrap());
    let rebuilt = h.add(Box::new(Leaf::recover(config, h.now, operations)));
    h.link(rebuilt, root);
    let (rebuilt_jobs, _) = stats_of(&mut h, consumer, "jobs");
    assert_eq!(
        (
            rebuilt_jobs.ready_total(),
            rebuilt_jobs.delayed,
            rebuilt_jobs.dead
        ),
        (0, 0, 1),
        "purged messages stay deleted; {dead} stays dead"
    );
    let others: Vec<MessageId> = h.pop(consumer, "other", 10).iter().map(|d| d.id).collect();
    assert_eq!(others, kept, "another topic is untouched");
}

#[test]
fn stats_give_each_priority_s_longest_waiting_ready_message_over_the_leaves() {
    let mut t = tree(4);
    let start = t.h.now;
    // Priority 5 waits since the start on leaf 2; priority 1 since 10 ms on leaf 1, and a
    // later one on leaf 2 does not make it younger.
    t.h.push(t.producers[1], "aged", &[5]);
    t.h.advance(Duration::from_millis(10));
    t.h.push(t.producers[0], "aged", &[1]);
    t.h.advance(Duration::from_millis(10));
    t.h.push(t.producers[1], "aged", &[1, 5]);
    let (stats, _) = stats_of(&mut t.h, t.consumer, "aged");
    let ms = |n: u64| start + Duration::from_millis(n);
    assert_eq!(stats.oldest_ready, vec![(1, ms(10)), (5, start)]);

    // Once the oldest of priority 1 leaves, the next one is the oldest.
    let got = t.h.pop(t.consumer, "aged", 1);
    assert_eq!(got[0].priority, 1);
    let (stats, _) = stats_of(&mut t.h, t.consumer, "aged");
    assert_eq!(stats.oldest_ready, vec![(1, ms(20)), (5, start)]);
    // A leased message is not waiting: with every priority-1 message out, no pair for it.
    t.h.pop(t.consumer, "aged", 1);
    let (stats, _) = stats_of(&mut t.h, t.consumer, "aged");
    assert_eq!(stats.oldest_ready, vec![(5, start)]);
}

/// Replaces the tree's root with a fresh one with `settings` (the aggregators' links and the
/// consumer's connection to the old one end; the aggregators link to the new one): a root's
/// restart. Answers the new root.
pub(super) fn replace_root(t: &mut Tree, settings: Settings) -> usize {
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
    let root = t.h.add(root_node(settings, all));
    for agg in t.aggs {
        t.h.link(agg, root);
    }
    root
}
