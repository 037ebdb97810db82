//! A leaf's log kept by a group of three replicas on loopback (real QUIC with mutual TLS, real
//! Raft logs and crest logs on disk): the leader's storage operations come back complete with
//! the bodies' locations, and every replica's crest log is the same, byte for byte, so any of
//! them can take over as the leaf.

use bytes::Bytes;
use crest_core::config::Settings;
use crest_core::id::{LeafId, MessageId};
use crest_core::machine::{StorageOp, SyncWait};
use crest_core::record::{Location, LogRecord, MessageBody, MessageHead};
use crest_core::time::Time;
use crest_node::replica::{Acks, Gathering, JournalLimits, LeafJournal, Outcome, ReplicatedStore};
use crest_replica::ReplicaId;
use crest_storage::wal::{BodyReader, WalOptions};
use crest_testkit::eventually;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "../../crest-replica/tests/common/cluster.rs"]
mod cluster;

use cluster::WAIT;

type Cluster = cluster::Cluster<LeafJournal, LeafJournal>;

fn log_dir(replica: &Path) -> PathBuf {
    replica.join("log")
}

/// Three replicas of a leaf's log. `RUST_LOG` shows what openraft says.
async fn leaf_group(settings: Settings) -> Cluster {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let wal_settings = settings.clone();
    let make: cluster::Factory<LeafJournal, LeafJournal> = Box::new(move |_, dir| {
        let options = WalOptions::new(log_dir(dir), &wal_settings);
        let journal = LeafJournal::open(options, JournalLimits::of(&wal_settings)).unwrap();
        (journal.clone(), journal)
    });
    Cluster::start(settings, make).await
}

/// The leader's store, and the outcomes it reports, in order.
fn store_of(
    cluster: &Cluster,
    leader: ReplicaId,
) -> (ReplicatedStore, std::sync::mpsc::Receiver<Outcome>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let raft = cluster.running[&leader].raft().clone();
    let stager = cluster.running[&leader].stager();
    let acks = Acks::of(&cluster.settings);
    let gathering = Gathering::of(&cluster.settings);
    let store = ReplicatedStore::start(raft, stager, gathering, acks, move |outcomes| {
        for outcome in outcomes {
            let _ = tx.send(outcome);
        }
    })
    .unwrap();
    (store, rx)
}

fn body(seq: u64) -> Bytes {
    Bytes::from(format!("body {seq}").into_bytes())
}

fn enqueue(seq: u64) -> LogRecord {
    LogRecord::Enqueue {
        head: MessageHead {
            id: MessageId::new(LeafId(1), seq),
            topic: "jobs".into(),
            priority: (seq % 5) as u32,
            ready_at: Time(seq),
            enqueued_at: Time(seq),
            expires_at: None,
            fairness_key: None,
            dedup_key: None,
        },
        metadata: vec![],
        payload: body(seq),
    }
}

/// Pushes messages `seqs` through `store`, one append each (with a lease record nobody waits
/// for after each), and waits for every append's outcome: where its body is.
fn push(
    store: &ReplicatedStore,
    outcomes: &std::sync::mpsc::Receiver<Outcome>,
    seqs: std::ops::Range<u64>,
) -> BTreeMap<u64, Location> {
    for seq in seqs.clone() {
        let append = StorageOp::Append {
            token: Some(seq),
            records: vec![enqueue(seq)],
            wait: SyncWait::Now,
        };
        store.submit(append).unwrap();
        let lease = StorageOp::Append {
            token: None,
            records: vec![LogRecord::Lease {
                id: MessageId::new(LeafId(1), seq),
                attempt: 1,
                deadline: Time(seq + 1000),
                token: seq,
            }],
            wait: SyncWait::Linger,
        };
        store.submit(lease).unwrap();
    }
    let mut placed = BTreeMap::new();
    for seq in seqs {
        let done = outcomes
            .recv_timeout(WAIT)
            .expect("an outcome for every append")
            .unwrap_or_else(|(token, reason)| panic!("append {token} failed: {reason}"));
        assert_eq!(done.token, seq, "outcomes come in the order appended");
        assert_eq!(done.locations.len(), 1, "one body per append");
        placed.insert(seq, done.locations[0]);
    }
    placed
}

