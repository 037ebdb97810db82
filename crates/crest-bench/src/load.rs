//! The load: producers that push stamped payloads open loop or at a rate, consumers that pop
//! and ack, and the progress line.

use super::*;
use anyhow::Context;
use anyhow::Result;
use bytes::BufMut;
use bytes::{Bytes, BytesMut};
use crest_sdk::{Consumer, Delivery, Message, PopOptions, Producer, ProducerConfig};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// State shared by every task of a run.
pub(super) struct Shared {
    pub(super) started: Instant,
    pub(super) nonce: u64,
    pub(super) next_seq: AtomicU64,
    pub(super) pushed: AtomicU64,
    pub(super) push_errors: AtomicU64,
    pub(super) popped: AtomicU64,
    pub(super) producers_done: AtomicBool,
    pub(super) present: Present,
    /// For the lease-time rank error (`None`: too many messages for it).
    pub(super) ledger: Option<Ledger>,
    pub(super) seen: Mutex<Seen>,
    pub(super) last_push_ack_ns: AtomicU64,
    pub(super) first_pop_ns: AtomicU64,
    pub(super) last_pop_ns: AtomicU64,
}

impl Shared {
    pub(super) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

pub(super) fn record(histogram: &mut Histogram<u64>, value: u64) {
    histogram.saturating_record(value.max(1));
}

pub(super) fn stamp(payload_bytes: usize, nonce: u64, seq: u64, sent_ns: u64) -> Bytes {
    let mut payload = BytesMut::with_capacity(payload_bytes);
    payload.put_u64_le(nonce);
    payload.put_u64_le(seq);
    payload.put_u64_le(sent_ns);
    payload.resize(payload_bytes, 0x2a);
    payload.freeze()
}

pub(super) fn read_stamp(payload: &[u8], nonce: u64) -> Option<(u64, u64)> {
    if payload.len() < STAMP_BYTES {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(payload[i * 8..i * 8 + 8].try_into().expect("8"));
    (word(0) == nonce).then(|| (word(1), word(2)))
}

/// Push-ack latencies, in all and per leaf.
pub(super) struct PushAcks {
    pub(super) all: Histogram<u64>,
    pub(super) by_leaf: BTreeMap<u16, Histogram<u64>>,
}

impl PushAcks {
    pub(super) fn new() -> PushAcks {
        PushAcks {
            all: histogram(),
            by_leaf: BTreeMap::new(),
        }
    }

    pub(super) fn record(&mut self, leaf: u16, micros: u64) {
        record(&mut self.all, micros);
        record(self.by_leaf.entry(leaf).or_insert_with(histogram), micros);
    }

    pub(super) fn merge(&mut self, other: PushAcks) {
        self.all.add(&other.all).expect("same bounds");
        for (leaf, hist) in other.by_leaf {
            self.by_leaf
                .entry(leaf)
                .or_insert_with(histogram)
                .add(&hist)
                .expect("same bounds");
        }
    }
}

pub(super) struct ProducerResult {
    pub(super) push_ack: PushAcks,
}

pub(super) async fn run_producer(
    config: Arc<BenchConfig>,
    producer_config: ProducerConfig,
    shared: Arc<Shared>,
    index: usize,
) -> Result<ProducerResult> {
    let producer = Producer::connect(producer_config)
        .await
        .context("producer connecting to the leaves")?;
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(index as u64));
    let mut push_ack = PushAcks::new();
    let mut in_flight = FuturesUnordered::new();
    // Messages sent and not yet settled (the window counts messages, not batches).
    let mut unsettled = 0usize;
    let per_producer_rate = config.rate.map(|rate| rate / config.producers as f64);
    let deadline = config.duration.map(|d| shared.started + d);
    let mut sent = 0u64;
    let begun = Instant::now();
    let due = |sent: u64| {
        per_producer_rate.map(|rate| begun + Duration::from_secs_f64(sent as f64 / rate))
    };
    let mut done = false;
    while !done {
        // Acknowledgements are taken in while the producer waits (for its pace, its window,
        // or a full send queue), so a push-ack latency is measured when the ack arrives.
        if let Some(due) = due(sent) {
            let sleep = tokio::time::sleep_until(due.into());
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    biased;
                    () = &mut sleep => break,
                    Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                        unsettled -= settle_push(outcome, &shared, &mut push_ack);
                    }
                }
            }
        }
        while unsettled >= config.producer_window {
            let Some(outcome) = in_flight.next().await else {
                break;
            };
            unsettled -= settle_push(outcome, &shared, &mut push_ack);
        }
        // The batch: the first message, then those already due, within the batch and window.
        let mut messages = Vec::new();
        let mut stamps = Vec::new();
        loop {
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                done = true;
                break;
            }
            let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
            if seq >= config.messages {
                done = true;
                break;
            }
            let priority = config.priorities.draw(&mut rng);
            let sent_ns = shared.now_ns();
            let payload = stamp(config.payload_bytes, shared.nonce, seq, sent_ns);
            let mut message = Message::new(config.topic.clone(), payload).priority(priority);
            if config.fairness_keys > 0 {
                let key = rng.random_range(0..config.fairness_keys);
                message = message.fairness_key(format!("k{key}"));
            }
            messages.push(message);
            stamps.push((priority, sent_ns, seq));
            sent += 1;
            if messages.len() >= config.push_batch
                || unsettled + messages.len() >= config.producer_window
                || due(sent).is_some_and(|due| due > Instant::now())
            {
                break;
            }
        }
        if messages.is_empty() {
            break;
        }
        let count = messages.len();
        let send = producer.send_batch(messages);
        tokio::pin!(send);
        let sent_result = loop {
            tokio::select! {
                biased;
                result = &mut send => break result,
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    unsettled -= settle_push(outcome, &shared, &mut push_ack);
                }
            }
        };
        match sent_result {
            Ok(handle) => {
                unsettled += count;
                in_flight.push(async move { (handle.acked().await, stamps) });
            }
            Err(error) => {
                shared
                    .push_errors
                    .fetch_add(count as u64, Ordering::Relaxed);
                tracing::warn!("push failed: {error}");
            }
        }
        // Settle acknowledgements already in, without waiting.
        while let Some(Some(outcome)) = futures_util::FutureExt::now_or_never(in_flight.next()) {
            unsettled -= settle_push(outcome, &shared, &mut push_ack);
        }
    }
    while let Some(outcome) = in_flight.next().await {
        settle_push(outcome, &shared, &mut push_ack);
    }
    Ok(ProducerResult { push_ack })
}

