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
//! # Access
//! A client connection the host authenticated carries a [`Principal`]: a pop needs `consume`
//! on its topic's namespace, a dead-letter operation `admin`, a topic's stats any permission
//! there; the stats of every topic list only the namespaces the principal holds a permission
//! in. The lease token
//! of each delivery is masked with the principal's receipt key on its way out and unmasked
//! with the settling principal's key on its way back: another principal's receipt unmasks to
//! a token its leaf never issued, answered `Stale` like any other wrong token.
//!
//! # Admin
//! Dead-letter and stats operations fan out as `LeafAdmin` to every leaf concerned (the leaves
//! owning the named ids, or every leaf of the tree); the answers are merged, and leaves that
//! cannot be reached are named in the reply.

//!
//! # Layout
//! This file holds the root's state and its bookkeeping types; each concern lives in a file:
//! [`pop`] (pops held and served, grants answered), [`ahead`] (reserve-ahead buffers),
//! [`settle`] (acks, nacks, extends), [`admin`] (admin fan-out and merge), [`links`]
//! (connections that end, direct links) and [`machine`] (the [`Machine`] implementation).
//!
//! [`Machine`]: crate::machine::Machine

mod admin;
mod ahead;
mod links;
mod machine;
mod pop;
mod settle;

use crate::access::{Permission, Principal, Tally, over_cap};
use crate::ahead::AheadBuffer;
use crate::config::Settings;
use crate::downstream::{Downstream, Topic, TopicMap, TopicSet};
use crate::id::{LeafId, Receipt};
use crate::key::Key;
use crate::machine::{ConnId, Outbox, Transmit};
use crate::metrics::Reporter;
use crate::time::Time;
use crate::window::{Slot, Window};
use crate::wire::{
    AdminResult, Delivery, ErrorCode, ReceiptError, Reserve, ReserveItem, Role, Wire,
};
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// How a root is set up.
#[derive(Clone, Debug)]
pub struct RootConfig {
    /// The root's name in the topology.
    pub name: String,
    /// Bounds and timings.
    pub settings: Settings,
    /// Every leaf in the tree, per the topology.
    pub subtree: Vec<LeafId>,
    /// A root standing by (not the first of the topology): while no child is with it, it
    /// refuses pops `Unavailable`, so that consumers move on to the root that has them.
    pub standby: bool,
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
    /// Whose pop it is ([`Root::tallies`]).
    principal: Option<Arc<str>>,
    /// The scopes whose pop rates it took tokens of (none: no pop rate applies).
    pop_scopes: Vec<String>,
    /// How many deliveries it took tokens and in-flight room for in each: those it does not
    /// make give theirs back.
    pop_tokens: u64,
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
    ahead: bool,
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
                ahead,
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

/// The root's direct links to leaves ([`crate::id::Link::Leaf`], setting `direct_pop_path`): reserves,
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
    /// Pops refused over a pop rate.
    pops_rate_limited: u64,
    /// Pops refused at an in-flight quota.
    pops_over_in_flight: u64,
    deliveries: u64,
    reserves: u64,
    reserves_denied: u64,
    settle_requests: u64,
    admin_requests: u64,
    /// Topic configurations sent to leaves that answered a listing with an older one.
    configs_repaired: u64,
    offers_received: u64,
    /// Entries reserved for the reserve-ahead buffers.
    reserved_ahead: u64,
    /// Deliveries served from them.
    ahead_hits: u64,
    /// Entries given back unused after `reserve_ahead_hold_ms`.
    ahead_released: u64,
    /// Buffered grants dropped because their leaf offered the entry again.
    ahead_revoked: u64,
    /// Reserves, confirms and admin requests given up on after `request_timeout_ms`.
    requests_timed_out: u64,
}

#[derive(Debug)]
struct PendingConfirm {
    ack: u64,
    /// The connection the `Confirm` went on.
    conn: ConnId,
    slots: Vec<usize>,
    /// When it was sent (see `request_timeout_ms`).
    sent: Time,
}

/// The connection of requests the root makes of itself (no driver names a connection so):
/// their answers go nowhere.
const ROOT_ITSELF: ConnId = ConnId::MAX;

