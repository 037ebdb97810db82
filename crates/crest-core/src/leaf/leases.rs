//! The pop path at its owner: reserves granted as leases, their answers with bodies, acks,
//! nacks, extends, releases, and the moves to the dead-letter queue.

use super::*;
use crate::downstream::Topic;
use crate::id::{MessageId, Receipt};
use crate::key::Key;
use crate::machine::{ConnId, StorageOp, SyncWait};
use crate::record::{Location, LogRecord, MessageBody};
use crate::time::Time;
use crate::wire::{
    Ack, AckReply, AdminResult, Confirm, Confirmed, Delivery, ErrorCode, LeafAdminReply,
    ReceiptError, Release, Reserve, ReserveDenied, ReserveOutcome, Reserved, Settle, Wire,
};
use std::time::Duration;

impl Leaf {
    pub(super) fn handle_reserve(&mut self, now: Time, conn: ConnId, reserve: Reserve) {
        let mut outcomes = Vec::with_capacity(reserve.items.len());
        // A lease record per item, mostly.
        let mut records = Vec::with_capacity(reserve.items.len());
        let mut missing = Vec::new();
        let topic = self
            .topics
            .get_key_value(crate::lanes::topic_of(&reserve.topic))
            .map(|(topic, _)| topic.clone());
        // The FIFO groups this reserve leased in (`leaf/fifo.rs`).
        let mut granted: HashMap<Arc<str>, usize> = HashMap::new();
        for item in reserve.items {
            let id = item.key.id;
            let available = topic
                .as_ref()
                .is_some_and(|t| self.topics[t].offers.get(&item.key).is_some());
            let refusal = topic
                .as_ref()
                .filter(|_| available)
                .and_then(|t| self.topics[t].fifo_refusal(&item.key, &granted, reserve.ahead));
            let result = match topic.clone() {
                Some(topic) if available && refusal.is_some() => {
                    // Offered again: the parent took it from its window.
                    let leaf_topic = self.topics.get_mut(&topic).expect("present");
                    let slot = leaf_topic
                        .unavailable(&item.key, Some(reserve.offer_seq))
                        .expect("present");
                    leaf_topic.make_available(item.key, slot);
                    self.dirty.insert(topic);
                    Err(refusal.expect("checked"))
                }
                Some(topic) if available => {
                    if self.expires_at(id) <= now {
                        let leaf_topic = self.topics.get_mut(&topic).expect("present");
                        let slot = leaf_topic.unavailable(&item.key, None).expect("present");
                        self.expire(&topic, id, &slot, &mut records);
                        Err(ReserveDenied::Gone)
                    } else {
                        if let Some(group) = self.topics[&topic].fifo_group(id) {
                            *granted.entry(group).or_default() += 1;
                        }
                        Ok(self.lease(now, topic, item.key, reserve.lease_ms, reserve.offer_seq))
                    }
                }
                _ if self.leases.by_id.contains_key(&id) => Err(ReserveDenied::Leased),
                _ => Err(ReserveDenied::Gone),
            };
            if let Ok((delivery, cached)) = &result {
                self.counters.leased += 1;
                if crate::trace::enabled() {
                    let span = crate::trace::Span {
                        id,
                        topic: &delivery.topic,
                        priority: delivery.priority,
                        traceparent: "",
                        elapsed: Duration::ZERO,
                    };
                    crate::trace::emit(crate::trace::Stage::Reserve, span);
                }
                records.push(LogRecord::Lease {
                    id,
                    attempt: delivery.attempt,
                    deadline: delivery.lease_deadline,
                    token: delivery.token,
                });
                if !cached {
                    missing.push(outcomes.len());
                }
            }
            outcomes.push(ReserveOutcome {
                reservation: item.reservation,
                key: item.key,
                result: result.map(|(delivery, _)| delivery),
            });
        }
        let logging = if self.config.settings.lease_grants_wait_for_log && !records.is_empty() {
            let token = self.writes.next_token;
            self.writes.next_token += 1;
            self.log(now, Some(token), SyncWait::Now, records);
            Some(token)
        } else {
            self.log(now, None, SyncWait::Linger, records);
            None
        };
        // Refill the parent's window before answering, on the same stream: by the time the root
        // sees the answer it already holds this leaf's next entries, so its next pop is exact.
        self.flush_offers(now, true);
        let locations: Vec<Location> = missing
            .iter()
            .map(|&index| {
                let id = outcomes[index].key.id;
                self.leases.by_id[&id].slot.location
            })
            .collect();
        let waiting = Waiting::Reserved(outcomes);
        self.answer(conn, waiting, missing, locations, logging);
    }

