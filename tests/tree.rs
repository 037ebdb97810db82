//! End-to-end tests of a whole tree over real QUIC sockets on loopback.
//!
//! Each test runs `topology/local.toml` (root, two aggregators, four leaves) in this process
//! with ephemeral ports, and talks to it through the SDK, or through raw framed streams where
//! it needs to send what the SDK never would.

use bytes::Bytes;
use crest::core::frame::encode_frame;
use crest::core::rng::SplitMix64;
use crest::core::topology::Topology;
use crest::core::wire::{
    ErrorCode, Hello, PROTOCOL_VERSION, PeerKind, Pop, Push, PushMessage, Role, Secret, Wire,
};
use crest::node::{LocalTree, SocketBook};
use crest::sdk::{
    ClientError, Consumer, Delivery, LeafId, MessageId, Producer, ProducerConfig, Receipt,
    ReceiptError,
};
use crest::transport::stream::{FrameReader, ReadEvent, open_streams};
use std::collections::HashSet;
use std::time::Duration;

mod common;

use common::{WAIT, consumer, producers, start_tree, tls};
use crest_testkit::eventually;

/// Waits until every window above the leaves is full (each child offers its credits, or all
/// of its subtree's `per_leaf` messages a leaf if fewer) and no offer moved for 300 ms.
async fn wait_until_quiet(tree: &LocalTree, per_leaf: u64) {
    let credits = u64::from(tree.topology.root().settings.credits_per_topic);
    let topology = &tree.topology;
    let full_window = |name: &str| -> u64 {
        topology
            .nodes
            .iter()
            .filter(|child| child.parent.as_deref() == Some(name))
            .map(|child| credits.min(per_leaf * topology.subtree_leaves(&child.name).len() as u64))
            .sum()
    };
    // Quiet: full windows, and no offer received across one look and the next, QUIET apart.
    const QUIET: Duration = Duration::from_millis(300);
    let mut last = None;
    eventually(WAIT, "the tree to settle", async || {
        let mut full = true;
        let mut offers = 0;
        for node in tree.nodes.iter().filter(|n| n.role() != Role::Leaf) {
            if node.stats().await.unwrap().window_entries < full_window(node.name()) {
                full = false;
            }
            let report = node.report().await.unwrap();
            offers += report.nodes[0].counters["offers_received"];
        }
        let quiet = full && last == Some(offers);
        if !quiet {
            last = Some(offers);
            tokio::time::sleep(QUIET).await;
        }
        quiet
    })
    .await
}

/// Pushes `per_leaf` messages of random priority through every leaf, concurrently.
async fn push_everywhere(
    producers: &[Producer],
    per_leaf: usize,
    seed: u64,
) -> Vec<(MessageId, u32)> {
    let mut rng = SplitMix64::new(seed);
    let mut handles = Vec::new();
    for round in 0..per_leaf {
        for producer in producers {
            let priority = rng.below(10) as u32;
            let message = crest::sdk::Message::new("jobs", format!("m{round}")).priority(priority);
            handles.push((producer.send(message).await.unwrap(), priority));
        }
    }
    let mut pushed = Vec::new();
    for (handle, priority) in handles {
        pushed.push((handle.acked().await.unwrap(), priority));
    }
    pushed
}

