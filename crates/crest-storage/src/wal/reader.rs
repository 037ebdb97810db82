//! Reading message bodies back from the log where their completions said they are.

use crate::format::{decode_body, segment_name};
use crest_core::record::{Location, MessageBody};
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

/// Reads message bodies back from a log's segments (see [`crate::format`], "Bodies in
/// place"). Keeps up to [`BodyReader::FILES_OPEN_MAX`] segment files open.
pub struct BodyReader {
    dir: PathBuf,
    files: HashMap<u32, File>,
    buf: Vec<u8>,
}

impl BodyReader {
    /// Segment files kept open at most.
    pub const FILES_OPEN_MAX: usize = 64;

    /// A reader of the log in `dir`.
    pub fn new(dir: PathBuf) -> BodyReader {
        BodyReader {
            dir,
            files: HashMap::new(),
            buf: Vec::new(),
        }
    }

    /// Reads and verifies the body at `location`.
    ///
    /// # Errors
    /// What went wrong: the segment is gone or unreadable, or the bytes do not match.
    pub fn read(&mut self, location: &Location) -> Result<MessageBody, String> {
        use std::os::unix::fs::FileExt;
        if !self.files.contains_key(&location.segment) {
            if self.files.len() >= Self::FILES_OPEN_MAX {
                self.files.clear();
            }
            let path = self.dir.join(segment_name(u64::from(location.segment)));
            let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            self.files.insert(location.segment, file);
        }
        let file = &self.files[&location.segment];
        self.buf.resize(location.len as usize, 0);
        file.read_exact_at(&mut self.buf, u64::from(location.offset))
            .map_err(|e| {
                format!(
                    "{}: read at offset {}: {e}",
                    segment_name(u64::from(location.segment)),
                    location.offset
                )
            })?;
        decode_body(location, &self.buf)
    }
}
