//! Admin requests and answers: what the root fans out to the leaves and merges.

use super::*;

/// An administrative operation on the dead-letter queues or stats of the tree.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum AdminOp {
    /// Lists up to `limit` dead letters of a topic, oldest death first, with payloads. An
    /// answer stops short to fit one frame ([`AdminReply::more`]): ask again `after` the last
    /// one listed.
    DeadLetters {
        /// The topic.
        topic: String,
        /// Most entries to return.
        limit: u32,
        /// Only those after this `(dead_at, id)` (the last one of the previous page).
        #[serde(default)]
        after: Option<(Time, MessageId)>,
    },
    /// Moves dead letters back into their topic, attempts reset (`ids` empty: all of them).
    Redrive {
        /// The topic.
        topic: String,
        /// Which dead letters (empty: every one of the topic).
        ids: Vec<MessageId>,
    },
    /// Deletes dead letters (`ids` empty: all of the topic's).
    Purge {
        /// The topic.
        topic: String,
        /// Which dead letters (empty: every one of the topic).
        ids: Vec<MessageId>,
    },
    /// Deletes the ready and delayed messages of a topic (leased ones and dead letters stay):
    /// at most `purge_batch_messages` per leaf per request; the answer counts those deleted,
    /// so a caller repeats until it is 0.
    PurgeTopic {
        /// The topic.
        topic: String,
    },
    /// Moves the ready and delayed messages of a topic into another of the same namespace,
    /// attempts reset, ids, payloads and metadata kept (SQS's message move task): at most
    /// `purge_batch_messages` per leaf per request; the answer counts those moved.
    MoveTopic {
        /// The topic the messages leave.
        topic: String,
        /// The topic they join.
        to: String,
    },
    /// Sets a topic's configuration at every leaf (`config.deleted`: removes it). The root
    /// stamps it with its clock ([`TopicConfig::version`]); the answer counts the leaves that
    /// keep it.
    Configure {
        /// The topic.
        topic: String,
        /// Its configuration (boxed: it is much larger than the other operations).
        config: Box<TopicConfig>,
    },
    /// Lists topic configurations whose names start with `prefix`, by name, up to `limit`,
    /// after `after` (the last one of the previous page).
    Configs {
        /// Only topics whose names start with this.
        prefix: String,
        /// Most entries to return.
        limit: u32,
        /// Only those after this name.
        #[serde(default)]
        after: Option<String>,
        /// Only topics in namespaces these grants allow something in (`None`: every one).
        /// The root sets it to the asking principal's grants, whatever the request says, so
        /// that a page and its cursor are cut among what the principal may see: a cursor cut
        /// among all names named another namespace's topic.
        #[serde(default)]
        within: Option<crate::access::Grants>,
    },
    /// Depths and counters per topic (`topic` `None`: every topic).
    Stats {
        /// One topic, or all.
        topic: Option<String>,
    },
    /// Changes the priority of a waiting (ready or delayed) message of a topic: it moves in the
    /// tree at once (retracted and offered again where its parent held it). Logged with who,
    /// when and why, and shown with its deliveries and dead letters ([`Escalation`]); the
    /// message is no longer aged. Answered with [`AdminResult::Reprioritized`].
    Reprioritize {
        /// The topic.
        topic: String,
        /// The message.
        id: MessageId,
        /// Its priority from now on.
        priority: u32,
        /// Why (at most `reason_bytes_max` bytes).
        reason: String,
        /// Who asked: set by the root to the request's principal (what a client sends here is
        /// replaced).
        #[serde(default)]
        by: Option<String>,
    },
    /// Replaces the metadata of a waiting (ready or delayed) message of a topic: its
    /// deliveries and dead-letter listing carry the new pairs from now on (logged; the
    /// payload is unchanged). Answered with [`AdminResult::MetadataSet`].
    SetMetadata {
        /// The topic.
        topic: String,
        /// The message.
        id: MessageId,
        /// Its metadata from now on (`metadata_entries_max`, `metadata_bytes_max`).
        metadata: Vec<(String, String)>,
    },
    /// Settles the live leases of messages of a topic by id, whoever they were delivered to:
    /// an admin's override of a consumer's receipt (release a stuck lease, ack a message a
    /// lost consumer finished). Ids not leased now, or of another topic, are left alone; the
    /// answer counts the leases settled.
    Settle {
        /// The topic.
        topic: String,
        /// What to do with each lease.
        op: Settle,
        /// Which messages (at least one).
        ids: Vec<MessageId>,
    },
}

