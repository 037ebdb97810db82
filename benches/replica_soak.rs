//! Whether a replicated leaf keeps its leader under lasting load on a busy machine:
//! `cargo bench --bench replica_soak [-- SECONDS]` (default 600).
//!
//! A root, an aggregator and a leaf of three replicas below it run as five `crest launch`
//! processes with default settings (`tests/common/replicated.toml` without its checkpoint
//! settings); a thread of this process spins on one core for the whole run, so the tree
//! and the load share the other. A producer pushes 5,000 messages a second (100 every
//! 20 ms) and a consumer pops and acknowledges them. Every 5 s the group's leader and term
//! are read from `crest status`; at the end each replica's log says how often it took the
//! lead. Reports the leadership changes (the run fails if there was any), the pushes
//! acknowledged and refused, and what was delivered.

#[path = "../tests/common/cluster.rs"]
mod cluster;

use crest::sdk::Message;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REPLICAS: [&str; 3] = ["leaf-1a", "leaf-1b", "leaf-1c"];

fn main() {
    let seconds: u64 = cluster::count_argument(600);
    let runtime = cluster::bench_runtime();
    let template = include_str!("../tests/common/replicated.toml")
        .replace("checkpoint_log_bytes = 65536\n", "")
        .replace("checkpoint_interval_ms = 500\n", "");
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    });
    let failed = runtime.block_on(async {
        let mut cluster = cluster::Cluster::from_template("replica-soak", &template);
        for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
            cluster.launch(node);
        }
        let producer = cluster.producer().await;
        let consumer = cluster.consumer().await;
        let leader = cluster.leader_among(&REPLICAS).await;
        let first = cluster::crest_status(&cluster.topology_path).await;
        let term = first["groups"][0]["term"].as_u64().unwrap();
        println!("{leader} leads in term {term}; {seconds} s at 5,000 msgs/s, one core spinning");
        let (acked, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let delivered = Arc::new(Mutex::new(HashSet::new()));
        let copies = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + Duration::from_secs(seconds);
        let pushing = tokio::spawn({
            let (acked, refused) = (acked.clone(), refused.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                let mut round = 0u64;
                while Instant::now() < until {
                    tick.tick().await;
                    let this = round;
                    round += 1;
                    let messages =
                        (0..100).map(move |i| Message::new("jobs", format!("soak {this} {i}")));
                    let batch = producer.send_batch(messages).await.unwrap();
                    let (acked, refused) = (acked.clone(), refused.clone());
                    tokio::spawn(async move {
                        match batch.acked().await {
                            Ok(ids) => acked.fetch_add(ids.len() as u64, Ordering::Relaxed),
                            Err(_) => refused.fetch_add(100, Ordering::Relaxed),
                        };
                    });
                }
            }
        });
        let popping = tokio::spawn({
            let (consumer, delivered, copies) = (consumer.clone(), delivered.clone(), copies.clone());
            async move {
                while Instant::now() < until + Duration::from_secs(5) {
                    let Ok(batch) = consumer.pop("jobs", 256, Duration::from_millis(200)).await
                    else {
                        continue;
                    };
                    let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
                    {
                        let mut delivered = delivered.lock().unwrap();
                        for delivery in &batch {
                            if !delivered.insert(delivery.id) {
                                copies.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    let _ = consumer.ack_many(&receipts).await;
                }
            }
        });
        let mut changes = Vec::new();
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let status = cluster::crest_status(&cluster.topology_path).await;
            let group = &status["groups"][0];
            if group["leader"] != leader.as_str() || group["term"] != term {
                changes.push(format!("{} in term {}", group["leader"], group["term"]));
            }
        }
        pushing.await.unwrap();
        popping.await.unwrap();
        let took_lead: usize = REPLICAS
            .iter()
            .map(|r| cluster.plain_log(r).matches("leads its group").count())
            .sum();
        let delivered = delivered.lock().unwrap().len();
        println!(
            "pushes acknowledged {}, refused {}; delivered {delivered} (copies again {}); \
             looks at the group that found another leader or term: {}; times a replica took the lead: {took_lead}",
            acked.load(Ordering::Relaxed),
            refused.load(Ordering::Relaxed),
            copies.load(Ordering::Relaxed),
            changes.len()
        );
        for change in &changes {
            println!("  {change}");
        }
        !changes.is_empty() || took_lead != 1
    });
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    if failed {
        eprintln!("leadership changed under load");
        std::process::exit(1);
    }
}
