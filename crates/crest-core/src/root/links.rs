//! Connections that end: children, direct links to leaves (their reserves sent again through
//! the tree), consumers; and what arrives on a direct link.

use super::*;
use crate::downstream::Topic;
use crate::id::{LeafId, Receipt};
use crate::machine::ConnId;
use crate::time::Time;
use crate::wire::{ReceiptError, Release, Reserve, ReserveItem, Role, Wire};
use std::collections::BTreeMap;
use std::time::Duration;

impl Root {
    pub(super) fn child_gone(&mut self, now: Time, conn: ConnId) {
        self.reporter.child_gone(conn);
        if let Some(removed) = self.children.disconnect(conn, now) {
            self.dirty
                .extend(removed.into_iter().map(|(topic, _)| topic));
        }
        self.park_unreachable();
        self.fail_outstanding(conn);
    }

    /// A direct link ended: what went on it is answered as unavailable (as for a child), and
    /// the leaf is reached through the aggregators again.
    pub(super) fn direct_gone(&mut self, conn: ConnId) {
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
    pub(super) fn resend_through_the_tree(&mut self, lost: ConnId, leaf: LeafId) {
        let Ok(child) = self.children.route(leaf) else {
            return;
        };
        let numbers = sorted_where(&self.reservations, |r| r.conn == lost);
        let mut groups: BTreeMap<(Topic, u64, bool), Vec<ReserveItem>> = BTreeMap::new();
        for reservation in numbers {
            let r = self.reservations.get_mut(&reservation).expect("listed");
            r.conn = child;
            groups
                .entry((
                    r.topic.clone(),
                    r.lease_ms,
                    matches!(r.purpose, ReservedFor::Ahead),
                ))
                .or_default()
                .push(ReserveItem {
                    reservation,
                    key: r.key,
                });
        }
        for ((topic, lease_ms, ahead), items) in groups {
            self.counters.reserves += 1;
            let msg = Wire::Reserve(Reserve {
                leaf,
                topic: topic.to_string(),
                lease_ms,
                items,
                offer_seq: 0,
                direct: false,
                ahead,
            });
            self.send(child, msg);
        }
    }

    /// A direct link's `Welcome` (or refusal).
    pub(super) fn direct_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        let leaf = self.direct.conns[&conn];
        match msg {
            Wire::Welcome(welcome) if welcome.role == Role::Leaf => {
                if let Some(old) = self.direct.by_leaf.insert(leaf, conn)
                    && old != conn
                {
                    self.direct_gone(old);
                    self.outbox.close(old, "superseded by a new direct link");
                }
                if !self.ahead.parked.is_empty() {
                    self.release_parked();
                }
            }
            Wire::Welcome(welcome) => {
                self.violations += 1;
                let reason = format!("leaf {leaf}'s address answers as a {}", welcome.role);
                self.outbox.close(conn, reason);
            }
            Wire::Reserved(reserved) => self.handle_reserved(now, conn, reserved),
            Wire::Confirmed(confirmed) => self.handle_confirmed(conn, confirmed),
            Wire::LeafAdminReply(reply) => self.handle_leaf_admin_reply(conn, reply),
            // A refused handshake (say, a leaf of another protocol version): the pop path
            // stays on the aggregators.
            Wire::Error(_) => self.violations += 1,
            other => self.reject_unexpected(conn, &other),
        }
    }

    /// Answers everything that went on `conn` and was not answered as unavailable.
    pub(super) fn fail_outstanding(&mut self, conn: ConnId) {
        for id in sorted_where(&self.reservations, |r| r.conn == conn) {
            self.give_up_reservation(id);
        }
        for tag in sorted_where(&self.requests.confirms, |c| c.conn == conn) {
            let confirm = self.requests.confirms.remove(&tag).expect("present");
            self.fill_confirm(confirm, |_| Err(ReceiptError::Unavailable));
        }
        for tag in sorted_where(&self.requests.leaf_admins, |a| a.conn == conn) {
            let pending = self.requests.leaf_admins.remove(&tag).expect("present");
            self.merge_admin(pending, None, false);
        }
        // Frontiers of the lost child no longer hold anything back.
        self.dirty.extend(self.pops.waiting.keys().cloned());
    }

