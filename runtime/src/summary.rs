//! What a finished run leaves behind, in one schema each way: `summary.json` ([`Summary`]) and
//! `metrics.csv` ([`metrics_csv`], [`parse_metrics`]), and a run held in memory or read back
//! from its directory ([`RecordedRun`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rudra_actors::goodput::{LearnerSeconds, LearnerTime};
use rudra_actors::report::nan_if_null;
use rudra_actors::{BytesMoved, Diverged, ElasticSpec, MetricsRow, RunReport};
use rudra_proto::StalenessSummary;
use rudra_transport::Codecs;
use serde::{Deserialize, Serialize};

use crate::{Config, RuntimeError};

/// The first columns of `metrics.csv`, in order: the fields of [`MetricsRow`]. One column
/// per learner and measure follows ([`LEARNER_COLUMNS`]).
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

/// The columns of [`MetricsRow::bytes`], after [`METRICS_COLUMNS`]; 0 where a file lacks them.
const BYTES_COLUMNS: [&str; 5] =
    ["steps", "payload_bytes", "payload_bytes_up", "payload_bytes_down", "wire_bytes"];

/// The run's goodput so far, after [`BYTES_COLUMNS`]; NaN where a file lacks it.
const GOODPUT_COLUMN: &str = "goodput";

/// The prefixes of the per-learner columns of `metrics.csv`, each followed by the learner's id:
/// examples processed, seconds computing, and the rest of its seconds.
const LEARNER_COLUMNS: [&str; 3] = ["samples_learner_", "compute_seconds_learner_", "wait_seconds_learner_"];

/// `summary.json`, written by every run and read back by reports, in one schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Examples the run was to process (0 where not known): fewer processed, and the run is
    /// `incomplete`.
    #[serde(default)]
    pub samples_expected: u64,
    /// Training seconds (start to last gradient, excluding start-up and the final evaluation).
    pub wall_seconds: f64,
    /// `samples / wall_seconds`.
    pub samples_per_second: f64,
    /// `completed`; `incomplete` when examples were left unprocessed (learners left out at
    /// the end; see `samples` against `samples_expected`); `diverged` (see `diverged`); or
    /// `failed` (see `error`).
    pub outcome: String,
    /// Why a failed run stopped (what it had recorded by then is in the rest of the summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the run diverged, if it did.
    pub diverged: Option<Diverged>,
    /// Test accuracy at the end.
    #[serde(deserialize_with = "nan_if_null")]
    pub final_test_accuracy: f64,
    /// Train loss over the last window (`null` when it is not a number).
    #[serde(deserialize_with = "nan_if_null")]
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
    /// How gradients and weights travelled (`transport.*_codec`).
    pub codecs: Codecs,
    /// What the learners' messages carried: gradient steps, payload bytes as encoded (in all,
    /// up and down), and frame bytes on the wire (0 in one process), sent and received.
    pub bytes: BytesMoved,
    /// Payload bytes per gradient step of one learner, sent and received.
    pub payload_bytes_per_step: f64,
    /// Of them, those it sent: its gradient (or exchange).
    #[serde(default)]
    pub payload_bytes_up_per_step: f64,
    /// Of them, those it received: weights (or centers).
    #[serde(default)]
    pub payload_bytes_down_per_step: f64,
    /// Frame bytes on the wire per gradient step of one learner, sent and received.
    pub wire_bytes_per_step: f64,
    /// Payload bytes each shard received (gradients, or the elastic family's exchanges), by
    /// shard id: with learner groups, their aggregates.
    #[serde(default)]
    pub shard_payload_in: Vec<u64>,
    /// Of them, the busiest shard's per update it applied.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub shard_payload_in_per_update: f64,
    /// G, the learner groups (1: none).
    #[serde(default = "one")]
    pub groups: u32,
    /// The learners' compute time that ended in applied contributions over all their time in
    /// the run (`null` where not measured).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub goodput: f64,
    /// Each learner's compute and waiting seconds, and its contributions applied and dropped,
    /// by learner id.
    #[serde(default)]
    pub learner_time: Vec<LearnerTime>,
    /// With adaptive batch sizes, every learner's minibatch size in each epoch (`[e][l]`);
    /// absent with fixed sizes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_sizes: Vec<Vec<u32>>,
}

