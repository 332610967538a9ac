//! The error type of `rudra-transport`.

/// Everything that can go wrong on the wire.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A received frame is malformed: bad header, over the size limit, failed validation, or
    /// a kind the receiver does not accept. The stream is closed; the node carries on.
    #[error("rejected frame: {0}")]
    BadFrame(String),
    /// A message could not be serialized.
    #[error("cannot encode message: {0}")]
    Encode(String),
}
