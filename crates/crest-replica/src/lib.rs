//! Replica groups: one log kept by several processes on several hosts, with Raft.
//!
//! A replicated leaf is a *group* of replicas. One of them, the leader, takes every write;
//! a write is a [`Batch`] of the leaf's log records, and it is *committed* once a majority of
//! the group holds it durably in its Raft log. Committed batches are handed, in order and
//! exactly once per replica, to that replica's [`Journal`] (the leaf's own log and state),
//! which answers with what it made of it ([`Applied`]). When the leader dies or is cut off,
//! another replica with every committed batch is elected and takes over; a leader of an older
//! term can no longer commit anything.
//!
//! Election, log replication, membership and snapshots are [`openraft`]'s (its published
//! design, tested by its authors with Jepsen); the Raft log on disk is [`raft_log`]'s (by
//! openraft's authors, with checksummed chunks and group flushes). This crate adds what crest
//! needs around them: the [`Journal`] contract, the RPCs over QUIC with the cluster's mutual
//! TLS ([`net`]), snapshots as files, and a [`Group`] that ties a replica together.
//!
//! See ARCHITECTURE.md, "Replica groups", for why Raft and why this shape.

// openraft's error types are large by design, and its traits return them.
#![allow(clippy::result_large_err)]

mod group;
mod heard;
mod log_store;
mod net;
mod prevote;
mod rejoin;
mod stage;
mod state_machine;

pub use group::{Group, GroupConfig, GroupError, Member, WriteError};
pub use openraft::{CommittedLeaderId, LogId, ServerState, StoredMembership};
pub use prevote::PreVoteRounds;
pub use stage::{StageCounts, Stager};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// The types of a crest replica group's Raft.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = tokio::fs::File,
);

/// The Raft of a replica group.
pub type Raft = openraft::Raft<TypeConfig>;

/// Raft's answer to a write handed to it ([`Raft::client_write_ff`]), to come.
pub type WriteAnswer =
    <<TypeConfig as openraft::RaftTypeConfig>::Responder as openraft::raft::responder::Responder<
        TypeConfig,
    >>::Receiver;

/// What a replica's Raft reports of itself (and, on a leader, of its followers).
pub type RaftMetrics = openraft::RaftMetrics<ReplicaId, openraft::BasicNode>;

/// A replica's number in its group (its place in the topology's list, from 1).
pub type ReplicaId = u64;

/// Where a replica's applied state stands: the last batch applied and the group's membership
/// as of it. A [`Journal`] keeps it durably with its data, so that after a restart Raft
/// hands it exactly the batches it does not hold yet.
pub type Position = (
    Option<LogId<ReplicaId>>,
    StoredMembership<ReplicaId, openraft::BasicNode>,
);

/// A number drawn afresh (the standard library's per-process random hash keys over the
/// clock): for stage sessions and election jitter, which need spread, not secrecy.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// One write of the leader: opaque bytes to this crate (the leaf's encoded log records).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Batch(pub Bytes);

/// What a journal made of one committed batch: opaque bytes to this crate (for a leaf, where
/// the bodies of the batch's messages lie in its log).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Applied(pub Bytes);

/// The state a replica group keeps in agreement: a leaf's log and what it holds.
///
/// Every replica's journal receives the same committed batches in the same order. A journal
/// stores its [`Position`] durably together with what it applied (one atomic step, or the
/// position last), so that a crash between the two never makes it skip or repeat a batch.
pub trait Journal: Send + 'static {
    /// What the journal holds: the last batch applied and the membership as of it.
    ///
    /// # Errors
    /// An I/O error reading it.
    fn position(&mut self) -> std::io::Result<Position>;

    /// Applies committed entries, in order: each is the position it moves the journal to and
    /// the leader's batch (`None`: an entry of Raft's own, a new term's first entry or a
    /// membership change, which only moves the position). Answers one [`Applied`] per entry.
    /// Entries come in groups, so a journal can make a whole group durable at once.
    ///
    /// # Errors
    /// An I/O error: the replica stops applying (Raft treats its state machine as broken).
    fn apply(&mut self, entries: Vec<(Position, Option<Batch>)>) -> std::io::Result<Vec<Applied>>;

    /// Writes everything the journal holds to `into`, a snapshot for a replica that is too
    /// far behind for the log; answers the position it holds.
    ///
    /// # Errors
    /// An I/O error writing it.
    fn snapshot(&mut self, into: &mut std::fs::File) -> std::io::Result<Position>;

    /// Replaces everything the journal holds with the snapshot `from`, taken at `position`.
    ///
    /// # Errors
    /// An I/O error, or a snapshot the journal cannot read.
    fn restore(&mut self, from: &mut std::fs::File, position: &Position) -> std::io::Result<()>;
}
