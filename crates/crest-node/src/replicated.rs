//! A replica of a replicated leaf: its group's Raft, its journal, and the leaf node it runs
//! while it leads.
//!
//! Every replica runs its group member at once: it votes, takes the leader's entries and writes
//! them to its own log ([`LeafJournal`]). A replica serves the leaf only while it leads and
//! has applied every entry committed before its term (its term's first entry is applied):
//! it then rebuilds the leaf from its own log, as a restarted leaf does, and starts the node
//! (client port, the session with the parent, saying `Hello` for the group with its
//! term). It stops serving as soon as it no longer leads in that term, or has heard from no
//! majority for an election timeout (a leader cut off from its group; another is being
//! elected). A follower refuses every connection on the client address at once (QUIC's
//! `CONNECTION_REFUSED`, before any handshake); the replica serves HTTP itself, leading or
//! not (`/healthz` and `/metrics` say where it stands in its group): producers and the
//! root's direct links find the group's leader by trying its replicas, each refusal costing
//! a round trip rather than a connect timeout.

use crate::replica::{JournalLimits, LeafJournal};
use crate::{Backing, NodeError, NodeHandle, NodeTls, StartOptions, now_millis, serve};
use crest_core::leaf::{Leaf, LeafConfig};
use crest_core::metrics::{FollowerReport, GroupReport};
use crest_core::topology::{NodeSpec, Topology};
use crest_core::wire::ReplicaClaim;
use crest_replica::{Group, GroupConfig, Member, ServerState};
use crest_storage::wal::WalOptions;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The subdirectory of a replica's data directory that holds its crest log (the group's Raft
/// log and snapshots are beside it).
pub const LOG_DIR: &str = "log";

/// A running replica; see the module doc.
pub struct ReplicaHandle {
    name: String,
    /// Where it serves HTTP (leading or not).
    http_addr: Option<std::net::SocketAddr>,
    spec: NodeSpec,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    supervisor: tokio::task::JoinHandle<()>,
}

/// What the supervisor and the handle share.
struct Shared {
    /// The node it runs while it leads, and the term it leads in.
    serving: tokio::sync::Mutex<Option<(u64, NodeHandle)>>,
    /// What the next node starts with (reloads change it).
    options: Mutex<StartOptions>,
    tls: Mutex<NodeTls>,
    /// Where the group stands, as last seen.
    status: Mutex<ReplicaStatus>,
    /// The actor of the node it serves, for its HTTP.
    actor: Mutex<Option<ractor::ActorRef<crate::actor::NodeMsg>>>,
    /// Why its Raft stopped on its own (a log it cannot write), once it did.
    stopped: tokio::sync::watch::Sender<Option<String>>,
    /// Its group member's pre-vote rounds, read when the status is.
    pre_votes: Arc<crest_replica::PreVoteRounds>,
}

impl Shared {
    /// Where the replica stands, as last seen, with its pre-vote rounds as they are now.
    fn status(&self) -> ReplicaStatus {
        let mut status = lock(&self.status).clone();
        status.pre_votes = self.pre_votes.asked();
        status.pre_votes_granted = self.pre_votes.granted();
        status
    }
}

pub use crate::replica::{FollowerLag, ReplicaStatus};

impl ReplicaHandle {
    /// The replica's node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's name: the leaf's name in the tree.
    pub fn group(&self) -> &str {
        self.spec.tree_name()
    }

    /// Where the replica takes clients while it leads.
    pub fn listen_addr(&self) -> std::net::SocketAddr {
        self.spec.listen
    }

