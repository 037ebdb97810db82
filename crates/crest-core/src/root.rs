//! The root state machine: holds the global candidate window and serves consumers.
//!
//! # Contract
//! Implements [`Machine`]; see [`crate::machine`] for the polling order and time rules.
//!
//! # Pop
//! A pop waits in its topic's FIFO queue. Serving a topic walks its queue in order; each pop
//! takes the most urgent entries of the window while the entry is *certain* (more urgent than
//! every child's frontier, see [`crate::window`]). When the best entry is not certain (a
//! child's window is being refilled), the pop waits until it is, or until `pop_order_wait_ms`
//! after the pop arrived, whichever is first. Taken entries leave the window at once (so no
//! other pop takes them) and a `Reserve` goes to their leaf. The pop is answered when no
//! reserve is outstanding and it holds at least one delivery, or when its long-poll wait ends.
//! Grants for a pop that is gone (consumer disconnected) are released at once.
//!
//! A pop may carry a priority filter (`max_priority`): it then takes only entries at most that
//! priority. Since the window is ordered by priority first, a filtered pop whose best entry is
//! over its filter takes nothing and waits; it never blocks the pops queued behind it.
//!
//! # Settle (ack, nack, extend)
//! Receipts are grouped by owning leaf; each group travels as one `Confirm` carrying the
//! operation, and the consumer gets one result per receipt once every leaf answered (or its
//! route failed).
//!
//! # Admin
//! Dead-letter and stats operations fan out as `LeafAdmin` to every leaf concerned (the leaves
//! owning the named ids, or every leaf of the tree); the answers are merged, and leaves that
//! cannot be reached are named in the reply.

use crate::ahead::{AheadBuffer, Held};
use crate::config::{FRAME_OVERHEAD_BYTES, Settings};
use crate::downstream::{Downstream, PeerKindTag, Topic, TopicMap, TopicSet};
use crate::id::{LeafId, Receipt};
use crate::key::Key;
use crate::machine::{ConnId, Link, Machine, NodeStats, Transmit};
use crate::metrics::{Metric, OwnReport, Report, Reporter, named};
use crate::time::Time;
use crate::validate::validate_topic;
use crate::window::{Slot, Window};
use crate::wire::{
    Ack, AckReply, Admin, AdminOp, AdminReply, AdminResult, Confirm, Confirmed, Delivery,
    ErrorCode, LeafAdmin, LeafAdminReply, Pop, PopReply, ReceiptError, Release, Reserve,
    ReserveItem, Reserved, Role, Settle, Stats, Wire,
};
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// How a root is set up.
#[derive(Clone, Debug)]
pub struct RootConfig {
    /// The root's name in the topology.
    pub name: String,
    /// Bounds and timings.
    pub settings: Settings,
    /// Every leaf in the tree, per the topology.
    pub subtree: Vec<LeafId>,
}

#[derive(Debug)]
struct PendingPop {
    conn: ConnId,
    request: u64,
    topic: Topic,
    max: usize,
    max_priority: u32,
    lease_ms: u64,
    /// End of the long-poll wait.
    deadline: Time,
    /// Until when the pop waits for uncertain entries to become certain.
    order_deadline: Time,
    /// Payload bytes taken so far (bounded so the reply fits in a frame).
    bytes: u64,
    outstanding: usize,
    deliveries: Vec<(Key, Delivery)>,
    /// Whether it holds deliveries from the reserve-ahead buffer: it is then answered with
    /// them rather than wait a round trip for more.
    from_ahead: bool,
    /// Whether a grant of its own reservations came back: it then takes nothing more and is
    /// answered once its outstanding reserves are, so a steady trickle of arrivals cannot keep
    /// a pop gathering until it is full (its latency would be the time to fill `max`).
    granted: bool,
    /// When the pop arrived.
    arrived: Time,
}

/// Reservations waiting for their leaf's answer, by number.
#[derive(Debug, Default)]
struct Reservations {
    by_number: HashMap<u64, Reservation>,
    next: u64,
}

impl Reservations {
    /// Registers a reservation of `key` (its window slot `slot`) sent on `at.conn` at
    /// `at.now`; returns its number.
    fn add(&mut self, purpose: ReservedFor, topic: &Topic, key: Key, slot: Slot, at: Sent) -> u64 {
        self.next += 1;
        let reservation = Reservation {
            purpose,
            topic: topic.clone(),
            key,
            conn: at.conn,
            size: slot.size,
            lease_ms: at.lease_ms,
            sent: at.now,
        };
        self.by_number.insert(self.next, reservation);
        self.next
    }
}

impl std::ops::Deref for Reservations {
    type Target = HashMap<u64, Reservation>;
    fn deref(&self) -> &Self::Target {
        &self.by_number
    }
}

impl std::ops::DerefMut for Reservations {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.by_number
    }
}

/// One `Reserve` per (child, leaf) group, each carrying the last offer of `topic` applied from
/// that child (see [`Reserve::offer_seq`]). A leaf with a direct link gets its reserve there,
/// numbered 0 (its parent did not take the entries: the leaf retracts them from it, so a
/// re-offer in flight cannot leave a ghost), and the child gets the same items as a notice
/// ([`Reserve::direct`]): it takes them from its window and refills at once.
fn reserves(
    topic: &Topic,
    lease_ms: u64,
    groups: BTreeMap<(ConnId, LeafId), Vec<ReserveItem>>,
    window: Option<&Window>,
    direct: &DirectLinks,
) -> impl Iterator<Item = Transmit> {
    groups.into_iter().flat_map(move |((child, leaf), items)| {
        let reserve = |items, offer_seq, direct| {
            Wire::Reserve(Reserve {
                leaf,
                topic: topic.to_string(),
                lease_ms,
                items,
                offer_seq,
                direct,
            })
        };
        let applied = window.map_or(0, |window| window.applied(child));
        let link = direct.by_leaf.get(&leaf).copied();
        let notice = link.map(|_| Transmit {
            conn: child,
            msg: reserve(items.clone(), applied, true),
        });
        let to_leaf = Transmit {
            conn: link.unwrap_or(child),
            msg: reserve(items, if link.is_some() { 0 } else { applied }, false),
        };
        notice.into_iter().chain(std::iter::once(to_leaf))
    })
}

/// The numbers of `map`'s entries that satisfy `keep`, in order: answers produced from them go
/// out in an order that does not depend on hashing (the simulator's runs are reproducible).
fn sorted_where<V>(map: &HashMap<u64, V>, keep: impl Fn(&V) -> bool) -> Vec<u64> {
    let mut numbers: Vec<u64> = map
        .iter()
        .filter(|(_, value)| keep(value))
        .map(|(number, _)| *number)
        .collect();
    numbers.sort_unstable();
    numbers
}

/// When a reserve is sent, on which connection, and the visibility timeout it asks for.
#[derive(Debug, Clone, Copy)]
struct Sent {
    now: Time,
    conn: ConnId,
    lease_ms: u64,
}

