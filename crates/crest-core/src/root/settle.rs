//! Acks, nacks and extends: receipts grouped by leaf into confirms, answers gathered per ack.

use super::*;
use crate::id::{LeafId, Receipt};
use crate::machine::ConnId;
use crate::time::Time;
use crate::wire::{Ack, AckReply, Confirm, Confirmed, ErrorCode, ReceiptError, Wire};
use std::collections::BTreeMap;

impl Root {
    pub(super) fn handle_ack(&mut self, now: Time, conn: ConnId, ack: Ack) {
        self.counters.settle_requests += 1;
        if let Err(text) = crate::validate::validate_settle(&self.settings, &ack) {
            self.refuse(conn, ack.request, ErrorCode::InvalidArgument, text);
            return;
        }
        let count = ack.receipts.len();
        if self.requests.acks.len() >= self.settings.root_pending_requests_max as usize {
            let text = "too many acknowledgements waiting at the root; retry";
            self.refuse(conn, ack.request, ErrorCode::Overloaded, text);
            return;
        }
        let principal = self.principal_of(conn);
        if !self.admit(conn, ack.request, principal.as_ref(), false) {
            return;
        }
        let ack_id = self.requests.next_tag;
        self.requests.next_tag += 1;
        // The leaf checks `consume` on each message's namespace: the root does not know them.
        let grants = self
            .principals
            .get(&conn)
            .and_then(|p| p.grants.to_check_for_consume())
            .cloned();
        let mut results = vec![None; count];
        let mut groups: BTreeMap<(ConnId, LeafId), (Vec<usize>, Vec<Receipt>)> = BTreeMap::new();
        for (slot, mut receipt) in ack.receipts.into_iter().enumerate() {
            receipt.token ^= self.receipt_mask(conn, receipt.id);
            match self.route(receipt.id.leaf()) {
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
            let tag = self.requests.next_tag;
            self.requests.next_tag += 1;
            self.requests.confirms.insert(
                tag,
                PendingConfirm {
                    ack: ack_id,
                    conn: child,
                    slots,
                    sent: now,
                },
            );
            self.send(
                child,
                Wire::Confirm(Confirm {
                    tag,
                    leaf,
                    op: ack.op.clone(),
                    receipts,
                    grants: grants.clone(),
                }),
            );
        }
        self.requests.acks.insert(
            ack_id,
            PendingAck {
                conn,
                request: ack.request,
                results,
                outstanding,
                principal,
            },
        );
        self.finish_ack(ack_id);
    }

    /// A leaf's answer to a `Confirm`, taken only from the connection the `Confirm` went
    /// on: another node answering for a subtree not its own is a violation.
    pub(super) fn handle_confirmed(&mut self, conn: ConnId, confirmed: Confirmed) {
        match self.requests.confirms.get(&confirmed.tag) {
            Some(confirm) if confirm.conn != conn => {
                self.violations += 1;
                return;
            }
            Some(_) => {}
            None => return,
        }
        let Some(confirm) = self.requests.confirms.remove(&confirmed.tag) else {
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

    pub(super) fn fill_confirm(
        &mut self,
        confirm: PendingConfirm,
        result: impl Fn(usize) -> Result<(), ReceiptError>,
    ) {
        let Some(ack) = self.requests.acks.get_mut(&confirm.ack) else {
            return;
        };
        for (index, slot) in confirm.slots.iter().enumerate() {
            ack.results[*slot] = Some(result(index));
        }
        ack.outstanding -= 1;
        self.finish_ack(confirm.ack);
    }

    pub(super) fn finish_ack(&mut self, ack_id: u64) {
        if self.requests.acks[&ack_id].outstanding > 0 {
            return;
        }
        let ack = self.requests.acks.remove(&ack_id).expect("present");
        self.tallies.requests.give(ack.principal.as_ref());
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
}
