//! Micro-benchmarks of the core's hot paths: frame encode/decode and key ordering.
//!
//! Run: `cargo bench --bench core`

use bytes::Bytes;
use crest::core::id::{LeafId, MessageId};
use crest::core::key::Key;
use crest::core::time::Time;
use crest::core::wire::{Push, PushMessage, Wire, decode_frame, encode_frame};
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
        .map(|i| Key {
            priority: (i.wrapping_mul(2654435761) % 10) as u32,
            ready_at: Time(i.wrapping_mul(40503) % 1000),
            id: MessageId::new(LeafId((i % 4 + 1) as u16), i),
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

criterion_group!(benches, frames, keys);
criterion_main!(benches);
