//! Writing a log from the caller's thread, for a replica's journal.
//!
//! A replica of a group applies committed entries whose durability is its Raft log's: they are
//! already synced there, on a majority. Its crest log is the applied state, so it is written
//! without a sync per append (synced when its owner asks: at a checkpoint, before a snapshot,
//! or every so many bytes), and after a crash it is cut back to the end its owner last
//! recorded as synced ([`truncate_to`]) and the entries after it are applied again. A segment
//! it seals is synced with the next sync too, not as it is sealed, and a sync can run on
//! another thread while the log goes on being written ([`DirectLog::sync_job`]): the owner
//! records the end it reached once the job is done.
//!
//! For that to give every replica the same bytes at the same places, each append is its own
//! write and decides its own segment rotation: the same appends in the same order from the
//! same log give the same log, whatever the timing. The group-commit writer thread gathers
//! whatever is queued into one write, so the place where it rotates depends on timing.

use super::writer::fail_all;
use super::*;
use crate::format::{
    RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES, parse_checkpoint_name, parse_segment_name,
    record_header_of, segment_name,
};
use crest_core::config::Durability;

/// A log written by its caller, one append a write, synced when asked; see the module doc.
pub struct DirectLog {
    wal: Wal,
    buf: Vec<u8>,
}

impl DirectLog {
    /// The log `wal` (opened and recovered), written without syncs from now on.
    pub fn new(mut wal: Wal) -> DirectLog {
        wal.options.durability = Durability::Buffered;
        wal.defer_rotation_sync = true;
        DirectLog {
            wal,
            buf: Vec::with_capacity(1 << 20),
        }
    }

    /// Writes `records` at the end of the log as one append (starting a new segment first if
    /// it would pass `segment_bytes_max`), without syncing; answers where its bodies are.
    /// `token` names the append to a later checkpoint's `includes`.
    ///
    /// # Errors
    /// The write failed (it is cut back from the file), or the log stopped after a failed
    /// sync.
    pub fn append(&mut self, records: Vec<LogRecord>, token: u64) -> Result<Vec<Location>, String> {
        let job = [Append {
            records,
            token: Some(token),
            wait: SyncWait::Now,
        }];
        if self.wal.stopped {
            self.wal
                .ready
                .extend(fail_all(&job, "the log stopped after a failed sync"));
        } else {
            self.wal.write_group(&job, &mut self.buf);
        }
        let mut ready = std::mem::take(&mut self.wal.ready);
        match ready.iter().position(|(t, _)| *t == token) {
            Some(at) => ready.swap_remove(at).1,
            None => Err("the log wrote the append but did not report it".into()),
        }
    }

    /// Writes one record whose body `body` was made by [`crate::format::encode_record_body`]
    /// (on another replica, perhaps) at the end of the log, as [`DirectLog::append`] does
    /// with its records, without decoding them; answers the segment and the file offset the
    /// body starts at (a body's location is that plus its span). `body_crc` is the body's
    /// CRC-32 where the sender computed it (`None`: computed here).
    ///
    /// # Errors
    /// A body past `record_bytes_max`, a failed write (cut back from the file), or a log
    /// stopped after a failed sync.
    pub fn append_encoded(
        &mut self,
        body: &[u8],
        body_crc: Option<u32>,
        token: u64,
    ) -> Result<(u64, u64), String> {
        let wal = &mut self.wal;
        if wal.stopped {
            return Err("the log stopped after a failed sync".into());
        }
        let max = wal.options.record_bytes_max;
        if body.len() > max as usize {
            return Err(format!("log record of {} bytes exceeds {max}", body.len()));
        }
        let bytes = (RECORD_HEADER_BYTES + body.len()) as u64;
        let header = SEGMENT_HEADER_BYTES as u64;
        if wal.len > header && wal.len + bytes > wal.options.segment_bytes_max {
            // The same rule as a group's: the same records rotate at the same place.
            if let Err(error) = wal.rotate() {
                let error = error.to_string();
                wal.refused(&error);
                return Err(error);
            }
        }
        let body_crc = body_crc.unwrap_or_else(|| crc32fast::hash(body));
        let record = record_header_of(wal.seq, body.len(), body_crc);
        if let Err(error) = wal.file.write_all_vectored_at(&[&record, body], wal.len) {
            let _ = wal.file.set_len(wal.len);
            let path = wal.options.dir.join(segment_name(wal.seq));
            let error = format!("log write to {} failed: {error}", path.display());
            wal.refused(&error);
            return Err(error);
        }
        let start = (wal.seq, wal.len);
        if wal.positions.len() >= writer::POSITIONS_KEPT {
            wal.positions.pop_front();
        }
        wal.positions.push_back((token, start));
        wal.len += bytes;
        Ok((start.0, start.1 + RECORD_HEADER_BYTES as u64))
    }

