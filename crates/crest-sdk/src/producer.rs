//! The producer: pushes messages to leaves in adaptive batches.
//!
//! Each leaf gets a *lane*: a bounded queue of messages and a task that turns it into push
//! batches. A lane sends at once while it has a free in-flight slot (an idle link gives each
//! message its own batch: lowest latency); when all `batches_in_flight_max` slots are busy,
//! messages queue up and the next free slot takes all of them, up to `batch_messages_max` and
//! `batch_bytes_max` (heavy load gets big batches: throughput). `linger` optionally holds a
//! batch a little longer for more company when the link is busy. A push resolves once its
//! leaf acknowledged the batch (after it is durable). Messages are spread round-robin over
//! the lanes, except messages with a dedup key: those go to the leaf the key hashes to.

use crate::link::Link;
use crate::{ClientError, ClientTls};
use bytes::Bytes;
use crest_core::config::Settings;
use crest_core::id::MessageId;
use crest_core::time::Time;
use crest_core::topology::Topology;
use crest_core::wire::{PeerKind, Push, PushMessage, Wire};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};

/// A message to push.
#[derive(Clone, Debug)]
pub struct Message {
    message: PushMessage,
}

impl Message {
    /// A message of `topic` with the default priority ([`crest_core::tier::NORMAL`]).
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Message {
        Message {
            message: PushMessage {
                topic: topic.into(),
                priority: crest_core::tier::NORMAL,
                payload: payload.into(),
                ..PushMessage::default()
            },
        }
    }

    /// Sets the priority (lower is more urgent).
    pub fn priority(mut self, priority: u32) -> Message {
        self.message.priority = priority;
        self
    }

    /// Adds a metadata entry.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Message {
        self.message.metadata.push((key.into(), value.into()));
        self
    }

    /// Not delivered before `delay` after its leaf accepts it.
    pub fn deliver_after(mut self, delay: Duration) -> Message {
        self.message.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Not delivered before `at` (by the leaf's clock).
    pub fn deliver_at(mut self, at: SystemTime) -> Message {
        let micros = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.message.deliver_at = Some(Time(micros));
        self
    }

    /// Dropped if not consumed within `ttl` after it is ready (`Duration::ZERO`: never, even
    /// if the topic has a default time to live).
    pub fn ttl(mut self, ttl: Duration) -> Message {
        self.message.ttl_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// A second push of this topic with the same key within the topic's dedup window is
    /// acknowledged with the first message's id and not enqueued again. The producer sends
    /// every message with a key to the leaf the key hashes to, so this holds across producers
    /// that list the same leaves.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Message {
        self.message.dedup_key = Some(key.into());
        self
    }
}

/// How a producer connects and batches.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// Leaf addresses (`host:port`); messages are spread over them.
    pub leaves: Vec<String>,
    /// Trust.
    pub tls: ClientTls,
    /// Most messages in one batch.
    pub batch_messages_max: usize,
    /// Most payload bytes in one batch.
    pub batch_bytes_max: usize,
    /// How long a batch may wait for more messages while the link is busy (0: never).
    pub linger: Duration,
    /// Batches in flight per leaf.
    pub batches_in_flight_max: usize,
    /// Messages queued per leaf before `send` waits (backpressure).
    pub queue_messages_max: usize,
    /// How long to wait for a batch's acknowledgement.
    pub ack_timeout: Duration,
}

impl ProducerConfig {
    /// Defaults for the given leaves.
    pub fn new(leaves: Vec<String>, tls: ClientTls) -> ProducerConfig {
        ProducerConfig {
            leaves,
            tls,
            batch_messages_max: 1024,
            batch_bytes_max: 1024 * 1024,
            linger: Duration::ZERO,
            batches_in_flight_max: 8,
            queue_messages_max: 16 * 1024,
            ack_timeout: Duration::from_secs(30),
        }
    }

    /// Every leaf of a topology.
    pub fn from_topology(topology: &Topology, tls: ClientTls) -> ProducerConfig {
        ProducerConfig::new(
            topology.leaves().map(|leaf| leaf.address.clone()).collect(),
            tls,
        )
    }
}

/// Where a pushed message's outcome goes.
type Reply = oneshot::Sender<Result<MessageId, ClientError>>;

