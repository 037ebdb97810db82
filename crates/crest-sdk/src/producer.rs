//! The producer: pushes messages to leaves in adaptive batches.
//!
//! Each leaf gets a *lane*: a bounded queue of messages and a task that turns it into push
//! batches. A lane sends at once while it has a free in-flight slot (an idle link gives each
//! message its own batch: lowest latency); when all `batches_in_flight_max` slots are busy,
//! messages queue up and the next free slot takes all of them, up to `batch_messages_max` and
//! `batch_bytes_max` (heavy load gets big batches: throughput). `linger` optionally holds a
//! batch a little longer for more company when the link is busy. A push resolves once its
//! leaf acknowledged the batch (after it is durable). Messages are spread round-robin over
//! the lanes, except messages with a dedup key: those go to the leaf the key hashes to (a
//! replicated leaf, [`ProducerConfig::replicas`], is one leaf: its replica that answers).
//!
//! A leaf that cannot be reached is routed around: when a lane cannot connect to its leaf,
//! the batch it was about to send goes to the other lanes (messages with a dedup key
//! excepted: they belong to their leaf, and wait for it or another of its replicas, as below),
//! and new messages avoid the lane for a
//! while (`leaf_retry_initial`, doubling up to `leaf_retry_max`); after that the next batch
//! tries the leaf again. A batch already sent when its connection breaks (or that is not
//! acknowledged within `ack_timeout`, or refused `StorageFailed` by a leaf whose disk is full
//! or failing) goes to the other leaves the same way, and the lane is avoided: a leaf whose
//! host vanished costs its in-flight batches about `leaf_idle_timeout` (1 s) of latency, and
//! a leaf out of disk space a round trip, not an error. A batch that no leaf takes (none answers, or each is
//! avoided) tries the leaves in turn every `leaf_retry_initial`, up to `leaf_wait_max` (10 s),
//! before its pushes fail: a replicated leaf electing its next leader, or a lone leaf
//! restarting, delays pushes (and [`Producer::connect`] to replicated leaves waits for a
//! leader the same way). Such a batch may have been stored by the leaf that did not
//! answer, so it may be delivered twice (at-least-once; a message with a dedup key is
//! acknowledged once, with one id). [`Producer::connect`] needs one reachable leaf, not all.
//!
//! [`Producer::send_batch`] hands a lane many messages at once, with one acknowledgement
//! for all of them: it saves the per-message queue slot and reply that [`Producer::send`]
//! takes, which is most of a producer's cost at high rates. A lane still cuts its push
//! batches by `batch_messages_max` and `batch_bytes_max`.

use crate::link::Link;
use crate::{ClientError, ClientTls};
use bytes::Bytes;
use crest_core::id::MessageId;
use crest_core::topology::Topology;
use crest_core::wire::{ErrorCode, PeerKind, Push, PushMessage, Wire};
use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

mod message;
mod routing;

pub use message::Message;

use routing::{Health, Leaves, spread, spread_among, wait_for_lane};

/// How a producer connects and batches.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// Leaf addresses (`host:port`, or `NAME@host:port` to take only the certificate of node
    /// NAME there, as [`ProducerConfig::from_topology`] gives them); messages are spread over
    /// them.
    pub leaves: Vec<String>,
    /// The replicated leaves among `leaves`: each the addresses of one leaf's replicas, in
    /// the topology's order. A message with a dedup key goes to its leaf's replica that
    /// leads; an address in no group is a leaf of its own.
    pub replicas: Vec<Vec<String>>,
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
    /// How long new messages avoid a leaf that could not be reached, at first; doubles with
    /// each failure in a row.
    pub leaf_retry_initial: Duration,
    /// The longest a leaf is avoided before it is tried again.
    pub leaf_retry_max: Duration,
    /// How long a batch that no leaf takes (each was just refused, unreachable or is being
    /// avoided) waits for one that answers before its pushes fail: a replicated leaf electing
    /// a new leader, or a leaf restarting, delays pushes instead of failing them.
    pub leaf_wait_max: Duration,
    /// A connection to a leaf with no traffic for this long is given up (keep-alives go every
    /// fifth of it): how long a leaf whose host vanished goes unnoticed.
    pub leaf_idle_timeout: Duration,
    /// How long a batch the leaf refused for now ([`ClientError::RetryLater`]: say, while the
    /// leaf asks the root for a larger share of a quota) is sent again, each time after the
    /// wait the leaf named, before its pushes fail with that refusal.
    pub refused_wait_max: Duration,
}

