//! What the log's tests share: temporary directories, records, writers that wait for their
//! completions, and segment files that inject faults.
// Each test binary uses a part of these helpers.
#![allow(dead_code)]

use crest_core::config::Settings;
use crest_core::id::{LeafId, MessageId};
use crest_core::machine::SyncWait;
use crest_core::record::{LogRecord, MessageHead};
use crest_storage::format::{SEGMENT_HEADER_BYTES, scan_segment};
use crest_storage::wal::{
    Completion, FileWrapper, SegmentFile, SyncFailure, WalHandle, WalOptions, open,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("crest-wal-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub(crate) fn options(dir: &Path) -> WalOptions {
    WalOptions {
        record_bytes_max: 1 << 20,
        ..WalOptions::new(dir.to_path_buf(), &Settings::default())
    }
}

/// Where writing stopped in segment `seq` at `path` (a preallocated file is longer).
pub(crate) fn written_len(path: &Path, seq: u64) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    scan_segment(&bytes, seq, 1 << 20, SEGMENT_HEADER_BYTES).valid_len
}

/// Loses the last `n` written bytes of segment `seq`, as a crash does to a write that was
/// never synced: a preallocated file keeps its length (the bytes read as zeros again), a
/// growing one is shorter.
pub(crate) fn tear(path: &Path, seq: u64, n: u64) {
    let written = written_len(path, seq);
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    if file.metadata().unwrap().len() > written {
        let zeros = vec![0u8; n as usize];
        std::os::unix::fs::FileExt::write_all_at(&file, &zeros, written - n).unwrap();
    } else {
        file.set_len(written - n).unwrap();
    }
}

pub(crate) fn head(n: u64) -> MessageHead {
    MessageHead {
        id: MessageId::new(LeafId(1), n),
        topic: "jobs".into(),
        priority: (n % 5) as u32,
        ready_at: crest_core::Time(n),
        enqueued_at: crest_core::Time(n),
        expires_at: None,
        dedup_key: None,
        fairness_key: None,
    }
}

pub(crate) fn op(n: u64) -> Vec<LogRecord> {
    vec![LogRecord::Enqueue {
        head: head(n),
        metadata: vec![],
        payload: bytes::Bytes::from(format!("payload {n}")),
    }]
}

