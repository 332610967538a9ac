//! The error type of the protocol cores.

/// Why a core refused an input. A refused input changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The input broke the protocol (wrong length, unknown learner, a push never asked for);
    /// the node that sent it misbehaves.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A late or repeated copy of an input already handled (a retried pull, a duplicated
    /// push): ignored.
    #[error("duplicate: {0}")]
    Duplicate(String),
}

impl CoreError {
    /// Whether this is only a late or repeated copy, worth a debug line rather than a warning.
    #[must_use]
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}