struct Job {
    message: PushMessage,
    reply: Reply,
}

/// See the module doc.
pub struct Producer {
    lanes: Vec<mpsc::Sender<Job>>,
    /// The address of each lane, to route dedup keys.
    addresses: Vec<String>,
    next_lane: AtomicUsize,
    payload_bytes_max: usize,
}

/// The acknowledgement of one pushed message, to await later.
pub struct PushHandle(oneshot::Receiver<Result<MessageId, ClientError>>);

impl PushHandle {
    /// Waits for the leaf's acknowledgement.
    ///
    /// # Errors
    /// Whatever failed the push (see [`ClientError`]).
    pub async fn acked(self) -> Result<MessageId, ClientError> {
        self.0.await.map_err(|_| ClientError::Closed)?
    }
}

impl Producer {
    /// Connects to every leaf of the config.
    ///
    /// # Errors
    /// [`ClientError`] if a leaf cannot be reached or refuses us.
    pub async fn connect(config: ProducerConfig) -> Result<Producer, ClientError> {
        if config.leaves.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a producer needs at least one leaf address".into(),
            ));
        }
        if config.batch_messages_max == 0
            || config.batches_in_flight_max == 0
            || config.queue_messages_max == 0
        {
            return Err(ClientError::InvalidArgument(
                "batch_messages_max, batches_in_flight_max and queue_messages_max must be at least 1".into(),
            ));
        }
        let mut lanes = Vec::new();
        let mut payload_bytes_max = usize::MAX;
        for address in &config.leaves {
            let link = connect_leaf(address, &config).await?;
            payload_bytes_max = payload_bytes_max.min(link.welcome().payload_bytes_max as usize);
            let (tx, rx) = mpsc::channel(config.queue_messages_max);
            tokio::spawn(run_lane(
                address.clone(),
                Arc::new(link),
                rx,
                config.clone(),
            ));
            lanes.push(tx);
        }
        Ok(Producer {
            lanes,
            addresses: config.leaves.clone(),
            next_lane: AtomicUsize::new(0),
            payload_bytes_max,
        })
    }

    /// Queues a message (waiting while the queue is full) and returns a handle to its ack.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a payload over the leaves' limit;
    /// [`ClientError::Closed`] if the producer is shutting down.
    pub async fn send(&self, message: Message) -> Result<PushHandle, ClientError> {
        let message = message.message;
        if message.payload.len() > self.payload_bytes_max {
            return Err(ClientError::InvalidArgument(format!(
                "payload of {} bytes exceeds the leaves' payload_bytes_max {}",
                message.payload.len(),
                self.payload_bytes_max
            )));
        }
        let lane = match &message.dedup_key {
            Some(key) => dedup_lane(&self.addresses, &message.topic, key),
            None => self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len(),
        };
        let (reply, rx) = oneshot::channel();
        self.lanes[lane]
            .send(Job { message, reply })
            .await
            .map_err(|_| ClientError::Closed)?;
        Ok(PushHandle(rx))
    }

    /// Pushes one message and waits until its leaf acknowledged it.
    ///
    /// # Errors
    /// See [`Producer::send`] and [`PushHandle::acked`].
    pub async fn push(
        &self,
        topic: &str,
        priority: u32,
        payload: impl Into<Bytes>,
    ) -> Result<MessageId, ClientError> {
        self.send(Message::new(topic, payload).priority(priority))
            .await?
            .acked()
            .await
    }
}

