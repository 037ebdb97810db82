//! The node actor: a thin driver around one core state machine.
//!
//! It turns mailbox messages into `handle_*` calls, then drains the machine's outputs in the
//! order [`crest_core::machine`] prescribes: storage first, then transmits (handed to the
//! connection's writer task), then closes; finally it re-arms its one timer from
//! `poll_timeout`. No handler awaits disk or network, so the mailbox never stalls.
//!
//! # Bounded mailbox
//! ractor mailboxes are unbounded, so every producer of messages is bounded instead: each
//! connection's readers hold one permit of a per-connection semaphore
//! (`connection_inflight_frames_max`) per frame until the actor has handled it; connection
//! events are bounded by `connections_max`; there is at most one pending timer message per
//! deadline.

use crate::access::{Access, Credential};
use crate::admission::{Admission, Admitted, Refusal};
use crate::storage::{Storage, Submitted};
use crest_core::machine::{ConnId, Link, Machine, NodeStats};
use crest_core::metrics::Report;
use crest_core::time::Time;
use crest_core::wire::{Hello, PeerKind, ReplicaClaim, Wire};
use crest_storage::wal::{Completion, GroupTiming};
use crest_transport::stream::Outgoing;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinHandle;

/// The sending side of a connection, as the actor holds it.
pub(crate) struct ConnHandle {
    pub(crate) control: mpsc::Sender<Outgoing>,
    pub(crate) data: mpsc::Sender<Outgoing>,
    pub(crate) connection: quinn::Connection,
    pub(crate) link: Link,
}

/// Most links listed one by one in `/stats` (the node's own links to its parent and to leaves
/// first, then incoming ones by age); the rest are only counted.
pub(crate) const LINKS_LISTED_MAX: usize = 256;

/// One QUIC connection of a node as its transport sees it (`/stats`, `/metrics`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LinkStats {
    /// The node's number for the connection.
    pub conn: ConnId,
    /// `parent` (this node dialled its parent), `leaf` (the root dialled a leaf for its pop
    /// path) or `incoming` (a child, producer or consumer dialled this node).
    pub kind: &'static str,
    /// The peer's address.
    pub remote: String,
    /// Smoothed round-trip time, µs.
    pub rtt_us: u64,
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Largest packet the path carries now (after MTU discovery), bytes.
    pub mtu_bytes: u16,
    /// Packets sent.
    pub sent_packets: u64,
    /// Packets declared lost.
    pub lost_packets: u64,
    /// Times the congestion controller cut the window.
    pub congestion_events: u64,
}

impl LinkStats {
    fn of(conn: ConnId, handle: &ConnHandle) -> LinkStats {
        let stats = handle.connection.stats();
        LinkStats {
            conn,
            kind: link_kind(handle.link),
            remote: handle.connection.remote_address().to_string(),
            rtt_us: stats.path.rtt.as_micros() as u64,
            cwnd_bytes: stats.path.cwnd,
            mtu_bytes: stats.path.current_mtu,
            sent_packets: stats.path.sent_packets,
            lost_packets: stats.path.lost_packets,
            congestion_events: stats.path.congestion_events,
        }
    }
}

/// The name of a link's kind in `/stats` and `/metrics`.
fn link_kind(link: Link) -> &'static str {
    match link {
        Link::Parent => "parent",
        Link::Leaf(_) => "leaf",
        Link::Incoming => "incoming",
    }
}

/// A node's links: every one summed by kind, the first [`LINKS_LISTED_MAX`] listed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Links {
    /// Listed links: outgoing ones first, then incoming ones, each by connection number.
    pub listed: Vec<LinkStats>,
    /// Links not listed (beyond [`LINKS_LISTED_MAX`]).
    pub omitted: usize,
    /// Per kind: links, packets sent, packets lost, congestion events (all links).
    pub totals: Vec<LinkTotals>,
}

