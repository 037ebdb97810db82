//! The wire protocol: every message exchanged between nodes and clients. How each travels in
//! a frame is [`crate::frame`]'s.
//!
//! # Streams
//! Every connection carries two long-lived bidirectional streams opened by the connecting side:
//! the control stream (first byte [`STREAM_CONTROL`]) for the handshake and errors without a
//! request, and the data stream (first byte [`STREAM_DATA`]) for everything else, so that bulk
//! traffic never delays the handshake. [`Wire::is_control`] says which stream a message takes.
//!
//! # Conversations
//! - Handshake: the connecting side sends [`Hello`]; a node answers [`Welcome`] (a child then
//!   starts offering) or an [`ErrorReply`].
//! - Push: producer [`Push`] → leaf, answered by [`PushAck`] once the batch is durable.
//! - Bubble-up: child [`Offer`] → parent, each a diff (adds, retracts) of the child's offered
//!   set of one topic plus its frontier.
//! - Pop: consumer [`Pop`] → root; root [`Reserve`] → … → leaf; leaf [`Reserved`] → … → root;
//!   root [`PopReply`] → consumer.
//! - Ack: consumer [`Ack`] → the owning leaf, answered [`AckReply`]; or, from a consumer
//!   without the leaves' addresses, consumer [`Ack`] → root; root [`Confirm`] → … → leaf; leaf
//!   [`Confirmed`] → … → root; root [`AckReply`] → consumer. A root that cannot use a lease it
//!   was granted sends [`Release`] down so the message becomes available at once.

use crate::id::{LeafId, MessageId, Receipt};
use crate::key::Key;
pub use crate::metrics::{Stats, TopicStats};
use crate::time::Time;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

mod admin;

pub use admin::*;

/// Version of this protocol; a `Hello` with another version is refused.
pub const PROTOCOL_VERSION: u16 = 20;
/// First byte written on a control stream.
pub const STREAM_CONTROL: u8 = 0xC0;
/// First byte written on a data stream.
pub const STREAM_DATA: u8 = 0xD0;

/// The role of a node in the tree.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum Role {
    /// Serves consumers; holds the global candidate window.
    Root,
    /// Merges its children's offers and offers upward.
    Aggregator,
    /// Accepts pushes and owns messages.
    Leaf,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Root => "root",
            Role::Aggregator => "aggregator",
            Role::Leaf => "leaf",
        })
    }
}

/// Who is on the connecting side of a connection.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum PeerKind {
    /// A child node of the tree.
    Node {
        /// The child's name in the topology.
        name: String,
        /// The child's role.
        role: Role,
        /// Every leaf in the child's subtree: the parent routes by these.
        leaves: Vec<LeafId>,
        /// For the leader of a replicated leaf (`name` is then its group): which replica it
        /// is and its term. The parent takes no leader of a term older than one it welcomed.
        #[serde(default)]
        replica: Option<ReplicaClaim>,
    },
    /// The root, connecting to a leaf for its pop path (see [`crate::machine::Link::Leaf`]):
    /// reserves, settles and admin requests go to the leaf, and their answers come back, on
    /// this connection instead of through the aggregators.
    Root {
        /// The root's name in the topology.
        name: String,
    },
    /// A producer (pushes to a leaf).
    Producer,
    /// A consumer (pops from the root).
    Consumer,
}

/// A replica of a group speaking for it as its leader; see [`PeerKind::Node`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ReplicaClaim {
    /// The replica's node name: its certificate is made out to it.
    pub name: String,
    /// The group's Raft term in which it leads.
    pub term: u64,
}

/// First message on a connection's control stream.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal [`PROTOCOL_VERSION`].
    pub protocol: u16,
    /// Who is connecting.
    pub peer: PeerKind,
    /// A client's API token (`crest token create`), when it does not present a client
    /// certificate; nodes ignore it on links between nodes.
    #[serde(default)]
    pub token: Option<Secret>,
}

