//! The SQS operations, over crest's SDK: each takes the request's JSON and answers JSON, or an
//! [`SqsError`].

use crate::digest::{Attribute, AttributeValue, md5_of_attributes, md5_of_body};
use crate::error::{SqsError, receipt_error, tree_error};
use crate::params::{names, number, number_within, text};
use crate::queues::{QueueAttributes, QueueName};
use crate::{Caller, State, manage, moves};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use crest_core::id::Receipt;
use crest_core::wire::Settle;
use crest_sdk::Message;
use crest_sdk::ReceiptError;
use crest_sdk::{Delivery, PopOptions};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

/// Most entries in one batch request.
const BATCH_ENTRIES_MAX: usize = 10;
/// Most bytes of the messages of one batch request (bodies and attributes), as SQS's 1 MiB.
const BATCH_BYTES_MAX: usize = 1_048_576;
/// Most messages one receive returns.
const RECEIVE_MAX: u64 = 10;
/// Longest long poll.
const WAIT_SECONDS_MAX: u64 = 20;
/// Longest visibility timeout (12 hours).
const VISIBILITY_SECONDS_MAX: u64 = 43_200;
/// Longest delay of a message.
const DELAY_SECONDS_MAX: u64 = 900;
/// Most message attributes on one message.
const ATTRIBUTES_MAX: usize = 10;
/// The message attribute that carries a message's priority.
pub const PRIORITY_ATTRIBUTE: &str = "Priority";
/// Metadata keys that hold a message attribute: `sqs.a.NAME` = `TYPE\nVALUE`.
const ATTRIBUTE_PREFIX: &str = "sqs.a.";
/// Metadata key of the access key that sent a message (`SenderId`), stamped (see
/// [`sender_stamp`]).
const SENDER_KEY: &str = "sqs.sender";
/// Metadata key of a message's `AWSTraceHeader` system attribute.
const TRACE_KEY: &str = "sqs.trace";
/// The metadata key of a FIFO message's `MessageDeduplicationId` (given or derived).
const DEDUP_KEY: &str = "sqs.dedup";
/// The one system attribute a sender may set.
const TRACE_ATTRIBUTE: &str = "AWSTraceHeader";

/// The `sqs.sender` value of a message with `body` sent with the key `key_id`: the id and an
/// HMAC-SHA256 of it and the body under the key's secret. A native producer may set any
/// metadata, but cannot name a key it does not hold as a message's sender.
pub(crate) fn sender_stamp(key_id: &str, secret: &str, body: &str) -> String {
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes()),
        format!("crest sqs sender\n{key_id}\n{body}").as_bytes(),
    );
    format!("{key_id} {}", crate::sigv4::hex(mac.as_ref()))
}

