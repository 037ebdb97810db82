//! Writes the seed corpus of the fuzz targets (`fuzz/`): one frame per kind of message, the
//! bodies of the same, and reports to merge. Run from the repository's root:
//!
//! ```sh
//! cargo run -p crest-core --example fuzz_seeds -- fuzz/seeds
//! ```

use bytes::Bytes;
use crest_core::frame::{FRAME_HEADER_BYTES, encode_frame};
use crest_core::id::{LeafId, MessageId, Receipt};
use crest_core::key::Key;
use crest_core::metrics::{Hist, Metric, NodeReport, Report, Stats, TopicStats};
use crest_core::time::Time;
use crest_core::wire::*;
use std::path::Path;

fn messages() -> Vec<(&'static str, Wire)> {
    let id = MessageId::new(LeafId(1), 7);
    let key = Key::new(2, Time(1_000), id);
    let delivery = Delivery {
        id,
        token: 0x0123_4567_89ab_cdef,
        topic: "orders/eu".into(),
        priority: 2,
        attempt: 1,
        enqueued_at: Time(1_000),
        lease_deadline: Time(31_000),
        metadata: vec![("trace".into(), "abc".into())],
        payload: Bytes::from_static(b"payload"),
        escalation: Some(Escalation {
            original_priority: 4,
            escalated_at: Time(2_000),
            escalated_by: Some("ops".into()),
            reason: "customer waiting".into(),
            aged: false,
        }),
        fairness_key: Some("tenant-42".into()),
    };
    let report = Report {
        nodes: vec![NodeReport {
            name: "leaf-1".into(),
            role: "leaf".into(),
            parent: Some("agg-1".into()),
            connected: true,
            ..NodeReport::default()
        }],
        histograms: [(Metric::BubbleToRoot, Hist(vec![(10, 3), (200, 1)]))].into(),
        stats: Stats {
            topics: vec![TopicStats {
                topic: "jobs".into(),
                ready: vec![(0, 2), (3, 1)],
                ..TopicStats::default()
            }],
            ..Stats::default()
        },
        absent: vec![LeafId(2)],
        ..Report::default()
    };
    vec![
        (
            "hello",
            Wire::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                peer: PeerKind::Consumer,
                token: Some(Secret("crest_0011223344556677_00".into())),
            }),
        ),
        (
            "push",
            Wire::Push(Push {
                request: 1,
                messages: vec![PushMessage {
                    topic: "orders/eu".into(),
                    priority: 1,
                    metadata: vec![("k".into(), "v".into())],
                    payload: Bytes::from_static(b"hello"),
                    deliver_at: Some(Time(5)),
                    delay_ms: 10,
                    ttl_ms: Some(60_000),
                    dedup_key: Some("once".into()),
                    fairness_key: Some("tenant-42".into()),
                }],
            }),
        ),
        (
            "pop",
            Wire::Pop(Pop {
                request: 2,
                topic: "jobs".into(),
                max: 10,
                wait_ms: 1_000,
                lease_ms: Some(30_000),
                max_priority: Some(3),
            }),
        ),
        (
            "pop_reply",
            Wire::PopReply(PopReply {
                request: 2,
                deliveries: vec![delivery.clone()],
            }),
        ),
        (
            "ack",
            Wire::Ack(Ack {
                request: 3,
                op: Settle::Nack {
                    delay_ms: 5,
                    reason: Some("failed".into()),
                },
                receipts: vec![Receipt { id, token: 9 }],
            }),
        ),
        (
            "offer",
            Wire::Offer(Offer {
                topic: "jobs".into(),
                adds: vec![OfferEntry {
                    key,
                    size: 7,
                    since: Time(1),
                    entered: Time(2),
                }],
                retracts: vec![key],
                frontier: Some(key),
                seq: 4,
            }),
        ),
        (
            "reserve",
            Wire::Reserve(Reserve {
                leaf: LeafId(1),
                topic: "jobs".into(),
                lease_ms: 30_000,
                items: vec![ReserveItem {
                    reservation: 5,
                    key,
                }],
                offer_seq: 4,
                direct: true,
                ahead: false,
            }),
        ),
        (
            "reserved",
            Wire::Reserved(Reserved {
                items: vec![
                    ReserveOutcome {
                        reservation: 5,
                        key,
                        result: Ok(delivery),
                    },
                    ReserveOutcome {
                        reservation: 6,
                        key,
                        result: Err(ReserveDenied::Leased),
                    },
                ],
            }),
        ),
        (
            "confirmed",
            Wire::Confirmed(Confirmed {
                tag: 7,
                results: vec![Ok(()), Err(ReceiptError::Stale)],
            }),
        ),
        (
            "admin",
            Wire::Admin(Admin {
                request: 8,
                op: AdminOp::DeadLetters {
                    topic: "jobs".into(),
                    limit: 10,
                    after: Some((Time(3), id)),
                },
            }),
        ),
        ("report", Wire::Report(report)),
        (
            "error",
            Wire::error(Some(9), ErrorCode::Forbidden, "principal may not consume"),
        ),
    ]
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fuzz/seeds".into());
    let out = Path::new(&out);
    for target in ["frame", "body", "report_merge"] {
        std::fs::create_dir_all(out.join(target)).expect("create the seed directories");
    }
    let mut stream = Vec::new();
    for (name, msg) in messages() {
        let mut frame = Vec::new();
        encode_frame(&msg, u32::MAX, &mut frame).expect("encodes");
        std::fs::write(out.join("frame").join(name), &frame).expect("write");
        std::fs::write(out.join("body").join(name), &frame[FRAME_HEADER_BYTES..]).expect("write");
        stream.extend_from_slice(&frame);
        if let Wire::Report(report) = msg {
            let body = rmp_serde::to_vec(&report).expect("encodes");
            let mut pair = vec![body.len().min(255) as u8];
            pair.extend_from_slice(&body);
            pair.extend_from_slice(&body);
            std::fs::write(out.join("report_merge").join("two"), pair).expect("write");
        }
    }
    std::fs::write(out.join("frame").join("stream"), stream).expect("write");
}