/// A credential: kept out of logs (its `Debug` shows only its length).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// A node's answer to an accepted [`Hello`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Welcome {
    /// The accepting node's name.
    pub node: String,
    /// The accepting node's role.
    pub role: Role,
    /// Entries per topic the child may hold in this parent's window (0 for clients).
    pub credits_per_topic: u32,
    /// Largest payload the node accepts, in bytes.
    pub payload_bytes_max: u32,
    /// Largest frame the node accepts, in bytes.
    pub frame_bytes_max: u32,
    /// Entries per fairness key's lane the child may hold in this parent's window (0 for
    /// clients; see [`crate::config::Settings::credits_per_key`]).
    #[serde(default)]
    pub credits_per_key: u32,
}

/// What went wrong, as a stable code (the message gives details).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum ErrorCode {
    /// A frame body did not decode as a message.
    MalformedFrame,
    /// A frame was longer than `frame_bytes_max`; it was skipped.
    FrameTooLarge,
    /// A frame body did not match its checksum.
    ChecksumMismatch,
    /// The `Hello` named another protocol version.
    UnsupportedProtocol,
    /// A message that this node does not accept here (wrong role, or before `Hello`).
    UnexpectedMessage,
    /// A request argument is out of range; the message names it.
    InvalidArgument,
    /// A payload exceeds `payload_bytes_max`.
    PayloadTooLarge,
    /// A batch exceeds `push_batch_messages_max` or `push_batch_bytes_max`.
    BatchTooLarge,
    /// The leaf already holds `topics_max` topics.
    TopicLimit,
    /// The leaf already holds `leaf_messages_max` messages.
    QueueFull,
    /// Too many requests are waiting at this node; retry later.
    Overloaded,
    /// A node needed for the request is not connected.
    Unavailable,
    /// The leaf could not store the batch (disk full, I/O error); nothing of it was accepted.
    StorageFailed,
    /// The peer did not prove who it says it is (no certificate, or one made out to another
    /// name); the connection is closed.
    Unauthenticated,
    /// The peer is who it says it is, but may not do this (a node the topology does not place
    /// there); the connection is closed.
    Forbidden,
    /// The push would pass a quota of its namespace or topic ([`ErrorReply::quota`] says
    /// which); nothing of the batch was accepted.
    QuotaExceeded,
    /// The push would pass a rate limit of its namespace or topic ([`ErrorReply::quota`] says
    /// which); nothing of the batch was accepted; retry after [`ErrorReply::retry_after_ms`].
    RateLimited,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::ChecksumMismatch,
        ErrorCode::UnsupportedProtocol,
        ErrorCode::UnexpectedMessage,
        ErrorCode::InvalidArgument,
        ErrorCode::PayloadTooLarge,
        ErrorCode::BatchTooLarge,
        ErrorCode::TopicLimit,
        ErrorCode::QueueFull,
        ErrorCode::Overloaded,
        ErrorCode::Unavailable,
        ErrorCode::StorageFailed,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::QuotaExceeded,
        ErrorCode::RateLimited,
    ];
}

impl std::str::FromStr for ErrorCode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.to_string() == text)
            .ok_or_else(|| format!("unknown error code {text:?}"))
    }
}

/// An error answer. `request` names the request it answers, if any.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ErrorReply {
    /// The request this answers, when the error belongs to one.
    pub request: Option<u64>,
    /// Stable error code.
    pub code: ErrorCode,
    /// Human-readable details naming the problem.
    pub message: String,
    /// The request may succeed if sent again this many milliseconds later (say, a leaf asking
    /// the root for a larger share of a quota).
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// For [`ErrorCode::QuotaExceeded`]: the scope and the limit.
    #[serde(default)]
    pub quota: Option<Box<crate::quota::QuotaExceeded>>,
}