/// The key a stamp names, if it is a key of this gateway's and the stamp is its (a stamp
/// that does not verify names no sender).
fn stamped_sender(state: &State, stamp: &str, body: &str) -> Option<String> {
    let (key_id, _) = stamp.split_once(' ')?;
    let key = state.keys.get(key_id)?;
    let expected = sender_stamp(key_id, &key.secret, body);
    // Constant time, as signatures are compared.
    let same = expected.len() == stamp.len()
        && expected
            .bytes()
            .zip(stamp.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    same.then(|| key_id.to_string())
}

/// Runs operation `action` for `caller`.
pub(crate) async fn dispatch(
    state: &State,
    caller: &Caller,
    action: &str,
    input: &Value,
) -> Result<Value, SqsError> {
    match action {
        "CreateQueue" => manage::create_queue(state, caller, input).await,
        "GetQueueUrl" => manage::get_queue_url(state, caller, input).await,
        "ListQueues" => manage::list_queues(state, caller, input).await,
        "DeleteQueue" => manage::delete_queue(state, caller, input).await,
        "GetQueueAttributes" => manage::get_queue_attributes(state, caller, input).await,
        "SetQueueAttributes" => manage::set_queue_attributes(state, caller, input).await,
        "PurgeQueue" => manage::purge_queue(state, caller, input).await,
        "ListDeadLetterSourceQueues" => manage::dead_letter_sources(state, caller, input).await,
        "StartMessageMoveTask" => moves::start(state, caller, input).await,
        "ListMessageMoveTasks" => moves::list(state, caller, input).await,
        "CancelMessageMoveTask" => moves::cancel(state, caller, input).await,
        "SendMessage" => send_message(state, caller, input).await,
        "SendMessageBatch" => send_message_batch(state, caller, input).await,
        "ReceiveMessage" => receive_message(state, caller, input).await,
        "DeleteMessage" => settle(state, caller, input, Op::Delete, false).await,
        "ChangeMessageVisibility" => settle(state, caller, input, Op::Visibility, false).await,
        "DeleteMessageBatch" => settle(state, caller, input, Op::Delete, true).await,
        "ChangeMessageVisibilityBatch" => settle(state, caller, input, Op::Visibility, true).await,
        "TagQueue" => manage::tag_queue(state, caller, input).await,
        "UntagQueue" => manage::untag_queue(state, caller, input).await,
        "ListQueueTags" => manage::list_queue_tags(state, caller, input).await,
        "AddPermission" => manage::add_permission(state, caller, input).await,
        "RemovePermission" => manage::remove_permission(state, caller, input).await,
        _ => Err(SqsError::unknown_action(action)),
    }
}

/// Whether the query protocol serves `action` at a queue's URL: SQS refuses `CreateQueue` and
/// `ListQueues` there (`InvalidAction`) and serves the rest, `GetQueueUrl` included (AWS's
/// recorded answers in LocalStack's tests).
pub(crate) fn served_at_a_queue(action: &str) -> bool {
    !matches!(action, "CreateQueue" | "ListQueues")
}

/// The queue a request's `QueueUrl` names, as the tree keeps it (cached).
async fn queue_of(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<(QueueName, QueueAttributes), SqsError> {
    let name = caller.addressed(text(input, "QueueUrl")?, &state.config.region)?;
    let clients = state.clients(caller)?;
    let queue = clients.queue(&state.config, &name).await?;
    Ok((name, queue.attributes))
}

/// A body SQS takes: present, and of XML's characters.
fn check_body(body: &str) -> Result<(), SqsError> {
    if body.is_empty() {
        return Err(SqsError::missing("MessageBody"));
    }
    if let Some(c) = body.chars().find(|c| !xml_char(*c)) {
        return Err(SqsError::bad_contents(format!(
            "Invalid characters found in the message body: U+{:04X}.",
            c as u32
        )));
    }
    Ok(())
}

/// The size SQS gives a message of a send request (an entry of a batch): its body's bytes and
/// each attribute's name, type and value (a binary value's bytes).
fn message_bytes(entry: &Value) -> usize {
    let body = entry["MessageBody"].as_str().map_or(0, str::len);
    let attributes = entry["MessageAttributes"].as_object().into_iter().flatten();
    let attribute = |(name, value): (&String, &Value)| {
        let text = |field: &str| value[field].as_str().unwrap_or_default();
        let binary = text("BinaryValue");
        let binary = BASE64.decode(binary).map_or(binary.len(), |b| b.len());
        name.len() + text("DataType").len() + text("StringValue").len() + binary
    };
    body + attributes.map(attribute).sum::<usize>()
}

/// A batch's answer: SQS leaves out a list that is empty.
fn batch_result(successful: Vec<Value>, failed: Vec<Value>) -> Value {
    let mut out = Map::new();
    if !successful.is_empty() {
        out.insert("Successful".into(), successful.into());
    }
    if !failed.is_empty() {
        out.insert("Failed".into(), failed.into());
    }
    out.into()
}

/// Whether SQS takes `c` in a body or a string attribute: XML's characters.
fn xml_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
        || c >= '\u{10000}'
}

/// A message's attributes from a request's `MessageAttributes`.
fn parse_attributes(input: &Value) -> Result<Vec<(String, Attribute)>, SqsError> {
    let Some(map) = input.get("MessageAttributes") else {
        return Ok(Vec::new());
    };
    let map = map
        .as_object()
        .ok_or_else(|| SqsError::invalid("MessageAttributes must be a map"))?;
    if map.len() > ATTRIBUTES_MAX {
        return Err(SqsError::invalid(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{ATTRIBUTES_MAX}].",
            map.len()
        )));
    }
    let mut out = Vec::with_capacity(map.len());
    for (name, value) in map {
        // Letters and digits of any script, as SQS takes them (`attr.1øßä`), and `_-.`.
        let valid_name = !name.is_empty()
            && name.chars().count() <= 256
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && !name.starts_with('.')
            && !name.ends_with('.')
            && !name.to_ascii_lowercase().starts_with("aws.")
            && !name.to_ascii_lowercase().starts_with("amazon.");
        if !valid_name {
            return Err(SqsError::invalid(format!(
                "Message attribute name {name:?} is invalid."
            )));
        }
        let data_type = value
            .get("DataType")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                SqsError::invalid(format!("The message attribute {name} has no DataType."))
            })?;
        let base = data_type.split('.').next().unwrap_or_default();
        let field = |field: &str| {
            value.get(field).and_then(Value::as_str).ok_or_else(|| {
                SqsError::invalid(format!("The message attribute {name} has no {field}."))
            })
        };
        let empty = || {
            SqsError::invalid(format!(
                "Message (user) attribute '{name}' must contain a non-empty value of type \
                 '{base}'."
            ))
        };
        let value = match base {
            "String" | "Number" => {
                let text = field("StringValue")?;
                if text.is_empty() {
                    return Err(empty());
                }
                if let Some(c) = text.chars().find(|c| !xml_char(*c)) {
                    return Err(SqsError::invalid(format!(
                        "Message (user) attribute '{name}' has an invalid character: U+{:04X}.",
                        c as u32
                    )));
                }
                if base == "Number" && text.parse::<f64>().is_err() {
                    return Err(SqsError::invalid(format!(
                        "Can't cast the value of message attribute {name} to a number."
                    )));
                }
                AttributeValue::Text(text.to_string())
            }
            "Binary" => {
                let bytes = BASE64.decode(field("BinaryValue")?).map_err(|_| {
                    SqsError::invalid(format!("The message attribute {name} is not base64."))
                })?;
                if bytes.is_empty() {
                    return Err(empty());
                }
                AttributeValue::Binary(bytes)
            }
            _ => {
                return Err(SqsError::invalid(format!(
                    "The type of message attribute {name} is invalid: {data_type:?}."
                )));
            }
        };
        out.push((
            name.clone(),
            Attribute {
                data_type: data_type.to_string(),
                value,
            },
        ));
    }
    Ok(out)
}

