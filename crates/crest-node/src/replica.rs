//! A leaf's log kept by a replica group.
//!
//! The leader's leaf emits its storage operations as a single-replica leaf does; a
//! [`ReplicatedStore`] sends each, in the order emitted, through the group's Raft log. Every
//! replica's [`LeafJournal`] (the leader's too) then writes the committed operations to its own
//! crest log, in that same order, so every replica's log holds the same records and the same
//! checkpoints: a follower that becomes leader recovers its leaf from its own log exactly as a
//! restarted leaf does. An append is complete for the leaf once a majority holds it and the
//! leader's own log has it durably; the bodies' locations come from the leader's log.

use crest_core::machine::{StorageDone, StorageOp, SyncWait};
use crest_core::record::{Location, LogRecord};
use crest_replica::{Applied, Batch, Journal, Position};
use crest_storage::wal::{Completion, WalHandle, WalOptions};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// One storage operation of the leader's leaf as it travels in the group's log. Reads stay
/// local: every replica's log holds the bodies.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Operation {
    /// [`StorageOp::Append`]; the token is the leader's, echoed to its leaf.
    Append {
        /// The leader's token, if its leaf waits for the append.
        token: Option<u64>,
        /// The records.
        records: Vec<LogRecord>,
    },
    /// [`StorageOp::Checkpoint`], its `includes` in the leader's tokens.
    Checkpoint {
        /// The snapshot.
        records: Vec<LogRecord>,
        /// The leader's tokens of the appends the snapshot does not reflect.
        includes: Vec<u64>,
        /// Segments that must outlive the checkpoint.
        segments: Vec<u32>,
    },
}

impl Operation {
    /// The operation that carries `op` through the log; `None` for a read.
    pub fn of(op: StorageOp) -> Option<Operation> {
        match op {
            StorageOp::Append { token, records, .. } => Some(Operation::Append { token, records }),
            StorageOp::Checkpoint {
                records,
                includes,
                segments,
            } => Some(Operation::Checkpoint {
                records,
                includes,
                segments,
            }),
            StorageOp::Read { .. } => None,
        }
    }

    /// The batch that carries it.
    ///
    /// # Errors
    /// A record that cannot be encoded.
    pub fn encode(&self) -> std::io::Result<Batch> {
        rmp_serde::to_vec(self)
            .map(|bytes| Batch(bytes.into()))
            .map_err(std::io::Error::other)
    }

