//! Framing: a 16-byte header (magic, version, kind, body length) before each archived body.
//!
//! The header is checked before anything is allocated for the body: a wrong magic, an unknown
//! version or kind, or a length over the receiver's limit is rejected from 16 bytes alone.

use crate::Kind;
use crate::TransportError;

/// Bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"RDRA";
/// The wire format version this build speaks.
pub const VERSION: u16 = 6;
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
