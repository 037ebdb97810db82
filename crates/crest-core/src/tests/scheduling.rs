//! Weighted scheduling: tiers share pops by weight, each tier in key order, an empty tier's
//! share going to the others; a topic changed to weighted (and back) at run time.

use super::configs::configure;
use super::*;
use crate::config::{Scheduling, TopicSettings, Weights};
use crate::wire::TopicConfig;
use std::collections::BTreeMap;

fn weighted(settings: &mut Settings, topic: &str) {
    settings.topics.insert(
        topic.into(),
        TopicSettings {
            scheduling: Some(Scheduling::Weighted),
            ..TopicSettings::default()
        },
    );
}

/// Pops `count` messages of "jobs" one at a time (acked), returning their keys.
fn pop_keys(t: &mut Tree, count: usize) -> Vec<(u32, MessageId)> {
    let mut keys = Vec::with_capacity(count);
    for _ in 0..count {
        let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
        assert_eq!(t.h.ack(t.consumer, vec![delivery.receipt()]), vec![Ok(())]);
        keys.push((delivery.priority, delivery.id));
    }
    keys
}

fn count_by_priority(keys: &[(u32, MessageId)]) -> BTreeMap<u32, usize> {
    let mut counts = BTreeMap::new();
    for (priority, _) in keys {
        *counts.entry(*priority).or_default() += 1;
    }
    counts
}

/// Pushes `per_tier` messages of each priority in `priorities` through every leaf.
fn fill(t: &mut Tree, priorities: &[u32], per_tier: usize) -> Vec<(u32, MessageId)> {
    let mut pushed = Vec::new();
    for (at, producer) in t.producers.into_iter().enumerate() {
        let mine: Vec<u32> = priorities
            .iter()
            .flat_map(|p| std::iter::repeat_n(*p, per_tier / 4 + usize::from(at < per_tier % 4)))
            .collect();
        let ids = t.h.push(producer, "jobs", &mine);
        pushed.extend(mine.into_iter().zip(ids));
    }
    pushed
}

#[test]
fn weighted_tiers_share_pops_by_weight_each_tier_in_key_order() {
    // Two credits: every tier is far deeper than what the root holds of it.
    let mut settings = settings(2);
    weighted(&mut settings, "jobs");
    let mut t = tree_with(settings);
    let pushed = fill(&mut t, &[0, 1, 2, 3, 4, 7], 100);
    // Weights 8, 4, 2, 1, 0.5 (7 joins tier 4): 15.5 per round, ten rounds.
    let keys = pop_keys(&mut t, 155);
    let counts = count_by_priority(&keys);
    let tier_4 = counts.get(&4).copied().unwrap_or(0) + counts.get(&7).copied().unwrap_or(0);
    assert_eq!(
        (counts[&0], counts[&1], counts[&2], counts[&3], tier_4),
        (80, 40, 20, 10, 5),
        "{counts:?}"
    );
    assert!(
        !counts.contains_key(&7),
        "tier 4 in key order: priority 4 before 7"
    );
    // Within a tier, the key order: each leaf's messages of a priority in push order, and
    // every message popped was pushed, once.
    for tier in [0, 1, 2, 3, 4] {
        for leaf in 1..=4 {
            let got: Vec<MessageId> = keys
                .iter()
                .filter(|(p, id)| *p == tier && id.leaf() == LeafId(leaf))
                .map(|(_, id)| *id)
                .collect();
            let pushed: Vec<MessageId> = pushed
                .iter()
                .filter(|(p, id)| *p == tier && id.leaf() == LeafId(leaf))
                .map(|(_, id)| *id)
                .take(got.len())
                .collect();
            assert_eq!(got, pushed, "tier {tier} at leaf {leaf}");
        }
    }
}

