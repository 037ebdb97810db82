//! The leaf state machine: accepts pushes, owns messages, leases them to the root.
//!
//! # Contract
//! Implements [`Machine`]; see [`crate::machine`] for the polling order and time rules.
//!
//! # Message states
//! Every message the leaf holds is in exactly one state:
//! - **pending**: in a push batch waiting for storage; not yet acknowledged nor offered;
//! - **available**: a candidate of its topic's [`OfferSet`] (offered to the parent or not);
//! - **leased**: reserved by the root under a lease (token, deadline, attempt number).
//!
//! Transitions: a push batch becomes available when storage reports it durable, and only then
//! is the producer acknowledged. `Reserve` turns available into leased (anything else is
//! denied: the leaf's lease is the single authority). `Confirm` with the live token deletes a
//! leased message; `Release` with the live token, or the lease deadline passing, makes it
//! available again with its attempt count kept.
//!
//! # Storage
//! Every state change is emitted as a [`LogRecord`] through `poll_storage`. Push batches carry
//! a token and are acknowledged on `handle_storage_done`; the other records carry none.

use crate::config::Settings;
use crate::downstream::{Downstream, PeerKindTag, Topic};
use crate::id::{IdMap, LeafId, MESSAGE_SEQ_MAX, MessageId, Receipt};
use crate::key::Key;
use crate::machine::{ConnId, Link, Machine, NodeStats, StorageDone, StorageOp, Transmit};
use crate::offer::OfferSet;
use crate::time::Time;
use crate::upstream::Upstream;
use crate::wire::{
    Confirm, Confirmed, Delivery, ErrorCode, Push, PushAck, PushMessage, ReceiptError, Release,
    Reserve, ReserveDenied, ReserveOutcome, Reserved, Role, Wire,
};
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// One record of the leaf's log.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum LogRecord {
    /// A message was accepted.
    Enqueue {
        /// Its id.
        id: MessageId,
        /// Its topic.
        topic: String,
        /// Its priority.
        priority: u32,
        /// When it is ready.
        ready_at: Time,
        /// When it was accepted.
        enqueued_at: Time,
        /// Producer metadata.
        metadata: Vec<(String, String)>,
        /// The payload.
        payload: Bytes,
    },
    /// A lease was granted.
    Lease {
        /// The message.
        id: MessageId,
        /// The attempt number this lease is.
        attempt: u32,
        /// The lease deadline.
        deadline: Time,
    },
    /// A message was acknowledged and deleted.
    Delete {
        /// The message.
        id: MessageId,
    },
    /// A lease ended early; the message is available again.
    Release {
        /// The message.
        id: MessageId,
    },
}

/// How a leaf is set up.
#[derive(Clone, Debug)]
pub struct LeafConfig {
    /// The leaf's name in the topology.
    pub name: String,
    /// The leaf's id (encoded in every message id it mints).
    pub id: LeafId,
    /// Bounds and timings.
    pub settings: Settings,
    /// Seed of the lease-token generator.
    pub seed: u64,
    /// First sequence number to assign (storage recovery, or a clock reading for a memory
    /// store, so that ids are not reused across restarts).
    pub first_seq: u64,
}

#[derive(Debug)]
struct Lease {
    token: u64,
    deadline: Time,
}

#[derive(Debug)]
struct Stored {
    topic: Topic,
    key: Key,
    enqueued_at: Time,
    metadata: Vec<(String, String)>,
    payload: Bytes,
    /// Leases granted so far.
    attempt: u32,
    lease: Option<Lease>,
}

#[derive(Debug, Default)]
struct LeafTopic {
    offers: OfferSet,
    /// Messages of this topic in any state but pending.
    messages: u64,
}

#[derive(Debug)]
struct PendingBatch {
    conn: ConnId,
    request: u64,
    messages: Vec<(MessageId, Stored)>,
}