fn nan() -> f64 {
    f64::NAN
}

fn one() -> u32 {
    1
}

/// How a run that stopped without an error ended. Hardsync's backup learners are cut off by
/// design: their unprocessed examples do not make a run incomplete.
fn outcome(report: &RunReport, not_waited_for: u32) -> &'static str {
    if report.diverged.is_some() {
        "diverged"
    } else if not_waited_for == 0 && report.samples < report.samples_expected {
        "incomplete"
    } else {
        "completed"
    }
}

impl Summary {
    /// The summary of `report` for a run of `config`.
    #[must_use]
    pub fn new(config: &Config, report: &RunReport) -> Self {
        let c = &config.cluster;
        let target = config.target_accuracy;
        let reached = report.metrics.iter().find(|m| m.test_accuracy >= target);
        Self {
            protocol: config.protocol_name().to_owned(),
            n: config.sync_n(),
            learners: c.learners,
            shards: c.shards,
            batch_size: c.batch_size,
            global_batch: c.global_batch(),
            lr_modulation: c.protocol.modulation().to_string(),
            max_staleness: c.protocol.max_staleness(),
            model: config.model_kind.as_str().to_owned(),
            device: config.device.name().into(),
            updates: report.updates,
            updates_lost: report.updates_lost,
            gradients_applied: report.staleness.applied,
            gradients_dropped: report.staleness.dropped,
            samples: report.samples,
            samples_expected: report.samples_expected,
            wall_seconds: report.wall_seconds,
            samples_per_second: report.samples as f64 / report.wall_seconds.max(1e-9),
            outcome: outcome(report, c.not_waited_for()).to_owned(),
            diverged: report.diverged,
            error: None,
            final_test_accuracy: report.final_test_accuracy,
            final_train_loss: report.final_train_loss,
            staleness: report.staleness.clone(),
            target_accuracy: target,
            time_to_target: reached.map(|m| m.wall_seconds),
            updates_to_target: reached.map(|m| m.updates),
            elastic: c.protocol.elastic().cloned(),
            codecs: c.codecs,
            bytes: report.bytes,
            payload_bytes_per_step: report.bytes.payload_per_step(),
            payload_bytes_up_per_step: report.bytes.payload_up_per_step(),
            payload_bytes_down_per_step: report.bytes.payload_down_per_step(),
            wire_bytes_per_step: report.bytes.wire_per_step(),
            shard_payload_in: report.shard_payload_in.clone(),
            shard_payload_in_per_update: report
                .shard_payload_in
                .iter()
                .max()
                .map_or(f64::NAN, |&b| b as f64 / report.updates.max(1) as f64),
            groups: c.groups,
            goodput: report.goodput,
            learner_time: report.learner_time.clone(),
            batch_sizes: report.batch_sizes.clone(),
        }
    }
}

/// `metrics.csv` of `rows`: one column per field of [`MetricsRow`], then one per learner.
#[must_use]
pub fn metrics_csv(rows: &[MetricsRow]) -> String {
    let learners =
        rows.iter().map(|r| r.learner_samples.len().max(r.learner_seconds.len())).max().unwrap_or(0);
    let mut csv = METRICS_COLUMNS.join(",") + "," + &BYTES_COLUMNS.join(",") + "," + GOODPUT_COLUMN;
    for prefix in LEARNER_COLUMNS {
        for l in 0..learners {
            let _ = write!(csv, ",{prefix}{l}");
        }
    }
    csv.push('\n');
    for r in rows {
        let _ = write!(
            csv,
            "{:.3},{:.4},{},{},{:.6},{:.6},{:.6},{:.4},{:.1},{},{},{},{},{},{:.6}",
            r.wall_seconds,
            r.epoch,
            r.updates,
            r.samples,
            r.train_loss,
            r.test_loss,
            r.test_accuracy,
            r.mean_staleness,
            r.samples_per_second,
            r.bytes.steps,
            r.bytes.payload,
            r.bytes.payload_up,
            r.bytes.payload_down,
            r.bytes.wire,
            r.goodput,
        );
        for l in 0..learners {
            let _ = write!(csv, ",{}", r.learner_samples.get(l).copied().unwrap_or(0));
        }
        for seconds in [|s: &LearnerSeconds| s.compute, |s: &LearnerSeconds| s.wait] {
            for l in 0..learners {
                let _ = write!(csv, ",{:.3}", r.learner_seconds.get(l).map_or(0.0, seconds));
            }
        }
        csv.push('\n');
    }
    csv
}

