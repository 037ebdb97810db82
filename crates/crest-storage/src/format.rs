//! The on-disk format of the write-ahead log, and the recovery scan over its bytes.
//!
//! # Segment file
//! A log is a directory of segment files named by zero-padded sequence number,
//! `00000000000000000001.wal`, `00000000000000000002.wal`, … Each starts with a 32-byte header:
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"CRESTWAL"
//!      8     4  format version, u32 big-endian (3: bodies addressed in place)
//!     12     4  reserved, zero
//!     16     8  segment sequence number, u64 big-endian (equals the file name)
//!     24     4  crc32 of bytes 0..24, u32 big-endian
//!     28     4  reserved, zero
//! ```
//!
//! # Record
//! After the header come records, back to back:
//!
//! ```text
//! +----------------+----------------+------------------------------+
//! | length: u32 BE | crc32: u32 BE  | body: `length` bytes         |
//! +----------------+----------------+------------------------------+
//! ```
//!
//! `crc32` covers the segment's sequence number (8 bytes, big-endian) followed by the body, so a
//! record copied into another segment (or stale bytes of a reused file) fails verification. The
//! body is one storage operation of the leaf: a `Vec<LogRecord>` in MessagePack (rmp-serde),
//! written and recovered as a whole.
//!
//! # Bodies in place
//! A message's body stays where its `Enqueue` record was written. The bytes of that record
//! (one element of the body's array, ending with the payload) are its [`Location`]: segment,
//! file offset, length and their own crc32, so one `pread` reads a body back and verifies it
//! without the rest of the record. Recovery reads an `Enqueue` as a [`LogRecord::Index`] with
//! its location, skipping payloads and metadata.
//!
//! # Checkpoint file
//! `00000000000000000007.ckpt` holds a snapshot of the leaf's state (bodies referred to by
//! location, not copied) that replaces the log's records before segment 7: the same 32-byte
//! header with magic `b"CRESTCKP"`, then records framed and bound to sequence 7 as above. The
//! first record is where replay starts, `[segment, offset]` (MessagePack array of two
//! integers): the first append the snapshot does not reflect, at or before the start of
//! segment 7. Then come the snapshot's records, then an empty record as the end marker.
//! Segments before the replay start are kept only while they hold bodies the leaf still needs.
//!
//! # Preallocation
//! A segment may be allocated at its full size when created (`wal_preallocate`): its
//! unwritten part reads as zeros. Writing stops where a record header of 8 zero bytes begins
//! (a segment's record is never empty) and only zeros follow; a sealed segment is cut back to
//! what was written. A file of zeros only is a segment whose creation a crash interrupted.
//!
//! # Scan
//! [`scan_segment`] verifies a segment's header and yields its records until the end (of the
//! file, or of what was written) or the first bad record, and says where that is and whether
//! the bad record is the last thing written, only zeros after it (a torn tail: what a crash in
//! the middle of a write leaves), or not (corruption).

use crest_core::record::{Location, LogRecord, MessageBody, MessageHead};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// First bytes of every segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"CRESTWAL";
/// Version of this format, which this build writes. 4: lease records carry their token; 5:
/// message heads carry their fairness key.
pub const SEGMENT_VERSION: u32 = 5;
/// Versions this build reads: 3 (lease records without their token, read as token 0), 4
/// (message heads without a fairness key, read as none) and 5.
pub const SEGMENT_VERSIONS_READ: std::ops::RangeInclusive<u32> = 3..=SEGMENT_VERSION;
/// Size of the segment header.
pub const SEGMENT_HEADER_BYTES: usize = 32;
/// Size of a record header (length and checksum).
pub const RECORD_HEADER_BYTES: usize = 8;

/// The file name of segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("{seq:020}.wal")
}

/// Parses a segment file name back into its sequence number.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// First bytes of every checkpoint file.
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"CRESTCKP";

/// The file name of the checkpoint that starts the log at segment `seq`.
pub fn checkpoint_name(seq: u64) -> String {
    format!("{seq:020}.ckpt")
}

/// Parses a checkpoint file name back into its sequence number.
pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    parse_segment_name(&format!("{}.wal", name.strip_suffix(".ckpt")?))
}

/// The header of segment `seq`.
pub fn segment_header(seq: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    file_header(SEGMENT_MAGIC, seq)
}

/// The header of the checkpoint that starts the log at segment `seq`.
pub fn checkpoint_header(seq: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    file_header(CHECKPOINT_MAGIC, seq)
}