/// See the module doc.
pub struct Leaf {
    config: LeafConfig,
    next_seq: u64,
    rng: u64,
    upstream: Upstream,
    clients: Downstream,
    messages: IdMap<Stored>,
    topics: HashMap<Topic, LeafTopic>,
    leases: BTreeSet<(Time, MessageId)>,
    pending: HashMap<u64, PendingBatch>,
    pending_messages: u64,
    next_token: u64,
    dirty: HashSet<Topic>,
    transmits: VecDeque<Transmit>,
    storage: VecDeque<StorageOp>,
    closes: VecDeque<(ConnId, String)>,
    violations: u64,
    /// Approximate bytes appended to the log since the last checkpoint.
    logged_bytes: u64,
    /// Approximate bytes a checkpoint of the live state would take.
    live_bytes: u64,
    /// When the time trigger takes a checkpoint (set once something is logged after one).
    checkpoint_due: Option<Time>,
}

impl Leaf {
    /// Creates an empty leaf.
    pub fn new(config: LeafConfig) -> Leaf {
        assert!(config.id.0 != 0, "leaf id 0 is reserved");
        let upstream = Upstream::new(config.name.clone(), Role::Leaf, vec![config.id]);
        let clients = Downstream::new(
            config.name.clone(),
            Role::Leaf,
            config.settings.clone(),
            vec![config.id],
        );
        Leaf {
            next_seq: config.first_seq.clamp(1, MESSAGE_SEQ_MAX),
            rng: config.seed,
            upstream,
            clients,
            messages: IdMap::default(),
            topics: HashMap::new(),
            leases: BTreeSet::new(),
            pending: HashMap::new(),
            pending_messages: 0,
            next_token: 1,
            dirty: HashSet::new(),
            transmits: VecDeque::new(),
            storage: VecDeque::new(),
            closes: VecDeque::new(),
            violations: 0,
            logged_bytes: 0,
            live_bytes: 0,
            checkpoint_due: None,
            config,
        }
    }

    /// Rebuilds a leaf from its log: every storage operation it ever emitted, in order.
    ///
    /// Messages come back available; those that were leased at the crash keep their attempt
    /// counts (their leases are gone with the root that held them). Sequence numbers continue
    /// above both the highest recovered and `config.first_seq`.
    pub fn recover(
        config: LeafConfig,
        operations: impl IntoIterator<Item = Vec<LogRecord>>,
    ) -> Leaf {
        let mut leaf = Leaf::new(config);
        let operations: Vec<Vec<LogRecord>> = operations.into_iter().collect();
        let enqueues = operations
            .iter()
            .flatten()
            .filter(|r| matches!(r, LogRecord::Enqueue { .. }))
            .count();
        leaf.messages.reserve(enqueues);
        let mut seq_max = 0;
        // Consecutive records mostly share a topic: remember the last one instead of hashing
        // its name for every record.
        let mut last_topic: Option<Topic> = None;
        for record in operations.into_iter().flatten() {
            match record {
                LogRecord::Enqueue {
                    id,
                    topic,
                    priority,
                    ready_at,
                    enqueued_at,
                    metadata,
                    payload,
                } => {
                    seq_max = seq_max.max(id.seq());
                    let topic = match &last_topic {
                        Some(last) if **last == *topic => last.clone(),
                        _ => {
                            let interned = leaf.topic(&topic);
                            last_topic = Some(interned.clone());
                            interned
                        }
                    };
                    let key = Key {
                        priority,
                        ready_at,
                        id,
                    };
                    let stored = Stored {
                        topic,
                        key,
                        enqueued_at,
                        metadata,
                        payload,
                        attempt: 0,
                        lease: None,
                    };
                    let bytes = stored_bytes(&stored);
                    if leaf.messages.insert(id, stored).is_none() {
                        leaf.live_bytes += bytes;
                    }
                }
                LogRecord::Lease { id, attempt, .. } => {
                    if let Some(stored) = leaf.messages.get_mut(&id) {
                        stored.attempt = stored.attempt.max(attempt);
                    }
                }
                LogRecord::Delete { id } => {
                    if let Some(stored) = leaf.messages.remove(&id) {
                        leaf.live_bytes -= stored_bytes(&stored);
                    }
                }
                LogRecord::Release { .. } => {}
            }
        }
        // Every recovered message is available: gather each topic's entries, then build its
        // index in bulk (sorting once beats a million ordered inserts).
        let mut by_topic: HashMap<Topic, Vec<(Key, u32)>> = HashMap::new();
        for stored in leaf.messages.values() {
            by_topic
                .entry(stored.topic.clone())
                .or_default()
                .push((stored.key, stored.payload.len() as u32));
        }
        for (name, entries) in by_topic {
            let topic = leaf.topics.get_mut(&name).expect("interned above");
            topic.messages = entries.len() as u64;
            topic.offers = OfferSet::from_unoffered(entries);
        }
        leaf.topics.retain(|_, topic| topic.messages > 0);
        leaf.dirty.clear();
        leaf.dirty.extend(leaf.topics.keys().cloned());
        leaf.next_seq = leaf.next_seq.max(seq_max + 1).min(MESSAGE_SEQ_MAX);
        leaf
    }