/// One entry of an offer: metadata only, the payload stays at the leaf.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct OfferEntry {
    /// The entry's key (its id names the owning leaf).
    pub key: Key,
    /// Payload size in bytes, so the root can bound reply sizes.
    pub size: u32,
    /// When the leaf offered the message (it joined the leaf's offered set: available, and
    /// within the parent's credit): the start of its bubble-up latency.
    pub since: Time,
    /// When the sender got the entry (a leaf: `since`; an aggregator: when the entry reached
    /// its window), so the parent can measure the last hop alone.
    pub entered: Time,
}

/// A change to the set of entries a child offers its parent for one topic.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Offer {
    /// The topic all entries belong to.
    pub topic: String,
    /// Entries the parent may now hold, sorted by key.
    pub adds: Vec<OfferEntry>,
    /// Entries the parent must drop (the child took them back).
    pub retracts: Vec<Key>,
    /// A lower bound on every entry of this topic in the child's subtree that the child has not
    /// offered (`None`: there is none). Entries the parent holds that are more urgent than every
    /// child's frontier are certainly the most urgent of the whole subtree.
    pub frontier: Option<Key>,
    /// The offer's number in its session and topic (1, 2, …). The parent echoes the last one it
    /// applied in [`Reserve::offer_seq`], so the child can tell whether the parent has seen its
    /// latest add of a reserved entry.
    pub seq: u64,
}

/// One message the root wants leased.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ReserveItem {
    /// The root's reservation number, echoed in the answer.
    pub reservation: u64,
    /// The entry to reserve.
    pub key: Key,
}

/// Root → leaf (through aggregators): lease these messages of one leaf.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Reserve {
    /// The leaf that owns every item.
    pub leaf: LeafId,
    /// The topic of every item.
    pub topic: String,
    /// Visibility timeout of the leases, in milliseconds.
    pub lease_ms: u64,
    /// What to reserve.
    pub items: Vec<ReserveItem>,
    /// The last [`Offer::seq`] of this topic the sender applied from the receiving child when
    /// it took the items from its window. An item the child re-added in a later offer (still
    /// in flight) will reach the parent again after this reserve: the child retracts it.
    pub offer_seq: u64,
    /// A notice to an aggregator: the root sends this reserve to the leaf on its direct link
    /// (setting `direct_pop_path`), so the aggregator takes the items from its window and
    /// refills its parent, but does not forward it.
    pub direct: bool,
    /// Made ahead of pops (the root's reserve-ahead buffer): its grants may go to several
    /// pops, so a FIFO topic's leaf refuses it ([`ReserveDenied::InOrder`]).
    #[serde(default)]
    pub ahead: bool,
}

/// Why a leaf refused to lease a message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ReserveDenied {
    /// The message is already leased.
    Leased,
    /// The message no longer exists (acknowledged, expired or never existed).
    Gone,
    /// The leaf could not be reached.
    Unavailable,
    /// The message is not its FIFO group's next one for this reserve (an earlier one of the
    /// group is leased or not reserved with it), or the reserve was made ahead of pops; it is
    /// offered again.
    InOrder,
}

/// One delivered message, with everything the consumer needs.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Delivery {
    /// The message id.
    pub id: MessageId,
    /// The lease token: `(id, token)` is the receipt handle.
    pub token: u64,
    /// The message's topic.
    pub topic: String,
    /// The message's priority.
    pub priority: u32,
    /// How many times the message has been leased, this delivery included.
    pub attempt: u32,
    /// When the leaf accepted the message.
    pub enqueued_at: Time,
    /// When this lease expires unless acknowledged or extended.
    pub lease_deadline: Time,
    /// The producer's metadata.
    pub metadata: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
    /// How its priority came to differ from the one it was pushed with (`None`: it did not);
    /// `priority` is the effective one.
    #[serde(default)]
    pub escalation: Option<Escalation>,
    /// The fairness key it was pushed with.
    #[serde(default)]
    pub fairness_key: Option<String>,
}