/// The links of one kind, summed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LinkTotals {
    /// See [`LinkStats::kind`].
    pub kind: &'static str,
    /// Open links of this kind.
    pub links: u64,
    /// Packets sent on them.
    pub sent_packets: u64,
    /// Packets lost on them.
    pub lost_packets: u64,
    /// Congestion events on them.
    pub congestion_events: u64,
    /// Largest smoothed round-trip time among them, µs.
    pub rtt_max_us: u64,
}

fn links(conns: &HashMap<ConnId, ConnHandle>) -> Links {
    let mut handles: Vec<(&ConnId, &ConnHandle)> = conns.iter().collect();
    handles.sort_by_key(|(conn, handle)| (handle.link == Link::Incoming, **conn));
    let mut all: Vec<LinkStats> = handles
        .into_iter()
        .map(|(conn, handle)| LinkStats::of(*conn, handle))
        .collect();
    let mut totals: Vec<LinkTotals> = Vec::new();
    for link in &all {
        let index = match totals.iter().position(|t| t.kind == link.kind) {
            Some(index) => index,
            None => {
                totals.push(LinkTotals {
                    kind: link.kind,
                    ..LinkTotals::default()
                });
                totals.len() - 1
            }
        };
        let total = &mut totals[index];
        total.links += 1;
        total.sent_packets += link.sent_packets;
        total.lost_packets += link.lost_packets;
        total.congestion_events += link.congestion_events;
        total.rtt_max_us = total.rtt_max_us.max(link.rtt_us);
    }
    let omitted = all.len().saturating_sub(LINKS_LISTED_MAX);
    all.truncate(LINKS_LISTED_MAX);
    Links {
        listed: all,
        omitted,
        totals,
    }
}

/// Messages of the node actor.
pub(crate) enum NodeMsg {
    /// A connection is ready (its writers exist; its readers start after this message).
    Connected {
        conn: ConnId,
        link: Link,
        handle: ConnHandle,
    },
    /// A connection is gone; `silent`: because its peer went silent (its idle timeout).
    Disconnected { conn: ConnId, silent: bool },
    /// `hello_timeout_ms` passed since an incoming connection opened: closed if it has not
    /// said `Hello` yet.
    HelloDeadline { conn: ConnId },
    /// A message arrived; the permit returns to the connection's reader when handled.
    Frame {
        conn: ConnId,
        msg: Wire,
        permit: OwnedSemaphorePermit,
    },
    /// The machine's timer may be due.
    Tick,
    /// Storage operations finished (from the log writer), and how long their sync took.
    Stored(Vec<Completion>, GroupTiming),
    /// Bodies read from the log (from the log reader).
    Read {
        token: u64,
        bodies: Vec<Result<crest_core::record::MessageBody, String>>,
    },
    /// A new access file (`None`: clients are no longer authenticated): open client
    /// connections get their principal's new grants, or are closed if their credential no
    /// longer stands for anyone.
    Access(Option<Access>),
    /// Report counters.
    Stats(RpcReplyPort<NodeStats>),
    /// The node's QUIC links as the transport sees them.
    Links(RpcReplyPort<Links>),
    /// The subtree's measurements.
    Report(RpcReplyPort<Report>),
    /// Time to send the subtree's report to the parent (`report_interval_ms`). The flag is
    /// set by the sender and cleared here, so at most one tick waits in the mailbox.
    ReportTick(Arc<AtomicBool>),
    /// Where the replica group this node leads stands (a replicated leaf's leader, from its
    /// replica's supervisor), for its reports.
    Group(crest_core::metrics::GroupReport),
}

impl NodeMsg {
    /// The message's kind, for logs.
    fn kind(&self) -> &'static str {
        match self {
            NodeMsg::Connected { .. } => "connected",
            NodeMsg::Disconnected { .. } => "disconnected",
            NodeMsg::HelloDeadline { .. } => "hello deadline",
            NodeMsg::Frame { msg, .. } => msg.name(),
            NodeMsg::Tick => "tick",
            NodeMsg::Stored(..) => "stored",
            NodeMsg::Read { .. } => "read",
            NodeMsg::Access(_) => "access",
            NodeMsg::Stats(_) => "stats",
            NodeMsg::Links(_) => "links",
            NodeMsg::Report(_) => "report",
            NodeMsg::ReportTick(_) => "report tick",
            NodeMsg::Group(_) => "group",
        }
    }
}