/// `topology/local.toml` on free fixed ports (as `crest local` runs it, not on port 0), and the
/// nodes' sockets, bound on those ports: held from the moment they are chosen, so no other
/// process can take one before its node listens.
fn local_topology_on_free_ports() -> (Topology, SocketBook) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    crest::node::on_held_ports(&Topology::parse(&text).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_tree_on_fixed_ports_starts_without_losing_a_packet() {
    // The root dials its leaves directly; were it to dial before they listen, the first
    // handshake packet of each link would be lost, and with it a third of the link's starting
    // congestion window.
    let (topology, sockets) = local_topology_on_free_ports();
    let tree = LocalTree::start_on(&topology, None, Some(sockets))
        .await
        .unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    for node in &tree.nodes {
        let links = node.links().await.unwrap();
        for link in &links.listed {
            assert_eq!(link.lost_packets, 0, "{}: {link:?}", node.name());
            assert_eq!(link.congestion_events, 0, "{}: {link:?}", node.name());
        }
    }
    let root = tree.node("root").unwrap().links().await.unwrap();
    assert_eq!(root.listed.iter().filter(|l| l.kind == "leaf").count(), 4);
    tree.shutdown().await;
}

#[test]
fn every_shipped_topology_file_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/topology");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let topology =
                Topology::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(topology.leaves().count() >= 1, "{}", path.display());
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "local, one-leaf, two-level, three-hosts, sim-16"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_delivered_once_in_key_order_across_leaves() {
    // Goal: exactly-once delivery of acked pops, and zero rank error once the tree is quiet.
    // Method: 4 producers × 300 messages of random priority, then pop one at a time and ack.
    let tree = start_tree().await;
    let producers = producers(&tree).await;
    let pushed = push_everywhere(&producers, 300, 11).await;
    let leaves: HashSet<LeafId> = pushed.iter().map(|(id, _)| id.leaf()).collect();
    assert_eq!(leaves.len(), 4, "messages live on every leaf");
    // An acknowledged push is durable at its leaf; its entry then bubbles up (and better
    // entries swap in for worse ones). Until that settles, a message may be ready at a leaf
    // without the root knowing of it: rank error by bubble-up latency, which grows with the
    // machine's load. Quiet: every window above the leaves is full and no offer has moved for
    // 300 ms.
    wait_until_quiet(&tree, 300).await;

    let consumer = consumer(&tree).await;
    let mut popped: Vec<Delivery> = Vec::new();
    loop {
        let batch = consumer.pop("jobs", 1, Duration::ZERO).await.unwrap();
        let Some(delivery) = batch.into_iter().next() else {
            break;
        };
        consumer.ack(&delivery.receipt()).await.unwrap();
        popped.push(delivery);
    }
    let ids: HashSet<MessageId> = popped.iter().map(|d| d.id).collect();
    assert_eq!(ids.len(), popped.len(), "no duplicates");
    assert_eq!(ids, pushed.iter().map(|(id, _)| *id).collect(), "none lost");
    let keys: Vec<(u32, u64, MessageId)> = popped
        .iter()
        .map(|d| (d.priority, d.enqueued_at.0, d.id))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    let inversions = keys.iter().zip(&sorted).filter(|(a, b)| a != b).count();
    if inversions > 0 {
        let first = keys.iter().zip(&sorted).position(|(a, b)| a != b).unwrap();
        for (i, (k, d)) in keys
            .iter()
            .zip(&popped)
            .enumerate()
            .skip(first.saturating_sub(3))
            .take(12)
        {
            eprintln!(
                "DEBUG {i}: popped {:?} leaf {} expected {:?}",
                (k.0, k.1 % 10_000_000),
                d.id.leaf(),
                (sorted[i].0, sorted[i].1 % 10_000_000)
            );
        }
    }
    assert_eq!(
        inversions, 0,
        "pop sequence is in key order (priority, ready time, id)"
    );
    for node in &tree.nodes {
        let stats = node.stats().await.unwrap();
        assert_eq!(
            stats.messages,
            0,
            "{} holds nothing after the acks",
            node.name()
        );
    }
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_pops_deliver_everything_exactly_once() {
    let tree = start_tree().await;
    let producers = producers(&tree).await;
    let pushed = push_everywhere(&producers, 500, 5).await;
    let consumer = consumer(&tree).await;
    let mut seen = HashSet::new();
    loop {
        let batch = consumer.pop("jobs", 64, Duration::ZERO).await.unwrap();
        if batch.is_empty() {
            break;
        }
        assert!(batch.len() <= 64);
        assert!(
            batch.windows(2).all(|w| w[0].priority <= w[1].priority),
            "a batch is sorted"
        );
        let receipts: Vec<Receipt> = batch.iter().map(Delivery::receipt).collect();
        assert!(
            consumer
                .ack_many(&receipts)
                .await
                .unwrap()
                .iter()
                .all(Result::is_ok)
        );
        for delivery in batch {
            assert!(seen.insert(delivery.id), "{} delivered twice", delivery.id);
        }
    }
    assert_eq!(seen.len(), pushed.len());
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_urgent_message_on_another_leaf_is_popped_first() {
    let tree = start_tree().await;
    let producers = producers(&tree).await;
    for producer in &producers[..3] {
        for _ in 0..200 {
            producer
                .send(crest::sdk::Message::new("jobs", "bulk").priority(5))
                .await
                .unwrap();
        }
        producer.push("jobs", 5, "last bulk").await.unwrap();
    }
    let consumer = consumer(&tree).await;
    let first = consumer.pop("jobs", 1, Duration::ZERO).await.unwrap();
    assert_eq!(first[0].priority, 5);
    let urgent = producers[3].push("jobs", 0, "urgent").await.unwrap();
    // The push is acknowledged as soon as the leaf holds it; its entry then bubbles up two
    // hops to the root, asynchronously. Pops racing that bubble-up may still return queued
    // messages, so the property is: it overtakes the ~600 queued messages within a few pops.
    let mut popped_before = 0;
    loop {
        let delivery = consumer.pop("jobs", 1, WAIT).await.unwrap().remove(0);
        consumer.ack(&delivery.receipt()).await.unwrap();
        if delivery.id == urgent {
            break;
        }
        assert_eq!(delivery.priority, 5);
        popped_before += 1;
        assert!(
            popped_before < 50,
            "the urgent message did not overtake the queue"
        );
    }
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_receipts_and_invalid_arguments_get_typed_errors() {
    let tree = start_tree().await;
    let producers = producers(&tree).await;
    producers[1].push("jobs", 1, "x").await.unwrap();
    let consumer = consumer(&tree).await;
    let delivery = consumer.pop("jobs", 1, WAIT).await.unwrap().remove(0);

    let forged = Receipt {
        id: delivery.id,
        token: delivery.token.wrapping_add(1),
    };
    let error = consumer.ack(&forged).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Receipt(ReceiptError::Stale)),
        "{error}"
    );
    let elsewhere = Receipt {
        id: MessageId::new(LeafId(999), 1),
        token: 1,
    };
    let error = consumer.ack(&elsewhere).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Receipt(ReceiptError::UnknownLeaf)),
        "{error}"
    );
    consumer.ack(&delivery.receipt()).await.unwrap();
    let error = consumer.ack(&delivery.receipt()).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Receipt(ReceiptError::Settled)),
        "{error}"
    );

    // Settling no receipts (an empty pop's) is nothing to do, not an error.
    assert!(consumer.ack_many(&[]).await.unwrap().is_empty());

    let error = consumer.pop("jobs", 0, Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Rejected { code: ErrorCode::InvalidArgument, message } if message.contains("max 0")),
        "{error}"
    );
    // A wait one millisecond past the bound (20,000 ms) is refused, not shortened.
    for wait in [Duration::from_secs(3600), Duration::from_millis(20_001)] {
        let error = consumer.pop("jobs", 1, wait).await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Rejected { message, .. } if message.contains("pop_wait_max_ms 20000")),
            "{wait:?}: {error}"
        );
    }

    let huge = vec![0u8; crest::core::config::PAYLOAD_BYTES_MAX_DEFAULT as usize + 1];
    let error = producers[0].push("jobs", 1, huge).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::InvalidArgument(m) if m.contains("payload_bytes_max")),
        "{error}"
    );
    let error = producers[0].push("no spaces", 1, "x").await.unwrap_err();
    assert!(
        matches!(
            &error,
            ClientError::Rejected {
                code: ErrorCode::InvalidArgument,
                ..
            }
        ),
        "{error}"
    );

    // The connections survived every refusal.
    producers[0].push("jobs", 2, "still fine").await.unwrap();
    assert_eq!(consumer.pop("jobs", 1, WAIT).await.unwrap().len(), 1);
    tree.shutdown().await;
}

