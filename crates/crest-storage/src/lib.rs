//! crest leaf storage: a segmented write-ahead log with group commit and crash recovery.
//!
//! # Layout
//! - [`format`]: segment and record format (written out in its doc), and the recovery scan
//!   over bytes;
//! - [`wal`]: the log on disk: [`wal::open`] recovers, [`wal::Wal::start`] runs the
//!   group-commit writer;
//! - [`inspect`]: read-only verification of a log directory (`crest wal inspect`).

pub mod format;
pub mod inspect;
pub mod wal;

/// What can go wrong with storage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// An I/O operation failed.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: String,
        /// The kind of the operating system's error (`Other` where none was involved), so a
        /// caller can tell a full disk (`StorageFull`) from a missing file (`NotFound`).
        kind: std::io::ErrorKind,
        /// The error.
        error: String,
    },
    /// Another process (or another log in this one) has the data directory open.
    #[error(
        "{dir}: the data directory is in use by {} (it holds {dir}/LOCK); stop it, or give \
         this node another data directory",
        holder.map_or_else(|| "another crest process".to_string(), |pid| format!("process {pid}"))
    )]
    Locked {
        /// The data directory.
        dir: String,
        /// The process id the lock file names, if it could be read.
        holder: Option<u32>,
    },
    /// A record in the middle of the log is bad: recovery stops rather than guess.
    #[error(
        "{file}: corrupt log record at offset {offset}: {detail} (start with recovery mode \
         `truncate-corrupt` to cut the log there, discarding what follows)"
    )]
    Corruption {
        /// The segment file.
        file: String,
        /// Offset of the bad record.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// A file of another format version: never cut or skipped, whatever the recovery mode.
    #[error(
        "{file}: log format version {found}; this crest writes version {expected} and reads \
         versions 3 and up (version 2 logs kept message bodies in memory): drain the queue with \
         the crest that wrote it, or move the directory away"
    )]
    Version {
        /// The file.
        file: String,
        /// Its version.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The writer has stopped.
    #[error("the log writer has stopped")]
    Closed,
}

impl StorageError {
    /// An I/O error at `path`, keeping its kind.
    pub fn io(path: &std::path::Path, error: &std::io::Error) -> Self {
        StorageError::Io {
            path: path.display().to_string(),
            kind: error.kind(),
            error: error.to_string(),
        }
    }

    /// A failure at `path` that no operating-system error carries (kind `Other`).
    pub fn other(path: &std::path::Path, error: impl Into<String>) -> Self {
        StorageError::Io {
            path: path.display().to_string(),
            kind: std::io::ErrorKind::Other,
            error: error.into(),
        }
    }
}
