//! A noisy neighbour: a producer of another namespace offering far more than its push rate,
//! open loop, while the workload runs (`crest bench --against-noisy`).

use anyhow::{Context, Result};
use crest_sdk::{Message, Producer, ProducerConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A noisy producer.
#[derive(Clone, Debug)]
pub struct Noise {
    /// The topic it pushes to (of a namespace other than the workload's).
    pub topic: String,
    /// Messages per second it offers.
    pub offered: f64,
}

/// What the noisy producer was admitted and refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NoiseReport {
    /// Messages offered.
    pub offered: u64,
    /// Messages the tree acknowledged.
    pub admitted: u64,
    /// Messages refused (rate, quota), or that failed otherwise.
    pub refused: u64,
    /// How long it offered them, in milliseconds.
    pub millis: u64,
}

/// How often the noisy producer sends a batch.
const TICK: Duration = Duration::from_millis(5);
/// Most batches it has in flight; past them it waits for the oldest answer.
const IN_FLIGHT_MAX: usize = 256;

/// Offers `noise.offered` messages a second until `stop`, each batch sent once: a refused
/// batch is counted, not sent again (the producer's `refused_wait_max` is zero).
pub(super) async fn run(
    noise: Noise,
    producer: ProducerConfig,
    stop: Arc<AtomicBool>,
) -> Result<NoiseReport> {
    let config = ProducerConfig {
        refused_wait_max: Duration::ZERO,
        ..producer
    };
    let producer = Producer::connect(config)
        .await
        .context("noisy producer connecting to the leaves")?;
    let per_tick = ((noise.offered * TICK.as_secs_f64()).ceil() as usize).max(1);
    let mut report = NoiseReport::default();
    let started = std::time::Instant::now();
    let mut waiting = tokio::task::JoinSet::new();
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let count = |report: &mut NoiseReport, admitted: bool| {
        if admitted {
            report.admitted += per_tick as u64;
        } else {
            report.refused += per_tick as u64;
        }
    };
    while !stop.load(Ordering::Acquire) {
        ticks.tick().await;
        let batch = (0..per_tick).map(|_| Message::new(noise.topic.as_str(), &b"noise"[..]));
        report.offered += per_tick as u64;
        match producer.send_batch(batch).await {
            Ok(handle) => {
                waiting.spawn(async move { handle.acked().await.is_ok() });
            }
            Err(_) => count(&mut report, false),
        }
        while waiting.len() > IN_FLIGHT_MAX {
            if let Some(done) = waiting.join_next().await {
                count(&mut report, done.unwrap_or(false));
            }
        }
        while let Some(done) = waiting.try_join_next() {
            count(&mut report, done.unwrap_or(false));
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    while let Some(done) = waiting.join_next().await {
        count(&mut report, done.unwrap_or(false));
    }
    Ok(report)
}