/// Writes raw bytes on a raw crest connection's data stream and reads what comes back.
struct RawClient {
    _endpoint: quinn::Endpoint,
    control_send: quinn::SendStream,
    data_send: quinn::SendStream,
    control: FrameReader,
    data: FrameReader,
}

impl RawClient {
    async fn connect(tree: &LocalTree, address: &str, peer: PeerKind) -> RawClient {
        let settings = crest::core::config::Settings::default();
        let client = crest::transport::client_config(&tree.ca_pem, &settings).unwrap();
        let addr = address.parse().unwrap();
        let endpoint = crest::transport::client_endpoint(addr, client, &settings).unwrap();
        let connection =
            crest::transport::connect(&endpoint, addr, crest::transport::tls::SERVER_NAME)
                .await
                .unwrap();
        let streams = open_streams(&connection).await.unwrap();
        let max = settings.frame_bytes_max;
        let mut raw = RawClient {
            _endpoint: endpoint,
            control_send: streams.control.0,
            data_send: streams.data.0,
            control: FrameReader::new(streams.control.1, max),
            data: FrameReader::new(streams.data.1, max),
        };
        let mut hello = Vec::new();
        encode_frame(
            &Wire::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                token: Some(Secret(tree.admin_token.clone())),
                peer,
            }),
            max,
            &mut hello,
        )
        .unwrap();
        raw.control_send.write_all(&hello).await.unwrap();
        assert!(matches!(raw.next_control().await, Wire::Welcome(_)));
        raw
    }

    async fn next_control(&mut self) -> Wire {
        match tokio::time::timeout(WAIT, self.control.next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(ReadEvent::Frame(msg)) => msg,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    async fn next_data(&mut self) -> Wire {
        match tokio::time::timeout(WAIT, self.data.next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(ReadEvent::Frame(msg)) => msg,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    async fn expect_error(&mut self, code: ErrorCode) -> String {
        match self.next_control().await {
            Wire::Error(error) if error.code == code => error.message,
            other => panic!("expected {code:?}, got {other:?}"),
        }
    }
}

fn raw_frame(body: &[u8], crc: u32) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&crc.to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_are_answered_and_the_connection_survives() {
    let tree = start_tree().await;
    let leaf = tree.topology.leaves().next().unwrap().address.clone();
    let mut raw = RawClient::connect(&tree, &leaf, PeerKind::Producer).await;

    let garbage = b"\xc1 this is not msgpack";
    raw.data_send
        .write_all(&raw_frame(garbage, crc32fast::hash(garbage)))
        .await
        .unwrap();
    let message = raw.expect_error(ErrorCode::MalformedFrame).await;
    assert!(message.contains("malformed"), "{message}");

    raw.data_send
        .write_all(&raw_frame(b"abcd", 0xdead_beef))
        .await
        .unwrap();
    raw.expect_error(ErrorCode::ChecksumMismatch).await;

    let max = crest::core::config::Settings::default().frame_bytes_max as usize;
    let oversized = vec![7u8; max + 1];
    raw.data_send
        .write_all(&raw_frame(&oversized, 0))
        .await
        .unwrap();
    let message = raw.expect_error(ErrorCode::FrameTooLarge).await;
    assert!(message.contains(&max.to_string()), "{message}");

    // More messages, or metadata entries, than the leaf allows: refused while decoding,
    // before the lists are allocated, answered to the request on the data stream.
    let settings = crest::core::config::Settings::default();
    let entry = |entries: u32| PushMessage {
        topic: "jobs".into(),
        metadata: (0..entries)
            .map(|i| (i.to_string(), String::new()))
            .collect(),
        ..PushMessage::default()
    };
    for (request, messages, code) in [
        (
            41,
            vec![entry(0); settings.push_batch_messages_max as usize + 1],
            ErrorCode::BatchTooLarge,
        ),
        (
            42,
            vec![entry(settings.metadata_entries_max + 1)],
            ErrorCode::InvalidArgument,
        ),
    ] {
        let mut frame = Vec::new();
        encode_frame(
            &Wire::Push(Push { request, messages }),
            max as u32,
            &mut frame,
        )
        .unwrap();
        raw.data_send.write_all(&frame).await.unwrap();
        match raw.next_data().await {
            Wire::Error(error) => {
                assert_eq!(
                    (error.request, error.code),
                    (Some(request), code),
                    "{error:?}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    // A payload over the leaf's limit in a well-formed frame is refused by name.
    let too_big = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        metadata: vec![],
        payload: Bytes::from(vec![
            1u8;
            crest::core::config::PAYLOAD_BYTES_MAX_DEFAULT as usize
                + 1
        ]),
        ..PushMessage::default()
    };
    let mut frame = Vec::new();
    encode_frame(
        &Wire::Push(Push {
            request: 1,
            messages: vec![too_big],
        }),
        max as u32,
        &mut frame,
    )
    .unwrap();
    raw.data_send.write_all(&frame).await.unwrap();
    match raw.next_data().await {
        Wire::Error(error) => assert_eq!(
            (error.request, error.code),
            (Some(1), ErrorCode::PayloadTooLarge)
        ),
        other => panic!("{other:?}"),
    }

    // The same connection still serves a valid push.
    let ok = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        metadata: vec![],
        payload: Bytes::from_static(b"ok"),
        ..PushMessage::default()
    };
    let mut frame = Vec::new();
    encode_frame(
        &Wire::Push(Push {
            request: 2,
            messages: vec![ok],
        }),
        max as u32,
        &mut frame,
    )
    .unwrap();
    raw.data_send.write_all(&frame).await.unwrap();
    assert!(
        matches!(raw.next_data().await, Wire::PushAck(ack) if ack.request == 2 && ack.ids.len() == 1)
    );

    // And a consumer cannot push, a producer cannot pop: named, typed refusals.
    let root = tree.topology.root().address.clone();
    let mut raw_consumer = RawClient::connect(&tree, &root, PeerKind::Consumer).await;
    let mut frame = Vec::new();
    let pop = Pop {
        request: 9,
        topic: "jobs".into(),
        max: 1,
        wait_ms: 0,
        lease_ms: Some(0),
        ..Pop::default()
    };
    encode_frame(&Wire::Pop(pop), max as u32, &mut frame).unwrap();
    raw_consumer.data_send.write_all(&frame).await.unwrap();
    match raw_consumer.next_data().await {
        Wire::Error(error) => {
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(
                error.message.contains("visibility timeout"),
                "{}",
                error.message
            );
        }
        other => panic!("{other:?}"),
    }
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_root_loses_nothing_a_leaf_holds() {
    // In-process variant: stop the root (its connections close), start a new root on the
    // same address, and check every message is still delivered. The real-process variant with
    // SIGKILL lives in tests/processes.rs.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let topology = Topology::parse(&text).unwrap().with_ephemeral_ports();
    let mut tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let producers = producers(&tree).await;
    let pushed = push_everywhere(&producers, 100, 3).await;

    let consumer_before = consumer(&tree).await;
    let early = consumer_before.pop("jobs", 10, WAIT).await.unwrap();
    let receipts: Vec<Receipt> = early.iter().map(Delivery::receipt).collect();
    assert!(
        consumer_before
            .ack_many(&receipts)
            .await
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );

    tree.stop_node("root").await;
    assert!(
        consumer_before
            .pop("jobs", 1, Duration::ZERO)
            .await
            .is_err(),
        "the old root is gone"
    );
    tree.restart_node("root").await.unwrap();
    assert!(tree.wait_connected(WAIT).await);

    let consumer_after = consumer(&tree).await;
    let rest = pop_and_ack(&consumer_after, pushed.len() - early.len()).await;
    assert_eq!(
        distinct(&early, &rest),
        pushed.len(),
        "every message delivered after the restart"
    );
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_standing_by_serves_once_the_root_is_gone() {
    // Goal: with a second root standing by, stopping the root moves its children (and the
    // consumer, given both roots) to the standby, which serves every message the leaves hold;
    // acks of deliveries made by the old root reach their leaves through the new one.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let text =
        format!("{text}\n[[node]]\nname = \"root-b\"\nrole = \"root\"\nlisten = \"127.0.0.1:0\"\n");
    let topology = Topology::parse(&text).unwrap().with_ephemeral_ports();
    assert_eq!(topology.roots().count(), 2);
    let mut tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let producers = producers(&tree).await;
    let pushed = push_everywhere(&producers, 100, 3).await;
    let consumer = consumer(&tree).await;
    let early = consumer.pop("jobs", 10, WAIT).await.unwrap();
    assert_eq!(early.len(), 10);
    let standby = tree.node("root-b").unwrap();
    assert_eq!(standby.stats().await.unwrap().children, 0, "it stands by");

    tree.stop_node("root").await;
    eventually(WAIT, "the children to move to root-b", async || {
        tree.node("root-b").unwrap().stats().await.unwrap().children >= 2
    })
    .await;
    // Delivered by the old root, acknowledged through the new one.
    let receipts: Vec<Receipt> = early.iter().map(Delivery::receipt).collect();
    let results = consumer.ack_many(&receipts).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let rest = pop_and_ack(&consumer, pushed.len() - early.len()).await;
    assert_eq!(
        distinct(&early, &rest),
        pushed.len(),
        "every message served by the standby"
    );

    // The root is back: the aggregators go back to it (`root_fail_back_ms`), and the
    // consumer, refused by the standby that no node is with any more, follows.
    tree.restart_node("root").await.unwrap();
    eventually(WAIT, "the children to go back to the root", async || {
        tree.node("root").unwrap().stats().await.unwrap().children >= 2
    })
    .await;
    eventually(WAIT, "the standby to let them go", async || {
        tree.node("root-b").unwrap().stats().await.unwrap().children == 0
    })
    .await;
    let later = push_everywhere(&producers, 10, 3).await;
    let back = pop_and_ack(&consumer, later.len()).await;
    assert_eq!(back.len(), later.len(), "served by the root again");
    tree.shutdown().await;
}

/// How many distinct messages two lists of deliveries hold.
fn distinct(first: &[Delivery], then: &[Delivery]) -> usize {
    let ids: std::collections::HashSet<MessageId> =
        first.iter().chain(then).map(|d| d.id).collect();
    ids.len()
}

/// Pops "jobs" and acknowledges each batch (every ack must succeed) until `count` deliveries
/// came (failing after `WAIT`); returns them.
async fn pop_and_ack(consumer: &Consumer, count: usize) -> Vec<Delivery> {
    let mut got = Vec::new();
    eventually(WAIT, format!("{count} deliveries"), async || {
        if got.len() >= count {
            return Ok(());
        }
        let batch = consumer
            .pop("jobs", 50, Duration::from_millis(200))
            .await
            .unwrap();
        let receipts: Vec<Receipt> = batch.iter().map(Delivery::receipt).collect();
        if !receipts.is_empty() {
            let results = consumer.ack_many(&receipts).await.unwrap();
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        got.extend(batch);
        Err(got.len())
    })
    .await;
    got
}

/// The `pushed` and `push_batches` counters of every leaf, summed.
async fn push_counters(tree: &LocalTree) -> (u64, u64) {
    let mut totals = (0, 0);
    for node in tree.nodes.iter().filter(|n| n.role() == Role::Leaf) {
        let report = node.report().await.unwrap();
        totals.0 += report.nodes[0].counters["pushed"];
        totals.1 += report.nodes[0].counters["push_batches"];
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_batches_adapt_to_load() {
    // Goal: the SDK sends at once when its link is idle (light load: one message per batch,
    // no waiting for company) and batches grow as load rises (heavy load: many per batch).
    // Method: the leaves' counters of messages and batches received.
    let tree = start_tree().await;
    let producer = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .unwrap();
    for i in 0..40u32 {
        producer.push("light", i % 10, vec![1u8; 16]).await.unwrap();
    }
    assert_eq!(
        push_counters(&tree).await,
        (40, 40),
        "idle link: every message went alone, at once"
    );
    let mut handles = Vec::new();
    for i in 0..20_000u32 {
        let message = crest::sdk::Message::new("heavy", vec![2u8; 16]).priority(i % 10);
        handles.push(producer.send(message).await.unwrap());
    }
    for handle in handles {
        handle.acked().await.unwrap();
    }
    let (pushed, batches) = push_counters(&tree).await;
    assert_eq!(pushed, 20_040);
    let heavy_batches = batches - 40;
    assert!(
        heavy_batches * 8 <= 20_000,
        "busy link: batches grew ({heavy_batches} batches for 20,000 messages)"
    );
    // Bounded by the producer's batch_messages_max (histograms keep two significant digits).
    let max_batch = ProducerConfig::from_topology(&tree.topology, tls(&tree)).batch_messages_max;
    for node in tree.nodes.iter().filter(|n| n.role() == Role::Leaf) {
        let report = node.report().await.unwrap();
        let sizes = &report.histograms[&crest::core::metrics::Metric::PushBatch];
        let largest = sizes.percentiles().max;
        assert!(largest > 1, "{largest}");
        assert!(largest <= max_batch as u64 * 101 / 100, "{largest}");
    }
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_direct_pop_path_acks_reach_leaves_whose_aggregator_is_down() {
    // Goal: the root reaches the leaves directly for reserves and acks (the default
    // `direct_pop_path`), so the aggregators carry offers only, and a consumer can still ack
    // what it holds from leaves whose aggregator went away.
    // Method: pop a batch from all four leaves, stop agg-1, ack the batch; then restart agg-1
    // and drain the rest, each message once.
    let mut tree = start_tree().await;
    let root = tree.node("root").unwrap();
    assert_eq!(root.stats().await.unwrap().direct_links, 4);
    let producers = producers(&tree).await;
    let pushed = push_everywhere(&producers, 50, 11).await;
    // Let the offers reach the root, so the batch spans the leaves.
    wait_until_quiet(&tree, 50).await;
    let consumer = consumer(&tree).await;
    let held = consumer.pop("jobs", 100, WAIT).await.unwrap();
    let leaves: HashSet<LeafId> = held.iter().map(|d| d.id.leaf()).collect();
    assert!(
        leaves.contains(&LeafId(1)) || leaves.contains(&LeafId(2)),
        "the batch holds messages of agg-1's leaves: {leaves:?}"
    );
    for name in ["agg-1", "agg-2"] {
        let report = tree.node(name).unwrap().report().await.unwrap();
        assert_eq!(
            report.nodes[0].counters["reserves_forwarded"], 0,
            "{name} saw no reserve"
        );
    }

    tree.stop_node("agg-1").await;
    let receipts: Vec<Receipt> = held.iter().map(Delivery::receipt).collect();
    let results = consumer.ack_many(&receipts).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    tree.restart_node("agg-1").await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let mut seen: HashSet<MessageId> = held.iter().map(|d| d.id).collect();
    for delivery in pop_and_ack(&consumer, pushed.len() - held.len()).await {
        assert!(seen.insert(delivery.id), "{} delivered twice", delivery.id);
    }
    assert_eq!(seen.len(), pushed.len(), "every message delivered once");
    tree.shutdown().await;
}
