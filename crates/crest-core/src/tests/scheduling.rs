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
