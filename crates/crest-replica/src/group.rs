//! One replica of a group: its Raft, its log, its journal and its listener, tied together.

use crate::heard::Heard;
use crate::log_store::LogStore;
use crate::net::{self, Names, Network, Serving};
use crate::prevote::{PreVote, PreVoteRounds};
use crate::rejoin::Rejoin;
use crate::stage::{Staged, Stager};
use crate::state_machine::StateMachine;
use crate::{Applied, Batch, Journal, Raft, ReplicaId};
use crest_core::config::Settings;
use crest_transport::tls::{CertifiedKey, StatelessReset};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, LogId, ServerState, SnapshotPolicy};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A replica of the group as the topology lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its number in the group (from 1, unique).
    pub id: ReplicaId,
    /// Its node name: its certificate is made out to it.
    pub name: String,
    /// Where it listens for the group's RPCs.
    pub address: SocketAddr,
}

/// What a replica needs to start.
pub struct GroupConfig {
    /// Where its Raft log and snapshots live (`raft/` and `snapshots/` below it).
    pub dir: PathBuf,
    /// Which member it is.
    pub me: ReplicaId,
    /// Every member of the group, itself included.
    pub members: Vec<Member>,
    /// Its node certificate and the cluster CA.
    pub identity: CertifiedKey,
    /// The cluster CA (PEM).
    pub ca_pem: String,
    /// The node's settings (QUIC, and `replica_*` for the group).
    pub settings: Settings,
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The configuration is not one a group can run with.
    #[error("replica group configuration: {0}")]
    Config(String),
    /// Its log or snapshots could not be opened.
    #[error("replica log in {dir}: {source}")]
    Storage {
        /// The directory.
        dir: String,
        /// What failed.
        source: std::io::Error,
    },
    /// Its listener could not be bound.
    #[error(transparent)]
    Transport(#[from] crest_transport::TransportError),
    /// Raft refused to start.
    #[error("raft: {0}")]
    Raft(String),
}

/// Why a write was not committed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// This replica is not the leader (the leader it knows of, if any): nothing was written,
    /// or what was written will never be committed by this replica's term.
    #[error("not the leader of the group (leader: {leader:?})")]
    NotLeader {
        /// The leader this replica knows of.
        leader: Option<ReplicaId>,
    },
    /// The replica stopped, or its log or journal failed.
    #[error("replica failed: {0}")]
    Failed(String),
}

/// A running replica; see the crate doc.
pub struct Group {
    raft: Raft,
    endpoint: quinn::Endpoint,
    server: tokio::task::JoinHandle<()>,
    stager: Stager,
    /// The stage tasks and the pre-vote task.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    rounds: Arc<PreVoteRounds>,
    me: ReplicaId,
    snapshot_parts_refused: Arc<std::sync::atomic::AtomicU64>,
}

