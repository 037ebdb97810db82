//! Golden fixtures of the disk format: a segment and a checkpoint written by the real log
//! writer, committed under `tests/fixtures/vN/` for every version this build reads (3: lease
//! records without their token; 4: with it). Both directions are checked byte for byte:
//! - what this build writes for the fixture's records is exactly the committed files, so a
//!   refactor cannot silently change the format (a deliberate change bumps
//!   `SEGMENT_VERSION`, adds fixtures of the new version and keeps these, read or refused by
//!   name);
//! - what this build reads from the committed files is exactly the fixture's records, and a
//!   leaf's log made of them recovers.
//!
//! `CREST_BLESS=1 cargo test -p crest-storage --test golden` rewrites the fixtures.

use bytes::Bytes;
use crest_core::config::Settings;
use crest_core::id::{LeafId, MessageId};
use crest_core::record::{Location, LogRecord, MessageHead};
use crest_core::time::Time;
use crest_storage::format::{
    SEGMENT_HEADER_BYTES, SEGMENT_VERSION, SEGMENT_VERSIONS_READ, checkpoint_name, decode_body,
    file_version, read_checkpoint, scan_segment, segment_name,
};
use crest_storage::wal::{Completion, WalOptions, open};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

const RECORD_BYTES_MAX: u32 = 1 << 20;

fn fixtures(version: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/v{version}"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crest-golden-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn id(seq: u64) -> MessageId {
    MessageId::new(LeafId(7), seq)
}

fn head(
    seq: u64,
    priority: u32,
    dedup_key: Option<&str>,
    fairness_key: Option<&str>,
) -> MessageHead {
    MessageHead {
        id: id(seq),
        topic: "orders".into(),
        priority,
        ready_at: Time(1_700_000_000_000 + seq),
        enqueued_at: Time(1_700_000_000_000),
        expires_at: (seq == 2).then_some(Time(1_700_000_060_000)),
        dedup_key: dedup_key.map(str::to_string),
        fairness_key: fairness_key.map(str::to_string),
    }
}

/// One storage operation of each kind a leaf logs, with every optional field set somewhere.
/// The fixture's operations as a log of `version` holds them (version 3 logged no lease
/// tokens: they read back as 0; versions before 5 no fairness keys: none).
fn operations(version: u32) -> Vec<Vec<LogRecord>> {
    vec![
        vec![
            LogRecord::Enqueue {
                head: head(1, 0, None, None),
                metadata: vec![],
                payload: Bytes::from_static(b"urgent"),
            },
            LogRecord::Enqueue {
                head: head(2, 3, Some("order-42"), (version >= 5).then_some("tenant-7")),
                metadata: vec![("trace".into(), "abc".into()), ("from".into(), "eu".into())],
                payload: Bytes::from(vec![0u8, 1, 2, 255]),
            },
        ],
        vec![LogRecord::Lease {
            id: id(1),
            attempt: 1,
            deadline: Time(1_700_000_030_000),
            token: if version >= 4 { 0x5eed_1ea5e } else { 0 },
        }],
        vec![LogRecord::Release {
            id: id(1),
            attempt: 1,
            ready_at: Time(1_700_000_040_000),
        }],
        vec![
            LogRecord::Dead {
                id: id(1),
                reason: "nacked: bad input".into(),
                at: Time(1_700_000_050_000),
            },
            LogRecord::Redrive { id: id(1) },
        ],
        vec![LogRecord::Delete { id: id(2) }],
    ]
}

/// The checkpoint's snapshot: an index entry whose body is in segment 1, and a dedup key.
fn snapshot(location: Location) -> Vec<LogRecord> {
    vec![
        LogRecord::Index {
            head: MessageHead {
                dedup_key: None,
                ..head(1, 0, None, None)
            },
            size: 6,
            location,
        },
        LogRecord::Dedup {
            topic: "orders".into(),
            key: "order-42".into(),
            id: id(2),
            until: Time(1_700_000_300_000),
        },
    ]
}

fn options(dir: &Path) -> WalOptions {
    let settings = Settings {
        wal_preallocate: false,
        ..Settings::default()
    };
    WalOptions {
        record_bytes_max: RECORD_BYTES_MAX,
        ..WalOptions::new(dir.to_path_buf(), &settings)
    }
}

/// Writes the fixture's operations and checkpoint with the real writer into `dir`; returns the
/// location of message 1's body.
fn write_log(dir: &Path) -> Location {
    let (wal, _) = open(options(dir)).expect("open a new log");
    let (tx, rx) = mpsc::channel::<Vec<Completion>>();
    let handle = wal
        .start(move |done| {
            let _ = tx.send(done);
        })
        .expect("start the writer");
    let mut first_location = None;
    for (token, records) in operations(SEGMENT_VERSION).into_iter().enumerate() {
        handle.submit(records, Some(token as u64)).expect("submit");
        let done = rx.recv().expect("a completion");
        let (_, result) = &done[0];
        let locations = result.as_ref().expect("durable");
        if token == 0 {
            first_location = Some(locations[0]);
        }
    }
    let location = first_location.expect("the first operation placed bodies");
    handle
        .checkpoint(snapshot(location), Vec::new(), vec![1])
        .expect("queue the checkpoint");
    handle.close().expect("the writer stops cleanly");
    location
}

