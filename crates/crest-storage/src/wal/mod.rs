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

mod direct;
mod reader;
mod recovery;
mod writer;

pub use direct::{DirectLog, SyncJob, truncate_to};
pub use reader::BodyReader;
pub use recovery::{open, open_with};
pub use writer::approximate_bytes;

use crate::StorageError;
use crate::format::{SEGMENT_HEADER_BYTES, parse_segment_name, segment_header, segment_name};
use crest_core::config::{Durability, Settings};
use crest_core::machine::SyncWait;
use crest_core::record::{Location, LogRecord};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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
    /// Writes all of `parts`, one after another, at `offset` (as [`SegmentFile::write_all_at`]
    /// with their concatenation, which is what it does unless the file has a better way).
    fn write_all_vectored_at(&mut self, parts: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.write_all_at(&parts.concat(), offset)
    }
    /// Makes everything written so far durable (`fdatasync`).
    fn sync_data(&mut self) -> std::io::Result<()>;
    /// Cuts the file back to `len` bytes.
    fn set_len(&mut self, len: u64) -> std::io::Result<()>;
    /// Another handle on the same file, for syncing it from another thread ([`SyncJob`]);
    /// `None` where the file has none to give (its syncs then run on the caller's thread).
    fn try_clone(&self) -> Option<std::io::Result<Box<dyn SegmentFile>>> {
        None
    }
}

impl SegmentFile for File {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
    /// One `pwritev` (a record's header and its body, without copying them together); what a
    /// short write left is written as [`SegmentFile::write_all_at`] writes.
    fn write_all_vectored_at(&mut self, parts: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let slices: Vec<std::io::IoSlice<'_>> = parts
            .iter()
            .map(|part| std::io::IoSlice::new(part))
            .collect();
        let mut written = rustix::io::pwritev(&*self, &slices, offset)?;
        let mut at = offset;
        for part in parts {
            let done = written.min(part.len());
            written -= done;
            if done < part.len() {
                std::os::unix::fs::FileExt::write_all_at(self, &part[done..], at + done as u64)?;
            }
            at += part.len() as u64;
        }
        Ok(())
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        File::set_len(self, len)
    }
    fn try_clone(&self) -> Option<std::io::Result<Box<dyn SegmentFile>>> {
        Some(File::try_clone(self).map(|file| Box::new(file) as Box<dyn SegmentFile>))
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
    /// Whether a rotation leaves the sealed segment's sync to the next sync of the log
    /// ([`DirectLog`]: it syncs on its owner's schedule) instead of syncing it at once.
    defer_rotation_sync: bool,
    /// Sealed segments not synced yet (with `defer_rotation_sync`), by sequence number: at
    /// most those written between two syncs of the log.
    sealed: Vec<(u64, Box<dyn SegmentFile>)>,
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
    /// Groups refused since the writer last said so (see [`REFUSALS_LOGGED_EVERY`]).
    refusals: Refusals,
}

/// While the log refuses writes (a full disk), the writer says so at most this often, with
/// how many groups it refused meanwhile, and says when writes succeed again.
pub(super) const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Refusals {
    /// Groups refused since the first refusal after the last success.
    pub(super) count: u64,
    /// When the writer last logged a refusal.
    pub(super) logged_at: Option<Instant>,
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

/// The mode of a file the log creates: its payloads are readable by the owner alone.
pub(crate) const PRIVATE_FILE: u32 = 0o600;
/// The mode of a directory the log creates.
pub(crate) const PRIVATE_DIR: u32 = 0o700;

/// Takes the exclusive lock of `dir` (see [`LOCK_FILE`]) without waiting for it.
fn lock_dir(dir: &Path) -> Result<File, StorageError> {
    use rustix::fs::{FlockOperation, flock};
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(PRIVATE_FILE)
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

fn wrap(options: &WalOptions, file: File) -> Box<dyn SegmentFile> {
    match &options.file_wrapper {
        Some(wrapper) => (wrapper.0)(file),
        None => Box::new(file),
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
        .mode(PRIVATE_FILE)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    let made = Write::write_all(&mut file, &segment_header(seq))
        .and_then(|()| {
            if options.preallocate {
                preallocate(&file, options.segment_bytes_max, &path);
            }
            file.sync_all()
        })
        .map_err(|e| io_error(&path, e))
        .and_then(|()| sync_dir(dir));
    if let Err(error) = made {
        // A segment that could not be made whole is not left behind (the next attempt creates
        // it again, say once a full disk has room).
        drop(file);
        if let Err(removal) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), %removal, "half-made segment not removed");
        }
        return Err(error);
    }
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
    /// Reported as done, with no locations, once every job before it was.
    Barrier(u64),
    Checkpoint {
        records: Vec<LogRecord>,
        includes: Vec<u64>,
        segments: Vec<u32>,
    },
}

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

    /// Queues a barrier: the writer reports `token` done (with no locations) once everything
    /// queued before it was written and any checkpoint before it taken, and writes nothing
    /// for it. Whoever copies the log's files waits for one first.
    ///
    /// # Errors
    /// [`StorageError::Closed`] if the writer has stopped.
    pub fn barrier(&self, token: u64) -> Result<(), StorageError> {
        self.tx
            .send(Job::Barrier(token))
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
