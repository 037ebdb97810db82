//! The write-ahead log on disk: recovery at open, then a group-commit writer thread.
//!
//! # Group commit
//! One thread owns the active segment. It takes every operation waiting in its queue (up to
//! `write_batch_bytes_max`), writes them with one `write`, then — in [`Durability::Fsync`] mode
//! — one `fdatasync`, and only then reports them complete: every push batch in the group is
//! acknowledged by the same sync. In [`Durability::Buffered`] mode completion is reported after
//! the write (a process crash loses nothing, a machine crash loses the last moments).
//!
//! Not every waiter is in a hurry. While pushes are coming (an append with [`SyncWait::Now`]
//! forced a sync within `linger_sync_after`), an append submitted with [`SyncWait::Linger`]
//! (an ack's delete) is written at once, but its completion is held until the next sync a
//! push forces, or until `linger_sync_after` has passed: it is still reported only once
//! durable, and a push arriving meanwhile waits for one sync instead of two. With no pushes
//! coming it is synced at once, like a push. Completions are always reported in log order.
//!
//! # Failures
//! A failed write (disk full, I/O error) is cut back from the file and reported as failed for
//! every operation of its group; nothing of it is acknowledged and the writer goes on. A failed
//! `fdatasync` is fatal: the process aborts, because after it the kernel may have dropped the
//! dirty pages and the state of the file is unknown; recovery on restart decides what
//! survived. The writer never retries a sync.
//!
//! # Bodies
//! Each completion carries the [`Location`] of every message body its append wrote (see
//! [`crate::format`], "Bodies in place"); [`BodyReader`] reads them back.
//!
//! # Checkpoints
//! A checkpoint job (a snapshot of the leaf equivalent to everything before it but the appends
//! it `includes`) takes effect in log order: the writer syncs and seals the active segment,
//! starts segment S, writes the snapshot with its replay start (the first included append, or
//! the start of S) to `S.ckpt.tmp`, syncs it, renames it to `S.ckpt`, syncs the directory, and
//! only then deletes the older checkpoints and the segments before the replay start that hold
//! no body the snapshot keeps. A crash at any point leaves either the old log whole or the new
//! checkpoint whole.
//!
//! # Recovery
//! [`open`] loads the newest checkpoint (if any; an incomplete one is corruption), checks that
//! every segment its bodies are in exists, then scans the log from the checkpoint's replay
//! start, in order. A bad record at the very end of the last segment is
//! a torn tail: the file is cut back to the last valid record, synced, and the log opens. Any
//! other bad record fails with [`StorageError::Corruption`] naming the file and offset, unless
//! [`RecoveryMode::TruncateCorrupt`] explicitly says to cut the log there (discarding
//! everything after it).

use crate::StorageError;
use crate::format::{
    SEGMENT_HEADER_BYTES, SEGMENT_VERSION, body_location, checkpoint_header, checkpoint_name,
    decode_body, encode_checkpoint_start, encode_record, file_version, parse_checkpoint_name,
    parse_segment_name, read_checkpoint, scan_segment_file, segment_header, segment_name,
};
use crest_core::config::{Durability, Settings};
use crest_core::machine::SyncWait;
use crest_core::record::{Location, LogRecord, MessageBody};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// What recovery does about a bad record that is not a torn tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Cut back a torn tail of the last segment; fail on anything else (the default).
    #[default]
    TolerateTornTail,
    /// Cut the log at the first bad record, wherever it is, discarding all that follows.
    /// Explicit data loss: for an operator who would rather start than keep the node down.
    TruncateCorrupt,
}

/// The file operations the writer performs on the active segment. Production uses
/// [`std::fs::File`]; tests wrap it to inject faults (a full disk, a failing sync, writes lost
/// because they were never synced) without global failpoints.
pub trait SegmentFile: Send {
    /// Writes all of `buf` at `offset`, the end of what was written so far (the file may be
    /// longer: preallocated).
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes everything written so far durable (`fdatasync`).
    fn sync_data(&mut self) -> std::io::Result<()>;
    /// Cuts the file back to `len` bytes.
    fn set_len(&mut self, len: u64) -> std::io::Result<()>;
}

impl SegmentFile for File {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        File::set_len(self, len)
    }
}

/// Turns each opened segment file into the [`SegmentFile`] the writer uses (fault injection).
#[derive(Clone)]
pub struct FileWrapper(pub std::sync::Arc<dyn Fn(File) -> Box<dyn SegmentFile> + Send + Sync>);

impl std::fmt::Debug for FileWrapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileWrapper")
    }
}

/// What the writer does when `fdatasync` fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncFailure {
    /// Abort the process (the default, and the only safe choice in production: the kernel may
    /// have dropped the dirty pages, so nothing about the file can be trusted until recovery).
    #[default]
    Abort,
    /// Fail the group and stop the writer: every later operation fails too. For tests that
    /// check the node stops acknowledging.
    StopWriter,
}