    /// This leaf's id.
    pub fn id(&self) -> LeafId {
        self.config.id
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.transmits.push_back(Transmit { conn, msg });
    }

    /// splitmix64: lease tokens are unguessable enough for receipts, and reproducible by seed.
    fn next_lease_token(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn topic(&mut self, name: &str) -> Topic {
        if let Some((topic, _)) = self.topics.get_key_value(name) {
            return topic.clone();
        }
        let topic: Topic = Arc::from(name);
        self.topics.insert(topic.clone(), LeafTopic::default());
        topic
    }

    /// Checks a push batch; the error names the first problem found.
    fn validate_push(&self, push: &Push) -> Result<(), (ErrorCode, String)> {
        let s = &self.config.settings;
        let count = push.messages.len();
        if count == 0 {
            return Err((ErrorCode::InvalidArgument, "empty push batch".into()));
        }
        if count > s.push_batch_messages_max as usize {
            return Err((
                ErrorCode::BatchTooLarge,
                format!(
                    "batch of {count} messages exceeds push_batch_messages_max {}",
                    s.push_batch_messages_max
                ),
            ));
        }
        let bytes: usize = push.messages.iter().map(|m| m.payload.len()).sum();
        if bytes > s.push_batch_bytes_max as usize {
            return Err((
                ErrorCode::BatchTooLarge,
                format!(
                    "batch of {bytes} payload bytes exceeds push_batch_bytes_max {}",
                    s.push_batch_bytes_max
                ),
            ));
        }
        let mut new_topics = HashSet::new();
        for (index, message) in push.messages.iter().enumerate() {
            validate_message(s, message)
                .map_err(|(code, why)| (code, format!("message {index}: {why}")))?;
            if !self.topics.contains_key(message.topic.as_str()) {
                new_topics.insert(message.topic.as_str());
            }
        }
        if self.topics.len() + new_topics.len() > s.topics_max as usize {
            return Err((
                ErrorCode::TopicLimit,
                format!(
                    "leaf holds {} topics; topics_max is {}",
                    self.topics.len(),
                    s.topics_max
                ),
            ));
        }
        let held = self.messages.len() as u64 + self.pending_messages;
        if held + count as u64 > s.leaf_messages_max {
            return Err((
                ErrorCode::QueueFull,
                format!(
                    "leaf holds {held} messages; leaf_messages_max is {}",
                    s.leaf_messages_max
                ),
            ));
        }
        if self.pending.len() >= s.leaf_pending_batches_max as usize {
            return Err((
                ErrorCode::Overloaded,
                "too many push batches waiting for storage; retry".into(),
            ));
        }
        if self.next_seq + count as u64 > MESSAGE_SEQ_MAX {
            return Err((
                ErrorCode::QueueFull,
                "message sequence space of this leaf is exhausted".into(),
            ));
        }
        Ok(())
    }

    fn handle_push(&mut self, now: Time, conn: ConnId, push: Push) {
        if let Err((code, message)) = self.validate_push(&push) {
            self.send(conn, Wire::error(Some(push.request), code, message));
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        let mut records = Vec::with_capacity(push.messages.len());
        let mut messages = Vec::with_capacity(push.messages.len());
        for message in push.messages {
            let id = MessageId::new(self.config.id, self.next_seq);
            self.next_seq += 1;
            let topic = self.topic(&message.topic);
            let key = Key {
                priority: message.priority,
                ready_at: now,
                id,
            };
            records.push(LogRecord::Enqueue {
                id,
                topic: message.topic,
                priority: message.priority,
                ready_at: now,
                enqueued_at: now,
                metadata: message.metadata.clone(),
                payload: message.payload.clone(),
            });
            let stored = Stored {
                topic,
                key,
                enqueued_at: now,
                metadata: message.metadata,
                payload: message.payload,
                attempt: 0,
                lease: None,
            };
            messages.push((id, stored));
        }
        self.pending_messages += messages.len() as u64;
        // Pending messages are part of the state a snapshot holds.
        self.live_bytes += messages.iter().map(|(_, m)| stored_bytes(m)).sum::<u64>();
        self.pending.insert(
            token,
            PendingBatch {
                conn,
                request: push.request,
                messages,
            },
        );
        self.log(now, Some(token), records);
    }

    /// Appends records to the log (through `poll_storage`) and counts log growth.
    fn log(&mut self, now: Time, token: Option<u64>, records: Vec<LogRecord>) {
        if records.is_empty() {
            return;
        }
        self.logged_bytes += records.iter().map(record_bytes).sum::<u64>();
        if self.checkpoint_due.is_none() {
            let interval = Duration::from_millis(self.config.settings.checkpoint_interval_ms);
            self.checkpoint_due = Some(now + interval);
        }
        self.storage.push_back(StorageOp::Append { token, records });
    }

    /// Takes a checkpoint when the log has grown by `checkpoint_log_bytes` and a snapshot would
    /// be at most half its size, or when `checkpoint_interval_ms` passed since the first record
    /// logged after the last checkpoint.
    fn maybe_checkpoint(&mut self, now: Time) {
        let by_growth = self.logged_bytes >= self.config.settings.checkpoint_log_bytes
            && self.live_bytes.saturating_mul(2) <= self.logged_bytes;
        let by_time = self.checkpoint_due.is_some_and(|due| due <= now);
        if !(by_growth || by_time) {
            return;
        }
        let records = self.snapshot();
        self.logged_bytes = 0;
        self.checkpoint_due = None;
        self.storage.push_back(StorageOp::Checkpoint { records });
    }

    /// The leaf's whole state as log records: replaying them rebuilds it (see `recover`).
    /// Pending batches are included: their records precede the checkpoint in the log.
    fn snapshot(&self) -> Vec<LogRecord> {
        let pending = self
            .pending
            .values()
            .flat_map(|batch| batch.messages.iter().map(|(id, m)| (id, m)));
        let mut records = Vec::with_capacity(self.messages.len() + self.pending_messages as usize);
        for (id, stored) in self.messages.iter().chain(pending) {
            records.push(LogRecord::Enqueue {
                id: *id,
                topic: stored.topic.to_string(),
                priority: stored.key.priority,
                ready_at: stored.key.ready_at,
                enqueued_at: stored.enqueued_at,
                metadata: stored.metadata.clone(),
                payload: stored.payload.clone(),
            });
            if stored.attempt > 0 {
                records.push(LogRecord::Lease {
                    id: *id,
                    attempt: stored.attempt,
                    deadline: Time::ZERO,
                });
            }
        }
        records
    }

    fn make_available(&mut self, id: MessageId) {
        let stored = self.messages.get(&id).expect("message exists");
        let (topic, key, size) = (
            stored.topic.clone(),
            stored.key,
            stored.payload.len() as u32,
        );
        self.topics
            .get_mut(&topic)
            .expect("topic exists")
            .offers
            .insert(key, size);
        self.dirty.insert(topic);
    }

    fn handle_reserve(&mut self, now: Time, conn: ConnId, reserve: Reserve) {
        let lease_ms = reserve
            .lease_ms
            .clamp(1, self.config.settings.lease_timeout_max_ms);
        let mut outcomes = Vec::with_capacity(reserve.items.len());
        let mut records = Vec::new();
        for item in reserve.items {
            let id = item.key.id;
            let result = match self.messages.get(&id) {
                None => Err(ReserveDenied::Gone),
                Some(stored) if stored.lease.is_some() => Err(ReserveDenied::Leased),
                Some(_) => {
                    let token = self.next_lease_token();
                    let stored = self.messages.get_mut(&id).expect("checked");
                    let topic = self.topics.get_mut(&stored.topic).expect("topic exists");
                    topic.offers.take(&stored.key);
                    self.dirty.insert(stored.topic.clone());
                    stored.attempt += 1;
                    let deadline = now + Duration::from_millis(lease_ms);
                    stored.lease = Some(Lease { token, deadline });
                    self.leases.insert((deadline, id));
                    records.push(LogRecord::Lease {
                        id,
                        attempt: stored.attempt,
                        deadline,
                    });
                    Ok(Delivery {
                        id,
                        token,
                        topic: stored.topic.to_string(),
                        priority: stored.key.priority,
                        attempt: stored.attempt,
                        enqueued_at: stored.enqueued_at,
                        lease_deadline: deadline,
                        metadata: stored.metadata.clone(),
                        payload: stored.payload.clone(),
                    })
                }
            };
            outcomes.push(ReserveOutcome {
                reservation: item.reservation,
                key: item.key,
                result,
            });
        }
        self.log(now, None, records);
        // Refill the parent's window before answering, on the same stream: by the time the root
        // sees the answer it already holds this leaf's next entries, so its next pop is exact.
        self.flush_offers();
        self.send(conn, Wire::Reserved(Reserved { items: outcomes }));
    }

    /// Checks a receipt against the live lease; `Ok` gives the message's id.
    fn check_receipt(&self, now: Time, receipt: &Receipt) -> Result<MessageId, ReceiptError> {
        let stored = self
            .messages
            .get(&receipt.id)
            .ok_or(ReceiptError::UnknownMessage)?;
        match &stored.lease {
            Some(lease) if lease.token == receipt.token && lease.deadline > now => Ok(receipt.id),
            _ => Err(ReceiptError::Stale),
        }
    }

    fn end_lease(&mut self, id: MessageId) -> Stored {
        let mut stored = self.messages.remove(&id).expect("message exists");
        if let Some(lease) = stored.lease.take() {
            self.leases.remove(&(lease.deadline, id));
        }
        stored
    }

    fn handle_confirm(&mut self, now: Time, conn: ConnId, confirm: Confirm) {
        self.expire_leases(now);
        let mut records = Vec::new();
        let mut results = Vec::with_capacity(confirm.receipts.len());
        for receipt in &confirm.receipts {
            let result = self.check_receipt(now, receipt).map(|id| {
                let stored = self.end_lease(id);
                self.live_bytes -= stored_bytes(&stored);
                let topic = self.topics.get_mut(&stored.topic).expect("topic exists");
                topic.messages -= 1;
                self.dirty.insert(stored.topic);
                records.push(LogRecord::Delete { id });
            });
            results.push(result);
        }
        self.log(now, None, records);
        self.send(
            conn,
            Wire::Confirmed(Confirmed {
                tag: confirm.tag,
                results,
            }),
        );
    }

    fn handle_release(&mut self, now: Time, release: Release) {
        let mut records = Vec::new();
        for receipt in &release.receipts {
            if let Ok(id) = self.check_receipt(now, receipt) {
                let stored = self.end_lease(id);
                self.messages.insert(id, stored);
                self.make_available(id);
                records.push(LogRecord::Release { id });
            }
        }
        self.log(now, None, records);
    }

    fn expire_leases(&mut self, now: Time) {
        while let Some(&(deadline, id)) = self.leases.first() {
            if deadline > now {
                break;
            }
            self.leases.pop_first();
            if let Some(stored) = self.messages.get_mut(&id) {
                stored.lease = None;
                self.make_available(id);
            }
        }
    }

    /// Sends each dirty topic's offer diff to the parent and forgets empty topics.
    fn flush_offers(&mut self) {
        let credits = self.upstream.credits();
        let session = self.upstream.session();
        for topic_name in std::mem::take(&mut self.dirty) {
            let Some(topic) = self.topics.get_mut(&topic_name) else {
                continue;
            };
            if let Some(parent) = session {
                topic.offers.rebalance(credits);
                let frontier = topic.offers.best_unoffered();
                if let Some(offer) = topic.offers.poll(&topic_name, frontier) {
                    self.transmits.push_back(Transmit {
                        conn: parent,
                        msg: Wire::Offer(offer),
                    });
                }
            }
            if topic.messages == 0 && topic.offers.is_idle() && !self.has_pending_for(&topic_name) {
                self.topics.remove(&topic_name);
            }
        }
    }

    fn has_pending_for(&self, topic: &Topic) -> bool {
        self.pending.values().any(|batch| {
            batch
                .messages
                .iter()
                .any(|(_, m)| Arc::ptr_eq(&m.topic, topic))
        })
    }

    fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
        self.violations += 1;
        let request = match msg {
            Wire::Pop(pop) => Some(pop.request),
            Wire::Ack(ack) => Some(ack.request),
            _ => None,
        };
        let text = format!(
            "leaf {:?} does not accept {} messages here",
            self.config.name,
            msg.name()
        );
        self.send(
            conn,
            Wire::error(request, ErrorCode::UnexpectedMessage, text),
        );
    }
}

/// Approximate size of a record in the log.
fn record_bytes(record: &LogRecord) -> u64 {
    match record {
        LogRecord::Enqueue {
            topic,
            metadata,
            payload,
            ..
        } => {
            let metadata: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
            (64 + topic.len() + metadata + payload.len()) as u64
        }
        _ => 24,
    }
}

/// Approximate size of a message in a snapshot.
fn stored_bytes(stored: &Stored) -> u64 {
    let metadata: usize = stored.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    (64 + stored.topic.len() + metadata + stored.payload.len()) as u64
}

/// Checks one message of a push batch against the settings.
fn validate_message(s: &Settings, message: &PushMessage) -> Result<(), (ErrorCode, String)> {
    if message.payload.len() > s.payload_bytes_max as usize {
        return Err((
            ErrorCode::PayloadTooLarge,
            format!(
                "payload of {} bytes exceeds payload_bytes_max {}",
                message.payload.len(),
                s.payload_bytes_max
            ),
        ));
    }
    validate_topic(s, &message.topic).map_err(|why| (ErrorCode::InvalidArgument, why))?;
    if message.metadata.len() > s.metadata_entries_max as usize {
        return Err((
            ErrorCode::InvalidArgument,
            format!(
                "{} metadata entries exceed metadata_entries_max {}",
                message.metadata.len(),
                s.metadata_entries_max
            ),
        ));
    }
    let metadata_bytes: usize = message
        .metadata
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if metadata_bytes > s.metadata_bytes_max as usize {
        return Err((
            ErrorCode::InvalidArgument,
            format!(
                "{metadata_bytes} metadata bytes exceed metadata_bytes_max {}",
                s.metadata_bytes_max
            ),
        ));
    }
    Ok(())
}

/// Checks a topic name: 1 to `topic_bytes_max` bytes of printable characters.
///
/// # Errors
/// A sentence naming the problem.
pub fn validate_topic(s: &Settings, topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("topic is empty".into());
    }
    if topic.len() > s.topic_bytes_max as usize {
        return Err(format!(
            "topic of {} bytes exceeds topic_bytes_max {}",
            topic.len(),
            s.topic_bytes_max
        ));
    }
    if topic.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "topic {topic:?} contains whitespace or control characters"
        ));
    }
    Ok(())
}

