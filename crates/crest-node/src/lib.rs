//! crest nodes: ractor actors that drive the core state machines over QUIC.
//!
//! # Layout
//! - [`actor`](crate::actor): the node actor, a thin driver of one [`Machine`];
//! - `net`: accept loop, parent link with reconnect and backoff, frame readers;
//! - `storage`: where a leaf's log records go;
//! - this module: [`start_node`], [`NodeHandle`], and [`LocalTree`] (a whole topology in one
//!   process).
//!
//! # Shutdown
//! One [`CancellationToken`] per node fans out to every task; [`NodeHandle::shutdown`] cancels
//! it, closes the endpoint (peers see the connections end at once), stops the actor and waits
//! for it.

pub mod access;
mod actor;
mod admission;
mod exporter;
mod http;
mod local;
mod net;
pub mod replica;
mod replicated;
mod storage;

pub use actor::{LinkStats, LinkTotals, Links};
pub use local::{LOCAL_ADMIN, LocalTree};
pub use replicated::{
    FollowerLag, LOG_DIR as REPLICA_LOG_DIR, ReplicaHandle, ReplicaStatus, start_replica,
};

use actor::{NodeActor, NodeArgs, NodeMsg};
use crest_core::aggregator::{Aggregator, AggregatorConfig};
use crest_core::leaf::{Leaf, LeafConfig};
use crest_core::machine::{Link, Machine, NodeStats};
use crest_core::root::{Root, RootConfig};
use crest_core::topology::{NodeSpec, Topology};
use crest_core::wire::Role;
use crest_storage::wal::{RecoveryMode, WalOptions};
use crest_transport::tls::{CERT_VALIDITY_DEFAULT, CertificateAuthority, CertifiedKey};
use net::NetContext;
use ractor::{Actor, ActorRef};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

pub use crest_core::machine::NodeStats as Stats;

/// What can stop a node from starting.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node is not in the topology.
    #[error("node {0:?} is not in the topology")]
    UnknownNode(String),
    /// Transport setup failed (TLS material, binding the address).
    #[error(transparent)]
    Transport(#[from] crest_transport::TransportError),
    /// Reading certificate files failed.
    #[error("reading {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        error: std::io::Error,
    },
    /// The actor could not be spawned or queried.
    #[error("actor: {0}")]
    Actor(String),
    /// The leaf's log could not be opened or recovered.
    #[error(transparent)]
    Storage(#[from] crest_storage::StorageError),
    /// A replica of a replicated leaf could not start.
    #[error("replica: {0}")]
    Replica(String),
}

/// How a node keeps its data.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// A leaf's log directory; `None` keeps its messages in memory only (lost on a crash).
    pub data_dir: Option<PathBuf>,
    /// What log recovery does about corruption that is not a torn tail.
    pub recovery: RecoveryMode,
    /// Addresses learnt at run time, by node name, read at every attempt of the root's
    /// direct links before the topology's (a [`LocalTree`] on ephemeral ports learns a leaf's
    /// address only once it is bound, after the root started).
    pub addresses: Option<AddressBook>,
    /// The root dials its direct links to the leaves once this turns `true` (`None`: at
    /// once). A [`LocalTree`] starts parents before children, so its leaves listen only after
    /// the root started; dialed earlier, each link's first handshake packet would be lost, and
    /// the loss would cut the link's starting congestion window.
    pub direct_links_start: Option<tokio::sync::watch::Receiver<bool>>,
    /// Sockets already bound, by node name: a node with some listens on them instead of
    /// binding its `listen` and `http` addresses (socket activation by a service manager;
    /// tests that hold the ports they chose until the nodes take them).
    pub sockets: Option<SocketBook>,
    /// The principals producers and consumers must prove ([`access`]); `None`: any client
    /// that trusts the CA may do anything.
    pub access: Option<access::Access>,
}

/// See [`StartOptions::sockets`].
pub type SocketBook = Arc<std::sync::Mutex<std::collections::HashMap<String, NodeSockets>>>;

/// The HTTP listener on `addr`: the one handed over in `held`, else one bound now.
async fn http_listener(
    addr: SocketAddr,
    held: Option<std::net::TcpListener>,
) -> Result<tokio::net::TcpListener, NodeError> {
    let io_error = |error| NodeError::Io {
        path: format!("HTTP address {addr}"),
        error,
    };
    match held {
        Some(held) => held
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(held))
            .map_err(io_error),
        None => tokio::net::TcpListener::bind(addr).await.map_err(io_error),
    }
}