/// The crest message for a send (entry) to `queue`, and the digests to answer with.
pub(crate) struct Prepared {
    message: Message,
    md5_body: String,
    md5_attributes: Option<String>,
    md5_system: Option<String>,
    /// Sent to a FIFO queue (answered with a `SequenceNumber`).
    fifo: bool,
}

/// Checks a batch's entries for a FIFO queue as SQS does before any is sent: every entry
/// needs its group, and a deduplication id unless the queue derives it from the body.
fn check_fifo_batch(queue: &QueueAttributes, entries: &[Value]) -> Result<(), SqsError> {
    let Some(fifo) = &queue.fifo else {
        return Ok(());
    };
    let lacks = |name: &str| {
        entries
            .iter()
            .any(|e| e.get(name).is_none_or(Value::is_null))
    };
    if lacks("MessageGroupId") {
        return Err(SqsError::invalid(
            "The request must contain the parameter MessageGroupId.",
        ));
    }
    if !fifo.content_based && lacks("MessageDeduplicationId") {
        return Err(SqsError::invalid(NO_DEDUP_ID));
    }
    Ok(())
}

/// SQS's answer to a FIFO send without a deduplication id to a queue that derives none.
const NO_DEDUP_ID: &str = "The queue should either have ContentBasedDeduplication enabled or \
                           MessageDeduplicationId provided explicitly";