/// A change of a waiting message's priority: by an admin ([`AdminOp::Reprioritize`]) or by
/// its topic's aging. Kept with the message (in its leaf's log) and shown with its deliveries
/// and dead letters.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Escalation {
    /// The priority the message was pushed with.
    pub original_priority: u32,
    /// When its priority last changed (the leaf's clock).
    pub escalated_at: Time,
    /// The principal of the admin who changed it last (`None`: aging, or an admin connection
    /// the host gave no principal).
    pub escalated_by: Option<String>,
    /// Why: the admin's reason, or the aging step that promoted it.
    pub reason: String,
    /// Aging made the last change (no admin set its priority): aging may promote it again.
    pub aged: bool,
}

impl Escalation {
    /// An upper bound on its size in a frame.
    pub fn frame_bytes(&self) -> u64 {
        32 + self.escalated_by.as_ref().map_or(0, String::len) as u64 + self.reason.len() as u64
    }
}

/// Why [`AdminOp::Reprioritize`] changed nothing: the message is not waiting.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, thiserror::Error)]
pub enum NotWaiting {
    /// No message of that id is in the topic (acknowledged, expired, never pushed, or in
    /// another topic).
    #[error("no such message in the topic (acknowledged, expired or never pushed)")]
    Unknown,
    /// The message is leased to a consumer: its priority no longer matters.
    #[error("the message is leased: settle or wait for its lease first")]
    Leased,
    /// The message is a dead letter: redrive it first.
    #[error("the message is a dead letter: redrive it first")]
    Dead,
}

impl Delivery {
    /// The receipt handle of this delivery.
    pub fn receipt(&self) -> Receipt {
        Receipt {
            id: self.id,
            token: self.token,
        }
    }
}

/// The outcome of one [`ReserveItem`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ReserveOutcome {
    /// The reservation number from the request.
    pub reservation: u64,
    /// The entry that was asked for.
    pub key: Key,
    /// The delivery, or why not.
    pub result: Result<Delivery, ReserveDenied>,
}

/// Leaf → root (through aggregators): outcomes of a [`Reserve`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Reserved {
    /// One outcome per reserve item.
    pub items: Vec<ReserveOutcome>,
}

/// Why an ack (or other receipt operation) was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, thiserror::Error)]
pub enum ReceiptError {
    /// The receipt's lease is no longer live: it expired or the message was re-delivered.
    #[error("stale receipt: the lease expired or the message was delivered again")]
    Stale,
    /// The message was never queued at its leaf.
    #[error("unknown message: the receipt names a message its leaf never queued")]
    UnknownMessage,
    /// The message is gone from its leaf: acknowledged, expired or purged.
    #[error("already settled: the message was acknowledged, expired or purged")]
    Settled,
    /// The receipt names a leaf that is not in this tree.
    #[error("unknown leaf: the receipt names a leaf that is not in this tree")]
    UnknownLeaf,
    /// The owning leaf is not reachable now; nothing was done: retry.
    #[error("owning leaf unavailable; retry")]
    Unavailable,
    /// The owning leaf did not answer within `request_timeout_ms`: the settlement may or may
    /// not have been applied. Retrying is safe: an ack applied already answers `Settled`, a
    /// nack or extend applied already answers `Stale` or succeeds again.
    #[error("owning leaf did not answer in time; the settlement may have been applied: retry")]
    TimedOut,
    /// The principal settling it holds no `consume` permission in the message's namespace
    /// (any more: grants are re-read while leases run); nothing was done.
    #[error("forbidden: no consume permission in the message's namespace")]
    Forbidden,
}

/// Root → leaf (through aggregators): settle these leases of one leaf (see [`Settle`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Confirm {
    /// The root's tag, echoed in the answer.
    pub tag: u64,
    /// The leaf that owns every receipt.
    pub leaf: LeafId,
    /// What to do with each receipt's lease.
    pub op: Settle,
    /// The receipts to settle.
    pub receipts: Vec<Receipt>,
    /// The settling principal's grants, for a leaf to check `consume` on each message's
    /// namespace (`None`: it may consume in every namespace, or it is the root's own). Left
    /// out of the encoding when `None`, so an ack's Confirm keeps its short form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<crate::access::Grants>,
}

