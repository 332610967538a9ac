//! The run directory: `config.toml`, `metrics.csv`, `summary.json`, `checkpoint.safetensors`
//! and the plots; [`RecordedRun`] reads a finished one back.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rudra_actors::protocol::StalenessSummary;
use rudra_actors::{ElasticSpec, MetricsRow, RunReport};
use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::{Config, RuntimeError};

/// The first columns of `metrics.csv`, in order: the fields of [`MetricsRow`]. One column
/// per learner follows, [`LEARNER_COLUMN`]`L`: examples learner `L` processed so far.
const METRICS_COLUMNS: [&str; 9] = [
    "wall_seconds",
    "epoch",
    "updates",
    "samples",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "mean_staleness",
    "samples_per_second",
];

/// The prefix of the per-learner columns of `metrics.csv`.
const LEARNER_COLUMN: &str = "samples_learner_";

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
    /// Compute device as configured (`auto`, `cpu`, `cuda` or `wgpu`).
    pub device: String,
    /// Updates applied per shard.
    pub updates: u64,
    /// Updates shards made and lost in crashes (rolled back to their checkpoints).
    pub updates_lost: u64,
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
    /// `training.target_accuracy`.
    pub target_accuracy: f64,
    /// Seconds until the first evaluation at or above the target accuracy (`null`: never).
    pub time_to_target: Option<f64>,
    /// Updates applied by then.
    pub updates_to_target: Option<u64>,
    /// The EASGD family's settings, for those protocols.
    pub elastic: Option<ElasticSpec>,
}