pub(crate) fn prepare(
    caller: &Caller,
    name: &QueueName,
    queue: &QueueAttributes,
    entry: &Value,
) -> Result<Prepared, SqsError> {
    let body = text(entry, "MessageBody")?;
    check_body(body)?;
    let attributes = parse_attributes(entry)?;
    // As SQS counts a message: its body and its attributes' names, types and values.
    let max = queue.maximum_message_size;
    if message_bytes(entry) > max as usize {
        return Err(SqsError::invalid(format!(
            "One or more parameters are invalid. Reason: Message must be shorter than {max} \
             bytes."
        )));
    }
    let delay = number(
        entry,
        "DelaySeconds",
        queue.delay_seconds.into(),
        DELAY_SECONDS_MAX,
    )?;
    let mut message = Message::new(name.topic(), body.as_bytes().to_vec())
        .ttl(Duration::from_secs(queue.retention_seconds.into()))
        .metadata(
            SENDER_KEY,
            sender_stamp(&caller.key_id, &caller.secret, body),
        );
    // A FIFO queue's messages wait its own delay only (a message's own would reorder its
    // group); a message's 0 is the queue's.
    let delay = match &queue.fifo {
        Some(_) if entry.get("DelaySeconds").is_some_and(|d| !d.is_null()) && delay > 0 => {
            return Err(SqsError::invalid(format!(
                "Value {delay} for parameter DelaySeconds is invalid. Reason: The request \
                 include parameter that is not valid for this queue type."
            )));
        }
        Some(_) => u64::from(queue.delay_seconds),
        None => delay,
    };
    if delay > 0 {
        message = message.deliver_after(Duration::from_secs(delay));
    }
    for (attribute_name, attribute) in &attributes {
        if attribute_name == PRIORITY_ATTRIBUTE {
            let priority = match &attribute.value {
                AttributeValue::Text(t) if attribute.data_type.starts_with("Number") => {
                    t.parse::<u32>().ok()
                }
                _ => None,
            }
            .ok_or_else(|| {
                SqsError::invalid(format!(
                    "The message attribute {PRIORITY_ATTRIBUTE} must be a Number from 0 to \
                     {}.",
                    u32::MAX
                ))
            })?;
            message = message.priority(priority);
        }
        let stored = match &attribute.value {
            AttributeValue::Text(t) => format!("{}\n{t}", attribute.data_type),
            AttributeValue::Binary(b) => format!("{}\n{}", attribute.data_type, BASE64.encode(b)),
        };
        message = message.metadata(format!("{ATTRIBUTE_PREFIX}{attribute_name}"), stored);
    }
    let dedup_id = token(entry, "MessageDeduplicationId")?;
    let group = token(entry, "MessageGroupId")?;
    match &queue.fifo {
        None => {
            if let Some(id) = dedup_id {
                message = message.dedup_key(id);
            }
            if let Some(group) = group {
                message = message.fairness_key(group);
            }
        }
        Some(fifo) => {
            let dedup_id = match dedup_id {
                Some(id) => id.to_string(),
                None if fifo.content_based => {
                    let hash = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
                    hash.as_ref().iter().map(|b| format!("{b:02x}")).collect()
                }
                None if group.is_none() => return Err(SqsError::missing("MessageGroupId")),
                None => return Err(SqsError::invalid(NO_DEDUP_ID)),
            };
            let group = group.ok_or_else(|| SqsError::missing("MessageGroupId"))?;
            message = message.group(group).metadata(DEDUP_KEY, dedup_id.clone());
            // The scope of a deduplication id: the queue (the whole queue on one leaf, where
            // its ids meet) or its group (the groups spread over the leaves; a space is in
            // neither a group nor an id, so the pairs cannot meet).
            message = if fifo.dedup_per_group {
                message.dedup_key(format!("{group} {dedup_id}"))
            } else {
                message.route("").dedup_key(dedup_id)
            };
        }
    }
    let trace = trace_header(caller, entry)?;
    let md5_system = trace.as_ref().and_then(|trace| {
        let attribute = Attribute {
            data_type: "String".into(),
            value: AttributeValue::Text(trace.clone()),
        };
        md5_of_attributes([(TRACE_ATTRIBUTE, &attribute)])
    });
    if let Some(trace) = trace {
        message = message.metadata(TRACE_KEY, trace);
    }
    Ok(Prepared {
        message,
        md5_body: md5_of_body(body),
        md5_attributes: md5_of_attributes(attributes.iter().map(|(n, a)| (n.as_str(), a))),
        md5_system,
        fifo: queue.fifo.is_some(),
    })
}

/// An optional id parameter as SQS allows it: 1–128 of ASCII letters, digits and
/// punctuation.
fn token<'a>(entry: &'a Value, name: &str) -> Result<Option<&'a str>, SqsError> {
    let Some(value) = entry.get(name).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match value.as_str() {
        Some(id) if (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(id))
        }
        // SQS's words, the value first.
        text => Err(SqsError::invalid(format!(
            "Value {} for parameter {name} is invalid. Reason: {name} can only include \
             alphanumeric and punctuation characters. 1 to 128 in length.",
            text.unwrap_or_default()
        ))),
    }
}

fn sent(prepared: &Prepared, id: crest_sdk::MessageId) -> Value {
    let mut out = json!({
        "MessageId": id.to_uuid(),
        "MD5OfMessageBody": prepared.md5_body,
    });
    if prepared.fifo {
        out["SequenceNumber"] = sequence_number(id).into();
    }
    if let Some(md5) = &prepared.md5_attributes {
        out["MD5OfMessageAttributes"] = md5.clone().into();
    }
    if let Some(md5) = &prepared.md5_system {
        out["MD5OfMessageSystemAttributes"] = md5.clone().into();
    }
    out
}

/// A message's `AWSTraceHeader`: its `MessageSystemAttributes` one (the only system attribute
/// a sender sets, a `String`), else the request's `X-Amzn-Trace-Id`.
fn trace_header(caller: &Caller, entry: &Value) -> Result<Option<String>, SqsError> {
    let Some(system) = entry
        .get("MessageSystemAttributes")
        .filter(|v| !v.is_null())
    else {
        return Ok(caller.trace.clone());
    };
    let system = system
        .as_object()
        .ok_or_else(|| SqsError::invalid("MessageSystemAttributes must be a map"))?;
    if let Some(name) = system.keys().find(|name| *name != TRACE_ATTRIBUTE) {
        return Err(SqsError::invalid(format!(
            "Message system attribute name '{name}' is invalid."
        )));
    }
    let Some(trace) = system.get(TRACE_ATTRIBUTE) else {
        return Ok(caller.trace.clone());
    };
    match (trace["DataType"].as_str(), trace["StringValue"].as_str()) {
        (Some("String"), Some(value)) if !value.is_empty() && value.chars().all(xml_char) => {
            Ok(Some(value.to_string()))
        }
        _ => Err(SqsError::invalid(format!(
            "Message system attribute '{TRACE_ATTRIBUTE}' must contain a non-empty value of \
             type 'String'."
        ))),
    }
}