impl AdminOp {
    /// The topic the operation is about, if one.
    pub fn topic(&self) -> Option<&str> {
        match self {
            AdminOp::DeadLetters { topic, .. }
            | AdminOp::Redrive { topic, .. }
            | AdminOp::Purge { topic, .. }
            | AdminOp::PurgeTopic { topic }
            | AdminOp::MoveTopic { topic, .. }
            | AdminOp::Configure { topic, .. }
            | AdminOp::Reprioritize { topic, .. }
            | AdminOp::SetMetadata { topic, .. }
            | AdminOp::Settle { topic, .. } => Some(topic),
            AdminOp::Stats { topic } => topic.as_deref(),
            AdminOp::Configs { .. } => None,
        }
    }

    /// The message ids the operation names (empty: the whole topic).
    pub fn ids(&self) -> &[MessageId] {
        match self {
            AdminOp::Redrive { ids, .. }
            | AdminOp::Purge { ids, .. }
            | AdminOp::Settle { ids, .. } => ids,
            AdminOp::Reprioritize { id, .. } | AdminOp::SetMetadata { id, .. } => {
                std::slice::from_ref(id)
            }
            _ => &[],
        }
    }

    /// The same operation on `ids` only (the share of one leaf).
    pub fn with_ids(&self, only: Vec<MessageId>) -> AdminOp {
        let mut op = self.clone();
        if let AdminOp::Redrive { ids, .. }
        | AdminOp::Purge { ids, .. }
        | AdminOp::Settle { ids, .. } = &mut op
        {
            *ids = only;
        }
        op
    }
}

/// A message in a dead-letter queue.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The message id.
    pub id: MessageId,
    /// Its topic.
    pub topic: String,
    /// Its priority.
    pub priority: u32,
    /// Deliveries it had.
    pub attempts: u32,
    /// Why its last delivery failed.
    pub reason: String,
    /// When the leaf first accepted it.
    pub enqueued_at: Time,
    /// When it moved to the dead-letter queue.
    pub dead_at: Time,
    /// The producer's metadata.
    pub metadata: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
    /// How its priority came to differ from the one it was pushed with (`None`: it did not).
    #[serde(default)]
    pub escalation: Option<Escalation>,
}

impl DeadLetter {
    /// An upper bound on its size in a frame (MessagePack adds at most a few bytes to each
    /// field; 128 covers the fixed fields and headers, 16 each metadata pair's).
    pub fn frame_bytes(&self) -> u64 {
        let metadata: u64 = self
            .metadata
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64 + 16)
            .sum();
        128 + self.topic.len() as u64
            + self.reason.len() as u64
            + self.payload.len() as u64
            + metadata
            + self.escalation.as_ref().map_or(0, Escalation::frame_bytes)
    }
}

