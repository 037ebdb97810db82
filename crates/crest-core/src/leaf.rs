//! The leaf state machine: accepts pushes, owns messages, leases them to the root.
//!
//! # Contract
//! Implements [`Machine`]; see [`crate::machine`] for the polling order and time rules.
//!
//! # Message states
//! Every message the leaf holds is in exactly one state:
//! - **pending**: in a push batch waiting for storage; not yet acknowledged nor offered;
//! - **delayed**: durable, waiting for its `ready_at` (deliver-after, or a nack's delay);
//! - **available**: a candidate of its topic's [`OfferSet`] (offered to the parent or not);
//! - **leased**: reserved by the root under a lease (token, deadline, attempt number);
//! - **dead**: in its topic's dead-letter queue, with the reason of its last failure.
//!
//! Transitions: a push batch becomes delayed or available when storage reports it durable, and
//! only then is the producer acknowledged. `Reserve` turns available into leased (anything
//! else is denied: the leaf's lease is the single authority). A settle with the live token
//! acts on a leased message: ack deletes it; nack (or the lease deadline passing) makes it
//! available again, after a delay if asked, with its attempt count kept, or dead once it has
//! had `max_attempts` deliveries; extend moves the deadline. A `Release` from the root (a grant
//! nobody received) makes it available and gives the attempt back. A message past its time to
//! live is deleted instead of becoming available or leased again. Admin operations redrive
//! (dead → available, attempts reset) and purge (dead → deleted) dead letters.
//!
//! # Dedup
//! A push carrying a dedup key already seen for its topic within the topic's dedup window is
//! answered with the first message's id and not enqueued. Keys live in a table bounded by
//! `dedup_keys_max`, outlive their messages until the window ends, and are logged, so they
//! survive restarts.
//!
//! # Storage
//! Every state change a restart must see is emitted as a [`LogRecord`] through
//! `poll_storage`. Push batches carry a token and are acknowledged on `handle_storage_done`;
//! the other records carry none. Leases are not restored by recovery (their root is gone with
//! the crash), so a lease grant logs only its attempt number and an extend logs nothing: it is
//! answered at once.

use crate::config::{Settings, TopicPolicy};
use crate::downstream::{Downstream, PeerKindTag, Topic, TopicMap, TopicSet};
use crate::id::{AscendingIdMap, IdMap, LeafId, LiveIds, MESSAGE_SEQ_MAX, MessageId, Receipt};
use crate::key::Key;
use crate::machine::{
    ConnId, Link, Machine, NodeStats, StorageDone, StorageOp, SyncWait, Transmit,
};
use crate::metrics::{Metric, OwnReport, Report, Reporter, named};
use crate::offer::{Candidate, FlushPolicy, OfferSet, Offerable};
use crate::record::{Location, LogRecord, MessageBody, MessageHead};
use crate::sorted::SortedMap;
use crate::time::Time;
use crate::upstream::Upstream;
use crate::validate::validate_message;
use crate::wire::{
    AdminOp, AdminResult, Confirm, Confirmed, DeadLetter, Delivery, ErrorCode, LeafAdmin,
    LeafAdminReply, Push, PushAck, PushMessage, ReceiptError, Release, Reserve, ReserveDenied,
    ReserveOutcome, Reserved, Role, Settle, Stats, TopicStats, Wire,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

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

/// A location no body has: the body is held in memory only (a store that keeps no bodies).
const NO_LOCATION: Location = Location {
    segment: u32::MAX,
    offset: 0,
    len: 0,
    crc: 0,
};

/// What a leaf keeps in memory of a durable message besides its key and topic, in every
/// state: 24 bytes. Where the message is kept says its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    /// Where its body is in the log (`NO_LOCATION`: in `Leaf::bodies` only).
    location: Location,
    /// Payload bytes.
    size: u32,
    /// Leases granted so far (given back when the root releases an undelivered grant).
    attempt: u32,
}

impl Slot {
    /// Its body's place in the log, if it has one.
    fn logged(&self) -> Option<Location> {
        (self.location.segment != NO_LOCATION.segment).then_some(self.location)
    }
}

impl Offerable for Slot {
    /// The leaf offers a message as of the moment it joins the offered set.
    fn candidate(&self, now: Time) -> Candidate {
        Candidate {
            size: self.size,
            since: now,
            entered: now,
        }
    }
}

/// A leased message (few at once: kept whole, by id).
#[derive(Debug)]
struct Leased {
    topic: Topic,
    key: Key,
    slot: Slot,
    token: u64,
    deadline: Time,
}

/// A delayed message, in `Leaf::delayed` by `(ready_at, id)`.
#[derive(Debug)]
struct Delayed {
    topic: Topic,
    priority: u32,
    slot: Slot,
}

/// A dead letter, in its topic's `dead` by `(dead_at, id)`.
#[derive(Debug)]
struct Dead {
    priority: u32,
    ready_at: Time,
    enqueued_at: Time,
    /// `Time::MAX`: never (kept for a redrive).
    expires_at: Time,
    slot: Slot,
    reason: Box<str>,
}

/// A message with a time to live: where to find it when the time comes (its key changes only
/// while it is leased, and is updated then).
#[derive(Debug)]
struct Ttl {
    expires_at: Time,
    topic: Topic,
    key: Key,
}

/// Messages of a topic accepted at one time, from id `first` (the key of `LeafTopic::ages`) up
/// to the next entry's: ids grow with acceptance time, so one entry per push batch tells
/// every message's `enqueued_at` and the topic's oldest.
#[derive(Debug, Clone, Copy)]
struct Age {
    at: Time,
    /// Messages of the entry still live and not dead.
    live: u64,
}

/// How much of a log segment's bodies are still live.
#[derive(Debug, Default)]
struct SegmentUse {
    live: u64,
    live_bytes: u64,
    /// Bytes of every body placed in it (since the leaf started: a recovered segment counts
    /// only the bodies live at recovery).
    placed_bytes: u64,
}

impl SegmentUse {
    /// Counts `count` bodies of `bytes` in all placed in the segment.
    fn add(&mut self, count: u64, bytes: u64) {
        self.live += count;
        self.live_bytes += bytes;
        self.placed_bytes += bytes;
    }
}

/// An answer that waits for bodies to be read from the log.
#[derive(Debug)]
enum Waiting {
    Reserved(Vec<ReserveOutcome>),
    DeadLetters { tag: u64, letters: Vec<DeadLetter> },
}

#[derive(Debug)]
struct Answer {
    conn: ConnId,
    /// The read it waits for (`None`: ready to send).
    read: Option<u64>,
    /// Which items miss their bodies.
    missing: Vec<usize>,
    waiting: Waiting,
}

/// A live body compaction moves: found again by topic and key (the key changes only while
/// a message is leased; one that changed is skipped and stays for a later pass).
#[derive(Debug, Clone)]
struct CompactItem {
    topic: Topic,
    key: Key,
    location: Location,
}

/// The one compaction step under way: bodies being read, then rewritten.
#[derive(Debug)]
struct Compaction {
    token: u64,
    writing: bool,
    items: Vec<CompactItem>,
}

#[derive(Debug, Default)]
struct LeafTopic {
    /// Available messages.
    offers: OfferSet<Slot>,
    /// Messages of this topic in any state but pending.
    messages: u64,
    /// Available messages per priority.
    ready: BTreeMap<u32, u64>,
    /// Delayed messages (in `Leaf::delayed`).
    delayed: u64,
    /// Leased messages (in `Leaf::leased`).
    leased: u64,
    /// Dead letters by `(dead_at, id)`.
    dead: BTreeMap<(Time, MessageId), Dead>,
    /// When each dead letter died.
    dead_at: IdMap<Time>,
    /// Acceptance times of the live messages that are not dead (see [`Age`]).
    ages: BTreeMap<MessageId, Age>,
}

impl LeafTopic {
    /// When message `id` (live, not dead) was accepted.
    fn enqueued_at(&self, id: MessageId) -> Time {
        self.ages
            .range(..=id)
            .next_back()
            .map_or(Time::ZERO, |(_, age)| age.at)
    }

    /// Counts message `id`, accepted at `at`, in the ages.
    fn age_add(&mut self, id: MessageId, at: Time) {
        self.ages_add(id, Age { at, live: 1 });
    }

    /// Counts `add.live` messages accepted at `add.at`, from id `first` on, in the ages.
    fn ages_add(&mut self, first: MessageId, add: Age) {
        if let Some((_, age)) = self.ages.range_mut(..=first).next_back()
            && age.at == add.at
        {
            age.live += add.live;
            return;
        }
        self.ages.insert(first, add);
    }

    /// Uncounts message `id` from the ages.
    fn age_remove(&mut self, id: MessageId) {
        let Some((&first, age)) = self.ages.range_mut(..=id).next_back() else {
            return;
        };
        age.live = age.live.saturating_sub(1);
        if age.live == 0 {
            self.ages.remove(&first);
        }
    }

    /// Places an available message.
    fn make_available(&mut self, key: Key, slot: Slot) {
        self.offers.insert(key, slot);
        *self.ready.entry(key.priority).or_default() += 1;
    }

    /// Takes an available message out (`take`: the parent reserved it, with `applied`).
    fn unavailable(&mut self, key: &Key, take: Option<u64>) -> Option<Slot> {
        let slot = match take {
            Some(applied) => self.offers.take(key, applied),
            None => self.offers.remove(key),
        }?;
        if let Some(count) = self.ready.get_mut(&key.priority) {
            *count -= 1;
            if *count == 0 {
                self.ready.remove(&key.priority);
            }
        }
        Some(slot)
    }
}

/// A message accepted and waiting for its batch to be durable.
#[derive(Debug)]
struct PendingMessage {
    id: MessageId,
    topic: Topic,
    key: Key,
    enqueued_at: Time,
    /// `Time::MAX`: never.
    expires_at: Time,
    size: u32,
    body: MessageBody,
}

#[derive(Debug)]
struct PendingBatch {
    conn: ConnId,
    request: u64,
    /// The id answered for each message of the push, in order (duplicates included).
    ids: Vec<MessageId>,
    /// The messages this batch enqueues.
    messages: Vec<PendingMessage>,
    /// Set when a message this batch duplicates failed to be stored: the producer is told.
    failed: Option<String>,
    /// When the push arrived.
    received_at: Time,
}

#[derive(Debug, Clone, Copy)]
struct DedupEntry {
    id: MessageId,
    until: Time,
}

/// Event counters since the leaf started.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    expired: u64,
    dead_lettered: u64,
    deduplicated: u64,
    pushed: u64,
    push_batches: u64,
    pushes_refused: u64,
    leased: u64,
    acked: u64,
    nacked: u64,
    extended: u64,
    /// Bodies read back from the log for deliveries and listings.
    body_reads: u64,
    /// Bodies compaction moved.
    compacted: u64,
}

