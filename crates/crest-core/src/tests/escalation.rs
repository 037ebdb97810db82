//! Priorities that change while a message waits: an admin's reprioritize and topic aging, in
//! the tree, in the log, and across a rebuild from the log.

use super::access::principal;
use super::*;
use crate::config::{Aging, TopicSettings};
use crate::wire::{Escalation, NotWaiting};

fn reprioritize(
    h: &mut Harness,
    client: ConnId,
    topic: &str,
    id: MessageId,
    priority: u32,
) -> Result<Escalation, NotWaiting> {
    let op = AdminOp::Reprioritize {
        topic: topic.into(),
        id,
        priority,
        reason: "customer escalation".into(),
        by: Some("forged".into()),
    };
    match admin(h, client, op) {
        AdminResult::Reprioritized(result) => result,
        other => panic!("reprioritize answer: {other:?}"),
    }
}

fn set_metadata(
    h: &mut Harness,
    client: ConnId,
    id: MessageId,
    metadata: &[(&str, &str)],
) -> Result<(), NotWaiting> {
    let op = AdminOp::SetMetadata {
        topic: "jobs".into(),
        id,
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    match admin(h, client, op) {
        AdminResult::MetadataSet(result) => result,
        other => panic!("set metadata answer: {other:?}"),
    }
}

/// Settings whose topic "jobs" ages: LOW (3) after 30 s, BACKGROUND (4) after 60 s, never
/// above NORMAL (2) for `floor` 2.
fn aging_settings(credits: u32, floor: u32) -> Settings {
    let mut settings = settings(credits);
    let thresholds = [(3, Duration::from_secs(30)), (4, Duration::from_secs(60))];
    settings.topics.insert(
        "jobs".into(),
        TopicSettings {
            aging: Some(Aging {
                thresholds: thresholds.into_iter().collect(),
            }),
            aging_floor: Some(floor),
            ..TopicSettings::default()
        },
    );
    settings
}

/// A recorded leaf on [`aging_settings`] below a root: its config, the root, the link's end
/// and the log, checkpointing every second if `checkpoint`, else not within the tests.
fn aging_leaf(
    h: &mut Harness,
    floor: u32,
    checkpoint: bool,
) -> (LeafConfig, usize, ConnId, SharedLog) {
    let leaf_settings = Settings {
        checkpoint_interval_ms: if checkpoint { 1000 } else { 3_600_000 },
        ..aging_settings(4, floor)
    };
    let (config, root, _, leaf_end, log) = recorded_leaf_with(h, leaf_settings);
    (config, root, leaf_end, log)
}

fn ready_by_priority(h: &mut Harness, client: ConnId) -> Vec<(u32, u64)> {
    let (stats, _) = stats_of(h, client, "jobs");
    stats.ready.into_iter().collect()
}

#[test]
fn a_reprioritized_message_moves_in_the_tree_at_once_and_its_delivery_says_who_when_why() {
    // Two credits per topic: most messages are not in the root's window, so the escalated
    // one must be retracted/offered anew to be seen.
    let mut t = tree(2);
    let low = t.h.push(t.producers[0], "jobs", &[4; 8]);
    let normal = t.h.push(t.producers[2], "jobs", &[2; 4]);
    let escalated_at = t.h.now;
    let escalation = reprioritize(&mut t.h, t.consumer, "jobs", low[6], 0).expect("waiting");
    assert_eq!(
        escalation,
        Escalation {
            original_priority: 4,
            escalated_at,
            escalated_by: None,
            reason: "customer escalation".into(),
            aged: false,
        },
        "a connection without a principal is no one: what the request claims is dropped"
    );
    let first = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!((first.id, first.priority), (low[6], 0));
    assert_eq!(first.escalation, Some(escalation));
    // The rest in key order, the demoted one among its new peers.
    reprioritize(&mut t.h, t.consumer, "jobs", normal[0], 4).expect("waiting");
    let mut rest = Vec::new();
    while let Some(next) = t.h.pop(t.consumer, "jobs", 1).first() {
        rest.push(next.id);
    }
    let mut expected = normal[1..].to_vec();
    expected.extend(low.iter().filter(|id| **id != low[6]));
    expected.push(normal[0]);
    assert_eq!(rest, expected);
    assert_eq!(counter(&mut t.h, t.leaves[0], "reprioritized"), 1);
}

#[test]
fn a_delayed_message_can_be_reprioritized_and_keeps_its_delay() {
    let mut t = tree(4);
    let later = t.h.now + Duration::from_secs(10);
    let delayed = t.h.push_messages(
        t.producers[1],
        vec![PushMessage {
            topic: "jobs".into(),
            priority: 3,
            payload: Bytes::from_static(b"later"),
            deliver_at: Some(later),
            ..PushMessage::default()
        }],
    )[0];
    let now = t.h.push(t.producers[0], "jobs", &[1, 1]);
    reprioritize(&mut t.h, t.consumer, "jobs", delayed, 0).expect("delayed is waiting");
    let early: Vec<MessageId> =
        t.h.pop(t.consumer, "jobs", 10)
            .iter()
            .map(|d| d.id)
            .collect();
    assert_eq!(early, now, "still delayed: not delivered before its time");
    t.h.advance(Duration::from_secs(10));
    let due = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!((due.id, due.priority), (delayed, 0));
}

#[test]
fn reprioritize_refuses_a_leased_a_dead_and_an_unknown_message_with_a_typed_error() {
    let mut t = tree_with(Settings {
        max_attempts: 1,
        ..settings(4)
    });
    let ids = t.h.push(t.producers[0], "jobs", &[2, 2, 2]);
    let leased = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!(
        reprioritize(&mut t.h, t.consumer, "jobs", leased.id, 0),
        Err(NotWaiting::Leased)
    );
    // Escalated, then dead: the dead letter shows the escalation.
    reprioritize(&mut t.h, t.consumer, "jobs", ids[1], 1).expect("waiting");
    let second = t.h.pop(t.consumer, "jobs", 1).remove(0);
    assert_eq!(second.id, ids[1]);
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: Some("broken".into()),
    };
    assert_eq!(
        t.h.settle(t.consumer, nack, vec![second.receipt()]),
        vec![Ok(())]
    );
    assert_eq!(
        reprioritize(&mut t.h, t.consumer, "jobs", ids[1], 0),
        Err(NotWaiting::Dead)
    );
    let op = AdminOp::DeadLetters {
        topic: "jobs".into(),
        limit: 10,
        after: None,
    };
    let AdminResult::DeadLetters(dead) = admin(&mut t.h, t.consumer, op) else {
        panic!("dead letters")
    };
    let shown = dead[0].escalation.as_ref().expect("escalation kept");
    assert_eq!((dead[0].priority, shown.original_priority), (1, 2));
    // Acked, in another topic, of a leaf not in the tree: unknown.
    assert_eq!(t.h.ack(t.consumer, vec![leased.receipt()]), vec![Ok(())]);
    for (topic, id) in [
        ("jobs", leased.id),
        ("other", ids[2]),
        ("jobs", MessageId::new(LeafId(9), 1)),
    ] {
        assert_eq!(
            reprioritize(&mut t.h, t.consumer, topic, id, 0),
            Err(NotWaiting::Unknown),
            "{topic} {id}"
        );
    }
}

