//! Quotas over the tree: a namespace's limit holds whatever leaves the producers use, refusals
//! are typed, and a leaf short of allowance gets more from the root.

use super::*;
use crate::quota::{Limits, Quota, QuotaExceeded};

/// The admin request that sets `scope`'s limits.
pub(super) fn configure(scope: &str, limits: Limits) -> AdminOp {
    AdminOp::Configure {
        topic: scope.into(),
        config: Box::new(TopicConfig {
            limits,
            ..TopicConfig::default()
        }),
    }
}

pub(super) fn set_limits(t: &mut Tree, scope: &str, limits: Limits) {
    let op = configure(scope, limits);
    assert_eq!(admin(&mut t.h, t.consumer, op), AdminResult::Count(4));
}

/// Sets namespace `orders`' push rate.
fn set_push_rate(t: &mut Tree, per_second: u64, burst: u64) {
    let rate = crate::quota::Rate { per_second, burst };
    let limits = Limits {
        push_rate: Some(rate),
        ..Limits::default()
    };
    set_limits(t, "orders/", limits);
}

/// The next answer to `client`, waiting in virtual time (a leaf may hold a push batch while
/// it asks for allowance).
fn answer_to(t: &mut Tree, client: ConnId) -> Wire {
    for _ in 0..10_000 {
        if let Some(answer) = t.h.try_recv(client) {
            return answer;
        }
        t.h.advance(Duration::from_millis(1));
    }
    panic!("no answer in 10 s")
}

/// How a push batch ended.
#[derive(Debug, PartialEq)]
enum Pushed {
    Stored(usize),
    Over(QuotaExceeded),
}

