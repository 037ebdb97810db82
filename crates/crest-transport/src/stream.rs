//! Framed, long-lived QUIC streams.
//!
//! A [`FrameReader`] turns a receive stream into [`Wire`] messages, reading in large chunks and
//! decoding every whole frame it holds; a bad frame becomes a [`ReadEvent::Bad`] and reading
//! goes on after it (an oversized frame's body is skipped as it arrives, never buffered).
//! [`spawn_writer`] owns a send stream behind a bounded channel and writes every queued message
//! in one buffer handed to quinn without a copy, so many small messages cost one stream write.

use crate::TransportError;
use bytes::{Buf, Bytes, BytesMut};
use crest_core::frame::{DecodeLimits, FRAME_HEADER_BYTES, FrameError, FrameHeader, encode_frame};
use crest_core::wire::{STREAM_CONTROL, STREAM_DATA, Wire};
use tokio::sync::mpsc;

/// Bytes asked of the stream per read.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// A writer stops gathering queued messages into one write past this many bytes.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;

/// What a writer is given to write: a message, or a frame its sender encoded already (so that
/// the sender keeps the message: the producer gives a batch to another leaf when its own does
/// not answer, without a copy of every message made just in case).
#[derive(Debug)]
pub enum Outgoing {
    /// A message, framed by the writer.
    Message(Wire),
    /// A whole frame (header and body).
    Frame(Bytes),
}

impl From<Wire> for Outgoing {
    fn from(msg: Wire) -> Outgoing {
        Outgoing::Message(msg)
    }
}

/// What a [`FrameReader`] read.
#[derive(Debug)]
pub enum ReadEvent {
    /// A well-formed message.
    Frame(Wire),
    /// A frame that was skipped, and why.
    Bad(FrameError),
}

/// See the module doc.
pub struct FrameReader {
    recv: quinn::RecvStream,
    max: u32,
    /// What a client's lists may hold, checked while decoding.
    limits: DecodeLimits,
    buf: BytesMut,
    /// Bytes of an oversized frame still to skip.
    skip: usize,
}

impl FrameReader {
    /// Reads frames of at most `max` body bytes from `recv`.
    pub fn new(recv: quinn::RecvStream, max: u32) -> FrameReader {
        FrameReader::with_limits(recv, max, DecodeLimits::NONE)
    }

    /// As [`FrameReader::new`], refusing a client's lists over `limits` before allocating
    /// them (a node reading its clients).
    pub fn with_limits(recv: quinn::RecvStream, max: u32, limits: DecodeLimits) -> FrameReader {
        FrameReader {
            recv,
            max,
            limits,
            buf: BytesMut::with_capacity(64 * 1024),
            skip: 0,
        }
    }

    /// The next message or bad frame; `None` when the peer finished the stream cleanly.
    ///
    /// # Errors
    /// [`TransportError::Stream`] when the stream breaks, or ends inside a frame.
    pub async fn next(&mut self) -> Result<Option<ReadEvent>, TransportError> {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.buf.len());
                self.buf.advance(n);
                self.skip -= n;
            }
            if self.skip == 0 && self.buf.len() >= FRAME_HEADER_BYTES {
                let header_bytes: [u8; FRAME_HEADER_BYTES] = self.buf[..FRAME_HEADER_BYTES]
                    .try_into()
                    .expect("header length");
                let header = FrameHeader::parse(header_bytes);
                if let Err(error) = header.check_len(self.max) {
                    self.skip = FRAME_HEADER_BYTES + header.len as usize;
                    return Ok(Some(ReadEvent::Bad(error)));
                }
                let total = FRAME_HEADER_BYTES + header.len as usize;
                if self.buf.len() >= total {
                    let frame = self.buf.split_to(total);
                    return Ok(Some(
                        match header.decode_body_within(&frame[FRAME_HEADER_BYTES..], self.limits) {
                            Ok(msg) => ReadEvent::Frame(msg),
                            Err(error) => ReadEvent::Bad(error),
                        },
                    ));
                }
                self.buf.reserve(total - self.buf.len());
            }
            match self.recv.read_chunk(READ_CHUNK_BYTES, true).await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk.bytes),
                Ok(None) if self.buf.is_empty() && self.skip == 0 => return Ok(None),
                Ok(None) => {
                    return Err(TransportError::Stream("stream ended inside a frame".into()));
                }
                Err(error) => return Err(TransportError::Stream(error.to_string())),
            }
        }
    }
}

