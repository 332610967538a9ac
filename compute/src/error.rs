//! The error type of `rudra-compute`.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in compute and data loading.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// A dataset file could not be opened or read.
    #[error("cannot read dataset file {path}: {source}; check that the path exists and is readable")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A dataset file is not in the format expected of it.
    #[error("dataset file {path} is invalid: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Buffers or inputs passed to an operation do not have the sizes it needs.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A compute backend cannot be opened here.
    #[error("the {backend} backend is not available: {reason}; choose another with compute.device")]
    Unavailable {
        /// `cuda` or `wgpu`.
        backend: &'static str,
        /// Why: no driver, no device, not built in.
        reason: String,
    },
    /// A model of the user's own (a Python learner's gradient function) failed or gave back
    /// something unusable.
    #[error("{0}")]
    External(String),
    /// A device operation failed after the device was opened.
    #[error("{backend} device error: {message}")]
    Device {
        /// `cuda` or `wgpu`.
        backend: &'static str,
        /// What the driver reported.
        message: String,
    },
}
