//! The admin client: dead-letter queues, stats and leases of the whole tree, through the root.
//!
//! Every operation fans out from the root to the leaves concerned and is merged there. A leaf
//! that cannot be reached is left out and named in [`AdminAnswer::unreachable`]: a listing
//! or count is then partial, and the caller decides whether to retry.

use crate::ClientError;
use crate::consumer::{ConsumerConfig, connect_root, unexpected};
use crate::link::Link;
use crest_core::id::{LeafId, MessageId};
use crest_core::wire::{
    Admin as AdminRequest, AdminOp, AdminResult, DeadLetter, ErrorCode, Escalation, Settle, Stats,
    TopicConfig, Wire,
};
use std::time::Duration;

/// How long an admin request may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Most requests [`Admin::purge_topic`] or [`Admin::move_topic`] sends for one call.
pub const PURGE_ROUNDS_MAX: u32 = 1_000;

/// Topic configurations asked for per page.
const CONFIGS_PAGE: u32 = 1_000;

/// A merged answer and the leaves it leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminAnswer<T> {
    /// The merged result of every leaf that answered.
    pub value: T,
    /// Leaves that could not be reached.
    pub unreachable: Vec<LeafId>,
}

/// See the module doc.
pub struct Admin {
    link: Link,
}

impl Admin {
    /// Connects to the root (the same configuration as a consumer's).
    ///
    /// # Errors
    /// [`ClientError`] if the root cannot be reached or refuses us.
    pub async fn connect(config: ConsumerConfig) -> Result<Admin, ClientError> {
        Ok(Admin {
            link: connect_root(&config, &[0]).await?.0,
        })
    }

    /// Up to `limit` dead letters of `topic`, oldest death first, with payloads, reasons and
    /// attempt counts. An answer the root must keep within one frame comes in pages; this
    /// asks for each in turn.
    ///
    /// # Errors
    /// [`ClientError`] if a request failed as a whole.
    pub async fn dead_letters(
        &self,
        topic: &str,
        limit: u32,
    ) -> Result<AdminAnswer<Vec<DeadLetter>>, ClientError> {
        let mut value: Vec<DeadLetter> = Vec::new();
        let mut unreachable: Vec<LeafId> = Vec::new();
        let mut after = None;
        loop {
            let op = AdminOp::DeadLetters {
                topic: topic.into(),
                limit: limit - value.len() as u32,
                after,
            };
            let (result, missing, more) = self.call(op).await?;
            let AdminResult::DeadLetters(page) = result else {
                return Err(mismatch(&result));
            };
            unreachable.extend(missing);
            after = page.last().map(|d| (d.dead_at, d.id));
            let empty = page.is_empty();
            value.extend(page);
            if !more || empty || value.len() >= limit as usize {
                break;
            }
        }
        unreachable.sort_unstable();
        unreachable.dedup();
        Ok(AdminAnswer { value, unreachable })
    }