impl Group {
    /// Starts replica `config.me` with `journal`, listening on `socket` if one is given (a
    /// test's held port), else on its member address. A replica that has never run forms the
    /// group with the configured members (every first start does the same, which is safe);
    /// one that has runs on from its log.
    ///
    /// # Errors
    /// [`GroupError`] if the configuration, the log or the listener fails.
    pub async fn start<J: Journal>(
        config: GroupConfig,
        journal: J,
        socket: Option<std::net::UdpSocket>,
    ) -> Result<Group, GroupError> {
        let me = config
            .members
            .iter()
            .find(|m| m.id == config.me)
            .cloned()
            .ok_or_else(|| GroupError::Config(format!("replica {} is no member", config.me)))?;
        let ids: BTreeSet<ReplicaId> = config.members.iter().map(|m| m.id).collect();
        if ids.len() != config.members.len() {
            return Err(GroupError::Config("two members share a number".into()));
        }
        let s = &config.settings;
        let election_timeout = Duration::from_millis(s.replica_election_timeout_ms);
        let (election_timeout_min, election_timeout_max) =
            crate::prevote::openraft_timeouts(election_timeout);
        let raft_config = openraft::Config {
            cluster_name: "crest".into(),
            heartbeat_interval: s.replica_heartbeat_ms,
            election_timeout_min,
            election_timeout_max,
            max_payload_entries: s.replica_append_entries_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(s.replica_snapshot_after_entries),
            max_in_snapshot_log_to_keep: s.replica_snapshot_after_entries,
            // Elections are timed by the pre-vote task (crate::prevote), not openraft.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(|e| GroupError::Config(e.to_string()))?;
        let storage_error = |dir: &PathBuf| {
            let dir = dir.display().to_string();
            move |source| GroupError::Storage { dir, source }
        };
        let log_dir = config.dir.join("raft");
        let log = LogStore::open(
            &log_dir,
            s.replica_log_cache_entries as usize,
            s.replica_log_cache_bytes as usize,
            Duration::from_micros(s.replica_log_flush_linger_us),
        )
        .map_err(storage_error(&log_dir))?;
        let snapshot_dir = config.dir.join("snapshots");
        let state_machine =
            StateMachine::new(journal, &snapshot_dir).map_err(storage_error(&snapshot_dir))?;

        let endpoint_config = crest_transport::NodeEndpointConfig {
            server: crest_transport::server_config(&config.identity, &config.ca_pem, s)?,
            client: crest_transport::link_client_config(&config.ca_pem, &config.identity, s)?,
            reset: StatelessReset::for_node(&config.identity),
        };
        let endpoint = match socket {
            Some(socket) => crest_transport::node_endpoint_on(socket, &endpoint_config, s)?,
            None => crest_transport::node_endpoint(me.address, &endpoint_config, s)?,
        };
        let names: Names = Arc::new(
            config
                .members
                .iter()
                .map(|m| (m.id, m.name.clone()))
                .collect(),
        );
        let rpc_bytes_max = s.replica_rpc_bytes_max as usize;
        let peers: BTreeMap<ReplicaId, (String, SocketAddr)> = config
            .members
            .iter()
            .filter(|m| m.id != me.id)
            .map(|m| (m.id, (m.name.clone(), m.address)))
            .collect();
        let stager = Stager::new(peers.keys().copied(), rpc_bytes_max);
        let mut tasks = stager.spawn(
            &endpoint,
            &peers,
            Duration::from_millis(s.replica_heartbeat_ms),
        );
        // A named body still in transit is waited for about a heartbeat, then asked for in
        // full.
        let staged = Staged::new(rpc_bytes_max, Duration::from_millis(s.replica_heartbeat_ms));
        let network = Network {
            endpoint: endpoint.clone(),
            names: names.clone(),
            rpc_bytes_max,
            stager: stager.clone(),
        };
        let raft = Raft::new(
            me.id,
            Arc::new(raft_config),
            network,
            log.clone(),
            state_machine,
        )
        .await
        .map_err(|e| GroupError::Raft(e.to_string()))?;
        let members: BTreeMap<ReplicaId, BasicNode> = config
            .members
            .iter()
            .map(|m| (m.id, BasicNode::new(m.address.to_string())))
            .collect();
        let pristine = raft
            .with_raft_state(|state| state.vote_ref().leader_id().term == 0)
            .await
            .unwrap_or(false)
            && raft.metrics().borrow().last_log_index.is_none();
        let rejoin = Rejoin::new(pristine);
        rejoin.watch(&raft);
        let heard = Arc::new(Heard::default());
        let snapshot_parts_refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let serving = Arc::new(Serving {
            raft: raft.clone(),
            log: log.clone(),
            rpc_bytes_max,
            rejoin: rejoin.clone(),
            staged,
            heard: heard.clone(),
            lease: crate::heard::lease(election_timeout),
            snapshot_bytes_max: s.replica_snapshot_bytes_max,
            snapshot_parts_refused: snapshot_parts_refused.clone(),
        });
        let server = tokio::spawn(net::serve(endpoint.clone(), names, serving));
        let rounds = Arc::new(PreVoteRounds::default());
        tasks.push(tokio::spawn(
            PreVote {
                raft: raft.clone(),
                log,
                heard,
                rejoin: rejoin.clone(),
                me: me.id,
                peers,
                endpoint: endpoint.clone(),
                timeout: election_timeout,
                rounds: rounds.clone(),
            }
            .run(),
        ));
        let first = config.members.iter().map(|m| m.id).min() == Some(me.id);
        if pristine && first {
            // A replica with nothing on disk is either new or wiped. A wiped one must not form
            // the group again (it would vote a second time in a term it forgot), so only the
            // first member forms it, and only once no leader reached it for two election
            // timeouts: the leader of a group that exists replicates to every member.
            let (raft, rejoin) = (raft.clone(), rejoin.clone());
            let wait = Duration::from_millis(2 * s.replica_election_timeout_ms);
            tokio::spawn(async move {
                let mut metrics = raft.metrics();
                let reached = tokio::time::timeout(wait, async {
                    loop {
                        {
                            let now = metrics.borrow();
                            if now.current_leader.is_some() || now.last_log_index.is_some() {
                                return;
                            }
                        }
                        if metrics.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                })
                .await
                .is_ok();
                if !reached {
                    // It forms the group and stands for election: its log holds the formation
                    // only, so no voter that ever held more elects it. It still withholds its
                    // own vote from candidates with history until a leader caught it up: it
                    // cannot tell being new from being wiped.
                    rejoin.form();
                    if let Err(error) = raft.initialize(members).await {
                        tracing::debug!(%error, "group already formed");
                    }
                }
            });
        }
        Ok(Group {
            raft,
            endpoint,
            server,
            stager,
            tasks,
            rounds,
            me: me.id,
            snapshot_parts_refused,
        })
    }

    /// Commits `batch`: answers once a majority of the group holds it durably and this
    /// replica's journal applied it, with its place in the log and the journal's answer.
    ///
    /// # Errors
    /// [`WriteError::NotLeader`] on a replica that is not the leader (nothing committed);
    /// [`WriteError::Failed`] if it stopped.
    pub async fn write(&self, batch: Batch) -> Result<(LogId<ReplicaId>, Applied), WriteError> {
        self.stager.stage(&batch);
        match self.raft.client_write(batch).await {
            Ok(response) => Ok((response.log_id, response.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(WriteError::NotLeader {
                    leader: forward.leader_id,
                })
            }
            Err(error) => Err(WriteError::Failed(error.to_string())),
        }
    }

    /// What streams a batch to the followers ahead of its entry ([`Stager::stage`]): call
    /// it with the very batch before handing it to [`Raft::client_write_ff`]. [`Group::write`]
    /// does so itself.
    pub fn stager(&self) -> Stager {
        self.stager.clone()
    }

    /// Parts of snapshots this replica refused for going past `replica_snapshot_bytes_max`.
    pub fn snapshot_parts_refused(&self) -> u64 {
        self.snapshot_parts_refused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its pre-vote rounds so far (see [`PreVoteRounds`]).
    pub fn pre_votes(&self) -> Arc<PreVoteRounds> {
        self.rounds.clone()
    }

    /// This replica's number.
    pub fn id(&self) -> ReplicaId {
        self.me
    }

    /// The leader this replica knows of, and whether that is itself.
    pub fn leader(&self) -> Option<ReplicaId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Whether this replica leads, follows, or is electing.
    pub fn state(&self) -> ServerState {
        self.raft.metrics().borrow().state
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Waits until this replica knows a leader, or `timeout` passes.
    pub async fn wait_leader(&self, timeout: Duration) -> Option<ReplicaId> {
        let mut metrics = self.raft.metrics();
        let wait = async {
            loop {
                if let Some(leader) = metrics.borrow().current_leader {
                    return leader;
                }
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }

    /// The index of the last entry this replica applied to its journal.
    pub fn applied(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|id| id.index)
    }

    /// The group's Raft, for what this type does not wrap (metrics, membership).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops the replica: its Raft, its listener and its connections.
    pub async fn shutdown(self) {
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!(%error, "raft did not stop cleanly");
        }
        self.endpoint.close(0u32.into(), b"replica stopped");
        self.server.abort();
        for task in self.tasks {
            task.abort();
        }
        // Give close frames a moment to leave, without waiting out peers that are gone.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
    }
}