/// Pushes `count` messages of `topic` through `producer`, sending again while the leaf asks
/// for time (it waits for its share), as the SDK's producer does.
fn push_within(t: &mut Tree, leaf: usize, topic: &str, count: usize, bytes: usize) -> Pushed {
    let messages: Vec<PushMessage> = (0..count)
        .map(|_| PushMessage {
            topic: topic.into(),
            payload: Bytes::from(vec![b'x'; bytes]),
            ..PushMessage::default()
        })
        .collect();
    let producer = t.producers[leaf];
    for _ in 0..100 {
        let request = t.h.request();
        let push = Push {
            request,
            messages: messages.clone(),
        };
        t.h.send(producer, Wire::Push(push));
        match answer_to(t, producer) {
            Wire::PushAck(ack) => return Pushed::Stored(ack.ids.len()),
            Wire::Error(ErrorReply {
                code: ErrorCode::QuotaExceeded,
                quota: Some(quota),
                ..
            }) => return Pushed::Over(*quota),
            Wire::Error(ErrorReply {
                code: ErrorCode::Overloaded | ErrorCode::RateLimited,
                retry_after_ms: Some(after),
                ..
            }) => t.h.advance(Duration::from_millis(after)),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    panic!("a push never got its share")
}

fn held(t: &mut Tree, namespace_topics: &[&str]) -> u64 {
    namespace_topics
        .iter()
        .map(|topic| stats_of(&mut t.h, t.consumer, topic).0.messages())
        .sum()
}

#[test]
fn a_namespace_quota_holds_over_four_leaves_and_frees_up_as_consumers_take() {
    // Goal: producers on all four leaves (behind two aggregators) together get no more than
    // the namespace's 200 messages stored, each refusal names the scope and the limit, the
    // tree fills close to the limit (refusals start at most the unused shares early), another
    // namespace is untouched, and consuming makes room again. Method: batches of 7 round-robin
    // over the leaves, two topics of the namespace, until every leaf is refused.
    let mut t = tree(4);
    set_limits(
        &mut t,
        "orders/",
        Limits {
            messages_max: Some(200),
            ..Limits::default()
        },
    );
    let mut refused = [false; 4];
    let mut stored = 0;
    let mut round = 0;
    while refused.iter().any(|r| !r) {
        let leaf = round % 4;
        let topic = ["orders/eu", "orders/us"][round % 2];
        match push_within(&mut t, leaf, topic, 7, 10) {
            Pushed::Stored(n) => stored += n,
            Pushed::Over(quota) => {
                assert_eq!(
                    quota,
                    QuotaExceeded {
                        scope: "orders/".into(),
                        which: Quota::Messages,
                        limit: 200
                    }
                );
                refused[leaf] = true;
            }
        }
        round += 1;
        assert!(round < 1000, "the quota never refused");
        // Reports go on as time passes.
        t.h.advance(Duration::from_millis(30));
    }
    let now_held = held(&mut t, &["orders/eu", "orders/us"]);
    assert_eq!(
        now_held, stored as u64,
        "what was acknowledged is what is held"
    );
    assert!(now_held <= 200, "{now_held} over the quota");
    assert!(
        now_held >= 200 - 4 * 7,
        "{now_held}: refused far below the quota"
    );
    // Another namespace is not limited.
    assert_eq!(
        push_within(&mut t, 0, "billing/x", 500, 10),
        Pushed::Stored(500)
    );
    // Consumers take 50: pushes are admitted again, up to the quota.
    let mut consumed = 0;
    while consumed < 50 {
        let got = t.h.pop(t.consumer, "orders/eu", 1);
        assert_eq!(got.len(), 1, "orders/eu holds more");
        assert_eq!(t.h.ack(t.consumer, vec![got[0].receipt()]), vec![Ok(())]);
        consumed += 1;
    }
    t.h.advance(Duration::from_millis(300));
    let mut again = 0;
    for round in 0..40 {
        if let Pushed::Stored(n) = push_within(&mut t, round % 4, "orders/us", 5, 10) {
            again += n;
        }
        t.h.advance(Duration::from_millis(30));
    }
    assert!(
        again >= 50 - 4 * 5,
        "only {again} admitted after 50 were consumed"
    );
    let after = held(&mut t, &["orders/eu", "orders/us"]);
    assert!(after <= 200, "{after} over the quota");
}

#[test]
fn byte_and_message_size_limits_refuse_with_their_names_and_store_nothing() {
    // Goal: a topic's bytes quota and largest-message limit refuse typed, and a refused batch
    // leaves nothing behind. Method: one tree, limits on topic `media/video`.
    let mut t = tree(4);
    set_limits(
        &mut t,
        "media/video",
        Limits {
            bytes_max: Some(10_000),
            message_bytes_max: Some(1_000),
            ..Limits::default()
        },
    );
    let over = push_within(&mut t, 1, "media/video", 1, 1_001);
    assert_eq!(
        over,
        Pushed::Over(QuotaExceeded {
            scope: "media/video".into(),
            which: Quota::MessageBytes,
            limit: 1_000
        })
    );
    let mut stored = 0;
    loop {
        match push_within(&mut t, stored % 4, "media/video", 3, 1_000) {
            Pushed::Stored(n) => stored += n,
            Pushed::Over(quota) => {
                assert_eq!(quota.which, Quota::Bytes);
                assert_eq!(quota.limit, 10_000);
                break;
            }
        }
        t.h.advance(Duration::from_millis(30));
    }
    let (stats, _) = stats_of(&mut t.h, t.consumer, "media/video");
    assert_eq!(stats.messages(), stored as u64);
    assert!(stats.bytes <= 10_000, "{} bytes", stats.bytes);
    // Other topics of the namespace take larger messages.
    assert_eq!(
        push_within(&mut t, 1, "media/audio", 1, 5_000),
        Pushed::Stored(1)
    );
}

#[test]
fn a_quota_on_a_topic_name_ending_in_a_slash_is_the_namespace_s_and_pushes_there_are_refused() {
    // Goal: `NS/` names a namespace's quotas, not a topic: a push to it is refused, and a
    // namespace's configuration takes no topic settings.
    let mut t = tree(4);
    let request = t.h.request();
    let push = Push {
        request,
        messages: vec![PushMessage {
            topic: "orders/".into(),
            ..PushMessage::default()
        }],
    };
    t.h.send(t.producers[0], Wire::Push(push));
    match t.h.recv(t.producers[0]) {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains("namespace"), "{}", error.message);
        }
        other => panic!("accepted: {other:?}"),
    }
    let op = AdminOp::Configure {
        topic: "orders/".into(),
        config: Box::new(TopicConfig {
            settings: crate::config::TopicSettings {
                max_attempts: Some(2),
                ..Default::default()
            },
            ..TopicConfig::default()
        }),
    };
    let request = t.h.request();
    t.h.send(t.consumer, Wire::Admin(Admin { request, op }));
    match t.h.recv(t.consumer) {
        Wire::Error(error) => assert_eq!(error.code, ErrorCode::InvalidArgument),
        other => panic!("accepted: {other:?}"),
    }
}