/// A batch's outcome, and the priority, send time and sequence number of each of its
/// messages.
pub(super) type PushOutcome = (
    Result<Vec<crest_core::id::MessageId>, crest_sdk::ClientError>,
    Vec<(u32, u64, u64)>,
);

/// Counts a batch's outcome; how many messages it settled.
pub(super) fn settle_push(outcome: PushOutcome, shared: &Shared, push_ack: &mut PushAcks) -> usize {
    let (result, stamps) = outcome;
    match result {
        Ok(ids) => {
            let now = shared.now_ns();
            for (index, &(priority, sent_ns, seq)) in stamps.iter().enumerate() {
                // The SDK gives an id per message; were one missing, it would count as leaf 0,
                // which no leaf is.
                let leaf = ids.get(index).map_or(0, |id| id.leaf().0);
                push_ack.record(leaf, now.saturating_sub(sent_ns) / 1000);
                shared.present.add(priority);
                if let Some(ledger) = &shared.ledger {
                    ledger.acked(seq, priority, now);
                }
            }
            shared
                .pushed
                .fetch_add(stamps.len() as u64, Ordering::Relaxed);
            shared.last_push_ack_ns.fetch_max(now, Ordering::Relaxed);
        }
        Err(error) => {
            shared
                .push_errors
                .fetch_add(stamps.len() as u64, Ordering::Relaxed);
            tracing::warn!("push not acknowledged: {error}");
        }
    }
    stamps.len()
}

