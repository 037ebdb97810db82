//! Replica groups of three on loopback: real QUIC with the cluster's mutual TLS, real Raft
//! logs on disk. Each replica's journal records what it was given, in order, so the tests
//! compare what every replica applied.

use bytes::Bytes;
use crest_core::config::Settings;
use crest_replica::{Applied, Batch, Journal, Position, ReplicaId, WriteError};
use crest_testkit::eventually;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;

use cluster::WAIT;

/// What a replica applied: the batches in order, the position after the last, and how many
/// snapshots it restored.
#[derive(Default)]
struct Applies {
    batches: Vec<Bytes>,
    position: Option<Position>,
    restores: usize,
}

/// A journal that keeps what it applies in memory, shared with the test.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Applies>>);

impl Recorder {
    fn batches(&self) -> Vec<Bytes> {
        self.0.lock().unwrap().batches.clone()
    }

    fn restores(&self) -> usize {
        self.0.lock().unwrap().restores
    }
}

impl Journal for Recorder {
    fn position(&mut self) -> std::io::Result<Position> {
        Ok(self.0.lock().unwrap().position.clone().unwrap_or_default())
    }

    fn apply(&mut self, entries: Vec<(Position, Option<Batch>)>) -> std::io::Result<Vec<Applied>> {
        let mut applies = self.0.lock().unwrap();
        let mut answers = Vec::new();
        for (position, batch) in entries {
            if let Some(batch) = batch {
                applies.batches.push(batch.0);
            }
            applies.position = Some(position);
            let count = applies.batches.len() as u64;
            answers.push(Applied(Bytes::copy_from_slice(&count.to_le_bytes())));
        }
        Ok(answers)
    }

    fn snapshot(&mut self, into: &mut std::fs::File) -> std::io::Result<Position> {
        let applies = self.0.lock().unwrap();
        rmp_serde::encode::write(into, &applies.batches).map_err(std::io::Error::other)?;
        Ok(applies.position.clone().unwrap_or_default())
    }

    fn restore(&mut self, from: &mut std::fs::File, position: &Position) -> std::io::Result<()> {
        let batches: Vec<Bytes> = rmp_serde::decode::from_read(from)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let mut applies = self.0.lock().unwrap();
        applies.batches = batches;
        applies.position = Some(position.clone());
        applies.restores += 1;
        Ok(())
    }
}

type Cluster = cluster::Cluster<Recorder, Recorder>;

/// Three replicas whose journals record what they apply.
async fn recording(settings: Settings) -> Cluster {
    let make: cluster::Factory<Recorder, Recorder> = Box::new(|_, _| {
        let journal = Recorder::default();
        (journal.clone(), journal)
    });
    Cluster::start(settings, make).await
}

async fn write(cluster: &Cluster, id: ReplicaId, text: &str) -> Result<Applied, WriteError> {
    cluster.running[&id]
        .write(Batch(Bytes::copy_from_slice(text.as_bytes())))
        .await
        .map(|(_, applied)| applied)
}

/// Waits until replica `id` applied exactly `expected`.
async fn applied(cluster: &Cluster, id: ReplicaId, expected: &[Bytes]) {
    let what = format!(
        "replica {id} to apply the {} batches expected",
        expected.len()
    );
    eventually(WAIT, what, async || {
        let batches = cluster.journals[&id].batches();
        if batches == expected {
            Ok(())
        } else {
            Err(format!("{} applied", batches.len()))
        }
    })
    .await
}

