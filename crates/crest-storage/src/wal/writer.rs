//! The group-commit writer thread: appends gathered into one write and one sync, acks that
//! ride the pushes' syncs, segment rotation, checkpoints and what they replace.

use super::*;
use crate::StorageError;
use crate::format::{
    SEGMENT_HEADER_BYTES, body_location, checkpoint_header, checkpoint_name,
    encode_checkpoint_start, encode_record, parse_checkpoint_name, parse_segment_name,
    segment_name,
};
use crest_core::config::Durability;
use crest_core::machine::SyncWait;
use crest_core::record::LogRecord;
use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

/// How many failed append tokens the writer remembers to check checkpoints against.
pub(super) const FAILED_TOKENS_KEPT: usize = 4096;

/// How many append positions the writer remembers to start checkpoints' replay at. A
/// checkpoint including an append older than that is abandoned (the log stays whole).
pub(super) const POSITIONS_KEPT: usize = 65_536;

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

    pub(super) fn run(
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
                    Job::Barrier(token) => {
                        self.flush(&mut group, &mut buf, &mut on_complete);
                        self.ready.push((token, Ok(Vec::new())));
                        self.report(&mut on_complete);
                    }
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

    pub(super) fn flush(
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
    pub(super) fn report(&mut self, on_complete: &mut impl FnMut(Vec<Completion>, GroupTiming)) {
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
    pub(super) fn checkpoint(&mut self, records: &[LogRecord], includes: &[u64], segments: &[u32]) {
        self.checkpoint_with(records, includes, segments, &mut |_| Ok(()));
    }

    /// As [`Wal::checkpoint`], calling `before_removal` with the log's new end once the
    /// checkpoint is durable and before anything it replaces is deleted; an error from it
    /// leaves the replaced files in place (the log stays whole). Answers whether the
    /// checkpoint was taken.
    pub(super) fn checkpoint_with(
        &mut self,
        records: &[LogRecord],
        includes: &[u64],
        segments: &[u32],
        before_removal: &mut dyn FnMut((u64, u64)) -> Result<(), String>,
    ) -> bool {
        let started = std::time::Instant::now();
        // Replay starts at the first append the snapshot does not reflect.
        let mut first: Option<(u64, u64)> = None;
        for token in includes {
            let Some((_, position)) = self.positions.iter().find(|(t, _)| t == token) else {
                tracing::warn!(
                    token,
                    "checkpoint abandoned: an append it includes is too old"
                );
                return false;
            };
            first = Some(first.map_or(*position, |f| f.min(*position)));
        }
        if let Err(error) = self.rotate() {
            tracing::error!(%error, "checkpoint abandoned: cannot start a new segment");
            return false;
        }
        // Replay may start in any segment before the new one: they are all durable first.
        if self.defer_rotation_sync
            && let Err(error) = self.sync()
        {
            tracing::error!(%error, "checkpoint abandoned: the log could not be synced");
            return false;
        }
        let seq = self.seq;
        let replay_from = first.unwrap_or((seq, SEGMENT_HEADER_BYTES as u64));
        let dir = self.options.dir.clone();
        let max = self.options.record_bytes_max;
        match write_checkpoint(&dir, seq, replay_from, records, max) {
            Ok(bytes) => {
                if let Err(error) = before_removal((self.seq, self.len)) {
                    tracing::error!(%error, "checkpoint written; what it replaces is kept");
                    return true;
                }
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
                true
            }
            Err(error) => {
                tracing::error!(%error, "checkpoint abandoned");
                false
            }
        }
    }

    /// Encodes, writes and (in fsync mode) syncs one group; its completions join the ready
    /// ones, or the held ones while it lingers unsynced.
    pub(super) fn write_group(&mut self, jobs: &[Append], buf: &mut Vec<u8>) {
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
                let error = error.to_string();
                self.refused(&error);
                self.ready.extend(fail_all(jobs, &error));
                return;
            }
            failed = encode(self.seq, buf);
        }
        let path = self.options.dir.join(segment_name(self.seq));
        if let Err(error) = self.file.write_all_at(buf, self.len) {
            // Cut back whatever part of the group reached the file: none of it is acknowledged,
            // and recovery must not find half of it.
            let _ = self.file.set_len(self.len);
            let error = format!("log write to {} failed: {error}", path.display());
            self.refused(&error);
            self.ready.extend(fail_all(jobs, &error));
            return;
        }
        if self.refusals.count > 0 {
            tracing::warn!(
                refused = self.refusals.count,
                "log writes succeed again; the leaf accepts pushes"
            );
            self.refusals = Refusals::default();
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

    /// A group refused: said at once the first time, then at most every
    /// [`REFUSALS_LOGGED_EVERY`] with the count, so a full disk neither goes unseen nor floods
    /// the log.
    pub(super) fn refused(&mut self, error: &str) {
        self.refusals.count += 1;
        let due = self
            .refusals
            .logged_at
            .is_none_or(|at| at.elapsed() >= REFUSALS_LOGGED_EVERY);
        if due {
            tracing::error!(
                error,
                refused = self.refusals.count,
                "the log cannot be written: pushes are refused until it can"
            );
            self.refusals.logged_at = Some(Instant::now());
        }
    }

    /// Whether pushes are coming, so that a lingering append may wait for the next one: a
    /// push forced a sync within the linger. With none (a drain), there is no push to protect
    /// nor to ride with, and a consumer acking one message at a time is not kept waiting for
    /// nothing.
    pub(super) fn pushes_coming(&self) -> bool {
        self.pushed_at
            .is_some_and(|at| at.elapsed() < self.options.linger_sync_after)
    }

    /// Syncs the sealed segments not synced yet, then the active one; a failure applies
    /// [`SyncFailure`] (abort, or stop the writer).
    pub(super) fn sync(&mut self) -> Result<(), String> {
        let started = Instant::now();
        for (seq, mut file) in std::mem::take(&mut self.sealed) {
            if let Err(error) = file.sync_data() {
                return Err(self.sync_failed(seq, &error));
            }
        }
        let Err(error) = self.file.sync_data() else {
            let took = started.elapsed();
            self.synced_for = Some(self.synced_for.unwrap_or_default() + took);
            self.unsynced_since = None;
            // Everything held was written before this sync: it is durable now.
            self.held_since = None;
            self.ready.append(&mut self.held);
            return Ok(());
        };
        Err(self.sync_failed(self.seq, &error))
    }

    /// After a failed sync of segment `seq`: aborts, or stops the writer and fails what it
    /// held (see [`SyncFailure`]); answers the error.
    fn sync_failed(&mut self, seq: u64, error: &std::io::Error) -> String {
        let error = sync_failure(&self.options, seq, error);
        self.stopped = true;
        self.unsynced_since = None;
        // What was held is lost with the sync: its waiters learn so.
        self.held_since = None;
        let held = std::mem::take(&mut self.held);
        self.ready.extend(
            held.into_iter()
                .map(|(token, _)| (token, Err(error.clone()))),
        );
        error
    }

    /// Seals the active segment (synced first, unless `defer_rotation_sync` leaves that to the
    /// next sync of the log) and starts the next one.
    pub(super) fn rotate(&mut self) -> Result<(), StorageError> {
        if !self.defer_rotation_sync {
            self.sync()
                .map_err(|error| StorageError::other(&self.options.dir, error))?;
        }
        // The sealed segment gives back its unwritten preallocated space (if this is lost in a
        // crash, recovery reads the zeros as its end all the same).
        if self.options.preallocate
            && let Err(error) = self.file.set_len(self.len)
        {
            tracing::debug!(%error, "sealed segment not trimmed");
        }
        let (file, len) = create_segment(&self.options, self.seq + 1)?;
        let sealed = std::mem::replace(&mut self.file, wrap(&self.options, file));
        if self.defer_rotation_sync {
            self.sealed.push((self.seq, sealed));
        }
        self.seq += 1;
        self.len = len;
        Ok(())
    }
}

/// What a failed `fdatasync` of segment `seq` does under `options.sync_failure`: aborts the
/// process, or answers the error (the caller stops its log).
pub(super) fn sync_failure(options: &WalOptions, seq: u64, error: &std::io::Error) -> String {
    let path = options.dir.join(segment_name(seq));
    tracing::error!(path = %path.display(), %error, "fdatasync failed: the log stops");
    if options.sync_failure == SyncFailure::Abort {
        eprintln!(
            "crest: fdatasync of {} failed: {error}; aborting (recovery decides what survived)",
            path.display()
        );
        std::process::abort();
    }
    format!("fdatasync of {} failed: {error}", path.display())
}

/// Writes `records` as checkpoint `seq` (replay starting at `replay_from`): a temporary file,
/// synced, renamed into place, and the directory synced. Returns its size.
pub(super) fn write_checkpoint(
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
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(super::PRIVATE_FILE)
            .open(&tmp_path)
            .map_err(|e| io_error(&tmp_path, e))?;
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
pub(super) fn remove_replaced(
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

/// Roughly how many bytes `record` takes in the log (what bounds a group's size).
pub fn approximate_bytes(record: &LogRecord) -> usize {
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

pub(super) fn fail_all(jobs: &[Append], error: &str) -> Vec<Completion> {
    jobs.iter()
        .filter_map(|job| job.token.map(|token| (token, Err(error.to_string()))))
        .collect()
}
