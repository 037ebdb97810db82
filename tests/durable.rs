//! Leaves whose message bodies live in their logs, over real QUIC on loopback and real files:
//! bodies read back on delivery, segments compacted and deleted once mostly acknowledged, and
//! a restart that finds every body where its index says.
//!
//! The tree is `topology/local.toml` in this process, with `leaf_body_cache_bytes = 0` (no
//! body stays in memory once durable), 64 KiB segments, small group commits and quick
//! checkpoints.

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{
    ClientTls, Consumer, ConsumerConfig, Delivery, Message, PopOptions, Producer, ProducerConfig,
};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

mod common;

use common::leaf_counter;

const WAIT: Duration = Duration::from_secs(10);

fn topology() -> Topology {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let mut topology = Topology::parse(&text).unwrap().with_ephemeral_ports();
    for setting in [
        "leaf_body_cache_bytes=0",
        "wal_segment_bytes_max=65536",
        "wal_write_batch_bytes_max=16384",
        "compaction_live_pct=25",
        "compaction_batch_messages=64",
        "checkpoint_interval_ms=200",
        "checkpoint_log_bytes=65536",
    ] {
        topology.set_setting(setting).unwrap();
    }
    topology
}

fn tls(tree: &LocalTree) -> ClientTls {
    ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone())
}

/// The payload of message `n`: 600 bytes that name it.
fn payload(n: u32) -> String {
    format!("{n:08}-").repeat(60)
}

/// Checks that a delivery carries the body it was pushed with; returns its number.
fn check(delivery: &Delivery) -> u32 {
    let n: u32 = delivery
        .metadata
        .iter()
        .find(|(k, _)| k == "n")
        .map(|(_, v)| v.parse().unwrap())
        .expect("metadata survives");
    assert_eq!(
        delivery.payload,
        payload(n).as_bytes(),
        "message {n} comes back whole"
    );
    assert_eq!(delivery.priority, n % 7, "message {n}'s priority");
    n
}

/// The leaves' directories under `data` (beside the tree's receipt key).
fn leaf_dirs(data: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(data)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect()
}

/// Log segments of every leaf under `data`: how many, and their bytes.
fn segments(data: &Path) -> (usize, u64) {
    let (mut count, mut bytes) = (0, 0);
    for leaf in leaf_dirs(data) {
        for file in std::fs::read_dir(leaf).unwrap() {
            let file = file.unwrap();
            if file.path().extension().is_some_and(|e| e == "wal") {
                count += 1;
                bytes += file.metadata().map_or(0, |m| m.len());
            }
        }
    }
    (count, bytes)
}