/// The root's direct links to leaves ([`Link::Leaf`], setting `direct_pop_path`): reserves,
/// settles and admin requests for a leaf go on its link once the leaf welcomed it, and through
/// the aggregators otherwise.
#[derive(Debug, Default)]
struct DirectLinks {
    /// Every direct connection: the leaf it reaches.
    conns: HashMap<ConnId, LeafId>,
    /// Welcomed links by leaf.
    by_leaf: HashMap<LeafId, ConnId>,
}

impl DirectLinks {
    /// The connection a message for `leaf` goes on: its direct link, else `child` (the child
    /// that leads to it).
    fn or(&self, leaf: LeafId, child: ConnId) -> ConnId {
        self.by_leaf.get(&leaf).copied().unwrap_or(child)
    }
}

/// Where a pop's next entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The window: it must be reserved.
    Window,
    /// The reserve-ahead buffer: granted already.
    Buffer,
    /// A reserve-ahead grant on its way (its reservation number).
    Awaited(u64),
}

/// Who a reservation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReservedFor {
    /// A waiting pop.
    Pop(u64),
    /// The topic's reserve-ahead buffer.
    Ahead,
}

#[derive(Debug)]
struct Reservation {
    purpose: ReservedFor,
    topic: Topic,
    /// The entry reserved.
    key: Key,
    /// The connection the reserve went on (a child, or a direct link).
    conn: ConnId,
    /// Payload size of the entry (reserve-ahead bytes are counted from the reserve on).
    size: u32,
    /// The visibility timeout the reserve asked for, in milliseconds.
    lease_ms: u64,
    /// When the reserve was sent.
    sent: Time,
}

#[derive(Debug, Default, Clone, Copy)]
struct RootCounters {
    pops: u64,
    empty_pops: u64,
    deliveries: u64,
    reserves: u64,
    reserves_denied: u64,
    settle_requests: u64,
    admin_requests: u64,
    offers_received: u64,
    /// Entries reserved for the reserve-ahead buffers.
    reserved_ahead: u64,
    /// Deliveries served from them.
    ahead_hits: u64,
    /// Entries given back unused after `reserve_ahead_hold_ms`.
    ahead_released: u64,
    /// Buffered grants dropped because their leaf offered the entry again.
    ahead_revoked: u64,
}

#[derive(Debug)]
struct PendingConfirm {
    ack: u64,
    /// The connection the `Confirm` went on.
    conn: ConnId,
    slots: Vec<usize>,
}

#[derive(Debug)]
struct PendingAdmin {
    conn: ConnId,
    request: u64,
    /// Most dead letters to return (for a listing).
    limit: usize,
    outstanding: usize,
    result: AdminResult,
    unreachable: Vec<LeafId>,
}

#[derive(Debug)]
struct PendingLeafAdmin {
    admin: u64,
    /// The connection the `LeafAdmin` went on.
    conn: ConnId,
    leaf: LeafId,
}

#[derive(Debug)]
struct PendingAck {
    conn: ConnId,
    request: u64,
    results: Vec<Option<Result<(), ReceiptError>>>,
    outstanding: usize,
}

/// See the module doc.
pub struct Root {
    settings: Settings,
    children: Downstream,
    waiting: TopicMap<VecDeque<u64>>,
    pops: HashMap<u64, PendingPop>,
    next_pop: u64,
    reservations: Reservations,
    confirms: HashMap<u64, PendingConfirm>,
    acks: HashMap<u64, PendingAck>,
    admins: HashMap<u64, PendingAdmin>,
    leaf_admins: HashMap<u64, PendingLeafAdmin>,
    next_tag: u64,
    timers: BTreeSet<(Time, u64)>,
    dirty: TopicSet,
    transmits: VecDeque<Transmit>,
    closes: VecDeque<(ConnId, String)>,
    violations: u64,
    name: String,
    reporter: Reporter,
    counters: RootCounters,
    /// Direct links to leaves.
    direct: DirectLinks,
    /// Reserve-ahead buffers by topic (see [`crate::ahead`]).
    ahead: TopicMap<AheadBuffer>,
    /// Payload bytes held or expected in all reserve-ahead buffers.
    ahead_bytes: u64,
    /// When each held entry is given back: `(deadline, key, topic)`.
    ahead_expiry: BTreeSet<(Time, Key, Topic)>,
    /// Smoothed reserve round trip, in microseconds (sizes the reserve-ahead buffers).
    round_trip_us: u64,
    /// Buffered grants whose leaf became unreachable (its child's session ended): not
    /// delivered — an ack could not reach the leaf —, and given back once the leaf is
    /// reachable again. Bounded: the oldest are forgotten past `PARKED_PER_AHEAD_MAX ×
    /// reserve_ahead_max` (their leases then expire at the leaf).
    parked: VecDeque<(LeafId, Receipt)>,
}

/// See [`Root::parked`].
const PARKED_PER_AHEAD_MAX: usize = 16;

impl Root {
    /// Creates a root with no children connected.
    pub fn new(config: RootConfig) -> Root {
        let name = config.name.clone();
        let reporter = Reporter::new(&config.settings);
        let children = Downstream::new(
            config.name,
            Role::Root,
            config.settings.clone(),
            config.subtree,
        );
        Root {
            settings: config.settings,
            children,
            waiting: Default::default(),
            pops: HashMap::default(),
            next_pop: 1,
            reservations: Reservations::default(),
            confirms: HashMap::default(),
            acks: HashMap::default(),
            admins: HashMap::default(),
            leaf_admins: HashMap::default(),
            next_tag: 1,
            timers: BTreeSet::new(),
            dirty: Default::default(),
            transmits: VecDeque::new(),
            closes: VecDeque::new(),
            violations: 0,
            name,
            reporter,
            counters: RootCounters::default(),
            direct: DirectLinks::default(),
            ahead: Default::default(),
            ahead_bytes: 0,
            ahead_expiry: BTreeSet::new(),
            round_trip_us: 1_000,
            parked: VecDeque::new(),
        }
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.transmits.push_back(Transmit { conn, msg });
    }

    /// The connection that reaches `leaf`: its direct link if welcomed, else the child that
    /// leads to it.
    fn route(&self, leaf: LeafId) -> Result<ConnId, ReceiptError> {
        match self.direct.by_leaf.get(&leaf) {
            Some(conn) => Ok(*conn),
            None => self.children.route(leaf),
        }
    }

