//! Helpers shared by the end-to-end tests: trees started in the test's process, and the
//! `crest` binary run as a command.
#![allow(dead_code)]

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Producer, ProducerConfig};
use std::time::Duration;

/// How long a test waits for a condition before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// `topology/local.toml` on ephemeral ports, started in this process and connected.
pub(crate) async fn start_tree() -> LocalTree {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let topology = Topology::parse(&text).unwrap().with_ephemeral_ports();
    let tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    tree
}

/// What a client of `tree` trusts and proves: its CA and its admin token.
pub(crate) fn tls(tree: &LocalTree) -> ClientTls {
    ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone())
}

/// One producer per leaf, so pushes land on known leaves.
pub(crate) async fn producers(tree: &LocalTree) -> Vec<Producer> {
    let mut producers = Vec::new();
    for leaf in tree.topology.leaves() {
        let config = ProducerConfig::new(vec![leaf.address.clone()], tls(tree));
        producers.push(Producer::connect(config).await.unwrap());
    }
    producers
}

/// A producer of every leaf of the tree and a consumer of its root.
pub(crate) async fn clients(tree: &LocalTree) -> (Producer, Consumer) {
    let config = ProducerConfig::from_topology(&tree.topology, tls(tree));
    (
        Producer::connect(config).await.unwrap(),
        consumer(tree).await,
    )
}

/// A consumer of the tree's root.
pub(crate) async fn consumer(tree: &LocalTree) -> Consumer {
    Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls(tree)))
        .await
        .unwrap()
}

/// Counter `name` summed over the tree's leaves.
pub(crate) async fn leaf_counter(tree: &LocalTree, name: &str) -> u64 {
    let mut sum = 0;
    for leaf in tree.topology.leaves() {
        let report = tree.node(&leaf.name).unwrap().report().await.unwrap();
        sum += report.nodes[0].counters.get(name).copied().unwrap_or(0);
    }
    sum
}

/// Acknowledges `deliveries`, each of which must succeed.
pub(crate) async fn ack_all(consumer: &Consumer, deliveries: &[crest::sdk::Delivery]) {
    let receipts: Vec<crest::sdk::Receipt> = deliveries.iter().map(|d| d.receipt()).collect();
    let results = consumer.ack_many(&receipts).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// Runs a command to completion off the async runtime; returns (success, stdout + stderr).
pub(crate) async fn output(mut command: std::process::Command) -> (bool, String) {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}
