use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

const INTERVAL: Duration = Duration::from_millis(100);
const LEAST: Amount = Amount {
    messages: 10,
    bytes: 1000,
};

/// The report of a leaf that holds nothing (leaf 2).
fn report_nothing(allowances: &mut Allowances, now: Time) -> Usage {
    let none = Holdings::default();
    allowances
        .report(now, LeafId(2), &none, INTERVAL, LEAST)
        .expect("owed")
}

/// The ledger's grant for `usage`, every leaf heard from.
fn answer(ledger: &mut Ledger, usage: &Usage) -> Option<Grant> {
    ledger
        .report(Time::from_millis(1), usage, &[], Duration::ZERO)
        .grant
}

fn scope_name(name: &str) -> String {
    name.to_string()
}

fn limited(allowances: &mut Allowances, now: Time, scope: &str, version: u64, limits: Limits) {
    let name = scope_name(scope);
    allowances.sync(now, std::iter::once((&name, Time(version), limits)), 16);
}

fn messages_max(max: u64) -> Limits {
    Limits {
        messages_max: Some(max),
        ..Limits::default()
    }
}

/// One leaf as the ledger sees it: its allowances and what it holds.
struct TestLeaf {
    id: LeafId,
    allowances: Allowances,
    held: u64,
}

impl TestLeaf {
    fn new(id: u16, now: Time, limits: Limits) -> TestLeaf {
        let mut allowances = Allowances::default();
        limited(&mut allowances, now, "orders/", 1, limits);
        TestLeaf {
            id: LeafId(id),
            allowances,
            held: 0,
        }
    }

    fn push(&mut self, now: Time, count: usize) -> Result<(), Shortfall> {
        let batch = vec![("orders/a", 10_u64); count];
        self.allowances.admit(now, batch.into_iter())?;
        self.held += count as u64;
        Ok(())
    }

    /// Reports, and takes the answer at once.
    fn exchange(&mut self, now: Time, ledger: &mut Ledger) {
        let usage = self.report(now);
        let grant = answer(ledger, &usage).expect("answered");
        self.allowances.grant(&grant);
    }

    fn report(&mut self, now: Time) -> Usage {
        let used = HashMap::from([(
            "orders/".to_string(),
            Amount {
                messages: self.held,
                bytes: self.held * 10,
            },
        )]);
        let holdings = Holdings {
            used,
            ..Holdings::default()
        };
        self.allowances
            .report(now, self.id, &holdings, INTERVAL, LEAST)
            .expect("a limited scope")
    }
}

#[test]
fn a_leaf_without_a_grant_asks_and_then_admits_within_it() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut leaf = TestLeaf::new(1, now, messages_max(100));
    assert!(matches!(leaf.push(now, 1), Err(Shortfall::Waiting { .. })));
    assert_eq!(
        leaf.allowances.due(),
        Some(now),
        "a short leaf reports at once"
    );
    let grant = answer(&mut ledger, &leaf.report(now)).expect("answered");
    assert_eq!(grant.scopes[0].ceiling.expect("known").messages, 100);
    // It wanted the refused message and the least share (11), and got a share of what is
    // free: half of it, in a tree of one leaf.
    assert_eq!(grant.scopes[0].granted.messages, 50);
    leaf.allowances.grant(&grant);
    leaf.push(now, 50).expect("within the grant");
    assert!(matches!(leaf.push(now, 1), Err(Shortfall::Waiting { .. })));
}

#[test]
fn the_tree_wide_limit_refuses_with_the_scope_and_limit() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut leaf = TestLeaf::new(1, now, messages_max(5));
    let _ = leaf.push(now, 20);
    let grant = answer(&mut ledger, &leaf.report(now)).expect("answered");
    assert_eq!(grant.scopes[0].granted.messages, 5);
    assert_eq!(grant.scopes[0].ceiling.expect("known").messages, 5);
    leaf.allowances.grant(&grant);
    leaf.push(now, 5).expect("the five the limit leaves");
    let refusal = leaf.push(now, 1).expect_err("at the limit");
    let expected = QuotaExceeded {
        scope: "orders/".into(),
        which: Quota::Messages,
        limit: 5,
    };
    assert_eq!(refusal, Shortfall::Exceeded(expected.clone()));
    assert_eq!(
        expected.to_string(),
        "namespace orders would hold more messages than its messages_max 5"
    );
}

