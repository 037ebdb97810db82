//! A leaf whose disk fills up, on a real filesystem that runs out of space (a small tmpfs
//! mounted for the test): pushes are refused `StorageFailed` while it is full, the leaf says so
//! in its log, accepts pushes again as soon as space is back (no restart), an ack it could not
//! log is refused `Unavailable` and changed nothing (its retry acks), and nothing it
//! acknowledged is lost across a restart.

use crest::core::topology::Topology;
use crest::core::wire::ErrorCode;
use crest::core::wire::ReceiptError;
use crest::node::LocalTree;
use crest::sdk::{
    ClientError, ClientTls, Consumer, ConsumerConfig, Message, MessageId, Producer, ProducerConfig,
    Receipt,
};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::io::Write;

use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/tmpfs.rs"]
mod tmpfs;

use tmpfs::{Tmpfs, fill};

const WAIT: Duration = Duration::from_secs(20);
const SMALL: usize = 16 * 1024;
/// Messages popped before the disk fills, then acked in one request while it is full: their
/// delete records (about 20 bytes each) need more than the page the log's last write left.
const LEASED: usize = 400;
/// More than what is left of the first segment after the small pushes: its push starts a new
/// segment, whose creation is what a full disk refuses.
const LARGE: usize = 160 * 1024;

/// Everything the nodes log, kept to look at.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn topology() -> Topology {
    let text = include_str!("../topology/one-leaf.toml");
    let mut topology = Topology::parse(text).unwrap().with_ephemeral_ports();
    // Segments grow as they are written (no preallocated room to give back when one is
    // sealed), so that a full disk refuses the creation of the next one.
    for setting in [
        "wal_segment_bytes_max=262144",
        "wal_preallocate=false",
        "leaf_body_cache_bytes=0",
    ] {
        topology.set_setting(setting).unwrap();
    }
    topology
}

async fn connect_consumer(tree: &LocalTree) -> Consumer {
    let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
    Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls))
        .await
        .unwrap()
}

/// Pops `count` messages of topic "leased" (their leases outlast the test).
async fn pop_all(consumer: &Consumer, count: usize) -> Vec<Receipt> {
    let mut receipts = Vec::new();
    eventually(WAIT, format!("{count} popped"), async || {
        let batch = consumer
            .pop("leased", 1000, Duration::from_millis(500))
            .await
            .unwrap();
        receipts.extend(batch.iter().map(|d| d.receipt()));
        if receipts.len() < count {
            Err(receipts.len())
        } else {
            Ok(())
        }
    })
    .await;
    receipts
}

/// A producer that gives up on a refused push at once: with one leaf there is no other to
/// route it to, and the refusal is what these tests look at.
async fn producer(tree: &LocalTree) -> Producer {
    let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
    let config = ProducerConfig {
        leaf_wait_max: Duration::ZERO,
        ..ProducerConfig::from_topology(&tree.topology, tls)
    };
    Producer::connect(config).await.unwrap()
}