#[derive(Default)]
pub(super) struct ConsumerResult {
    pub(super) pop: Option<Histogram<u64>>,
    pub(super) pop_wait: Option<Histogram<u64>>,
    pub(super) ack: Option<Histogram<u64>>,
    pub(super) push_to_pop: Option<Histogram<u64>>,
    pub(super) rank_error: Option<Histogram<u64>>,
    /// Pops that delivered new messages (for the lease-time rank error).
    pub(super) pops: Vec<PopRecord>,
    pub(super) acked: u64,
    pub(super) ack_rejected: u64,
    pub(super) pop_errors: u64,
    pub(super) ack_errors: u64,
    pub(super) foreign: u64,
    pub(super) empty_pops: u64,
    pub(super) inverted_pops: u64,
}

/// Pause after a pop that failed, before the next.
const POP_ERROR_PAUSE: Duration = Duration::from_millis(100);

pub(super) async fn run_consumer(
    config: Arc<BenchConfig>,
    consumer: Consumer,
    shared: Arc<Shared>,
) -> Result<ConsumerResult> {
    let mut pop = histogram();
    let mut pop_wait = histogram();
    let mut ack = histogram();
    let mut push_to_pop = histogram();
    let mut rank_error = Histogram::<u64>::new_with_bounds(1, u64::MAX / 4, 3).expect("bounds");
    let mut result = ConsumerResult::default();
    let options = PopOptions {
        max: config.pop_batch,
        wait: Duration::from_millis(100),
        ..PopOptions::default()
    };
    let mut idle_since = Instant::now();
    let mut acks = tokio::task::JoinSet::new();
    loop {
        let producers_done = shared.producers_done.load(Ordering::Acquire);
        if producers_done
            && shared.popped.load(Ordering::Acquire) >= shared.pushed.load(Ordering::Acquire)
        {
            break;
        }
        if producers_done && idle_since.elapsed() >= config.drain_idle_timeout {
            break;
        }
        let asked = Instant::now();
        let asked_ns = shared.now_ns();
        let known_ready = shared.present.any();
        // A pop that failed (the consumer retried it already: the root is gone for longer)
        // is counted and asked again, so a run rides through faults of the tree.
        let deliveries: Vec<Delivery> =
            match consumer.pop_with(&config.topic, options.clone()).await {
                Ok(deliveries) => deliveries,
                Err(error) => {
                    result.pop_errors += 1;
                    tracing::warn!("pop failed: {error}");
                    tokio::time::sleep(POP_ERROR_PAUSE).await;
                    continue;
                }
            };
        let answered = shared.now_ns();
        if deliveries.is_empty() {
            result.empty_pops += 1;
            continue;
        }
        idle_since = Instant::now();
        if known_ready {
            record(&mut pop, asked.elapsed().as_micros() as u64);
        }
        shared.first_pop_ns.fetch_min(answered, Ordering::Relaxed);
        let mut new = 0u64;
        let mut first_sent_ns = u64::MAX;
        let mut priorities = Vec::new();
        {
            let mut seen = shared.seen.lock().unwrap_or_else(PoisonError::into_inner);
            for delivery in &deliveries {
                let Some((seq, sent_ns)) = read_stamp(&delivery.payload, shared.nonce) else {
                    result.foreign += 1;
                    continue;
                };
                first_sent_ns = first_sent_ns.min(sent_ns);
                if !seen.mark(seq) {
                    continue;
                }
                new += 1;
                if let Some(ledger) = &shared.ledger {
                    ledger.popped(seq, asked_ns);
                    priorities.push(delivery.priority.min(PRIORITY_LEVELS as u32 - 1) as u8);
                }
                record(&mut push_to_pop, answered.saturating_sub(sent_ns) / 1000);
                let error = shared
                    .present
                    .pop(delivery.priority.min(PRIORITY_LEVELS as u32 - 1));
                rank_error.saturating_record(error);
                if error > 0 {
                    result.inverted_pops += 1;
                }
            }
        }
        if !priorities.is_empty() {
            result.pops.push(PopRecord {
                asked_ns,
                answered_ns: answered,
                priorities,
            });
        }
        if let Some(wait) = pop_wait_ns(asked_ns, first_sent_ns, answered) {
            record(&mut pop_wait, wait / 1000);
        }
        shared.popped.fetch_add(new, Ordering::AcqRel);
        if config.ack {
            // Acks are pipelined behind the next pops (a few in flight), as a consumer that
            // processes one batch while the previous one's ack travels.
            while acks.len() >= config.acks_in_flight.max(1) {
                settle_ack(acks.join_next().await, &mut ack, &mut result)?;
            }
            let receipts: Vec<_> = deliveries.iter().map(Delivery::receipt).collect();
            let consumer = consumer.clone();
            let shared = shared.clone();
            acks.spawn(async move {
                let sent = Instant::now();
                let outcomes = consumer.ack_many(&receipts).await;
                shared
                    .last_pop_ns
                    .fetch_max(shared.now_ns(), Ordering::Relaxed);
                (sent.elapsed(), outcomes)
            });
        } else {
            shared
                .last_pop_ns
                .fetch_max(shared.now_ns(), Ordering::Relaxed);
        }
    }
    while let Some(done) = acks.join_next().await {
        settle_ack(Some(done), &mut ack, &mut result)?;
    }
    result.pop = Some(pop);
    result.pop_wait = Some(pop_wait);
    result.ack = Some(ack);
    result.push_to_pop = Some(push_to_pop);
    result.rank_error = Some(rank_error);
    Ok(result)
}

