//! Offline inspection of a log directory: what `crest wal inspect` prints.
//!
//! Reads every segment without changing anything, verifies every checksum, counts records by
//! kind, and says where a scan stopped and whether recovery would cut there (a torn tail of
//! the last segment) or refuse to start (corruption anywhere else).

use crate::StorageError;
use crate::format::{
    SEGMENT_HEADER_BYTES, checkpoint_name, parse_checkpoint_name, parse_segment_name,
    read_checkpoint, scan_segment_file, segment_name,
};
use crest_core::id::MessageId;
use crest_core::record::LogRecord;
use std::collections::HashSet;
use std::path::Path;

/// One file's findings (a checkpoint, then segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    /// The file name.
    pub name: String,
    /// File size in bytes.
    pub bytes: u64,
    /// Bytes up to the end of the last valid record (a preallocated segment's file is longer).
    pub written: u64,
    /// Valid records (storage operations) in it.
    pub records: u64,
    /// Where the scan stopped early, and what recovery would do about it.
    pub problem: Option<String>,
    /// Whether recovery would refuse to start because of this segment.
    pub fatal: bool,
}

/// The kinds of log entries [`Report::entries`] counts, in its order.
pub const ENTRY_KINDS: [&str; 11] = [
    "enqueue",
    "lease",
    "delete",
    "release",
    "dead",
    "redrive",
    "dedup",
    "move",
    "configure",
    "reprioritize",
    "metadata",
];

/// What a whole directory holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Per segment, in order.
    pub segments: Vec<SegmentReport>,
    /// Log entries by kind, in the order of [`ENTRY_KINDS`].
    pub entries: [u64; 11],
    /// Messages enqueued and not deleted: what recovery would bring back.
    pub live_messages: u64,
}

impl Report {
    /// Whether recovery would refuse to start.
    pub fn is_fatal(&self) -> bool {
        self.segments.iter().any(|s| s.fatal)
    }
}

/// Inspects the log in `dir` (see the module doc).
///
/// # Errors
/// [`StorageError::Io`] if the directory or a file cannot be read.
pub fn inspect(dir: &Path, record_bytes_max: u32) -> Result<Report, StorageError> {
    let io = |error: std::io::Error| StorageError::io(dir, &error);
    let mut seqs: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()
                .and_then(parse_segment_name)
        })
        .collect();
    seqs.sort_unstable();
    let mut report = Report::default();
    let mut live: HashSet<MessageId> = HashSet::new();
    let mut count = |record: &LogRecord, report: &mut Report| match record {
        LogRecord::Enqueue { head, .. } | LogRecord::Index { head, .. } => {
            report.entries[0] += 1;
            live.insert(head.id);
        }
        LogRecord::Lease { .. } => report.entries[1] += 1,
        LogRecord::Delete { id } => {
            report.entries[2] += 1;
            live.remove(id);
        }
        LogRecord::Release { .. } => report.entries[3] += 1,
        LogRecord::Dead { .. } => report.entries[4] += 1,
        LogRecord::Redrive { .. } => report.entries[5] += 1,
        LogRecord::Dedup { .. } => report.entries[6] += 1,
        LogRecord::Move { .. } => report.entries[7] += 1,
        LogRecord::Configure { .. } => report.entries[8] += 1,
        LogRecord::Reprioritize { .. } => report.entries[9] += 1,
        LogRecord::SetMetadata { .. } => report.entries[10] += 1,
    };
    // The newest checkpoint starts the log; segments before its replay start hold bodies only
    // (their records are verified, not counted).
    let mut checkpoints: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()
                .and_then(parse_checkpoint_name)
        })
        .collect();
    checkpoints.sort_unstable();
    let mut replay_from = (0, 0);
    if let Some(&base) = checkpoints.last() {
        let name = checkpoint_name(base);
        let path = dir.join(&name);
        let bytes = std::fs::read(&path).map_err(|e| StorageError::io(&path, &e))?;
        let (records, problem, fatal) = match read_checkpoint(&bytes, base, record_bytes_max) {
            Ok(checkpoint) => {
                checkpoint
                    .chunks
                    .iter()
                    .flatten()
                    .for_each(|r| count(r, &mut report));
                replay_from = checkpoint.replay_from;
                (checkpoint.chunks.len() as u64, None, false)
            }
            Err(why) => (
                0,
                Some(format!(
                    "CORRUPT checkpoint {why} (recovery refuses to start)"
                )),
                true,
            ),
        };
        report.segments.push(SegmentReport {
            name,
            bytes: bytes.len() as u64,
            written: bytes.len() as u64,
            records,
            problem,
            fatal,
        });
    }
    for (index, &seq) in seqs.iter().enumerate() {
        let name = segment_name(seq);
        let path = dir.join(&name);
        // A window at a time, as recovery reads it: a preallocated segment is mostly zeros.
        let io = |e: std::io::Error| StorageError::io(&path, &e);
        let file = std::fs::File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let scan = scan_segment_file(&file, file_len, seq, record_bytes_max, SEGMENT_HEADER_BYTES)
            .map_err(io)?;
        let (from, offset) = replay_from;
        if seq > from {
            scan.operations
                .iter()
                .flatten()
                .for_each(|r| count(r, &mut report));
        } else if seq == from {
            let replayed =
                scan_segment_file(&file, file_len, seq, record_bytes_max, offset as usize)
                    .map_err(io)?;
            replayed
                .operations
                .iter()
                .flatten()
                .for_each(|r| count(r, &mut report));
        }
        let bodies_only = seq < from;
        let last = index + 1 == seqs.len();
        let (problem, fatal) = match &scan.stop {
            None => (None, false),
            Some(stop) if bodies_only => (
                Some(format!(
                    "CORRUPT at offset {}: {} (bodies only: recovery starts; reads of bodies \
                     past it fail and dead-letter their messages)",
                    stop.offset, stop.bad
                )),
                false,
            ),
            Some(stop) if last && stop.reaches_end => (
                Some(format!(
                    "torn tail at offset {}: {} (recovery cuts {} bytes)",
                    stop.offset,
                    stop.bad,
                    file_len - scan.valid_len
                )),
                false,
            ),
            Some(stop) => (
                Some(format!(
                    "CORRUPT at offset {}: {} (recovery refuses to start)",
                    stop.offset, stop.bad
                )),
                true,
            ),
        };
        let name = if bodies_only {
            format!("{name} (bodies only)")
        } else {
            name
        };
        report.segments.push(SegmentReport {
            name,
            bytes: file_len,
            written: scan.valid_len,
            records: scan.operations.len() as u64,
            problem,
            fatal,
        });
    }
    report.live_messages = live.len() as u64;
    Ok(report)
}
