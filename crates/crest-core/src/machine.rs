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

use crate::time::Time;
use crate::wire::Wire;

/// A connection, named by the driver. Ids are never reused within one driver.
pub type ConnId = u64;

/// How a connection came to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Link {
    /// This node connected to its parent.
    Parent,
    /// Someone connected to this node (a child, a producer or a consumer); it says who in its
    /// `Hello`.
    Incoming,
}

/// A message to send on a connection.
#[derive(Clone, PartialEq, Debug)]
pub struct Transmit {
    /// Where to send it.
    pub conn: ConnId,
    /// What to send.
    pub msg: Wire,
}

/// A storage operation the leaf asks its driver to perform, in order.
#[derive(Clone, PartialEq, Debug)]
pub enum StorageOp {
    /// Append records to the log.
    Append {
        /// Echoed in [`StorageDone`]; `None` when nobody waits for completion.
        token: Option<u64>,
        /// The records, written and recovered as a whole.
        records: Vec<crate::leaf::LogRecord>,
    },
    /// Make these records — a snapshot of the leaf's whole state, equivalent to everything
    /// appended before this operation — the new start of the log, and drop what it covers.
    Checkpoint {
        /// The snapshot.
        records: Vec<crate::leaf::LogRecord>,
        /// Tokens of the appends still pending when the snapshot was taken: it holds their
        /// records, so it is valid only if every one of them is written. If one failed, the
        /// checkpoint must be abandoned (the log itself stays complete).
        includes: Vec<u64>,
    },
}

impl StorageOp {
    /// The token of an append that waits for completion.
    pub fn token(&self) -> Option<u64> {
        match self {
            StorageOp::Append { token, .. } => *token,
            StorageOp::Checkpoint { .. } => None,
        }
    }

    /// The records of the operation.
    pub fn records(&self) -> &[crate::leaf::LogRecord] {
        match self {
            StorageOp::Append { records, .. } | StorageOp::Checkpoint { records, .. } => records,
        }
    }
}

/// Completion of a [`StorageOp`] that carried a token.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StorageDone {
    /// The operation's token.
    pub token: u64,
}

/// See the module doc.
pub trait Machine: Send {
    /// A connection is established.
    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link);
    /// A connection is gone.
    fn handle_disconnected(&mut self, now: Time, conn: ConnId);
    /// A message arrived on a connection.
    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire);
    /// The time given by `poll_timeout` has come.
    fn handle_timeout(&mut self, now: Time);
    /// A storage operation finished durably.
    fn handle_storage_done(&mut self, _now: Time, _done: StorageDone) {}
    /// A storage operation with a token failed: nothing of it is stored.
    fn handle_storage_failed(&mut self, _now: Time, _token: u64, _reason: &str) {}
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
    /// Every `report_interval_ms` (the driver's clock): send the subtree's report to the
    /// parent, if there is a session. Driven from outside `poll_timeout` so that an idle node
    /// under virtual time is not woken once a second for days.
    fn report_tick(&mut self, _now: Time) {}
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
    /// Pops waiting (root).
    pub pending_pops: u64,
    /// Entries held reserved ahead of pops (root).
    pub ahead_entries: u64,
    /// Protocol violations seen (offers over credit, unexpected messages).
    pub violations: u64,
}
