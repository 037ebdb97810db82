//! The log on real files: group-committed writes, rotation, and recovery after damage.

use crest_core::config::Durability;
use crest_core::id::{LeafId, MessageId};
use crest_core::leaf::LogRecord;
use crest_storage::StorageError;
use crest_storage::format::{SEGMENT_HEADER_BYTES, segment_name};
use crest_storage::wal::{Completion, RecoveryMode, WalOptions, open};
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
        dir: dir.to_path_buf(),
        segment_bytes_max: 64 * 1024 * 1024,
        record_bytes_max: 1 << 20,
        durability: Durability::Fsync,
        recovery: RecoveryMode::TolerateTornTail,
        queue_ops_max: 1024,
        write_batch_bytes_max: 1 << 20,
    }
}

fn op(n: u64) -> Vec<LogRecord> {
    vec![LogRecord::Enqueue {
        id: MessageId::new(LeafId(1), n),
        topic: "jobs".into(),
        priority: (n % 5) as u32,
        ready_at: crest_core::Time(n),
        enqueued_at: crest_core::Time(n),
        metadata: vec![],
        payload: bytes::Bytes::from(format!("payload {n}")),
    }]
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
    assert_eq!(recovered.operations, (1..=250).map(op).collect::<Vec<_>>());
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
    let len = std::fs::metadata(&segment).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    file.set_len(len - 5).unwrap();
    drop(file);

    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(recovered.operations, (1..=9).map(op).collect::<Vec<_>>());
    assert_eq!(recovered.truncated.len(), 1, "{:?}", recovered.truncated);
    // The log accepts new writes after the cut, and they are recovered after the survivors.
    write(options(&dir), 100, 1);
    let (_, recovered) = open(options(&dir)).unwrap();
    assert_eq!(recovered.operations.len(), 10);
    assert_eq!(recovered.operations[9], op(100));
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

    let last = dir.join(segment_name(report.segments.len() as u64));
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
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
