//! A replica's crest log as the group's [`Journal`]: committed operations written in log
//! order, synced every `replica_journal_sync_bytes`, at checkpoints and before snapshots, and
//! cut back to the last synced end after a crash.

use super::{Operation, Placed, Placement, decode_entry, encode_placed, snapshot};
use crest_core::record::LogRecord;
use crest_replica::{Applied, Batch, Journal, Position};
use crest_storage::wal::{DirectLog, WalOptions};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A journal's bounds.
#[derive(Clone, Copy, Debug)]
pub struct JournalLimits {
    /// The appends a checkpoint can name (older ones make it abandoned: the log stays whole).
    pub tokens_kept: usize,
    /// `replica_lag_window_entries`.
    pub lag_window: usize,
    /// Bytes applied between syncs of the crest log (`replica_journal_sync_bytes`): what a
    /// replica applies again from its Raft log after a crash, at most.
    pub sync_bytes: u64,
}

impl JournalLimits {
    /// The limits `settings` name (the log writer's queue bounds the appends kept).
    pub fn of(settings: &crest_core::config::Settings) -> JournalLimits {
        JournalLimits {
            tokens_kept: usize::try_from(settings.wal_queue_ops_max).unwrap_or(usize::MAX),
            lag_window: usize::try_from(settings.replica_lag_window_entries).unwrap_or(usize::MAX),
            sync_bytes: settings.replica_journal_sync_bytes,
        }
    }
}

/// The file beside a replica's log that holds the journal's last synced [`Saved`].
const POSITION_FILE: &str = "replica-position";

/// What the position file holds: the last entry applied when the log was last synced, and
/// where the log ended then.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    position: Position,
    /// `None` in a file written before the crest log was synced less often than every entry:
    /// the log then holds exactly what the position says.
    end: Option<(u64, u64)>,
}

/// A replica's crest log as the group's [`Journal`]; see the module doc. Clones share it: the
/// group applies through one, the node recovers its leaf through another.
#[derive(Clone)]
pub struct LeafJournal {
    state: Arc<Mutex<JournalState>>,
    /// Apart from the state: the status reads it while an apply holds the state.
    recent: Arc<Mutex<AppliedBytes>>,
}

/// The bytes of the batches a replica applied lately, by log index: how far behind a follower
/// is in bytes, counted over the last `replica_lag_window_entries` entries.
struct AppliedBytes {
    /// (index, bytes applied in all up to and with it), oldest first.
    entries: VecDeque<(u64, u64)>,
    total: u64,
    max: usize,
}

impl AppliedBytes {
    fn record(&mut self, index: u64, bytes: u64) {
        self.total += bytes;
        self.entries.push_back((index, self.total));
        while self.entries.len() > self.max {
            self.entries.pop_front();
        }
    }

    /// The bytes applied after entry `index`: `None` if `index` is older than the window.
    fn after(&self, index: Option<u64>) -> Option<u64> {
        let Some(&(last, _)) = self.entries.back() else {
            return Some(0);
        };
        let index = match index {
            Some(index) if index >= last => return Some(0),
            Some(index) => index,
            None => {
                return self
                    .entries
                    .front()
                    .filter(|(i, _)| *i <= 1)
                    .map(|_| self.total);
            }
        };
        let at = self.entries.partition_point(|(i, _)| *i <= index);
        if at == 0 {
            return None;
        }
        Some(self.total - self.entries[at - 1].1)
    }
}

struct JournalState {
    options: WalOptions,
    log: Option<DirectLog>,
    /// The last entry applied (ahead of the saved one until the next sync).
    position: Position,
    /// Bytes written to the log since its last sync started.
    unsynced: u64,
    sync_bytes: u64,
    /// The sync running apart from the apply, if one is: it saves the position it was
    /// started at once done. One at a time: the next waits for it.
    syncing: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// The local token of each recent append with a leader's token, by (term, leader's token):
    /// a checkpoint names the appends it does not include by the leader's tokens.
    tokens: HashMap<(u64, u64), u64>,
    token_order: VecDeque<(u64, u64)>,
    tokens_kept: usize,
    next_token: u64,
}

