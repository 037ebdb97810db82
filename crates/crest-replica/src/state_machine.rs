//! openraft's state machine API over a [`Journal`], with snapshots kept as files.
//!
//! A snapshot is the journal's whole state written to `snapshot` in the replica's directory,
//! beside `snapshot.meta` (the position and membership it was taken at). One is sent to a
//! replica too far behind for the log (a new replica, or one whose disk was replaced); it
//! travels in chunks and is read from and written to files, never held in memory whole.

use crate::{Applied, Journal, Position, ReplicaId, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

type Meta = SnapshotMeta<ReplicaId, BasicNode>;

/// See the module doc. Clones share the journal.
pub(crate) struct StateMachine<J> {
    journal: Arc<Mutex<J>>,
    dir: PathBuf,
}

impl<J> Clone for StateMachine<J> {
    fn clone(&self) -> Self {
        StateMachine {
            journal: self.journal.clone(),
            dir: self.dir.clone(),
        }
    }
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl<J: Journal> StateMachine<J> {
    pub(crate) fn new(journal: J, dir: &Path) -> std::io::Result<StateMachine<J>> {
        std::fs::create_dir_all(dir)?;
        Ok(StateMachine {
            journal: Arc::new(Mutex::new(journal)),
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Runs `work` on the journal on a blocking thread (journals read and write files).
    async fn with_journal<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut J) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || {
            let mut journal = journal.lock().unwrap_or_else(|p| p.into_inner());
            work(&mut journal)
        })
        .await
        .map_err(io_error)?
    }

    /// The snapshot kept, if one was taken or received.
    fn read_meta(&self) -> std::io::Result<Option<Meta>> {
        match std::fs::read(self.path("snapshot.meta")) {
            Ok(bytes) => rmp_serde::from_slice(&bytes).map(Some).map_err(io_error),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes the file `from` the snapshot kept, described by `meta` (file first, then its
    /// description, each replaced whole).
    fn keep(&self, from: &Path, meta: &Meta) -> std::io::Result<()> {
        std::fs::rename(from, self.path("snapshot"))?;
        let bytes = rmp_serde::to_vec(meta).map_err(io_error)?;
        let temporary = self.path("snapshot.meta.new");
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(temporary, self.path("snapshot.meta"))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    async fn open_kept(&self, meta: Meta) -> std::io::Result<Snapshot<TypeConfig>> {
        let file = tokio::fs::File::open(self.path("snapshot")).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl<J: Journal> RaftSnapshotBuilder<TypeConfig> for StateMachine<J> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<ReplicaId>> {
        let building = self.path("snapshot.building");
        let file = building.clone();
        let position = self
            .with_journal(move |journal| {
                let mut out = std::fs::File::create(&file)?;
                let position = journal.snapshot(&mut out)?;
                out.sync_all()?;
                Ok(position)
            })
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let (last_log_id, last_membership) = position;
        let meta = Meta {
            last_log_id,
            last_membership,
            snapshot_id: format!(
                "{}-{}",
                last_log_id.map_or(0, |id| id.index),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ),
        };
        self.keep(&building, &meta)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        self.open_kept(meta.clone())
            .await
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e).into())
    }
}

impl<J: Journal> RaftStateMachine<TypeConfig> for StateMachine<J> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<ReplicaId>>,
            StoredMembership<ReplicaId, BasicNode>,
        ),
        StorageError<ReplicaId>,
    > {
        let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        journal
            .position()
            .map_err(|e| StorageIOError::read_state_machine(&e).into())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<ReplicaId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|entry| entry.log_id) else {
            return Ok(Vec::new());
        };
        self.with_journal(move |journal| {
            let mut membership = journal.position()?.1;
            let mut group = Vec::with_capacity(entries.len());
            for entry in entries {
                let log_id = entry.log_id;
                let batch = match entry.payload {
                    EntryPayload::Normal(batch) => Some(batch),
                    EntryPayload::Membership(changed) => {
                        membership = StoredMembership::new(Some(log_id), changed);
                        None
                    }
                    EntryPayload::Blank => None,
                };
                let position: Position = (Some(log_id), membership.clone());
                group.push((position, batch));
            }
            journal.apply(group)
        })
        .await
        .map_err(|e| StorageIOError::apply(last, &e).into())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<tokio::fs::File>, StorageError<ReplicaId>> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.path("snapshot.incoming"))
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<ReplicaId>> {
        let signature = meta.signature();
        let mut file = snapshot.into_std().await;
        let position: Position = (meta.last_log_id, meta.last_membership.clone());
        let installed = self
            .with_journal(move |journal| {
                file.sync_all()?;
                file.rewind()?;
                journal.restore(&mut file, &position)
            })
            .await;
        installed.map_err(|e| StorageIOError::write_snapshot(Some(signature.clone()), &e))?;
        self.keep(&self.path("snapshot.incoming"), meta)
            .map_err(|e| StorageIOError::write_snapshot(Some(signature), &e).into())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<ReplicaId>> {
        let meta = self
            .read_meta()
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        match meta {
            Some(meta) => self
                .open_kept(meta.clone())
                .await
                .map(Some)
                .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e).into()),
            None => Ok(None),
        }
    }
}
