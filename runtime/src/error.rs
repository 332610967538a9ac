//! The error type of `rudra-runtime`.

use std::path::PathBuf;

use rudra_actors::{ActorError, ClusterSpec, Diverged, ElasticMethod, InvalidSetting, ProtocolSpec};
use rudra_compute::ComputeError;
use rudra_proto::LrModulation;

/// Everything that can stop a node.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The configuration could not be read (syntax, types, unknown keys, a bad `--set`).
    #[error("configuration error: {0}")]
    Config(String),
    /// A configuration value or flag is out of range.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
    /// The cluster failed.
    #[error(transparent)]
    Actor(ActorError),
    /// The network failed.
    #[error(transparent)]
    Transport(#[from] rudra_transport::TransportError),
    /// Data loading or compute failed.
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// The simulator reached a state its protocol cores reject.
    #[error("simulation failed: {0}")]
    Simulation(String),
    /// A `cert` command failed: the certificate directory, its CA or a name is not usable.
    /// Running the same command again fails the same way.
    #[error("certificates: {0}")]
    Certificates(String),
    /// A run-directory file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// An input file (a run directory's `summary.json` or `metrics.csv`, a checkpoint) is
    /// missing or not what it should be.
    #[error("{path}: {message}")]
    Input {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it and, where it helps, how to get a good one.
        message: String,
    },
    /// The run diverged (docs/src/algorithms.md §3.9: the train loss became non-finite or exceeded ten times
    /// its first measured value) and was stopped; its run directory says so.
    #[error("the run diverged at update {}: {}; {hint}", diverged.update, why_diverged(diverged))]
    Diverged {
        /// Where.
        diverged: Diverged,
        /// What to change.
        hint: String,
    },
    /// The scheduler stopped the run because of a failure elsewhere.
    #[error("the scheduler stopped the run: {0}")]
    RunFailed(String),
    /// The node was interrupted (a Python learner's Ctrl-C); it said goodbye.
    #[error("interrupted")]
    Interrupted,
    /// A plot could not be drawn.
    #[error(
        "cannot draw {path}: {message}; check that the directory is writable and that a sans-serif font is installed (Debian: fonts-dejavu-core)"
    )]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
}

/// What the train loss did.
fn why_diverged(d: &Diverged) -> String {
    if d.train_loss.is_finite() {
        format!(
            "the train loss {:.4} is more than {} times the first measured, {:.4}",
            d.train_loss,
            rudra_proto::DIVERGENCE_FACTOR,
            d.first_loss
        )
    } else {
        format!("the train loss became {}", d.train_loss)
    }
}

impl RuntimeError {
    /// The run of `cluster` diverged at `diverged`: the error, with a hint of what to change.
    #[must_use]
    pub fn diverged(cluster: &ClusterSpec, diverged: Diverged) -> Self {
        let lr = cluster.schedule.base;
        let mut hint = format!("lower training.learning_rate (now {lr})");
        match &cluster.protocol {
            ProtocolSpec::Elastic(e)
                if matches!(e.method, ElasticMethod::Eamsgd | ElasticMethod::MDownpour) =>
            {
                hint += &format!(" or protocol.momentum (now {})", e.momentum);
            }
            ProtocolSpec::Sgd(s) if s.modulation == LrModulation::None => {
                hint += ", or modulate it by staleness (protocol.lr_modulation = \"per-gradient\")";
            }
            _ => {}
        }
        Self::Diverged { diverged, hint }
    }

    /// The process exit code: 0 is success; 2 bad configuration, input data or join token (do
    /// not restart: it fails again the same way); 3 a run that diverged; 1 any other failure
    /// (worth a restart).
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Diverged { .. } => 3,
            Self::Config(_)
            | Self::Invalid(_)
            | Self::Compute(
                ComputeError::Io { .. }
                | ComputeError::Format { .. }
                | ComputeError::Shape(_)
                | ComputeError::Unavailable { .. },
            )
            | Self::Input { .. }
            | Self::Certificates(_)
            | Self::Transport(rudra_transport::TransportError::Refused(_)) => 2,
            Self::Actor(_)
            | Self::Compute(_)
            | Self::Transport(_)
            | Self::Simulation(_)
            | Self::RunFailed(_)
            | Self::Io { .. }
            | Self::Plot { .. } => 1,
            // A shell's convention for SIGINT.
            Self::Interrupted => 130,
        }
    }
}

impl From<ActorError> for RuntimeError {
    /// A bad setting found by the actors is a bad setting of the run, like any other; a
    /// checkpoint that cannot be read back (damaged, of another job) is a bad input.
    fn from(e: ActorError) -> Self {
        match e {
            ActorError::Invalid(setting) => Self::Invalid(setting),
            ActorError::Checkpoint { path, message } => {
                Self::Input { path, message: format!("checkpoint: {message}") }
            }
            other => Self::Actor(other),
        }
    }
}

impl From<rudra_proto::CoreError> for RuntimeError {
    /// A protocol core refused an input: a failure of the cluster that drove it.
    fn from(e: rudra_proto::CoreError) -> Self {
        Self::Actor(ActorError::Core(e))
    }
}
