//! Per-message spans: what a message went through, stage by stage, for a tracing backend.
//!
//! Each stage a message passes through the tree is a `tracing` span at `TRACE` level under the
//! one target [`TARGET`], named after the stage ([`Stage`]) and carrying the message's id,
//! topic and priority. A subscriber that does not ask for the target pays one check per batch
//! ([`enabled`]): the spans are built only when someone listens.
//!
//! A stage ends when its span is made; its `elapsed_us` says how long before that it began (a
//! push from its batch's arrival to its acknowledgement, a delivery from its pop's arrival).
//! The spans of a push and of a delivery carry the message's W3C `traceparent` metadata value
//! ([`TRACEPARENT`]), so an exporter can parent them on the producer's trace and a consumer,
//! which receives the same metadata, can link its own work to it.

use crate::id::MessageId;
use std::time::Duration;

/// The target of every per-message span.
pub const TARGET: &str = "crest::message";

/// The metadata key of a message's W3C trace context (`00-<trace id>-<span id>-<flags>`).
pub const TRACEPARENT: &str = "traceparent";

/// A stage of a message's way through the tree; each is a span of that name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A leaf made the message durable and acknowledged its push.
    Push,
    /// A leaf offered the message to its parent.
    Offer,
    /// A leaf leased the message to the root's reservation.
    Reserve,
    /// The root delivered the message to a consumer's pop.
    Delivery,
    /// A leaf made the consumer's acknowledgement of the message durable.
    Ack,
}

/// Whether anyone listens for per-message spans: callers check once per batch.
#[inline]
pub fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::TRACE)
}

/// The `traceparent` value among `metadata`, if any.
pub fn traceparent(metadata: &[(String, String)]) -> Option<&str> {
    metadata
        .iter()
        .find(|(key, _)| key == TRACEPARENT)
        .map(|(_, value)| value.as_str())
}

/// What one span says of its message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span<'a> {
    pub(crate) id: MessageId,
    pub(crate) topic: &'a str,
    pub(crate) priority: u32,
    /// The message's `traceparent` metadata value ("" when it has none or the stage does not
    /// hold its metadata).
    pub(crate) traceparent: &'a str,
    /// How long before the span the stage began.
    pub(crate) elapsed: Duration,
}

/// Emits the span of `stage` for `span`'s message (callers check [`enabled`] first).
pub(crate) fn emit(stage: Stage, span: Span<'_>) {
    // A callsite per stage: a span's name is fixed where the macro stands.
    let elapsed_us = span.elapsed.as_micros() as u64;
    let made = match stage {
        Stage::Push => tracing::trace_span!(target: TARGET, "push", message_id = %span.id,
            topic = span.topic, priority = span.priority, traceparent = span.traceparent,
            elapsed_us),
        Stage::Offer => tracing::trace_span!(target: TARGET, "offer", message_id = %span.id,
            topic = span.topic, priority = span.priority, traceparent = span.traceparent,
            elapsed_us),
        Stage::Reserve => tracing::trace_span!(target: TARGET, "reserve",
            message_id = %span.id, topic = span.topic, priority = span.priority,
            traceparent = span.traceparent, elapsed_us),
        Stage::Delivery => tracing::trace_span!(target: TARGET, "delivery",
            message_id = %span.id, topic = span.topic, priority = span.priority,
            traceparent = span.traceparent, elapsed_us),
        Stage::Ack => tracing::trace_span!(target: TARGET, "ack", message_id = %span.id,
            topic = span.topic, priority = span.priority, traceparent = span.traceparent,
            elapsed_us),
    };
    // Entered and left at once: the span closes here, its stage over.
    drop(made.entered());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_traceparent_among_metadata() {
        let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let metadata = vec![
            ("kind".to_string(), "order".to_string()),
            (TRACEPARENT.to_string(), value.to_string()),
        ];
        assert_eq!(traceparent(&metadata), Some(value));
        assert_eq!(traceparent(&metadata[..1]), None);
    }
}