/// Waits until every running replica applied as far as the leader.
async fn caught_up(cluster: &Cluster, leader: ReplicaId) {
    eventually(
        WAIT,
        "every replica to apply as far as the leader",
        async || {
            let target = cluster.running[&leader].applied();
            let applied: Vec<Option<u64>> = cluster.running.values().map(|g| g.applied()).collect();
            if applied.iter().all(|a| *a == target) {
                Ok(())
            } else {
                Err(format!("replicas at {applied:?}, leader at {target:?}"))
            }
        },
    )
    .await
}

/// Every body at the place the leader answered for it, read from replica `id`'s own log.
fn assert_bodies(cluster: &Cluster, id: ReplicaId, placed: &BTreeMap<u64, Location>) {
    let mut reader = BodyReader::new(log_dir(&cluster.dirs[&id]));
    for (seq, location) in placed {
        let read = reader
            .read(location)
            .unwrap_or_else(|e| panic!("replica {id}, {seq}: {e}"));
        assert_eq!(
            read,
            MessageBody {
                metadata: vec![],
                payload: body(*seq)
            },
            "replica {id}, message {seq}"
        );
    }
}

/// The segments of the log in `dir`, by name: their bytes through the last valid record (a
/// segment is preallocated, and a copy leaves the unwritten tail out).
fn segments(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if crest_storage::format::parse_checkpoint_name(&name).is_some() {
            found.insert(name, std::fs::read(entry.path()).unwrap());
            continue;
        }
        let Some(seq) = crest_storage::format::parse_segment_name(&name) else {
            continue;
        };
        let file = std::fs::File::open(entry.path()).unwrap();
        let len = file.metadata().unwrap().len();
        let max = Settings::default().frame_bytes_max;
        let valid = crest_storage::format::segment_valid_len(&file, len, seq, max).unwrap();
        let mut bytes = std::fs::read(entry.path()).unwrap();
        bytes.truncate(valid as usize);
        found.insert(name, bytes);
    }
    found
}

fn log_files(cluster: &Cluster, id: ReplicaId) -> BTreeMap<String, Vec<u8>> {
    segments(&log_dir(&cluster.dirs[&id]))
}

