//! Peers that send what they should not: each is refused with a typed error, counted as a
//! protocol violation, and changes nothing.

use super::*;
use crate::key::Key;

/// An offer of one entry of `leaf`'s on `topic`.
fn offer_of(topic: &str, leaf: u16) -> Wire {
    let entry = crate::wire::OfferEntry {
        key: Key::new(0, Time::ZERO, MessageId::new(LeafId(leaf), 1)),
        size: 1,
        since: Time::ZERO,
        entered: Time::ZERO,
    };
    Wire::Offer(Offer {
        topic: topic.into(),
        adds: vec![entry],
        retracts: Vec::new(),
        frontier: None,
        seq: 1,
    })
}

#[test]
fn a_child_s_offer_of_another_subtree_s_message_or_a_bad_topic_is_refused() {
    // Goal: a parent applies nothing of an offer whose entries belong to leaves the child does
    // not lead to (their reserves and acks would go to the wrong subtree) or whose topic is
    // not a valid name. Method: a child of the root that leads to leaf 1 offers a message of
    // leaf 3, then one on an empty topic and one with a newline; the same at an aggregator.
    let mut t = tree(4);
    for (node, leaves) in [
        (t.root, vec![LeafId(1), LeafId(2)]),
        (t.aggs[1], vec![LeafId(3)]),
    ] {
        let own = leaves[0].0;
        let other = if own == 1 { 3 } else { 1 };
        let child = t.h.client(
            node,
            PeerKind::Node {
                name: if node == t.root { "agg-0" } else { "leaf-3" }.into(),
                role: if node == t.root {
                    Role::Aggregator
                } else {
                    Role::Leaf
                },
                leaves,
                replica: None,
            },
        );
        let before = t.h.nodes[node].stats();
        for (offer, says) in [
            (offer_of("jobs", other), "does not lead to"),
            (offer_of("", own), "topic is empty"),
            (offer_of("a\nb", own), "whitespace or control"),
            (offer_of("jobs\u{1}x:1", own), "nor a lane of one"),
            (offer_of("jobs\u{1}4:0", own), "nor a lane of one"),
            (offer_of("\u{1}4:500", own), "topic is empty"),
            (
                offer_of("jobs\u{1}4:500\u{1}1000:", own),
                "nor a lane of one",
            ),
            (offer_of("jobs\u{1}4:500\u{1}0:k", own), "nor a lane of one"),
            (
                offer_of("jobs\u{1}4:500\u{1}1000:a\tb", own),
                "control character",
            ),
        ] {
            t.h.send(child, offer);
            let Wire::Error(error) = t.h.recv(child) else {
                panic!("a refusal")
            };
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains(says), "{}", error.message);
        }
        let after = t.h.nodes[node].stats();
        assert_eq!(after.violations, before.violations + 9);
        assert_eq!(
            after.window_entries, before.window_entries,
            "nothing applied"
        );
    }
}

#[test]
fn a_child_cannot_make_its_parent_hold_more_topics_than_the_leaves_below_may() {
    // Goal: a parent holds a window per topic its children offer; a child offering ever new
    // topics is refused past `topics_max` per leaf of the parent's subtree, so the windows
    // stay bounded. Method: topics_max 2 and an aggregator of two leaves: a rogue leaf-3 offers
    // four topics, the fifth is refused, and an offer on a topic already held still applies.
    let mut t = tree_with(Settings {
        topics_max: 2,
        ..Settings::default()
    });
    let node = t.aggs[1];
    let child = t.h.client(
        node,
        PeerKind::Node {
            name: "leaf-3".into(),
            role: Role::Leaf,
            leaves: vec![LeafId(3)],
            replica: None,
        },
    );
    let before = t.h.nodes[node].stats();
    for topic in ["a", "b", "c", "d"] {
        t.h.send(child, offer_of(topic, 3));
    }
    t.h.send(child, offer_of("e", 3));
    let Wire::Error(error) = t.h.recv(child) else {
        panic!("a refusal")
    };
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert!(error.message.contains("past 4 topics"), "{}", error.message);
    let after = t.h.nodes[node].stats();
    assert_eq!(after.violations, before.violations + 1);
    assert_eq!(after.window_entries, before.window_entries + 4);
    // The lanes of a weighted topic held count as one topic: more lanes of "a" apply (its
    // first lane made it weighted), up to twice the most tiers a topic has.
    let lane = |tier: usize| format!("a\u{1}{tier}:1000");
    for tier in 0..2 * crate::config::TIERS_MAX {
        t.h.send(child, offer_of(&lane(tier), 3));
    }
    t.h.send(child, offer_of(&lane(1000), 3));
    let Wire::Error(error) = t.h.recv(child) else {
        panic!("a refusal")
    };
    assert!(
        error.message.contains("past 128 tier lanes"),
        "{}",
        error.message
    );
    let last = t.h.nodes[node].stats();
    assert_eq!(last.violations, after.violations + 1);
    assert_eq!(
        last.window_entries,
        after.window_entries + 2 * crate::config::TIERS_MAX as u64
    );
    // Fairness keys' lanes: at most `fairness_keys_max` per leaf below, twice (the
    // aggregator leads to two leaves: 4 × 64 × 2).
    let keys_max = 2 * Settings::default().fairness_keys_max as usize * 2;
    let key_lane = |key: usize| format!("a\u{1}0:1000\u{1}1000:k{key}");
    for key in 0..keys_max {
        t.h.send(child, offer_of(&key_lane(key), 3));
    }
    t.h.send(child, offer_of(&key_lane(keys_max), 3));
    let Wire::Error(error) = t.h.recv(child) else {
        panic!("a refusal")
    };
    assert!(
        error
            .message
            .contains(&format!("past {keys_max} fairness key lanes")),
        "{}",
        error.message
    );
    let end = t.h.nodes[node].stats();
    assert_eq!(end.violations, last.violations + 1);
}