impl ProducerConfig {
    /// Defaults for the given leaves.
    pub fn new(leaves: Vec<String>, tls: ClientTls) -> ProducerConfig {
        ProducerConfig {
            leaves,
            replicas: Vec::new(),
            tls,
            batch_messages_max: 1024,
            batch_bytes_max: 1024 * 1024,
            linger: Duration::ZERO,
            batches_in_flight_max: 32,
            queue_messages_max: 16 * 1024,
            ack_timeout: Duration::from_secs(30),
            leaf_retry_initial: Duration::from_millis(100),
            leaf_retry_max: Duration::from_secs(5),
            leaf_wait_max: Duration::from_secs(10),
            leaf_idle_timeout: Duration::from_secs(1),
            refused_wait_max: Duration::from_secs(30),
        }
    }

    /// Every leaf of a topology.
    pub fn from_topology(topology: &Topology, tls: ClientTls) -> ProducerConfig {
        let mut config = ProducerConfig::new(
            topology.leaves().map(|leaf| leaf.dial_address()).collect(),
            tls,
        );
        for leaf in topology.leaves() {
            if leaf.replica.as_ref().is_some_and(|r| r.number == 1) {
                let members = topology.members(leaf.tree_name());
                config
                    .replicas
                    .push(members.iter().map(|m| m.dial_address()).collect());
            }
        }
        config
    }
}

/// Where a pushed message's outcome goes.
type Reply = oneshot::Sender<Result<MessageId, ClientError>>;

/// Where the outcome of a part of a batch goes (its ids, in order).
type BatchReply = oneshot::Sender<Result<Vec<MessageId>, ClientError>>;

/// The acknowledgement of a part of a batch.
type PartAck = oneshot::Receiver<Result<Vec<MessageId>, ClientError>>;

/// What a lane is handed: one message ([`Producer::send`]) or a part of a batch
/// ([`Producer::send_batch`]). Either holds its permits of the lane's queue until the lane
/// takes its messages into a push batch.
enum Job {
    One {
        message: PushMessage,
        reply: Reply,
        since: Waiting,
        _queued: OwnedSemaphorePermit,
    },
    Many {
        messages: Vec<PushMessage>,
        bytes: usize,
        reply: BatchReply,
        since: Waiting,
        _queued: OwnedSemaphorePermit,
    },
}

/// Since when a batch has been waiting for a leaf that takes it (`leaf_wait_max`; `None`
/// until no leaf took it once), and whether it belongs to its leaf (routed by a key).
#[derive(Clone, Copy, Debug, Default)]
struct Waiting {
    since: Option<tokio::time::Instant>,
    pinned: bool,
}

impl Job {
    fn len(&self) -> usize {
        match self {
            Job::One { .. } => 1,
            Job::Many { messages, .. } => messages.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Job::One { message, .. } => message.payload.len(),
            Job::Many { bytes, .. } => *bytes,
        }
    }
}

/// A lane's way in: its queue, bounded in messages by `queue_messages_max` permits.
struct Lane {
    jobs: mpsc::UnboundedSender<Job>,
    queued: Arc<Semaphore>,
    health: Health,
    /// The lanes of this lane's leaf (itself included): where its dedup keys may go.
    replicas: Vec<usize>,
}

impl Lane {
    /// Queues `job` of `count` messages, waiting while the lane's queue is full.
    async fn queue(
        &self,
        count: usize,
        job: impl FnOnce(OwnedSemaphorePermit) -> Job,
    ) -> Result<(), ClientError> {
        let count = u32::try_from(count).map_err(|_| ClientError::Closed)?;
        let permit = self
            .queued
            .clone()
            .acquire_many_owned(count)
            .await
            .map_err(|_| ClientError::Closed)?;
        self.jobs.send(job(permit)).map_err(|_| ClientError::Closed)
    }
}