/// A handler that runs this long is logged as a warning.
const SLOW_HANDLER: Duration = Duration::from_millis(50);

/// Read-only configuration of the actor (mutable state lives in [`NodeState`]).
pub(crate) struct NodeActor;

/// What the actor starts with.
pub(crate) struct NodeArgs {
    pub(crate) machine: Box<dyn Machine>,
    pub(crate) storage: Box<dyn Storage>,
    pub(crate) admission: Admission,
    /// What its `Hello` upward says when it leads a replica group.
    pub(crate) claim: Option<ReplicaClaim>,
}

/// The actor's state: the machine and the handles it drives.
pub(crate) struct NodeState {
    machine: Box<dyn Machine>,
    storage: Box<dyn Storage>,
    admission: Admission,
    claim: Option<ReplicaClaim>,
    conns: HashMap<ConnId, ConnHandle>,
    /// Incoming connections that have not said `Hello` yet.
    unintroduced: HashSet<ConnId>,
    /// What each authenticated client connection proved, and the principal it stands for.
    credentials: HashMap<ConnId, (Credential, Arc<str>)>,
    /// Connections per principal (`principal_connections_max`).
    per_principal: crest_core::access::Tally,
    /// The armed timer: its deadline and the task that will send `Tick`.
    timer: Option<(Time, JoinHandle<()>)>,
    /// Last time handed to the machine: time never goes backwards.
    last_now: Time,
}

/// Longest the node sleeps on a timer before looking at the clock again.
const TIMER_SLICE_MAX: Duration = Duration::from_secs(1);

impl NodeState {
    fn now(&mut self) -> Time {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.last_now = self.last_now.max(Time(micros));
        self.last_now
    }