/// Pops until `count` deliveries came back, checking each body; acks those `ack` picks and
/// holds the leases of the others for a minute.
async fn pop(consumer: &Consumer, count: usize, ack: impl Fn(u32) -> bool) -> Vec<Delivery> {
    let mut got = Vec::new();
    eventually(WAIT * 3, format!("{count} popped"), async || {
        let options = PopOptions {
            max: (count - got.len()).min(100) as u32,
            wait: Duration::from_millis(500),
            visibility: Some(Duration::from_secs(60)),
            ..PopOptions::default()
        };
        let deliveries = consumer.pop_with("jobs", options).await.unwrap();
        let receipts: Vec<_> = deliveries
            .iter()
            .filter(|d| ack(check(d)))
            .map(Delivery::receipt)
            .collect();
        if !receipts.is_empty() {
            for result in consumer.ack_many(&receipts).await.unwrap() {
                result.unwrap();
            }
        }
        got.extend(deliveries);
        if got.len() < count {
            Err(got.len())
        } else {
            Ok(())
        }
    })
    .await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_come_back_from_the_log_segments_are_compacted_and_a_restart_finds_the_rest() {
    let data = tempfile::tempdir().unwrap();
    let topology = topology();
    let tree = LocalTree::start_with(&topology, Some(data.path()))
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    // Push batches no larger than a log write (`wal_write_batch_bytes_max`): a busy machine
    // makes the producer's batches large, and one record never spans segments, so a leaf's
    // pushes could all land in its newest segment, which is never compacted.
    let producer = Producer::connect(ProducerConfig {
        batch_bytes_max: 16 * 1024,
        ..ProducerConfig::from_topology(&tree.topology, tls(&tree))
    })
    .await
    .unwrap();
    let total = 3000u32;
    let mut handles = Vec::new();
    for n in 0..total {
        let message = Message::new("jobs", payload(n))
            .priority(n % 7)
            .metadata("n", n.to_string());
        handles.push(producer.send(message).await.unwrap());
    }
    for handle in handles {
        handle.acked().await.unwrap();
    }
    // Every leaf synced its log for those pushes, and reports how long the syncs took.
    for leaf in tree.topology.leaves() {
        let report = tree.node(&leaf.name).unwrap().report().await.unwrap();
        let syncs = report
            .histograms
            .get(&crest::core::metrics::Metric::LogSync)
            .map_or(0, |h| h.count());
        assert!(syncs >= 1, "{}: {syncs} log syncs reported", leaf.name);
    }
    let (written, written_bytes) = segments(data.path());
    assert!(
        written >= 8,
        "3000 × 600 B fill many 64 KiB segments: {written}"
    );

    // Take everything, every body read back from the log; acknowledge all but one message in
    // 20 (picked by a hash, so on every leaf), whose leases are held: about 5 % of every
    // segment stays live.
    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    let held = |n: u32| (n.wrapping_mul(2_654_435_761) >> 16) % 20 == 0;
    let first = pop(&consumer, total as usize, |n| !held(n)).await;
    let numbers: HashSet<u32> = first.iter().map(check).collect();
    assert_eq!(numbers.len(), total as usize, "each message once");
    // Segments whose bodies are mostly acknowledged are rewritten and deleted: what is left
    // on disk is about the live bodies (~90 KB per leaf), not the 1.8 MB written: each leaf
    // keeps the segments the moved bodies went to, its checkpoint's segment, and small
    // segments still mostly live (a checkpoint sealed them early; not worth rewriting).
    let leaves = tree.topology.leaves().count() as u64;
    let bound = 3 * leaves * 65_536;
    eventually(
        WAIT,
        "compaction to bring the log within its bound",
        async || {
            let (left, left_bytes) = segments(data.path());
            let compacted = leaf_counter(&tree, "compacted").await;
            if left_bytes <= bound && compacted > 0 {
                Ok(())
            } else {
                Err(format!(
                    "{left} segments ({left_bytes} bytes), {compacted} moved"
                ))
            }
        },
    )
    .await;
    let (left, left_bytes) = segments(data.path());
    let compacted = leaf_counter(&tree, "compacted").await;
    eprintln!(
        "{written} segments written ({written_bytes} bytes), {left} left ({left_bytes} bytes); \
         {compacted} bodies moved"
    );
    // Bytes, not files: compaction writes the moved bodies to new segments and checkpoints
    // start new ones, so the count of files may stay where it was while the bytes shrink.
    assert!(
        left_bytes <= bound,
        "{left} of {written} segments left: {left_bytes} of {written_bytes} bytes"
    );
    assert!(
        compacted > 0,
        "compaction moved the live bodies of old segments"
    );
    assert_eq!(
        leaf_counter(&tree, "body_reads").await,
        u64::from(total),
        "every delivery read its body"
    );
    tree.shutdown().await;

    // A new incarnation of every leaf holds the held messages' leases (their receipts still
    // settle them) and finds their bodies where its index says once they are nacked.
    let tree = LocalTree::start_with(&topology, Some(data.path()))
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects again");
    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    let expected: HashSet<u32> = (0..total).filter(|n| held(*n)).collect();
    let none = consumer
        .pop("jobs", 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        none.is_empty(),
        "the held messages are still leased: {}",
        none.len()
    );
    let receipts: Vec<_> = first
        .iter()
        .filter(|d| held(check(d)))
        .map(Delivery::receipt)
        .collect();
    let nack = crest::core::wire::Settle::Nack {
        delay_ms: 0,
        reason: None,
    };
    for result in consumer.settle(nack, &receipts).await.unwrap() {
        result.unwrap();
    }
    let rest = pop(&consumer, expected.len(), |_| true).await;
    let again: HashSet<u32> = rest.iter().map(check).collect();
    assert_eq!(again, expected);
    assert!(rest.iter().all(|d| d.attempt == 2), "attempts survive");
    let none = consumer
        .pop("jobs", 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(none.is_empty(), "nothing more: {}", none.len());
    for dir in leaf_dirs(data.path()) {
        let report = crest::storage::inspect::inspect(&dir, 1 << 24).unwrap();
        assert!(!report.is_fatal(), "{}: {report:?}", dir.display());
    }
    tree.shutdown().await;
}
