//! Framing: how every [`Wire`] message travels on a stream.
//!
//! Every message travels in one frame:
//!
//! ```text
//! +----------------+----------------+--------------------------------+
//! | length: u32 BE | crc32: u32 BE  | body: `length` bytes           |
//! +----------------+----------------+--------------------------------+
//! ```
//!
//! `length` counts the body only; `crc32` (crc32fast, IEEE) covers the body only. The body is
//! one [`Wire`] value encoded with rmp-serde (MessagePack, structs as arrays; the messages that
//! carry payloads are written and read by hand in exactly that form, see `codec`). A frame whose
//! length exceeds the receiver's `frame_bytes_max` is skipped and answered with
//! [`ErrorCode::FrameTooLarge`]; a body that fails its checksum or does not decode is answered
//! with [`ErrorCode::ChecksumMismatch`] or [`ErrorCode::MalformedFrame`]. The stream and the
//! connection stay open in every case, because the length prefix still delimits the frame.

pub use crate::config::DecodeLimits;
use crate::wire::{ErrorCode, Wire};

/// Bytes of a frame header (length and checksum).
pub const FRAME_HEADER_BYTES: usize = 8;

/// A frame that could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame is longer than the receiver (or sender) allows.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The frame body's length.
        len: u64,
        /// The maximum allowed.
        max: u32,
    },
    /// The body does not match its checksum.
    #[error("frame checksum mismatch: header says {expected:08x}, body has {actual:08x}")]
    Checksum {
        /// The checksum in the header.
        expected: u32,
        /// The checksum of the body received.
        actual: u32,
    },
    /// The body is not a valid message.
    #[error("malformed frame body: {0}")]
    Malformed(String),
    /// The message could not be encoded (a bug, reported rather than panicking).
    #[error("could not encode message: {0}")]
    Encode(String),
    /// A list in the body is over the receiver's limits ([`DecodeLimits`]): refused before
    /// it was allocated.
    #[error("{message}")]
    Refused {
        /// The request the body carries, answered with the refusal.
        request: Option<u64>,
        /// What the refusal is answered with.
        code: ErrorCode,
        /// Which list, how long, and the setting it is over.
        message: String,
    },
}

impl FrameError {
    /// The error code sent to the peer for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::Checksum { .. } => ErrorCode::ChecksumMismatch,
            FrameError::Malformed(_) | FrameError::Encode(_) => ErrorCode::MalformedFrame,
            FrameError::Refused { code, .. } => *code,
        }
    }

    /// The request the refused body carried, if one could be read.
    pub fn request(&self) -> Option<u64> {
        match self {
            FrameError::Refused { request, .. } => *request,
            _ => None,
        }
    }
}

/// A parsed frame header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FrameHeader {
    /// Body length in bytes.
    pub len: u32,
    /// crc32 of the body.
    pub crc: u32,
}

impl FrameHeader {
    /// Parses the 8 header bytes.
    pub fn parse(bytes: [u8; FRAME_HEADER_BYTES]) -> FrameHeader {
        let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let crc = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        FrameHeader { len, crc }
    }

    /// Checks the length against the receiver's maximum.
    ///
    /// # Errors
    /// [`FrameError::TooLarge`] when the body is longer than `max`.
    pub fn check_len(&self, max: u32) -> Result<(), FrameError> {
        if self.len > max {
            return Err(FrameError::TooLarge {
                len: self.len.into(),
                max,
            });
        }
        Ok(())
    }

    /// Verifies and decodes a body that this header announced.
    ///
    /// # Errors
    /// [`FrameError::Checksum`] or [`FrameError::Malformed`].
    pub fn decode_body(&self, body: &[u8]) -> Result<Wire, FrameError> {
        self.decode_body_within(body, DecodeLimits::NONE)
    }

    /// As [`FrameHeader::decode_body`], refusing lists over `limits` before allocating them.
    ///
    /// # Errors
    /// As [`FrameHeader::decode_body`], and [`FrameError::Refused`].
    pub fn decode_body_within(
        &self,
        body: &[u8],
        limits: DecodeLimits,
    ) -> Result<Wire, FrameError> {
        debug_assert_eq!(body.len(), self.len as usize);
        let actual = crc32fast::hash(body);
        if actual != self.crc {
            return Err(FrameError::Checksum {
                expected: self.crc,
                actual,
            });
        }
        match crate::codec::decode(body, limits) {
            Ok(Some(msg)) => return Ok(msg),
            Ok(None) => {}
            Err(crate::codec::Rejected::Malformed(why)) => return Err(FrameError::Malformed(why)),
            Err(crate::codec::Rejected::OverLimit {
                request,
                code,
                message,
            }) => {
                return Err(FrameError::Refused {
                    request,
                    code,
                    message,
                });
            }
        }
        rmp_serde::from_slice(body).map_err(|error| FrameError::Malformed(error.to_string()))
    }
}