/// How long a pop asked at `asked_ns` and answered at `answered_ns` kept a consumer waiting
/// while something it got existed: from the later of the request and the first push among
/// its deliveries (`first_sent_ns`; `u64::MAX`: none of the bench's), in nanoseconds.
pub(super) fn pop_wait_ns(asked_ns: u64, first_sent_ns: u64, answered_ns: u64) -> Option<u64> {
    (first_sent_ns != u64::MAX).then(|| answered_ns.saturating_sub(asked_ns.max(first_sent_ns)))
}

pub(super) type AckOutcome = (
    Duration,
    Result<Vec<Result<(), crest_sdk::ReceiptError>>, crest_sdk::ClientError>,
);

pub(super) fn settle_ack(
    done: Option<Result<AckOutcome, tokio::task::JoinError>>,
    histogram: &mut Histogram<u64>,
    result: &mut ConsumerResult,
) -> Result<()> {
    let Some(done) = done else {
        return Ok(());
    };
    let (took, outcomes) = done.context("ack task")?;
    record(histogram, took.as_micros() as u64);
    let outcomes = match outcomes {
        Ok(outcomes) => outcomes,
        Err(error) => {
            // The deliveries come back after their visibility timeout (duplicates).
            result.ack_errors += 1;
            tracing::warn!("ack failed: {error}");
            return Ok(());
        }
    };
    for outcome in outcomes {
        match outcome {
            Ok(()) => result.acked += 1,
            Err(_) => result.ack_rejected += 1,
        }
    }
    Ok(())
}

pub(super) fn spawn_progress(shared: Arc<Shared>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        let (mut last_pushed, mut last_popped) = (0u64, 0u64);
        loop {
            ticker.tick().await;
            let pushed = shared.pushed.load(Ordering::Relaxed);
            let popped = shared.popped.load(Ordering::Relaxed);
            let seconds = every.as_secs_f64();
            eprintln!(
                "[{:>6.1}s] pushed {pushed:>10} ({:>9.0}/s)  popped {popped:>10} ({:>9.0}/s)  errors {}",
                shared.started.elapsed().as_secs_f64(),
                (pushed - last_pushed) as f64 / seconds,
                (popped - last_popped) as f64 / seconds,
                shared.push_errors.load(Ordering::Relaxed),
            );
            let _ = std::io::stderr().flush();
            last_pushed = pushed;
            last_popped = popped;
        }
    })
}
