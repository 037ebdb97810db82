//! Hand-written MessagePack for the messages every pushed or popped message passes through:
//! those that carry payloads — the push frame ([`Wire::Push`]), the log's
//! [`LogRecord::Enqueue`], and on the way out [`Wire::Reserved`] (leaf → root, through
//! aggregators) and [`Wire::PopReply`] (root → consumer) — and the pop path's per-entry
//! messages: [`Wire::Offer`], [`Wire::Reserve`], acks ([`Wire::Ack`], [`Wire::Confirm`]) and
//! their answers ([`Wire::AckReply`], [`Wire::Confirmed`]).
//!
//! The bytes are exactly those rmp-serde writes for the same values (structs as arrays, enums
//! as a one-entry map from the variant's name, `None` as nil, newtypes as their field, integers
//! in their shortest form), so the format stays the one the protocol and the log document; the
//! tests compare both encoders on arbitrary values. The decoder accepts that canonical form with
//! integers of any width, and answers `None` for anything else, which callers then hand to
//! rmp-serde: a frame another encoder wrote still decodes, and a malformed one gets
//! rmp-serde's error.
//!
//! Why: serde's generic paths were a quarter of the CPU of a durable push over QUIC (`perf`:
//! encode in the producer, decode in the leaf, encode again in the log writer), and a sixth of
//! a drain's; once the payload-bearing messages were done, the other pop-path messages were
//! still 8 % of a drain's.
//!
//! [`LogRecord::Enqueue`]: crate::record::LogRecord::Enqueue

use crate::config::DecodeLimits;
use crate::id::{LeafId, MessageId, Receipt};
use crate::key::Key;
use crate::record::{LogRecord, MessageHead};
use crate::time::Time;
use crate::wire::{
    Ack, AckReply, Confirm, Confirmed, Delivery, ErrorCode, Escalation, Offer, OfferEntry,
    PopReply, Push, PushMessage, ReceiptError, Reserve, ReserveDenied, ReserveItem, ReserveOutcome,
    Reserved, Settle, Wire,
};
use bytes::Bytes;
use rmp::encode as w;

impl LogRecord {
    /// Appends the record's MessagePack encoding (rmp-serde's form; `Enqueue`, one per pushed
    /// message, is written by hand in that same form).
    ///
    /// # Errors
    /// rmp-serde's message, for a record it cannot encode.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            LogRecord::Enqueue {
                head,
                metadata,
                payload,
            } => {
                encode_enqueue(head, metadata, payload, out);
                Ok(())
            }
            _ => rmp_serde::encode::write(out, self).map_err(|e| e.to_string()),
        }
    }
}

/// The map key rmp-serde writes before a `Push` variant's value.
const PUSH_VARIANT: &str = "Push";
/// The map key rmp-serde writes before an `Enqueue` variant's value.
const ENQUEUE_VARIANT: &str = "Enqueue";
/// The map key rmp-serde writes before a `Reserved` variant's value.
const RESERVED_VARIANT: &str = "Reserved";
/// The map key rmp-serde writes before a `PopReply` variant's value.
const POP_REPLY_VARIANT: &str = "PopReply";
/// The map keys rmp-serde writes before the pop path's other messages.
const OFFER_VARIANT: &str = "Offer";
const RESERVE_VARIANT: &str = "Reserve";
const CONFIRM_VARIANT: &str = "Confirm";
const CONFIRMED_VARIANT: &str = "Confirmed";
const ACK_VARIANT: &str = "Ack";
const ACK_REPLY_VARIANT: &str = "AckReply";
/// `Settle::Ack`, a unit variant: rmp-serde writes its name alone.
const SETTLE_ACK: &str = "Ack";

