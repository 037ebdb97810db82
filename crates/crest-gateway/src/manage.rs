//! The SQS operations on queues themselves: create, find, list, change, delete and purge
//! them, their dead-letter queues and message move tasks. A queue's attributes are its
//! topic's configuration in the tree (see [`crate::queues`]), read and written with the
//! caller's own permissions: changing a queue needs `admin` in its namespace.

use crate::error::{SqsError, tree_error};
use crate::params::{names, number_within, string_map, text};
use crate::permissions;
use crate::queues::{Fifo, Queue, QueueAttributes, QueueName, SSE_ATTRIBUTE};
use crate::{Caller, Clients, State};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// The attributes a `CreateQueue` or `SetQueueAttributes` asks for, checked; a redrive
/// policy's dead-letter queue must exist.
async fn asked_attributes(
    state: &State,
    clients: &Clients,
    name: &QueueName,
    mut attributes: QueueAttributes,
    input: &Value,
) -> Result<QueueAttributes, SqsError> {
    for (key, value) in string_map(input, "Attributes")? {
        attributes.set(name, &state.config.region, &key, &value)?;
    }
    if let Some(redrive) = &attributes.redrive {
        if redrive.dead_letter == *name {
            return Err(SqsError::invalid(
                "Value for parameter RedrivePolicy is invalid. Reason: a queue cannot be its \
                 own dead-letter queue.",
            ));
        }
        clients
            .queue(&state.config, &redrive.dead_letter)
            .await
            .map_err(|_| {
                SqsError::invalid(format!(
                    "Value for parameter RedrivePolicy is invalid. Reason: Dead letter target \
                     does not exist: {}.",
                    redrive.dead_letter.name
                ))
            })?;
    }
    Ok(attributes)
}

/// The queue a request's `QueueUrl` names, and the caller's clients.
fn addressed(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<(QueueName, Arc<Clients>), SqsError> {
    let name = caller.addressed(text(input, "QueueUrl")?, &state.config.region)?;
    Ok((name, state.clients(caller)?))
}

/// The queue a request's `QueueUrl` names, the caller's clients, and the queue as kept.
async fn addressed_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<(QueueName, Arc<Clients>, Queue), SqsError> {
    let (name, clients) = addressed(state, caller, input)?;
    let queue = clients.queue(&state.config, &name).await?;
    Ok((name, clients, queue))
}

/// Keeps `queue` as `name`'s topic configuration in the tree, and in the key's cache.
async fn keep(
    state: &State,
    clients: &Clients,
    name: &QueueName,
    queue: Queue,
) -> Result<(), SqsError> {
    let admin = clients.admin().await?;
    let answer = admin
        .configure(&name.topic(), queue.to_config())
        .await
        .map_err(tree_error)?;
    // Kept by no leaf: lost if taken as done. Leaves unreachable now get it from the next
    // listing that finds them behind, as long as one leaf keeps it.
    if answer.value == 0 && !answer.unreachable.is_empty() {
        return Err(SqsError::unavailable(
            "no leaf of the tree could keep the queue's attributes now; retry",
        ));
    }
    if answer.value == 0 {
        return Err(SqsError::over_limit(
            "the tree holds its most topic configurations (setting topic_configs_max)",
        ));
    }
    clients.remember(&state.config, name, Some(queue))
}

pub(crate) async fn create_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let asked = text(input, "QueueName")?;
    // A `.fifo` name is a FIFO queue's, and a FIFO queue's name ends so, as SQS answers.
    let fifo = input["Attributes"]["FifoQueue"]
        .as_str()
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if asked.ends_with(".fifo") && !fifo {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in \
             length",
        ));
    }
    if fifo && !asked.ends_with(".fifo") {
        return Err(SqsError::invalid(
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or \
             underscores, must end with .fifo suffix and be 1 to 80 in length.",
        ));
    }
    let base = QueueAttributes {
        fifo: fifo.then(Fifo::default),
        ..QueueAttributes::default()
    };
    let name = QueueName::checked(&caller.namespace, asked)?
        .in_region(caller.region.as_deref(), &state.config.region);
    let clients = state.clients(caller)?;
    match clients.fetch(&state.config, &name).await? {
        // As SQS: an existing queue is answered when every attribute the request gives has
        // the queue's value (those it leaves out are not compared).
        Some(existing) => {
            let given = existing.attributes.clone();
            let asked = asked_attributes(state, &clients, &name, given, input).await?;
            if let Some(attribute) = changed(&existing.attributes, &asked, &state.config.region) {
                return Err(SqsError::queue_exists(attribute));
            }
        }
        None => {
            let attributes = asked_attributes(state, &clients, &name, base, input).await?;
            let mut queue = Queue::new(attributes);
            // `tags` in the JSON protocol; the query protocol's `Tag.N` come as `Tags`.
            let field = if input.get("tags").is_some() {
                "tags"
            } else {
                "Tags"
            };
            add_tags(&mut queue, asked_tags(input, field)?)?;
            keep(state, &clients, &name, queue).await?
        }
    }
    Ok(json!({ "QueueUrl": name.url(&caller.host) }))
}

