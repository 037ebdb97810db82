//! The WAL segment scanner: any bytes scan to valid records and a stop, never a panic, and
//! the valid length never passes the bytes given.
#![no_main]

use crest_storage::format::{SEGMENT_HEADER_BYTES, scan_segment};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for from in [SEGMENT_HEADER_BYTES, 0] {
        let scan = scan_segment(data, 1, 64 << 10, from);
        assert!(scan.valid_len <= data.len() as u64);
    }
});
