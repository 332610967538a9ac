//! Rudra's node runtime. The entry points are [`Config::load`] (defaults < file < environment
//! < `--set`, validated once), [`local::run_local`], which runs a whole cluster in this
//! process, and the roles of [`node`], one per process; [`RunDir`] writes what a run produced,
//! [`report::report`] compares finished runs and [`Checkpoint`] reads a run's model back. The
//! `rudra-node` binary is a thin front over these.
//!
//! # Layout
//! - [`config`]: raw and typed configuration.
//! - [`local`]: the in-process cluster and its progress display.
//! - [`node`]: one role per process over QUIC.
//! - [`experiment`]: a fault-injection scenario next to a clean run, and its report.
//! - `exporter`: `--metrics-addr`, the Prometheus endpoint of a node.
//! - `rundir`: the run directory, written from the run as recorded.
//! - `summary`: `summary.json` and `metrics.csv`, both ways, and a recorded run.
//! - [`secret`]: the CA and join tokens as Kubernetes Secret manifests.
//! - [`checkpoint`]: `checkpoint.safetensors`, written and read, and its test accuracy.
//! - [`init`]: `training.init`, the initial weights of a model of the user's own.
//! - [`plot`]: the PNG plots of a run and of a comparison.
//! - [`report`]: the comparison table of several runs.
//! - [`simulate`]: the deterministic simulator, virtual learners on the real protocol cores.
//! - [`bench`](mod@bench): the `rudra-node bench` measurements.
//! - [`error`]: the crate's error type.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod experiment;
mod exporter;
pub mod init;
pub mod local;
pub mod node;
pub mod plot;
pub mod processes;
pub mod report;
mod rundir;
pub mod secret;
pub mod simulate;
pub mod study;
mod summary;

pub use checkpoint::Checkpoint;
pub use config::{Config, RawConfig};
pub use error::RuntimeError;
pub use rundir::{RunDir, RunLock};
pub use summary::{RecordedRun, Summary, metrics_csv, parse_metrics};