    fn validate_pop(&self, pop: &Pop) -> Result<(), (ErrorCode, String)> {
        let s = &self.settings;
        validate_topic(s, &pop.topic).map_err(|why| (ErrorCode::InvalidArgument, why))?;
        if pop.max == 0 || pop.max > s.pop_messages_max {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "max {} is outside 1..={} (pop_messages_max)",
                    pop.max, s.pop_messages_max
                ),
            ));
        }
        if pop.wait_ms > s.pop_wait_max_ms {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "wait of {} ms exceeds pop_wait_max_ms {}",
                    pop.wait_ms, s.pop_wait_max_ms
                ),
            ));
        }
        if let Some(lease_ms) = pop.lease_ms
            && (lease_ms == 0 || lease_ms > s.lease_timeout_max_ms)
        {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "visibility timeout of {lease_ms} ms is outside 1..={} (lease_timeout_max_ms)",
                    s.lease_timeout_max_ms
                ),
            ));
        }
        if self.pops.len() >= s.root_pending_pops_max as usize {
            return Err((
                ErrorCode::Overloaded,
                "too many pops waiting at the root; retry".into(),
            ));
        }
        Ok(())
    }

    fn handle_pop(&mut self, now: Time, conn: ConnId, pop: Pop) {
        if let Err((code, message)) = self.validate_pop(&pop) {
            self.send(conn, Wire::error(Some(pop.request), code, message));
            return;
        }
        let id = self.next_pop;
        self.next_pop += 1;
        let topic = self.children.topic(&pop.topic);
        let pending = PendingPop {
            conn,
            request: pop.request,
            topic: topic.clone(),
            max: pop.max as usize,
            max_priority: pop.max_priority.unwrap_or(u32::MAX),
            lease_ms: pop
                .lease_ms
                .unwrap_or(self.settings.topic_policy(&pop.topic).lease_timeout_ms),
            deadline: now + Duration::from_millis(pop.wait_ms),
            order_deadline: now + Duration::from_millis(self.settings.pop_order_wait_ms),
            bytes: 0,
            outstanding: 0,
            deliveries: Vec::new(),
            from_ahead: false,
            granted: false,
            arrived: now,
        };
        self.counters.pops += 1;
        self.timers.insert((pending.deadline, id));
        self.timers.insert((pending.order_deadline, id));
        self.pops.insert(id, pending);
        self.waiting.entry(topic.clone()).or_default().push_back(id);
        self.dirty.insert(topic);
    }

    /// Hands entries to the waiting pops of `topic` in key order — from the window (a reserve
    /// to the leaf) or from the reserve-ahead buffer (granted already) —, answers finished
    /// pops, then tops the buffer up.
    fn serve(&mut self, now: Time, topic: &Topic) {
        let queue: Vec<u64> = self
            .waiting
            .get(topic)
            .map(|queue| queue.iter().copied().collect())
            .unwrap_or_default();
        let budget = u64::from(self.settings.frame_bytes_max - FRAME_OVERHEAD_BYTES);
        let per_delivery =
            u64::from(self.settings.metadata_bytes_max + self.settings.topic_bytes_max) + 128;
        for &pop_id in &queue {
            let pop = self.pops.get_mut(&pop_id).expect("queued pops exist");
            let mut window = self.children.windows.get_mut(topic);
            let mut buffer = self.ahead.get_mut(topic);
            // Entries taken from the window for this pop, grouped by the child and leaf they
            // go to; buffered deliveries whose lease must be extended to the pop's, by leaf.
            let mut groups: BTreeMap<(ConnId, LeafId), Vec<ReserveItem>> = BTreeMap::new();
            let mut extends: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
            while !pop.granted && pop.deliveries.len() + pop.outstanding < pop.max {
                let in_window = window.as_ref().and_then(|window| window.first());
                let in_buffer = buffer.as_ref().and_then(|buffer| buffer.first());
                let awaited = buffer.as_ref().and_then(|buffer| buffer.first_awaited());
                // The most urgent of the window, the buffer and the grants on their way.
                let mut next = in_window.map(|(key, _)| (key, Source::Window));
                for candidate in [
                    in_buffer.map(|key| (key, Source::Buffer)),
                    awaited.map(|(key, reservation)| (key, Source::Awaited(reservation))),
                ]
                .into_iter()
                .flatten()
                {
                    if next.is_none_or(|(best, _)| candidate.0 < best) {
                        next = Some(candidate);
                    }
                }
                let Some((key, source)) = next else {
                    break;
                };
                if key.priority > pop.max_priority {
                    break;
                }
                let certain = window.as_ref().is_none_or(|window| window.is_certain(&key));
                if !certain && now < pop.order_deadline {
                    break;
                }
                let taken = pop.deliveries.len() + pop.outstanding;
                if let Source::Awaited(reservation) = source {
                    // Its grant is on its way: the pop claims the reservation and waits for it
                    // like one of its own reserves (never passing over it).
                    let ahead = self
                        .reservations
                        .get_mut(&reservation)
                        .expect("outstanding");
                    let cost = u64::from(ahead.size) + per_delivery;
                    if taken > 0 && pop.bytes + cost > budget {
                        break;
                    }
                    ahead.purpose = ReservedFor::Pop(pop_id);
                    self.ahead_bytes -= u64::from(ahead.size);
                    let buffer = buffer.as_mut().expect("picked from it");
                    buffer.outstanding.remove(&key);
                    pop.bytes += cost;
                    pop.outstanding += 1;
                    continue;
                }
                let from_buffer = source == Source::Buffer;
                if from_buffer {
                    let buffer = buffer.as_mut().expect("picked from it");
                    let size = buffer.held[&key].delivery.payload.len() as u64;
                    let cost = size + per_delivery;
                    if taken > 0 && pop.bytes + cost > budget {
                        break;
                    }
                    let mut held = buffer.held.remove(&key).expect("picked from it");
                    self.ahead_bytes -= size;
                    let expiry = held.reserved_at
                        + Duration::from_millis(self.settings.reserve_ahead_hold_ms);
                    self.ahead_expiry.remove(&(expiry, key, topic.clone()));
                    if held.lease_ms != pop.lease_ms {
                        held.delivery.lease_deadline = now + Duration::from_millis(pop.lease_ms);
                        extends
                            .entry(key.id.leaf())
                            .or_default()
                            .push(held.delivery.receipt());
                    }
                    pop.bytes += cost;
                    pop.deliveries.push((key, held.delivery));
                    pop.from_ahead = true;
                    self.counters.ahead_hits += 1;
                    continue;
                }
                // Answer with what the buffer gave rather than wait a round trip for more —
                // everything taken is more urgent than this entry, so the order holds —, once
                // the buffer filled at least half the pop (a buffer smaller than the demand
                // must not shrink every batch).
                if pop.from_ahead && pop.deliveries.len() * 2 >= pop.max {
                    break;
                }
                let window = window.as_mut().expect("picked from it");
                let (_, slot) = in_window.expect("picked from it");
                let cost = u64::from(slot.size) + per_delivery;
                if taken > 0 && pop.bytes + cost > budget {
                    break;
                }
                window.take(&key);
                pop.bytes += cost;
                pop.outstanding += 1;
                let purpose = ReservedFor::Pop(pop_id);
                let sent = Sent {
                    now,
                    conn: self.direct.or(key.id.leaf(), slot.child),
                    lease_ms: pop.lease_ms,
                };
                let reservation = self.reservations.add(purpose, topic, key, slot, sent);
                groups
                    .entry((slot.child, key.id.leaf()))
                    .or_default()
                    .push(ReserveItem { reservation, key });
            }
            let lease_ms = pop.lease_ms;
            let window = window.as_deref();
            self.counters.reserves += groups.len() as u64;
            self.transmits
                .extend(reserves(topic, lease_ms, groups, window, &self.direct));
            for (leaf, receipts) in extends {
                self.extend_unanswered(leaf, receipts, lease_ms);
            }
        }
        for pop_id in queue {
            let pop = &self.pops[&pop_id];
            if pop.outstanding == 0 && (!pop.deliveries.is_empty() || now >= pop.deadline) {
                self.answer_pop(now, pop_id);
            }
        }
        self.top_up(now, topic);
    }

    /// Moves the visibility timeout of buffered deliveries handed to a pop that asked for
    /// another one. Nobody waits for the answer: a refused extend shows on the consumer's ack.
    fn extend_unanswered(&mut self, leaf: LeafId, receipts: Vec<Receipt>, lease_ms: u64) {
        let Ok(child) = self.route(leaf) else {
            return;
        };
        // A tag the root never registers: the leaf's `Confirmed` is dropped on arrival.
        let tag = self.next_tag;
        self.next_tag += 1;
        self.send(
            child,
            Wire::Confirm(Confirm {
                tag,
                leaf,
                op: Settle::Extend { lease_ms },
                receipts,
            }),
        );
    }

    /// Reserves the topic's next certain entries into its reserve-ahead buffer, up to what
    /// recent demand asks for (see [`crate::ahead`]).
    fn top_up(&mut self, now: Time, topic: &Topic) {
        let s = &self.settings;
        let lease_ms = s.topic_policy(topic).lease_timeout_ms;
        // A topic whose leases are short gets none: a held entry must leave its consumer most
        // of its lease.
        if s.reserve_ahead_max == 0 || lease_ms < s.reserve_ahead_hold_ms.saturating_mul(2) {
            return;
        }
        let (Some(buffer), Some(window)) = (
            self.ahead.get_mut(topic),
            self.children.windows.get_mut(topic),
        ) else {
            return;
        };
        buffer.demand.roll(now);
        let target = buffer
            .demand
            .target(self.round_trip_us, s.reserve_ahead_max);
        let mut groups: BTreeMap<(ConnId, LeafId), Vec<ReserveItem>> = BTreeMap::new();
        while buffer.len() < target {
            let Some((key, slot)) = window.first() else {
                break;
            };
            if !window.is_certain(&key)
                || self.ahead_bytes + u64::from(slot.size) > s.reserve_ahead_bytes_max
            {
                break;
            }
            window.take(&key);
            self.ahead_bytes += u64::from(slot.size);
            let sent = Sent {
                now,
                conn: self.direct.or(key.id.leaf(), slot.child),
                lease_ms,
            };
            let reservation = self
                .reservations
                .add(ReservedFor::Ahead, topic, key, slot, sent);
            buffer.outstanding.insert(key, reservation);
            groups
                .entry((slot.child, key.id.leaf()))
                .or_default()
                .push(ReserveItem { reservation, key });
        }
        self.counters.reserves += groups.len() as u64;
        self.counters.reserved_ahead +=
            groups.values().map(|items| items.len() as u64).sum::<u64>();
        self.transmits.extend(reserves(
            topic,
            lease_ms,
            groups,
            Some(window),
            &self.direct,
        ));
    }

    /// Moves buffered grants whose leaf has no route any more to [`Root::parked`].
    fn park_unreachable(&mut self) {
        let hold = Duration::from_millis(self.settings.reserve_ahead_hold_ms);
        for (topic, buffer) in self.ahead.iter_mut() {
            let unreachable: Vec<Key> = buffer
                .held
                .keys()
                .filter(|key| {
                    let leaf = key.id.leaf();
                    !self.direct.by_leaf.contains_key(&leaf) && self.children.route(leaf).is_err()
                })
                .copied()
                .collect();
            for key in unreachable {
                let held = buffer.held.remove(&key).expect("listed");
                self.ahead_bytes -= held.delivery.payload.len() as u64;
                self.ahead_expiry
                    .remove(&(held.reserved_at + hold, key, topic.clone()));
                self.parked
                    .push_back((key.id.leaf(), held.delivery.receipt()));
            }
        }
        let bound = PARKED_PER_AHEAD_MAX * self.settings.reserve_ahead_max.max(1) as usize;
        while self.parked.len() > bound {
            self.parked.pop_front();
        }
    }

    /// Gives parked grants back to their leaves that are reachable again.
    fn release_parked(&mut self) {
        let mut by_leaf: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        let (children, direct) = (&self.children, &self.direct);
        self.parked.retain(|(leaf, receipt)| {
            if !direct.by_leaf.contains_key(leaf) && children.route(*leaf).is_err() {
                return true;
            }
            by_leaf.entry(*leaf).or_default().push(*receipt);
            false
        });
        for (leaf, receipts) in by_leaf {
            self.counters.ahead_released += receipts.len() as u64;
            if let Ok(child) = self.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
        }
    }

    /// Gives back buffered entries held for `reserve_ahead_hold_ms` (available again at their
    /// leaf, attempt returned).
    fn release_stale_ahead(&mut self, now: Time) {
        let mut by_leaf: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        while let Some((at, _, _)) = self.ahead_expiry.first() {
            if *at > now {
                break;
            }
            let (_, key, topic) = self.ahead_expiry.pop_first().expect("present");
            let Some(buffer) = self.ahead.get_mut(&topic) else {
                continue;
            };
            if let Some(held) = buffer.held.remove(&key) {
                // Held unused for the whole hold time: the demand that asked for it is gone,
                // and refilling now would only lease and release again.
                buffer.demand.reset();
                self.ahead_bytes -= held.delivery.payload.len() as u64;
                self.counters.ahead_released += 1;
                by_leaf
                    .entry(key.id.leaf())
                    .or_default()
                    .push(held.delivery.receipt());
            }
            self.dirty.insert(topic);
        }
        for (leaf, receipts) in by_leaf {
            if let Ok(child) = self.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
        }
    }

    fn answer_pop(&mut self, now: Time, pop_id: u64) {
        let pop = self.pops.remove(&pop_id).expect("pop exists");
        if pop.deliveries.is_empty() {
            self.counters.empty_pops += 1;
        } else {
            self.counters.deliveries += pop.deliveries.len() as u64;
            if self.settings.reserve_ahead_max > 0 {
                self.ahead
                    .entry(pop.topic.clone())
                    .or_default()
                    .demand
                    .taken(now, pop.deliveries.len() as u64);
            }
            let recorder = &mut self.reporter.recorder;
            recorder.record_since(now, Metric::Pop, pop.arrived);
            recorder.record(now, Metric::PopBatch, pop.deliveries.len() as u64);
        }
        self.timers.remove(&(pop.deadline, pop_id));
        self.timers.remove(&(pop.order_deadline, pop_id));
        if let Some(queue) = self.waiting.get_mut(&pop.topic) {
            queue.retain(|id| *id != pop_id);
            if queue.is_empty() {
                self.waiting.remove(&pop.topic);
            }
        }
        let mut deliveries = pop.deliveries;
        deliveries.sort_by_key(|(key, _)| *key);
        let deliveries = deliveries
            .into_iter()
            .map(|(_, delivery)| delivery)
            .collect();
        self.send(
            pop.conn,
            Wire::PopReply(PopReply {
                request: pop.request,
                deliveries,
            }),
        );
    }

    fn handle_reserved(&mut self, now: Time, reserved: Reserved) {
        let mut orphans: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        let mut extends: Vec<(Receipt, u64)> = Vec::new();
        for outcome in reserved.items {
            if outcome.result.is_err() {
                self.counters.reserves_denied += 1;
            }
            // A number whose key differs is a late answer to a former root's reservation (an
            // aggregator forwards what its children answer, and a restarted root numbers its
            // reservations from 1 again): not an answer to ours, which stays outstanding.
            let ours = self
                .reservations
                .get(&outcome.reservation)
                .is_some_and(|r| r.key == outcome.key);
            let Some(reservation) = ours
                .then(|| self.reservations.remove(&outcome.reservation))
                .flatten()
            else {
                // Nobody waits for this grant any more: end the lease now.
                if let Ok(delivery) = outcome.result {
                    let leaf = delivery.id.leaf();
                    orphans.entry(leaf).or_default().push(delivery.receipt());
                }
                continue;
            };
            let round_trip = now.saturating_since(reservation.sent);
            self.reporter
                .recorder
                .record_since(now, Metric::ReserveRoundTrip, reservation.sent);
            let sample = round_trip.as_micros() as u64;
            self.round_trip_us = (self.round_trip_us * 7 + sample) / 8;
            match reservation.purpose {
                ReservedFor::Pop(pop_id) => match (self.pops.get_mut(&pop_id), outcome.result) {
                    (Some(pop), result) => {
                        pop.outstanding -= 1;
                        if let Ok(mut delivery) = result {
                            // A grant reserved ahead and claimed by a pop that asked for
                            // another visibility timeout is extended to it, as a buffered one.
                            if reservation.lease_ms != pop.lease_ms {
                                let lease_ms = pop.lease_ms;
                                delivery.lease_deadline = now + Duration::from_millis(lease_ms);
                                extends.push((delivery.receipt(), lease_ms));
                            }
                            pop.deliveries.push((outcome.key, delivery));
                            pop.granted = true;
                        }
                        self.dirty.insert(pop.topic.clone());
                    }
                    (None, Ok(delivery)) => {
                        let leaf = delivery.id.leaf();
                        orphans.entry(leaf).or_default().push(delivery.receipt());
                    }
                    (None, Err(_)) => {}
                },
                ReservedFor::Ahead => {
                    let topic = reservation.topic;
                    let buffer = self.ahead.entry(topic.clone()).or_default();
                    buffer.outstanding.remove(&outcome.key);
                    self.ahead_bytes -= u64::from(reservation.size);
                    if let Ok(delivery) = outcome.result {
                        self.ahead_bytes += delivery.payload.len() as u64;
                        let hold = Duration::from_millis(self.settings.reserve_ahead_hold_ms);
                        self.ahead_expiry.insert((
                            reservation.sent + hold,
                            outcome.key,
                            topic.clone(),
                        ));
                        let lease_ms = reservation.lease_ms;
                        buffer.held.insert(
                            outcome.key,
                            Held {
                                delivery,
                                reserved_at: reservation.sent,
                                lease_ms,
                            },
                        );
                    }
                    self.dirty.insert(topic);
                }
            }
        }
        for (leaf, receipts) in orphans {
            if let Ok(child) = self.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
        }
        for (receipt, lease_ms) in extends {
            self.extend_unanswered(receipt.id.leaf(), vec![receipt], lease_ms);
        }
    }

    fn validate_settle(&self, ack: &Ack) -> Result<(), String> {
        let s = &self.settings;
        let count = ack.receipts.len();
        if count == 0 || count > s.pop_messages_max as usize {
            return Err(format!(
                "{count} receipts is outside 1..={} (pop_messages_max)",
                s.pop_messages_max
            ));
        }
        match &ack.op {
            Settle::Ack => {}
            Settle::Nack { delay_ms, reason } => {
                if *delay_ms > s.delay_max_ms {
                    return Err(format!(
                        "nack delay of {delay_ms} ms exceeds delay_max_ms {}",
                        s.delay_max_ms
                    ));
                }
                if let Some(reason) = reason
                    && reason.len() > s.reason_bytes_max as usize
                {
                    return Err(format!(
                        "reason of {} bytes exceeds reason_bytes_max {}",
                        reason.len(),
                        s.reason_bytes_max
                    ));
                }
            }
            Settle::Extend { lease_ms } => {
                if *lease_ms == 0 || *lease_ms > s.lease_timeout_max_ms {
                    return Err(format!(
                        "visibility timeout of {lease_ms} ms is outside 1..={} (lease_timeout_max_ms)",
                        s.lease_timeout_max_ms
                    ));
                }
            }
        }
        Ok(())
    }

    fn handle_ack(&mut self, conn: ConnId, ack: Ack) {
        self.counters.settle_requests += 1;
        if let Err(text) = self.validate_settle(&ack) {
            self.send(
                conn,
                Wire::error(Some(ack.request), ErrorCode::InvalidArgument, text),
            );
            return;
        }
        let count = ack.receipts.len();
        if self.acks.len() >= self.settings.root_pending_requests_max as usize {
            let text = "too many acknowledgements waiting at the root; retry";
            self.send(
                conn,
                Wire::error(Some(ack.request), ErrorCode::Overloaded, text),
            );
            return;
        }
        let ack_id = self.next_tag;
        self.next_tag += 1;
        let mut results = vec![None; count];
        let mut groups: BTreeMap<(ConnId, LeafId), (Vec<usize>, Vec<Receipt>)> = BTreeMap::new();
        for (slot, receipt) in ack.receipts.into_iter().enumerate() {
            match self.route(receipt.id.leaf()) {
                Ok(child) => {
                    let group = groups.entry((child, receipt.id.leaf())).or_default();
                    group.0.push(slot);
                    group.1.push(receipt);
                }
                Err(error) => results[slot] = Some(Err(error)),
            }
        }
        let outstanding = groups.len();
        for ((child, leaf), (slots, receipts)) in groups {
            let tag = self.next_tag;
            self.next_tag += 1;
            self.confirms.insert(
                tag,
                PendingConfirm {
                    ack: ack_id,
                    conn: child,
                    slots,
                },
            );
            self.send(
                child,
                Wire::Confirm(Confirm {
                    tag,
                    leaf,
                    op: ack.op.clone(),
                    receipts,
                }),
            );
        }
        self.acks.insert(
            ack_id,
            PendingAck {
                conn,
                request: ack.request,
                results,
                outstanding,
            },
        );
        self.finish_ack(ack_id);
    }

    fn handle_confirmed(&mut self, confirmed: Confirmed) {
        let Some(confirm) = self.confirms.remove(&confirmed.tag) else {
            return;
        };
        if confirmed.results.len() != confirm.slots.len() {
            self.violations += 1;
        }
        self.fill_confirm(confirm, |index| {
            confirmed
                .results
                .get(index)
                .copied()
                .unwrap_or(Err(ReceiptError::Unavailable))
        });
    }

    fn fill_confirm(
        &mut self,
        confirm: PendingConfirm,
        result: impl Fn(usize) -> Result<(), ReceiptError>,
    ) {
        let Some(ack) = self.acks.get_mut(&confirm.ack) else {
            return;
        };
        for (index, slot) in confirm.slots.iter().enumerate() {
            ack.results[*slot] = Some(result(index));
        }
        ack.outstanding -= 1;
        self.finish_ack(confirm.ack);
    }

    fn finish_ack(&mut self, ack_id: u64) {
        if self.acks[&ack_id].outstanding > 0 {
            return;
        }
        let ack = self.acks.remove(&ack_id).expect("present");
        let results = ack
            .results
            .into_iter()
            .map(|r| r.expect("every slot filled"))
            .collect();
        self.send(
            ack.conn,
            Wire::AckReply(AckReply {
                request: ack.request,
                results,
            }),
        );
    }

    fn validate_admin(&self, op: &AdminOp) -> Result<(), String> {
        let s = &self.settings;
        if let Some(topic) = op.topic() {
            validate_topic(s, topic)?;
        }
        if op.ids().len() > s.pop_messages_max as usize {
            return Err(format!(
                "{} ids exceed pop_messages_max {}",
                op.ids().len(),
                s.pop_messages_max
            ));
        }
        if let AdminOp::DeadLetters { limit, .. } = op
            && (*limit == 0 || *limit > s.pop_messages_max)
        {
            return Err(format!(
                "limit {limit} is outside 1..={} (pop_messages_max)",
                s.pop_messages_max
            ));
        }
        Ok(())
    }

    fn handle_admin(&mut self, conn: ConnId, admin: Admin) {
        self.counters.admin_requests += 1;
        if let Err(text) = self.validate_admin(&admin.op) {
            self.send(
                conn,
                Wire::error(Some(admin.request), ErrorCode::InvalidArgument, text),
            );
            return;
        }
        if self.admins.len() >= self.settings.root_pending_requests_max as usize {
            let text = "too many admin requests waiting at the root; retry";
            self.send(
                conn,
                Wire::error(Some(admin.request), ErrorCode::Overloaded, text),
            );
            return;
        }
        let subtree = self.children.subtree_leaves();
        let targets: Vec<(LeafId, Vec<crate::id::MessageId>)> = if admin.op.ids().is_empty() {
            subtree.into_iter().map(|leaf| (leaf, Vec::new())).collect()
        } else {
            let mut by_leaf: BTreeMap<LeafId, Vec<crate::id::MessageId>> = BTreeMap::new();
            for id in admin.op.ids() {
                if subtree.contains(&id.leaf()) {
                    by_leaf.entry(id.leaf()).or_default().push(*id);
                }
            }
            by_leaf.into_iter().collect()
        };
        let admin_id = self.next_tag;
        self.next_tag += 1;
        let (limit, result) = match &admin.op {
            AdminOp::DeadLetters { limit, .. } => {
                (*limit as usize, AdminResult::DeadLetters(Vec::new()))
            }
            AdminOp::Redrive { .. } | AdminOp::Purge { .. } => (0, AdminResult::Count(0)),
            AdminOp::Stats { .. } => (0, AdminResult::Stats(Stats::default())),
        };
        let mut pending = PendingAdmin {
            conn,
            request: admin.request,
            limit,
            outstanding: 0,
            result,
            unreachable: Vec::new(),
        };
        for (leaf, ids) in targets {
            let Ok(child) = self.route(leaf) else {
                pending.unreachable.push(leaf);
                continue;
            };
            let op = match &admin.op {
                AdminOp::Redrive { topic, .. } if !ids.is_empty() => AdminOp::Redrive {
                    topic: topic.clone(),
                    ids,
                },
                AdminOp::Purge { topic, .. } if !ids.is_empty() => AdminOp::Purge {
                    topic: topic.clone(),
                    ids,
                },
                other => other.clone(),
            };
            let tag = self.next_tag;
            self.next_tag += 1;
            self.leaf_admins.insert(
                tag,
                PendingLeafAdmin {
                    admin: admin_id,
                    conn: child,
                    leaf,
                },
            );
            pending.outstanding += 1;
            self.send(child, Wire::LeafAdmin(LeafAdmin { tag, leaf, op }));
        }
        self.admins.insert(admin_id, pending);
        self.finish_admin(admin_id);
    }

    fn handle_leaf_admin_reply(&mut self, reply: LeafAdminReply) {
        let Some(pending) = self.leaf_admins.remove(&reply.tag) else {
            return;
        };
        self.merge_admin(pending, reply.result);
    }

    fn merge_admin(&mut self, from: PendingLeafAdmin, result: Option<AdminResult>) {
        let Some(admin) = self.admins.get_mut(&from.admin) else {
            return;
        };
        admin.outstanding -= 1;
        match (&mut admin.result, result) {
            (AdminResult::DeadLetters(all), Some(AdminResult::DeadLetters(more))) => {
                all.extend(more);
                all.sort_by_key(|d| (d.dead_at, d.id));
                all.truncate(admin.limit);
            }
            (AdminResult::Count(total), Some(AdminResult::Count(more))) => *total += more,
            (AdminResult::Stats(total), Some(AdminResult::Stats(more))) => total.merge(&more),
            (_, None) => admin.unreachable.push(from.leaf),
            (_, Some(_)) => {
                self.violations += 1;
                admin.unreachable.push(from.leaf);
            }
        }
        self.finish_admin(from.admin);
    }

    fn finish_admin(&mut self, admin_id: u64) {
        if self.admins[&admin_id].outstanding > 0 {
            return;
        }
        let mut admin = self.admins.remove(&admin_id).expect("present");
        admin.unreachable.sort_unstable();
        self.send(
            admin.conn,
            Wire::AdminReply(AdminReply {
                request: admin.request,
                result: admin.result,
                unreachable: admin.unreachable,
            }),
        );
    }

    fn child_gone(&mut self, conn: ConnId) {
        self.reporter.child_gone(conn);
        if let Some(removed) = self.children.disconnect(conn) {
            self.dirty
                .extend(removed.into_iter().map(|(topic, _)| topic));
        }
        self.park_unreachable();
        self.fail_outstanding(conn);
    }

    /// A direct link ended: what went on it is answered as unavailable (as for a child), and
    /// the leaf is reached through the aggregators again.
    fn direct_gone(&mut self, conn: ConnId) {
        let Some(leaf) = self.direct.conns.remove(&conn) else {
            return;
        };
        if self.direct.by_leaf.get(&leaf) == Some(&conn) {
            self.direct.by_leaf.remove(&leaf);
        }
        self.resend_through_the_tree(conn, leaf);
        self.park_unreachable();
        self.fail_outstanding(conn);
    }

    /// Sends the reserves still unanswered on a lost direct link again through the child that
    /// leads to `leaf`, as the same reservations, so each gets an answer: the leaf grants it
    /// if the first never reached it, or refuses it as leased if the first was granted and
    /// its grant lost (the lease then expires at the leaf). Numbered 0: the aggregator took the
    /// entries on the notice already. Without a route they fail as unavailable.
    fn resend_through_the_tree(&mut self, lost: ConnId, leaf: LeafId) {
        let Ok(child) = self.children.route(leaf) else {
            return;
        };
        let numbers = sorted_where(&self.reservations, |r| r.conn == lost);
        let mut groups: BTreeMap<(Topic, u64), Vec<ReserveItem>> = BTreeMap::new();
        for reservation in numbers {
            let r = self.reservations.get_mut(&reservation).expect("listed");
            r.conn = child;
            groups
                .entry((r.topic.clone(), r.lease_ms))
                .or_default()
                .push(ReserveItem {
                    reservation,
                    key: r.key,
                });
        }
        for ((topic, lease_ms), items) in groups {
            self.counters.reserves += 1;
            let msg = Wire::Reserve(Reserve {
                leaf,
                topic: topic.to_string(),
                lease_ms,
                items,
                offer_seq: 0,
                direct: false,
            });
            self.send(child, msg);
        }
    }

    /// A direct link's `Welcome` (or refusal).
    fn direct_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        let leaf = self.direct.conns[&conn];
        match msg {
            Wire::Welcome(welcome) if welcome.role == Role::Leaf => {
                if let Some(old) = self.direct.by_leaf.insert(leaf, conn)
                    && old != conn
                {
                    self.direct_gone(old);
                    self.closes
                        .push_back((old, "superseded by a new direct link".into()));
                }
                if !self.parked.is_empty() {
                    self.release_parked();
                }
            }
            Wire::Welcome(welcome) => {
                self.violations += 1;
                let reason = format!("leaf {leaf}'s address answers as a {}", welcome.role);
                self.closes.push_back((conn, reason));
            }
            Wire::Reserved(reserved) => self.handle_reserved(now, reserved),
            Wire::Confirmed(confirmed) => self.handle_confirmed(confirmed),
            Wire::LeafAdminReply(reply) => self.handle_leaf_admin_reply(reply),
            // A refused handshake (say, a leaf of another protocol version): the pop path
            // stays on the aggregators.
            Wire::Error(_) => self.violations += 1,
            other => self.reject_unexpected(conn, &other),
        }
    }

    /// Answers everything that went on `conn` and was not answered as unavailable.
    fn fail_outstanding(&mut self, conn: ConnId) {
        let lost = sorted_where(&self.reservations, |r| r.conn == conn);
        for id in lost {
            let reservation = self.reservations.remove(&id).expect("present");
            match reservation.purpose {
                ReservedFor::Pop(pop_id) => {
                    if let Some(pop) = self.pops.get_mut(&pop_id) {
                        pop.outstanding -= 1;
                        self.dirty.insert(pop.topic.clone());
                    }
                }
                ReservedFor::Ahead => {
                    // If the leaf granted it, the lease expires there unused.
                    if let Some(buffer) = self.ahead.get_mut(&reservation.topic) {
                        buffer.outstanding.remove(&reservation.key);
                    }
                    self.ahead_bytes -= u64::from(reservation.size);
                    self.dirty.insert(reservation.topic);
                }
            }
        }
        let lost = sorted_where(&self.confirms, |c| c.conn == conn);
        for tag in lost {
            let confirm = self.confirms.remove(&tag).expect("present");
            self.fill_confirm(confirm, |_| Err(ReceiptError::Unavailable));
        }
        let lost = sorted_where(&self.leaf_admins, |a| a.conn == conn);
        for tag in lost {
            let pending = self.leaf_admins.remove(&tag).expect("present");
            self.merge_admin(pending, None);
        }
        // Frontiers of the lost child no longer hold anything back.
        self.dirty.extend(self.waiting.keys().cloned());
    }

    fn consumer_gone(&mut self, conn: ConnId) {
        let pops = sorted_where(&self.pops, |p| p.conn == conn);
        for pop_id in pops {
            let pop = self.pops.remove(&pop_id).expect("present");
            self.timers.remove(&(pop.deadline, pop_id));
            self.timers.remove(&(pop.order_deadline, pop_id));
            if let Some(queue) = self.waiting.get_mut(&pop.topic) {
                queue.retain(|id| *id != pop_id);
            }
            // Deliveries already granted go back at once rather than waiting out their lease.
            let mut by_leaf: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
            for (_, delivery) in pop.deliveries {
                by_leaf
                    .entry(delivery.id.leaf())
                    .or_default()
                    .push(delivery.receipt());
            }
            for (leaf, receipts) in by_leaf {
                if let Ok(child) = self.route(leaf) {
                    self.send(child, Wire::Release(Release { leaf, receipts }));
                }
            }
        }
        self.acks.retain(|_, ack| ack.conn != conn);
        self.admins.retain(|_, admin| admin.conn != conn);
    }

    fn serve_dirty(&mut self, now: Time) {
        for topic in std::mem::take(&mut self.dirty) {
            self.serve(now, &topic);
            let idle = self
                .children
                .windows
                .get(&topic)
                .is_none_or(|w| w.is_idle());
            if idle && !self.waiting.contains_key(&topic) {
                self.children.windows.remove(&topic);
            }
            if self
                .ahead
                .get(&topic)
                .is_some_and(|buffer| buffer.is_idle())
            {
                self.ahead.remove(&topic);
            }
        }
    }

    fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
        self.violations += 1;
        let request = match msg {
            Wire::Push(push) => Some(push.request),
            Wire::Pop(pop) => Some(pop.request),
            Wire::Ack(ack) => Some(ack.request),
            Wire::Admin(admin) => Some(admin.request),
            _ => None,
        };
        let text = format!("root does not accept {} messages here", msg.name());
        self.send(
            conn,
            Wire::error(request, ErrorCode::UnexpectedMessage, text),
        );
    }
}