impl LeafJournal {
    /// Opens the log in `options.dir` (creating it; cut back to where it was last synced),
    /// within `limits`.
    ///
    /// # Errors
    /// The log cannot be opened or its position read.
    pub fn open(options: WalOptions, limits: JournalLimits) -> std::io::Result<LeafJournal> {
        JournalState::open(options, limits).map(|state| LeafJournal {
            state: Arc::new(Mutex::new(state)),
            recent: Arc::new(Mutex::new(AppliedBytes {
                entries: VecDeque::new(),
                total: 0,
                max: limits.lag_window.max(1),
            })),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, JournalState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, AppliedBytes> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The bytes of the entries this replica applied after entry `index` (of those it applied
    /// since it started, within `replica_lag_window_entries`): a follower's lag in bytes, on
    /// its leader. `None` if `index` is older than that.
    pub fn bytes_applied_after(&self, index: Option<u64>) -> Option<u64> {
        self.recent().after(index)
    }

    /// Waits until the sync running apart from the apply, if one is, has saved its position.
    ///
    /// # Errors
    /// That sync failed (the log is then closed).
    pub fn synced(&self) -> std::io::Result<()> {
        self.state().settle()
    }

    /// The log's directory.
    pub fn dir(&self) -> PathBuf {
        self.state().options.dir.clone()
    }

    /// Hands every operation of this replica's log, in order, to `each` (a leaf's
    /// `replay_operation`): what the replica just elected leader does, once it applied every
    /// committed entry, to rebuild its leaf exactly as a restarted leaf does. The group applies
    /// nothing meanwhile.
    ///
    /// # Errors
    /// The log cannot be read; the journal is then closed and the replica must not lead.
    pub fn recover(
        &self,
        each: impl FnMut(Vec<LogRecord>),
    ) -> std::io::Result<crest_storage::wal::Recovered> {
        let mut state = self.state();
        state.settle()?;
        // The directory's lock goes with the log; the recovery takes it again.
        state.log = None;
        let (wal, recovered) = crest_storage::wal::open_with(state.options.clone(), each)
            .map_err(std::io::Error::other)?;
        state.log = Some(DirectLog::new(wal));
        Ok(recovered)
    }
}

impl Journal for LeafJournal {
    fn position(&mut self) -> std::io::Result<Position> {
        Ok(self.state().position.clone())
    }

    fn apply(&mut self, entries: Vec<(Position, Option<Batch>)>) -> std::io::Result<Vec<Applied>> {
        let sizes: Vec<(u64, u64)> = entries
            .iter()
            .filter_map(|(position, batch)| {
                let bytes = batch.as_ref().map_or(0, |b| b.0.len() as u64);
                Some((position.0?.index, bytes))
            })
            .collect();
        let answers = self.state().apply(entries)?;
        let mut recent = self.recent();
        for (index, bytes) in sizes {
            recent.record(index, bytes);
        }
        Ok(answers)
    }

    fn snapshot(&mut self, into: &mut std::fs::File) -> std::io::Result<Position> {
        let mut state = self.state();
        // The Raft log before the snapshot may be purged once it is taken: what it describes
        // must be durable here first.
        state.sync()?;
        snapshot::write(&state.options.dir, state.options.record_bytes_max, into)?;
        Ok(state.position.clone())
    }

    fn restore(&mut self, from: &mut std::fs::File, position: &Position) -> std::io::Result<()> {
        let mut state = self.state();
        // The log is replaced whole: a sync of the old one may fail, but must not save after.
        if let Err(error) = state.settle() {
            tracing::warn!(%error, "the replica's log, replaced by a snapshot, was not synced");
        }
        state.log = None;
        snapshot::read(from, &state.options.dir)?;
        state.tokens.clear();
        state.token_order.clear();
        let (wal, _) = crest_storage::wal::open_with(state.options.clone(), |_| {})
            .map_err(std::io::Error::other)?;
        let log = DirectLog::new(wal);
        let end = log.end();
        state.log = Some(log);
        state.position = position.clone();
        state.unsynced = 0;
        save(&state.options.dir, &state.position, end)
    }
}

fn read_saved(dir: &Path) -> std::io::Result<Saved> {
    let bytes = match std::fs::read(dir.join(POSITION_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Saved {
                position: Position::default(),
                end: None,
            });
        }
        Err(e) => return Err(e),
    };
    rmp_serde::from_slice::<Saved>(&bytes)
        .or_else(|_| {
            rmp_serde::from_slice::<Position>(&bytes).map(|position| Saved {
                position,
                end: None,
            })
        })
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Replaces the position file, durably: after a crash the log is cut back to `end` and the
/// Raft log's entries after `position` are applied again, so the file must never be older
/// than what the Raft log still holds (it purges only what a snapshot covers, and a snapshot
/// saves first).
fn save(dir: &Path, position: &Position, end: (u64, u64)) -> std::io::Result<()> {
    let saved = Saved {
        position: position.clone(),
        end: Some(end),
    };
    let bytes = rmp_serde::to_vec(&saved).map_err(std::io::Error::other)?;
    let path = dir.join(POSITION_FILE);
    let temporary = path.with_extension("new");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

impl JournalState {
    fn open(options: WalOptions, limits: JournalLimits) -> std::io::Result<JournalState> {
        std::fs::create_dir_all(&options.dir)?;
        let saved = read_saved(&options.dir)?;
        if let Some(end) = saved.end {
            // What was written after the last sync is applied again from the Raft log, so
            // that it lands at the same places as on every other replica.
            let cut = crest_storage::wal::truncate_to(&options.dir, end)
                .map_err(std::io::Error::other)?;
            for what in cut {
                tracing::info!(dir = %options.dir.display(), what, "replica log cut back to its last sync");
            }
        }
        // Opening checks the log whole (a torn tail is cut, as for any leaf); the leaf that
        // later runs on it recovers it again.
        let (wal, _) = crest_storage::wal::open_with(options.clone(), |_| {})
            .map_err(std::io::Error::other)?;
        Ok(JournalState {
            options,
            log: Some(DirectLog::new(wal)),
            position: saved.position,
            unsynced: 0,
            sync_bytes: limits.sync_bytes.max(1),
            syncing: None,
            tokens: HashMap::new(),
            token_order: VecDeque::new(),
            tokens_kept: limits.tokens_kept.max(1),
            next_token: 1,
        })
    }

    fn log(&mut self) -> std::io::Result<&mut DirectLog> {
        self.log
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the replica's log is closed"))
    }

    fn token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    fn remember(&mut self, term: u64, leader: u64, local: u64) {
        self.tokens.insert((term, leader), local);
        self.token_order.push_back((term, leader));
        while self.token_order.len() > self.tokens_kept {
            if let Some(old) = self.token_order.pop_front() {
                self.tokens.remove(&old);
            }
        }
    }

    /// Waits for the sync running apart, if one is. Its failure closes the log: after a failed
    /// `fdatasync` nothing more is written to it (the replica stops and, restarted, cuts its
    /// log back to the last end saved and applies again from the Raft log).
    fn settle(&mut self) -> std::io::Result<()> {
        let Some(syncing) = self.syncing.take() else {
            return Ok(());
        };
        let result = syncing
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the log's sync thread panicked")));
        if result.is_err() {
            self.log = None;
        }
        result
    }

    /// Starts a sync of everything applied so far on a thread of its own, which saves the
    /// position once the log is durable to where it ends now; the apply goes on meanwhile.
    /// Where no thread can be started, syncs here.
    fn sync_apart(&mut self) -> std::io::Result<()> {
        self.settle()?;
        let job = self.log()?.sync_job().map_err(std::io::Error::other)?;
        let dir = self.options.dir.clone();
        let position = self.position.clone();
        self.unsynced = 0;
        // Shared so that, if no thread can be started, it runs here all the same.
        let run = Arc::new(Mutex::new(Some(move || {
            let end = job.run().map_err(std::io::Error::other)?;
            save(&dir, &position, end)
        })));
        let take = |run: &Mutex<Option<_>>| {
            run.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take()
        };
        let spawned = std::thread::Builder::new()
            .name("crest-journal-sync".into())
            .spawn({
                let run = run.clone();
                move || take(&run).map_or(Ok(()), |run| run())
            });
        match spawned {
            Ok(thread) => {
                self.syncing = Some(thread);
                Ok(())
            }
            Err(error) => {
                tracing::warn!(%error, "no thread for the replica log's sync: synced in the apply");
                let result = take(&run).map_or(Ok(()), |run| run());
                if result.is_err() {
                    self.log = None;
                }
                result
            }
        }
    }

    /// Syncs the log and saves the position it reflects.
    fn sync(&mut self) -> std::io::Result<()> {
        self.settle()?;
        let log = self.log()?;
        log.sync().map_err(std::io::Error::other)?;
        let end = log.end();
        save(&self.options.dir, &self.position, end)?;
        self.unsynced = 0;
        Ok(())
    }

    fn apply(&mut self, entries: Vec<(Position, Option<Batch>)>) -> std::io::Result<Vec<Applied>> {
        let mut answers = Vec::with_capacity(entries.len());
        for (position, batch) in entries {
            let placed = match batch {
                Some(batch) => self.apply_entry(&position, &batch)?,
                None => Vec::new(),
            };
            self.position = position;
            answers.push(encode_placed(&placed)?);
        }
        if self.unsynced >= self.sync_bytes {
            self.sync_apart()?;
        } else if self.syncing.as_ref().is_some_and(|s| s.is_finished()) {
            // A failed sync is heard of at the next apply, not the next threshold.
            self.settle()?;
        }
        Ok(answers)
    }

    fn apply_entry(&mut self, position: &Position, batch: &Batch) -> std::io::Result<Placed> {
        let term = position.0.map_or(0, |id| id.leader_id.term);
        let ops = decode_entry(batch)?;
        let count = ops.len();
        let mut placed = Vec::new();
        for (index, op) in ops.into_iter().enumerate() {
            match op {
                Operation::Append { token, records } => {
                    let local = self.token();
                    let log = self.log()?;
                    let before = log.end();
                    let locations = log.append(records, local).map_err(std::io::Error::other)?;
                    let after = log.end();
                    // In a new segment, what it holds (the sealed one's last bytes are not
                    // counted: the threshold is a schedule, the sync takes all).
                    self.unsynced += if after.0 == before.0 {
                        after.1 - before.1
                    } else {
                        after.1
                    };
                    if let Some(token) = token {
                        self.remember(term, token, local);
                        placed.push((token, Placement::Locations(locations)));
                    }
                }
                Operation::Encoded {
                    token, body, crc, ..
                } => {
                    let local = self.token();
                    let log = self.log()?;
                    let (segment, offset) = log
                        .append_encoded(&body, crc, local)
                        .map_err(std::io::Error::other)?;
                    self.unsynced += body.len() as u64;
                    if let Some(token) = token {
                        self.remember(term, token, local);
                        placed.push((token, Placement::At { segment, offset }));
                    }
                }
                Operation::Checkpoint {
                    records,
                    includes,
                    segments,
                } => {
                    if index + 1 != count {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "a checkpoint that is not the last operation of its entry",
                        ));
                    }
                    // An append this journal cannot name any more makes the log abandon the
                    // checkpoint (0 is no token it ever used).
                    let includes: Vec<u64> = includes
                        .iter()
                        .map(|token| self.tokens.get(&(term, *token)).copied().unwrap_or(0))
                        .collect();
                    self.checkpoint(position, &records, &includes, &segments)?;
                }
            }
        }
        Ok(placed)
    }

    /// Takes a checkpoint, the last operation of the entry at `position`: once it is durable
    /// the entry is saved as applied (with everything before it, which the checkpoint's sync
    /// made durable), and only then does the log delete what it replaces, so that after a
    /// crash the log is never cut back to before a checkpoint whose replaced files are gone.
    fn checkpoint(
        &mut self,
        position: &Position,
        records: &[LogRecord],
        includes: &[u64],
        segments: &[u32],
    ) -> std::io::Result<()> {
        // A sync running apart would save an older position after this one.
        self.settle()?;
        let dir = self.options.dir.clone();
        let mut failed = None;
        let mut saved = false;
        let mut before_removal = |end: (u64, u64)| {
            let result = save(&dir, position, end).map_err(|e| e.to_string());
            saved = result.is_ok();
            if let Err(error) = &result {
                failed = Some(error.clone());
            }
            result
        };
        self.log()?
            .checkpoint(records, includes, segments, &mut before_removal);
        if let Some(error) = failed {
            return Err(std::io::Error::other(error));
        }
        if saved {
            self.unsynced = 0;
        }
        Ok(())
    }
}

impl Drop for JournalState {
    fn drop(&mut self) {
        // Less to apply again at the next start; nothing depends on it.
        if let Err(error) = self.settle() {
            tracing::warn!(%error, "the replica's log was not synced as it closed");
        }
        if self.log.is_some()
            && let Err(error) = self.sync()
        {
            tracing::warn!(%error, "the replica's log was not synced as it closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AppliedBytes;
    use std::collections::VecDeque;

    #[test]
    fn a_follower_s_lag_in_bytes_is_counted_over_the_window() {
        let mut recent = AppliedBytes {
            entries: VecDeque::new(),
            total: 0,
            max: 3,
        };
        assert_eq!(recent.after(Some(7)), Some(0), "nothing applied yet");
        for (index, bytes) in [(1, 10), (2, 20), (3, 30)] {
            recent.record(index, bytes);
        }
        assert_eq!(recent.after(None), Some(60), "behind by everything");
        assert_eq!(recent.after(Some(1)), Some(50));
        assert_eq!(recent.after(Some(3)), Some(0), "caught up");
        assert_eq!(
            recent.after(Some(9)),
            Some(0),
            "holds more than applied here"
        );
        recent.record(4, 40);
        assert_eq!(recent.after(Some(2)), Some(70));
        assert_eq!(recent.after(Some(1)), None, "older than the window");
        assert_eq!(recent.after(None), None);
    }
}
