//! The log under injected faults and timing: a full disk, failing syncs, appends nobody waits
//! for, lingering acks, and how long each group's sync took.

mod common;

use common::*;
use crest_core::record::LogRecord;
use crest_storage::wal::{Completion, FileWrapper, SegmentFile, WalOptions, open};
use crest_testkit::eventually_blocking;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn a_full_disk_refuses_the_batch_keeps_what_was_acknowledged_and_recovers_when_space_returns() {
    let dir = temp_dir("enospc");
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(300),
        syncs_left: AtomicU64::new(u64::MAX),
    });
    let (wal, _) = open(faulty(&dir, &faults)).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    let mut acked = Vec::new();
    let mut refused = None;
    for n in 1..=20 {
        match submit_and_wait(&handle, &rx, n).expect("every operation is answered") {
            Ok(()) => acked.push(n),
            Err(error) => {
                refused = Some((n, error));
                break;
            }
        }
    }
    let (refused_n, error) = refused.expect("the disk fills up");
    assert!(
        error.contains("No space left") || error.contains("os error 28"),
        "{error}"
    );
    assert!(!acked.is_empty());

    faults.space.store(1 << 20, Ordering::SeqCst);
    for n in 100..103 {
        assert_eq!(
            submit_and_wait(&handle, &rx, n),
            Some(Ok(())),
            "space is back"
        );
        acked.push(n);
    }
    // A snapshot the leaf took while the refused batch was pending holds its records: the
    // log must not make it the new start.
    let snapshot: Vec<LogRecord> = acked
        .iter()
        .chain([&refused_n])
        .flat_map(|n| op(*n))
        .collect();
    handle
        .checkpoint(snapshot, vec![refused_n], Vec::new())
        .unwrap();
    assert_eq!(submit_and_wait(&handle, &rx, 200), Some(Ok(())));
    acked.push(200);
    assert_eq!(files(&dir, ".ckpt"), 0, "the checkpoint is abandoned");
    handle.close().unwrap();

    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect(acked.iter().copied()));
    assert!(
        !ids(&recovered.operations).contains(&expect([refused_n])[0]),
        "the refused batch left no trace"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failing_sync_stops_the_log_and_only_acknowledged_operations_survive() {
    let dir = temp_dir("syncfail");
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(u64::MAX / 2),
        syncs_left: AtomicU64::new(5),
    });
    let (wal, _) = open(faulty(&dir, &faults)).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    for n in 1..=5 {
        assert_eq!(submit_and_wait(&handle, &rx, n), Some(Ok(())));
    }
    let failed = submit_and_wait(&handle, &rx, 6).expect("the failed group is answered");
    assert!(
        failed.unwrap_err().contains("fdatasync"),
        "the failure is named"
    );
    // The writer has stopped: nothing more is acknowledged, ever.
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        submit_and_wait(&handle, &rx, 7).is_none(),
        "no acknowledgement after a failed sync"
    );
    assert!(
        handle.submit(op(8), Some(8)).is_err(),
        "the log refuses new work"
    );

    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(
        ids(&recovered.operations),
        expect(1..=5),
        "unsynced writes are lost, acked ones kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn appends_nobody_waits_for_are_synced_with_the_next_waiter_or_after_the_interval() {
    let dir = temp_dir("unwaited");
    // An interval no test run reaches: only a waiter syncs.
    let (faults, wal_options) = unwaited(&dir, Duration::from_secs(3600));
    let (wal, _) = open(wal_options).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    handle.submit(op(1), None).unwrap();
    handle.submit(op(2), None).unwrap();
    // A waiter's group commit makes the unwaited appends before it durable with one sync.
    barrier(&handle, &rx, 3);
    let after_barrier = syncs(&faults);
    assert!(after_barrier >= 1);
    handle.submit(op(4), None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        syncs(&faults),
        after_barrier,
        "an unwaited append alone is not synced"
    );
    // A machine crash now (the faulty file loses what was not synced) keeps 1–3, loses 4.
    std::mem::forget(handle);
    assert_eq!(recovered_after_crash(&dir), expect(1..=3));
    std::fs::remove_dir_all(&dir).unwrap();

    // With a short interval, an unwaited append is synced on its own soon after.
    let dir = temp_dir("unwaited-timer");
    let (faults, wal_options) = unwaited(&dir, Duration::from_millis(20));
    let (wal, _) = open(wal_options).unwrap();
    let handle = wal.start(|_| {}).unwrap();
    handle.submit(op(1), None).unwrap();
    eventually_blocking(Duration::from_secs(10), "a sync by the interval", || {
        syncs(&faults) > 0
    });
    assert_eq!(syncs(&faults), 1, "synced by the interval");
    handle.close().unwrap();
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect([1]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_lingering_append_waits_for_a_push_s_sync_only_while_pushes_come_and_never_completes_before_it_is_durable()
 {
    // A linger no test run reaches: only a push's sync completes an ack's held append.
    let dir = temp_dir("linger");
    let (faults, handle, rx) = start_lingering(&dir, Duration::from_secs(3600), u64::MAX);
    // No push has come: nothing to ride with, so it is synced at once.
    submit_lingering(&handle, 1);
    completions(&rx, 1);
    assert_eq!(syncs(&faults), 1, "synced at once with no push coming");
    // A push comes: from now on acks' appends wait for the next push's sync.
    push_and_wait(&handle, &rx, 2);
    assert_eq!(syncs(&faults), 2);
    submit_lingering(&handle, 3);
    submit_lingering(&handle, 4);
    std::thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "no completion before a sync");
    assert_eq!(syncs(&faults), 2, "a lingering append forces no sync");
    assert_eq!(
        recovered_after_crash(&dir),
        expect(1..=2),
        "3 and 4 are written, not yet durable: their waiters were told nothing"
    );
    // The next push's sync makes them durable: all three complete, in log order, after one
    // sync.
    handle.submit(op(5), Some(5)).unwrap();
    let (done, tokens) = completions(&rx, 3);
    assert_eq!(tokens, vec![3, 4, 5]);
    assert!(done.iter().all(|(_, result)| result.is_ok()));
    assert_eq!(syncs(&faults), 3, "one sync for the three");
    assert_eq!(recovered_after_crash(&dir), expect(1..=5));
    handle.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    // While pushes come, a lingering append with no push after it is synced once its linger
    // passes (or at once with none).
    for linger in [Duration::from_millis(300), Duration::ZERO] {
        let dir = temp_dir("linger-timer");
        let (faults, handle, rx) = start_lingering(&dir, linger, u64::MAX);
        push_and_wait(&handle, &rx, 1);
        submit_lingering(&handle, 2);
        let (done, _) = completions(&rx, 1);
        assert!(done[0].1.is_ok());
        assert_eq!(syncs(&faults), 2, "{linger:?}: synced before it completed");
        assert_eq!(recovered_after_crash(&dir), expect(1..=2));
        handle.close().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_failed_sync_fails_the_lingering_appends_it_would_have_made_durable() {
    let dir = temp_dir("linger-fail");
    // One sync succeeds (a push's, so that pushes are coming), the next fails.
    let (_, handle, rx) = start_lingering(&dir, Duration::from_secs(3600), 1);
    push_and_wait(&handle, &rx, 1);
    submit_lingering(&handle, 2);
    handle.submit(op(3), Some(3)).unwrap();
    let (done, tokens) = completions(&rx, 2);
    assert_eq!(tokens, vec![2, 3]);
    for (token, result) in &done {
        let error = result.as_ref().expect_err("nothing was made durable");
        assert!(error.contains("fdatasync"), "{token}: {error}");
    }
    handle.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn each_group_reports_how_long_its_sync_took_and_buffered_groups_none() {
    use crest_core::config::Durability;
    use crest_storage::wal::GroupTiming;
    for durability in [Durability::Fsync, Durability::Buffered] {
        let dir = temp_dir("timed");
        let options = WalOptions {
            durability,
            file_wrapper: Some(FileWrapper(std::sync::Arc::new(|file| {
                Box::new(SlowSyncFile(file)) as Box<dyn SegmentFile>
            }))),
            ..options(&dir)
        };
        let (wal, _) = open(options).unwrap();
        let (tx, rx) = mpsc::channel::<(Vec<Completion>, GroupTiming)>();
        let handle = wal
            .start_timed(move |done, timing| tx.send((done, timing)).unwrap())
            .unwrap();
        for n in 1..=3 {
            handle.submit(op(n), Some(n)).unwrap();
            let (done, timing) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(done.len(), 1);
            assert!(done[0].1.is_ok());
            match durability {
                Durability::Fsync => {
                    let sync = timing.sync.expect("an fsync group reports its sync");
                    assert!(sync >= SLOW_SYNC, "{sync:?}");
                }
                Durability::Buffered => assert_eq!(timing, GroupTiming::default()),
            }
        }
        handle.close().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The length on disk of each segment of `dir` (a [`FaultyFile`] puts there only what was
/// synced).
fn on_disk(dir: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".wal"))
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, entry.metadata().unwrap().len())
        })
        .collect()
}

#[test]
fn a_direct_log_syncs_the_segments_it_sealed_with_its_next_sync_and_a_sync_job_runs_apart() {
    // Goal: a replica's log does not stall its apply on a sync at each rotation: a sealed
    // segment waits for the next sync of the log, which can run on another thread while the
    // log is written on, and makes durable all it was given and nothing after it.
    let dir = temp_dir("direct-sync");
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(u64::MAX / 2),
        syncs_left: AtomicU64::new(u64::MAX),
    });
    let options = WalOptions {
        segment_bytes_max: 1024,
        ..faulty(&dir, &faults)
    };
    let (wal, _) = open(options.clone()).unwrap();
    let mut log = crest_storage::wal::DirectLog::new(wal);
    let synced_at_open = syncs(&faults);
    for n in 1..=40 {
        log.append(op(n), n).unwrap();
    }
    let end = log.end();
    assert!(end.0 >= 3, "the appends span segments: ended in {end:?}");
    assert_eq!(
        syncs(&faults),
        synced_at_open,
        "no sync as segments were sealed"
    );
    let job = log.sync_job().unwrap();
    assert_eq!(job.end(), end);
    // The log goes on while the job runs on a thread of its own.
    let syncing = std::thread::spawn(move || job.run());
    for n in 41..=60 {
        log.append(op(n), n).unwrap();
    }
    assert_eq!(syncing.join().unwrap(), Ok(end));
    let disk = on_disk(&dir);
    let (last, len) = end;
    let name = crest_storage::format::segment_name;
    // Durable at least to where the job took it (a sync of a file makes what was written
    // to it meanwhile durable too).
    assert!(
        disk[&name(last)] >= len,
        "segment {last} durable to {} < {len}",
        disk[&name(last)]
    );
    for seq in 1..last {
        assert!(disk[&name(seq)] > 0, "sealed segment {seq} synced with it");
    }
    // A crash now keeps what the job synced: recovery finds every append up to 40.
    let later = log.end();
    assert!(later > end);
    drop(log);
    let (_, recovered) = open(options).unwrap();
    let ids = ids(&recovered.operations);
    assert!(
        ids.len() >= 40 && ids[..40] == expect(1..=40)[..],
        "what the job synced survives: {} operations",
        ids.len()
    );

    // A job whose sync fails says so and syncs nothing more.
    let dir = temp_dir("direct-sync-fails");
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(u64::MAX / 2),
        syncs_left: AtomicU64::new(u64::MAX),
    });
    let (wal, _) = open(faulty(&dir, &faults)).unwrap();
    let mut log = crest_storage::wal::DirectLog::new(wal);
    log.append(op(1), 1).unwrap();
    let job = log.sync_job().unwrap();
    faults.syncs_left.store(0, Ordering::SeqCst);
    let failed = job.run().unwrap_err();
    assert!(
        failed.contains("fdatasync"),
        "the failure is named: {failed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
