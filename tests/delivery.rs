//! End-to-end tests of the delivery semantics over real QUIC on loopback: leases and receipts,
//! nack with delay, extend and heartbeats, dead-letter queues, delayed messages, time to live,
//! dedup keys, long-poll, the priority filter, and the lease invariant under concurrency.
//!
//! Each test runs `topology/local.toml` (root, two aggregators, four leaves) in this process
//! with ephemeral ports and short per-topic policies appended to its settings. Times asserted
//! are lower bounds ("not before"), which a slow machine cannot break.

use crest::core::rng::SplitMix64;
use crest::core::topology::Topology;
use crest::core::wire::ErrorCode;
use crest::node::LocalTree;
use crest::sdk::{
    Admin, ClientError, ClientTls, Consumer, ConsumerConfig, Delivery, Message, MessageId,
    PopOptions, Producer, ProducerConfig, ReceiptError, tier,
};
use crest_testkit::eventually;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const WAIT: Duration = Duration::from_secs(10);

/// Per-topic policies the tests rely on.
const TOPIC_SETTINGS: &str = r#"
[settings.topics.flaky]
max_attempts = 3

[settings.topics.ephemeral]
message_ttl_ms = 300

[settings.topics.dedup]
dedup_window_ms = 60000
"#;

fn topology() -> Topology {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    Topology::parse(&format!("{text}\n{TOPIC_SETTINGS}"))
        .unwrap()
        .with_ephemeral_ports()
}

async fn start_tree(data_root: Option<&Path>) -> LocalTree {
    let tree = LocalTree::start_with(&topology(), data_root).await.unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    tree
}

fn tls(tree: &LocalTree) -> ClientTls {
    ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone())
}

async fn producer(tree: &LocalTree) -> Producer {
    Producer::connect(ProducerConfig::from_topology(&tree.topology, tls(tree)))
        .await
        .unwrap()
}

fn root_config(tree: &LocalTree) -> ConsumerConfig {
    ConsumerConfig::from_topology(&tree.topology, tls(tree))
}

async fn consumer(tree: &LocalTree) -> Consumer {
    Consumer::connect(root_config(tree)).await.unwrap()
}

async fn admin(tree: &LocalTree) -> Admin {
    Admin::connect(root_config(tree)).await.unwrap()
}

async fn push(producer: &Producer, message: Message) -> MessageId {
    producer.send(message).await.unwrap().acked().await.unwrap()
}

fn options(max: u32, wait: Duration, visibility: Option<Duration>) -> PopOptions {
    PopOptions {
        max,
        wait,
        visibility,
        ..PopOptions::default()
    }
}

/// Pops one delivery of `topic`, waiting up to `WAIT` for it.
async fn pop_one(consumer: &Consumer, topic: &str, visibility: Option<Duration>) -> Delivery {
    let mut got = consumer
        .pop_with(topic, options(1, WAIT, visibility))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "a delivery of {topic} within {WAIT:?}");
    got.remove(0)
}

async fn pop_none(consumer: &Consumer, topic: &str) {
    let got = consumer
        .pop_with(topic, options(10, Duration::ZERO, None))
        .await
        .unwrap();
    assert!(got.is_empty(), "nothing of {topic} is deliverable: {got:?}");
}

