//! The run directory: `config.toml`, `metrics.csv` and `summary.json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rudra_actors::RunReport;
use rudra_actors::protocol::StalenessSummary;
use serde::Serialize;

use crate::{Config, RuntimeError};

/// `summary.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `hardsync`, `softsync` or `async`.
    pub protocol: String,
    /// Softsync `n` (λ for async, 0 for hardsync).
    pub n: u32,
    /// λ.
    pub learners: u32,
    /// Shards.
    pub shards: u32,
    /// μ.
    pub batch_size: usize,
    /// μλ.
    pub global_batch: usize,
    /// The `α(σ)` that ran.
    pub lr_modulation: String,
    /// The staleness bound, if any.
    pub max_staleness: Option<u64>,
    /// Model name.
    pub model: String,
    /// Compute device.
    pub device: String,
    /// Updates applied per shard.
    pub updates: u64,
    /// Gradients applied (summed over shards).
    pub gradients_applied: u64,
    /// Gradients dropped (summed over shards).
    pub gradients_dropped: u64,
    /// Examples processed.
    pub samples: u64,
    /// Training seconds (start to last gradient, excluding start-up and the final evaluation).
    pub wall_seconds: f64,
    /// `samples / wall_seconds`.
    pub samples_per_second: f64,
    /// Test accuracy at the end.
    pub final_test_accuracy: f64,
    /// Train loss over the last window.
    pub final_train_loss: f64,
    /// Staleness statistics.
    pub staleness: StalenessSummary,
}

impl Summary {
    /// The summary of `report` for a run of `config`.
    #[must_use]
    pub fn new(config: &Config, report: &RunReport) -> Self {
        let c = &config.cluster;
        let n = match c.protocol.rule {
            rudra_actors::protocol::SyncRule::Hardsync => 0,
            rudra_actors::protocol::SyncRule::Softsync { n } => n,
        };
        Self {
            protocol: config.protocol_name().to_owned(),
            n,
            learners: c.learners,
            shards: c.shards,
            batch_size: c.batch_size,
            global_batch: c.global_batch(),
            lr_modulation: c.protocol.modulation.to_string(),
            max_staleness: c.protocol.max_staleness,
            model: config.raw.training.model.clone(),
            device: "cpu".into(),
            updates: report.updates,
            gradients_applied: report.staleness.applied,
            gradients_dropped: report.staleness.dropped,
            samples: report.samples,
            wall_seconds: report.wall_seconds,
            samples_per_second: report.samples as f64 / report.wall_seconds.max(1e-9),
            final_test_accuracy: report.final_test_accuracy,
            final_train_loss: report.final_train_loss,
            staleness: report.staleness.clone(),
        }
    }
}

/// A run's output directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// `out`, or `runs/<UTC timestamp>-<protocol>` when none is given; created if needed.
    pub fn create(out: Option<&Path>, protocol: &str) -> Result<Self, RuntimeError> {
        let path = out.map_or_else(
            || {
                let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect();
                PathBuf::from("runs").join(format!("{stamp}-{protocol}"))
            },
            Path::to_path_buf,
        );
        std::fs::create_dir_all(&path).map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
        Ok(Self { path })
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write the file `name` in the directory.
    pub fn write_file(&self, name: &str, contents: &str) -> Result<(), RuntimeError> {
        let path = self.path.join(name);
        std::fs::write(&path, contents).map_err(|source| RuntimeError::Io { path, source })
    }

    /// `config.toml`, the configuration as resolved.
    pub fn write_config(&self, config: &Config) -> Result<(), RuntimeError> {
        self.write_file("config.toml", &config.to_toml()?)
    }

    /// `checkpoint.safetensors`: one f32 tensor per layer under its conventional name
    /// (`fc1.weight`, `fc1.bias`, …), run metadata in the header; replaced atomically.
    pub fn write_checkpoint(&self, config: &Config, params: &[f32]) -> Result<(), RuntimeError> {
        let layout = config.cluster.model.layout();
        if params.len() != layout.len {
            return Err(RuntimeError::Config(format!(
                "checkpoint: {} parameters for a model of {}",
                params.len(),
                layout.len
            )));
        }
        let bytes: Vec<Vec<u8>> = layout
            .tensors
            .iter()
            .map(|t| params[t.range.clone()].iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect();
        let views = layout
            .tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), b)
                    .map(|v| (t.name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RuntimeError::Config(format!("checkpoint: {e}")))?;
        let metadata = [
            ("model".to_owned(), config.raw.training.model.clone()),
            ("protocol".to_owned(), config.protocol_name().to_owned()),
            ("seed".to_owned(), config.cluster.seed.to_string()),
        ];
        let file = safetensors::tensor::serialize(views, Some(metadata.into_iter().collect()))
            .map_err(|e| RuntimeError::Config(format!("checkpoint: {e}")))?;
        let tmp = self.path.join("checkpoint.safetensors.tmp");
        std::fs::write(&tmp, file).map_err(|source| RuntimeError::Io { path: tmp.clone(), source })?;
        let path = self.path.join("checkpoint.safetensors");
        std::fs::rename(&tmp, &path).map_err(|source| RuntimeError::Io { path, source })
    }

    /// `metrics.csv`, `summary.json` and `checkpoint.safetensors`.
    pub fn write_report(&self, config: &Config, report: &RunReport) -> Result<Summary, RuntimeError> {
        let mut csv = String::from(
            "wall_seconds,epoch,updates,samples,train_loss,test_loss,test_accuracy,mean_staleness,samples_per_second\n",
        );
        for r in &report.metrics {
            let _ = writeln!(
                csv,
                "{:.3},{:.4},{},{},{:.6},{:.6},{:.6},{:.4},{:.1}",
                r.wall_seconds,
                r.epoch,
                r.updates,
                r.samples,
                r.train_loss,
                r.test_loss,
                r.test_accuracy,
                r.mean_staleness,
                r.samples_per_second
            );
        }
        self.write_file("metrics.csv", &csv)?;
        self.write_checkpoint(config, &report.params)?;
        let summary = Summary::new(config, report);
        let json = serde_json::to_string_pretty(&summary).map_err(|e| RuntimeError::Config(e.to_string()))?;
        self.write_file("summary.json", &json)?;
        Ok(summary)
    }
}