/// How a log is opened.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// The log's directory (created if missing).
    pub dir: PathBuf,
    /// A segment is sealed and a new one started past this size.
    pub segment_bytes_max: u64,
    /// Allocate each new segment at `segment_bytes_max` when creating it.
    pub preallocate: bool,
    /// Largest record body.
    pub record_bytes_max: u32,
    /// When completion is reported.
    pub durability: Durability,
    /// What to do about corruption.
    pub recovery: RecoveryMode,
    /// Operations queued for the writer at most.
    pub queue_ops_max: usize,
    /// Bytes the writer gathers into one write at most.
    pub write_batch_bytes_max: usize,
    /// What to do when a sync fails.
    pub sync_failure: SyncFailure,
    /// In fsync mode, a group of appends nobody waits for (no token: leases, expiries,
    /// releases) is written at once but synced with the next group that has a waiter, or
    /// after this long at the latest.
    pub unwaited_sync_after: Duration,
    /// In fsync mode, how long an append submitted with [`SyncWait::Linger`] may wait for a
    /// sync a push forces before the writer syncs for it (zero: at once); it waits only if a
    /// push forced a sync within this long before it.
    pub linger_sync_after: Duration,
    /// Wraps segment files (fault injection); `None` writes to the files directly.
    pub file_wrapper: Option<FileWrapper>,
}

impl WalOptions {
    /// Options for a log in `dir` from a node's settings; abort on a failed sync, no wrapper.
    pub fn new(dir: PathBuf, settings: &Settings) -> WalOptions {
        WalOptions {
            dir,
            segment_bytes_max: settings.wal_segment_bytes_max,
            preallocate: settings.wal_preallocate,
            record_bytes_max: settings.frame_bytes_max,
            durability: settings.durability,
            recovery: RecoveryMode::default(),
            queue_ops_max: settings.wal_queue_ops_max as usize,
            write_batch_bytes_max: settings.wal_write_batch_bytes_max as usize,
            sync_failure: SyncFailure::Abort,
            unwaited_sync_after: Duration::from_millis(settings.wal_unwaited_sync_ms),
            linger_sync_after: Duration::from_micros(settings.wal_ack_sync_linger_us),
            file_wrapper: None,
        }
    }
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Every storage operation in the log, in order (empty with [`open_with`]).
    pub operations: Vec<Vec<LogRecord>>,
    /// Segment files read.
    pub segments: usize,
    /// The checkpoint recovery started from (the segment it starts the log at).
    pub checkpoint: Option<u64>,
    /// Bytes cut from a torn tail, or discarded by `TruncateCorrupt`, with where.
    pub truncated: Vec<String>,
}

/// The completion of one operation that carried a token: where the bodies it wrote are.
pub type Completion = (u64, Result<Vec<Location>, String>);

/// The log, recovered and ready to start writing.
pub struct Wal {
    options: WalOptions,
    /// The data directory's `LOCK` file, exclusively `flock`ed: released when the writer ends.
    _lock: File,
    seq: u64,
    file: Box<dyn SegmentFile>,
    len: u64,
    /// Set after a failed sync in `SyncFailure::StopWriter` mode.
    stopped: bool,
    /// Since when bytes written are not synced (fsync mode: appends nobody waited for).
    unsynced_since: Option<Instant>,
    /// Tokens of recent appends that failed (bounded), to abandon checkpoints holding them.
    failed_tokens: VecDeque<u64>,
    /// Where recent appends with tokens start (bounded): a checkpoint's replay start.
    positions: VecDeque<(u64, (u64, u64))>,
    /// Time spent in `fdatasync` since the last completions were reported (see
    /// [`GroupTiming`]).
    synced_for: Option<Duration>,
    /// Completions of lingering appends written but not yet synced, in log order, and since
    /// when the first of them waits.
    held: Vec<Completion>,
    held_since: Option<Instant>,
    /// When a push (an append with [`SyncWait::Now`]) last forced a sync: a lingering append
    /// waits only while pushes are coming.
    pushed_at: Option<Instant>,
    /// Completions ready to report, in log order.
    ready: Vec<Completion>,
}

/// How the group that carried a set of completions was made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupTiming {
    /// Time the group spent in `fdatasync` (more than one sync when the segment rotated);
    /// `None` when it was not synced (`buffered` durability, or no append waited).
    pub sync: Option<Duration>,
}

fn io_error(path: &Path, error: std::io::Error) -> StorageError {
    StorageError::io(path, &error)
}

/// The file in a data directory whose exclusive `flock` the log holds while it is open. It
/// holds the process id of its holder, for the error a second process gets.
pub const LOCK_FILE: &str = "LOCK";

/// Takes the exclusive lock of `dir` (see [`LOCK_FILE`]) without waiting for it.
fn lock_dir(dir: &Path) -> Result<File, StorageError> {
    use rustix::fs::{FlockOperation, flock};
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(StorageError::Locked {
                dir: dir.display().to_string(),
                holder: holder.trim().parse().ok(),
            });
        }
        Err(errno) => return Err(io_error(&path, errno.into())),
    }
    // Who holds it, for the error of the next one to try (best effort: the lock is what counts).
    let _ = file
        .set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    Ok(file)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