#[test]
fn an_empty_tiers_share_goes_to_the_others_and_a_tier_coming_back_is_not_owed() {
    let mut settings = settings(4);
    weighted(&mut settings, "jobs");
    let mut t = tree_with(settings);
    fill(&mut t, &[0, 4], 80);
    // 8 : 0.5 while only tiers 0 and 4 have messages: 32 and 2 of 34.
    let counts = count_by_priority(&pop_keys(&mut t, 34));
    assert_eq!((counts[&0], counts.get(&4).copied()), (32, Some(2)));
    // Tier 2 arrives after a long time without it: it gets its weight from now on (2 of
    // 10.5 per round), not a burst for the pops it missed.
    fill(&mut t, &[2], 40);
    let counts = count_by_priority(&pop_keys(&mut t, 21));
    assert_eq!(
        (counts[&0], counts[&2], counts[&4]),
        (16, 4, 1),
        "{counts:?}"
    );
}

#[test]
fn a_strict_topic_beside_a_weighted_one_keeps_the_key_order() {
    let mut settings = settings(2);
    weighted(&mut settings, "other");
    let mut t = tree_with(settings);
    fill(&mut t, &[4, 0, 2], 8);
    let priorities: Vec<u32> = pop_keys(&mut t, 24).into_iter().map(|(p, _)| p).collect();
    let mut sorted = priorities.clone();
    sorted.sort_unstable();
    assert_eq!(priorities, sorted);
}

#[test]
fn a_topic_made_weighted_at_run_time_moves_its_waiting_messages_and_back() {
    let mut t = tree(2);
    fill(&mut t, &[0, 3], 60);
    // Strict: the first pops are all of priority 0.
    let counts = count_by_priority(&pop_keys(&mut t, 4));
    assert_eq!(counts[&0], 4);
    let config = |scheduling, weights| TopicConfig {
        settings: TopicSettings {
            scheduling: Some(scheduling),
            weights,
            ..TopicSettings::default()
        },
        ..TopicConfig::default()
    };
    let even = Weights {
        milli: [(0, 1000), (3, 1000)].into(),
    };
    let kept = configure(
        &mut t.h,
        t.consumer,
        "jobs",
        config(Scheduling::Weighted, Some(even)),
    );
    assert_eq!(kept, 4, "configured at every leaf");
    // Equal weights: the two tiers alternate.
    let counts = count_by_priority(&pop_keys(&mut t, 20));
    assert_eq!((counts[&0], counts[&3]), (10, 10), "{counts:?}");
    // The root's clock orders configurations: a later one.
    t.h.advance(Duration::from_millis(1));
    configure(
        &mut t.h,
        t.consumer,
        "jobs",
        config(Scheduling::Strict, None),
    );
    let counts = count_by_priority(&pop_keys(&mut t, 20));
    assert_eq!(counts.get(&3), None, "strict again: {counts:?}");
    // Nothing was lost nor held twice on the way: every message pops exactly once.
    let rest = pop_keys(&mut t, 120 - 44);
    let counts = count_by_priority(&rest);
    assert_eq!((counts[&0], counts[&3]), (26, 50));
    assert!(t.h.pop(t.consumer, "jobs", 1).is_empty());
}

/// Pushes `count` messages of priority `priority` with fairness key `key` through `producer`.
fn push_keyed(
    t: &mut Tree,
    producer: ConnId,
    key: Option<&str>,
    priority: u32,
    count: usize,
) -> Vec<MessageId> {
    let messages = (0..count)
        .map(|_| PushMessage {
            topic: "jobs".into(),
            priority,
            payload: Bytes::from_static(b"x"),
            fairness_key: key.map(str::to_string),
            ..PushMessage::default()
        })
        .collect();
    t.h.push_messages(producer, messages)
}

/// Pops `count` messages of "jobs" one at a time (acked): their fairness keys and ids.
fn pop_fair(h: &mut Harness, consumer: ConnId, count: usize) -> Vec<(String, MessageId)> {
    let mut got = Vec::with_capacity(count);
    for _ in 0..count {
        let delivery = h.pop(consumer, "jobs", 1).remove(0);
        assert_eq!(h.ack(consumer, vec![delivery.receipt()]), vec![Ok(())]);
        got.push((delivery.fairness_key.unwrap_or_default(), delivery.id));
    }
    got
}