    /// Drains every output of the machine until it has nothing more to say.
    fn drive(&mut self, myself: &ActorRef<NodeMsg>) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.machine.poll_storage() {
                progressed = true;
                let now = self.now();
                match self.storage.submit(op) {
                    Submitted::Done(done) => self.machine.handle_storage_done(now, done),
                    Submitted::Failed { token, reason } => {
                        self.machine.handle_storage_failed(now, token, &reason)
                    }
                    Submitted::Read { token, bodies } => {
                        self.machine.handle_storage_read(now, token, bodies)
                    }
                    Submitted::Pending => {}
                }
            }
            while let Some(transmit) = self.machine.poll_transmit() {
                progressed = true;
                self.transmit(transmit.conn, transmit.msg);
            }
            while let Some((conn, reason)) = self.machine.poll_close() {
                progressed = true;
                self.close(conn, &reason);
            }
            if !progressed {
                break;
            }
        }
        // Debug builds (every test) check the machine's invariants after each input.
        if cfg!(debug_assertions) {
            self.machine.check_invariants();
        }
        self.arm_timer(myself);
    }

    fn transmit(&mut self, conn: ConnId, mut msg: Wire) {
        let Some(handle) = self.conns.get(&conn) else {
            return;
        };
        // The machine speaks for the group; which replica it runs on is the driver's to say.
        if let (
            Some(claim),
            Wire::Hello(Hello {
                peer: PeerKind::Node { replica, .. },
                ..
            }),
        ) = (&self.claim, &mut msg)
        {
            *replica = Some(claim.clone());
        }
        let queue = if msg.is_control() {
            &handle.control
        } else {
            &handle.data
        };
        match queue.try_send(msg.into()) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                // The peer does not read fast enough to drain a bounded queue: cut it loose
                // rather than buffer without bound. Its session resets and resynchronises.
                tracing::warn!(conn, "send queue full (connection_send_queue_max); closing");
                self.close(conn, "send queue full");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Answers a peer that failed [`Admission::check`] and closes its connection (the close
    /// carries the reason too, in case the answer does not get out first).
    fn refuse(&mut self, conn: ConnId, refusal: Refusal) {
        tracing::warn!(conn, code = %refusal.code, reason = %refusal.text, "peer refused");
        let text = format!("{}: {}", refusal.code, refusal.text);
        self.transmit(conn, Wire::error(None, refusal.code, refusal.text));
        self.close(conn, &text);
    }

    /// Counts an authenticated client's connection against its principal's
    /// `principal_connections_max` and hands its principal to the machine, or says why not.
    fn admit_client(
        &mut self,
        conn: ConnId,
        credential: Credential,
        principal: crest_core::access::Principal,
    ) -> Result<(), Refusal> {
        let max = self.admission.principal_connections_max;
        if !self.per_principal.take(Some(&principal.name), max) {
            return Err(Refusal {
                code: crest_core::wire::ErrorCode::Overloaded,
                text: format!(
                    "principal {:?} holds {max} connections to this node already (principal_connections_max)",
                    principal.name
                ),
            });
        }
        tracing::debug!(conn, principal = %principal.name, "client authenticated");
        self.credentials
            .insert(conn, (credential, principal.name.clone()));
        self.machine.handle_principal(conn, Arc::new(principal));
        Ok(())
    }

    /// Stops counting `conn` as its principal's (it closed, or its credential was revoked).
    fn forget_client(&mut self, conn: ConnId) {
        if let Some((_, name)) = self.credentials.remove(&conn) {
            self.per_principal.give(Some(&name));
        }
    }

    /// Applies a new access file to the open client connections (see [`NodeMsg::Access`]).
    fn reload_access(&mut self, access: Option<Access>) {
        let mut refused = Vec::new();
        for (conn, (credential, _)) in &self.credentials {
            let principal = match &access {
                None => Ok(crest_core::access::Principal::anonymous()),
                Some(access) => access.resolve(credential),
            };
            match principal {
                Ok(principal) => self.machine.handle_principal(*conn, Arc::new(principal)),
                Err(text) => refused.push((*conn, text)),
            }
        }
        for (conn, text) in refused {
            self.forget_client(conn);
            // Nothing more is granted to what it sends before the close lands.
            let nobody = crest_core::access::Principal {
                name: "revoked".into(),
                grants: crest_core::access::Grants::default(),
                receipt_key: None,
            };
            self.machine.handle_principal(conn, Arc::new(nobody));
            let code = crest_core::wire::ErrorCode::Unauthenticated;
            self.refuse(conn, Refusal { code, text });
        }
        self.admission.access = access;
    }

    fn close(&mut self, conn: ConnId, reason: &str) {
        if let Some(handle) = self.conns.get(&conn) {
            handle.connection.close(1u32.into(), reason.as_bytes());
        }
    }

    fn arm_timer(&mut self, myself: &ActorRef<NodeMsg>) {
        let Some(deadline) = self.machine.poll_timeout() else {
            return;
        };
        if let Some((armed, task)) = &self.timer {
            if *armed <= deadline && !task.is_finished() {
                return;
            }
            task.abort();
        }
        // Deadlines are wall-clock times (a delayed message may wait for days); sleeping in
        // slices re-reads the clock, so a corrected system clock is followed within a slice.
        let delay =
            Duration::from_micros(deadline.0.saturating_sub(self.now().0)).min(TIMER_SLICE_MAX);
        let actor = myself.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = actor.send_message(NodeMsg::Tick);
        });
        self.timer = Some((deadline, task));
    }
}