fn file_header(magic: &[u8; 8], seq: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[..8].copy_from_slice(magic);
    header[8..12].copy_from_slice(&SEGMENT_VERSION.to_be_bytes());
    header[16..24].copy_from_slice(&seq.to_be_bytes());
    let crc = crc32fast::hash(&header[..24]);
    header[24..28].copy_from_slice(&crc.to_be_bytes());
    header
}

fn record_crc(seq: u64, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&seq.to_be_bytes());
    hasher.update(body);
    hasher.finalize()
}

/// Appends one record holding `records` to `out`, bound to segment `seq`, and pushes onto
/// `bodies` the span in `out` of each `Enqueue` element (see "Bodies in place").
///
/// # Errors
/// A message if the records cannot be encoded or exceed `max` body bytes (nothing appended).
pub fn encode_record(
    seq: u64,
    records: &[LogRecord],
    max: u32,
    out: &mut Vec<u8>,
    bodies: &mut Vec<Range<usize>>,
) -> Result<(), String> {
    let start = out.len();
    let spans = bodies.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_BYTES]);
    let encoded = encode_elements(records, max, out, |span, _| bodies.push(span));
    if let Err(error) = encoded {
        out.truncate(start);
        bodies.truncate(spans);
        return Err(error);
    }
    let len = out.len() - start - RECORD_HEADER_BYTES;
    let crc = record_crc(seq, &out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Appends the body of a record holding `records` (their array), calling `on_body` with the
/// span of each `Enqueue` element in `out` and its bytes; nothing stays appended on an error.
fn encode_elements(
    records: &[LogRecord],
    max: u32,
    out: &mut Vec<u8>,
    mut on_body: impl FnMut(Range<usize>, &[u8]),
) -> Result<(), String> {
    let start = out.len();
    let encoded = (|| {
        rmp::encode::write_array_len(out, records.len() as u32).map_err(|e| e.to_string())?;
        for record in records {
            let element = out.len();
            record.encode(out)?;
            if matches!(record, LogRecord::Enqueue { .. }) {
                on_body(element..out.len(), &out[element..]);
            }
        }
        Ok::<(), String>(())
    })();
    let len = out.len() - start;
    let refused = match encoded {
        Err(error) => Some(format!("encode log record: {error}")),
        Ok(()) if len > max as usize => Some(format!("log record of {len} bytes exceeds {max}")),
        Ok(()) => None,
    };
    match refused {
        Some(error) => {
            out.truncate(start);
            Err(error)
        }
        None => Ok(()),
    }
}

/// The body of a log record holding `records` (what follows its header, which binds it to a
/// segment), appended to `out`, with each `Enqueue` element's span in `out` and checksum
/// pushed onto `bodies`: a replica group's leader sends this, and every replica writes it
/// with [`crate::wal::DirectLog::append_encoded`] without decoding the records.
///
/// # Errors
/// A message if the records cannot be encoded or exceed `max` bytes (nothing appended).
pub fn encode_record_body(
    records: &[LogRecord],
    max: u32,
    out: &mut Vec<u8>,
    bodies: &mut Vec<(Range<usize>, u32)>,
) -> Result<(), String> {
    let spans = bodies.len();
    let encoded = encode_elements(records, max, out, |span, bytes| {
        bodies.push((span, crc32fast::hash(bytes)));
    });
    if encoded.is_err() {
        bodies.truncate(spans);
    }
    encoded
}

/// The header of a record, in segment `seq`, whose body of `len` bytes has the CRC-32
/// `body_crc` (`crc32fast::hash` of the body alone): the record's checksum, which is bound to
/// its segment, is combined from the two without reading the body again, so that a body
/// checksummed once where it was encoded is written by every replica without another pass.
pub fn record_header_of(seq: u64, len: usize, body_crc: u32) -> [u8; RECORD_HEADER_BYTES] {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&seq.to_be_bytes());
    crc.combine(&crc32fast::Hasher::new_with_initial_len(
        body_crc, len as u64,
    ));
    let mut header = [0u8; RECORD_HEADER_BYTES];
    header[..4].copy_from_slice(&(len as u32).to_be_bytes());
    header[4..8].copy_from_slice(&crc.finalize().to_be_bytes());
    header
}

/// The location of the `Enqueue` element at `span` of `buf`, which starts at `file_offset` of
/// segment `seq`.
pub fn body_location(seq: u64, file_offset: u64, buf: &[u8], span: &Range<usize>) -> Location {
    Location {
        segment: seq as u32,
        offset: (file_offset + span.start as u64) as u32,
        len: span.len() as u32,
        crc: crc32fast::hash(&buf[span.clone()]),
    }
}