/// Recovery's operations with each message record reduced to its id: segments give back an
/// `Index` (with the body's location) where an `Enqueue` was written.
pub(crate) fn ids(operations: &[Vec<LogRecord>]) -> Vec<Vec<MessageId>> {
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

pub(crate) fn expect(ns: impl IntoIterator<Item = u64>) -> Vec<Vec<MessageId>> {
    ns.into_iter().map(|n| ids(&[op(n)]).remove(0)).collect()
}

/// Writes `count` operations with tokens and waits until each is reported durable. With
/// `one_by_one`, each waits for the previous one, so every group commit holds one operation.
pub(crate) fn write_with(options: WalOptions, from: u64, count: u64, one_by_one: bool) {
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

pub(crate) fn write(options: WalOptions, from: u64, count: u64) {
    write_with(options, from, count, false)
}

/// Faults a [`FaultyFile`] injects, shared with the test.
#[derive(Default)]
pub(crate) struct Faults {
    /// Bytes that still fit on the "disk"; a write past it fails with ENOSPC after writing
    /// what fits (a partial write).
    pub(crate) space: AtomicU64,
    /// Syncs that still succeed; the next one fails with EIO and loses the unsynced bytes.
    pub(crate) syncs_left: AtomicU64,
}

/// A segment file whose writes sit in a page cache of its own until a sync succeeds; its
/// clones (for syncing from another thread) share that cache, as handles on one file do.
pub(crate) struct FaultyFile {
    pub(crate) cached: std::sync::Arc<std::sync::Mutex<Cached>>,
    pub(crate) faults: std::sync::Arc<Faults>,
}

/// A [`FaultyFile`]'s file and what was written to it and not synced.
pub(crate) struct Cached {
    pub(crate) file: std::fs::File,
    pub(crate) unsynced: Vec<u8>,
}

impl FaultyFile {
    fn cached(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.cached.lock().unwrap()
    }
}

impl SegmentFile for FaultyFile {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let faults = self.faults.clone();
        let mut cached = self.cached();
        let synced = cached.file.metadata()?.len();
        assert_eq!(
            offset,
            synced + cached.unsynced.len() as u64,
            "writes go at the end"
        );
        let space = faults.space.load(Ordering::SeqCst) as usize;
        let fits = buf.len().min(space);
        cached.unsynced.extend_from_slice(&buf[..fits]);
        faults.space.fetch_sub(fits as u64, Ordering::SeqCst);
        if fits < buf.len() {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        Ok(())
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        let faults = self.faults.clone();
        let mut cached = self.cached();
        if faults.syncs_left.load(Ordering::SeqCst) == 0 {
            cached.unsynced.clear();
            return Err(std::io::Error::from_raw_os_error(5));
        }
        faults.syncs_left.fetch_sub(1, Ordering::SeqCst);
        let synced = cached.file.metadata()?.len();
        let unsynced = std::mem::take(&mut cached.unsynced);
        std::os::unix::fs::FileExt::write_all_at(&cached.file, &unsynced, synced)?;
        cached.file.sync_data()
    }

    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        let faults = self.faults.clone();
        let mut cached = self.cached();
        let synced = cached.file.metadata()?.len();
        let logical = synced + cached.unsynced.len() as u64;
        faults
            .space
            .fetch_add(logical.saturating_sub(len), Ordering::SeqCst);
        if len >= synced {
            cached.unsynced.truncate((len - synced) as usize);
            Ok(())
        } else {
            cached.unsynced.clear();
            cached.file.set_len(len)
        }
    }

    fn try_clone(&self) -> Option<std::io::Result<Box<dyn SegmentFile>>> {
        Some(Ok(Box::new(FaultyFile {
            cached: self.cached.clone(),
            faults: self.faults.clone(),
        })))
    }
}

pub(crate) fn faulty(dir: &Path, faults: &std::sync::Arc<Faults>) -> WalOptions {
    let faults = faults.clone();
    let wrapper = FileWrapper(std::sync::Arc::new(move |file| {
        Box::new(FaultyFile {
            cached: std::sync::Arc::new(std::sync::Mutex::new(Cached {
                file,
                unsynced: Vec::new(),
            })),
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
pub(crate) fn submit_and_wait(
    handle: &WalHandle,
    rx: &mpsc::Receiver<Vec<Completion>>,
    n: u64,
) -> Option<Result<(), String>> {
    handle.submit(op(n), Some(n)).ok()?;
    let completions = rx.recv_timeout(Duration::from_secs(1)).ok()?;
    assert_eq!(completions.len(), 1);
    Some(completions[0].1.clone().map(|_| ()))
}

/// Syncs a [`FaultyFile`] made so far (its budget started at `u64::MAX`).
pub(crate) fn syncs(faults: &Faults) -> u64 {
    u64::MAX - faults.syncs_left.load(Ordering::SeqCst)
}

/// A faulty file with room and syncs to spare, whose writer syncs unwaited appends `after`.
pub(crate) fn unwaited(dir: &Path, after: Duration) -> (std::sync::Arc<Faults>, WalOptions) {
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

/// A faulty file allowed `syncs` syncs, whose writer holds lingering appends up to `linger`.
pub(crate) fn lingering(
    dir: &Path,
    linger: Duration,
    syncs: u64,
) -> (std::sync::Arc<Faults>, WalOptions) {
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
pub(crate) fn start_lingering(
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
pub(crate) fn submit_lingering(handle: &WalHandle, n: u64) {
    handle
        .submit_with(op(n), Some(n), SyncWait::Linger)
        .unwrap();
}

/// Submits operation `n` as a push (synced at once) and waits for its completion.
pub(crate) fn push_and_wait(handle: &WalHandle, rx: &mpsc::Receiver<Vec<Completion>>, n: u64) {
    handle.submit(op(n), Some(n)).unwrap();
    let (done, tokens) = completions(rx, 1);
    assert_eq!(tokens, vec![n]);
    assert!(done[0].1.is_ok());
}

/// The next `n` completions, and their tokens in the order they came.
pub(crate) fn completions(
    rx: &mpsc::Receiver<Vec<Completion>>,
    n: usize,
) -> (Vec<Completion>, Vec<u64>) {
    let mut done = Vec::new();
    while done.len() < n {
        done.extend(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    let tokens = done.iter().map(|(token, _)| *token).collect();
    (done, tokens)
}

/// What recovery finds in `dir` after a machine crash now (the faulty file keeps only what
/// was synced).
pub(crate) fn recovered_after_crash(dir: &Path) -> Vec<Vec<MessageId>> {
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

/// Submits an operation and waits until it (and everything queued before it) is durable.
pub(crate) fn barrier(handle: &WalHandle, rx: &mpsc::Receiver<Vec<Completion>>, n: u64) {
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

pub(crate) fn files(dir: &Path, suffix: &str) -> usize {
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

/// A segment file whose syncs take at least `SLOW_SYNC` longer than the disk's.
pub(crate) struct SlowSyncFile(pub(crate) std::fs::File);

pub(crate) const SLOW_SYNC: Duration = Duration::from_millis(30);

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
