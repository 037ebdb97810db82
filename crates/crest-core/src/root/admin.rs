//! Admin requests: fanned out to the leaves concerned, their answers merged.

use super::*;
use crate::access::namespace;
use crate::config::FRAME_OVERHEAD_BYTES;
use crate::id::LeafId;
use crate::machine::ConnId;
use crate::quota::namespace_scope;
use crate::validate::validate_topic;
use crate::wire::{
    Admin, AdminOp, AdminReply, AdminResult, ErrorCode, LeafAdmin, LeafAdminReply, Stats,
    TopicConfig, Wire,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

impl Root {
    pub(super) fn validate_admin(&self, op: &AdminOp) -> Result<(), String> {
        let s = &self.settings;
        match op {
            AdminOp::Configure { topic, .. } => s.check_scope(topic)?,
            _ => {
                if let Some(topic) = op.topic() {
                    validate_topic(s, topic)?;
                }
            }
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
            AdminOp::SetMetadata { metadata, .. } => {
                crate::validate::validate_metadata(s, metadata)?;
            }
            AdminOp::Reprioritize { reason, .. } if reason.len() > s.reason_bytes_max as usize => {
                return Err(format!(
                    "reason of {} bytes exceeds reason_bytes_max {}",
                    reason.len(),
                    s.reason_bytes_max
                ));
            }
            AdminOp::MoveTopic { topic, to } => {
                validate_topic(s, to)?;
                if to == topic {
                    return Err(format!("moving {topic} into itself"));
                }
                if namespace(topic) != namespace(to) {
                    return Err(format!(
                        "{to} is in namespace {}, not {}: messages move within one",
                        namespace(to),
                        namespace(topic)
                    ));
                }
            }
            AdminOp::Configure { topic, config } => {
                config
                    .limits
                    .check_for(topic)
                    .map_err(|e| format!("{topic}: {e}"))?;
                if topic.ends_with('/') || topic.starts_with('@') {
                    if config.settings != crate::config::TopicSettings::default() {
                        return Err(format!(
                            "{topic} is a namespace or a principal: its configuration carries \
                             quotas and attributes, not a topic's settings"
                        ));
                    }
                } else {
                    config.settings.check(s, topic)?;
                }
                let bytes = config.attribute_bytes();
                if bytes > u64::from(s.topic_attributes_bytes_max) {
                    return Err(format!(
                        "{topic}: attributes of {bytes} bytes exceed topic_attributes_bytes_max {}",
                        s.topic_attributes_bytes_max
                    ));
                }
            }
            AdminOp::Configs { prefix, limit, .. } => {
                if *limit == 0 {
                    return Err("a listing of topic configurations needs a limit above 0".into());
                }
                if prefix.len() > s.topic_bytes_max as usize {
                    return Err(format!(
                        "prefix of {} bytes exceeds topic_bytes_max {}",
                        prefix.len(),
                        s.topic_bytes_max
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn handle_admin(&mut self, now: Time, conn: ConnId, mut admin: Admin) {
        self.counters.admin_requests += 1;
        // The root's clock orders configurations: the newest wins at every leaf.
        if let AdminOp::Configure { config, .. } = &mut admin.op {
            config.version = now;
        }
        if let Err(text) = self.validate_admin(&admin.op) {
            self.refuse(conn, admin.request, ErrorCode::InvalidArgument, text);
            return;
        }
        // A listing shows only what the principal may see, whatever the request says.
        if let AdminOp::Configs { within, .. } = &mut admin.op {
            *within = self.principals.get(&conn).map(|p| p.grants.clone());
        }
        // Who reprioritizes is the request's principal, whatever the request says.
        if let AdminOp::Reprioritize { by, .. } = &mut admin.op {
            *by = self.principal_of(conn).map(|p| p.to_string());
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
            AdminOp::Configs { limit, .. } => (
                *limit as usize,
                AdminResult::Configs {
                    configs: Vec::new(),
                    next: None,
                },
            ),
            AdminOp::Redrive { .. }
            | AdminOp::Purge { .. }
            | AdminOp::PurgeTopic { .. }
            | AdminOp::MoveTopic { .. }
            | AdminOp::Configure { .. }
            | AdminOp::Settle { .. } => (0, AdminResult::Count(0)),
            // A message of a leaf not in the tree is unknown to it.
            AdminOp::Reprioritize { .. } => (
                0,
                AdminResult::Reprioritized(Err(crate::wire::NotWaiting::Unknown)),
            ),
            AdminOp::SetMetadata { .. } => (
                0,
                AdminResult::MetadataSet(Err(crate::wire::NotWaiting::Unknown)),
            ),
            AdminOp::Stats { topic } => {
                // The topic's own limits and its namespace's; every scope's without a topic.
                let namespace = topic.as_deref().map(|t| namespace_scope(namespace(t)));
                let show = |scope: &str| {
                    topic.is_none()
                        || topic.as_deref() == Some(scope)
                        || namespace.as_deref() == Some(scope)
                };
                let stats = Stats {
                    limits: self.ledger.stats(show),
                    ..Stats::default()
                };
                (0, AdminResult::Stats(stats))
            }
        };
        let mut pending = PendingAdmin {
            conn,
            request: admin.request,
            limit,
            cut: None,
            name_cut: None,
            versions: Vec::new(),
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

    /// A leaf's answer to a `LeafAdmin`, taken only from the connection the request went on
    /// (as [`Root::handle_confirmed`]).
    pub(super) fn handle_leaf_admin_reply(&mut self, conn: ConnId, reply: LeafAdminReply) {
        match self.requests.leaf_admins.get(&reply.tag) {
            Some(pending) if pending.conn != conn => {
                self.violations += 1;
                return;
            }
            Some(_) => {}
            None => return,
        }
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
            (
                AdminResult::Configs { configs: all, .. },
                Some(AdminResult::Configs {
                    configs: theirs,
                    next,
                }),
            ) => {
                if let Some(last) = next {
                    let cut = match admin.name_cut.take() {
                        Some(cut) if cut <= last => cut,
                        _ => last,
                    };
                    admin.name_cut = Some(cut);
                }
                for (name, config) in theirs {
                    admin
                        .versions
                        .push((from.leaf, name.clone(), config.version));
                    match all.binary_search_by(|(n, _)| n.cmp(&name)) {
                        Ok(at) if all[at].1.version < config.version => all[at].1 = config,
                        Ok(_) => {}
                        Err(at) => all.insert(at, (name, config)),
                    }
                }
                if all.len() > admin.limit {
                    // What is cut here is listed on the next page, after the last one kept.
                    all.truncate(admin.limit);
                    let last = all
                        .last()
                        .map(|(name, _)| name.clone())
                        .expect("limit >= 1");
                    let cut = match admin.name_cut.take() {
                        Some(cut) if cut <= last => cut,
                        _ => last,
                    };
                    admin.name_cut = Some(cut);
                }
            }
            (AdminResult::Count(total), Some(AdminResult::Count(theirs))) => {
                *total = total.saturating_add(theirs);
            }
            (AdminResult::Stats(total), Some(AdminResult::Stats(more))) => total.merge(&more),
            (AdminResult::Reprioritized(total), Some(AdminResult::Reprioritized(theirs))) => {
                *total = theirs;
            }
            (AdminResult::MetadataSet(total), Some(AdminResult::MetadataSet(theirs))) => {
                *total = theirs;
            }
            (_, None) => admin.unreachable.push(from.leaf),
            (_, Some(_)) => {
                self.violations += 1;
                admin.unreachable.push(from.leaf);
            }
        }
        self.finish_admin(from.admin);
    }

    /// Sends the newest of each listed configuration to the leaves that answered an older one
    /// or none (a leaf unreachable when it was set): every listing heals the tree a little.
    /// Their answers come back under tags nobody waits for, and are dropped.
    fn repair_configs(
        &mut self,
        listed: &[(String, TopicConfig)],
        versions: &[(LeafId, String, Time)],
        unreachable: &[LeafId],
    ) {
        let answered: BTreeSet<LeafId> = self
            .children
            .subtree_leaves()
            .into_iter()
            .filter(|leaf| !unreachable.contains(leaf))
            .collect();
        let known: HashMap<(LeafId, &str), Time> = versions
            .iter()
            .map(|(leaf, name, version)| ((*leaf, name.as_str()), *version))
            .collect();
        for (name, config) in listed {
            for &leaf in &answered {
                let current = known
                    .get(&(leaf, name.as_str()))
                    .is_some_and(|version| *version >= config.version);
                if current {
                    continue;
                }
                let Ok(child) = self.route(leaf) else {
                    continue;
                };
                let tag = self.requests.next_tag;
                self.requests.next_tag += 1;
                let op = AdminOp::Configure {
                    topic: name.clone(),
                    config: Box::new(config.clone()),
                };
                self.counters.configs_repaired += 1;
                self.send(child, Wire::LeafAdmin(LeafAdmin { tag, leaf, op }));
            }
        }
    }

    /// Lists `scope`'s configuration at every leaf for the listing's read repair only (no
    /// client waits for it): a leaf whose usage report lacks a limited scope, or has an older
    /// configuration of it (it was away when it was set), gets the newest.
    pub(super) fn repair_scope(&mut self, now: Time, scope: String) {
        let op = AdminOp::Configs {
            prefix: scope,
            limit: 1,
            after: None,
            within: None,
        };
        self.handle_admin(now, ROOT_ITSELF, Admin { request: 0, op });
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
            stats
                .limits
                .retain(|l| principal.grants.any_in(namespace(&l.scope)));
        }
        let mut more = false;
        if let AdminResult::Configs { configs: all, next } = &mut admin.result {
            if let Some(cut) = &admin.name_cut {
                all.retain(|(name, _)| name <= cut);
                more = true;
                *next = Some(cut.clone());
            }
            self.repair_configs(all, &admin.versions, &admin.unreachable);
            if let Some(principal) = self.principals.get(&admin.conn) {
                all.retain(|(name, _)| principal.grants.any_in(namespace(name)));
            }
            let budget = u64::from(self.settings.frame_bytes_max - FRAME_OVERHEAD_BYTES)
                .saturating_sub(1024 + 8 * admin.unreachable.len() as u64);
            let mut bytes = 0;
            let fits = all
                .iter()
                .take_while(|(name, config)| {
                    bytes += config.frame_bytes(name);
                    bytes <= budget
                })
                .count();
            if fits < all.len() {
                all.truncate(fits.max(1));
                more = true;
                *next = all.last().map(|(name, _)| name.clone());
            }
        }
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
        if admin.conn == ROOT_ITSELF {
            return;
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