/// Leaf → root (through aggregators): outcomes of a [`Confirm`], in order.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Confirmed {
    /// The tag from the request.
    pub tag: u64,
    /// One result per receipt.
    pub results: Vec<Result<(), ReceiptError>>,
}

/// Root → leaf (through aggregators): end these leases now; the messages become available.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Release {
    /// The leaf that owns every receipt.
    pub leaf: LeafId,
    /// The leases to end.
    pub receipts: Vec<Receipt>,
}

/// One message a producer pushes.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct PushMessage {
    /// The topic (queue) within the tree.
    pub topic: String,
    /// Lower is more urgent.
    pub priority: u32,
    /// Producer metadata.
    pub metadata: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
    /// Not delivered before this time (absolute; the leaf's clock decides).
    pub deliver_at: Option<Time>,
    /// Not delivered before this long after the leaf accepts it, in milliseconds (0: at once).
    /// With `deliver_at` too, the later of both wins.
    pub delay_ms: u64,
    /// Dropped if not consumed this long after it is ready, in milliseconds (`None`: the
    /// topic's default; 0: forever).
    pub ttl_ms: Option<u64>,
    /// A second push of the topic with the same key within the dedup window is acknowledged
    /// with the first message's id and not enqueued again.
    pub dedup_key: Option<String>,
    /// Within its tier of a `weighted` topic, pops rotate among the fairness keys with ready
    /// messages (a tenant, a customer, SQS's message group), so one key's backlog cannot
    /// starve another's. Ignored by `strict` topics (kept and delivered all the same).
    #[serde(default)]
    pub fairness_key: Option<String>,
}

/// Producer → leaf: a batch of messages, accepted or rejected as a whole.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Push {
    /// The producer's request number.
    pub request: u64,
    /// The messages.
    pub messages: Vec<PushMessage>,
}

/// Leaf → producer: the batch is durable; ids in batch order.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct PushAck {
    /// The request this answers.
    pub request: u64,
    /// One id per message, in order.
    pub ids: Vec<MessageId>,
}

/// Consumer → root: pop up to `max` messages of a topic.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Pop {
    /// The consumer's request number.
    pub request: u64,
    /// The topic.
    pub topic: String,
    /// Most messages to return (at least 1).
    pub max: u32,
    /// How long to wait for a first message, in milliseconds (0: answer at once).
    pub wait_ms: u64,
    /// Visibility timeout for these deliveries (`None`: the topic's default), in milliseconds.
    pub lease_ms: Option<u64>,
    /// Only messages with a priority at most this (`None`: any).
    pub max_priority: Option<u32>,
}

/// Root → consumer: the deliveries of a pop (empty if none was ready in time).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct PopReply {
    /// The request this answers.
    pub request: u64,
    /// Deliveries, most urgent first.
    pub deliveries: Vec<Delivery>,
}

/// What to do with a delivery's lease.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Settle {
    /// Done: the message is deleted.
    Ack,
    /// Failed: the message is available again after `delay_ms` (its attempt count kept), or
    /// moves to the dead-letter queue if this was its last attempt. `reason` is kept with it.
    Nack {
        /// Delay before it is available again, in milliseconds.
        delay_ms: u64,
        /// Why it failed (kept as the message's last failure reason).
        reason: Option<String>,
    },
    /// Still working: the lease now ends `lease_ms` from now.
    Extend {
        /// The new visibility timeout from now, in milliseconds.
        lease_ms: u64,
    },
}

impl Settle {
    /// A short name for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Settle::Ack => "ack",
            Settle::Nack { .. } => "nack",
            Settle::Extend { .. } => "extend",
        }
    }
}

/// Consumer → root: settle delivered messages (ack, nack or extend their leases).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Ack {
    /// The consumer's request number.
    pub request: u64,
    /// What to do.
    pub op: Settle,
    /// The receipts of the deliveries.
    pub receipts: Vec<Receipt>,
}

