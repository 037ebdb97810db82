//! FIFO topics (`leaf/fifo.rs`): a group's messages go in order, one run at a time; none of a
//! group is served while one of it is leased; other groups go on meanwhile.

use super::*;
use crate::config::TopicSettings;
use crate::wire::{Settle, TopicConfig};

fn fifo_tree() -> Tree {
    let mut settings = settings(4);
    settings.topics.insert(
        "jobs".into(),
        TopicSettings {
            fifo: Some(true),
            ..TopicSettings::default()
        },
    );
    tree_with(settings)
}

/// Pushes one message of group `group` (its fairness key) through `producer`.
fn push_grouped(t: &mut Tree, producer: ConnId, group: &str, payload: &'static str) -> MessageId {
    let message = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        payload: Bytes::from_static(payload.as_bytes()),
        fairness_key: Some(group.into()),
        ..PushMessage::default()
    };
    t.h.push_messages(producer, vec![message])[0]
}

/// Nacks `receipts` without delay: each message is ready again at once, with its key.
fn give_back(t: &mut Tree, receipts: Vec<Receipt>) {
    let count = receipts.len();
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: None,
    };
    assert_eq!(t.h.settle(t.consumer, nack, receipts), vec![Ok(()); count]);
}

fn payloads(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries
        .iter()
        .map(|d| std::str::from_utf8(&d.payload).unwrap())
        .collect()
}

#[test]
fn one_pop_takes_a_groups_run_in_order() {
    let mut t = fifo_tree();
    let producer = t.producers[0];
    for (group, payload) in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("a", "a3")] {
        push_grouped(&mut t, producer, group, payload);
    }
    let got = t.h.pop(t.consumer, "jobs", 10);
    let mut got = payloads(&got);
    got.sort_by_key(|p| p.as_bytes()[0]);
    assert_eq!(got, ["a1", "a2", "a3", "b1"], "every run, each in order");
    assert!(t.h.pop(t.consumer, "jobs", 10).is_empty(), "all leased");
}

#[test]
fn a_group_waits_while_one_of_it_is_leased_and_others_go_on() {
    let mut t = fifo_tree();
    let producer = t.producers[0];
    for (group, payload) in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")] {
        push_grouped(&mut t, producer, group, payload);
    }
    let a1 = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(payloads(&a1), ["a1"]);
    // a2 is held while a1 is leased: group b's head comes next, then nothing.
    let b1 = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(payloads(&b1), ["b1"]);
    assert!(
        t.h.pop(t.consumer, "jobs", 1).is_empty(),
        "both groups held"
    );

    // A nack gives a1 back at the head of its group (it keeps its key).
    give_back(&mut t, vec![a1[0].receipt()]);
    let again = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(payloads(&again), ["a1"]);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(
        t.h.ack(t.consumer, vec![again[0].receipt(), b1[0].receipt()]),
        vec![Ok(()), Ok(())]
    );
    let rest = t.h.pop(t.consumer, "jobs", 10);
    let mut rest = payloads(&rest);
    rest.sort_unstable();
    assert_eq!(
        rest,
        ["a2", "b2"],
        "each group's next, once its lease ended"
    );
}

#[test]
fn an_expired_lease_gives_its_group_back_and_a_topic_made_fifo_at_run_time_holds_its_groups() {
    let mut t = tree(4);
    let producer = t.producers[0];
    for (group, payload) in [("a", "a1"), ("a", "a2")] {
        push_grouped(&mut t, producer, group, payload);
    }
    // Not FIFO yet: both of group a go to two pops.
    let first = t.h.pop(t.consumer, "jobs", 1);
    assert_eq!(payloads(&first), ["a1"]);
    let config = TopicConfig {
        settings: TopicSettings {
            fifo: Some(true),
            ..TopicSettings::default()
        },
        ..TopicConfig::default()
    };
    super::configs::configure(&mut t.h, t.consumer, "jobs", config);
    // FIFO now, with a1 leased: a2 is held.
    assert!(
        t.h.pop(t.consumer, "jobs", 1).is_empty(),
        "a2 held behind a1"
    );
    t.h.advance(Duration::from_millis(
        Settings::default().lease_timeout_ms + 1_000,
    ));
    let again = t.h.pop(t.consumer, "jobs", 10);
    assert_eq!(payloads(&again), ["a1", "a2"], "a1 again first, a2 with it");
}

#[test]
fn a_group_opens_when_its_first_message_is_given_back_while_a_later_one_is_leased() {
    let mut t = fifo_tree();
    let producer = t.producers[0];
    for payload in ["a1", "a2"] {
        push_grouped(&mut t, producer, "a", payload);
    }
    let run = t.h.pop(t.consumer, "jobs", 2);
    assert_eq!(payloads(&run), ["a1", "a2"]);
    // a1 back while a2 stays leased: a1 is the group's first again, so the group is open.
    give_back(&mut t, vec![run[0].receipt()]);
    let again = t.h.pop(t.consumer, "jobs", 10);
    assert_eq!(payloads(&again), ["a1"]);
    assert_eq!(t.h.ack(t.consumer, vec![again[0].receipt()]), vec![Ok(())]);
    // a2 is now the group's first, and leased: nothing of the group until it ends.
    push_grouped(&mut t, producer, "a", "a3");
    assert!(
        t.h.pop(t.consumer, "jobs", 10).is_empty(),
        "a3 waits for a2"
    );
    assert_eq!(t.h.ack(t.consumer, vec![run[1].receipt()]), vec![Ok(())]);
    assert_eq!(payloads(&t.h.pop(t.consumer, "jobs", 10)), ["a3"]);
}

#[test]
fn a_run_stops_at_a_message_another_pop_holds() {
    let mut t = fifo_tree();
    let producer = t.producers[0];
    for payload in ["a1", "a2", "a3"] {
        push_grouped(&mut t, producer, "a", payload);
    }
    let run = t.h.pop(t.consumer, "jobs", 3);
    assert_eq!(payloads(&run), ["a1", "a2", "a3"]);
    give_back(&mut t, vec![run[0].receipt(), run[2].receipt()]);
    // a1 and a3 are ready, a2 still leased: a pop takes a1 only, not a3 past a2.
    assert_eq!(payloads(&t.h.pop(t.consumer, "jobs", 10)), ["a1"]);
}
