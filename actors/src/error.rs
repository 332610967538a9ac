//! The error types of `rudra-actors`: [`ActorError`], and [`InvalidSetting`], the one error for
//! a bad setting that every crate of the workspace reports.

use rudra_compute::ComputeError;
use rudra_transport::{LearnerId, ShardId};

use rudra_proto::CoreError;

/// A setting out of range, named by its configuration key; the run does not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{key}`: {message}")]
pub struct InvalidSetting {
    /// The configuration key (e.g. `protocol.n`) or command-line flag (e.g. `--resume`).
    pub key: &'static str,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl InvalidSetting {
    /// `key` is wrong: `message` says why and what is allowed.
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self { key, message: message.into() }
    }
}

/// Everything that can go wrong in the actors and the cluster builder.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// A protocol core refused an input; the receiver's state is unchanged.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A cluster setting is out of range.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
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
    LearnerFailed(LearnerId, String),
    /// A shard could not come back after a crash and the run was aborted.
    #[error("{0} failed: {1}; the run was stopped")]
    ShardFailed(ShardId, String),
    /// A learner group's aggregator was lost and the run was aborted.
    #[error("the aggregator of learner group {0} was lost ({1}); the run was stopped")]
    AggregatorLost(u32, String),
    /// A learner's train loss is not finite: it stops computing and the scheduler, which sees
    /// the loss, stops the run as diverged.
    #[error("{0}")]
    NonFiniteLoss(String),
    /// A model computed a gradient holding NaN or ±Inf from a finite loss: a bug of the model.
    #[error("{0}; the model computes NaN or ±Inf from a finite loss")]
    NonFiniteGradient(String),
    /// The evaluation of the model on the test set could not run to its end.
    #[error("the evaluation failed: {0}")]
    Evaluation(String),
    /// A payload could not be decoded (a compressed payload whose scales do not fit it).
    #[error(transparent)]
    Payload(#[from] rudra_transport::TransportError),
    /// The scheduler stopped without a report (the cluster was torn down).
    #[error("the scheduler stopped without a report")]
    NoReport,
}
