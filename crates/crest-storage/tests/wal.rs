//! The log on real files: group-committed writes, rotation, and recovery after damage.

use crest_core::config::Settings;
use crest_core::id::{LeafId, MessageId};
use crest_core::machine::SyncWait;
use crest_core::record::{LogRecord, MessageHead};
use crest_storage::StorageError;
use crest_storage::format::{SEGMENT_HEADER_BYTES, scan_segment, segment_name};
use crest_storage::wal::{
    Completion, FileWrapper, RecoveryMode, SegmentFile, SyncFailure, WalHandle, WalOptions, open,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("crest-wal-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn options(dir: &Path) -> WalOptions {
    WalOptions {
        record_bytes_max: 1 << 20,
        ..WalOptions::new(dir.to_path_buf(), &Settings::default())
    }
}

/// Where writing stopped in segment `seq` at `path` (a preallocated file is longer).
fn written_len(path: &Path, seq: u64) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    scan_segment(&bytes, seq, 1 << 20, SEGMENT_HEADER_BYTES).valid_len
}

/// Loses the last `n` written bytes of segment `seq`, as a crash does to a write that was
/// never synced: a preallocated file keeps its length (the bytes read as zeros again), a
/// growing one is shorter.
fn tear(path: &Path, seq: u64, n: u64) {
    let written = written_len(path, seq);
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    if file.metadata().unwrap().len() > written {
        let zeros = vec![0u8; n as usize];
        std::os::unix::fs::FileExt::write_all_at(&file, &zeros, written - n).unwrap();
    } else {
        file.set_len(written - n).unwrap();
    }
}

fn head(n: u64) -> MessageHead {
    MessageHead {
        id: MessageId::new(LeafId(1), n),
        topic: "jobs".into(),
        priority: (n % 5) as u32,
        ready_at: crest_core::Time(n),
        enqueued_at: crest_core::Time(n),
        expires_at: None,
        dedup_key: None,
    }
}

fn op(n: u64) -> Vec<LogRecord> {
    vec![LogRecord::Enqueue {
        head: head(n),
        metadata: vec![],
        payload: bytes::Bytes::from(format!("payload {n}")),
    }]
}

/// Recovery's operations with each message record reduced to its id: segments give back an
/// `Index` (with the body's location) where an `Enqueue` was written.
fn ids(operations: &[Vec<LogRecord>]) -> Vec<Vec<MessageId>> {
    operations
        .iter()
        .map(|records| {
            records
                .iter()
                .map(|record| match record {
                    LogRecord::Enqueue { head, .. } | LogRecord::Index { head, .. } => head.id,
                    other => panic!("unexpected record {other:?}"),
                })
                .collect()
        })
        .collect()
}

fn expect(ns: impl IntoIterator<Item = u64>) -> Vec<Vec<MessageId>> {
    ns.into_iter().map(|n| ids(&[op(n)]).remove(0)).collect()
}

/// Writes `count` operations with tokens and waits until each is reported durable. With
/// `one_by_one`, each waits for the previous one, so every group commit holds one operation.
fn write_with(options: WalOptions, from: u64, count: u64, one_by_one: bool) {
    let (wal, _) = open(options).unwrap();
    let (tx, rx) = mpsc::channel::<Vec<Completion>>();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    let mut acked = 0;
    let receive = |acked: &mut u64| {
        for (_, result) in rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            result.unwrap();
            *acked += 1;
        }
    };
    for n in from..from + count {
        handle.submit(op(n), Some(n)).unwrap();
        if one_by_one {
            receive(&mut acked);
        }
    }
    while acked < count {
        receive(&mut acked);
    }
    handle.close().unwrap();
}

fn write(options: WalOptions, from: u64, count: u64) {
    write_with(options, from, count, false)
}

