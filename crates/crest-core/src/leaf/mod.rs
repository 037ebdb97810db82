//! The leaf state machine: accepts pushes, owns messages, leases them to the root.
//!
//! # Contract
//! Implements [`Machine`]; see [`crate::machine`] for the polling order and time rules.
//!
//! # Message states
//! Every message the leaf holds is in exactly one state:
//! - **pending**: in a push batch waiting for storage; not yet acknowledged nor offered;
//! - **delayed**: durable, waiting for its `ready_at` (deliver-after, or a nack's delay);
//! - **available**: a candidate of its topic's [`Lanes`] (offered to the parent or not);
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
//! (dead → available, attempts reset) and purge (dead → deleted) dead letters, and purge a
//! topic (available or delayed → deleted, a bounded number per request).
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
//! the other records carry none. A lease's grant and extends are logged with its token and
//! deadline, and recovery restores the leases still live, so a receipt outlives a restart of
//! its leaf (and a replica taking over from its group's leader); both are answered without
//! waiting for their record.
//!
//! # Layout
//! This file holds the leaf's state and its per-message types; each concern lives in a file:
//! [`push`] (validation, dedup, ids), [`checkpoint`] (what is logged, snapshots),
//! [`recovery`] (rebuilding from the log), [`bodies`] (where bodies lie, compaction),
//! [`leases`] (reserve, settle, release, dead letters), [`admin`] (listings, redrive, purge,
//! stats) and [`machine`] (the [`Machine`] implementation: dispatch, timers, invariants).
//!
//! [`Machine`]: crate::machine::Machine

mod admin;
mod bodies;
mod checkpoint;
mod escalate;
mod fifo;
mod leases;
mod machine;
mod push;
mod quota;
mod recovery;

use crate::config::{Settings, TopicPolicy};
use crate::downstream::{Downstream, Topic, TopicMap, TopicSet};
use crate::id::{AscendingIdMap, IdMap, LeafId, LiveIds, MESSAGE_SEQ_MAX, MessageId};
use crate::key::Key;
use crate::lanes::Lanes;
use crate::machine::{ConnId, Outbox, StorageOp};
use crate::metrics::Reporter;
use crate::offer::{Candidate, FlushPolicy, Offerable};
use crate::record::{Location, LogRecord, MessageBody};
use crate::sorted::SortedMap;
use crate::time::Time;
use crate::upstream::Upstream;
use crate::wire::{AckReply, Confirmed, DeadLetter, PushMessage, ReserveOutcome, Role, Wire};
use rand_chacha::ChaCha12Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
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
    /// Key of the lease-token generator (ChaCha12): random in a real node, so that no number
    /// of receipts tells anything about another; derived from a seed in the simulator and
    /// the tests ([`token_key_from_seed`]), so that runs repeat.
    pub token_key: [u8; 32],
    /// First sequence number to assign (storage recovery, or a clock reading for a memory
    /// store, so that ids are not reused across restarts).
    pub first_seq: u64,
}

/// A lease-token key fixed by `seed`, for runs that must repeat (the simulator, tests,
/// benchmarks); a real node draws its key at random.
pub fn token_key_from_seed(seed: u64) -> [u8; 32] {
    let mut draws = crate::rng::SplitMix64::new(seed);
    let mut key = [0; 32];
    for chunk in key.chunks_exact_mut(8) {
        chunk.copy_from_slice(&draws.next_u64().to_le_bytes());
    }
    key
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
    /// Where its body is in the log (`NO_LOCATION`: in `Bodies::cached` only).
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
    /// An ack or nack of it is being logged: it is out of `Leases::by_deadline` until the
    /// record is durable (the settlement then applies) or refused (the lease goes on as if
    /// the settlement never came).
    settling: bool,
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
    DeadLetters {
        tag: u64,
        letters: Vec<DeadLetter>,
        /// The listing stopped short of its limit to fit a frame.
        more: bool,
    },
}