impl Summary {
    /// The summary of `report` for a run of `config`.
    #[must_use]
    pub fn new(config: &Config, report: &RunReport) -> Self {
        let c = &config.cluster;
        let target = config.raw.training.target_accuracy;
        let reached = report.metrics.iter().find(|m| m.test_accuracy >= target);
        Self {
            protocol: config.protocol_name().to_owned(),
            n: config.sync_n(),
            learners: c.learners,
            shards: c.shards,
            batch_size: c.batch_size,
            global_batch: c.global_batch(),
            lr_modulation: c.protocol.modulation.to_string(),
            max_staleness: c.protocol.max_staleness,
            model: config.raw.training.model.clone(),
            device: config.device.name().into(),
            updates: report.updates,
            updates_lost: report.updates_lost,
            gradients_applied: report.staleness.applied,
            gradients_dropped: report.staleness.dropped,
            samples: report.samples,
            wall_seconds: report.wall_seconds,
            samples_per_second: report.samples as f64 / report.wall_seconds.max(1e-9),
            final_test_accuracy: report.final_test_accuracy,
            final_train_loss: report.final_train_loss,
            staleness: report.staleness.clone(),
            target_accuracy: target,
            time_to_target: reached.map(|m| m.wall_seconds),
            updates_to_target: reached.map(|m| m.updates),
            elastic: c.protocol.elastic.clone(),
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

    /// Everything a finished run leaves: `summary.json`, `metrics.csv`, the checkpoint (see
    /// [`RunDir::write_report`]) and the plots (a warning if they cannot be drawn).
    pub fn record(&self, config: &Config, report: &RunReport) -> Result<Summary, RuntimeError> {
        let summary = self.write_report(config, report)?;
        if let Err(e) = crate::plot::draw_run(self.path()) {
            tracing::warn!("the run's plots were not drawn: {e}");
        }
        Ok(summary)
    }

    /// `config.toml`, the configuration as resolved.
    pub fn write_config(&self, config: &Config) -> Result<(), RuntimeError> {
        self.write_file("config.toml", &config.to_toml()?)
    }

    /// `checkpoint.safetensors` (see [`crate::checkpoint`]) with the run's settings as
    /// metadata; replaced atomically.
    pub fn write_checkpoint(&self, config: &Config, params: &[f32]) -> Result<(), RuntimeError> {
        let c = &config.cluster;
        let run = [
            ("protocol", config.protocol_name().to_owned()),
            ("n", config.sync_n().to_string()),
            ("learners", c.learners.to_string()),
            ("shards", c.shards.to_string()),
            ("batch_size", c.batch_size.to_string()),
            ("epochs", c.epochs.to_string()),
            ("seed", c.seed.to_string()),
            ("dataset", config.raw.training.dataset.clone()),
        ];
        let tmp = self.path.join("checkpoint.safetensors.tmp");
        Checkpoint::write(&tmp, &c.model, params, &run)?;
        let path = self.path.join("checkpoint.safetensors");
        std::fs::rename(&tmp, &path).map_err(|source| RuntimeError::Io { path, source })
    }

    /// `metrics.csv`, `summary.json` and `checkpoint.safetensors`.
    pub fn write_report(&self, config: &Config, report: &RunReport) -> Result<Summary, RuntimeError> {
        let learners = report.metrics.iter().map(|r| r.learner_samples.len()).max().unwrap_or(0);
        let mut csv = METRICS_COLUMNS.join(",");
        for l in 0..learners {
            let _ = write!(csv, ",{LEARNER_COLUMN}{l}");
        }
        csv.push('\n');
        for r in &report.metrics {
            let _ = write!(
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
            for l in 0..learners {
                let _ = write!(csv, ",{}", r.learner_samples.get(l).copied().unwrap_or(0));
            }
            csv.push('\n');
        }
        self.write_file("metrics.csv", &csv)?;
        self.write_checkpoint(config, &report.params)?;
        let summary = Summary::new(config, report);
        let json = serde_json::to_string_pretty(&summary).map_err(|e| RuntimeError::Config(e.to_string()))?;
        self.write_file("summary.json", &json)?;
        Ok(summary)
    }
}

/// What reports and plots read of `summary.json`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RecordedSummary {
    /// `hardsync`, `softsync` or `async`.
    pub protocol: String,
    /// Softsync `n` (λ for async, 0 for hardsync).
    pub n: u32,
    /// λ.
    pub learners: u32,
    /// μ.
    pub batch_size: usize,
    /// μλ.
    pub global_batch: usize,
    /// Training seconds.
    pub wall_seconds: f64,
    /// Examples per second over the run.
    pub samples_per_second: f64,
    /// Test accuracy at the end.
    pub final_test_accuracy: f64,
    /// Staleness statistics.
    pub staleness: RecordedStaleness,
}

/// What reports and plots read of `summary.json`'s `staleness`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RecordedStaleness {
    /// ⟨σ⟩.
    pub mean: f64,
    /// `histogram[σ]` = applied gradients of staleness σ.
    pub histogram: Vec<u64>,
}

/// A finished run, read back from its directory.
#[derive(Clone, Debug)]
pub struct RecordedRun {
    /// The directory.
    pub dir: PathBuf,
    /// How plots and tables name the run: the directory's name.
    pub label: String,
    /// `summary.json`.
    pub summary: RecordedSummary,
    /// `metrics.csv`, one row per evaluation.
    pub metrics: Vec<MetricsRow>,
}

fn input_error(path: &Path, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Input { path: path.to_owned(), message: message.into() }
}

fn read_input(path: &Path) -> Result<String, RuntimeError> {
    std::fs::read_to_string(path)
        .map_err(|e| input_error(path, format!("cannot be read ({e}); a finished run writes it")))
}

impl RecordedRun {
    /// Read the run directory `dir`: its `summary.json` and `metrics.csv`.
    pub fn read(dir: &Path) -> Result<Self, RuntimeError> {
        if !dir.is_dir() {
            return Err(input_error(dir, "is not a run directory (no such directory)"));
        }
        let path = dir.join("summary.json");
        let summary = serde_json::from_str(&read_input(&path)?)
            .map_err(|e| input_error(&path, format!("is not a run summary: {e}")))?;
        let path = dir.join("metrics.csv");
        let metrics = parse_metrics(&path, &read_input(&path)?)?;
        let label =
            dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(Self { dir: dir.to_owned(), label, summary, metrics })
    }
}

/// The rows of `metrics.csv` at `path`, with errors naming the line and column.
fn parse_metrics(path: &Path, text: &str) -> Result<Vec<MetricsRow>, RuntimeError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let header: Vec<&str> =
        lines.next().map(|(_, l)| l.split(',').map(str::trim).collect()).unwrap_or_default();
    let mut learner_columns: Vec<(u32, usize, &str)> = header
        .iter()
        .enumerate()
        .filter_map(|(i, h)| Some((h.strip_prefix(LEARNER_COLUMN)?.parse().ok()?, i, *h)))
        .collect();
    learner_columns.sort_unstable();
    let mut at = [0; METRICS_COLUMNS.len()];
    for (slot, name) in at.iter_mut().zip(METRICS_COLUMNS) {
        *slot = header.iter().position(|h| *h == name).ok_or_else(|| {
            input_error(
                path,
                format!("has no column `{name}`; its header must name {}", METRICS_COLUMNS.join(",")),
            )
        })?;
    }
    let rows = lines
        .map(|(i, line)| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let row = Row { path, line: i + 1, fields: &fields, at: &at };
            Ok(MetricsRow {
                wall_seconds: row.get(0)?,
                epoch: row.get(1)?,
                updates: row.get(2)?,
                samples: row.get(3)?,
                train_loss: row.get(4)?,
                test_loss: row.get(5)?,
                test_accuracy: row.get(6)?,
                mean_staleness: row.get(7)?,
                samples_per_second: row.get(8)?,
                learner_samples: learner_columns
                    .iter()
                    .map(|&(_, i, name)| row.parse(i, name))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    if rows.is_empty() {
        return Err(input_error(path, "has no evaluations; a finished run writes at least one row"));
    }
    Ok(rows)
}

/// One line of `metrics.csv` being parsed.
struct Row<'a> {
    path: &'a Path,
    line: usize,
    fields: &'a [&'a str],
    at: &'a [usize; METRICS_COLUMNS.len()],
}

impl Row<'_> {
    /// Column `METRICS_COLUMNS[c]`.
    fn get<T: FromStr>(&self, c: usize) -> Result<T, RuntimeError> {
        self.parse(self.at[c], METRICS_COLUMNS[c])
    }