/// The first attribute whose value `asked` changes from `now`'s, as SQS names it.
fn changed(now: &QueueAttributes, asked: &QueueAttributes, region: &str) -> Option<&'static str> {
    if asked == now {
        return None;
    }
    let (now, asked) = (now.listed(region), asked.listed(region));
    let value = |list: &[(&'static str, String)], name: &str| {
        list.iter()
            .find(|(a, _)| *a == name)
            .map(|(_, v)| v.clone())
    };
    let differs = asked
        .iter()
        .chain(&now)
        .map(|(a, _)| *a)
        .find(|a| value(&asked, a) != value(&now, a));
    Some(differs.unwrap_or("Attributes"))
}

pub(crate) async fn get_queue_url(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let name = QueueName::checked(&caller.namespace, text(input, "QueueName")?)
        .map_err(|_| SqsError::no_queue())?
        .in_region(caller.region.as_deref(), &state.config.region);
    state.clients(caller)?.queue(&state.config, &name).await?;
    Ok(json!({ "QueueUrl": name.url(&caller.host) }))
}

/// The queues of `namespace` in `region` (`None`: the gateway's) whose names start with
/// `prefix`, by name, as the tree keeps them.
async fn queues_of(
    clients: &Clients,
    namespace: &str,
    region: Option<&str>,
    prefix: &str,
) -> Result<Vec<(QueueName, Queue)>, SqsError> {
    let admin = clients.admin().await?;
    let listed = admin
        .configs(&QueueName::topic_prefix(namespace, region, prefix))
        .await
        .map_err(tree_error)?;
    Ok(listed
        .value
        .iter()
        .filter_map(|(topic, config)| {
            let name = QueueName::from_topic(topic)?;
            let queue = Queue::from_config(config)?;
            let ours = name.namespace == namespace && name.region.as_deref() == region;
            ours.then_some((name, queue))
        })
        .collect())
}

pub(crate) async fn list_queues(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let prefix = match input.get("QueueNamePrefix") {
        Some(Value::String(s)) => s.as_str(),
        _ => "",
    };
    let clients = state.clients(caller)?;
    let region = caller.region.as_deref();
    let queues = queues_of(&clients, &caller.namespace, region, prefix).await?;
    let (names, next) = page(input, queues.into_iter().map(|(name, _)| name).collect())?;
    Ok(listing("QueueUrls", &names, next, &caller.host))
}

/// Forgets the queue's attributes and deletes its waiting messages (received ones stay with
/// their receipts).
pub(crate) async fn delete_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (name, clients) = addressed(state, caller, input)?;
    if clients.fetch(&state.config, &name).await?.is_none() {
        return Err(SqsError::no_queue());
    }
    // The queues that name it as their dead-letter queue lose their redrive policy first: a
    // policy naming a deleted queue would send their dead letters to a topic nobody reads.
    // They keep their messages, as a queue without a dead-letter queue does.
    for (source, mut queue) in sources_of(&clients, &name).await? {
        queue.attributes.redrive = None;
        queue.modified = crate::queues::seconds_now();
        keep(state, &clients, &source, queue).await?;
    }
    let admin = clients.admin().await?;
    let topic = name.topic();
    admin.unconfigure(&topic).await.map_err(tree_error)?;
    clients.remember(&state.config, &name, None)?;
    admin.purge_topic(&topic).await.map_err(tree_error)?;
    Ok(json!({}))
}

/// Most tags of one queue, as SQS allows.
const TAGS_MAX: usize = 50;

/// Tags a request gives under `field` (`Tags`; `tags` at `CreateQueue`), checked as SQS checks
/// them: keys 1–128 characters, values at most 256.
fn asked_tags(input: &Value, field: &str) -> Result<Vec<(String, String)>, SqsError> {
    let tags = string_map(input, field)?;
    for (key, value) in &tags {
        if key.is_empty() || key.chars().count() > 128 || value.chars().count() > 256 {
            return Err(SqsError::invalid(format!(
                "Tag {key:?}: a key is 1 to 128 characters, a value at most 256."
            )));
        }
    }
    Ok(tags)
}

