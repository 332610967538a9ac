//! `rudra-node study FILE`: a base configuration and the settings to vary (`[study]`), every
//! point run one after another into its own run directory, and the answers as one table.
//!
//! ```text
//! OUT/config.toml        the study as resolved
//! OUT/point-NNN/         each point's run directory (point.json once it is complete)
//! OUT/study.csv          one row per point: its settings, accuracy and error, time and updates
//!                        to the target, ⟨σ⟩ and max σ, samples/s, payload bytes moved
//! OUT/study.md           the same as a table
//! OUT/MEASURE.png        per [study] figures: a measure (test_error.png by default) against the
//!                        first axis, one line per combination of the other axes (mean over seeds)
//! OUT/accuracy_loss_vs_time.png, accuracy_loss_vs_updates.png
//!                        figure "curves": every point's curves on shared axes
//! OUT/staleness.png      figure "staleness": every point's σ histogram, side by side
//! ```
//!
//! `--resume` keeps every point that is complete (its `point.json` is written last) and runs
//! the rest, so an interrupted study loses at most the point it was running.

pub mod settings;

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::local::{ProgressMode, run_local};
use crate::node::run_loopback;
use crate::simulate::{self, progress::Progress, settings::GradientSource};
use crate::summary::RecordedRun;
use crate::{Config, RunDir, RuntimeError, Summary, plot};
use settings::{Figure, Measure, StudyRuns, invalid};
pub use settings::{RawStudy, Study};

/// What one point of a study measured (`point.json`, a row of `study.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The point's settings, as `key=value`.
    pub settings: Vec<String>,
    /// Final test accuracy (NaN when the point has none: the simulator's quadratic).
    #[serde(deserialize_with = "rudra_actors::report::nan_if_null")]
    pub test_accuracy: f64,
    /// Seconds until the target accuracy (virtual seconds in the simulator).
    pub time_to_target: Option<f64>,
    /// Updates until the target accuracy.
    pub updates_to_target: Option<u64>,
    /// ⟨σ⟩.
    pub mean_staleness: f64,
    /// Max σ.
    pub max_staleness: u64,
    /// Samples per second (virtual seconds in the simulator).
    pub samples_per_second: f64,
    /// Payload bytes the learners' messages carried.
    pub payload_bytes: u64,
    /// The share of all learners' time spent computing what was applied (0 in points written
    /// before it was measured).
    #[serde(default)]
    pub goodput: f64,
    /// Payload bytes into the busiest shard per update it applied (NaN where not measured).
    #[serde(default = "nan", deserialize_with = "rudra_actors::report::nan_if_null")]
    pub shard_bytes_per_update: f64,
    /// `completed`, `diverged` or `failed`.
    pub outcome: String,
    /// `staleness_histogram[σ]`: applied gradients of staleness σ.
    #[serde(default)]
    pub staleness_histogram: Vec<u64>,
}

impl Point {
    fn of(settings: &[String], s: &Summary) -> Self {
        Self {
            settings: settings.to_vec(),
            test_accuracy: s.final_test_accuracy,
            time_to_target: s.time_to_target,
            updates_to_target: s.updates_to_target,
            mean_staleness: s.staleness.mean,
            max_staleness: s.staleness.max,
            samples_per_second: s.samples_per_second,
            payload_bytes: s.bytes.payload,
            goodput: s.goodput,
            shard_bytes_per_update: s.shard_payload_in_per_update,
            outcome: s.outcome.clone(),
            staleness_histogram: s.staleness.histogram.clone(),
        }
    }

    /// Test error: 1 − accuracy.
    #[must_use]
    pub fn test_error(&self) -> f64 {
        1.0 - self.test_accuracy
    }

    /// The value of `measure` (NaN where there is none: a target never reached).
    #[must_use]
    pub fn measure(&self, measure: Measure) -> f64 {
        match measure {
            Measure::TestError => self.test_error(),
            Measure::TimeToTarget => self.time_to_target.unwrap_or(f64::NAN),
            Measure::UpdatesToTarget => self.updates_to_target.map_or(f64::NAN, |u| u as f64),
            Measure::MeanStaleness => self.mean_staleness,
            Measure::SamplesPerSecond => self.samples_per_second,
            Measure::PayloadBytes => self.payload_bytes as f64,
            Measure::Goodput => self.goodput,
            Measure::ShardBytesPerUpdate => self.shard_bytes_per_update,
        }
    }

