//! How long a replicated leaf's messages stay out of consumers' reach when its leader is
//! killed with SIGKILL: `cargo bench --bench replica_failover [-- KILLS]`
//! (default 20).
//!
//! A root, an aggregator and a leaf of three replicas below it run as five `crest launch`
//! processes (`tests/common/replicated.toml`: default settings, checkpoints every 500 ms; the
//! root links to the leader directly). Each round
//! pushes 20 messages, kills the group's leader, and pops until a message comes: the time from
//! the SIGKILL to that pop is the failover time. The rest is drained and acknowledged, the
//! killed replica launched again on its data directory, and the next round waits until it
//! caught up. Reports p50, p90 and max, and a histogram in 250 ms buckets.

#[path = "../tests/common/cluster.rs"]
mod cluster;

use crest::sdk::{Consumer, Message};
use std::time::{Duration, Instant};

const REPLICAS: [&str; 3] = ["leaf-1a", "leaf-1b", "leaf-1c"];
const MESSAGES_PER_ROUND: usize = 20;
const BUCKET_MS: u128 = 250;

fn main() {
    let kills: usize = cluster::count_argument(20);
    let runtime = cluster::bench_runtime();
    runtime.block_on(async {
        let mut cluster = cluster::Cluster::from_template(
            "replica-failover",
            include_str!("../tests/common/replicated.toml"),
        );
        for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
            cluster.launch(node);
        }
        let producer = cluster.producer().await;
        let consumer = cluster.consumer().await;
        let mut times = Vec::new();
        for round in 0..kills {
            // A push refused while the producer has not found the new leader yet (every
            // replica it tried was down or refused) is sent again.
            let mut acked = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            while acked < MESSAGES_PER_ROUND {
                assert!(Instant::now() < deadline, "pushes refused for 60 s");
                let mut handles = Vec::new();
                for i in acked..MESSAGES_PER_ROUND {
                    let message = Message::new("jobs", format!("round {round} {i}"));
                    handles.push(producer.send(message).await.unwrap());
                }
                for handle in handles {
                    acked += usize::from(handle.acked().await.is_ok());
                }
            }
            let leader = cluster.leader_among(&REPLICAS).await;
            cluster.kill(&leader);
            let killed = Instant::now();
            pop_one(&consumer).await;
            times.push(killed.elapsed());
            let mut popped = 1;
            let deadline = Instant::now() + Duration::from_secs(60);
            while popped < MESSAGES_PER_ROUND {
                assert!(
                    Instant::now() < deadline,
                    "{popped} of round {round}'s {MESSAGES_PER_ROUND} messages popped in 60 s"
                );
                popped += drain(&consumer).await;
            }
            cluster.launch(&leader);
            let successor = cluster.leader_among(&REPLICAS).await;
            cluster.caught_up(&leader, &successor).await;
            eprintln!(
                "kill {round}: {leader} -> {successor}, first pop after {:?}",
                times[round]
            );
        }
        report(&mut times);
    });
}

/// Pops one message (acknowledging it), retrying empty pops and failed ones for 60 s.
async fn pop_one(consumer: &Consumer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no pop within 60 s of the kill");
        if let Ok(batch) = consumer.pop("jobs", 1, Duration::from_millis(100)).await
            && let Some(delivery) = batch.first()
        {
            let _ = consumer.ack(&delivery.receipt()).await;
            return;
        }
    }
}

/// Pops and acknowledges what is there; answers how many were popped.
async fn drain(consumer: &Consumer) -> usize {
    let Ok(batch) = consumer.pop("jobs", 256, Duration::from_millis(500)).await else {
        return 0;
    };
    let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
    let _ = consumer.ack_many(&receipts).await;
    batch.len()
}

fn report(times: &mut [Duration]) {
    times.sort();
    let n = times.len();
    let ms = |d: Duration| d.as_millis();
    println!(
        "leader killed {n} times: SIGKILL to the first pop p50 {} ms, p90 {} ms, max {} ms",
        ms(times[n / 2]),
        ms(times[(n * 9 / 10).min(n - 1)]),
        ms(times[n - 1])
    );
    let mut buckets = std::collections::BTreeMap::new();
    for time in times.iter() {
        *buckets.entry(ms(*time) / BUCKET_MS).or_insert(0usize) += 1;
    }
    for (bucket, count) in buckets {
        println!(
            "  {:>5}-{:<5} ms {:>3} {}",
            bucket * BUCKET_MS,
            (bucket + 1) * BUCKET_MS,
            count,
            "#".repeat(count)
        );
    }
}