/// The lane a dedup key goes to: rendezvous hashing over the leaf addresses, so every
/// producer listing the same leaves (in any order) picks the same one, and adding a leaf moves
/// only the keys that now hash to it.
fn dedup_lane(addresses: &[String], topic: &str, key: &str) -> usize {
    let score = |address: &str| {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for part in [address, "\0", topic, "\0", key] {
            for byte in part.bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        // splitmix64 finaliser: FNV alone mixes the last bytes poorly.
        hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        hash ^ (hash >> 31)
    };
    (0..addresses.len())
        .max_by_key(|&index| (score(&addresses[index]), std::cmp::Reverse(index)))
        .unwrap_or(0)
}

async fn connect_leaf(address: &str, config: &ProducerConfig) -> Result<Link, ClientError> {
    let settings = Settings::default();
    Link::connect(
        address,
        PeerKind::Producer,
        &config.tls.ca_pem,
        &settings,
        config.batches_in_flight_max,
    )
    .await
}

async fn run_lane(
    address: String,
    link: Arc<Link>,
    mut rx: mpsc::Receiver<Job>,
    config: ProducerConfig,
) {
    let link = Arc::new(Mutex::new(link));
    let slots = Arc::new(Semaphore::new(config.batches_in_flight_max));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.message.payload.len();
        let mut batch = vec![first];
        let busy = slots.available_permits() + 1 < config.batches_in_flight_max;
        let linger_until = tokio::time::Instant::now() + config.linger;
        while batch.len() < config.batch_messages_max && bytes < config.batch_bytes_max {
            let job = match rx.try_recv() {
                Ok(job) => job,
                Err(_) if busy && !config.linger.is_zero() => {
                    match tokio::time::timeout_at(linger_until, rx.recv()).await {
                        Ok(Some(job)) => job,
                        _ => break,
                    }
                }
                Err(_) => break,
            };
            bytes += job.message.payload.len();
            batch.push(job);
        }
        let link = link.clone();
        let address = address.clone();
        let config = config.clone();
        tokio::spawn(async move {
            // The messages go into the frame; the replies wait for its answer.
            let (messages, replies): (Vec<PushMessage>, Vec<_>) = batch
                .into_iter()
                .map(|job| (job.message, job.reply))
                .unzip();
            let mut replies = Some(replies);
            let current = current_link(&link, &address, &config).await;
            let result = match current {
                Ok(current) => {
                    let result =
                        send_batch(&current, messages, &mut replies, config.ack_timeout).await;
                    if matches!(result, Err(ClientError::Timeout(_))) {
                        // A leaf that does not answer in time is treated as gone (it may have
                        // crashed without closing the connection): the next batch reconnects.
                        current.close();
                    }
                    result
                }
                Err(error) => Err(error),
            };
            if let (Err(error), Some(replies)) = (result, replies) {
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
            drop(slot);
        });
    }
}

/// The lane's link, reconnected if the last one ended.
async fn current_link(
    link: &Mutex<Arc<Link>>,
    address: &str,
    config: &ProducerConfig,
) -> Result<Arc<Link>, ClientError> {
    let mut guard = link.lock().await;
    if guard.is_closed() {
        *guard = Arc::new(connect_leaf(address, config).await?);
    }
    Ok(guard.clone())
}

/// Pushes `messages` as one batch and, once acknowledged, answers `replies` (taken) with
/// their ids; on an error they are left to the caller.
async fn send_batch(
    link: &Link,
    messages: Vec<PushMessage>,
    replies: &mut Option<Vec<Reply>>,
    timeout: Duration,
) -> Result<(), ClientError> {
    let count = messages.len();
    let answer = link
        .request(|request| Wire::Push(Push { request, messages }), timeout)
        .await?;
    let Wire::PushAck(ack) = answer else {
        return Err(ClientError::Protocol(format!(
            "expected PushAck, got {}",
            answer.name()
        )));
    };
    if ack.ids.len() != count {
        return Err(ClientError::Protocol(format!(
            "{} ids for {count} messages",
            ack.ids.len(),
        )));
    }
    for (reply, id) in replies.take().into_iter().flatten().zip(ack.ids) {
        let _ = reply.send(Ok(id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dedup_lane;

    #[test]
    fn a_dedup_key_picks_the_same_leaf_whatever_the_order_of_addresses() {
        let forward: Vec<String> = (0..5).map(|i| format!("10.0.0.{i}:7411")).collect();
        let mut backward = forward.clone();
        backward.reverse();
        let mut used = std::collections::HashSet::new();
        for key in 0..200 {
            let key = format!("order-{key}");
            let a = &forward[dedup_lane(&forward, "jobs", &key)];
            let b = &backward[dedup_lane(&backward, "jobs", &key)];
            assert_eq!(a, b, "{key}");
            used.insert(a.clone());
        }
        assert_eq!(used.len(), 5, "keys spread over every leaf");
    }
}