async fn send_message(state: &State, caller: &Caller, input: &Value) -> Result<Value, SqsError> {
    let (name, queue) = queue_of(state, caller, input).await?;
    let prepared = prepare(caller, &name, &queue, input)?;
    let clients = state.clients(caller)?;
    let producer = clients.producer().await?;
    let handle = producer
        .send(prepared.message.clone())
        .await
        .map_err(tree_error)?;
    let id = handle.acked().await.map_err(tree_error)?;
    Ok(sent(&prepared, id))
}

/// A batch's entries, checked as SQS checks them (count, ids).
pub(crate) fn entries(input: &Value) -> Result<&Vec<Value>, SqsError> {
    let entries = match input.get("Entries") {
        Some(Value::Array(entries)) => entries,
        // The query protocol sends an empty list as an empty value.
        None | Some(Value::Null) => return Err(SqsError::empty_batch()),
        Some(Value::String(text)) if text.is_empty() => return Err(SqsError::empty_batch()),
        Some(_) => return Err(SqsError::invalid("Entries must be a list")),
    };
    if entries.is_empty() {
        return Err(SqsError::empty_batch());
    }
    if entries.len() > BATCH_ENTRIES_MAX {
        return Err(SqsError::too_many_entries(entries.len()));
    }
    let mut seen = BTreeSet::new();
    for entry in entries {
        let id = entry.get("Id").and_then(Value::as_str).unwrap_or_default();
        let valid = !id.is_empty()
            && id.len() <= 80
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(SqsError::bad_entry_id());
        }
        if !seen.insert(id) {
            return Err(SqsError::ids_not_distinct(id));
        }
    }
    Ok(entries)
}

fn failed(id: &str, error: &SqsError) -> Value {
    json!({
        "Id": id,
        "SenderFault": error.sender,
        "Code": error.code,
        "Message": error.message,
    })
}

async fn send_message_batch(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (name, queue) = queue_of(state, caller, input).await?;
    let entries = entries(input)?;
    check_fifo_batch(&queue, entries)?;
    let bytes: usize = entries.iter().map(message_bytes).sum();
    if bytes > BATCH_BYTES_MAX {
        return Err(SqsError::batch_too_long(BATCH_BYTES_MAX, bytes));
    }
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for entry in entries {
        let id = entry["Id"].as_str().unwrap_or_default();
        match prepare(caller, &name, &queue, entry) {
            Ok(prepared) => ok.push((id, prepared)),
            Err(error) => bad.push(failed(id, &error)),
        }
    }
    let mut successful = Vec::new();
    if !ok.is_empty() {
        let clients = state.clients(caller)?;
        let producer = clients.producer().await?;
        let messages = ok.iter().map(|(_, p)| p.message.clone());
        let handle = producer.send_batch(messages).await.map_err(tree_error)?;
        let ids = handle.acked().await.map_err(tree_error)?;
        for ((entry_id, prepared), id) in ok.iter().zip(ids) {
            let mut out = sent(prepared, id);
            out["Id"] = (*entry_id).into();
            successful.push(out);
        }
    }
    Ok(batch_result(successful, bad))
}

/// Whether `name` is asked for by a receive's `MessageAttributeNames`.
fn asked(patterns: &[String], name: &str) -> bool {
    // As SQS reads them: `All`, `*` and `.*` for every name; `P.*` for the names that start
    // with `P`.
    patterns.iter().any(|p| {
        matches!(p.as_str(), "All" | "*" | ".*")
            || p == name
            || p.strip_suffix(".*")
                .is_some_and(|prefix| name.starts_with(prefix))
    })
}