/// A finished run, read back from its directory.
#[derive(Clone, Debug)]
pub struct RecordedRun {
    /// The directory.
    pub dir: PathBuf,
    /// How plots and tables name the run: the directory's name.
    pub label: String,
    /// `summary.json`.
    pub summary: Summary,
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

/// How plots and tables name the run in `dir`: the directory's name.
fn label_of(dir: &Path) -> String {
    dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
}

impl RecordedRun {
    /// The run of `config` that `report` describes, written into `dir`.
    #[must_use]
    pub fn of(dir: &Path, config: &Config, report: &RunReport) -> Self {
        let summary = Summary::new(config, report);
        Self { dir: dir.to_owned(), label: label_of(dir), summary, metrics: report.metrics.clone() }
    }

    /// Read the run directory `dir`: its `summary.json` and `metrics.csv`.
    pub fn read(dir: &Path) -> Result<Self, RuntimeError> {
        if !dir.is_dir() {
            return Err(input_error(dir, "is not a run directory (no such directory)"));
        }
        let path = dir.join("summary.json");
        let summary: Summary = serde_json::from_str(&read_input(&path)?)
            .map_err(|e| input_error(&path, format!("is not a run summary: {e}")))?;
        let path = dir.join("metrics.csv");
        let metrics = parse_metrics(&path, &read_input(&path)?)?;
        // A run that failed may have stopped before its first evaluation.
        if metrics.is_empty() && summary.outcome != "failed" {
            return Err(input_error(&path, "has no evaluations; a finished run writes at least one row"));
        }
        Ok(Self { dir: dir.to_owned(), label: label_of(dir), summary, metrics })
    }
}

/// The rows of `metrics.csv` at `path`, with errors naming the line and column.
pub fn parse_metrics(path: &Path, text: &str) -> Result<Vec<MetricsRow>, RuntimeError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let header: Vec<&str> =
        lines.next().map(|(_, l)| l.split(',').map(str::trim).collect()).unwrap_or_default();
    // Per prefix, the (learner, index, name) of its columns in learner order.
    let learner_columns = LEARNER_COLUMNS.map(|prefix| {
        let mut columns: Vec<(u32, usize, &str)> = (header.iter().enumerate())
            .filter_map(|(i, h)| Some((h.strip_prefix(prefix)?.parse().ok()?, i, *h)))
            .collect();
        columns.sort_unstable();
        columns
    });
    let goodput_at = header.iter().position(|h| *h == GOODPUT_COLUMN);
    let mut at = [0; METRICS_COLUMNS.len()];
    for (slot, name) in at.iter_mut().zip(METRICS_COLUMNS) {
        *slot = header.iter().position(|h| *h == name).ok_or_else(|| {
            input_error(
                path,
                format!("has no column `{name}`; its header must name {}", METRICS_COLUMNS.join(",")),
            )
        })?;
    }
    let bytes_at = BYTES_COLUMNS.map(|name| header.iter().position(|h| *h == name));
    let rows = lines
        .map(|(i, line)| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let row = Row { path, line: i + 1, fields: &fields, at: &at, bytes_at: &bytes_at };
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
                bytes: BytesMoved {
                    steps: row.count(0)?,
                    payload: row.count(1)?,
                    payload_up: row.count(2)?,
                    payload_down: row.count(3)?,
                    wire: row.count(4)?,
                },
                learner_samples: learner_columns[0]
                    .iter()
                    .map(|&(_, i, name)| row.parse(i, name))
                    .collect::<Result<_, _>>()?,
                learner_seconds: (learner_columns[1].iter().zip(&learner_columns[2]))
                    .map(|(&(_, c, compute), &(_, w, wait))| {
                        Ok(LearnerSeconds { compute: row.parse(c, compute)?, wait: row.parse(w, wait)? })
                    })
                    .collect::<Result<_, RuntimeError>>()?,
                goodput: goodput_at.map_or(Ok(f64::NAN), |i| row.parse(i, GOODPUT_COLUMN))?,
            })
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    Ok(rows)
}

