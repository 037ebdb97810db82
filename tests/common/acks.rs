//! Acks through a replicated leaf's failover, shared by the tests of replica groups.

use crest::sdk::{Consumer, Delivery, MessageId, Receipt};
use std::collections::HashSet;
use std::time::Duration;

/// Pops `batch` at a time from topic `jobs` and acks (through [`ack_until_applied`]) until
/// `done` holds of the distinct messages seen; fails on a second delivery of an acknowledged
/// message, or after 60 s.
pub(crate) async fn pop_and_ack_until(
    consumer: &Consumer,
    seen: &mut HashSet<MessageId>,
    batch: u32,
    done: impl Fn(&HashSet<MessageId>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(seen) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} messages delivered, and not all that were expected within 60 s",
            seen.len()
        );
        let popped = consumer
            .pop("jobs", batch, Duration::from_millis(500))
            .await
            .unwrap();
        let receipts: Vec<Receipt> = popped.iter().map(Delivery::receipt).collect();
        ack_until_applied(consumer, receipts).await;
        for delivery in popped {
            assert!(
                seen.insert(delivery.id),
                "{} delivered again after its ack",
                delivery.id
            );
        }
    }
}

/// Acks until every receipt is applied: an ack refused as unavailable while the group elects
/// did nothing and its lease is live (the new leader knows it), so it is sent again.
pub(crate) async fn ack_until_applied(consumer: &Consumer, mut receipts: Vec<Receipt>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut retry = false;
    while !receipts.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "acks still refused after 30 s: {receipts:?}"
        );
        let results = consumer.ack_many(&receipts).await.unwrap();
        let mut pending = Vec::new();
        for (receipt, result) in receipts.iter().zip(&results) {
            match result {
                Ok(()) => {}
                Err(crest::sdk::ReceiptError::Settled) if retry => {}
                Err(crest::sdk::ReceiptError::Unavailable | crest::sdk::ReceiptError::TimedOut) => {
                    pending.push(*receipt)
                }
                Err(error) => panic!("ack of {} refused: {error:?}", receipt.id),
            }
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        receipts = pending;
        retry = true;
    }
}
