//! Connection tasks: the accept loop, the parent link, and per-connection readers.
//!
//! Every connection gets two writer tasks (control, data; see `crest_transport::stream`), two
//! reader tasks that forward frames to the actor under the connection's permits, and a watcher
//! that reports `Disconnected` when the connection ends for any reason. A reader answers a bad
//! frame itself with an error on the control stream, naming the problem, and reads on.

use crate::actor::{ConnHandle, NodeMsg};
use crest_core::config::Settings;
use crest_core::machine::{ConnId, Link};
use crest_core::wire::Wire;
use crest_transport::stream::{
    FrameReader, Outgoing, ReadEvent, StreamPair, accept_streams, open_streams, spawn_writer,
};
use ractor::ActorRef;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// How long a new connection may take to open its two streams.
const STREAM_SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared by the connection tasks of one node.
#[derive(Clone)]
pub(crate) struct NetContext {
    pub(crate) actor: ActorRef<NodeMsg>,
    /// What this node dials its links with (replaced when its certificates are reloaded).
    pub(crate) link_client: Arc<std::sync::RwLock<quinn::ClientConfig>>,
    pub(crate) settings: Settings,
    pub(crate) next_conn: Arc<AtomicU64>,
    pub(crate) shutdown: CancellationToken,
}

impl NetContext {
    /// Registers a connection with the actor and starts its readers and watcher.
    fn attach(&self, connection: quinn::Connection, streams: StreamPair, link: Link) -> ConnId {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let max = self.settings.frame_bytes_max;
        let capacity = self.settings.connection_send_queue_max as usize;
        let control = spawn_writer(streams.control.0, max, capacity);
        let data = spawn_writer(streams.data.0, max, capacity);
        let handle = ConnHandle {
            control: control.clone(),
            data: data.clone(),
            connection: connection.clone(),
            link,
        };
        if self
            .actor
            .send_message(NodeMsg::Connected { conn, link, handle })
            .is_err()
        {
            connection.close(0u32.into(), b"node stopping");
            return conn;
        }
        let permits = Arc::new(Semaphore::new(
            self.settings.connection_inflight_frames_max as usize,
        ));
        let limits = crest_core::frame::DecodeLimits::of(&self.settings);
        for recv in [streams.control.1, streams.data.1] {
            let reader = FrameReader::with_limits(recv, max, limits);
            tokio::spawn(read_frames(
                self.actor.clone(),
                conn,
                reader,
                permits.clone(),
                (control.clone(), data.clone()),
                connection.clone(),
            ));
        }
        let actor = self.actor.clone();
        tokio::spawn(async move {
            let reason = connection.closed().await;
            tracing::debug!(conn, %reason, "connection closed");
            let silent = matches!(reason, quinn::ConnectionError::TimedOut);
            let _ = actor.send_message(NodeMsg::Disconnected { conn, silent });
        });
        conn
    }
}

async fn read_frames(
    actor: ActorRef<NodeMsg>,
    conn: ConnId,
    mut reader: FrameReader,
    permits: Arc<Semaphore>,
    (control, data): (mpsc::Sender<Outgoing>, mpsc::Sender<Outgoing>),
    connection: quinn::Connection,
) {
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        match reader.next().await {
            Ok(Some(ReadEvent::Frame(msg))) => {
                if actor
                    .send_message(NodeMsg::Frame { conn, msg, permit })
                    .is_err()
                {
                    return;
                }
            }
            Ok(Some(ReadEvent::Bad(error))) => {
                tracing::warn!(conn, %error, "bad frame skipped");
                let reply = Wire::error(error.request(), error.code(), error.to_string());
                // An answer to a request goes where the requester waits for it, the data
                // stream. Best effort: a peer that floods bad frames and never reads loses
                // the answers.
                let to = if reply.is_control() { &control } else { &data };
                let _ = to.try_send(reply.into());
            }
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(conn, %error, "stream ended");
                // Closing a connection that already ended would replace why it ended (a
                // silent peer's time-out, which the link's loop acts on) with our close.
                if connection.close_reason().is_none() {
                    connection.close(2u32.into(), b"stream error");
                }
                return;
            }
        }
    }
}

/// Where nodes of the cluster dialed this one from, as far as it knows: the last
/// `node_connections_max` addresses a connection presenting a node certificate came from. A
/// node dials from the socket it listens on, so a node that comes back (a restart) dials from
/// where it did before.
struct NodeAddresses {
    known: std::collections::HashSet<SocketAddr>,
    order: std::collections::VecDeque<SocketAddr>,
    max: usize,
}

impl NodeAddresses {
    fn contains(&self, address: &SocketAddr) -> bool {
        self.known.contains(address)
    }

