//! The contract between a state machine and its driver.
//!
//! Every role ([`crate::leaf::Leaf`], [`crate::aggregator::Aggregator`], [`crate::root::Root`])
//! implements [`Machine`]. A driver (the ractor actor in `crest-node`, or the simulator) owns
//! the machine and:
//!
//! 1. feeds it inputs: `handle_connected`, `handle_disconnected`, `handle_message`,
//!    `handle_timeout`, `handle_storage_done`, each with the current time;
//! 2. after every input, drains outputs in this order until each returns `None`:
//!    `poll_storage` (durable writes come first), `poll_transmit` (messages, in order per
//!    connection: the order is part of the protocol), `poll_close`;
//! 3. reads `poll_timeout` and calls `handle_timeout` at (or after) that time.
//!
//! Time passed in must never go backwards; drivers clamp a clock that does. Machines never
//! read a clock, open a socket, spawn a task or draw from a global random source.

pub use crate::id::{ConnId, Link};
use crate::record::{Location, LogRecord, MessageBody};
use crate::time::Time;
use crate::wire::Wire;
use std::collections::VecDeque;

/// A message to send on a connection.
#[derive(Clone, PartialEq, Debug)]
pub struct Transmit {
    /// Where to send it.
    pub conn: ConnId,
    /// What to send.
    pub msg: Wire,
}

/// What a machine has to say, in the order it said it: messages for its connections, and
/// connections to close. The three machines share it, and their drivers drain it through
/// [`Machine::poll_transmit`] and [`Machine::poll_close`].
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    transmits: VecDeque<Transmit>,
    closes: VecDeque<(ConnId, String)>,
}

impl Outbox {
    /// Queues `msg` for connection `conn`.
    pub(crate) fn send(&mut self, conn: ConnId, msg: Wire) {
        self.transmits.push_back(Transmit { conn, msg });
    }

    /// Queues a message.
    pub(crate) fn push(&mut self, transmit: Transmit) {
        self.transmits.push_back(transmit);
    }

    /// Queues messages, in order.
    pub(crate) fn extend(&mut self, transmits: impl IntoIterator<Item = Transmit>) {
        self.transmits.extend(transmits);
    }

    /// Queues the closing of connection `conn`, saying why.
    pub(crate) fn close(&mut self, conn: ConnId, reason: impl Into<String>) {
        self.closes.push_back((conn, reason.into()));
    }

    /// The next message to send.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next connection to close.
    pub(crate) fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.closes.pop_front()
    }
}

/// How soon the waiter of an append needs it durable (`fsync` mode; the log of `buffered`
/// leaves completes every append once written).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum SyncWait {
    /// Synced at once: a producer waits for its push's acknowledgement.
    #[default]
    Now,
    /// While pushes are coming, completed with the next sync a push forces, or after
    /// `wal_ack_sync_linger_us` at the latest (with no pushes coming, synced at once): an
    /// ack's delete, a nack's release, a compaction step. Its waiter is not
    /// holding up a producer, and a push that arrives meanwhile then waits for one sync
    /// instead of two.
    Linger,
}

/// A storage operation the leaf asks its driver to perform, in order.
#[derive(Clone, PartialEq, Debug)]
pub enum StorageOp {
    /// Append records to the log.
    Append {
        /// Echoed in [`StorageDone`]; `None` when nobody waits for completion.
        token: Option<u64>,
        /// The records, written and recovered as a whole.
        records: Vec<LogRecord>,
        /// How soon its waiter needs it durable (with a token, in `fsync` mode).
        wait: SyncWait,
    },
    /// Make these records — a snapshot of the leaf's state, equivalent to everything appended
    /// before this operation except the appends listed in `includes` — the new start of the
    /// log. Recovery replays the log from the first of those appends on top of the snapshot
    /// (replaying records the snapshot already reflects changes nothing: each sets absolute
    /// values), so the log store keeps everything from there and drops what comes before.
    Checkpoint {
        /// The snapshot.
        records: Vec<LogRecord>,
        /// Tokens of the appends still pending when the snapshot was taken. If one of them
        /// failed, the checkpoint must be abandoned (the log itself stays complete).
        includes: Vec<u64>,
        /// Log segments that hold bodies of messages the snapshot keeps: they must outlive
        /// the checkpoint even when it replaces their records.
        segments: Vec<u32>,
    },
    /// Read message bodies back from the log; answered by [`Machine::handle_storage_read`].
    Read {
        /// Echoed in the answer.
        token: u64,
        /// Where the bodies are.
        locations: Vec<Location>,
    },
}

impl StorageOp {
    /// The token of an append that waits for completion.
    pub fn token(&self) -> Option<u64> {
        match self {
            StorageOp::Append { token, .. } => *token,
            StorageOp::Checkpoint { .. } | StorageOp::Read { .. } => None,
        }
    }

    /// The records the operation writes.
    pub fn records(&self) -> &[LogRecord] {
        match self {
            StorageOp::Append { records, .. } | StorageOp::Checkpoint { records, .. } => records,
            StorageOp::Read { .. } => &[],
        }
    }
}