/// One line of `metrics.csv` being parsed.
struct Row<'a> {
    path: &'a Path,
    line: usize,
    fields: &'a [&'a str],
    at: &'a [usize; METRICS_COLUMNS.len()],
    bytes_at: &'a [Option<usize>; BYTES_COLUMNS.len()],
}

impl Row<'_> {
    /// Column `METRICS_COLUMNS[c]`.
    fn get<T: FromStr>(&self, c: usize) -> Result<T, RuntimeError> {
        self.parse(self.at[c], METRICS_COLUMNS[c])
    }

    /// Column `BYTES_COLUMNS[c]`, 0 when the file has no such column.
    fn count(&self, c: usize) -> Result<u64, RuntimeError> {
        self.bytes_at[c].map_or(Ok(0), |i| self.parse(i, BYTES_COLUMNS[c]))
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
    use crate::RunDir;

    const HEADER: &str = "wall_seconds,epoch,updates,samples,train_loss,test_loss,test_accuracy,mean_staleness,samples_per_second";

    #[test]
    fn learner_columns_are_written_and_read_back_in_learner_order() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(Some(dir.path()), "async").unwrap();
        let bytes = BytesMoved {
            steps: 8,
            payload: 8 << 20,
            payload_up: 3 << 20,
            payload_down: 5 << 20,
            wire: 9 << 20,
        };
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
            learner_seconds: (0..learner_samples.len())
                .map(|l| LearnerSeconds { compute: t * 0.25 * l as f64, wait: 1.5 })
                .collect(),
            learner_samples,
            bytes,
            goodput: 0.125,
        };
        let rows = vec![row(1.0, vec![64, 32, 0]), row(2.0, vec![128, 96, 32])];
        let config = Config::load(None, &[]).unwrap();
        let report = RunReport {
            batch_sizes: Vec::new(),
            shard_payload_in: Vec::new(),
            timeline: Vec::new(),
            updates_lost: 0,
            diverged: None,
            metrics: rows.clone(),
            params: vec![0.0; config.model.param_count()],
            staleness: StalenessSummary::default(),
            updates: 10,
            samples: 256,
            samples_expected: 256,
            learner_samples: vec![128, 96, 32],
            wall_seconds: 2.0,
            final_test_accuracy: 0.9,
            final_train_loss: 0.5,
            bytes,
            learner_time: Vec::new(),
            goodput: f64::NAN,
        };
        run.record(&config, &report).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        let header = text.lines().next().unwrap();
        assert!(
            header.ends_with(
                ",samples_per_second,steps,payload_bytes,payload_bytes_up,payload_bytes_down,wire_bytes,goodput,samples_learner_0,samples_learner_1,samples_learner_2,compute_seconds_learner_0,compute_seconds_learner_1,compute_seconds_learner_2,wait_seconds_learner_0,wait_seconds_learner_1,wait_seconds_learner_2"
            )
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
        assert!(parse_metrics(Path::new("m.csv"), &format!("{HEADER}\n")).unwrap().is_empty());
        let e = err(&format!("{HEADER}\n1,1,250\n"));
        assert!(e.contains("`samples` is \"\""), "{e}");
    }
}