/// Appends `msg` as rmp-serde would, if it is one of the messages this module writes;
/// `false` (nothing appended) for the others.
pub(crate) fn encode(msg: &Wire, out: &mut Vec<u8>) -> bool {
    match msg {
        Wire::Push(push) => encode_push(push, out),
        Wire::Reserved(reserved) => encode_reserved(reserved, out),
        Wire::PopReply(reply) => encode_pop_reply(reply, out),
        Wire::Offer(offer) => encode_offer(offer, out),
        Wire::Reserve(reserve) => encode_reserve(reserve, out),
        Wire::Confirm(confirm) if confirm.op == Settle::Ack && confirm.grants.is_none() => {
            enum_variant(out, CONFIRM_VARIANT);
            array(out, 4);
            uint(out, confirm.tag);
            uint(out, confirm.leaf.0.into());
            str_(out, SETTLE_ACK);
            receipts(out, &confirm.receipts);
        }
        Wire::Ack(ack) if ack.op == Settle::Ack => {
            enum_variant(out, ACK_VARIANT);
            array(out, 3);
            uint(out, ack.request);
            str_(out, SETTLE_ACK);
            receipts(out, &ack.receipts);
        }
        Wire::Confirmed(confirmed) => {
            tagged_results(out, CONFIRMED_VARIANT, confirmed.tag, &confirmed.results);
        }
        Wire::AckReply(reply) => {
            tagged_results(out, ACK_REPLY_VARIANT, reply.request, &reply.results);
        }
        _ => return false,
    }
    true
}

// Writes into a `Vec` cannot fail; rmp's signatures return `Result` for other writers.
fn str_(out: &mut Vec<u8>, s: &str) {
    w::write_str(out, s).expect("write to Vec");
}
fn uint(out: &mut Vec<u8>, v: u64) {
    w::write_uint(out, v).expect("write to Vec");
}
fn bool_(out: &mut Vec<u8>, v: bool) {
    w::write_bool(out, v).expect("write to Vec");
}

fn array(out: &mut Vec<u8>, len: usize) {
    w::write_array_len(out, len as u32).expect("write to Vec");
}
fn bin(out: &mut Vec<u8>, b: &[u8]) {
    w::write_bin(out, b).expect("write to Vec");
}
fn nil(out: &mut Vec<u8>) {
    w::write_nil(out).expect("write to Vec");
}
fn opt_uint(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => uint(out, v),
        None => nil(out),
    }
}
fn opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => str_(out, v),
        None => nil(out),
    }
}
fn metadata(out: &mut Vec<u8>, pairs: &[(String, String)]) {
    array(out, pairs.len());
    for (key, value) in pairs {
        array(out, 2);
        str_(out, key);
        str_(out, value);
    }
}

/// Starts an enum value: rmp-serde writes a one-entry map from the variant's name.
fn enum_variant(out: &mut Vec<u8>, name: &str) {
    w::write_map_len(out, 1).expect("write to Vec");
    str_(out, name);
}

/// Starts a message made of a request number and a list of `len` elements.
fn request_and_list(out: &mut Vec<u8>, variant: &str, request: u64, len: usize) {
    enum_variant(out, variant);
    array(out, 2);
    uint(out, request);
    array(out, len);
}

/// Appends `Wire::Push(push)` as rmp-serde would.
fn encode_push(push: &Push, out: &mut Vec<u8>) {
    request_and_list(out, PUSH_VARIANT, push.request, push.messages.len());
    for m in &push.messages {
        array(out, 9);
        str_(out, &m.topic);
        uint(out, m.priority.into());
        metadata(out, &m.metadata);
        bin(out, &m.payload);
        opt_uint(out, m.deliver_at.map(|t| t.0));
        uint(out, m.delay_ms);
        opt_uint(out, m.ttl_ms);
        opt_str(out, m.dedup_key.as_deref());
        opt_str(out, m.fairness_key.as_deref());
    }
}

/// Appends `LogRecord::Enqueue { head, metadata, payload }` as rmp-serde would.
pub(crate) fn encode_enqueue(
    head: &MessageHead,
    pairs: &[(String, String)],
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    enum_variant(out, ENQUEUE_VARIANT);
    array(out, 3);
    array(out, 8);
    uint(out, head.id.0);
    str_(out, &head.topic);
    uint(out, head.priority.into());
    uint(out, head.ready_at.0);
    uint(out, head.enqueued_at.0);
    opt_uint(out, head.expires_at.map(|t| t.0));
    opt_str(out, head.dedup_key.as_deref());
    opt_str(out, head.fairness_key.as_deref());
    metadata(out, pairs);
    bin(out, payload);
}

fn key(out: &mut Vec<u8>, key: &Key) {
    array(out, 3);
    uint(out, key.rank());
    uint(out, key.ready_at.0);
    uint(out, key.id.0);
}

