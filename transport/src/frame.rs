//! Framing: a 16-byte header (magic, version, kind, body length) before each archived body.
//!
//! The header is checked before anything is allocated for the body: a wrong magic, an unknown
//! version or kind, or a length over the receiver's limit is rejected from 16 bytes alone.
//!
//! A frame leaves as a few chunks ([`Frame`]): the archived body is written by its body writer,
//! which keeps a payload's values where they already lie and sends them as a chunk of their
//! own, so the sender copies none of a payload's bytes before QUIC packs them.

use bytes::{Bytes, BytesMut};
use rkyv::ser::{Positional, Writer};

use crate::Kind;
use crate::TransportError;

/// Bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"RDRA";
/// The wire format version this build speaks.
pub const VERSION: u16 = 10;
/// Length of the header; bodies start 16-byte aligned after it.
pub const HEADER_LEN: usize = 16;

/// A parsed, checked frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the body holds.
    pub kind: Kind,
    /// Body length in bytes.
    pub body_len: u32,
}

impl Header {
    /// The 16 header bytes: magic, version (LE u16), kind (LE u16), body length (LE u32), zero.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        h[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        h
    }

    /// Check 16 header bytes against this build's format and the receiver's `max_body`.
    pub fn decode(bytes: &[u8; HEADER_LEN], max_body: u32) -> Result<Self, TransportError> {
        if bytes[..4] != MAGIC {
            return Err(TransportError::BadFrame(format!(
                "bad magic {:02x?}; not a Rudra peer",
                &bytes[..4]
            )));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(TransportError::BadFrame(format!(
                "wire version {version}, this node speaks {VERSION}; run the same Rudra release on every node"
            )));
        }
        let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
        let kind = Kind::from_u16(kind)
            .ok_or_else(|| TransportError::BadFrame(format!("unknown message kind {kind}")))?;
        let body_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if body_len > max_body {
            return Err(TransportError::BadFrame(format!(
                "a {kind:?} body of {body_len} bytes exceeds the {max_body}-byte limit (transport.max_frame_bytes)"
            )));
        }
        Ok(Self { kind, body_len })
    }
}

/// A frame ready to write: its header and archived body as chunks, in order. Cloning it shares
/// the chunks.
#[derive(Clone, Debug)]
pub struct Frame {
    chunks: Vec<Bytes>,
    len: usize,
}

impl Frame {
    /// The frame of `kind` whose archived body `body` wrote.
    pub(crate) fn new(kind: Kind, body: BodyWriter<'_>) -> Result<Self, TransportError> {
        let len = body.pos;
        let body_len = u32::try_from(len)
            .map_err(|_| TransportError::Encode(format!("a {kind:?} of {len} bytes is too large")))?;
        let mut chunks = vec![Bytes::copy_from_slice(&Header { kind, body_len }.encode())];
        chunks.extend(body.finish());
        Ok(Self { chunks, len: HEADER_LEN + len })
    }

    /// Bytes in the frame, header included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame holds no bytes (never true of an encoded message).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks, in order.
    #[must_use]
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.chunks
    }

    /// The whole frame in one buffer (a copy, unless it is one chunk).
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        match self.chunks.as_slice() {
            [one] => one.clone(),
            chunks => chunks.concat().into(),
        }
    }
}

impl From<Bytes> for Frame {
    /// Bytes written as they are, one chunk: a frame encoded elsewhere, or a malformed one.
    fn from(bytes: Bytes) -> Self {
        Self { len: bytes.len(), chunks: vec![bytes] }
    }
}

/// rkyv's writer of a frame body. Writes go into a buffer, except a write of exactly one of
/// `spans` (a payload's values, already in memory): that becomes a chunk of its own, shared
/// rather than copied. The bytes are the same either way.
pub(crate) struct BodyWriter<'a> {
    spans: &'a [Bytes],
    chunks: Vec<Bytes>,
    buf: BytesMut,
    pos: usize,
}

impl<'a> BodyWriter<'a> {
    /// A writer that shares `spans` where the body holds them, with room for `hint` bytes
    /// besides.
    pub(crate) fn new(spans: &'a [Bytes], hint: usize) -> Self {
        Self { spans, chunks: Vec::new(), buf: BytesMut::with_capacity(hint), pos: 0 }
    }

    fn finish(self) -> Vec<Bytes> {
        let mut chunks = self.chunks;
        if !self.buf.is_empty() {
            chunks.push(self.buf.freeze());
        }
        chunks
    }
}

impl Positional for BodyWriter<'_> {
    fn pos(&self) -> usize {
        self.pos
    }
}

impl<E> Writer<E> for BodyWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.pos += bytes.len();
        let span = (!bytes.is_empty())
            .then(|| self.spans.iter().find(|s| s.as_ptr() == bytes.as_ptr() && s.len() == bytes.len()))
            .flatten();
        match span {
            Some(span) => {
                if !self.buf.is_empty() {
                    self.chunks.push(self.buf.split().freeze());
                }
                self.chunks.push(span.clone());
            }
            None => self.buf.extend_from_slice(bytes),
        }
        Ok(())
    }
}
