//! Validation of what clients send, shared by the machines that receive it: a leaf checks
//! every pushed message, the root every topic a pop or an admin request names, both the
//! acks, nacks and extends consumers send them.

use crate::config::Settings;
use crate::time::Time;
use crate::wire::{Ack, ErrorCode, PushMessage, Settle};
use std::time::Duration;

/// Checks a consumer's ack, nack or extend: its count of receipts and its operation.
pub(crate) fn validate_settle(s: &Settings, ack: &Ack) -> Result<(), String> {
    let count = ack.receipts.len();
    if count == 0 || count > s.pop_messages_max as usize {
        return Err(format!(
            "{count} receipts is outside 1..={} (pop_messages_max)",
            s.pop_messages_max
        ));
    }
    validate_settle_op(s, &ack.op)
}

/// Checks a settlement's operation: a nack's delay and reason, an extend's timeout.
pub(crate) fn validate_settle_op(s: &Settings, op: &Settle) -> Result<(), String> {
    match op {
        Settle::Ack => {}
        Settle::Nack { delay_ms, reason } => {
            if *delay_ms > s.delay_max_ms {
                return Err(format!(
                    "nack delay of {delay_ms} ms exceeds delay_max_ms {}",
                    s.delay_max_ms
                ));
            }
            if let Some(reason) = reason
                && reason.len() > s.reason_bytes_max as usize
            {
                return Err(format!(
                    "reason of {} bytes exceeds reason_bytes_max {}",
                    reason.len(),
                    s.reason_bytes_max
                ));
            }
        }
        Settle::Extend { lease_ms } => {
            if *lease_ms == 0 || *lease_ms > s.lease_timeout_max_ms {
                return Err(format!(
                    "visibility timeout of {lease_ms} ms is outside 1..={} (lease_timeout_max_ms)",
                    s.lease_timeout_max_ms
                ));
            }
        }
    }
    Ok(())
}

/// Checks a message's metadata: at most `metadata_entries_max` pairs of
/// `metadata_bytes_max` bytes in all.
pub(crate) fn validate_metadata(s: &Settings, metadata: &[(String, String)]) -> Result<(), String> {
    if metadata.len() > s.metadata_entries_max as usize {
        return Err(format!(
            "{} metadata entries exceed metadata_entries_max {}",
            metadata.len(),
            s.metadata_entries_max
        ));
    }
    let bytes: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > s.metadata_bytes_max as usize {
        return Err(format!(
            "{bytes} metadata bytes exceed metadata_bytes_max {}",
            s.metadata_bytes_max
        ));
    }
    Ok(())
}

/// Checks one message of a push batch against the settings.
pub(crate) fn validate_message(
    s: &Settings,
    now: Time,
    message: &PushMessage,
) -> Result<(), (ErrorCode, String)> {
    let invalid = |why: String| Err((ErrorCode::InvalidArgument, why));
    if message.payload.len() > s.payload_bytes_max as usize {
        return Err((
            ErrorCode::PayloadTooLarge,
            format!(
                "payload of {} bytes exceeds payload_bytes_max {}",
                message.payload.len(),
                s.payload_bytes_max
            ),
        ));
    }
    validate_topic(s, &message.topic).map_err(|why| (ErrorCode::InvalidArgument, why))?;
    validate_metadata(s, &message.metadata).map_err(|why| (ErrorCode::InvalidArgument, why))?;
    if message.delay_ms > s.delay_max_ms {
        return invalid(format!(
            "delay of {} ms exceeds delay_max_ms {}",
            message.delay_ms, s.delay_max_ms
        ));
    }
    if let Some(at) = message.deliver_at
        && at > now + Duration::from_millis(s.delay_max_ms)
    {
        return invalid(format!(
            "deliver_at is {} ms ahead; delay_max_ms is {}",
            at.saturating_since(now).as_millis(),
            s.delay_max_ms
        ));
    }
    if let Some(key) = &message.fairness_key {
        s.check_fairness_key(key)
            .map_err(|why| (ErrorCode::InvalidArgument, why))?;
    }
    if let Some(key) = &message.dedup_key
        && (key.is_empty() || key.len() > s.dedup_key_bytes_max as usize)
    {
        return invalid(format!(
            "dedup key of {} bytes is outside 1..={} (dedup_key_bytes_max)",
            key.len(),
            s.dedup_key_bytes_max
        ));
    }
    Ok(())
}

/// Checks a topic name: 1 to `topic_bytes_max` bytes of printable characters.
///
/// # Errors
/// A sentence naming the problem.
pub(crate) fn validate_topic(s: &Settings, topic: &str) -> Result<(), String> {
    s.check_topic(topic)
}