    /// Leases available message `key` of `topic`; `offer_seq` is the parent's
    /// [`Reserve::offer_seq`]. Also says whether the delivery carries its body (`false`: it
    /// must be read).
    pub(super) fn lease(
        &mut self,
        now: Time,
        topic: Topic,
        key: Key,
        lease_ms: u64,
        offer_seq: u64,
    ) -> (Delivery, bool) {
        let lease_ms = lease_ms.clamp(1, self.config.settings.lease_timeout_max_ms);
        let token = self.next_lease_token();
        let deadline = now + Duration::from_millis(lease_ms);
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let mut slot = leaf_topic
            .unavailable(&key, Some(offer_seq))
            .expect("checked");
        leaf_topic.leased += 1;
        leaf_topic.fifo_leased(key);
        let enqueued_at = leaf_topic.enqueued_at(key.id);
        let fairness_key = leaf_topic.offers.key_of(key.id).map(|key| key.to_string());
        slot.attempt += 1;
        self.dirty.insert(topic.clone());
        self.leases.by_deadline.insert((deadline, key.id));
        let body = self.bodies.cached.get(&key.id).cloned();
        let cached = body.is_some();
        let body = body.unwrap_or_default();
        let delivery = Delivery {
            id: key.id,
            token,
            topic: topic.to_string(),
            priority: key.priority(),
            attempt: slot.attempt,
            enqueued_at,
            lease_deadline: deadline,
            metadata: self.metadata_of(key.id, body.metadata),
            payload: body.payload,
            escalation: match self.escalations.is_empty() {
                true => None,
                false => self.escalations.get(&key.id).cloned(),
            },
            fairness_key,
        };
        self.hold(topic, key, slot, token, deadline);
        (delivery, cached)
    }

    /// Records a live lease on `key`'s message (out of its topic's index already).
    fn hold(&mut self, topic: Topic, key: Key, slot: Slot, token: u64, deadline: Time) {
        let leased = Leased {
            topic,
            key,
            slot,
            token,
            deadline,
            settling: false,
        };
        self.leases.by_id.insert(key.id, leased);
    }

    /// Recovery: a lease the log holds that has not ended nor expired is live again, with its
    /// token (so its receipt settles it) and deadline; its attempt is the message's already.
    pub(super) fn restore_lease(&mut self, topic: Topic, key: Key, token: u64, deadline: Time) {
        let leaf_topic = self.topics.get_mut(&topic).expect("recovered");
        let Some(slot) = leaf_topic.unavailable(&key, None) else {
            return;
        };
        leaf_topic.leased += 1;
        leaf_topic.fifo_leased(key);
        self.dirty.insert(topic.clone());
        self.leases.by_deadline.insert((deadline, key.id));
        self.hold(topic, key, slot, token, deadline);
    }

    /// Sends an answer once the bodies at `locations` (those of the items at `missing`) are
    /// read from the log and the append `logging` (its grants' records) is durable, after every
    /// answer queued before it.
    pub(super) fn answer(
        &mut self,
        conn: ConnId,
        waiting: Waiting,
        missing: Vec<usize>,
        locations: Vec<Location>,
        logging: Option<u64>,
    ) {
        let read = if locations.is_empty() {
            None
        } else {
            let token = self.writes.next_token;
            self.writes.next_token += 1;
            self.counters.body_reads += locations.len() as u64;
            self.storage.push_back(StorageOp::Read { token, locations });
            Some(token)
        };
        self.answers.push_back(Answer {
            conn,
            read,
            logging,
            missing,
            waiting,
        });
        self.send_answers();
    }

