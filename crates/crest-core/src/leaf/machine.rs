//! The leaf as a [`Machine`]: inputs dispatched, timers, offers flushed, outputs polled, and
//! its invariants.

use super::*;
use crate::downstream::{PeerKindTag, Topic, TopicSet};
use crate::id::MessageId;
use crate::machine::{
    ConnId, Link, Machine, NodeStats, StorageDone, StorageOp, SyncWait, Transmit,
};
use crate::metrics::{GroupReport, Metric, OwnReport, Report, named};
use crate::record::MessageBody;
use crate::time::Time;
use crate::wire::{ErrorCode, PushAck, Wire};
use std::collections::HashSet;
use std::sync::Arc;

impl Leaf {
    /// Everything time moves: lease deadlines, delays, time to live, dedup windows.
    pub(super) fn tick(&mut self, now: Time) {
        self.expire_held_pushes(now);
        let mut records = Vec::new();
        while let Some(&(deadline, id)) = self.leases.by_deadline.first() {
            if deadline > now {
                break;
            }
            let leased = self.end_lease(id);
            let reason = format!(
                "visibility timeout expired (attempt {})",
                leased.slot.attempt
            );
            self.delivery_failed(now, leased, 0, reason, &mut records);
        }
        while let Some((&(ready_at, id), _)) = self.delayed.first_key_value() {
            if ready_at > now {
                break;
            }
            let (_, delayed) = self.delayed.pop_first().expect("present");
            let key = self.key_of(delayed.priority, ready_at, id);
            let topic = self.topics.get_mut(&delayed.topic).expect("topic exists");
            topic.delayed -= 1;
            self.place(now, delayed.topic, key, delayed.slot);
        }
        while let Some(&(expires_at, id)) = self.ttl.by_expiry.first() {
            if expires_at > now {
                break;
            }
            self.ttl.by_expiry.pop_first();
            // A leased message expires when its lease ends without an ack.
            if self.leases.by_id.contains_key(&id) {
                continue;
            }
            let Some(ttl) = self.ttl.by_id.get(&id) else {
                continue;
            };
            let (topic, key) = (ttl.topic.clone(), ttl.key);
            let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
            let slot = match leaf_topic.unavailable(&key, None) {
                Some(slot) => Some(slot),
                None => self.delayed.remove(&(key.ready_at, id)).map(|delayed| {
                    leaf_topic.delayed -= 1;
                    delayed.slot
                }),
            };
            match slot {
                Some(slot) => self.expire(&topic, id, &slot, &mut records),
                None => {
                    self.ttl.by_id.remove(&id);
                }
            }
        }
        self.expire_dedup(now);
        self.log(now, None, SyncWait::Linger, records);
        self.age(now);
    }

    /// Sends each dirty topic's offer diff to the parent when the flush policy says so (or
    /// `force`), and forgets empty topics. Diffs that may wait stay dirty until the linger
    /// deadline (`offer_due`).
    pub(super) fn flush_offers(&mut self, now: Time, force: bool) {
        let (credits, key_credits) = (self.upstream.credits(), self.upstream.key_credits());
        let session = self.upstream.session();
        let force = force || self.offer_due.is_some_and(|due| due <= now);
        let mut lingering = TopicSet::default();
        for topic_name in std::mem::take(&mut self.dirty) {
            let Some(topic) = self.topics.get_mut(&topic_name) else {
                continue;
            };
            if let Some(parent) = session {
                let mut linger = false;
                for lane in topic.offers.lanes_mut(&topic_name) {
                    let credits = if lane.keyed { key_credits } else { credits };
                    let (lane, offers) = (lane.name, lane.set);
                    offers.rebalance(credits, self.config.settings.offer_swap, now);
                    let frontier = offers.best_unoffered();
                    if !self.flush_policy.due(offers, frontier, force) {
                        linger = true;
                        continue;
                    }
                    if let Some(offer) = offers.poll(&lane, frontier) {
                        if crate::trace::enabled() {
                            for entry in &offer.adds {
                                let span = crate::trace::Span {
                                    id: entry.key.id,
                                    topic: &topic_name,
                                    priority: entry.key.priority(),
                                    traceparent: "",
                                    elapsed: Duration::ZERO,
                                };
                                crate::trace::emit(crate::trace::Stage::Offer, span);
                            }
                        }
                        self.outbox.push(Transmit {
                            conn: parent,
                            msg: Wire::Offer(offer),
                        });
                    }
                }
                topic.offers.drop_idle_retired();
                if linger {
                    lingering.insert(topic_name);
                    continue;
                }
            }
            if topic.messages == 0
                && topic.offers.is_idle()
                && !self.dedup.keys.contains_key(&topic_name)
                && !self.has_pending_for(&topic_name)
            {
                self.topics.remove(&topic_name);
            }
        }
        // A forced flush leaves nothing waiting, so a deadline still set is in the future.
        self.offer_due = (!lingering.is_empty()).then(|| {
            self.offer_due
                .unwrap_or_else(|| self.flush_policy.deadline(now))
        });
        self.dirty = lingering;
    }