#[derive(Debug)]
struct PendingAdmin {
    conn: ConnId,
    request: u64,
    /// Most dead letters to return (for a listing).
    limit: usize,
    /// The earliest last entry of the leaves whose listing stopped short to fit a frame: the
    /// merged listing must stop there too, or a next page (`after` its last entry) would
    /// skip what those leaves left out.
    cut: Option<(Time, crate::id::MessageId)>,
    /// The same for a listing of topic configurations: the earliest last name.
    name_cut: Option<String>,
    /// For a listing of topic configurations: the version each leaf answered for each topic,
    /// so that the leaves behind are sent the newest (see `Root::repair_configs`).
    versions: Vec<(LeafId, String, Time)>,
    outstanding: usize,
    result: AdminResult,
    unreachable: Vec<LeafId>,
    principal: Option<Arc<str>>,
}

#[derive(Debug)]
struct PendingLeafAdmin {
    admin: u64,
    /// The connection the `LeafAdmin` went on.
    conn: ConnId,
    leaf: LeafId,
    /// When it was sent (see `request_timeout_ms`).
    sent: Time,
}

#[derive(Debug)]
struct PendingAck {
    conn: ConnId,
    request: u64,
    results: Vec<Option<Result<(), ReceiptError>>>,
    outstanding: usize,
    principal: Option<Arc<str>>,
}

/// Stride scheduling over the lanes of a weighted topic (see [`crate::lanes`]), on two
/// levels: tiers share pops by their weights, and within a tier its lanes — one per fairness
/// key with ready messages, one for the messages without a key — share the tier's pops by the
/// keys' weights. Serving an entry moves its tier's pass on by 1 / the tier's weight and its
/// lane's pass within the tier by 1 / its key's weight; pops take from the tier of the lowest
/// pass among those with an entry they may have, and in it from the lane of the lowest pass.
/// A tier or lane that had nothing joins at the pass served last at its level, so it is not
/// owed its idle time: an empty tier's (or key's) share goes to the others, and one that comes
/// back takes its share from then on.
#[derive(Debug, Default)]
struct Stride {
    /// Per tier (its first priority): its pass, and the pass of its lane served last.
    tiers: HashMap<u32, (f64, f64)>,
    /// Per lane: its pass within its tier.
    lanes: HashMap<Topic, f64>,
    /// The pass of the tier served last.
    virtual_time: f64,
}

/// What stride scheduling reads of a lane's name: its tier, the tier's weight and its key's
/// weight (in thousandths).
#[derive(Clone, Copy, Debug)]
struct LaneWeights {
    tier: u32,
    tier_milli: u32,
    key_milli: u32,
}

impl LaneWeights {
    /// A strict topic's one lane (no stride scheduling reads it).
    const STRICT: LaneWeights = LaneWeights {
        tier: 0,
        tier_milli: 1000,
        key_milli: crate::lanes::KEY_WEIGHT_MILLI,
    };

    fn of(lane: &str) -> LaneWeights {
        let name = crate::lanes::parse(lane);
        LaneWeights {
            tier: name.and_then(|name| name.tier).unwrap_or(0),
            tier_milli: name.map_or(1000, |name| name.weight_milli.max(1)),
            key_milli: name
                .and_then(|name| name.key)
                .map_or(crate::lanes::KEY_WEIGHT_MILLI, |(_, weight)| weight.max(1)),
        }
    }
}

impl Stride {
    /// Whether lane `a` goes before lane `b`: the lower tier pass; within a tier, the lower
    /// lane pass (ties keep `b`, the lane found first).
    fn before(&self, a: (&Topic, LaneWeights), b: (&Topic, LaneWeights)) -> bool {
        let (a_tier, a_own) = self.pass(a.0, a.1);
        let (b_tier, b_own) = self.pass(b.0, b.1);
        if a.1.tier == b.1.tier {
            a_own < b_own
        } else {
            a_tier < b_tier
        }
    }

    /// Where `lane` stands: its tier's pass, then its own within the tier.
    fn pass(&self, lane: &Topic, weights: LaneWeights) -> (f64, f64) {
        let (tier, lanes_time) = self.tiers.get(&weights.tier).copied().unwrap_or_default();
        let own = self.lanes.get(lane).copied().unwrap_or(0.0);
        (tier.max(self.virtual_time), own.max(lanes_time))
    }