    /// Where the replica serves HTTP, if its node has an `http` address.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http_addr
    }

    /// Where the replica stands in its group.
    pub fn status(&self) -> ReplicaStatus {
        self.shared.status()
    }

    /// Waits until the replica serves the leaf, or `timeout` passes; answers the term.
    pub async fn wait_serving(&self, timeout: Duration) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(term) = self.status().serving {
                return Some(term);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The measurements of the leaf, while this replica serves it.
    ///
    /// # Errors
    /// [`NodeError::Replica`] on a replica that does not serve; [`NodeError::Actor`] as for
    /// [`NodeHandle::report`].
    pub async fn report(&self) -> Result<crest_core::metrics::Report, NodeError> {
        crate::report_of(&self.serving_actor().await?).await
    }

    /// The actor of the leaf it serves, taken out of the `serving` lock: an answer that is
    /// slow to come must not hold up the supervisor's heartbeat and step-down, which take
    /// that lock.
    async fn serving_actor(&self) -> Result<ractor::ActorRef<crate::actor::NodeMsg>, NodeError> {
        match &*self.shared.serving.lock().await {
            Some((_, node)) => Ok(node.actor()),
            None => Err(self.not_serving()),
        }
    }

    /// The counters of the leaf, while this replica serves it.
    ///
    /// # Errors
    /// As [`ReplicaHandle::report`].
    pub async fn stats(&self) -> Result<crest_core::machine::NodeStats, NodeError> {
        crate::stats_of(&self.serving_actor().await?).await
    }

    fn not_serving(&self) -> NodeError {
        NodeError::Replica(format!(
            "{} does not lead group {}",
            self.name,
            self.group()
        ))
    }

    /// Applies a new access file, now if it serves and to every node it runs later.
    pub async fn reload_access(&self, access: Option<crate::access::Access>) {
        lock(&self.shared.options).access = access.clone();
        if let Some((_, node)) = &*self.shared.serving.lock().await {
            node.reload_access(access);
        }
    }

    /// Uses `tls` for the leaf node it serves now and later (the group's own connections keep
    /// the material the replica started with until it restarts).
    ///
    /// # Errors
    /// As [`NodeHandle::reload_tls`].
    pub async fn reload_tls(&self, tls: &NodeTls) -> Result<(), NodeError> {
        if let Some((_, node)) = &*self.shared.serving.lock().await {
            node.reload_tls(tls)?;
        }
        *lock(&self.shared.tls) = tls.clone();
        Ok(())
    }

    /// Resolves once the replica's Raft stopped on its own, with why: a fatal error, such as
    /// a log its disk refuses to write. The replica then takes no part in its group (the
    /// others serve on without it) until its process is started again, which `crest launch`
    /// does by exiting for its service manager to restart it.
    pub async fn stopped(&self) -> String {
        let mut stopped = self.shared.stopped.subscribe();
        loop {
            if let Some(reason) = stopped.borrow_and_update().clone() {
                return reason;
            }
            if stopped.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Stops the replica: the node it serves, its group member and its log.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.supervisor.await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts replica `name` of `topology` (a node with a `group`): opens its log, joins its
/// group, and serves the leaf whenever it leads.
///
/// # Errors
/// [`NodeError`] if the node is not a replica, has no data directory, or its log or group
/// cannot start.
pub async fn start_replica(
    topology: &Topology,
    name: &str,
    tls: &NodeTls,
    options: &StartOptions,
) -> Result<ReplicaHandle, NodeError> {
    let spec = topology
        .node(name)
        .ok_or_else(|| NodeError::UnknownNode(name.to_string()))?
        .clone();
    let replica = spec
        .replica
        .clone()
        .ok_or_else(|| NodeError::Replica(format!("{name:?} is in no replica group")))?;
    let dir = options.data_dir.clone().ok_or_else(|| {
        NodeError::Replica(format!(
            "{name:?}: a replica keeps its log on disk and needs a data directory"
        ))
    })?;
    let settings = &spec.settings;
    let wal_options = WalOptions {
        recovery: options.recovery,
        ..WalOptions::new(dir.join(LOG_DIR), settings)
    };
    // A checkpoint names the appends it does not reflect; they are among those the log
    // writer may hold queued.
    let journal = LeafJournal::open(wal_options, JournalLimits::of(settings)).map_err(|error| {
        NodeError::Io {
            path: dir.join(LOG_DIR).display().to_string(),
            error,
        }
    })?;
    let members = topology
        .members(&replica.group)
        .into_iter()
        .filter_map(|node| {
            let replica = node.replica.as_ref()?;
            Some(Member {
                id: replica.number,
                name: node.name.clone(),
                address: replica.address,
            })
        })
        .collect();
    // The replica holds its client socket for its whole life: the follower's refusals and
    // every term's node use it in turn (a socket handed over by socket activation or a test,
    // else one bound here). A replication socket handed over is the group's.
    let handed = options.sockets.as_ref().and_then(|book| {
        book.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(name)
    });
    let mut own = match handed {
        Some(sockets) => sockets,
        None => crate::NodeSockets {
            quic: std::net::UdpSocket::bind(spec.listen).map_err(|error| NodeError::Io {
                path: format!("listen address {}", spec.listen),
                error,
            })?,
            http: None,
            replication: None,
        },
    };
    let replication_socket = own.replication.take();
    let held_http = own.http.take();
    let http_listener = match spec.http {
        None => None,
        Some(addr) => Some(crate::http_listener(addr, held_http).await?),
    };
    let mut options = options.clone();
    options.sockets = Some(Arc::new(Mutex::new(std::collections::HashMap::from([(
        name.to_string(),
        own,
    )]))));
    let group = Group::start(
        GroupConfig {
            dir: dir.clone(),
            me: replica.number,
            members,
            identity: tls.node.clone(),
            ca_pem: tls.ca_pem.clone(),
            settings: settings.clone(),
        },
        journal.clone(),
        replication_socket,
    )
    .await
    .map_err(|error| NodeError::Replica(error.to_string()))?;
    tracing::info!(
        node = name,
        group = %replica.group,
        number = replica.number,
        replication = %replica.address,
        "replica started"
    );
    let shared = Arc::new(Shared {
        serving: tokio::sync::Mutex::new(None),
        options: Mutex::new(options),
        tls: Mutex::new(tls.clone()),
        status: Mutex::new(ReplicaStatus {
            name: name.to_string(),
            group: replica.group.clone(),
            number: replica.number,
            ..ReplicaStatus::default()
        }),
        actor: Mutex::new(None),
        stopped: tokio::sync::watch::Sender::new(None),
        pre_votes: group.pre_votes(),
    });
    let shutdown = CancellationToken::new();
    let http_addr = http_listener.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(listener) = http_listener {
        let (actor_of, status_of) = (shared.clone(), shared.clone());
        let state = crate::http::HttpState {
            name: name.to_string(),
            role: spec.role.to_string(),
            actor: Box::new(move || lock(&actor_of.actor).clone()),
            replica: Some(Box::new(move || status_of.status())),
            data_dir: Some(dir.clone()),
            hosts: crate::http::hosts_of(&spec),
        };
        tokio::spawn(crate::http::serve(listener, state, shutdown.clone()));
    }
    let supervisor = tokio::spawn(supervise(Supervisor {
        topology: topology.clone(),
        spec: spec.clone(),
        dir: dir.join(LOG_DIR),
        group,
        journal,
        shared: shared.clone(),
        shutdown: shutdown.clone(),
    }));
    Ok(ReplicaHandle {
        name: name.to_string(),
        http_addr,
        spec,
        shared,
        shutdown,
        supervisor,
    })
}

struct Supervisor {
    topology: Topology,
    spec: NodeSpec,
    /// The replica's crest log.
    dir: PathBuf,
    group: Group,
    journal: LeafJournal,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

/// Starts and stops the leaf node as the replica gains and loses the lead; see the module doc.
async fn supervise(s: Supervisor) {
    let settings = &s.spec.settings;
    let mut ticker = tokio::time::interval(Duration::from_millis(settings.replica_heartbeat_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut metrics = s.group.raft().metrics();
    let mut refusing: Option<Refuser> = None;
    // Set when the Raft's metrics end without a shutdown: it stopped on a fatal error.
    let mut lost = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            changed = metrics.changed() => if changed.is_err() { lost = true; break },
            () = s.shutdown.cancelled() => break,
        }
        let m = metrics.borrow_and_update().clone();
        // A leader's first entry of its term is applied once every entry committed before
        // it is: its log then holds everything the group acknowledged.
        let caught_up = m
            .last_applied
            .is_some_and(|applied| applied.leader_id.term == m.current_term);
        let heard_from_majority = m
            .millis_since_quorum_ack
            .is_some_and(|ms| ms < settings.replica_election_timeout_ms);
        let leads = (m.state == ServerState::Leader && caught_up && heard_from_majority)
            .then_some(m.current_term);
        let serving_term = s
            .shared
            .serving
            .lock()
            .await
            .as_ref()
            .map(|(term, _)| *term);
        if serving_term.is_some() && serving_term != leads {
            // Taken out first: the lock is not held while the node stops.
            let stopping = s.shared.serving.lock().await.take();
            lock(&s.shared.actor).take();
            if let Some((term, node)) = stopping {
                tracing::warn!(
                    node = %s.spec.name,
                    term,
                    state = ?m.state,
                    current_term = m.current_term,
                    "no longer leads its group: stops serving the leaf"
                );
                node.shutdown().await;
            }
        }
        let serving_now = s.shared.serving.lock().await.is_some();
        if leads.is_none() && !serving_now && refusing.is_none() {
            match refuse_clients(&s) {
                Ok(refuser) => refusing = Some(refuser),
                Err(error) => {
                    tracing::warn!(node = %s.spec.name, %error, "cannot refuse clients as a follower");
                }
            }
        }
        // (A guard in this condition would live through the block, which takes the lock.)
        let serving_now = s.shared.serving.lock().await.is_some();
        if let (Some(term), false) = (leads, serving_now) {
            // The node serves on the endpoint that refused until now: a second endpoint on
            // the same socket would go on taking (and refusing) some of its packets until
            // its driver noticed it was dropped.
            let endpoint = match refusing.take() {
                Some(Refuser {
                    endpoint,
                    accepting,
                }) => {
                    accepting.abort();
                    let _ = accepting.await;
                    Some(endpoint)
                }
                None => None,
            };
            match lead(&s, term, endpoint).await {
                Ok(node) => {
                    *lock(&s.shared.actor) = Some(node.actor.clone());
                    *s.shared.serving.lock().await = Some((term, node));
                }
                Err(error) => {
                    tracing::error!(node = %s.spec.name, term, %error, "cannot serve the leaf");
                }
            }
        }
        let serving = s
            .shared
            .serving
            .lock()
            .await
            .as_ref()
            .map(|(term, _)| *term);
        let followers = followers(&s, &m);
        let actor = lock(&s.shared.actor).clone();
        if let (Some(term), Some(actor)) = (serving, actor) {
            let _ = actor.cast(crate::actor::NodeMsg::Group(GroupReport {
                leader: s.spec.name.clone(),
                term,
                followers: followers
                    .iter()
                    .take(crest_core::metrics::FOLLOWERS_MAX)
                    .map(|f| FollowerReport {
                        name: f.name.clone(),
                        lag_entries: f.lag_entries,
                        lag_bytes: f.lag_bytes,
                    })
                    .collect(),
            }));
        }
        let mut status = lock(&s.shared.status);
        status.state = format!("{:?}", m.state).to_lowercase();
        status.term = m.current_term;
        status.leader = m.current_leader;
        status.serving = serving;
        status.applied = m.last_applied.map(|id| id.index);
        status.last_log = m.last_log_index;
        status.followers = followers;
    }
    lock(&s.shared.actor).take();
    let stopping = s.shared.serving.lock().await.take();
    if let Some((_, node)) = stopping {
        node.shutdown().await;
    }
    if let Some(Refuser {
        endpoint,
        accepting,
    }) = refusing
    {
        accepting.abort();
        endpoint.close(0u32.into(), b"stopped");
    }
    let reason = if lost {
        // A stopped Raft answers any command with the error it stopped on.
        Some(match s.group.raft().trigger().heartbeat().await {
            Err(fatal) => fatal.to_string(),
            Ok(()) => "its Raft stopped".to_string(),
        })
    } else {
        None
    };
    s.group.shutdown().await;
    {
        let mut status = lock(&s.shared.status);
        status.serving = None;
        if reason.is_some() {
            status.state = "shutdown".into();
        }
    }
    drop(s.journal);
    if let Some(reason) = reason {
        tracing::error!(
            node = %s.spec.name,
            %reason,
            "the replica stopped taking part in its group; it must be started again"
        );
        s.shared.stopped.send_replace(Some(reason));
    }
}

/// On a leader, how far behind each follower is (empty on others).
fn followers(s: &Supervisor, m: &crest_replica::RaftMetrics) -> Vec<FollowerLag> {
    let Some(replication) = &m.replication else {
        return Vec::new();
    };
    let last = m.last_log_index;
    replication
        .iter()
        .filter(|(number, _)| **number != m.id)
        .map(|(&number, matched)| {
            let matched = matched.map(|id| id.index);
            let lag_entries = match (last, matched) {
                (Some(last), Some(matched)) => last.saturating_sub(matched),
                (Some(last), None) => last + 1,
                (None, _) => 0,
            };
            let name = s
                .topology
                .members(s.spec.tree_name())
                .into_iter()
                .find(|node| node.replica.as_ref().is_some_and(|r| r.number == number))
                .map(|node| node.name.clone())
                .unwrap_or_default();
            FollowerLag {
                number,
                name,
                matched,
                lag_entries,
                lag_bytes: s.journal.bytes_applied_after(matched),
            }
        })
        .collect()
}

/// The endpoint on a follower's client address and the task that refuses what it accepts.
struct Refuser {
    endpoint: quinn::Endpoint,
    accepting: tokio::task::JoinHandle<()>,
}

/// Refuses every connection to the client address while this replica follows: a producer
/// or the root dialing it learns at once that it is not the group's leader.
fn refuse_clients(s: &Supervisor) -> Result<Refuser, NodeError> {
    let socket = {
        let options = lock(&s.shared.options);
        let book = options
            .sockets
            .as_ref()
            .expect("a replica holds its sockets");
        let book = book.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let sockets = book
            .get(&s.spec.name)
            .ok_or_else(|| NodeError::Replica("its client socket is gone".into()))?;
        sockets.quic.try_clone().map_err(|error| NodeError::Io {
            path: format!("listen address {}", s.spec.listen),
            error,
        })?
    };
    let tls = lock(&s.shared.tls).clone();
    let settings = &s.spec.settings;
    let config = crest_transport::NodeEndpointConfig {
        server: crest_transport::server_config(&tls.node, &tls.ca_pem, settings)?,
        client: crest_transport::link_client_config(&tls.ca_pem, &tls.node, settings)?,
        reset: crest_transport::tls::StatelessReset::for_node(&tls.node),
    };
    let endpoint = crest_transport::node_endpoint_on(socket, &config, settings)?;
    let refusing = endpoint.clone();
    let accepting = tokio::spawn(async move {
        while let Some(incoming) = refusing.accept().await {
            incoming.refuse();
        }
    });
    Ok(Refuser {
        endpoint,
        accepting,
    })
}

/// Rebuilds the leaf from this replica's log and starts serving it in `term`.
async fn lead(
    s: &Supervisor,
    term: u64,
    endpoint: Option<quinn::Endpoint>,
) -> Result<NodeHandle, NodeError> {
    let spec = &s.spec;
    let mut settings = spec.settings.clone();
    // A deposed leader must not grant a lease its successor does not know of: a grant
    // counts once its record is committed.
    settings.lease_grants_wait_for_log = true;
    let config = LeafConfig {
        name: spec.tree_name().to_string(),
        id: spec.leaf_id.expect("validated: leaves have ids"),
        settings,
        token_key: rand::random(),
        first_seq: now_millis(),
    };
    let started = std::time::Instant::now();
    let journal = s.journal.clone();
    let (leaf, operations) = tokio::task::spawn_blocking(move || {
        let mut leaf = Leaf::recovering(config);
        let mut operations = 0u64;
        let recovered = journal.recover(|records| {
            operations += 1;
            leaf.replay_operation(records);
        })?;
        for cut in &recovered.truncated {
            tracing::warn!("log recovery: {cut}");
        }
        Ok::<_, std::io::Error>((leaf, operations))
    })
    .await
    .map_err(|error| NodeError::Replica(error.to_string()))?
    .map_err(|error| NodeError::Io {
        path: s.dir.display().to_string(),
        error,
    })?;
    let leaf = leaf.recovered(crest_core::time::Time::from_millis(now_millis()));
    tracing::info!(
        node = %spec.name,
        group = %spec.tree_name(),
        term,
        operations,
        messages = crest_core::machine::Machine::stats(&leaf).messages,
        elapsed = ?started.elapsed(),
        "leads its group: leaf rebuilt from the log, serving"
    );
    let options = lock(&s.shared.options).clone();
    let tls = lock(&s.shared.tls).clone();
    // The node takes its sockets from the book, and closes them when it stops: keep copies
    // for the next term this replica leads.
    let kept = options.sockets.as_ref().and_then(|book| {
        let book = book.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        book.get(&spec.name).map(crate::NodeSockets::duplicate)
    });
    let claim = ReplicaClaim {
        name: spec.name.clone(),
        term,
    };
    // The replica serves HTTP itself, leading or not.
    let spec = &NodeSpec {
        http: None,
        ..spec.clone()
    };
    let node = serve(
        &s.topology,
        spec,
        &tls,
        &options,
        Box::new(leaf),
        Backing::Replicated(s.group.raft().clone(), s.group.stager(), s.dir.clone()),
        Some(claim),
        endpoint,
    )
    .await;
    if let (Some(book), Some(Ok(sockets))) = (&options.sockets, kept) {
        book.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(spec.name.clone(), sockets);
    }
    node
}