    pub(super) fn has_pending_for(&self, topic: &Topic) -> bool {
        self.writes
            .batches
            .values()
            .any(|batch| batch.messages.iter().any(|m| Arc::ptr_eq(&m.topic, topic)))
    }

    /// What the parent, or the root on its direct link, asks of the leaf.
    pub(super) fn handle_pop_path(&mut self, now: Time, conn: ConnId, msg: Wire) {
        match msg {
            Wire::Reserve(reserve) => self.handle_reserve(now, conn, reserve),
            Wire::Confirm(confirm) => self.handle_confirm(now, conn, confirm),
            Wire::Release(release) => self.handle_release(now, release),
            Wire::LeafAdmin(admin) => self.handle_admin(now, conn, admin),
            Wire::Grant(grant) if grant.leaf == self.config.id => {
                let grew = self.allowances.grant(&grant);
                self.release_held_pushes(now);
                if grew && !self.held_pushes.is_empty() {
                    self.allowances.ask(now);
                }
            }
            Wire::Error(_) => self.violations += 1,
            other => self.reject_unexpected(conn, &other),
        }
    }

    pub(super) fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
        self.violations += 1;
        let request = match msg {
            Wire::Pop(pop) => Some(pop.request),
            Wire::Ack(ack) => Some(ack.request),
            Wire::Admin(admin) => Some(admin.request),
            _ => None,
        };
        let text = format!(
            "leaf {:?} does not accept {} messages here",
            self.config.name,
            msg.name()
        );
        self.send(
            conn,
            Wire::error(request, ErrorCode::UnexpectedMessage, text),
        );
    }
}

