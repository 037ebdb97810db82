//! Bodies read back from a simulated disk, compaction, unreadable bodies.

use super::*;

#[test]
fn bodies_beyond_the_cache_are_read_back_and_mostly_dead_segments_are_compacted() {
    let (mut h, leaf, producer, consumer, _, reads) = disk_leaf();
    for chunk in 0..4 {
        let messages = (chunk * 10..chunk * 10 + 10).map(numbered).collect();
        h.push_messages(producer, messages);
    }
    // Most urgent first; every body comes from the "disk", whole.
    let first = h.pop(consumer, "jobs", 36);
    let numbers: Vec<u32> = first.iter().map(|d| d.priority).collect();
    assert_eq!(numbers, (0..36).collect::<Vec<_>>());
    for delivery in &first {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
        assert_eq!(
            delivery.metadata,
            vec![("n".to_string(), delivery.priority.to_string())]
        );
    }
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 36);
    // Ack all but one of each segment (3, 13, 23, 33): the first three are then a tenth full,
    // below the half that triggers compaction, and their survivors move to the end; the
    // fourth still holds five live bodies (33 and the unpopped 36..40).
    let (kept, acked): (Vec<&Delivery>, Vec<&Delivery>) =
        first.iter().partition(|d| d.priority % 10 == 3);
    let receipts = acked.iter().map(|d| d.receipt()).collect();
    assert!(h.ack(consumer, receipts).iter().all(Result::is_ok));
    h.run();
    assert_eq!(counter(&mut h, leaf, "compacted"), 3);
    let now = h.now;
    let gauges = h.nodes[leaf].report(now).nodes[0].gauges.clone();
    assert_eq!(
        gauges["log_segments_live"], 2,
        "the fourth segment, and the one the moved bodies went to"
    );
    // The moved messages keep their leases and their bodies.
    let receipts = kept.iter().map(|d| d.receipt()).collect();
    let nacks = h.settle(
        consumer,
        Settle::Nack {
            delay_ms: 0,
            reason: None,
        },
        receipts,
    );
    assert!(nacks.iter().all(Result::is_ok));
    let rest = h.pop(consumer, "jobs", 10);
    let numbers: Vec<u32> = rest.iter().map(|d| d.priority).collect();
    assert_eq!(numbers, vec![3, 13, 23, 33, 36, 37, 38, 39]);
    for delivery in &rest {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
    }
}

#[test]
fn a_body_that_cannot_be_read_is_dead_lettered_with_the_reason_and_others_are_delivered() {
    let (mut h, _leaf, producer, consumer, unreadable, _) = disk_leaf();
    h.push_messages(producer, (0..10).map(numbered).collect());
    h.push_messages(producer, (10..20).map(numbered).collect());
    unreadable.lock().unwrap().insert(1);
    // The bodies of 0..10 are in the damaged segment 1: those reservations are denied and the
    // messages dead-lettered; the pop is answered from the rest.
    let got = h.pop(consumer, "jobs", 5);
    assert!(
        got.iter().all(|d| d.priority >= 10),
        "only readable bodies are delivered: {:?}",
        got.iter().map(|d| d.priority).collect::<Vec<_>>()
    );
    for delivery in &got {
        assert_eq!(
            delivery.payload,
            Bytes::from(format!("body of {}", delivery.priority))
        );
    }
    let request = h.request();
    h.send(
        consumer,
        Wire::Admin(crate::wire::Admin {
            request,
            op: AdminOp::DeadLetters {
                topic: "jobs".into(),
                limit: 100,
                after: None,
            },
        }),
    );
    let Wire::AdminReply(reply) = h.recv(consumer) else {
        panic!("admin reply")
    };
    let AdminResult::DeadLetters(letters) = reply.result else {
        panic!("dead letters")
    };
    assert!(!letters.is_empty());
    assert!(
        letters
            .iter()
            .all(|l| l.priority < 10 && l.reason.contains("segment 1 is damaged")),
        "{letters:?}"
    );
}