fn segments(dir: &Path) -> Result<Vec<u64>, StorageError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        if let Some(seq) = entry.file_name().to_str().and_then(parse_segment_name) {
            found.push(seq);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Opens (creating if needed) and recovers the log in `options.dir`.
///
/// # Errors
/// [`StorageError::Corruption`] naming the file and offset of a bad record that is not a torn
/// tail (see [`RecoveryMode`]); [`StorageError::Io`] for any I/O failure.
pub fn open(options: WalOptions) -> Result<(Wal, Recovered), StorageError> {
    let mut operations = Vec::new();
    let (wal, mut recovered) = open_with(options, |records| operations.push(records))?;
    recovered.operations = operations;
    Ok((wal, recovered))
}

/// As [`open`], handing each recovered operation to `each` as it is read instead of
/// collecting them ([`Recovered::operations`] stays empty): a leaf rebuilds itself from a log
/// far larger than memory this way. After an error, what `each` was given must be discarded.
///
/// # Errors
/// As [`open`].
pub fn open_with(
    options: WalOptions,
    mut each: impl FnMut(Vec<LogRecord>),
) -> Result<(Wal, Recovered), StorageError> {
    // Reading and decoding the log runs on a thread of its own, a few operations ahead of
    // `each` (which rebuilds the leaf here): the two overlap on two cores.
    let (tx, rx) = mpsc::sync_channel::<Vec<LogRecord>>(RECOVERY_AHEAD_OPS);
    std::thread::scope(|scope| {
        let dir = options.dir.clone();
        let reader = std::thread::Builder::new()
            .name("crest-recover".into())
            .spawn_scoped(scope, move || {
                recover(options, |records| {
                    // The receiver only goes away with this scope.
                    let _ = tx.send(records);
                })
            })
            .map_err(|e| io_error(&dir, e))?;
        for records in rx {
            each(records);
        }
        reader
            .join()
            .unwrap_or_else(|_| Err(StorageError::other(&dir, "the recovery thread panicked")))
    })
}

/// Operations recovery reads ahead of the leaf at most.
const RECOVERY_AHEAD_OPS: usize = 64;

fn recover(
    options: WalOptions,
    mut each: impl FnMut(Vec<LogRecord>),
) -> Result<(Wal, Recovered), StorageError> {
    let dir = options.dir.clone();
    std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
    // Held from before the first read until the writer thread ends: no second process may
    // recover or append to this log meanwhile.
    let lock = lock_dir(&dir)?;
    let mut recovered = Recovered::default();
    let replay_from = recover_checkpoint(&dir, &options, &mut recovered, &mut each)?;
    let mut seqs = segments(&dir)?;
    // A new segment, if one is needed, comes after every segment present and not before
    // replay starts: never over a segment a checkpoint still reads bodies from.
    let first_new = seqs
        .last()
        .map_or(1, |last| last + 1)
        .max(replay_from.map_or(1, |(from, _)| from));
    if let Some((from, _)) = replay_from {
        // Older segments hold bodies only (or nothing, left over from a crash between writing
        // the checkpoint and deleting them; the next checkpoint deletes those).
        seqs.retain(|seq| *seq >= from);
    }
    // Where writing stopped in each segment kept (a preallocated one is longer).
    let mut written: HashMap<u64, u64> = HashMap::new();
    let mut index = 0;
    while index < seqs.len() {
        let seq = seqs[index];
        let path = dir.join(segment_name(seq));
        // Read a window at a time: a preallocated segment is mostly zeros, and recovery's
        // memory must not grow with `wal_segment_bytes_max`.
        let file = File::open(&path).map_err(|e| io_error(&path, e))?;
        let file_len = file.metadata().map_err(|e| io_error(&path, e))?.len();
        let mut header = vec![0u8; SEGMENT_HEADER_BYTES.min(file_len as usize)];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| io_error(&path, e))?;
        check_version(&path, &header)?;
        let start = match replay_from {
            Some((from, offset)) if from == seq => offset as usize,
            _ => SEGMENT_HEADER_BYTES,
        };
        let scan = scan_segment_file(&file, file_len, seq, options.record_bytes_max, start)
            .map_err(|e| io_error(&path, e))?;
        drop(file);
        recovered.segments += 1;
        scan.operations.into_iter().for_each(&mut each);
        written.insert(seq, scan.valid_len);
        if let Some(stop) = scan.stop {
            let last = index + 1 == seqs.len();
            let torn = last && stop.reaches_end;
            if !torn && options.recovery != RecoveryMode::TruncateCorrupt {
                return Err(StorageError::Corruption {
                    file: path.display().to_string(),
                    offset: stop.offset,
                    detail: stop.bad.to_string(),
                });
            }
            let what = if torn {
                "torn tail"
            } else {
                "corruption (TruncateCorrupt)"
            };
            recovered.truncated.push(format!(
                "{}: cut {} bytes at offset {} ({what}: {})",
                path.display(),
                file_len - scan.valid_len,
                stop.offset,
                stop.bad
            ));
            if scan.valid_len < SEGMENT_HEADER_BYTES as u64 {
                std::fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
            } else {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| io_error(&path, e))?;
                file.set_len(scan.valid_len)
                    .map_err(|e| io_error(&path, e))?;
                file.sync_all().map_err(|e| io_error(&path, e))?;
            }
            for later in seqs.drain(index + 1..) {
                let later_path = dir.join(segment_name(later));
                recovered.truncated.push(format!(
                    "{}: removed (after corruption)",
                    later_path.display()
                ));
                std::fs::remove_file(&later_path).map_err(|e| io_error(&later_path, e))?;
            }
            sync_dir(&dir)?;
            if scan.valid_len < SEGMENT_HEADER_BYTES as u64 {
                seqs.truncate(index);
            }
        }
        index += 1;
    }
    let (seq, file, len) = match seqs.last() {
        Some(&seq) => {
            let path = dir.join(segment_name(seq));
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| io_error(&path, e))?;
            (seq, file, written[&seq])
        }
        None => {
            let (file, len) = create_segment(&options, first_new)?;
            (first_new, file, len)
        }
    };
    let file = wrap(&options, file);
    let wal = Wal {
        options,
        _lock: lock,
        seq,
        file,
        len,
        stopped: false,
        unsynced_since: None,
        failed_tokens: VecDeque::new(),
        positions: VecDeque::new(),
        synced_for: None,
        held: Vec::new(),
        held_since: None,
        pushed_at: None,
        ready: Vec::new(),
    };
    Ok((wal, recovered))
}