#[test]
fn acknowledged_operations_are_recovered_in_order_across_segments() {
    let dir = temp_dir("roundtrip");
    let small = WalOptions {
        segment_bytes_max: 4096,
        ..options(&dir)
    };
    write_with(small.clone(), 1, 200, true);
    write(small.clone(), 201, 50);
    let (_, recovered) = open(small).unwrap();
    assert_eq!(ids(&recovered.operations), expect(1..=250));
    assert!(
        recovered.segments > 3,
        "rotation made {} segments",
        recovered.segments
    );
    assert!(recovered.truncated.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_torn_tail_is_cut_back_and_the_log_goes_on() {
    let dir = temp_dir("torn");
    write(options(&dir), 1, 10);
    let segment = dir.join(segment_name(1));
    tear(&segment, 1, 5);

    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect(1..=9));
    assert_eq!(recovered.truncated.len(), 1, "{:?}", recovered.truncated);
    // The log accepts new writes after the cut, and they are recovered after the survivors.
    write(options(&dir), 100, 1);
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(recovered.operations.len(), 10);
    assert_eq!(ids(&recovered.operations[9..]), expect([100]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_preallocated_segment_ends_where_writing_stopped_and_damage_past_it_is_refused() {
    let dir = temp_dir("prealloc");
    let segment = dir.join(segment_name(1));
    write(options(&dir), 1, 10);
    let size = std::fs::metadata(&segment).unwrap().len();
    let written = written_len(&segment, 1);
    assert_eq!(
        size,
        Settings::default().wal_segment_bytes_max,
        "allocated whole"
    );
    assert!(written < size);
    // Reopened, the log goes on where writing stopped: no torn tail is reported.
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect(1..=10));
    assert!(recovered.truncated.is_empty(), "{:?}", recovered.truncated);
    write(options(&dir), 100, 1);
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations[10..]), expect([100]));
    assert!(written_len(&segment, 1) > written);

    // Bytes written past the unwritten part are damage, refused unless told to cut.
    let end = written_len(&segment, 1);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"stale", end + 4096).unwrap();
    drop(file);
    let error = open(options(&dir)).err().expect("damage is refused");
    assert!(
        matches!(&error, StorageError::Corruption { offset, .. } if *offset == end),
        "{error}"
    );
    let cut = WalOptions {
        recovery: RecoveryMode::TruncateCorrupt,
        ..options(&dir)
    };
    let (_, recovered) = open(cut).unwrap();
    assert_eq!(recovered.operations.len(), 11);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sealed_segments_give_back_their_preallocated_space() {
    let dir = temp_dir("sealed");
    let small = WalOptions {
        segment_bytes_max: 2048,
        ..options(&dir)
    };
    write_with(small.clone(), 1, 120, true);
    let (_, recovered) = open(small).unwrap();
    assert!(recovered.segments >= 2, "{}", recovered.segments);
    for seq in 1..recovered.segments as u64 {
        let path = dir.join(segment_name(seq));
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(size, written_len(&path, seq), "segment {seq}");
    }
    let last = dir.join(segment_name(recovered.segments as u64));
    assert_eq!(std::fs::metadata(&last).unwrap().len(), 2048);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_flipped_bit_mid_log_is_an_error_naming_file_and_offset_unless_told_to_cut() {
    let dir = temp_dir("flip");
    write(options(&dir), 1, 10);
    let segment = dir.join(segment_name(1));
    let mut bytes = std::fs::read(&segment).unwrap();
    let offset = SEGMENT_HEADER_BYTES + 20;
    bytes[offset] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let error = open(options(&dir)).err().expect("corruption is refused");
    let StorageError::Corruption {
        file, offset: at, ..
    } = &error
    else {
        panic!("{error}")
    };
    assert!(file.ends_with(&segment_name(1)), "{file}");
    assert_eq!(
        *at, SEGMENT_HEADER_BYTES as u64,
        "the first record holds the flipped bit"
    );
    assert!(
        error.to_string().contains("truncate-corrupt"),
        "the error says how to override: {error}"
    );

    let cut = WalOptions {
        recovery: RecoveryMode::TruncateCorrupt,
        ..options(&dir)
    };
    let (_, recovered) = open(cut).unwrap();
    assert!(recovered.operations.is_empty());
    assert!(!recovered.truncated.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_segment_before_the_last_is_corruption_even_at_its_end() {
    let dir = temp_dir("middle");
    let small = WalOptions {
        segment_bytes_max: 2048,
        ..options(&dir)
    };
    write_with(small.clone(), 1, 60, true);
    let first = dir.join(segment_name(1));
    let len = std::fs::metadata(&first).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let error = open(small)
        .err()
        .expect("a cut in a sealed segment is not a torn tail");
    assert!(matches!(error, StorageError::Corruption { .. }), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inspect_counts_records_and_tells_a_torn_tail_from_corruption() {
    let dir = temp_dir("inspect");
    let small = WalOptions {
        segment_bytes_max: 2048,
        ..options(&dir)
    };
    write_with(small.clone(), 1, 120, true);
    let report = crest_storage::inspect::inspect(&dir, 1 << 20).unwrap();
    assert!(report.segments.len() > 1);
    assert_eq!(report.entries[0], 120);
    assert_eq!(report.live_messages, 120);
    assert!(!report.is_fatal() && report.segments.iter().all(|s| s.problem.is_none()));
    // Sealed segments are cut back to what was written; the active one is preallocated.
    let (active, sealed) = report.segments.split_last().unwrap();
    assert!(sealed.iter().all(|s| s.written == s.bytes));
    assert!(active.written < active.bytes && active.bytes == 2048);

    let seq = report.segments.len() as u64;
    tear(&dir.join(segment_name(seq)), seq, 1);
    let report = crest_storage::inspect::inspect(&dir, 1 << 20).unwrap();
    let problem = report.segments.last().unwrap().problem.clone().unwrap();
    assert!(
        problem.contains("torn tail") && !report.is_fatal(),
        "{problem}"
    );

    let first = dir.join(segment_name(1));
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[SEGMENT_HEADER_BYTES + 12] ^= 0x80;
    std::fs::write(&first, bytes).unwrap();
    let report = crest_storage::inspect::inspect(&dir, 1 << 20).unwrap();
    assert!(report.is_fatal());
    assert!(
        report.segments[0]
            .problem
            .as_ref()
            .unwrap()
            .contains("offset 32"),
        "{:?}",
        report.segments[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Faults a [`FaultyFile`] injects, shared with the test.
#[derive(Default)]
struct Faults {
    /// Bytes that still fit on the "disk"; a write past it fails with ENOSPC after writing
    /// what fits (a partial write).
    space: AtomicU64,
    /// Syncs that still succeed; the next one fails with EIO and loses the unsynced bytes.
    syncs_left: AtomicU64,
}

/// A segment file whose writes sit in a page cache of its own until a sync succeeds.
struct FaultyFile {
    file: std::fs::File,
    unsynced: Vec<u8>,
    faults: std::sync::Arc<Faults>,
}

impl SegmentFile for FaultyFile {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let synced = self.file.metadata()?.len();
        assert_eq!(
            offset,
            synced + self.unsynced.len() as u64,
            "writes go at the end"
        );
        let space = self.faults.space.load(Ordering::SeqCst) as usize;
        let fits = buf.len().min(space);
        self.unsynced.extend_from_slice(&buf[..fits]);
        self.faults.space.fetch_sub(fits as u64, Ordering::SeqCst);
        if fits < buf.len() {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        Ok(())
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        if self.faults.syncs_left.load(Ordering::SeqCst) == 0 {
            self.unsynced.clear();
            return Err(std::io::Error::from_raw_os_error(5));
        }
        self.faults.syncs_left.fetch_sub(1, Ordering::SeqCst);
        let synced = self.file.metadata()?.len();
        std::os::unix::fs::FileExt::write_all_at(&self.file, &self.unsynced, synced)?;
        self.unsynced.clear();
        self.file.sync_data()
    }

    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        let synced = self.file.metadata()?.len();
        let logical = synced + self.unsynced.len() as u64;
        self.faults
            .space
            .fetch_add(logical.saturating_sub(len), Ordering::SeqCst);
        if len >= synced {
            self.unsynced.truncate((len - synced) as usize);
            Ok(())
        } else {
            self.unsynced.clear();
            self.file.set_len(len)
        }
    }
}

fn faulty(dir: &Path, faults: &std::sync::Arc<Faults>) -> WalOptions {
    let faults = faults.clone();
    let wrapper = FileWrapper(std::sync::Arc::new(move |file| {
        Box::new(FaultyFile {
            file,
            unsynced: Vec::new(),
            faults: faults.clone(),
        }) as Box<dyn SegmentFile>
    }));
    WalOptions {
        sync_failure: SyncFailure::StopWriter,
        file_wrapper: Some(wrapper),
        // The fake page cache appends at sync time: its file holds only what was synced.
        preallocate: false,
        ..options(dir)
    }
}

/// Submits one operation and waits for its completion (or `None` if none comes in 1 s).
fn submit_and_wait(
    handle: &WalHandle,
    rx: &mpsc::Receiver<Vec<Completion>>,
    n: u64,
) -> Option<Result<(), String>> {
    handle.submit(op(n), Some(n)).ok()?;
    let completions = rx.recv_timeout(Duration::from_secs(1)).ok()?;
    assert_eq!(completions.len(), 1);
    Some(completions[0].1.clone().map(|_| ()))
}

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

/// Syncs a [`FaultyFile`] made so far (its budget started at `u64::MAX`).
fn syncs(faults: &Faults) -> u64 {
    u64::MAX - faults.syncs_left.load(Ordering::SeqCst)
}

/// A faulty file with room and syncs to spare, whose writer syncs unwaited appends `after`.
fn unwaited(dir: &Path, after: Duration) -> (std::sync::Arc<Faults>, WalOptions) {
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(u64::MAX / 2),
        syncs_left: AtomicU64::new(u64::MAX),
    });
    let options = WalOptions {
        unwaited_sync_after: after,
        ..faulty(dir, &faults)
    };
    (faults, options)
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
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while syncs(&faults) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(syncs(&faults), 1, "synced by the interval");
    handle.close().unwrap();
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect([1]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A faulty file allowed `syncs` syncs, whose writer holds lingering appends up to `linger`.
fn lingering(dir: &Path, linger: Duration, syncs: u64) -> (std::sync::Arc<Faults>, WalOptions) {
    let faults = std::sync::Arc::new(Faults {
        space: AtomicU64::new(u64::MAX / 2),
        syncs_left: AtomicU64::new(syncs),
    });
    let options = WalOptions {
        linger_sync_after: linger,
        unwaited_sync_after: Duration::from_secs(3600),
        ..faulty(dir, &faults)
    };
    (faults, options)
}

/// A started log as [`lingering`] makes it, with its completions' receiver.
fn start_lingering(
    dir: &Path,
    linger: Duration,
    syncs: u64,
) -> (
    std::sync::Arc<Faults>,
    WalHandle,
    mpsc::Receiver<Vec<Completion>>,
) {
    let (faults, wal_options) = lingering(dir, linger, syncs);
    let (wal, _) = open(wal_options).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    (faults, handle, rx)
}

/// Submits operation `n` as an ack's append: it may linger for a sync.
fn submit_lingering(handle: &WalHandle, n: u64) {
    handle
        .submit_with(op(n), Some(n), SyncWait::Linger)
        .unwrap();
}

/// Submits operation `n` as a push (synced at once) and waits for its completion.
fn push_and_wait(handle: &WalHandle, rx: &mpsc::Receiver<Vec<Completion>>, n: u64) {
    handle.submit(op(n), Some(n)).unwrap();
    let (done, tokens) = completions(rx, 1);
    assert_eq!(tokens, vec![n]);
    assert!(done[0].1.is_ok());
}

/// The next `n` completions, and their tokens in the order they came.
fn completions(rx: &mpsc::Receiver<Vec<Completion>>, n: usize) -> (Vec<Completion>, Vec<u64>) {
    let mut done = Vec::new();
    while done.len() < n {
        done.extend(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    let tokens = done.iter().map(|(token, _)| *token).collect();
    (done, tokens)
}

/// What recovery finds in `dir` after a machine crash now (the faulty file keeps only what
/// was synced).
fn recovered_after_crash(dir: &Path) -> Vec<Vec<MessageId>> {
    let crashed = temp_dir("crash");
    std::fs::create_dir_all(&crashed).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), crashed.join(entry.file_name())).unwrap();
    }
    let (_, recovered) = open(options(&crashed)).unwrap();
    std::fs::remove_dir_all(&crashed).unwrap();
    ids(&recovered.operations)
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

/// Submits an operation and waits until it (and everything queued before it) is durable.
fn barrier(handle: &WalHandle, rx: &mpsc::Receiver<Vec<Completion>>, n: u64) {
    handle.submit(op(n), Some(n)).unwrap();
    loop {
        let done = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        if done
            .iter()
            .any(|(token, result)| *token == n && result.is_ok())
        {
            return;
        }
    }
}

fn files(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .ends_with(suffix)
        })
        .count()
}

#[test]
fn a_checkpoint_replaces_the_log_before_it_and_recovery_starts_from_it() {
    let dir = temp_dir("checkpoint");
    let small = WalOptions {
        segment_bytes_max: 1024,
        ..options(&dir)
    };
    let (wal, _) = open(small.clone()).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    for n in 1..=60 {
        barrier(&handle, &rx, n);
    }
    assert!(files(&dir, ".wal") > 2);
    // The snapshot stands for operations 1..=60 (here: the last ten, as if 1..=50 were acked).
    let snapshot: Vec<LogRecord> = (51..=60).flat_map(op).collect();
    handle
        .checkpoint(snapshot.clone(), Vec::new(), Vec::new())
        .unwrap();
    for n in 61..=65 {
        barrier(&handle, &rx, n);
    }
    assert_eq!(files(&dir, ".ckpt"), 1);
    assert_eq!(
        files(&dir, ".wal"),
        1,
        "every segment before the checkpoint is gone"
    );
    handle.close().unwrap();

    let (_, recovered) = open(small.clone()).unwrap();
    assert!(recovered.checkpoint.is_some());
    let mut expected = ids(&[snapshot]);
    expected.extend(expect(61..=65));
    assert_eq!(ids(&recovered.operations), expected);

    // A crash in the middle of the next checkpoint leaves a temporary file: it is ignored.
    std::fs::write(
        dir.join("99999999999999999999.ckpt.tmp"),
        b"half a checkpoint",
    )
    .unwrap();
    let (_, again) = open(small.clone()).unwrap();
    assert_eq!(ids(&again.operations), expected);
    assert_eq!(files(&dir, ".tmp"), 0);
    let report = crest_storage::inspect::inspect(&dir, 1 << 20).unwrap();
    assert_eq!(report.live_messages, 15, "10 in the checkpoint, 5 after it");
    assert!(report.segments[0].name.ends_with(".ckpt") && !report.is_fatal());

    // A complete checkpoint that fails its checksum is corruption, never silently skipped.
    let checkpoint = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .unwrap();
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    bytes[SEGMENT_HEADER_BYTES + 30] ^= 0x04;
    std::fs::write(&checkpoint, bytes).unwrap();
    let error = open(small).err().expect("a corrupt checkpoint is refused");
    assert!(error.to_string().contains("checkpoint"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bodies_are_read_back_where_completions_say_and_a_checkpoint_keeps_the_segments_holding_them() {
    let dir = temp_dir("bodies");
    let small = WalOptions {
        segment_bytes_max: 300,
        ..options(&dir)
    };
    let (wal, _) = open(small.clone()).unwrap();
    let (tx, rx) = mpsc::channel::<Vec<Completion>>();
    let handle = wal.start(move |done| tx.send(done).unwrap()).unwrap();
    let mut locations = std::collections::HashMap::new();
    for n in 1..=40 {
        handle.submit(op(n), Some(n)).unwrap();
        let done = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        for (token, result) in done {
            let mut found = result.unwrap();
            assert_eq!(found.len(), 1, "one body per enqueue");
            locations.insert(token, found.remove(0));
        }
    }
    let mut reader = crest_storage::wal::BodyReader::new(dir.clone());
    for n in [1, 17, 40] {
        let body = reader.read(&locations[&n]).unwrap();
        assert_eq!(body.payload, bytes::Bytes::from(format!("payload {n}")));
    }
    let keep = locations[&3].segment;
    let last = locations[&40].segment;
    assert!(keep + 2 < last, "the messages span many segments");
    // A snapshot keeping message 3 (its body stays in its segment) while append 41 is still
    // pending: replay must start at 41, and 3's segment must survive the checkpoint.
    let snapshot = vec![LogRecord::Index {
        head: head(3),
        size: 9,
        location: locations[&3],
    }];
    handle.submit(op(41), Some(41)).unwrap();
    handle
        .checkpoint(snapshot.clone(), vec![41], vec![keep])
        .unwrap();
    barrier(&handle, &rx, 42);
    handle.close().unwrap();
    let present: Vec<u64> = {
        let mut seqs: Vec<u64> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                crest_storage::format::parse_segment_name(e.unwrap().file_name().to_str()?)
            })
            .collect();
        seqs.sort_unstable();
        seqs
    };
    assert!(present.contains(&u64::from(keep)), "{present:?}");
    assert!(
        !present.contains(&u64::from(locations[&20].segment)),
        "a segment holding no kept body is deleted: {present:?}"
    );
    let (_, recovered) = open(small.clone()).unwrap();
    let mut expected = ids(&[snapshot]);
    expected.extend(expect([41, 42]));
    assert_eq!(ids(&recovered.operations), expected);
    let mut reader = crest_storage::wal::BodyReader::new(dir.clone());
    assert_eq!(
        reader.read(&locations[&3]).unwrap().payload,
        bytes::Bytes::from("payload 3")
    );
    let report = crest_storage::inspect::inspect(&dir, 1 << 20).unwrap();
    assert!(!report.is_fatal(), "{report:?}");
    assert_eq!(
        report.live_messages, 3,
        "3 in the checkpoint, 41 and 42 after it"
    );

    // A checkpoint whose body segment is gone is refused, naming it, unless told to cut.
    std::fs::remove_file(dir.join(segment_name(u64::from(keep)))).unwrap();
    let error = open(small.clone()).err().expect("a missing body segment");
    assert!(
        error.to_string().contains(&segment_name(u64::from(keep))),
        "{error}"
    );
    let (_, cut) = open(WalOptions {
        recovery: RecoveryMode::TruncateCorrupt,
        ..small
    })
    .unwrap();
    let mut expected = vec![vec![]];
    expected.extend(expect([41, 42]));
    assert_eq!(ids(&cut.operations), expected, "message 3 is dropped");
    assert!(!cut.truncated.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_log_of_another_format_version_is_refused_by_name_and_never_cut() {
    let dir = temp_dir("version");
    write(options(&dir), 1, 3);
    // Make segment 1 a version-2 file, as an older crest wrote it.
    let path = dir.join(segment_name(1));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&2u32.to_be_bytes());
    let crc = crc32fast::hash(&bytes[..24]);
    bytes[24..28].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(&path, &bytes).unwrap();
    for recovery in [
        RecoveryMode::TolerateTornTail,
        RecoveryMode::TruncateCorrupt,
    ] {
        let error = open(WalOptions {
            recovery,
            ..options(&dir)
        })
        .err()
        .expect("an older format is refused");
        assert!(
            matches!(&error, StorageError::Version { file, found: 2, expected: 3 } if file.ends_with(&segment_name(1))),
            "{error}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A segment file whose syncs take at least `SLOW_SYNC` longer than the disk's.
struct SlowSyncFile(std::fs::File);

const SLOW_SYNC: Duration = Duration::from_millis(30);

impl SegmentFile for SlowSyncFile {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        std::thread::sleep(SLOW_SYNC);
        self.0.sync_data()
    }

    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
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

#[test]
fn a_second_open_of_a_data_directory_is_refused_until_the_writer_has_stopped() {
    let dir = temp_dir("lock");
    let (wal, _) = open(options(&dir)).unwrap();
    let refused = open(options(&dir)).err().expect("a second open is refused");
    assert!(
        matches!(refused, StorageError::Locked { holder: Some(pid), .. } if pid == std::process::id()),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains(&format!("in use by process {}", std::process::id())),
        "{refused}"
    );
    let handle = wal.start(|_| {}).unwrap();
    handle.submit(op(1), Some(1)).unwrap();
    assert!(matches!(
        open(options(&dir)),
        Err(StorageError::Locked { .. })
    ));
    // A closed log is written, synced and unlocked: it opens again at once, whole.
    handle.close().unwrap();
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(ids(&recovered.operations), expect([1]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_io_error_keeps_its_kind() {
    let parent = temp_dir("kind");
    std::fs::create_dir_all(&parent).unwrap();
    let file = parent.join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let error = open(options(&file.join("log")))
        .err()
        .expect("no log inside a file");
    let StorageError::Io { kind, path, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*kind, std::io::ErrorKind::NotADirectory, "{error}");
    assert!(path.contains("not-a-directory"), "{error}");
    std::fs::remove_dir_all(&parent).unwrap();
}
