//! Weighted scheduling end to end: one process per node over real QUIC, topics made weighted
//! through the `crest` binary, their leaf killed with SIGKILL and started again; pops share
//! the tiers by their weights and a tier by its fairness keys' weights, and a strict topic
//! beside them keeps the key order.

use crest::sdk::{Delivery, Message, MessageId, PopOptions, ProducerConfig};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;

use cluster::{Cluster, retry};

/// Entries the root holds in its windows, from its `/metrics`.
async fn root_window_entries(cluster: &Cluster) -> u64 {
    let (code, metrics) = cluster.http_get("root", "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    metrics
        .lines()
        .filter(|line| line.starts_with("crest_window_entries{node=\"root\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits up to 20 s until the root holds `want` entries.
async fn root_holds(cluster: &Cluster, want: u64) {
    let what = format!("the root to hold {want} entries");
    eventually(Duration::from_secs(20), what, async || {
        let held = root_window_entries(cluster).await;
        if held == want { Ok(()) } else { Err(held) }
    })
    .await
}

fn priorities(deliveries: &[Delivery]) -> (usize, usize) {
    let urgent = deliveries.iter().filter(|d| d.priority == 0).count();
    (urgent, deliveries.len() - urgent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_topic_shares_pops_by_weight_across_a_leaf_kill() {
    let mut cluster = Cluster::start_with("scheduling", "");
    let set = [
        "topic",
        "set",
        "--topic",
        "jobs",
        "--scheduling",
        "weighted",
        "--weight",
        "0=3",
        "--weight",
        "4=1",
    ];
    cluster.crest_until(&set, "configured at 4 leaves").await;
    let (ok, text) = cluster.crest(&["topic", "list"]).await;
    assert!(
        ok && text.contains("scheduling=weighted weight=0=3 weight=4=1"),
        "{text}"
    );
    // One tier; within it, key gold weighs 3 and the others 1.
    let set = [
        "topic",
        "set",
        "--topic",
        "tenants",
        "--scheduling",
        "weighted",
        "--weight",
        "0=1",
        "--fairness-weight",
        "gold=3",
    ];
    cluster.crest_until(&set, "configured at 4 leaves").await;
    let (ok, text) = cluster.crest(&["topic", "list"]).await;
    assert!(ok && text.contains("fairness_weight=gold=3"), "{text}");
    let (ok, text) = cluster
        .crest(&["topic", "set", "--topic", "x", "--weight", "0=0"])
        .await;
    assert!(
        !ok && text.contains("0.001"),
        "a weight of 0 is refused: {text}"
    );

    let leaf = cluster.topology.node("leaf-1").unwrap().address.clone();
    let tls = cluster.tls();
    let producer = retry(|| {
        crest::sdk::Producer::connect(ProducerConfig::new(vec![leaf.clone()], tls.clone()))
    })
    .await;
    let mut pushed: HashSet<MessageId> = HashSet::new();
    for round in 0..12 {
        for (topic, priority) in [("jobs", 4), ("jobs", 0), ("plain", 4), ("plain", 0)] {
            let message = Message::new(topic, format!("{round}")).priority(priority);
            let id = producer.send(message).await.unwrap().acked().await.unwrap();
            if topic == "jobs" {
                pushed.insert(id);
            }
        }
    }
    // A noisy key's backlog first, then gold's; the quiet key's through `crest push`.
    let mut tenants: HashSet<MessageId> = HashSet::new();
    for (key, count) in [("noisy", 20), ("gold", 8)] {
        for at in 0..count {
            let message = Message::new("tenants", format!("{key} {at}")).fairness_key(key);
            let id = producer.send(message).await.unwrap().acked().await.unwrap();
            tenants.insert(id);
        }
    }
    let leaf_arg = ["--leaf", leaf.as_str()];
    let push = [
        &[
            "push",
            "--topic",
            "tenants",
            "--fairness-key",
            "quiet",
            "--count",
            "4",
        ][..],
        &leaf_arg,
        &["q"],
    ]
    .concat();
    let (ok, text) = cluster.crest(&push).await;
    assert!(ok, "{text}");
    tenants.extend(
        text.lines()
            .filter_map(|line| line.trim().parse::<MessageId>().ok()),
    );
    assert_eq!(tenants.len(), 32, "{text}");
    cluster.kill("leaf-1");
    cluster.launch("leaf-1");
    // The restarted leaf offers what it recovered, each tier in its own lane again, each
    // fairness key in its own (16 entries of a key's lane at most: credits_per_key).
    root_holds(&cluster, 48 + 16 + 8 + 4).await;

    let consumer = cluster.consumer().await;
    let options = |max| PopOptions {
        max,
        wait: Duration::from_secs(5),
        visibility: Some(Duration::from_secs(60)),
        ..PopOptions::default()
    };
    // Weights 3 : 1 over sixteen pops: twelve of tier 0, four of tier 4.
    let first = consumer.pop_with("jobs", options(16)).await.unwrap();
    assert_eq!(priorities(&first), (12, 4));
    // The strict topic beside it: every priority 0 before any 4.
    let plain = consumer.pop_with("plain", options(16)).await.unwrap();
    assert_eq!(priorities(&plain), (12, 4));
    let order: Vec<u32> = plain.iter().map(|d| d.priority).collect();
    assert!(order.is_sorted(), "{order:?}");
    // A weighted tier alone has all the pops; nothing was lost or given twice.
    let mut popped: Vec<Delivery> = first;
    while popped.len() < pushed.len() {
        let more = consumer.pop_with("jobs", options(16)).await.unwrap();
        assert!(
            !more.is_empty(),
            "popped {} of {}",
            popped.len(),
            pushed.len()
        );
        popped.extend(more);
    }
    let ids: HashSet<MessageId> = popped.iter().map(|d| d.id).collect();
    assert_eq!((ids, popped.len()), (pushed, 24));

    // Keys weighing 3 : 1 : 1 over ten pops: six of gold, two of each other; the noisy
    // backlog pushed first does not keep the others waiting.
    let first = consumer.pop_with("tenants", options(10)).await.unwrap();
    let of = |key: &str| {
        first
            .iter()
            .filter(|d| d.fairness_key.as_deref() == Some(key))
            .count()
    };
    assert_eq!((of("gold"), of("noisy"), of("quiet")), (6, 2, 2));
    let (ok, text) = cluster
        .crest(&["pop", "--topic", "tenants", "--max", "1", "--ack"])
        .await;
    assert!(ok && text.contains(" fairness_key="), "{text}");
    let mut popped = first.len() + 1;
    while popped < tenants.len() {
        let more = consumer.pop_with("tenants", options(16)).await.unwrap();
        assert!(!more.is_empty(), "popped {popped} of {}", tenants.len());
        assert!(more.iter().all(|d| tenants.contains(&d.id)));
        popped += more.len();
    }
    assert_eq!(popped, 32);
}
