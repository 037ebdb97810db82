//! Namespaces and permissions: leaves check `produce` on pushes, the root `consume` on pops
//! and `admin` on admin requests; receipts are bound to the principal they were delivered to.

use super::*;
use crate::access::{Grants, Principal};

/// A principal named `name` holding `grants` (`NAMESPACE:PERM,...` each).
pub(super) fn principal(name: &str, grants: &[&str]) -> Principal {
    let mut all = Grants::default();
    for grant in grants {
        let (namespace, permissions) = Grants::parse_one(grant).unwrap();
        all.add(&namespace, &permissions);
    }
    let mut receipt_key = [0u8; 16];
    receipt_key[..name.len().min(16)].copy_from_slice(&name.as_bytes()[..name.len().min(16)]);
    Principal {
        name: name.into(),
        grants: all,
        receipt_key: Some(receipt_key),
    }
}

/// A consumer connected to `node` as `principal`, welcomed: its end and the node's.
fn consumer_as(t: &mut Tree, node: usize, principal: Principal) -> (ConnId, ConnId) {
    let (c, n) = t.h.pair(Owner::Client, Owner::Node(node));
    t.h.inbox.insert(c, VecDeque::new());
    t.h.nodes[node].handle_connected(t.h.now, n, Link::Incoming);
    t.h.nodes[node].handle_principal(n, std::sync::Arc::new(principal));
    t.h.send(
        c,
        Wire::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            token: None,
            peer: PeerKind::Consumer,
        }),
    );
    assert!(matches!(t.h.recv(c), Wire::Welcome(_)));
    (c, n)
}

