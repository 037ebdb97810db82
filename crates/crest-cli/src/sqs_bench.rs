//! `crest sqs-bench`: a load generator for the SQS-compatible API, in Rust so that the
//! client is not what bounds the figure (boto3 is, at about 11 k sends/s on 2 cores).
//! Batches of up to 10 over keep-alive HTTP/1.1 connections, signed as the AWS SDKs sign.

use crate::*;
use crest_gateway::client::{CallError, SqsClient};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Phase {
    /// SendMessageBatch only.
    Send,
    /// ReceiveMessage and DeleteMessageBatch only, until the queue stays empty.
    Receive,
    /// Send, then receive.
    Both,
}

#[derive(Args)]
pub(crate) struct SqsBenchArgs {
    /// The gateway.
    #[arg(long, default_value = "http://127.0.0.1:9324")]
    endpoint: String,
    /// Access key id.
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    key: String,
    /// Its secret.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret: String,
    /// The queue (created if missing).
    #[arg(long, default_value = "bench")]
    queue: String,
    /// Messages to send (and to receive).
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Requests in flight at once (each on its own connection).
    #[arg(long, default_value_t = 32)]
    clients: u32,
    /// Messages per call, 1..=10.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10))]
    batch: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// What to run.
    #[arg(long, value_enum, default_value_t = Phase::Both)]
    phase: Phase,
}

/// A phase's outcome: messages and the latency of each call, in microseconds.
struct Measured {
    messages: u64,
    seconds: f64,
    calls: hdrhistogram::Histogram<u64>,
}

impl Measured {
    fn print(&self, name: &str) {
        let ms = |q: f64| self.calls.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "{name:<16} {:>8} messages in {:6.2} s = {:>8.0} msgs/s   call p50 {:.2} ms  p99 {:.2} ms",
            self.messages,
            self.seconds,
            self.messages as f64 / self.seconds,
            ms(0.5),
            ms(0.99)
        );
    }
}

pub(crate) async fn sqs_bench(args: SqsBenchArgs) -> Result<()> {
    let client = SqsClient::new(
        &args.endpoint,
        &args.key,
        &args.secret,
        args.clients as usize,
    )?;
    let created = client
        .call("CreateQueue", &json!({"QueueName": args.queue}))
        .await?;
    let url = created["QueueUrl"]
        .as_str()
        .context("CreateQueue answered no QueueUrl")?
        .to_string();
    println!(
        "crest sqs-bench: {} messages of {} B, batches of {}, {} requests at once, {}",
        args.messages, args.payload_bytes, args.batch, args.clients, url
    );
    if args.phase != Phase::Receive {
        send(&client, &url, &args).await?.print("send");
    }
    if args.phase != Phase::Send {
        let received = receive(&client, &url, &args).await?;
        received.print("receive + delete");
        if args.phase == Phase::Both && received.messages < args.messages {
            bail!(
                "received {} of the {} messages sent",
                received.messages,
                args.messages
            );
        }
    }
    Ok(())
}

/// Runs `clients` tasks of `work` (each answers its calls' latencies) and merges them.
async fn run<F, Fut>(clients: u32, work: F) -> Result<hdrhistogram::Histogram<u64>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<hdrhistogram::Histogram<u64>>> + Send + 'static,
{
    let tasks: Vec<_> = (0..clients).map(|_| tokio::spawn(work())).collect();
    let mut all = hdrhistogram::Histogram::new(3)?;
    for task in tasks {
        all.add(task.await??)?;
    }
    Ok(all)
}

async fn send(client: &SqsClient, url: &str, args: &SqsBenchArgs) -> Result<Measured> {
    let batches = Arc::new(AtomicU64::new(args.messages.div_ceil(args.batch)));
    let body = "x".repeat(args.payload_bytes);
    let started = Instant::now();
    let calls = run(args.clients, || {
        let (client, url, body) = (client.clone(), url.to_string(), body.clone());
        let (batches, batch, total) = (batches.clone(), args.batch, args.messages);
        async move {
            let mut calls = hdrhistogram::Histogram::new(3)?;
            // Each batch number is taken once; the last may be short.
            while let Some(left) = take(&batches) {
                let count = batch.min(total - (left - 1) * batch).max(1);
                let entries: Vec<Value> = (0..count)
                    .map(|i| {
                        json!({
                            "Id": format!("m{i}"),
                            "MessageBody": body,
                            "MessageAttributes": {"Priority": {
                                "DataType": "Number",
                                "StringValue": ((left + i) % 10).to_string(),
                            }},
                        })
                    })
                    .collect();
                let input = json!({"QueueUrl": url, "Entries": entries});
                let at = Instant::now();
                let answer = call(&client, "SendMessageBatch", &input).await?;
                calls.record(at.elapsed().as_micros() as u64)?;
                if let Some(failed) = answer["Failed"].as_array().filter(|f| !f.is_empty()) {
                    bail!("a batch failed in part: {failed:?}");
                }
            }
            Ok(calls)
        }
    })
    .await?;
    Ok(Measured {
        messages: args.messages,
        seconds: started.elapsed().as_secs_f64(),
        calls,
    })
}

/// Takes one unit from `left`, if any is left; answers how many were left before.
fn take(left: &AtomicU64) -> Option<u64> {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .ok()
}

async fn receive(client: &SqsClient, url: &str, args: &SqsBenchArgs) -> Result<Measured> {
    let received = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let calls = run(args.clients, || {
        let (client, url, received) = (client.clone(), url.to_string(), received.clone());
        let (batch, total) = (args.batch, args.messages);
        async move {
            let mut calls = hdrhistogram::Histogram::new(3)?;
            let mut empty = 0;
            // Until every message came, or the queue answered empty three long polls in a
            // row (a message lost would otherwise wait forever).
            while received.load(Ordering::Relaxed) < total && empty < 3 {
                let input = json!({
                    "QueueUrl": url, "MaxNumberOfMessages": batch, "WaitTimeSeconds": 1,
                });
                let at = Instant::now();
                let answer = call(&client, "ReceiveMessage", &input).await?;
                let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
                if messages.is_empty() {
                    empty += 1;
                    continue;
                }
                empty = 0;
                let entries: Vec<Value> = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| json!({"Id": format!("d{i}"), "ReceiptHandle": m["ReceiptHandle"]}))
                    .collect();
                let deleted = call(
                    &client,
                    "DeleteMessageBatch",
                    &json!({"QueueUrl": url, "Entries": entries}),
                )
                .await?;
                calls.record(at.elapsed().as_micros() as u64)?;
                if let Some(failed) = deleted["Failed"].as_array().filter(|f| !f.is_empty()) {
                    bail!("a delete failed in part: {failed:?}");
                }
                received.fetch_add(messages.len() as u64, Ordering::Relaxed);
            }
            Ok(calls)
        }
    })
    .await?;
    Ok(Measured {
        messages: received.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        calls,
    })
}

/// Most tries of a call the gateway throttled or could not serve (SDKs retry those too).
const CALL_TRIES_MAX: u32 = 10;

/// Calls `action`, trying again after a throttle or an unavailable tree, as SDKs do.
async fn call(client: &SqsClient, action: &str, input: &Value) -> Result<Value> {
    let mut tries = 0;
    loop {
        tries += 1;
        match client.call(action, input).await {
            Err(CallError::Sqs { code, .. })
                if tries < CALL_TRIES_MAX
                    && (code == "RequestThrottled" || code == "ServiceUnavailable") =>
            {
                tokio::time::sleep(Duration::from_millis(10 << tries.min(6))).await;
            }
            other => return Ok(other?),
        }
    }
}