    /// Moves dead letters of `topic` back into it with their attempts reset (`ids` empty:
    /// all of them); answers how many moved.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn redrive(
        &self,
        topic: &str,
        ids: &[MessageId],
    ) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::Redrive {
            topic: topic.into(),
            ids: ids.to_vec(),
        };
        self.count(op).await
    }

    /// Deletes dead letters of `topic` (`ids` empty: all of them); answers how many.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn purge(
        &self,
        topic: &str,
        ids: &[MessageId],
    ) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::Purge {
            topic: topic.into(),
            ids: ids.to_vec(),
        };
        self.count(op).await
    }

    /// Deletes every ready and delayed message of `topic` (leased messages and dead letters
    /// stay); answers how many. Each leaf deletes at most `purge_batch_messages` per request,
    /// so this asks again until a request deletes none, at most [`PURGE_ROUNDS_MAX`] times:
    /// under a steady stream of pushes it stops there rather than chase them.
    ///
    /// # Errors
    /// [`ClientError`] if a request failed as a whole.
    pub async fn purge_topic(&self, topic: &str) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::PurgeTopic {
            topic: topic.into(),
        };
        self.until_none(op).await
    }

    /// Moves every ready and delayed message of `topic` into `to`, a topic of the same
    /// namespace, with its attempts reset (ids, payloads and metadata kept): e.g. a
    /// dead-letter topic's messages back to their source after a fix. Answers how many; asks
    /// again as [`Admin::purge_topic`] does.
    ///
    /// # Errors
    /// [`ClientError`] if a request failed as a whole.
    pub async fn move_topic(&self, topic: &str, to: &str) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::MoveTopic {
            topic: topic.into(),
            to: to.into(),
        };
        self.until_none(op).await
    }

    /// One step of [`Admin::move_topic`]: each leaf moves at most `purge_batch_messages`;
    /// answers how many moved (0: none was left), so a caller can stop between steps.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn move_topic_step(
        &self,
        topic: &str,
        to: &str,
    ) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::MoveTopic {
            topic: topic.into(),
            to: to.into(),
        };
        self.count(op).await
    }

    /// Sets `topic`'s configuration at every leaf (the root stamps its version); answers how
    /// many leaves keep it. A leaf that cannot be reached gets it when a listing
    /// ([`Admin::configs`]) finds it behind.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole, e.g. `InvalidArgument` for settings
    /// out of range.
    pub async fn configure(
        &self,
        topic: &str,
        config: TopicConfig,
    ) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::Configure {
            topic: topic.into(),
            config: Box::new(config),
        };
        self.count(op).await
    }

    /// Removes `topic`'s configuration (the topology's settings apply again).
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn unconfigure(&self, topic: &str) -> Result<AdminAnswer<u64>, ClientError> {
        let config = TopicConfig {
            deleted: true,
            ..TopicConfig::default()
        };
        self.configure(topic, config).await
    }

    /// The configurations of the topics whose names start with `prefix` (those the caller may
    /// see), by name, the newest each leaf knows; removed ones left out. Asks for each page.
    ///
    /// # Errors
    /// [`ClientError`] if a request failed as a whole.
    pub async fn configs(
        &self,
        prefix: &str,
    ) -> Result<AdminAnswer<Vec<(String, TopicConfig)>>, ClientError> {
        let mut value = Vec::new();
        let mut unreachable: Vec<LeafId> = Vec::new();
        let mut after = None;
        loop {
            let op = AdminOp::Configs {
                prefix: prefix.into(),
                limit: CONFIGS_PAGE,
                after: after.take(),
                within: None,
            };
            let (result, missing, _) = self.call(op).await?;
            let AdminResult::Configs { configs, next } = result else {
                return Err(mismatch(&result));
            };
            unreachable.extend(missing);
            value.extend(configs.into_iter().filter(|(_, c)| !c.deleted));
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        unreachable.sort_unstable();
        unreachable.dedup();
        Ok(AdminAnswer { value, unreachable })
    }

    /// `topic`'s configuration, if it has one.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn config(
        &self,
        topic: &str,
    ) -> Result<AdminAnswer<Option<TopicConfig>>, ClientError> {
        let op = AdminOp::Configs {
            prefix: topic.into(),
            limit: 1,
            after: None,
            within: None,
        };
        let (result, unreachable, _) = self.call(op).await?;
        let AdminResult::Configs { configs, .. } = result else {
            return Err(mismatch(&result));
        };
        let value = configs
            .into_iter()
            .find(|(name, config)| name == topic && !config.deleted)
            .map(|(_, config)| config);
        Ok(AdminAnswer { value, unreachable })
    }

    /// Sends `op` (a bounded step) until a step answers 0, at most [`PURGE_ROUNDS_MAX`] times;
    /// the counts summed.
    async fn until_none(&self, op: AdminOp) -> Result<AdminAnswer<u64>, ClientError> {
        let mut total = AdminAnswer {
            value: 0,
            unreachable: Vec::new(),
        };
        for _ in 0..PURGE_ROUNDS_MAX {
            let round = self.count(op.clone()).await?;
            total.value += round.value;
            total.unreachable.extend(round.unreachable);
            if round.value == 0 {
                break;
            }
        }
        total.unreachable.sort_unstable();
        total.unreachable.dedup();
        Ok(total)
    }

    /// Settles the live leases of `topic`'s messages `ids` as `op` says, whoever they were
    /// delivered to: the override of an admin (`admin` permission in the topic's namespace)
    /// for a consumer's receipts, e.g. to release the lease of a consumer that hangs. Ids not
    /// leased now, or of another topic, are left alone; answers how many leases were settled.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn settle(
        &self,
        topic: &str,
        op: Settle,
        ids: &[MessageId],
    ) -> Result<AdminAnswer<u64>, ClientError> {
        let op = AdminOp::Settle {
            topic: topic.into(),
            op,
            ids: ids.to_vec(),
        };
        self.count(op).await
    }

    /// Changes the priority of `topic`'s waiting (ready or delayed) message `id` to
    /// `priority`, for `reason` (an admin's escalation; `admin` permission in the topic's
    /// namespace): the message moves in the tree at once, and its deliveries and dead-letter
    /// listing show the change ([`Escalation`]: when, by whom, why, the original priority).
    /// Aging leaves it alone from then on.
    ///
    /// # Errors
    /// [`ClientError::NotWaiting`] if the message is leased, dead or not in the topic;
    /// `Unavailable` if its leaf cannot be reached; [`ClientError`] if the request failed.
    pub async fn reprioritize(
        &self,
        topic: &str,
        id: MessageId,
        priority: u32,
        reason: &str,
    ) -> Result<Escalation, ClientError> {
        let op = AdminOp::Reprioritize {
            topic: topic.into(),
            id,
            priority,
            reason: reason.into(),
            by: None,
        };
        match self.call(op).await? {
            (_, unreachable, _) if !unreachable.is_empty() => {
                Err(unreachable_leaf(id, &unreachable))
            }
            (AdminResult::Reprioritized(result), _, _) => Ok(result?),
            (other, _, _) => Err(mismatch(&other)),
        }
    }

    /// Replaces the metadata of `topic`'s waiting (ready or delayed) message `id` with
    /// `metadata` (`admin` permission in the topic's namespace): its deliveries and
    /// dead-letter listing carry the new pairs from now on; the payload is unchanged.
    ///
    /// # Errors
    /// [`ClientError::NotWaiting`] if the message is leased, dead or not in the topic;
    /// `Unavailable` if its leaf cannot be reached; [`ClientError`] if the request failed.
    pub async fn set_metadata(
        &self,
        topic: &str,
        id: MessageId,
        metadata: &[(String, String)],
    ) -> Result<(), ClientError> {
        let op = AdminOp::SetMetadata {
            topic: topic.into(),
            id,
            metadata: metadata.to_vec(),
        };
        match self.call(op).await? {
            (_, unreachable, _) if !unreachable.is_empty() => {
                Err(unreachable_leaf(id, &unreachable))
            }
            (AdminResult::MetadataSet(result), _, _) => Ok(result?),
            (other, _, _) => Err(mismatch(&other)),
        }
    }

    /// Depths per topic (ready by priority, delayed, in flight, dead, oldest) and counters
    /// (expired, dead-lettered, deduplicated) of one topic or all.
    ///
    /// # Errors
    /// [`ClientError`] if the request failed as a whole.
    pub async fn stats(&self, topic: Option<&str>) -> Result<AdminAnswer<Stats>, ClientError> {
        let op = AdminOp::Stats {
            topic: topic.map(str::to_string),
        };
        match self.call(op).await? {
            (AdminResult::Stats(stats), unreachable, _) => Ok(AdminAnswer {
                value: stats,
                unreachable,
            }),
            (other, _, _) => Err(mismatch(&other)),
        }
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.link.close();
    }

    async fn count(&self, op: AdminOp) -> Result<AdminAnswer<u64>, ClientError> {
        match self.call(op).await? {
            (AdminResult::Count(count), unreachable, _) => Ok(AdminAnswer {
                value: count,
                unreachable,
            }),
            (other, _, _) => Err(mismatch(&other)),
        }
    }

    /// The root's answer: the result, the leaves it could not reach, and whether a dead-letter
    /// listing stopped short to fit a frame.
    async fn call(&self, op: AdminOp) -> Result<(AdminResult, Vec<LeafId>, bool), ClientError> {
        let answer = self
            .link
            .request(
                |request| Wire::Admin(AdminRequest { request, op }),
                ANSWER_TIMEOUT,
            )
            .await?;
        match answer {
            Wire::AdminReply(reply) => Ok((reply.result, reply.unreachable, reply.more)),
            other => Err(unexpected("AdminReply", &other)),
        }
    }
}

fn mismatch(result: &AdminResult) -> ClientError {
    ClientError::Protocol(format!("the root answered with the wrong kind: {result:?}"))
}

/// The error of an operation on message `id` whose leaf could not be reached.
fn unreachable_leaf(id: MessageId, unreachable: &[LeafId]) -> ClientError {
    ClientError::Rejected {
        code: ErrorCode::Unavailable,
        message: format!("leaf {} of message {id} cannot be reached", unreachable[0]),
    }
}
