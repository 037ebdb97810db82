//! Producers and consumers, and what the simulator watches on the way: pushes acknowledged,
//! grants delivered (the live-lease checker), acks retried while a leaf is unreachable.

use super::*;
use bytes::Bytes;
use crest_core::id::Receipt;
use crest_core::machine::ConnId;
use crest_core::time::Time;
use crest_core::wire::{Ack, Pop, Push, PushMessage, Role, Settle, Wire};
use std::time::Duration;

impl Sim {
    /// Ground truth taken where it happens: a leaf acknowledging a push, the root answering
    /// a pop.
    pub(super) fn observe_transmit(&mut self, node: usize, conn: ConnId, msg: &Wire) {
        match (self.roles[node], msg) {
            (Role::Leaf, Wire::PushAck(ack)) => {
                if let Some((topic, priorities)) = self.pushes.remove(&(conn, ack.request)) {
                    let truth = self.truth.entry(topic.clone()).or_default();
                    for (id, priority) in ack.ids.iter().zip(priorities) {
                        truth.acked(*id, priority, self.now);
                    }
                    let count = ack.ids.len() as u64;
                    self.pushed += count;
                    self.current.pushed += count;
                    self.tally(&topic).pushed += count;
                }
            }
            (Role::Leaf, Wire::Error(error)) => {
                if let Some(request) = error.request
                    && let Some((topic, priorities)) = self.pushes.remove(&(conn, request))
                {
                    self.push_errors += 1;
                    self.tally(&topic).refused += priorities.len() as u64;
                }
            }
            (Role::Leaf, Wire::Reserved(reserved)) => {
                for outcome in &reserved.items {
                    let Ok(delivery) = &outcome.result else {
                        continue;
                    };
                    let grant = (delivery.token, delivery.lease_deadline);
                    if let Some((token, deadline)) = self.leases.insert(delivery.id, grant)
                        && deadline > self.now
                    {
                        self.lease_violations += 1;
                        self.lease_violation.get_or_insert_with(|| {
                            format!(
                                "message {} leased with token {:x} at {:?} while its lease {:x} \
                                 was live until {:?}",
                                delivery.id, delivery.token, self.now, token, deadline
                            )
                        });
                    }
                }
            }
            (Role::Root, Wire::PopReply(reply)) => {
                for delivery in &reply.deliveries {
                    self.unconfirmed.insert(delivery.id);
                    let truth = self.truth.entry(delivery.topic.clone()).or_default();
                    let priority = delivery
                        .escalation
                        .as_ref()
                        .map_or(delivery.priority, |e| e.original_priority);
                    if let Some(measured) = truth.delivered(delivery.id, priority, self.now) {
                        let in_load = self.now <= self.load_end;
                        let tally = self.tally(&delivery.topic);
                        let key = delivery.fairness_key.as_deref();
                        tally.delivered(priority, key, measured.wait_us, in_load);
                        let rank = measured.rank_error;
                        self.rank_error.saturating_record(rank);
                        self.inversion
                            .saturating_record(measured.inversion_us.max(1));
                        self.current.delivered += 1;
                        self.current.rank_error_max = self.current.rank_error_max.max(rank);
                    }
                }
            }
            _ => {}
        }
    }

    /// The lease checker's view of a settle reaching a leaf: a receipt with the live token
    /// ends (ack, nack, release) or moves (extend) the lease, exactly as the leaf judges it.
    pub(super) fn observe_settle(&mut self, msg: &Wire) {
        let (receipts, extend) = match msg {
            Wire::Confirm(confirm) => match confirm.op {
                Settle::Extend { lease_ms } => (&confirm.receipts, Some(lease_ms)),
                _ => (&confirm.receipts, None),
            },
            Wire::Release(release) => (&release.receipts, None),
            _ => return,
        };
        for receipt in receipts {
            let Some(&(token, deadline)) = self.leases.get(&receipt.id) else {
                continue;
            };
            if token != receipt.token || deadline <= self.now {
                continue;
            }
            match extend {
                None => {
                    self.leases.remove(&receipt.id);
                }
                Some(lease_ms) => {
                    let deadline = self.now + Duration::from_millis(lease_ms);
                    self.leases.insert(receipt.id, (token, deadline));
                }
            }
        }
    }

    /// Consumer `consumer` acknowledges `receipts` (the `tries`-th time).
    pub(super) fn ack(&mut self, consumer: usize, receipts: Vec<Receipt>, tries: u32) {
        let request = self.request();
        self.consumers[consumer]
            .acks
            .insert(request, (receipts.clone(), tries));
        let end = self.consumers[consumer].end;
        self.send(
            end,
            Wire::Ack(Ack {
                request,
                op: Settle::Ack,
                receipts,
            }),
        );
    }

    pub(super) fn request(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    pub(super) fn pop(&mut self, consumer: usize) {
        if self.consumers[consumer].pending.is_some() {
            return;
        }
        let request = self.request();
        let spec = &self.consumers[consumer].spec;
        let pop = Pop {
            request,
            topic: self.consumers[consumer].topic.clone(),
            max: spec.max,
            wait_ms: spec.wait_ms,
            ..Pop::default()
        };
        self.consumers[consumer].pending = Some((request, self.now));
        let end = self.consumers[consumer].end;
        self.send(end, Wire::Pop(pop));
    }

    pub(super) fn produce(&mut self, producer: usize, until: Time) {
        let tick = Duration::from_millis(1);
        let state = &mut self.producers[producer];
        let elapsed = self.now.saturating_since(state.last_tick).as_secs_f64();
        state.last_tick = self.now;
        state.owed = (state.owed + elapsed * state.spec.rate).min(1e6);
        let mut batches = Vec::new();
        while state.owed >= 1.0 && !state.ends.is_empty() {
            let count = (state.owed.floor() as u32).min(state.spec.batch_max.max(1));
            state.owed -= f64::from(count);
            let end = state.ends[state.next_end % state.ends.len()];
            state.next_end += 1;
            batches.push((end, count));
        }
        let spec = self.producers[producer].spec.clone();
        let topic = self.producers[producer].topic.clone();
        for (end, count) in batches {
            let messages: Vec<PushMessage> = (0..count)
                .map(|_| PushMessage {
                    topic: topic.clone(),
                    priority: spec.priorities.draw(&mut self.rng),
                    payload: Bytes::from(vec![0u8; spec.payload_bytes]),
                    fairness_key: spec.fairness_key.clone(),
                    ..PushMessage::default()
                })
                .collect();
            let request = self.request();
            self.producers[producer]
                .in_flight
                .insert(request, (self.now, end));
            self.send(end, Wire::Push(Push { request, messages }));
        }
        if self.now + tick < until {
            self.schedule(self.now + tick, Event::Produce { producer });
        }
    }
}
