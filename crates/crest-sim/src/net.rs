//! Simulated links: latency with jitter, in order per connection; lost packets resent after a
//! probe timeout; partitions that hold traffic or end connections.

use super::*;
use crest_core::id::Receipt;
use crest_core::machine::{ConnId, Link};
use crest_core::time::Time;
use crest_core::wire::{Hello, PROTOCOL_VERSION, PeerKind, ReceiptError, Role, Wire};
use std::time::Duration;

/// A partition in force.
pub(super) struct Cut {
    pub(super) index: usize,
    pub(super) nodes: Vec<usize>,
    pub(super) heal_at: Time,
    /// Whether it outlasted the idle timeout (its connections ended).
    pub(super) timed_out: bool,
}

impl Cut {
    pub(super) fn separates(&self, a: Owner, b: Owner) -> bool {
        let inside = |owner: Owner| matches!(owner, Owner::Node(n) if self.nodes.contains(&n));
        inside(a) != inside(b)
    }
}

impl Sim {
    /// One draw of a link's one-way latency: the base latency give or take the jitter.
    pub(super) fn link_latency_us(&mut self) -> u64 {
        let jitter = self.rng.below(self.link.jitter_us * 2 + 1);
        (self.link.latency_us + jitter).saturating_sub(self.link.jitter_us)
    }

