//! The error type of `rudra-transport`.

/// Everything that can go wrong on the wire.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A received frame is malformed: bad header, over the size limit, failed validation, or
    /// a kind the receiver does not accept. The stream is closed; the node carries on.
    #[error("rejected frame: {0}")]
    BadFrame(String),
    /// Certificates are missing or invalid, or a peer failed authentication.
    #[error("tls: {0}")]
    Tls(String),
    /// A connection could not be made or broke.
    #[error("connection: {0}")]
    Connection(String),
    /// A socket could not be bound or used.
    #[error("network: {0}")]
    Io(String),
    /// A link fault rule is out of range; `field` names it.
    #[error("fault rule `{field}`: {problem}")]
    FaultRule {
        /// The offending field.
        field: &'static str,
        /// What is wrong and what to use instead.
        problem: String,
    },
    /// The scheduler refused to enrol this node (a bad, expired, replayed or wrong-role join
    /// token); running again with the same token fails the same way.
    #[error("enrolment refused: {0}")]
    Refused(String),
    /// A message could not be serialized.
    #[error("cannot encode message: {0}")]
    Encode(String),
}
