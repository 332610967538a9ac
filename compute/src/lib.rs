//! Rudra's numerical side. The entry types are [`Model`], which computes the loss and gradient
//! of a network whose parameters live in one flat buffer, and [`Dataset`] with its
//! [`Partition`]s, which feed it real examples.
//!
//! Models run on a [`Backend`]. [`Device`] is the one to use: an enum over every backend,
//! opened from a [`DeviceKind`] (`auto`, `cpu`, `cuda`, `wgpu`). [`CpuBackend`] is the reference
//! every other backend is tested against. Shards use the slice kernels in [`cpu`] (`axpy`,
//! `scale`) for their updates.
//!
//! # Layout
//! - [`backend`]: the `Backend` trait, the GEMM description and the image geometry.
//! - [`device`]: [`Device`] and [`Storage`], the enums at the public edge.
//! - [`cpu`]: the CPU reference backend and its host-slice kernels.
//! - [`wgpu_backend`], [`cuda_backend`]: the GPU backends (stand-ins that fail to open when
//!   their cargo feature is off).
//! - [`model`]: model specifications, the flat parameter layout, forward and backward.
//! - [`learnable`]: [`GradientModel`], what a learner needs of a model (yours or [`Model`]).
//! - `candle` (feature `candle`, on by default): `CandleModel`, a candle network as a
//!   [`GradientModel`].
//! - [`data`]: IDX files, MNIST, per-learner partitions and minibatch streams.
//! - [`error`]: the crate's error type.

#[cfg(any(not(feature = "wgpu"), not(feature = "cuda")))]
#[macro_use]
mod dummy;

pub mod backend;
#[cfg(feature = "candle")]
pub mod candle;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_backend;
#[cfg(not(feature = "cuda"))]
#[path = "dummy_cuda_backend.rs"]
pub mod cuda_backend;
pub mod data;
pub mod device;
pub mod error;
pub mod learnable;
pub mod model;
#[cfg(feature = "wgpu")]
pub mod wgpu_backend;
#[cfg(not(feature = "wgpu"))]
#[path = "dummy_wgpu_backend.rs"]
pub mod wgpu_backend;

pub use backend::{Adam, Backend, Conv2d, Gemm, Images, Pool2d, PoolKind, Rate, Window};
#[cfg(feature = "candle")]
pub use candle::CandleModel;
pub use cpu::CpuBackend;
pub use cuda_backend::CudaBackend;
pub use data::{ADAPTIVE_WARMUP_STEPS, Batch, BatchStream, Dataset, Minibatches, Partition};
pub use device::{Device, DeviceKind, Storage};
pub use error::ComputeError;
pub use learnable::GradientModel;
pub use model::{ConvLayer, ConvSpec, Model, ModelSpec, ParamLayout, TensorInfo};
pub use wgpu_backend::WgpuBackend;
