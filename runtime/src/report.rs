//! `rudra-node report`: several finished runs compared in one table and on the same axes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::RecordedRun;
use crate::RuntimeError;
use crate::plot::draw_comparison;
use rudra_actors::InvalidSetting;

/// One run's line of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct ComparisonRow {
    /// The run's label (its directory's name).
    pub run: String,
    /// `hardsync`, `n-softsync` or `async`.
    pub protocol: String,
    /// λ.
    pub learners: u32,
    /// μ.
    pub batch_size: usize,
    /// μλ.
    pub global_batch: usize,
    /// ⟨σ⟩.
    pub mean_staleness: f64,
    /// Test accuracy at the end.
    pub final_accuracy: f64,
    /// Wall seconds at the first evaluation that reached the target accuracy, if one did.
    pub time_to_target: Option<f64>,
    /// Examples per second over the run.
    pub samples_per_second: f64,
}

/// The comparison table of several runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The target test accuracy for the time-to-target column.
    pub target: f64,
    /// One row per run, in the order given.
    pub rows: Vec<ComparisonRow>,
}

impl ComparisonRow {
    /// The row of `run` for a `target` test accuracy.
    #[must_use]
    pub fn new(run: &RecordedRun, target: f64) -> Self {
        let s = &run.summary;
        let protocol = match s.protocol.as_str() {
            "softsync" => format!("{}-softsync", s.n),
            other => other.to_owned(),
        };
        Self {
            run: run.label.clone(),
            protocol,
            learners: s.learners,
            batch_size: s.batch_size,
            global_batch: s.global_batch,
            mean_staleness: s.staleness.mean,
            final_accuracy: s.final_test_accuracy,
            time_to_target: run.metrics.iter().find(|m| m.test_accuracy >= target).map(|m| m.wall_seconds),
            samples_per_second: s.samples_per_second,
        }
    }
}

/// Quote a CSV field when it needs it.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_owned() }
}

impl Comparison {
    /// The table of `runs` for a `target` test accuracy.
    #[must_use]
    pub fn new(runs: &[RecordedRun], target: f64) -> Self {
        Self { target, rows: runs.iter().map(|r| ComparisonRow::new(r, target)).collect() }
    }

    /// A Markdown table with aligned columns; runs that never reached the target show "—".
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let header = [
            "run".to_owned(),
            "protocol".to_owned(),
            "λ".to_owned(),
            "μ".to_owned(),
            "μλ".to_owned(),
            "⟨σ⟩".to_owned(),
            "final accuracy".to_owned(),
            format!("time to {} (s)", self.target),
            "samples/s".to_owned(),
        ];
        let body: Vec<[String; 9]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.run.clone(),
                    r.protocol.clone(),
                    r.learners.to_string(),
                    r.batch_size.to_string(),
                    r.global_batch.to_string(),
                    format!("{:.2}", r.mean_staleness),
                    format!("{:.4}", r.final_accuracy),
                    r.time_to_target.map_or_else(|| "—".to_owned(), |t| format!("{t:.1}")),
                    format!("{:.0}", r.samples_per_second),
                ]
            })
            .collect();
        let width = |c: usize| {
            std::iter::once(&header).chain(&body).map(|row| row[c].chars().count()).max().unwrap_or(0)
        };
        let widths: Vec<usize> = (0..header.len()).map(width).collect();
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            for (cell, w) in cells.iter().zip(&widths) {
                let _ = write!(out, "| {cell}{} ", " ".repeat(w - cell.chars().count()));
            }
            out.push_str("|\n");
        };
        line(&header);
        line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
        for row in &body {
            line(row);
        }
        out
    }

    /// The table as CSV with plain column names; an empty `time_to_target_seconds` means the
    /// run never reached `target_accuracy`.
    #[must_use]
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "run,protocol,learners,batch_size,global_batch,mean_staleness,final_test_accuracy,\
             target_accuracy,time_to_target_seconds,samples_per_second\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{:.4},{:.6},{},{},{:.1}",
                csv_field(&r.run),
                r.protocol,
                r.learners,
                r.batch_size,
                r.global_batch,
                r.mean_staleness,
                r.final_accuracy,
                self.target,
                r.time_to_target.map_or_else(String::new, |t| format!("{t:.3}")),
                r.samples_per_second
            );
        }
        out
    }
}

