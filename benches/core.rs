//! Micro-benchmarks of the core's hot paths: frame encode/decode, key ordering (sort, ordered
//! set as a priority heap), the leaf's enqueue path, an aggregator merging its children's
//! offers (window operations), and write-ahead-log appends.
//!
//! Run: `cargo bench --bench core` (or `cargo bench --bench core -- aggregator` for one group).

use bytes::Bytes;
use crest::core::aggregator::{Aggregator, AggregatorConfig};
use crest::core::config::{Durability, Settings};
use crest::core::frame::{decode_frame, encode_frame};
use crest::core::id::{LeafId, MessageId};
use crest::core::key::Key;
use crest::core::leaf::{Leaf, LeafConfig};
use crest::core::machine::{Link, Machine, StorageDone};
use crest::core::record::LogRecord;
use crest::core::time::Time;
use crest::core::wire::{Hello, Offer, OfferEntry, PROTOCOL_VERSION, PeerKind, Role, Welcome};
use crest::core::wire::{Push, PushMessage, Wire};
use crest::storage::wal::{WalOptions, open};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn push_batch(messages: usize, payload: usize) -> Wire {
    let messages = (0..messages)
        .map(|i| PushMessage {
            topic: "jobs".into(),
            priority: (i % 10) as u32,
            metadata: vec![],
            payload: Bytes::from(vec![7u8; payload]),
            ..PushMessage::default()
        })
        .collect();
    Wire::Push(Push {
        request: 1,
        messages,
    })
}

fn frames(c: &mut Criterion) {
    let max = 16 * 1024 * 1024;
    let batch = push_batch(1024, 100);
    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Elements(1024));
    group.bench_function("encode push batch of 1024 x 100 B", |b| {
        let mut out = Vec::with_capacity(256 * 1024);
        b.iter(|| {
            out.clear();
            encode_frame(black_box(&batch), max, &mut out).unwrap();
        })
    });
    let mut encoded = Vec::new();
    encode_frame(&batch, max, &mut encoded).unwrap();
    group.bench_function("decode push batch of 1024 x 100 B", |b| {
        b.iter(|| decode_frame(black_box(&encoded), max).unwrap().unwrap())
    });
    group.finish();
}

