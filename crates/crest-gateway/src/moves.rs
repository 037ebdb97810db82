//! Message move tasks (`StartMessageMoveTask`, `ListMessageMoveTasks`,
//! `CancelMessageMoveTask`): each moves a dead-letter queue's messages on a task of its own
//! in the gateway that started it, and is remembered there (`gateway_move_tasks_max`).
//!
//! Without `MaxNumberOfMessagesPerSecond` a task moves in the tree's steps (`MoveTopic`: each
//! leaf moves at most `purge_batch_messages` ready and delayed messages per step, ids, bodies
//! and attributes kept, receive counts reset), looking for a cancellation between steps.
//! With it, one message at a time at that rate: received from the source under a lease, sent
//! to the destination, then deleted from the source, so a message is never in neither queue;
//! a gateway that stops between the send and the delete leaves it in both (its lease runs out
//! and it is moved again by the next task). A destination deleted while a task runs fails the
//! task, as SQS's do; what was not moved stays in the source.

use crate::error::{SqsError, tree_error};
use crate::params::{number_within, text};
use crate::queues::QueueName;
use crate::{Caller, Clients, State};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use crest_sdk::{Message, PopOptions, Settle};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// SQS's highest `MaxNumberOfMessagesPerSecond`.
const RATE_MAX: u64 = 500;
/// How long a message being moved at a rate is leased from the source.
const MOVE_LEASE: Duration = Duration::from_secs(30);

/// A task as `ListMessageMoveTasks` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Status {
    Running,
    Completed,
    Cancelled,
    /// With SQS's code for why.
    Failed(String),
}

impl Status {
    fn name(&self) -> &'static str {
        match self {
            Status::Running => "RUNNING",
            Status::Completed => "COMPLETED",
            Status::Cancelled => "CANCELLED",
            Status::Failed(_) => "FAILED",
        }
    }
}

/// What a task's job and the requests about it share.
#[derive(Debug)]
struct Progress {
    moved: AtomicU64,
    cancel: AtomicBool,
    status: Mutex<Status>,
}

impl Progress {
    fn status(&self) -> Status {
        self.status
            .lock()
            .map_or(Status::Failed("the task's state is unusable".into()), |s| {
                s.clone()
            })
    }

    fn end(&self, status: Status) {
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
    }
}

/// One move task.
#[derive(Clone, Debug)]
pub(crate) struct MoveTask {
    id: String,
    source: QueueName,
    destination: QueueName,
    /// Whether the request named the destination (SQS lists it only then).
    named_destination: bool,
    rate: Option<u64>,
    to_move: u64,
    started_ms: u64,
    progress: Arc<Progress>,
}

/// `TaskHandle` as SQS makes it: base64 of `{"taskId":…,"sourceArn":…}`.
fn handle(id: &str, source_arn: &str) -> String {
    BASE64.encode(format!(
        "{{\"taskId\":\"{id}\",\"sourceArn\":\"{source_arn}\"}}"
    ))
}

/// The task id and source ARN a `TaskHandle` holds.
fn parse_handle(handle: &str) -> Option<(String, String)> {
    let json: Value = serde_json::from_slice(&BASE64.decode(handle).ok()?).ok()?;
    Some((
        json.get("taskId")?.as_str()?.to_string(),
        json.get("sourceArn")?.as_str()?.to_string(),
    ))
}

/// The queue `arn` (given as `field`) names; SQS's `ResourceNotFoundException` when there is
/// none.
async fn existing(
    state: &State,
    clients: &Clients,
    arn: &str,
    field: &str,
) -> Result<QueueName, SqsError> {
    let missing = || {
        SqsError::not_found(format!(
            "The resource that you specified for the {field} parameter doesn't exist."
        ))
    };
    let name = QueueName::from_arn(arn, &state.config.region).ok_or_else(missing)?;
    clients
        .queue(&state.config, &name)
        .await
        .map_err(|_| missing())?;
    Ok(name)
}

