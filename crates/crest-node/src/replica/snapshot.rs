//! The snapshot a replica sends one too far behind for the Raft log: its crest log's files,
//! each segment through its last valid record (a preallocated tail is not sent).
//!
//! Format: for each file, its name's length (u16 LE), its name, its length (u64 LE) and its
//! bytes; a name length of 0 ends it.

use crest_storage::format::{
    SEGMENT_HEADER_BYTES, parse_checkpoint_name, parse_segment_name, segment_valid_len,
};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The files of the log in `dir`: segments and checkpoints, in name order.
pub(super) fn log_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_log_file(name) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

fn is_log_file(name: &str) -> bool {
    parse_segment_name(name).is_some() || parse_checkpoint_name(name).is_some()
}

/// Writes the log in `dir` (synced and not written meanwhile) to `into`.
pub(super) fn write(
    dir: &Path,
    record_bytes_max: u32,
    into: &mut std::fs::File,
) -> std::io::Result<()> {
    for path in log_files(dir)? {
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
            .to_string();
        let mut len = file.metadata()?.len();
        if let Some(seq) = parse_segment_name(&name) {
            let valid = segment_valid_len(&file, len, seq, record_bytes_max)?;
            // Never less than the header a segment starts with.
            len = valid.max(len.min(SEGMENT_HEADER_BYTES as u64));
        }
        into.write_all(&(name.len() as u16).to_le_bytes())?;
        into.write_all(name.as_bytes())?;
        into.write_all(&len.to_le_bytes())?;
        let copied = std::io::copy(&mut (&mut file).take(len), into)?;
        if copied != len {
            return Err(std::io::Error::other(format!(
                "{} shrank while it was copied",
                path.display()
            )));
        }
    }
    into.write_all(&0u16.to_le_bytes())
}

/// Replaces the log in `dir` (not open) with the one `from` holds, every file synced.
pub(super) fn read(from: &mut std::fs::File, dir: &Path) -> std::io::Result<()> {
    for path in log_files(dir)? {
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
            .filter(|n| is_log_file(n))
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not a log file")
            })?;
        let mut size = [0u8; 8];
        from.read_exact(&mut size)?;
        let size = u64::from_le_bytes(size);
        let mut file = std::fs::File::create(dir.join(name))?;
        let copied = std::io::copy(&mut (&mut *from).take(size), &mut file)?;
        if copied != size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the snapshot ends inside a file",
            ));
        }
        file.sync_all()?;
    }
    std::fs::File::open(dir)?.sync_all()
}