    fn served(&mut self, lane: &Topic, weights: LaneWeights) {
        let (tier, own) = self.pass(lane, weights);
        self.virtual_time = tier;
        let next_tier = tier + 1000.0 / f64::from(weights.tier_milli);
        self.tiers.insert(weights.tier, (next_tier, own));
        let next_own = own + 1000.0 / f64::from(weights.key_milli);
        self.lanes.insert(lane.clone(), next_own);
    }

    /// Forgets the lanes and tiers not among `lanes` (their windows went: idle).
    fn keep(&mut self, lanes: &[(Topic, LaneWeights)]) {
        if self.lanes.len() > lanes.len() {
            let present: std::collections::HashSet<&Topic> =
                lanes.iter().map(|(lane, _)| lane).collect();
            self.lanes.retain(|lane, _| present.contains(lane));
        }
        // The lanes come in tier order.
        let tiers: Vec<u32> = lanes.iter().map(|(_, weights)| weights.tier).collect();
        self.tiers
            .retain(|tier, _| tiers.binary_search(tier).is_ok());
    }
}

/// See the module doc.
pub struct Root {
    settings: Settings,
    children: Downstream,
    pops: Pops,
    /// Per weighted topic, its lanes' stride scheduling.
    strides: HashMap<Topic, Stride>,
    reservations: Reservations,
    requests: Requests,
    dirty: TopicSet,
    outbox: Outbox,
    violations: u64,
    name: String,
    /// See [`RootConfig::standby`].
    standby: bool,
    reporter: Reporter,
    /// Consumer lag per topic and priority, for `/metrics`.
    lag: crate::metrics::ConsumerLag,
    /// The leaves' allowances of each scope with quotas ([`crate::quota`]).
    ledger: crate::quota::Ledger,
    counters: RootCounters,
    /// Direct links to leaves.
    direct: DirectLinks,
    ahead: ReserveAhead,
    /// The principal of each client connection the host authenticated ([`crate::access`]).
    principals: HashMap<ConnId, Arc<Principal>>,
    /// What each principal has waiting: pops (`principal_pops_max`), and acks and admin
    /// requests (`principal_requests_max`).
    tallies: RootTallies,
}

#[derive(Default)]
struct RootTallies {
    pops: Tally,
    requests: Tally,
}

/// Pops waiting for an answer (`root/pop.rs`).
struct Pops {
    by_id: HashMap<u64, PendingPop>,
    /// Those waiting for messages, per topic, oldest first.
    waiting: TopicMap<VecDeque<u64>>,
    /// Their deadlines (answer and ordering), as `(deadline, pop id)`.
    deadlines: BTreeSet<(Time, u64)>,
    next_id: u64,
}

/// Confirms, acks and admin requests forwarded to a leaf or the subtree and waiting for its
/// answer, by tag.
struct Requests {
    confirms: HashMap<u64, PendingConfirm>,
    acks: HashMap<u64, PendingAck>,
    admins: HashMap<u64, PendingAdmin>,
    leaf_admins: HashMap<u64, PendingLeafAdmin>,
    next_tag: u64,
    /// When reserves, confirms and leaf admin requests were last checked against
    /// `request_timeout_ms`.
    checked_at: Time,
}

/// Reserve-ahead (`root/ahead.rs`, [`crate::ahead`]).
#[derive(Default)]
struct ReserveAhead {
    /// The buffers, by topic.
    buffers: TopicMap<AheadBuffer>,
    /// Payload bytes held or expected in all of them.
    bytes: u64,
    /// When each held entry is given back: `(deadline, key, topic)`.
    expiry: BTreeSet<(Time, Key, Topic)>,
    /// Smoothed reserve round trip, in microseconds (sizes the buffers).
    round_trip_us: u64,
    /// Buffered grants whose leaf became unreachable (its child's session ended): not
    /// delivered — an ack could not reach the leaf —, and given back once the leaf is
    /// reachable again. Bounded: the oldest are forgotten past `PARKED_PER_AHEAD_MAX ×
    /// reserve_ahead_max` (their leases then expire at the leaf).
    parked: VecDeque<(LeafId, Receipt)>,
}

