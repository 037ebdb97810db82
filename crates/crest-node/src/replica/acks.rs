//! When the leader counts a write done: at its commit (`replica_acks = "majority"`), or once
//! every follower in sync holds it as well (`"all"`).

use std::collections::HashMap;
use std::time::Duration;

/// When the leader counts a write done: `replica_acks`, and how long a follower that takes
/// nothing stays in sync (`replica_election_timeout_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Acks {
    /// `replica_acks`.
    pub mode: crest_core::config::ReplicaAcks,
    /// How long a follower that takes no entry stays in sync.
    pub in_sync_for: Duration,
}

impl Acks {
    /// As `settings` say.
    pub fn of(settings: &crest_core::config::Settings) -> Acks {
        Acks {
            mode: settings.replica_acks,
            in_sync_for: Duration::from_millis(settings.replica_election_timeout_ms),
        }
    }
}

/// For `replica_acks = "all"`: which followers are in sync, and waiting until they hold an
/// entry. A follower is in sync while the last entry it holds changed within `in_sync_for`
/// (one that holds the leader's last entry is never waited for).
pub(super) struct InSync {
    metrics: tokio::sync::watch::Receiver<crest_replica::RaftMetrics>,
    /// Per follower: the last entry it held, and since when.
    progress: HashMap<u64, (Option<u64>, tokio::time::Instant)>,
    in_sync_for: Duration,
}

impl InSync {
    pub(super) fn new(raft: &crest_replica::Raft, acks: Acks) -> Option<InSync> {
        (acks.mode == crest_core::config::ReplicaAcks::All).then(|| InSync {
            metrics: raft.metrics(),
            progress: HashMap::new(),
            in_sync_for: acks.in_sync_for,
        })
    }

    /// Waits until every follower in sync holds entry `index` (committed already: a majority
    /// holds it). Returns at once on a replica that no longer leads.
    pub(super) async fn hold(&mut self, index: u64) {
        loop {
            let now = tokio::time::Instant::now();
            let mut waits_until = None;
            {
                let metrics = self.metrics.borrow_and_update();
                let Some(replication) = &metrics.replication else {
                    return;
                };
                for (&follower, matched) in replication.iter() {
                    if follower == metrics.id {
                        continue;
                    }
                    let matched = matched.map(|id| id.index);
                    let seen = self.progress.entry(follower).or_insert((matched, now));
                    if seen.0 != matched {
                        *seen = (matched, now);
                    }
                    let out_of_sync_at = seen.1 + self.in_sync_for;
                    if matched.is_some_and(|m| m >= index) || out_of_sync_at <= now {
                        continue;
                    }
                    waits_until = Some(
                        waits_until.map_or(out_of_sync_at, |t: tokio::time::Instant| {
                            t.min(out_of_sync_at)
                        }),
                    );
                }
            }
            let Some(until) = waits_until else {
                return;
            };
            if let Ok(Err(_)) = tokio::time::timeout_at(until, self.metrics.changed()).await {
                return;
            }
        }
    }
}
