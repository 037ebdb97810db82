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

use crate::config::{FRAME_OVERHEAD_BYTES, Settings};
use crate::downstream::{Downstream, PeerKindTag, Topic, TopicMap, TopicSet};
use crate::id::{LeafId, Receipt};
use crate::key::Key;
use crate::leaf::validate_topic;
use crate::machine::{ConnId, Link, Machine, NodeStats, Transmit};
use crate::metrics::{Metric, OwnReport, Report, Reporter, named};
use crate::time::Time;
use crate::wire::{
    Ack, AckReply, Admin, AdminOp, AdminReply, AdminResult, Confirm, Confirmed, Delivery,
    ErrorCode, LeafAdmin, LeafAdminReply, Pop, PopReply, ReceiptError, Release, Reserve,
    ReserveItem, Reserved, Role, Settle, Stats, Wire,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    /// When the pop arrived.
    arrived: Time,
}

#[derive(Debug)]
struct Reservation {
    pop: u64,
    child: ConnId,
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
}

#[derive(Debug)]
struct PendingConfirm {
    ack: u64,
    child: ConnId,
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
    child: ConnId,
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
    reservations: HashMap<u64, Reservation>,
    next_reservation: u64,
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
}

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
            pops: HashMap::new(),
            next_pop: 1,
            reservations: HashMap::new(),
            next_reservation: 1,
            confirms: HashMap::new(),
            acks: HashMap::new(),
            admins: HashMap::new(),
            leaf_admins: HashMap::new(),
            next_tag: 1,
            timers: BTreeSet::new(),
            dirty: Default::default(),
            transmits: VecDeque::new(),
            closes: VecDeque::new(),
            violations: 0,
            name,
            reporter,
            counters: RootCounters::default(),
        }
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.transmits.push_back(Transmit { conn, msg });
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
            arrived: now,
        };
        self.counters.pops += 1;
        self.timers.insert((pending.deadline, id));
        self.timers.insert((pending.order_deadline, id));
        self.pops.insert(id, pending);
        self.waiting.entry(topic.clone()).or_default().push_back(id);
        self.dirty.insert(topic);
    }

    /// Hands window entries to the waiting pops of `topic`, then answers finished pops.
    fn serve(&mut self, now: Time, topic: &Topic) {
        let Some(queue) = self.waiting.get(topic) else {
            return;
        };
        let queue: Vec<u64> = queue.iter().copied().collect();
        let budget = u64::from(self.settings.frame_bytes_max - FRAME_OVERHEAD_BYTES);
        let per_delivery =
            u64::from(self.settings.metadata_bytes_max + self.settings.topic_bytes_max) + 128;
        for &pop_id in &queue {
            let Some(window) = self.children.windows.get_mut(topic) else {
                break;
            };
            let pop = self.pops.get_mut(&pop_id).expect("queued pops exist");
            // Entries taken for this pop, grouped by the child and leaf they go to.
            let mut groups: BTreeMap<(ConnId, LeafId), Vec<ReserveItem>> = BTreeMap::new();
            while pop.deliveries.len() + pop.outstanding < pop.max {
                let Some((key, slot)) = window.first() else {
                    break;
                };
                if key.priority > pop.max_priority {
                    break;
                }
                if !window.is_certain(&key) && now < pop.order_deadline {
                    break;
                }
                let cost = u64::from(slot.size) + per_delivery;
                let taken = pop.deliveries.len() + pop.outstanding;
                if taken > 0 && pop.bytes + cost > budget {
                    break;
                }
                window.take(&key);
                pop.bytes += cost;
                pop.outstanding += 1;
                let reservation = self.next_reservation;
                self.next_reservation += 1;
                self.reservations.insert(
                    reservation,
                    Reservation {
                        pop: pop_id,
                        child: slot.child,
                        sent: now,
                    },
                );
                groups
                    .entry((slot.child, key.id.leaf()))
                    .or_default()
                    .push(ReserveItem { reservation, key });
            }
            let lease_ms = pop.lease_ms;
            for ((child, leaf), items) in groups {
                let reserve = Reserve {
                    leaf,
                    topic: topic.to_string(),
                    lease_ms,
                    items,
                    offer_seq: window.applied(child),
                };
                self.counters.reserves += 1;
                self.transmits.push_back(Transmit {
                    conn: child,
                    msg: Wire::Reserve(reserve),
                });
            }
        }
        for pop_id in queue {
            let pop = &self.pops[&pop_id];
            if pop.outstanding == 0 && (!pop.deliveries.is_empty() || now >= pop.deadline) {
                self.answer_pop(now, pop_id);
            }
        }
    }

    fn answer_pop(&mut self, now: Time, pop_id: u64) {
        let pop = self.pops.remove(&pop_id).expect("pop exists");
        if pop.deliveries.is_empty() {
            self.counters.empty_pops += 1;
        } else {
            self.counters.deliveries += pop.deliveries.len() as u64;
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
        for outcome in reserved.items {
            if outcome.result.is_err() {
                self.counters.reserves_denied += 1;
            }
            let reservation = self.reservations.remove(&outcome.reservation);
            if let Some(reservation) = &reservation {
                self.reporter.recorder.record_since(
                    now,
                    Metric::ReserveRoundTrip,
                    reservation.sent,
                );
            }
            let pop = reservation.and_then(|reservation| self.pops.get_mut(&reservation.pop));
            match (pop, outcome.result) {
                (Some(pop), result) => {
                    pop.outstanding -= 1;
                    if let Ok(delivery) = result {
                        pop.deliveries.push((outcome.key, delivery));
                    }
                    self.dirty.insert(pop.topic.clone());
                }
                // Nobody waits for this grant any more: end the lease now.
                (None, Ok(delivery)) => {
                    orphans
                        .entry(delivery.id.leaf())
                        .or_default()
                        .push(delivery.receipt());
                }
                (None, Err(_)) => {}
            }
        }
        for (leaf, receipts) in orphans {
            if let Ok(child) = self.children.route(leaf) {
                self.send(child, Wire::Release(Release { leaf, receipts }));
            }
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
            match self.children.route(receipt.id.leaf()) {
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
                    child,
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
            let Ok(child) = self.children.route(leaf) else {
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
                    child,
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
        let lost: Vec<u64> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.child == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in lost {
            let reservation = self.reservations.remove(&id).expect("present");
            if let Some(pop) = self.pops.get_mut(&reservation.pop) {
                pop.outstanding -= 1;
                self.dirty.insert(pop.topic.clone());
            }
        }
        let lost: Vec<u64> = self
            .confirms
            .iter()
            .filter(|(_, c)| c.child == conn)
            .map(|(t, _)| *t)
            .collect();
        for tag in lost {
            let confirm = self.confirms.remove(&tag).expect("present");
            self.fill_confirm(confirm, |_| Err(ReceiptError::Unavailable));
        }
        let lost: Vec<u64> = self
            .leaf_admins
            .iter()
            .filter(|(_, a)| a.child == conn)
            .map(|(t, _)| *t)
            .collect();
        for tag in lost {
            let pending = self.leaf_admins.remove(&tag).expect("present");
            self.merge_admin(pending, None);
        }
        // Frontiers of the lost child no longer hold anything back.
        self.dirty.extend(self.waiting.keys().cloned());
    }

    fn consumer_gone(&mut self, conn: ConnId) {
        let pops: Vec<u64> = self
            .pops
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(id, _)| *id)
            .collect();
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
                if let Ok(child) = self.children.route(leaf) {
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
        }
    }

    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
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
        self.serve_dirty(now);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.closes.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.timers.first().map(|(at, _)| *at)
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            window_entries: self.children.window_entries() as u64,
            children: self.children.children() as u64,
            pending_pops: self.pops.len() as u64,
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
            ("protocol_violations", self.violations),
        ];
        let gauges = [
            ("window_entries", self.children.window_entries() as u64),
            ("children", self.children.children() as u64),
            ("pending_pops", self.pops.len() as u64),
            ("reservations", self.reservations.len() as u64),
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