    /// The lease records of an answer's grants are durable (`ok`), or were refused: then its
    /// grants are undone (the messages available again, attempts given back) and denied
    /// `Unavailable`. Returns whether `token` was such an append.
    pub(super) fn grants_logged(&mut self, now: Time, token: u64, ok: bool) -> bool {
        if !self.config.settings.lease_grants_wait_for_log {
            return false;
        }
        let Some(index) = self.answers.iter().position(|a| a.logging == Some(token)) else {
            return false;
        };
        self.answers[index].logging = None;
        if !ok {
            let mut undone = Vec::new();
            if let Waiting::Reserved(items) = &mut self.answers[index].waiting {
                for item in items.iter_mut() {
                    let Ok(delivery) = &item.result else { continue };
                    let live = self
                        .leases
                        .by_id
                        .get(&delivery.id)
                        .is_some_and(|l| l.token == delivery.token && !l.settling);
                    if live {
                        undone.push(delivery.id);
                    }
                    item.result = Err(ReserveDenied::Unavailable);
                }
            }
            for id in undone {
                let Leased {
                    topic,
                    key,
                    mut slot,
                    ..
                } = self.end_lease(id);
                slot.attempt = slot.attempt.saturating_sub(1);
                self.place(now, topic, key, slot);
            }
            self.flush_offers(now, false);
        }
        self.send_answers();
        true
    }

    /// Sends the answers at the front of the queue that wait for nothing.
    pub(super) fn send_answers(&mut self) {
        while self
            .answers
            .front()
            .is_some_and(|a| a.read.is_none() && a.logging.is_none())
        {
            let answer = self.answers.pop_front().expect("checked");
            let msg = match answer.waiting {
                Waiting::Reserved(items) => Wire::Reserved(Reserved { items }),
                Waiting::DeadLetters { tag, letters, more } => {
                    Wire::LeafAdminReply(LeafAdminReply {
                        tag,
                        result: Some(AdminResult::DeadLetters(letters)),
                        more,
                    })
                }
            };
            self.send(answer.conn, msg);
        }
    }

    /// Bodies read for an answer: filled in, or, where a read failed, the message is moved to
    /// the dead letters with the reason (a reserve of it is denied; a listing omits it).
    pub(super) fn bodies_read(
        &mut self,
        now: Time,
        token: u64,
        bodies: Vec<Result<MessageBody, String>>,
    ) {
        let Some(index) = self.answers.iter().position(|a| a.read == Some(token)) else {
            return;
        };
        // Taken out while the leaf changes state below, put back ready to send.
        let placeholder = Answer {
            conn: 0,
            read: None,
            logging: None,
            missing: Vec::new(),
            waiting: Waiting::Reserved(Vec::new()),
        };
        let mut answer = std::mem::replace(&mut self.answers[index], placeholder);
        answer.read = None;
        let mut records = Vec::new();
        for (&item, body) in answer.missing.iter().zip(bodies) {
            match (&mut answer.waiting, body) {
                (Waiting::Reserved(items), Ok(body)) => {
                    if let Ok(delivery) = &mut items[item].result {
                        delivery.metadata = self.metadata_of(delivery.id, body.metadata);
                        delivery.payload = body.payload;
                    }
                }
                (Waiting::Reserved(items), Err(error)) => {
                    let id = items[item].key.id;
                    let token = items[item].result.as_ref().map_or(0, |d| d.token);
                    items[item].result = Err(ReserveDenied::Gone);
                    // Only while the lease granted for this answer is still live: it may have
                    // ended (and the message moved on) while the read was under way.
                    // Not while it is settling: the settlement decides.
                    if self
                        .leases
                        .by_id
                        .get(&id)
                        .is_some_and(|l| l.token == token && !l.settling)
                    {
                        let Leased {
                            topic, key, slot, ..
                        } = self.end_lease(id);
                        let reason = format!("body unreadable from the log: {error}");
                        tracing::error!(%id, %reason, "message moved to the dead letters");
                        self.move_to_dead(now, topic, key, slot, reason, &mut records);
                    }
                }
                (Waiting::DeadLetters { letters, .. }, Ok(body)) => {
                    letters[item].metadata = self.metadata_of(letters[item].id, body.metadata);
                    letters[item].payload = body.payload;
                }
                (Waiting::DeadLetters { letters, .. }, Err(error)) => {
                    tracing::error!(id = %letters[item].id, %error, "dead letter body unreadable");
                    letters[item].reason = format!(
                        "{} (body unreadable from the log: {error})",
                        letters[item].reason
                    );
                }
            }
        }
        self.answers[index] = answer;
        self.log(now, None, SyncWait::Linger, records);
        self.send_answers();
    }

