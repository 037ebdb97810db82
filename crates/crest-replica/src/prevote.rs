//! Pre-vote: a replica stands for election only once a majority of its group says it would
//! vote for it.
//!
//! In Raft as openraft 0.9 runs it, a follower that stops hearing its leader raises its term
//! and campaigns. One cut off from the others does so again every election timeout, and when
//! it comes back its higher term deposes the healthy leader that never lost its majority (the
//! leader sees the term in an answer and steps down): the group stops serving for an election
//! it did not need. A busy host that misses a few heartbeats does the same without any fault.
//! Raft's answer (Ongaro's thesis, 9.6) is a pre-vote round: before raising its term, a
//! candidate asks whether the others would vote for it, and they say yes only if they have not
//! heard a leader within the election timeout themselves and its log is at least as
//! up-to-date as theirs. A replica that cannot reach a majority, or whose peers still hear a
//! leader, never raises its term.
//!
//! openraft's own election timer is therefore off (`enable_elect`); this module's task times
//! elections instead and triggers one after a pre-vote a majority granted. The vote itself is
//! openraft's, unchanged: pre-vote only holds campaigns back. The times, with T the election
//! timeout (`replica_election_timeout_ms`):
//!
//! - openraft refuses a vote within its leader lease of hearing a leader, which it takes to
//!   be the longest election timeout; crest gives it T + 1 ms ([`openraft_timeouts`]). (With
//!   openraft's own timer a follower also waited that lease on top of its election timeout
//!   before campaigning: 1.5 to 2 T after the last heartbeat.)
//! - A replica grants a pre-vote only after [`lease`](crate::heard::lease) (1.1 T) without hearing a leader, so
//!   that a granted pre-vote is one openraft's vote will not refuse for its lease.
//! - A replica asks after 1.2 T to 2.2 T without hearing a leader, drawn anew each time (so
//!   that replicas do not all ask at once), and again as long after its last attempt.

use crate::heard::{Heard, lease};
use crate::log_store::LogStore;
use crate::net::PreVoteAsk;
use crate::rejoin::Rejoin;
use crate::{Raft, ReplicaId};
use openraft::ServerState;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Pre-vote rounds a replica ran since it started (it heard no leader for an election
/// timeout), and how many of them a majority granted, so that it stood for election.
#[derive(Debug, Default)]
pub struct PreVoteRounds {
    asked: std::sync::atomic::AtomicU64,
    granted: std::sync::atomic::AtomicU64,
}

impl PreVoteRounds {
    /// Rounds run.
    pub fn asked(&self) -> u64 {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Rounds a majority granted.
    pub fn granted(&self) -> u64 {
        self.granted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What the pre-vote needs of its replica.
pub(crate) struct PreVote {
    pub(crate) raft: Raft,
    pub(crate) log: LogStore,
    pub(crate) heard: Arc<Heard>,
    pub(crate) rejoin: Arc<Rejoin>,
    pub(crate) me: ReplicaId,
    /// The other members: node name and group address.
    pub(crate) peers: BTreeMap<ReplicaId, (String, SocketAddr)>,
    pub(crate) endpoint: quinn::Endpoint,
    /// `replica_election_timeout_ms` (T in the module doc).
    pub(crate) timeout: Duration,
    pub(crate) rounds: Arc<PreVoteRounds>,
}

impl PreVote {
    /// Runs until the replica stops: times elections, and starts one after a granted
    /// pre-vote.
    pub(crate) async fn run(self) {
        let metrics = self.raft.metrics();
        let mut attempted: Option<Instant> = None;
        let started = Instant::now();
        loop {
            let wait = lease(self.timeout) + self.timeout / 10 + jittered(self.timeout);
            // From the last time a leader was heard or an attempt was made.
            let since = [self.heard.at(), attempted, Some(started)]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(started);
            let due = since + wait;
            if Instant::now() < due {
                tokio::time::sleep_until(due).await;
                continue;
            }
            let state = metrics.borrow().state;
            if state == ServerState::Shutdown {
                return;
            }
            attempted = Some(Instant::now());
            if state == ServerState::Leader || !self.rejoin.stands() {
                continue;
            }
            use std::sync::atomic::Ordering::Relaxed;
            self.rounds.asked.fetch_add(1, Relaxed);
            if self.majority_would_vote().await {
                self.rounds.granted.fetch_add(1, Relaxed);
                tracing::info!("a majority would vote for this replica: it stands for election");
                if self.raft.trigger().elect().await.is_err() {
                    return;
                }
            }
        }
    }

    /// Asks every other member, at once, whether it would vote for this replica now; answers
    /// as soon as a majority (itself included) said yes, or can no longer say it.
    async fn majority_would_vote(&self) -> bool {
        use futures_util::StreamExt;
        let last = self.log.last_log_id();
        let members = self.peers.len() + 1;
        let needed = members / 2 + 1;
        let deadline = self.timeout / 2;
        let mut asks: futures_util::stream::FuturesUnordered<_> = self
            .peers
            .values()
            .map(|(name, address)| {
                let ask = PreVoteAsk {
                    endpoint: self.endpoint.clone(),
                    name: name.clone(),
                    address: *address,
                };
                async move {
                    tokio::time::timeout(deadline, ask.ask(self.me, last))
                        .await
                        .unwrap_or(false)
                }
            })
            .collect();
        let (mut granted, mut pending) = (1, self.peers.len());
        while granted < needed && granted + pending >= needed {
            let Some(yes) = asks.next().await else { break };
            pending -= 1;
            granted += usize::from(yes);
        }
        tracing::debug!(granted, needed, "pre-vote");
        granted >= needed
    }
}

/// openraft's election timeouts (min, max) for `timeout` (T): its leader lease is the max.
pub(crate) fn openraft_timeouts(timeout: Duration) -> (u64, u64) {
    let min = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    (min, min.saturating_add(1))
}

/// From nothing to `timeout`, drawn anew each time.
fn jittered(timeout: Duration) -> Duration {
    let fraction = (crate::random_u64() % 1_000) as u32;
    timeout * fraction / 1_000
}