impl Actor for NodeActor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<NodeMsg>,
        args: NodeArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        Ok(NodeState {
            machine: args.machine,
            storage: args.storage,
            admission: args.admission,
            claim: args.claim,
            conns: HashMap::new(),
            unintroduced: HashSet::new(),
            credentials: HashMap::new(),
            per_principal: Default::default(),
            timer: None,
            last_now: Time::ZERO,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<NodeMsg>,
        message: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.now();
        let started = std::time::Instant::now();
        let kind = message.kind();
        match message {
            NodeMsg::Connected { conn, link, handle } => {
                if link == Link::Incoming {
                    state.unintroduced.insert(conn);
                }
                state.conns.insert(conn, handle);
                state.machine.handle_connected(now, conn, link);
            }
            NodeMsg::HelloDeadline { conn } => {
                if state.unintroduced.remove(&conn) {
                    tracing::debug!(conn, "no Hello in time; closing");
                    state.close(conn, "no Hello within hello_timeout_ms");
                }
            }
            NodeMsg::Disconnected { conn, silent } => {
                state.unintroduced.remove(&conn);
                state.forget_client(conn);
                if state.conns.remove(&conn).is_some() {
                    if silent {
                        state.machine.handle_went_silent(now, conn);
                    } else {
                        state.machine.handle_disconnected(now, conn);
                    }
                }
            }
            NodeMsg::Frame { conn, msg, permit } => {
                if let Some(handle) = state.conns.get(&conn) {
                    match state.admission.check(&handle.connection, handle.link, &msg) {
                        Ok(admitted) => {
                            // Only a connection's first `Hello` proves who it is; the machine
                            // refuses any later one.
                            let first_hello =
                                matches!(msg, Wire::Hello(_)) && state.unintroduced.remove(&conn);
                            if let (true, Admitted::Client(credential, principal)) =
                                (first_hello, admitted)
                                && let Err(refusal) =
                                    state.admit_client(conn, credential, principal)
                            {
                                state.refuse(conn, refusal);
                            } else {
                                state.machine.handle_message(now, conn, msg);
                            }
                        }
                        Err(refusal) => state.refuse(conn, refusal),
                    }
                }
                drop(permit);
            }
            NodeMsg::Tick => {
                if state
                    .timer
                    .as_ref()
                    .is_some_and(|(deadline, _)| *deadline <= now)
                {
                    state.timer = None;
                }
                if state
                    .machine
                    .poll_timeout()
                    .is_some_and(|deadline| deadline <= now)
                {
                    state.machine.handle_timeout(now);
                }
            }
            NodeMsg::Stored(completions, timing) => {
                if let Some(sync) = timing.sync {
                    state.machine.handle_storage_synced(now, sync);
                }
                for (token, result) in completions {
                    match result {
                        Ok(locations) => state.machine.handle_storage_done(
                            now,
                            crest_core::machine::StorageDone { token, locations },
                        ),
                        Err(reason) => state.machine.handle_storage_failed(now, token, &reason),
                    }
                }
            }
            NodeMsg::Read { token, bodies } => {
                state.machine.handle_storage_read(now, token, bodies)
            }
            NodeMsg::Access(access) => state.reload_access(access),
            NodeMsg::Stats(reply) => {
                let _ = reply.send(state.machine.stats());
            }
            NodeMsg::Links(reply) => {
                let _ = reply.send(links(&state.conns));
            }
            NodeMsg::Report(reply) => {
                let mut report = state.machine.report(now);
                report.totals = state.machine.histogram_totals();
                let _ = reply.send(report);
            }
            NodeMsg::ReportTick(pending) => {
                pending.store(false, Ordering::Release);
                state.machine.report_tick(now);
            }
            NodeMsg::Group(group) => state.machine.set_group(Some(group)),
        }
        state.drive(&myself);
        // A handler runs on a runtime worker without yielding: one this slow starves the tasks
        // queued behind it on that worker (connection drivers included).
        let elapsed = started.elapsed();
        if elapsed >= SLOW_HANDLER {
            tracing::warn!(kind, ?elapsed, "slow actor handler");
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<NodeMsg>,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((_, task)) = state.timer.take() {
            task.abort();
        }
        Ok(())
    }
}