    /// Field `i`, of the column `name`.
    fn parse<T: FromStr>(&self, i: usize, name: &str) -> Result<T, RuntimeError> {
        let raw = self.fields.get(i).copied();
        raw.and_then(|v| v.parse().ok()).ok_or_else(|| {
            input_error(
                self.path,
                format!("line {}: `{name}` is {:?}, not a number", self.line, raw.unwrap_or("")),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "wall_seconds,epoch,updates,samples,train_loss,test_loss,test_accuracy,mean_staleness,samples_per_second";

    #[test]
    fn learner_columns_are_written_and_read_back_in_learner_order() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(Some(dir.path()), "async").unwrap();
        let row = |t: f64, learner_samples: Vec<u64>| MetricsRow {
            wall_seconds: t,
            epoch: t,
            updates: 10,
            samples: learner_samples.iter().sum(),
            train_loss: 0.5,
            test_loss: 0.4,
            test_accuracy: 0.9,
            mean_staleness: 1.5,
            samples_per_second: 100.0,
            learner_samples,
        };
        let rows = vec![row(1.0, vec![64, 32, 0]), row(2.0, vec![128, 96, 32])];
        let config = Config::load(None, &[]).unwrap();
        let report = RunReport {
            timeline: Vec::new(),
            updates_lost: 0,
            metrics: rows.clone(),
            params: config.cluster.model.init(1),
            staleness: StalenessSummary::default(),
            updates: 10,
            samples: 256,
            learner_samples: vec![128, 96, 32],
            wall_seconds: 2.0,
            final_test_accuracy: 0.9,
            final_train_loss: 0.5,
        };
        run.write_report(&config, &report).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        let header = text.lines().next().unwrap();
        assert!(
            header.ends_with(",samples_per_second,samples_learner_0,samples_learner_1,samples_learner_2")
        );
        assert_eq!(parse_metrics(Path::new("m.csv"), &text).unwrap(), rows);
        // Columns are matched by name, in learner order, wherever they stand.
        let text =
            format!("samples_learner_1,{HEADER},samples_learner_0\n7,1,1,250,8000,0.5,0.3,0.9,3.5,5333,9\n");
        assert_eq!(parse_metrics(Path::new("m.csv"), &text).unwrap()[0].learner_samples, [9, 7]);
    }

    #[test]
    fn metrics_rows_are_read_by_column_name() {
        let text = format!(
            "{HEADER}\n1.500,1.0000,250,8000,0.512,0.301,0.9012,3.5,5333.3\n3.0,2.0,500,16000,NaN,0.2,0.93,3.6,5333.3\n"
        );
        let rows = parse_metrics(Path::new("m.csv"), &text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].wall_seconds, rows[0].updates, rows[0].samples), (1.5, 250, 8000));
        assert_eq!(rows[1].test_accuracy, 0.93);
        assert!(rows[1].train_loss.is_nan());
    }

    #[test]
    fn malformed_metrics_name_the_file_line_and_column() {
        let err = |text: &str| parse_metrics(Path::new("run/metrics.csv"), text).unwrap_err().to_string();
        let e = err(&format!(
            "{HEADER}\n1,1,250,8000,0.5,0.3,0.9,3.5,5333\n2,2,five,16000,0.5,0.3,0.9,3.5,5333\n"
        ));
        assert!(e.contains("run/metrics.csv") && e.contains("line 3") && e.contains("`updates`"), "{e}");
        let e = err("wall_seconds,epoch\n1,1\n");
        assert!(e.contains("no column `updates`"), "{e}");
        assert!(err(&format!("{HEADER}\n")).contains("no evaluations"));
        let e = err(&format!("{HEADER}\n1,1,250\n"));
        assert!(e.contains("`samples` is \"\""), "{e}");
    }
}
