//! `rudra-node experiment`: a fault-injection scenario next to a clean run with the same seed,
//! and a report of what the faults cost.
//!
//! ```text
//! OUT/clean/    the run without the [faults] section (summary.json, metrics.csv, plots)
//! OUT/faulty/   the run with it
//! OUT/logs/     with [[faults.kill]], where both runs are processes: each process's log
//! OUT/experiment.json, OUT/experiment.md   timeline, accuracies, updates lost, ⟨σ⟩ over time
//! OUT/report.md and plots                  both runs on the same axes (`rudra-node report`)
//! ```

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rudra_actors::faults::FaultPlan;
use rudra_actors::{MetricsRow, TimelineEntry, TrainingData};
use serde::Serialize;

use crate::config::Kill;
use crate::local::{ProgressMode, run_local};
use crate::processes::{Launch, Processes, issue_certs, names};
use crate::{Config, RecordedRun, RunDir, RuntimeError, Summary, report};
use rudra_actors::InvalidSetting;

/// What `experiment.json` holds.
#[derive(Debug, Serialize)]
pub struct Experiment {
    /// The faults injected, as configured.
    pub faults: FaultPlan,
    /// The processes killed, as configured (`[[faults.kill]]`).
    pub kills: Vec<Kill>,
    /// What was injected and what the cluster detected, in order.
    pub timeline: Vec<TimelineEntry>,
    /// Final test accuracy without and with the faults (for a run that stopped, its last).
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
    /// Why the faulty run stopped before its end, if it did (a lost shard that never came back
    /// stops the run by design).
    pub stopped: Option<String>,
    /// How each process of the faulty run ended, when it ran as processes: its exit code
    /// (`None`: killed, and not started again).
    pub exits: Vec<(String, Option<i32>)>,
}

/// One run of an experiment, as recorded.
struct Run {
    summary: Summary,
    timeline: Vec<TimelineEntry>,
    staleness: Vec<(f64, f64)>,
    exits: Vec<(String, Option<i32>)>,
}

/// How long an experiment's runs may take.
pub struct Bounds {
    /// Each run must end within this.
    pub limit: Duration,
    /// Every process's `--connect-timeout`, for runs as processes.
    pub connect_timeout: Duration,
}

/// Run `config` with and without its faults into `dir`. With `[[faults.kill]]` both runs are
/// `rudra-node` processes over loopback QUIC (logs in `dir/logs/`), otherwise both run in this
/// process.
pub fn run(
    config: &Config,
    data: &TrainingData,
    dir: &RunDir,
    bounds: &Bounds,
) -> Result<Experiment, RuntimeError> {
    let out = dir.path();
    if config.faults.is_empty() && config.kills.is_empty() {
        return Err(InvalidSetting::new(
            "faults",
            "the configuration injects no faults: add a [faults] section (see configs/faults/)",
        )
        .into());
    }
    let clean_config = config.without_faults()?;
    let (clean, faulty) = if config.kills.is_empty() {
        let clean = in_process(&clean_config, data, &out.join("clean"), bounds.limit, "the clean run")?;
        (clean, in_process(config, data, &out.join("faulty"), bounds.limit, "the run with faults")?)
    } else {
        let c = &config.cluster;
        issue_certs(&out.join("certs"), &names((c.shards, c.learners, c.groups)))?;
        let clean = as_processes(&clean_config, &[], out, "clean", bounds)?;
        (clean, as_processes(&config.without_kills()?, &config.kills, out, "faulty", bounds)?)
    };
    let dirs = [out.join("clean"), out.join("faulty")];
    let (table, _) = report::report(&dirs, out, config.target_accuracy)?;
    let (c, f) = (&clean.summary, &faulty.summary);
    let experiment = Experiment {
        faults: config.faults.clone(),
        kills: config.kills.clone(),
        timeline: faulty.timeline,
        accuracy: (c.final_test_accuracy, f.final_test_accuracy),
        updates: (c.updates, f.updates),
        updates_lost: f.updates_lost,
        updates_missing: c.updates.saturating_sub(f.updates),
        gradients_dropped: (c.gradients_dropped, f.gradients_dropped),
        wall_seconds: (c.wall_seconds, f.wall_seconds),
        staleness_over_time: faulty.staleness,
        stopped: f.error.clone(),
        exits: faulty.exits,
    };
    let json = serde_json::to_string_pretty(&experiment).map_err(|e| RuntimeError::Config(e.to_string()))?;
    dir.write_file("experiment.json", &json)?;
    dir.write_file("experiment.md", &markdown(&experiment, &table.to_markdown()))?;
    Ok(experiment)
}