/// Read the run directories `dirs`, write `report.md`, `report.csv` and the comparison plots
/// into `out` (created if needed), and return the table with the plots' paths.
pub fn report(dirs: &[PathBuf], out: &Path, target: f64) -> Result<(Comparison, Vec<PathBuf>), RuntimeError> {
    if !(target > 0.0 && target <= 1.0) {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--target",
            format!("is {target}; give an accuracy in (0, 1]"),
        )));
    }
    if dirs.is_empty() {
        return Err(RuntimeError::Config("give one or more run directories".into()));
    }
    let mut runs = dirs.iter().map(|d| RecordedRun::read(d)).collect::<Result<Vec<_>, _>>()?;
    // Runs from different parents may share a directory name; then name each by its path.
    let mut labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    labels.sort_unstable();
    labels.dedup();
    if labels.len() < runs.len() {
        for r in &mut runs {
            r.label = r.dir.display().to_string();
        }
    }
    std::fs::create_dir_all(out).map_err(|source| RuntimeError::Io { path: out.to_owned(), source })?;
    let table = Comparison::new(&runs, target);
    for (name, text) in [("report.md", table.to_markdown()), ("report.csv", table.to_csv())] {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|source| RuntimeError::Io { path, source })?;
    }
    let plots = draw_comparison(&runs, out)?;
    Ok((table, plots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rudra_actors::{MetricsRow, RunReport};
    use rudra_proto::StalenessSummary;

    fn run(label: &str, protocol: &str, n: u32, accuracies: &[f64]) -> RecordedRun {
        let metrics: Vec<MetricsRow> = accuracies
            .iter()
            .zip(1u32..)
            .map(|(&test_accuracy, i)| MetricsRow {
                wall_seconds: f64::from(i) * 1.5,
                epoch: f64::from(i),
                updates: u64::from(i) * 100,
                samples: u64::from(i) * 3200,
                train_loss: 1.0 / f64::from(i),
                test_loss: 0.5,
                test_accuracy,
                mean_staleness: 3.0,
                samples_per_second: 2133.3,
                learner_samples: vec![u64::from(i) * 800; 4],
                bytes: rudra_actors::BytesMoved::default(),
                learner_seconds: Vec::new(),
                goodput: f64::NAN,
            })
            .collect();
        let config = crate::Config::load(None, &[]).expect("the default configuration");
        let report = RunReport {
            batch_sizes: Vec::new(),
            shard_payload_in: Vec::new(),
            metrics: metrics.clone(),
            params: Vec::new(),
            staleness: StalenessSummary {
                mean: 3.25,
                histogram: vec![1, 2, 3],
                ..StalenessSummary::default()
            },
            updates: 100,
            samples: 3200,
            samples_expected: 3200,
            learner_samples: vec![800; 4],
            wall_seconds: 1.5 * accuracies.len() as f64,
            final_test_accuracy: *accuracies.last().unwrap(),
            final_train_loss: 0.5,
            timeline: Vec::new(),
            updates_lost: 0,
            diverged: None,
            bytes: rudra_actors::BytesMoved::default(),
            learner_time: Vec::new(),
            goodput: f64::NAN,
        };
        let mut run = RecordedRun::of(&PathBuf::from("runs").join(label), &config, &report);
        (run.summary.protocol, run.summary.n) = (protocol.to_owned(), n);
        (run.summary.samples_per_second, run.metrics) = (2133.3, metrics);
        run
    }

    #[test]
    fn rows_name_protocols_and_time_to_target() {
        let runs = [run("a", "softsync", 2, &[0.90, 0.975, 0.98]), run("b", "hardsync", 0, &[0.8, 0.9])];
        let t = Comparison::new(&runs, 0.97);
        assert_eq!(t.rows[0].protocol, "2-softsync");
        assert_eq!(t.rows[0].time_to_target, Some(3.0));
        assert_eq!(t.rows[1].protocol, "hardsync");
        assert_eq!(t.rows[1].time_to_target, None);
        assert_eq!(t.rows[1].final_accuracy, 0.9);

        let md = t.to_markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains("time to 0.97 (s)"));
        assert!(
            lines[2].starts_with("| a ") && lines[2].contains("| 0.9800 ") && lines[2].contains("| 3.0 ")
        );
        assert!(lines[3].contains("| —"), "{md}");
        let widths: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "aligned columns: {md}");

        let csv = t.to_csv();
        let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(rows[0][8], "time_to_target_seconds");
        assert_eq!(
            rows[1],
            ["a", "2-softsync", "4", "32", "128", "3.2500", "0.980000", "0.97", "3.000", "2133.3"]
        );
        assert_eq!(rows[2][8], "");
    }

    #[test]
    fn bad_targets_and_missing_runs_are_refused() {
        let out = tempfile::tempdir().unwrap();
        for target in [0.0, 1.5, f64::NAN] {
            assert!(matches!(
                report(&[PathBuf::from("x")], out.path(), target),
                Err(RuntimeError::Invalid(InvalidSetting { key: "--target", .. }))
            ));
        }
        let e = report(&[out.path().join("gone")], out.path(), 0.9).unwrap_err();
        assert!(matches!(e, RuntimeError::Input { .. }) && e.to_string().contains("gone"), "{e}");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
    }
}
