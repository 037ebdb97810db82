//! The frame reader: any bytes, read as a stream of frames, give messages or typed errors,
//! never a panic; a message read is written again to the same message.
#![no_main]

use crest_core::frame::{FRAME_HEADER_BYTES, FrameError, decode_frame, encode_frame};
use libfuzzer_sys::fuzz_target;

/// A frame limit small enough that the fuzzer reaches it.
const MAX: u32 = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while !rest.is_empty() {
        match decode_frame(rest, MAX) {
            Ok(None) => break,
            Ok(Some((msg, used))) => {
                let mut again = Vec::new();
                encode_frame(&msg, u32::MAX, &mut again).expect("a decoded message encodes");
                let (back, _) = decode_frame(&again, u32::MAX)
                    .expect("its frame decodes")
                    .expect("whole");
                assert_eq!(back, msg, "a message survives a round trip");
                rest = &rest[used..];
            }
            Err(FrameError::TooLarge { .. }) => break,
            Err(_) => {
                // The length prefix still delimits the frame: skip it, as nodes do.
                let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
                let skip = FRAME_HEADER_BYTES + len;
                if skip > rest.len() {
                    break;
                }
                rest = &rest[skip..];
            }
        }
    }
});
