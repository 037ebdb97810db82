//! Topic configurations kept by the tree: set at run time, applied by the leaves, logged,
//! listed newest first, healed on leaves that missed them; dead-letter topics and moves.

use super::*;
use crate::config::TopicSettings;

pub(super) fn configure(h: &mut Harness, client: ConnId, topic: &str, config: TopicConfig) -> u64 {
    let op = AdminOp::Configure {
        topic: topic.into(),
        config: Box::new(config),
    };
    let request = h.request();
    h.send(client, Wire::Admin(Admin { request, op }));
    match h.recv(client) {
        Wire::AdminReply(AdminReply {
            result: AdminResult::Count(kept),
            ..
        }) => kept,
        other => panic!("configure failed: {other:?}"),
    }
}

fn configs(h: &mut Harness, client: ConnId, prefix: &str) -> Vec<(String, TopicConfig)> {
    let op = AdminOp::Configs {
        prefix: prefix.into(),
        limit: 100,
        after: None,
        within: None,
    };
    match admin(h, client, op) {
        AdminResult::Configs { configs, next } => {
            assert_eq!(next, None, "one page");
            configs
        }
        other => panic!("a listing: {other:?}"),
    }
}

/// A configuration routing `topic`'s messages to `dead` after `attempts` deliveries.
fn routing(attempts: u32, dead: &str) -> TopicConfig {
    TopicConfig {
        settings: TopicSettings {
            max_attempts: Some(attempts),
            dead_letter_topic: Some(dead.into()),
            ..TopicSettings::default()
        },
        attributes: [("owner".to_string(), "team-a".to_string())].into(),
        ..TopicConfig::default()
    }
}

/// Nacks the one message of `topic` `times` times.
fn fail(h: &mut Harness, consumer: ConnId, topic: &str, times: u32) {
    for _ in 0..times {
        let got = h.pop(consumer, topic, 1);
        assert_eq!(got.len(), 1, "{topic} has its message");
        let nack = Settle::Nack {
            delay_ms: 0,
            reason: Some("boom".into()),
        };
        assert_eq!(
            h.settle(consumer, nack, vec![got[0].receipt()]),
            vec![Ok(())]
        );
    }
}

#[test]
fn a_configuration_set_at_run_time_routes_failures_to_a_dead_letter_topic_and_survives_a_rebuild() {
    // Goal: a topic configured at run time (max attempts 2, dead-letter topic `jobs-dlq`)
    // behaves so at the leaf at once, the message out of attempts is ready in `jobs-dlq` with
    // its attempts reset and its id and payload kept, and a leaf rebuilt from its log keeps
    // both the configuration and the moved message. Method: one leaf with a recorded log.
    let mut h = Harness::new();
    let (config, root, first, leaf_end, log) = recorded_leaf_with(&mut h, settings(4));
    let producer = h.client(first, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    assert_eq!(
        configure(&mut h, consumer, "jobs", routing(2, "jobs-dlq")),
        1
    );
    let id = h.push(producer, "jobs", &[3])[0];
    fail(&mut h, consumer, "jobs", 2);
    assert!(h.pop(consumer, "jobs", 1).is_empty(), "out of attempts");
    let (jobs, totals) = stats_of(&mut h, consumer, "jobs");
    assert_eq!(
        (jobs.dead, totals.dead_lettered),
        (0, 1),
        "not in jobs' own DLQ"
    );
    let (dlq, _) = stats_of(&mut h, consumer, "jobs-dlq");
    assert_eq!(dlq.ready_total(), 1);
    assert_eq!(
        (jobs.bytes, dlq.bytes),
        (0, 2),
        "its payload's bytes moved with it"
    );

    h.disconnect(leaf_end);
    let operations = crate::machine::replay(&log.lock().unwrap());
    let rebuilt = h.add(Box::new(Leaf::recover(config, h.now, operations)));
    h.link(rebuilt, root);
    let listed = configs(&mut h, consumer, "jobs");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.settings.max_attempts, Some(2));
    assert_eq!(listed[0].1.attributes["owner"], "team-a");
    assert!(listed[0].1.version > Time::ZERO, "stamped by the root");
    let got = h.pop(consumer, "jobs-dlq", 1);
    assert_eq!((got[0].id, got[0].attempt, got[0].priority), (id, 1, 3));
    assert_eq!(got[0].payload.as_ref(), b"p3", "the payload kept");
    assert_eq!(h.ack(consumer, vec![got[0].receipt()]), vec![Ok(())]);

    // The rebuilt leaf applies the configuration too.
    let producer = h.client(rebuilt, PeerKind::Producer);
    let again = h.push(producer, "jobs", &[1])[0];
    fail(&mut h, consumer, "jobs", 2);
    let got = h.pop(consumer, "jobs-dlq", 1);
    assert_eq!(got[0].id, again);
}

