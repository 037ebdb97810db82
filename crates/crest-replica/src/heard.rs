//! What a replica knows of its leader for the pre-vote ([`crate::prevote`]): when it last heard
//! one, and the rule by which it grants another replica its pre-vote. The RPC listener records
//! and applies them; the pre-vote task reads them.

use crate::log_store::LogStore;
use crate::rejoin::Rejoin;
use crate::{Raft, ReplicaId};
use openraft::{LogId, ServerState};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// When this replica last heard a leader (an append it accepted), shared by the RPC listener
/// that records it and the pre-vote task and answers that read it.
#[derive(Default)]
pub(crate) struct Heard {
    at: Mutex<Option<Instant>>,
}

impl Heard {
    /// A leader's append was accepted now.
    pub(crate) fn leader(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// When a leader was last heard.
    pub(crate) fn at(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a leader was heard within `lease`.
    pub(crate) fn within(&self, lease: Duration) -> bool {
        self.at().is_some_and(|at| at.elapsed() < lease)
    }
}

/// Whether this replica would vote for a candidate whose log ends at `candidate`: it has
/// not heard a leader within the lease, does not lead itself, and the candidate's log is
/// at least as up-to-date as its own (and a replica catching up after an empty start
/// would give it its vote).
pub(crate) fn grants(
    raft: &Raft,
    log: &LogStore,
    heard: &Heard,
    rejoin: &Rejoin,
    lease: Duration,
    candidate: Option<LogId<ReplicaId>>,
) -> bool {
    let leads = raft.metrics().borrow().state == ServerState::Leader;
    !leads
        && !heard.within(lease)
        && candidate >= log.last_log_id()
        && !rejoin.abstains(candidate.map(|id| id.index))
}

/// How long after hearing a leader a replica grants no pre-vote: 1.1 T.
pub(crate) fn lease(timeout: Duration) -> Duration {
    timeout + timeout / 10
}