    /// Deletes a message whose time to live passed (taken out of its index by the caller).
    pub(super) fn expire(
        &mut self,
        topic: &Topic,
        id: MessageId,
        slot: &Slot,
        records: &mut Vec<LogRecord>,
    ) {
        self.forget(topic, id, slot, false);
        self.counters.expired += 1;
        records.push(LogRecord::Delete { id });
    }

    /// Checks a receipt against the live lease; `Ok` gives the message's id.
    pub(super) fn check_receipt(
        &self,
        now: Time,
        receipt: &Receipt,
    ) -> Result<MessageId, ReceiptError> {
        match self.leases.by_id.get(&receipt.id) {
            // Its outcome is not known until the record settling it is durable.
            Some(lease) if lease.token == receipt.token && lease.settling => {
                Err(ReceiptError::Unavailable)
            }
            Some(lease) if lease.token == receipt.token && lease.deadline > now => Ok(receipt.id),
            Some(_) => Err(ReceiptError::Stale),
            None if receipt.id.leaf() == self.config.id && self.live.contains(receipt.id.seq()) => {
                Err(ReceiptError::Stale)
            }
            // Ids are given in order: one below the next was queued here once, and is gone.
            None if receipt.id.leaf() == self.config.id && receipt.id.seq() < self.next_seq => {
                Err(ReceiptError::Settled)
            }
            None => Err(ReceiptError::UnknownMessage),
        }
    }

    /// `id` if `grants` (none: no check) allow `consume` in its leased message's namespace.
    fn may_consume(
        &self,
        grants: Option<&crate::access::Grants>,
        id: MessageId,
    ) -> Result<MessageId, ReceiptError> {
        let Some(grants) = grants else { return Ok(id) };
        let topic = &self.leases.by_id[&id].topic;
        if grants.allow(
            crate::access::namespace(topic),
            crate::access::Permission::Consume,
        ) {
            Ok(id)
        } else {
            Err(ReceiptError::Forbidden)
        }
    }

    /// Ends the live lease of a message: it is in no index until the caller places it.
    pub(super) fn end_lease(&mut self, id: MessageId) -> Leased {
        let leased = self.leases.by_id.remove(&id).expect("leased");
        if leased.settling {
            self.leases.settling -= 1;
        } else {
            self.leases.by_deadline.remove(&(leased.deadline, id));
        }
        let topic = self.topics.get_mut(&leased.topic).expect("topic exists");
        topic.leased -= 1;
        if topic.fifo_unleased(&leased.key) {
            self.dirty.insert(leased.topic.clone());
        }
        leased
    }

    /// Holds a lease while the record settling it is logged: it cannot expire, be extended,
    /// released or settled again until [`Leaf::settled`] or [`Leaf::unsettled`].
    fn settling(&mut self, id: MessageId) -> &Leased {
        let leased = self.leases.by_id.get_mut(&id).expect("leased");
        debug_assert!(!leased.settling, "settled twice");
        leased.settling = true;
        self.leases.by_deadline.remove(&(leased.deadline, id));
        self.leases.settling += 1;
        leased
    }