/// A node's sockets, bound by someone else before it starts.
#[derive(Debug)]
pub struct NodeSockets {
    /// The QUIC socket, in place of binding the node's `listen` address.
    pub quic: std::net::UdpSocket,
    /// The HTTP listener, in place of binding the node's `http` address (ignored if the node
    /// has none).
    pub http: Option<std::net::TcpListener>,
    /// A replica's socket for its group's RPCs, in place of binding its `replication` address.
    pub replication: Option<std::net::UdpSocket>,
}

impl NodeSockets {
    /// Copies of the QUIC socket and HTTP listener (the same sockets), for a node that will
    /// serve on them again after it stopped: a replica that leads its group once more.
    ///
    /// # Errors
    /// The descriptors cannot be duplicated.
    pub fn duplicate(&self) -> std::io::Result<NodeSockets> {
        Ok(NodeSockets {
            quic: self.quic.try_clone()?,
            http: self.http.as_ref().map(|h| h.try_clone()).transpose()?,
            replication: None,
        })
    }
}

/// `topology` on loopback ports held for it: each node's QUIC socket, HTTP listener (if it
/// has an `http` address) and replication socket (a replica) bound now to a free port, and
/// the topology naming those ports. For a tree started in this process where port 0 will not
/// do: a group's replicas must know each other's addresses before they start.
///
/// # Errors
/// A socket cannot be bound.
pub fn on_held_ports(
    topology: &crest_core::topology::Topology,
) -> std::io::Result<(crest_core::topology::Topology, SocketBook)> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut topology = topology.clone();
    let mut book = std::collections::HashMap::new();
    for node in &mut topology.nodes {
        let quic = std::net::UdpSocket::bind(loopback)?;
        node.listen = quic.local_addr()?;
        node.address = node.listen.to_string();
        let http = match node.http {
            Some(_) => {
                let listener = std::net::TcpListener::bind(loopback)?;
                node.http = Some(listener.local_addr()?);
                Some(listener)
            }
            None => None,
        };
        let replication = match &mut node.replica {
            Some(replica) => {
                let socket = std::net::UdpSocket::bind(loopback)?;
                replica.address = socket.local_addr()?;
                Some(socket)
            }
            None => None,
        };
        book.insert(
            node.name.clone(),
            NodeSockets {
                quic,
                http,
                replication,
            },
        );
    }
    Ok((topology, Arc::new(std::sync::Mutex::new(book))))
}

impl NodeSockets {
    /// A QUIC socket alone.
    pub fn quic(socket: std::net::UdpSocket) -> NodeSockets {
        NodeSockets {
            quic: socket,
            http: None,
            replication: None,
        }
    }
}

/// See [`StartOptions::addresses`].
pub type AddressBook = Arc<std::sync::RwLock<std::collections::HashMap<String, String>>>;

/// TLS material of one node: its certificate and the CA it trusts for its parent.
#[derive(Clone, Debug)]
pub struct NodeTls {
    /// The node's certificate and key.
    pub node: CertifiedKey,
    /// The cluster CA (PEM).
    pub ca_pem: String,
}

impl NodeTls {
    /// Loads `NAME.pem`/`NAME.key` and the CA named by the topology's `[tls]` section, with
    /// paths relative to `base` (the topology file's directory).
    ///
    /// # Errors
    /// [`NodeError::Io`] naming the file that could not be read.
    pub fn from_files(
        topology: &Topology,
        name: &str,
        base: &Path,
    ) -> Result<Option<NodeTls>, NodeError> {
        let Some(files) = &topology.tls else {
            return Ok(None);
        };
        let read = |path: std::path::PathBuf| {
            let path = base.join(path);
            std::fs::read_to_string(&path).map_err(|error| NodeError::Io {
                path: path.display().to_string(),
                error,
            })
        };
        Ok(Some(NodeTls {
            node: CertifiedKey {
                cert_pem: read(files.cert_dir.join(format!("{name}.pem")))?,
                key_pem: read(files.cert_dir.join(format!("{name}.key")))?,
            },
            ca_pem: read(files.ca.clone())?,
        }))
    }

