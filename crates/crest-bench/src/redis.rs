//! The reference workload against Redis used as a reliable priority queue, for a peer
//! comparison (`crest bench --redis URL`, `scripts/bench-redis`).
//!
//! The pattern Redis-based queues use for at-least-once delivery: messages are members of a
//! sorted set scored by priority, then arrival (`ZADD`, one command per batch of
//! `push_batch`); a Lua script claims the `pop_batch` most urgent into an in-flight sorted set
//! scored by the lease's deadline (`ZRANGE` + `ZREM` + `ZADD`, atomic); an ack removes them
//! from it (`ZREM`). Producers and consumers each have a connection of their own and keep
//! requests in flight on it (`producer_window` messages, `acks_in_flight` acks), as crest's
//! SDK does. Durability is the server's: run it with `appendfsync always` (a sync per write,
//! like crest's leaves) or `everysec`.

use crate::config::{BenchConfig, Phase};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Claims up to ARGV[1] of the most urgent members of KEYS[1] into KEYS[2] with score ARGV[2]
/// (the lease deadline), and returns them.
const CLAIM: &str = r"
local items = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items == 0 then return items end
redis.call('ZREM', KEYS[1], unpack(items))
local scored = {}
for i, item in ipairs(items) do
  scored[2 * i - 1] = ARGV[2]
  scored[2 * i] = item
end
redis.call('ZADD', KEYS[2], unpack(scored))
return items
";

/// What a run against Redis measured.
#[derive(Clone, Debug, Serialize)]
pub struct RedisReport {
    /// Where the server was.
    pub url: String,
    /// Producers, consumers.
    pub producers: usize,
    /// Consumers.
    pub consumers: usize,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Messages the server took.
    pub pushed: u64,
    /// Seconds from the first push to the last one answered.
    pub push_seconds: f64,
    /// Messages claimed and acknowledged.
    pub popped: u64,
    /// Seconds from the first claim to the last ack answered.
    pub pop_seconds: f64,
    /// Messages pushed and never claimed.
    pub missing: u64,
    /// Messages claimed more than once.
    pub duplicates: u64,
    /// Members left in the queue and in the in-flight set at the end (0 and 0: every
    /// message claimed and acknowledged).
    pub left: (u64, u64),
}

impl RedisReport {
    /// Pushes per second.
    pub fn push_rate(&self) -> f64 {
        self.pushed as f64 / self.push_seconds.max(1e-9)
    }

    /// Claims + acks per second.
    pub fn pop_rate(&self) -> f64 {
        self.popped as f64 / self.pop_seconds.max(1e-9)
    }

    /// The report as `crest bench` prints its own (the same lines for the same figures).
    pub fn render(&self) -> String {
        format!(
            "redis bench: FillThenDrain, {} producers x {} consumers, {} B payloads, {}\n\
             \x20 pushed   {:>10}  in {:>7.3} s  = {:>10.0} msgs/s\n\
             \x20 popped   {:>10}  in {:>7.3} s  = {:>10.0} msgs/s (pop + ack)\n\
             \x20 missing {}  duplicates {}  left in queue {}  left in flight {}\n",
            self.producers,
            self.consumers,
            self.payload_bytes,
            self.url,
            self.pushed,
            self.push_seconds,
            self.push_rate(),
            self.popped,
            self.pop_seconds,
            self.pop_rate(),
            self.missing,
            self.duplicates,
            self.left.0,
            self.left.1,
        )
    }
}

/// Runs `config`'s workload (fill then drain) against the Redis server at `url`.
///
/// # Errors
/// When the server cannot be reached or answers with an error, or the workload asks for
/// what this comparison does not do (a mixed phase, a duration, a rate, no acks).
pub async fn run(url: &str, config: &BenchConfig) -> Result<RedisReport> {
    if config.phase != Phase::FillThenDrain
        || config.duration.is_some()
        || config.rate.is_some()
        || !config.ack
    {
        bail!(
            "--redis runs the reference shape only: fill then drain, a count of messages, open \
             loop, acks on"
        );
    }
    let client = redis::Client::open(url).with_context(|| format!("redis URL {url}"))?;
    let connect = || async {
        client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to redis at {url}"))
    };
    let queue = format!("{}:queue", config.topic);
    let in_flight = format!("{}:in-flight", config.topic);
    let mut admin = connect().await?;
    redis::cmd("DEL")
        .arg(&queue)
        .arg(&in_flight)
        .exec_async(&mut admin)
        .await?;
    let messages = config.messages;
    let seen: Arc<Vec<AtomicBool>> =
        Arc::new((0..messages).map(|_| AtomicBool::new(false)).collect());
    let next = Arc::new(AtomicU64::new(0));

    let fill = Instant::now();
    let mut producers = Vec::new();
    for index in 0..config.producers {
        let connection = connect().await?;
        let (config, queue, next) = (config.clone(), queue.clone(), next.clone());
        producers.push(tokio::spawn(async move {
            produce(connection, &config, index, &queue, &next).await
        }));
    }
    let mut pushed = 0;
    for producer in producers {
        pushed += producer.await.context("producer task")??;
    }
    let push_seconds = fill.elapsed().as_secs_f64();

    let drain = Instant::now();
    let counts = Arc::new(Counts::default());
    let mut consumers = Vec::new();
    for _ in 0..config.consumers {
        let connection = connect().await?;
        let (config, seen, counts) = (config.clone(), seen.clone(), counts.clone());
        let keys = (queue.clone(), in_flight.clone());
        consumers.push(tokio::spawn(async move {
            consume(connection, &config, &keys, &seen, &counts).await
        }));
    }
    for consumer in consumers {
        consumer.await.context("consumer task")??;
    }
    let pop_seconds = drain.elapsed().as_secs_f64();
    let missing = seen.iter().filter(|s| !s.load(Ordering::Relaxed)).count() as u64;
    let left_queue: u64 = redis::cmd("ZCARD")
        .arg(&queue)
        .query_async(&mut admin)
        .await?;
    let left_in_flight: u64 = redis::cmd("ZCARD")
        .arg(&in_flight)
        .query_async(&mut admin)
        .await?;
    Ok(RedisReport {
        url: url.to_string(),
        producers: config.producers,
        consumers: config.consumers,
        payload_bytes: config.payload_bytes,
        pushed,
        push_seconds,
        popped: counts.acked.load(Ordering::Relaxed),
        pop_seconds,
        missing,
        duplicates: counts.duplicates.load(Ordering::Relaxed),
        left: (left_queue, left_in_flight),
    })
}