    fn decode(batch: &Batch) -> std::io::Result<Operation> {
        rmp_serde::from_slice(&batch.0)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// What the leader's leaf gets back for an append: where its bodies are in the leader's log.
///
/// # Errors
/// An answer that is not a list of locations.
pub fn locations(applied: &Applied) -> std::io::Result<Vec<Location>> {
    if applied.0.is_empty() {
        return Ok(Vec::new());
    }
    rmp_serde::from_slice(&applied.0)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A journal's bounds.
#[derive(Clone, Copy, Debug)]
pub struct JournalLimits {
    /// The appends a checkpoint can name (older ones make it abandoned: the log stays whole).
    pub tokens_kept: usize,
    /// `replica_lag_window_entries`.
    pub lag_window: usize,
    /// How long it waits for its own log's writer before it takes the replica's disk for
    /// broken (the writer waits on nothing but the disk): `replica_log_write_timeout_ms`.
    pub writer_wait: Duration,
}

impl JournalLimits {
    /// The limits `settings` name (the log writer's queue bounds the appends kept).
    pub fn of(settings: &crest_core::config::Settings) -> JournalLimits {
        JournalLimits {
            tokens_kept: usize::try_from(settings.wal_queue_ops_max).unwrap_or(usize::MAX),
            lag_window: usize::try_from(settings.replica_lag_window_entries).unwrap_or(usize::MAX),
            writer_wait: Duration::from_millis(settings.replica_log_write_timeout_ms),
        }
    }
}

/// The file beside a replica's log that holds the journal's [`Position`].
const POSITION_FILE: &str = "replica-position";

/// A replica's crest log as the group's [`Journal`]; see the module doc. Clones share it: the
/// group applies through one, the node recovers its leaf through another.
#[derive(Clone)]
pub struct LeafJournal {
    state: Arc<Mutex<JournalState>>,
    /// Apart from the state: the status reads it while an apply holds the state through a sync.
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
    wal: Option<WalHandle>,
    completions: mpsc::Receiver<Vec<Completion>>,
    completions_tx: mpsc::Sender<Vec<Completion>>,
    position: Position,
    /// The local token of each recent append with a leader's token, by (term, leader's token):
    /// a checkpoint names the appends it does not include by the leader's tokens.
    tokens: HashMap<(u64, u64), u64>,
    token_order: VecDeque<(u64, u64)>,
    tokens_kept: usize,
    next_token: u64,
    /// See [`JournalLimits::writer_wait`].
    writer_wait: Duration,
}

impl LeafJournal {
    /// Opens the log in `options.dir` (creating it) and starts its writer, within `limits`.
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
    /// The log cannot be read; the writer is then stopped and the replica must not lead.
    pub fn recover(
        &self,
        each: impl FnMut(Vec<LogRecord>),
    ) -> std::io::Result<crest_storage::wal::Recovered> {
        let mut state = self.state();
        if let Some(wal) = state.wal.take() {
            wal.close().map_err(std::io::Error::other)?;
        }
        let (wal, recovered) = crest_storage::wal::open_with(state.options.clone(), each)
            .map_err(std::io::Error::other)?;
        state.start(wal)?;
        Ok(recovered)
    }
}

impl Journal for LeafJournal {
    fn position(&mut self) -> std::io::Result<Position> {
        self.state().position()
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
        self.state().snapshot(into)
    }

    fn restore(&mut self, from: &mut std::fs::File, position: &Position) -> std::io::Result<()> {
        self.state().restore(from, position)
    }
}

impl JournalState {
    /// Opens the log in `options.dir` (creating it) and starts its writer, within `limits`.
    ///
    /// # Errors
    /// The log cannot be opened or its position read.
    fn open(options: WalOptions, limits: JournalLimits) -> std::io::Result<JournalState> {
        std::fs::create_dir_all(&options.dir)?;
        let position = read_position(&options.dir)?;
        let (completions_tx, completions) = mpsc::channel();
        let mut journal = JournalState {
            options,
            wal: None,
            completions,
            completions_tx,
            position,
            tokens: HashMap::new(),
            token_order: VecDeque::new(),
            tokens_kept: limits.tokens_kept.max(1),
            next_token: 1,
            writer_wait: limits.writer_wait,
        };
        journal.start_writer()?;
        Ok(journal)
    }

    fn start_writer(&mut self) -> std::io::Result<()> {
        // Opening checks the log whole (a torn tail is cut, as for any leaf); the leaf that
        // later runs on it recovers it again.
        let (wal, _) = crest_storage::wal::open_with(self.options.clone(), |_| {})
            .map_err(std::io::Error::other)?;
        self.start(wal)
    }

    fn start(&mut self, wal: crest_storage::wal::Wal) -> std::io::Result<()> {
        // Completions of a former writer that nobody waited for are of no interest now.
        while self.completions.try_recv().is_ok() {}
        let tx = self.completions_tx.clone();
        let handle = wal
            .start(move |done| {
                let _ = tx.send(done);
            })
            .map_err(std::io::Error::other)?;
        self.wal = Some(handle);
        Ok(())
    }

    fn writer(&self) -> std::io::Result<&WalHandle> {
        self.wal
            .as_ref()
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

    /// Waits until the writer reported every token of `waiting`; answers each one's result.
    fn wait_for(
        &mut self,
        mut waiting: HashMap<u64, usize>,
    ) -> std::io::Result<Vec<(usize, Vec<Location>)>> {
        let mut done = Vec::new();
        while !waiting.is_empty() {
            let group = self
                .completions
                .recv_timeout(self.writer_wait)
                .map_err(|_| std::io::Error::other("the replica's log writer does not answer"))?;
            for (token, result) in group {
                if let Some(index) = waiting.remove(&token) {
                    let locations = result.map_err(std::io::Error::other)?;
                    done.push((index, locations));
                }
            }
        }
        Ok(done)
    }

    /// Waits until the writer has done everything submitted before (checkpoints included).
    fn quiesce(&mut self) -> std::io::Result<()> {
        let token = self.token();
        self.writer()?
            .barrier(token)
            .map_err(std::io::Error::other)?;
        self.wait_for(HashMap::from([(token, 0)])).map(drop)
    }

    fn save_position(&mut self, position: Position) -> std::io::Result<()> {
        // Written after what it describes is durable, and replaced whole. It is not synced: a
        // position lost in a crash is an older one, and the batches after it are applied
        // again, which changes nothing (each log record sets absolute values, as recovery
        // replaying a checkpoint's tail relies on).
        let bytes = rmp_serde::to_vec(&position).map_err(std::io::Error::other)?;
        let path = self.options.dir.join(POSITION_FILE);
        let temporary = path.with_extension("new");
        std::fs::write(&temporary, bytes)?;
        std::fs::rename(temporary, path)?;
        self.position = position;
        Ok(())
    }

    /// The files of the log: segments and checkpoints.
    fn log_files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.options.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if crest_storage::format::parse_segment_name(name).is_some()
                || crest_storage::format::parse_checkpoint_name(name).is_some()
            {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }
}

impl Drop for JournalState {
    fn drop(&mut self) {
        // The writer syncs what it holds and releases the directory's lock before this
        // returns, so the replica can be started again at once.
        if let Some(wal) = self.wal.take()
            && let Err(error) = wal.close()
        {
            tracing::warn!(%error, "the replica's log writer did not stop cleanly");
        }
    }
}

fn read_position(dir: &Path) -> std::io::Result<Position> {
    match std::fs::read(dir.join(POSITION_FILE)) {
        Ok(bytes) => rmp_serde::from_slice(&bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Position::default()),
        Err(e) => Err(e),
    }
}

impl JournalState {
    fn position(&self) -> std::io::Result<Position> {
        Ok(self.position.clone())
    }

    fn apply(&mut self, entries: Vec<(Position, Option<Batch>)>) -> std::io::Result<Vec<Applied>> {
        let mut answers = vec![Applied::default(); entries.len()];
        let Some(last) = entries.last().map(|(position, _)| position.clone()) else {
            return Ok(answers);
        };
        // Every append of the group waits for its sync, so the position saved after them
        // never runs ahead of the log.
        let mut waiting = HashMap::new();
        let mut answered = HashSet::new();
        for (index, (position, batch)) in entries.into_iter().enumerate() {
            let Some(batch) = batch else { continue };
            let term = position.0.map_or(0, |id| id.leader_id.term);
            match Operation::decode(&batch)? {
                Operation::Append { token, records } => {
                    let local = self.token();
                    if let Some(token) = token {
                        self.remember(term, token, local);
                        answered.insert(index);
                    }
                    self.writer()?
                        .submit_with(records, Some(local), SyncWait::Now)
                        .map_err(std::io::Error::other)?;
                    waiting.insert(local, index);
                }
                Operation::Checkpoint {
                    records,
                    includes,
                    segments,
                } => {
                    // An append this journal cannot name any more makes the writer abandon the
                    // checkpoint (0 is no token it ever used).
                    let includes = includes
                        .iter()
                        .map(|token| self.tokens.get(&(term, *token)).copied().unwrap_or(0))
                        .collect();
                    self.writer()?
                        .checkpoint(records, includes, segments)
                        .map_err(std::io::Error::other)?;
                }
            }
        }
        for (index, locations) in self.wait_for(waiting)? {
            if answered.contains(&index) {
                let bytes = rmp_serde::to_vec(&locations).map_err(std::io::Error::other)?;
                answers[index] = Applied(bytes.into());
            }
        }
        self.save_position(last)?;
        Ok(answers)
    }

    fn snapshot(&mut self, into: &mut std::fs::File) -> std::io::Result<Position> {
        self.quiesce()?;
        for path in self.log_files()? {
            let mut file = match std::fs::File::open(&path) {
                Ok(file) => file,
                // A file the last checkpoint replaced.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .as_bytes()
                .to_vec();
            // A segment is copied through its last valid record, not its preallocated tail.
            let mut len = file.metadata()?.len();
            if let Some(seq) = crest_storage::format::parse_segment_name(
                path.file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default(),
            ) {
                let valid = crest_storage::format::segment_valid_len(
                    &file,
                    len,
                    seq,
                    self.options.record_bytes_max,
                )?;
                // Never less than the header a segment starts with.
                len = valid.max(len.min(crest_storage::format::SEGMENT_HEADER_BYTES as u64));
            }
            into.write_all(&(name.len() as u16).to_le_bytes())?;
            into.write_all(&name)?;
            into.write_all(&len.to_le_bytes())?;
            let copied = std::io::copy(&mut (&mut file).take(len), into)?;
            if copied != len {
                return Err(std::io::Error::other(format!(
                    "{} shrank while it was copied",
                    path.display()
                )));
            }
        }
        into.write_all(&0u16.to_le_bytes())?;
        Ok(self.position.clone())
    }

    fn restore(&mut self, from: &mut std::fs::File, position: &Position) -> std::io::Result<()> {
        if let Some(wal) = self.wal.take() {
            wal.close().map_err(std::io::Error::other)?;
        }
        for path in self.log_files()? {
            std::fs::remove_file(path)?;
        }
        loop {
            let mut len = [0u8; 2];
            from.read_exact(&mut len)?;
            let len = u16::from_le_bytes(len) as usize;
            if len == 0 {
                break;
            }
            let mut name = vec![0u8; len];
            from.read_exact(&mut name)?;
            let name = String::from_utf8(name)
                .ok()
                .filter(|n| {
                    crest_storage::format::parse_segment_name(n).is_some()
                        || crest_storage::format::parse_checkpoint_name(n).is_some()
                })
                .ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "not a log file")
                })?;
            let mut size = [0u8; 8];
            from.read_exact(&mut size)?;
            let size = u64::from_le_bytes(size);
            let path = self.options.dir.join(name);
            let mut file = std::fs::File::create(&path)?;
            let copied = std::io::copy(&mut (&mut *from).take(size), &mut file)?;
            if copied != size {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the snapshot ends inside a file",
                ));
            }
            file.sync_all()?;
        }
        std::fs::File::open(&self.options.dir)?.sync_all()?;
        self.tokens.clear();
        self.token_order.clear();
        self.start_writer()?;
        self.save_position(position.clone())
    }
}