    /// The records of a settlement are durable: its outcomes apply.
    pub(super) fn settled(&mut self, now: Time, outcomes: Vec<(MessageId, Outcome)>) {
        let tracing = crate::trace::enabled();
        for (id, outcome) in outcomes {
            match &outcome {
                Outcome::Acked => self.counters.acked += 1,
                _ => self.counters.nacked += 1,
            }
            let leased = self.end_lease(id);
            if tracing && matches!(outcome, Outcome::Acked) {
                let span = crate::trace::Span {
                    id,
                    topic: &leased.topic,
                    priority: leased.key.priority(),
                    traceparent: "",
                    elapsed: Duration::ZERO,
                };
                crate::trace::emit(crate::trace::Stage::Ack, span);
            }
            self.apply_outcome(now, leased, outcome);
        }
    }

    /// The records of a settlement could not be logged: the leases go on as before it.
    pub(super) fn unsettled(&mut self, outcomes: &[(MessageId, Outcome)]) {
        for (id, _) in outcomes {
            let leased = self.leases.by_id.get_mut(id).expect("settling leases stay");
            leased.settling = false;
            self.leases.by_deadline.insert((leased.deadline, *id));
            self.leases.settling -= 1;
        }
    }

    /// How a delivery that failed (nack or lease expiry) ends: the message expires, becomes
    /// dead, or is delayed or available again.
    fn failure_outcome(
        &self,
        now: Time,
        leased: &Leased,
        delay_ms: u64,
        reason: String,
    ) -> Outcome {
        let id = leased.key.id;
        if self.expires_at(id) <= now {
            return Outcome::Expired;
        }
        let max_attempts = self.policy(&leased.topic).max_attempts;
        if leased.slot.attempt >= max_attempts {
            // A topic may route to another only while the leaf has room for one more topic.
            return match self.dead_letter_topic(&leased.topic) {
                Some(topic)
                    if self.topics.contains_key(topic.as_str())
                        || self.room_for_topics(&[topic.as_str()]).is_ok() =>
                {
                    Outcome::Moved { topic }
                }
                _ => Outcome::Dead { reason, at: now },
            };
        }
        let mut ready_at = leased.key.ready_at;
        if delay_ms > 0 {
            ready_at = ready_at.max(now + Duration::from_millis(delay_ms));
        }
        Outcome::Released { ready_at }
    }

    /// The record that makes `outcome` of the lease on `leased` durable.
    fn outcome_record(leased: &Leased, outcome: &Outcome) -> LogRecord {
        let id = leased.key.id;
        match outcome {
            Outcome::Acked | Outcome::Expired => LogRecord::Delete { id },
            Outcome::Dead { reason, at } => LogRecord::Dead {
                id,
                reason: reason.clone(),
                at: *at,
            },
            Outcome::Moved { topic } => LogRecord::Move {
                id,
                topic: topic.clone(),
            },
            Outcome::Released { ready_at } => LogRecord::Release {
                id,
                attempt: leased.slot.attempt,
                ready_at: *ready_at,
            },
        }
    }

    /// Applies `outcome` to a message whose lease has ended.
    fn apply_outcome(&mut self, now: Time, leased: Leased, outcome: Outcome) {
        let Leased {
            topic,
            mut key,
            slot,
            ..
        } = leased;
        let id = key.id;
        match outcome {
            Outcome::Acked => self.forget(&topic, id, &slot, false),
            Outcome::Expired => {
                self.forget(&topic, id, &slot, false);
                self.counters.expired += 1;
            }
            Outcome::Dead { reason, at } => self.bury(at, topic, key, slot, reason),
            Outcome::Moved { topic: to } => {
                self.counters.dead_lettered += 1;
                self.retopic(now, &topic, &to, key, slot);
            }
            Outcome::Released { ready_at } => {
                if ready_at != key.ready_at {
                    key.ready_at = ready_at;
                    if let Some(ttl) = self.ttl.by_id.get_mut(&id) {
                        ttl.key = key;
                    }
                }
                self.place(now, topic, key, slot);
            }
        }
    }