/// One producer: takes sequence numbers until `config.messages` are given out and pushes them
/// in `ZADD`s of `push_batch`, keeping `producer_window` messages unanswered. Answers how
/// many the server took.
async fn produce(
    connection: redis::aio::MultiplexedConnection,
    config: &BenchConfig,
    index: usize,
    queue: &str,
    next: &AtomicU64,
) -> Result<u64> {
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(index as u64));
    let batch = config.push_batch.max(1) as u64;
    let window = (config.producer_window / config.push_batch.max(1)).max(1);
    let mut in_flight = FuturesUnordered::new();
    let mut pushed = 0;
    loop {
        while in_flight.len() < window {
            let first = next.fetch_add(batch, Ordering::Relaxed);
            if first >= config.messages {
                break;
            }
            let last = (first + batch).min(config.messages);
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(queue);
            for seq in first..last {
                let priority = u64::from(config.priorities.draw(&mut rng));
                // Priority first, then arrival: exact in a double while seq < 2^40.
                zadd.arg((priority << 40 | seq) as f64)
                    .arg(member(seq, config.payload_bytes));
            }
            let mut connection = connection.clone();
            in_flight.push(async move {
                let added: u64 = zadd.query_async(&mut connection).await?;
                Ok::<u64, redis::RedisError>(added)
            });
        }
        match in_flight.next().await {
            Some(added) => pushed += added?,
            None => return Ok(pushed),
        }
    }
}

/// What the consumers counted together.
#[derive(Default)]
struct Counts {
    /// Messages claimed for the first time.
    claimed: AtomicU64,
    /// Messages whose ack was answered.
    acked: AtomicU64,
    /// Claims of a message claimed before.
    duplicates: AtomicU64,
}

/// One consumer: claims `pop_batch` at a time and acks them, `acks_in_flight` acks unanswered,
/// until the queue is empty and every message was claimed (or claims come back empty for
/// `drain_idle_timeout`).
async fn consume(
    connection: redis::aio::MultiplexedConnection,
    config: &BenchConfig,
    (queue, in_flight): &(String, String),
    seen: &[AtomicBool],
    counts: &Counts,
) -> Result<()> {
    let claim = redis::Script::new(CLAIM);
    let mut acks = FuturesUnordered::new();
    let mut claimer = connection.clone();
    let mut idle_since: Option<Instant> = None;
    loop {
        let deadline = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + Duration::from_secs(30);
        let items: Vec<Vec<u8>> = claim
            .key(queue)
            .key(in_flight)
            .arg(config.pop_batch)
            .arg(deadline.as_millis() as u64)
            .invoke_async(&mut claimer)
            .await?;
        if items.is_empty() {
            let all = counts.claimed.load(Ordering::Relaxed) >= config.messages;
            let idle = idle_since.get_or_insert_with(Instant::now);
            if all || idle.elapsed() >= config.drain_idle_timeout {
                break;
            }
            tokio::task::yield_now().await;
            continue;
        }
        idle_since = None;
        for item in &items {
            let seq = sequence(item);
            match seen.get(seq as usize) {
                Some(flag) if !flag.swap(true, Ordering::Relaxed) => {
                    counts.claimed.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    counts.duplicates.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        while acks.len() >= config.acks_in_flight.max(1) {
            if let Some(acked) = acks.next().await {
                acked?;
            }
        }
        let count = items.len() as u64;
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(in_flight).arg(items);
        let mut connection = connection.clone();
        acks.push(async move {
            let removed: u64 = zrem.query_async(&mut connection).await?;
            counts.acked.fetch_add(count, Ordering::Relaxed);
            Ok::<u64, redis::RedisError>(removed)
        });
    }
    while let Some(acked) = acks.next().await {
        acked?;
    }
    Ok(())
}

/// A message: its sequence number, then filler up to `payload_bytes` (at least the number).
fn member(seq: u64, payload_bytes: usize) -> Vec<u8> {
    let mut bytes = seq.to_be_bytes().to_vec();
    bytes.resize(payload_bytes.max(8), b'x');
    bytes
}

/// The sequence number a member starts with (`u64::MAX` for one too short: not ours).
fn sequence(member: &[u8]) -> u64 {
    member
        .get(..8)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(u64::MAX, u64::from_be_bytes)
}