/// When the leader counts a write done: `replica_acks`, and how long a follower that takes
/// nothing stays in sync (`replica_election_timeout_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Acks {
    /// `replica_acks`.
    pub mode: crest_core::config::ReplicaAcks,
    /// How long a follower that takes no entry stays in sync.
    pub in_sync_for: Duration,
}

impl Acks {
    /// As `settings` say.
    pub fn of(settings: &crest_core::config::Settings) -> Acks {
        Acks {
            mode: settings.replica_acks,
            in_sync_for: Duration::from_millis(settings.replica_election_timeout_ms),
        }
    }
}

/// For `replica_acks = "all"`: which followers are in sync, and waiting until they hold an
/// entry. A follower is in sync while the last entry it holds changed within `in_sync_for`
/// (one that holds the leader's last entry is never waited for).
struct InSync {
    metrics: tokio::sync::watch::Receiver<crest_replica::RaftMetrics>,
    /// Per follower: the last entry it held, and since when.
    progress: HashMap<u64, (Option<u64>, tokio::time::Instant)>,
    in_sync_for: Duration,
}

impl InSync {
    fn new(raft: &crest_replica::Raft, acks: Acks) -> Option<InSync> {
        (acks.mode == crest_core::config::ReplicaAcks::All).then(|| InSync {
            metrics: raft.metrics(),
            progress: HashMap::new(),
            in_sync_for: acks.in_sync_for,
        })
    }