fn texts(range: std::ops::Range<u32>) -> Vec<Bytes> {
    range
        .map(|i| Bytes::from(format!("batch {i}").into_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_commits_through_its_leader_and_every_replica_applies_the_same_batches() {
    // Goal: writes to the leader are committed and applied in the same order by all three
    // replicas; a follower refuses writes, naming the leader.
    let cluster = recording(Settings::default()).await;
    let leader = cluster.leader().await;
    let expected = texts(0..100);
    for (i, text) in expected.iter().enumerate() {
        let applied = write(&cluster, leader, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
        assert_eq!(applied.0.as_ref(), (i as u64 + 1).to_le_bytes());
    }
    for id in 1..=3 {
        applied(&cluster, id, &expected).await;
    }
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    assert_eq!(
        write(&cluster, follower, "refused").await,
        Err(WriteError::NotLeader {
            leader: Some(leader)
        })
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_stops_another_takes_over_with_every_committed_write() {
    // Goal: the leader stopped, the two others elect one of themselves in a later term; it
    // holds every write the old leader committed and commits new ones; the old leader, back
    // on its log, follows and catches up.
    let mut cluster = recording(Settings::default()).await;
    let first = cluster.leader().await;
    let term = cluster.running[&first].term();
    let before = texts(0..50);
    for text in &before {
        write(&cluster, first, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
    }
    cluster.stop(first).await;
    let second = cluster.leader().await;
    assert_ne!(second, first);
    assert!(cluster.running[&second].term() > term);
    let after = texts(50..100);
    for text in &after {
        write(&cluster, second, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
    }
    let all: Vec<Bytes> = before.iter().chain(&after).cloned().collect();
    applied(&cluster, second, &all).await;
    cluster.run(first, None).await;
    assert_eq!(cluster.leader().await, second, "the old leader follows");
    applied(&cluster, first, &all).await;
    cluster.shutdown().await;
}

/// `count` batches of `bytes` bytes each, every one different, from `first` on.
fn bodies(first: u32, count: u32, bytes: usize) -> Vec<Bytes> {
    (first..first + count)
        .map(|i| {
            let mut body = vec![0u8; bytes];
            for (at, byte) in body.iter_mut().enumerate() {
                *byte = (i as usize * 31 + at * 7) as u8;
            }
            body[..4].copy_from_slice(&i.to_le_bytes());
            Bytes::from(body)
        })
        .collect()
}

/// Writes `batches` to the leader eight at a time (so that entries queue behind the
/// AppendEntries out to each follower); answers them in the order the group applied them.
async fn write_eight_at_a_time(cluster: &Cluster, leader: ReplicaId, batches: &[Bytes]) {
    for eight in batches.chunks(8) {
        let writes = eight
            .iter()
            .map(|body| cluster.running[&leader].write(Batch(body.clone())));
        for answer in futures_util::future::join_all(writes).await {
            answer.unwrap();
        }
    }
}

/// Waits until replica `id` applied the same batches as `expected`, in any order; answers
/// them in its order.
async fn applied_all(cluster: &Cluster, id: ReplicaId, expected: &[Bytes]) -> Vec<Bytes> {
    let mut want = expected.to_vec();
    want.sort();
    let what = format!(
        "replica {id} to apply the {} batches expected",
        expected.len()
    );
    eventually(WAIT, what, async || {
        let batches = cluster.journals[&id].batches();
        let mut sorted = batches.clone();
        sorted.sort();
        if sorted == want {
            return Ok(batches);
        }
        let among = batches
            .iter()
            .filter(|b| want.binary_search(b).is_ok())
            .count();
        Err(format!(
            "{} applied, {among} of them expected",
            batches.len()
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_sent_ahead_of_their_entries_reach_every_replica_whole_across_a_follower_restart() {
    // Goal: the leader streams each batch to the followers ahead of the AppendEntries that
    // names it; every replica applies exactly the leader's bytes in the leader's order, also
    // after a follower restarts (its staged bodies gone: the leader sends them in full).
    let mut cluster = recording(Settings::default()).await;
    let leader = cluster.leader().await;
    let before = bodies(0, 48, 96 * 1024);
    write_eight_at_a_time(&cluster, leader, &before).await;
    let order = applied_all(&cluster, leader, &before).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let other = (1..=3).find(|id| *id != leader && *id != follower).unwrap();
    for id in [follower, other] {
        assert_eq!(applied_all(&cluster, id, &before).await, order);
    }
    let staged = cluster.running[&leader].stager().counts();
    assert!(
        staged.named > 0,
        "no append named a staged body: {staged:?}"
    );

    cluster.stop(follower).await;
    let during = bodies(48, 16, 96 * 1024);
    write_eight_at_a_time(&cluster, leader, &during).await;
    cluster.run(follower, None).await;
    let after = bodies(64, 48, 96 * 1024);
    write_eight_at_a_time(&cluster, leader, &after).await;
    let all: Vec<Bytes> = before
        .iter()
        .chain(&during)
        .chain(&after)
        .cloned()
        .collect();
    let order = applied_all(&cluster, leader, &all).await;
    for id in [follower, other] {
        assert_eq!(applied_all(&cluster, id, &all).await, order);
    }
    let later = cluster.running[&leader].stager().counts();
    assert!(later.named > staged.named, "{staged:?} then {later:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_data_was_deleted_catches_up_from_a_snapshot() {
    // Goal: with snapshots every 20 entries the leader lets go of its older log; a follower
    // whose directory was deleted comes back empty and is sent the snapshot, then the log
    // after it, and ends with every batch. Started first with `replica_snapshot_bytes_max`
    // below the snapshot's size, it refuses the snapshot and applies nothing.
    let settings = Settings {
        replica_snapshot_after_entries: 20,
        ..Settings::default()
    };
    let mut cluster = recording(settings).await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let expected = texts(0..120);
    for text in &expected[..100] {
        write(&cluster, leader, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
    }
    applied(&cluster, follower, &expected[..100]).await;
    cluster.stop(follower).await;
    std::fs::remove_dir_all(&cluster.dirs[&follower]).unwrap();
    for text in &expected[100..] {
        write(&cluster, leader, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
    }
    let snapshot = cluster.running[&leader]
        .raft()
        .metrics()
        .borrow()
        .snapshot
        .map(|id| id.index);
    assert!(snapshot.is_some_and(|index| index >= 20), "{snapshot:?}");
    let bound = cluster.settings.replica_snapshot_bytes_max;
    cluster.settings.replica_snapshot_bytes_max = 16;
    cluster.run(follower, None).await;
    eventually(WAIT, "the leader to send its snapshot", async || {
        cluster.running[&follower].snapshot_parts_refused() > 0
    })
    .await;
    assert!(
        cluster.journals[&follower].batches().is_empty(),
        "nothing applied without the snapshot"
    );
    cluster.stop(follower).await;
    cluster.settings.replica_snapshot_bytes_max = bound;
    cluster.run(follower, None).await;
    applied(&cluster, follower, &expected).await;
    assert_eq!(
        cluster.journals[&follower].restores(),
        1,
        "it caught up from the snapshot, not from the log alone"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_majority_commits_nothing() {
    // Goal: with both followers stopped the leader cannot commit: the write does not
    // complete and nothing is applied; once one follower is back, the group commits again.
    let mut cluster = recording(Settings::default()).await;
    let leader = cluster.leader().await;
    write(&cluster, leader, "committed").await.unwrap();
    let followers: Vec<ReplicaId> = (1..=3).filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.stop(*id).await;
    }
    let alone =
        tokio::time::timeout(Duration::from_secs(2), write(&cluster, leader, "alone")).await;
    assert!(
        !matches!(alone, Ok(Ok(_))),
        "a lone replica committed: {alone:?}"
    );
    assert_eq!(
        cluster.journals[&leader].batches(),
        texts_of(&["committed"])
    );
    cluster.run(followers[0], None).await;
    let leader = cluster.leader().await;
    write(&cluster, leader, "again").await.unwrap();
    let applied = cluster.journals[&leader].batches();
    assert_eq!(applied.first(), Some(&Bytes::from_static(b"committed")));
    assert_eq!(applied.last(), Some(&Bytes::from_static(b"again")));
    cluster.shutdown().await;
}

fn texts_of(texts: &[&str]) -> Vec<Bytes> {
    texts
        .iter()
        .map(|t| Bytes::copy_from_slice(t.as_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_members_of_the_group_are_served() {
    // Goal: a node of the cluster that is not a replica of this group (its certificate names
    // another node) is closed without an answer.
    let cluster = recording(Settings::default()).await;
    let settings = Settings::default();
    let stranger = cluster
        .ca
        .issue("leaf-2-1", &[], Duration::from_secs(3600))
        .unwrap();
    let client =
        crest_transport::link_client_config(cluster.ca.cert_pem(), &stranger, &settings).unwrap();
    let target: SocketAddr = cluster.members[0].address;
    let endpoint = crest_transport::client_endpoint(target, client, &settings).unwrap();
    let connection = crest_transport::connect(&endpoint, target, &cluster.members[0].name)
        .await
        .unwrap();
    let reason = tokio::time::timeout(WAIT, connection.closed())
        .await
        .unwrap();
    assert!(
        reason.to_string().contains("not a replica of this group"),
        "{reason}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_replica_does_not_vote_a_stale_one_into_leading_without_committed_writes() {
    // Goal: the double fault Raft alone does not survive. Writes are committed by the leader
    // and one follower W while the third replica S is down; then the leader stops and W's
    // disk is wiped. W and S are up, a majority: were W to vote as before, S would lead
    // without those writes and the group would lose them. W, back empty, withholds its vote
    // (and its pre-vote) from a candidate with history until a leader caught it up: S asks
    // again and again and never leads; once the old leader is back, the group leads on with
    // every write, and all three apply them.
    let mut cluster = recording(Settings::default()).await;
    let leader = cluster.leader().await;
    let others: Vec<ReplicaId> = (1..=3).filter(|id| *id != leader).collect();
    let (wiped, stale) = (others[0], others[1]);
    cluster.stop(stale).await;
    let committed = texts(0..10);
    for text in &committed {
        write(&cluster, leader, std::str::from_utf8(text).unwrap())
            .await
            .unwrap();
    }
    applied(&cluster, wiped, &committed).await;
    cluster.stop(leader).await;
    cluster.stop(wiped).await;
    std::fs::remove_dir_all(&cluster.dirs[&wiped]).unwrap();
    cluster.run(wiped, None).await;
    cluster.run(stale, None).await;

    // The stale replica asks twice over whether it would be elected, in vain: the wiped one
    // withholds its pre-vote as it would its vote, so the stale one never even raises its term.
    let term = cluster.running[&stale].term();
    eventually(WAIT, "the stale replica to ask twice", async || {
        let replica = &cluster.running[&stale];
        if replica.pre_votes().asked() >= 2 {
            Ok(())
        } else {
            Err(format!(
                "leader {:?}, term {}",
                replica.leader(),
                replica.term()
            ))
        }
    })
    .await;
    assert_eq!(cluster.running[&stale].pre_votes().granted(), 0);
    assert_eq!(cluster.running[&stale].term(), term);
    // Neither leads (each may still name the stopped leader its log last heard of).
    for id in [wiped, stale] {
        assert_ne!(
            cluster.running[&id].state(),
            crest_replica::ServerState::Leader,
            "replica {id} leads"
        );
        assert_ne!(
            cluster.running[&id].leader(),
            Some(id),
            "replica {id} leads"
        );
    }

    // Back, the old leader leads first (no other log holds every write); once the others
    // caught up, any of them may lead later.
    cluster.run(leader, None).await;
    let mut all = committed.clone();
    all.extend(texts(10..11));
    eventually(WAIT, "batch 10 written", async || {
        write(&cluster, cluster.leader().await, "batch 10").await
    })
    .await;
    for id in 1..=3 {
        applied(&cluster, id, &all).await;
    }
    cluster.shutdown().await;
}