pub(crate) async fn start(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let clients = state.clients(caller)?;
    let source = existing(state, &clients, text(input, "SourceArn")?, "SourceArn").await?;
    let sources = crate::manage::sources_of(&clients, &source).await?;
    if sources.is_empty() {
        return Err(SqsError::invalid(
            "Source queue must be configured as a Dead Letter Queue.",
        ));
    }
    let destination = match input.get("DestinationArn") {
        None | Some(Value::Null) => match &sources[..] {
            [(only, _)] => only.clone(),
            _ => {
                return Err(SqsError::invalid(
                    "The dead-letter queue has several source queues: name DestinationArn \
                     (crest does not record which queue each message came from).",
                ));
            }
        },
        Some(_) => {
            let arn = text(input, "DestinationArn")?;
            existing(state, &clients, arn, "DestinationArn").await?
        }
    };
    if destination.namespace != source.namespace || destination == source {
        return Err(SqsError::invalid(
            "DestinationArn must name another queue of the source queue's namespace.",
        ));
    }
    let rate = match input.get("MaxNumberOfMessagesPerSecond") {
        None | Some(Value::Null) => None,
        Some(_) => Some(number_within(
            input,
            "MaxNumberOfMessagesPerSecond",
            1,
            1,
            RATE_MAX,
        )?),
    };
    let admin = clients.admin().await?;
    let topic = source.topic();
    let stats = admin.stats(Some(&topic)).await.map_err(tree_error)?.value;
    let to_move = stats
        .topics
        .iter()
        .find(|t| t.topic == topic)
        .map_or(0, |t| t.ready_total() + t.delayed);
    let started_ms = millis_now();
    let number = state.request_ids.fetch_add(1, Ordering::Relaxed);
    let id = task_id(started_ms, number);
    let progress = Arc::new(Progress {
        moved: AtomicU64::new(0),
        cancel: AtomicBool::new(false),
        status: Mutex::new(Status::Running),
    });
    let task = MoveTask {
        id: id.clone(),
        source: source.clone(),
        destination: destination.clone(),
        named_destination: !matches!(input.get("DestinationArn"), None | Some(Value::Null)),
        rate,
        to_move,
        started_ms,
        progress: progress.clone(),
    };
    {
        let mut tasks = state.tasks()?;
        let running = tasks
            .iter()
            .any(|t| t.source == source && t.progress.status() == Status::Running);
        if running {
            return Err(SqsError::invalid(
                "There is already a task running. Only one active task is allowed for a source \
                 queue arn at a given time.",
            ));
        }
        if tasks.len() >= state.config.move_tasks_max {
            // The oldest that is not running goes; a running one is never forgotten, so the
            // bound holds the tasks running at once too.
            let at = tasks
                .iter()
                .position(|t| t.progress.status() != Status::Running)
                .ok_or_else(|| {
                    SqsError::throttled(format!(
                        "{} move tasks are running, the most this gateway runs at once \
                         (gateway_move_tasks_max)",
                        tasks.len()
                    ))
                })?;
            tasks.remove(at);
        }
        tasks.push_back(task);
    }
    let config = state.config.clone();
    let arn = source.arn(&state.config.region);
    tokio::spawn(async move {
        let outcome = match rate {
            None => in_steps(&clients, &source, &destination, &progress).await,
            Some(rate) => at_rate(&config, &clients, &source, &destination, rate, &progress).await,
        };
        progress.end(match outcome {
            Ok(()) if progress.cancel.load(Ordering::Relaxed) => Status::Cancelled,
            Ok(()) => Status::Completed,
            Err(error) => Status::Failed(error.code),
        });
    });
    Ok(json!({ "TaskHandle": handle(&id, &arn) }))
}

/// Moves with the tree's steps until none is left or the task is cancelled.
async fn in_steps(
    clients: &Clients,
    source: &QueueName,
    destination: &QueueName,
    progress: &Progress,
) -> Result<(), SqsError> {
    let admin = clients.admin().await?;
    while !progress.cancel.load(Ordering::Relaxed) {
        let moved = admin
            .move_topic_step(&source.topic(), &destination.topic())
            .await
            .map_err(tree_error)?
            .value;
        if moved == 0 {
            break;
        }
        progress.moved.fetch_add(moved, Ordering::Relaxed);
    }
    Ok(())
}