fn stale(result: Result<(), ClientError>) -> bool {
    matches!(result, Err(ClientError::Receipt(ReceiptError::Stale)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_delivery_goes_to_another_consumer_after_its_timeout_and_the_late_ack_is_refused()
 {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let (slow, other) = (consumer(&tree).await, consumer(&tree).await);
    let id = push(&producer, Message::new("jobs", "work")).await;

    let visibility = Duration::from_millis(300);
    let first = pop_one(&slow, "jobs", Some(visibility)).await;
    assert_eq!((first.id, first.attempt), (id, 1));
    let popped_at = Instant::now();
    // The other consumer long-polls: it gets the message once the lease has run out.
    let second = pop_one(&other, "jobs", Some(Duration::from_secs(30))).await;
    assert!(
        popped_at.elapsed() >= visibility - Duration::from_millis(50),
        "not redelivered before the visibility timeout"
    );
    assert_eq!((second.id, second.attempt), (id, 2));
    assert!(second.lease_deadline >= first.lease_deadline);

    // Every late operation of the first consumer is refused, never silently applied.
    assert!(stale(slow.ack(&first.receipt()).await), "late ack");
    assert!(stale(
        slow.nack(&first.receipt(), Duration::ZERO, None).await
    ));
    assert!(stale(slow.extend(&first.receipt(), WAIT).await));
    other.ack(&second.receipt()).await.unwrap();
    assert!(matches!(
        other.ack(&second.receipt()).await,
        Err(ClientError::Receipt(ReceiptError::Settled))
    ));
    pop_none(&other, "jobs").await;
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_a_heartbeat_keep_a_lease_alive_past_its_timeout() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let (worker, thief) = (consumer(&tree).await, consumer(&tree).await);
    push(&producer, Message::new("jobs", "long job")).await;

    // Margins of hundreds of milliseconds, so a busy machine cannot make an extend late: the
    // sleeps stand for the worker's processing, not for synchronisation.
    let visibility = Duration::from_millis(1000);
    let delivery = pop_one(&worker, "jobs", Some(visibility)).await;
    // By hand: extend twice, each time well before the deadline, until past the first one.
    for _ in 0..2 {
        tokio::time::sleep(visibility * 6 / 10).await;
        worker
            .extend(&delivery.receipt(), visibility * 2)
            .await
            .unwrap();
    }
    pop_none(&thief, "jobs").await;
    // With a heartbeat: the handler runs for three timeouts and keeps its lease.
    let heartbeat = worker.heartbeat(delivery.receipt(), visibility);
    tokio::time::sleep(visibility * 3).await;
    pop_none(&thief, "jobs").await;
    assert!(heartbeat.lost().is_none());
    heartbeat.stop();
    worker.ack(&delivery.receipt()).await.unwrap();
    pop_none(&thief, "jobs").await;
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_delay_redelivers_after_the_delay_with_its_attempt_count() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    let id = push(&producer, Message::new("jobs", "retry me")).await;

    let first = pop_one(&consumer, "jobs", None).await;
    let delay = Duration::from_millis(500);
    let nacked_at = Instant::now();
    consumer
        .nack(&first.receipt(), delay, Some("db timeout"))
        .await
        .unwrap();
    pop_none(&consumer, "jobs").await;
    let again = pop_one(&consumer, "jobs", None).await;
    assert!(
        nacked_at.elapsed() >= delay - Duration::from_millis(50),
        "not before the delay"
    );
    assert_eq!((again.id, again.attempt), (id, 2));
    // A nack without delay makes it available at once.
    consumer
        .nack(&again.receipt(), Duration::ZERO, None)
        .await
        .unwrap();
    let third = pop_one(&consumer, "jobs", None).await;
    assert_eq!((third.id, third.attempt), (id, 3));
    consumer.ack(&third.receipt()).await.unwrap();
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_max_attempts_times_is_dead_lettered_and_can_be_redriven_or_purged() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    let admin = admin(&tree).await;
    let keep = push(
        &producer,
        Message::new("flaky", "poison").priority(tier::HIGH),
    )
    .await;
    let drop = push(&producer, Message::new("flaky", "garbage")).await;

    // `flaky` allows 3 attempts: two nacks and one lease that runs out.
    for attempt in 1..=3 {
        let mut got = consumer
            .pop_with("flaky", options(2, WAIT, Some(Duration::from_millis(200))))
            .await
            .unwrap();
        if got.len() < 2 {
            got.extend(
                consumer
                    .pop_with("flaky", options(1, WAIT, Some(Duration::from_millis(200))))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(got.len(), 2, "attempt {attempt}");
        assert!(got.iter().all(|d| d.attempt == attempt));
        if attempt < 3 {
            for delivery in &got {
                consumer
                    .nack(&delivery.receipt(), Duration::ZERO, Some("boom"))
                    .await
                    .unwrap();
            }
        }
    }
    // The third leases expire: both move to the dead-letter queue.
    let listed = eventually(WAIT, "two dead letters", async || {
        let answer = admin.dead_letters("flaky", 10).await.unwrap();
        assert!(answer.unreachable.is_empty());
        (answer.value.len() == 2).then_some(answer.value)
    })
    .await;
    pop_none(&consumer, "flaky").await;
    let poison = listed.iter().find(|d| d.id == keep).expect("listed");
    assert_eq!(poison.attempts, 3);
    assert_eq!(&poison.payload[..], b"poison");
    assert_eq!(poison.priority, tier::HIGH);
    assert!(
        poison.reason.contains("visibility timeout"),
        "{}",
        poison.reason
    );
    assert!(poison.dead_at >= poison.enqueued_at);
    let stats = admin.stats(Some("flaky")).await.unwrap().value;
    assert_eq!(stats.topic("flaky").unwrap().dead, 2);
    assert!(stats.dead_lettered >= 2);

    // Purge one by id, redrive the rest: it comes back with its attempts reset.
    assert_eq!(admin.purge("flaky", &[drop]).await.unwrap().value, 1);
    assert_eq!(admin.redrive("flaky", &[]).await.unwrap().value, 1);
    assert!(
        admin
            .dead_letters("flaky", 10)
            .await
            .unwrap()
            .value
            .is_empty()
    );
    let back = pop_one(&consumer, "flaky", None).await;
    assert_eq!((back.id, back.attempt), (keep, 1));
    consumer.ack(&back.receipt()).await.unwrap();
    pop_none(&consumer, "flaky").await;
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_not_popped_early_and_is_popped_once_ready() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    let admin = admin(&tree).await;
    let delay = Duration::from_millis(700);
    let pushed_at = Instant::now();
    let after = push(
        &producer,
        Message::new("later", "after").deliver_after(delay),
    )
    .await;
    let at = push(
        &producer,
        Message::new("later", "at")
            .priority(tier::CRITICAL)
            .deliver_at(SystemTime::now() + delay),
    )
    .await;
    pop_none(&consumer, "later").await;
    let stats = admin.stats(Some("later")).await.unwrap().value;
    assert_eq!(stats.topic("later").unwrap().delayed, 2);

    let first = pop_one(&consumer, "later", None).await;
    assert!(pushed_at.elapsed() >= delay, "not delivered before it");
    // Once ready, the order is the key's: the critical one first (if both were ready).
    let second = pop_one(&consumer, "later", None).await;
    let mut ids = vec![first.id, second.id];
    ids.sort();
    let mut want = vec![after, at];
    want.sort();
    assert_eq!(ids, want);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_message_is_never_popped_and_is_counted() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    let admin = admin(&tree).await;
    // One with its own time to live, two under the topic's default (300 ms), one exempt.
    push(
        &producer,
        Message::new("jobs", "short").ttl(Duration::from_millis(200)),
    )
    .await;
    push(&producer, Message::new("ephemeral", "a")).await;
    push(&producer, Message::new("ephemeral", "b")).await;
    let kept = push(
        &producer,
        Message::new("ephemeral", "forever").ttl(Duration::ZERO),
    )
    .await;
    // The three expire on the leaves' timers: wait until they are counted.
    eventually(WAIT, "three messages expired", async || {
        admin.stats(None).await.unwrap().value.expired >= 3
    })
    .await;
    pop_none(&consumer, "jobs").await;
    let got = consumer
        .pop_with("ephemeral", options(10, Duration::from_millis(300), None))
        .await
        .unwrap();
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), vec![kept]);
    let stats = admin.stats(None).await.unwrap().value;
    assert_eq!(stats.expired, 3);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_dedup_key_yields_the_same_id_and_one_delivery_across_producers() {
    let tree = start_tree(None).await;
    // Two producers listing the leaves in opposite orders still pick the same leaf per key.
    let first = producer(&tree).await;
    let mut reversed: Vec<String> = tree.topology.leaves().map(|l| l.address.clone()).collect();
    reversed.reverse();
    let second = Producer::connect(ProducerConfig::new(reversed, tls(&tree)))
        .await
        .unwrap();
    let consumer = consumer(&tree).await;
    let admin = admin(&tree).await;

    let mut ids = Vec::new();
    for key in 0..8 {
        let key = format!("order-{key}");
        let a = push(&first, Message::new("dedup", "one").dedup_key(&key)).await;
        let b = push(&second, Message::new("dedup", "two").dedup_key(&key)).await;
        assert_eq!(a, b, "{key}: the second push answers the first id");
        ids.push(a);
    }
    // The same key on another topic is another message.
    let elsewhere = push(&first, Message::new("jobs", "x").dedup_key("order-0")).await;
    assert_ne!(elsewhere, ids[0]);

    let got = consumer
        .pop_with("dedup", options(100, WAIT, None))
        .await
        .unwrap();
    let mut popped: Vec<MessageId> = got.iter().map(|d| d.id).collect();
    while popped.len() < ids.len() {
        let more = consumer
            .pop_with("dedup", options(100, Duration::from_millis(500), None))
            .await
            .unwrap();
        assert!(!more.is_empty(), "every first message is delivered");
        popped.extend(more.iter().map(|d| d.id));
    }
    popped.sort();
    ids.sort();
    assert_eq!(popped, ids, "one delivery per key");
    assert!(got.iter().all(|d| &d.payload[..] == b"one"));
    pop_none(&consumer, "dedup").await;
    assert_eq!(admin.stats(None).await.unwrap().value.deduplicated, 8);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_send_answers_each_message_id_in_order_across_parts_leaves_and_dedup_keys() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    // 2,500 messages: three parts of at most 1,024 (batch_messages_max), spread over leaves;
    // every tenth carries a dedup key and goes to the leaf its key hashes to.
    let batch = (0..2_500u32).map(|i| {
        let message = Message::new("batched", format!("m{i}")).priority(i % 7);
        if i % 10 == 0 {
            message.dedup_key(format!("key-{i}"))
        } else {
            message
        }
    });
    let handle = producer.send_batch(batch).await.unwrap();
    assert_eq!(handle.len(), 2_500);
    let ids = handle.acked().await.unwrap();
    assert_eq!(ids.len(), 2_500);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        2_500,
        "one id each"
    );
    let leaves: HashSet<_> = ids.iter().map(|id| id.leaf()).collect();
    assert!(leaves.len() > 1, "parts spread over leaves: {leaves:?}");
    // The id answered for each position is the id of that message.
    let mut payload_of = HashMap::new();
    while payload_of.len() < ids.len() {
        let got = consumer
            .pop_with("batched", options(500, WAIT, None))
            .await
            .unwrap();
        assert!(!got.is_empty(), "every message is delivered");
        for delivery in &got {
            let text = String::from_utf8(delivery.payload.to_vec()).unwrap();
            assert!(
                payload_of.insert(delivery.id, text).is_none(),
                "delivered once"
            );
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(payload_of[id], format!("m{i}"), "position {i}");
    }
    // A batch sent again with the same dedup keys answers the first ids for those.
    let again =
        (0..50u32).map(|i| Message::new("batched", "again").dedup_key(format!("key-{}", i * 10)));
    let again = producer
        .send_batch(again)
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    let expected: Vec<MessageId> = (0..50).map(|i| ids[i * 10]).collect();
    assert_eq!(again, expected);
    // A payload over the leaves' limit refuses the whole batch; nothing of it is sent.
    let oversized = vec![
        Message::new("batched", "fine"),
        Message::new("batched", vec![0u8; 2 << 20]),
    ];
    match producer.send_batch(oversized).await {
        Err(ClientError::InvalidArgument(text)) => {
            assert!(text.contains("payload_bytes_max"), "{text}")
        }
        Err(other) => panic!("expected InvalidArgument, got {other}"),
        Ok(_) => panic!("expected InvalidArgument, got a handle"),
    }
    pop_none(&consumer, "batched").await;
    tree.shutdown().await;
}

/// Waits until the root holds exactly `count` pops waiting for messages (within `WAIT`).
async fn pops_waiting_at_the_root(tree: &LocalTree, count: u64) {
    let root = tree.node("root").expect("the tree has a root");
    eventually(
        WAIT,
        format!("{count} pops waiting at the root"),
        async || {
            let waiting = root.stats().await.unwrap().pending_pops;
            if waiting == count {
                Ok(())
            } else {
                Err(waiting)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_when_a_message_arrives_and_each_message_wakes_one_consumer() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(consumer(&tree).await);
    }
    let results = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (index, waiter) in waiters.iter().enumerate() {
        let waiter = waiter.clone();
        let results = results.clone();
        tasks.push(tokio::spawn(async move {
            let got = waiter
                .pop_with("wake", options(1, Duration::from_secs(15), None))
                .await
                .unwrap();
            results
                .lock()
                .unwrap()
                .push((index, got.len(), Instant::now()));
        }));
    }
    // All three wait: the root holds three pops.
    pops_waiting_at_the_root(&tree, 3).await;
    assert!(results.lock().unwrap().is_empty(), "all three wait");
    let pushed_at = Instant::now();
    push(&producer, Message::new("wake", "one")).await;
    // Exactly one waiter is answered, long before its wait ends; the others keep waiting.
    eventually(WAIT, "a waiter answered", async || {
        !results.lock().unwrap().is_empty()
    })
    .await;
    // The other two still wait at the root.
    pops_waiting_at_the_root(&tree, 2).await;
    {
        let results = results.lock().unwrap();
        assert_eq!(results.len(), 1, "one message wakes one consumer");
        assert_eq!(results[0].1, 1);
        assert!(results[0].2.duration_since(pushed_at) < Duration::from_secs(14));
    }
    push(&producer, Message::new("wake", "two")).await;
    push(&producer, Message::new("wake", "three")).await;
    for task in tasks {
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    assert_eq!(results.iter().map(|r| r.1).sum::<usize>(), 3);
    assert!(results.iter().all(|r| r.1 == 1), "{results:?}");
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_filter_never_returns_a_less_urgent_message() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = consumer(&tree).await;
    let mut handles = Vec::new();
    for i in 0..200u32 {
        let message = Message::new("mixed", format!("m{i}")).priority(i % 10);
        handles.push(producer.send(message).await.unwrap());
    }
    for handle in handles {
        handle.acked().await.unwrap();
    }
    let urgent_only = PopOptions {
        max: 7,
        wait: Duration::from_millis(300),
        max_priority: Some(2),
        ..PopOptions::default()
    };
    let mut urgent = 0;
    loop {
        let got = consumer
            .pop_with("mixed", urgent_only.clone())
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        assert!(got.iter().all(|d| d.priority <= 2), "{got:?}");
        urgent += got.len();
        let receipts: Vec<_> = got.iter().map(Delivery::receipt).collect();
        assert!(
            consumer
                .ack_many(&receipts)
                .await
                .unwrap()
                .iter()
                .all(Result::is_ok)
        );
    }
    assert_eq!(
        urgent, 60,
        "every message of priority 0..=2, and only those"
    );
    let rest = consumer
        .pop_with("mixed", options(1000, WAIT, None))
        .await
        .unwrap();
    assert!(rest.iter().all(|d| d.priority > 2));
    assert!(!rest.is_empty());
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_is_held_by_two_consumers_under_live_leases_at_once() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let total = 300u32;
    let mut handles = Vec::new();
    for i in 0..total {
        let message = Message::new("contended", format!("m{i}")).priority(i % 5);
        handles.push(producer.send(message).await.unwrap());
    }
    for handle in handles {
        handle.acked().await.unwrap();
    }
    let visibility = Duration::from_millis(150);
    // Every delivery seen, and the receipts whose ack succeeded.
    let deliveries = Arc::new(Mutex::new(Vec::<Delivery>::new()));
    let acked = Arc::new(Mutex::new(Vec::<MessageId>::new()));
    let mut tasks = Vec::new();
    for worker in 0..8u64 {
        let consumer = consumer(&tree).await;
        let (deliveries, acked) = (deliveries.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(worker * 7919 + 1);
            let mut idle = 0;
            while idle < 3 {
                let got = consumer
                    .pop_with(
                        "contended",
                        options(4, Duration::from_millis(400), Some(visibility)),
                    )
                    .await
                    .unwrap();
                if got.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                deliveries.lock().unwrap().extend(got.iter().cloned());
                for delivery in got {
                    // One delivery in four is held past its lease.
                    let hold = if rng.below(4) == 0 {
                        visibility + Duration::from_millis(60)
                    } else {
                        Duration::from_millis(rng.below(20))
                    };
                    tokio::time::sleep(hold).await;
                    match consumer.ack(&delivery.receipt()).await {
                        Ok(()) => acked.lock().unwrap().push(delivery.id),
                        Err(ClientError::Receipt(ReceiptError::Stale)) => {
                            // Refused only once the lease has ended (the leaf's clock is this
                            // machine's: read after the answer, it is past the check).
                            let now = SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap()
                                .as_micros() as u64;
                            assert!(
                                now >= delivery.lease_deadline.as_micros(),
                                "a live lease's ack is refused"
                            );
                        }
                        Err(ClientError::Receipt(ReceiptError::Settled)) => {}
                        Err(other) => panic!("ack failed: {other}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let deliveries = std::mem::take(&mut *deliveries.lock().unwrap());
    let mut by_id: HashMap<MessageId, Vec<&Delivery>> = HashMap::new();
    for delivery in deliveries.iter() {
        by_id.entry(delivery.id).or_default().push(delivery);
    }
    let mut redelivered = 0;
    for (id, list) in &mut by_id {
        list.sort_by_key(|d| d.attempt);
        for pair in list.windows(2) {
            redelivered += 1;
            assert!(pair[1].attempt > pair[0].attempt, "{id}: attempts increase");
            // Deadlines are the leaf's clock: a lease starts at deadline - visibility. The next
            // lease may start only once the previous one has ended.
            let visibility_us = visibility.as_micros() as u64;
            let next_start = pair[1].lease_deadline.as_micros() - visibility_us;
            assert!(
                next_start >= pair[0].lease_deadline.as_micros(),
                "{id}: leased to two consumers at once ({:?} and {:?})",
                pair[0],
                pair[1]
            );
        }
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let unique: HashSet<&MessageId> = acked.iter().collect();
    assert_eq!(unique.len(), acked.len(), "each message acked once");
    assert_eq!(acked.len(), total as usize, "every message acked");
    assert!(
        redelivered > 0,
        "the test held some leases past their timeout"
    );
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_delays_attempts_and_dedup_keys_survive_a_leaf_restart() {
    let data = tempfile::tempdir().unwrap();
    let mut tree = start_tree(Some(data.path())).await;
    // One producer on leaf-1 only, so every message is owned by the leaf restarted below.
    let leaf = tree.topology.node("leaf-1").unwrap().address.clone();
    let producer = Producer::connect(ProducerConfig::new(vec![leaf], tls(&tree)))
        .await
        .unwrap();
    let consumer = consumer(&tree).await;
    let dead = push(&producer, Message::new("flaky", "poison")).await;
    for _ in 0..3 {
        let delivery = pop_one(&consumer, "flaky", None).await;
        consumer
            .nack(&delivery.receipt(), Duration::ZERO, Some("bad input"))
            .await
            .unwrap();
    }
    let delayed = push(
        &producer,
        Message::new("later", "tomorrow").deliver_after(Duration::from_secs(3600)),
    )
    .await;
    let retried = push(&producer, Message::new("jobs", "retried")).await;
    let delivery = pop_one(&consumer, "jobs", None).await;
    consumer
        .nack(&delivery.receipt(), Duration::ZERO, None)
        .await
        .unwrap();
    let keyed = push(&producer, Message::new("dedup", "k").dedup_key("once")).await;
    let consumed = pop_one(&consumer, "dedup", None).await;
    consumer.ack(&consumed.receipt()).await.unwrap();

    tree.restart_node("leaf-1").await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let producer = Producer::connect(ProducerConfig::new(
        vec![tree.topology.node("leaf-1").unwrap().address.clone()],
        tls(&tree),
    ))
    .await
    .unwrap();
    let admin = admin(&tree).await;

    let listed = admin.dead_letters("flaky", 10).await.unwrap().value;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id, listed[0].attempts), (dead, 3));
    assert_eq!(listed[0].reason, "bad input");
    assert_eq!(
        listed[0].payload, "poison",
        "the dead letter's body is read back from the log"
    );
    let stats = admin.stats(Some("later")).await.unwrap().value;
    assert_eq!(stats.topic("later").unwrap().delayed, 1);
    pop_none(&consumer, "later").await;
    let again = pop_one(&consumer, "jobs", None).await;
    assert_eq!((again.id, again.attempt), (retried, 2), "attempts survive");
    // The key's message was consumed and deleted, but its window is still open.
    let repeat = push(&producer, Message::new("dedup", "k").dedup_key("once")).await;
    assert_eq!(repeat, keyed);
    pop_none(&consumer, "dedup").await;
    let _ = delayed;
    tree.shutdown().await;
}

/// A leaf that stops: pushes of a producer connected to every leaf keep being acknowledged by
/// the other leaves (no error surfaces), a new producer connects with the leaf down, and
/// pushes reach the leaf again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_go_around_a_leaf_that_stopped_and_back_to_it_once_it_returns() {
    let mut tree = start_tree(None).await;
    let producer = producer(&tree).await;
    for n in 0..8 {
        push(&producer, Message::new("jobs", format!("before {n}"))).await;
    }
    let gone = tree.topology.node("leaf-2").unwrap().leaf_id.unwrap();
    tree.stop_node("leaf-2").await;
    let mut handles = Vec::new();
    for n in 0..200 {
        let message = Message::new("jobs", format!("during {n}"));
        handles.push(producer.send(message).await.unwrap());
    }
    let mut ids = Vec::new();
    for handle in handles {
        ids.push(handle.acked().await.expect("acknowledged by another leaf"));
    }
    let batch = (0..100).map(|n| Message::new("jobs", format!("batch {n}")));
    ids.extend(
        producer
            .send_batch(batch)
            .await
            .unwrap()
            .acked()
            .await
            .unwrap(),
    );
    assert!(
        ids.iter().all(|id| id.leaf() != gone),
        "none on the stopped leaf"
    );

    let second = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls(&tree)))
        .await
        .expect("a producer connects while one leaf is down");
    push(&second, Message::new("jobs", "from the second")).await;

    tree.restart_node("leaf-2").await.unwrap();
    eventually(WAIT, "a push to the leaf once back", async || {
        push(&producer, Message::new("jobs", "after")).await.leaf() == gone
    })
    .await;
    tree.shutdown().await;
}

/// A producer whose only leaf stops: a push sent meanwhile waits for the leaf to come back
/// (up to `leaf_wait_max`) and is acknowledged by it; with a shorter `leaf_wait_max` than the
/// leaf is away, the push fails with the connect error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_waits_for_its_only_leaf_to_come_back_up_to_leaf_wait_max() {
    let mut tree = start_tree(None).await;
    let leaf = tree.topology.node("leaf-1").unwrap();
    let (address, id) = (leaf.address.clone(), leaf.leaf_id.unwrap());
    let config = ProducerConfig::new(vec![address.clone()], tls(&tree));
    let waiting = Producer::connect(config.clone()).await.unwrap();
    let impatient = Producer::connect(ProducerConfig {
        leaf_wait_max: Duration::from_millis(100),
        ..config
    })
    .await
    .unwrap();
    tree.stop_node("leaf-1").await;
    let sent = waiting
        .send(Message::new("jobs", "while away"))
        .await
        .unwrap();
    let refused = impatient
        .send(Message::new("jobs", "while away, impatient"))
        .await
        .unwrap();
    let refused = refused.acked().await;
    // A node that is closing refuses new connections as one at its handshake cap does.
    assert!(
        matches!(
            refused,
            Err(ClientError::Connect(_))
                | Err(ClientError::Rejected {
                    code: ErrorCode::Overloaded,
                    ..
                })
        ),
        "{refused:?}"
    );
    tree.restart_node("leaf-1").await.unwrap();
    let acked = sent
        .acked()
        .await
        .expect("acknowledged once the leaf is back");
    assert_eq!(acked.leaf(), id);
    tree.shutdown().await;
}

/// The root restarts under a consumer: the same `Consumer` connects again on its next
/// request, with no new `Consumer` made; an ack of a delivery popped before the restart
/// succeeds at the first call (the consumer tries it again while the root comes back and
/// its leaves connect to it), and it pops what waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_connects_again_by_itself_after_the_root_restarts() {
    let mut tree = start_tree(None).await;
    let producer = producer(&tree).await;
    let consumer = Consumer::connect(ConsumerConfig {
        // Enough tries (about 10 s of them) for the leaves to connect to the new root.
        tries_max: 14,
        ..root_config(&tree)
    })
    .await
    .unwrap();
    push(&producer, Message::new("jobs", "before")).await;
    let before = pop_one(&consumer, "jobs", None).await;
    assert_eq!(before.payload, "before");
    tree.restart_node("root").await.unwrap();
    consumer
        .ack(&before.receipt())
        .await
        .expect("the ack rides through the restart");
    push(&producer, Message::new("jobs", "after")).await;
    let delivery = eventually(WAIT, "the consumer to pop again", async || {
        match consumer.pop("jobs", 1, Duration::from_millis(500)).await {
            Ok(batch) => batch.into_iter().next(),
            // The root is starting, or its leaves have not offered yet.
            Err(ClientError::Connect(_) | ClientError::Disconnected(_)) => None,
            Err(other) => panic!("pop: {other}"),
        }
    })
    .await;
    assert_eq!(delivery.payload, "after");
    consumer.ack(&delivery.receipt()).await.unwrap();
    consumer.close();
    assert!(matches!(
        consumer.pop("jobs", 1, Duration::ZERO).await,
        Err(ClientError::Closed)
    ));
    tree.shutdown().await;
}

/// A consumer dialing a leaf that does not answer holds up none of its other settlements
/// with that leaf: while one ack waits for the dial (up to `connect_timeout_ms` per
/// address), the next goes through the root and is answered first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_does_not_wait_for_another_ack_s_dial_to_a_silent_leaf() {
    let tree = start_tree(None).await;
    let producer = producer(&tree).await;
    // Takes datagrams and never answers: a leaf whose host went quiet.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = root_config(&tree);
    for leaf in &mut config.leaves {
        leaf.addresses = vec![silent.local_addr().unwrap().to_string()];
    }
    let consumer = Consumer::connect(config).await.unwrap();
    for n in 0..8 {
        push(&producer, Message::new("dial", format!("m{n}"))).await;
    }
    let mut by_leaf: HashMap<_, Vec<Delivery>> = HashMap::new();
    for _ in 0..8 {
        let delivery = pop_one(&consumer, "dial", None).await;
        by_leaf
            .entry(delivery.id.leaf())
            .or_default()
            .push(delivery);
    }
    // Eight messages over four leaves: some leaf holds two.
    let pair = by_leaf
        .values()
        .find(|d| d.len() >= 2)
        .expect("a leaf with two");
    let (first, second) = (pair[0].receipt(), pair[1].receipt());
    let dialing = consumer.ack(&first);
    let through_root = consumer.ack(&second);
    tokio::pin!(dialing, through_root);
    tokio::select! {
        biased;
        done = &mut dialing => panic!("the ack that dials answered first: {done:?}"),
        done = &mut through_root => done.expect("the second ack, through the root"),
    }
    dialing
        .await
        .expect("the first ack, through the root once the dial failed");
    tree.shutdown().await;
}