fn delivery(out: &mut Vec<u8>, d: &Delivery) {
    array(out, 11);
    uint(out, d.id.0);
    uint(out, d.token);
    str_(out, &d.topic);
    uint(out, d.priority.into());
    uint(out, d.attempt.into());
    uint(out, d.enqueued_at.0);
    uint(out, d.lease_deadline.0);
    metadata(out, &d.metadata);
    bin(out, &d.payload);
    match &d.escalation {
        None => nil(out),
        Some(e) => {
            array(out, 5);
            uint(out, e.original_priority.into());
            uint(out, e.escalated_at.0);
            opt_str(out, e.escalated_by.as_deref());
            str_(out, &e.reason);
            bool_(out, e.aged);
        }
    }
    opt_str(out, d.fairness_key.as_deref());
}

/// Appends `Wire::Reserved(reserved)` as rmp-serde would.
fn encode_reserved(reserved: &Reserved, out: &mut Vec<u8>) {
    enum_variant(out, RESERVED_VARIANT);
    array(out, 1);
    array(out, reserved.items.len());
    for item in &reserved.items {
        array(out, 3);
        uint(out, item.reservation);
        key(out, &item.key);
        match &item.result {
            Ok(d) => {
                enum_variant(out, "Ok");
                delivery(out, d);
            }
            Err(denied) => {
                enum_variant(out, "Err");
                str_(out, denied_name(*denied));
            }
        }
    }
}

/// Appends `Wire::PopReply(reply)` as rmp-serde would.
fn encode_pop_reply(reply: &PopReply, out: &mut Vec<u8>) {
    request_and_list(
        out,
        POP_REPLY_VARIANT,
        reply.request,
        reply.deliveries.len(),
    );
    for d in &reply.deliveries {
        delivery(out, d);
    }
}

fn offer_entry(out: &mut Vec<u8>, entry: &OfferEntry) {
    array(out, 4);
    key(out, &entry.key);
    uint(out, entry.size.into());
    uint(out, entry.since.0);
    uint(out, entry.entered.0);
}

fn encode_offer(offer: &Offer, out: &mut Vec<u8>) {
    enum_variant(out, OFFER_VARIANT);
    array(out, 5);
    str_(out, &offer.topic);
    array(out, offer.adds.len());
    for entry in &offer.adds {
        offer_entry(out, entry);
    }
    array(out, offer.retracts.len());
    for retract in &offer.retracts {
        key(out, retract);
    }
    match &offer.frontier {
        Some(frontier) => key(out, frontier),
        None => nil(out),
    }
    uint(out, offer.seq);
}

fn encode_reserve(reserve: &Reserve, out: &mut Vec<u8>) {
    enum_variant(out, RESERVE_VARIANT);
    array(out, 7);
    uint(out, reserve.leaf.0.into());
    str_(out, &reserve.topic);
    uint(out, reserve.lease_ms);
    array(out, reserve.items.len());
    for item in &reserve.items {
        array(out, 2);
        uint(out, item.reservation);
        key(out, &item.key);
    }
    uint(out, reserve.offer_seq);
    bool_(out, reserve.direct);
    bool_(out, reserve.ahead);
}

fn receipts(out: &mut Vec<u8>, receipts: &[Receipt]) {
    array(out, receipts.len());
    for receipt in receipts {
        array(out, 2);
        uint(out, receipt.id.0);
        uint(out, receipt.token);
    }
}

/// A `Confirmed` or an `AckReply`: a number, then one result per receipt.
fn tagged_results(
    out: &mut Vec<u8>,
    variant: &str,
    tag: u64,
    results: &[Result<(), ReceiptError>],
) {
    enum_variant(out, variant);
    array(out, 2);
    uint(out, tag);
    array(out, results.len());
    for result in results {
        match result {
            Ok(()) => {
                enum_variant(out, "Ok");
                nil(out);
            }
            Err(error) => {
                enum_variant(out, "Err");
                str_(out, receipt_error_name(*error));
            }
        }
    }
}

fn receipt_error_name(error: ReceiptError) -> &'static str {
    match error {
        ReceiptError::Stale => "Stale",
        ReceiptError::UnknownMessage => "UnknownMessage",
        ReceiptError::Settled => "Settled",
        ReceiptError::UnknownLeaf => "UnknownLeaf",
        ReceiptError::Unavailable => "Unavailable",
        ReceiptError::TimedOut => "TimedOut",
        ReceiptError::Forbidden => "Forbidden",
    }
}

