//! Durable-path benchmarks: WAL group-commit throughput, recovery speed, memory per queued
//! message, and durable pushes into one leaf (in process, and over QUIC).
//!
//! Run: `cargo bench --bench durable` (release build; writes under the system temp dir).
//! Each figure is the median of several runs; the machine is shared, so compare ratios.

use bytes::Bytes;
use crest::core::config::{Durability, Settings};
use crest::core::id::{LeafId, MessageId};
use crest::core::leaf::{Leaf, LeafConfig};
use crest::core::record::LogRecord;
use crest::core::time::Time;
use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{ClientTls, Message, Producer, ProducerConfig};
use crest::storage::wal::{WalOptions, open};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PAYLOAD_BYTES: usize = 100;
const BATCH: u64 = 1024;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn options(dir: &Path, durability: Durability) -> WalOptions {
    WalOptions {
        durability,
        ..WalOptions::new(dir.to_path_buf(), &Settings::default())
    }
}

/// When the benchmarks recover their logs: after every message in them became ready, so that
/// they come back available (queued), not delayed.
const RECOVERED_AT: Time = Time::from_millis(1 << 32);

/// A push batch of 1024 messages as a leaf logs it: one acceptance time (a millisecond per
/// batch), priorities 0–9.
fn batch(first: u64) -> Vec<LogRecord> {
    let payload = Bytes::from(vec![7u8; PAYLOAD_BYTES]);
    let accepted = Time::from_millis(first / BATCH);
    (first..first + BATCH)
        .map(|seq| LogRecord::Enqueue {
            head: crest::core::record::MessageHead {
                id: MessageId::new(LeafId(1), seq),
                topic: "bench".into(),
                priority: (seq % 10) as u32,
                ready_at: accepted,
                enqueued_at: accepted,
                expires_at: None,
                dedup_key: None,
                fairness_key: None,
            },
            metadata: vec![],
            payload: payload.clone(),
        })
        .collect()
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crest-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Appends `messages` in batches of 1024 (as push batches arrive), keeping up to 64 batches
/// queued, and waits until all are reported durable. Returns messages per second.
fn wal_append(dir: &Path, durability: Durability, messages: u64) -> f64 {
    let (wal, _) = open(options(dir, durability)).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal
        .start(move |done| tx.send(done.len() as u64).unwrap())
        .unwrap();
    let batches: Vec<Vec<LogRecord>> = (0..messages / BATCH)
        .map(|i| batch(1 + i * BATCH))
        .collect();
    let started = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    for records in batches {
        while sent - done >= 64 {
            done += rx.recv().unwrap();
        }
        handle.submit(records, Some(sent)).unwrap();
        sent += 1;
    }
    while done < sent {
        done += rx.recv().unwrap();
    }
    messages as f64 / started.elapsed().as_secs_f64()
}

/// Replaces the log in `dir` by a checkpoint of every message in it (bodies left where they
/// are), as a long-running leaf's log mostly is.
fn checkpoint_all(dir: &Path) {
    let (wal, recovered) = open(options(dir, Durability::Fsync)).unwrap();
    let snapshot: Vec<LogRecord> = recovered.operations.into_iter().flatten().collect();
    let segments: std::collections::BTreeSet<u32> = snapshot
        .iter()
        .filter_map(|r| match r {
            LogRecord::Index { location, .. } => Some(location.segment),
            _ => None,
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    handle
        .checkpoint(snapshot, Vec::new(), segments.into_iter().collect())
        .unwrap();
    // An append after the checkpoint is complete once the checkpoint is.
    handle.submit(Vec::new(), Some(0)).unwrap();
    rx.recv().unwrap();
}

/// Recovers the log in `dir` and rebuilds a leaf from it. Returns messages per second overall,
/// the seconds spent reading the log into the leaf (before settling its state), and the
/// messages recovered.
fn recovery(dir: &Path) -> (f64, f64, u64) {
    let started = Instant::now();
    let config = bench_leaf(Settings::default());
    // As a node recovers: each operation goes to the leaf as it is read.
    let mut leaf = Leaf::recovering(config);
    let _ = crest::storage::wal::open_with(options(dir, Durability::Fsync), |records| {
        leaf.replay_operation(records)
    })
    .unwrap();
    let scanned = started.elapsed().as_secs_f64();
    let leaf = leaf.recovered(RECOVERED_AT);
    let messages = crest::core::Machine::stats(&leaf).messages;
    (
        messages as f64 / started.elapsed().as_secs_f64(),
        scanned,
        messages,
    )
}

/// The product's allocator (as in `crest`), counting allocations to measure what a structure
/// holds.
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

/// Bytes allocated and not yet freed.
fn live_bytes() -> usize {
    ALLOCATOR.allocated()
}

/// The benchmarks' leaf, with `settings`.
fn bench_leaf(settings: Settings) -> LeafConfig {
    LeafConfig {
        name: "bench".into(),
        id: LeafId(1),
        settings,
        token_key: crest::core::leaf::token_key_from_seed(1),
        first_seq: 1,
    }
}

/// A leaf that keeps no body in memory once it is durable.
fn no_cache_leaf() -> LeafConfig {
    bench_leaf(Settings {
        leaf_body_cache_bytes: 0,
        ..Settings::default()
    })
}

/// Heap bytes `leaf` holds: what dropping it frees (counted by the allocator).
fn held_by(leaf: Leaf) -> usize {
    let before = live_bytes();
    drop(leaf);
    before.saturating_sub(live_bytes())
}

/// Memory a leaf takes per queued message whose body is in the log: the heap bytes a
/// recovered leaf holds, divided by its messages. Payload bytes are on disk, not in it.
fn memory_per_message(dir: &Path) -> (f64, u64) {
    let (wal, recovered) = open(options(dir, Durability::Fsync)).unwrap();
    drop(wal);
    let config = no_cache_leaf();
    let leaf = Leaf::recover(config, RECOVERED_AT, recovered.operations);
    let messages = crest::core::Machine::stats(&leaf).messages;
    (held_by(leaf) as f64 / messages as f64, messages)
}

/// A leaf with a parent holding 256 entries per topic (connection 1) and a producer
/// (connection 2), as a node runs it.
fn connected_leaf(config: LeafConfig, now: Time) -> Leaf {
    use crest::core::Machine;
    use crest::core::machine::Link;
    use crest::core::wire::{Hello, PROTOCOL_VERSION, PeerKind, Role, Welcome, Wire};
    let mut leaf = Leaf::new(config);
    leaf.handle_connected(now, 1, Link::Parent);
    let welcome = Welcome {
        node: "parent".into(),
        role: Role::Aggregator,
        credits_per_topic: 256,
        payload_bytes_max: 1 << 20,
        frame_bytes_max: 16 << 20,
        credits_per_key: 16,
    };
    leaf.handle_message(now, 1, Wire::Welcome(welcome));
    leaf.handle_connected(now, 2, Link::Incoming);
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        peer: PeerKind::Producer,
    };
    leaf.handle_message(now, 2, Wire::Hello(hello));
    while leaf.poll_transmit().is_some() {}
    leaf
}

/// A push of 1024 × 100 B, priorities 0–9, as a producer sends it.
fn push_frame(request: u64) -> crest::core::wire::Wire {
    use crest::core::wire::{Push, PushMessage, Wire};
    let messages = (0..BATCH)
        .map(|i| PushMessage {
            topic: "bench".into(),
            priority: (i % 10) as u32,
            payload: Bytes::from(vec![7u8; PAYLOAD_BYTES]),
            ..PushMessage::default()
        })
        .collect();
    Wire::Push(Push { request, messages })
}

/// Memory a leaf takes per queued message when its messages arrive as pushes (the way a live
/// leaf fills): batches of 1024 × 100 B under a parent holding 256 of them, each batch made
/// durable with its bodies placed "in the log" (locations given, so no body stays in memory).
fn memory_per_pushed_message(batches: u64) -> f64 {
    use crest::core::Machine;
    use crest::core::machine::{StorageDone, StorageOp};
    let now = Time::from_millis(1_000);
    let mut leaf = connected_leaf(no_cache_leaf(), now);
    let mut offset = 0u32;
    for request in 0..batches {
        leaf.handle_message(now, 2, push_frame(request));
        while let Some(op) = leaf.poll_storage() {
            if let StorageOp::Append {
                token: Some(token),
                records,
                ..
            } = op
            {
                let locations = records
                    .iter()
                    .map(|_| {
                        offset += 160;
                        crest::core::record::Location {
                            segment: 1 + offset / (64 << 20),
                            offset: offset % (64 << 20),
                            len: 160,
                            crc: 0,
                        }
                    })
                    .collect();
                leaf.handle_storage_done(now, StorageDone { token, locations });
            }
        }
        while leaf.poll_transmit().is_some() {}
    }
    let messages = leaf.stats().messages;
    held_by(leaf) as f64 / messages as f64
}

/// Durable pushes into one leaf in process: its state machine driven as its node drives it,
/// and its log (group commit, `fdatasync`), without the network: push batches of 1024 × 100 B
/// (built before the clock starts), up to 64 batches waiting for their sync. Returns messages
/// per second acknowledged.
fn leaf_push(dir: &Path, messages: u64) -> f64 {
    use crest::core::Machine;
    use crest::core::machine::{StorageDone, StorageOp};
    use crest::core::wire::Wire;
    let (wal, _) = open(options(dir, Durability::Fsync)).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    let config = bench_leaf(Settings::default());
    let started = Instant::now();
    let clock = || Time::from_millis(1_000) + started.elapsed();
    let mut leaf = connected_leaf(config, clock());
    let mut frames: std::collections::VecDeque<Wire> =
        (0..messages / BATCH).map(push_frame).collect();
    let started = Instant::now();
    let (mut in_flight, mut acked) = (0u64, 0u64);
    while acked < messages {
        while in_flight < 64
            && let Some(frame) = frames.pop_front()
        {
            leaf.handle_message(clock(), 2, frame);
            in_flight += 1;
        }
        loop {
            while let Some(op) = leaf.poll_storage() {
                match op {
                    StorageOp::Append {
                        records,
                        token,
                        wait,
                    } => handle.submit_with(records, token, wait).unwrap(),
                    StorageOp::Checkpoint {
                        records,
                        includes,
                        segments,
                    } => handle.checkpoint(records, includes, segments).unwrap(),
                    StorageOp::Read { .. } => unreachable!("no reserves here"),
                }
            }
            while let Some(transmit) = leaf.poll_transmit() {
                if let Wire::PushAck(ack) = transmit.msg {
                    acked += ack.ids.len() as u64;
                    in_flight -= 1;
                }
            }
            match rx.try_recv() {
                Ok(done) => {
                    for (token, result) in done {
                        let locations = result.unwrap();
                        leaf.handle_storage_done(clock(), StorageDone { token, locations });
                    }
                }
                Err(_) if in_flight < 64 && !frames.is_empty() => break,
                Err(_) if acked >= messages => break,
                Err(_) => {
                    for (token, result) in rx.recv().unwrap() {
                        let locations = result.unwrap();
                        leaf.handle_storage_done(clock(), StorageDone { token, locations });
                    }
                }
            }
        }
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    drop(handle);
    rate
}

/// Pushes `messages` through one durable leaf over QUIC with the SDK; messages per second.
async fn durable_push(messages: usize) -> f64 {
    let text = include_str!("../topology/two-level.toml");
    let topology = Topology::parse(text).unwrap().with_ephemeral_ports();
    let dir = fresh_dir("push");
    let tree = LocalTree::start_with(&topology, Some(&dir)).await.unwrap();
    assert!(tree.wait_connected(Duration::from_secs(10)).await);
    let leaf = tree.topology.leaves().next().unwrap().address.clone();
    let config = ProducerConfig::new(
        vec![leaf],
        ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone()),
    );
    let producer = Producer::connect(config).await.unwrap();
    let payload = Bytes::from(vec![7u8; PAYLOAD_BYTES]);
    let started = Instant::now();
    let mut handles = std::collections::VecDeque::new();
    // The application hands the producer batches of 1024 (`send_batch`), keeping 32 in flight.
    for first in (0..messages).step_by(1024) {
        let batch = (first..messages.min(first + 1024))
            .map(|i| Message::new("bench", payload.clone()).priority((i % 10) as u32));
        handles.push_back(producer.send_batch(batch).await.unwrap());
        if handles.len() >= 32 {
            handles.pop_front().unwrap().acked().await.unwrap();
        }
    }
    for handle in handles {
        handle.acked().await.unwrap();
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    tree.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    rate
}

fn main() {
    // `cargo bench --bench durable -- recovery` runs one section (wal, recovery, scan,
    // memory, leaf, push).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let run = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let runs = 3;
    let messages = 1_048_576u64;
    let mb = |rate: f64| rate * PAYLOAD_BYTES as f64 / 1e6;
    if run("wal") {
        for durability in [Durability::Fsync, Durability::Buffered] {
            let mut rates = Vec::new();
            for _ in 0..runs {
                let dir = fresh_dir("wal");
                rates.push(wal_append(&dir, durability, messages));
                let _ = std::fs::remove_dir_all(&dir);
            }
            let rate = median(rates);
            println!(
                "wal append ({durability:?}, batches of {BATCH} x {PAYLOAD_BYTES} B): {rate:.0} msgs/s, {:.0} MB/s payload",
                mb(rate)
            );
        }
    }
    if run("recovery") {
        let dir = fresh_dir("recovery");
        wal_append(&dir, Durability::Buffered, messages);
        let (mut rates, mut scans) = (Vec::new(), Vec::new());
        let mut recovered = 0;
        for _ in 0..runs {
            let (rate, scan, count) = recovery(&dir);
            rates.push(rate);
            scans.push(scan);
            recovered = count;
        }
        println!(
            "recovery (scan + rebuild leaf) of {recovered} messages: {:.0} msgs/s ({:.2} s of it reading the log into the leaf)",
            median(rates),
            median(scans)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    if run("recovery") {
        let dir = fresh_dir("recovery-checkpoint");
        wal_append(&dir, Durability::Buffered, messages);
        checkpoint_all(&dir);
        let mut rates = Vec::new();
        let mut recovered = 0;
        for _ in 0..runs {
            let (rate, _, count) = recovery(&dir);
            rates.push(rate);
            recovered = count;
        }
        println!(
            "recovery from a checkpoint of {recovered} messages (bodies in the log): {:.0} msgs/s",
            median(rates)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    if run("scan") {
        let dir = fresh_dir("scan");
        wal_append(&dir, Durability::Buffered, messages);
        for _ in 0..runs {
            let started = Instant::now();
            let mut count = 0usize;
            let _ = crest::storage::wal::open_with(options(&dir, Durability::Fsync), |records| {
                count += records.len()
            })
            .unwrap();
            println!(
                "scan only: {count} records in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if run("memory") {
        let dir = fresh_dir("memory");
        wal_append(&dir, Durability::Buffered, messages);
        let mut per = Vec::new();
        let mut count = 0;
        for _ in 0..runs {
            let (bytes, n) = memory_per_message(&dir);
            per.push(bytes);
            count = n;
        }
        println!(
            "memory of a leaf recovered with {count} messages, bodies in its log: {:.0} bytes/message",
            median(per)
        );
        let per: Vec<f64> = (0..runs)
            .map(|_| memory_per_pushed_message(messages / 1024))
            .collect();
        println!(
            "memory of a leaf pushed {messages} messages, bodies in its log: {:.0} bytes/message",
            median(per)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    if run("leaf") {
        let mut rates = Vec::new();
        for _ in 0..runs {
            let dir = fresh_dir("leaf");
            rates.push(leaf_push(&dir, messages));
            let _ = std::fs::remove_dir_all(&dir);
        }
        let rate = median(rates);
        println!(
            "durable push into one leaf in process (state machine + log, fsync, no network): {rate:.0} msgs/s, {:.0} MB/s payload",
            mb(rate)
        );
    }
    if run("push") {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let mut rates = Vec::new();
        for _ in 0..runs {
            rates.push(runtime.block_on(durable_push(1_000_000)));
        }
        println!(
            "durable push into one leaf over QUIC (SDK, fsync): {:.0} msgs/s",
            median(rates)
        );
    }
}
