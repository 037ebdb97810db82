//! Rates of principals and of pops, and in-flight quotas: a principal's push rate holds over
//! every leaf it pushes through, a pop rate and an in-flight quota are kept by the root at each
//! pop, and each refusal is typed (with a time to retry for a rate).

use super::access::principal;
use super::delivery::replace_root;
use super::quotas::{configure, one_batch as batch, set_limits};
use super::*;
use crate::quota::{Limits, Quota, Rate};

fn rate(per_second: u64, burst: u64) -> Option<Rate> {
    Some(Rate { per_second, burst })
}

/// Lets the leaves report the new limits to the root (it learns them from their reports).
fn settle_limits(t: &mut Tree) {
    t.h.advance(Duration::from_millis(500));
}

/// What answers `client` holds now: messages stored, and the rate refusals (scope, limit).
fn drain(t: &mut Tree, client: ConnId, stored: &mut u64, refusals: &mut Vec<(String, Quota)>) {
    while let Some(answer) = t.h.try_recv(client) {
        match answer {
            Wire::PushAck(ack) => *stored += ack.ids.len() as u64,
            Wire::Error(ErrorReply {
                code: ErrorCode::RateLimited,
                quota: Some(rate),
                retry_after_ms: Some(after),
                ..
            }) => {
                assert!((1..=1000).contains(&after), "retry after {after} ms");
                refusals.push((rate.scope, rate.which));
            }
            Wire::Error(ErrorReply {
                code: ErrorCode::Overloaded,
                ..
            }) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

#[test]
fn a_principal_s_push_rate_holds_over_all_the_leaves_it_pushes_through() {
    // Goal: principal `alice` limited to 100 messages/s (burst 100) is admitted burst + rate
    // × time ± 10 % over 2 s although it pushes through all four leaves at 25 times the
    // rate; refusals name `@alice` and its push rate; `bob`, in the same namespace, is not
    // limited by alice's rate.
    let mut t = tree(16);
    let limits = Limits {
        push_rate: rate(100, 100),
        ..Limits::default()
    };
    set_limits(&mut t, "@alice", limits);
    settle_limits(&mut t);
    let alice: Vec<ConnId> = (0..4)
        .map(|i| {
            let who = principal("alice", &["orders:produce"]);
            t.h.client_as(t.leaves[i], PeerKind::Producer, Some(who))
        })
        .collect();
    let bob = t.h.client_as(
        t.leaves[0],
        PeerKind::Producer,
        Some(principal("bob", &["orders:produce"])),
    );
    let (mut stored, mut bob_stored) = (0, 0);
    let mut refusals = Vec::new();
    let mut bob_refusals = Vec::new();
    for step in 0..1000 {
        // Every 2 ms a batch of 5 through the next leaf: 2,500 messages/s offered.
        t.h.send(alice[step % 4], batch("orders/eu", 5));
        if step % 100 == 0 {
            t.h.send(bob, batch("orders/us", 5));
        }
        t.h.advance(Duration::from_millis(2));
        for &client in &alice {
            drain(&mut t, client, &mut stored, &mut refusals);
        }
        drain(&mut t, bob, &mut bob_stored, &mut bob_refusals);
    }
    // Batches still held get their answers.
    t.h.advance(Duration::from_millis(500));
    for &client in &alice {
        drain(&mut t, client, &mut stored, &mut refusals);
    }
    let expected = 100.0 + 100.0 * 2.0;
    assert!(
        (stored as f64 - expected).abs() <= expected * 0.1,
        "alice stored {stored}, expected {expected} ± 10 %"
    );
    assert!(!refusals.is_empty());
    assert!(
        refusals
            .iter()
            .all(|(scope, which)| scope == "@alice" && *which == Quota::PushRate),
        "{refusals:?}"
    );
    assert_eq!((bob_stored, bob_refusals.len()), (50, 0));
    let (stats, _) = stats_of(&mut t.h, t.consumer, "orders/eu");
    assert_eq!(stats.messages(), stored);
}

/// The answer to a pop of up to 16 of `topic` through `consumer`, without a wait.
fn pop_now(t: &mut Tree, consumer: ConnId, topic: &str, lease_ms: Option<u64>) -> Wire {
    let request = t.h.request();
    let pop = Pop {
        request,
        topic: topic.into(),
        max: 16,
        wait_ms: 0,
        lease_ms,
        ..Pop::default()
    };
    t.h.send(consumer, Wire::Pop(pop));
    t.h.recv(consumer)
}

/// Pops `topic` (max 16, no wait) through `consumer` and acks what it got: the number of
/// deliveries, or the pop rate's refusal (scope, which, retry after).
fn pop_once(t: &mut Tree, consumer: ConnId, topic: &str) -> Result<usize, (String, Quota, u64)> {
    match pop_now(t, consumer, topic, None) {
        Wire::PopReply(reply) => {
            let receipts: Vec<Receipt> = reply.deliveries.iter().map(|d| d.receipt()).collect();
            let count = receipts.len();
            if count > 0 {
                assert!(t.h.ack(consumer, receipts).iter().all(Result::is_ok));
            }
            Ok(count)
        }
        Wire::Error(ErrorReply {
            code: ErrorCode::RateLimited,
            quota: Some(rate),
            retry_after_ms: Some(after),
            ..
        }) => Err((rate.scope, rate.which, after)),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn pop_rates_of_a_namespace_and_of_a_principal_are_kept_by_the_root() {
    // Goal: namespace `orders` limited to 20 pops/s (burst 10) delivers burst + rate × time
    // over 2 s to a consumer popping every 10 ms; a refused pop names the scope, the limit,
    // and when a token comes; another namespace is not limited; principal `carol`'s own pop
    // rate (5/s, burst 5) holds in a namespace without one; nothing refused is lost.
    let mut t = tree(16);
    let producer = t.producers[0];
    for topic in ["orders/eu", "billing/eu"] {
        for _ in 0..4 {
            t.h.push(producer, topic, &[1; 50]);
        }
    }
    let orders = Limits {
        pop_rate: rate(20, 10),
        ..Limits::default()
    };
    set_limits(&mut t, "orders/", orders);
    let carol_limits = Limits {
        pop_rate: rate(5, 5),
        ..Limits::default()
    };
    set_limits(&mut t, "@carol", carol_limits);
    settle_limits(&mut t);
    let carol = t.h.client_as(
        t.root,
        PeerKind::Consumer,
        Some(principal("carol", &["billing:consume"])),
    );
    let consumer = t.consumer;
    let (mut orders_popped, mut billing_popped, mut carol_popped) = (0, 0, 0);
    let mut refused = 0;
    for _ in 0..200 {
        match pop_once(&mut t, consumer, "orders/eu") {
            Ok(n) => orders_popped += n,
            Err((scope, which, after)) => {
                assert_eq!((scope.as_str(), which), ("orders/", Quota::PopRate));
                assert!((1..=50).contains(&after), "a token every 50 ms: {after}");
                refused += 1;
            }
        }
        if let Ok(n) = pop_once(&mut t, carol, "billing/eu") {
            carol_popped += n;
        }
        t.h.advance(Duration::from_millis(10));
    }
    let expected = 10.0 + 20.0 * 2.0;
    assert!(
        (orders_popped as f64 - expected).abs() <= expected * 0.1,
        "orders popped {orders_popped}, expected {expected} ± 10 %"
    );
    assert!(refused > 100, "refused {refused}");
    let expected = 5.0 + 5.0 * 2.0;
    assert!(
        (carol_popped as f64 - expected).abs() <= expected * 0.2,
        "carol popped {carol_popped}, expected {expected} ± 1 token"
    );
    // The host's consumer has no principal: only namespaces limit it.
    while let Ok(n @ 1..) = pop_once(&mut t, consumer, "billing/eu") {
        billing_popped += n;
    }
    assert_eq!(carol_popped + billing_popped, 200);
    // Without the limit, everything the rate held back is there.
    set_limits(&mut t, "orders/", Limits::default());
    let (stats, _) = stats_of(&mut t.h, t.consumer, "orders/eu");
    assert_eq!(stats.messages(), 200 - orders_popped as u64);
    let AdminResult::Stats(all) = admin(&mut t.h, t.consumer, AdminOp::Stats { topic: None })
    else {
        panic!("stats");
    };
    let carol_scope = all
        .limits
        .iter()
        .find(|s| s.scope == "@carol")
        .expect("shown");
    assert_eq!(carol_scope.popped, carol_popped as u64);
    assert!(carol_scope.refused.pops_rate_limited > 100);
}

#[test]
fn a_principal_s_limits_are_rates_set_by_an_admin_of_every_namespace() {
    // Goal: `@NAME` configures principal NAME's rates only: a quota on it is refused, so is
    // a topic named `@...`, and setting it takes `admin` on `*` (admin of one namespace is
    // not enough).
    let mut t = tree(16);
    let limits = Limits {
        messages_max: Some(10),
        ..Limits::default()
    };
    let quota = configure("@alice", limits);
    let request = t.h.request();
    t.h.send(t.consumer, Wire::Admin(Admin { request, op: quota }));
    match t.h.recv(t.consumer) {
        Wire::Error(e) if e.code == ErrorCode::InvalidArgument => {
            assert!(e.message.contains("principal"), "{}", e.message);
        }
        other => panic!("unexpected {other:?}"),
    }
    let request = t.h.request();
    t.h.send(
        t.producers[0],
        Wire::Push(Push {
            request,
            messages: vec![PushMessage {
                topic: "@alice".into(),
                ..PushMessage::default()
            }],
        }),
    );
    match t.h.recv(t.producers[0]) {
        Wire::Error(e) if e.code == ErrorCode::InvalidArgument => {
            assert!(e.message.contains("'@'"), "{}", e.message);
        }
        other => panic!("unexpected {other:?}"),
    }
    let orders_admin = t.h.client_as(
        t.root,
        PeerKind::Consumer,
        Some(principal("ops", &["orders:admin"])),
    );
    let limits = Limits {
        push_rate: rate(10, 10),
        ..Limits::default()
    };
    let rates = configure("@alice", limits);
    let request = t.h.request();
    t.h.send(orders_admin, Wire::Admin(Admin { request, op: rates }));
    match t.h.recv(orders_admin) {
        Wire::Error(e) if e.code == ErrorCode::Forbidden => {
            assert!(e.message.contains("\"*\""), "{}", e.message);
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// Pops up to 16 of `topic` (no wait, `lease_ms` visibility) without settling them: the
/// deliveries, or the quota that refused the pop.
fn pop_leased(
    t: &mut Tree,
    topic: &str,
    lease_ms: u64,
) -> Result<Vec<Delivery>, crate::quota::QuotaExceeded> {
    let consumer = t.consumer;
    match pop_now(t, consumer, topic, Some(lease_ms)) {
        Wire::PopReply(reply) => Ok(reply.deliveries),
        Wire::Error(ErrorReply {
            code: ErrorCode::QuotaExceeded,
            quota: Some(quota),
            ..
        }) => Err(*quota),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Pops `topic` until the in-flight quota refuses; the deliveries.
fn pop_until_refused(t: &mut Tree, topic: &str, lease_ms: u64) -> Vec<Delivery> {
    let mut all = Vec::new();
    loop {
        match pop_leased(t, topic, lease_ms) {
            Ok(deliveries) => {
                assert!(!deliveries.is_empty(), "ran dry before the quota");
                all.extend(deliveries);
            }
            Err(quota) => {
                assert_eq!(
                    (quota.scope.as_str(), quota.which, quota.limit),
                    ("orders/", Quota::InFlight, 30)
                );
                return all;
            }
        }
    }
}

#[test]
fn an_in_flight_quota_holds_over_every_leaf_and_frees_as_deliveries_settle_or_expire() {
    // Goal: namespace `orders` limited to 30 messages in flight delivers exactly 30 from
    // messages on all four leaves and two topics, then refuses pops `QuotaExceeded` naming
    // the quota; another namespace is not limited; acking 10 frees 10 once the leaves
    // report it; expired leases free theirs; nothing refused is lost.
    let mut t = tree(16);
    for i in 0..4 {
        let producer = t.producers[i];
        t.h.push(producer, ["orders/eu", "orders/us"][i % 2], &[1; 25]);
        t.h.push(producer, "billing/eu", &[1; 10]);
    }
    let limits = Limits {
        in_flight_max: Some(30),
        ..Limits::default()
    };
    set_limits(&mut t, "orders/", limits);
    settle_limits(&mut t);
    let mut leased = pop_until_refused(&mut t, "orders/eu", 60_000);
    leased.extend(pop_until_refused(&mut t, "orders/us", 60_000));
    assert_eq!(leased.len(), 30);
    let leaves: std::collections::BTreeSet<LeafId> = leased.iter().map(|d| d.id.leaf()).collect();
    assert!(leaves.len() >= 2, "from several leaves: {leaves:?}");
    let billing = t.h.pop(t.consumer, "billing/eu", 16);
    assert_eq!(billing.len(), 16, "another namespace is not limited");
    let (_, all) = stats_of(&mut t.h, t.consumer, "orders/eu");
    let scope = all
        .limits
        .iter()
        .find(|s| s.scope == "orders/")
        .expect("shown");
    assert_eq!(scope.in_flight, 30);
    assert!(scope.refused.pops_over_in_flight >= 2);

    // Settled deliveries free their room once the leaves report (every `quota_report_ms`).
    let acked: Vec<Receipt> = leased.drain(..10).map(|d| d.receipt()).collect();
    assert!(t.h.ack(t.consumer, acked).iter().all(Result::is_ok));
    settle_limits(&mut t);
    let more = pop_until_refused(&mut t, "orders/eu", 1_000);
    assert_eq!(more.len(), 10);
    // Expired leases too: those 10 were leased for 1 s.
    t.h.advance(Duration::from_millis(1_500));
    let again = pop_until_refused(&mut t, "orders/eu", 60_000);
    assert_eq!(again.len(), 10);
    // Nothing was lost: 100 pushed, 10 acknowledged.
    let held: u64 = ["orders/eu", "orders/us"]
        .iter()
        .map(|topic| stats_of(&mut t.h, t.consumer, topic).0.messages())
        .sum();
    assert_eq!(held, 90);
}

#[test]
fn a_restarted_root_gives_no_second_burst_of_a_pop_rate() {
    // Goal: a pop bucket holds at most what it gathered since its root heard the leaves, so
    // replacing the root does not hand consumers the burst again. Method: a namespace at 10
    // pops/s with a burst of 100; a root up for 20 s gives the burst at once; a fresh root in
    // its place, 500 ms after the leaves report to it, gives what 500 ms gathered.
    let mut t = tree(16);
    let producer = t.producers[0];
    for _ in 0..16 {
        t.h.push(producer, "orders/eu", &[1; 16]);
    }
    set_limits(
        &mut t,
        "orders/",
        Limits {
            pop_rate: rate(10, 100),
            ..Limits::default()
        },
    );
    t.h.advance(Duration::from_secs(20));
    let until_refused = |t: &mut Tree, consumer: ConnId| {
        let mut popped = 0;
        while let Ok(n) = pop_once(t, consumer, "orders/eu") {
            assert!(n > 0, "the topic holds more than any bucket here");
            popped += n;
        }
        popped
    };
    let consumer = t.consumer;
    let first = until_refused(&mut t, consumer);
    assert_eq!(first, 100, "a root up for 20 s gives the whole burst");

    let root = replace_root(&mut t, settings(16));
    settle_limits(&mut t);
    let consumer = t.h.client(root, PeerKind::Consumer);
    let second = until_refused(&mut t, consumer);
    assert!(
        (4..=6).contains(&second),
        "a fresh root gives what 500 ms gathered at 10/s, not the burst: {second}"
    );
}
