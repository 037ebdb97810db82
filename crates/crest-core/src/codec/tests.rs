//! The hand-written codec against rmp-serde on arbitrary values, and its fallbacks.

use super::*;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        ".{0,40}",
        // Lengths on both sides of MessagePack's str8/str16 boundaries.
        (0usize..300).prop_map(|n| "x".repeat(n)),
    ]
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..200,
        any::<u8>().prop_map(u64::from),
        any::<u16>().prop_map(u64::from),
        any::<u32>().prop_map(u64::from),
        any::<u64>(),
    ]
}

fn payload() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (0usize..70_000).prop_map(|n| vec![7u8; n]),
    ]
    .prop_map(Bytes::from)
}

fn message() -> impl Strategy<Value = PushMessage> {
    (
        text(),
        any::<u32>(),
        prop::collection::vec((text(), text()), 0..3),
        payload(),
        prop::option::of(number()),
        number(),
        prop::option::of(number()),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(
            |(
                topic,
                priority,
                metadata,
                payload,
                deliver_at,
                delay_ms,
                ttl_ms,
                dedup_key,
                fairness_key,
            )| {
                PushMessage {
                    topic,
                    priority,
                    metadata,
                    payload,
                    deliver_at: deliver_at.map(Time),
                    delay_ms,
                    ttl_ms,
                    dedup_key,
                    fairness_key,
                }
            },
        )
}

fn push() -> impl Strategy<Value = Push> {
    (number(), prop::collection::vec(message(), 0..6))
        .prop_map(|(request, messages)| Push { request, messages })
}

fn head() -> impl Strategy<Value = MessageHead> {
    (
        number(),
        text(),
        any::<u32>(),
        number(),
        number(),
        prop::option::of(number()),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(
            |(id, topic, priority, ready_at, enqueued_at, expires_at, dedup_key, fairness_key)| {
                MessageHead {
                    id: MessageId(id),
                    topic,
                    priority,
                    ready_at: Time(ready_at),
                    enqueued_at: Time(enqueued_at),
                    expires_at: expires_at.map(Time),
                    dedup_key,
                    fairness_key,
                }
            },
        )
}

fn key() -> impl Strategy<Value = Key> {
    (any::<u32>(), any::<bool>(), number(), number()).prop_map(
        |(priority, native, ready_at, id)| {
            let (ready_at, id) = (Time(ready_at), MessageId(id));
            match native {
                true => Key::new(priority, ready_at, id),
                false => Key::aged(priority, ready_at, id),
            }
        },
    )
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        (number(), number(), text(), any::<u32>(), any::<u32>()),
        (
            number(),
            number(),
            prop::collection::vec((text(), text()), 0..3),
            payload(),
            prop::option::of(text()),
        ),
        prop::option::of((
            any::<u32>(),
            number(),
            prop::option::of(text()),
            text(),
            any::<bool>(),
        )),
    )
        .prop_map(
            |(
                (id, token, topic, priority, attempt),
                (enqueued_at, deadline, metadata, payload, fairness_key),
                escalation,
            )| {
                Delivery {
                    id: MessageId(id),
                    token,
                    topic,
                    priority,
                    attempt,
                    enqueued_at: Time(enqueued_at),
                    lease_deadline: Time(deadline),
                    metadata,
                    payload,
                    escalation: escalation.map(|(original_priority, at, by, reason, aged)| {
                        crate::wire::Escalation {
                            original_priority,
                            escalated_at: Time(at),
                            escalated_by: by,
                            reason,
                            aged,
                        }
                    }),
                    fairness_key,
                }
            },
        )
}

fn outcome() -> impl Strategy<Value = ReserveOutcome> {
    let denied = prop_oneof![
        Just(ReserveDenied::Leased),
        Just(ReserveDenied::Gone),
        Just(ReserveDenied::Unavailable),
        Just(ReserveDenied::InOrder),
    ];
    (
        number(),
        key(),
        prop_oneof![delivery().prop_map(Ok), denied.prop_map(Err)],
    )
        .prop_map(|(reservation, key, result)| ReserveOutcome {
            reservation,
            key,
            result,
        })
}

fn settle() -> impl Strategy<Value = Settle> {
    prop_oneof![
        3 => Just(Settle::Ack),
        1 => (number(), prop::option::of(text()))
            .prop_map(|(delay_ms, reason)| Settle::Nack { delay_ms, reason }),
        1 => number().prop_map(|lease_ms| Settle::Extend { lease_ms }),
    ]
}

fn receipt() -> impl Strategy<Value = Receipt> {
    (number(), number()).prop_map(|(id, token)| Receipt {
        id: MessageId(id),
        token,
    })
}

fn result() -> impl Strategy<Value = Result<(), ReceiptError>> {
    prop_oneof![
        Just(Ok(())),
        Just(Err(ReceiptError::Stale)),
        Just(Err(ReceiptError::UnknownMessage)),
        Just(Err(ReceiptError::Settled)),
        Just(Err(ReceiptError::TimedOut)),
        Just(Err(ReceiptError::UnknownLeaf)),
        Just(Err(ReceiptError::Unavailable)),
        Just(Err(ReceiptError::Forbidden)),
    ]
}

/// The pop path's messages without payloads, every variant this module writes.
fn pop_path() -> impl Strategy<Value = Wire> {
    let entry =
        (key(), any::<u32>(), number(), number()).prop_map(|(key, size, since, entered)| {
            OfferEntry {
                key,
                size,
                since: Time(since),
                entered: Time(entered),
            }
        });
    let offer = (
        text(),
        prop::collection::vec(entry, 0..6),
        prop::collection::vec(key(), 0..4),
        prop::option::of(key()),
        number(),
    )
        .prop_map(|(topic, adds, retracts, frontier, seq)| {
            Wire::Offer(Offer {
                topic,
                adds,
                retracts,
                frontier,
                seq,
            })
        });
    let item = (number(), key()).prop_map(|(reservation, key)| ReserveItem { reservation, key });
    let reserve = (
        any::<u16>(),
        text(),
        number(),
        prop::collection::vec(item, 0..6),
        number(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(leaf, topic, lease_ms, items, offer_seq, direct, ahead)| {
            Wire::Reserve(Reserve {
                leaf: LeafId(leaf),
                topic,
                lease_ms,
                items,
                offer_seq,
                direct,
                ahead,
            })
        });
    let receipts = || prop::collection::vec(receipt(), 0..6);
    let results = || prop::collection::vec(result(), 0..6);
    prop_oneof![
        offer,
        reserve,
        (number(), any::<u16>(), settle(), receipts(), any::<bool>()).prop_map(
            |(tag, leaf, op, receipts, granted)| {
                // A principal's grants go with a Confirm only where it may not consume
                // everywhere: MessagePack's form then, not this module's.
                let grants = granted.then(|| {
                    let mut grants = crate::access::Grants::default();
                    grants.add("orders", &[crate::access::Permission::Consume]);
                    grants
                });
                Wire::Confirm(Confirm {
                    tag,
                    leaf: LeafId(leaf),
                    op,
                    receipts,
                    grants,
                })
            }
        ),
        (number(), settle(), receipts()).prop_map(|(request, op, receipts)| {
            Wire::Ack(Ack {
                request,
                op,
                receipts,
            })
        }),
        (number(), results())
            .prop_map(|(tag, results)| Wire::Confirmed(Confirmed { tag, results })),
        (number(), results())
            .prop_map(|(request, results)| Wire::AckReply(AckReply { request, results })),
    ]
}

fn other_encoding(msg: &Wire) -> Vec<u8> {
    rmp_serde::to_vec(msg).unwrap()
}

/// What the codec decodes without limits (`None`: left to rmp-serde, or refused).
fn decode(body: &[u8]) -> Option<Wire> {
    super::decode(body, DecodeLimits::NONE).ok().flatten()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn reserved_and_pop_reply_bytes_are_rmp_serde_bytes(
        items in prop::collection::vec(outcome(), 0..6),
        request in number(),
        deliveries in prop::collection::vec(delivery(), 0..6),
    ) {
        let reserved = Reserved { items };
        let mut ours = Vec::new();
        encode_reserved(&reserved, &mut ours);
        let msg = Wire::Reserved(reserved);
        prop_assert_eq!(&ours, &other_encoding(&msg));
        prop_assert_eq!(decode(&ours), Some(msg));

        let reply = PopReply { request, deliveries };
        let mut ours = Vec::new();
        encode_pop_reply(&reply, &mut ours);
        let msg = Wire::PopReply(reply);
        prop_assert_eq!(&ours, &other_encoding(&msg));
        prop_assert_eq!(decode(&ours), Some(msg));
    }

    /// The pop path's other messages: what this module writes is rmp-serde's bytes and
    /// reads back; a settle operation other than an ack, and a Confirm carrying grants, are
    /// left to rmp-serde both ways.
    #[test]
    fn pop_path_bytes_are_rmp_serde_bytes(msg in pop_path()) {
        let theirs = other_encoding(&msg);
        let mut ours = Vec::new();
        let handled = encode(&msg, &mut ours);
        let other_settle = matches!(
            &msg,
            Wire::Confirm(Confirm { op, .. }) | Wire::Ack(Ack { op, .. }) if *op != Settle::Ack
        ) || matches!(&msg, Wire::Confirm(Confirm { grants: Some(_), .. }));
        prop_assert_eq!(handled, !other_settle);
        if handled {
            prop_assert_eq!(&ours, &theirs);
            prop_assert_eq!(decode(&ours), Some(msg));
        } else {
            prop_assert!(ours.is_empty());
            prop_assert_eq!(decode(&theirs), None);
        }
    }

    #[test]
    fn push_bytes_are_rmp_serde_bytes(push in push()) {
        let mut ours = Vec::new();
        encode_push(&push, &mut ours);
        let theirs = rmp_serde::to_vec(&Wire::Push(push.clone())).unwrap();
        prop_assert_eq!(&ours, &theirs);
        prop_assert_eq!(decode(&ours), Some(Wire::Push(push)));
    }

    #[test]
    fn enqueue_bytes_are_rmp_serde_bytes(
        head in head(),
        metadata in prop::collection::vec((text(), text()), 0..3),
        payload in payload(),
    ) {
        let mut ours = Vec::new();
        encode_enqueue(&head, &metadata, &payload, &mut ours);
        let record = LogRecord::Enqueue { head, metadata, payload };
        let theirs = rmp_serde::to_vec(&record).unwrap();
        prop_assert_eq!(&ours, &theirs);
        prop_assert_eq!(decode_enqueue(&ours), Some(record));
    }

    /// Whatever the bytes, the decoder answers the value rmp-serde reads or gives up; it
    /// never panics and never disagrees.
    #[test]
    fn decoding_never_disagrees_with_rmp_serde(push in push(), items in prop::collection::vec(outcome(), 0..3), deliveries in prop::collection::vec(delivery(), 0..3), other in pop_path(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = Vec::new();
        encode_push(&push, &mut bytes);
        let mut reserved_bytes = Vec::new();
        encode_reserved(&Reserved { items }, &mut reserved_bytes);
        let mut reply_bytes = Vec::new();
        encode_pop_reply(&PopReply { request: push.request, deliveries }, &mut reply_bytes);
        let other_bytes = other_encoding(&other);
        for bytes in [bytes, reserved_bytes, reply_bytes, other_bytes] {
            let mut damaged = bytes.clone();
            let at = flip.index(damaged.len());
            damaged[at] ^= 1 << bit;
            for body in [&bytes[..cut.index(bytes.len() + 1)], &damaged[..]] {
                if let Some(ours) = decode(body) {
                    let theirs: Wire = rmp_serde::from_slice(body).unwrap();
                    prop_assert_eq!(ours, theirs);
                }
            }
        }
    }
}

#[test]
fn other_encoders_forms_fall_back() {
    // Integers written wider than needed are still canonical enough to read.
    let mut wide = Vec::new();
    w::write_map_len(&mut wide, 1).unwrap();
    str_(&mut wide, PUSH_VARIANT);
    array(&mut wide, 2);
    w::write_u64(&mut wide, 5).unwrap();
    array(&mut wide, 0);
    assert_eq!(
        decode(&wide),
        Some(Wire::Push(Push {
            request: 5,
            messages: vec![]
        }))
    );
    // A message as a map (rmp-serde's named-struct form) is left to rmp-serde, but a push is
    // only ever written as arrays: in any other form it is refused, never allocated unchecked.
    let mut named = Vec::new();
    w::write_map_len(&mut named, 1).unwrap();
    str_(&mut named, RESERVED_VARIANT);
    w::write_map_len(&mut named, 1).unwrap();
    assert_eq!(super::decode(&named, DecodeLimits::NONE), Ok(None));
    let mut named_push = Vec::new();
    w::write_map_len(&mut named_push, 1).unwrap();
    str_(&mut named_push, PUSH_VARIANT);
    w::write_map_len(&mut named_push, 2).unwrap();
    assert!(matches!(
        super::decode(&named_push, DecodeLimits::NONE),
        Err(Rejected::Malformed(_))
    ));
    // Trailing bytes are not a push.
    let mut trailing = Vec::new();
    encode_push(
        &Push {
            request: 1,
            messages: vec![],
        },
        &mut trailing,
    );
    trailing.push(0);
    assert_eq!(decode(&trailing), None);
}

#[test]
fn a_client_s_lists_over_the_limits_are_refused_before_they_are_allocated() {
    // Goal: a push with more messages, or a message with more metadata entries, than the
    // receiver allows, and an ack with too many receipts, are refused while decoding with the
    // code and text the validation after decoding would give, and the request's number.
    let limits = DecodeLimits {
        batch_messages_max: 2,
        metadata_entries_max: 1,
        receipts_max: 3,
        offer_entries_max: 2,
    };
    let message = |entries: usize| PushMessage {
        topic: "t".into(),
        metadata: (0..entries)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect(),
        ..PushMessage::default()
    };
    let refused = |msg: Wire| {
        let mut body = Vec::new();
        assert!(encode(&msg, &mut body));
        match super::decode(&body, limits) {
            Err(Rejected::OverLimit {
                request,
                code,
                message,
            }) => (request, code, message),
            other => panic!("{other:?}"),
        }
    };
    let batch = Wire::Push(Push {
        request: 7,
        messages: vec![message(0); 3],
    });
    assert_eq!(
        refused(batch),
        (
            Some(7),
            ErrorCode::BatchTooLarge,
            "batch of 3 messages exceeds push_batch_messages_max 2".into()
        )
    );
    let metadata = Wire::Push(Push {
        request: 8,
        messages: vec![message(1), message(2)],
    });
    assert_eq!(
        refused(metadata),
        (
            Some(8),
            ErrorCode::InvalidArgument,
            "2 metadata entries exceed metadata_entries_max 1".into()
        )
    );
    let receipts = (0..4)
        .map(|i| Receipt {
            id: MessageId(i),
            token: i,
        })
        .collect();
    let ack = Wire::Ack(Ack {
        request: 9,
        op: Settle::Ack,
        receipts,
    });
    let (request, code, text) = refused(ack);
    assert_eq!((request, code), (Some(9), ErrorCode::InvalidArgument));
    assert!(text.contains("pop_messages_max"), "{text}");
    // A child's offer adding, or taking back, more than its credit.
    let entry = |seq: u64| OfferEntry {
        key: Key::new(0, Time::ZERO, MessageId(seq)),
        size: 1,
        since: Time::ZERO,
        entered: Time::ZERO,
    };
    let offer = |adds: u64, retracts: u64| {
        Wire::Offer(Offer {
            topic: "t".into(),
            adds: (0..adds).map(entry).collect(),
            retracts: (0..retracts).map(|seq| entry(seq).key).collect(),
            frontier: None,
            seq: 1,
        })
    };
    for (adds, retracts, says) in [(3, 0, "3 entries"), (0, 3, "3 retracts")] {
        let (request, code, text) = refused(offer(adds, retracts));
        assert_eq!((request, code), (None, ErrorCode::InvalidArgument));
        assert!(
            text.contains(says) && text.contains("credits_per_topic"),
            "{text}"
        );
    }
    let mut body = Vec::new();
    assert!(encode(&offer(2, 2), &mut body));
    assert_eq!(super::decode(&body, limits), Ok(Some(offer(2, 2))));
    // Within the limits, the same decode as without.
    let fits = Wire::Push(Push {
        request: 10,
        messages: vec![message(1), message(0)],
    });
    let mut body = Vec::new();
    assert!(encode(&fits, &mut body));
    assert_eq!(super::decode(&body, limits), Ok(Some(fits)));
}