fn denied_name(denied: ReserveDenied) -> &'static str {
    match denied {
        ReserveDenied::Leased => "Leased",
        ReserveDenied::Gone => "Gone",
        ReserveDenied::Unavailable => "Unavailable",
        ReserveDenied::InOrder => "InOrder",
    }
}

/// MessagePack's fixarray markers (the length in the marker's low bits).
const ARRAY_FIX: std::ops::RangeInclusive<u8> = 0x90..=0x9f;

/// The length a MessagePack length header at the start of `buf` gives (a fix marker, or a
/// marker `l8`, `l16` or `l32` followed by a big-endian length of that width) and the
/// header's size in bytes; `None` for any other marker or a header cut short.
fn length_header(
    buf: &[u8],
    fix: std::ops::RangeInclusive<u8>,
    l8: Option<u8>,
    l16: u8,
    l32: u8,
) -> Option<(usize, usize)> {
    let marker = *buf.first()?;
    let width = if fix.contains(&marker) {
        return Some((usize::from(marker - fix.start()), 1));
    } else if Some(marker) == l8 {
        1
    } else if marker == l16 {
        2
    } else if marker == l32 {
        4
    } else {
        return None;
    };
    let len = buf
        .get(1..=width)?
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    Some((usize::try_from(len).ok()?, 1 + width))
}

/// A cursor over a body being decoded; every method answers `None` on anything but the
/// canonical form, or on a list over the receiver's limits (noted in `refused`).
struct Reader<'a> {
    buf: &'a [u8],
    limits: DecodeLimits,
    /// The request being decoded, to answer a refusal with.
    request: Option<u64>,
    /// Why the body was refused before its lists were allocated.
    refused: Option<Rejected>,
}

/// Why [`decode`] refused a body (the frame layer answers it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rejected {
    /// A list over the receiver's limits.
    OverLimit {
        request: Option<u64>,
        code: ErrorCode,
        message: String,
    },
    /// A push not in the canonical form.
    Malformed(String),
}

impl Reader<'_> {
    /// Notes a refusal and answers `None`, which ends the decoding.
    fn refuse<T>(&mut self, code: ErrorCode, message: String) -> Option<T> {
        self.refused = Some(Rejected::OverLimit {
            request: self.request,
            code,
            message,
        });
        None
    }
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        Some(
            self.take(n)?
                .iter()
                .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
        )
    }

    /// An unsigned integer of any width (a negative one is not canonical here).
    fn uint(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0x00..=0x7f => Some(b.into()),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            _ => None,
        }
    }

    fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0xc2 => Some(false),
            0xc3 => Some(true),
            _ => None,
        }
    }

    fn u32(&mut self) -> Option<u32> {
        self.uint()?.try_into().ok()
    }

    fn is_nil(&mut self) -> bool {
        if self.peek() == Some(0xc0) {
            self.buf = &self.buf[1..];
            true
        } else {
            false
        }
    }

    fn opt_uint(&mut self) -> Option<Option<u64>> {
        if self.is_nil() {
            return Some(None);
        }
        self.uint().map(Some)
    }

    fn len(
        &mut self,
        fix: std::ops::RangeInclusive<u8>,
        l8: Option<u8>,
        l16: u8,
        l32: u8,
    ) -> Option<usize> {
        let (len, header) = length_header(self.buf, fix, l8, l16, l32)?;
        self.buf = &self.buf[header..];
        Some(len)
    }

    fn array(&mut self) -> Option<usize> {
        // MessagePack has no array8 or map8.
        self.len(ARRAY_FIX, None, 0xdc, 0xdd)
    }

    fn map(&mut self) -> Option<usize> {
        self.len(0x80..=0x8f, None, 0xde, 0xdf)
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = self.len(0xa0..=0xbf, Some(0xd9), 0xda, 0xdb)?;
        std::str::from_utf8(self.take(len)?).ok()
    }

    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.is_nil() {
            return Some(None);
        }
        self.str().map(|s| Some(s.to_owned()))
    }

    fn bin(&mut self) -> Option<&'a [u8]> {
        let len = match self.byte()? {
            0xc4 => self.be(1)?,
            0xc5 => self.be(2)?,
            0xc6 => self.be(4)?,
            _ => return None,
        };
        self.take(usize::try_from(len).ok()?)
    }

    fn metadata(&mut self) -> Option<Vec<(String, String)>> {
        let max = self.limits.metadata_entries_max;
        let count = self.peek_count()?;
        if count > max as usize {
            return self.refuse(
                ErrorCode::InvalidArgument,
                format!("{count} metadata entries exceed metadata_entries_max {max}"),
            );
        }
        // Each pair takes at least 3 bytes.
        self.list(3, |r| {
            r.fields(2)?;
            Some((r.str()?.to_owned(), r.str()?.to_owned()))
        })
    }
}

