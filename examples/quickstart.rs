//! Quickstart: a whole crest tree in this process, four producers, one consumer.
//!
//! Starts the default local tree (root, two aggregators, four leaves) on free loopback ports,
//! pushes 10,000 messages of random priority through four producers (one per leaf), then pops
//! them all with one consumer and shows that they come out in priority order.
//!
//! Run: `cargo run --release --example quickstart`

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{
    ClientTls, Consumer, ConsumerConfig, Delivery, Message, Producer, ProducerConfig, Receipt,
};
use std::time::{Duration, Instant};

const MESSAGES: usize = 10_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::parse(crest::DEFAULT_TOPOLOGY)?.with_ephemeral_ports();
    let tree = LocalTree::start(&topology).await?;
    if !tree.wait_connected(Duration::from_secs(10)).await {
        return Err("the tree did not connect".into());
    }
    let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
    println!("tree up: root at {}", tree.topology.root().address);

    // One producer per leaf: the messages end up spread over all four leaves.
    let mut producers = Vec::new();
    for leaf in tree.topology.leaves() {
        producers.push(
            Producer::connect(ProducerConfig::new(vec![leaf.address.clone()], tls.clone())).await?,
        );
    }
    let started = Instant::now();
    let mut handles = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES {
        let priority = rand::random_range(0..10u32);
        let message = Message::new("quickstart", format!("message {i}")).priority(priority);
        handles.push(producers[i % producers.len()].send(message).await?);
    }
    for handle in handles {
        handle.acked().await?;
    }
    println!("pushed {MESSAGES} messages in {:.2?}", started.elapsed());

    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls)).await?;
    let started = Instant::now();
    let mut priorities = Vec::with_capacity(MESSAGES);
    while priorities.len() < MESSAGES {
        let batch = consumer
            .pop("quickstart", 100, Duration::from_secs(1))
            .await?;
        if batch.is_empty() {
            break;
        }
        let receipts: Vec<Receipt> = batch.iter().map(Delivery::receipt).collect();
        consumer.ack_many(&receipts).await?;
        priorities.extend(batch.iter().map(|d| d.priority));
    }
    println!(
        "popped and acked {} messages in {:.2?}",
        priorities.len(),
        started.elapsed()
    );

    let mut counts = [0usize; 10];
    for &priority in &priorities {
        counts[priority as usize] += 1;
    }
    for (priority, count) in counts.iter().enumerate() {
        println!("  priority {priority}: {count:>5} messages");
    }
    let out_of_order = priorities.windows(2).filter(|w| w[0] > w[1]).count();
    println!(
        "in priority order: {} ({out_of_order} adjacent pairs out of order)",
        if out_of_order == 0 { "yes" } else { "no" }
    );
    tree.shutdown().await;
    if priorities.len() != MESSAGES || out_of_order != 0 {
        return Err("not every message came out in order".into());
    }
    Ok(())
}
