//! `rudra-node experiment`: a fault-injection scenario next to a clean run with the same seed,
//! and a report of what the faults cost.
//!
//! ```text
//! OUT/clean/    the run without the [faults] section (summary.json, metrics.csv, plots)
//! OUT/faulty/   the run with it
//! OUT/experiment.json, OUT/experiment.md   timeline, accuracies, updates lost, ⟨σ⟩ over time
//! OUT/report.md and plots                  both runs on the same axes (`rudra-node report`)
//! ```

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rudra_actors::faults::FaultPlan;
use rudra_actors::{RunReport, TimelineEntry, TrainingData};
use serde::Serialize;

use crate::local::{ProgressMode, run_local};
use crate::{Config, RuntimeError, report};
use crate::{RunDir, Summary};
use rudra_actors::InvalidSetting;

/// What `experiment.json` holds.
#[derive(Debug, Serialize)]
pub struct Experiment {
    /// The faults injected, as configured.
    pub faults: FaultPlan,
    /// What was injected and what the cluster detected, in order.
    pub timeline: Vec<TimelineEntry>,
    /// Final test accuracy without and with the faults.
    pub accuracy: (f64, f64),
    /// Updates applied per shard without and with the faults.
    pub updates: (u64, u64),
    /// Updates shards made in the faulty run and lost when they crashed (rolled back to their
    /// checkpoints).
    pub updates_lost: u64,
    /// Updates the faulty run did not make: the clean run's minus its own (0 if it made more).
    pub updates_missing: u64,
    /// Gradients dropped (over the staleness bound, or from a closed round) in each run.
    pub gradients_dropped: (u64, u64),
    /// Seconds each run took.
    pub wall_seconds: (f64, f64),
    /// ⟨σ⟩ at each evaluation of the faulty run: (seconds, ⟨σ⟩).
    pub staleness_over_time: Vec<(f64, f64)>,
}

/// Run `config` with and without its faults into `dir`; each run must end within `limit`.
pub fn run(
    config: &Config,
    data: &TrainingData,
    dir: &RunDir,
    limit: Duration,
) -> Result<Experiment, RuntimeError> {
    let out = dir.path();
    if config.faults.is_empty() {
        return Err(InvalidSetting::new(
            "faults",
            "the configuration injects no faults: add a [faults] section (see configs/faults/)",
        )
        .into());
    }
    let clean = run_one(&config.without_faults()?, data, &out.join("clean"), limit, "the clean run")?;
    let faulty = run_one(config, data, &out.join("faulty"), limit, "the run with faults")?;
    let dirs = [out.join("clean"), out.join("faulty")];
    let (table, _) = report::report(&dirs, out, config.target_accuracy)?;
    let experiment = Experiment {
        faults: config.faults.clone(),
        timeline: faulty.0.timeline.clone(),
        accuracy: (clean.0.final_test_accuracy, faulty.0.final_test_accuracy),
        updates: (clean.0.updates, faulty.0.updates),
        updates_lost: faulty.0.updates_lost,
        updates_missing: clean.0.updates.saturating_sub(faulty.0.updates),
        gradients_dropped: (clean.1.gradients_dropped, faulty.1.gradients_dropped),
        wall_seconds: (clean.0.wall_seconds, faulty.0.wall_seconds),
        staleness_over_time: faulty.0.metrics.iter().map(|r| (r.wall_seconds, r.mean_staleness)).collect(),
    };
    let json = serde_json::to_string_pretty(&experiment).map_err(|e| RuntimeError::Config(e.to_string()))?;
    dir.write_file("experiment.json", &json)?;
    dir.write_file("experiment.md", &markdown(&experiment, &table.to_markdown()))?;
    Ok(experiment)
}

/// One run into `dir`, given up on with a clear error after `limit`.
fn run_one(
    config: &Config,
    data: &TrainingData,
    dir: &Path,
    limit: Duration,
    what: &str,
) -> Result<(RunReport, Summary), RuntimeError> {
    let dir = RunDir::create(Some(dir), config.protocol_name())?;
    dir.write_config(config)?;
    tracing::info!(dir = %dir.path().display(), "{what}");
    let (tx, rx) = mpsc::channel();
    let (config_, data_, path) = (config.clone(), data.clone(), dir.path().to_owned());
    std::thread::spawn(move || {
        // The receiver is gone only if the limit has passed.
        let _ = tx.send(run_local(&config_, data_, Some(&path), ProgressMode::detect(), None));
    });
    let report = rx.recv_timeout(limit).map_err(|_| {
        RuntimeError::Invalid(InvalidSetting::new(
            "--time-limit",
            format!("{what} did not finish within {limit:?}; the scenario hangs or needs a longer limit"),
        ))
    })??;
    let summary = dir.record(config, &report)?.summary;
    Ok((report, summary))
}

fn markdown(e: &Experiment, table: &str) -> String {
    let mut md = String::from("# Fault-injection experiment\n\n| | clean | with faults |\n|---|---|---|\n");
    md += &format!("| final test accuracy | {:.4} | {:.4} |\n", e.accuracy.0, e.accuracy.1);
    md += &format!("| updates per shard | {} | {} |\n", e.updates.0, e.updates.1);
    md += &format!("| gradients dropped | {} | {} |\n", e.gradients_dropped.0, e.gradients_dropped.1);
    md += &format!("| seconds | {:.1} | {:.1} |\n\n", e.wall_seconds.0, e.wall_seconds.1);
    md += &format!(
        "Updates lost in shard crashes: {}. Updates the faulty run did not make: {}.\n\n\
         ## Timeline\n\n| seconds | | event |\n|---|---|---|\n",
        e.updates_lost, e.updates_missing
    );
    for t in &e.timeline {
        md += &format!("| {:.2} | {} | {} |\n", t.seconds, t.kind, t.what);
    }
    md += "\n## Both runs\n\n";
    md += table;
    md
}