/// See the module doc.
pub struct Producer {
    lanes: Arc<Vec<Lane>>,
    /// The leaves, to route dedup keys.
    leaves: Leaves,
    next_lane: AtomicUsize,
    payload_bytes_max: usize,
    /// A batch's parts are at most this many messages and bytes (the lanes' push batch limits,
    /// and the queue's size).
    part_messages_max: usize,
    part_bytes_max: usize,
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

/// The acknowledgement of a batch sent with [`Producer::send_batch`], to await later.
pub struct BatchHandle {
    len: usize,
    parts: Vec<(Positions, PartAck)>,
}

/// Where a part's messages were in the batch.
enum Positions {
    Range(Range<usize>),
    List(Vec<usize>),
}

impl BatchHandle {
    /// How many messages the batch holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits until every message of the batch is acknowledged; their ids, in the batch's
    /// order.
    ///
    /// # Errors
    /// Whatever failed a push (see [`ClientError`]). A batch larger than one push batch
    /// travels in parts that are acknowledged apart, so after an error some of its messages
    /// may be durable: sending the batch again may enqueue those twice, unless they carry a
    /// dedup key.
    pub async fn acked(self) -> Result<Vec<MessageId>, ClientError> {
        let mut ids = vec![MessageId(0); self.len];
        for (positions, part) in self.parts {
            // A lane answers a part with exactly its ids (`answer`, after `send_batch` checked
            // the leaf's count).
            let got = part.await.map_err(|_| ClientError::Closed)??;
            match positions {
                Positions::Range(range) => ids[range].copy_from_slice(&got),
                Positions::List(list) => {
                    for (position, id) in list.into_iter().zip(got) {
                        ids[position] = id;
                    }
                }
            }
        }
        Ok(ids)
    }
}

impl Producer {
    /// Connects to every leaf of the config. One that answers is enough (the others are
    /// tried again as batches need them); with replicated leaves ([`ProducerConfig::replicas`])
    /// it waits up to `leaf_wait_max` for one, as a group elects its leader.
    ///
    /// # Errors
    /// [`ClientError`] (the first leaf's) if no leaf can be reached or each refuses us.
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
        let leaves = Leaves::new(&config.leaves, &config.replicas)?;
        let mut replicas = leaves.replicas(config.leaves.len()).into_iter();
        let queue_max = config.queue_messages_max.min(Semaphore::MAX_PERMITS);
        let mut lanes = Vec::new();
        let mut receivers = Vec::new();
        let mut payload_bytes_max = usize::MAX;
        let mut unreachable = None;
        // A replicated leaf whose replicas are all followers (its group is electing a leader,
        // as when the cluster has just started) refuses every connection for a moment: wait
        // for one to lead as a batch would (`leaf_wait_max`), rather than fail.
        let started = tokio::time::Instant::now();
        let dialed = loop {
            let dialed = dial_leaves(&config).await?;
            let none = dialed.iter().all(Result::is_err);
            if !none || config.replicas.is_empty() || started.elapsed() >= config.leaf_wait_max {
                break dialed;
            }
            tokio::time::sleep(config.leaf_retry_initial).await;
        };
        for (address, result) in config.leaves.iter().zip(dialed) {
            let health = Health::new();
            let link = match result {
                Ok(link) => {
                    payload_bytes_max =
                        payload_bytes_max.min(link.welcome().payload_bytes_max as usize);
                    Some(Arc::new(link))
                }
                Err(error) => {
                    health.failed(&config);
                    unreachable.get_or_insert(error);
                    None
                }
            };
            let (tx, rx) = mpsc::unbounded_channel();
            receivers.push((address.clone(), link, rx));
            lanes.push(Lane {
                jobs: tx,
                queued: Arc::new(Semaphore::new(queue_max)),
                health,
                replicas: replicas.next().expect("one per lane"),
            });
        }
        if let Some(error) = unreachable
            && payload_bytes_max == usize::MAX
        {
            return Err(error);
        }
        let lanes = Arc::new(lanes);
        for (index, (address, link, rx)) in receivers.into_iter().enumerate() {
            let lane = LaneTask {
                index,
                address,
                lanes: Arc::downgrade(&lanes),
                config: config.clone(),
            };
            tokio::spawn(run_lane(lane, link, rx));
        }
        Ok(Producer {
            lanes,
            leaves,
            next_lane: AtomicUsize::new(0),
            payload_bytes_max,
            part_messages_max: config.batch_messages_max.min(queue_max),
            part_bytes_max: config.batch_bytes_max.max(1),
        })
    }