async fn receive_message(state: &State, caller: &Caller, input: &Value) -> Result<Value, SqsError> {
    let (name, queue) = queue_of(state, caller, input).await?;
    let max = number_within(input, "MaxNumberOfMessages", 1, 1, RECEIVE_MAX)?;
    let wait = number(
        input,
        "WaitTimeSeconds",
        queue.receive_wait_seconds.into(),
        WAIT_SECONDS_MAX,
    )?;
    let visibility = number(
        input,
        "VisibilityTimeout",
        queue.visibility_timeout.into(),
        VISIBILITY_SECONDS_MAX,
    )?;
    let mut system = names(input, "AttributeNames")?;
    system.extend(names(input, "MessageSystemAttributeNames")?);
    let wanted_attributes = names(input, "MessageAttributeNames")?;
    let clients = state.clients(caller)?;
    let consumer = clients.consumer().await?;
    // A short poll waits a moment for messages still on their way up to the root.
    let wait = match wait {
        0 => state.config.short_poll,
        seconds => Duration::from_secs(seconds),
    };
    let options = PopOptions {
        max: max as u32,
        wait,
        // A visibility timeout of 0 leaves the message visible again at once: the shortest
        // lease crest grants.
        visibility: Some(Duration::from_millis((visibility * 1000).max(1))),
        max_priority: None,
    };
    let mut deliveries = consumer
        .pop_with(&name.topic(), options)
        .await
        .map_err(tree_error)?;
    if queue.fifo.is_some() {
        in_groups(&mut deliveries);
    }
    let asked_for = Asked {
        system,
        attributes: wanted_attributes,
    };
    let messages: Vec<Value> = deliveries
        .iter()
        .map(|delivery| received(state, delivery, &asked_for))
        .collect();
    // SQS leaves the list out when nothing came.
    if messages.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Messages": messages }))
}

/// Orders a FIFO receive as SQS answers it: each group's messages together, in their order,
/// the groups in the order their first message came (the tree's order).
fn in_groups(deliveries: &mut [Delivery]) {
    let mut first_seen: Vec<&str> = Vec::new();
    for delivery in deliveries.iter() {
        let group = delivery.fairness_key.as_deref().unwrap_or_default();
        if !first_seen.contains(&group) {
            first_seen.push(group);
        }
    }
    let rank: std::collections::HashMap<String, usize> = first_seen
        .iter()
        .enumerate()
        .map(|(at, group)| (group.to_string(), at))
        .collect();
    deliveries.sort_by_key(|d| rank[d.fairness_key.as_deref().unwrap_or_default()]);
}

/// A FIFO message's `SequenceNumber`: its crest id as a number (ids grow within a leaf, and a
/// group's messages are one leaf's), 20 digits as SQS writes them.
fn sequence_number(id: crest_sdk::MessageId) -> String {
    format!("{:020}", id.0)
}

/// The attributes a `ReceiveMessage` asked for: system attributes (`AttributeNames` and
/// `MessageSystemAttributeNames`, `All` for every one) and message attributes.
struct Asked {
    system: Vec<String>,
    attributes: Vec<String>,
}

impl Asked {
    fn system(&self, name: &str) -> bool {
        self.system.iter().any(|s| s == "All" || s == name)
    }
}

/// One received message as SQS answers it, with the attributes `asked` names.
fn received(state: &State, delivery: &Delivery, asked: &Asked) -> Value {
    let body = String::from_utf8_lossy(&delivery.payload).into_owned();
    let (mut attributes, sender) = message_attributes(state, delivery, &body);
    attributes.retain(|(n, _)| self::asked(&asked.attributes, n));
    let mut out = json!({
        "MessageId": delivery.id.to_uuid(),
        "ReceiptHandle": delivery.receipt().to_string(),
        "MD5OfBody": md5_of_body(&body),
        "Body": body,
    });
    let mut system = Map::new();
    if asked.system("ApproximateReceiveCount") {
        system.insert(
            "ApproximateReceiveCount".into(),
            delivery.attempt.to_string().into(),
        );
    }
    if asked.system("SentTimestamp") {
        system.insert(
            "SentTimestamp".into(),
            delivery.enqueued_at.as_millis().to_string().into(),
        );
    }
    if asked.system("SenderId")
        && let Some(sender) = sender
    {
        system.insert("SenderId".into(), sender.into());
    }
    if asked.system("MessageGroupId")
        && let Some(group) = &delivery.fairness_key
    {
        system.insert("MessageGroupId".into(), group.clone().into());
    }
    if asked.system(TRACE_ATTRIBUTE)
        && let Some((_, trace)) = delivery.metadata.iter().find(|(k, _)| k == TRACE_KEY)
    {
        system.insert(TRACE_ATTRIBUTE.into(), trace.clone().into());
    }
    // A FIFO message's: its deduplication id is kept with it.
    if let Some((_, dedup)) = delivery.metadata.iter().find(|(k, _)| k == DEDUP_KEY) {
        if asked.system("MessageDeduplicationId") {
            system.insert("MessageDeduplicationId".into(), dedup.clone().into());
        }
        if asked.system("SequenceNumber") {
            system.insert("SequenceNumber".into(), sequence_number(delivery.id).into());
        }
    }
    if !system.is_empty() {
        out["Attributes"] = system.into();
    }
    if let Some(md5) = md5_of_attributes(attributes.iter().map(|(n, a)| (n.as_str(), a))) {
        out["MD5OfMessageAttributes"] = md5.into();
        let mut map = Map::new();
        for (attribute_name, attribute) in &attributes {
            let value = match &attribute.value {
                AttributeValue::Text(t) => {
                    json!({ "DataType": attribute.data_type, "StringValue": t })
                }
                AttributeValue::Binary(b) => {
                    json!({ "DataType": attribute.data_type, "BinaryValue": BASE64.encode(b) })
                }
            };
            map.insert(attribute_name.clone(), value);
        }
        out["MessageAttributes"] = map.into();
    }
    out
}

