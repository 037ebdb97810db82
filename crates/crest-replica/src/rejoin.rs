//! A replica that starts with nothing on disk, and what it may not do until it caught up.
//!
//! Such a replica is new, or its disk was wiped or its log found corrupt and thrown away. In
//! the second case it may have held entries that a majority counted it in for: they were
//! committed, and now only the other copies hold them. Were it to vote as before, a stale
//! candidate lacking those entries could win with its vote while the replica holding them is
//! down, and the group would lose committed entries (Raft assumes a voter never forgets; a
//! wipe breaks that). So, until it holds again every entry committed when leaders reached it
//! (the highest commit index their appends carried), it does not stand for election and
//! votes only for a candidate whose log holds nothing past the group's formation (index 0):
//! the group's first election still needs its vote, a stale candidate never gets it. (The
//! group's first member, forming the group when no leader reached it, stands for election
//! with its formation-only log, which only replicas as empty as it can elect.) The
//! deterministic simulator models the same rule and checks it (`crest-sim`'s `group.rs`).

use crate::Raft;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

/// See the module doc: shared by the replica's RPC listener and its catching-up watcher.
pub(crate) struct Rejoin {
    recovering: AtomicBool,
    /// It formed the group itself: it stands for election while still recovering.
    formed: AtomicBool,
    /// The highest commit index of an append accepted while recovering (outer `None`: no
    /// leader reached it yet).
    target: watch::Sender<Option<Option<u64>>>,
}

impl Rejoin {
    /// For a replica that had something on disk (`pristine` false) nothing is held back.
    pub(crate) fn new(pristine: bool) -> Arc<Rejoin> {
        Arc::new(Rejoin {
            recovering: AtomicBool::new(pristine),
            formed: AtomicBool::new(false),
            target: watch::Sender::new(None),
        })
    }

    /// Whether it still holds back.
    pub(crate) fn recovering(&self) -> bool {
        self.recovering.load(Ordering::Acquire)
    }

    /// A leader's append was accepted, with `commit` as that leader's commit index.
    pub(crate) fn reached(&self, commit: Option<u64>) {
        if self.recovering() {
            self.target.send_if_modified(|target| {
                let raised = target.is_none_or(|known| commit > known);
                if raised {
                    *target = Some(commit);
                }
                raised
            });
        }
    }

    /// Whether it withholds its vote from a candidate whose last entry is at `last_index`.
    pub(crate) fn abstains(&self, last_index: Option<u64>) -> bool {
        self.recovering() && last_index.is_some_and(|index| index > 0)
    }

    /// It forms the group: it stands for election with its formation-only log.
    pub(crate) fn form(&self) {
        self.formed.store(true, Ordering::Release);
    }

    /// Whether it may stand for election ([`crate::prevote`] asks).
    pub(crate) fn stands(&self) -> bool {
        !self.recovering() || self.formed.load(Ordering::Acquire)
    }

    /// Stops holding back: it caught up.
    fn done(&self) {
        self.recovering.store(false, Ordering::Release);
    }

    /// Holds the replica back from elections until it applied every entry the leaders that
    /// reached `raft` had committed; then lets it take part again.
    pub(crate) fn watch(self: &Arc<Rejoin>, raft: &Raft) {
        if !self.recovering() {
            return;
        }
        let (rejoin, raft) = (self.clone(), raft.clone());
        tokio::spawn(async move {
            let mut metrics = raft.metrics();
            let mut target = rejoin.target.subscribe();
            loop {
                if !rejoin.recovering() {
                    return;
                }
                let goal = *target.borrow_and_update();
                let applied = metrics.borrow_and_update().last_applied.map(|id| id.index);
                if let Some(goal) = goal
                    && applied >= goal
                {
                    tracing::info!(
                        ?applied,
                        "caught up after starting empty: takes part in elections again"
                    );
                    rejoin.done();
                    return;
                }
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() { return },
                    changed = target.changed() => if changed.is_err() { return },
                }
            }
        });
    }
}
