//! The body decoder: the hand-written codec of the hot messages and the rmp-serde fallback
//! must agree on every body both accept, and neither may panic on any bytes.
#![no_main]

use crest_core::frame::FrameHeader;
use crest_core::wire::Wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok(len) = u32::try_from(body.len()) else {
        return;
    };
    let header = FrameHeader {
        len,
        crc: crc32fast::hash(body),
    };
    let decoded = header.decode_body(body);
    let generic = rmp_serde::from_slice::<Wire>(body);
    if let (Ok(fast), Ok(generic)) = (&decoded, &generic) {
        assert_eq!(fast, generic, "the fast codec and rmp-serde disagree");
    }
});