impl Machine for Leaf {
    fn handle_connected(&mut self, _now: Time, conn: ConnId, link: Link) {
        match link {
            Link::Parent => {
                let hello = self.upstream.connected(conn);
                self.transmits.push_back(hello);
            }
            Link::Incoming => {
                self.clients.accept(conn);
            }
        }
    }

    fn handle_disconnected(&mut self, _now: Time, conn: ConnId) {
        if self.upstream.disconnected(conn) {
            for topic in self.topics.values_mut() {
                topic.offers.reset();
            }
            return;
        }
        self.clients.disconnect(conn);
        // Batches of a vanished producer still become durable; only the ack has nowhere to go.
    }

    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        self.expire_leases(now);
        if self.upstream.is(conn) {
            match msg {
                Wire::Welcome(welcome) => {
                    if self.upstream.welcomed(conn, &welcome) {
                        self.dirty.extend(self.topics.keys().cloned());
                    }
                }
                Wire::Reserve(reserve) => self.handle_reserve(now, conn, reserve),
                Wire::Confirm(confirm) => self.handle_confirm(now, conn, confirm),
                Wire::Release(release) => self.handle_release(now, release),
                Wire::Error(_) => self.violations += 1,
                other => self.reject_unexpected(conn, &other),
            }
        } else {
            let is_producer =
                self.clients.peers.get(&conn) == Some(&crate::downstream::Peer::Producer);
            match msg {
                Wire::Hello(hello) => {
                    let outcome = self.clients.hello(conn, hello, &[PeerKindTag::Producer]);
                    self.send(conn, outcome.reply);
                    if outcome.close {
                        self.closes.push_back((conn, "handshake refused".into()));
                    }
                }
                Wire::Push(push) if is_producer => self.handle_push(now, conn, push),
                Wire::Push(push) => self.send(
                    conn,
                    Wire::error(
                        Some(push.request),
                        ErrorCode::UnexpectedMessage,
                        "Push before Hello",
                    ),
                ),
                other => self.reject_unexpected(conn, &other),
            }
        }
        self.flush_offers();
        self.maybe_checkpoint(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        self.expire_leases(now);
        self.flush_offers();
        self.maybe_checkpoint(now);
    }

