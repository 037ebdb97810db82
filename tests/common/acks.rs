//! Pops and acks through failovers, shared by the tests that kill nodes: replica groups, and
#![allow(dead_code)]
//! trees of processes.

use crest::sdk::{Consumer, Delivery, MessageId, Receipt, ReceiptError};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::time::Duration;

/// How long [`pop_and_ack_until`] waits for a new message while it expects more. Generous: a
/// passing run stops as soon as everything is in, the bound only ends a failing one. It bounds
/// the wait between messages, not the whole drain: a loaded 2-core machine drains tens of
/// thousands of messages through a debug build at a few hundred a second, and a drain that
/// goes on delivering is not a lost message.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(120);

/// Pops `batch` at a time from topic `jobs` and acks (through [`ack_until_applied`]) until
/// `done` holds of the distinct messages seen; fails on a second delivery of an acknowledged
/// message, or when no new message came for [`DRAIN_WAIT`] while `done` does not hold.
pub(crate) async fn pop_and_ack_until(
    consumer: &Consumer,
    seen: &mut HashSet<MessageId>,
    batch: u32,
    done: impl Fn(&HashSet<MessageId>) -> bool,
) {
    let mut progress = std::time::Instant::now();
    while !done(seen) {
        if pop_and_ack(consumer, seen, batch).await > 0 {
            progress = std::time::Instant::now();
        }
        assert!(
            progress.elapsed() < DRAIN_WAIT,
            "no new message for {DRAIN_WAIT:?} while more were expected; {} distinct messages \
             delivered",
            seen.len()
        );
    }
}

/// Pops and acks until at least `expected` distinct messages were seen and a pop comes back
/// empty.
pub(crate) async fn drain(consumer: &Consumer, seen: &mut HashSet<MessageId>, expected: usize) {
    pop_and_ack_until(consumer, seen, 32, |seen| seen.len() >= expected).await;
    eventually(DRAIN_WAIT, "an empty pop", async || {
        let popped = pop_and_ack(consumer, seen, 32).await;
        if popped == 0 {
            Ok(())
        } else {
            Err(format!("{popped} more popped"))
        }
    })
    .await
}

/// One pop of up to `batch` from topic `jobs`, acknowledged; answers how many came. Fails on a
/// second delivery of an acknowledged message.
async fn pop_and_ack(consumer: &Consumer, seen: &mut HashSet<MessageId>, batch: u32) -> usize {
    let popped = match consumer
        .pop("jobs", batch, Duration::from_millis(500))
        .await
    {
        Ok(popped) => popped,
        Err(error) => panic!("pop failed: {error}"),
    };
    let receipts: Vec<Receipt> = popped.iter().map(Delivery::receipt).collect();
    if !receipts.is_empty() {
        ack_until_applied(consumer, receipts).await;
    }
    let count = popped.len();
    for delivery in popped {
        assert!(
            seen.insert(delivery.id),
            "{} delivered again after its ack",
            delivery.id
        );
    }
    count
}

/// Acks `receipts` as a consumer must: an ack refused as `Unavailable` (the group elects, or a
/// node between the root and the leaf was killed and is not replaced yet) did nothing and its
/// lease is live, so it is sent again until applied (`TimedOut` likewise; the consumer tries a
/// few times by itself, this goes on longer, as an application would). On a retry, `Settled`
/// means an earlier try was applied and its answer lost with the node. Anything else fails.
pub(crate) async fn ack_until_applied(consumer: &Consumer, receipts: Vec<Receipt>) {
    let mut receipts = receipts;
    let mut retry = false;
    eventually(Duration::from_secs(30), "every ack applied", async || {
        let results = consumer.ack_many(&receipts).await.unwrap();
        let mut pending = Vec::new();
        for (receipt, result) in receipts.iter().zip(&results) {
            match result {
                Ok(()) => {}
                Err(ReceiptError::Settled) if retry => {}
                Err(ReceiptError::Unavailable | ReceiptError::TimedOut) => pending.push(*receipt),
                Err(error) => panic!("ack of {} refused: {error:?}", receipt.id),
            }
        }
        receipts = pending;
        retry = true;
        if receipts.is_empty() {
            Ok(())
        } else {
            Err(receipts.clone())
        }
    })
    .await
}