#[test]
fn a_child_cannot_answer_for_a_request_that_went_to_another() {
    // Goal: the root takes a leaf's answer (`Confirmed`, `LeafAdminReply`, `Reserved`) only
    // from the connection its request went on, so a compromised node cannot settle or list
    // for a subtree not its own. Method: a root over two node children, one leading to leaf
    // 1 and one to leaf 2; a consumer acks a receipt of leaf 1's and asks for leaf 1's dead
    // letters; the child of leaf 2 answers both requests first (each a violation that
    // changes nothing), then the child of leaf 1 does, and its answers are the ones the
    // consumer gets.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1), LeafId(2)]));
    let child = |h: &mut Harness, name: &str, leaf: u16| {
        let peer = PeerKind::Node {
            name: name.into(),
            role: Role::Leaf,
            leaves: vec![LeafId(leaf)],
            replica: None,
        };
        let conn = h.client(root, peer);
        while h.try_recv(conn).is_some() {}
        conn
    };
    let owner = child(&mut h, "leaf-1", 1);
    let rogue = child(&mut h, "leaf-2", 2);
    let consumer = h.client(root, PeerKind::Consumer);
    let receipt = Receipt {
        id: MessageId::new(LeafId(1), 7),
        token: 1,
    };
    let request = h.request();
    h.send(
        consumer,
        Wire::Ack(Ack {
            request,
            op: Settle::Ack,
            receipts: vec![receipt],
        }),
    );
    let Wire::Confirm(confirm) = h.recv(owner) else {
        panic!("a confirm to leaf 1's child")
    };
    let before = h.nodes[root].stats();
    let forged = Confirmed {
        tag: confirm.tag,
        results: vec![Ok(())],
    };
    h.send(rogue, Wire::Confirmed(forged));
    assert!(h.try_recv(consumer).is_none(), "no answer from the rogue");
    assert_eq!(h.nodes[root].stats().violations, before.violations + 1);
    let stale = Confirmed {
        tag: confirm.tag,
        results: vec![Err(ReceiptError::Stale)],
    };
    h.send(owner, Wire::Confirmed(stale));
    let Wire::AckReply(reply) = h.recv(consumer) else {
        panic!("an ack reply")
    };
    assert_eq!(reply.results, vec![Err(ReceiptError::Stale)]);

    // The same for an admin request's leaf answers.
    let request = h.request();
    h.send(
        consumer,
        Wire::Admin(crate::wire::Admin {
            request,
            op: AdminOp::DeadLetters {
                topic: "jobs".into(),
                after: None,
                limit: 10,
            },
        }),
    );
    let Wire::LeafAdmin(asked) = h.recv(owner) else {
        panic!("a leaf admin request to leaf 1's child")
    };
    let before = h.nodes[root].stats();
    let listing = |tag| {
        Wire::LeafAdminReply(crate::wire::LeafAdminReply {
            tag,
            result: Some(AdminResult::DeadLetters(Vec::new())),
            more: false,
        })
    };
    // The listing goes to every leaf: the rogue answers its own part, and leaf 1's.
    let Wire::LeafAdmin(own) = h.recv(rogue) else {
        panic!("a leaf admin request to leaf 2's child")
    };
    h.send(rogue, listing(own.tag));
    h.send(rogue, listing(asked.tag));
    assert!(
        h.try_recv(consumer).is_none(),
        "no answer: leaf 1's part is missing"
    );
    assert_eq!(h.nodes[root].stats().violations, before.violations + 1);
    h.send(owner, listing(asked.tag));
    assert!(matches!(h.recv(consumer), Wire::AdminReply(_)));
}