    /// Stops waiting for reservation `id`'s answer. Its entry left the window when it was
    /// taken; if the leaf granted it after all, the late grant is released when it arrives
    /// (or its lease expires at the leaf).
    fn give_up_reservation(&mut self, id: u64) {
        let reservation = self.reservations.remove(&id).expect("present");
        match reservation.purpose {
            ReservedFor::Pop(pop_id) => {
                if let Some(pop) = self.pops.by_id.get_mut(&pop_id) {
                    pop.outstanding -= 1;
                    self.dirty.insert(pop.topic.clone());
                }
            }
            ReservedFor::Ahead => {
                if let Some(buffer) = self.ahead.buffers.get_mut(&reservation.topic) {
                    buffer.outstanding.remove(&reservation.key);
                }
                self.ahead.bytes -= u64::from(reservation.size);
                self.dirty.insert(reservation.topic);
            }
        }
    }

    /// When requests routed to leaves are next checked against `request_timeout_ms` (`None`:
    /// none is outstanding, so an idle root is not woken).
    pub(super) fn next_request_check(&self) -> Option<Time> {
        let outstanding = !self.reservations.is_empty()
            || !self.requests.confirms.is_empty()
            || !self.requests.leaf_admins.is_empty();
        outstanding.then(|| self.requests.checked_at + self.request_check_period())
    }

    fn request_check_period(&self) -> Duration {
        Duration::from_millis(self.settings.request_timeout_ms / 4)
    }

    /// Gives up on reserves, confirms and leaf admin requests whose leaf has not answered
    /// within `request_timeout_ms`, though its link is up: a reserve's entry is passed over, a
    /// confirm is answered `TimedOut` (it may have been applied), an admin request names the
    /// leaf unreachable.
    pub(super) fn time_out_requests(&mut self, now: Time) {
        if now < self.requests.checked_at + self.request_check_period() {
            return;
        }
        self.requests.checked_at = now;
        let timeout = Duration::from_millis(self.settings.request_timeout_ms);
        let late = |sent: Time| sent + timeout <= now;
        let reservations = sorted_where(&self.reservations, |r| late(r.sent));
        let confirms = sorted_where(&self.requests.confirms, |c| late(c.sent));
        let admins = sorted_where(&self.requests.leaf_admins, |a| late(a.sent));
        let given_up = reservations.len() + confirms.len() + admins.len();
        if given_up == 0 {
            return;
        }
        self.counters.requests_timed_out += given_up as u64;
        tracing::warn!(
            reserves = reservations.len(),
            confirms = confirms.len(),
            admin = admins.len(),
            timeout_ms = self.settings.request_timeout_ms,
            "leaves did not answer in time; requests given up"
        );
        for id in reservations {
            self.give_up_reservation(id);
        }
        for tag in confirms {
            let confirm = self.requests.confirms.remove(&tag).expect("present");
            self.fill_confirm(confirm, |_| Err(ReceiptError::TimedOut));
        }
        for tag in admins {
            let pending = self.requests.leaf_admins.remove(&tag).expect("present");
            self.merge_admin(pending, None, false);
        }
    }

    pub(super) fn consumer_gone(&mut self, now: Time, conn: ConnId) {
        let pops = sorted_where(&self.pops.by_id, |p| p.conn == conn);
        for pop_id in pops {
            let pop = self.pops.by_id.remove(&pop_id).expect("present");
            self.tallies.pops.give(pop.principal.as_ref());
            if !pop.pop_scopes.is_empty() {
                // Its deliveries go back: so do their tokens.
                let none = std::iter::empty();
                self.ledger
                    .popped(now, &pop.pop_scopes, pop.pop_tokens, none);
            }
            self.pops.deadlines.remove(&(pop.deadline, pop_id));
            self.pops.deadlines.remove(&(pop.order_deadline, pop_id));
            if let Some(queue) = self.pops.waiting.get_mut(&pop.topic) {
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
        let tally = &mut self.tallies.requests;
        self.requests.acks.retain(|_, ack| {
            let keep = ack.conn != conn;
            if !keep {
                tally.give(ack.principal.as_ref());
            }
            keep
        });
        self.requests.admins.retain(|_, admin| {
            let keep = admin.conn != conn;
            if !keep {
                tally.give(admin.principal.as_ref());
            }
            keep
        });
    }
}