#[derive(Debug)]
struct Answer {
    conn: ConnId,
    /// The read it waits for (`None`: ready to send).
    read: Option<u64>,
    /// The append of its grants' lease records it waits for (`lease_grants_wait_for_log`).
    logging: Option<u64>,
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
    /// Available messages, in the topic's lanes.
    offers: Lanes<Slot>,
    /// Messages of this topic in any state but pending.
    messages: u64,
    /// Their payload bytes.
    bytes: u64,
    /// Available messages per priority.
    ready: BTreeMap<u32, u64>,
    /// Delayed messages (in `Leaf::delayed`).
    delayed: u64,
    /// Leased messages (in `Leases::by_id`).
    leased: u64,
    /// Dead letters by `(dead_at, id)`.
    dead: BTreeMap<(Time, MessageId), Dead>,
    /// When each dead letter died.
    dead_at: IdMap<Time>,
    /// Acceptance times of the live messages that are not dead (see [`Age`]).
    ages: BTreeMap<MessageId, Age>,
    /// A FIFO topic's groups (`None`: not FIFO; `leaf/fifo.rs`).
    groups: Option<fifo::Groups>,
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
        *self.ready.entry(key.priority()).or_default() += 1;
        self.fifo_available(key);
    }

    /// Takes an available message out (`take`: the parent reserved it, with `applied`).
    fn unavailable(&mut self, key: &Key, take: Option<u64>) -> Option<Slot> {
        let slot = match take {
            Some(applied) => self.offers.take(key, applied),
            None => self.offers.remove(key),
        }?;
        self.fifo_unavailable(key);
        if let Some(count) = self.ready.get_mut(&key.priority()) {
            *count -= 1;
            if *count == 0 {
                self.ready.remove(&key.priority());
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
    fairness_key: Option<String>,
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
    /// Whose push it is (`principal_requests_max`).
    principal: Option<Arc<str>>,
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
    /// Push batches refused for a quota (`QuotaExceeded`).
    pushes_over_quota: u64,
    /// Push batches refused while the leaf waited for a larger share of a quota.
    pushes_awaiting_allowance: u64,
    pushes_held: u64,
    /// Push batches refused for a rate limit (`RateLimited`).
    pushes_rate_limited: u64,
    leased: u64,
    acked: u64,
    nacked: u64,
    extended: u64,
    /// Acks, nacks and extends consumers sent here directly (not through the root).
    settle_requests: u64,
    /// Bodies read back from the log for deliveries and listings.
    body_reads: u64,
    /// Bodies compaction moved.
    compacted: u64,
    /// Ready and delayed messages deleted by `PurgeTopic`.
    purged: u64,
    /// Waiting messages an admin reprioritized.
    reprioritized: u64,
    /// Promotions by aging.
    aged: u64,
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
    /// Leases logged with their token and not ended since: token and deadline.
    leases: IdMap<(u64, Time)>,
    /// The latest priority change of each message that had one.
    escalations: IdMap<crate::wire::Escalation>,
    /// Metadata set by `SetMetadata`, by message.
    metadata: IdMap<Vec<(String, String)>>,
    /// The fairness keys of the messages that have one.
    fairness: IdMap<Arc<str>>,
    topics: Vec<Topic>,
    /// The last topic a record named, and its index.
    last: Option<(Topic, u32)>,
}

/// See the module doc.
pub struct Leaf {
    config: LeafConfig,
    next_seq: u64,
    /// Draws lease tokens: a cryptographic generator, so a token cannot be predicted from
    /// others (a receipt is the only proof of a lease).
    tokens: ChaCha12Rng,
    upstream: Upstream,
    clients: Downstream,
    /// Sequence numbers of the durable messages.
    live: LiveIds,
    topics: TopicMap<LeafTopic>,
    leases: Leases,
    /// Delayed messages by `(ready_at, id)`.
    delayed: SortedMap<(Time, MessageId), Delayed>,
    ttl: Ttls,
    dedup: DedupKeys,
    writes: Writes,
    dirty: TopicSet,
    outbox: Outbox,
    storage: VecDeque<StorageOp>,
    violations: u64,
    counters: Counters,
    reporter: Reporter,
    /// Its replica group, while it is a replicated leaf's leader (`Machine::set_group`).
    group: Option<crate::metrics::GroupReport>,
    checkpoints: CheckpointTrigger,
    /// When offer changes that were held back must go (`None`: none are waiting).
    offer_due: Option<Time>,
    flush_policy: FlushPolicy,
    bodies: Bodies,
    /// The latest acceptance time given: acceptance times never go back as ids grow (see
    /// [`Age`]), whatever the clock does.
    last_enqueued_at: Time,
    compactor: Compactor,
    /// Answers in the order they must go, some waiting for reads.
    answers: VecDeque<Answer>,
    /// A recovery under way.
    recovery: Option<Box<Recovery>>,
    /// The principal of each producer connection the host authenticated: a push needs
    /// `produce` on the namespace of each of its messages ([`crate::access`]).
    principals: HashMap<ConnId, Arc<crate::access::Principal>>,
    /// Push batches waiting for the log, per principal (`principal_requests_max`).
    push_tally: crate::access::Tally,
    /// Settlements each principal has waiting here, sent directly by consumers.
    settle_tally: crate::access::Tally,
    /// Settlements sent directly by consumers waiting for storage (`leaf_pending_settles_max`).
    client_settles: u32,
    /// Topic configurations set at run time (`AdminOp::Configure`), by topic, deleted ones
    /// included (`topic_configs_max`).
    configs: BTreeMap<String, crate::wire::TopicConfig>,
    /// What the leaf may admit of each scope with quotas ([`crate::quota`]).
    allowances: crate::quota::Allowances,
    /// Push batches waiting for the allowance the leaf asked the root for, oldest first
    /// (`quota_hold_batches_max`, `quota_hold_ms`).
    held_pushes: std::collections::VecDeque<quota::HeldPush>,
    /// The latest priority change of each live message that had one (few: kept whole).
    escalations: IdMap<crate::wire::Escalation>,
    /// Metadata an admin set for a live message (`SetMetadata`): stands for the pairs of its
    /// body in the log.
    metadata: IdMap<Vec<(String, String)>>,
    /// The aging of each topic that has one, with its floor (`leaf/escalate.rs`).
    aging: BTreeMap<String, (crate::config::Aging, u32)>,
    /// When the next aging check is due (`None`: no topic ages).
    aging_due: Option<Time>,
    /// The tiers of each `weighted` topic, and the weights of its fairness keys
    /// (`crate::lanes`).
    weighted: HashMap<String, (crate::config::Weights, crate::lanes::KeyWeights)>,
    /// The FIFO topics (`leaf/fifo.rs`).
    fifo: HashSet<String>,
}

/// Live leases (`leaf/leases.rs`).
#[derive(Default)]
struct Leases {
    /// Leased messages by id.
    by_id: IdMap<Leased>,
    /// The same by `(deadline, id)`, except those settling.
    by_deadline: BTreeSet<(Time, MessageId)>,
    /// Leases whose settlement is being logged.
    settling: usize,
}

/// Messages with a time to live that are not dead.
#[derive(Default)]
struct Ttls {
    by_id: IdMap<Ttl>,
    /// The same by `(expires_at, id)`.
    by_expiry: BTreeSet<(Time, MessageId)>,
}

/// Deduplication keys per topic, each kept for `dedup_window_ms`.
#[derive(Default)]
struct DedupKeys {
    keys: HashMap<Topic, HashMap<Box<str>, DedupEntry>>,
    by_expiry: BTreeMap<(Time, MessageId), (Topic, Box<str>)>,
}

/// What waits for the log to be durable.
struct Writes {
    /// Push batches, by storage token.
    batches: HashMap<u64, PendingBatch>,
    /// Settlements (acks, nacks; extends only beside them) waiting for their records to be
    /// durable before they are answered: a confirmed ack is never undone by a crash.
    settlements: HashMap<u64, Settlement>,
    /// Messages in `batches`.
    messages: u64,
    /// The token of the next storage operation.
    next_token: u64,
}

/// A `Confirm` whose records are being logged.
struct Settlement {
    conn: ConnId,
    /// The answer, sent once the records are durable (or with the settled receipts refused as
    /// `Unavailable` if they are not).
    answer: SettleReply,
    /// The leases it ends and how, applied once the records are durable.
    outcomes: Vec<(MessageId, Outcome)>,
}

/// Who waits for a settlement: the root with a consumer's receipts, a consumer that sent
/// them to this leaf directly, or an admin's request.
#[derive(Debug)]
enum SettleReply {
    Confirmed(Confirmed),
    /// A consumer's [`Ack`](crate::wire::Ack) sent here, not through the root; `principal`
    /// is given back its tally's slot when answered.
    Client {
        reply: AckReply,
        principal: Option<Arc<str>>,
    },
    /// An admin's [`AdminOp::Settle`](crate::wire::AdminOp::Settle): the count of leases
    /// settled.
    Admin {
        tag: u64,
        settled: u64,
    },
}

impl SettleReply {
    /// The answer to send, once the records are `durable` or failed to be.
    fn into_wire(self, durable: bool) -> Wire {
        match self {
            SettleReply::Confirmed(mut confirmed) => {
                if !durable {
                    not_applied(&mut confirmed.results);
                }
                Wire::Confirmed(confirmed)
            }
            SettleReply::Client { mut reply, .. } => {
                if !durable {
                    not_applied(&mut reply.results);
                }
                Wire::AckReply(reply)
            }
            SettleReply::Admin { tag, settled } => {
                Wire::LeafAdminReply(crate::wire::LeafAdminReply {
                    tag,
                    result: durable.then_some(crate::wire::AdminResult::Count(settled)),
                    more: false,
                })
            }
        }
    }
}

/// A settlement whose records were not made durable was not applied: the leases go on, and
/// the consumer is told to retry.
fn not_applied(results: &mut [Result<(), crate::wire::ReceiptError>]) {
    for result in results {
        if result.is_ok() {
            *result = Err(crate::wire::ReceiptError::Unavailable);
        }
    }
}

/// How a lease ends, decided when its settlement (or its expiry) arrives, so that the record
/// logged and the change applied in memory are the same.
#[derive(Debug)]
enum Outcome {
    /// Acked: deleted.
    Acked,
    /// Its time to live passed: deleted.
    Expired,
    /// Out of attempts: moved to the dead letters.
    Dead { reason: String, at: Time },
    /// Out of attempts: moved to the topic's `dead_letter_topic`, ready there.
    Moved { topic: String },
    /// Available again (or delayed) from `ready_at`.
    Released { ready_at: Time },
}

/// When the next checkpoint is due (`leaf/checkpoint.rs`).
#[derive(Default)]
struct CheckpointTrigger {
    /// Approximate bytes appended to the log since the last checkpoint.
    logged_bytes: u64,
    /// When the time trigger takes a checkpoint (set once something is logged after one).
    due: Option<Time>,
}

/// Message bodies in memory and where the others are on disk (`leaf/bodies.rs`).
#[derive(Default)]
struct Bodies {
    /// Bodies held in memory: all without a location, those with one within
    /// `leaf_body_cache_bytes`.
    cached: AscendingIdMap<MessageBody>,
    /// Their bytes.
    bytes: u64,
    /// Bytes of bodies held in memory only (no location): a checkpoint copies them.
    unlogged_bytes: u64,
    /// Log segments holding live bodies.
    segments: BTreeMap<u32, SegmentUse>,
    /// The newest segment a body was placed in (the one being written).
    newest_segment: u32,
}

/// Compaction of sealed segments whose live bodies became few (`leaf/bodies.rs`).
#[derive(Default)]
struct Compactor {
    /// Sealed segments whose live bodies fell below `compaction_live_pct`.
    candidates: BTreeSet<u32>,
    /// Segments a compaction pass could not empty (an unreadable body): not tried again.
    stuck: BTreeSet<u32>,
    /// Bodies of the segment being compacted not yet in a step.
    queue: Vec<CompactItem>,
    /// The segment being compacted, and whether one of its bodies could not be moved.
    current: Option<(u32, bool)>,
    /// The step under way.
    step: Option<Compaction>,
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
        let mut leaf = Leaf {
            next_seq: config.first_seq.clamp(1, MESSAGE_SEQ_MAX),
            tokens: ChaCha12Rng::from_seed(config.token_key),
            principals: HashMap::new(),
            push_tally: crate::access::Tally::default(),
            settle_tally: crate::access::Tally::default(),
            client_settles: 0,
            configs: BTreeMap::new(),
            allowances: crate::quota::Allowances::default(),
            held_pushes: std::collections::VecDeque::new(),
            escalations: IdMap::default(),
            metadata: IdMap::default(),
            aging: BTreeMap::new(),
            aging_due: None,
            weighted: HashMap::new(),
            fifo: HashSet::new(),
            upstream,
            clients,
            live: LiveIds::default(),
            topics: Default::default(),
            leases: Leases::default(),
            delayed: SortedMap::default(),
            ttl: Ttls::default(),
            dedup: DedupKeys::default(),
            writes: Writes {
                batches: HashMap::new(),
                settlements: HashMap::new(),
                messages: 0,
                next_token: 1,
            },
            dirty: Default::default(),
            outbox: Outbox::default(),
            storage: VecDeque::new(),
            violations: 0,
            counters: Counters::default(),
            reporter: Reporter::new(&config.settings),
            group: None,
            checkpoints: CheckpointTrigger::default(),
            offer_due: None,
            flush_policy: FlushPolicy::new(&config.settings),
            bodies: Bodies::default(),
            last_enqueued_at: Time::ZERO,
            compactor: Compactor::default(),
            answers: VecDeque::new(),
            recovery: None,
            config,
        };
        leaf.refresh_topic_settings(None);
        leaf
    }

    /// This leaf's id.
    pub fn id(&self) -> LeafId {
        self.config.id
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.outbox.send(conn, msg);
    }

    fn policy(&self, topic: &str) -> TopicPolicy {
        self.config
            .settings
            .topic_policy_with(topic, self.runtime(topic))
    }

    /// The overrides set at run time for `topic`, if any.
    fn runtime(&self, topic: &str) -> Option<&crate::config::TopicSettings> {
        if self.configs.is_empty() {
            return None;
        }
        self.configs
            .get(topic)
            .filter(|config| !config.deleted)
            .map(|config| &config.settings)
    }

    /// Where `topic`'s messages go when out of attempts, if not its own dead letters.
    fn dead_letter_topic(&self, topic: &str) -> Option<String> {
        self.runtime(topic)
            .and_then(|r| r.dead_letter_topic.clone())
            .or_else(|| {
                let topology = self.config.settings.topics.get(topic)?;
                topology.dead_letter_topic.clone()
            })
    }

    /// Moves a message that is in no index from topic `from` to topic `to` (interned), ready
    /// or delayed there as its key says, with its attempts reset.
    fn retopic(&mut self, now: Time, from: &Topic, to: &str, key: Key, slot: Slot) {
        let id = key.id;
        let leaf_topic = self.topics.get_mut(from).expect("topic exists");
        let enqueued_at = leaf_topic.enqueued_at(id);
        leaf_topic.messages -= 1;
        leaf_topic.bytes -= u64::from(slot.size);
        leaf_topic.age_remove(id);
        let fairness_key = leaf_topic.offers.key_of(id).cloned();
        leaf_topic.offers.forget_key(id);
        self.dirty.insert(from.clone());
        let to = self.topic(to);
        let leaf_topic = self.topics.get_mut(&to).expect("interned");
        if let Some(fairness_key) = fairness_key {
            leaf_topic.offers.set_key(id, &fairness_key);
        }
        leaf_topic.messages += 1;
        leaf_topic.bytes += u64::from(slot.size);
        leaf_topic.age_add(id, enqueued_at);
        if let Some(ttl) = self.ttl.by_id.get_mut(&id) {
            ttl.topic = to.clone();
            ttl.key = key;
        }
        let slot = Slot { attempt: 0, ..slot };
        self.place(now, to, key, slot);
    }

    fn next_lease_token(&mut self) -> u64 {
        self.tokens.next_u64()
    }

    fn topic(&mut self, name: &str) -> Topic {
        if let Some((topic, _)) = self.topics.get_key_value(name) {
            return topic.clone();
        }
        let topic: Topic = Arc::from(name);
        let leaf_topic = LeafTopic {
            offers: Lanes::new(
                self.weighted.get(name).cloned(),
                self.config.settings.fairness_keys_max,
            ),
            groups: self.fifo.contains(name).then(fifo::Groups::default),
            ..LeafTopic::default()
        };
        self.topics.insert(topic.clone(), leaf_topic);
        topic
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
        LogRecord::Move { topic, .. } => 24 + topic.len() as u64,
        LogRecord::Configure { topic, config } => config.frame_bytes(topic),
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
            priority: key.priority(),
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

/// Up to how many items a table is summed in full by [`crate::machine::Machine::check_invariants`].
const INVARIANT_DEEP_ITEMS_MAX: usize = 10_000;

#[cfg(test)]
mod invariant_tests {
    use super::*;
    use crate::machine::Machine;

    fn leaf() -> Leaf {
        Leaf::new(LeafConfig {
            name: "leaf-1".into(),
            id: LeafId(1),
            settings: Settings::default(),
            token_key: token_key_from_seed(1),
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
        leaf.leases
            .by_deadline
            .insert((Time(5), MessageId::new(LeafId(1), 1)));
        leaf.check_invariants();
    }

    #[test]
    #[should_panic(expected = "cached body bytes add up")]
    fn miscounted_body_bytes_are_caught() {
        let mut leaf = leaf();
        leaf.bodies.bytes = 7;
        leaf.check_invariants();
    }
}