fn keys(c: &mut Criterion) {
    let keys: Vec<Key> = (0..100_000u64)
        .map(|i| {
            Key::new(
                (i.wrapping_mul(2654435761) % 10) as u32,
                Time(i.wrapping_mul(40503) % 1000),
                MessageId::new(LeafId((i % 4 + 1) as u16), i),
            )
        })
        .collect();
    let mut group = c.benchmark_group("key");
    group.throughput(Throughput::Elements(keys.len() as u64));
    group.bench_function("sort 100k keys", |b| {
        b.iter_batched(
            || keys.clone(),
            |mut k| k.sort_unstable(),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("btree insert+pop_first 100k keys", |b| {
        b.iter_batched(
            || keys.clone(),
            |k| {
                let mut set = std::collections::BTreeSet::new();
                for key in k {
                    set.insert(key);
                }
                while set.pop_first().is_some() {}
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// A leaf taking push batches of 1024 messages: validation, ids, the log records, the
/// indexes, and the offer set's rebalance against a parent window of 256 (storage completes at
/// once; the WAL has its own group).
fn leaf_enqueue(c: &mut Criterion) {
    let mut group = c.benchmark_group("leaf");
    group.throughput(Throughput::Elements(1024));
    group.bench_function("enqueue push batch of 1024 x 100 B", |b| {
        b.iter_batched(
            || {
                let mut leaf = Leaf::new(LeafConfig {
                    name: "leaf".into(),
                    id: LeafId(1),
                    settings: Settings::default(),
                    token_key: crest::core::leaf::token_key_from_seed(1),
                    first_seq: 1,
                });
                let now = Time::from_millis(1_000);
                leaf.handle_connected(now, 1, Link::Parent);
                leaf.handle_message(now, 1, welcome(256));
                leaf.handle_connected(now, 2, Link::Incoming);
                leaf.handle_message(now, 2, hello(PeerKind::Producer));
                while leaf.poll_transmit().is_some() {}
                (leaf, push_batch(1024, 100))
            },
            |(mut leaf, batch)| {
                let now = Time::from_millis(1_001);
                leaf.handle_message(now, 2, batch);
                while let Some(op) = leaf.poll_storage() {
                    if let Some(token) = op.token() {
                        leaf.handle_storage_done(now, StorageDone::new(token));
                    }
                }
                while let Some(t) = leaf.poll_transmit() {
                    black_box(t);
                }
                leaf
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn welcome(credits: u32) -> Wire {
    Wire::Welcome(Welcome {
        node: "parent".into(),
        role: Role::Aggregator,
        credits_per_topic: credits,
        payload_bytes_max: 1 << 20,
        frame_bytes_max: 16 << 20,
        credits_per_key: credits.min(16),
    })
}

fn hello(peer: PeerKind) -> Wire {
    Wire::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        peer,
    })
}

/// An aggregator with two leaves below it and a parent above, merging offers: each iteration,
/// one child swaps 256 entries in (adds more urgent entries, retracts as many), and the
/// aggregator rebalances what it offers its parent. Throughput counts window operations.
fn aggregator_merge(c: &mut Criterion) {
    let settings = Settings::default();
    let credits = settings.credits_per_topic;
    let mut agg = Aggregator::new(AggregatorConfig {
        name: "agg".into(),
        settings,
        subtree: vec![LeafId(1), LeafId(2)],
    });
    let now = Time::from_millis(1_000);
    agg.handle_connected(now, 1, Link::Parent);
    agg.handle_message(now, 1, welcome(credits));
    for (conn, leaf) in [(2u64, 1u16), (3, 2)] {
        agg.handle_connected(now, conn, Link::Incoming);
        let peer = PeerKind::Node {
            name: format!("leaf-{leaf}"),
            role: Role::Leaf,
            leaves: vec![LeafId(leaf)],
            replica: None,
        };
        agg.handle_message(now, conn, hello(peer));
    }
    let key = |leaf: u16, seq: u64, priority: u32| {
        Key::new(priority, Time(0), MessageId::new(LeafId(leaf), seq))
    };
    // Fill both children's windows.
    let mut seq = [0u64; 2];
    let mut offer_seq = [0u64; 2];
    let mut held: [Vec<Key>; 2] = [Vec::new(), Vec::new()];
    for child in 0..2 {
        let adds: Vec<OfferEntry> = (0..credits)
            .map(|_| {
                seq[child] += 1;
                let k = key(child as u16 + 1, seq[child], 5);
                held[child].push(k);
                OfferEntry {
                    key: k,
                    size: 100,
                    since: Time(0),
                    entered: Time(0),
                }
            })
            .collect();
        offer_seq[child] += 1;
        let offer = Offer {
            topic: "jobs".into(),
            adds,
            retracts: vec![],
            frontier: Some(key(child as u16 + 1, 1 << 40, 9)),
            seq: offer_seq[child],
        };
        agg.handle_message(now, child as u64 + 2, Wire::Offer(offer));
    }
    while agg.poll_transmit().is_some() {}
    let mut group = c.benchmark_group("aggregator");
    group.throughput(Throughput::Elements(512));
    let mut round = 0u64;
    group.bench_function("merge 256 swaps (256 adds + 256 retracts)", |b| {
        b.iter(|| {
            round += 1;
            let child = (round % 2) as usize;
            let retracts: Vec<Key> = held[child].drain(..256).collect();
            let adds: Vec<OfferEntry> = (0..256)
                .map(|i| {
                    seq[child] += 1;
                    let k = key(child as u16 + 1, seq[child], (i % 5) as u32);
                    held[child].push(k);
                    OfferEntry {
                        key: k,
                        size: 100,
                        since: Time(0),
                        entered: Time(0),
                    }
                })
                .collect();
            offer_seq[child] += 1;
            let offer = Offer {
                topic: "jobs".into(),
                adds,
                retracts,
                frontier: Some(key(child as u16 + 1, 1 << 40, 9)),
                seq: offer_seq[child],
            };
            agg.handle_message(now, child as u64 + 2, Wire::Offer(offer));
            while let Some(t) = agg.poll_transmit() {
                black_box(t);
            }
        })
    });
    group.finish();
}

/// Appending push batches (1024 records of 100 B) to the write-ahead log, buffered (written,
/// not fsynced: the fsync path is measured in `benches/durable.rs`).
fn wal_append(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("crest-bench-core-wal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = WalOptions {
        durability: Durability::Buffered,
        ..WalOptions::new(dir.clone(), &Settings::default())
    };
    let (wal, _) = open(options).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = wal.start(move |done| tx.send(done.len()).unwrap()).unwrap();
    let payload = Bytes::from(vec![7u8; 100]);
    let mut next = 1u64;
    let mut token = 0u64;
    let mut group = c.benchmark_group("wal");
    group.throughput(Throughput::Elements(1024));
    group.bench_function("append batch of 1024 x 100 B (buffered)", |b| {
        b.iter(|| {
            let records: Vec<LogRecord> = (next..next + 1024)
                .map(|seq| LogRecord::Enqueue {
                    head: crest::core::record::MessageHead {
                        id: MessageId::new(LeafId(1), seq),
                        topic: "bench".into(),
                        priority: (seq % 10) as u32,
                        ready_at: Time(seq),
                        enqueued_at: Time(seq),
                        expires_at: None,
                        dedup_key: None,
                        fairness_key: None,
                    },
                    metadata: vec![],
                    payload: payload.clone(),
                })
                .collect();
            next += 1024;
            token += 1;
            handle.submit(records, Some(token)).unwrap();
            rx.recv().unwrap();
        })
    });
    group.finish();
    drop(handle);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(
    benches,
    frames,
    keys,
    leaf_enqueue,
    aggregator_merge,
    wal_append
);
criterion_main!(benches);