/// Appends one frame holding `msg` to `out`.
///
/// # Errors
/// [`FrameError::TooLarge`] if the body would exceed `max` (nothing is appended), or
/// [`FrameError::Encode`].
pub fn encode_frame(msg: &Wire, max: u32, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    // The messages every pushed or popped message passes through are written by hand, byte
    // for byte as rmp-serde would.
    if !crate::codec::encode(msg, out)
        && let Err(error) = rmp_serde::encode::write(out, msg)
    {
        out.truncate(start);
        return Err(FrameError::Encode(error.to_string()));
    }
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    if body_len > max as usize {
        out.truncate(start);
        return Err(FrameError::TooLarge {
            len: body_len as u64,
            max,
        });
    }
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Decodes the first frame of `buf`, for callers that hold bytes in memory.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame (the normal "incomplete" case),
/// or the message and the number of bytes it used.
///
/// # Errors
/// As [`FrameHeader::check_len`] and [`FrameHeader::decode_body`]. After an error other than
/// `TooLarge`, the caller may skip `FRAME_HEADER_BYTES + len` bytes and go on.
pub fn decode_frame(buf: &[u8], max: u32) -> Result<Option<(Wire, usize)>, FrameError> {
    let Some(header_bytes) = buf.get(..FRAME_HEADER_BYTES) else {
        return Ok(None);
    };
    let header = FrameHeader::parse(header_bytes.try_into().expect("slice of header length"));
    header.check_len(max)?;
    let end = FRAME_HEADER_BYTES + header.len as usize;
    let Some(body) = buf.get(FRAME_HEADER_BYTES..end) else {
        return Ok(None);
    };
    Ok(Some((header.decode_body(body)?, end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;
    use crate::wire::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn sample_push(payload: Vec<u8>, priority: u32) -> Wire {
        Wire::Push(Push {
            request: 7,
            messages: vec![PushMessage {
                topic: "jobs".into(),
                priority,
                metadata: vec![("k".into(), "v".into())],
                payload: Bytes::from(payload),
                deliver_at: Some(Time::from_millis(u64::from(priority))),
                delay_ms: 5,
                ttl_ms: Some(60_000),
                dedup_key: Some(format!("key-{priority}")),
                fairness_key: Some("tenant".into()),
            }],
        })
    }

    #[test]
    fn payload_bytes_are_encoded_as_msgpack_bin_not_an_integer_array() {
        let payload = vec![0xAAu8; 1000];
        let mut out = Vec::new();
        encode_frame(&sample_push(payload, 1), 1 << 20, &mut out).unwrap();
        // A bin encoding costs ~1 byte per payload byte; an array of integers ~2 (0xAA > 127).
        assert!(
            out.len() < 1100,
            "frame of {} bytes for a 1000-byte payload",
            out.len()
        );
    }

    #[test]
    fn corrupt_frames_are_typed_errors() {
        let mut out = Vec::new();
        encode_frame(&sample_push(vec![1, 2, 3], 1), 1 << 20, &mut out).unwrap();
        let mut flipped = out.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        assert!(matches!(
            decode_frame(&flipped, 1 << 20),
            Err(FrameError::Checksum { .. })
        ));
        assert!(matches!(
            decode_frame(&out, 4),
            Err(FrameError::TooLarge { max: 4, .. })
        ));
        assert_eq!(decode_frame(&out[..out.len() - 1], 1 << 20), Ok(None));

        let garbage = b"not msgpack at all";
        let mut frame = (garbage.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&crc32fast::hash(garbage).to_be_bytes());
        frame.extend_from_slice(garbage);
        let error = decode_frame(&frame, 1 << 20).unwrap_err();
        assert_eq!(error.code(), ErrorCode::MalformedFrame);
    }

    #[test]
    fn encoding_refuses_frames_over_the_maximum() {
        let mut out = vec![9u8];
        let error = encode_frame(&sample_push(vec![0; 4096], 1), 1024, &mut out).unwrap_err();
        assert!(matches!(error, FrameError::TooLarge { max: 1024, .. }));
        assert_eq!(out, vec![9u8], "nothing appended on error");
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            payload in proptest::collection::vec(any::<u8>(), 0..512),
            priority in any::<u32>(),
            request in any::<u64>(),
        ) {
            let messages = [
                sample_push(payload.clone(), priority),
                Wire::Pop(Pop { request, topic: "t".into(), max: 3, wait_ms: 5, lease_ms: Some(9), max_priority: Some(2) }),
                Wire::Ack(Ack { request, op: Settle::Nack { delay_ms: 7, reason: Some("boom".into()) }, receipts: vec![] }),
                Wire::Admin(Admin { request, op: AdminOp::Redrive { topic: "t".into(), ids: vec![] } }),
                Wire::error(Some(request), ErrorCode::InvalidArgument, "max must be at least 1"),
            ];
            let mut out = Vec::new();
            for msg in &messages {
                encode_frame(msg, 1 << 20, &mut out).unwrap();
            }
            let mut offset = 0;
            for msg in &messages {
                let (decoded, used) = decode_frame(&out[offset..], 1 << 20).unwrap().unwrap();
                prop_assert_eq!(&decoded, msg);
                offset += used;
            }
            prop_assert_eq!(offset, out.len());
        }
    }
}