    /// Waits until every follower in sync holds entry `index` (committed already: a majority
    /// holds it). Returns at once on a replica that no longer leads.
    async fn hold(&mut self, index: u64) {
        loop {
            let now = tokio::time::Instant::now();
            let mut waits_until = None;
            {
                let metrics = self.metrics.borrow_and_update();
                let Some(replication) = &metrics.replication else {
                    return;
                };
                for (&follower, matched) in replication.iter() {
                    if follower == metrics.id {
                        continue;
                    }
                    let matched = matched.map(|id| id.index);
                    let seen = self.progress.entry(follower).or_insert((matched, now));
                    if seen.0 != matched {
                        *seen = (matched, now);
                    }
                    let out_of_sync_at = seen.1 + self.in_sync_for;
                    if matched.is_some_and(|m| m >= index) || out_of_sync_at <= now {
                        continue;
                    }
                    waits_until = Some(
                        waits_until.map_or(out_of_sync_at, |t: tokio::time::Instant| {
                            t.min(out_of_sync_at)
                        }),
                    );
                }
            }
            let Some(until) = waits_until else {
                return;
            };
            if let Ok(Err(_)) = tokio::time::timeout_at(until, self.metrics.changed()).await {
                return;
            }
        }
    }
}

/// A leader's storage: each operation goes through the group's log, in the order the leaf
/// emits them; completions come back, in that order, to `on_done`.
pub struct ReplicatedStore {
    ops: mpsc::SyncSender<Operation>,
}