/// `tags` added to `queue`'s, within [`TAGS_MAX`].
fn add_tags(queue: &mut Queue, tags: Vec<(String, String)>) -> Result<(), SqsError> {
    queue.tags.extend(tags);
    if queue.tags.len() > TAGS_MAX {
        return Err(SqsError::invalid(format!(
            "Too many tags added for queue: a queue has at most {TAGS_MAX}."
        )));
    }
    Ok(())
}

pub(crate) async fn tag_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let tags = asked_tags(input, "Tags")?;
    change_queue(state, caller, input, |queue| add_tags(queue, tags)).await
}

pub(crate) async fn untag_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let keys = names(input, "TagKeys")?;
    change_queue(state, caller, input, |queue| {
        for key in keys {
            queue.tags.remove(&key);
        }
        Ok(())
    })
    .await
}

pub(crate) async fn add_permission(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let arn = caller
        .addressed(text(input, "QueueUrl")?, &state.config.region)?
        .arn(&state.config.region);
    let label = text(input, "Label")?.to_string();
    let accounts = names(input, "AWSAccountIds")?;
    let actions = names(input, "Actions")?;
    change_queue(state, caller, input, |queue| {
        let policy = queue.attributes.policy.as_deref();
        queue.attributes.policy = permissions::add(policy, &arn, &label, accounts, actions)?;
        Ok(())
    })
    .await
}

pub(crate) async fn remove_permission(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let label = text(input, "Label")?.to_string();
    change_queue(state, caller, input, |queue| {
        let policy = queue.attributes.policy.as_deref();
        queue.attributes.policy = permissions::remove(policy, &label)?;
        Ok(())
    })
    .await
}

/// Changes the queue a request's `QueueUrl` names with `change`, and keeps it in the tree.
async fn change_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
    change: impl FnOnce(&mut Queue) -> Result<(), SqsError>,
) -> Result<Value, SqsError> {
    let (name, clients, mut queue) = addressed_queue(state, caller, input).await?;
    change(&mut queue)?;
    keep(state, &clients, &name, queue).await?;
    Ok(json!({}))
}

pub(crate) async fn list_queue_tags(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (_, _, queue) = addressed_queue(state, caller, input).await?;
    // SQS leaves the member out when the queue has none.
    if queue.tags.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Tags": queue.tags }))
}

pub(crate) async fn set_queue_attributes(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (name, clients) = addressed(state, caller, input)?;
    let mut queue = clients
        .fetch(&state.config, &name)
        .await?
        .ok_or_else(SqsError::no_queue)?;
    queue.attributes = asked_attributes(state, &clients, &name, queue.attributes, input).await?;
    queue.modified = crate::queues::seconds_now();
    keep(state, &clients, &name, queue).await?;
    Ok(json!({}))
}

pub(crate) async fn get_queue_attributes(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (name, clients, queue) = addressed_queue(state, caller, input).await?;
    let wanted = names(input, "AttributeNames")?;
    let all = wanted.iter().any(|n| n == "All");
    let want = |n: &str| all || wanted.iter().any(|w| w == n);
    let mut out = Map::new();
    for (key, value) in queue.attributes.listed(&state.config.region) {
        if want(key) {
            out.insert(key.into(), value.into());
        }
    }
    if want("CreatedTimestamp") {
        out.insert("CreatedTimestamp".into(), queue.created.to_string().into());
    }
    if want("LastModifiedTimestamp") {
        out.insert(
            "LastModifiedTimestamp".into(),
            queue.modified.to_string().into(),
        );
    }
    // Said as it is: crest keeps messages unencrypted in the leaves' logs (docs/sqs.md).
    if want(SSE_ATTRIBUTE) {
        out.insert(SSE_ATTRIBUTE.into(), "false".into());
    }
    let depths = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ];
    if depths.iter().any(|d| want(d)) {
        let admin = clients.admin().await?;
        let topic = name.topic();
        let stats = admin.stats(Some(&topic)).await.map_err(tree_error)?.value;
        let topic_stats = stats.topics.iter().find(|t| t.topic == topic);
        let (ready, leased, delayed) =
            topic_stats.map_or((0, 0, 0), |t| (t.ready_total(), t.in_flight, t.delayed));
        for (key, value) in depths.iter().zip([ready, leased, delayed]) {
            if want(key) {
                out.insert((*key).into(), value.to_string().into());
            }
        }
    }
    for name in &wanted {
        let known = name == "All"
            || out.contains_key(name)
            || matches!(name.as_str(), "QueueArn" | "Policy" | "RedrivePolicy");
        if !known {
            return Err(SqsError::bad_attribute(name));
        }
    }
    if want("QueueArn") {
        out.insert("QueueArn".into(), name.arn(&state.config.region).into());
    }
    // SQS leaves the member out when no attribute asked for is there (a queue without a
    // `Policy` asked for it alone).
    if out.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Attributes": out }))
}