    /// Queues a message (waiting while the queue is full) and returns a handle to its ack.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a payload over the leaves' limit;
    /// [`ClientError::Closed`] if the producer is shutting down.
    pub async fn send(&self, message: Message) -> Result<PushHandle, ClientError> {
        self.check_payload(&message.message)?;
        let lane = match message.routed_by() {
            Some(key) => {
                self.leaves
                    .dedup_lane(&self.lanes, &self.next_lane, &message.message.topic, key)
            }
            None => spread(&self.lanes, &self.next_lane, None).unwrap_or(0),
        };
        let pinned = message.routed_by().is_some();
        let message = message.message;
        let (reply, rx) = oneshot::channel();
        self.lanes[lane]
            .queue(1, |permit| Job::One {
                since: Waiting {
                    since: None,
                    pinned,
                },
                message,
                reply,
                _queued: permit,
            })
            .await?;
        Ok(PushHandle(rx))
    }

    /// Queues many messages at once (waiting while a lane's queue is full) and returns one
    /// handle to all their acks. Messages travel in the order given, in parts of at most
    /// `batch_messages_max` messages and `batch_bytes_max` bytes; each part goes to one leaf
    /// (round-robin), except messages with a dedup key, which go to the leaf their key
    /// hashes to.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] if a payload is over the leaves' limit (nothing is
    /// sent); [`ClientError::Closed`] if the producer is shutting down (parts already queued
    /// still go).
    pub async fn send_batch(
        &self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<BatchHandle, ClientError> {
        let messages: Vec<Message> = messages.into_iter().collect();
        for message in &messages {
            self.check_payload(&message.message)?;
        }
        let len = messages.len();
        let mut parts = Vec::new();
        if messages.iter().all(|m| m.routed_by().is_none()) {
            let mut messages = messages.into_iter().map(|m| m.message).peekable();
            let mut start = 0;
            while messages.peek().is_some() {
                let part = self.take_part(&mut messages);
                let range = start..start + part.len();
                start = range.end;
                let lane = spread(&self.lanes, &self.next_lane, None).unwrap_or(0);
                let part = self.queue_part(lane, part, false).await?;
                parts.push((Positions::Range(range), part));
            }
        } else {
            // Messages are grouped by lane (order kept within each), then cut into parts.
            let mut by_lane: Vec<Vec<(usize, PushMessage)>> = vec![Vec::new(); self.lanes.len()];
            let spread = spread(&self.lanes, &self.next_lane, None).unwrap_or(0);
            let mut pinned = vec![false; self.lanes.len()];
            for (position, message) in messages.into_iter().enumerate() {
                let lane = match message.routed_by() {
                    Some(key) => pinned_lane(
                        &mut pinned,
                        self.leaves.dedup_lane(
                            &self.lanes,
                            &self.next_lane,
                            &message.message.topic,
                            key,
                        ),
                    ),
                    None => spread,
                };
                by_lane[lane].push((position, message.message));
            }
            for (lane, messages) in by_lane.into_iter().enumerate() {
                let (positions, messages): (Vec<usize>, Vec<PushMessage>) =
                    messages.into_iter().unzip();
                let mut positions = positions.into_iter();
                let mut messages = messages.into_iter().peekable();
                while messages.peek().is_some() {
                    let part = self.take_part(&mut messages);
                    let list = positions.by_ref().take(part.len()).collect();
                    let part = self.queue_part(lane, part, pinned[lane]).await?;
                    parts.push((Positions::List(list), part));
                }
            }
        }
        Ok(BatchHandle { len, parts })
    }

    /// Takes the next part of a batch: at least one message, then as many as the limits let.
    fn take_part(
        &self,
        messages: &mut std::iter::Peekable<impl Iterator<Item = PushMessage>>,
    ) -> Vec<PushMessage> {
        let mut part = Vec::new();
        let mut bytes = 0;
        while let Some(next) = messages.peek() {
            let size = next.payload.len();
            if !part.is_empty()
                && (part.len() >= self.part_messages_max || bytes + size > self.part_bytes_max)
            {
                break;
            }
            bytes += size;
            part.extend(messages.next());
        }
        part
    }

    /// Queues one part of a batch on `lane`.
    async fn queue_part(
        &self,
        lane: usize,
        messages: Vec<PushMessage>,
        pinned: bool,
    ) -> Result<PartAck, ClientError> {
        let (reply, rx) = oneshot::channel();
        let bytes = messages.iter().map(|m| m.payload.len()).sum();
        let count = messages.len();
        self.lanes[lane]
            .queue(count, |permit| Job::Many {
                since: Waiting {
                    since: None,
                    pinned,
                },
                messages,
                bytes,
                reply,
                _queued: permit,
            })
            .await?;
        Ok(rx)
    }

    fn check_payload(&self, message: &PushMessage) -> Result<(), ClientError> {
        if message.payload.len() > self.payload_bytes_max {
            return Err(ClientError::InvalidArgument(format!(
                "payload of {} bytes exceeds the leaves' payload_bytes_max {}",
                message.payload.len(),
                self.payload_bytes_max
            )));
        }
        Ok(())
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

/// Dials every leaf at once: one that does not answer (its host is down, or it is a replica
/// that does not lead its group) costs `connect_timeout` once, not once each.
async fn dial_leaves(
    config: &ProducerConfig,
) -> Result<Vec<Result<Link, ClientError>>, ClientError> {
    let mut dials = tokio::task::JoinSet::new();
    for (index, address) in config.leaves.iter().enumerate() {
        let (address, config) = (address.clone(), config.clone());
        dials.spawn(async move { (index, connect_leaf(&address, &config).await) });
    }
    let mut dialed: Vec<Option<Result<Link, ClientError>>> =
        config.leaves.iter().map(|_| None).collect();
    while let Some(joined) = dials.join_next().await {
        let (index, result) =
            joined.map_err(|error| ClientError::Connect(format!("dialing a leaf: {error}")))?;
        dialed[index] = Some(result);
    }
    Ok(dialed
        .into_iter()
        .map(|result| result.expect("every dial was joined"))
        .collect())
}

async fn connect_leaf(address: &str, config: &ProducerConfig) -> Result<Link, ClientError> {
    let settings = crate::link::settings_idle_after(config.leaf_idle_timeout);
    Link::connect(
        address,
        PeerKind::Producer,
        &config.tls,
        &settings,
        config.batches_in_flight_max,
    )
    .await
}

/// Whom a push batch answers: a reply per message sent alone, one per part of a batch.
enum Answer {
    One(Reply, Waiting),
    Many(BatchReply, usize, Waiting),
}

/// Answers everyone of a push batch: `ids` in the order of its messages, or `error`.
fn answer(answers: Vec<Answer>, result: Result<Vec<MessageId>, ClientError>) {
    match result {
        Ok(ids) => {
            let mut ids = ids.into_iter();
            for answer in answers {
                match answer {
                    Answer::One(reply, _) => {
                        let _ = reply.send(ids.next().ok_or(ClientError::Closed));
                    }
                    Answer::Many(reply, count, _) => {
                        let _ = reply.send(Ok(ids.by_ref().take(count).collect()));
                    }
                }
            }
        }
        Err(error) => {
            for answer in answers {
                match answer {
                    Answer::One(reply, _) => {
                        let _ = reply.send(Err(error.clone()));
                    }
                    Answer::Many(reply, _, _) => {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
        }
    }
}

/// What a lane's task knows of itself and the others (weakly: the lanes' queues end when the
/// producer is dropped, and with them the tasks).
#[derive(Clone)]
struct LaneTask {
    index: usize,
    address: String,
    lanes: Weak<Vec<Lane>>,
    config: ProducerConfig,
}

impl LaneTask {
    fn health(&self, change: impl FnOnce(&Health)) {
        if let Some(lanes) = self.lanes.upgrade() {
            change(&lanes[self.index].health);
        }
    }
}

/// Marks `lane` as taking messages routed by a key (their part belongs to its leaf).
fn pinned_lane(pinned: &mut [bool], lane: usize) -> usize {
    pinned[lane] = true;
    lane
}

/// Hands the messages of a batch that could not be sent to lanes whose leaf answers, part by
/// part as they were queued. A part no other lane takes now waits for any lane whose leaf is
/// no longer avoided (this one's included), up to `leaf_wait_max` since it first found none;
/// returns the answers of the parts that waited that long. A part with a dedup key belongs to
/// its leaf: it goes only to the leaf's other replicas, or waits for this one.
async fn reroute(lane: &LaneTask, messages: Vec<PushMessage>, answers: Vec<Answer>) -> Vec<Answer> {
    let Some(lanes) = lane.lanes.upgrade() else {
        return answers;
    };
    let config = &lane.config;
    let next = AtomicUsize::new(lane.index + 1);
    let replicas = &lanes[lane.index].replicas;
    let mut messages = messages.into_iter();
    let mut stuck = Vec::new();
    for answer in answers {
        let (count, waiting) = match &answer {
            Answer::One(_, waiting) => (1, *waiting),
            Answer::Many(_, count, waiting) => (*count, *waiting),
        };
        let Waiting { since, pinned } = waiting;
        let part: Vec<PushMessage> = messages.by_ref().take(count).collect();
        // A part with a dedup key belongs to its leaf: it may move only to another of the
        // leaf's replicas.
        let among =
            (pinned || part.iter().any(|m| m.dedup_key.is_some())).then_some(replicas.as_slice());
        let waited_enough = since.is_some_and(|since| since.elapsed() >= config.leaf_wait_max);
        if waited_enough {
            stuck.push(answer);
            continue;
        }
        let mut target = match among {
            Some(among) => spread_among(&lanes, among, &next, Some(lane.index)),
            None => spread(&lanes, &next, Some(lane.index)),
        };
        let mut since = since;
        if target.is_none() {
            let started = *since.get_or_insert_with(tokio::time::Instant::now);
            let deadline = started + config.leaf_wait_max;
            target = wait_for_lane(&lanes, among, &next, deadline, config).await;
        }
        let Some(target) = target else {
            stuck.push(answer);
            continue;
        };
        // A lane that is closed (the producer is dropped) drops the reply: its handle says
        // `Closed`.
        let _ = match answer {
            Answer::One(reply, _) => {
                let message = part.into_iter().next().expect("one message");
                lanes[target]
                    .queue(1, |permit| Job::One {
                        message,
                        reply,
                        since: Waiting { since, pinned },
                        _queued: permit,
                    })
                    .await
            }
            Answer::Many(reply, _, _) => {
                let bytes = part.iter().map(|m| m.payload.len()).sum();
                lanes[target]
                    .queue(count, |permit| Job::Many {
                        messages: part,
                        bytes,
                        reply,
                        since: Waiting { since, pinned },
                        _queued: permit,
                    })
                    .await
            }
        };
    }
    stuck
}

async fn run_lane(lane: LaneTask, link: Option<Arc<Link>>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let config = lane.config.clone();
    let link = Arc::new(Mutex::new(LaneLink { link, failed: None }));
    let slots = Arc::new(Semaphore::new(config.batches_in_flight_max));
    // A job that did not fit the last push batch starts the next.
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let busy = slots.available_permits() + 1 < config.batches_in_flight_max;
        let linger_until = tokio::time::Instant::now() + config.linger;
        let capacity = config.batch_messages_max.min(first.len() + rx.len());
        let mut messages = Vec::with_capacity(capacity);
        let mut answers = Vec::with_capacity(capacity);
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            bytes += job.bytes();
            match job {
                Job::One {
                    message,
                    reply,
                    since,
                    ..
                } => {
                    messages.push(message);
                    answers.push(Answer::One(reply, since));
                }
                Job::Many {
                    messages: part,
                    reply,
                    since,
                    ..
                } => {
                    answers.push(Answer::Many(reply, part.len(), since));
                    messages.extend(part);
                }
            }
            if messages.len() >= config.batch_messages_max || bytes >= config.batch_bytes_max {
                break;
            }
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
            if messages.len() + job.len() > config.batch_messages_max
                || bytes + job.bytes() > config.batch_bytes_max
            {
                carried = Some(job);
                break;
            }
            next = Some(job);
        }
        let link = link.clone();
        let lane = lane.clone();
        tokio::spawn(async move {
            let config = &lane.config;
            let waiting_since = tokio::time::Instant::now();
            match current_link(&link, &lane.address, config, waiting_since).await {
                Ok(current) => {
                    let (mut kept, mut result) =
                        send_batch(&current, messages, config.ack_timeout).await;
                    let refused_since = tokio::time::Instant::now();
                    while let Err(ClientError::RetryLater { after, .. }) = &result {
                        let waited = refused_since.elapsed() + *after;
                        if kept.is_empty() || waited > config.refused_wait_max {
                            break;
                        }
                        tokio::time::sleep(*after).await;
                        (kept, result) = send_batch(&current, kept, config.ack_timeout).await;
                    }
                    if matches!(result, Err(ClientError::Timeout(_))) {
                        // A leaf that does not answer in time is treated as gone (it may have
                        // crashed without closing the connection): the next batch reconnects.
                        current.close();
                    }
                    match result {
                        Ok(ids) => {
                            lane.health(Health::answered);
                            answer(answers, Ok(ids));
                        }
                        // A leaf that cannot store the batch (its disk is full or failing)
                        // is routed around as one that cannot be reached.
                        Err(
                            error @ (ClientError::Disconnected(_)
                            | ClientError::Timeout(_)
                            | ClientError::Rejected {
                                code: ErrorCode::StorageFailed,
                                ..
                            }),
                        ) => {
                            lane.health(|health| health.failed(config));
                            let stuck = if kept.is_empty() {
                                answers
                            } else {
                                reroute(&lane, kept, answers).await
                            };
                            answer(stuck, Err(error));
                        }
                        Err(error) => answer(answers, Err(error)),
                    }
                }
                Err(error) => {
                    lane.health(|health| health.failed(config));
                    // Nothing of the batch left: it goes to leaves that answer.
                    let stuck = reroute(&lane, messages, answers).await;
                    answer(stuck, Err(error));
                }
            }
            drop(slot);
        });
    }
}

/// A lane's connection to its leaf, and how the last attempt to make one failed.
struct LaneLink {
    link: Option<Arc<Link>>,
    failed: Option<(tokio::time::Instant, ClientError)>,
}

/// The lane's link, reconnected if the last one ended. A batch that waited for the link
/// while another batch's attempt failed gets that failure rather than trying again: batches
/// queued behind a leaf whose host is gone move on together, each not waiting out its own
/// `connect_timeout_ms` in turn.
async fn current_link(
    link: &Mutex<LaneLink>,
    address: &str,
    config: &ProducerConfig,
    waiting_since: tokio::time::Instant,
) -> Result<Arc<Link>, ClientError> {
    let mut guard = link.lock().await;
    if let Some(current) = &guard.link
        && !current.is_closed()
    {
        return Ok(current.clone());
    }
    if let Some((at, error)) = &guard.failed
        && *at >= waiting_since
    {
        return Err(error.clone());
    }
    match connect_leaf(address, config).await {
        Ok(current) => {
            let current = Arc::new(current);
            guard.link = Some(current.clone());
            guard.failed = None;
            Ok(current)
        }
        Err(error) => {
            guard.failed = Some((tokio::time::Instant::now(), error.clone()));
            Err(error)
        }
    }
}

/// Pushes `messages` as one batch; their ids once acknowledged. The messages come back too
/// (empty if they could not be kept), to go to another leaf if this one does not answer.
async fn send_batch(
    link: &Link,
    messages: Vec<PushMessage>,
    timeout: Duration,
) -> (Vec<PushMessage>, Result<Vec<MessageId>, ClientError>) {
    let count = messages.len();
    let (sent, answer) = link
        .request_keeping(|request| Wire::Push(Push { request, messages }), timeout)
        .await;
    let kept = match sent {
        Some(Wire::Push(push)) => push.messages,
        _ => Vec::new(),
    };
    let ids = match answer {
        Ok(answer) => acknowledged(answer, count),
        Err(error) => Err(error),
    };
    (kept, ids)
}

/// The ids a push batch of `count` messages was answered with.
fn acknowledged(answer: Wire, count: usize) -> Result<Vec<MessageId>, ClientError> {
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
    Ok(ack.ids)
}
