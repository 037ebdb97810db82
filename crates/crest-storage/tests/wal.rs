//! The log on real files: group-committed writes, rotation, recovery after damage, checkpoints,
//! format versions and the data directory's lock.

mod common;

use common::*;
use crest_core::config::Settings;
use crest_core::record::LogRecord;
use crest_storage::StorageError;
use crest_storage::format::{SEGMENT_HEADER_BYTES, segment_name};
use crest_storage::wal::{Completion, RecoveryMode, WalOptions, open};
use std::sync::mpsc;
use std::time::Duration;

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
            matches!(&error, StorageError::Version { file, found: 2, expected: 5 } if file.ends_with(&segment_name(1))),
            "{error}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
    std::fs::remove_dir_all(&dir).unwrap();
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
