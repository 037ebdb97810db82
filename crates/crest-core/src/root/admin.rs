//! Admin requests: fanned out to the leaves concerned, their answers merged.

use super::*;
use crate::access::namespace;
use crate::config::FRAME_OVERHEAD_BYTES;
use crate::id::LeafId;
use crate::machine::ConnId;
use crate::validate::validate_topic;
use crate::wire::{
    Admin, AdminOp, AdminReply, AdminResult, ErrorCode, LeafAdmin, LeafAdminReply, Stats, Wire,
};
use std::collections::BTreeMap;

impl Root {
    pub(super) fn validate_admin(&self, op: &AdminOp) -> Result<(), String> {
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
        match op {
            AdminOp::DeadLetters { limit, .. } if *limit == 0 || *limit > s.pop_messages_max => {
                return Err(format!(
                    "limit {limit} is outside 1..={} (pop_messages_max)",
                    s.pop_messages_max
                ));
            }
            AdminOp::Settle { ids, .. } if ids.is_empty() => {
                return Err("settling leases needs the ids of their messages".into());
            }
            AdminOp::Settle { op, .. } => crate::validate::validate_settle_op(&self.settings, op)?,
            _ => {}
        }
        Ok(())
    }

    pub(super) fn handle_admin(&mut self, now: Time, conn: ConnId, admin: Admin) {
        self.counters.admin_requests += 1;
        if let Err(text) = self.validate_admin(&admin.op) {
            self.refuse(conn, admin.request, ErrorCode::InvalidArgument, text);
            return;
        }
        if let Some(topic) = admin.op.topic() {
            // A topic's stats need a permission in its namespace, dead letters `admin`.
            let permitted = match admin.op {
                AdminOp::Stats { .. } => self.permit(conn, admin.request, topic, None),
                _ => self.permit(conn, admin.request, topic, Some(Permission::Admin)),
            };
            if !permitted {
                return;
            }
        }
        if self.requests.admins.len() >= self.settings.root_pending_requests_max as usize {
            let text = "too many admin requests waiting at the root; retry";
            self.refuse(conn, admin.request, ErrorCode::Overloaded, text);
            return;
        }
        let principal = self.principal_of(conn);
        if !self.admit(conn, admin.request, principal.as_ref(), false) {
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
        let admin_id = self.requests.next_tag;
        self.requests.next_tag += 1;
        let (limit, result) = match &admin.op {
            AdminOp::DeadLetters { limit, .. } => {
                (*limit as usize, AdminResult::DeadLetters(Vec::new()))
            }
            AdminOp::Redrive { .. }
            | AdminOp::Purge { .. }
            | AdminOp::PurgeTopic { .. }
            | AdminOp::Settle { .. } => (0, AdminResult::Count(0)),
            AdminOp::Stats { .. } => (0, AdminResult::Stats(Stats::default())),
        };
        let mut pending = PendingAdmin {
            conn,
            request: admin.request,
            limit,
            cut: None,
            outstanding: 0,
            result,
            unreachable: Vec::new(),
            principal,
        };
        for (leaf, ids) in targets {
            let Ok(child) = self.route(leaf) else {
                pending.unreachable.push(leaf);
                continue;
            };
            let op = if ids.is_empty() {
                admin.op.clone()
            } else {
                admin.op.with_ids(ids)
            };
            let tag = self.requests.next_tag;
            self.requests.next_tag += 1;
            self.requests.leaf_admins.insert(
                tag,
                PendingLeafAdmin {
                    admin: admin_id,
                    conn: child,
                    leaf,
                    sent: now,
                },
            );
            pending.outstanding += 1;
            self.send(child, Wire::LeafAdmin(LeafAdmin { tag, leaf, op }));
        }
        self.requests.admins.insert(admin_id, pending);
        self.finish_admin(admin_id);
    }

    pub(super) fn handle_leaf_admin_reply(&mut self, reply: LeafAdminReply) {
        let Some(pending) = self.requests.leaf_admins.remove(&reply.tag) else {
            return;
        };
        self.merge_admin(pending, reply.result, reply.more);
    }

    /// Merges one leaf's answer (`None`: unreachable); `more`: its listing stopped short.
    pub(super) fn merge_admin(
        &mut self,
        from: PendingLeafAdmin,
        result: Option<AdminResult>,
        more: bool,
    ) {
        let Some(admin) = self.requests.admins.get_mut(&from.admin) else {
            return;
        };
        admin.outstanding -= 1;
        match (&mut admin.result, result) {
            (AdminResult::DeadLetters(all), Some(AdminResult::DeadLetters(theirs))) => {
                if more && let Some(last) = theirs.iter().map(|d| (d.dead_at, d.id)).max() {
                    admin.cut = Some(admin.cut.map_or(last, |cut| cut.min(last)));
                }
                all.extend(theirs);
                all.sort_by_key(|d| (d.dead_at, d.id));
                all.truncate(admin.limit);
            }
            (AdminResult::Count(total), Some(AdminResult::Count(theirs))) => {
                *total = total.saturating_add(theirs);
            }
            (AdminResult::Stats(total), Some(AdminResult::Stats(more))) => total.merge(&more),
            (_, None) => admin.unreachable.push(from.leaf),
            (_, Some(_)) => {
                self.violations += 1;
                admin.unreachable.push(from.leaf);
            }
        }
        self.finish_admin(from.admin);
    }

    pub(super) fn finish_admin(&mut self, admin_id: u64) {
        if self.requests.admins[&admin_id].outstanding > 0 {
            return;
        }
        let mut admin = self.requests.admins.remove(&admin_id).expect("present");
        self.tallies.requests.give(admin.principal.as_ref());
        admin.unreachable.sort_unstable();
        if let (AdminResult::Stats(stats), Some(principal)) =
            (&mut admin.result, self.principals.get(&admin.conn))
        {
            stats
                .topics
                .retain(|t| principal.grants.any_in(namespace(&t.topic)));
        }
        let mut more = false;
        if let AdminResult::DeadLetters(all) = &mut admin.result {
            if let Some(cut) = admin.cut {
                all.retain(|d| (d.dead_at, d.id) <= cut);
                more = all.len() < admin.limit;
            }
            // The merged listing must fit one frame as well (with room for the rest of the
            // reply: the unreachable leaves and the headers).
            let budget = u64::from(self.settings.frame_bytes_max - FRAME_OVERHEAD_BYTES)
                .saturating_sub(1024 + 8 * admin.unreachable.len() as u64);
            let mut bytes = 0;
            let fits = all
                .iter()
                .take_while(|d| {
                    bytes += d.frame_bytes();
                    bytes <= budget
                })
                .count();
            if fits < all.len() {
                all.truncate(fits.max(1));
                more = true;
            }
        }
        self.send(
            admin.conn,
            Wire::AdminReply(AdminReply {
                request: admin.request,
                result: admin.result,
                unreachable: admin.unreachable,
                more,
            }),
        );
    }
}