/// Decodes a body read from `location` (the bytes of its `Enqueue` element).
///
/// # Errors
/// What is wrong: a checksum that does not match, or bytes that are not an `Enqueue`.
pub fn decode_body(location: &Location, bytes: &[u8]) -> Result<MessageBody, String> {
    if crc32fast::hash(bytes) != location.crc {
        return Err(format!(
            "checksum mismatch at offset {} of segment {}",
            location.offset, location.segment
        ));
    }
    match rmp_serde::from_slice::<LogRecord>(bytes) {
        Ok(LogRecord::Enqueue {
            metadata, payload, ..
        }) => Ok(MessageBody { metadata, payload }),
        Ok(_) => Err(format!(
            "offset {} of segment {} holds no message",
            location.offset, location.segment
        )),
        Err(error) => Err(format!(
            "offset {} of segment {} does not decode: {error}",
            location.offset, location.segment
        )),
    }
}

/// An `Enqueue` record as recovery reads it: its metadata is skipped and of its payload only
/// the length is taken.
#[derive(serde::Deserialize)]
struct EnqueueLean {
    head: MessageHead,
    _metadata: serde::de::IgnoredAny,
    payload: PayloadLen,
}

struct PayloadLen(u32);

impl<'de> serde::Deserialize<'de> for PayloadLen {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = PayloadLen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("payload bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<PayloadLen, E> {
                Ok(PayloadLen(v.len() as u32))
            }
        }
        deserializer.deserialize_bytes(Visitor)
    }
}

/// The MessagePack prefix of an `Enqueue` element: a map of one entry keyed `"Enqueue"`.
const ENQUEUE_PREFIX: &[u8] = b"\x81\xa7Enqueue";

/// Decodes one segment record's body, which starts at `file_offset` of segment `seq`: every
/// `Enqueue` comes back as an `Index` with its location (see "Bodies in place").
fn decode_segment_record(
    body: &[u8],
    seq: u64,
    file_offset: u64,
) -> Result<Vec<LogRecord>, String> {
    let mut rest = body;
    let count = rmp::decode::read_array_len(&mut rest).map_err(|e| e.to_string())?;
    let mut records = Vec::with_capacity((count as usize).min(body.len()));
    for _ in 0..count {
        let start = body.len() - rest.len();
        if let Some(fields) = rest.strip_prefix(ENQUEUE_PREFIX) {
            let mut input = fields;
            let lean: EnqueueLean =
                serde::Deserialize::deserialize(&mut rmp_serde::Deserializer::new(&mut input))
                    .map_err(|e| e.to_string())?;
            let end = body.len() - input.len();
            rest = input;
            records.push(LogRecord::Index {
                head: lean.head,
                size: lean.payload.0,
                location: body_location(seq, file_offset, body, &(start..end)),
            });
        } else {
            let record: LogRecord =
                serde::Deserialize::deserialize(&mut rmp_serde::Deserializer::new(&mut rest))
                    .map_err(|e| e.to_string())?;
            records.push(record);
        }
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last entry", rest.len()));
    }
    Ok(records)
}

/// What is wrong with a segment at some offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRecord {
    /// The header is missing, has the wrong magic, version, checksum or sequence number.
    Header(String),
    /// The file ends inside a record.
    Truncated,
    /// The record's length exceeds the maximum.
    TooLong(u32),
    /// The record does not match its checksum.
    Checksum,
    /// The record's body does not decode.
    Undecodable(String),
    /// Written bytes follow an unwritten (zero) record header.
    Unwritten,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadRecord::Header(why) => write!(f, "bad segment header: {why}"),
            BadRecord::Truncated => f.write_str("file ends inside a record"),
            BadRecord::TooLong(len) => write!(f, "record length {len} exceeds the maximum"),
            BadRecord::Checksum => f.write_str("record checksum mismatch"),
            BadRecord::Undecodable(why) => write!(f, "record does not decode: {why}"),
            BadRecord::Unwritten => f.write_str("written bytes after an unwritten record header"),
        }
    }
}

/// Where a scan stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanStop {
    /// Offset of the bad record (or 0 for a bad header).
    pub offset: u64,
    /// What is wrong.
    pub bad: BadRecord,
    /// Whether the bad record reaches the end of the file: a torn tail, not corruption.
    pub reaches_end: bool,
}