impl Reader<'_> {
    fn key(&mut self) -> Option<Key> {
        self.fields(3)?;
        let rank = self.uint()?;
        Key::from_rank(rank, Time(self.uint()?), MessageId(self.uint()?))
    }

    fn delivery(&mut self) -> Option<Delivery> {
        self.fields(11)?;
        Some(Delivery {
            id: MessageId(self.uint()?),
            token: self.uint()?,
            topic: self.str()?.to_owned(),
            priority: self.u32()?,
            attempt: self.u32()?,
            enqueued_at: Time(self.uint()?),
            lease_deadline: Time(self.uint()?),
            metadata: self.metadata()?,
            payload: Bytes::copy_from_slice(self.bin()?),
            escalation: if self.is_nil() {
                None
            } else {
                self.fields(5)?;
                Some(Escalation {
                    original_priority: self.u32()?,
                    escalated_at: Time(self.uint()?),
                    escalated_by: self.opt_string()?,
                    reason: self.str()?.to_owned(),
                    aged: self.bool()?,
                })
            },
            fairness_key: self.opt_string()?,
        })
    }

    /// The length of the array that starts here, without moving past it.
    fn peek_count(&self) -> Option<usize> {
        length_header(self.buf, ARRAY_FIX, None, 0xdc, 0xdd).map(|(count, _)| count)
    }

    /// A count of elements of at least `min_bytes` each that the rest of the body can hold.
    fn count(&mut self, min_bytes: usize) -> Option<usize> {
        let count = self.array()?;
        (count <= self.buf.len() / min_bytes).then_some(count)
    }

    /// A list of elements of at least `min_bytes` each, read by `element`.
    fn list<T>(
        &mut self,
        min_bytes: usize,
        mut element: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let count = self.count(min_bytes)?;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(element(self)?);
        }
        Some(items)
    }

    /// An array of exactly `len` elements (a struct's fields) starts here.
    fn fields(&mut self, len: usize) -> Option<()> {
        (self.array()? == len).then_some(())
    }
}

impl Reader<'_> {
    /// A one-entry map's key: the variant of an enum value rmp-serde wrote.
    fn enum_variant(&mut self) -> Option<&str> {
        if self.map()? != 1 {
            return None;
        }
        self.str()
    }

    fn push(&mut self) -> Option<Push> {
        self.fields(2)?;
        let request = self.uint()?;
        self.request = Some(request);
        let max = self.limits.batch_messages_max;
        let count = self.peek_count()?;
        if count > max as usize {
            return self.refuse(
                ErrorCode::BatchTooLarge,
                format!("batch of {count} messages exceeds push_batch_messages_max {max}"),
            );
        }
        // A message takes at least 11 bytes.
        let count = self.count(11)?;
        let mut messages = Vec::with_capacity(count);
        let mut last_topic: Option<(&[u8], String)> = None;
        for _ in 0..count {
            self.fields(9)?;
            let topic = self.str()?;
            // Consecutive messages mostly share a topic: checked as UTF-8 once, copied by clone.
            let topic = match &last_topic {
                Some((bytes, owned)) if *bytes == topic.as_bytes() => owned.clone(),
                _ => {
                    last_topic = Some((topic.as_bytes(), topic.to_owned()));
                    topic.to_owned()
                }
            };
            messages.push(PushMessage {
                topic,
                priority: self.u32()?,
                metadata: self.metadata()?,
                payload: Bytes::copy_from_slice(self.bin()?),
                deliver_at: self.opt_uint()?.map(Time),
                delay_ms: self.uint()?,
                ttl_ms: self.opt_uint()?,
                dedup_key: self.opt_string()?,
                fairness_key: self.opt_string()?,
            });
        }
        Some(Push { request, messages })
    }

    fn reserved(&mut self) -> Option<Reserved> {
        self.fields(1)?;
        // An outcome takes at least 16 bytes (a denial; a delivery takes more).
        let items = self.list(16, |r| {
            r.fields(3)?;
            let reservation = r.uint()?;
            let key = r.key()?;
            let result = match r.enum_variant()? {
                "Ok" => Ok(r.delivery()?),
                "Err" => Err(match r.str()? {
                    "Leased" => ReserveDenied::Leased,
                    "Gone" => ReserveDenied::Gone,
                    "Unavailable" => ReserveDenied::Unavailable,
                    "InOrder" => ReserveDenied::InOrder,
                    _ => return None,
                }),
                _ => return None,
            };
            Some(ReserveOutcome {
                reservation,
                key,
                result,
            })
        })?;
        Some(Reserved { items })
    }

    fn pop_reply(&mut self) -> Option<PopReply> {
        self.fields(2)?;
        Some(PopReply {
            request: self.uint()?,
            // A delivery takes at least 11 bytes.
            deliveries: self.list(11, Self::delivery)?,
        })
    }
}