#[test]
fn a_leaf_away_when_the_quota_was_set_gets_it_when_it_comes_back() {
    // Goal: a leaf cut off while a namespace's quota is set learns it as soon as it is back
    // (its first usage report lacks the scope; the root sends it the configuration), so
    // pushes there count against the quota too. Method: leaf 4's connections torn down,
    // quota set, leaf 4 linked again, pushes to leaf 4 until refused.
    let mut t = tree(4);
    t.h.kill(t.leaves[3]);
    let limits = Limits {
        messages_max: Some(60),
        ..Limits::default()
    };
    let op = configure("orders/", limits);
    let request = t.h.request();
    t.h.send(t.consumer, Wire::Admin(Admin { request, op }));
    match t.h.recv(t.consumer) {
        Wire::AdminReply(reply) => {
            assert_eq!(reply.result, AdminResult::Count(3));
            assert_eq!(reply.unreachable, vec![LeafId(4)]);
        }
        other => panic!("configure failed: {other:?}"),
    }
    t.h.link(t.leaves[3], t.aggs[1]);
    t.producers[3] = t.h.client(t.leaves[3], PeerKind::Producer);
    t.h.advance(Duration::from_millis(100));
    let mut stored = 0;
    let refusal = loop {
        match push_within(&mut t, 3, "orders/eu", 10, 10) {
            Pushed::Stored(n) => stored += n,
            Pushed::Over(quota) => break quota,
        }
        assert!(stored <= 60, "leaf 4 stored {stored} of a quota of 60");
        t.h.advance(Duration::from_millis(30));
    };
    assert_eq!(refusal.limit, 60);
    assert!(stored >= 50, "{stored}");
    assert!(root_counter_of(&mut t, "configs_repaired") >= 1);
}

fn root_counter_of(t: &mut Tree, name: &str) -> u64 {
    counter(&mut t.h, t.root, name)
}

#[test]
fn a_child_cannot_report_usage_for_a_leaf_it_does_not_lead_to() {
    // Goal: a rogue child cannot draw allowances in another subtree's name (nor make the
    // root count usage there): its report is refused and counted as a violation.
    let mut t = tree(4);
    set_limits(
        &mut t,
        "orders/",
        Limits {
            messages_max: Some(100),
            ..Limits::default()
        },
    );
    let child = t.h.client(
        t.root,
        PeerKind::Node {
            name: "agg-0".into(),
            role: Role::Aggregator,
            leaves: vec![LeafId(1), LeafId(2)],
            replica: None,
        },
    );
    let before = t.h.nodes[t.root].stats().violations;
    let usage = crate::quota::Usage {
        leaf: LeafId(3),
        epoch: u64::MAX,
        scopes: Vec::new(),
    };
    t.h.send(child, Wire::Usage(usage));
    match t.h.recv(child) {
        Wire::Error(error) => assert_eq!(error.code, ErrorCode::UnexpectedMessage),
        other => panic!("answered {other:?}"),
    }
    assert_eq!(t.h.nodes[t.root].stats().violations, before + 1);
    // Leaf 3 still gets its share: the rogue epoch did not replace its incarnation.
    let stored = push_within(&mut t, 2, "orders/eu", 5, 1);
    assert_eq!(stored, Pushed::Stored(5));
}