/// What the tree keeps of a topic besides its messages, set at run time
/// ([`AdminOp::Configure`]) and kept by every leaf in its log, so that it survives restarts
/// and every client of the tree sees it (SQS gateways keep their queues' attributes here).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct TopicConfig {
    /// Delivery policy overrides, over the topology's `settings.topics` (each field set here
    /// wins; leaves apply `max_attempts`, `dedup_window_ms`, `message_ttl_ms` and
    /// `dead_letter_topic`).
    pub settings: crate::config::TopicSettings,
    /// Name-value pairs the tree keeps for clients and does not read
    /// (`topic_attributes_bytes_max`).
    pub attributes: std::collections::BTreeMap<String, String>,
    /// When the root accepted it (its clock): where leaves disagree, the newest wins.
    pub version: Time,
    /// Removed: kept as a marker so that an older configuration a leaf missed the removal
    /// of does not come back.
    pub deleted: bool,
    /// Quotas of the topic, or of the namespace for a namespace scope (`NS/`, see
    /// [`crate::quota`]).
    #[serde(default)]
    pub limits: crate::quota::Limits,
}

impl TopicConfig {
    /// Bytes of its attributes' names and values.
    pub fn attribute_bytes(&self) -> u64 {
        self.attributes
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }

    /// An upper bound on its size in a frame with its topic's name (MessagePack adds at most a
    /// few bytes to each field; 128 covers the fixed fields, 16 each attribute's).
    pub fn frame_bytes(&self, topic: &str) -> u64 {
        let dead = self
            .settings
            .dead_letter_topic
            .as_ref()
            .map_or(0, String::len);
        let fairness: usize = self
            .settings
            .fairness_weights
            .iter()
            .flat_map(|weights| weights.milli.keys())
            .map(|key| key.len() + 16)
            .sum();
        128 + topic.len() as u64
            + dead as u64
            + fairness as u64
            + self.attribute_bytes()
            + 16 * self.attributes.len() as u64
    }
}

/// The answer to an [`AdminOp`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum AdminResult {
    /// Topic configurations by name (for `Configs`), deleted ones included (marked).
    Configs {
        /// The configurations.
        configs: Vec<(String, TopicConfig)>,
        /// The listing stopped short: ask again after this name (which may be past the last
        /// one listed when those between were not the caller's to see).
        next: Option<String>,
    },
    /// Dead letters (for `DeadLetters`).
    DeadLetters(Vec<DeadLetter>),
    /// How many messages the operation moved or deleted (for `Redrive`, `Purge`,
    /// `PurgeTopic`, `MoveTopic`, `Settle`), or leaves that keep a configuration (for
    /// `Configure`).
    Count(u64),
    /// Depths and counters (for `Stats`).
    Stats(Stats),
    /// The message's escalation as now logged, or why it was not waiting (for
    /// `Reprioritize`).
    Reprioritized(Result<Escalation, NotWaiting>),
    /// Whether the metadata was replaced, or why the message was not waiting (for
    /// `SetMetadata`).
    MetadataSet(Result<(), NotWaiting>),
}

/// Client → root: an administrative operation.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Admin {
    /// The client's request number.
    pub request: u64,
    /// What to do.
    pub op: AdminOp,
}

/// Root → client: the merged answer of every leaf that answered.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct AdminReply {
    /// The request this answers.
    pub request: u64,
    /// The merged result.
    pub result: AdminResult,
    /// Leaves that could not be reached: the result leaves them out.
    pub unreachable: Vec<LeafId>,
    /// The dead letters listed stop short of the limit so that the answer fits one frame; more
    /// follow `after` the last one.
    #[serde(default)]
    pub more: bool,
}

/// Root → leaf (through aggregators): an administrative operation on one leaf.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LeafAdmin {
    /// The root's tag, echoed in the answer.
    pub tag: u64,
    /// The leaf.
    pub leaf: LeafId,
    /// What to do.
    pub op: AdminOp,
}

/// Leaf → root (through aggregators): the answer to a [`LeafAdmin`] (`None`: unreachable).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LeafAdminReply {
    /// The tag from the request.
    pub tag: u64,
    /// The leaf's result, or `None` if it could not be reached.
    pub result: Option<AdminResult>,
    /// The leaf's dead letters stop short of the limit to fit one frame (see
    /// [`AdminReply::more`]).
    #[serde(default)]
    pub more: bool,
}