/// The result of scanning one segment.
#[derive(Debug)]
pub struct Scan<T = Vec<LogRecord>> {
    /// Every valid record, in order (one storage operation each).
    pub operations: Vec<T>,
    /// Bytes from the start of the file through the last valid record.
    pub valid_len: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop: Option<ScanStop>,
}

/// Scans the bytes of segment `seq` (see the module doc) from offset `from` (a record boundary;
/// the header's size to scan it all). `Enqueue` records come back as `Index` records.
pub fn scan_segment(bytes: &[u8], seq: u64, max: u32, from: usize) -> Scan {
    let scanned = scan_file(
        &mut SliceSource(bytes),
        SEGMENT_MAGIC,
        seq,
        max,
        from,
        &|body, offset| decode_segment_record(body, seq, offset),
    );
    match scanned {
        Ok(scan) => scan,
        Err(never) => match never {},
    }
}

/// [`scan_segment`] of a segment file of `len` bytes, read a window at a time: memory holds at
/// most [`SCAN_CHUNK_BYTES`] or one record (at most `max` bytes) and one chunk more, whatever
/// the file's size (a preallocated segment is `wal_segment_bytes_max` long, mostly zeros).
///
/// # Errors
/// A read that failed.
pub fn scan_segment_file(
    file: &File,
    len: u64,
    seq: u64,
    max: u32,
    from: usize,
) -> io::Result<Scan> {
    scan_segment_file_in_chunks(file, len, seq, max, from, SCAN_CHUNK_BYTES)
}

fn scan_segment_file_in_chunks(
    file: &File,
    len: u64,
    seq: u64,
    max: u32,
    from: usize,
    chunk: usize,
) -> io::Result<Scan> {
    let mut source = FileSource {
        file,
        len: usize::try_from(len).unwrap_or(usize::MAX),
        chunk: chunk.max(1),
        start: 0,
        window: Vec::new(),
        scratch: Vec::new(),
    };
    scan_file(
        &mut source,
        SEGMENT_MAGIC,
        seq,
        max,
        from,
        &|body, offset| decode_segment_record(body, seq, offset),
    )
}

/// How many bytes from its start segment file `seq` (`len` bytes long) holds in valid records
/// ([`Scan::valid_len`]), checking and decoding each record but keeping none: what a copy of
/// the log needs of a segment, without its preallocated tail.
///
/// # Errors
/// A read that failed.
pub fn segment_valid_len(file: &File, len: u64, seq: u64, max: u32) -> io::Result<u64> {
    let mut source = FileSource {
        file,
        len: usize::try_from(len).unwrap_or(usize::MAX),
        chunk: SCAN_CHUNK_BYTES,
        start: 0,
        window: Vec::new(),
        scratch: Vec::new(),
    };
    let scan = scan_file(
        &mut source,
        SEGMENT_MAGIC,
        seq,
        max,
        SEGMENT_HEADER_BYTES,
        &|body, offset| decode_segment_record(body, seq, offset).map(drop),
    )?;
    Ok(scan.valid_len)
}

/// Bytes a file scan reads at once.
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Where a scan reads a file's bytes. Offsets asked for never go back by more than a record.
trait ScanSource {
    type Error;
    /// The file's length.
    fn len(&self) -> usize;
    /// Bytes `at..at + n`, within the file.
    fn bytes(&mut self, at: usize, n: usize) -> Result<&[u8], Self::Error>;
    /// Whether nothing but zeros follows `at`.
    fn zeros_from(&mut self, at: usize) -> Result<bool, Self::Error>;
}

/// Whether `bytes` are all zero: a block at a time, each folded without branches (which the
/// compiler vectorizes; a preallocated segment's tail is tens of MiB of zeros).
fn all_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(4096)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// A file already in memory.
struct SliceSource<'a>(&'a [u8]);

impl ScanSource for SliceSource<'_> {
    type Error = std::convert::Infallible;

    fn len(&self) -> usize {
        self.0.len()
    }

    fn bytes(&mut self, at: usize, n: usize) -> Result<&[u8], Self::Error> {
        Ok(&self.0[at..at + n])
    }

    fn zeros_from(&mut self, at: usize) -> Result<bool, Self::Error> {
        Ok(self.0.get(at..).is_none_or(all_zero))
    }
}

/// A file read through a window of at least a chunk ([`SCAN_CHUNK_BYTES`]) or one record.
struct FileSource<'a> {
    file: &'a File,
    len: usize,
    chunk: usize,
    /// The window holds the file's bytes `start..start + window.len()`.
    start: usize,
    window: Vec<u8>,
    /// For reading past the window (a zero tail), a chunk at a time.
    scratch: Vec<u8>,
}

