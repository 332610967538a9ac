//! Rudra's node runtime. The entry points are [`Config::load`] (defaults < file < environment
//! < `--set`, validated once) and [`local::run_local`], which runs a whole cluster in this
//! process; [`RunDir`] writes what a run produced. The `rudra-node` binary is a thin front
//! over these.
//!
//! # Layout
//! - [`config`]: raw and typed configuration.
//! - [`local`]: the in-process cluster and its progress display.
//! - [`node`]: one role per process over QUIC.
//! - [`rundir`]: `config.toml`, `metrics.csv`, `summary.json`.
//! - [`simulate`]: the deterministic simulator, virtual learners on the real protocol cores.
//! - [`bench`](mod@bench): the `rudra-node bench` measurements.
//! - [`error`]: the crate's error type.

pub mod bench;
pub mod config;
pub mod error;
pub mod local;
pub mod node;
pub mod rundir;
pub mod simulate;

pub use config::{Config, RawConfig};
pub use error::RuntimeError;
pub use rundir::{RunDir, Summary};