impl Reader<'_> {
    fn leaf(&mut self) -> Option<LeafId> {
        Some(LeafId(self.uint()?.try_into().ok()?))
    }

    /// Refuses an offer's list of `what` that holds more than a child's credit.
    fn within_credit(&mut self, what: &str) -> Option<()> {
        let max = self.limits.offer_entries_max;
        let count = self.peek_count()?;
        if count > max as usize {
            return self.refuse(
                ErrorCode::InvalidArgument,
                format!(
                    "an offer of {count} {what} exceeds the credit of {max} (credits_per_topic)"
                ),
            );
        }
        Some(())
    }

    fn offer(&mut self) -> Option<Offer> {
        self.fields(5)?;
        let topic = self.str()?.to_owned();
        self.within_credit("entries")?;
        // An entry takes at least 8 bytes, a key 4.
        let adds = self.list(8, |r| {
            r.fields(4)?;
            Some(OfferEntry {
                key: r.key()?,
                size: r.u32()?,
                since: Time(r.uint()?),
                entered: Time(r.uint()?),
            })
        })?;
        self.within_credit("retracts")?;
        let retracts = self.list(4, Self::key)?;
        let frontier = if self.is_nil() {
            None
        } else {
            Some(self.key()?)
        };
        Some(Offer {
            topic,
            adds,
            retracts,
            frontier,
            seq: self.uint()?,
        })
    }

    fn reserve(&mut self) -> Option<Reserve> {
        self.fields(7)?;
        let leaf = self.leaf()?;
        let topic = self.str()?.to_owned();
        let lease_ms = self.uint()?;
        // An item takes at least 6 bytes.
        let items = self.list(6, |r| {
            r.fields(2)?;
            Some(ReserveItem {
                reservation: r.uint()?,
                key: r.key()?,
            })
        })?;
        Some(Reserve {
            leaf,
            topic,
            lease_ms,
            items,
            offer_seq: self.uint()?,
            direct: self.bool()?,
            ahead: self.bool()?,
        })
    }

    /// `Settle::Ack` and the receipts after it; other settle operations are left to
    /// rmp-serde.
    /// An ack's receipts, at most `max` (a client's: checked before they are allocated).
    fn ack_receipts(&mut self, max: Option<u32>) -> Option<Vec<Receipt>> {
        if self.str()? != SETTLE_ACK {
            return None;
        }
        if let Some(max) = max {
            let count = self.peek_count()?;
            if count > max as usize {
                return self.refuse(
                    ErrorCode::InvalidArgument,
                    format!("{count} receipts is outside 1..={max} (pop_messages_max)"),
                );
            }
        }
        // A receipt takes at least 3 bytes.
        self.list(3, |r| {
            r.fields(2)?;
            Some(Receipt {
                id: MessageId(r.uint()?),
                token: r.uint()?,
            })
        })
    }

    fn confirm(&mut self) -> Option<Confirm> {
        self.fields(4)?;
        Some(Confirm {
            tag: self.uint()?,
            leaf: self.leaf()?,
            op: Settle::Ack,
            receipts: self.ack_receipts(None)?,
            grants: None,
        })
    }

    fn ack(&mut self) -> Option<Ack> {
        self.fields(3)?;
        let request = self.uint()?;
        self.request = Some(request);
        let max = self.limits.receipts_max;
        Some(Ack {
            request,
            op: Settle::Ack,
            receipts: self.ack_receipts(Some(max))?,
        })
    }

    /// The number and results of a `Confirmed` or an `AckReply`.
    fn tagged_results(&mut self) -> Option<(u64, Vec<Result<(), ReceiptError>>)> {
        self.fields(2)?;
        let tag = self.uint()?;
        // A result takes at least 5 bytes.
        let results = self.list(5, |r| {
            let ok = match r.enum_variant()? {
                "Ok" => true,
                "Err" => false,
                _ => return None,
            };
            if ok {
                return r.is_nil().then_some(Ok(()));
            }
            Some(Err(match r.str()? {
                "Stale" => ReceiptError::Stale,
                "UnknownMessage" => ReceiptError::UnknownMessage,
                "Settled" => ReceiptError::Settled,
                "UnknownLeaf" => ReceiptError::UnknownLeaf,
                "Unavailable" => ReceiptError::Unavailable,
                "TimedOut" => ReceiptError::TimedOut,
                "Forbidden" => ReceiptError::Forbidden,
                _ => return None,
            }))
        })?;
        Some((tag, results))
    }
}