impl ScanSource for FileSource<'_> {
    type Error = io::Error;

    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&mut self, at: usize, n: usize) -> io::Result<&[u8]> {
        let end = self.start + self.window.len();
        if at < self.start || at + n > end {
            let take = n.max(self.chunk).min(self.len - at);
            self.window.resize(take, 0);
            self.file.read_exact_at(&mut self.window, at as u64)?;
            self.start = at;
        }
        let from = at - self.start;
        Ok(&self.window[from..from + n])
    }

    fn zeros_from(&mut self, at: usize) -> io::Result<bool> {
        let end = self.start + self.window.len();
        // Most often the next record's header is already in the window.
        let mut next = at;
        if at >= self.start && at < end {
            if !all_zero(&self.window[at - self.start..]) {
                return Ok(false);
            }
            next = end;
        }
        while next < self.len {
            let take = self.chunk.min(self.len - next);
            self.scratch.resize(take, 0);
            self.file.read_exact_at(&mut self.scratch, next as u64)?;
            if !all_zero(&self.scratch) {
                return Ok(false);
            }
            next += take;
        }
        Ok(true)
    }
}

/// A checkpoint: where replay starts, and the snapshot's records.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The segment and offset replay starts at.
    pub replay_from: (u64, u64),
    /// The snapshot, in the chunks it was written in (one storage operation each).
    pub chunks: Vec<Vec<LogRecord>>,
}

/// Offset of a checkpoint's first record's body: where replay starts.
const CHECKPOINT_START_BODY: u64 = (SEGMENT_HEADER_BYTES + RECORD_HEADER_BYTES) as u64;

/// Reads a checkpoint: a header with [`CHECKPOINT_MAGIC`], the replay start, records framed as
/// in segments, and an empty record as its end marker. A checkpoint is renamed into place only
/// once it is complete and synced, so anything short of that is corruption.
///
/// # Errors
/// What is wrong and where.
pub fn read_checkpoint(bytes: &[u8], seq: u64, max: u32) -> Result<Checkpoint, String> {
    let scanned = scan_file(
        &mut SliceSource(bytes),
        CHECKPOINT_MAGIC,
        seq,
        max,
        SEGMENT_HEADER_BYTES,
        &|body, offset| {
            if offset == CHECKPOINT_START_BODY {
                let start: (u64, u64) = rmp_serde::from_slice(body).map_err(|e| e.to_string())?;
                return Ok(Err(start));
            }
            rmp_serde::from_slice::<Vec<LogRecord>>(body)
                .map(Ok)
                .map_err(|e| e.to_string())
        },
    );
    let scan = match scanned {
        Ok(scan) => scan,
        Err(never) => match never {},
    };
    if let Some(stop) = scan.stop {
        return Err(format!("at offset {}: {}", stop.offset, stop.bad));
    }
    let mut parts = scan.operations.into_iter();
    let Some(Err(replay_from)) = parts.next() else {
        return Err("no replay start: not a checkpoint of this format".into());
    };
    let mut chunks = Vec::new();
    let mut ended = false;
    for part in parts {
        match part {
            Ok(part) if part.is_empty() => ended = true,
            Ok(part) if !ended => chunks.push(part),
            _ => return Err("records after the end marker".into()),
        }
    }
    if !ended {
        return Err("no end marker: the checkpoint is incomplete".into());
    }
    Ok(Checkpoint {
        replay_from,
        chunks,
    })
}