/// What a log store that keeps every operation in order (a test's, the simulator's) recovers:
/// the records of the newest checkpoint, then every append from the first one it `includes`
/// (or after it), as [`StorageOp::Checkpoint`] prescribes.
pub fn replay(log: &[StorageOp]) -> Vec<Vec<LogRecord>> {
    let Some(at) = log
        .iter()
        .rposition(|op| matches!(op, StorageOp::Checkpoint { .. }))
    else {
        return log.iter().map(|op| op.records().to_vec()).collect();
    };
    let StorageOp::Checkpoint {
        records, includes, ..
    } = &log[at]
    else {
        unreachable!("found above")
    };
    let from = log[..at]
        .iter()
        .position(|op| op.token().is_some_and(|t| includes.contains(&t)))
        .unwrap_or(at);
    let mut operations = vec![records.clone()];
    operations.extend(
        log[from..]
            .iter()
            .filter(|op| matches!(op, StorageOp::Append { .. }))
            .map(|op| op.records().to_vec()),
    );
    operations
}

/// Completion of a [`StorageOp::Append`] that carried a token.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StorageDone {
    /// The operation's token.
    pub token: u64,
    /// Where the body of each `Enqueue` record of the append lies in the log, in order; empty
    /// when the store keeps no bodies (the leaf then keeps them in memory).
    pub locations: Vec<Location>,
}

impl StorageDone {
    /// A completion without locations (a store that keeps no bodies).
    pub fn new(token: u64) -> StorageDone {
        StorageDone {
            token,
            locations: Vec::new(),
        }
    }
}

/// See the module doc.
pub trait Machine: Send {
    /// A connection is established.
    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link);
    /// A connection is gone.
    fn handle_disconnected(&mut self, now: Time, conn: ConnId);
    /// A connection is gone because its peer went silent: nothing was heard from it for
    /// `link_idle_timeout_ms` (its host vanished or was cut off; a restarted peer resets its
    /// connections at their next packet instead, and ends as
    /// [`Machine::handle_disconnected`]). A parent waits for the leaves behind a child lost
    /// so from when the child was last heard, not from now: a host gone for good stalls no
    /// pop beyond the time it took to notice, while a restart keeps its full wait.
    fn handle_went_silent(&mut self, now: Time, conn: ConnId) {
        self.handle_disconnected(now, conn);
    }
    /// A message arrived on a connection.
    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire);
    /// The host authenticated the client on `conn` as `principal` (before handing over its
    /// `Hello`; again when the principal's grants change). The machine checks what that
    /// connection asks against the principal's grants ([`crate::access`]).
    fn handle_principal(
        &mut self,
        _conn: ConnId,
        _principal: std::sync::Arc<crate::access::Principal>,
    ) {
    }
    /// The time given by `poll_timeout` has come.
    fn handle_timeout(&mut self, now: Time);
    /// A storage operation finished durably.
    fn handle_storage_done(&mut self, _now: Time, _done: StorageDone) {}
    /// Checks the machine's own invariants, panicking with the one that does not hold. Drivers
    /// call it after every input and the outputs it drained: the node in debug builds, the
    /// simulator and the core tests always. It costs O(topics × children) at most, never
    /// O(messages), except where a bounded deep check says otherwise.
    fn check_invariants(&self) {}
    /// A storage operation with a token failed: nothing of it is stored.
    fn handle_storage_failed(&mut self, _now: Time, _token: u64, _reason: &str) {}
    /// A log group that completed operations was synced, taking `sync` (leaves record it).
    fn handle_storage_synced(&mut self, _now: Time, _sync: std::time::Duration) {}
    /// The bodies a [`StorageOp::Read`] asked for, each read or failed, in order.
    fn handle_storage_read(
        &mut self,
        _now: Time,
        _token: u64,
        _bodies: Vec<Result<MessageBody, String>>,
    ) {
    }
    /// The next storage operation to perform.
    fn poll_storage(&mut self) -> Option<StorageOp> {
        None
    }
    /// The next message to send.
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// A connection the driver must close, with the reason.
    fn poll_close(&mut self) -> Option<(ConnId, String)>;
    /// When to call `handle_timeout` next.
    fn poll_timeout(&self) -> Option<Time>;
    /// A snapshot of counters and sizes, for logs and tests.
    fn stats(&self) -> NodeStats;
    /// The measurements of this node's subtree (this node, then its children's latest
    /// reports), as sent to its parent and served over HTTP.
    fn report(&mut self, now: Time) -> crate::metrics::Report;
    /// This node's own histograms since it started, every metric (what `/metrics` serves;
    /// asked for at a scrape, not computed for every report).
    fn histogram_totals(
        &self,
    ) -> std::collections::BTreeMap<crate::metrics::Metric, crate::metrics::Hist> {
        std::collections::BTreeMap::new()
    }
    /// Every `report_interval_ms` (the driver's clock): send the subtree's report to the
    /// parent, if there is a session. Driven from outside `poll_timeout` so that an idle node
    /// under virtual time is not woken once a second for days.
    fn report_tick(&mut self, _now: Time) {}
    /// Where the replica group this leaf is the leader of stands, for its reports (a
    /// replicated leaf's leader is told every heartbeat).
    fn set_group(&mut self, _group: Option<crate::metrics::GroupReport>) {}
}

/// Counters and sizes of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeStats {
    /// Messages held (leaf: all states).
    pub messages: u64,
    /// Messages under a live lease (leaf).
    pub leased: u64,
    /// Entries held in windows from children (aggregator, root).
    pub window_entries: u64,
    /// Entries offered to the parent.
    pub offered: u64,
    /// Connected children.
    pub children: u64,
    /// Whether a parent session is established.
    pub parent_connected: bool,
    /// Welcomed direct links to leaves (root, `direct_pop_path`).
    pub direct_links: u64,
    /// Pops waiting (root).
    pub pending_pops: u64,
    /// Entries held reserved ahead of pops (root).
    pub ahead_entries: u64,
    /// Protocol violations seen (offers over credit, unexpected messages).
    pub violations: u64,
}