#[test]
fn a_leaf_that_missed_a_configuration_gets_the_newest_from_the_next_listing() {
    // Goal: configurations are the tree's, not one leaf's: a leaf unreachable when one was
    // set gets it once a listing finds it behind; the newest version wins; a removal hides a
    // configuration and keeps an older one from coming back. Method: a root over two leaves,
    // leaf 2 cut off while `jobs` is configured twice.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1), LeafId(2)]));
    let one = h.add(leaf(1, 4));
    let two = h.add(leaf(2, 4));
    h.link(one, root);
    let consumer = h.client(root, PeerKind::Consumer);
    assert_eq!(
        configure(&mut h, consumer, "jobs", routing(5, "jobs-dlq")),
        1
    );
    h.advance(Duration::from_millis(1));
    assert_eq!(
        configure(&mut h, consumer, "jobs", routing(1, "jobs-dlq")),
        1,
        "only leaf 1 keeps it"
    );
    assert_eq!(configure(&mut h, consumer, "other", routing(3, "x")), 1);
    h.link(two, root);

    // The listing answers the newest, and sends it to leaf 2.
    let listed = configs(&mut h, consumer, "");
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["jobs", "other"]);
    assert_eq!(listed[0].1.settings.max_attempts, Some(1), "the newest");
    assert_eq!(configs(&mut h, consumer, "jo").len(), 1, "by prefix");
    let producer = h.client(two, PeerKind::Producer);
    let id = h.push(producer, "jobs", &[0])[0];
    fail(&mut h, consumer, "jobs", 1);
    let got = h.pop(consumer, "jobs-dlq", 1);
    assert_eq!(got[0].id, id, "leaf 2 applies the healed configuration");

    // A removal hides it at both leaves.
    h.advance(Duration::from_millis(1));
    let removed = TopicConfig {
        deleted: true,
        ..TopicConfig::default()
    };
    assert_eq!(configure(&mut h, consumer, "jobs", removed.clone()), 2);
    let AdminResult::Configs { configs, .. } = admin(
        &mut h,
        consumer,
        AdminOp::Configs {
            prefix: "jobs".into(),
            limit: 10,
            after: None,
            within: None,
        },
    ) else {
        panic!("a listing")
    };
    assert!(configs.iter().all(|(_, c)| c.deleted), "{configs:?}");
}

#[test]
fn messages_move_between_topics_of_one_namespace_and_bad_configurations_are_refused() {
    // Goal: `MoveTopic` moves ready and delayed messages (leased ones stay) within one
    // namespace with their attempts reset; configurations and moves that break a rule get
    // `InvalidArgument` naming it. Method: one leaf under a root.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let node = h.add(leaf(1, 4));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let ids = h.push(producer, "a/dlq", &[2, 1, 0]);
    let held = h.pop(consumer, "a/dlq", 1);
    assert_eq!(held[0].id, ids[2]);
    let moved = admin(
        &mut h,
        consumer,
        AdminOp::MoveTopic {
            topic: "a/dlq".into(),
            to: "a/jobs".into(),
        },
    );
    assert_eq!(moved, AdminResult::Count(2));
    let got: Vec<(MessageId, u32)> = h
        .pop(consumer, "a/jobs", 10)
        .iter()
        .map(|d| (d.id, d.attempt))
        .collect();
    assert_eq!(
        got,
        vec![(ids[1], 1), (ids[0], 1)],
        "in order, attempts reset"
    );
    assert_eq!(h.ack(consumer, vec![held[0].receipt()]), vec![Ok(())]);

    let refused = |h: &mut Harness, op: AdminOp| {
        let request = h.request();
        h.send(consumer, Wire::Admin(Admin { request, op }));
        match h.recv(consumer) {
            Wire::Error(e) if e.code == ErrorCode::InvalidArgument => e.message,
            other => panic!("refused: {other:?}"),
        }
    };
    let across = AdminOp::MoveTopic {
        topic: "a/dlq".into(),
        to: "b/jobs".into(),
    };
    assert!(refused(&mut h, across).contains("namespace"));
    let elsewhere = AdminOp::Configure {
        topic: "a/jobs".into(),
        config: Box::new(routing(2, "b/dlq")),
    };
    assert!(refused(&mut h, elsewhere).contains("namespace"));
    let itself = AdminOp::Configure {
        topic: "a/jobs".into(),
        config: Box::new(routing(2, "a/jobs")),
    };
    assert!(refused(&mut h, itself).contains("itself"));
    let zero = AdminOp::Configure {
        topic: "a/jobs".into(),
        config: Box::new(routing(0, "a/dlq")),
    };
    assert!(refused(&mut h, zero).contains("max_attempts"));
    let mut big = routing(2, "a/dlq");
    big.attributes.insert(
        "k".into(),
        "v".repeat(Settings::default().topic_attributes_bytes_max as usize),
    );
    let big = AdminOp::Configure {
        topic: "a/jobs".into(),
        config: Box::new(big),
    };
    assert!(refused(&mut h, big).contains("topic_attributes_bytes_max"));
}
