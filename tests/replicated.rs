//! A replicated leaf in one process ([`LocalTree`]): three replicas of one leaf under the
//! root, each with its own data directory, over loopback QUIC; its leader stopped, pushes and
//! pops going on, and started again.

use crest::core::topology::Topology;
use crest::node::{LocalTree, NodeSockets};
use crest::sdk::{Consumer, Message, MessageId, Producer};
use crest_testkit::eventually;
use std::collections::{HashMap, HashSet};
use std::net::UdpSocket;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

#[path = "common/acks.rs"]
mod acks;

use acks::pop_and_ack_until;

const REPLICAS: [&str; 3] = ["leaf-1a", "leaf-1b", "leaf-1c"];

/// The topology on ports held for it, and the sockets that hold them (each node's QUIC
/// socket, and each replica's replication socket).
fn topology() -> (Topology, crest::node::SocketBook) {
    let udp = || UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut book = HashMap::new();
    let root = udp();
    let mut text = format!(
        "[[node]]\nname = \"root\"\nrole = \"root\"\nlisten = \"{}\"\n",
        root.local_addr().unwrap()
    );
    book.insert("root".to_string(), NodeSockets::quic(root));
    for name in REPLICAS {
        let (quic, replication) = (udp(), udp());
        text.push_str(&format!(
            "[[node]]\nname = \"{name}\"\nrole = \"leaf\"\ngroup = \"leaf-1\"\nlisten = \"{}\"\n\
             replication = \"{}\"\nparent = \"root\"\n",
            quic.local_addr().unwrap(),
            replication.local_addr().unwrap()
        ));
        let mut sockets = NodeSockets::quic(quic);
        sockets.replication = Some(replication);
        book.insert(name.to_string(), sockets);
    }
    (Topology::parse(&text).unwrap(), Arc::new(Mutex::new(book)))
}

async fn push(producer: &Producer, tag: &str, count: usize) -> HashSet<MessageId> {
    let messages = (0..count).map(|n| Message::new("jobs", format!("{tag} {n}")));
    let batch = producer.send_batch(messages).await.unwrap();
    batch
        .acked()
        .await
        .expect("every push acknowledged")
        .into_iter()
        .collect()
}

/// Pops and acks until every message of `want` came; none may come twice.
async fn drain(consumer: &Consumer, want: &HashSet<MessageId>, seen: &mut HashSet<MessageId>) {
    pop_and_ack_until(consumer, seen, 64, |seen| want.is_subset(seen)).await
}

fn leader(tree: &LocalTree) -> Option<String> {
    tree.replicas
        .iter()
        .find(|r| r.status().serving.is_some())
        .map(|r| r.name().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_tree_serves_a_replicated_leaf_through_the_loss_of_its_leader() {
    let data = tempfile::tempdir().unwrap();
    let (topology, book) = topology();
    let mut tree = LocalTree::start_on(&topology, Some(data.path()), Some(book))
        .await
        .unwrap();
    assert!(tree.wait_connected(Duration::from_secs(30)).await);
    let (producer, consumer) = common::clients(&tree).await;
    let mut seen = HashSet::new();
    let mut acked = push(&producer, "before", 100).await;
    drain(&consumer, &acked, &mut seen).await;

    let first = leader(&tree).expect("a replica serves the leaf");
    tree.stop_node(&first).await;
    acked.extend(push(&producer, "during", 100).await);
    drain(&consumer, &acked, &mut seen).await;
    let second = leader(&tree).expect("another replica took over");
    assert_ne!(first, second);

    // Started again, the first leader follows and catches up.
    tree.restart_node(&first).await.unwrap();
    let what = format!("{first} to catch up with {second}");
    eventually(Duration::from_secs(30), what, async || {
        let applied = |name: &str| tree.replica(name).unwrap().status().applied;
        applied(&first).is_some() && applied(&first) == applied(&second)
    })
    .await;
    assert_eq!(leader(&tree).as_deref(), Some(second.as_str()));
    acked.extend(push(&producer, "after", 50).await);
    drain(&consumer, &acked, &mut seen).await;
    tree.shutdown().await;
}