    /// The value of each setting, without its key (in the simulator the seed comes twice, as
    /// `training.seed` and `simulation.seed`: tables take the first).
    fn values(&self) -> impl Iterator<Item = &str> {
        self.settings.iter().map(|s| s.split_once('=').map_or("", |(_, v)| v).trim_matches('"'))
    }
}

/// Run the study in `file` (with `overrides` on top) into `out`; with `resume`, keep the
/// points already complete there. Every point is loaded and checked before the first runs;
/// how far the study is shows as `progress` says.
pub fn run_command(
    file: &Path,
    overrides: &[String],
    (out, resume): (Option<&Path>, bool),
    progress: ProgressMode,
) -> Result<Vec<Point>, RuntimeError> {
    let base = Config::load(Some(file), overrides)?;
    let study = base.study.clone();
    if study.axes.is_empty() {
        return Err(invalid("study.axis", "a study varies at least one setting: add a [[study.axis]]"));
    }
    let configs = (study.points().into_iter())
        .map(|sets| {
            let config = Config::load(Some(file), &[overrides, &sets].concat())?;
            match study.runs {
                StudyRuns::Simulate => simulate::validate(&config)?,
                StudyRuns::Local | StudyRuns::Quic => {
                    config.cluster.validate_settings(config.model.param_count())?;
                }
            }
            config.refuse_kills()?;
            config.refuse_panics()?;
            Ok((sets, config))
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    let dir = RunDir::create(out, "study")?;
    dir.write_config(&base)?;
    let total = configs.len();
    tracing::info!(dir = %dir.path().display(), points = total, "study directory");
    let mut points = Vec::new();
    let mut shown = Progress::new(progress);
    for (i, (sets, config)) in configs.iter().enumerate() {
        shown.update(i as f64 / total as f64, || format!("point {}/{total}: {}", i + 1, sets.join(" ")));
        let point_dir = RunDir::create(Some(&dir.path().join(format!("point-{i:03}"))), "")?;
        let kept = resume.then(|| read_point(point_dir.path())).flatten();
        let point = match kept {
            Some(p) if p.settings == *sets => p,
            _ => run_point(study.runs, config, sets, &point_dir)?,
        };
        shown.println(&format!(
            "[{}/{total}] {}: test accuracy {:.4}, ⟨σ⟩ {:.2}, {:.0} samples/s",
            i + 1,
            sets.join(" "),
            point.test_accuracy,
            point.mean_staleness,
            point.samples_per_second
        ));
        points.push(point);
    }
    drop(shown);
    let columns = study.columns();
    dir.write_file("study.csv", &study_csv(&columns, &points))?;
    dir.write_file("study.md", &study_md(&columns, &points))?;
    for figure in &study.figures {
        if let Err(e) = draw(*figure, &study, &points, dir.path()) {
            tracing::warn!("a figure of the study was not drawn: {e}");
        }
    }
    println!("{total} points; wrote {}", dir.path().join("study.csv").display());
    Ok(points)
}

/// Draw `figure` of the study's `points` into `out`.
fn draw(figure: Figure, study: &Study, points: &[Point], out: &Path) -> Result<(), RuntimeError> {
    let label = |p: &Point| p.settings.join(" ").replace('"', "");
    match figure {
        Figure::Measure(measure) => {
            let (x, lines) = lines(study, points, measure);
            let steps: Vec<String> =
                study.axes[0].values.iter().map(|row| row.join(", ").replace('"', "")).collect();
            let path = out.join(format!("{}.png", measure.name()));
            plot::draw_study(&path, (&x, &steps), &measure.name().replace('_', " "), &lines)
        }
        Figure::Curves => {
            let runs = (points.iter().enumerate())
                .map(|(i, p)| {
                    let run = RecordedRun::read(&out.join(format!("point-{i:03}")))?;
                    Ok(RecordedRun { label: label(p), ..run })
                })
                .collect::<Result<Vec<_>, RuntimeError>>()?;
            plot::draw_comparison(&runs, out).map(drop)
        }
        Figure::Staleness => {
            let histograms: Vec<(String, &[u64])> =
                points.iter().map(|p| (label(p), p.staleness_histogram.as_slice())).collect();
            plot::draw_histograms(&out.join("staleness.png"), &histograms)
        }
    }
}

/// A measure figure's x axis (the first axis's keys) and its lines: `measure` per step of the
/// first axis, one line per combination of the other axes, the mean over seeds.
fn lines(study: &Study, points: &[Point], measure: Measure) -> (String, Vec<plot::StudyLine>) {
    let first = &study.axes[0];
    let (steps, per_step) = (first.values.len(), points.len() / first.values.len().max(1));
    let width = first.keys.len();
    let seeds = study.seeds.len().max(1);
    let mut lines: Vec<plot::StudyLine> = Vec::new();
    // Points run with the first axis slowest, then the other axes, then the seeds.
    for line in 0..per_step / seeds {
        let label = points[line * seeds].settings[width..].iter().filter(|s| !s.contains("seed=")).cloned();
        let label: Vec<String> = label.collect();
        let values = (0..steps)
            .map(|step| {
                let runs = &points[step * per_step + line * seeds..][..seeds];
                runs.iter().map(|p| p.measure(measure)).sum::<f64>() / seeds as f64
            })
            .collect();
        let label = if label.is_empty() { measure.name().into() } else { label.join(" ").replace('"', "") };
        lines.push((label, values));
    }
    (first.keys.join(", "), lines)
}

/// A complete point's `point.json`, if there is one that reads.
fn read_point(dir: &Path) -> Option<Point> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("point.json")).ok()?).ok()
}