/// Appends the first record of checkpoint `seq`: replay starts at `from`.
///
/// # Errors
/// A message if it cannot be encoded.
pub fn encode_checkpoint_start(
    seq: u64,
    from: (u64, u64),
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_BYTES]);
    rmp_serde::encode::write(out, &from).map_err(|e| e.to_string())?;
    let len = out.len() - start - RECORD_HEADER_BYTES;
    let crc = record_crc(seq, &out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Decodes a record's body, which starts at the given file offset.
type Decode<'a, T> = &'a dyn Fn(&[u8], u64) -> Result<T, String>;

fn scan_file<T, S: ScanSource>(
    bytes: &mut S,
    magic: &[u8; 8],
    seq: u64,
    max: u32,
    from: usize,
    decode: Decode<'_, T>,
) -> Result<Scan<T>, S::Error> {
    let mut scan = Scan {
        operations: Vec::new(),
        valid_len: 0,
        stop: None,
    };
    let stop = |offset: usize, bad, reaches_end| {
        Some(ScanStop {
            offset: offset as u64,
            bad,
            reaches_end,
        })
    };
    // A crash while creating the file leaves a short header, or a preallocated file with
    // nothing written: nothing was ever in it.
    let file_len = bytes.len();
    if file_len < SEGMENT_HEADER_BYTES || bytes.zeros_from(0)? {
        let why = if file_len < SEGMENT_HEADER_BYTES {
            "file shorter than a header"
        } else {
            "nothing written (preallocated zeros)"
        };
        scan.stop = stop(0, BadRecord::Header(why.into()), true);
        return Ok(scan);
    }
    if let Err(why) = check_header(bytes.bytes(0, SEGMENT_HEADER_BYTES)?, magic, seq) {
        scan.stop = stop(0, BadRecord::Header(why), false);
        return Ok(scan);
    }
    let mut offset = from.max(SEGMENT_HEADER_BYTES);
    scan.valid_len = offset as u64;
    while offset < file_len {
        let rest = file_len - offset;
        if rest < RECORD_HEADER_BYTES {
            scan.stop = stop(offset, BadRecord::Truncated, true);
            return Ok(scan);
        }
        let header = bytes.bytes(offset, RECORD_HEADER_BYTES)?;
        let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
        let crc = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes"));
        // A segment's record is never empty: a zero header is where writing stopped in a
        // preallocated segment. Zeros to the end are its clean end; anything after them is
        // damage. (A checkpoint ends with an empty record, whose crc is not checked here.)
        if magic == SEGMENT_MAGIC && len == 0 && crc == 0 {
            if !bytes.zeros_from(offset)? {
                scan.stop = stop(offset, BadRecord::Unwritten, false);
            }
            return Ok(scan);
        }
        let end = RECORD_HEADER_BYTES + len as usize;
        // A torn write is the last thing written: only zeros may follow it.
        if len > max {
            let torn = bytes.zeros_from(offset + end)?;
            scan.stop = stop(offset, BadRecord::TooLong(len), torn);
            return Ok(scan);
        }
        if rest < end {
            scan.stop = stop(offset, BadRecord::Truncated, true);
            return Ok(scan);
        }
        let body = bytes.bytes(offset + RECORD_HEADER_BYTES, len as usize)?;
        let decoded = (record_crc(seq, body) == crc)
            .then(|| decode(body, (offset + RECORD_HEADER_BYTES) as u64));
        let bad = match decoded {
            Some(Ok(records)) => {
                scan.operations.push(records);
                offset += end;
                scan.valid_len = offset as u64;
                continue;
            }
            Some(Err(error)) => BadRecord::Undecodable(error),
            None => BadRecord::Checksum,
        };
        let torn = bytes.zeros_from(offset + end)?;
        scan.stop = stop(offset, bad, torn);
        return Ok(scan);
    }
    Ok(scan)
}

/// The format version of a log or checkpoint file whose header is otherwise sound (known
/// magic, matching checksum); `None` if the header is not.
pub fn file_version(bytes: &[u8]) -> Option<u32> {
    let header = bytes.get(..SEGMENT_HEADER_BYTES)?;
    let magic_known = &header[..8] == SEGMENT_MAGIC || &header[..8] == CHECKPOINT_MAGIC;
    let crc = u32::from_be_bytes(header[24..28].try_into().ok()?);
    (magic_known && crc32fast::hash(&header[..24]) == crc)
        .then(|| u32::from_be_bytes(header[8..12].try_into().expect("4 bytes")))
}

fn check_header(header: &[u8], magic: &[u8; 8], seq: u64) -> Result<(), String> {
    if &header[..8] != magic {
        return Err("wrong magic".into());
    }
    let crc = u32::from_be_bytes(header[24..28].try_into().expect("4 bytes"));
    if crc32fast::hash(&header[..24]) != crc {
        return Err("header checksum mismatch".into());
    }
    let version = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
    if !SEGMENT_VERSIONS_READ.contains(&version) {
        return Err(format!(
            "format version {version}, expected {SEGMENT_VERSIONS_READ:?}"
        ));
    }
    let found = u64::from_be_bytes(header[16..24].try_into().expect("8 bytes"));
    if found != seq {
        return Err(format!(
            "header names segment {found}, file name says {seq}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crest_core::id::{LeafId, MessageId};
    use proptest::prelude::*;

    /// Scans `bytes` in memory ([`scan_segment`]) and as a file read a window at a time
    /// ([`scan_segment_file`]) with windows of 1, 7, 64 and 4096 bytes and the default: every
    /// way must find the same records, end and stop. Returns the scan.
    fn scan_both(bytes: &[u8], seq: u64, max: u32, from: usize) -> Scan {
        let whole = scan_segment(bytes, seq, max, from);
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        for chunk in [1, 7, 64, 4096, SCAN_CHUNK_BYTES] {
            let len = bytes.len() as u64;
            let read = scan_segment_file_in_chunks(&file, len, seq, max, from, chunk).unwrap();
            assert_eq!(read.operations, whole.operations, "window of {chunk}");
            assert_eq!(read.valid_len, whole.valid_len, "window of {chunk}");
            assert_eq!(read.stop, whole.stop, "window of {chunk}");
        }
        whole
    }

    proptest! {
        /// A header combined from the body's own checksum is the header the writer makes
        /// from the body, for any segment and any body.
        #[test]
        fn a_header_from_the_body_s_checksum_is_the_header_of_the_body(
            seq in any::<u64>(),
            body in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let header = record_header_of(seq, body.len(), crc32fast::hash(&body));
            prop_assert_eq!(&header[..4], &(body.len() as u32).to_be_bytes()[..]);
            prop_assert_eq!(&header[4..], &record_crc(seq, &body).to_be_bytes()[..]);
        }
    }

    fn op(n: u64) -> Vec<LogRecord> {
        vec![
            LogRecord::Delete {
                id: MessageId::new(LeafId(1), n),
            },
            LogRecord::Release {
                id: MessageId::new(LeafId(2), n),
                attempt: 1,
                ready_at: crest_core::Time(n),
            },
            LogRecord::Dead {
                id: MessageId::new(LeafId(3), n),
                reason: format!("failed {n}"),
                at: crest_core::Time(n),
            },
        ]
    }

    fn segment(seq: u64, ops: &[Vec<LogRecord>]) -> Vec<u8> {
        let mut bytes = segment_header(seq).to_vec();
        for records in ops {
            encode_record(seq, records, 1 << 20, &mut bytes, &mut Vec::new()).unwrap();
        }
        bytes
    }

    #[test]
    fn an_enqueue_is_recovered_as_an_index_whose_location_reads_its_body_back() {
        let id = MessageId::new(LeafId(1), 5);
        let head = MessageHead {
            id,
            topic: "jobs".into(),
            priority: 3,
            ready_at: crest_core::Time(10),
            enqueued_at: crest_core::Time(9),
            expires_at: Some(crest_core::Time(99)),
            dedup_key: Some("k".into()),
            fairness_key: Some("tenant-42".into()),
        };
        let enqueue = LogRecord::Enqueue {
            head: head.clone(),
            metadata: vec![("trace".into(), "abc".into())],
            payload: bytes::Bytes::from_static(b"payload bytes"),
        };
        let ops = vec![
            op(1),
            vec![op(2)[0].clone(), enqueue.clone(), op(3)[1].clone()],
        ];
        let mut bytes = segment_header(4).to_vec();
        let mut spans = Vec::new();
        for records in &ops {
            encode_record(4, records, 1 << 20, &mut bytes, &mut spans).unwrap();
        }
        let scan = scan_both(&bytes, 4, 1 << 20, SEGMENT_HEADER_BYTES);
        assert!(scan.stop.is_none());
        assert_eq!(scan.operations[0], ops[0]);
        let LogRecord::Index {
            head: found,
            size,
            location,
        } = scan.operations[1][1].clone()
        else {
            panic!("not an index: {:?}", scan.operations[1][1]);
        };
        assert_eq!((found, size), (head, 13));
        assert_eq!(spans.len(), 1);
        assert_eq!(location, body_location(4, 0, &bytes, &spans[0]));
        assert_eq!(
            (scan.operations[1][0].clone(), scan.operations[1][2].clone()),
            (ops[1][0].clone(), ops[1][2].clone())
        );
        let at = location.offset as usize..(location.offset + location.len) as usize;
        let body = decode_body(&location, &bytes[at.clone()]).unwrap();
        assert_eq!(body.payload, bytes::Bytes::from_static(b"payload bytes"));
        assert_eq!(
            body.metadata,
            vec![("trace".to_string(), "abc".to_string())]
        );
        let mut damaged = bytes[at].to_vec();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(
            decode_body(&location, &damaged)
                .unwrap_err()
                .contains("checksum")
        );
    }

    #[test]
    fn names_round_trip_and_reject_strangers() {
        assert_eq!(parse_segment_name(&segment_name(42)), Some(42));
        assert_eq!(parse_segment_name("42.wal"), None);
        assert_eq!(parse_segment_name("checkpoint.tmp"), None);
    }

    #[test]
    fn a_cut_anywhere_in_the_last_record_is_a_torn_tail() {
        let ops: Vec<_> = (1..=3).map(op).collect();
        let bytes = segment(7, &ops);
        let whole = scan_both(&bytes, 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert_eq!(whole.operations, ops);
        assert_eq!(whole.valid_len, bytes.len() as u64);
        let two = segment(7, &ops[..2]).len();
        for cut in two + 1..bytes.len() {
            let scan = scan_both(&bytes[..cut], 7, 1 << 20, SEGMENT_HEADER_BYTES);
            assert_eq!(scan.operations, ops[..2].to_vec(), "cut at {cut}");
            assert_eq!(scan.valid_len, two as u64);
            assert!(scan.stop.unwrap().reaches_end, "cut at {cut}");
        }
    }

    #[test]
    fn zeros_after_the_last_record_are_a_preallocated_segment_s_clean_end() {
        let ops: Vec<_> = (1..=3).map(op).collect();
        let written = segment(7, &ops);
        let mut bytes = written.clone();
        bytes.resize(written.len() + 4096, 0);
        let scan = scan_both(&bytes, 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert_eq!(scan.operations, ops);
        assert_eq!(scan.valid_len, written.len() as u64);
        assert!(scan.stop.is_none(), "{:?}", scan.stop);

        // A write torn inside the last record, zeros after it: a torn tail.
        let two = segment(7, &ops[..2]).len();
        let mut torn = bytes.clone();
        torn[written.len() - 3..written.len()].fill(0);
        let scan = scan_both(&torn, 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert_eq!(scan.valid_len, two as u64);
        let stop = scan.stop.unwrap();
        assert_eq!((stop.bad, stop.reaches_end), (BadRecord::Checksum, true));

        // Written bytes beyond the zeros: damage, not an end.
        let mut damaged = bytes.clone();
        damaged[written.len() + 100] = 1;
        let scan = scan_both(&damaged, 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert_eq!(scan.operations, ops);
        let stop = scan.stop.unwrap();
        assert_eq!(
            (stop.offset, stop.bad, stop.reaches_end),
            (written.len() as u64, BadRecord::Unwritten, false)
        );

        // A segment preallocated but never written (a crash while creating it) is empty.
        let scan = scan_both(&[0u8; 4096], 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert!(scan.operations.is_empty() && scan.stop.unwrap().reaches_end);
    }

    #[test]
    fn a_flipped_bit_before_the_last_record_is_corruption_at_its_offset() {
        let ops: Vec<_> = (1..=3).map(op).collect();
        let mut bytes = segment(7, &ops);
        let first = SEGMENT_HEADER_BYTES;
        bytes[first + RECORD_HEADER_BYTES + 2] ^= 0x10;
        let scan = scan_both(&bytes, 7, 1 << 20, SEGMENT_HEADER_BYTES);
        assert!(scan.operations.is_empty());
        let stop = scan.stop.unwrap();
        assert_eq!(
            (stop.offset, stop.bad, stop.reaches_end),
            (first as u64, BadRecord::Checksum, false)
        );
    }

    #[test]
    fn records_are_bound_to_their_segment() {
        let bytes = segment(7, &[op(1)]);
        let mut moved = segment_header(8).to_vec();
        moved.extend_from_slice(&bytes[SEGMENT_HEADER_BYTES..]);
        let stop = scan_both(&moved, 8, 1 << 20, SEGMENT_HEADER_BYTES)
            .stop
            .unwrap();
        assert_eq!(stop.bad, BadRecord::Checksum);
        let stop = scan_both(&bytes, 8, 1 << 20, SEGMENT_HEADER_BYTES)
            .stop
            .unwrap();
        assert!(matches!(stop.bad, BadRecord::Header(why) if why.contains("segment 7")));
    }

    proptest! {
        #[test]
        fn scanning_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut with_header = segment_header(1).to_vec();
            with_header.extend_from_slice(&bytes);
            let _ = scan_both(&with_header, 1, 1 << 16, SEGMENT_HEADER_BYTES);
            let _ = scan_both(&bytes, 1, 1 << 16, SEGMENT_HEADER_BYTES);
        }
    }
}