#[test]
fn this_build_writes_the_committed_fixtures_of_its_version_byte_for_byte() {
    let fixtures = || fixtures(SEGMENT_VERSION);
    let dir = temp_dir("write");
    write_log(&dir);
    let names = [segment_name(1), segment_name(2), checkpoint_name(2)];
    if std::env::var_os("CREST_BLESS").is_some() {
        std::fs::create_dir_all(fixtures()).unwrap();
        for name in &names {
            std::fs::copy(dir.join(name), fixtures().join(name)).unwrap();
        }
    }
    for name in &names {
        let written = std::fs::read(dir.join(name)).unwrap();
        let committed = std::fs::read(fixtures().join(name))
            .unwrap_or_else(|e| panic!("fixture {name}: {e} (bless with CREST_BLESS=1)"));
        assert!(
            written == committed,
            "{name}: this build writes {} bytes that differ from the committed v{SEGMENT_VERSION} \
             fixture ({} bytes): the disk format changed. Bump SEGMENT_VERSION and keep reading \
             this one, or refuse it by name",
            written.len(),
            committed.len()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_committed_fixtures_of_every_version_read_decode_to_their_records() {
    assert!(
        fixtures(SEGMENT_VERSION).exists(),
        "a new version needs fixtures of its own"
    );
    for version in SEGMENT_VERSIONS_READ {
        decodes(version);
    }
}

fn decodes(version: u32) {
    let fixtures = || fixtures(version);
    let segment = std::fs::read(fixtures().join(segment_name(1))).unwrap();
    assert_eq!(file_version(&segment), Some(version));
    let scan = scan_segment(&segment, 1, RECORD_BYTES_MAX, SEGMENT_HEADER_BYTES);
    assert_eq!(scan.stop, None, "the fixture segment scans whole");
    assert_eq!(scan.valid_len, segment.len() as u64);
    // Segments give back an `Index` with the body's location where an `Enqueue` was written:
    // read each body there and put the `Enqueue` back together.
    let decoded: Vec<Vec<LogRecord>> = scan
        .operations
        .into_iter()
        .map(|records| {
            records
                .into_iter()
                .map(|record| match record {
                    LogRecord::Index {
                        head,
                        size,
                        location,
                    } => {
                        let start = location.offset as usize;
                        let bytes = &segment[start..start + location.len as usize];
                        let body = decode_body(&location, bytes).expect("the body decodes");
                        assert_eq!(size as usize, body.payload.len());
                        LogRecord::Enqueue {
                            head,
                            metadata: body.metadata,
                            payload: body.payload,
                        }
                    }
                    other => other,
                })
                .collect()
        })
        .collect();
    assert_eq!(decoded, operations(version), "version {version}");

    let checkpoint = std::fs::read(fixtures().join(checkpoint_name(2))).unwrap();
    let read = read_checkpoint(&checkpoint, 2, RECORD_BYTES_MAX).expect("the checkpoint reads");
    assert_eq!(read.replay_from, (2, SEGMENT_HEADER_BYTES as u64));
    let records: Vec<LogRecord> = read.chunks.into_iter().flatten().collect();
    let LogRecord::Index { location, .. } = &records[0] else {
        panic!("the snapshot starts with message 1's index entry: {records:?}");
    };
    assert_eq!(location.segment, 1);
    assert_eq!(records, snapshot(*location));
}

#[test]
fn a_log_made_of_the_fixtures_of_every_version_read_recovers() {
    for version in SEGMENT_VERSIONS_READ {
        recovers(version);
    }
}

fn recovers(version: u32) {
    let fixtures = || fixtures(version);
    let dir = temp_dir(&format!("recover-v{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [segment_name(1), segment_name(2), checkpoint_name(2)] {
        std::fs::copy(fixtures().join(&name), dir.join(&name)).unwrap();
    }
    let (_, recovered) = open(options(&dir)).expect("the fixture log recovers");
    assert_eq!(recovered.segments, 1, "replay reads segment 2, empty");
    assert_eq!(recovered.checkpoint, Some(2));
    let records: Vec<LogRecord> = recovered.operations.into_iter().flatten().collect();
    let LogRecord::Index { location, .. } = &records[0] else {
        panic!("recovery starts from the checkpoint's index entry: {records:?}");
    };
    assert_eq!(records, snapshot(*location));
    // The body it points at is message 1's, read from the fixture segment.
    let mut reader = crest_storage::wal::BodyReader::new(dir.clone());
    let body = reader.read(location).expect("the body reads back");
    assert_eq!(body.payload, Bytes::from_static(b"urgent"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_whose_replay_segment_is_missing_starts_a_new_one_after_the_kept_segments() {
    // Segment 2 (empty when the checkpoint was taken) is gone; segment 1 still holds a body
    // the checkpoint refers to. Recovery starts segment 2 again, never writing over 1.
    let fixtures = || fixtures(SEGMENT_VERSION);
    let dir = temp_dir("missing-tail");
    std::fs::create_dir_all(&dir).unwrap();
    for name in [segment_name(1), checkpoint_name(2)] {
        std::fs::copy(fixtures().join(&name), dir.join(&name)).unwrap();
    }
    let (wal, recovered) = open(options(&dir)).expect("recovers without its empty tail");
    assert_eq!(recovered.checkpoint, Some(2));
    drop(wal);
    let segment = std::fs::read(fixtures().join(segment_name(1))).unwrap();
    assert_eq!(std::fs::read(dir.join(segment_name(1))).unwrap(), segment);
    assert!(dir.join(segment_name(2)).exists(), "a new segment 2");
    std::fs::remove_dir_all(&dir).unwrap();
}