    /// Issues a certificate for `spec` from `ca`, made out to the node's name and the hosts
    /// it is reached at, valid for `valid_for`.
    ///
    /// # Errors
    /// [`NodeError::Transport`] if issuing fails.
    pub fn issue(
        ca: &CertificateAuthority,
        spec: &NodeSpec,
        valid_for: Duration,
    ) -> Result<NodeTls, NodeError> {
        let host = spec
            .address
            .rsplit_once(':')
            .map_or(spec.address.as_str(), |(host, _)| host);
        let hosts = vec![
            host.trim_matches(['[', ']']).to_string(),
            spec.listen.ip().to_string(),
        ];
        Ok(NodeTls {
            node: ca.issue(&spec.name, &hosts, valid_for)?,
            ca_pem: ca.cert_pem().to_string(),
        })
    }
}

/// See [`NodeHandle::report`].
pub(crate) async fn report_of(
    actor: &ActorRef<NodeMsg>,
) -> Result<crest_core::metrics::Report, NodeError> {
    ractor::call_t!(actor, NodeMsg::Report, 5_000).map_err(|e| NodeError::Actor(e.to_string()))
}

/// See [`NodeHandle::stats`].
pub(crate) async fn stats_of(actor: &ActorRef<NodeMsg>) -> Result<NodeStats, NodeError> {
    ractor::call_t!(actor, NodeMsg::Stats, 5_000).map_err(|e| NodeError::Actor(e.to_string()))
}

/// A running node.
pub struct NodeHandle {
    name: String,
    role: Role,
    local_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    actor: ActorRef<NodeMsg>,
    actor_task: tokio::task::JoinHandle<()>,
    endpoint: quinn::Endpoint,
    shutdown: CancellationToken,
    /// A leaf's log writer and body reader, joined by [`NodeHandle::shutdown`].
    storage_threads: Option<StorageThreads>,
    /// The node's settings (to build new TLS configurations: [`NodeHandle::reload_tls`]).
    settings: crest_core::config::Settings,
    /// What its links are dialed with, shared with their tasks.
    link_client: Arc<std::sync::RwLock<quinn::ClientConfig>>,
}

/// The threads of a leaf's storage, outliving the actor that feeds them until they drain.
struct StorageThreads {
    /// A handle to the log writer: the last one closed waits for it to finish (`None`: the
    /// log belongs to the replica's journal, which outlives the node).
    wal: Option<crest_storage::wal::WalHandle>,
    /// The body reader, which ends once the actor's sender is gone.
    reader: std::thread::JoinHandle<()>,
}

impl NodeHandle {
    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Uses `tls` (a renewed certificate and key, or a CA bundle with a new CA) for every
    /// connection made from now on, both accepted and dialed; connections already up keep
    /// theirs. The stateless-reset key stays the one derived at start, from the key the node
    /// started with.
    ///
    /// # Errors
    /// [`NodeError::Transport`] if the material does not parse; the node keeps what it had.
    pub fn reload_tls(&self, tls: &NodeTls) -> Result<(), NodeError> {
        let server = crest_transport::server_config(&tls.node, &tls.ca_pem, &self.settings)?;
        let client = crest_transport::link_client_config(&tls.ca_pem, &tls.node, &self.settings)?;
        self.endpoint.set_server_config(Some(server));
        *self
            .link_client
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = client;
        Ok(())
    }

    /// The address the node is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the node serves HTTP (`/metrics`, `/stats`, `/healthz`, the dashboard), if it does.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The measurements of the node's subtree (what `/stats` serves).
    ///
    /// # Errors
    /// [`NodeError::Actor`] if the actor does not answer within 5 seconds.
    pub async fn report(&self) -> Result<crest_core::metrics::Report, NodeError> {
        report_of(&self.actor).await
    }

    /// The node's actor, to ask it with [`report_of`] and [`stats_of`] without holding
    /// whatever holds the handle.
    pub(crate) fn actor(&self) -> ActorRef<NodeMsg> {
        self.actor.clone()
    }

    /// The node's counters.
    ///
    /// # Errors
    /// [`NodeError::Actor`] if the actor does not answer within 5 seconds.
    pub async fn stats(&self) -> Result<NodeStats, NodeError> {
        stats_of(&self.actor).await
    }

    /// Applies a new access file: new clients are checked against it, open client
    /// connections get their principal's new grants, and those whose token was revoked (or
    /// whose principal was removed) are closed.
    pub fn reload_access(&self, access: Option<access::Access>) {
        let _ = self.actor.send_message(NodeMsg::Access(access));
    }

    /// The node's QUIC connections as the transport sees them (as in `/stats`).
    ///
    /// # Errors
    /// [`NodeError::Actor`] if the actor does not answer within 5 seconds.
    pub async fn links(&self) -> Result<Links, NodeError> {
        ractor::call_t!(self.actor, NodeMsg::Links, 5_000)
            .map_err(|e| NodeError::Actor(e.to_string()))
    }