/// Offers batches of 5 messages of `orders/eu` every 10 ms for 5 s of virtual time (500/s),
/// through leaf 1 only or round-robin over the four; the messages admitted.
fn offered_for_five_seconds(t: &mut Tree, leaves: usize) -> u64 {
    let mut admitted = 0;
    for step in 0..500 {
        let request = t.h.request();
        let messages = vec![
            PushMessage {
                topic: "orders/eu".into(),
                payload: Bytes::from_static(b"x"),
                ..PushMessage::default()
            };
            5
        ];
        let producer = t.producers[step % leaves];
        t.h.send(producer, Wire::Push(Push { request, messages }));
        match t.h.recv(producer) {
            Wire::PushAck(ack) => admitted += ack.ids.len() as u64,
            Wire::Error(ErrorReply {
                code: ErrorCode::RateLimited | ErrorCode::Overloaded,
                retry_after_ms: Some(_),
                ..
            }) => {}
            other => panic!("unexpected answer {other:?}"),
        }
        t.h.advance(Duration::from_millis(10));
    }
    admitted
}

#[test]
fn a_push_rate_admits_its_rate_whether_the_producer_uses_one_leaf_or_four() {
    // Goal: a namespace's push rate of 200 messages/s (burst 20) admits 1,000 ± 10 % over 5 s
    // of pushes offered at 500/s, through one leaf or spread over four: the rate is the
    // tree's, not each leaf's. Method: virtual time, a batch of 5 every 10 ms.
    for leaves in [1, 4] {
        let mut t = tree(4);
        set_push_rate(&mut t, 200, 20);
        let admitted = offered_for_five_seconds(&mut t, leaves);
        assert!(
            (900..=1100).contains(&admitted),
            "{admitted} admitted over 5 s through {leaves} leaves"
        );
        let held = held(&mut t, &["orders/eu"]);
        assert_eq!(held, admitted, "refused batches left nothing");
    }
}

