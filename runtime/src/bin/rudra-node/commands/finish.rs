//! A run's end, for every command that trains: its results written and its summary printed.

use rudra_actors::RunReport;
use rudra_runtime::{Config, RunDir, RuntimeError, Summary};

/// A run's end: its results written and printed (printed even when they cannot be written);
/// or, for a run that failed, what it had recorded (`so_far`) and why it stopped, in its run
/// directory.
pub(crate) fn finish(
    dir: &RunDir,
    config: &Config,
    run: Result<RunReport, RuntimeError>,
    so_far: impl FnOnce() -> RunReport,
) -> Result<(), RuntimeError> {
    let report = match run {
        Ok(report) => report,
        Err(e) => {
            if let Err(not_written) = dir.record_failure(config, &so_far(), &e) {
                tracing::warn!("the failed run's record was not written: {not_written}");
            }
            return Err(e);
        }
    };
    let recorded = dir.record(config, &report);
    let s = recorded.as_ref().map_or_else(|_| Summary::new(config, &report), |run| run.summary.clone());
    let reached = s.time_to_target.map_or_else(
        || format!("{} never reached", s.target_accuracy),
        |t| format!("{} reached after {t:.1} s", s.target_accuracy),
    );
    println!(
        "{} λ={} μ={} μλ={}: test accuracy {:.4} ({reached}), train loss {:.4}, ⟨σ⟩ {:.2} (max {}), {} updates, {:.0} samples/s over {:.1} s; wrote {}",
        config.protocol_label(),
        s.learners,
        s.batch_size,
        s.global_batch,
        s.final_test_accuracy,
        s.final_train_loss,
        s.staleness.mean,
        s.staleness.max,
        s.updates,
        s.samples_per_second,
        s.wall_seconds,
        dir.path().display()
    );
    recorded?;
    if s.outcome == "incomplete" {
        let missing = s.samples_expected - s.samples;
        tracing::warn!(
            "the run is incomplete: {missing} of {} examples were not processed (learners left out at the end)",
            s.samples_expected
        );
    }
    match s.diverged {
        Some(d) => Err(RuntimeError::diverged(&config.cluster, d)),
        None => Ok(()),
    }
}
