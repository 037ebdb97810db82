//! Namespaces and permissions: leaves check `produce` on pushes, the root `consume` on pops
//! and `admin` on admin requests; receipts are bound to the principal they were delivered to.

use super::*;
use crate::access::{Grants, Principal};

/// A principal named `name` holding `grants` (`NAMESPACE:PERM,...` each).
fn principal(name: &str, grants: &[&str]) -> Principal {
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
    // Goal: the root refuses pops without `consume` and dead-letter operations without
    // `admin`, and lists in the stats of every topic only namespaces the principal holds
    // something in.
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
    // The refused pop took nothing: the billing message is still there, and the granted pop
    // gets its own namespace's.
    assert_eq!(t.h.pop(t.consumer, "billing/eu", 10).len(), 1);
    assert_eq!(t.h.pop(reader, "orders/eu", 10).len(), 1);
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
    let (c, n) = t.h.pair(Owner::Client, Owner::Node(t.root));
    t.h.inbox.insert(c, VecDeque::new());
    t.h.nodes[t.root].handle_connected(t.h.now, n, Link::Incoming);
    let grant = |t: &mut Tree, grants: &[&str]| {
        let principal = std::sync::Arc::new(principal("app", grants));
        t.h.nodes[t.root].handle_principal(n, principal);
    };
    grant(&mut t, &["orders:consume"]);
    t.h.send(
        c,
        Wire::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            token: None,
            peer: PeerKind::Consumer,
        }),
    );
    assert!(matches!(t.h.recv(c), Wire::Welcome(_)));
    grant(&mut t, &["orders:produce"]);
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