#[test]
fn a_message_larger_than_the_limit_is_refused_by_the_leaf_alone() {
    let now = Time::from_millis(1);
    let mut allowances = Allowances::default();
    let limits = Limits {
        message_bytes_max: Some(100),
        ..Limits::default()
    };
    limited(&mut allowances, now, "orders/big", 1, limits);
    allowances
        .admit(now, [("orders/big", 100)].into_iter())
        .expect("at the limit");
    allowances
        .admit(now, [("orders/small", 1000)].into_iter())
        .expect("another topic");
    let refusal = allowances.admit(now, [("orders/big", 101)].into_iter());
    assert_eq!(
        refusal,
        Err(Shortfall::Exceeded(QuotaExceeded {
            scope: "orders/big".into(),
            which: Quota::MessageBytes,
            limit: 100,
        }))
    );
}

#[test]
fn an_idle_leaf_gives_its_allowance_back_for_the_others() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut a = TestLeaf::new(1, now, messages_max(30));
    let mut b = TestLeaf::new(2, now, messages_max(30));
    let _ = a.push(now, 10);
    a.exchange(now, &mut ledger);
    a.push(now, 10).expect("granted");
    // b, busy, gets what a does not hold: a asked for 20, holds 10 of them.
    let _ = b.push(now, 25);
    let grant = answer(&mut ledger, &b.report(now)).expect("answered");
    assert_eq!(grant.scopes[0].granted.messages, 10);
    b.allowances.grant(&grant);
    // a goes idle: its report after two quiet intervals gives the rest back, and b's next
    // report gets it.
    a.exchange(now + INTERVAL, &mut ledger);
    a.exchange(now + INTERVAL * 2, &mut ledger);
    let later = now + INTERVAL * 3;
    a.exchange(later, &mut ledger);
    b.push(later, 10).expect("granted before");
    let _ = b.push(later, 15);
    let grant = answer(&mut ledger, &b.report(later)).expect("answered");
    b.allowances.grant(&grant);
    b.push(later, 10).expect("a's unused share");
    assert_eq!(a.held + b.held, 30);
    assert!(matches!(b.push(later, 1), Err(Shortfall::Exceeded(_))));
}

#[test]
fn a_restarted_leaf_starts_over_and_its_former_grants_are_forgotten() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut leaf = TestLeaf::new(1, now, messages_max(50));
    let _ = leaf.push(now, 30);
    leaf.exchange(now, &mut ledger);
    leaf.push(now, 30).expect("granted");
    // The new incarnation holds what the former stored, with nothing granted.
    let later = now + INTERVAL;
    let mut again = TestLeaf::new(1, later, messages_max(50));
    again.held = 30;
    let _ = again.push(later, 30);
    let grant = answer(&mut ledger, &again.report(later)).expect("answered");
    assert_eq!(grant.scopes[0].granted.messages, 20, "50 - 30 held");
    // A late report of the former incarnation is ignored.
    assert!(answer(&mut ledger, &leaf.report(now)).is_none());
    let standing = ledger.stats(|_| true).pop().expect("one scope");
    assert_eq!(standing.used.messages, 30);
    assert_eq!(standing.bound.messages, 50);
}

#[test]
fn a_changed_limit_returns_what_was_granted_under_the_old_one() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut leaf = TestLeaf::new(1, now, messages_max(1000));
    let _ = leaf.push(now, 100);
    leaf.exchange(now, &mut ledger);
    leaf.push(now, 50).expect("granted");
    limited(&mut leaf.allowances, now, "orders/", 2, messages_max(60));
    assert!(matches!(leaf.push(now, 1), Err(Shortfall::Waiting { .. })));
    let grant = answer(&mut ledger, &leaf.report(now)).expect("answered");
    leaf.allowances.grant(&grant);
    assert_eq!(
        ledger
            .stats(|_| true)
            .pop()
            .expect("one")
            .limits
            .messages_max,
        Some(60)
    );
    leaf.push(now, 10).expect("up to the new limit");
    // The last answer said how far the leaf could go: at the limit, refused at once.
    assert!(matches!(leaf.push(now, 1), Err(Shortfall::Exceeded(_))));
}

#[test]
fn a_scope_no_leaf_limits_any_more_is_forgotten() {
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut leaf = TestLeaf::new(1, now, messages_max(10));
    answer(&mut ledger, &leaf.report(now));
    assert_eq!(ledger.stats(|_| true).len(), 1);
    let none: [(&String, Time, Limits); 0] = [];
    leaf.allowances.sync(now, none.into_iter(), 16);
    let report = Usage {
        leaf: leaf.id,
        epoch: leaf.allowances.epoch.expect("reported"),
        scopes: Vec::new(),
    };
    answer(&mut ledger, &report);
    assert_eq!(ledger.stats(|_| true).len(), 0);
}