    fn insert(&mut self, address: SocketAddr) {
        if self.known.insert(address) {
            self.order.push_back(address);
            while self.order.len() > self.max {
                if let Some(old) = self.order.pop_front() {
                    self.known.remove(&old);
                }
            }
        }
    }
}

/// Accepts connections until shutdown: at most `node_connections_max` at once from peers
/// that presented a node certificate of the cluster, and `connections_max` from the others
/// (producers and consumers), so that idle clients cannot keep the tree's own links out.
/// Handshakes are bounded the same way before anyone is identified: at most
/// `node_connections_max` under way from addresses nodes dialed from before, and
/// `connections_max` from any other, so half-open handshakes from elsewhere cannot keep a
/// node that comes back out. A handshake from a node's address proves the address first (a
/// QUIC retry), so that it cannot be forged to reach the nodes' share. A refused handshake
/// is answered `CONNECTION_REFUSED` (the SDK reports `Overloaded`), a refused connection
/// closed with `Overloaded` naming the budget. A connection that has not said `Hello`
/// within `hello_timeout_ms` is closed.
pub(crate) async fn accept_loop(ctx: NetContext, endpoint: quinn::Endpoint) {
    let clients = Arc::new(Semaphore::new(ctx.settings.connections_max as usize));
    let nodes = Arc::new(Semaphore::new(ctx.settings.node_connections_max as usize));
    let client_handshakes = Arc::new(Semaphore::new(ctx.settings.connections_max as usize));
    let node_handshakes = Arc::new(Semaphore::new(ctx.settings.node_connections_max as usize));
    let node_addresses = Arc::new(std::sync::Mutex::new(NodeAddresses {
        known: Default::default(),
        order: Default::default(),
        max: ctx.settings.node_connections_max as usize,
    }));
    let hello_timeout = Duration::from_millis(ctx.settings.hello_timeout_ms);
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = ctx.shutdown.cancelled() => return,
        };
        let Some(incoming) = incoming else { return };
        let from_node = node_addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&incoming.remote_address());
        if from_node && !incoming.remote_address_validated() {
            if let Err(error) = incoming.retry() {
                error.into_incoming().refuse();
            }
            continue;
        }
        let handshakes = if from_node {
            &node_handshakes
        } else {
            &client_handshakes
        };
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            tracing::warn!(
                from_node,
                "too many handshakes under way; refusing a connection"
            );
            incoming.refuse();
            continue;
        };
        let (ctx, clients, nodes) = (ctx.clone(), clients.clone(), nodes.clone());
        let node_addresses = node_addresses.clone();
        tokio::spawn(async move {
            let setup = async {
                let connection = incoming.await.map_err(|e| e.to_string())?;
                // A client certificate names a principal, not a node: clients' budget.
                let node = connection.peer_identity().is_some()
                    && crest_transport::tls::client_name(&connection).is_none();
                let (budget, name, max) = if node {
                    node_addresses
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(connection.remote_address());
                    (
                        nodes,
                        "node_connections_max",
                        ctx.settings.node_connections_max,
                    )
                } else {
                    (clients, "connections_max", ctx.settings.connections_max)
                };
                let Ok(permit) = budget.try_acquire_owned() else {
                    tracing::warn!(
                        budget = name,
                        "connection budget used up; refusing a connection"
                    );
                    let code = crest_core::wire::ErrorCode::Overloaded;
                    let reason = format!("{code}: {name} reached ({max} connections); retry");
                    connection.close(3u32.into(), reason.as_bytes());
                    return Err(format!("{name} reached"));
                };
                let streams = accept_streams(&connection)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((connection, streams, permit))
            };
            let accepted = tokio::time::timeout(STREAM_SETUP_TIMEOUT, setup).await;
            drop(handshake);
            match accepted {
                Ok(Ok((connection, streams, permit))) => {
                    let conn = ctx.attach(connection.clone(), streams, Link::Incoming);
                    let actor = ctx.actor.clone();
                    tokio::select! {
                        () = tokio::time::sleep(hello_timeout) => {
                            let _ = actor.send_message(NodeMsg::HelloDeadline { conn });
                            connection.closed().await;
                        }
                        _ = connection.closed() => {}
                    }
                    drop(permit);
                }
                Ok(Err(error)) => tracing::debug!(%error, "incoming connection failed"),
                Err(_) => tracing::debug!("incoming connection did not open its streams in time"),
            }
        });
    }
}

/// Where a node is reached, looked up at each attempt (a test's tree learns its nodes'
/// ephemeral ports as they start).
pub(crate) type Address = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// A node to keep a session with: its name (its certificate's) and where it is reached.
pub(crate) type Target = (String, Address);

