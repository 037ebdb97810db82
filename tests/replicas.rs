//! A replicated leaf as real processes: three `crest launch` replicas of one leaf under an
//! aggregator and a root, each replica with its own data directory, QUIC between them;
//! leaders killed with SIGKILL.

use crest::sdk::{Consumer, Delivery, MessageId, Producer};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;

#[path = "common/browser.rs"]
mod browser;

#[path = "common/acks.rs"]
mod acks;

use acks::{ack_until_applied, pop_and_ack_until};

use cluster::Cluster;

/// A root and leaf-1 as a group of three replicas, with the placeholders of
/// [`Cluster::from_template`].
const TOPOLOGY: &str = include_str!("common/replicated.toml");

const REPLICAS: [&str; 3] = ["leaf-1a", "leaf-1b", "leaf-1c"];

/// Pushes `count` messages; each must be acknowledged: a push sent while the group elects
/// its next leader waits in the producer for a replica that takes it (`leaf_wait_max`).
async fn push(producer: &Producer, count: usize) -> Vec<MessageId> {
    let mut handles = Vec::new();
    for i in 0..count {
        let message = crest::sdk::Message::new("jobs", format!("m{i}")).priority((i % 5) as u32);
        handles.push(producer.send(message).await.unwrap());
    }
    let mut ids = Vec::new();
    for handle in handles {
        ids.push(
            handle
                .acked()
                .await
                .expect("acknowledged by the group's leader"),
        );
    }
    ids
}

/// Pushes one message per key of `keys` with that dedup key, in one batch; answers their ids.
async fn push_keyed(producer: &Producer, keys: std::ops::Range<usize>) -> Vec<MessageId> {
    let messages = keys
        .map(|k| crest::sdk::Message::new("jobs", format!("k{k}")).dedup_key(format!("key-{k}")));
    let batch = producer.send_batch(messages).await.unwrap();
    batch
        .acked()
        .await
        .expect("acknowledged by the group's leader")
}

/// Pops and acks until `count` distinct messages were seen in all; fails on a second delivery
/// of an acknowledged message, or after 60 s.
async fn take(consumer: &Consumer, seen: &mut HashSet<MessageId>, count: usize) {
    take_until(consumer, seen, |seen| seen.len() >= count).await
}

async fn take_until(
    consumer: &Consumer,
    seen: &mut HashSet<MessageId>,
    done: impl Fn(&HashSet<MessageId>) -> bool,
) {
    pop_and_ack_until(consumer, seen, 32, done).await
}

async fn current_leader(cluster: &Cluster) -> String {
    cluster.leader_among(&REPLICAS).await
}