/// ⟨σ⟩ at each evaluation: (seconds, ⟨σ⟩).
fn staleness_of(rows: &[MetricsRow]) -> Vec<(f64, f64)> {
    rows.iter().map(|r| (r.wall_seconds, r.mean_staleness)).collect()
}

/// One run in this process into `dir`, given up on with a clear error after `limit`.
fn in_process(
    config: &Config,
    data: &TrainingData,
    dir: &Path,
    limit: Duration,
    what: &str,
) -> Result<Run, RuntimeError> {
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
    let staleness = staleness_of(&report.metrics);
    Ok(Run { summary, timeline: report.timeline, staleness, exits: Vec::new() })
}

/// One run as processes into `out/name` (each process's log in `out/logs/name/`), with
/// `kills` carried out. The clean run (no kills) must end well; a faulty one may stop on an
/// error, which its summary records.
fn as_processes(
    config: &Config,
    kills: &[Kill],
    out: &Path,
    name: &str,
    bounds: &Bounds,
) -> Result<Run, RuntimeError> {
    let (run_dir, logs) = (out.join(name), out.join("logs").join(name));
    let file = RunDir::create(Some(&logs), name)?;
    file.write_file("job.toml", config.to_toml())?;
    let checkpoints = run_dir.join("checkpoints");
    let checkpoints =
        std::path::absolute(&checkpoints).map_err(|source| RuntimeError::Io { path: checkpoints, source })?;
    let sets = [format!("checkpoint.dir={}", checkpoints.display())];
    let c = &config.cluster;
    let launch = Launch {
        certs: &out.join("certs"),
        logs: &logs,
        run_dir: &run_dir,
        config: (Some(&logs.join("job.toml")), &sets),
        nodes: (c.shards, c.learners, c.groups),
        connect_timeout: bounds.connect_timeout,
        log_filter: "info",
        shard_front: None,
    };
    tracing::info!(dir = %run_dir.display(), logs = %logs.display(), "the {name} run, as processes");
    let ended = Processes::start(&launch)?.run(kills, bounds.limit)?;
    if kills.is_empty() {
        ended.require_success(&format!("the {name} run (logs in {})", logs.display()))?;
    }
    let recorded = RecordedRun::read(&run_dir)?;
    let path = run_dir.join("timeline.json");
    let text =
        std::fs::read_to_string(&path).map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
    let mut timeline: Vec<TimelineEntry> = serde_json::from_str(&text)
        .map_err(|e| RuntimeError::Input { path, message: format!("is not a timeline: {e}") })?;
    timeline.extend(ended.injected);
    timeline.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let staleness = staleness_of(&recorded.metrics);
    Ok(Run { summary: recorded.summary, timeline, staleness, exits: ended.exits })
}

fn markdown(e: &Experiment, table: &str) -> String {
    let mut md = String::from("# Fault-injection experiment\n\n| | clean | with faults |\n|---|---|---|\n");
    md += &format!("| final test accuracy | {:.4} | {:.4} |\n", e.accuracy.0, e.accuracy.1);
    md += &format!("| updates per shard | {} | {} |\n", e.updates.0, e.updates.1);
    md += &format!("| gradients dropped | {} | {} |\n", e.gradients_dropped.0, e.gradients_dropped.1);
    md += &format!("| seconds | {:.1} | {:.1} |\n\n", e.wall_seconds.0, e.wall_seconds.1);
    if let Some(why) = &e.stopped {
        md += &format!("The run with faults stopped before its end: {why}\n\n");
    }
    if !e.exits.is_empty() {
        md += "| process (with faults) | exit |\n|---|---|\n";
        for (name, code) in &e.exits {
            md += &format!("| {name} | {} |\n", code.map_or_else(|| "killed".into(), |c| c.to_string()));
        }
        md += "\n";
    }
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