fn wrap(options: &WalOptions, file: File) -> Box<dyn SegmentFile> {
    match &options.file_wrapper {
        Some(wrapper) => (wrapper.0)(file),
        None => Box::new(file),
    }
}

/// Loads the newest checkpoint, if any, into `recovered`, deletes older ones, and checks that
/// the segments holding its bodies exist; returns where replay starts.
fn recover_checkpoint(
    dir: &Path,
    options: &WalOptions,
    recovered: &mut Recovered,
    each: &mut impl FnMut(Vec<LogRecord>),
) -> Result<Option<(u64, u64)>, StorageError> {
    let mut checkpoints = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".ckpt.tmp") {
            // A checkpoint that was never completed: the log before it is still whole.
            std::fs::remove_file(entry.path()).map_err(|e| io_error(&entry.path(), e))?;
        } else if let Some(seq) = parse_checkpoint_name(name) {
            checkpoints.push(seq);
        }
    }
    let Some(&seq) = checkpoints.iter().max() else {
        return Ok(None);
    };
    let path = dir.join(checkpoint_name(seq));
    let bytes = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
    check_version(&path, &bytes)?;
    let checkpoint = read_checkpoint(&bytes, seq, options.record_bytes_max).map_err(|detail| {
        StorageError::Corruption {
            file: path.display().to_string(),
            offset: 0,
            detail: format!("checkpoint {detail}"),
        }
    })?;
    // The decoded records are all that is needed from here: the file's bytes need not stay
    // in memory while the leaf takes them in.
    drop(bytes);
    for older in checkpoints.iter().filter(|s| **s < seq) {
        let older = dir.join(checkpoint_name(*older));
        std::fs::remove_file(&older).map_err(|e| io_error(&older, e))?;
    }
    let present: BTreeSet<u64> = segments(dir)?.into_iter().collect();
    let mut chunks = checkpoint.chunks;
    let missing: BTreeSet<u32> = chunks
        .iter()
        .flatten()
        .filter_map(|record| match record {
            LogRecord::Index { location, .. }
                if !present.contains(&u64::from(location.segment)) =>
            {
                Some(location.segment)
            }
            _ => None,
        })
        .collect();
    if let Some(first) = missing.first() {
        let file = dir.join(segment_name(u64::from(*first)));
        if options.recovery != RecoveryMode::TruncateCorrupt {
            return Err(StorageError::Corruption {
                file: file.display().to_string(),
                offset: 0,
                detail: format!(
                    "missing: checkpoint {} keeps message bodies in it ({} segments missing)",
                    checkpoint_name(seq),
                    missing.len()
                ),
            });
        }
        let mut dropped = 0;
        for chunk in &mut chunks {
            let before = chunk.len();
            chunk.retain(|record| {
                !matches!(record, LogRecord::Index { location, .. } if missing.contains(&location.segment))
            });
            dropped += before - chunk.len();
        }
        recovered.truncated.push(format!(
            "{}: missing; dropped the {dropped} messages whose bodies it held (TruncateCorrupt)",
            file.display(),
        ));
    }
    chunks.into_iter().for_each(each);
    recovered.checkpoint = Some(seq);
    Ok(Some(checkpoint.replay_from))
}

/// Refuses a file of another format version (see [`StorageError::Version`]).
fn check_version(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    match file_version(bytes) {
        Some(found) if found != SEGMENT_VERSION => Err(StorageError::Version {
            file: path.display().to_string(),
            found,
            expected: SEGMENT_VERSION,
        }),
        _ => Ok(()),
    }
}

/// Creates segment `seq` holding its header (allocated at full size with
/// [`WalOptions::preallocate`]), synced with its directory entry; returns it and its written
/// length.
fn create_segment(options: &WalOptions, seq: u64) -> Result<(File, u64), StorageError> {
    let dir = &options.dir;
    let path = dir.join(segment_name(seq));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    Write::write_all(&mut file, &segment_header(seq)).map_err(|e| io_error(&path, e))?;
    if options.preallocate {
        preallocate(&file, options.segment_bytes_max, &path);
    }
    file.sync_all().map_err(|e| io_error(&path, e))?;
    sync_dir(dir)?;
    Ok((file, SEGMENT_HEADER_BYTES as u64))
}

/// Allocates `file` up to `len` bytes, which read as zeros until written. Writing into
/// allocated space lets `fdatasync` skip journaling the file's new size with every group
/// (on ext4 about a quarter faster, a quarter less kernel CPU: docs/storage.md). A
/// filesystem without `fallocate` keeps the file growing as it is written.
fn preallocate(file: &File, len: u64, path: &Path) {
    let flags = rustix::fs::FallocateFlags::empty();
    if let Err(error) = rustix::fs::fallocate(file, flags, 0, len) {
        tracing::debug!(path = %path.display(), %error, "segment not preallocated");
    }
}

