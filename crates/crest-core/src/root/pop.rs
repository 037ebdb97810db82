//! Pops: validated, held while the best entry is not yet certain (long-poll, refills), served
//! from the window and the reserve-ahead buffers, answered once their grants are back.

use super::*;
use crate::ahead::Held;
use crate::config::FRAME_OVERHEAD_BYTES;
use crate::downstream::Topic;
use crate::id::{LeafId, Receipt};
use crate::machine::ConnId;
use crate::metrics::Metric;
use crate::quota::PopRefused;
use crate::time::Time;
use crate::validate::validate_topic;
use crate::wire::{
    Confirm, ErrorCode, Pop, PopReply, Release, ReserveItem, Reserved, Settle, Wire,
};
use std::collections::BTreeMap;
use std::time::Duration;

impl Root {
    pub(super) fn validate_pop(&self, pop: &Pop) -> Result<(), (ErrorCode, String)> {
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
        if self.pops.by_id.len() >= s.root_pending_pops_max as usize {
            return Err((
                ErrorCode::Overloaded,
                "too many pops waiting at the root; retry".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn handle_pop(&mut self, now: Time, conn: ConnId, pop: Pop) {
        if let Err((code, message)) = self.validate_pop(&pop) {
            self.refuse(conn, pop.request, code, message);
            return;
        }
        if !self.permit(conn, pop.request, &pop.topic, Some(Permission::Consume)) {
            return;
        }
        if self.standby && self.children.children() == 0 {
            let text = format!(
                "root {:?} stands by and no node is with it: pop at another root",
                self.name
            );
            self.refuse(conn, pop.request, ErrorCode::Unavailable, text);
            return;
        }
        let principal = self.principal_of(conn);
        if !self.admit(conn, pop.request, principal.as_ref(), true) {
            return;
        }
        let pop_scopes = self.ledger.pop_scopes(&pop.topic, principal.as_deref());
        let mut max = pop.max as usize;
        let mut pop_tokens = 0;
        if !pop_scopes.is_empty() {
            match self.ledger.take_pops(now, &pop_scopes, max as u64) {
                Ok(tokens) => {
                    pop_tokens = tokens;
                    max = tokens as usize;
                }
                Err(refused) => {
                    self.tallies.pops.give(principal.as_ref());
                    let reply = match refused {
                        PopRefused::RateLimited { rate, wait_ms } => {
                            self.counters.pops_rate_limited += 1;
                            Wire::rate_limited(pop.request, rate, wait_ms)
                        }
                        PopRefused::InFlight(quota) => {
                            self.counters.pops_over_in_flight += 1;
                            Wire::over_quota(pop.request, quota)
                        }
                    };
                    if conn != ROOT_ITSELF {
                        self.send(conn, reply);
                    }
                    return;
                }
            }
        }
        let id = self.pops.next_id;
        self.pops.next_id += 1;
        let topic = self.children.topic(&pop.topic);
        let pending = PendingPop {
            conn,
            request: pop.request,
            topic: topic.clone(),
            max,
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
            principal,
            pop_scopes,
            pop_tokens,
        };
        self.counters.pops += 1;
        self.pops.deadlines.insert((pending.deadline, id));
        self.pops.deadlines.insert((pending.order_deadline, id));
        self.pops.by_id.insert(id, pending);
        self.pops
            .waiting
            .entry(topic.clone())
            .or_default()
            .push_back(id);
        self.dirty.insert(topic);
    }

    /// Hands entries to the waiting pops of `topic` — in key order for a strict topic; for a
    /// weighted one, lane by lane as stride scheduling over its tiers picks them, each lane in
    /// key order — from the window (a reserve to the leaf) or from the reserve-ahead buffer
    /// (granted already), answers finished pops, then tops the buffer up.
    pub(super) fn serve(&mut self, now: Time, topic: &Topic) {
        let queue: Vec<u64> = self
            .pops
            .waiting
            .get(topic)
            .map(|queue| queue.iter().copied().collect())
            .unwrap_or_default();
        let weighted = !self.children.lanes_of(topic).is_empty();
        let lanes: Vec<(Topic, LaneWeights)> = if weighted {
            let lanes = self.children.lanes_of(topic).iter();
            lanes
                .map(|(_, lane)| (lane.clone(), LaneWeights::of(lane)))
                .collect()
        } else {
            vec![(topic.clone(), LaneWeights::STRICT)]
        };
        let mut stride = weighted.then(|| {
            let mut stride = self.strides.remove(topic).unwrap_or_default();
            stride.keep(&lanes);
            stride
        });
        for &pop_id in &queue {
            let taken = self.fill(now, pop_id, &lanes, stride.as_mut());
            let lease_ms = self.pops.by_id[&pop_id].lease_ms;
            self.send_reserves(&lanes, lease_ms, taken.reserves);
            for (leaf, receipts) in taken.extends {
                self.extend_unanswered(leaf, receipts, lease_ms);
            }
        }
        if let Some(stride) = stride {
            self.strides.insert(topic.clone(), stride);
        }
        for pop_id in queue {
            let pop = &self.pops.by_id[&pop_id];
            if pop.outstanding == 0 && (!pop.deliveries.is_empty() || now >= pop.deadline) {
                self.answer_pop(now, pop_id);
            }
        }
        if !weighted {
            self.top_up(now, topic);
        }
    }

    /// Gives pop `pop_id` entries of `lanes` until it holds its `max`, its answer's frame is
    /// full, or no entry may be served to it now; what it took that the leaves must hear of.
    fn fill(
        &mut self,
        now: Time,
        pop_id: u64,
        lanes: &[(Topic, LaneWeights)],
        mut stride: Option<&mut Stride>,
    ) -> Taken {
        // Leaves below not yet known (a restart, a child's session that ended): nothing is
        // certain, and pops wait for them (bounded by `absent_child_wait_ms`).
        let awaiting = self.children.awaiting(now);
        let frame = FrameRoom {
            bytes: u64::from(self.settings.frame_bytes_max - FRAME_OVERHEAD_BYTES),
            per_delivery: u64::from(
                self.settings.metadata_bytes_max + self.settings.topic_bytes_max,
            ) + 128,
        };
        let mut filling = Filling {
            now,
            pop_id,
            frame,
            hold: Duration::from_millis(self.settings.reserve_ahead_hold_ms),
            pop: self.pops.by_id.get_mut(&pop_id).expect("queued pops exist"),
            windows: &mut self.children.windows,
            ahead: &mut self.ahead,
            reservations: &mut self.reservations,
            ahead_hits: &mut self.counters.ahead_hits,
            direct: &self.direct,
            taken: Taken::default(),
        };
        while filling.wants_more() {
            let Some((at, key, source)) = pick(
                now,
                lanes,
                filling.windows,
                &filling.ahead.buffers,
                stride.as_deref(),
                filling.pop,
                awaiting,
            ) else {
                break;
            };
            let (lane, weights) = &lanes[at];
            let took = match source {
                Source::Awaited(reservation) => filling.claim(lane, key, reservation),
                Source::Buffer => filling.take_buffered(lane, key),
                // Answer with what the buffer gave rather than wait a round trip for more —
                // everything taken is more urgent than this entry, so the order holds —, once
                // the buffer filled at least half the pop (a buffer smaller than the demand
                // must not shrink every batch).
                Source::Window if filling.pop.from_ahead && filling.half_full() => false,
                Source::Window => filling.reserve(at, lane, key),
            };
            if !took {
                break;
            }
            if let Some(stride) = stride.as_deref_mut() {
                stride.served(lane, *weights);
            }
        }
        filling.taken
    }

    /// Sends the reserves a pop's entries need: one per lane, child and leaf.
    fn send_reserves(
        &mut self,
        lanes: &[(Topic, LaneWeights)],
        lease_ms: u64,
        wanted: BTreeMap<(usize, ConnId, LeafId), Vec<ReserveItem>>,
    ) {
        let mut by_lane: BTreeMap<usize, BTreeMap<(ConnId, LeafId), Vec<ReserveItem>>> =
            BTreeMap::new();
        for ((at, child, leaf), items) in wanted {
            by_lane.entry(at).or_default().insert((child, leaf), items);
        }
        for (at, groups) in by_lane {
            let (lane, _) = &lanes[at];
            let window = self.children.windows.get(lane);
            self.counters.reserves += groups.len() as u64;
            self.outbox.extend(reserves(
                lane,
                lease_ms,
                groups,
                window,
                &self.direct,
                false,
            ));
        }
    }

    /// Moves the visibility timeout of buffered deliveries handed to a pop that asked for
    /// another one. Nobody waits for the answer: a refused extend shows on the consumer's ack.
    pub(super) fn extend_unanswered(
        &mut self,
        leaf: LeafId,
        receipts: Vec<Receipt>,
        lease_ms: u64,
    ) {
        let Ok(child) = self.route(leaf) else {
            return;
        };
        // A tag the root never registers: the leaf's `Confirmed` is dropped on arrival.
        let tag = self.requests.next_tag;
        self.requests.next_tag += 1;
        self.send(
            child,
            Wire::Confirm(Confirm {
                tag,
                leaf,
                op: Settle::Extend { lease_ms },
                receipts,
                grants: None,
            }),
        );
    }

    pub(super) fn answer_pop(&mut self, now: Time, pop_id: u64) {
        let pop = self.pops.by_id.remove(&pop_id).expect("pop exists");
        self.tallies.pops.give(pop.principal.as_ref());
        if !pop.pop_scopes.is_empty() {
            let delivered = pop.deliveries.iter().map(|(_, d)| d.id.leaf());
            self.ledger
                .popped(now, &pop.pop_scopes, pop.pop_tokens, delivered);
        }
        if pop.deliveries.is_empty() {
            self.counters.empty_pops += 1;
        } else {
            self.counters.deliveries += pop.deliveries.len() as u64;
            if self.settings.reserve_ahead_max > 0 {
                self.ahead
                    .buffers
                    .entry(pop.topic.clone())
                    .or_default()
                    .demand
                    .taken(now, pop.deliveries.len() as u64);
            }
            if crate::trace::enabled() {
                let elapsed = now.saturating_since(pop.arrived);
                for (_, delivery) in &pop.deliveries {
                    let span = crate::trace::Span {
                        id: delivery.id,
                        topic: &delivery.topic,
                        priority: delivery.priority,
                        traceparent: crate::trace::traceparent(&delivery.metadata)
                            .unwrap_or_default(),
                        elapsed,
                    };
                    crate::trace::emit(crate::trace::Stage::Delivery, span);
                }
            }
            let recorder = &mut self.reporter.recorder;
            recorder.record_since(now, Metric::Pop, pop.arrived);
            recorder.record(now, Metric::PopBatch, pop.deliveries.len() as u64);
            let series_max = self.settings.consumer_lag_series_max as usize;
            let delivered = pop
                .deliveries
                .iter()
                .map(|(key, d)| (d.priority, key.ready_at));
            self.lag.record_pop(now, &pop.topic, delivered, series_max);
        }
        self.pops.deadlines.remove(&(pop.deadline, pop_id));
        self.pops.deadlines.remove(&(pop.order_deadline, pop_id));
        if let Some(queue) = self.pops.waiting.get_mut(&pop.topic) {
            queue.retain(|id| *id != pop_id);
            if queue.is_empty() {
                self.pops.waiting.remove(&pop.topic);
            }
        }
        let mut deliveries = pop.deliveries;
        deliveries.sort_by_key(|(key, _)| *key);
        let deliveries = deliveries
            .into_iter()
            .map(|(_, mut delivery)| {
                delivery.token ^= self.receipt_mask(pop.conn, delivery.id);
                delivery
            })
            .collect();
        self.send(
            pop.conn,
            Wire::PopReply(PopReply {
                request: pop.request,
                deliveries,
            }),
        );
    }

    /// A leaf's answers to reserves. Each is taken only from the connection its reserve went
    /// on: another node answering for a subtree not its own is a violation, and its answer
    /// changes nothing (not even the lease it names, which is not its to end).
    pub(super) fn handle_reserved(&mut self, now: Time, conn: ConnId, reserved: Reserved) {
        let mut orphans: BTreeMap<LeafId, Vec<Receipt>> = BTreeMap::new();
        let mut extends: Vec<(Receipt, u64)> = Vec::new();
        for outcome in reserved.items {
            if self
                .reservations
                .get(&outcome.reservation)
                .is_some_and(|r| r.key == outcome.key && r.conn != conn)
            {
                self.violations += 1;
                continue;
            }
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
            self.ahead.round_trip_us = (self.ahead.round_trip_us * 7 + sample) / 8;
            match reservation.purpose {
                ReservedFor::Pop(pop_id) => {
                    match (self.pops.by_id.get_mut(&pop_id), outcome.result) {
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
                    }
                }
                ReservedFor::Ahead => {
                    let topic = reservation.topic;
                    let buffer = self.ahead.buffers.entry(topic.clone()).or_default();
                    buffer.outstanding.remove(&outcome.key);
                    self.ahead.bytes -= u64::from(reservation.size);
                    if outcome.result == Err(crate::wire::ReserveDenied::InOrder) {
                        buffer.in_order = true;
                    }
                    if let Ok(delivery) = outcome.result {
                        self.ahead.bytes += delivery.payload.len() as u64;
                        let hold = Duration::from_millis(self.settings.reserve_ahead_hold_ms);
                        self.ahead.expiry.insert((
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

    pub(super) fn serve_dirty(&mut self, now: Time) {
        let dirty = std::mem::take(&mut self.dirty);
        // A lane's change serves its topic's pops, once.
        let mut served = crate::downstream::TopicSet::default();
        for name in &dirty {
            let topic = crate::lanes::topic_of(name);
            if served.contains(topic) {
                continue;
            }
            let topic = if topic.len() == name.len() {
                name.clone()
            } else {
                self.children.topic(topic)
            };
            self.serve(now, &topic);
            served.insert(topic);
        }
        for name in dirty.into_iter().chain(served) {
            let topic = crate::lanes::topic_of(&name);
            let idle = self.children.windows.get(&name).is_none_or(|w| w.is_idle());
            if idle && !self.pops.waiting.contains_key(topic) {
                self.children.remove_window(&name);
                if self.children.lanes_of(topic).is_empty() {
                    self.strides.remove(topic);
                }
            }
            if self
                .ahead
                .buffers
                .get(&name)
                .is_some_and(|buffer| buffer.is_idle())
            {
                self.ahead.buffers.remove(&name);
            }
        }
    }
}

/// One pop being given entries, with the parts of the root it takes them from (borrowed
/// apart from the other pops). Each way of taking answers whether the pop's answer had room.
struct Filling<'a> {
    now: Time,
    pop_id: u64,
    frame: FrameRoom,
    /// `reserve_ahead_hold_ms`.
    hold: Duration,
    pop: &'a mut PendingPop,
    windows: &'a mut TopicMap<Window>,
    ahead: &'a mut ReserveAhead,
    reservations: &'a mut Reservations,
    ahead_hits: &'a mut u64,
    direct: &'a DirectLinks,
    taken: Taken,
}

impl Filling<'_> {
    /// Whether the pop may take more: not granted yet, and short of its `max`.
    fn wants_more(&self) -> bool {
        let pop = &self.pop;
        !pop.granted && pop.deliveries.len() + pop.outstanding < pop.max
    }

    /// Whether the pop holds at least half its `max`.
    fn half_full(&self) -> bool {
        self.pop.deliveries.len() * 2 >= self.pop.max
    }

    /// Claims a reserve-ahead grant on its way: the pop waits for it like one of its own
    /// reserves (never passing over it).
    fn claim(&mut self, lane: &Topic, key: Key, reservation: u64) -> bool {
        let ahead = self
            .reservations
            .get_mut(&reservation)
            .expect("outstanding");
        let took = self.frame.admits(self.pop, u64::from(ahead.size));
        if took {
            ahead.purpose = ReservedFor::Pop(self.pop_id);
            self.ahead.bytes -= u64::from(ahead.size);
            let buffer = self.ahead.buffers.get_mut(lane).expect("picked from it");
            buffer.outstanding.remove(&key);
            self.pop.outstanding += 1;
        }
        took
    }

    /// Takes a delivery granted ahead from the buffer.
    fn take_buffered(&mut self, lane: &Topic, key: Key) -> bool {
        let buffer = self.ahead.buffers.get_mut(lane).expect("picked from it");
        let size = buffer.held[&key].delivery.payload.len() as u64;
        let took = self.frame.admits(self.pop, size);
        if took {
            let held = buffer.held.remove(&key).expect("picked from it");
            self.ahead.bytes -= size;
            let expiry = held.reserved_at + self.hold;
            self.ahead.expiry.remove(&(expiry, key, lane.clone()));
            *self.ahead_hits += 1;
            let extends = &mut self.taken.extends;
            deliver_buffered(self.now, self.pop, key, held, extends);
        }
        took
    }

    /// Takes the window's first entry of lane `at` for a reserve to its leaf.
    fn reserve(&mut self, at: usize, lane: &Topic, key: Key) -> bool {
        let window = self.windows.get_mut(lane).expect("picked from it");
        let (_, slot) = window.first().expect("picked from it");
        let took = self.frame.admits(self.pop, u64::from(slot.size));
        if took {
            window.take(&key);
            self.pop.outstanding += 1;
            let sent = Sent {
                now: self.now,
                conn: self.direct.or(key.id.leaf(), slot.child),
                lease_ms: self.pop.lease_ms,
            };
            let purpose = ReservedFor::Pop(self.pop_id);
            let reservation = self.reservations.add(purpose, lane, key, slot, sent);
            self.taken
                .reserves
                .entry((at, slot.child, key.id.leaf()))
                .or_default()
                .push(ReserveItem { reservation, key });
        }
        took
    }
}

/// What a pop took that its leaves must hear of: entries of the windows to reserve, by lane,
/// child and leaf; buffered deliveries whose lease must follow the pop's, by leaf.
#[derive(Default)]
struct Taken {
    reserves: BTreeMap<(usize, ConnId, LeafId), Vec<ReserveItem>>,
    extends: BTreeMap<LeafId, Vec<Receipt>>,
}

/// The room of a pop's answer: one frame.
struct FrameRoom {
    bytes: u64,
    /// What a delivery costs besides its payload, at most.
    per_delivery: u64,
}

impl FrameRoom {
    /// Whether `pop`'s answer has room for a delivery of `payload` bytes (the first always
    /// has: a frame holds any one payload); if so, counts it.
    fn admits(&self, pop: &mut PendingPop, payload: u64) -> bool {
        let cost = payload + self.per_delivery;
        let first = pop.deliveries.is_empty() && pop.outstanding == 0;
        let fits = first || pop.bytes + cost <= self.bytes;
        if fits {
            pop.bytes += cost;
        }
        fits
    }
}

/// The entry `pop` may have next, by lane (the index into `lanes`), and where it is: per lane,
/// the most urgent of the window, the buffer and the grants on their way, if certain (or the
/// pop waited its `pop_order_wait_ms`) and within the pop's priorities; of those lanes, the
/// stride's pick (a strict topic has one lane).
fn pick(
    now: Time,
    lanes: &[(Topic, LaneWeights)],
    windows: &TopicMap<Window>,
    buffers: &TopicMap<AheadBuffer>,
    stride: Option<&Stride>,
    pop: &PendingPop,
    awaiting: bool,
) -> Option<(usize, Key, Source)> {
    let mut pick: Option<(usize, Key, Source)> = None;
    for (at, (lane, weights)) in lanes.iter().enumerate() {
        let window = windows.get(lane);
        let buffer = buffers.get(lane);
        let in_window = window.and_then(|window| window.first());
        let in_buffer = buffer.and_then(|buffer| buffer.first());
        let awaited = buffer.and_then(|buffer| buffer.first_awaited());
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
            continue;
        };
        if key.priority() > pop.max_priority {
            continue;
        }
        let certain = !awaiting && window.is_none_or(|window| window.is_certain(&key));
        if !certain && (awaiting || now < pop.order_deadline) {
            continue;
        }
        let better = match (stride, pick) {
            (_, None) => true,
            (Some(stride), Some((best, _, _))) => {
                let (best, best_weights) = &lanes[best];
                stride.before((lane, *weights), (best, *best_weights))
            }
            (None, Some(_)) => false,
        };
        if better {
            pick = Some((at, key, source));
        }
    }
    pick
}

/// Hands `pop` a delivery granted ahead, its lease moved to the pop's (noted in `extends`,
/// by leaf) when that differs from the one it was reserved with.
fn deliver_buffered(
    now: Time,
    pop: &mut PendingPop,
    key: Key,
    held: Held,
    extends: &mut BTreeMap<LeafId, Vec<Receipt>>,
) {
    let mut delivery = held.delivery;
    if held.lease_ms != pop.lease_ms {
        delivery.lease_deadline = now + Duration::from_millis(pop.lease_ms);
        extends
            .entry(key.id.leaf())
            .or_default()
            .push(delivery.receipt());
    }
    pop.deliveries.push((key, delivery));
    pop.from_ahead = true;
}