impl Machine for Leaf {
    fn check_invariants(&self) {
        let changed = self.escalations.keys().chain(self.metadata.keys());
        for id in changed.take(INVARIANT_DEEP_ITEMS_MAX) {
            assert!(
                self.live.contains(id.seq()),
                "escalation or metadata of {id}, which is gone"
            );
        }
        // Every live message is in exactly one state, and each state's counts agree with the
        // tables that hold it.
        let (mut messages, mut delayed, mut leased) = (0u64, 0u64, 0u64);
        for (topic, t) in &self.topics {
            let available = t.offers.len() as u64;
            assert_eq!(
                t.messages,
                available + t.delayed + t.leased + t.dead.len() as u64,
                "topic {topic}: messages = available + delayed + leased + dead"
            );
            assert_eq!(
                t.ready.values().sum::<u64>(),
                available,
                "topic {topic}: ready by priority adds up to the available messages"
            );
            assert_eq!(
                t.dead.len(),
                t.dead_at.len(),
                "topic {topic}: dead letters indexed twice"
            );
            let size = |slot: &Slot| u64::from(slot.size);
            let bytes = t.offers.iter().map(|(_, s)| size(s)).sum::<u64>()
                + t.dead.values().map(|d| size(&d.slot)).sum::<u64>()
                + self
                    .delayed
                    .iter()
                    .filter(|(_, d)| d.topic == *topic)
                    .map(|(_, d)| size(&d.slot))
                    .sum::<u64>()
                + self
                    .leases
                    .by_id
                    .values()
                    .filter(|l| l.topic == *topic)
                    .map(|l| size(&l.slot))
                    .sum::<u64>();
            assert_eq!(
                t.bytes, bytes,
                "topic {topic}: bytes = the sizes of its messages"
            );
            messages += t.messages;
            delayed += t.delayed;
            leased += t.leased;
        }
        assert_eq!(
            self.live.len(),
            messages,
            "live ids = messages of every topic"
        );
        assert_eq!(
            delayed,
            self.delayed.len() as u64,
            "delayed counts match the delay table"
        );
        assert_eq!(
            leased,
            self.leases.by_id.len() as u64,
            "leased counts match the lease table"
        );
        assert_eq!(
            self.leases.by_deadline.len() + self.leases.settling,
            self.leases.by_id.len(),
            "one deadline per lease but those settling"
        );
        assert_eq!(
            self.ttl.by_id.len(),
            self.ttl.by_expiry.len(),
            "one expiry per time to live"
        );
        // The body cache's byte count, summed in full while the cache is small enough for that
        // to stay cheap.
        if self.bodies.cached.len() <= INVARIANT_DEEP_ITEMS_MAX {
            let cached: u64 = self
                .bodies
                .cached
                .values()
                .map(MessageBody::cached_bytes)
                .sum();
            assert_eq!(cached, self.bodies.bytes, "cached body bytes add up");
        }
        assert!(
            self.bodies.cached.len() == 0 || self.bodies.bytes > 0,
            "cached bodies take bytes"
        );
    }

    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link) {
        match link {
            Link::Parent => {
                // The driver reports a lost connection from a task of its own, so the former
                // session may not have ended here yet: it ends now, and what was offered on it
                // is offered again on this one.
                if let Some(former) = self.upstream.current() {
                    self.handle_disconnected(now, former);
                }
                let hello = self.upstream.connected(conn);
                self.outbox.push(hello);
            }
            Link::Incoming => {
                self.clients.accept(conn);
            }
            Link::Leaf(_) => {
                self.violations += 1;
                self.outbox.close(conn, "a leaf does not connect to leaves");
            }
        }
    }

    fn handle_principal(&mut self, conn: ConnId, principal: Arc<crate::access::Principal>) {
        self.principals.insert(conn, principal);
    }

    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
        self.principals.remove(&conn);
        // A held batch was not accepted: its producer sends it again on another connection.
        let tally = &mut self.push_tally;
        self.held_pushes.retain(|held| {
            if held.conn == conn {
                tally.give(held.principal.as_ref());
            }
            held.conn != conn
        });
        if self.upstream.disconnected(conn) {
            for topic in self.topics.values_mut() {
                topic.offers.reset();
            }
            return;
        }
        self.clients.disconnect(conn, now);
        // Batches of a vanished producer still become durable; only the ack has nowhere to go.
    }

    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        self.tick(now);
        if self.upstream.is(conn) {
            match msg {
                Wire::Welcome(welcome) => {
                    if self.upstream.welcomed(conn, &welcome) {
                        self.dirty.extend(self.topics.keys().cloned());
                        // Everything offered, then a report: the parent knows this subtree
                        // once the report arrives (see `absent_child_wait_ms`).
                        self.flush_offers(now, true);
                        self.report_tick(now);
                        self.allowances.greet(now);
                    }
                }
                other => self.handle_pop_path(now, conn, other),
            }
        } else if self.clients.peers.get(&conn) == Some(&crate::downstream::Peer::Root) {
            // The root's direct link: the pop path without the aggregators. Its reserves carry
            // no offer number (0), so an entry the parent was offered is retracted from it.
            self.handle_pop_path(now, conn, msg);
        } else {
            let peer = self.clients.peers.get(&conn);
            let is_producer = peer == Some(&crate::downstream::Peer::Producer);
            let is_consumer = peer == Some(&crate::downstream::Peer::Consumer);
            match msg {
                Wire::Hello(hello) => {
                    // Consumers come to settle what they were delivered from here.
                    let accepts = [
                        PeerKindTag::Producer,
                        PeerKindTag::Root,
                        PeerKindTag::Consumer,
                    ];
                    let outcome = self.clients.hello(conn, hello, &accepts, now);
                    let reason = outcome.close_reason();
                    self.send(conn, outcome.reply);
                    if outcome.close {
                        self.outbox.close(conn, reason);
                    }
                }
                Wire::Push(push) if is_producer => self.handle_push(now, conn, push),
                Wire::Ack(ack) if is_consumer => self.handle_client_settle(now, conn, ack),
                Wire::Push(push) => self.send(
                    conn,
                    Wire::error(
                        Some(push.request),
                        ErrorCode::UnexpectedMessage,
                        "Push before Hello",
                    ),
                ),
                other => self.reject_unexpected(conn, &other),
            }
        }
        self.flush_offers(now, false);
        self.report_usage(now);
        self.maybe_checkpoint(now);
        self.maybe_compact(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        self.tick(now);
        self.flush_offers(now, false);
        self.report_usage(now);
        self.maybe_checkpoint(now);
        self.maybe_compact(now);
    }

    fn set_group(&mut self, group: Option<GroupReport>) {
        self.group = group;
    }

    fn report_tick(&mut self, now: Time) {
        if let Some(parent) = self.upstream.session() {
            let report = self.report(now);
            self.send(parent, Wire::Report(report));
        }
    }

    fn histogram_totals(&self) -> std::collections::BTreeMap<Metric, crate::metrics::Hist> {
        self.reporter.recorder.totals()
    }

    fn report(&mut self, now: Time) -> Report {
        let c = self.counters;
        let swaps = self.topics.values().map(|t| t.offers.swaps()).sum();
        let credit_stalls = self.topics.values().map(|t| t.offers.credit_stalls()).sum();
        let dead: u64 = self.topics.values().map(|t| t.dead.len() as u64).sum();
        let available: u64 = self.topics.values().map(|t| t.offers.len() as u64).sum();
        let counters = [
            ("pushed", c.pushed),
            ("push_batches", c.push_batches),
            ("pushes_refused", c.pushes_refused),
            ("pushes_over_quota", c.pushes_over_quota),
            ("pushes_awaiting_allowance", c.pushes_awaiting_allowance),
            ("pushes_held", c.pushes_held),
            ("pushes_rate_limited", c.pushes_rate_limited),
            ("leased", c.leased),
            ("acked", c.acked),
            ("nacked", c.nacked),
            ("extended", c.extended),
            ("settle_requests", c.settle_requests),
            ("expired", c.expired),
            ("dead_lettered", c.dead_lettered),
            ("deduplicated", c.deduplicated),
            ("body_reads", c.body_reads),
            ("compacted", c.compacted),
            ("purged", c.purged),
            ("reprioritized", c.reprioritized),
            ("aged", c.aged),
            ("swaps", swaps),
            ("credit_stalls", credit_stalls),
            ("protocol_violations", self.violations),
        ];
        let messages = self.live.len();
        let leased = self.leases.by_id.len() as u64;
        let delayed = self.delayed.len() as u64;
        let gauges = [
            ("messages", messages),
            ("available", available),
            // Not `leased`: that is the counter of leases granted.
            ("in_flight", leased),
            ("delayed", delayed),
            ("dead", dead),
            ("pending_messages", self.writes.messages),
            ("topics", self.topics.len() as u64),
            ("body_cache_bytes", self.bodies.bytes),
            ("log_segments_live", self.bodies.segments.len() as u64),
        ];
        let own = OwnReport {
            name: self.config.name.clone(),
            role: "leaf",
            parent: self.upstream.parent_name(),
            connected: self.upstream.session().is_some(),
            counters: named(&counters),
            gauges: named(&gauges),
            stats: self.topic_stats(None),
            absent: Vec::new(),
            group: self.group.clone(),
        };
        self.reporter.report(now, own)
    }

    fn handle_storage_synced(&mut self, now: Time, sync: std::time::Duration) {
        let micros = u64::try_from(sync.as_micros()).unwrap_or(u64::MAX);
        self.reporter
            .recorder
            .record(now, Metric::LogSync, micros.max(1));
    }

    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        if self.grants_logged(now, done.token, true) {
            return;
        }
        if let Some(settlement) = self.writes.settlements.remove(&done.token) {
            self.settled(now, settlement.outcomes);
            self.answer_settlement(settlement.conn, settlement.answer, true);
            // Nacked messages are offered again; acked bodies may leave a segment mostly dead.
            self.flush_offers(now, false);
            self.maybe_compact(now);
            return;
        }
        if self
            .compactor
            .step
            .as_ref()
            .is_some_and(|c| c.writing && c.token == done.token)
        {
            self.compaction_written(now, done.locations);
            return;
        }
        let Some(batch) = self.writes.batches.remove(&done.token) else {
            return;
        };
        self.push_tally.give(batch.principal.as_ref());
        // One location per message the batch enqueues, or none from a store that keeps no
        // bodies (they stay in memory).
        let mut locations = done.locations.into_iter();
        if locations.len() != batch.messages.len() {
            if locations.len() != 0 {
                tracing::error!(
                    locations = locations.len(),
                    messages = batch.messages.len(),
                    "storage reported locations that do not match the batch; bodies stay in memory"
                );
            }
            locations = Vec::new().into_iter();
        }
        self.writes.messages -= batch.messages.len() as u64;
        if batch.failed.is_none() {
            self.counters.pushed += batch.messages.len() as u64;
            self.reporter
                .recorder
                .record_since(now, Metric::PushAck, batch.received_at);
            if crate::trace::enabled() {
                let elapsed = now.saturating_since(batch.received_at);
                for message in &batch.messages {
                    let span = crate::trace::Span {
                        id: message.id,
                        topic: &message.topic,
                        priority: message.key.priority(),
                        traceparent: crate::trace::traceparent(&message.body.metadata)
                            .unwrap_or_default(),
                        elapsed,
                    };
                    crate::trace::emit(crate::trace::Stage::Push, span);
                }
            }
        }
        let cache = self.config.settings.leaf_body_cache_bytes;
        // Consecutive messages mostly share a topic: each run takes its topic out of the map
        // once, and counts its acceptance time and its bodies' segment once.
        let mut run: Option<(Topic, LeafTopic, Age, MessageId)> = None;
        let mut placed: Vec<(u32, u64, u64)> = Vec::new();
        for message in batch.messages {
            let PendingMessage {
                id,
                topic,
                key,
                enqueued_at,
                expires_at,
                size,
                body,
                fairness_key,
            } = message;
            let same = run
                .as_ref()
                .is_some_and(|(t, _, age, _)| Arc::ptr_eq(t, &topic) && age.at == enqueued_at);
            if !same {
                if let Some(ended) = run.take() {
                    self.end_run(ended);
                }
                let leaf_topic = self
                    .topics
                    .remove(&topic)
                    .expect("topic kept while pending");
                let age = Age {
                    at: enqueued_at,
                    live: 0,
                };
                run = Some((topic.clone(), leaf_topic, age, id));
            }
            let (_, leaf_topic, age, _) = run.as_mut().expect("set above");
            leaf_topic.messages += 1;
            leaf_topic.bytes += u64::from(size);
            if let Some(fairness_key) = &fairness_key {
                leaf_topic.offers.set_key(id, fairness_key);
            }
            age.live += 1;
            self.live.insert(id.seq());
            self.track_expiry(expires_at, &topic, key);
            // A body in the log stays in memory within the cache; one not in the log, always.
            let (bytes, cached) = (body.bytes(), body.cached_bytes());
            let location = locations.next();
            match &location {
                Some(location) => {
                    let len = u64::from(location.len);
                    match placed.last_mut() {
                        Some((segment, count, total)) if *segment == location.segment => {
                            *count += 1;
                            *total += len;
                        }
                        _ => placed.push((location.segment, 1, len)),
                    }
                    if self.bodies.bytes + cached <= cache {
                        self.bodies.bytes += cached;
                        self.bodies.cached.insert(id, body);
                    }
                }
                None => {
                    self.bodies.bytes += cached;
                    self.bodies.unlogged_bytes += bytes;
                    self.bodies.cached.insert(id, body);
                }
            }
            let slot = Slot {
                location: location.unwrap_or(NO_LOCATION),
                size,
                attempt: 0,
            };
            place_in(leaf_topic, &mut self.delayed, now, topic, key, slot);
        }
        if self.aging_due().is_none() {
            self.schedule_aging(now);
        }
        if let Some(ended) = run {
            self.end_run(ended);
        }
        for (segment, count, bytes) in placed {
            self.bodies_placed(segment, count, bytes);
        }
        let reply = match batch.failed {
            None => Wire::PushAck(PushAck {
                request: batch.request,
                ids: batch.ids,
            }),
            Some(reason) => Wire::error(Some(batch.request), ErrorCode::StorageFailed, reason),
        };
        self.send(batch.conn, reply);
        self.flush_offers(now, false);
    }

    fn handle_storage_read(
        &mut self,
        now: Time,
        token: u64,
        bodies: Vec<Result<MessageBody, String>>,
    ) {
        if self
            .compactor
            .step
            .as_ref()
            .is_some_and(|c| !c.writing && c.token == token)
        {
            self.compaction_read(now, bodies);
        } else {
            self.bodies_read(now, token, bodies);
        }
        self.maybe_compact(now);
    }

    fn handle_storage_failed(&mut self, now: Time, token: u64, reason: &str) {
        if self
            .compactor
            .step
            .as_ref()
            .is_some_and(|c| c.writing && c.token == token)
        {
            // The bodies stay where they are; the segment is tried again later.
            tracing::warn!(reason, "compaction step not written");
            self.compactor.step = None;
            return;
        }
        if self.grants_logged(now, token, false) {
            return;
        }
        if let Some(settlement) = self.writes.settlements.remove(&token) {
            // Not applied: the leases go on, and whoever asked is told so.
            self.unsettled(&settlement.outcomes);
            self.answer_settlement(settlement.conn, settlement.answer, false);
            return;
        }
        let Some(batch) = self.writes.batches.remove(&token) else {
            return;
        };
        self.push_tally.give(batch.principal.as_ref());
        self.writes.messages -= batch.messages.len() as u64;
        // Dedup keys of the lost messages are forgotten; batches that were answered with their
        // ids fail too.
        let lost: HashSet<MessageId> = batch.messages.iter().map(|m| m.id).collect();
        let forgotten: Vec<(Topic, Box<str>)> = self
            .dedup
            .by_expiry
            .iter()
            .filter(|((_, id), _)| lost.contains(id))
            .map(|(_, (topic, key))| (topic.clone(), key.clone()))
            .collect();
        for (topic, key) in forgotten {
            self.forget_dedup(&topic, &key);
        }
        for other in self.writes.batches.values_mut() {
            if other.failed.is_none() && other.ids.iter().any(|id| lost.contains(id)) {
                other.failed = Some(format!(
                    "a message this batch duplicates could not be stored ({reason}); retry"
                ));
            }
        }
        let mut topics: HashSet<Topic> = batch.messages.iter().map(|m| m.topic.clone()).collect();
        topics.extend(self.dedup.keys.keys().cloned());
        let text =
            format!("the leaf could not store the batch ({reason}); nothing of it was accepted");
        self.send(
            batch.conn,
            Wire::error(Some(batch.request), ErrorCode::StorageFailed, text),
        );
        self.dirty.extend(topics);
        self.flush_offers(now, false);
    }

    fn poll_storage(&mut self) -> Option<StorageOp> {
        self.storage.pop_front()
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll_transmit()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.outbox.poll_close()
    }

    fn poll_timeout(&self) -> Option<Time> {
        [
            self.leases.by_deadline.first().map(|(at, _)| *at),
            self.delayed.first_key_value().map(|((at, _), _)| *at),
            self.ttl.by_expiry.first().map(|(at, _)| *at),
            self.dedup
                .by_expiry
                .first_key_value()
                .map(|((at, _), _)| *at),
            self.checkpoints.due,
            self.offer_due,
            self.allowances.due(),
            self.held_pushes_due(),
            self.aging_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            messages: self.live.len(),
            leased: self.leases.by_id.len() as u64,
            offered: self
                .topics
                .values()
                .map(|t| t.offers.offered_len() as u64)
                .sum(),
            parent_connected: self.upstream.session().is_some(),
            violations: self.violations,
            ..NodeStats::default()
        }
    }
}
