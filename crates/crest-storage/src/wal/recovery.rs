//! Opening a log: the data directory locked, the newest checkpoint loaded, the segments after it
//! replayed into the leaf a window at a time, a torn tail cut.

use super::*;
use crate::StorageError;
use crate::format::{
    SEGMENT_HEADER_BYTES, SEGMENT_VERSION, SEGMENT_VERSIONS_READ, checkpoint_name, file_version,
    parse_checkpoint_name, read_checkpoint, scan_segment_file, segment_name,
};
use crest_core::record::LogRecord;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::mpsc;

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
pub(super) const RECOVERY_AHEAD_OPS: usize = 64;

pub(super) fn recover(
    options: WalOptions,
    mut each: impl FnMut(Vec<LogRecord>),
) -> Result<(Wal, Recovered), StorageError> {
    let dir = options.dir.clone();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(super::PRIVATE_DIR)
        .create(&dir)
        .map_err(|e| io_error(&dir, e))?;
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
    // Appends go on in the last segment only if it is of this build's version: a segment holds
    // records of its own version alone, so a build that reads only the older one can still
    // read the segments written before.
    let current = |seq: u64| -> Result<bool, StorageError> {
        let path = dir.join(segment_name(seq));
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        let file = File::open(&path).map_err(|e| io_error(&path, e))?;
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut header, 0)
            .map_err(|e| io_error(&path, e))?;
        Ok(file_version(&header) == Some(SEGMENT_VERSION))
    };
    let (seq, file, len) = match seqs.last() {
        Some(&seq) if !current(seq)? => {
            let (file, len) = create_segment(&options, seq + 1)?;
            (seq + 1, file, len)
        }
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
        defer_rotation_sync: false,
        sealed: Vec::new(),
        unsynced_since: None,
        failed_tokens: VecDeque::new(),
        positions: VecDeque::new(),
        synced_for: None,
        held: Vec::new(),
        held_since: None,
        pushed_at: None,
        refusals: Refusals::default(),
        ready: Vec::new(),
    };
    Ok((wal, recovered))
}

/// Loads the newest checkpoint, if any, into `recovered`, deletes older ones, and checks that
/// the segments holding its bodies exist; returns where replay starts.
pub(super) fn recover_checkpoint(
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
pub(super) fn check_version(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    match file_version(bytes) {
        Some(found) if !SEGMENT_VERSIONS_READ.contains(&found) => Err(StorageError::Version {
            file: path.display().to_string(),
            found,
            expected: SEGMENT_VERSION,
        }),
        _ => Ok(()),
    }
}