    /// A delivery failed (nack or lease expiry); its lease has ended. The message expires,
    /// becomes dead, or is delayed or available again, at once.
    pub(super) fn delivery_failed(
        &mut self,
        now: Time,
        leased: Leased,
        delay_ms: u64,
        reason: String,
        records: &mut Vec<LogRecord>,
    ) {
        let outcome = self.failure_outcome(now, &leased, delay_ms, reason);
        records.push(Self::outcome_record(&leased, &outcome));
        self.apply_outcome(now, leased, outcome);
    }

    /// Moves a message whose lease has ended to its topic's dead letters, logged.
    pub(super) fn move_to_dead(
        &mut self,
        now: Time,
        topic: Topic,
        key: Key,
        slot: Slot,
        reason: String,
        records: &mut Vec<LogRecord>,
    ) {
        records.push(LogRecord::Dead {
            id: key.id,
            reason: reason.clone(),
            at: now,
        });
        self.bury(now, topic, key, slot, reason);
    }

    /// Moves a message whose lease has ended to its topic's dead letters, as dead since `at`.
    fn bury(&mut self, at: Time, topic: Topic, key: Key, slot: Slot, reason: String) {
        let id = key.id;
        let expires_at = match self.ttl.by_id.remove(&id) {
            Some(ttl) => {
                self.ttl.by_expiry.remove(&(ttl.expires_at, id));
                ttl.expires_at
            }
            None => Time::MAX,
        };
        let leaf_topic = self.topics.get_mut(&topic).expect("topic exists");
        let enqueued_at = leaf_topic.enqueued_at(id);
        leaf_topic.age_remove(id);
        leaf_topic.dead_at.insert(id, at);
        leaf_topic.dead.insert(
            (at, id),
            Dead {
                priority: key.priority(),
                ready_at: key.ready_at,
                enqueued_at,
                expires_at,
                slot,
                reason: reason.as_str().into(),
            },
        );
        self.dirty.insert(topic);
        self.counters.dead_lettered += 1;
    }

    /// Settles leases. Acks and nacks are answered, and applied, once their records are
    /// durable: one refused by the log is answered `Unavailable` and changes nothing.
    pub(super) fn handle_confirm(&mut self, now: Time, conn: ConnId, confirm: Confirm) {
        let grants = confirm.grants.as_ref();
        let (results, records, outcomes) = self.settle(now, &confirm.op, &confirm.receipts, grants);
        let confirmed = Confirmed {
            tag: confirm.tag,
            results,
        };
        self.log_settlement(
            now,
            conn,
            SettleReply::Confirmed(confirmed),
            records,
            outcomes,
        );
    }