/// Spawns a task that writes every message sent on the returned channel to `send`, in order.
/// The channel holds at most `capacity` messages; the task ends when every sender is dropped
/// (finishing the stream) or the stream breaks.
pub fn spawn_writer(
    mut send: quinn::SendStream,
    max: u32,
    capacity: usize,
) -> mpsc::Sender<Outgoing> {
    let (tx, mut rx) = mpsc::channel::<Outgoing>(capacity);
    tokio::spawn(async move {
        // The buffer is handed to quinn whole (no copy; quinn holds it until the peer has
        // acknowledged it), so each write gathers into a new one, sized like the last.
        let mut size = 64 * 1024;
        while let Some(msg) = rx.recv().await {
            let mut out = Vec::with_capacity(size);
            encode_logged(&msg, max, &mut out);
            while out.len() < WRITE_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(msg) => encode_logged(&msg, max, &mut out),
                    Err(_) => break,
                }
            }
            size = out.len().clamp(4 * 1024, WRITE_BATCH_BYTES);
            if let Err(error) = send.write_chunk(Bytes::from(out)).await {
                tracing::debug!(%error, "stream write failed");
                return;
            }
        }
        let _ = send.finish();
    });
    tx
}

fn encode_logged(msg: &Outgoing, max: u32, out: &mut Vec<u8>) {
    let msg = match msg {
        Outgoing::Frame(frame) => return out.extend_from_slice(frame),
        Outgoing::Message(msg) => msg,
    };
    if let Err(error) = encode_frame(msg, max, out) {
        // Every sender bounds what it builds to fit a frame; reaching here is a bug, reported
        // rather than crashing the node.
        tracing::error!(%error, message = msg.name(), "dropped a message that cannot be framed");
    }
}

/// The two long-lived streams of a connection.
pub struct StreamPair {
    /// Handshake and connection-level errors.
    pub control: (quinn::SendStream, quinn::RecvStream),
    /// Everything else.
    pub data: (quinn::SendStream, quinn::RecvStream),
}

/// Opens the control and data streams (connecting side).
///
/// # Errors
/// [`TransportError::Stream`] if the connection fails meanwhile.
pub async fn open_streams(conn: &quinn::Connection) -> Result<StreamPair, TransportError> {
    let stream_error = |e: &dyn std::fmt::Display| TransportError::Stream(e.to_string());
    let mut control = conn.open_bi().await.map_err(|e| stream_error(&e))?;
    control
        .0
        .write_all(&[STREAM_CONTROL])
        .await
        .map_err(|e| stream_error(&e))?;
    let mut data = conn.open_bi().await.map_err(|e| stream_error(&e))?;
    data.0
        .write_all(&[STREAM_DATA])
        .await
        .map_err(|e| stream_error(&e))?;
    Ok(StreamPair { control, data })
}

/// Accepts the control and data streams (accepting side), in whichever order they arrive.
///
/// # Errors
/// [`TransportError::Stream`] if the connection fails or a stream starts with an unknown tag.
pub async fn accept_streams(conn: &quinn::Connection) -> Result<StreamPair, TransportError> {
    let mut control = None;
    let mut data = None;
    while control.is_none() || data.is_none() {
        let (send, mut recv) = conn
            .accept_bi()
            .await
            .map_err(|e| TransportError::Stream(e.to_string()))?;
        let mut tag = [0u8; 1];
        recv.read_exact(&mut tag)
            .await
            .map_err(|e| TransportError::Stream(e.to_string()))?;
        match tag[0] {
            STREAM_CONTROL if control.is_none() => control = Some((send, recv)),
            STREAM_DATA if data.is_none() => data = Some((send, recv)),
            other => {
                return Err(TransportError::Stream(format!(
                    "unexpected stream tag {other:#04x}"
                )));
            }
        }
    }
    Ok(StreamPair {
        control: control.expect("set"),
        data: data.expect("set"),
    })
}