struct Append {
    records: Vec<LogRecord>,
    token: Option<u64>,
    wait: SyncWait,
}

enum Job {
    Append(Append),
    Checkpoint {
        records: Vec<LogRecord>,
        includes: Vec<u64>,
        segments: Vec<u32>,
    },
}

/// How many failed append tokens the writer remembers to check checkpoints against.
const FAILED_TOKENS_KEPT: usize = 4096;
/// How many append positions the writer remembers to start checkpoints' replay at. A
/// checkpoint including an append older than that is abandoned (the log stays whole).
const POSITIONS_KEPT: usize = 65_536;

/// Submits operations to the writer thread.
///
/// The writer runs until every clone of its handle is dropped or closed: it then writes and
/// syncs what was queued, reports it, and ends, releasing the data directory's lock.
/// [`WalHandle::close`] waits for that.
#[derive(Clone)]
pub struct WalHandle {
    tx: mpsc::SyncSender<Job>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl WalHandle {
    /// Drops this handle and, if it was the last one, waits until the writer has written,
    /// synced and reported everything queued and has released the directory's lock, so the
    /// log can be opened again at once. A clone still alive keeps the writer running; the
    /// last one to close waits for it.
    ///
    /// # Errors
    /// [`StorageError::Io`] if the writer thread panicked.
    pub fn close(self) -> Result<(), StorageError> {
        let WalHandle { tx, writer } = self;
        drop(tx);
        let Some(writer) = Arc::into_inner(writer) else {
            return Ok(());
        };
        let thread = writer.into_inner().unwrap_or_else(|e| e.into_inner());
        match thread.map(std::thread::JoinHandle::join) {
            Some(Err(_)) => Err(StorageError::other(
                Path::new("crest-wal"),
                "the log writer thread panicked",
            )),
            _ => Ok(()),
        }
    }

    /// Queues an operation. Waits while the queue is full (`queue_ops_max`): records must not
    /// be dropped, so a leaf whose disk cannot keep up slows down instead.
    ///
    /// # Errors
    /// [`StorageError::Closed`] if the writer has stopped.
    pub fn submit(&self, records: Vec<LogRecord>, token: Option<u64>) -> Result<(), StorageError> {
        self.submit_with(records, token, SyncWait::Now)
    }

    /// As [`WalHandle::submit`], saying how soon the waiter needs the append durable.
    ///
    /// # Errors
    /// [`StorageError::Closed`] if the writer has stopped.
    pub fn submit_with(
        &self,
        records: Vec<LogRecord>,
        token: Option<u64>,
        wait: SyncWait,
    ) -> Result<(), StorageError> {
        self.tx
            .send(Job::Append(Append {
                records,
                token,
                wait,
            }))
            .map_err(|_| StorageError::Closed)
    }

    /// Queues a checkpoint: `records` are a snapshot equivalent to everything submitted before
    /// it except the appends whose tokens are in `includes`, which recovery replays after it.
    /// Once the checkpoint is durable, what it replaces is deleted, except the segments in
    /// `segments` (they hold bodies the snapshot refers to). If one of the included appends
    /// failed, the checkpoint is abandoned.
    ///
    /// # Errors
    /// [`StorageError::Closed`] if the writer has stopped.
    pub fn checkpoint(
        &self,
        records: Vec<LogRecord>,
        includes: Vec<u64>,
        segments: Vec<u32>,
    ) -> Result<(), StorageError> {
        self.tx
            .send(Job::Checkpoint {
                records,
                includes,
                segments,
            })
            .map_err(|_| StorageError::Closed)
    }
}

impl Wal {
    /// Starts the writer thread; `on_complete` receives the completions of each group.
    ///
    /// # Errors
    /// [`StorageError::Io`] if the thread cannot be spawned.
    pub fn start(
        self,
        mut on_complete: impl FnMut(Vec<Completion>) + Send + 'static,
    ) -> Result<WalHandle, StorageError> {
        self.start_timed(move |completions, _| on_complete(completions))
    }

    /// As [`Wal::start`], with how long each group's sync took.
    ///
    /// # Errors
    /// [`StorageError::Io`] if the thread cannot be spawned.
    pub fn start_timed(
        self,
        on_complete: impl FnMut(Vec<Completion>, GroupTiming) + Send + 'static,
    ) -> Result<WalHandle, StorageError> {
        let (tx, rx) = mpsc::sync_channel(self.options.queue_ops_max);
        let dir = self.options.dir.clone();
        let thread = std::thread::Builder::new()
            .name("crest-wal".into())
            .spawn(move || self.run(rx, on_complete))
            .map_err(|e| io_error(&dir, e))?;
        Ok(WalHandle {
            tx,
            writer: Arc::new(Mutex::new(Some(thread))),
        })
    }