/// Waits (up to 30 s) until `crest status` names `leader` as group leaf-1's leader, every
/// replica of `up` as up with its lag known, and `down` as down; answers the group's entry.
async fn status_shows(cluster: &Cluster, leader: &str, down: Option<&str>) -> serde_json::Value {
    let what = format!("crest status to show {leader} leading with {down:?} down");
    eventually(Duration::from_secs(30), what, async || {
        let status = cluster::crest_status(&cluster.topology_path).await;
        let group = status["groups"][0].clone();
        let replica = |name: &str| {
            group["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["node"] == name)
                .cloned()
                .unwrap()
        };
        let fits = group["group"] == "leaf-1"
            && group["leader"] == leader
            && status["root_in_charge"] == "root"
            && REPLICAS.iter().all(|name| {
                let r = replica(name);
                if Some(*name) == down {
                    r["up"] == false
                } else if *name == leader {
                    r["up"] == true && r["state"] == "leader"
                } else {
                    r["up"] == true && r["state"] == "follower" && r["lag_entries"].is_u64()
                }
            });
        if fits {
            Ok(group)
        } else {
            Err(format!("{status:#}"))
        }
    })
    .await
}

/// Waits (up to 30 s) until the root's report shows leaf-1 led by `leader` with both
/// followers' lag, then renders the root's dashboard in headless Chromium: its tree shows the
/// group.
async fn dashboard_shows(cluster: &Cluster, leader: &str) {
    let what = format!("the root's report to show {leader} leading leaf-1");
    let term = eventually(Duration::from_secs(30), what, async || {
        let (_, body) = cluster.http_get("root", "/stats").await;
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let leaf = stats["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == "leaf-1")
            .cloned()
            .unwrap_or_default();
        let group = &leaf["group"];
        if group["leader"] == leader && group["followers"].as_array().is_some_and(|f| f.len() == 2)
        {
            Ok(group["term"].as_u64().unwrap())
        } else {
            Err(format!("{leaf:#}"))
        }
    })
    .await;
    let browser = browser::chromium().expect(
        "headless Chromium is needed (Debian: apt-get install chromium); .ci/run installs it",
    );
    let profile = tempfile::tempdir().unwrap();
    let root = cluster.topology.node("root").unwrap().http.unwrap();
    let mut dump = browser::headless(&browser, profile.path());
    dump.arg("--dump-dom").arg(format!("http://{root}/"));
    let output = tokio::task::spawn_blocking(move || dump.output())
        .await
        .unwrap()
        .unwrap();
    let dom = String::from_utf8_lossy(&output.stdout);
    let shown = format!("replicas: {leader} leads (term {term})");
    assert!(
        dom.contains(&shown),
        "the dashboard does not show {shown:?}:\n{dom}"
    );
}

/// GETs `path` of `node`'s HTTP address: its status code and body.
fn assert_no_panic(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let log = std::fs::read_to_string(&path).unwrap();
            assert!(
                !log.contains("panicked"),
                "{} shows a panic",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replicated_leaf_s_leader_loses_no_acknowledged_message() {
    // Goal: the leader of a three-replica leaf killed with SIGKILL, twice, and brought back
    // each time with its data directory deleted: every acknowledged push is delivered once,
    // pops resume under the new leader, acks of the old leader's deliveries apply, and the
    // wiped replica catches up from the others.
    let mut cluster = Cluster::from_template("replicas", TOPOLOGY);
    for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
        cluster.launch(node);
    }
    let producer = cluster.producer().await;
    let consumer = cluster.consumer().await;
    let mut acked: HashSet<MessageId> = push(&producer, 300).await.into_iter().collect();
    // Keyed messages go to the group whichever replica leads; each leader knows the keys.
    let keyed = push_keyed(&producer, 0..40).await;
    acked.extend(keyed.iter().copied());
    // Every replica serves HTTP: the leader its leaf's metrics and its followers' lag, a
    // follower where it stands; `crest status` gathers them.
    let first = current_leader(&cluster).await;
    status_shows(&cluster, &first, None).await;
    dashboard_shows(&cluster, &first).await;
    let follower = REPLICAS.iter().find(|r| **r != first).unwrap();
    let (code, metrics) = cluster.http_get(follower, "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("crest_replica_serving{node=\""),
        "{metrics}"
    );
    let (code, _) = cluster.http_get(follower, "/stats").await;
    assert_eq!(code, 503, "a follower serves no leaf stats");
    let (_, metrics) = cluster.http_get(&first, "/metrics").await;
    for series in ["crest_replica_follower_lag_entries{", "crest_pushed_total{"] {
        assert!(
            metrics.contains(series),
            "the leader's metrics lack {series}: {metrics}"
        );
    }
    let mut seen = HashSet::new();
    take(&consumer, &mut seen, 50).await;
    for round in 0..2 {
        let leader = current_leader(&cluster).await;
        // Delivered by this leader, acknowledged after it is gone.
        let held = consumer
            .pop("jobs", 10, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!held.is_empty(), "round {round}: nothing to pop");
        cluster.kill(&leader);
        let killed = tokio::time::Instant::now();
        let before = seen.len();
        // Pushes sent at once, while the group has no leader, are acknowledged by the next.
        let (pushed, ()) = tokio::join!(push(&producer, 100), async {
            take(&consumer, &mut seen, before + 1).await;
            eprintln!(
                "round {round}: {leader} killed; the next pop came {:?} later",
                killed.elapsed()
            );
        });
        acked.extend(pushed);
        ack_until_applied(&consumer, held.iter().map(Delivery::receipt).collect()).await;
        for delivery in &held {
            assert!(seen.insert(delivery.id), "{} delivered twice", delivery.id);
        }
        let successor = current_leader(&cluster).await;
        assert_ne!(successor, leader);
        status_shows(&cluster, &successor, Some(&leader)).await;
        std::fs::remove_dir_all(cluster.dir.join("data").join(&leader)).unwrap();
        cluster.launch(&leader);
        cluster.caught_up(&leader, &successor).await;
        assert_eq!(
            push_keyed(&producer, 0..40).await,
            keyed,
            "round {round}: the keys pushed again under {successor} answer the first ids"
        );
    }
    // A leader stopped as a service manager stops it exits, and the others serve on.
    let leader = current_leader(&cluster).await;
    assert!(
        cluster.terminate(&leader, Duration::from_secs(20)),
        "{leader} did not exit within 20 s of SIGTERM"
    );
    acked.extend(push(&producer, 50).await);
    take_until(&consumer, &mut seen, |seen| acked.is_subset(seen)).await;
    let lost: Vec<&MessageId> = acked.difference(&seen).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged messages lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert_no_panic(&cluster.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_killed_under_a_stream_of_pipelined_pushes_lose_nothing_acknowledged() {
    // Goal: SIGKILL lands while entries are in flight, not between quiet rounds: a producer
    // streams batches (several entries out at once, followers flushing entries they have not
    // applied yet) while a follower, then the leader, is killed and launched again. Every
    // acknowledged push is delivered once; the killed follower catches up.
    let mut cluster = Cluster::from_template("replicas-stream", TOPOLOGY);
    for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
        cluster.launch(node);
    }
    let producer = std::sync::Arc::new(cluster.producer().await);
    let consumer = cluster.consumer().await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
    let streaming = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let stream = tokio::spawn({
        let (producer, acked, streaming) = (producer.clone(), acked.clone(), streaming.clone());
        async move {
            let mut batch = 0;
            while streaming.load(std::sync::atomic::Ordering::SeqCst) {
                // Eight batches out at once: entries pipelined to the followers.
                let mut out = Vec::new();
                for _ in 0..8 {
                    let messages =
                        (0..200).map(|i| crest::sdk::Message::new("jobs", format!("s{batch} {i}")));
                    out.push(producer.send_batch(messages).await.unwrap());
                    batch += 1;
                }
                for handle in out {
                    let ids = handle.acked().await.expect("acknowledged by the group");
                    acked.lock().unwrap().extend(ids);
                }
            }
        }
    });
    let acked_count = || acked.lock().unwrap().len();
    let wait_for_more = |than: usize| {
        let acked = acked.clone();
        async move {
            eventually(Duration::from_secs(30), "3,000 more pushes", async || {
                acked.lock().unwrap().len() >= than + 3000
            })
            .await
        }
    };
    wait_for_more(0).await;
    let leader = current_leader(&cluster).await;
    let follower = REPLICAS.iter().find(|r| **r != leader).unwrap().to_string();
    cluster.kill(&follower);
    wait_for_more(acked_count()).await;
    cluster.launch(&follower);
    cluster.kill(&leader);
    wait_for_more(acked_count()).await;
    cluster.launch(&leader);
    let successor = current_leader(&cluster).await;
    assert_ne!(successor, leader);
    wait_for_more(acked_count()).await;
    streaming.store(false, std::sync::atomic::Ordering::SeqCst);
    stream.await.unwrap();
    cluster.caught_up(&follower, &successor).await;
    cluster.caught_up(&leader, &successor).await;
    let acked = acked.lock().unwrap().clone();
    let mut seen = HashSet::new();
    take_until(&consumer, &mut seen, |seen| acked.is_subset(seen)).await;
    assert_no_panic(&cluster.dir);
}

/// Dials agg-1, the group's parent, as node `cert` (its certificate and key from `crest
/// certs`), says `Hello` as the leader of group `leaf-1` with `claim`, and answers agg-1's
/// refusal, or `Ok` if
/// it was welcomed.
async fn hello_as_leader(
    cluster: &Cluster,
    cert: &str,
    claim: Option<crest::core::wire::ReplicaClaim>,
) -> Result<(), String> {
    use crest::core::wire::{Hello, PROTOCOL_VERSION, PeerKind, Role, Wire};
    use crest::transport::stream::{FrameReader, ReadEvent, open_streams};
    let certs = cluster.dir.join("certs");
    let read = |file: String| std::fs::read_to_string(certs.join(file)).unwrap();
    let identity = crest::transport::tls::CertifiedKey {
        cert_pem: read(format!("{cert}.pem")),
        key_pem: read(format!("{cert}.key")),
    };
    let settings = crest::core::config::Settings::default();
    let config =
        crest::transport::link_client_config(&read("ca.pem".into()), &identity, &settings).unwrap();
    let parent: std::net::SocketAddr = cluster
        .topology
        .node("agg-1")
        .unwrap()
        .address
        .parse()
        .unwrap();
    let endpoint = crest::transport::client_endpoint(parent, config, &settings).unwrap();
    let connection = crest::transport::connect(&endpoint, parent, "agg-1")
        .await
        .unwrap();
    let streams = open_streams(&connection).await.unwrap();
    let (mut send, recv) = streams.control;
    let hello = Wire::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        peer: PeerKind::Node {
            name: "leaf-1".into(),
            role: Role::Leaf,
            leaves: vec![crest::sdk::LeafId(1)],
            replica: claim,
        },
    });
    let mut frame = Vec::new();
    crest::core::frame::encode_frame(&hello, settings.frame_bytes_max, &mut frame).unwrap();
    send.write_all(&frame).await.unwrap();
    let mut control = FrameReader::new(recv, settings.frame_bytes_max);
    let answer = tokio::time::timeout(Duration::from_secs(10), control.next())
        .await
        .unwrap();
    match answer {
        Ok(Some(ReadEvent::Frame(Wire::Welcome(_)))) => Ok(()),
        Ok(Some(ReadEvent::Frame(Wire::Error(error)))) => {
            Err(format!("{}: {}", error.code, error.message))
        }
        other => Err(connection
            .close_reason()
            .map_or_else(|| format!("{other:?}"), |reason| reason.to_string())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_takes_a_replicated_leaf_only_from_a_member_in_its_newest_term() {
    // Goal: a parent welcomes a group's leader only with a certificate of a member of that
    // group, and never with a term older than the newest it welcomed (a deposed leader cannot
    // take the group's place back); the group's real session is undisturbed.
    let mut cluster = Cluster::from_template("replica-claims", TOPOLOGY);
    for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
        cluster.launch(node);
    }
    let producer = cluster.producer().await;
    let consumer = cluster.consumer().await;
    let leader = current_leader(&cluster).await;
    let term = cluster.led_in(&leader).unwrap();
    // A message served through the tree: the parent has welcomed the leader in its term, so
    // an older term is one it must refuse (before, on a loaded machine, the probe below could
    // come first and find no term to compare with).
    let first: HashSet<MessageId> = push(&producer, 1).await.into_iter().collect();
    let mut seen = HashSet::new();
    take_until(&consumer, &mut seen, |seen| first.is_subset(seen)).await;
    let follower = REPLICAS.iter().find(|name| **name != leader).unwrap();
    let claim = |name: &str, term: u64| {
        Some(crest::core::wire::ReplicaClaim {
            name: name.into(),
            term,
        })
    };

    let text = hello_as_leader(&cluster, follower, None).await.unwrap_err();
    assert!(
        text.contains("Forbidden") && text.contains("must say which replica"),
        "{text}"
    );
    let text = hello_as_leader(&cluster, "root", claim("root", term + 1))
        .await
        .unwrap_err();
    assert!(
        text.contains("Forbidden") && text.contains("no replica \"root\""),
        "{text}"
    );
    let other = REPLICAS.iter().find(|name| **name != *follower).unwrap();
    let text = hello_as_leader(&cluster, other, claim(follower, term + 1))
        .await
        .unwrap_err();
    assert!(
        text.contains("Unauthenticated") && text.contains("not made out to"),
        "{text}"
    );
    let text = hello_as_leader(&cluster, follower, claim(follower, term - 1))
        .await
        .unwrap_err();
    assert!(
        text.contains("Forbidden") && text.contains("deposed"),
        "{text}"
    );

    // The group's leader still serves through its parent.
    let pushed: HashSet<MessageId> = push(&producer, 20).await.into_iter().collect();
    take_until(&consumer, &mut seen, |seen| pushed.is_subset(seen)).await;
    assert_no_panic(&cluster.dir);
}

/// The destination connection ids of the QUIC Initial packets that arrive on `socket` within
/// `within`: each dial of a client opens with a fresh one (its retransmissions repeat it).
fn initial_connection_ids(socket: &std::net::UdpSocket, within: Duration) -> HashSet<Vec<u8>> {
    let deadline = std::time::Instant::now() + within;
    let mut ids = HashSet::new();
    let mut packet = [0u8; 2048];
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok(length) = socket.recv(&mut packet) else {
            break;
        };
        // A long header: the form bit, a 4-byte version, then the id's length and the id.
        if length > 6 && packet[0] & 0x80 != 0 {
            let id_length = usize::from(packet[5]);
            if let Some(id) = packet.get(6..6 + id_length) {
                ids.insert(id.to_vec());
            }
        }
        if ids.len() >= 2 {
            break;
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_started_before_its_replicated_leaf_has_a_leader_waits_for_one() {
    // Goal: `Producer::connect` while no replica of a group leads (one of three running: it
    // refuses clients as a follower; the others not started) does not fail; it dials again
    // and connects once a second replica starts and a leader is elected.
    let mut cluster = Cluster::from_template("replica-first-leader", TOPOLOGY);
    for node in ["root", "agg-1", "leaf-1a"] {
        cluster.launch(node);
    }
    let config = crest::sdk::ProducerConfig::from_topology(&cluster.topology, cluster.tls());
    let connecting = tokio::spawn(Producer::connect(config));
    // leaf-1b's socket is held here, unanswered: two distinct dials arriving on it mean the
    // producer's first round found no leader and it is trying again.
    let silent = cluster.sockets["leaf-1b"].0.try_clone().unwrap();
    let dials = tokio::task::spawn_blocking(move || {
        initial_connection_ids(&silent, Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert!(
        dials.len() >= 2,
        "the producer dialed leaf-1b {} times",
        dials.len()
    );
    assert!(
        !connecting.is_finished(),
        "connect gave up without a leader"
    );
    cluster.launch("leaf-1b");
    let producer = tokio::time::timeout(Duration::from_secs(30), connecting)
        .await
        .expect("connected within 30 s of a second replica")
        .unwrap()
        .expect("connected to the leader");
    assert_eq!(push(&producer, 10).await.len(), 10);
}

/// The next delivery of `topic`, within 60 s.
async fn pop_one(consumer: &Consumer, topic: &str) -> Delivery {
    eventually(
        Duration::from_secs(60),
        format!("a delivery of {topic}"),
        async || {
            let got = consumer
                .pop(topic, 1, Duration::from_secs(1))
                .await
                .unwrap_or_default();
            got.into_iter().next()
        },
    )
    .await
}

/// Nacks the next delivery of `topic`; answers its id. A nack lost while a group elects its
/// leader fails the delivery all the same, when its lease ends.
async fn fail_one(consumer: &Consumer, topic: &str) -> MessageId {
    let delivery = pop_one(consumer, topic).await;
    let _ = consumer
        .nack(&delivery.receipt(), Duration::ZERO, Some("boom"))
        .await;
    delivery.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_configuration_outlives_the_leader_that_logged_it() {
    // Goal: a configuration set at run time is part of the group's log: after its leader is
    // killed with SIGKILL, the next leader still routes a message out of attempts to the
    // dead-letter topic, and the listing still finds it.
    let mut cluster = Cluster::from_template("replica-configs", TOPOLOGY);
    for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
        cluster.launch(node);
    }
    let producer = cluster.producer().await;
    let consumer = cluster.consumer().await;
    let config = crest::sdk::ConsumerConfig::from_topology(&cluster.topology, cluster.tls());
    let admin = crest::sdk::Admin::connect(config).await.unwrap();
    let routing = crest::sdk::TopicConfig {
        settings: crest::sdk::TopicSettings {
            max_attempts: Some(1),
            dead_letter_topic: Some("jobs-dlq".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = admin.configure("jobs", routing).await.unwrap();
    assert_eq!((answer.value, answer.unreachable.len()), (1, 0));
    let first = push(&producer, 1).await[0];
    assert_eq!(fail_one(&consumer, "jobs").await, first);
    let moved = pop_one(&consumer, "jobs-dlq").await;
    assert_eq!(
        (moved.id, moved.attempt),
        (first, 1),
        "moved, attempts reset"
    );
    ack_until_applied(&consumer, vec![moved.receipt()]).await;

    let leader = current_leader(&cluster).await;
    cluster.kill(&leader);
    let second = push(&producer, 1).await[0];
    assert_eq!(fail_one(&consumer, "jobs").await, second);
    let moved = pop_one(&consumer, "jobs-dlq").await;
    assert_eq!(
        moved.id, second,
        "the next leader applied the configuration"
    );
    ack_until_applied(&consumer, vec![moved.receipt()]).await;
    let listed = admin.configs("jobs").await.unwrap().value;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].1.settings.dead_letter_topic.as_deref(),
        Some("jobs-dlq")
    );
}