/// Root → consumer: one result per acknowledged receipt, in order.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct AckReply {
    /// The request this answers.
    pub request: u64,
    /// One result per receipt.
    pub results: Vec<Result<(), ReceiptError>>,
}

/// Every message of the protocol.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[allow(missing_docs)] // Each variant wraps the struct of the same name, documented above.
pub enum Wire {
    Hello(Hello),
    Welcome(Welcome),
    Error(ErrorReply),
    Offer(Offer),
    Reserve(Reserve),
    Reserved(Reserved),
    Confirm(Confirm),
    Confirmed(Confirmed),
    Release(Release),
    Push(Push),
    PushAck(PushAck),
    Pop(Pop),
    PopReply(PopReply),
    Ack(Ack),
    AckReply(AckReply),
    Admin(Admin),
    AdminReply(AdminReply),
    LeafAdmin(LeafAdmin),
    LeafAdminReply(LeafAdminReply),
    /// Child → parent, every `report_interval_ms`: the child's subtree measurements.
    Report(crate::metrics::Report),
    /// Leaf → root (through aggregators): its usage of each limited scope.
    Usage(crate::quota::Usage),
    /// Root → leaf (through aggregators): its allowances.
    Grant(crate::quota::Grant),
}

impl Wire {
    /// Whether this message travels on the control stream (else on the data stream).
    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Wire::Hello(_) | Wire::Welcome(_) | Wire::Error(ErrorReply { request: None, .. })
        )
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Wire::Hello(_) => "Hello",
            Wire::Welcome(_) => "Welcome",
            Wire::Error(_) => "Error",
            Wire::Offer(_) => "Offer",
            Wire::Reserve(_) => "Reserve",
            Wire::Reserved(_) => "Reserved",
            Wire::Confirm(_) => "Confirm",
            Wire::Confirmed(_) => "Confirmed",
            Wire::Release(_) => "Release",
            Wire::Push(_) => "Push",
            Wire::PushAck(_) => "PushAck",
            Wire::Pop(_) => "Pop",
            Wire::PopReply(_) => "PopReply",
            Wire::Ack(_) => "Ack",
            Wire::AckReply(_) => "AckReply",
            Wire::Admin(_) => "Admin",
            Wire::AdminReply(_) => "AdminReply",
            Wire::LeafAdmin(_) => "LeafAdmin",
            Wire::LeafAdminReply(_) => "LeafAdminReply",
            Wire::Report(_) => "Report",
            Wire::Usage(_) => "Usage",
            Wire::Grant(_) => "Grant",
        }
    }

    /// Builds an error reply.
    pub fn error(request: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Wire {
        Wire::Error(ErrorReply {
            request,
            code,
            message: message.into(),
            retry_after_ms: None,
            quota: None,
        })
    }

    /// Refuses a push that would pass a quota.
    pub fn over_quota(request: u64, quota: crate::quota::QuotaExceeded) -> Wire {
        Wire::Error(ErrorReply {
            request: Some(request),
            code: ErrorCode::QuotaExceeded,
            message: quota.to_string(),
            retry_after_ms: None,
            quota: Some(Box::new(quota)),
        })
    }

    /// Refuses a push that would pass a rate limit: retry `after_ms` later.
    pub fn rate_limited(request: u64, rate: crate::quota::QuotaExceeded, after_ms: u64) -> Wire {
        Wire::Error(ErrorReply {
            request: Some(request),
            code: ErrorCode::RateLimited,
            message: format!("{rate}; retry in {after_ms} ms"),
            retry_after_ms: Some(after_ms),
            quota: Some(Box::new(rate)),
        })
    }

    /// Refuses a request that may succeed `after` milliseconds later.
    pub fn retry_later(request: u64, code: ErrorCode, message: String, after_ms: u64) -> Wire {
        Wire::Error(ErrorReply {
            request: Some(request),
            code,
            message,
            retry_after_ms: Some(after_ms),
            quota: None,
        })
    }
}