/// See [`ReserveAhead::parked`].
const PARKED_PER_AHEAD_MAX: usize = 16;

impl Root {
    /// Creates a root with no children connected.
    pub fn new(config: RootConfig) -> Root {
        let name = config.name.clone();
        let standby = config.standby;
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
            pops: Pops {
                by_id: HashMap::default(),
                waiting: Default::default(),
                deadlines: BTreeSet::new(),
                next_id: 1,
            },
            reservations: Reservations::default(),
            requests: Requests {
                confirms: HashMap::default(),
                acks: HashMap::default(),
                admins: HashMap::default(),
                leaf_admins: HashMap::default(),
                next_tag: 1,
                checked_at: Time::ZERO,
            },
            dirty: Default::default(),
            strides: HashMap::default(),
            outbox: Outbox::default(),
            violations: 0,
            name,
            standby,
            reporter,
            lag: crate::metrics::ConsumerLag::default(),
            ledger: crate::quota::Ledger::default(),
            counters: RootCounters::default(),
            direct: DirectLinks::default(),
            ahead: ReserveAhead {
                round_trip_us: 1_000,
                ..ReserveAhead::default()
            },
            principals: HashMap::default(),
            tallies: RootTallies::default(),
        }
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.outbox.send(conn, msg);
    }

    /// Whether `conn`'s principal may do `permission` (`None`: anything at all) on `topic`'s
    /// namespace; if not, `request` is refused `Forbidden`. A connection without a principal
    /// (a tree without access control) may do everything.
    fn permit(
        &mut self,
        conn: ConnId,
        request: u64,
        topic: &str,
        permission: Option<Permission>,
    ) -> bool {
        let Some(principal) = self.principals.get(&conn) else {
            return true;
        };
        let text = match permission {
            Some(permission) if principal.may(topic, permission) => return true,
            Some(permission) => principal.refusal(topic, permission),
            None if principal.grants.any_in(crate::access::namespace(topic)) => return true,
            None => format!(
                "principal {:?} holds no permission in namespace {:?}",
                principal.name,
                crate::access::namespace(topic)
            ),
        };
        self.refuse(conn, request, ErrorCode::Forbidden, text);
        false
    }

    /// Answers `request` of `conn` with an error.
    fn refuse(&mut self, conn: ConnId, request: u64, code: ErrorCode, text: impl Into<String>) {
        if conn != ROOT_ITSELF {
            self.send(conn, Wire::error(Some(request), code, text));
        }
    }

    /// The name of `conn`'s principal, if the host gave one.
    fn principal_of(&self, conn: ConnId) -> Option<Arc<str>> {
        self.principals.get(&conn).map(|p| p.name.clone())
    }

    /// Counts a request of `principal` in `tally` (pops or requests), or refuses `request`
    /// with `Overloaded` when the principal holds `max` already.
    fn admit(
        &mut self,
        conn: ConnId,
        request: u64,
        principal: Option<&Arc<str>>,
        pops: bool,
    ) -> bool {
        let s = &self.settings;
        let (tally, max, what, setting) = if pops {
            let max = s.principal_pops_max;
            (&mut self.tallies.pops, max, "pops", "principal_pops_max")
        } else {
            let max = s.principal_requests_max;
            (
                &mut self.tallies.requests,
                max,
                "requests",
                "principal_requests_max",
            )
        };
        if tally.take(principal, max) {
            return true;
        }
        let text = over_cap(principal.map_or("", |p| p), what, setting, max);
        self.refuse(conn, request, ErrorCode::Overloaded, text);
        false
    }

    /// The receipt mask of `conn`'s principal for message `id` (0 without one).
    fn receipt_mask(&self, conn: ConnId, id: crate::id::MessageId) -> u64 {
        self.principals
            .get(&conn)
            .map_or(0, |principal| principal.receipt_mask(id))
    }

    /// The connection that reaches `leaf`: its direct link if welcomed, else the child that
    /// leads to it.
    fn route(&self, leaf: LeafId) -> Result<ConnId, ReceiptError> {
        match self.direct.by_leaf.get(&leaf) {
            Some(conn) => Ok(*conn),
            None => self.children.route(leaf),
        }
    }
}