/// Moves one message every `1 / rate` seconds until none is left or the task is cancelled.
async fn at_rate(
    config: &crate::GatewayConfig,
    clients: &Clients,
    source: &QueueName,
    destination: &QueueName,
    rate: u64,
    progress: &Progress,
) -> Result<(), SqsError> {
    let every = Duration::from_secs(1) / u32::try_from(rate).unwrap_or(1);
    let mut next = tokio::time::Instant::now();
    while !progress.cancel.load(Ordering::Relaxed) {
        tokio::time::sleep_until(next).await;
        next += every;
        // A destination deleted meanwhile fails the task before anything more leaves.
        let queue = clients.queue(config, destination).await?;
        let consumer = clients.consumer().await?;
        let options = PopOptions {
            max: 1,
            wait: Duration::ZERO,
            visibility: Some(MOVE_LEASE),
            max_priority: None,
        };
        let deliveries = consumer
            .pop_with(&source.topic(), options)
            .await
            .map_err(tree_error)?;
        let Some(delivery) = deliveries.into_iter().next() else {
            break;
        };
        let mut message = Message::new(destination.topic(), delivery.payload.clone())
            .priority(delivery.priority)
            .ttl(Duration::from_secs(
                queue.attributes.retention_seconds.into(),
            ));
        for (key, value) in &delivery.metadata {
            message = message.metadata(key.clone(), value.clone());
        }
        if let Some(group) = &delivery.fairness_key {
            message = message.fairness_key(group.clone());
        }
        let producer = clients.producer().await?;
        let sent = producer.send(message).await.map_err(tree_error)?;
        sent.acked().await.map_err(tree_error)?;
        consumer
            .settle(Settle::Ack, &[delivery.receipt()])
            .await
            .map_err(tree_error)?;
        progress.moved.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

pub(crate) async fn list(state: &State, caller: &Caller, input: &Value) -> Result<Value, SqsError> {
    let clients = state.clients(caller)?;
    let source = existing(state, &clients, text(input, "SourceArn")?, "SourceArn").await?;
    let max = number_within(input, "MaxResults", 1, 1, 10)? as usize;
    let region = &state.config.region;
    let results: Vec<Value> = state
        .tasks()?
        .iter()
        .rev()
        .filter(|task| task.source == source)
        .take(max)
        .map(|task| {
            let status = task.progress.status();
            let mut out = json!({
                "Status": status.name(),
                "SourceArn": task.source.arn(region),
                "ApproximateNumberOfMessagesMoved": task.progress.moved.load(Ordering::Relaxed),
                "ApproximateNumberOfMessagesToMove": task.to_move,
                "StartedTimestamp": task.started_ms,
            });
            // SQS names the handle of a running task only: it is what a cancel takes.
            if status == Status::Running {
                out["TaskHandle"] = handle(&task.id, &task.source.arn(region)).into();
            }
            if task.named_destination {
                out["DestinationArn"] = task.destination.arn(region).into();
            }
            if let Some(rate) = task.rate {
                out["MaxNumberOfMessagesPerSecond"] = rate.into();
            }
            if let Status::Failed(reason) = status {
                out["FailureReason"] = reason.into();
            }
            out
        })
        .collect();
    Ok(json!({ "Results": results }))
}

pub(crate) async fn cancel(
    state: &State,
    caller: &Caller,
    input: &Value,
) -> Result<Value, SqsError> {
    let given = text(input, "TaskHandle")?;
    let (id, arn) = parse_handle(given)
        .ok_or_else(|| SqsError::invalid("Value for parameter TaskHandle is invalid."))?;
    let clients = state.clients(caller)?;
    let source = existing(state, &clients, &arn, "SourceArn").await?;
    let tasks = state.tasks()?;
    let task = tasks
        .iter()
        .find(|t| t.id == id && t.source == source)
        .ok_or_else(|| SqsError::not_found("Task does not exist."))?;
    if task.progress.status() != Status::Running {
        return Err(SqsError::not_found("Task does not exist."));
    }
    task.progress.cancel.store(true, Ordering::Relaxed);
    Ok(json!({
        "ApproximateNumberOfMessagesMoved": task.progress.moved.load(Ordering::Relaxed)
    }))
}

/// A task id in the form of a UUID, from when it started and the gateway's request counter.
fn task_id(started_ms: u64, number: u64) -> String {
    let high = started_ms & 0xffff_ffff_ffff;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        high >> 16,
        high & 0xffff,
        (number >> 48) & 0xfff,
        (number >> 36) & 0xfff,
        number & 0xffff_ffff_ffff
    )
}

fn millis_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_handles_are_base64_json_both_ways() {
        let arn = "arn:aws:sqs:us-east-1:417263580914:dlq";
        let id = task_id(1_796_010_420_768, 7);
        let made = handle(&id, arn);
        assert_eq!(parse_handle(&made), Some((id.clone(), arn.to_string())));
        // As SQS writes it (LocalStack's `encode_move_task_handle`).
        let theirs = BASE64.encode(format!("{{\"taskId\":\"{id}\",\"sourceArn\":\"{arn}\"}}"));
        assert_eq!(parse_handle(&theirs), Some((id, arn.to_string())));
        assert_eq!(parse_handle("foobared"), None);
        assert_eq!(parse_handle(&BASE64.encode("{}")), None);
    }
}
