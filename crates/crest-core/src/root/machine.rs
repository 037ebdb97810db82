//! The root as a [`Machine`]: inputs dispatched, timers, outputs polled, and its invariants.

use super::*;
use crate::downstream::PeerKindTag;
use crate::machine::{ConnId, Link, Machine, NodeStats, Transmit};
use crate::metrics::{Metric, OwnReport, Report, named};
use crate::time::Time;
use crate::wire::{ErrorCode, ReceiptError, Stats, Wire};
use std::time::Duration;

impl Root {
    pub(super) fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
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
            self.pops.by_id.len() <= self.settings.root_pending_pops_max as usize,
            "{} pops held over root_pending_pops_max",
            self.pops.by_id.len()
        );
    }

    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link) {
        self.children.clock(now);
        match link {
            Link::Parent => {
                self.violations += 1;
                self.outbox.close(conn, "the root has no parent");
            }
            Link::Incoming => {
                self.children.accept(conn);
            }
            Link::Leaf(leaf) => {
                if self.children.route(leaf) == Err(ReceiptError::UnknownLeaf) {
                    self.violations += 1;
                    let reason = format!("leaf {leaf} is not in this tree");
                    self.outbox.close(conn, reason);
                    return;
                }
                self.direct.conns.insert(conn, leaf);
                let name = self.name.clone();
                self.send(
                    conn,
                    Wire::Hello(crate::wire::Hello {
                        protocol: crate::wire::PROTOCOL_VERSION,
                        token: None,
                        peer: crate::wire::PeerKind::Root { name },
                    }),
                );
            }
        }
    }

    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
        self.principals.remove(&conn);
        if self.direct.conns.contains_key(&conn) {
            self.direct_gone(conn);
            self.serve_dirty(now);
            return;
        }
        match self.children.peers.get(&conn) {
            Some(crate::downstream::Peer::Child { .. }) => self.child_gone(now, conn),
            Some(crate::downstream::Peer::Consumer) => {
                self.consumer_gone(now, conn);
                self.children.disconnect(conn, now);
            }
            _ => {
                self.children.disconnect(conn, now);
            }
        }
        self.serve_dirty(now);
    }

    fn handle_principal(&mut self, conn: ConnId, principal: Arc<Principal>) {
        self.principals.insert(conn, principal);
    }

    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        self.children.clock(now);
        if self.direct.conns.contains_key(&conn) {
            self.direct_message(now, conn, msg);
            self.serve_dirty(now);
            return;
        }
        let peer = self.children.peers.get(&conn).cloned();
        match (peer, msg) {
            (Some(crate::downstream::Peer::Child { .. }), Wire::Offer(offer))
                if let Err(text) = self.children.check_offer(conn, &offer) =>
            {
                self.violations += 1;
                self.send(conn, Wire::error(None, ErrorCode::InvalidArgument, text));
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Offer(offer)) => {
                self.counters.offers_received += 1;
                let topic = self.children.topic(&offer.topic);
                let credits = self.children.credit(&topic);
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
                if let Some(buffer) = self.ahead.buffers.get_mut(&topic) {
                    for entry in &delta.added {
                        if let Some(held) = buffer.held.remove(&entry.key) {
                            self.ahead.bytes -= held.delivery.payload.len() as u64;
                            let expiry = held.reserved_at
                                + Duration::from_millis(self.settings.reserve_ahead_hold_ms);
                            self.ahead
                                .expiry
                                .remove(&(expiry, entry.key, topic.clone()));
                            self.counters.ahead_revoked += 1;
                        }
                    }
                }
                self.dirty.insert(topic);
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Usage(usage))
                if self.children.route(usage.leaf) == Ok(conn) =>
            {
                let subtree = self.children.subtree_leaves();
                let wait = Duration::from_millis(self.settings.quota_start_wait_ms);
                let answer = self.ledger.report(now, &usage, &subtree, wait);
                if let Some(grant) = answer.grant {
                    self.send(conn, Wire::Grant(grant));
                }
                for scope in answer.stale {
                    self.repair_scope(now, scope);
                }
                for grant in answer.reclaim {
                    if let Ok(child) = self.children.route(grant.leaf) {
                        self.send(child, Wire::Grant(grant));
                    }
                }
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Report(report)) => {
                // Its first: the leaves below it are known now, but those it waits for.
                let heard = self.children.heard(conn);
                let changed = self.children.reported_absent(conn, &report.absent, now);
                self.reporter.child_report(conn, report);
                if heard || changed {
                    self.dirty.extend(self.pops.waiting.keys().cloned());
                }
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Reserved(reserved)) => {
                self.handle_reserved(now, conn, reserved)
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::Confirmed(confirmed)) => {
                self.handle_confirmed(conn, confirmed)
            }
            (Some(crate::downstream::Peer::Consumer), Wire::Pop(pop)) => {
                self.handle_pop(now, conn, pop)
            }
            (Some(crate::downstream::Peer::Child { .. }), Wire::LeafAdminReply(reply)) => {
                self.handle_leaf_admin_reply(conn, reply)
            }
            (Some(crate::downstream::Peer::Consumer), Wire::Ack(ack)) => {
                self.handle_ack(now, conn, ack)
            }
            (Some(crate::downstream::Peer::Consumer), Wire::Admin(admin)) => {
                self.handle_admin(now, conn, admin)
            }
            (_, Wire::Hello(hello)) => {
                let accepts = [PeerKindTag::Node, PeerKindTag::Consumer];
                let outcome = self.children.hello(conn, hello, &accepts, now);
                let reason = outcome.close_reason();
                self.send(conn, outcome.reply);
                if outcome.close {
                    self.outbox.close(conn, reason);
                }
                if let Some(old) = outcome.superseded {
                    self.child_gone(now, old);
                    self.outbox.close(old, "superseded by a new session");
                }
                if !self.ahead.parked.is_empty() {
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
                self.refuse(conn, request, ErrorCode::UnexpectedMessage, text);
            }
            (_, Wire::Error(_)) => self.violations += 1,
            (_, other) => self.reject_unexpected(conn, &other),
        }
        self.serve_dirty(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, pop_id)) = self.pops.deadlines.first() {
            if at > now {
                break;
            }
            self.pops.deadlines.pop_first();
            if let Some(pop) = self.pops.by_id.get(&pop_id) {
                self.dirty.insert(pop.topic.clone());
            }
        }
        self.release_stale_ahead(now);
        self.time_out_requests(now);
        if self.children.stop_waiting(now) {
            self.dirty.extend(self.pops.waiting.keys().cloned());
        }
        self.serve_dirty(now);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll_transmit()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.outbox.poll_close()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let pops = self.pops.deadlines.first().map(|(at, _)| *at);
        let ahead = self.ahead.expiry.first().map(|(at, _, _)| *at);
        pops.into_iter()
            .chain(ahead)
            .chain(self.next_request_check())
            .chain(self.children.next_wait_end())
            .min()
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            window_entries: self.children.window_entries() as u64,
            children: self.children.children() as u64,
            direct_links: self.direct.by_leaf.len() as u64,
            pending_pops: self.pops.by_id.len() as u64,
            ahead_entries: self
                .ahead
                .buffers
                .values()
                .map(|b| b.held.len() as u64)
                .sum(),
            violations: self.violations,
            ..NodeStats::default()
        }
    }

    fn histogram_totals(&self) -> std::collections::BTreeMap<Metric, crate::metrics::Hist> {
        self.reporter.recorder.totals()
    }

    fn report(&mut self, now: Time) -> Report {
        let c = self.counters;
        let counters = [
            ("pops", c.pops),
            ("empty_pops", c.empty_pops),
            ("pops_rate_limited", c.pops_rate_limited),
            ("pops_over_in_flight", c.pops_over_in_flight),
            ("deliveries", c.deliveries),
            ("reserves", c.reserves),
            ("reserves_denied", c.reserves_denied),
            ("requests_timed_out", c.requests_timed_out),
            ("settle_requests", c.settle_requests),
            ("admin_requests", c.admin_requests),
            ("configs_repaired", c.configs_repaired),
            ("offers_received", c.offers_received),
            ("reserved_ahead", c.reserved_ahead),
            ("ahead_hits", c.ahead_hits),
            ("ahead_released", c.ahead_released),
            ("ahead_revoked", c.ahead_revoked),
            ("protocol_violations", self.violations),
            ("consumer_lag_unmeasured", self.lag.unmeasured),
        ];
        let gauges = [
            ("window_entries", self.children.window_entries() as u64),
            ("children", self.children.children() as u64),
            ("direct_links", self.direct.by_leaf.len() as u64),
            ("pending_pops", self.pops.by_id.len() as u64),
            ("reservations", self.reservations.len() as u64),
            (
                "ahead_entries",
                self.ahead
                    .buffers
                    .values()
                    .map(|b| b.held.len() as u64)
                    .sum(),
            ),
            ("ahead_bytes", self.ahead.bytes),
            ("topics", self.children.windows.len() as u64),
        ];
        let own = OwnReport {
            name: self.name.clone(),
            role: "root",
            parent: None,
            connected: true,
            counters: named(&counters),
            gauges: named(&gauges),
            stats: Stats {
                limits: self.ledger.stats(|_| true),
                ..Stats::default()
            },
            absent: Vec::new(),
            group: None,
        };
        let mut report = self.reporter.report(now, own);
        report.consumer_lag = self.lag.snapshot();
        report
    }
}