#[test]
fn a_rate_limited_push_names_the_rate_and_when_to_retry() {
    let mut t = tree(4);
    set_push_rate(&mut t, 10, 10);
    // The burst goes through (after the leaf's first ask), the next batch is refused.
    assert_eq!(
        push_within(&mut t, 0, "orders/eu", 10, 1),
        Pushed::Stored(10)
    );
    let request = t.h.request();
    let messages = vec![
        PushMessage {
            topic: "orders/eu".into(),
            ..PushMessage::default()
        };
        5
    ];
    let mut refusal = None;
    for _ in 0..3 {
        t.h.send(
            t.producers[0],
            Wire::Push(Push {
                request,
                messages: messages.clone(),
            }),
        );
        match t.h.recv(t.producers[0]) {
            Wire::Error(error) if error.code == ErrorCode::RateLimited => {
                refusal = Some(error);
                break;
            }
            Wire::Error(error) if error.code == ErrorCode::Overloaded => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let error = refusal.expect("rate limited");
    let rate = error.quota.expect("named");
    assert_eq!(
        (rate.scope.as_str(), rate.which, rate.limit),
        ("orders/", Quota::PushRate, 10)
    );
    let after = error.retry_after_ms.expect("a time to retry");
    assert!((1..=1000).contains(&after), "retry after {after} ms");
}

/// A push of `count` one-byte messages of `topic`.
pub(super) fn one_batch(topic: &str, count: usize) -> Wire {
    let message = PushMessage {
        topic: topic.into(),
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    Wire::Push(Push {
        request: u64::MAX,
        messages: vec![message; count],
    })
}

/// Cuts `leaf`'s link to its `parent`: it can no longer ask the root for grants.
fn cut_from_parent(t: &mut Tree, leaf: usize, parent: usize) {
    let uplink =
        t.h.ends
            .iter()
            .find(|(_, (owner, other))| {
                *owner == Owner::Node(leaf) && t.h.ends[other].0 == Owner::Node(parent)
            })
            .map(|(end, _)| *end)
            .expect("the leaf is linked to its parent");
    t.h.disconnect(uplink);
}

/// A tree whose namespace `orders` has a quota of `max` messages.
fn far_quota(max: u64) -> Tree {
    let mut t = tree(4);
    let limits = Limits {
        messages_max: Some(max),
        ..Limits::default()
    };
    set_limits(&mut t, "orders/", limits);
    t
}

#[test]
fn a_first_push_after_a_far_off_quota_is_set_needs_no_round_trip_to_the_root() {
    // Goal: leaves ask ahead for a standing allowance of a newly limited scope when the limit
    // is far, so a producer's first batch is stored without waiting for a grant; once quiet
    // for two report intervals they give it back, and the next batch waits for one.
    let mut t = far_quota(100_000);
    let (producer, leaf) = (t.producers[0], t.leaves[0]);
    t.h.send(producer, one_batch("orders/eu", 400));
    match t.h.recv(producer) {
        Wire::PushAck(ack) => assert_eq!(ack.ids.len(), 400),
        other => panic!("answered {other:?}"),
    }
    assert_eq!(counter(&mut t.h, leaf, "pushes_held"), 0);
    // Leaves 2 to 4 never pushed: quiet since the change, they give their share back.
    let report = Duration::from_millis(Settings::default().quota_report_ms);
    t.h.advance(report * 3);
    let second = t.producers[1];
    t.h.send(second, one_batch("orders/eu", 400));
    match answer_to(&mut t, second) {
        Wire::PushAck(ack) => assert_eq!(ack.ids.len(), 400),
        other => panic!("answered {other:?}"),
    }
    assert_eq!(counter(&mut t.h, t.leaves[1], "pushes_held"), 1);
    assert_eq!(held(&mut t, &["orders/eu"]), 800);
}

#[test]
fn a_batch_beyond_its_leaf_s_allowance_waits_there_for_the_root_s_grant_and_is_stored() {
    // Goal: a producer whose batch is larger than what its leaf holds of a far-off quota sees
    // no refusal: the leaf holds the batch while it asks the root for more, then stores it.
    // Each leaf asked ahead for a share (an eighth of 20,000 or less): 4,000 is beyond it.
    let mut t = far_quota(20_000);
    t.h.send(t.producers[0], one_batch("orders/eu", 4000));
    match t.h.recv(t.producers[0]) {
        Wire::PushAck(ack) => assert_eq!(ack.ids.len(), 4000),
        other => panic!("answered {other:?}"),
    }
    let leaf = t.leaves[0];
    assert_eq!(counter(&mut t.h, leaf, "pushes_held"), 1);
    assert_eq!(counter(&mut t.h, leaf, "pushes_awaiting_allowance"), 0);
    assert_eq!(held(&mut t, &["orders/eu"]), 4000);
}

#[test]
fn a_held_batch_whose_grant_does_not_come_is_refused_with_a_time_to_retry_and_not_stored() {
    // Goal: a leaf cut off from the root holds a batch beyond its allowance no longer than
    // `quota_hold_ms`, then refuses it (`Overloaded`, retry after `quota_retry_ms`); the batch
    // is stored once the leaf is linked again and the producer sends it again.
    let mut t = far_quota(20_000);
    let (producer, leaf, parent) = (t.producers[0], t.leaves[0], t.aggs[0]);
    cut_from_parent(&mut t, leaf, parent);
    t.h.send(producer, one_batch("orders/eu", 4000));
    assert_eq!(t.h.try_recv(producer), None, "held while the leaf asks");
    let settings = Settings::default();
    t.h.advance(Duration::from_millis(settings.quota_hold_ms - 1));
    assert_eq!(t.h.try_recv(producer), None, "held for quota_hold_ms");
    t.h.advance(Duration::from_millis(1));
    match t.h.recv(producer) {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::Overloaded);
            assert_eq!(error.retry_after_ms, Some(settings.quota_retry_ms));
        }
        other => panic!("answered {other:?}"),
    }
    assert_eq!(counter(&mut t.h, leaf, "pushes_awaiting_allowance"), 1);
    t.h.link(leaf, parent);
    t.h.advance(Duration::from_millis(settings.quota_report_ms));
    t.h.send(producer, one_batch("orders/eu", 4000));
    match t.h.recv(producer) {
        Wire::PushAck(ack) => assert_eq!(ack.ids.len(), 4000),
        other => panic!("answered {other:?}"),
    }
    assert_eq!(
        held(&mut t, &["orders/eu"]),
        4000,
        "the refused batch left nothing"
    );
}

#[test]
fn a_namespace_topic_quota_counts_the_tree_s_topics_whatever_leaf_creates_them() {
    // Goal: namespace `orders` limited to 3 topics takes 3 new topics through three leaves,
    // refuses a fourth `QuotaExceeded` naming the limit (through a fourth leaf), still takes
    // pushes to a topic the tree holds through a leaf that does not, and takes a new topic
    // once one is emptied; another namespace is not limited; nothing refused is stored.
    let mut t = tree(16);
    let limits = Limits {
        topics_max: Some(3),
        ..Limits::default()
    };
    set_limits(&mut t, "orders/", limits);
    t.h.advance(Duration::from_millis(300));
    for (leaf, topic) in [(0, "orders/a"), (1, "orders/b"), (2, "orders/c")] {
        assert_eq!(push_within(&mut t, leaf, topic, 2, 1), Pushed::Stored(2));
    }
    let over = QuotaExceeded {
        scope: "orders/".into(),
        which: Quota::Topics,
        limit: 3,
    };
    assert_eq!(
        push_within(&mut t, 3, "orders/d", 2, 1),
        Pushed::Over(over.clone())
    );
    assert_eq!(push_within(&mut t, 3, "orders/a", 2, 1), Pushed::Stored(2));
    assert_eq!(push_within(&mut t, 3, "billing/x", 2, 1), Pushed::Stored(2));
    t.h.advance(Duration::from_millis(300));
    let (_, all) = stats_of(&mut t.h, t.consumer, "orders/a");
    let scope = all
        .limits
        .iter()
        .find(|s| s.scope == "orders/")
        .expect("shown");
    assert_eq!(scope.topics, 3);
    assert_eq!(
        held(&mut t, &["orders/a", "orders/b", "orders/c", "orders/d"]),
        8
    );

    // Emptied, `orders/c` leaves the count once its leaf reports.
    let deliveries = t.h.pop(t.consumer, "orders/c", 16);
    let receipts: Vec<Receipt> = deliveries.iter().map(|d| d.receipt()).collect();
    assert!(t.h.ack(t.consumer, receipts).iter().all(Result::is_ok));
    t.h.advance(Duration::from_millis(300));
    assert_eq!(push_within(&mut t, 3, "orders/d", 2, 1), Pushed::Stored(2));
    assert_eq!(push_within(&mut t, 2, "orders/c", 1, 1), Pushed::Over(over));
}

#[test]
fn a_principal_s_held_batches_count_among_its_waiting_requests() {
    // Goal: a batch a leaf holds for a grant counts against its principal's
    // `principal_requests_max` while held: one producer cannot take every place
    // `quota_hold_batches_max` gives a leaf; past its share it is refused at once
    // (`Overloaded` naming the setting, with a time to retry) and another principal's batch is
    // still held; once the held ones are answered, its share is free again.
    let settings = Settings {
        principal_requests_max: 2,
        ..Settings::default()
    };
    let mut t = tree_with(settings.clone());
    let limits = Limits {
        messages_max: Some(20_000),
        ..Limits::default()
    };
    set_limits(&mut t, "orders/", limits);
    let (leaf, parent) = (t.leaves[0], t.aggs[0]);
    cut_from_parent(&mut t, leaf, parent);
    let [app, other] = ["app", "other"].map(|name| {
        let principal = super::access::principal(name, &["orders:produce"]);
        t.h.client_as(leaf, PeerKind::Producer, Some(principal))
    });
    for _ in 0..2 {
        t.h.send(app, one_batch("orders/eu", 4000));
    }
    assert_eq!(t.h.try_recv(app), None, "two held");
    t.h.send(app, one_batch("orders/eu", 4000));
    match t.h.recv(app) {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::Overloaded);
            assert!(
                error.message.contains("principal_requests_max"),
                "{}",
                error.message
            );
            assert_eq!(error.retry_after_ms, Some(settings.quota_retry_ms));
        }
        other => panic!("answered {other:?}"),
    }
    t.h.send(other, one_batch("orders/eu", 4000));
    assert_eq!(t.h.try_recv(other), None, "another principal's is held");
    // Past `quota_hold_ms` all three held are refused; the share is free again.
    t.h.advance(Duration::from_millis(settings.quota_hold_ms));
    for conn in [app, app, other] {
        assert!(matches!(t.h.recv(conn), Wire::Error(_)));
    }
    t.h.send(app, one_batch("orders/eu", 4000));
    assert_eq!(t.h.try_recv(app), None, "held again");
}