impl Machine for Root {
    fn check_invariants(&self) {
        // What the root holds from each child is bounded by the credits it granted.
        self.children.check_windows();
        assert!(
            self.pops.len() <= self.settings.root_pending_pops_max as usize,
            "{} pops held over root_pending_pops_max",
            self.pops.len()
        );
    }

    fn handle_connected(&mut self, _now: Time, conn: ConnId, link: Link) {
        match link {
            Link::Parent => {
                self.violations += 1;
                self.closes
                    .push_back((conn, "the root has no parent".into()));
            }
            Link::Incoming => {
                self.children.accept(conn);
            }
            Link::Leaf(leaf) => {
                if self.children.route(leaf) == Err(ReceiptError::UnknownLeaf) {
                    self.violations += 1;
                    let reason = format!("leaf {leaf} is not in this tree");
                    self.closes.push_back((conn, reason));
                    return;
                }
                self.direct.conns.insert(conn, leaf);
                let name = self.name.clone();
                self.send(
                    conn,
                    Wire::Hello(crate::wire::Hello {
                        protocol: crate::wire::PROTOCOL_VERSION,
                        peer: crate::wire::PeerKind::Root { name },
                    }),
                );
            }
        }
    }

    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
        if self.direct.conns.contains_key(&conn) {
            self.direct_gone(conn);
            self.serve_dirty(now);
            return;
        }
        match self.children.peers.get(&conn) {
            Some(crate::downstream::Peer::Child { .. }) => self.child_gone(conn),
            Some(crate::downstream::Peer::Consumer) => {
                self.consumer_gone(conn);
                self.children.disconnect(conn);
            }
            _ => {
                self.children.disconnect(conn);
            }
        }
        self.serve_dirty(now);
    }

    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        if self.direct.conns.contains_key(&conn) {
            self.direct_message(now, conn, msg);
            self.serve_dirty(now);
            return;
        }
        let peer = self.children.peers.get(&conn).cloned();
        match (peer, msg) {
            (Some(crate::downstream::Peer::Child { .. }), Wire::Offer(offer)) => {
                self.counters.offers_received += 1;
                let topic = self.children.topic(&offer.topic);
                let credits = self.children.credits();
                let window = self
                    .children
                    .windows
                    .get_mut(&topic)
                    .expect("created above");
                let delta = window.apply(conn, &offer, credits);
                if delta.refused > 0 {
                    self.violations += 1;
                }
                for entry in &delta.added {
                    let recorder = &mut self.reporter.recorder;
                    recorder.record_since(now, Metric::BubbleToRoot, entry.since);
                    recorder.record_since(now, Metric::HopToRoot, entry.entered);
                }
                // An entry offered again while its grant waits in the reserve-ahead buffer is
                // no longer leased at its leaf (the leaf restarted, or the lease ended): the
                // grant is dead and must not be delivered.
                if let Some(buffer) = self.ahead.get_mut(&topic) {
                    for entry in &delta.added {
                        if let Some(held) = buffer.held.remove(&entry.key) {
                            self.ahead_bytes -= held.delivery.payload.len() as u64;
                            let expiry = held.reserved_at
                                + Duration::from_millis(self.settings.reserve_ahead_hold_ms);
                            self.ahead_expiry
                                .remove(&(expiry, entry.key, topic.clone()));
                            self.counters.ahead_revoked += 1;
                        }
                    }
                }
                self.dirty.insert(topic);
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Report(report)) => {
                self.reporter.child_report(conn, report)
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Reserved(reserved)) => {
                self.handle_reserved(now, reserved)
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Confirmed(confirmed)) => {
                self.handle_confirmed(confirmed)
            }
            (Some(crate::downstream::Peer::Consumer), Wire::Pop(pop)) => {
                self.handle_pop(now, conn, pop)
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::LeafAdminReply(reply)) => {
                self.handle_leaf_admin_reply(reply)
            }
            (Some(crate::downstream::Peer::Consumer), Wire::Ack(ack)) => self.handle_ack(conn, ack),
            (Some(crate::downstream::Peer::Consumer), Wire::Admin(admin)) => {
                self.handle_admin(conn, admin)
            }
            (_, Wire::Hello(hello)) => {
                let accepts = [PeerKindTag::Node, PeerKindTag::Consumer];
                let outcome = self.children.hello(conn, hello, &accepts);
                self.send(conn, outcome.reply);
                if outcome.close {
                    self.closes.push_back((conn, "handshake refused".into()));
                }
                if let Some(old) = outcome.superseded {
                    self.child_gone(old);
                    self.closes
                        .push_back((old, "superseded by a new session".into()));
                }
                if !self.parked.is_empty() {
                    self.release_parked();
                }
            }
            (
                Some(crate::downstream::Peer::Pending),
                msg @ (Wire::Pop(_) | Wire::Ack(_) | Wire::Admin(_)),
            ) => {
                let request = match &msg {
                    Wire::Pop(pop) => pop.request,
                    Wire::Ack(ack) => ack.request,
                    Wire::Admin(admin) => admin.request,
                    _ => unreachable!("matched above"),
                };
                let text = format!("{} before Hello", msg.name());
                self.send(
                    conn,
                    Wire::error(Some(request), ErrorCode::UnexpectedMessage, text),
                );
            }
            (_, Wire::Error(_)) => self.violations += 1,
            (_, other) => self.reject_unexpected(conn, &other),
        }
        self.serve_dirty(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, pop_id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            if let Some(pop) = self.pops.get(&pop_id) {
                self.dirty.insert(pop.topic.clone());
            }
        }
        self.release_stale_ahead(now);
        self.serve_dirty(now);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.closes.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let pops = self.timers.first().map(|(at, _)| *at);
        let ahead = self.ahead_expiry.first().map(|(at, _, _)| *at);
        pops.into_iter().chain(ahead).min()
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            window_entries: self.children.window_entries() as u64,
            children: self.children.children() as u64,
            direct_links: self.direct.by_leaf.len() as u64,
            pending_pops: self.pops.len() as u64,
            ahead_entries: self.ahead.values().map(|b| b.held.len() as u64).sum(),
            violations: self.violations,
            ..NodeStats::default()
        }
    }

    fn report(&mut self, now: Time) -> Report {
        let c = self.counters;
        let counters = [
            ("pops", c.pops),
            ("empty_pops", c.empty_pops),
            ("deliveries", c.deliveries),
            ("reserves", c.reserves),
            ("reserves_denied", c.reserves_denied),
            ("settle_requests", c.settle_requests),
            ("admin_requests", c.admin_requests),
            ("offers_received", c.offers_received),
            ("reserved_ahead", c.reserved_ahead),
            ("ahead_hits", c.ahead_hits),
            ("ahead_released", c.ahead_released),
            ("ahead_revoked", c.ahead_revoked),
            ("protocol_violations", self.violations),
        ];
        let gauges = [
            ("window_entries", self.children.window_entries() as u64),
            ("children", self.children.children() as u64),
            ("direct_links", self.direct.by_leaf.len() as u64),
            ("pending_pops", self.pops.len() as u64),
            ("reservations", self.reservations.len() as u64),
            (
                "ahead_entries",
                self.ahead.values().map(|b| b.held.len() as u64).sum(),
            ),
            ("ahead_bytes", self.ahead_bytes),
            ("topics", self.children.windows.len() as u64),
        ];
        let own = OwnReport {
            name: self.name.clone(),
            role: "root",
            parent: None,
            connected: true,
            counters: named(&counters),
            gauges: named(&gauges),
            stats: Stats::default(),
        };
        self.reporter.report(now, own)
    }
}