/// What became of one append the leader's leaf waits for.
pub type Outcome = Result<StorageDone, (u64, String)>;

impl ReplicatedStore {
    /// Starts the thread that hands operations to `raft` (at most `queue` wait; then the leaf
    /// waits, as for its own disk) and the task that reports completions to `on_done`.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn start(
        raft: crest_replica::Raft,
        queue: usize,
        acks: Acks,
        on_done: impl Fn(Outcome) + Send + 'static,
    ) -> std::io::Result<ReplicatedStore> {
        let mut in_sync = InSync::new(&raft, acks);
        let (ops, rx) = mpsc::sync_channel::<Operation>(queue.max(1));
        let runtime = tokio::runtime::Handle::current();
        // Writes handed to Raft and not answered yet: bounded like the queue before them.
        let (pending_tx, mut pending) = tokio::sync::mpsc::channel(queue.max(1));
        std::thread::Builder::new()
            .name("crest-replicate".into())
            .spawn(move || {
                while let Ok(op) = rx.recv() {
                    let token = match &op {
                        Operation::Append { token, .. } => *token,
                        Operation::Checkpoint { .. } => None,
                    };
                    let sent = op.encode().map_err(|e| e.to_string()).and_then(|batch| {
                        runtime
                            .block_on(raft.client_write_ff(batch))
                            .map_err(|e| e.to_string())
                    });
                    if pending_tx.blocking_send((token, sent)).is_err() {
                        return;
                    }
                }
            })?;
        // Raft answers writes in log order; this task passes the answers on in that order.
        tokio::spawn(async move {
            while let Some((token, sent)) = pending.recv().await {
                let answer = match sent {
                    Ok(receiver) => match receiver.await {
                        Ok(Ok(response)) => {
                            if let Some(in_sync) = &mut in_sync {
                                in_sync.hold(response.log_id.index).await;
                            }
                            locations(&response.data).map_err(|e| e.to_string())
                        }
                        Ok(Err(error)) => Err(error.to_string()),
                        Err(_) => Err("the replica group stopped".to_string()),
                    },
                    Err(error) => Err(error),
                };
                let Some(token) = token else {
                    if let Err(error) = answer {
                        tracing::warn!(%error, "a log record was not replicated");
                    }
                    continue;
                };
                on_done(match answer {
                    Ok(locations) => Ok(StorageDone { token, locations }),
                    Err(reason) => Err((token, reason)),
                });
            }
        });
        Ok(ReplicatedStore { ops })
    }

    /// Queues `op` for the group (reads are not for this store: the caller reads its own log).
    ///
    /// # Errors
    /// The store has stopped.
    pub fn submit(&self, op: StorageOp) -> Result<(), String> {
        let Some(op) = Operation::of(op) else {
            return Err("reads go to the replica's own log".into());
        };
        self.ops
            .send(op)
            .map_err(|_| "the replica group stopped".to_string())
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