/// Pushes one message of `bytes`; `None` if the leaf refused it for want of storage.
async fn push(producer: &Producer, n: usize, bytes: usize) -> Option<MessageId> {
    let payload = format!("{n:08}").repeat(bytes / 8);
    let handle = producer.send(Message::new("jobs", payload)).await.unwrap();
    match handle.acked().await {
        Ok(id) => Some(id),
        Err(ClientError::Rejected {
            code: ErrorCode::StorageFailed,
            ..
        }) => None,
        Err(other) => panic!("push {n}: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_pushes_and_they_are_accepted_again_once_space_is_back() {
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("crest_storage=warn,crest_node=warn")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let disk = Tmpfs::mount("8m");
    let data = disk.path().join("data");
    let tree = LocalTree::start_on(&topology(), Some(&data), None)
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let producer = producer(&tree).await;
    let mut accepted = HashSet::new();
    let mut n = 0;
    for _ in 0..8 {
        accepted.insert(push(&producer, n, SMALL).await.expect("room on the disk"));
        n += 1;
    }
    let mut handles = Vec::new();
    for i in 0..LEASED {
        let message = Message::new("leased", format!("{i:08}"));
        handles.push(producer.send(message).await.unwrap());
    }
    for handle in handles {
        handle.acked().await.expect("room on the disk");
    }
    let consumer = connect_consumer(&tree).await;
    let leased = pop_all(&consumer, LEASED).await;

    // The disk fills up: pushes that need a new segment are refused, each with
    // StorageFailed, and no half-made segment is left behind.
    let ballast = fill(disk.path());
    let mut refused = 0;
    eventually(WAIT, "three pushes refused on a full disk", async || {
        match push(&producer, n, LARGE).await {
            Some(id) => {
                accepted.insert(id);
            }
            None => refused += 1,
        }
        n += 1;
        if refused < 3 { Err(refused) } else { Ok(()) }
    })
    .await;
    let said = logs.text();
    assert!(
        said.contains("the log cannot be written"),
        "the leaf says why it refuses:\n{said}"
    );
    assert_eq!(
        said.matches("the log cannot be written").count(),
        1,
        "at most once per interval, not once per refusal:\n{said}"
    );

    // An ack the log cannot write is refused, every receipt of it, and changes nothing: the
    // messages stay leased (not available to others), and the same ack succeeds later.
    let refused_acks = consumer.ack_many(&leased).await.unwrap();
    assert!(
        refused_acks
            .iter()
            .all(|result| *result == Err(ReceiptError::Unavailable)),
        "{:?}",
        refused_acks.iter().find(|r| r.is_ok())
    );
    let others = consumer
        .pop("leased", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(others.is_empty(), "still leased, not available again");

    // Space is back: the very next pushes are accepted, without a restart.
    std::fs::remove_file(&ballast).unwrap();
    let acks = consumer.ack_many(&leased).await.unwrap();
    assert!(acks.iter().all(Result::is_ok), "the retried ack succeeds");
    drop(consumer);
    for _ in 0..8 {
        accepted.insert(
            push(&producer, n, LARGE)
                .await
                .expect("accepted once space is back"),
        );
        n += 1;
    }
    assert!(
        logs.text().contains("log writes succeed again"),
        "{}",
        logs.text()
    );

    // Nothing acknowledged is lost, across a restart on the same disk.
    drop(producer);
    tree.shutdown().await;
    let tree = LocalTree::start_on(&topology(), Some(&data), None)
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let consumer = connect_consumer(&tree).await;
    assert!(
        consumer
            .pop("leased", 10, Duration::from_millis(500))
            .await
            .unwrap()
            .is_empty(),
        "the acked messages stay acked after a restart"
    );
    let mut delivered = HashSet::new();
    eventually(WAIT, "every acknowledged push delivered", async || {
        if delivered.len() >= accepted.len() {
            return Ok(());
        }
        let batch = consumer
            .pop("jobs", 64, Duration::from_millis(500))
            .await
            .unwrap();
        let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
        for delivery in &batch {
            assert!(delivered.insert(delivery.id), "{} twice", delivery.id);
        }
        consumer.ack_many(&receipts).await.unwrap();
        Err(delivered.len())
    })
    .await;
    assert_eq!(delivered, accepted, "every acknowledged push, once");
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_a_leaf_with_a_full_disk_refuses_go_to_the_other_leaves() {
    // Goal: of four leaves, one has its data directory on a disk that is full. A producer of
    // the SDK's defaults sees no error: each batch that leaf refuses `StorageFailed` goes to
    // the others, as a batch to a leaf that cannot be reached does; every push is delivered.
    let text = include_str!("../topology/four-leaves.toml");
    let mut topology = Topology::parse(text).unwrap().with_ephemeral_ports();
    for setting in ["wal_preallocate=false", "leaf_body_cache_bytes=0"] {
        topology.set_setting(setting).unwrap();
    }
    let data = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount_on(&data.path().join("leaf-2"), "4m");
    let tree = LocalTree::start_on(&topology, Some(data.path()), None)
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
    let producer = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls))
        .await
        .unwrap();
    // Every leaf takes its turn of pushes while there is room.
    let mut accepted = HashSet::new();
    let mut leaves = HashSet::new();
    eventually(WAIT, "every leaf to take a push", async || {
        let handle = producer.send(Message::new("jobs", "room")).await.unwrap();
        let id = handle.acked().await.unwrap();
        leaves.insert(id.leaf());
        accepted.insert(id);
        if leaves.len() < 4 {
            Err(leaves.clone())
        } else {
            Ok(())
        }
    })
    .await;
    let _ballast = fill(disk.path());
    let mut handles = Vec::new();
    for n in 0..400 {
        let message = Message::new("jobs", format!("{n:08}").repeat(512));
        handles.push(producer.send(message).await.unwrap());
    }
    for (n, handle) in handles.into_iter().enumerate() {
        let id = handle.acked().await.unwrap_or_else(|error| {
            panic!("push {n} failed although three leaves have room: {error}")
        });
        assert_ne!(id.leaf(), crest::sdk::LeafId(2), "leaf-2 has no room");
        accepted.insert(id);
    }
    let consumer = connect_consumer(&tree).await;
    let mut delivered = HashSet::new();
    eventually(WAIT, "every accepted push delivered", async || {
        if accepted.is_subset(&delivered) {
            return Ok(());
        }
        let batch = consumer
            .pop("jobs", 64, Duration::from_millis(200))
            .await
            .unwrap();
        let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
        delivered.extend(batch.iter().map(|d| d.id));
        consumer.ack_many(&receipts).await.unwrap();
        Err(format!(
            "{} of {} delivered",
            delivered.len(),
            accepted.len()
        ))
    })
    .await;
    tree.shutdown().await;
}