    /// A consumer's ack, nack or extend sent to this leaf directly, not through the root: its
    /// receipts are unmasked with the consumer's principal as the root would (a receipt
    /// delivered to another principal does not match), settled as the root's `Confirm`
    /// would be, and answered once durable. The lease stays this leaf's alone to end.
    pub(super) fn handle_client_settle(&mut self, now: Time, conn: ConnId, ack: Ack) {
        self.counters.settle_requests += 1;
        let s = &self.config.settings;
        if let Err(text) = crate::validate::validate_settle(s, &ack) {
            let error = Wire::error(Some(ack.request), ErrorCode::InvalidArgument, text);
            self.send(conn, error);
            return;
        }
        if self.client_settles >= s.leaf_pending_settles_max {
            let text = "too many acknowledgements waiting at this leaf; retry";
            self.send(
                conn,
                Wire::error(Some(ack.request), ErrorCode::Overloaded, text),
            );
            return;
        }
        let principal = self.principals.get(&conn).cloned();
        let name = principal.as_ref().map(|p| p.name.clone());
        let max = s.principal_requests_max;
        if !self.settle_tally.take(name.as_ref(), max) {
            let text = crate::access::over_cap(
                name.as_deref().unwrap_or_default(),
                "acknowledgements",
                "principal_requests_max",
                max,
            );
            self.send(
                conn,
                Wire::error(Some(ack.request), ErrorCode::Overloaded, text),
            );
            return;
        }
        self.client_settles += 1;
        // Receipts of other leaves are answered as the root answers a leaf it does not know;
        // the rest are settled in one go, their results put back in the request's order.
        let mut mine = Vec::with_capacity(ack.receipts.len());
        let mut slots = Vec::with_capacity(ack.receipts.len());
        let mut results = vec![Err(ReceiptError::UnknownLeaf); ack.receipts.len()];
        for (slot, receipt) in ack.receipts.iter().enumerate() {
            if receipt.id.leaf() == self.config.id {
                let mask = principal.as_ref().map_or(0, |p| p.receipt_mask(receipt.id));
                mine.push(Receipt {
                    id: receipt.id,
                    token: receipt.token ^ mask,
                });
                slots.push(slot);
            }
        }
        // As the root sends a `Confirm`'s: no check for a principal that may consume anywhere.
        let grants = principal
            .as_ref()
            .and_then(|p| p.grants.to_check_for_consume());
        let (settled, records, outcomes) = self.settle(now, &ack.op, &mine, grants);
        for (slot, result) in slots.into_iter().zip(settled) {
            results[slot] = result;
        }
        let reply = AckReply {
            request: ack.request,
            results,
        };
        let answer = SettleReply::Client {
            reply,
            principal: name,
        };
        self.log_settlement(now, conn, answer, records, outcomes);
    }

    /// Sends a settlement's answer (`durable`: its records are, and it was applied) and
    /// gives back what a consumer's direct request held.
    pub(super) fn answer_settlement(&mut self, conn: ConnId, answer: SettleReply, durable: bool) {
        if let SettleReply::Client { principal, .. } = &answer {
            self.client_settles -= 1;
            self.settle_tally.give(principal.as_ref());
        }
        self.send(conn, answer.into_wire(durable));
    }

    /// Logs the records of a settlement and answers once they are durable (at once if there
    /// are none: extends).
    pub(super) fn log_settlement(
        &mut self,
        now: Time,
        conn: ConnId,
        answer: SettleReply,
        records: Vec<LogRecord>,
        outcomes: Vec<(MessageId, Outcome)>,
    ) {
        if records.is_empty() {
            self.answer_settlement(conn, answer, true);
            return;
        }
        let token = self.writes.next_token;
        self.writes.next_token += 1;
        self.writes.settlements.insert(
            token,
            Settlement {
                conn,
                answer,
                outcomes,
            },
        );
        self.log(now, Some(token), SyncWait::Linger, records);
    }