    /// Takes a checkpoint (see [`WalHandle::checkpoint`]): the log moves to a new segment,
    /// synced, and `before_removal` is called with the new end once the checkpoint is durable,
    /// before the files it replaces are deleted (an error from it keeps them). Answers whether
    /// the checkpoint was taken; one that was not leaves the log whole.
    pub fn checkpoint(
        &mut self,
        records: &[LogRecord],
        includes: &[u64],
        segments: &[u32],
        before_removal: &mut dyn FnMut((u64, u64)) -> Result<(), String>,
    ) -> bool {
        if self.wal.stopped {
            return false;
        }
        self.wal
            .checkpoint_with(records, includes, segments, before_removal)
    }

    /// Makes everything written durable (`fdatasync` of the segments sealed since the last
    /// sync, then of the active one). A failure applies the log's [`SyncFailure`].
    ///
    /// # Errors
    /// The sync failed (in [`SyncFailure::StopWriter`] mode).
    pub fn sync(&mut self) -> Result<(), String> {
        if self.wal.stopped {
            return Err("the log stopped after a failed sync".into());
        }
        self.wal.sync()?;
        // Nothing is held in buffered mode; what a sync reports is of no one's interest.
        self.wal.ready.clear();
        Ok(())
    }

    /// Where the log ends: the active segment and the length written to it.
    pub fn end(&self) -> (u64, u64) {
        (self.wal.seq, self.wal.len)
    }

    /// A sync of everything written so far, to run on another thread while this log goes on
    /// being written: the segments sealed since the last sync and another handle on the
    /// active one. A segment file that has no other handle to give is synced here instead (the
    /// job then has nothing left to do).
    ///
    /// # Errors
    /// The log stopped after a failed sync, the active segment could not be shared, or (synced
    /// here) its sync failed.
    pub fn sync_job(&mut self) -> Result<SyncJob, String> {
        if self.wal.stopped {
            return Err("the log stopped after a failed sync".into());
        }
        let end = self.end();
        let options = self.wal.options.clone();
        match self.wal.file.try_clone() {
            Some(Ok(active)) => {
                let mut files = std::mem::take(&mut self.wal.sealed);
                files.push((end.0, active));
                Ok(SyncJob {
                    files,
                    end,
                    options,
                })
            }
            Some(Err(error)) => Err(format!(
                "segment {} of {} could not be shared for syncing: {error}",
                end.0,
                options.dir.display()
            )),
            None => {
                self.sync()?;
                Ok(SyncJob {
                    files: Vec::new(),
                    end,
                    options,
                })
            }
        }
    }
}

/// A sync of a [`DirectLog`] up to [`SyncJob::end`], run apart from the log
/// ([`DirectLog::sync_job`]).
pub struct SyncJob {
    files: Vec<(u64, Box<dyn SegmentFile>)>,
    end: (u64, u64),
    options: WalOptions,
}

impl SyncJob {
    /// Where the log ended when the job was made: durable once it ran.
    pub fn end(&self) -> (u64, u64) {
        self.end
    }

    /// Syncs each segment; a failure applies the log's [`SyncFailure`] (an abort, or the
    /// error, after which the log's owner must write no more to it: the failed pages may be
    /// dropped by the kernel and a later sync would not say so).
    ///
    /// # Errors
    /// An `fdatasync` failed.
    pub fn run(self) -> Result<(u64, u64), String> {
        for (seq, mut file) in self.files {
            if let Err(error) = file.sync_data() {
                return Err(writer::sync_failure(&self.options, seq, &error));
            }
        }
        Ok(self.end)
    }
}

/// Cuts the log in `dir` back to `end` (a segment and a length in it, as [`DirectLog::end`]
/// gave once synced): segments and checkpoints after that segment are deleted and the segment
/// is cut to that length. Answers what was cut, for the operator's log. Call it before the log
/// is opened.
///
/// # Errors
/// An I/O error, or no segment `end.0` while later files exist (the log is not the one `end`
/// was taken from).
pub fn truncate_to(dir: &Path, end: (u64, u64)) -> Result<Vec<String>, StorageError> {
    let (seq, len) = end;
    let mut cut = Vec::new();
    let mut found = false;
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let after = match (parse_segment_name(name), parse_checkpoint_name(name)) {
            (Some(s), _) => {
                found |= s == seq;
                s > seq
            }
            (None, Some(s)) => s > seq,
            (None, None) => false,
        };
        if after {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
            cut.push(format!("{name} removed"));
        }
    }
    if !found {
        if cut.is_empty() {
            return Ok(cut);
        }
        return Err(StorageError::other(
            dir,
            format!("no segment {seq} to cut the log back to, but later files"),
        ));
    }
    let path = dir.join(segment_name(seq));
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    let written = file.metadata().map_err(|e| io_error(&path, e))?.len();
    if written > len {
        file.set_len(len).map_err(|e| io_error(&path, e))?;
        file.sync_all().map_err(|e| io_error(&path, e))?;
        cut.push(format!(
            "{} cut from {written} to {len} bytes",
            segment_name(seq)
        ));
    }
    sync_dir(dir)?;
    Ok(cut)
}