/// Run one point into `dir`, and write its `point.json` last.
fn run_point(runs: StudyRuns, config: &Config, sets: &[String], dir: &RunDir) -> Result<Point, RuntimeError> {
    dir.write_config(config)?;
    let summary = match runs {
        StudyRuns::Local | StudyRuns::Quic => {
            let data = config.data.load()?;
            let run = if runs == StudyRuns::Quic { run_loopback } else { run_local };
            let report = run(config, data, Some(dir.path()), ProgressMode::Quiet, None)?;
            dir.record(config, &report)?.summary
        }
        StudyRuns::Simulate => {
            let report = simulate::simulate(config, ProgressMode::Quiet)?;
            let mut s = simulate::write_run(dir, config, &report)?.run;
            // The simulated cluster's rate, not the simulator's own.
            s.samples_per_second = s.samples as f64 / report.virtual_seconds.max(1e-12);
            if config.simulation.gradients != GradientSource::Model {
                s.final_test_accuracy = f64::NAN; // the quadratic has no test set
            }
            s
        }
    };
    let point = Point::of(sets, &summary);
    let json = serde_json::to_string_pretty(&point).map_err(|e| RuntimeError::Config(e.to_string()))?;
    dir.write_file("point.json", &json)?;
    Ok(point)
}

fn nan() -> f64 {
    f64::NAN
}

/// A number for a table: empty when there is none.
fn cell(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite()).map_or_else(String::new, |v| format!("{v:.4}"))
}

const MEASURES: &str = "test_accuracy,test_error,time_to_target,updates_to_target,mean_staleness,\
                        max_staleness,samples_per_second,payload_bytes,goodput,shard_bytes_per_update,outcome";

/// The measured cells of `p`, in the order of [`MEASURES`].
fn measures(p: &Point) -> Vec<String> {
    vec![
        cell(Some(p.test_accuracy)),
        cell(Some(p.test_error())),
        cell(p.time_to_target),
        p.updates_to_target.map_or_else(String::new, |u| u.to_string()),
        format!("{:.3}", p.mean_staleness),
        p.max_staleness.to_string(),
        format!("{:.0}", p.samples_per_second),
        p.payload_bytes.to_string(),
        format!("{:.3}", p.goodput),
        Some(p.shard_bytes_per_update)
            .filter(|b| b.is_finite())
            .map_or_else(String::new, |b| format!("{b:.0}")),
        p.outcome.clone(),
    ]
}

/// `study.csv`: one row per point, its settings first.
#[must_use]
pub fn study_csv(columns: &[String], points: &[Point]) -> String {
    let mut out = format!("point,{},{MEASURES}\n", columns.join(","));
    for (i, p) in points.iter().enumerate() {
        let values: Vec<String> = p
            .values()
            .take(columns.len())
            .map(|v| if v.contains(',') { format!("\"{v}\"") } else { v.into() })
            .collect();
        let _ = writeln!(out, "{i},{},{}", values.join(","), measures(p).join(","));
    }
    out
}

/// `study.md`: the same as a Markdown table.
#[must_use]
pub fn study_md(columns: &[String], points: &[Point]) -> String {
    let header: Vec<String> = std::iter::once("point".to_owned())
        .chain(columns.iter().cloned())
        .chain(MEASURES.split(',').map(str::to_owned))
        .collect();
    let mut out = format!("# Study\n\n| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for (i, p) in points.iter().enumerate() {
        let row: Vec<String> = std::iter::once(i.to_string())
            .chain(p.values().take(columns.len()).map(str::to_owned))
            .chain(measures(p))
            .collect();
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}