    fn run(
        mut self,
        rx: mpsc::Receiver<Job>,
        mut on_complete: impl FnMut(Vec<Completion>, GroupTiming),
    ) {
        let mut buf = Vec::with_capacity(1 << 20);
        loop {
            let unwaited_due = self
                .unsynced_since
                .map(|since| since + self.options.unwaited_sync_after);
            let held_due = self
                .held_since
                .map(|since| since + self.options.linger_sync_after);
            let due = [unwaited_due, held_due].into_iter().flatten().min();
            let first = if let Some(due) = due {
                match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let _ = self.sync();
                        self.report(&mut on_complete);
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        let _ = self.sync();
                        self.report(&mut on_complete);
                        break;
                    }
                }
            } else {
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            if self.stopped {
                break;
            }
            let mut jobs = vec![first];
            let mut estimate = 0usize;
            while estimate < self.options.write_batch_bytes_max {
                match rx.try_recv() {
                    Ok(job) => {
                        if let Job::Append(append) = &job {
                            estimate += append.records.iter().map(approximate_bytes).sum::<usize>();
                        }
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            // Appends are grouped; a checkpoint takes effect between the appends before it and
            // those after it, exactly where the leaf emitted it.
            let mut group = Vec::new();
            for job in jobs {
                match job {
                    Job::Append(append) => group.push(append),
                    Job::Checkpoint {
                        records,
                        includes,
                        segments,
                    } => {
                        self.flush(&mut group, &mut buf, &mut on_complete);
                        if let Some(token) =
                            includes.iter().find(|t| self.failed_tokens.contains(t))
                        {
                            tracing::warn!(
                                token,
                                "checkpoint abandoned: it holds an append the log refused"
                            );
                        } else if !self.stopped {
                            self.checkpoint(&records, &includes, &segments);
                            // Its sync made held completions durable.
                            self.report(&mut on_complete);
                        }
                    }
                }
            }
            self.flush(&mut group, &mut buf, &mut on_complete);
            if self.stopped {
                // Dropping the receiver makes every later submit fail with `Closed`.
                break;
            }
        }
    }

    fn flush(
        &mut self,
        group: &mut Vec<Append>,
        buf: &mut Vec<u8>,
        on_complete: &mut impl FnMut(Vec<Completion>, GroupTiming),
    ) {
        if group.is_empty() {
            return;
        }
        if self.stopped {
            let failed = fail_all(group, "the log stopped after a failed sync");
            self.ready.extend(failed);
        } else {
            self.write_group(group, buf);
        }
        group.clear();
        self.report(on_complete);
    }

    /// Reports the completions that are ready, with the time spent syncing since the last
    /// report.
    fn report(&mut self, on_complete: &mut impl FnMut(Vec<Completion>, GroupTiming)) {
        let timing = GroupTiming {
            sync: self.synced_for.take(),
        };
        if self.ready.is_empty() {
            return;
        }
        let completions = std::mem::take(&mut self.ready);
        for (token, result) in &completions {
            if result.is_err() {
                if self.failed_tokens.len() >= FAILED_TOKENS_KEPT {
                    self.failed_tokens.pop_front();
                }
                self.failed_tokens.push_back(*token);
            }
        }
        on_complete(completions, timing);
    }

    /// Writes a checkpoint that starts the log at a fresh segment, then deletes what it
    /// replaces. A checkpoint that cannot be written is abandoned (the log is still complete).
    fn checkpoint(&mut self, records: &[LogRecord], includes: &[u64], segments: &[u32]) {
        let started = std::time::Instant::now();
        // Replay starts at the first append the snapshot does not reflect.
        let mut first: Option<(u64, u64)> = None;
        for token in includes {
            let Some((_, position)) = self.positions.iter().find(|(t, _)| t == token) else {
                tracing::warn!(
                    token,
                    "checkpoint abandoned: an append it includes is too old"
                );
                return;
            };
            first = Some(first.map_or(*position, |f| f.min(*position)));
        }
        if let Err(error) = self.rotate() {
            tracing::error!(%error, "checkpoint abandoned: cannot start a new segment");
            return;
        }
        let seq = self.seq;
        let replay_from = first.unwrap_or((seq, SEGMENT_HEADER_BYTES as u64));
        let dir = self.options.dir.clone();
        let max = self.options.record_bytes_max;
        match write_checkpoint(&dir, seq, replay_from, records, max) {
            Ok(bytes) => {
                let keep: BTreeSet<u64> = segments.iter().map(|s| u64::from(*s)).collect();
                if let Err(error) = remove_replaced(&dir, seq, replay_from.0, &keep) {
                    tracing::warn!(%error, "checkpoint written, but old files could not all be removed");
                }
                tracing::info!(
                    dir = %dir.display(),
                    seq,
                    records = records.len(),
                    bytes,
                    elapsed = ?started.elapsed(),
                    "checkpoint taken"
                );
            }
            Err(error) => tracing::error!(%error, "checkpoint abandoned"),
        }
    }

    /// Encodes, writes and (in fsync mode) syncs one group; its completions join the ready
    /// ones, or the held ones while it lingers unsynced.
    fn write_group(&mut self, jobs: &[Append], buf: &mut Vec<u8>) {
        let max = self.options.record_bytes_max;
        // Per job: where its record starts in `buf`, and the spans of its bodies.
        let mut starts = Vec::with_capacity(jobs.len());
        let mut bodies = Vec::new();
        let mut encode = |seq: u64, buf: &mut Vec<u8>| {
            buf.clear();
            starts.clear();
            bodies.clear();
            let mut failed = Vec::new();
            for (index, job) in jobs.iter().enumerate() {
                starts.push((buf.len(), bodies.len()));
                if let Err(error) = encode_record(seq, &job.records, max, buf, &mut bodies) {
                    failed.push((index, error));
                }
            }
            starts.push((buf.len(), bodies.len()));
            failed
        };
        let mut failed: Vec<(usize, String)> = encode(self.seq, buf);
        let header = SEGMENT_HEADER_BYTES as u64;
        if self.len > header && self.len + buf.len() as u64 > self.options.segment_bytes_max {
            if let Err(error) = self.rotate() {
                self.ready.extend(fail_all(jobs, &error.to_string()));
                return;
            }
            failed = encode(self.seq, buf);
        }
        let path = self.options.dir.join(segment_name(self.seq));
        if let Err(error) = self.file.write_all_at(buf, self.len) {
            // Cut back whatever part of the group reached the file: none of it is acknowledged,
            // and recovery must not find half of it.
            let _ = self.file.set_len(self.len);
            tracing::error!(path = %path.display(), %error, "log write failed; the group is refused");
            let error = format!("log write to {} failed: {error}", path.display());
            self.ready.extend(fail_all(jobs, &error));
            return;
        }
        // Whether this group's completions wait for a later sync.
        let mut hold = false;
        if self.options.durability == Durability::Fsync {
            let waits = |wait| jobs.iter().any(|j| j.token.is_some() && j.wait == wait);
            let (now, lingers) = (waits(SyncWait::Now), waits(SyncWait::Linger));
            if now || (lingers && !self.pushes_coming()) {
                if let Err(error) = self.sync() {
                    self.ready.extend(fail_all(jobs, &error));
                    return;
                }
                if now {
                    self.pushed_at = Some(Instant::now());
                }
            } else if lingers {
                let since = *self.held_since.get_or_insert_with(Instant::now);
                self.unsynced_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.options.linger_sync_after {
                    if let Err(error) = self.sync() {
                        self.ready.extend(fail_all(jobs, &error));
                        return;
                    }
                } else {
                    hold = true;
                }
            } else {
                // Synced by the next waiter, or here once the oldest unsynced write is due
                // (the writer's idle timeout covers a quiet log).
                let since = *self.unsynced_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.options.unwaited_sync_after
                    && let Err(error) = self.sync()
                {
                    self.ready.extend(fail_all(jobs, &error));
                    return;
                }
            }
        }
        let base = self.len;
        self.len += buf.len() as u64;
        let (seq, buf) = (self.seq, &buf[..]);
        let mut completions = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            let Some(token) = job.token else { continue };
            let (start, first_body) = starts[index];
            let (_, end_body) = starts[index + 1];
            let result = match failed.iter().find(|(i, _)| *i == index) {
                Some((_, error)) => Err(error.clone()),
                None => {
                    if self.positions.len() >= POSITIONS_KEPT {
                        self.positions.pop_front();
                    }
                    self.positions
                        .push_back((token, (seq, base + start as u64)));
                    Ok(bodies[first_body..end_body]
                        .iter()
                        .map(|span| body_location(seq, base, buf, span))
                        .collect())
                }
            };
            completions.push((token, result));
        }
        if hold {
            self.held.extend(completions);
        } else {
            self.ready.extend(completions);
        }
    }

    /// Whether pushes are coming, so that a lingering append may wait for the next one: a
    /// push forced a sync within the linger. With none (a drain), there is no push to protect
    /// nor to ride with, and a consumer acking one message at a time is not kept waiting for
    /// nothing.
    fn pushes_coming(&self) -> bool {
        self.pushed_at
            .is_some_and(|at| at.elapsed() < self.options.linger_sync_after)
    }

    /// Syncs the active segment; a failure applies [`SyncFailure`] (abort, or stop the writer).
    fn sync(&mut self) -> Result<(), String> {
        let started = Instant::now();
        let Err(error) = self.file.sync_data() else {
            let took = started.elapsed();
            self.synced_for = Some(self.synced_for.unwrap_or_default() + took);
            self.unsynced_since = None;
            // Everything held was written before this sync: it is durable now.
            self.held_since = None;
            self.ready.append(&mut self.held);
            return Ok(());
        };
        let path = self.options.dir.join(segment_name(self.seq));
        tracing::error!(path = %path.display(), %error, "fdatasync failed: the log stops");
        if self.options.sync_failure == SyncFailure::Abort {
            eprintln!(
                "crest: fdatasync of {} failed: {error}; aborting (recovery decides what survived)",
                path.display()
            );
            std::process::abort();
        }
        self.stopped = true;
        self.unsynced_since = None;
        let error = format!("fdatasync of {} failed: {error}", path.display());
        // What was held is lost with the sync: its waiters learn so.
        self.held_since = None;
        let held = std::mem::take(&mut self.held);
        self.ready.extend(
            held.into_iter()
                .map(|(token, _)| (token, Err(error.clone()))),
        );
        Err(error)
    }

    fn rotate(&mut self) -> Result<(), StorageError> {
        self.sync()
            .map_err(|error| StorageError::other(&self.options.dir, error))?;
        // The sealed segment gives back its unwritten preallocated space (if this is lost in a
        // crash, recovery reads the zeros as its end all the same).
        if self.options.preallocate
            && let Err(error) = self.file.set_len(self.len)
        {
            tracing::debug!(%error, "sealed segment not trimmed");
        }
        let (file, len) = create_segment(&self.options, self.seq + 1)?;
        self.seq += 1;
        self.file = wrap(&self.options, file);
        self.len = len;
        Ok(())
    }
}

/// Writes `records` as checkpoint `seq` (replay starting at `replay_from`): a temporary file,
/// synced, renamed into place, and the directory synced. Returns its size.
fn write_checkpoint(
    dir: &Path,
    seq: u64,
    replay_from: (u64, u64),
    records: &[LogRecord],
    max: u32,
) -> Result<u64, StorageError> {
    let final_path = dir.join(checkpoint_name(seq));
    let tmp_path = dir.join(format!("{}.tmp", checkpoint_name(seq)));
    let result = (|| {
        let encoding = |error: String| StorageError::other(&tmp_path, error);
        let mut file = File::create(&tmp_path).map_err(|e| io_error(&tmp_path, e))?;
        let mut buf = checkpoint_header(seq).to_vec();
        encode_checkpoint_start(seq, replay_from, &mut buf).map_err(encoding)?;
        let mut written = 0u64;
        let mut chunk_start = 0;
        let mut chunk_bytes = 0usize;
        let mut spans = Vec::new();
        // Chunks stay well under the record limit whatever the payload sizes.
        for (index, record) in records.iter().enumerate() {
            chunk_bytes += approximate_bytes(record);
            if chunk_bytes >= max as usize / 4 || index + 1 == records.len() {
                spans.clear();
                encode_record(
                    seq,
                    &records[chunk_start..=index],
                    max,
                    &mut buf,
                    &mut spans,
                )
                .map_err(encoding)?;
                chunk_start = index + 1;
                chunk_bytes = 0;
            }
            if buf.len() >= 4 << 20 {
                Write::write_all(&mut file, &buf).map_err(|e| io_error(&tmp_path, e))?;
                written += buf.len() as u64;
                buf.clear();
            }
        }
        encode_record(seq, &[], max, &mut buf, &mut spans).map_err(encoding)?;
        Write::write_all(&mut file, &buf).map_err(|e| io_error(&tmp_path, e))?;
        written += buf.len() as u64;
        file.sync_all().map_err(|e| io_error(&tmp_path, e))?;
        std::fs::rename(&tmp_path, &final_path).map_err(|e| io_error(&final_path, e))?;
        sync_dir(dir)?;
        Ok(written)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_path);
    }
    result
}

/// Deletes what checkpoint `seq` replaces: older checkpoints, and the segments before
/// `replay_from` except those in `keep` (they hold bodies still needed).
fn remove_replaced(
    dir: &Path,
    seq: u64,
    replay_from: u64,
    keep: &BTreeSet<u64>,
) -> Result<(), StorageError> {
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let replaced = parse_segment_name(name)
            .is_some_and(|s| s < replay_from && !keep.contains(&s))
            || parse_checkpoint_name(name).is_some_and(|s| s < seq);
        if replaced {
            std::fs::remove_file(entry.path()).map_err(|e| io_error(&entry.path(), e))?;
        }
    }
    sync_dir(dir)
}

/// Reads message bodies back from a log's segments (see [`crate::format`], "Bodies in
/// place"). Keeps up to [`BodyReader::FILES_OPEN_MAX`] segment files open.
pub struct BodyReader {
    dir: PathBuf,
    files: HashMap<u32, File>,
    buf: Vec<u8>,
}

impl BodyReader {
    /// Segment files kept open at most.
    pub const FILES_OPEN_MAX: usize = 64;