/// A message as recovery rebuilds it, by id, before it settles into its place (48 bytes: a
/// recovery map of a million messages is written once, and each byte of it is a page
/// fault).
#[derive(Debug)]
struct Recovered {
    /// Index into `Recovery::topics`.
    topic: u32,
    priority: u32,
    ready_at: Time,
    enqueued_at: Time,
    slot: Slot,
}

/// The state of a recovery under way (see [`Leaf::recovering`]).
#[derive(Debug, Default)]
struct Recovery {
    messages: IdMap<Recovered>,
    /// Expiry times of the messages that have one.
    expiring: IdMap<Time>,
    /// Dead letters: when they died, and why.
    dead: IdMap<(Time, Box<str>)>,
    topics: Vec<Topic>,
    /// The last topic a record named, and its index.
    last: Option<(Topic, u32)>,
}

/// See the module doc.
pub struct Leaf {
    config: LeafConfig,
    next_seq: u64,
    rng: u64,
    upstream: Upstream,
    clients: Downstream,
    /// Sequence numbers of the durable messages.
    live: LiveIds,
    topics: TopicMap<LeafTopic>,
    /// Leased messages by id.
    leased: IdMap<Leased>,
    /// Live leases by `(deadline, id)`.
    leases: BTreeSet<(Time, MessageId)>,
    /// Delayed messages by `(ready_at, id)`.
    delayed: SortedMap<(Time, MessageId), Delayed>,
    /// Messages with a time to live (not dead), by id.
    ttl: IdMap<Ttl>,
    /// The same by `(expires_at, id)`.
    expiries: BTreeSet<(Time, MessageId)>,
    dedup: HashMap<Topic, HashMap<Box<str>, DedupEntry>>,
    dedup_expiry: BTreeMap<(Time, MessageId), (Topic, Box<str>)>,
    pending: HashMap<u64, PendingBatch>,
    /// Settlements (acks, nacks; extends only beside them) waiting for their records to be durable before
    /// they are answered: a confirmed ack is never undone by a crash.
    confirms: HashMap<u64, (ConnId, Confirmed)>,
    pending_messages: u64,
    next_token: u64,
    dirty: TopicSet,
    transmits: VecDeque<Transmit>,
    storage: VecDeque<StorageOp>,
    closes: VecDeque<(ConnId, String)>,
    violations: u64,
    counters: Counters,
    reporter: Reporter,
    /// Approximate bytes appended to the log since the last checkpoint.
    logged_bytes: u64,
    /// Bytes of bodies held in memory only (no location): a checkpoint copies them.
    unlogged_bytes: u64,
    /// When the time trigger takes a checkpoint (set once something is logged after one).
    checkpoint_due: Option<Time>,
    /// When offer changes that were held back must go (`None`: none are waiting).
    offer_due: Option<Time>,
    flush_policy: FlushPolicy,
    /// Bodies held in memory: all without a location, those with one within
    /// `leaf_body_cache_bytes`.
    bodies: AscendingIdMap<MessageBody>,
    /// Their bytes.
    body_bytes: u64,
    /// The latest acceptance time given: acceptance times never go back as ids grow (see
    /// [`Age`]), whatever the clock does.
    last_enqueued_at: Time,
    /// Log segments holding live bodies.
    segments: BTreeMap<u32, SegmentUse>,
    /// The newest segment a body was placed in (the one being written).
    newest_segment: u32,
    /// Sealed segments whose live bodies fell below `compaction_live_pct`.
    compactable: BTreeSet<u32>,
    /// Segments a compaction pass could not empty (an unreadable body): not tried again.
    compaction_stuck: BTreeSet<u32>,
    /// Bodies of the segment being compacted not yet in a step.
    compaction_queue: Vec<CompactItem>,
    /// The segment being compacted, and whether one of its bodies could not be moved.
    compacting: Option<(u32, bool)>,
    compaction: Option<Compaction>,
    /// Answers in the order they must go, some waiting for reads.
    answers: VecDeque<Answer>,
    /// A recovery under way.
    recovery: Option<Box<Recovery>>,
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
            live: LiveIds::default(),
            topics: Default::default(),
            leased: IdMap::default(),
            leases: BTreeSet::new(),
            delayed: SortedMap::default(),
            ttl: IdMap::default(),
            expiries: BTreeSet::new(),
            dedup: HashMap::new(),
            dedup_expiry: BTreeMap::new(),
            pending: HashMap::new(),
            confirms: HashMap::new(),
            pending_messages: 0,
            next_token: 1,
            dirty: Default::default(),
            transmits: VecDeque::new(),
            storage: VecDeque::new(),
            closes: VecDeque::new(),
            violations: 0,
            counters: Counters::default(),
            reporter: Reporter::new(&config.settings),
            logged_bytes: 0,
            unlogged_bytes: 0,
            checkpoint_due: None,
            offer_due: None,
            flush_policy: FlushPolicy::new(&config.settings),
            bodies: AscendingIdMap::default(),
            body_bytes: 0,
            last_enqueued_at: Time::ZERO,
            segments: BTreeMap::new(),
            newest_segment: 0,
            compactable: BTreeSet::new(),
            compaction_stuck: BTreeSet::new(),
            compaction_queue: Vec::new(),
            compacting: None,
            compaction: None,
            answers: VecDeque::new(),
            recovery: None,
            config,
        }
    }

    /// Rebuilds a leaf from its log: every storage operation it ever emitted, in order, as of
    /// `now`: [`Leaf::recovering`], [`Leaf::replay_operation`] for each operation, then
    /// [`Leaf::recovered`].
    pub fn recover(
        config: LeafConfig,
        now: Time,
        operations: impl IntoIterator<Item = Vec<LogRecord>>,
    ) -> Leaf {
        let mut leaf = Leaf::recovering(config);
        for records in operations {
            leaf.replay_operation(records);
        }
        leaf.recovered(now)
    }

    /// An empty leaf about to be rebuilt from its log, one operation at a time (so that a log
    /// far larger than the leaf's index is never held in memory at once).
    pub fn recovering(config: LeafConfig) -> Leaf {
        let mut leaf = Leaf::new(config);
        leaf.recovery = Some(Box::default());
        leaf
    }

    /// Recovery: applies one storage operation of the log, in log order.
    pub fn replay_operation(&mut self, records: Vec<LogRecord>) {
        let mut recovery = self.recovery.take().unwrap_or_default();
        // A checkpoint comes as one operation of every message at once: room for all of them
        // in one step rather than by doubling (a no-op while there is room).
        recovery.messages.reserve(records.len());
        for record in records {
            self.replay(&mut recovery, record);
        }
        self.recovery = Some(recovery);
    }

    /// Ends recovery as of `now`.
    ///
    /// Messages come back delayed, available or dead; those that were leased at the crash come
    /// back available with their attempt counts (their leases are gone with the root that held
    /// them). Messages whose time to live passed and dedup keys whose window ended are dropped.
    /// Sequence numbers continue above both the highest recovered and `config.first_seq`.
    pub fn recovered(self, now: Time) -> Leaf {
        let mut leaf = self;
        let Some(recovery) = leaf.recovery.take() else {
            return leaf;
        };
        let Recovery {
            messages,
            mut expiring,
            mut dead,
            topics,
            ..
        } = *recovery;
        // Settle every message as of `now`, gathering each topic's index to build in bulk
        // (sorting once beats a million ordered inserts), told apart by index, not by name.
        #[derive(Default)]
        struct Gathered {
            messages: u64,
            delayed: u64,
            available: Vec<(Key, Slot)>,
            ages: Vec<(MessageId, Time)>,
            dead: Vec<((Time, MessageId), Dead)>,
        }
        let mut gathered: Vec<Gathered> = topics.iter().map(|_| Gathered::default()).collect();
        if let Some(first) = gathered.first_mut() {
            // Most leaves hold one topic: it gets room for all.
            first.available.reserve(messages.len());
            first.ages.reserve(messages.len());
        }
        let mut delayed = Vec::new();
        for (id, message) in messages {
            let Recovered {
                topic: index,
                priority,
                ready_at,
                enqueued_at,
                slot,
            } = message;
            let key = Key {
                priority,
                ready_at,
                id,
            };
            let expires_at = match expiring.is_empty() {
                true => Time::MAX,
                false => expiring.remove(&id).unwrap_or(Time::MAX),
            };
            let death = match dead.is_empty() {
                true => None,
                false => dead.remove(&id),
            };
            if expires_at <= now && death.is_none() {
                if let Some(body) = leaf.bodies.remove(&id) {
                    leaf.body_bytes -= body.cached_bytes();
                }
                leaf.counters.expired += 1;
                continue;
            }
            leaf.live.insert(id.seq());
            leaf.last_enqueued_at = leaf.last_enqueued_at.max(enqueued_at);
            match slot.logged() {
                Some(location) => place_body(&mut leaf.segments, &location),
                None => {
                    let bytes = leaf.bodies.get(&id).map_or(0, MessageBody::bytes);
                    leaf.unlogged_bytes += bytes;
                }
            }
            let gather = &mut gathered[index as usize];
            gather.messages += 1;
            if let Some((at, reason)) = death {
                let dead = Dead {
                    priority: key.priority,
                    ready_at: key.ready_at,
                    enqueued_at,
                    expires_at,
                    slot,
                    reason,
                };
                gather.dead.push(((at, id), dead));
                continue;
            }
            gather.ages.push((id, enqueued_at));
            let name = &topics[index as usize];
            leaf.track_expiry(expires_at, name, key);
            if key.ready_at > now {
                gather.delayed += 1;
                let entry = Delayed {
                    topic: name.clone(),
                    priority: key.priority,
                    slot,
                };
                delayed.push(((key.ready_at, id), entry));
            } else {
                gather.available.push((key, slot));
            }
        }
        for (name, gather) in topics.iter().zip(gathered) {
            let topic = leaf.topics.get_mut(name).expect("interned by replay");
            topic.messages = gather.messages;
            topic.delayed = gather.delayed;
            let mut available = gather.available;
            available.sort_unstable_by_key(|(key, _)| *key);
            // Sorted by key, priorities come in runs.
            for chunk in available.chunk_by(|a, b| a.0.priority == b.0.priority) {
                topic.ready.insert(chunk[0].0.priority, chunk.len() as u64);
            }
            topic.offers = OfferSet::from_sorted(available);
            let mut ages = gather.ages;
            ages.sort_unstable_by_key(|(id, _)| *id);
            for (id, at) in ages {
                match topic.ages.last_entry() {
                    Some(mut last) if last.get().at == at => last.get_mut().live += 1,
                    _ => {
                        topic.ages.insert(id, Age { at, live: 1 });
                    }
                }
            }
            for ((at, id), dead) in gather.dead {
                topic.dead_at.insert(id, at);
                topic.dead.insert((at, id), dead);
            }
        }
        delayed.sort_unstable_by_key(|(at, _)| *at);
        leaf.delayed = SortedMap::from_sorted(delayed);
        leaf.newest_segment = leaf.segments.keys().last().copied().unwrap_or(0);
        let segments: Vec<u32> = leaf.segments.keys().copied().collect();
        for segment in segments {
            leaf.check_compactable(segment);
        }
        leaf.expire_dedup(now);
        leaf.topics
            .retain(|name, topic| topic.messages > 0 || leaf.dedup.contains_key(name));
        leaf.dirty.clear();
        leaf.dirty.extend(leaf.topics.keys().cloned());
        leaf
    }

    /// Recovery: a message's record. A message already recovered only moves its body
    /// (compaction rewrote it elsewhere).
    fn recover_message(
        &mut self,
        recovery: &mut Recovery,
        head: MessageHead,
        size: u32,
        place: Result<Location, MessageBody>,
    ) {
        let id = head.id;
        let location = match place {
            Ok(location) => {
                if let Some(body) = self.bodies.remove(&id) {
                    self.body_bytes -= body.cached_bytes();
                }
                location
            }
            Err(body) => {
                self.body_bytes += body.cached_bytes();
                if let Some(old) = self.bodies.insert(id, body) {
                    self.body_bytes -= old.cached_bytes();
                }
                NO_LOCATION
            }
        };
        if let Some(message) = recovery.messages.get_mut(&id) {
            message.slot.location = location;
            return;
        }
        // Consecutive records mostly share a topic: reuse the last one instead of hashing its
        // name for every record.
        let index = match &recovery.last {
            Some((last, index)) if **last == *head.topic => *index,
            _ => {
                let interned = self.topic(&head.topic);
                let index = match recovery.topics.iter().position(|t| *t == interned) {
                    Some(index) => index as u32,
                    None => {
                        recovery.topics.push(interned.clone());
                        (recovery.topics.len() - 1) as u32
                    }
                };
                recovery.last = Some((interned, index));
                index
            }
        };
        // Ids are never reused, not even those of messages deleted since.
        self.next_seq = self.next_seq.max(id.seq() + 1).min(MESSAGE_SEQ_MAX);
        if let Some(key) = head.dedup_key {
            let topic = recovery.topics[index as usize].clone();
            let window = self.policy(&topic).dedup_window_ms;
            let until = head.enqueued_at + Duration::from_millis(window);
            self.remember_dedup(&topic, key.into(), DedupEntry { id, until });
        }
        if let Some(expires_at) = head.expires_at {
            recovery.expiring.insert(id, expires_at);
        }
        recovery.messages.insert(
            id,
            Recovered {
                topic: index,
                priority: head.priority,
                ready_at: head.ready_at,
                enqueued_at: head.enqueued_at,
                slot: Slot {
                    location,
                    size,
                    attempt: 0,
                },
            },
        );
    }

    /// Recovery: one record of the log.
    fn replay(&mut self, recovery: &mut Recovery, record: LogRecord) {
        let messages = &mut recovery.messages;
        match record {
            LogRecord::Enqueue {
                head,
                metadata,
                payload,
            } => {
                let size = payload.len() as u32;
                let body = MessageBody { metadata, payload };
                self.recover_message(recovery, head, size, Err(body));
            }
            LogRecord::Index {
                head,
                size,
                location,
            } => self.recover_message(recovery, head, size, Ok(location)),
            LogRecord::Lease { id, attempt, .. } => {
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = attempt;
                }
            }
            LogRecord::Release {
                id,
                attempt,
                ready_at,
            } => {
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = attempt;
                    message.ready_at = ready_at;
                }
            }
            LogRecord::Dead { id, reason, at } => {
                if messages.contains_key(&id) {
                    recovery.dead.insert(id, (at, reason.into()));
                }
            }
            LogRecord::Redrive { id } => {
                recovery.dead.remove(&id);
                if let Some(message) = messages.get_mut(&id) {
                    message.slot.attempt = 0;
                }
            }
            LogRecord::Delete { id } => {
                messages.remove(&id);
                if !recovery.expiring.is_empty() {
                    recovery.expiring.remove(&id);
                }
                if !recovery.dead.is_empty() {
                    recovery.dead.remove(&id);
                }
                if let Some(body) = self.bodies.remove(&id) {
                    self.body_bytes -= body.cached_bytes();
                }
            }
            LogRecord::Dedup {
                topic,
                key,
                id,
                until,
            } => {
                let topic = self.topic(&topic);
                self.remember_dedup(&topic, key.into(), DedupEntry { id, until });
            }
        }
    }

    /// This leaf's id.
    pub fn id(&self) -> LeafId {
        self.config.id
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.transmits.push_back(Transmit { conn, msg });
    }

    fn policy(&self, topic: &str) -> TopicPolicy {
        self.config.settings.topic_policy(topic)
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

    /// The live dedup entry of `key` in `topic`, if its window is open at `now`.
    fn find_dedup(&self, topic: &str, key: &str, now: Time) -> Option<DedupEntry> {
        self.dedup
            .get(topic)
            .and_then(|keys| keys.get(key))
            .filter(|entry| entry.until > now)
            .copied()
    }

    fn remember_dedup(&mut self, topic: &Topic, key: Box<str>, entry: DedupEntry) {
        let keys = self.dedup.entry(topic.clone()).or_default();
        if let Some(old) = keys.insert(key.clone(), entry) {
            self.dedup_expiry.remove(&(old.until, old.id));
        }
        self.dedup_expiry
            .insert((entry.until, entry.id), (topic.clone(), key));
    }

    fn forget_dedup(&mut self, topic: &Topic, key: &str) {
        if let Some(keys) = self.dedup.get_mut(topic) {
            if let Some(old) = keys.remove(key) {
                self.dedup_expiry.remove(&(old.until, old.id));
            }
            if keys.is_empty() {
                self.dedup.remove(topic);
            }
        }
    }

    fn expire_dedup(&mut self, now: Time) {
        while let Some((&(until, _), _)) = self.dedup_expiry.first_key_value() {
            if until > now {
                break;
            }
            let (_, (topic, key)) = self.dedup_expiry.pop_first().expect("present");
            if let Some(keys) = self.dedup.get_mut(&topic) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.dedup.remove(&topic);
                    self.dirty.insert(topic);
                }
            }
        }
    }

    fn dedup_len(&self) -> usize {
        self.dedup_expiry.len()
    }

    /// Checks a push batch; the error names the first problem found.
    fn validate_push(&self, now: Time, push: &Push) -> Result<(), (ErrorCode, String)> {
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
        let mut keyed = 0;
        for (index, message) in push.messages.iter().enumerate() {
            validate_message(s, now, message)
                .map_err(|(code, why)| (code, format!("message {index}: {why}")))?;
            if !self.topics.contains_key(message.topic.as_str()) {
                new_topics.insert(message.topic.as_str());
            }
            keyed += usize::from(message.dedup_key.is_some());
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
        let held = self.live.len() + self.pending_messages;
        if held + count as u64 > s.leaf_messages_max {
            return Err((
                ErrorCode::QueueFull,
                format!(
                    "leaf holds {held} messages; leaf_messages_max is {}",
                    s.leaf_messages_max
                ),
            ));
        }
        if (self.dedup_len() + keyed) as u64 > s.dedup_keys_max {
            return Err((
                ErrorCode::Overloaded,
                format!(
                    "leaf remembers {} dedup keys; dedup_keys_max is {}; retry later",
                    self.dedup_len(),
                    s.dedup_keys_max
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
        if let Err((code, message)) = self.validate_push(now, &push) {
            self.counters.pushes_refused += 1;
            self.send(conn, Wire::error(Some(push.request), code, message));
            return;
        }
        self.counters.push_batches += 1;
        self.reporter
            .recorder
            .record(now, Metric::PushBatch, push.messages.len() as u64);
        let token = self.next_token;
        self.next_token += 1;
        // Acceptance times never go back as ids grow, whatever the clock does (see `Age`).
        let enqueued_at = now.max(self.last_enqueued_at);
        self.last_enqueued_at = enqueued_at;
        let mut records = Vec::with_capacity(push.messages.len());
        let mut messages = Vec::with_capacity(push.messages.len());
        let mut ids = Vec::with_capacity(push.messages.len());
        // Consecutive messages mostly share a topic: looked up once per run.
        let mut last: Option<Topic> = None;
        for message in push.messages {
            let topic = match &last {
                Some(topic) if **topic == *message.topic => topic.clone(),
                _ => {
                    let topic = self.topic(&message.topic);
                    last = Some(topic.clone());
                    topic
                }
            };
            if let Some(key) = &message.dedup_key
                && let Some(first) = self.find_dedup(&topic, key, now)
            {
                self.counters.deduplicated += 1;
                ids.push(first.id);
                continue;
            }
            let id = MessageId::new(self.config.id, self.next_seq);
            self.next_seq += 1;
            ids.push(id);
            let policy = self.policy(&topic);
            let ready_at = ready_time(now, &message);
            let ttl_ms = message.ttl_ms.unwrap_or(policy.message_ttl_ms);
            let expires_at = (ttl_ms > 0).then(|| ready_at + Duration::from_millis(ttl_ms));
            if let Some(key) = &message.dedup_key {
                let until = now + Duration::from_millis(policy.dedup_window_ms);
                self.remember_dedup(&topic, key.as_str().into(), DedupEntry { id, until });
            }
            let head = MessageHead {
                id,
                topic: message.topic,
                priority: message.priority,
                ready_at,
                enqueued_at,
                expires_at,
                dedup_key: message.dedup_key,
            };
            records.push(LogRecord::Enqueue {
                head,
                metadata: message.metadata.clone(),
                payload: message.payload.clone(),
            });
            messages.push(PendingMessage {
                id,
                topic,
                key: Key {
                    priority: message.priority,
                    ready_at,
                    id,
                },
                enqueued_at,
                expires_at: expires_at.unwrap_or(Time::MAX),
                size: message.payload.len() as u32,
                body: MessageBody {
                    metadata: message.metadata,
                    payload: message.payload,
                },
            });
        }
        self.pending_messages += messages.len() as u64;
        self.pending.insert(
            token,
            PendingBatch {
                conn,
                request: push.request,
                ids,
                messages,
                failed: None,
                received_at: now,
            },
        );
        // A batch of duplicates only still goes through the log: its acknowledgement must not
        // overtake that of a batch it duplicates, and the log completes in order.
        self.log(now, Some(token), SyncWait::Now, records);
    }

    /// Appends records to the log (through `poll_storage`) and counts log growth.
    fn log(&mut self, now: Time, token: Option<u64>, wait: SyncWait, records: Vec<LogRecord>) {
        if records.is_empty() && token.is_none() {
            return;
        }
        self.logged_bytes += records.iter().map(record_bytes).sum::<u64>();
        if self.checkpoint_due.is_none() {
            let interval = Duration::from_millis(self.config.settings.checkpoint_interval_ms);
            self.checkpoint_due = Some(now + interval);
        }
        self.storage.push_back(StorageOp::Append {
            token,
            records,
            wait,
        });
    }

    /// Approximate bytes a checkpoint of the live state would take.
    fn live_bytes(&self) -> u64 {
        // Pending batches count too: the log replays them after the snapshot.
        (self.live.len() + self.pending_messages) * INDEX_RECORD_BYTES
            + self.unlogged_bytes
            + self.dedup_len() as u64 * 64
    }

    /// Takes a checkpoint when the log has grown by `checkpoint_log_bytes` and a snapshot would
    /// be at most half its size, or when `checkpoint_interval_ms` passed since the first record
    /// logged after the last checkpoint.
    fn maybe_checkpoint(&mut self, now: Time) {
        let by_growth = self.logged_bytes >= self.config.settings.checkpoint_log_bytes
            && self.live_bytes().saturating_mul(2) <= self.logged_bytes;
        let by_time = self.checkpoint_due.is_some_and(|due| due <= now);
        if !(by_growth || by_time) {
            return;
        }
        let records = self.snapshot();
        let compaction = self.compaction.as_ref().filter(|c| c.writing);
        let includes = self
            .pending
            .keys()
            .chain(self.confirms.keys())
            .copied()
            .chain(compaction.map(|c| c.token))
            .collect();
        let segments = self.segments.keys().copied().collect();
        self.logged_bytes = 0;
        self.checkpoint_due = None;
        self.storage.push_back(StorageOp::Checkpoint {
            records,
            includes,
            segments,
        });
    }

    /// What the log keeps of message `key` of `topic` besides its body (no dedup key:
    /// checkpoints log keys apart, and a rewritten body must not open a new window).
    fn head(&self, topic: &Topic, key: &Key, enqueued_at: Time, expires_at: Time) -> MessageHead {
        MessageHead {
            id: key.id,
            topic: topic.to_string(),
            priority: key.priority,
            ready_at: key.ready_at,
            enqueued_at,
            expires_at: (expires_at != Time::MAX).then_some(expires_at),
            dedup_key: None,
        }
    }

    /// Watches the time to live of message `key` of `topic` (none if `expires_at` is
    /// `Time::MAX`).
    fn track_expiry(&mut self, expires_at: Time, topic: &Topic, key: Key) {
        if expires_at == Time::MAX {
            return;
        }
        self.expiries.insert((expires_at, key.id));
        let ttl = Ttl {
            expires_at,
            topic: topic.clone(),
            key,
        };
        self.ttl.insert(key.id, ttl);
    }

    /// When message `id` (not dead) expires (`Time::MAX`: never).
    fn expires_at(&self, id: MessageId) -> Time {
        if self.ttl.is_empty() {
            return Time::MAX;
        }
        self.ttl.get(&id).map_or(Time::MAX, |ttl| ttl.expires_at)
    }

    /// The records that rebuild one message: its body (referred to when in the log), its
    /// attempts, its death.
    fn message_records(
        &self,
        records: &mut Vec<LogRecord>,
        head: MessageHead,
        slot: &Slot,
        dead: Option<(Time, &str)>,
    ) {
        let id = head.id;
        records.push(match slot.logged() {
            Some(location) => LogRecord::Index {
                head,
                size: slot.size,
                location,
            },
            None => {
                let body = self.bodies.get(&id).cloned().unwrap_or_default();
                LogRecord::Enqueue {
                    head,
                    metadata: body.metadata,
                    payload: body.payload,
                }
            }
        });
        if slot.attempt > 0 {
            records.push(LogRecord::Lease {
                id,
                attempt: slot.attempt,
                deadline: Time::ZERO,
            });
        }
        if let Some((at, reason)) = dead {
            records.push(LogRecord::Dead {
                id,
                reason: reason.to_string(),
                at,
            });
        }
    }

    /// The leaf's state as log records, except the batches still pending (the log replays
    /// their appends after the snapshot: see [`StorageOp::Checkpoint`]). Replaying them
    /// rebuilds the leaf (see `recover`). Bodies in the log are referred to, not copied.
    fn snapshot(&self) -> Vec<LogRecord> {
        let mut records = Vec::with_capacity(self.live.len() as usize + self.dedup_len());
        for (name, topic) in &self.topics {
            for (key, slot) in topic.offers.iter() {
                let head = self.head(
                    name,
                    key,
                    topic.enqueued_at(key.id),
                    self.expires_at(key.id),
                );
                self.message_records(&mut records, head, slot, None);
            }
            for (&(at, id), dead) in &topic.dead {
                let key = Key {
                    priority: dead.priority,
                    ready_at: dead.ready_at,
                    id,
                };
                let head = self.head(name, &key, dead.enqueued_at, dead.expires_at);
                self.message_records(&mut records, head, &dead.slot, Some((at, &dead.reason)));
            }
        }
        for (&(ready_at, id), delayed) in self.delayed.iter() {
            let key = Key {
                priority: delayed.priority,
                ready_at,
                id,
            };
            let topic = &self.topics[&delayed.topic];
            let head = self.head(
                &delayed.topic,
                &key,
                topic.enqueued_at(id),
                self.expires_at(id),
            );
            self.message_records(&mut records, head, &delayed.slot, None);
        }
        for (&id, leased) in &self.leased {
            let topic = &self.topics[&leased.topic];
            let head = self.head(
                &leased.topic,
                &leased.key,
                topic.enqueued_at(id),
                self.expires_at(id),
            );
            self.message_records(&mut records, head, &leased.slot, None);
        }
        for ((until, id), (topic, key)) in &self.dedup_expiry {
            records.push(LogRecord::Dedup {
                topic: topic.to_string(),
                key: key.to_string(),
                id: *id,
                until: *until,
            });
        }
        records
    }

    /// Places a message that is in no index: delayed or available, as its ready time says.
    fn place(&mut self, now: Time, topic: Topic, key: Key, slot: Slot) {
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let Some(topic) = place_in(leaf_topic, &mut self.delayed, now, topic, key, slot) else {
            return;
        };
        self.dirty.insert(topic);
    }

    /// Forgets a message that is in no index any more (acked, expired, purged).
    fn forget(&mut self, topic: &Topic, id: MessageId, slot: &Slot, dead: bool) {
        let leaf_topic = self.topics.get_mut(topic).expect("topic exists");
        leaf_topic.messages -= 1;
        if !dead {
            leaf_topic.age_remove(id);
        }
        self.dirty.insert(topic.clone());
        self.live.remove(id.seq());
        if let Some(ttl) = self.ttl.remove(&id) {
            self.expiries.remove(&(ttl.expires_at, id));
        }
        if let Some(body) = self.bodies.remove(&id) {
            self.body_bytes -= body.cached_bytes();
            if slot.logged().is_none() {
                self.unlogged_bytes -= body.bytes();
            }
        }
        if let Some(location) = slot.logged() {
            self.unplace_body(&location);
        }
    }

    /// A body left `location` (its message is gone, or its body moved).
    fn unplace_body(&mut self, location: &Location) {
        let Some(segment) = self.segments.get_mut(&location.segment) else {
            return;
        };
        segment.live -= 1;
        segment.live_bytes -= u64::from(location.len);
        if segment.live == 0 {
            self.segments.remove(&location.segment);
            self.compactable.remove(&location.segment);
            self.compaction_stuck.remove(&location.segment);
        } else {
            self.check_compactable(location.segment);
        }
    }

    /// Marks a sealed segment for compaction once its live bodies are few enough.
    fn check_compactable(&mut self, segment: u32) {
        let s = &self.config.settings;
        let Some(used) = self.segments.get(&segment) else {
            return;
        };
        let sparse = used.live_bytes * 100 < used.placed_bytes * u64::from(s.compaction_live_pct);
        if segment < self.newest_segment
            && sparse
            && !self.compaction_stuck.contains(&segment)
            && self.compacting.is_none_or(|(at, _)| at != segment)
        {
            self.compactable.insert(segment);
        }
    }

    /// A body is durable at `location`: counts it in its segment.
    fn body_placed(&mut self, location: &Location) {
        self.bodies_placed(location.segment, 1, u64::from(location.len));
    }

    /// `count` bodies of `bytes` in all are durable in `segment`: counts them.
    fn bodies_placed(&mut self, segment: u32, count: u64, bytes: u64) {
        if segment > self.newest_segment {
            let sealed = self.newest_segment;
            self.newest_segment = segment;
            self.check_compactable(sealed);
        }
        self.segments.entry(segment).or_default().add(count, bytes);
    }

    /// Ends a run of durable messages of one topic accepted at one time, from id `first`
    /// (see `handle_storage_done`): the topic goes back in its map, counted and dirty.
    fn end_run(&mut self, (topic, mut leaf_topic, age, first): (Topic, LeafTopic, Age, MessageId)) {
        leaf_topic.ages_add(first, age);
        self.topics.insert(topic.clone(), leaf_topic);
        self.dirty.insert(topic);
    }

    fn handle_reserve(&mut self, now: Time, conn: ConnId, reserve: Reserve) {
        let mut outcomes = Vec::with_capacity(reserve.items.len());
        // A lease record per item, mostly.
        let mut records = Vec::with_capacity(reserve.items.len());
        let mut missing = Vec::new();
        let topic = self
            .topics
            .get_key_value(reserve.topic.as_str())
            .map(|(topic, _)| topic.clone());
        for item in reserve.items {
            let id = item.key.id;
            let available = topic
                .as_ref()
                .is_some_and(|t| self.topics[t].offers.get(&item.key).is_some());
            let result = match topic.clone() {
                Some(topic) if available => {
                    if self.expires_at(id) <= now {
                        let leaf_topic = self.topics.get_mut(&topic).expect("present");
                        let slot = leaf_topic.unavailable(&item.key, None).expect("present");
                        self.expire(&topic, id, &slot, &mut records);
                        Err(ReserveDenied::Gone)
                    } else {
                        Ok(self.lease(now, topic, item.key, reserve.lease_ms, reserve.offer_seq))
                    }
                }
                _ if self.leased.contains_key(&id) => Err(ReserveDenied::Leased),
                _ => Err(ReserveDenied::Gone),
            };
            if let Ok((delivery, cached)) = &result {
                self.counters.leased += 1;
                records.push(LogRecord::Lease {
                    id,
                    attempt: delivery.attempt,
                    deadline: delivery.lease_deadline,
                });
                if !cached {
                    missing.push(outcomes.len());
                }
            }
            outcomes.push(ReserveOutcome {
                reservation: item.reservation,
                key: item.key,
                result: result.map(|(delivery, _)| delivery),
            });
        }
        self.log(now, None, SyncWait::Linger, records);
        // Refill the parent's window before answering, on the same stream: by the time the root
        // sees the answer it already holds this leaf's next entries, so its next pop is exact.
        self.flush_offers(now, true);
        let locations: Vec<Location> = missing
            .iter()
            .map(|&index| {
                let id = outcomes[index].key.id;
                self.leased[&id].slot.location
            })
            .collect();
        self.answer(conn, Waiting::Reserved(outcomes), missing, locations);
    }

    /// Leases available message `key` of `topic`; `offer_seq` is the parent's
    /// [`Reserve::offer_seq`]. Also says whether the delivery carries its body (`false`: it
    /// must be read).
    fn lease(
        &mut self,
        now: Time,
        topic: Topic,
        key: Key,
        lease_ms: u64,
        offer_seq: u64,
    ) -> (Delivery, bool) {
        let lease_ms = lease_ms.clamp(1, self.config.settings.lease_timeout_max_ms);
        let token = self.next_lease_token();
        let deadline = now + Duration::from_millis(lease_ms);
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let mut slot = leaf_topic
            .unavailable(&key, Some(offer_seq))
            .expect("checked");
        leaf_topic.leased += 1;
        let enqueued_at = leaf_topic.enqueued_at(key.id);
        slot.attempt += 1;
        self.dirty.insert(topic.clone());
        self.leases.insert((deadline, key.id));
        let body = self.bodies.get(&key.id).cloned();
        let cached = body.is_some();
        let body = body.unwrap_or_default();
        let delivery = Delivery {
            id: key.id,
            token,
            topic: topic.to_string(),
            priority: key.priority,
            attempt: slot.attempt,
            enqueued_at,
            lease_deadline: deadline,
            metadata: body.metadata,
            payload: body.payload,
        };
        let leased = Leased {
            topic,
            key,
            slot,
            token,
            deadline,
        };
        self.leased.insert(key.id, leased);
        (delivery, cached)
    }

    /// Sends an answer once the bodies at `locations` (those of the items at `missing`) are
    /// read from the log, after every answer queued before it.
    fn answer(
        &mut self,
        conn: ConnId,
        waiting: Waiting,
        missing: Vec<usize>,
        locations: Vec<Location>,
    ) {
        let read = if locations.is_empty() {
            None
        } else {
            let token = self.next_token;
            self.next_token += 1;
            self.counters.body_reads += locations.len() as u64;
            self.storage.push_back(StorageOp::Read { token, locations });
            Some(token)
        };
        self.answers.push_back(Answer {
            conn,
            read,
            missing,
            waiting,
        });
        self.send_answers();
    }

    /// Sends the answers at the front of the queue that wait for nothing.
    fn send_answers(&mut self) {
        while self.answers.front().is_some_and(|a| a.read.is_none()) {
            let answer = self.answers.pop_front().expect("checked");
            let msg = match answer.waiting {
                Waiting::Reserved(items) => Wire::Reserved(Reserved { items }),
                Waiting::DeadLetters { tag, letters } => Wire::LeafAdminReply(LeafAdminReply {
                    tag,
                    result: Some(AdminResult::DeadLetters(letters)),
                }),
            };
            self.send(answer.conn, msg);
        }
    }

    /// Bodies read for an answer: filled in, or, where a read failed, the message is moved to
    /// the dead letters with the reason (a reserve of it is denied; a listing omits it).
    fn bodies_read(&mut self, now: Time, token: u64, bodies: Vec<Result<MessageBody, String>>) {
        let Some(index) = self.answers.iter().position(|a| a.read == Some(token)) else {
            return;
        };
        // Taken out while the leaf changes state below, put back ready to send.
        let placeholder = Answer {
            conn: 0,
            read: None,
            missing: Vec::new(),
            waiting: Waiting::Reserved(Vec::new()),
        };
        let mut answer = std::mem::replace(&mut self.answers[index], placeholder);
        answer.read = None;
        let mut records = Vec::new();
        for (&item, body) in answer.missing.iter().zip(bodies) {
            match (&mut answer.waiting, body) {
                (Waiting::Reserved(items), Ok(body)) => {
                    if let Ok(delivery) = &mut items[item].result {
                        delivery.metadata = body.metadata;
                        delivery.payload = body.payload;
                    }
                }
                (Waiting::Reserved(items), Err(error)) => {
                    let id = items[item].key.id;
                    let token = items[item].result.as_ref().map_or(0, |d| d.token);
                    items[item].result = Err(ReserveDenied::Gone);
                    // Only while the lease granted for this answer is still live: it may have
                    // ended (and the message moved on) while the read was under way.
                    if self.leased.get(&id).is_some_and(|l| l.token == token) {
                        let Leased {
                            topic, key, slot, ..
                        } = self.end_lease(id);
                        let reason = format!("body unreadable from the log: {error}");
                        tracing::error!(%id, %reason, "message moved to the dead letters");
                        self.move_to_dead(now, topic, key, slot, reason, &mut records);
                    }
                }
                (Waiting::DeadLetters { letters, .. }, Ok(body)) => {
                    letters[item].metadata = body.metadata;
                    letters[item].payload = body.payload;
                }
                (Waiting::DeadLetters { letters, .. }, Err(error)) => {
                    tracing::error!(id = %letters[item].id, %error, "dead letter body unreadable");
                    letters[item].reason = format!(
                        "{} (body unreadable from the log: {error})",
                        letters[item].reason
                    );
                }
            }
        }
        self.answers[index] = answer;
        self.log(now, None, SyncWait::Linger, records);
        self.send_answers();
    }

    /// Deletes a message whose time to live passed (taken out of its index by the caller).
    fn expire(&mut self, topic: &Topic, id: MessageId, slot: &Slot, records: &mut Vec<LogRecord>) {
        self.forget(topic, id, slot, false);
        self.counters.expired += 1;
        records.push(LogRecord::Delete { id });
    }

    /// Checks a receipt against the live lease; `Ok` gives the message's id.
    fn check_receipt(&self, now: Time, receipt: &Receipt) -> Result<MessageId, ReceiptError> {
        match self.leased.get(&receipt.id) {
            Some(lease) if lease.token == receipt.token && lease.deadline > now => Ok(receipt.id),
            Some(_) => Err(ReceiptError::Stale),
            None if receipt.id.leaf() == self.config.id && self.live.contains(receipt.id.seq()) => {
                Err(ReceiptError::Stale)
            }
            None => Err(ReceiptError::UnknownMessage),
        }
    }

    /// Ends the live lease of a message: it is in no index until the caller places it.
    fn end_lease(&mut self, id: MessageId) -> Leased {
        let leased = self.leased.remove(&id).expect("leased");
        self.leases.remove(&(leased.deadline, id));
        let topic = self.topics.get_mut(&leased.topic).expect("topic exists");
        topic.leased -= 1;
        leased
    }

    /// A delivery failed (nack or lease expiry); its lease has ended. The message expires,
    /// becomes dead, or is delayed or available again.
    fn delivery_failed(
        &mut self,
        now: Time,
        leased: Leased,
        delay_ms: u64,
        reason: String,
        records: &mut Vec<LogRecord>,
    ) {
        let Leased {
            topic,
            mut key,
            slot,
            ..
        } = leased;
        let id = key.id;
        if self.expires_at(id) <= now {
            self.expire(&topic, id, &slot, records);
            return;
        }
        let max_attempts = self.config.settings.topic_policy(&topic).max_attempts;
        if slot.attempt >= max_attempts {
            self.move_to_dead(now, topic, key, slot, reason, records);
            return;
        }
        if delay_ms > 0 {
            let later = now + Duration::from_millis(delay_ms);
            key.ready_at = key.ready_at.max(later);
            if let Some(ttl) = self.ttl.get_mut(&id) {
                ttl.key = key;
            }
        }
        records.push(LogRecord::Release {
            id,
            attempt: slot.attempt,
            ready_at: key.ready_at,
        });
        self.place(now, topic, key, slot);
    }

    /// Moves a message whose lease has ended to its topic's dead letters.
    fn move_to_dead(
        &mut self,
        now: Time,
        topic: Topic,
        key: Key,
        slot: Slot,
        reason: String,
        records: &mut Vec<LogRecord>,
    ) {
        let id = key.id;
        let expires_at = match self.ttl.remove(&id) {
            Some(ttl) => {
                self.expiries.remove(&(ttl.expires_at, id));
                ttl.expires_at
            }
            None => Time::MAX,
        };
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let enqueued_at = leaf_topic.enqueued_at(id);
        leaf_topic.age_remove(id);
        leaf_topic.dead_at.insert(id, now);
        leaf_topic.dead.insert(
            (now, id),
            Dead {
                priority: key.priority,
                ready_at: key.ready_at,
                enqueued_at,
                expires_at,
                slot,
                reason: reason.as_str().into(),
            },
        );
        self.dirty.insert(topic);
        self.counters.dead_lettered += 1;
        records.push(LogRecord::Dead {
            id,
            reason,
            at: now,
        });
    }

    fn handle_confirm(&mut self, now: Time, conn: ConnId, confirm: Confirm) {
        // A delete (or release) record per receipt, mostly.
        let mut records = Vec::with_capacity(confirm.receipts.len());
        let mut results = Vec::with_capacity(confirm.receipts.len());
        for receipt in &confirm.receipts {
            let result = self
                .check_receipt(now, receipt)
                .map(|id| match &confirm.op {
                    Settle::Ack => {
                        self.counters.acked += 1;
                        let leased = self.end_lease(id);
                        self.forget(&leased.topic, id, &leased.slot, false);
                        records.push(LogRecord::Delete { id });
                    }
                    Settle::Nack { delay_ms, reason } => {
                        self.counters.nacked += 1;
                        let leased = self.end_lease(id);
                        let reason = reason.clone().unwrap_or_else(|| "nacked".into());
                        self.delivery_failed(now, leased, *delay_ms, reason, &mut records);
                    }
                    Settle::Extend { lease_ms } => {
                        self.counters.extended += 1;
                        let max = self.config.settings.lease_timeout_max_ms;
                        let deadline = now + Duration::from_millis((*lease_ms).clamp(1, max));
                        let leased = self.leased.get_mut(&id).expect("checked");
                        self.leases.remove(&(leased.deadline, id));
                        leased.deadline = deadline;
                        self.leases.insert((deadline, id));
                    }
                });
            results.push(result);
        }
        let confirmed = Confirmed {
            tag: confirm.tag,
            results,
        };
        if records.is_empty() {
            self.send(conn, Wire::Confirmed(confirmed));
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.confirms.insert(token, (conn, confirmed));
        self.log(now, Some(token), SyncWait::Linger, records);
    }

    /// The root gives back grants no consumer received: available again, attempt returned.
    fn handle_release(&mut self, now: Time, release: Release) {
        let mut records = Vec::new();
        for receipt in &release.receipts {
            if let Ok(id) = self.check_receipt(now, receipt) {
                let Leased {
                    topic,
                    key,
                    mut slot,
                    ..
                } = self.end_lease(id);
                if self.expires_at(id) <= now {
                    self.expire(&topic, id, &slot, &mut records);
                    continue;
                }
                slot.attempt = slot.attempt.saturating_sub(1);
                records.push(LogRecord::Release {
                    id,
                    attempt: slot.attempt,
                    ready_at: key.ready_at,
                });
                self.place(now, topic, key, slot);
            }
        }
        self.log(now, None, SyncWait::Linger, records);
    }

    /// The slot of message `key` of `topic`, in whatever state it is (`None`: gone, or its key
    /// changed).
    fn slot_mut(&mut self, topic: &Topic, key: &Key) -> Option<&mut Slot> {
        if self.leased.contains_key(&key.id) {
            let leased = self.leased.get_mut(&key.id).expect("checked");
            return (leased.key == *key).then_some(&mut leased.slot);
        }
        let leaf_topic = self.topics.get_mut(topic)?;
        if let Some(&at) = leaf_topic.dead_at.get(&key.id) {
            return leaf_topic
                .dead
                .get_mut(&(at, key.id))
                .filter(|dead| dead.priority == key.priority && dead.ready_at == key.ready_at)
                .map(|dead| &mut dead.slot);
        }
        if leaf_topic.offers.get(key).is_some() {
            return leaf_topic.offers.get_mut(key);
        }
        self.delayed
            .get_mut(&(key.ready_at, key.id))
            .filter(|delayed| delayed.priority == key.priority)
            .map(|delayed| &mut delayed.slot)
    }

    /// Every live body in log segment `segment`: one scan of the index (a segment is
    /// compacted once its live bodies are few, so this is rare next to the pushes that
    /// filled it).
    fn bodies_in(&self, segment: u32) -> Vec<CompactItem> {
        let mut items = Vec::new();
        let mut keep = |topic: &Topic, key: Key, slot: &Slot| {
            if slot.location.segment == segment && slot.logged().is_some() {
                items.push(CompactItem {
                    topic: topic.clone(),
                    key,
                    location: slot.location,
                });
            }
        };
        for (name, topic) in &self.topics {
            for (key, slot) in topic.offers.iter() {
                keep(name, *key, slot);
            }
            for (&(_, id), dead) in &topic.dead {
                let key = Key {
                    priority: dead.priority,
                    ready_at: dead.ready_at,
                    id,
                };
                keep(name, key, &dead.slot);
            }
        }
        for (&(ready_at, id), delayed) in self.delayed.iter() {
            let key = Key {
                priority: delayed.priority,
                ready_at,
                id,
            };
            keep(&delayed.topic, key, &delayed.slot);
        }
        for leased in self.leased.values() {
            keep(&leased.topic, leased.key, &leased.slot);
        }
        items
    }

    /// Starts a compaction step when none is under way and a segment qualifies: reads up to
    /// `compaction_batch_messages` of the bodies still live in it.
    fn maybe_compact(&mut self, _now: Time) {
        if self.compaction.is_some() || self.config.settings.compaction_live_pct == 0 {
            return;
        }
        let batch = self.config.settings.compaction_batch_messages.max(1) as usize;
        if self.compaction_queue.is_empty() {
            if let Some((segment, stuck)) = self.compacting.take() {
                // A pass is over: a segment it could not empty is not tried again (until its
                // bodies go); one whose bodies moved while queued qualifies again.
                if stuck {
                    self.compaction_stuck.insert(segment);
                } else {
                    self.check_compactable(segment);
                }
            }
            while let Some(segment) = self.compactable.pop_first() {
                if !self.segments.contains_key(&segment) {
                    continue;
                }
                let items = self.bodies_in(segment);
                if items.is_empty() {
                    continue;
                }
                let used = &self.segments[&segment];
                tracing::info!(
                    leaf = %self.config.name,
                    segment,
                    bodies = items.len(),
                    live_bytes = used.live_bytes,
                    "compacting a log segment"
                );
                self.compaction_queue = items;
                self.compacting = Some((segment, false));
                break;
            }
            if self.compaction_queue.is_empty() {
                return;
            }
        }
        let take = batch.min(self.compaction_queue.len());
        let items: Vec<CompactItem> = self.compaction_queue.drain(..take).collect();
        let token = self.next_token;
        self.next_token += 1;
        let locations = items.iter().map(|item| item.location).collect();
        self.storage.push_back(StorageOp::Read { token, locations });
        self.compaction = Some(Compaction {
            token,
            writing: false,
            items,
        });
    }

    /// A compaction step's bodies are read: those still live where they were are appended
    /// again at the end of the log.
    fn compaction_read(&mut self, now: Time, bodies: Vec<Result<MessageBody, String>>) {
        let Some(mut step) = self.compaction.take() else {
            return;
        };
        let mut records = Vec::new();
        let mut moving = Vec::new();
        for (item, body) in step.items.into_iter().zip(bodies) {
            let Some(slot) = self.slot_mut(&item.topic, &item.key).copied() else {
                continue;
            };
            if slot.location != item.location {
                continue;
            }
            let body = match body {
                Ok(body) => body,
                Err(error) => {
                    // Left in place: its delivery will fail the same way and dead-letter it.
                    let id = item.key.id;
                    tracing::error!(%id, %error, "compaction cannot read a body; it stays");
                    if let Some((_, stuck)) = &mut self.compacting {
                        *stuck = true;
                    }
                    continue;
                }
            };
            let topic = &self.topics[&item.topic];
            let id = item.key.id;
            let (enqueued_at, expires_at) = match topic.dead_at.get(&id) {
                Some(at) => {
                    let dead = &topic.dead[&(*at, id)];
                    (dead.enqueued_at, dead.expires_at)
                }
                None => (topic.enqueued_at(id), self.expires_at(id)),
            };
            records.push(LogRecord::Enqueue {
                head: self.head(&item.topic, &item.key, enqueued_at, expires_at),
                metadata: body.metadata,
                payload: body.payload,
            });
            moving.push(item);
        }
        if records.is_empty() {
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        step.token = token;
        step.writing = true;
        step.items = moving;
        self.compaction = Some(step);
        self.log(now, Some(token), SyncWait::Linger, records);
    }

    /// A compaction step's bodies are in their new places.
    fn compaction_written(&mut self, now: Time, locations: Vec<Location>) {
        let Some(step) = self.compaction.take() else {
            return;
        };
        if locations.len() == step.items.len() {
            for (item, new) in step.items.into_iter().zip(locations) {
                let Some(slot) = self.slot_mut(&item.topic, &item.key) else {
                    continue;
                };
                if slot.location != item.location {
                    continue;
                }
                slot.location = new;
                self.counters.compacted += 1;
                self.body_placed(&new);
                self.unplace_body(&item.location);
            }
        }
        self.maybe_compact(now);
    }

    /// Everything time moves: lease deadlines, delays, time to live, dedup windows.
    fn tick(&mut self, now: Time) {
        let mut records = Vec::new();
        while let Some(&(deadline, id)) = self.leases.first() {
            if deadline > now {
                break;
            }
            let leased = self.end_lease(id);
            let reason = format!(
                "visibility timeout expired (attempt {})",
                leased.slot.attempt
            );
            self.delivery_failed(now, leased, 0, reason, &mut records);
        }
        while let Some((&(ready_at, id), _)) = self.delayed.first_key_value() {
            if ready_at > now {
                break;
            }
            let (_, delayed) = self.delayed.pop_first().expect("present");
            let key = Key {
                priority: delayed.priority,
                ready_at,
                id,
            };
            let topic = self.topics.get_mut(&delayed.topic).expect("topic exists");
            topic.delayed -= 1;
            self.place(now, delayed.topic, key, delayed.slot);
        }
        while let Some(&(expires_at, id)) = self.expiries.first() {
            if expires_at > now {
                break;
            }
            self.expiries.pop_first();
            // A leased message expires when its lease ends without an ack.
            if self.leased.contains_key(&id) {
                continue;
            }
            let Some(ttl) = self.ttl.get(&id) else {
                continue;
            };
            let (topic, key) = (ttl.topic.clone(), ttl.key);
            let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
            let slot = match leaf_topic.unavailable(&key, None) {
                Some(slot) => Some(slot),
                None => self.delayed.remove(&(key.ready_at, id)).map(|delayed| {
                    leaf_topic.delayed -= 1;
                    delayed.slot
                }),
            };
            match slot {
                Some(slot) => self.expire(&topic, id, &slot, &mut records),
                None => {
                    self.ttl.remove(&id);
                }
            }
        }
        self.expire_dedup(now);
        self.log(now, None, SyncWait::Linger, records);
    }

    fn handle_admin(&mut self, now: Time, conn: ConnId, admin: LeafAdmin) {
        let mut records = Vec::new();
        let result = match &admin.op {
            AdminOp::DeadLetters { topic, limit } => {
                // Bodies in the log are read first; the reply waits for them.
                let (letters, missing, locations) = self.dead_letters(topic, *limit as usize);
                let waiting = Waiting::DeadLetters {
                    tag: admin.tag,
                    letters,
                };
                self.answer(conn, waiting, missing, locations);
                return;
            }
            AdminOp::Redrive { topic, ids } => {
                let ids = self.dead_ids(topic, ids);
                let topic = self
                    .topics
                    .get_key_value(topic.as_str())
                    .map(|(topic, _)| topic.clone());
                for id in &ids {
                    let topic = topic.clone().expect("dead letters have a topic");
                    let leaf_topic = self.topics.get_mut(&topic).expect("present");
                    let at = leaf_topic.dead_at.remove(id).expect("listed");
                    let dead = leaf_topic.dead.remove(&(at, *id)).expect("listed");
                    leaf_topic.age_add(*id, dead.enqueued_at);
                    let key = Key {
                        priority: dead.priority,
                        ready_at: dead.ready_at,
                        id: *id,
                    };
                    self.track_expiry(dead.expires_at, &topic, key);
                    let slot = Slot {
                        attempt: 0,
                        ..dead.slot
                    };
                    records.push(LogRecord::Redrive { id: *id });
                    self.place(now, topic, key, slot);
                }
                AdminResult::Count(ids.len() as u64)
            }
            AdminOp::Purge { topic, ids } => {
                let ids = self.dead_ids(topic, ids);
                let topic = self
                    .topics
                    .get_key_value(topic.as_str())
                    .map(|(topic, _)| topic.clone());
                for id in &ids {
                    let topic = topic.clone().expect("dead letters have a topic");
                    let leaf_topic = self.topics.get_mut(&topic).expect("present");
                    let at = leaf_topic.dead_at.remove(id).expect("listed");
                    let dead = leaf_topic.dead.remove(&(at, *id)).expect("listed");
                    self.forget(&topic, *id, &dead.slot, true);
                    records.push(LogRecord::Delete { id: *id });
                }
                AdminResult::Count(ids.len() as u64)
            }
            AdminOp::Stats { topic } => AdminResult::Stats(self.topic_stats(topic.as_deref())),
        };
        self.log(now, None, SyncWait::Linger, records);
        self.send(
            conn,
            Wire::LeafAdminReply(LeafAdminReply {
                tag: admin.tag,
                result: Some(result),
            }),
        );
    }

    /// The dead letters of `topic` among `ids` (empty: all of them).
    fn dead_ids(&self, topic: &str, ids: &[MessageId]) -> Vec<MessageId> {
        let Some(leaf_topic) = self.topics.get(topic) else {
            return Vec::new();
        };
        if ids.is_empty() {
            return leaf_topic.dead.keys().map(|(_, id)| *id).collect();
        }
        let mut wanted: Vec<MessageId> = ids
            .iter()
            .copied()
            .filter(|id| leaf_topic.dead_at.contains_key(id))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// Up to `limit` dead letters of `topic`, oldest death first, within a frame's room; which
    /// of them miss their bodies, and where those are in the log.
    fn dead_letters(
        &self,
        topic: &str,
        limit: usize,
    ) -> (Vec<DeadLetter>, Vec<usize>, Vec<Location>) {
        let Some(leaf_topic) = self.topics.get(topic) else {
            return (Vec::new(), Vec::new(), Vec::new());
        };
        let s = &self.config.settings;
        let budget = u64::from(s.frame_bytes_max - crate::config::FRAME_OVERHEAD_BYTES);
        let mut bytes = 0;
        let mut out = Vec::new();
        let mut missing = Vec::new();
        let mut locations = Vec::new();
        for (&(dead_at, id), dead) in leaf_topic.dead.iter().take(limit) {
            let body = self.bodies.get(&id);
            let body_bytes = match (body, dead.slot.logged()) {
                (Some(body), _) => body.bytes(),
                (None, Some(location)) => u64::from(location.len),
                (None, None) => 0,
            };
            let cost =
                INDEX_RECORD_BYTES + topic.len() as u64 + body_bytes + dead.reason.len() as u64;
            if !out.is_empty() && bytes + cost > budget {
                break;
            }
            bytes += cost;
            if body.is_none()
                && let Some(location) = dead.slot.logged()
            {
                missing.push(out.len());
                locations.push(location);
            }
            let body = body.cloned().unwrap_or_default();
            out.push(DeadLetter {
                id,
                topic: topic.to_string(),
                priority: dead.priority,
                attempts: dead.slot.attempt,
                reason: dead.reason.to_string(),
                enqueued_at: dead.enqueued_at,
                dead_at,
                metadata: body.metadata,
                payload: body.payload,
            });
        }
        (out, missing, locations)
    }

    /// Depths per topic and the leaf's counters (from counts kept as messages move: no scan).
    fn topic_stats(&self, only: Option<&str>) -> Stats {
        let mut topics: Vec<TopicStats> = self
            .topics
            .iter()
            .filter(|(name, topic)| only.is_none_or(|only| only == &***name) && topic.messages > 0)
            .map(|(name, topic)| TopicStats {
                topic: name.to_string(),
                ready: topic.ready.iter().map(|(p, n)| (*p, *n)).collect(),
                delayed: topic.delayed,
                in_flight: topic.leased,
                dead: topic.dead.len() as u64,
                oldest_enqueued_at: topic.ages.first_key_value().map(|(_, age)| age.at),
            })
            .collect();
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        Stats {
            topics,
            expired: self.counters.expired,
            dead_lettered: self.counters.dead_lettered,
            deduplicated: self.counters.deduplicated,
        }
    }

    /// Sends each dirty topic's offer diff to the parent when the flush policy says so (or
    /// `force`), and forgets empty topics. Diffs that may wait stay dirty until the linger
    /// deadline (`offer_due`).
    fn flush_offers(&mut self, now: Time, force: bool) {
        let credits = self.upstream.credits();
        let session = self.upstream.session();
        let force = force || self.offer_due.is_some_and(|due| due <= now);
        let mut lingering = TopicSet::default();
        for topic_name in std::mem::take(&mut self.dirty) {
            let Some(topic) = self.topics.get_mut(&topic_name) else {
                continue;
            };
            if let Some(parent) = session {
                topic
                    .offers
                    .rebalance(credits, self.config.settings.offer_swap, now);
                let frontier = topic.offers.best_unoffered();
                if !self.flush_policy.due(&topic.offers, frontier, force) {
                    lingering.insert(topic_name);
                    continue;
                }
                if let Some(offer) = topic.offers.poll(&topic_name, frontier) {
                    self.transmits.push_back(Transmit {
                        conn: parent,
                        msg: Wire::Offer(offer),
                    });
                }
            }
            if topic.messages == 0
                && topic.offers.is_idle()
                && !self.dedup.contains_key(&topic_name)
                && !self.has_pending_for(&topic_name)
            {
                self.topics.remove(&topic_name);
            }
        }
        // A forced flush leaves nothing waiting, so a deadline still set is in the future.
        self.offer_due = (!lingering.is_empty()).then(|| {
            self.offer_due
                .unwrap_or_else(|| self.flush_policy.deadline(now))
        });
        self.dirty = lingering;
    }

    fn has_pending_for(&self, topic: &Topic) -> bool {
        self.pending
            .values()
            .any(|batch| batch.messages.iter().any(|m| Arc::ptr_eq(&m.topic, topic)))
    }

    /// What the parent, or the root on its direct link, asks of the leaf.
    fn handle_pop_path(&mut self, now: Time, conn: ConnId, msg: Wire) {
        match msg {
            Wire::Reserve(reserve) => self.handle_reserve(now, conn, reserve),
            Wire::Confirm(confirm) => self.handle_confirm(now, conn, confirm),
            Wire::Release(release) => self.handle_release(now, release),
            Wire::LeafAdmin(admin) => self.handle_admin(now, conn, admin),
            Wire::Error(_) => self.violations += 1,
            other => self.reject_unexpected(conn, &other),
        }
    }

    fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
        self.violations += 1;
        let request = match msg {
            Wire::Pop(pop) => Some(pop.request),
            Wire::Ack(ack) => Some(ack.request),
            Wire::Admin(admin) => Some(admin.request),
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

/// When a pushed message becomes ready: the latest of now, its absolute time and its delay.
fn ready_time(now: Time, message: &PushMessage) -> Time {
    let after_delay = now + Duration::from_millis(message.delay_ms);
    message
        .deliver_at
        .map_or(after_delay, |at| at.max(after_delay))
}

/// Approximate size of a record in the log.
fn record_bytes(record: &LogRecord) -> u64 {
    match record {
        LogRecord::Enqueue {
            head,
            metadata,
            payload,
        } => {
            let metadata: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
            let key = head.dedup_key.as_ref().map_or(0, String::len);
            (80 + head.topic.len() + key + metadata + payload.len()) as u64
        }
        LogRecord::Dead { reason, .. } => 40 + reason.len() as u64,
        LogRecord::Dedup { topic, key, .. } => (40 + topic.len() + key.len()) as u64,
        _ => 24,
    }
}

/// Approximate size of a message's `Index` record in a checkpoint (its body in the log is
/// referred to, not copied).
const INDEX_RECORD_BYTES: u64 = 96;

/// Places a message of `topic` that is in no index: delayed, or available (then `topic` is
/// given back: the caller marks it dirty).
fn place_in(
    leaf_topic: &mut LeafTopic,
    delayed: &mut SortedMap<(Time, MessageId), Delayed>,
    now: Time,
    topic: Topic,
    key: Key,
    slot: Slot,
) -> Option<Topic> {
    if key.ready_at > now {
        leaf_topic.delayed += 1;
        let entry = Delayed {
            topic,
            priority: key.priority,
            slot,
        };
        delayed.insert((key.ready_at, key.id), entry);
        return None;
    }
    leaf_topic.make_available(key, slot);
    Some(topic)
}

/// Adds a body at `location` to its segment's use.
fn place_body(segments: &mut BTreeMap<u32, SegmentUse>, location: &Location) {
    let used = segments.entry(location.segment).or_default();
    used.add(1, u64::from(location.len));
}

/// Up to how many items a table is summed in full by [`Machine::check_invariants`].
const INVARIANT_DEEP_ITEMS_MAX: usize = 10_000;

impl Machine for Leaf {
    fn check_invariants(&self) {
        // Every live message is in exactly one state, and each state's counts agree with the
        // tables that hold it.
        let (mut messages, mut delayed, mut leased) = (0u64, 0u64, 0u64);
        for (topic, t) in &self.topics {
            let available = t.offers.len() as u64;
            assert_eq!(
                t.messages,
                available + t.delayed + t.leased + t.dead.len() as u64,
                "topic {topic}: messages = available + delayed + leased + dead"
            );
            assert_eq!(
                t.ready.values().sum::<u64>(),
                available,
                "topic {topic}: ready by priority adds up to the available messages"
            );
            assert_eq!(
                t.dead.len(),
                t.dead_at.len(),
                "topic {topic}: dead letters indexed twice"
            );
            messages += t.messages;
            delayed += t.delayed;
            leased += t.leased;
        }
        assert_eq!(
            self.live.len(),
            messages,
            "live ids = messages of every topic"
        );
        assert_eq!(
            delayed,
            self.delayed.len() as u64,
            "delayed counts match the delay table"
        );
        assert_eq!(
            leased,
            self.leased.len() as u64,
            "leased counts match the lease table"
        );
        assert_eq!(
            self.leases.len(),
            self.leased.len(),
            "one deadline per lease"
        );
        assert_eq!(
            self.ttl.len(),
            self.expiries.len(),
            "one expiry per time to live"
        );
        // The body cache's byte count, summed in full while the cache is small enough for that
        // to stay cheap.
        if self.bodies.len() <= INVARIANT_DEEP_ITEMS_MAX {
            let cached: u64 = self.bodies.values().map(MessageBody::cached_bytes).sum();
            assert_eq!(cached, self.body_bytes, "cached body bytes add up");
        }
        assert!(
            self.bodies.len() == 0 || self.body_bytes > 0,
            "cached bodies take bytes"
        );
    }

    fn handle_connected(&mut self, _now: Time, conn: ConnId, link: Link) {
        match link {
            Link::Parent => {
                let hello = self.upstream.connected(conn);
                self.transmits.push_back(hello);
            }
            Link::Incoming => {
                self.clients.accept(conn);
            }
            Link::Leaf(_) => {
                self.violations += 1;
                self.closes
                    .push_back((conn, "a leaf does not connect to leaves".into()));
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
        self.tick(now);
        if self.upstream.is(conn) {
            match msg {
                Wire::Welcome(welcome) => {
                    if self.upstream.welcomed(conn, &welcome) {
                        self.dirty.extend(self.topics.keys().cloned());
                    }
                }
                other => self.handle_pop_path(now, conn, other),
            }
        } else if self.clients.peers.get(&conn) == Some(&crate::downstream::Peer::Root) {
            // The root's direct link: the pop path without the aggregators. Its reserves carry
            // no offer number (0), so an entry the parent was offered is retracted from it.
            self.handle_pop_path(now, conn, msg);
        } else {
            let is_producer =
                self.clients.peers.get(&conn) == Some(&crate::downstream::Peer::Producer);
            match msg {
                Wire::Hello(hello) => {
                    let accepts = [PeerKindTag::Producer, PeerKindTag::Root];
                    let outcome = self.clients.hello(conn, hello, &accepts);
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
        self.flush_offers(now, false);
        self.maybe_checkpoint(now);
        self.maybe_compact(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        self.tick(now);
        self.flush_offers(now, false);
        self.maybe_checkpoint(now);
        self.maybe_compact(now);
    }

    fn report_tick(&mut self, now: Time) {
        if let Some(parent) = self.upstream.session() {
            let report = self.report(now);
            self.send(parent, Wire::Report(report));
        }
    }

    fn report(&mut self, now: Time) -> Report {
        let c = self.counters;
        let swaps = self.topics.values().map(|t| t.offers.swaps).sum();
        let credit_stalls = self.topics.values().map(|t| t.offers.credit_stalls).sum();
        let dead: u64 = self.topics.values().map(|t| t.dead.len() as u64).sum();
        let available: u64 = self.topics.values().map(|t| t.offers.len() as u64).sum();
        let counters = [
            ("pushed", c.pushed),
            ("push_batches", c.push_batches),
            ("pushes_refused", c.pushes_refused),
            ("leased", c.leased),
            ("acked", c.acked),
            ("nacked", c.nacked),
            ("extended", c.extended),
            ("expired", c.expired),
            ("dead_lettered", c.dead_lettered),
            ("deduplicated", c.deduplicated),
            ("body_reads", c.body_reads),
            ("compacted", c.compacted),
            ("swaps", swaps),
            ("credit_stalls", credit_stalls),
            ("protocol_violations", self.violations),
        ];
        let messages = self.live.len();
        let leased = self.leased.len() as u64;
        let delayed = self.delayed.len() as u64;
        let gauges = [
            ("messages", messages),
            ("available", available),
            ("leased", leased),
            ("delayed", delayed),
            ("dead", dead),
            ("pending_messages", self.pending_messages),
            ("topics", self.topics.len() as u64),
            ("body_cache_bytes", self.body_bytes),
            ("log_segments_live", self.segments.len() as u64),
        ];
        let own = OwnReport {
            name: self.config.name.clone(),
            role: "leaf",
            parent: self.upstream.parent_name(),
            connected: self.upstream.session().is_some(),
            counters: named(&counters),
            gauges: named(&gauges),
            stats: self.topic_stats(None),
        };
        self.reporter.report(now, own)
    }

    fn handle_storage_synced(&mut self, now: Time, sync: std::time::Duration) {
        let micros = u64::try_from(sync.as_micros()).unwrap_or(u64::MAX);
        self.reporter
            .recorder
            .record(now, Metric::LogSync, micros.max(1));
    }

    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        if let Some((conn, confirmed)) = self.confirms.remove(&done.token) {
            self.send(conn, Wire::Confirmed(confirmed));
            return;
        }
        if self
            .compaction
            .as_ref()
            .is_some_and(|c| c.writing && c.token == done.token)
        {
            self.compaction_written(now, done.locations);
            return;
        }
        let Some(batch) = self.pending.remove(&done.token) else {
            return;
        };
        // One location per message the batch enqueues, or none from a store that keeps no
        // bodies (they stay in memory).
        let mut locations = done.locations.into_iter();
        if locations.len() != batch.messages.len() {
            if locations.len() != 0 {
                tracing::error!(
                    locations = locations.len(),
                    messages = batch.messages.len(),
                    "storage reported locations that do not match the batch; bodies stay in memory"
                );
            }
            locations = Vec::new().into_iter();
        }
        self.pending_messages -= batch.messages.len() as u64;
        if batch.failed.is_none() {
            self.counters.pushed += batch.messages.len() as u64;
            self.reporter
                .recorder
                .record_since(now, Metric::PushAck, batch.received_at);
        }
        let cache = self.config.settings.leaf_body_cache_bytes;
        // Consecutive messages mostly share a topic: each run takes its topic out of the map
        // once, and counts its acceptance time and its bodies' segment once.
        let mut run: Option<(Topic, LeafTopic, Age, MessageId)> = None;
        let mut placed: Vec<(u32, u64, u64)> = Vec::new();
        for message in batch.messages {
            let PendingMessage {
                id,
                topic,
                key,
                enqueued_at,
                expires_at,
                size,
                body,
            } = message;
            let same = run
                .as_ref()
                .is_some_and(|(t, _, age, _)| Arc::ptr_eq(t, &topic) && age.at == enqueued_at);
            if !same {
                if let Some(ended) = run.take() {
                    self.end_run(ended);
                }
                let leaf_topic = self
                    .topics
                    .remove(&topic)
                    .expect("topic kept while pending");
                let age = Age {
                    at: enqueued_at,
                    live: 0,
                };
                run = Some((topic.clone(), leaf_topic, age, id));
            }
            let (_, leaf_topic, age, _) = run.as_mut().expect("set above");
            leaf_topic.messages += 1;
            age.live += 1;
            self.live.insert(id.seq());
            self.track_expiry(expires_at, &topic, key);
            // A body in the log stays in memory within the cache; one not in the log, always.
            let (bytes, cached) = (body.bytes(), body.cached_bytes());
            let location = locations.next();
            match &location {
                Some(location) => {
                    let len = u64::from(location.len);
                    match placed.last_mut() {
                        Some((segment, count, total)) if *segment == location.segment => {
                            *count += 1;
                            *total += len;
                        }
                        _ => placed.push((location.segment, 1, len)),
                    }
                    if self.body_bytes + cached <= cache {
                        self.body_bytes += cached;
                        self.bodies.insert(id, body);
                    }
                }
                None => {
                    self.body_bytes += cached;
                    self.unlogged_bytes += bytes;
                    self.bodies.insert(id, body);
                }
            }
            let slot = Slot {
                location: location.unwrap_or(NO_LOCATION),
                size,
                attempt: 0,
            };
            place_in(leaf_topic, &mut self.delayed, now, topic, key, slot);
        }
        if let Some(ended) = run {
            self.end_run(ended);
        }
        for (segment, count, bytes) in placed {
            self.bodies_placed(segment, count, bytes);
        }
        let reply = match batch.failed {
            None => Wire::PushAck(PushAck {
                request: batch.request,
                ids: batch.ids,
            }),
            Some(reason) => Wire::error(Some(batch.request), ErrorCode::StorageFailed, reason),
        };
        self.send(batch.conn, reply);
        self.flush_offers(now, false);
    }

    fn handle_storage_read(
        &mut self,
        now: Time,
        token: u64,
        bodies: Vec<Result<MessageBody, String>>,
    ) {
        if self
            .compaction
            .as_ref()
            .is_some_and(|c| !c.writing && c.token == token)
        {
            self.compaction_read(now, bodies);
        } else {
            self.bodies_read(now, token, bodies);
        }
        self.maybe_compact(now);
    }

    fn handle_storage_failed(&mut self, now: Time, token: u64, reason: &str) {
        if self
            .compaction
            .as_ref()
            .is_some_and(|c| c.writing && c.token == token)
        {
            // The bodies stay where they are; the segment is tried again later.
            tracing::warn!(reason, "compaction step not written");
            self.compaction = None;
            return;
        }
        if let Some((conn, mut confirmed)) = self.confirms.remove(&token) {
            // Applied in memory but not logged: after a restart the messages may come back
            // (at-least-once). The consumer is told to retry.
            for result in &mut confirmed.results {
                if result.is_ok() {
                    *result = Err(ReceiptError::Unavailable);
                }
            }
            self.send(conn, Wire::Confirmed(confirmed));
            return;
        }
        let Some(batch) = self.pending.remove(&token) else {
            return;
        };
        self.pending_messages -= batch.messages.len() as u64;
        // Dedup keys of the lost messages are forgotten; batches that were answered with their
        // ids fail too.
        let lost: HashSet<MessageId> = batch.messages.iter().map(|m| m.id).collect();
        let forgotten: Vec<(Topic, Box<str>)> = self
            .dedup_expiry
            .iter()
            .filter(|((_, id), _)| lost.contains(id))
            .map(|(_, (topic, key))| (topic.clone(), key.clone()))
            .collect();
        for (topic, key) in forgotten {
            self.forget_dedup(&topic, &key);
        }
        for other in self.pending.values_mut() {
            if other.failed.is_none() && other.ids.iter().any(|id| lost.contains(id)) {
                other.failed = Some(format!(
                    "a message this batch duplicates could not be stored ({reason}); retry"
                ));
            }
        }
        let mut topics: HashSet<Topic> = batch.messages.iter().map(|m| m.topic.clone()).collect();
        topics.extend(self.dedup.keys().cloned());
        let text =
            format!("the leaf could not store the batch ({reason}); nothing of it was accepted");
        self.send(
            batch.conn,
            Wire::error(Some(batch.request), ErrorCode::StorageFailed, text),
        );
        self.dirty.extend(topics);
        self.flush_offers(now, false);
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
        [
            self.leases.first().map(|(at, _)| *at),
            self.delayed.first_key_value().map(|((at, _), _)| *at),
            self.expiries.first().map(|(at, _)| *at),
            self.dedup_expiry.first_key_value().map(|((at, _), _)| *at),
            self.checkpoint_due,
            self.offer_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            messages: self.live.len(),
            leased: self.leased.len() as u64,
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

#[cfg(test)]
mod invariant_tests {
    use super::*;

    fn leaf() -> Leaf {
        Leaf::new(LeafConfig {
            name: "leaf-1".into(),
            id: LeafId(1),
            settings: Settings::default(),
            seed: 1,
            first_seq: 1,
        })
    }

    #[test]
    fn a_new_leaf_passes_its_check() {
        leaf().check_invariants();
    }

    #[test]
    #[should_panic(expected = "one deadline per lease")]
    fn a_deadline_without_its_lease_is_caught() {
        let mut leaf = leaf();
        leaf.leases.insert((Time(5), MessageId::new(LeafId(1), 1)));
        leaf.check_invariants();
    }

    #[test]
    #[should_panic(expected = "cached body bytes add up")]
    fn miscounted_body_bytes_are_caught() {
        let mut leaf = leaf();
        leaf.body_bytes = 7;
        leaf.check_invariants();
    }
}