    /// Receipts for the live leases of `topic`'s messages among `ids`, whoever holds them.
    pub(super) fn live_receipts(&self, topic: &str, ids: &[MessageId]) -> Vec<Receipt> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| {
                let lease = self.leases.by_id.get(&id)?;
                (&*lease.topic == topic && !lease.settling).then_some(Receipt {
                    id,
                    token: lease.token,
                })
            })
            .collect()
    }

    /// Checks each receipt (and, given the settling principal's `grants`, its `consume`
    /// permission on the message's namespace) and settles its lease as `op` says: the result
    /// per receipt, the records to log and the outcomes to apply once they are durable.
    #[allow(clippy::type_complexity)]
    pub(super) fn settle(
        &mut self,
        now: Time,
        op: &Settle,
        receipts: &[Receipt],
        grants: Option<&crate::access::Grants>,
    ) -> (
        Vec<Result<(), ReceiptError>>,
        Vec<LogRecord>,
        Vec<(MessageId, Outcome)>,
    ) {
        // A delete (or release) record per receipt, mostly.
        let mut records = Vec::with_capacity(receipts.len());
        let mut outcomes = Vec::with_capacity(receipts.len());
        let mut results = Vec::with_capacity(receipts.len());
        let mut extended = Vec::new();
        for receipt in receipts {
            let result = self
                .check_receipt(now, receipt)
                .and_then(|id| self.may_consume(grants, id))
                .map(|id| match op {
                    Settle::Ack => {
                        let leased = self.settling(id);
                        let outcome = Outcome::Acked;
                        records.push(Self::outcome_record(leased, &outcome));
                        outcomes.push((id, outcome));
                    }
                    Settle::Nack { delay_ms, reason } => {
                        let reason = reason.clone().unwrap_or_else(|| "nacked".into());
                        let leased = &self.leases.by_id[&id];
                        let outcome = self.failure_outcome(now, leased, *delay_ms, reason);
                        let leased = self.settling(id);
                        records.push(Self::outcome_record(leased, &outcome));
                        outcomes.push((id, outcome));
                    }
                    Settle::Extend { lease_ms } => {
                        self.counters.extended += 1;
                        let max = self.config.settings.lease_timeout_max_ms;
                        let deadline = now + Duration::from_millis((*lease_ms).clamp(1, max));
                        let leased = self.leases.by_id.get_mut(&id).expect("checked");
                        self.leases.by_deadline.remove(&(leased.deadline, id));
                        leased.deadline = deadline;
                        self.leases.by_deadline.insert((deadline, id));
                        // Logged, so whoever rebuilds the leaf ends the lease at the new deadline;
                        // answered at once, like the grant (a crash that loses the record ends the
                        // lease at its former deadline: a delivery again, never a loss).
                        extended.push(LogRecord::Lease {
                            id,
                            attempt: leased.slot.attempt,
                            deadline,
                            token: leased.token,
                        });
                    }
                });
            results.push(result);
        }
        if !extended.is_empty() {
            self.log(now, None, SyncWait::Linger, extended);
        }
        (results, records, outcomes)
    }

    /// The root gives back grants no consumer received: available again, attempt returned.
    pub(super) fn handle_release(&mut self, now: Time, release: Release) {
        let mut records = Vec::new();
        for receipt in &release.receipts {
            if let Ok(id) = self.check_receipt(now, receipt) {
                let Leased {
                    topic,
                    key,
                    mut slot,
                    ..
                } = self.end_lease(id);
                if self.expires_at(id) <= now {
                    self.expire(&topic, id, &slot, &mut records);
                    continue;
                }
                slot.attempt = slot.attempt.saturating_sub(1);
                records.push(LogRecord::Release {
                    id,
                    attempt: slot.attempt,
                    ready_at: key.ready_at,
                });
                self.place(now, topic, key, slot);
            }
        }
        self.log(now, None, SyncWait::Linger, records);
    }

    /// The slot of message `key` of `topic`, in whatever state it is (`None`: gone, or its key
    /// changed).
    pub(super) fn slot_mut(&mut self, topic: &Topic, key: &Key) -> Option<&mut Slot> {
        if self.leases.by_id.contains_key(&key.id) {
            let leased = self.leases.by_id.get_mut(&key.id).expect("checked");
            return (leased.key == *key).then_some(&mut leased.slot);
        }
        let leaf_topic = self.topics.get_mut(topic)?;
        if let Some(&at) = leaf_topic.dead_at.get(&key.id) {
            return leaf_topic
                .dead
                .get_mut(&(at, key.id))
                .filter(|dead| dead.priority == key.priority() && dead.ready_at == key.ready_at)
                .map(|dead| &mut dead.slot);
        }
        if leaf_topic.offers.get(key).is_some() {
            return leaf_topic.offers.get_mut(key);
        }
        self.delayed
            .get_mut(&(key.ready_at, key.id))
            .filter(|delayed| delayed.priority == key.priority())
            .map(|delayed| &mut delayed.slot)
    }
}
