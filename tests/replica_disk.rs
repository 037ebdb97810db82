//! A replicated leaf whose one replica's disk refuses writes (its data directory, or only its
//! crest log's, on a small tmpfs, filled to the last byte while the group serves), as real
//! processes: the group goes on acknowledging pushes with the other two, the replica says why
//! and exits (for its service manager to start it again), and once it has room again and is
//! started it catches up; nothing acknowledged is lost.

use crest::sdk::{MessageId, Producer};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;

#[path = "common/acks.rs"]
mod acks;

#[path = "common/tmpfs.rs"]
mod tmpfs;

use acks::pop_and_ack_until;
use cluster::Cluster;
use tmpfs::{Tmpfs, fill};

const TOPOLOGY: &str = include_str!("common/replicated.toml");

const REPLICAS: [&str; 3] = ["leaf-1a", "leaf-1b", "leaf-1c"];

/// The replica whose disk fills.
const FULL: &str = "leaf-1c";

/// Pushes `count` messages tagged `tag`; each must be acknowledged (a push sent while the
/// group elects its next leader waits in the producer for one, `leaf_wait_max`).
async fn push(producer: &Producer, tag: &str, count: usize) -> Vec<MessageId> {
    let mut handles = Vec::new();
    for i in 0..count {
        let message = crest::sdk::Message::new("jobs", format!("{tag} {i}"));
        handles.push(producer.send(message).await.unwrap());
    }
    let mut ids = Vec::new();
    for handle in handles {
        ids.push(handle.acked().await.expect("acknowledged by the group"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_refuses_writes_leaves_the_group_serving_and_catches_up_with_room() {
    // The whole data directory: the Raft log and the crest log both fail.
    fills_and_recovers("replica-disk", TOPOLOGY, "", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_between_its_flush_and_its_apply_applies_the_rest_from_its_raft_log() {
    // Only the crest log's directory: the replica's Raft log takes and syncs every entry, its
    // apply of one fails, and it stops with entries in its Raft log it never applied. Started
    // again with room, it applies them from there; then it leads, or the leader is killed and
    // the group serves from the other two, this one among them.
    // Segments not preallocated: every write of the apply needs room (a preallocated segment
    // takes writes until it is full, and only the checkpoints' new segments would fail).
    let topology = TOPOLOGY.replacen("[settings]", "[settings]\nwal_preallocate = false", 1);
    fills_and_recovers(
        "replica-apply",
        &topology,
        crest::node::REPLICA_LOG_DIR,
        true,
    )
    .await;
}

/// Fills the disk under `under` (a directory below `FULL`'s data directory, or all of it)
/// while the group serves; once `FULL` stopped, makes room, starts it again and, with
/// `kill_leader`, kills the group's leader (SIGKILL) once `FULL` caught up, unless `FULL`
/// leads already. Every
/// acknowledged message is then delivered exactly once.
async fn fills_and_recovers(name: &str, topology: &str, under: &str, kill_leader: bool) {
    let mut cluster = Cluster::from_template(name, topology);
    // Room for the logs' first segments and checkpoints, then filled.
    let mut at = cluster.dir.join("data").join(FULL);
    if !under.is_empty() {
        at = at.join(under);
    }
    let disk = Tmpfs::mount_on(&at, "192m");
    for node in ["root", "agg-1", "leaf-1a", "leaf-1b", "leaf-1c"] {
        cluster.launch(node);
    }
    let producer = cluster.producer().await;
    let consumer = cluster.consumer().await;
    let mut acked: HashSet<MessageId> = push(&producer, "before", 100).await.into_iter().collect();
    let leader = cluster.leader_among(&REPLICAS).await;
    cluster.caught_up(FULL, &leader).await;

    let ballast = fill(disk.path());
    // The group goes on with two of its three replicas (after an election, if the full one
    // led): every push is acknowledged, several entries' worth.
    for round in 0..5 {
        acked.extend(push(&producer, &format!("full {round}"), 200).await);
    }
    // It says why, and exits for its service manager to start it again.
    let what = format!("{FULL} to exit once its disk filled");
    let status = eventually(Duration::from_secs(30), what, async || {
        cluster.exited(FULL).ok_or_else(|| cluster.plain_log(FULL))
    })
    .await;
    assert!(!status.success(), "{FULL} exited with {status}");
    let log = cluster.plain_log(FULL);
    assert!(
        log.contains("the replica stopped") && log.contains("No space left on device"),
        "{FULL}'s log: {}",
        &log[log.len().saturating_sub(3000)..]
    );

    // Room again; restarted, the replica catches up with the group's leader.
    std::fs::remove_file(ballast).unwrap();
    cluster.launch(FULL);
    acked.extend(push(&producer, "after", 100).await);
    let leader = cluster.leader_among(&REPLICAS).await;
    if leader != FULL {
        cluster.caught_up(FULL, &leader).await;
    }
    if kill_leader && leader != FULL {
        cluster.kill(&leader);
        acked.extend(push(&producer, "leader killed", 100).await);
    }

    let mut seen = HashSet::new();
    pop_and_ack_until(&consumer, &mut seen, 64, |seen| acked.is_subset(seen)).await;
    for replica in REPLICAS {
        assert!(
            !cluster.plain_log(replica).contains("panicked"),
            "{replica} panicked"
        );
    }
}