/// Keeps a session with one of `targets` — this node's parent ([`Link::Parent`]; for a child
/// of the root, the root and then the roots standing by), or a leaf the root links to
/// directly ([`Link::Leaf`]): connect, serve until the connection ends, reconnect; until
/// shutdown. A session that lasted reconnects at once to the same node (it may be back
/// already: a restarted node resets its predecessor's connections at their first packet),
/// except one that went silent or a replicated leaf's, which start with the next target; a
/// failed attempt moves on
/// to the next target, and once every target failed in turn, the next round waits, doubling
/// within the settings.
pub(crate) async fn link_loop(
    ctx: NetContext,
    endpoint: quinn::Endpoint,
    targets: Vec<Target>,
    link: Link,
) {
    let peer = match link {
        Link::Parent => "parent",
        _ => "leaf",
    };
    if targets.is_empty() {
        return;
    }
    let initial = Duration::from_millis(ctx.settings.reconnect_backoff_initial_ms);
    let max = Duration::from_millis(ctx.settings.reconnect_backoff_max_ms);
    let mut backoff = initial;
    let mut current = 0;
    let mut failed_in_turn = 0;
    loop {
        let (name, address) = &targets[current];
        let address = address();
        let attempt = async {
            let addr = resolve(&address).await?;
            // The peer must present a certificate made out to its name in the topology.
            let config = ctx
                .link_client
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone();
            let connection = crest_transport::connect_with(&endpoint, config, addr, name)
                .await
                .map_err(|e| e.to_string())?;
            let streams = open_streams(&connection).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((connection, streams))
        };
        let result = tokio::select! {
            result = attempt => result,
            () = ctx.shutdown.cancelled() => return,
        };
        match result {
            Ok((connection, streams)) => {
                failed_in_turn = 0;
                tracing::info!(peer, %name, %address, "connected");
                let connected_at = tokio::time::Instant::now();
                ctx.attach(connection.clone(), streams, link);
                tokio::select! {
                    biased;
                    () = ctx.shutdown.cancelled() => return,
                    reason = connection.closed() => {
                        // Our own shutdown closes the connection too: not a loss.
                        if ctx.shutdown.is_cancelled() {
                            return;
                        }
                        tracing::warn!(peer, %address, %reason, "connection lost");
                        // A peer that went silent (its host gone or cut off, not restarted:
                        // a restart resets the connection at once) would only be dialed in
                        // vain until `connect_timeout_ms`: the next target goes first.
                        if matches!(reason, quinn::ConnectionError::TimedOut) && targets.len() > 1 {
                            current = (current + 1) % targets.len();
                            backoff = initial;
                            continue;
                        }
                    }
                    () = fail_back(&ctx, &endpoint, &targets[0], current) => {
                        tracing::info!(peer, from = %name, to = %targets[0].0, "going back");
                        connection.close(0u32.into(), b"going back to the root");
                        current = 0;
                        backoff = initial;
                        continue;
                    }
                }
                // A replicated leaf's session ends when its leader is lost: the next leader
                // is another replica, and the lost one may not answer at all (a dial to it
                // waits out `connect_timeout_ms`), so it is tried last.
                if matches!(link, Link::Leaf(_)) && targets.len() > 1 {
                    current = (current + 1) % targets.len();
                }
                if connected_at.elapsed() >= max {
                    backoff = initial;
                    continue;
                }
            }
            Err(error) => {
                tracing::debug!(peer, %name, %address, %error, "cannot connect");
                current = (current + 1) % targets.len();
                failed_in_turn += 1;
                if failed_in_turn < targets.len() {
                    continue;
                }
                failed_in_turn = 0;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = ctx.shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(max);
    }
}

/// Returns once `first` — the root, for a child of the root that went to a root standing by
/// (`current` is not 0) — answers a dial again; tried every `root_fail_back_ms`. Never for a
/// session with the first target itself.
async fn fail_back(ctx: &NetContext, endpoint: &quinn::Endpoint, first: &Target, current: usize) {
    if current == 0 {
        return std::future::pending().await;
    }
    let every = Duration::from_millis(ctx.settings.root_fail_back_ms);
    loop {
        tokio::time::sleep(every).await;
        let (name, address) = first;
        let Ok(addr) = resolve(&address()).await else {
            continue;
        };
        let config = ctx
            .link_client
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Ok(probe) = crest_transport::connect_with(endpoint, config, addr, name).await {
            probe.close(0u32.into(), b"probe: coming back");
            return;
        }
    }
}

/// Resolves `host:port` to one socket address.
pub(crate) async fn resolve(address: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = address.parse() {
        return Ok(addr);
    }
    tokio::net::lookup_host(address)
        .await
        .map_err(|e| format!("resolve {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("resolve {address}: no address"))
}