    fn handle_storage_done(&mut self, _now: Time, done: StorageDone) {
        let Some(batch) = self.pending.remove(&done.token) else {
            return;
        };
        self.pending_messages -= batch.messages.len() as u64;
        let mut ids = Vec::with_capacity(batch.messages.len());
        for (id, stored) in batch.messages {
            let topic = self
                .topics
                .get_mut(&stored.topic)
                .expect("topic kept while pending");
            topic.messages += 1;
            ids.push(id);
            self.messages.insert(id, stored);
            self.make_available(id);
        }
        self.send(
            batch.conn,
            Wire::PushAck(PushAck {
                request: batch.request,
                ids,
            }),
        );
        self.flush_offers();
    }

    fn handle_storage_failed(&mut self, _now: Time, token: u64, reason: &str) {
        let Some(batch) = self.pending.remove(&token) else {
            return;
        };
        self.pending_messages -= batch.messages.len() as u64;
        self.live_bytes -= batch
            .messages
            .iter()
            .map(|(_, m)| stored_bytes(m))
            .sum::<u64>();
        let topics: HashSet<Topic> = batch
            .messages
            .iter()
            .map(|(_, m)| m.topic.clone())
            .collect();
        let text =
            format!("the leaf could not store the batch ({reason}); nothing of it was accepted");
        self.send(
            batch.conn,
            Wire::error(Some(batch.request), ErrorCode::StorageFailed, text),
        );
        self.dirty.extend(topics);
        self.flush_offers();
    }

    fn poll_storage(&mut self) -> Option<StorageOp> {
        self.storage.pop_front()
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.closes.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let lease = self.leases.first().map(|(deadline, _)| *deadline);
        match (lease, self.checkpoint_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            messages: self.messages.len() as u64,
            leased: self.leases.len() as u64,
            offered: self
                .topics
                .values()
                .map(|t| t.offers.offered_len() as u64)
                .sum(),
            parent_connected: self.upstream.session().is_some(),
            violations: self.violations,
            ..NodeStats::default()
        }
    }
}
