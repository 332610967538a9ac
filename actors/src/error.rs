//! The error type of `rudra-actors`.

use rudra_compute::ComputeError;

/// Everything that can go wrong in the protocol cores, the actors and the cluster builder.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// A message broke the protocol (wrong length, unknown learner, a push never asked for).
    /// The message is rejected and the receiver's state is unchanged.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A late or repeated copy of a message already handled (a retried pull, a duplicated
    /// push): ignored, and the receiver's state is unchanged.
    #[error("duplicate: {0}")]
    Duplicate(String),
    /// A cluster setting is out of range; `key` is its name in the configuration file.
    #[error("invalid setting `{key}`: {message}")]
    Spec {
        /// The configuration key, e.g. `protocol.n`.
        key: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A shard's checkpoint could not be written or read.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A compute kernel or the data pipeline failed.
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// An actor stopped before answering; the cluster is shutting down.
    #[error("an actor stopped before answering ({0}); the cluster is shutting down")]
    Mailbox(#[from] actix::MailboxError),
    /// A learner failed and the run was aborted.
    #[error("{0} failed: {1}; the run was stopped")]
    LearnerFailed(rudra_transport::LearnerId, String),
    /// A shard could not come back after a crash and the run was aborted.
    #[error("{0} failed: {1}; the run was stopped")]
    ShardFailed(rudra_transport::ShardId, String),
}