/// Deletes the queue's ready and delayed messages; messages received and not yet deleted stay
/// with their receipts (SQS may or may not delete those).
/// How often a queue may be purged, as SQS allows: once a minute.
const PURGE_INTERVAL_SECONDS: u64 = 60;

pub(crate) async fn purge_queue(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let (name, clients, mut queue) = addressed_queue(state, caller, input).await?;
    // One purge a minute, as SQS allows: its time is kept with the queue in the tree, so every
    // gateway sees it.
    let now = crate::queues::seconds_now();
    if queue
        .purged
        .is_some_and(|at| now < at + PURGE_INTERVAL_SECONDS)
    {
        return Err(SqsError::purge_in_progress(&name.name));
    }
    queue.purged = Some(now);
    keep(state, &clients, &name, queue).await?;
    let admin = clients.admin().await?;
    admin.purge_topic(&name.topic()).await.map_err(tree_error)?;
    Ok(json!({}))
}

/// The queues of the namespace whose redrive policy names `target`.
pub(crate) async fn sources_of(
    clients: &Clients,
    target: &QueueName,
) -> Result<Vec<(QueueName, Queue)>, SqsError> {
    Ok(
        queues_of(clients, &target.namespace, target.region.as_deref(), "")
            .await?
            .into_iter()
            .filter(|(_, queue)| {
                let redrive = queue.attributes.redrive.as_ref();
                redrive.is_some_and(|r| r.dead_letter == *target)
            })
            .collect(),
    )
}

/// A page of `names` (in name order): those after `NextToken` (the last name of the page
/// before), at most `MaxResults` (1–1,000); with the next page's token when `MaxResults` was
/// given and more remain, as SQS pages.
fn page(
    input: &Value,
    names: Vec<QueueName>,
) -> Result<(Vec<QueueName>, Option<String>), SqsError> {
    let max = number_within(input, "MaxResults", 1000, 1, 1000)? as usize;
    let limited = input.get("MaxResults").is_some_and(|v| !v.is_null());
    let after = match input.get("NextToken") {
        None | Some(Value::Null) => None,
        Some(token) => Some(
            token
                .as_str()
                .and_then(|t| BASE64.decode(t).ok())
                .and_then(|name| String::from_utf8(name).ok())
                .ok_or_else(|| SqsError::invalid("Invalid NextToken value."))?,
        ),
    };
    let mut rest: Vec<QueueName> = names
        .into_iter()
        .filter(|name| after.as_ref().is_none_or(|after| name.name > *after))
        .collect();
    let more = rest.len() > max;
    rest.truncate(max);
    let next = rest
        .last()
        .filter(|_| limited && more)
        .map(|last| BASE64.encode(&last.name));
    Ok((rest, next))
}

/// A listing of queue URLs under `member`, left out when empty (as SQS answers), and its
/// `NextToken`.
fn listing(member: &str, names: &[QueueName], next: Option<String>, host: &str) -> Value {
    let mut out = Map::new();
    if !names.is_empty() {
        let urls: Vec<Value> = names.iter().map(|name| name.url(host).into()).collect();
        out.insert(member.into(), urls.into());
    }
    if let Some(token) = next {
        out.insert("NextToken".into(), token.into());
    }
    out.into()
}

pub(crate) async fn dead_letter_sources(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let name = caller.addressed(text(input, "QueueUrl")?, &state.config.region)?;
    let clients = state.clients(caller)?;
    clients.queue(&state.config, &name).await?;
    let sources = sources_of(&clients, &name).await?;
    let (names, next) = page(input, sources.into_iter().map(|(name, _)| name).collect())?;
    // This operation's JSON member is `queueUrls`, as AWS's model names it.
    Ok(listing("queueUrls", &names, next, &caller.host))
}