#[test]
fn reprioritize_needs_admin_on_the_namespace_and_logs_its_principal() {
    let mut t = tree(4);
    let ids = t.h.push(t.producers[0], "orders/eu", &[3]);
    let op = |id| AdminOp::Reprioritize {
        topic: "orders/eu".into(),
        id,
        priority: 0,
        reason: "vip".into(),
        by: None,
    };
    let consumer = principal("worker", &["orders:consume"]);
    let worker = t.h.client_as(t.root, PeerKind::Consumer, Some(consumer));
    let request = t.h.request();
    let admin_op = Admin {
        request,
        op: op(ids[0]),
    };
    t.h.send(worker, Wire::Admin(admin_op));
    match t.h.recv(worker) {
        Wire::Error(error) => assert_eq!(error.code, ErrorCode::Forbidden),
        other => panic!("expected Forbidden, got {other:?}"),
    }
    // A reason over `reason_bytes_max` is refused before anything moves.
    let request = t.h.request();
    let mut long = op(ids[0]);
    if let AdminOp::Reprioritize { reason, .. } = &mut long {
        *reason = "x".repeat(Settings::default().reason_bytes_max as usize + 1);
    }
    t.h.send(t.consumer, Wire::Admin(Admin { request, op: long }));
    match t.h.recv(t.consumer) {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains("reason_bytes_max"), "{error:?}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let boss = principal("ops-lead", &["orders:admin,consume"]);
    let ops = t.h.client_as(t.root, PeerKind::Consumer, Some(boss));
    let AdminResult::Reprioritized(Ok(escalation)) = admin(&mut t.h, ops, op(ids[0])) else {
        panic!("reprioritized")
    };
    assert_eq!(escalation.escalated_by.as_deref(), Some("ops-lead"));
    let popped = t.h.pop(ops, "orders/eu", 1).remove(0);
    assert_eq!(popped.escalation, Some(escalation));
}

#[test]
fn aging_promotes_one_priority_per_threshold_up_to_the_floor_and_leaves_escalations_alone() {
    let mut t = tree_with(aging_settings(4, 2));
    let background = t.h.push(t.producers[0], "jobs", &[4, 4]);
    t.h.advance(Duration::from_secs(40));
    let low = t.h.push(t.producers[1], "jobs", &[3]);
    // An admin's priority stands: the second background message is set to 4 explicitly.
    reprioritize(&mut t.h, t.consumer, "jobs", background[1], 4).expect("waiting");
    assert_eq!(
        ready_by_priority(&mut t.h, t.consumer),
        vec![(3, 1), (4, 2)]
    );
    // 61 s: the first background message waited 60 s at 4 → 3 (the low one only 21 s).
    t.h.advance(Duration::from_secs(21));
    assert_eq!(
        ready_by_priority(&mut t.h, t.consumer),
        vec![(3, 2), (4, 1)]
    );
    // 71 s: the low one waited 30 s at 3 → 2; the promoted one has waited 11 s at 3 only.
    t.h.advance(Duration::from_secs(10));
    assert_eq!(
        ready_by_priority(&mut t.h, t.consumer),
        vec![(2, 1), (3, 1), (4, 1)]
    );
    // 91 s: the promoted one waited 30 s at 3 too → 2, the floor; nothing moves after.
    t.h.advance(Duration::from_secs(20));
    assert_eq!(
        ready_by_priority(&mut t.h, t.consumer),
        vec![(2, 2), (4, 1)]
    );
    t.h.advance(Duration::from_secs(600));
    assert_eq!(
        ready_by_priority(&mut t.h, t.consumer),
        vec![(2, 2), (4, 1)]
    );
    assert_eq!(counter(&mut t.h, t.leaves[0], "aged"), 2);
    // Within priority 2 by ready time: the background message has waited longest.
    let popped = t.h.pop(t.consumer, "jobs", 3);
    let got: Vec<(MessageId, u32)> = popped.iter().map(|d| (d.id, d.priority)).collect();
    assert_eq!(
        got,
        vec![(background[0], 2), (low[0], 2), (background[1], 4)]
    );
    let aged = popped[0].escalation.as_ref().expect("aged");
    assert!(aged.aged && aged.escalated_by.is_none(), "{aged:?}");
    assert_eq!(aged.original_priority, 4);
    assert!(!popped[2].escalation.as_ref().expect("escalated").aged);
}

#[test]
fn an_aged_message_goes_ahead_of_its_new_prioritys_backlog_across_nack_delay_and_restart() {
    for checkpoint in [false, true] {
        let mut h = Harness::new();
        let (config, root, leaf_end, log) = aging_leaf(&mut h, 2, checkpoint);
        let producer = h.client(h.nodes.len() - 1, PeerKind::Producer);
        let consumer = h.client(root, PeerKind::Consumer);
        // A backlog at 2, ready before the two at 3 that age into 2 after 30 s.
        let backlog = h.push(producer, "jobs", &[2; 6]);
        h.advance(Duration::from_secs(1));
        let low = h.push(producer, "jobs", &[3, 3]);
        h.advance(Duration::from_secs(31));
        assert_eq!(ready_by_priority(&mut h, consumer), vec![(2, 8)]);
        // An admin's priority makes a message native again: behind the backlog.
        reprioritize(&mut h, consumer, "jobs", low[1], 2).expect("waiting");
        let checkpointed = restart_from_log(&mut h, config, root, leaf_end, &log);
        assert_eq!(checkpointed, checkpoint);
        // Promoted, it goes ahead of the six that were ready before it; a nack with a delay
        // brings it back ahead of them again.
        let first = h.pop(consumer, "jobs", 1);
        assert_eq!(first[0].id, low[0], "checkpoint {checkpoint}");
        let nack = Settle::Nack {
            delay_ms: 1000,
            reason: None,
        };
        assert_eq!(
            h.settle(consumer, nack, vec![first[0].receipt()]),
            vec![Ok(())]
        );
        h.advance(Duration::from_secs(2));
        let popped = h.pop(consumer, "jobs", 8);
        let got: Vec<MessageId> = popped.iter().map(|d| d.id).collect();
        let mut want = vec![low[0]];
        want.extend(&backlog);
        want.push(low[1]);
        assert_eq!(got, want, "checkpoint {checkpoint}");
    }
}

#[test]
fn aging_set_at_run_time_applies_to_the_messages_already_waiting() {
    let mut t = tree(4);
    let ids = t.h.push(t.producers[0], "jobs", &[4]);
    t.h.advance(Duration::from_secs(120));
    let mut config = TopicConfig::default();
    config.settings.aging = aging_settings(4, 0).topics["jobs"].aging.clone();
    let op = AdminOp::Configure {
        topic: "jobs".into(),
        config: Box::new(config),
    };
    assert_eq!(admin(&mut t.h, t.consumer, op), AdminResult::Count(4));
    // Waited 120 s: 60 s at 4, then 30 s at 3 → 2, one step per check; 2 has no threshold.
    t.h.advance(Duration::from_millis(Settings::default().aging_check_ms));
    assert_eq!(ready_by_priority(&mut t.h, t.consumer), vec![(3, 1)]);
    t.h.advance(Duration::from_millis(Settings::default().aging_check_ms));
    assert_eq!(ready_by_priority(&mut t.h, t.consumer), vec![(2, 1)]);
    assert_eq!(t.h.pop(t.consumer, "jobs", 1)[0].id, ids[0]);
}

#[test]
fn escalations_and_promotions_survive_a_rebuild_from_the_log_and_from_a_checkpoint() {
    for checkpoint in [false, true] {
        let mut h = Harness::new();
        let (config, root, leaf_end, log) = aging_leaf(&mut h, 0, checkpoint);
        let producer = h.client(h.nodes.len() - 1, PeerKind::Producer);
        let consumer = h.client(root, PeerKind::Consumer);
        let ids = h.push(producer, "jobs", &[4, 2, 2]);
        reprioritize(&mut h, consumer, "jobs", ids[2], 1).expect("waiting");
        set_metadata(&mut h, consumer, ids[1], &[("set", "by admin")]).expect("waiting");
        h.advance(Duration::from_secs(61));
        assert_eq!(
            ready_by_priority(&mut h, consumer),
            vec![(1, 1), (2, 1), (3, 1)]
        );
        let checkpointed = restart_from_log(&mut h, config, root, leaf_end, &log);
        assert_eq!(checkpointed, checkpoint);
        assert_eq!(
            ready_by_priority(&mut h, consumer),
            vec![(1, 1), (2, 1), (3, 1)],
            "checkpoint {checkpoint}"
        );
        // Aging goes on from where it was: 30 s more at 3 → 2.
        h.advance(Duration::from_secs(31));
        let popped = h.pop(consumer, "jobs", 3);
        let got: Vec<(MessageId, u32)> = popped.iter().map(|d| (d.id, d.priority)).collect();
        assert_eq!(got, vec![(ids[2], 1), (ids[0], 2), (ids[1], 2)]);
        let escalated = popped[0].escalation.as_ref().expect("kept");
        assert_eq!((escalated.original_priority, escalated.aged), (2, false));
        let aged = popped[1].escalation.as_ref().expect("kept");
        assert_eq!((aged.original_priority, aged.aged), (4, true));
        let set = vec![("set".to_string(), "by admin".to_string())];
        assert_eq!(popped[2].metadata, set, "checkpoint {checkpoint}");
    }
}

#[test]
fn metadata_set_by_an_admin_stands_for_the_pushed_pairs_read_back_from_the_log() {
    // No body cache: every delivery reads its body from the (simulated) disk, whose metadata
    // is the pushed one; the admin's pairs must replace it there.
    let (mut h, _, producer, consumer, _, reads) = disk_leaf();
    let ids = h.push_messages(producer, (0..3).map(numbered).collect());
    assert_eq!(
        set_metadata(
            &mut h,
            consumer,
            ids[1],
            &[("owner", "team-b"), ("n", "one")]
        ),
        Ok(())
    );
    let popped = h.pop(consumer, "jobs", 3);
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 3);
    let pairs = |d: &Delivery| d.metadata.clone();
    assert_eq!(pairs(&popped[0]), vec![("n".to_string(), "0".to_string())]);
    assert_eq!(
        pairs(&popped[1]),
        vec![
            ("owner".to_string(), "team-b".to_string()),
            ("n".to_string(), "one".to_string())
        ]
    );
    assert_eq!(
        popped[1].payload,
        Bytes::from("body of 1"),
        "payload unchanged"
    );
    assert_eq!(
        set_metadata(&mut h, consumer, ids[0], &[]),
        Err(NotWaiting::Leased)
    );
    // Over the bounds of a push's metadata: refused before anything changes.
    let request = h.request();
    let op = AdminOp::SetMetadata {
        topic: "jobs".into(),
        id: ids[2],
        metadata: vec![(
            "k".into(),
            "v".repeat(Settings::default().metadata_bytes_max as usize),
        )],
    };
    h.send(consumer, Wire::Admin(Admin { request, op }));
    match h.recv(consumer) {
        Wire::Error(error) => assert!(
            error.code == ErrorCode::InvalidArgument
                && error.message.contains("metadata_bytes_max"),
            "{error:?}"
        ),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