/// A delivery's message attributes, from its metadata (a native producer's priority shows as
/// the `Priority` attribute), and its sender if the gateway stamped one.
fn message_attributes(
    state: &State,
    delivery: &Delivery,
    body: &str,
) -> (Vec<(String, Attribute)>, Option<String>) {
    let mut attributes: Vec<(String, Attribute)> = Vec::new();
    let mut sender = None;
    let mut through_sqs = false;
    for (key, value) in &delivery.metadata {
        if key == SENDER_KEY {
            sender = stamped_sender(state, value, body);
            through_sqs = true;
        }
        let Some(attribute_name) = key.strip_prefix(ATTRIBUTE_PREFIX) else {
            continue;
        };
        let Some((data_type, stored)) = value.split_once('\n') else {
            continue;
        };
        let value = if data_type.starts_with("Binary") {
            AttributeValue::Binary(BASE64.decode(stored).unwrap_or_default())
        } else {
            AttributeValue::Text(stored.to_string())
        };
        let data_type = data_type.to_string();
        attributes.push((attribute_name.to_string(), Attribute { data_type, value }));
    }
    // A message sent through SQS without a priority comes back without one, as SQS answers.
    if !through_sqs && !attributes.iter().any(|(n, _)| n == PRIORITY_ATTRIBUTE) {
        attributes.push((
            PRIORITY_ATTRIBUTE.to_string(),
            Attribute {
                data_type: "Number".into(),
                value: AttributeValue::Text(delivery.priority.to_string()),
            },
        ));
    }
    (attributes, sender)
}

#[derive(Clone, Copy)]
pub(crate) enum Op {
    Delete,
    Visibility,
}

/// What a settle does for an entry: the crest operation, from the entry's fields.
pub(crate) fn settle_op(op: Op, entry: &Value) -> Result<Settle, SqsError> {
    Ok(match op {
        Op::Delete => Settle::Ack,
        Op::Visibility => {
            let seconds = match entry.get("VisibilityTimeout") {
                None | Some(Value::Null) => return Err(SqsError::missing("VisibilityTimeout")),
                Some(_) => number(entry, "VisibilityTimeout", 0, VISIBILITY_SECONDS_MAX)?,
            };
            if seconds == 0 {
                // Visible again at once: given back, its receive count kept.
                Settle::Nack {
                    delay_ms: 0,
                    reason: None,
                }
            } else {
                Settle::Extend {
                    lease_ms: seconds * 1000,
                }
            }
        }
    })
}

pub(crate) fn receipt(entry: &Value) -> Result<Receipt, SqsError> {
    let handle = text(entry, "ReceiptHandle")?;
    handle.parse().map_err(|_| {
        SqsError::bad_receipt(format!(
            "The input receipt handle \"{handle}\" is not a valid receipt handle."
        ))
    })
}

/// Applies `settle` to `receipts` as `caller`'s principal: one result per receipt (`fifo`: of
/// a FIFO queue's messages).
async fn settle_receipts(
    state: &State,
    caller: &Caller,
    settle: Settle,
    receipts: &[Receipt],
    fifo: bool,
) -> Result<Vec<Result<(), SqsError>>, SqsError> {
    let clients = state.clients(caller)?;
    let consumer = clients.consumer().await?;
    let delete = settle == Settle::Ack;
    let results = consumer
        .settle(settle, receipts)
        .await
        .map_err(tree_error)?;
    Ok(results
        .into_iter()
        .zip(receipts)
        .map(|(result, receipt)| match result {
            // A FIFO queue's receipt expires with its visibility timeout, as on SQS (the
            // group may be someone else's by now).
            Err(ReceiptError::Stale) if delete && fifo => Err(SqsError::invalid(format!(
                "Value {receipt} for parameter ReceiptHandle is invalid. Reason: The receipt \
                 handle has expired."
            ))),
            // As SQS: a delete with an old or already used receipt succeeds and does nothing
            // (a message is deleted with its latest receipt only).
            Err(ReceiptError::Stale | ReceiptError::Settled) if delete => Ok(()),
            // SQS's words for a visibility change of a message that is gone.
            Err(ReceiptError::Settled) => Err(SqsError::invalid(format!(
                "Value {receipt} for parameter ReceiptHandle is invalid. Reason: Message does \
                 not exist or is not available for visibility timeout change."
            ))),
            other => other.map_err(receipt_error),
        })
        .collect())
}