    /// A reader of the log in `dir`.
    pub fn new(dir: PathBuf) -> BodyReader {
        BodyReader {
            dir,
            files: HashMap::new(),
            buf: Vec::new(),
        }
    }

    /// Reads and verifies the body at `location`.
    ///
    /// # Errors
    /// What went wrong: the segment is gone or unreadable, or the bytes do not match.
    pub fn read(&mut self, location: &Location) -> Result<MessageBody, String> {
        use std::os::unix::fs::FileExt;
        if !self.files.contains_key(&location.segment) {
            if self.files.len() >= Self::FILES_OPEN_MAX {
                self.files.clear();
            }
            let path = self.dir.join(segment_name(u64::from(location.segment)));
            let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            self.files.insert(location.segment, file);
        }
        let file = &self.files[&location.segment];
        self.buf.resize(location.len as usize, 0);
        file.read_exact_at(&mut self.buf, u64::from(location.offset))
            .map_err(|e| {
                format!(
                    "{}: read at offset {}: {e}",
                    segment_name(u64::from(location.segment)),
                    location.offset
                )
            })?;
        decode_body(location, &self.buf)
    }
}

fn approximate_bytes(record: &LogRecord) -> usize {
    match record {
        LogRecord::Index { head, .. } => 64 + head.topic.len(),
        LogRecord::Enqueue {
            head,
            metadata,
            payload,
        } => {
            64 + head.topic.len()
                + payload.len()
                + metadata
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 4)
                    .sum::<usize>()
        }
        _ => 32,
    }
}

fn fail_all(jobs: &[Append], error: &str) -> Vec<Completion> {
    jobs.iter()
        .filter_map(|job| job.token.map(|token| (token, Err(error.to_string()))))
        .collect()
}