/// Decodes `body` if it holds one of the messages this module writes, in the canonical form
/// and nothing after it: `Ok(None)` otherwise (the caller then decodes it with rmp-serde).
/// A client's `Push` and `Ack` are checked against `limits` before their lists are
/// allocated; a `Push` is only ever written in the canonical form, so one in another form is
/// refused rather than handed to rmp-serde, which would allocate before any check.
///
/// # Errors
/// [`Rejected::OverLimit`] for a list over `limits`, [`Rejected::Malformed`] for a `Push`
/// not in the canonical form.
pub(crate) fn decode(body: &[u8], limits: DecodeLimits) -> Result<Option<Wire>, Rejected> {
    let mut r = Reader {
        buf: body,
        limits,
        request: None,
        refused: None,
    };
    let mut push = false;
    let msg = match r.enum_variant() {
        Some(PUSH_VARIANT) => {
            push = true;
            r.push().map(Wire::Push)
        }
        Some(RESERVED_VARIANT) => r.reserved().map(Wire::Reserved),
        Some(POP_REPLY_VARIANT) => r.pop_reply().map(Wire::PopReply),
        Some(OFFER_VARIANT) => r.offer().map(Wire::Offer),
        Some(RESERVE_VARIANT) => r.reserve().map(Wire::Reserve),
        Some(CONFIRM_VARIANT) => r.confirm().map(Wire::Confirm),
        Some(ACK_VARIANT) => r.ack().map(Wire::Ack),
        Some(CONFIRMED_VARIANT) => r
            .tagged_results()
            .map(|(tag, results)| Wire::Confirmed(Confirmed { tag, results })),
        Some(ACK_REPLY_VARIANT) => r
            .tagged_results()
            .map(|(request, results)| Wire::AckReply(AckReply { request, results })),
        _ => return Ok(None),
    };
    if let Some(refused) = r.refused {
        return Err(refused);
    }
    match msg {
        Some(msg) if r.buf.is_empty() => Ok(Some(msg)),
        _ if push => Err(Rejected::Malformed(
            "a Push not in the canonical form (as rmp-serde writes it)".into(),
        )),
        _ => Ok(None),
    }
}

/// Decodes what [`encode_enqueue`] wrote; `None` if `body` is not that canonical form.
#[cfg(test)]
pub(crate) fn decode_enqueue(body: &[u8]) -> Option<LogRecord> {
    let mut r = Reader {
        buf: body,
        limits: DecodeLimits::NONE,
        request: None,
        refused: None,
    };
    if r.enum_variant()? != ENQUEUE_VARIANT {
        return None;
    }
    r.fields(3)?;
    r.fields(8)?;
    let head = MessageHead {
        id: MessageId(r.uint()?),
        topic: r.str()?.to_owned(),
        priority: r.u32()?,
        ready_at: Time(r.uint()?),
        enqueued_at: Time(r.uint()?),
        expires_at: r.opt_uint()?.map(Time),
        dedup_key: r.opt_string()?,
        fairness_key: r.opt_string()?,
    };
    let metadata = r.metadata()?;
    let payload = Bytes::copy_from_slice(r.bin()?);
    r.buf.is_empty().then_some(LogRecord::Enqueue {
        head,
        metadata,
        payload,
    })
}

#[cfg(test)]
mod tests;
