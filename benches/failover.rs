//! How long a node killed with SIGKILL and started again at once keeps its messages from
//! consumers: `cargo bench --bench failover [-- ROUNDS]`.
//!
//! The default tree runs as seven `crest launch` processes with their default settings. Each
//! round pushes 20 priority-5 messages to each of leaves 2-4 and one priority-0 message to
//! leaf-1, kills a node (leaf-1, its aggregator agg-1, or the root) and launches it again,
//! then pops one message at a time until the priority-0 one comes. It reports, per node
//! killed, the time from the relaunch to that pop and how many priority-5 messages were popped
//! before it (each a priority inversion the failure caused), split at the instant the relaunched
//! process rejoined the tree (as it logged: connected to its parent; the root: started). Before
//! that instant, the tree cannot tell the killed node from a quiet one; it finds out when the
//! replacement connects, or after `link_idle_timeout_ms` if none does.

#[path = "../tests/common/cluster.rs"]
mod cluster;

use cluster::{Cluster, retry};
use crest::sdk::{Consumer, ConsumerConfig, Message, MessageId, Producer, ProducerConfig};
use std::time::{Duration, Instant, SystemTime};

const FILLER_PER_LEAF: usize = 20;

struct Round {
    /// Relaunch to the urgent message's pop.
    urgent_after: Duration,
    /// Less urgent messages popped before it, before the relaunched process rejoined the tree.
    passed_while_down: usize,
    /// Less urgent messages popped before it once the relaunched process had rejoined.
    passed_after_restart: usize,
    /// Pops that failed (the consumer connected again).
    pop_errors: usize,
}

fn main() {
    let rounds: usize = cluster::count_argument(10);
    let runtime = cluster::bench_runtime();
    runtime.block_on(async {
        let mut cluster = Cluster::start_exactly("failover", "");
        println!("node killed   rounds   relaunch to urgent pop (ms): p50   p90   max   passed over while down (p50 / max)   after the restart (p50 / max)   pop errors");
        for node in ["leaf-1", "agg-1", "root"] {
            let mut results = Vec::new();
            for _ in 0..rounds {
                results.push(round(&mut cluster, node).await);
            }
            report(node, &mut results);
        }
    });
}

async fn producer_for(cluster: &Cluster, leaf: &str) -> Producer {
    let address = cluster.topology.node(leaf).unwrap().address.clone();
    retry(|| Producer::connect(ProducerConfig::new(vec![address.clone()], cluster.tls()))).await
}

async fn consumer(cluster: &Cluster) -> Consumer {
    retry(|| {
        Consumer::connect(ConsumerConfig::from_topology(
            &cluster.topology,
            cluster.tls(),
        ))
    })
    .await
}

async fn round(cluster: &mut Cluster, node: &str) -> Round {
    for leaf in ["leaf-2", "leaf-3", "leaf-4"] {
        let producer = producer_for(cluster, leaf).await;
        let mut handles = Vec::new();
        for i in 0..FILLER_PER_LEAF {
            let message = Message::new("jobs", format!("filler {i}")).priority(5);
            handles.push(producer.send(message).await.unwrap());
        }
        for handle in handles {
            handle.acked().await.unwrap();
        }
    }
    let urgent: MessageId = producer_for(cluster, "leaf-1")
        .await
        .send(Message::new("jobs", "urgent").priority(0))
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    cluster.kill(node);
    cluster.launch(node);
    let relaunched = Instant::now();
    let mut consumer = consumer(cluster).await;
    let (mut passes, mut pop_errors) = (Vec::new(), 0);
    let deadline = relaunched + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the urgent message never came");
        let batch = match consumer.pop("jobs", 1, Duration::from_millis(200)).await {
            Ok(batch) => batch,
            Err(_) => {
                pop_errors += 1;
                consumer = self::consumer(cluster).await;
                continue;
            }
        };
        let Some(delivery) = batch.into_iter().next() else {
            continue;
        };
        let _ = consumer.ack(&delivery.receipt()).await;
        if delivery.id == urgent {
            let urgent_after = relaunched.elapsed();
            // The rest of the filler goes, so every round starts from the same queue.
            while let Ok(batch) = consumer.pop("jobs", 256, Duration::from_millis(100)).await {
                if batch.is_empty() {
                    break;
                }
                let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
                let _ = consumer.ack_many(&receipts).await;
            }
            let rejoined = rejoined_at(cluster, node);
            let passed_while_down = passes.iter().filter(|at| **at < rejoined).count();
            return Round {
                urgent_after,
                passed_while_down,
                passed_after_restart: passes.len() - passed_while_down,
                pop_errors,
            };
        }
        passes.push(SystemTime::now());
    }
}

fn report(node: &str, results: &mut [Round]) {
    let n = results.len();
    results.sort_by_key(|r| r.urgent_after);
    let ms = |r: &Round| r.urgent_after.as_secs_f64() * 1000.0;
    let (p50, p90, max) = (
        ms(&results[n / 2]),
        ms(&results[(n * 9 / 10).min(n - 1)]),
        ms(&results[n - 1]),
    );
    let sorted = |count: fn(&Round) -> usize| {
        let mut counts: Vec<usize> = results.iter().map(count).collect();
        counts.sort_unstable();
        (counts[n / 2], counts[n - 1])
    };
    let down = sorted(|r| r.passed_while_down);
    let after = sorted(|r| r.passed_after_restart);
    let errors: usize = results.iter().map(|r| r.pop_errors).sum();
    println!(
        "{node:<13} {n:>6}   {p50:>40.0} {p90:>5.0} {max:>5.0}   {:>23} / {:<10} {:>18} / {:<10} {errors:>10}",
        down.0, down.1, after.0, after.1,
    );
}

/// When the relaunched `node` logged that it rejoined the tree (its log is written anew at
/// each launch).
fn rejoined_at(cluster: &Cluster, node: &str) -> SystemTime {
    let log = std::fs::read_to_string(cluster.dir.join(format!("{node}.log"))).unwrap();
    let event = if node == "root" {
        "node started"
    } else {
        "connected peer=\"parent\""
    };
    let line = log
        .lines()
        .map(plain)
        .find(|line| line.contains(event))
        .expect("the relaunched node logged that it rejoined");
    // The line starts with an RFC 3339 time.
    let stamp = line.split_whitespace().next().expect("a time stamp");
    humantime::parse_rfc3339_weak(stamp).expect("an RFC 3339 time")
}

/// A log line without its colour codes.
fn plain(line: &str) -> String {
    let mut parts = line.split('\u{1b}');
    let mut plain = parts.next().unwrap_or_default().to_string();
    for part in parts {
        plain.push_str(part.split_once('m').map_or(part, |(_, rest)| rest));
    }
    plain
}