    /// Stops the node: closes its connections, stops its tasks and actor, and waits for them.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.endpoint.close(0u32.into(), b"shutdown");
        self.actor.stop(Some("shutdown".into()));
        let _ = self.actor_task.await;
        // The actor's storage handles went with it: the log writer now writes and syncs what
        // was queued and releases the data directory, and the reader ends. Wait for both, so a
        // stopped node holds no file and the directory can be opened again at once.
        if let Some(StorageThreads { wal, reader }) = self.storage_threads {
            let joined = tokio::task::spawn_blocking(move || {
                let closed = wal.map_or(Ok(()), |wal| wal.close());
                let _ = reader.join();
                closed
            })
            .await;
            if let Ok(Err(error)) = joined {
                tracing::error!(node = %self.name, %error, "the log writer did not stop cleanly");
            }
        }
        // Give close frames a moment to leave, without waiting out peers that are gone.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_seconds() -> u64 {
    now_millis() / 1000
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Builds the state machine for a node of the topology, recovering a leaf from its log when
/// it has a data directory; returns the log, ready to start, too.
fn machine_for(
    topology: &Topology,
    spec: &NodeSpec,
    options: &StartOptions,
) -> Result<(Box<dyn Machine>, Option<crest_storage::wal::Wal>), NodeError> {
    let subtree = topology.subtree_leaves(&spec.name);
    let settings = spec.settings.clone();
    let machine: Box<dyn Machine> = match spec.role {
        Role::Root => Box::new(Root::new(RootConfig {
            name: spec.name.clone(),
            settings,
            subtree,
            standby: spec.name != topology.root().name,
        })),
        Role::Aggregator => Box::new(Aggregator::new(AggregatorConfig {
            name: spec.name.clone(),
            settings,
            subtree,
        })),
        Role::Leaf => {
            let config = LeafConfig {
                name: spec.name.clone(),
                id: spec.leaf_id.expect("validated: leaves have ids"),
                settings: settings.clone(),
                token_key: rand::random(),
                // Sequence numbers start at the clock (or above the recovered ones), so ids of a
                // restarted leaf never repeat ids an older incarnation may have handed out.
                first_seq: now_millis(),
            };
            let Some(dir) = &options.data_dir else {
                return Ok((Box::new(Leaf::new(config)), None));
            };
            let wal_options = WalOptions {
                recovery: options.recovery,
                ..WalOptions::new(dir.clone(), &settings)
            };
            let started = std::time::Instant::now();
            let mut leaf = Leaf::recovering(config);
            let mut operations = 0u64;
            let (wal, recovered) = crest_storage::wal::open_with(wal_options, |records| {
                operations += 1;
                leaf.replay_operation(records);
            })?;
            let now = crest_core::time::Time::from_millis(now_millis());
            let leaf = leaf.recovered(now);
            for cut in &recovered.truncated {
                tracing::warn!(node = %spec.name, "log recovery: {cut}");
            }
            tracing::info!(
                node = %spec.name,
                dir = %dir.display(),
                segments = recovered.segments,
                operations,
                messages = leaf.stats().messages,
                elapsed = ?started.elapsed(),
                "leaf recovered from its log"
            );
            return Ok((Box::new(leaf), Some(wal)));
        }
    };
    Ok((machine, None))
}

/// Starts node `name` of `topology`: recovers a leaf's log, binds its address, spawns its
/// actor, accepts connections and (except the root) keeps a session with its parent.
///
/// # Errors
/// [`NodeError`] if the node is unknown, its log cannot be recovered, the TLS material is
/// invalid or the address is taken.
pub async fn start_node(
    topology: &Topology,
    name: &str,
    tls: &NodeTls,
    options: &StartOptions,
) -> Result<NodeHandle, NodeError> {
    let spec = topology
        .node(name)
        .ok_or_else(|| NodeError::UnknownNode(name.to_string()))?;
    if spec.replica.is_some() {
        return Err(NodeError::Replica(format!(
            "{name:?} is a replica of a replicated leaf: start it with start_replica"
        )));
    }
    let (machine, wal) = machine_for(topology, spec, options)?;
    let backing = match (wal, &options.data_dir) {
        (Some(wal), Some(dir)) => Backing::Wal(Box::new(wal), dir.clone()),
        _ => Backing::Memory,
    };
    serve(topology, spec, tls, options, machine, backing, None, None).await
}

/// Where a serving node's leaf keeps its log records.
pub(crate) enum Backing {
    /// Nowhere (not a leaf, or a leaf in memory).
    Memory,
    /// Its own log in the directory, recovered and ready to start.
    Wal(Box<crest_storage::wal::Wal>, PathBuf),
    /// Its replica group's log; bodies are read from this replica's log in the directory.
    Replicated(crest_replica::Raft, crest_replica::Stager, PathBuf),
}

/// Runs `machine` as node `spec`: binds its addresses (or serves on `endpoint`, one already
/// bound to its QUIC address), spawns its actor, accepts connections and (except the root)
/// keeps a session with its parent, saying `Hello` with `claim` when it leads a replica group.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    topology: &Topology,
    spec: &NodeSpec,
    tls: &NodeTls,
    options: &StartOptions,
    machine: Box<dyn Machine>,
    backing: Backing,
    claim: Option<crest_core::wire::ReplicaClaim>,
    endpoint: Option<quinn::Endpoint>,
) -> Result<NodeHandle, NodeError> {
    let name = spec.name.as_str();
    let log_dir = match &backing {
        Backing::Wal(_, dir) | Backing::Replicated(_, _, dir) => Some(dir.clone()),
        Backing::Memory => None,
    };
    let endpoint_config = crest_transport::NodeEndpointConfig {
        server: crest_transport::server_config(&tls.node, &tls.ca_pem, &spec.settings)?,
        client: crest_transport::link_client_config(&tls.ca_pem, &tls.node, &spec.settings)?,
        reset: crest_transport::tls::StatelessReset::for_node(&tls.node),
    };
    let held = options.sockets.as_ref().and_then(|book| {
        book.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(name)
    });
    let (endpoint, held_http) = match (endpoint, held) {
        (Some(endpoint), held) => {
            endpoint.set_server_config(Some(endpoint_config.server.clone()));
            (endpoint, held.and_then(|held| held.http))
        }
        (None, Some(held)) => (
            crest_transport::node_endpoint_on(held.quic, &endpoint_config, &spec.settings)?,
            held.http,
        ),
        (None, None) => (
            crest_transport::node_endpoint(spec.listen, &endpoint_config, &spec.settings)?,
            None,
        ),
    };
    let local_addr = endpoint
        .local_addr()
        .map_err(|e| NodeError::Actor(e.to_string()))?;
    // The log writer reports completions to the actor, which exists only after the spawn; no
    // operation can be submitted before the actor runs, so none can complete before this is set.
    let actor_slot: Arc<OnceLock<ActorRef<NodeMsg>>> = Arc::new(OnceLock::new());
    let mut storage_threads = None;
    let queue = spec.settings.wal_queue_ops_max as usize;
    let start_reader = |dir: &PathBuf| {
        let slot = actor_slot.clone();
        storage::start_reader(dir.clone(), queue, move |token, bodies| {
            if let Some(actor) = slot.get() {
                let _ = actor.send_message(NodeMsg::Read { token, bodies });
            }
        })
        .map_err(|error| NodeError::Io {
            path: dir.display().to_string(),
            error,
        })
    };
    let storage: Box<dyn storage::Storage> = match backing {
        Backing::Wal(wal, dir) => {
            let slot = actor_slot.clone();
            let handle = wal.start_timed(move |done, timing| {
                if let Some(actor) = slot.get() {
                    let _ = actor.send_message(NodeMsg::Stored(done, timing));
                }
            })?;
            let (reads, reader) = start_reader(&dir)?;
            storage_threads = Some(StorageThreads {
                wal: Some(handle.clone()),
                reader,
            });
            Box::new(storage::WalStore { handle, reads })
        }
        Backing::Replicated(raft, stager, dir) => {
            let slot = actor_slot.clone();
            let store = replica::ReplicatedStore::start(
                raft,
                stager,
                replica::Gathering::of(&spec.settings),
                replica::Acks::of(&spec.settings),
                move |outcomes| {
                    let completions = outcomes
                        .into_iter()
                        .map(|outcome| match outcome {
                            Ok(done) => (done.token, Ok(done.locations)),
                            Err((token, reason)) => (token, Err(reason)),
                        })
                        .collect();
                    if let Some(actor) = slot.get() {
                        let timing = crest_storage::wal::GroupTiming::default();
                        let _ = actor.send_message(NodeMsg::Stored(completions, timing));
                    }
                },
            )
            .map_err(|error| NodeError::Io {
                path: dir.display().to_string(),
                error,
            })?;
            let (reads, reader) = start_reader(&dir)?;
            storage_threads = Some(StorageThreads { wal: None, reader });
            Box::new(storage::ReplicaStore { store, reads })
        }
        Backing::Memory => Box::new(storage::MemoryStore),
    };
    let args = NodeArgs {
        machine,
        storage,
        admission: admission::Admission::for_node(topology, name, options.access.clone()),
        claim,
    };
    let (actor, actor_task) = Actor::spawn(None, NodeActor, args)
        .await
        .map_err(|e| NodeError::Actor(e.to_string()))?;
    let _ = actor_slot.set(actor.clone());
    let shutdown = CancellationToken::new();
    let link_client = Arc::new(std::sync::RwLock::new(endpoint_config.client.clone()));
    let ctx = NetContext {
        actor: actor.clone(),
        link_client: link_client.clone(),
        settings: spec.settings.clone(),
        next_conn: Arc::new(AtomicU64::new(1)),
        shutdown: shutdown.clone(),
    };
    let http_addr = match spec.http {
        None => None,
        Some(addr) => {
            let listener = http_listener(addr, held_http).await?;
            let bound = listener.local_addr().ok();
            tokio::spawn(http::serve(
                listener,
                http::HttpState::node(
                    actor.clone(),
                    name.to_string(),
                    spec.role.to_string(),
                    log_dir.clone(),
                    http::hosts_of(spec),
                ),
                shutdown.clone(),
            ));
            bound
        }
    };
    if spec.parent.is_some() {
        tokio::spawn(report_ticks(
            actor.clone(),
            Duration::from_millis(spec.settings.report_interval_ms),
            shutdown.clone(),
        ));
    }
    tokio::spawn(net::accept_loop(ctx.clone(), endpoint.clone()));
    let parents = topology.parents_of(spec);
    if !parents.is_empty() {
        // A child of the root tries the roots standing by when it cannot reach it.
        let targets: Vec<net::Target> = parents
            .into_iter()
            .map(|parent| {
                let address = parent.address.clone();
                let address: net::Address = Arc::new(move || address.clone());
                (parent.name.clone(), address)
            })
            .collect();
        tokio::spawn(net::link_loop(
            ctx.clone(),
            endpoint.clone(),
            targets,
            Link::Parent,
        ));
    }
    if spec.role == Role::Root {
        for leaf in topology.direct_leaves() {
            let Some(id) = leaf.leaf_id else { continue };
            let link = Link::Leaf(id);
            // A replicated leaf is served by whichever replica leads its group: the link
            // tries them in turn (the others do not listen).
            let targets: Vec<net::Target> = topology
                .members(leaf.tree_name())
                .into_iter()
                .map(|member| {
                    let (name, fixed) = (member.name.clone(), member.address.clone());
                    let book = options.addresses.clone();
                    let address: net::Address = Arc::new(move || {
                        let learnt = book.as_ref().and_then(|book| {
                            let book = book.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                            book.get(&name).cloned()
                        });
                        learnt.unwrap_or_else(|| fixed.clone())
                    });
                    (member.name.clone(), address)
                })
                .collect();
            let (ctx, endpoint) = (ctx.clone(), endpoint.clone());
            let mut start = options.direct_links_start.clone();
            tokio::spawn(async move {
                // A gate whose sender is gone before opening means the tree did not start.
                if let Some(start) = start.as_mut()
                    && start.wait_for(|open| *open).await.is_err()
                {
                    return;
                }
                net::link_loop(ctx, endpoint, targets, link).await;
            });
        }
    }
    tracing::info!(node = name, role = %spec.role, %local_addr, "node started");
    Ok(NodeHandle {
        storage_threads,
        name: name.to_string(),
        role: spec.role,
        local_addr,
        http_addr,
        actor,
        actor_task,
        endpoint,
        shutdown,
        settings: spec.settings.clone(),
        link_client,
    })
}

/// Asks the actor to report to its parent every `interval`, at most one request waiting.
async fn report_ticks(actor: ActorRef<NodeMsg>, interval: Duration, shutdown: CancellationToken) {
    let pending = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        if !pending.swap(true, std::sync::atomic::Ordering::AcqRel)
            && actor
                .send_message(NodeMsg::ReportTick(pending.clone()))
                .is_err()
        {
            return;
        }
    }
}