/// A delete or visibility change: of one receipt (`batch` false) or of a batch's entries.
async fn settle(
    state: &State,
    caller: &Caller,
    input: &Value,
    op: Op,
    batch: bool,
) -> Result<Value, SqsError> {
    let (_, queue) = queue_of(state, caller, input).await?;
    let fifo = queue.fifo.is_some();
    if !batch {
        let receipt = receipt(input)?;
        let settle = settle_op(op, input)?;
        return match settle_receipts(state, caller, settle, &[receipt], fifo)
            .await?
            .pop()
        {
            Some(Ok(())) => Ok(json!({})),
            Some(Err(error)) => Err(error),
            None => Err(SqsError::unavailable("no answer for the receipt")),
        };
    }
    let entries = entries(input)?;
    let mut bad = Vec::new();
    // Entries by operation (a visibility batch may mix extends and give-backs).
    let mut groups: Vec<(Settle, Vec<(&str, Receipt)>)> = Vec::new();
    for entry in entries {
        let id = entry["Id"].as_str().unwrap_or_default();
        match receipt(entry).and_then(|r| Ok((r, settle_op(op, entry)?))) {
            Ok((receipt, settle)) => match groups.iter_mut().find(|(s, _)| *s == settle) {
                Some((_, items)) => items.push((id, receipt)),
                None => groups.push((settle, vec![(id, receipt)])),
            },
            Err(error) => bad.push(failed(id, &error)),
        }
    }
    let mut successful = Vec::new();
    for (settle, items) in groups {
        let receipts: Vec<Receipt> = items.iter().map(|(_, r)| *r).collect();
        let results = settle_receipts(state, caller, settle, &receipts, fifo).await?;
        for ((id, _), result) in items.iter().zip(results) {
            match result {
                Ok(()) => successful.push(json!({ "Id": id })),
                Err(error) => bad.push(failed(id, &error)),
            }
        }
    }
    Ok(batch_result(successful, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_name_patterns_select_as_sqs_does() {
        for every in ["All", "*", ".*"] {
            assert!(asked(&[every.to_string()], "x.y"), "{every}");
        }
        // AWS's recorded answer (LocalStack's snapshot): `Hel.*` selects `Hello` and
        // `Help.Me`, not `General`.
        let some = vec!["Priority".to_string(), "Hel.*".to_string()];
        assert!(asked(&some, "Priority"));
        assert!(asked(&some, "Hello"));
        assert!(asked(&some, "Help.Me"));
        assert!(!asked(&some, "General"));
        assert!(!asked(&some, "He"));
        assert!(!asked(&[], "Priority"));
    }

    #[test]
    fn bodies_with_characters_outside_xml_s_are_refused() {
        assert!(check_body("hello\tworld\n").is_ok());
        assert_eq!(
            check_body("a\u{1}b").unwrap_err().code,
            "InvalidMessageContents"
        );
        assert_eq!(check_body("").unwrap_err().code, "MissingParameter");
    }

    #[test]
    fn a_message_s_size_is_its_body_and_its_attributes() {
        let entry = json!({
            "MessageBody": "abcd",
            "MessageAttributes": {
                "k": { "DataType": "String", "StringValue": "vv" },
                "b": { "DataType": "Binary", "BinaryValue": "AAEC" },
            },
        });
        // 4 + (1 + 6 + 2) + (1 + 6 + 3 bytes decoded)
        assert_eq!(message_bytes(&entry), 23);
        assert_eq!(message_bytes(&json!({ "MessageBody": "é" })), 2);
    }

    #[test]
    fn a_batch_is_refused_whole_for_its_shape_only() {
        let entry = |id: &str| json!({ "Id": id });
        let ten: Vec<Value> = (0..10).map(|i| entry(&format!("e{i}"))).collect();
        assert!(entries(&json!({ "Entries": ten })).is_ok());
        let eleven: Vec<Value> = (0..11).map(|i| entry(&format!("e{i}"))).collect();
        assert_eq!(
            entries(&json!({ "Entries": eleven })).unwrap_err().code,
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
        );
        assert_eq!(
            entries(&json!({ "Entries": [] })).unwrap_err().code,
            "AWS.SimpleQueueService.EmptyBatchRequest"
        );
        assert_eq!(
            entries(&json!({ "Entries": [entry("a"), entry("a")] }))
                .unwrap_err()
                .code,
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
        );
        assert_eq!(
            entries(&json!({ "Entries": [entry("a b")] }))
                .unwrap_err()
                .code,
            "AWS.SimpleQueueService.InvalidBatchEntryId"
        );
    }
}