fn count_by_key(got: &[(String, MessageId)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (key, _) in got {
        *counts.entry(key.clone()).or_default() += 1;
    }
    counts
}

#[test]
fn fairness_keys_share_their_tier_so_a_deep_key_cannot_starve_a_shallow_one() {
    // Goal: within a tier, pops rotate among the keys with ready messages, each key in key
    // order. Method: a noisy key's 400 messages pushed first (so in key order they all come
    // first), then two quiet keys' 20 each, on all four leaves; two credits per lane.
    for keyed in [false, true] {
        let mut settings = settings(2);
        settings.credits_per_key = 2;
        weighted(&mut settings, "jobs");
        let mut t = tree_with(settings);
        let mut pushed: BTreeMap<&str, Vec<MessageId>> = BTreeMap::new();
        for (key, count) in [("noisy", 100), ("quiet-a", 5), ("quiet-b", 5)] {
            for producer in t.producers {
                let fairness_key = keyed.then_some(key);
                let ids = push_keyed(&mut t, producer, fairness_key, 2, count);
                pushed.entry(key).or_default().extend(ids);
            }
        }
        let got = pop_fair(&mut t.h, t.consumer, 30);
        let counts = count_by_key(&got);
        if !keyed {
            // Without keys, the key order: the noisy backlog first.
            let noisy = &pushed["noisy"];
            assert!(got.iter().all(|(_, id)| noisy.contains(id)), "{counts:?}");
            continue;
        }
        assert_eq!(
            counts.values().copied().collect::<Vec<_>>(),
            vec![10, 10, 10],
            "equal shares while each key has messages: {counts:?}"
        );
        // Each key's messages in its own key order (per leaf: push order), none twice.
        for (key, ids) in &pushed {
            for leaf in 1..=4 {
                let got: Vec<MessageId> = got
                    .iter()
                    .filter(|(k, id)| k == key && id.leaf() == LeafId(leaf))
                    .map(|(_, id)| *id)
                    .collect();
                let mine: Vec<MessageId> = ids
                    .iter()
                    .filter(|id| id.leaf() == LeafId(leaf))
                    .take(got.len())
                    .copied()
                    .collect();
                assert_eq!(got, mine, "{key} at leaf {leaf}");
            }
        }
        // The quiet keys are done: the rest is the noisy key's, all of it, once.
        let rest = pop_fair(&mut t.h, t.consumer, 400 + 40 - 30);
        let counts = count_by_key(&rest);
        assert_eq!(counts.get("noisy"), Some(&390), "{counts:?}");
        assert!(t.h.pop(t.consumer, "jobs", 1).is_empty());
    }
}

#[test]
fn fairness_weights_share_a_tier_by_weight_and_tiers_keep_their_weights() {
    let mut settings = settings(4);
    settings.credits_per_key = 2;
    settings.topics.insert(
        "jobs".into(),
        TopicSettings {
            scheduling: Some(Scheduling::Weighted),
            weights: Some(Weights {
                milli: [(0, 3000), (4, 1000)].into(),
            }),
            fairness_weights: Some(crate::config::KeyWeights {
                milli: [("gold".to_string(), 3000)].into(),
            }),
            ..TopicSettings::default()
        },
    );
    let mut t = tree_with(settings);
    for producer in t.producers {
        push_keyed(&mut t, producer, Some("gold"), 0, 30);
        push_keyed(&mut t, producer, Some("silver"), 0, 30);
        push_keyed(&mut t, producer, None, 0, 30);
        push_keyed(&mut t, producer, Some("gold"), 4, 30);
    }
    // Tiers 3 : 1; within tier 0, gold 3 : silver 1 : no key 1.
    let mut tiers = BTreeMap::new();
    let mut keys = BTreeMap::new();
    for _ in 0..40 {
        let delivery = t.h.pop(t.consumer, "jobs", 1).remove(0);
        assert_eq!(t.h.ack(t.consumer, vec![delivery.receipt()]), vec![Ok(())]);
        *tiers.entry(delivery.priority).or_insert(0) += 1;
        if delivery.priority == 0 {
            let key = delivery.fairness_key.unwrap_or_else(|| "-".into());
            *keys.entry(key).or_insert(0) += 1;
        }
    }
    assert_eq!((tiers[&0], tiers[&4]), (30, 10), "{tiers:?}");
    assert_eq!(
        (keys["gold"], keys["silver"], keys["-"]),
        (18, 6, 6),
        "{keys:?}"
    );
}

#[test]
fn keys_past_fairness_keys_max_share_their_tiers_lane_and_nothing_is_lost() {
    let mut settings = settings(2);
    settings.credits_per_key = 2;
    settings.fairness_keys_max = 2;
    weighted(&mut settings, "jobs");
    let mut t = tree_with(settings);
    let producer = t.producers[0];
    let mut pushed = Vec::new();
    for key in ["a", "b", "c", "d"] {
        pushed.extend(push_keyed(&mut t, producer, Some(key), 1, 10));
    }
    // Keys a and b have lanes; c and d share the tier's lane with each other (as one key).
    let got = pop_fair(&mut t.h, t.consumer, 12);
    let counts = count_by_key(&got);
    assert_eq!(
        (
            counts["a"],
            counts["b"],
            counts["c"] + counts.get("d").unwrap_or(&0)
        ),
        (4, 4, 4),
        "{counts:?}"
    );
    let rest = pop_fair(&mut t.h, t.consumer, 28);
    let mut all: Vec<MessageId> = got.iter().chain(&rest).map(|(_, id)| *id).collect();
    all.sort_unstable();
    pushed.sort_unstable();
    assert_eq!(all, pushed, "every message once");
    assert!(t.h.pop(t.consumer, "jobs", 1).is_empty());
}

#[test]
fn fairness_keys_survive_a_rebuild_from_the_log_and_from_a_checkpoint() {
    for checkpoint in [false, true] {
        let mut h = Harness::new();
        let mut leaf_settings = Settings {
            checkpoint_interval_ms: if checkpoint { 1000 } else { 3_600_000 },
            credits_per_key: 2,
            ..settings(2)
        };
        weighted(&mut leaf_settings, "jobs");
        let (config, root, _, leaf_end, log) = recorded_leaf_with(&mut h, leaf_settings);
        let producer = h.client(h.nodes.len() - 1, PeerKind::Producer);
        let consumer = h.client(root, PeerKind::Consumer);
        let keyed = |key: &str, count: usize| -> Vec<PushMessage> {
            (0..count)
                .map(|_| PushMessage {
                    topic: "jobs".into(),
                    priority: 2,
                    payload: Bytes::from_static(b"x"),
                    fairness_key: Some(key.into()),
                    ..PushMessage::default()
                })
                .collect()
        };
        h.push_messages(producer, keyed("noisy", 40));
        h.push_messages(producer, keyed("quiet", 4));
        h.advance(Duration::from_secs(2));
        let checkpointed = restart_from_log(&mut h, config, root, leaf_end, &log);
        assert_eq!(checkpointed, checkpoint);
        let counts = count_by_key(&pop_fair(&mut h, consumer, 8));
        assert_eq!(
            (counts["noisy"], counts["quiet"]),
            (4, 4),
            "checkpoint {checkpoint}: {counts:?}"
        );
    }
}

#[test]
fn a_push_with_a_bad_fairness_key_is_refused_whole_and_names_it() {
    let mut t = tree(2);
    let long = "k".repeat(Settings::default().fairness_key_bytes_max as usize + 1);
    for (key, says) in [
        ("", "outside 1..=128"),
        ("a\u{1}b", "control character"),
        (long.as_str(), "fairness_key_bytes_max"),
    ] {
        let good = PushMessage {
            topic: "jobs".into(),
            fairness_key: Some("fine".into()),
            ..PushMessage::default()
        };
        let bad = PushMessage {
            fairness_key: Some(key.into()),
            ..good.clone()
        };
        let request = t.h.request();
        let push = Push {
            request,
            messages: vec![good, bad],
        };
        t.h.send(t.producers[0], Wire::Push(push));
        let Wire::Error(error) = t.h.recv(t.producers[0]) else {
            panic!("a refusal for {key:?}")
        };
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(
            error.message.contains("message 1") && error.message.contains(says),
            "{key:?}: {}",
            error.message
        );
    }
    assert_eq!(t.h.nodes[t.leaves[0]].stats().messages, 0, "nothing kept");
}
