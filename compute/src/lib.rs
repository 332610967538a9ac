//! Rudra's numerical side. The entry types are [`Model`], which computes the loss and gradient
//! of a network whose parameters live in one flat buffer, and [`Dataset`] with its
//! [`Partition`]s, which feed it real examples.
//!
//! Models run on a [`Backend`]; [`CpuBackend`] is the reference every other backend is tested
//! against. Shards use the slice kernels in [`cpu`] (`axpy`, `scale`) for their updates.
//!
//! # Layout
//! - [`backend`]: the `Backend` trait and the GEMM description.
//! - [`cpu`]: the CPU reference backend and its host-slice kernels.
//! - [`model`]: model specifications, the flat parameter layout, forward and backward.
//! - [`learnable`]: [`GradientModel`], what a learner needs of a model (yours or [`Model`]).
//! - [`data`]: IDX files, MNIST, per-learner partitions and minibatch streams.
//! - [`error`]: the crate's error type.

pub mod backend;
pub mod cpu;
pub mod data;
pub mod error;
pub mod learnable;
pub mod model;

pub use backend::{Backend, Gemm};
pub use cpu::CpuBackend;
pub use data::{BatchStream, Dataset, Minibatches, Partition};
pub use error::ComputeError;
pub use learnable::GradientModel;
pub use model::{Model, ModelSpec, ParamLayout, TensorInfo};