    pub(super) fn schedule(&mut self, at: Time, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    pub(super) fn pair(&mut self, a: Owner, b: Owner) -> (ConnId, ConnId) {
        let (x, y) = (self.next_conn, self.next_conn + 1);
        self.next_conn += 2;
        self.ends.insert(x, (a, y));
        self.ends.insert(y, (b, x));
        (x, y)
    }

    /// Sends `msg` from the end `from` across its link.
    pub(super) fn send(&mut self, from: ConnId, msg: Wire) {
        let Some(&(from_owner, to)) = self.ends.get(&from) else {
            return;
        };
        let mut latency = self.link_latency_us();
        if self.link.loss > 0.0 {
            let retransmit = match self.link.retransmit_us {
                0 => self.link.latency_us * 3,
                us => us,
            };
            // Lost again with the same probability; bounded like QUIC's own probes.
            for _ in 0..8 {
                if self.rng.unit() >= self.link.loss {
                    break;
                }
                self.packets_lost += 1;
                latency += retransmit;
            }
        }
        let mut at = self.now + Duration::from_micros(latency);
        // Across a partition, QUIC keeps retransmitting: the message arrives after the heal.
        let to_owner = self.ends.get(&to).map(|(owner, _)| *owner);
        if let Some(to_owner) = to_owner
            && let Some(heal) = self
                .cuts
                .iter()
                .filter(|cut| cut.separates(from_owner, to_owner))
                .map(|cut| cut.heal_at)
                .max()
        {
            at = at.max(heal + Duration::from_micros(self.link.latency_us));
        }
        if let Some(last) = self.last_arrival.get(&to) {
            at = at.max(*last);
        }
        self.last_arrival.insert(to, at);
        self.schedule(at, Event::Deliver { to, msg });
    }

    /// Hands a node's outputs to the links, the disk and its timer.
    pub(super) fn drain(&mut self, node: usize) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.nodes[node].poll_storage() {
                progressed = true;
                let at = self.now + Duration::from_micros(self.disk.fsync_us);
                let fails = !matches!(op, crest_core::machine::StorageOp::Read { .. })
                    && self.disk.append_failures > 0.0
                    && self.rng.unit() < self.disk.append_failures;
                if fails {
                    // Nothing of it reaches the log; a waiter hears of it when the sync would
                    // have come.
                    self.disk_failures += 1;
                    if let Some(token) = op.token() {
                        let life = self.lives[node];
                        self.schedule(at, Event::StoreFailed { node, life, token });
                    }
                    continue;
                }
                // A replicated leaf's operation is durable once its group commits it.
                let replicated = self.groups[node].is_some()
                    && !matches!(op, crest_core::machine::StorageOp::Read { .. });
                let token = op.token();
                if let Some(token) = token
                    && !replicated
                {
                    let life = self.lives[node];
                    self.schedule(at, Event::Stored { node, life, token });
                }
                if let crest_core::machine::StorageOp::Read { token, locations } = &op {
                    // The simulated leaves keep bodies in memory and never ask; answer anyway.
                    let bodies = locations
                        .iter()
                        .map(|_| Err("the simulator keeps no bodies on disk".to_string()))
                        .collect();
                    let now = self.now;
                    self.nodes[node].handle_storage_read(now, *token, bodies);
                    continue;
                }
                self.logs[node].push((at, op));
                if replicated {
                    self.group_append(node, at, token);
                }
            }
            while let Some(transmit) = self.nodes[node].poll_transmit() {
                progressed = true;
                self.observe_transmit(node, transmit.conn, &transmit.msg);
                self.send(transmit.conn, transmit.msg);
            }
            while self.nodes[node].poll_close().is_some() {
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        // The simulator runs the machines' own invariant checks after every event.
        self.nodes[node].check_invariants();
        // A deadline already past fires now: armed as now, so that the timer event (at now)
        // disarms it and later deadlines can be armed again.
        if let Some(at) = self.nodes[node].poll_timeout().map(|at| at.max(self.now))
            && self.armed[node].is_none_or(|armed| at < armed)
        {
            self.armed[node] = Some(at);
            let life = self.lives[node];
            self.schedule(at, Event::Timer { node, life });
        }
    }

    pub(super) fn deliver(&mut self, to: ConnId, msg: Wire) {
        let Some(&(owner, _)) = self.ends.get(&to) else {
            return;
        };
        match owner {
            Owner::Node(node) => {
                if let Wire::Offer(offer) = &msg {
                    let histogram = match self.roles[node] {
                        Role::Root => Some(&mut self.bubble_root),
                        Role::Aggregator => Some(&mut self.bubble_aggregator),
                        Role::Leaf => None,
                    };
                    if let Some(histogram) = histogram {
                        for entry in &offer.adds {
                            let micros = self.now.saturating_since(entry.since).as_micros() as u64;
                            histogram.saturating_record(micros.max(1));
                        }
                    }
                }
                if let Wire::Push(push) = &msg {
                    // A simulated producer's batch is of one topic.
                    let topic = push.messages.first().map(|m| m.topic.clone());
                    let priorities = push.messages.iter().map(|m| m.priority).collect();
                    let pushed = (topic.unwrap_or_default(), priorities);
                    self.pushes.insert((to, push.request), pushed);
                }
                if self.roles[node] == Role::Leaf {
                    self.observe_settle(&msg);
                }
                self.nodes[node].handle_message(self.now, to, msg);
                self.drain(node);
                if matches!(self.roles[node], Role::Root | Role::Aggregator) {
                    let stats = self.nodes[node].stats();
                    let entries = stats.window_entries + stats.ahead_entries;
                    self.window_max = self.window_max.max(entries);
                }
            }
            Owner::Producer(producer) => match msg {
                Wire::PushAck(ack) => {
                    if let Some((sent, _)) = self.producers[producer].in_flight.remove(&ack.request)
                    {
                        let micros = self.now.saturating_since(sent).as_micros() as u64;
                        let topic = self.producers[producer].topic.clone();
                        let count = ack.ids.len() as u64;
                        self.push_ack.saturating_record_n(micros.max(1), count);
                        self.tally(&topic)
                            .push_ack
                            .saturating_record_n(micros.max(1), count);
                    }
                }
                Wire::Error(error) => {
                    if let Some(request) = error.request {
                        self.producers[producer].in_flight.remove(&request);
                    }
                }
                _ => {}
            },
            Owner::Consumer(consumer) => {
                if let Wire::AckReply(reply) = &msg
                    && let Some((receipts, tries)) =
                        self.consumers[consumer].acks.remove(&reply.request)
                {
                    let mut retry = Vec::new();
                    for (receipt, result) in receipts.iter().zip(&reply.results) {
                        match result {
                            Ok(()) => {
                                self.unconfirmed.remove(&receipt.id);
                            }
                            // A retry of an ack that timed out but was applied is told
                            // `Settled`: the ack stands.
                            Err(ReceiptError::Settled) if tries > 0 => {
                                self.unconfirmed.remove(&receipt.id);
                            }
                            // The leaf cannot be reached right now (a node on the way
                            // restarts), or did not answer in time: a consumer retries.
                            Err(ReceiptError::Unavailable | ReceiptError::TimedOut)
                                if tries < ACK_TRIES_MAX =>
                            {
                                retry.push(*receipt);
                            }
                            Err(_) => {}
                        }
                    }
                    if !retry.is_empty() {
                        let at = self.now + ACK_RETRY_AFTER;
                        self.schedule(
                            at,
                            Event::Reack {
                                consumer,
                                receipts: retry,
                                tries: tries + 1,
                            },
                        );
                    }
                }
                if let Wire::PopReply(reply) = msg {
                    let state = &mut self.consumers[consumer];
                    let Some((request, sent)) = state.pending else {
                        return;
                    };
                    if request != reply.request {
                        return;
                    }
                    state.pending = None;
                    if !reply.deliveries.is_empty() {
                        let micros = self.now.saturating_since(sent).as_micros() as u64;
                        self.pop_latency.saturating_record(micros.max(1));
                        let topic = self.consumers[consumer].topic.clone();
                        self.tally(&topic)
                            .pop_latency
                            .saturating_record(micros.max(1));
                        let receipts: Vec<Receipt> =
                            reply.deliveries.iter().map(|d| d.receipt()).collect();
                        self.ack(consumer, receipts, 1);
                    }
                    if self.consumers[consumer].spec.rate <= 0.0 {
                        self.pop(consumer);
                    }
                }
            }
        }
    }

    /// Connects `child` to `parent` (both up).
    pub(super) fn link(&mut self, child: usize, parent: usize) {
        let (c, p) = self.pair(Owner::Node(child), Owner::Node(parent));
        let now = self.now;
        self.nodes[parent].handle_connected(now, p, Link::Incoming);
        self.nodes[child].handle_connected(now, c, Link::Parent);
        self.drain(parent);
        self.drain(child);
    }

    /// Makes the root's missing direct links to leaves that are up and reachable.
    pub(super) fn link_direct(&mut self) {
        let root = self.root;
        if !self.up[root] {
            return;
        }
        for leaf in self.direct.clone() {
            let id = self.leaf_ids[leaf].expect("a leaf");
            let (r, l) = (Owner::Node(root), Owner::Node(leaf));
            if !self.up[leaf] || self.cut_off(r, l) || self.connected(r, l) {
                continue;
            }
            let (r_end, l_end) = self.pair(r, l);
            let now = self.now;
            self.nodes[leaf].handle_connected(now, l_end, Link::Incoming);
            self.nodes[root].handle_connected(now, r_end, Link::Leaf(id));
            self.drain(leaf);
            self.drain(root);
        }
    }

    pub(super) fn hello(peer: PeerKind) -> Wire {
        Wire::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            token: None,
            peer,
        })
    }

    /// Connects producer `p` to `leaf`.
    pub(super) fn connect_producer(&mut self, p: usize, leaf: usize) {
        let (client, node) = self.pair(Owner::Producer(p), Owner::Node(leaf));
        let now = self.now;
        self.nodes[leaf].handle_connected(now, node, Link::Incoming);
        self.send(client, Sim::hello(PeerKind::Producer));
        self.producers[p].ends.push(client);
    }

    /// Connects consumer `c` to the root.
    pub(super) fn connect_consumer(&mut self, c: usize, root: usize) {
        let (client, node) = self.pair(Owner::Consumer(c), Owner::Node(root));
        let now = self.now;
        self.nodes[root].handle_connected(now, node, Link::Incoming);
        self.send(client, Sim::hello(PeerKind::Consumer));
        self.consumers[c].end = client;
        self.consumers[c].pending = None;
    }

    /// Ends the connection with the end `end`: both ends vanish with what is in flight on them,
    /// and the owners that are up (but `skip`) are told.
    pub(super) fn close_conn(&mut self, end: ConnId, skip: Option<usize>) {
        self.end_conn(end, skip, false);
    }

    /// [`Sim::close_conn`] for a connection whose peer went silent for the idle timeout (a
    /// partition): the nodes are told [`crest_core::machine::Machine::handle_went_silent`].
    pub(super) fn time_out_conn(&mut self, end: ConnId) {
        self.end_conn(end, None, true);
    }

    fn end_conn(&mut self, end: ConnId, skip: Option<usize>, silent: bool) {
        let Some((owner, peer)) = self.ends.remove(&end) else {
            return;
        };
        let Some((peer_owner, _)) = self.ends.remove(&peer) else {
            return;
        };
        self.last_arrival.remove(&end);
        self.last_arrival.remove(&peer);
        let now = self.now;
        for (owner, end) in [(owner, end), (peer_owner, peer)] {
            match owner {
                Owner::Node(node) => {
                    if Some(node) != skip && self.up[node] {
                        if silent {
                            self.nodes[node].handle_went_silent(now, end);
                        } else {
                            self.nodes[node].handle_disconnected(now, end);
                        }
                        self.drain(node);
                    }
                }
                Owner::Producer(p) => {
                    self.producers[p].ends.retain(|e| *e != end);
                    self.producers[p].in_flight.retain(|_, (_, e)| *e != end);
                }
                Owner::Consumer(c) => {
                    self.consumers[c].pending = None;
                    self.consumers[c].acks.clear();
                }
            }
        }
        let ends = &self.ends;
        self.pushes.retain(|(end, _), _| ends.contains_key(end));
    }

    /// Whether a connection joins `a` and `b`.
    pub(super) fn connected(&self, a: Owner, b: Owner) -> bool {
        self.ends
            .values()
            .any(|(owner, peer)| *owner == a && self.ends.get(peer).is_some_and(|(o, _)| *o == b))
    }

    /// Whether a partition whose connections ended still separates `a` and `b`.
    pub(super) fn cut_off(&self, a: Owner, b: Owner) -> bool {
        self.cuts
            .iter()
            .any(|cut| cut.timed_out && cut.separates(a, b))
    }
}