proptest! {
    /// Whatever the leaves push, in whatever order the reports, grants and deletions come
    /// (grants delayed or lost), the scope never holds more than its limit.
    #[test]
    fn the_tree_never_holds_more_than_the_limit(
        limit in 1_u64..200,
        steps in proptest::collection::vec((0_u16..4, 0_u8..5, 1_usize..40), 1..300),
    ) {
        let mut now = Time::from_millis(1);
        let mut ledger = Ledger::default();
        let mut leaves: Vec<TestLeaf> =
            (1..=4).map(|id| TestLeaf::new(id, now, messages_max(limit))).collect();
        let mut in_flight: Vec<Grant> = Vec::new();
        for (leaf, action, count) in steps {
            now = now + Duration::from_millis(7);
            let leaf_index = usize::from(leaf);
            match action {
                0 => {
                    let _ = leaves[leaf_index].push(now, count);
                }
                1 => {
                    let usage = leaves[leaf_index].report(now);
                    if let Some(grant) = answer(&mut ledger, &usage) {
                        in_flight.push(grant);
                    }
                }
                2 => {
                    // A grant arrives (possibly out of order).
                    if !in_flight.is_empty() {
                        let grant = in_flight.remove(count % in_flight.len());
                        let to = usize::from(grant.leaf.0) - 1;
                        leaves[to].allowances.grant(&grant);
                    }
                }
                3 => {
                    // A grant is lost.
                    if !in_flight.is_empty() {
                        in_flight.remove(count % in_flight.len());
                    }
                }
                _ => {
                    // Consumers take some messages away.
                    let held = &mut leaves[leaf_index].held;
                    *held = held.saturating_sub(count as u64);
                }
            }
            let held: u64 = leaves.iter().map(|l| l.held).sum();
            prop_assert!(held <= limit, "held {held} over limit {limit}");
        }
    }
}

#[test]
fn a_new_root_grants_nothing_until_every_leaf_reported_or_the_wait_passed() {
    // A root that restarted does not know what leaf 2 holds: granting leaf 1 the whole limit
    // could pass it.
    let now = Time::from_millis(1);
    let wait = Duration::from_secs(2);
    let subtree = [LeafId(1), LeafId(2)];
    let mut ledger = Ledger::default();
    let mut one = TestLeaf::new(1, now, messages_max(100));
    let mut two = TestLeaf::new(2, now, messages_max(100));
    two.held = 90;
    let _ = one.push(now, 50);
    let first = ledger.report(now, &one.report(now), &subtree, wait);
    let grant = first.grant.expect("answered");
    assert_eq!(grant.scopes[0].granted.messages, 0, "leaf 2 unheard of");
    assert_eq!(grant.scopes[0].ceiling, None, "waiting, not full");
    ledger.report(now, &two.report(now), &subtree, wait);
    let _ = one.push(now, 50);
    let grant = ledger.report(now, &one.report(now), &subtree, wait).grant;
    assert_eq!(grant.expect("answered").scopes[0].granted.messages, 10);
    // With leaf 2 silent, the wait ends the wait.
    let mut fresh = Ledger::default();
    let later = now + wait;
    let _ = one.push(later, 1);
    let grant = fresh.report(now, &one.report(now), &subtree, wait).grant;
    assert_eq!(grant.expect("answered").scopes[0].granted.messages, 0);
    let _ = one.push(later, 1);
    let grant = fresh
        .report(later, &one.report(later), &subtree, wait)
        .grant;
    assert!(grant.expect("answered").scopes[0].granted.messages > 0);
}

#[test]
fn a_leaf_that_lacks_a_limited_scope_or_has_an_older_one_is_named_for_repair_once_a_wait() {
    let now = Time::from_millis(1);
    let wait = Duration::from_secs(2);
    let mut ledger = Ledger::default();
    let mut one = TestLeaf::new(1, now, messages_max(100));
    let answer = ledger.report(now, &one.report(now), &[], wait);
    assert!(answer.stale.is_empty());
    // Leaf 2 was away when the quota was set: it reports no scope.
    let mut two = Allowances::default();
    two.greet(now);
    let usage = report_nothing(&mut two, now);
    assert!(usage.scopes.is_empty());
    let answer = ledger.report(now, &usage, &[], wait);
    assert!(answer.grant.is_none());
    assert_eq!(answer.stale, vec!["orders/".to_string()]);
    // Not asked again within the wait, asked again after it.
    two.greet(now);
    let usage = report_nothing(&mut two, now);
    assert!(ledger.report(now, &usage, &[], wait).stale.is_empty());
    let later = now + wait;
    assert_eq!(ledger.report(later, &usage, &[], wait).stale.len(), 1);
    // Leaf 1 has a newer configuration: leaf 2's older one is stale too.
    limited(&mut one.allowances, later, "orders/", 2, messages_max(50));
    ledger.report(later, &one.report(later), &[], wait);
    let mut old = TestLeaf::new(2, later, messages_max(100));
    let much_later = later + wait;
    let stale = ledger
        .report(much_later, &old.report(much_later), &[], wait)
        .stale;
    assert_eq!(stale, vec!["orders/".to_string()]);
}