fn assert_same_logs(cluster: &Cluster, checkpoints: usize) {
    let ids: Vec<ReplicaId> = cluster.running.keys().copied().collect();
    let first = log_files(cluster, ids[0]);
    assert!(!first.is_empty(), "replica {} has a log", ids[0]);
    let taken = first
        .keys()
        .filter(|name| crest_storage::format::parse_checkpoint_name(name).is_some())
        .count();
    assert_eq!(taken, checkpoints, "checkpoints in {:?}", first.keys());
    for id in &ids[1..] {
        let other = log_files(cluster, *id);
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            other.keys().collect::<Vec<_>>(),
            "replicas {} and {id} have the same segments",
            ids[0]
        );
        for (name, bytes) in &first {
            assert!(
                other[name] == *bytes,
                "segment {name} differs between replicas {} and {id}",
                ids[0]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_of_a_leaf_keeps_the_same_log_and_a_new_leader_goes_on_with_it() {
    // Goal: appends through the group complete, in order, with where each body lies in the
    // leader's log; every replica's log holds the bodies at those same places (the logs are
    // identical); after the leader stops, another takes appends, and the stopped replica,
    // started again, catches up to the same log.
    let mut cluster = leaf_group(Settings::default()).await;
    let leader = cluster.leader().await;
    let (store, outcomes) = store_of(&cluster, leader);
    let mut placed = push(&store, &outcomes, 1..41);
    caught_up(&cluster, leader).await;
    for id in cluster.running.keys() {
        assert_bodies(&cluster, *id, &placed);
    }
    assert_same_logs(&cluster, 0);

    drop(store);
    cluster.stop(leader).await;
    let next = cluster.leader().await;
    assert_ne!(next, leader);
    let (store, outcomes) = store_of(&cluster, next);
    placed.extend(push(&store, &outcomes, 41..61));
    // The new leader rebuilds its leaf from its own log, as a restarted leaf does: every
    // message acknowledged through either leader is there.
    let mut leaf = crest_core::leaf::Leaf::recovering(crest_core::leaf::LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: Settings::default(),
        token_key: crest_core::leaf::token_key_from_seed(1),
        first_seq: 1,
    });
    let recovered = cluster.journals[&next]
        .recover(|records| leaf.replay_operation(records))
        .unwrap();
    assert!(recovered.truncated.is_empty(), "{:?}", recovered.truncated);
    let leaf = leaf.recovered(Time::from_millis(1));
    use crest_core::machine::Machine;
    assert_eq!(
        leaf.stats().messages,
        60,
        "the new leader's leaf holds every message"
    );
    // What a restarted process has: nothing of the stopped replica's journal.
    cluster.journals.remove(&leader);
    cluster.run(leader, None).await;
    caught_up(&cluster, next).await;
    for id in cluster.running.keys() {
        assert_bodies(&cluster, *id, &placed);
    }
    assert_same_logs(&cluster, 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_by_more_than_one_rpc_holds_catches_up_in_parts() {
    // Goal: a follower that missed more entries than one RPC may carry
    // (`replica_rpc_bytes_max`) gets them in several, each within the bound (the follower
    // refuses a larger one, and did at every retry: it never caught up).
    let frame = crest_core::config::FRAME_OVERHEAD_BYTES + 8192;
    let mut settings = Settings {
        payload_bytes_max: 4096,
        push_batch_bytes_max: 8192,
        push_batch_messages_max: 64,
        frame_bytes_max: frame,
        replica_entry_bytes_max: 16 * 1024,
        ..Settings::default()
    };
    settings.replica_rpc_bytes_max = settings.replica_entry_bytes_max
        + u64::from(frame)
        + 64 * 16
        + crest_core::config::REPLICA_RPC_OVERHEAD_BYTES;
    settings.validate().unwrap();
    let rpc_bytes_max = settings.replica_rpc_bytes_max;
    let mut cluster = leaf_group(settings).await;
    let leader = cluster.leader().await;
    let follower = *cluster.running.keys().find(|id| **id != leader).unwrap();
    cluster.stop(follower).await;
    let (store, outcomes) = store_of(&cluster, leader);
    // Twice what one RPC holds, in 3 KiB bodies, while the follower is down.
    let count = 2 * rpc_bytes_max / 3000;
    for seq in 1..=count {
        let mut record = enqueue(seq);
        if let LogRecord::Enqueue { payload, .. } = &mut record {
            *payload = Bytes::from(vec![(seq % 251) as u8; 3000]);
        }
        let append = StorageOp::Append {
            token: Some(seq),
            records: vec![record],
            wait: SyncWait::Now,
        };
        store.submit(append).unwrap();
    }
    let mut placed = BTreeMap::new();
    for seq in 1..=count {
        let done = outcomes.recv_timeout(WAIT).expect("an outcome").unwrap();
        assert_eq!(done.token, seq);
        placed.insert(seq, done.locations[0]);
    }
    cluster.journals.remove(&follower);
    cluster.run(follower, None).await;
    caught_up(&cluster, leader).await;
    assert_same_logs(&cluster, 0);
    let log = log_dir(&cluster.dirs[&follower]);
    let mut reader = BodyReader::new(log);
    let last = placed[&count];
    let body = reader.read(&last).unwrap();
    assert_eq!(
        body.payload.len(),
        3000,
        "the last body, read from the follower's log"
    );
    drop(store);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_was_wiped_gets_the_leader_s_log_from_a_snapshot() {
    // Goal: a replica that lost its directory rejoins; the group's log no longer reaches back
    // to the first append (snapshots every 16 entries purge it), so it is sent a snapshot of
    // the leaf's log, and then the entries after it. Its log ends up the same as the others'.
    let settings = Settings {
        replica_snapshot_after_entries: 16,
        ..Settings::default()
    };
    let mut cluster = leaf_group(settings).await;
    let leader = cluster.leader().await;
    let (store, outcomes) = store_of(&cluster, leader);
    let follower = *cluster.running.keys().find(|id| **id != leader).unwrap();
    cluster.stop(follower).await;
    std::fs::remove_dir_all(&cluster.dirs[&follower]).unwrap();
    let mut placed = push(&store, &outcomes, 1..81);
    // A checkpoint of the leaf's state, which keeps the bodies where they are: every replica
    // takes it at the same place in its log.
    let index = placed
        .iter()
        .map(|(seq, location)| {
            let LogRecord::Enqueue { head, .. } = enqueue(*seq) else {
                unreachable!()
            };
            LogRecord::Index {
                head,
                size: body(*seq).len() as u32,
                location: *location,
            }
        })
        .collect();
    let segments = placed.values().map(|l| l.segment).collect::<BTreeSet<_>>();
    store
        .submit(StorageOp::Checkpoint {
            records: index,
            includes: vec![],
            segments: segments.into_iter().collect(),
        })
        .unwrap();
    placed.extend(push(&store, &outcomes, 81..86));
    cluster.run(follower, None).await;
    placed.extend(push(&store, &outcomes, 86..91));
    caught_up(&cluster, leader).await;
    for id in cluster.running.keys() {
        assert_bodies(&cluster, *id, &placed);
    }
    assert_same_logs(&cluster, 1);
    cluster.shutdown().await;
}

#[test]
fn a_leaf_journal_s_snapshot_restores_the_same_log_elsewhere() {
    // Goal: what a replica sends one too far behind is its whole log, and the receiver ends
    // up with the same files and position.
    let dirs = tempfile::tempdir().unwrap();
    let settings = Settings::default();
    let open = |name: &str| {
        let options = WalOptions::new(dirs.path().join(name), &settings);
        LeafJournal::open(options, JournalLimits::of(&settings)).unwrap()
    };
    let mut source = open("source");
    let membership = crest_replica::StoredMembership::default();
    let entries: Vec<(crest_replica::Position, Option<crest_replica::Batch>)> = (1..=20u64)
        .map(|seq| {
            let op = crest_node::replica::Operation::Append {
                token: Some(seq),
                records: vec![enqueue(seq)],
            };
            let id = crest_replica::LogId::new(crest_replica::CommittedLeaderId::new(1, 1), seq);
            ((Some(id), membership.clone()), Some(op.encode().unwrap()))
        })
        .collect();
    let last = entries.last().unwrap().0.clone();
    let applied = crest_replica::Journal::apply(&mut source, entries).unwrap();
    assert_eq!(applied.len(), 20);
    let snapshot_path = dirs.path().join("snapshot");
    let mut file = std::fs::File::create(&snapshot_path).unwrap();
    let position = crest_replica::Journal::snapshot(&mut source, &mut file).unwrap();
    assert_eq!(position, last);
    let mut target = open("target");
    let mut file = std::fs::File::open(&snapshot_path).unwrap();
    crest_replica::Journal::restore(&mut target, &mut file, &position).unwrap();
    assert_eq!(crest_replica::Journal::position(&mut target).unwrap(), last);
    let (source, target) = (
        segments(&dirs.path().join("source")),
        segments(&dirs.path().join("target")),
    );
    assert!(
        !source.is_empty() && source.values().all(|bytes| bytes.len() > 64),
        "records in the log"
    );
    assert_eq!(source, target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_all_an_append_is_done_once_every_replica_in_sync_holds_it() {
    // Goal: under `replica_acks = "all"`, an append's outcome comes once every follower in
    // sync holds its entry, not only a majority; a follower that stops leaves the in-sync set
    // after `replica_election_timeout_ms`, and appends go on without it.
    let settings = Settings {
        replica_acks: crest_core::config::ReplicaAcks::All,
        ..Settings::default()
    };
    let mut cluster = leaf_group(settings).await;
    let leader = cluster.leader().await;
    let (store, outcomes) = store_of(&cluster, leader);
    let last_log = |group: &crest_replica::Group| group.raft().metrics().borrow().last_log_index;
    let append = |seq: u64| {
        store
            .submit(StorageOp::Append {
                token: Some(seq),
                records: vec![enqueue(seq)],
                wait: SyncWait::Now,
            })
            .unwrap();
        let done = outcomes.recv_timeout(WAIT).expect("an outcome");
        assert_eq!(done.map(|d| d.token), Ok(seq));
    };
    let term = |group: &crest_replica::Group| group.raft().metrics().borrow().current_term;
    for seq in 0..100 {
        let before = term(&cluster.running[&leader]);
        append(seq);
        // One append at a time: the leader's last entry is this append's, unless an election
        // came in between (a replica on a loaded machine missing a heartbeat), whose new
        // leader's own entry is the last one then: that append is not judged.
        let entry = last_log(&cluster.running[&leader]);
        if term(&cluster.running[&leader]) != before {
            continue;
        }
        for (id, group) in &cluster.running {
            assert!(
                last_log(group) >= entry,
                "append {seq} done while replica {id} holds up to {:?}, not {entry:?}",
                last_log(group)
            );
        }
    }
    let follower = *cluster.running.keys().find(|id| **id != leader).unwrap();
    cluster.stop(follower).await;
    for seq in 100..110 {
        append(seq);
    }
    drop(store);
    cluster.shutdown().await;
}

/// Entries `seqs` as the group's leader sends them: one encoded append each, in term 1.
fn entries(
    seqs: std::ops::RangeInclusive<u64>,
) -> Vec<(crest_replica::Position, Option<crest_replica::Batch>)> {
    let membership = crest_replica::StoredMembership::default();
    seqs.map(|seq| {
        let op = crest_node::replica::Operation::Append {
            token: Some(seq),
            records: vec![enqueue(seq)],
        }
        .encoded(Settings::default().frame_bytes_max)
        .unwrap();
        let id = crest_replica::LogId::new(crest_replica::CommittedLeaderId::new(1, 1), seq);
        ((Some(id), membership.clone()), Some(op.encode().unwrap()))
    })
    .collect()
}

/// Copies the files of `from` to `to`: the disk as a crash would leave it, with what was
/// written and not synced still there (a process crash) unless the test cuts it.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn a_replica_restarted_with_its_log_ahead_of_its_last_sync_cuts_it_back_and_applies_again() {
    // Goal: a replica's crest log is not synced per entry (its Raft log is); after a crash it
    // is cut back to the end saved at its last sync and the entries after it are applied
    // again from the Raft log, ending with the same bytes as a replica that never crashed,
    // whether what was written after the sync survived (a process crash), or was lost or
    // torn (a machine crash).
    let dirs = tempfile::tempdir().unwrap();
    // A sync after every 4 KiB applied: the first entries are synced, the last ones not.
    let settings = Settings {
        replica_journal_sync_bytes: 4096,
        ..Settings::default()
    };
    let open = |dir: &Path| {
        let options = WalOptions::new(dir.to_path_buf(), &settings);
        LeafJournal::open(options, JournalLimits::of(&settings)).unwrap()
    };
    let mut source = open(&dirs.path().join("source"));
    // Past the sync threshold: synced and saved after it is applied.
    let applied = crest_replica::Journal::apply(&mut source, entries(1..=100)).unwrap();
    assert_eq!(applied.len(), 100);
    // Below it: written, not synced, not saved.
    crest_replica::Journal::apply(&mut source, entries(101..=110)).unwrap();
    // The sync the first apply started runs apart from the applies: the copies below are of
    // the disk once it saved its position.
    source.synced().unwrap();
    for (case, cut) in [
        ("process crash", None),
        ("torn tail", Some(b"\xffgarbage".as_slice())),
    ] {
        let crashed = dirs.path().join(case);
        copy_dir(&dirs.path().join("source"), &crashed);
        if let Some(garbage) = cut {
            // What was written after the last sync is torn: some of it lost, garbage after.
            let segment = segments(&crashed).into_keys().last().unwrap();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(crashed.join(&segment))
                .unwrap();
            let len = segments(&crashed)[&segment].len() as u64;
            std::os::unix::fs::FileExt::write_all_at(&file, garbage, len - 40).unwrap();
        }
        let mut restarted = open(&crashed);
        let (position, _) = crest_replica::Journal::position(&mut restarted).unwrap();
        let saved = position.expect("a position saved at the last sync").index;
        assert_eq!(saved, 100, "{case}: the position saved at the last sync");
        let again =
            crest_replica::Journal::apply(&mut restarted, entries(saved + 1..=110)).unwrap();
        assert_eq!(again.len() as u64, 110 - saved);
        assert_eq!(
            crest_node::replica::placed(&again[again.len() - 1]).unwrap(),
            crest_node::replica::placed(
                &crest_replica::Journal::apply(
                    &mut open(&dirs.path().join(format!("{case} reference"))),
                    entries(1..=110)
                )
                .unwrap()[109]
            )
            .unwrap(),
            "{case}: the last body lands where it did"
        );
        drop(restarted);
        assert_eq!(
            segments(&crashed),
            segments(&dirs.path().join("source")),
            "{case}: the log is the one that never crashed, byte for byte"
        );
    }
}

fn append(token: Option<u64>, seqs: std::ops::Range<u64>) -> crest_node::replica::Operation {
    crest_node::replica::Operation::Append {
        token,
        records: seqs.map(enqueue).collect(),
    }
}

#[test]
fn an_entry_carries_each_append_encoded_once_with_its_spans_and_checksum() {
    // Goal: the leader encodes an append straight into the entry; what a replica decodes
    // is what `encoded` makes of the same records (body, spans, checksum), sliced out of
    // the entry it received, and other operations come back as they went.
    let max = u32::MAX;
    let mut entry = crest_node::replica::EntryWriter::with_capacity(0);
    let sent_a = entry.push(append(Some(7), 0..3), max).unwrap();
    assert!(entry.push(append(None, 3..4), max).unwrap().is_none());
    let pre = append(Some(9), 4..6).encoded(max).unwrap();
    let sent_b = entry.push(pre, max).unwrap();
    let checkpoint = crest_node::replica::Operation::Checkpoint {
        records: vec![enqueue(9)],
        includes: vec![7],
        segments: vec![2],
    };
    entry.push(checkpoint, max).unwrap();
    let batch = entry.finish();
    let ops = crest_node::replica::decode_entry(&batch).unwrap();
    assert_eq!(ops.len(), 4);
    for (op, (token, seqs), sent) in [
        (&ops[0], (Some(7), 0..3), Some(sent_a)),
        (&ops[1], (None, 3..4), None),
        (&ops[2], (Some(9), 4..6), Some(sent_b)),
    ]
    .into_iter()
    .map(|(op, (token, seqs), sent)| (op, (token, seqs), sent.flatten()))
    {
        let crest_node::replica::Operation::Encoded {
            token: got,
            body,
            spans,
            crc,
        } = op
        else {
            panic!("an append decodes as encoded: {op:?}");
        };
        let crest_node::replica::Operation::Encoded {
            body: want_body,
            spans: want_spans,
            crc: want_crc,
            ..
        } = append(token, seqs).encoded(max).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(*got, token);
        assert_eq!(body, &want_body);
        assert_eq!(spans, &want_spans);
        assert_eq!(*crc, want_crc);
        assert_eq!(*crc, Some(crc32fast::hash(body)));
        if let Some(sent) = sent {
            assert_eq!(Some(sent.token), token);
            assert_eq!(sent.spans, Some((want_spans, want_body.len())));
        }
        // Sliced from the entry, not copied.
        let within = batch.0.as_ptr_range();
        assert!(
            within.contains(&body.as_ptr()),
            "the body is a slice of the entry"
        );
    }
    assert!(
        matches!(&ops[3], crest_node::replica::Operation::Checkpoint { includes, segments, .. }
            if includes == &[7] && segments == &[2])
    );
}

#[test]
fn entries_of_the_older_formats_still_decode() {
    let op = append(Some(3), 0..2);
    let list = crest_replica::Batch(rmp_serde::to_vec(&[&op]).unwrap().into());
    let single = crest_replica::Batch(rmp_serde::to_vec(&op).unwrap().into());
    for batch in [list, single] {
        let ops = crest_node::replica::decode_entry(&batch).unwrap();
        assert!(
            matches!(&ops[..], [crest_node::replica::Operation::Append { token: Some(3), records }] if records.len() == 2)
        );
    }
}

#[test]
fn a_cut_or_garbled_entry_is_an_error_not_a_panic() {
    let mut entry = crest_node::replica::EntryWriter::with_capacity(0);
    entry.push(append(Some(1), 0..4), u32::MAX).unwrap();
    let whole = entry.finish().0;
    // Cut anywhere inside its one operation (an entry of the format byte alone holds none).
    for len in 2..whole.len() {
        let cut = crest_replica::Batch(whole.slice(..len));
        assert!(
            crest_node::replica::decode_entry(&cut).is_err(),
            "cut at {len} of {}",
            whole.len()
        );
    }
    let mut unknown = whole.to_vec();
    unknown[1] = 9;
    assert!(crest_node::replica::decode_entry(&crest_replica::Batch(unknown.into())).is_err());
    let mut huge = whole.to_vec();
    // The body's length, past the end of the entry.
    huge[15..19].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(crest_node::replica::decode_entry(&crest_replica::Batch(huge.into())).is_err());
}

#[test]
fn an_append_that_cannot_be_logged_is_refused_alone() {
    let mut entry = crest_node::replica::EntryWriter::with_capacity(0);
    assert!(entry.push(append(Some(1), 0..50), 64).is_err());
    assert!(entry.is_empty(), "nothing of the refused append stays");
    entry.push(append(Some(2), 0..1), u32::MAX).unwrap();
    let ops = crest_node::replica::decode_entry(&entry.finish()).unwrap();
    assert!(matches!(
        &ops[..],
        [crest_node::replica::Operation::Encoded { token: Some(2), .. }]
    ));
}
