//! Reprioritize and aging end to end: one process per node over real QUIC, configured and
//! driven through the `crest` binary, and a leaf killed with SIGKILL and started again keeps
//! every priority change.

use crest::sdk::{Admin, ConsumerConfig, Message, MessageId, PopOptions, ProducerConfig};
use crest_testkit::eventually;
use std::collections::BTreeMap;
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;

use cluster::{Cluster, retry};

/// Ready messages of "jobs" by priority, as the tree's stats say.
async fn ready(admin: &Admin) -> BTreeMap<u32, u64> {
    let stats = admin.stats(Some("jobs")).await.unwrap().value;
    stats
        .topic("jobs")
        .map(|t| t.ready.iter().copied().collect())
        .unwrap_or_default()
}

/// Waits up to 20 s for the ready counts to be `want`.
async fn ready_until(admin: &Admin, want: &[(u32, u64)]) {
    let want: BTreeMap<u32, u64> = want.iter().copied().collect();
    let what = format!("ready by priority {want:?}");
    eventually(Duration::from_secs(20), what, async || {
        let got = ready(admin).await;
        if got == want { Ok(()) } else { Err(got) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprioritized_and_an_aged_message_keep_their_priorities_across_a_leaf_kill() {
    let mut cluster = Cluster::start_with("escalation", "aging_check_ms = 50\n");
    let args = [
        "topic",
        "set",
        "--topic",
        "jobs",
        "--aging",
        "4=1s",
        "--aging-floor",
        "3",
    ];
    cluster.crest_until(&args, "configured at 4 leaves").await;
    let (ok, text) = cluster.crest(&["topic", "list"]).await;
    assert!(ok && text.contains("aging=4=1s aging_floor=3"), "{text}");
    let leaf = cluster.topology.node("leaf-1").unwrap().address.clone();
    let tls = cluster.tls();
    let producer = retry(|| {
        crest::sdk::Producer::connect(ProducerConfig::new(vec![leaf.clone()], tls.clone()))
    })
    .await;
    let mut ids: Vec<MessageId> = Vec::new();
    let pushes = [("earlier", 3), ("background", 4), ("normal", 2), ("low", 3)];
    for (payload, priority) in pushes {
        let handle = producer
            .send(Message::new("jobs", payload).priority(priority))
            .await
            .unwrap();
        ids.push(handle.acked().await.unwrap());
    }
    let [earlier, background, normal, low] = [ids[0], ids[1], ids[2], ids[3]];
    let config = ConsumerConfig::from_topology(&cluster.topology, cluster.tls());
    let admin = retry(|| Admin::connect(config.clone())).await;

    // The escalation through the binary; aging moves the background one to 3 and no further.
    let low_id = low.to_string();
    let (ok, text) = cluster
        .crest(&[
            "reprioritize",
            &low_id,
            "--topic",
            "jobs",
            "--priority",
            "0",
            "--reason",
            "vip",
        ])
        .await;
    assert!(ok, "crest reprioritize: {text}");
    assert!(text.contains("priority 0 (pushed with 3)"), "{text}");
    ready_until(&admin, &[(0, 1), (2, 1), (3, 2)]).await;
    let normal_id = normal.to_string();
    let args = [
        "set-metadata",
        &normal_id,
        "--topic",
        "jobs",
        "--metadata",
        "owner=team-b",
    ];
    let (ok, text) = cluster.crest(&args).await;
    assert!(
        ok && text.contains("1 metadata pairs set"),
        "crest set-metadata: {text}"
    );

    // A later push is acknowledged once durable, and the log is written in order: the
    // priority changes before it are on disk when it is acknowledged.
    let fence = producer
        .send(Message::new("jobs", "fence").priority(9))
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    cluster.kill("leaf-1");
    cluster.launch("leaf-1");
    let admin = retry(|| Admin::connect(config.clone())).await;
    ready_until(&admin, &[(0, 1), (2, 1), (3, 2), (9, 1)]).await;

    let consumer = cluster.consumer().await;
    let mut popped = Vec::new();
    eventually(Duration::from_secs(20), "5 popped", async || {
        let options = PopOptions {
            max: 1,
            wait: Duration::from_millis(500),
            visibility: Some(Duration::from_secs(60)),
            ..PopOptions::default()
        };
        popped.extend(consumer.pop_with("jobs", options).await.unwrap());
        if popped.len() < 5 {
            Err(popped.len())
        } else {
            Ok(())
        }
    })
    .await;
    let order: Vec<(MessageId, u32)> = popped.iter().map(|d| (d.id, d.priority)).collect();
    // The aged one goes ahead of the message pushed at 3 before it, after the restart too.
    assert_eq!(
        order,
        vec![
            (low, 0),
            (normal, 2),
            (background, 3),
            (earlier, 3),
            (fence, 9)
        ]
    );
    let escalated = popped[0].escalation.as_ref().expect("escalation kept");
    assert_eq!(
        (
            escalated.original_priority,
            escalated.reason.as_str(),
            escalated.aged
        ),
        (3, "vip", false)
    );
    let aged = popped[2].escalation.as_ref().expect("promotion kept");
    assert_eq!((aged.original_priority, aged.aged), (4, true));
    assert!(popped[1].escalation.is_none());
    let owner = vec![("owner".to_string(), "team-b".to_string())];
    assert_eq!(
        popped[1].metadata, owner,
        "the metadata set outlives the kill"
    );

    // Leased now: refused with the typed error, named by the binary.
    let (ok, text) = cluster
        .crest(&[
            "reprioritize",
            &low_id,
            "--topic",
            "jobs",
            "--priority",
            "1",
        ])
        .await;
    assert!(!ok && text.contains("leased"), "{text}");
    match admin.reprioritize("jobs", normal, 1, "").await {
        Err(crest::sdk::ClientError::NotWaiting(crest::sdk::NotWaiting::Leased)) => {}
        other => panic!("expected NotWaiting::Leased, got {other:?}"),
    }
}