fn forbidden(reply: Wire) -> String {
    match reply {
        Wire::Error(error) if error.code == ErrorCode::Forbidden => error.message,
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

#[test]
fn a_push_into_a_namespace_without_produce_is_refused_whole_and_stores_nothing() {
    // Goal: a leaf refuses a batch with any message outside the principal's `produce`
    // namespaces, naming the namespace and permission, and keeps none of the batch.
    let mut t = tree(16);
    let orders = t.h.client_as(
        t.leaves[0],
        PeerKind::Producer,
        Some(principal("orders-app", &["orders:produce"])),
    );
    let ids = t.h.push(orders, "orders/eu", &[3]);
    assert_eq!(ids.len(), 1);
    let request = t.h.request();
    let batch = ["orders/eu", "billing/eu"]
        .map(|topic| PushMessage {
            topic: topic.into(),
            priority: 1,
            payload: Bytes::from_static(b"x"),
            ..PushMessage::default()
        })
        .to_vec();
    t.h.send(
        orders,
        Wire::Push(Push {
            request,
            messages: batch,
        }),
    );
    let text = forbidden(t.h.recv(orders));
    assert!(
        text.contains("\"orders-app\"") && text.contains("produce"),
        "{text}"
    );
    assert!(text.contains("\"billing\""), "{text}");
    // Topics without a namespace are in `default`, which it was not granted either.
    let request = t.h.request();
    t.h.send(
        orders,
        Wire::Push(Push {
            request,
            messages: vec![numbered(1)],
        }),
    );
    assert!(forbidden(t.h.recv(orders)).contains("\"default\""));
    // Only the first push is there.
    let delivered = t.h.pop(t.consumer, "orders/eu", 10);
    assert_eq!(delivered.iter().map(|d| d.id).collect::<Vec<_>>(), ids);
    assert!(t.h.pop(t.consumer, "billing/eu", 10).is_empty());
}

#[test]
fn pops_and_admin_requests_need_their_permission_on_the_topic_s_namespace() {
    // Goal: the root refuses pops without `consume` and dead-letter operations, purges, moves
    // and configurations without `admin`, and lists in the stats of every topic, and among
    // topic configurations, only namespaces the principal holds something in.
    let mut t = tree(16);
    t.h.push(t.producers[0], "orders/eu", &[1]);
    t.h.push(t.producers[1], "billing/eu", &[1]);
    let reader = t.h.client_as(
        t.root,
        PeerKind::Consumer,
        Some(principal("reader", &["orders:consume"])),
    );
    let request = t.h.request();
    t.h.send(
        reader,
        Wire::Pop(Pop {
            request,
            topic: "billing/eu".into(),
            max: 1,
            ..Pop::default()
        }),
    );
    let text = forbidden(t.h.recv(reader));
    assert!(
        text.contains("consume") && text.contains("\"billing\""),
        "{text}"
    );
    for op in [
        AdminOp::Purge {
            topic: "orders/eu".into(),
            ids: Vec::new(),
        },
        AdminOp::DeadLetters {
            topic: "orders/eu".into(),
            limit: 10,
            after: None,
        },
        AdminOp::Stats {
            topic: Some("billing/eu".into()),
        },
        AdminOp::PurgeTopic {
            topic: "orders/eu".into(),
        },
        AdminOp::MoveTopic {
            topic: "orders/eu".into(),
            to: "orders/us".into(),
        },
        AdminOp::Configure {
            topic: "orders/eu".into(),
            config: Box::new(TopicConfig::default()),
        },
    ] {
        let request = t.h.request();
        t.h.send(reader, Wire::Admin(Admin { request, op }));
        let text = forbidden(t.h.recv(reader));
        assert!(
            text.contains("admin") || text.contains("no permission in namespace \"billing\""),
            "{text}"
        );
    }
    let (orders, _) = stats_of(&mut t.h, reader, "orders/eu");
    assert_eq!(
        orders.ready_total(),
        1,
        "a topic's stats need any permission"
    );
    let AdminResult::Stats(stats) = admin(&mut t.h, reader, AdminOp::Stats { topic: None }) else {
        panic!("stats answer")
    };
    let topics: Vec<&str> = stats.topics.iter().map(|t| t.topic.as_str()).collect();
    assert_eq!(topics, ["orders/eu"]);
    // Configurations are listed only in namespaces the principal holds something in.
    for topic in ["orders/eu", "billing/eu"] {
        let op = AdminOp::Configure {
            topic: topic.into(),
            config: Box::new(TopicConfig::default()),
        };
        assert_eq!(admin(&mut t.h, t.consumer, op), AdminResult::Count(4));
    }
    let listing = AdminOp::Configs {
        prefix: String::new(),
        limit: 10,
        after: None,
        within: None,
    };
    let AdminResult::Configs { configs, .. } = admin(&mut t.h, reader, listing) else {
        panic!("a listing")
    };
    let names: Vec<&str> = configs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["orders/eu"]);
    // The refused pop took nothing: the billing message is still there, and the granted pop
    // gets its own namespace's.
    assert_eq!(t.h.pop(t.consumer, "billing/eu", 10).len(), 1);
    assert_eq!(t.h.pop(reader, "orders/eu", 10).len(), 1);
}

#[test]
fn a_listing_s_pages_and_cursors_name_only_configurations_the_principal_may_see() {
    // Goal: paging through topic configurations, neither a page nor its cursor names a topic
    // of a namespace the principal holds nothing in; one with no grants sees nothing, and
    // is told there is nothing more.
    let mut t = tree(16);
    let topics = [
        "apps/a",
        "billing/a",
        "billing/b",
        "orders/a",
        "zeta/a",
        "zeta/b",
    ];
    for topic in topics {
        let op = AdminOp::Configure {
            topic: topic.into(),
            config: Box::new(TopicConfig::default()),
        };
        assert_eq!(admin(&mut t.h, t.consumer, op), AdminResult::Count(4));
    }
    let page = |h: &mut Harness, who, after| {
        let op = AdminOp::Configs {
            prefix: String::new(),
            limit: 1,
            after,
            within: None,
        };
        match admin(h, who, op) {
            AdminResult::Configs { configs, next } => (
                configs
                    .into_iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
                next,
            ),
            other => panic!("a listing, got {other:?}"),
        }
    };
    let reader = t.h.client_as(
        t.root,
        PeerKind::Consumer,
        Some(principal("reader", &["orders:consume", "apps:produce"])),
    );
    let mut seen = Vec::new();
    let mut after = None;
    for _ in 0..topics.len() + 1 {
        let (names, next) = page(&mut t.h, reader, after.take());
        seen.extend(names);
        if let Some(cursor) = &next {
            assert!(
                cursor.starts_with("apps/") || cursor.starts_with("orders/"),
                "a cursor names {cursor}"
            );
        }
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["apps/a", "orders/a"]);
    let nobody =
        t.h.client_as(t.root, PeerKind::Consumer, Some(principal("nobody", &[])));
    assert_eq!(page(&mut t.h, nobody, None), (Vec::new(), None));
}

#[test]
fn one_namespace_holds_at_most_its_share_of_a_leaf_s_topics_and_configurations() {
    // Goal: a namespace at `namespace_topics_max` topics of a leaf is refused another
    // (`TopicLimit` naming the namespace and the setting) while other namespaces still get
    // theirs; the same for configurations past `namespace_topic_configs_max`, where a
    // deleted configuration of the namespace makes room.
    let mut t = tree_with(Settings {
        topics_max: 6,
        namespace_topics_max: 3,
        topic_configs_max: 6,
        namespace_topic_configs_max: 3,
        ..settings(16)
    });
    let producer = t.producers[0];
    for i in 0..3 {
        t.h.push(producer, &format!("noisy/t{i}"), &[1]);
    }
    let request = t.h.request();
    let one_more = PushMessage {
        topic: "noisy/t3".into(),
        priority: 1,
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    t.h.send(
        producer,
        Wire::Push(Push {
            request,
            messages: vec![one_more],
        }),
    );
    match t.h.recv(producer) {
        Wire::Error(error) if error.code == ErrorCode::TopicLimit => assert!(
            error.message.contains("namespace_topics_max") && error.message.contains("\"noisy\""),
            "{}",
            error.message
        ),
        other => panic!("expected TopicLimit, got {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(t.h.push(producer, &format!("quiet/t{i}"), &[1]).len(), 1);
    }
    let configure = |t: &mut Tree, topic: &str, deleted: bool| {
        let config = TopicConfig {
            deleted,
            ..TopicConfig::default()
        };
        let op = AdminOp::Configure {
            topic: topic.into(),
            config: Box::new(config),
        };
        admin(&mut t.h, t.consumer, op)
    };
    for i in 0..3 {
        let topic = format!("noisy/c{i}");
        assert_eq!(configure(&mut t, &topic, false), AdminResult::Count(4));
    }
    // No leaf keeps a fourth of the namespace; another namespace's goes in.
    assert_eq!(configure(&mut t, "noisy/c3", false), AdminResult::Count(0));
    assert_eq!(configure(&mut t, "quiet/c0", false), AdminResult::Count(4));
    // A deleted one of the namespace gives way (the root's clock orders configurations).
    t.h.advance(Duration::from_millis(1));
    assert_eq!(configure(&mut t, "noisy/c0", true), AdminResult::Count(4));
    assert_eq!(configure(&mut t, "noisy/c3", false), AdminResult::Count(4));
}

#[test]
fn a_receipt_can_be_settled_only_by_the_principal_it_was_delivered_to() {
    // Goal: another principal's ack, nack or extend of a receipt fails as `Stale` and changes
    // nothing; the holder's ack then succeeds. Also through the reserve-ahead buffer, whose
    // grants are leased before the root knows who will get them.
    for settings in [settings(16), ahead_settings()] {
        let mut t = tree_with(settings);
        let [alice, mallory] = ["alice", "mallory"].map(|name| {
            t.h.client_as(
                t.root,
                PeerKind::Consumer,
                Some(principal(name, &["*:consume"])),
            )
        });
        t.h.push(t.producers[0], "jobs", &[1, 2, 3]);
        let delivered = t.h.pop(alice, "jobs", 1);
        assert_eq!(delivered.len(), 1);
        let receipt = delivered[0].receipt();
        for op in [
            Settle::Extend { lease_ms: 60_000 },
            Settle::Nack {
                delay_ms: 0,
                reason: None,
            },
            Settle::Ack,
        ] {
            assert_eq!(
                t.h.settle(mallory, op, vec![receipt]),
                [Err(ReceiptError::Stale)]
            );
        }
        // Still leased to alice: nobody else is given it, and her ack holds.
        let others: Vec<MessageId> = t.h.pop(mallory, "jobs", 10).iter().map(|d| d.id).collect();
        assert!(!others.contains(&receipt.id), "{others:?}");
        assert_eq!(t.h.ack(alice, vec![receipt]), [Ok(())]);
    }
}

#[test]
fn grants_changed_on_a_live_connection_apply_to_its_next_request() {
    // Goal: the host hands a connection's principal again when the access file changes; the
    // machine checks the next request against the new grants.
    let mut t = tree(16);
    t.h.push(t.producers[0], "orders/eu", &[1]);
    let root = t.root;
    let (c, n) = consumer_as(&mut t, root, principal("app", &["orders:consume"]));
    let principal = std::sync::Arc::new(principal("app", &["orders:produce"]));
    t.h.nodes[t.root].handle_principal(n, principal);
    let request = t.h.request();
    t.h.send(
        c,
        Wire::Pop(Pop {
            request,
            topic: "orders/eu".into(),
            max: 1,
            ..Pop::default()
        }),
    );
    assert!(forbidden(t.h.recv(c)).contains("consume"));
}

#[test]
fn a_principal_whose_consume_grant_is_revoked_settles_nothing_it_still_holds() {
    // Goal: once the access file no longer grants `consume` in a namespace, receipts the
    // principal still holds there extend, nack and ack nothing, through the root or at the
    // leaf directly (`Forbidden`); granted again, its ack holds.
    let mut t = tree(16);
    t.h.push(t.producers[0], "orders/eu", &[1, 2]);
    let connect =
        |t: &mut Tree, node: usize| consumer_as(t, node, principal("app", &["orders:consume"]));
    let root_node = t.root;
    let root = connect(&mut t, root_node);
    let delivered = t.h.pop(root.0, "orders/eu", 2);
    assert_eq!(delivered.len(), 2);
    let [first, second] = [delivered[0].receipt(), delivered[1].receipt()];
    // Leaf `i` of the tree is LeafId(i + 1).
    let owner = t.leaves[usize::from(first.id.leaf().0) - 1];
    assert_eq!(second.id.leaf(), first.id.leaf());
    let leaf = connect(&mut t, owner);
    let grant = |t: &mut Tree, (_, n): (ConnId, ConnId), node: usize, grants: &[&str]| {
        t.h.nodes[node].handle_principal(n, std::sync::Arc::new(principal("app", grants)));
    };
    grant(&mut t, root, root_node, &["orders:produce"]);
    grant(&mut t, leaf, owner, &["orders:produce"]);
    for op in [
        Settle::Extend {
            lease_ms: 12 * 3_600_000,
        },
        Settle::Nack {
            delay_ms: 0,
            reason: None,
        },
        Settle::Ack,
    ] {
        for conn in [root.0, leaf.0] {
            let results = t.h.settle(conn, op.clone(), vec![first, second]);
            assert_eq!(results, [Err(ReceiptError::Forbidden); 2], "{op:?}");
        }
    }
    grant(&mut t, root, root_node, &["orders:consume"]);
    grant(&mut t, leaf, owner, &["orders:consume"]);
    assert_eq!(t.h.ack(root.0, vec![first]), [Ok(())]);
    assert_eq!(t.h.settle(leaf.0, Settle::Ack, vec![second]), [Ok(())]);
}

fn overloaded(reply: Wire) -> String {
    match reply {
        Wire::Error(error) if error.code == ErrorCode::Overloaded => error.message,
        other => panic!("expected Overloaded, got {other:?}"),
    }
}

fn long_poll(topic: &str, request: u64) -> Wire {
    Wire::Pop(Pop {
        request,
        topic: topic.into(),
        max: 1,
        wait_ms: 10_000,
        ..Pop::default()
    })
}

#[test]
fn one_principal_cannot_hold_more_than_its_share_of_waiting_pops_and_requests() {
    // Goal: `principal_pops_max` bounds one principal's long-polls at the root and
    // `principal_requests_max` its acks waiting on leaves; the refusal is `Overloaded`
    // naming the setting, other principals are unaffected, and a slot freed is usable again.
    let mut t = tree_with(Settings {
        principal_pops_max: 2,
        principal_requests_max: 2,
        ..settings(16)
    });
    let [greedy, other] = ["greedy", "other"].map(|name| {
        t.h.client_as(
            t.root,
            PeerKind::Consumer,
            Some(principal(name, &["*:consume"])),
        )
    });
    let requests: Vec<u64> = (0..3).map(|_| t.h.request()).collect();
    for request in &requests {
        t.h.send(greedy, long_poll("empty", *request));
    }
    let text = overloaded(t.h.recv(greedy));
    assert!(
        text.contains("principal_pops_max") && text.contains("\"greedy\""),
        "{text}"
    );
    // Another principal still waits; a push answers the first waiting pops.
    let request = t.h.request();
    t.h.send(other, long_poll("empty", request));
    assert!(t.h.try_recv(other).is_none(), "waiting");
    t.h.push(t.producers[0], "empty", &[1, 1, 1]);
    let answered = (0..2)
        .map(|_| t.h.recv(greedy))
        .filter(|w| matches!(w, Wire::PopReply(r) if r.deliveries.len() == 1))
        .count();
    assert_eq!(answered, 2);
    assert!(matches!(t.h.recv(other), Wire::PopReply(_)));
    // Its slots are free again.
    let request = t.h.request();
    t.h.send(greedy, long_poll("empty", request));
    assert!(t.h.try_recv(greedy).is_none(), "admitted and waiting");

    // Acks: three sent before any leaf answers; the third is over the cap.
    let mut t = tree_with(Settings {
        principal_requests_max: 2,
        ..settings(16)
    });
    let greedy = t.h.client_as(
        t.root,
        PeerKind::Consumer,
        Some(principal("greedy", &["*:consume"])),
    );
    t.h.push(t.producers[0], "jobs", &[1, 2, 3]);
    let receipts: Vec<Receipt> =
        t.h.pop(greedy, "jobs", 3)
            .iter()
            .map(|d| d.receipt())
            .collect();
    for receipt in &receipts {
        let request = t.h.request();
        t.h.send_later(
            greedy,
            Wire::Ack(Ack {
                request,
                op: Settle::Ack,
                receipts: vec![*receipt],
            }),
        );
    }
    t.h.run();
    let replies: Vec<Wire> = (0..3).map(|_| t.h.recv(greedy)).collect();
    let refused: Vec<String> = replies
        .iter()
        .filter_map(|w| match w {
            Wire::Error(e) if e.code == ErrorCode::Overloaded => Some(e.message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{replies:?}");
    assert!(refused[0].contains("principal_requests_max"), "{refused:?}");
    // The refused ack changed nothing: its message is still leased, and acking it now works.
    let last = receipts
        .iter()
        .find(|r| t.h.ack(greedy, vec![**r]) == [Ok(())])
        .copied();
    assert!(last.is_some(), "one receipt was left to ack");
}

/// A leaf whose log writes are held (not handed to the harness) while `stalled` is set.
struct Stalled {
    inner: Box<dyn Machine>,
    now: Time,
    held: VecDeque<crate::machine::StorageOp>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Machine for Stalled {
    inputs_noting_now!();
    pass_through!();
    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        self.inner.handle_storage_done(now, done)
    }
    fn poll_storage(&mut self) -> Option<crate::machine::StorageOp> {
        while let Some(op) = self.inner.poll_storage() {
            self.held.push_back(op);
        }
        if self.stalled.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.held.pop_front()
    }
}

#[test]
fn one_principal_cannot_hold_more_than_its_share_of_pushes_waiting_for_the_log() {
    // Goal: `principal_requests_max` bounds one principal's push batches waiting at a leaf
    // for its log; the refused batch stores nothing; another principal is unaffected.
    let mut h = Harness::new();
    let settings = Settings {
        principal_requests_max: 2,
        ..settings(16)
    };
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let root = h.add(root_node(settings.clone(), vec![LeafId(1)]));
    let leaf = h.add(Box::new(Stalled {
        inner: Box::new(Leaf::new(LeafConfig {
            name: "leaf-1".into(),
            id: LeafId(1),
            settings,
            token_key: token_key_from_seed(1),
            first_seq: 1,
        })),
        now: Time::ZERO,
        held: VecDeque::new(),
        stalled: stalled.clone(),
    }));
    h.link(leaf, root);
    let [greedy, other] = ["greedy", "other"].map(|name| {
        h.client_as(
            leaf,
            PeerKind::Producer,
            Some(principal(name, &["*:produce"])),
        )
    });
    stalled.store(true, std::sync::atomic::Ordering::Relaxed);
    let push = |h: &mut Harness, from: ConnId, payload: &'static str| {
        let request = h.request();
        let message = PushMessage {
            topic: "jobs".into(),
            payload: Bytes::from_static(payload.as_bytes()),
            ..PushMessage::default()
        };
        h.send(
            from,
            Wire::Push(Push {
                request,
                messages: vec![message],
            }),
        );
    };
    for payload in ["one", "two", "three"] {
        push(&mut h, greedy, payload);
    }
    let text = overloaded(h.recv(greedy));
    assert!(
        text.contains("principal_requests_max") && text.contains("push batches"),
        "{text}"
    );
    push(&mut h, other, "other");
    assert!(
        h.try_recv(other).is_none(),
        "waiting for the log, not refused"
    );
    stalled.store(false, std::sync::atomic::Ordering::Relaxed);
    h.run();
    for _ in 0..2 {
        assert!(matches!(h.recv(greedy), Wire::PushAck(_)));
    }
    assert!(matches!(h.recv(other), Wire::PushAck(_)));
    let consumer = h.client(root, PeerKind::Consumer);
    let payloads: Vec<Bytes> = h
        .pop(consumer, "jobs", 10)
        .into_iter()
        .map(|d| d.payload)
        .collect();
    assert_eq!(payloads.len(), 3, "{payloads:?}");
    assert!(!payloads.contains(&Bytes::from_static(b"three")));
}

#[test]
fn a_consumer_settles_at_the_owning_leaf_directly_with_its_principal_s_receipts() {
    // Goal: acks, nacks and extends sent to the leaf that owns the message, not through the
    // root, settle it exactly as through the root: bound to the principal it was delivered to
    // (another principal's is `Stale`), a receipt of another leaf `UnknownLeaf`, a bad request
    // refused by name; an ack applied there is `Settled` when repeated through the root.
    let mut t = tree(16);
    let alice_principal = principal("alice", &["*:consume"]);
    let alice =
        t.h.client_as(t.root, PeerKind::Consumer, Some(alice_principal.clone()));
    let at_leaf =
        t.h.client_as(t.leaves[0], PeerKind::Consumer, Some(alice_principal));
    let mallory = t.h.client_as(
        t.leaves[0],
        PeerKind::Consumer,
        Some(principal("mallory", &["*:consume"])),
    );
    let mine = t.h.push(t.producers[0], "jobs", &[1, 2, 3]);
    let other = t.h.push(t.producers[1], "jobs", &[9]);
    let delivered = t.h.pop(alice, "jobs", 4);
    assert_eq!(delivered.len(), 4);
    let receipt = |id: MessageId| delivered.iter().find(|d| d.id == id).unwrap().receipt();
    let first = receipt(mine[0]);
    assert_eq!(
        t.h.settle(mallory, Settle::Ack, vec![first]),
        [Err(ReceiptError::Stale)]
    );
    let before = t.h.nodes[t.leaves[0]].stats().messages;
    assert_eq!(
        t.h.ack(at_leaf, vec![first, receipt(other[0])]),
        [Ok(()), Err(ReceiptError::UnknownLeaf)]
    );
    assert_eq!(t.h.nodes[t.leaves[0]].stats().messages, before - 1);
    assert_eq!(t.h.ack(alice, vec![first]), [Err(ReceiptError::Settled)]);
    // An extend and a nack there too: the nacked message is delivered again.
    let extend = Settle::Extend { lease_ms: 60_000 };
    assert_eq!(
        t.h.settle(at_leaf, extend, vec![receipt(mine[1])]),
        [Ok(())]
    );
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: None,
    };
    assert_eq!(t.h.settle(at_leaf, nack, vec![receipt(mine[2])]), [Ok(())]);
    let again: Vec<MessageId> = t.h.pop(alice, "jobs", 4).iter().map(|d| d.id).collect();
    assert_eq!(again, [mine[2]]);
    // An empty ack is refused, naming the bound.
    let request = t.h.request();
    t.h.send(
        at_leaf,
        Wire::Ack(Ack {
            request,
            op: Settle::Ack,
            receipts: Vec::new(),
        }),
    );
    match t.h.recv(at_leaf) {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains("pop_messages_max"), "{error:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
