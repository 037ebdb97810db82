//! FIFO topics on a running tree (real QUIC, four leaves, files on disk): each group's
//! messages reach one leaf and are delivered in order, one run at a time, none of a group
//! while one of it is leased, other groups going on meanwhile; a leaf restarted with a lease
//! of a group outstanding still holds the group back.

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{
    Admin, ClientTls, Consumer, ConsumerConfig, Delivery, Message, PopOptions, Producer,
    ProducerConfig, TopicConfig, TopicSettings,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

const TOPIC: &str = "orders.fifo";

/// A tree of four leaves; `settings`, TOML appended to the topology (topic settings).
async fn start_tree(data_root: &Path, settings: &str) -> LocalTree {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let topology = Topology::parse(&format!("{text}\n{settings}"))
        .unwrap()
        .with_ephemeral_ports();
    let tree = LocalTree::start_with(&topology, Some(data_root))
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    tree
}

fn tls(tree: &LocalTree) -> ClientTls {
    ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone())
}

async fn make_fifo(tree: &LocalTree) {
    let admin = Admin::connect(ConsumerConfig::from_topology(&tree.topology, tls(tree)))
        .await
        .unwrap();
    let config = TopicConfig {
        settings: TopicSettings {
            fifo: Some(true),
            ..TopicSettings::default()
        },
        ..TopicConfig::default()
    };
    let kept = admin.configure(TOPIC, config).await.unwrap();
    assert_eq!(kept.value, 4, "every leaf keeps the configuration");
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8(delivery.payload.to_vec()).unwrap()
}

fn group(delivery: &Delivery) -> String {
    delivery.fairness_key.clone().unwrap()
}

/// Pops what is deliverable now (up to `max`), waiting `wait` for the first.
async fn pop(consumer: &Consumer, max: u32, wait: Duration) -> Vec<Delivery> {
    let options = PopOptions {
        max,
        wait,
        visibility: Some(Duration::from_secs(60)),
        ..PopOptions::default()
    };
    consumer.pop_with(TOPIC, options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_delivered_in_order_one_run_at_a_time_across_four_leaves() {
    let data = tempfile::tempdir().unwrap();
    let tree = start_tree(data.path(), "").await;
    make_fifo(&tree).await;
    let producer = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    // Six groups, eight messages each, interleaved in one batch.
    let groups: Vec<String> = (0..6).map(|g| format!("g{g}")).collect();
    let messages: Vec<Message> = (0..8)
        .flat_map(|n| {
            groups
                .iter()
                .map(move |g| Message::new(TOPIC, format!("{g}-{n}")).group(g.clone()))
        })
        .collect();
    let ids = producer
        .send_batch(messages)
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    // A group's messages reach one leaf (its order is that leaf's).
    let mut leaves: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for (at, id) in ids.iter().enumerate() {
        leaves
            .entry(groups[at % groups.len()].clone())
            .or_default()
            .push(id.leaf());
    }
    for (group, at) in &leaves {
        assert!(at.iter().all(|l| *l == at[0]), "{group} on leaves {at:?}");
    }

    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    let mut next: BTreeMap<String, usize> = BTreeMap::new();
    let mut delivered = 0;
    while delivered < 48 {
        // Two pops at once: what one holds of a group, the other never gets.
        let first = pop(&consumer, 3, WAIT).await;
        let second = pop(&consumer, 3, Duration::ZERO).await;
        assert!(
            !first.is_empty(),
            "{delivered} of 48 delivered, then nothing"
        );
        let held: Vec<String> = first.iter().map(group).collect();
        for delivery in &second {
            assert!(
                !held.contains(&group(delivery)),
                "{} went to a second pop while the first held its group",
                body(delivery)
            );
        }
        for delivery in first.iter().chain(&second) {
            let group = group(delivery);
            let expected = next.entry(group.clone()).or_default();
            assert_eq!(body(delivery), format!("{group}-{expected}"), "in order");
            *expected += 1;
        }
        delivered += first.len() + second.len();
        let receipts: Vec<_> = first.iter().chain(&second).map(Delivery::receipt).collect();
        for result in consumer.ack_many(&receipts).await.unwrap() {
            result.unwrap();
        }
    }
    assert!(next.values().all(|n| *n == 8), "{next:?}");
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_restarted_under_a_lease_still_holds_its_group_back() {
    let data = tempfile::tempdir().unwrap();
    // FIFO by the topology this time: the leaf knows it before it replays its log.
    let settings = format!("[settings.topics.\"{TOPIC}\"]\nfifo = true\n");
    let mut tree = start_tree(data.path(), &settings).await;
    let producer = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        let message = Message::new(TOPIC, format!("a-{n}")).group("a");
        ids.push(producer.send(message).await.unwrap().acked().await.unwrap());
    }
    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    let first = pop(&consumer, 1, WAIT).await;
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["a-0"]);

    let leaf = tree
        .topology
        .leaves()
        .find(|l| l.leaf_id == Some(ids[0].leaf()))
        .unwrap()
        .name
        .clone();
    tree.restart_node(&leaf).await.unwrap();
    assert!(tree.wait_connected(WAIT).await, "{leaf} is back");
    // The lease came back from the leaf's log, and with it the hold on a-1 and a-2.
    let during = pop(&consumer, 10, Duration::from_secs(1)).await;
    assert!(
        during.is_empty(),
        "{:?}",
        during.iter().map(body).collect::<Vec<_>>()
    );

    consumer.ack(&first[0].receipt()).await.unwrap();
    let rest = pop(&consumer, 10, WAIT).await;
    assert_eq!(rest.iter().map(body).collect::<Vec<_>>(), ["a-1", "a-2"]);
    tree.shutdown().await;
}