#[test]
fn a_short_leaf_has_the_root_ask_the_others_for_what_they_hold_unused() {
    // Leaf 1 holds 15 unused of a quota of 20; leaf 2 needs 10: it waits (not refused), leaf 1
    // is asked to give back, does so without taking it right back, and leaf 2 gets it.
    let now = Time::from_millis(1);
    let mut ledger = Ledger::default();
    let mut one = TestLeaf::new(1, now, messages_max(20));
    let mut two = TestLeaf::new(2, now, messages_max(20));
    let _ = one.push(now, 5);
    one.exchange(now, &mut ledger);
    one.push(now, 5).expect("granted");
    let _ = two.push(now, 10);
    let answer = ledger.report(now, &two.report(now), &[], INTERVAL);
    let grant = answer.grant.expect("answered");
    assert_eq!(grant.scopes[0].granted.messages, 5, "all that is free");
    two.allowances.grant(&grant);
    assert!(
        matches!(two.push(now, 10), Err(Shortfall::Waiting { .. })),
        "it could fit"
    );
    assert_eq!(answer.reclaim.len(), 1);
    assert_eq!(answer.reclaim[0].leaf, LeafId(1));
    one.allowances.grant(&answer.reclaim[0]);
    assert_eq!(one.allowances.due(), Some(Time::ZERO), "reports at once");
    let usage = one.report(now);
    assert_eq!(
        usage.scopes[0].want,
        Amount::default(),
        "takes nothing back"
    );
    ledger.report(now, &usage, &[], INTERVAL);
    two.exchange(now, &mut ledger);
    two.push(now, 10).expect("leaf 1's unused share");
    assert_eq!(one.held + two.held, 15);
    let refused = two.push(now, 6).expect_err("past the quota");
    assert!(matches!(refused, Shortfall::Exceeded(_)), "{refused:?}");
}

proptest! {
    /// A refusal for the quota is never early: whatever the delays, with reports and grants
    /// each in order on their links (grants, reclaims and give-backs crossing reports the
    /// leaf sent before they arrived), a batch refused as `QuotaExceeded` would have passed
    /// the limit with what the tree holds.
    #[test]
    fn a_quota_refusal_means_the_batch_would_pass_the_limit(
        limit in 20_u64..300,
        steps in proptest::collection::vec((0_u16..4, 0_u8..4, 1_usize..40), 1..400),
    ) {
        let mut now = Time::from_millis(1);
        let mut ledger = Ledger::default();
        let mut leaves: Vec<TestLeaf> =
            (1..=4).map(|id| TestLeaf::new(id, now, messages_max(limit))).collect();
        let mut up: Vec<VecDeque<Usage>> = vec![VecDeque::new(); 4];
        let mut down: Vec<VecDeque<Grant>> = vec![VecDeque::new(); 4];
        for (leaf, action, count) in steps {
            now = now + Duration::from_millis(7);
            let leaf_index = usize::from(leaf);
            match action {
                0 => {
                    let held: u64 = leaves.iter().map(|l| l.held).sum();
                    if let Err(Shortfall::Exceeded(quota)) = leaves[leaf_index].push(now, count) {
                        prop_assert!(
                            held + count as u64 > limit,
                            "{count} refused ({quota:?}) with {held} held of {limit}"
                        );
                    }
                }
                1 => {
                    let usage = leaves[leaf_index].report(now);
                    up[leaf_index].push_back(usage);
                }
                2 => {
                    // The root takes the leaf's oldest report; its answers go down in order.
                    if let Some(usage) = up[leaf_index].pop_front() {
                        let answer = ledger.report(now, &usage, &[], Duration::ZERO);
                        down[leaf_index].extend(answer.grant);
                        for reclaim in answer.reclaim {
                            down[usize::from(reclaim.leaf.0) - 1].push_back(reclaim);
                        }
                    }
                }
                _ => {
                    if let Some(grant) = down[leaf_index].pop_front() {
                        leaves[leaf_index].allowances.grant(&grant);
                    }
                }
            }
            let held: u64 = leaves.iter().map(|l| l.held).sum();
            prop_assert!(held <= limit, "held {held} over limit {limit}");
        }
    }
}
