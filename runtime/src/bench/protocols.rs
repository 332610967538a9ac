//! Every protocol with its defaults: `local` with `protocol.kind` set and nothing else changed
//! (beyond the caller's `--set`s), each run's final test accuracy and throughput, the latter as
//! a ratio to the default protocol's in the same run.

use super::{BenchRow, median};
use crate::config::ProtocolKind;
use crate::local::{ProgressMode, run_local};
use crate::{Config, RuntimeError};

/// Run every protocol `repeats` times on the configuration of `file` and `overrides`.
pub fn run(
    file: Option<&std::path::Path>,
    overrides: &[String],
    repeats: usize,
) -> Result<Vec<BenchRow>, RuntimeError> {
    let mut rows = Vec::new();
    let mut baseline = None;
    for kind in ProtocolKind::ALL {
        let mut sets = vec![format!("protocol.kind={}", kind.as_str())];
        sets.extend(overrides.iter().cloned());
        let config = Config::load(file, &sets)?;
        let data = config.data.load()?;
        let (mut accuracy, mut speed) = (Vec::new(), Vec::new());
        for round in 0..repeats.max(1) {
            let report = run_local(&config, data.clone(), None, ProgressMode::Quiet, None)?;
            tracing::info!(
                round,
                "{}: test accuracy {:.4}",
                config.protocol_label(),
                report.final_test_accuracy
            );
            accuracy.push(report.final_test_accuracy);
            speed.push(report.samples as f64 / report.wall_seconds.max(1e-9));
        }
        let (accuracy, speed) = (median(accuracy), median(speed));
        let base = *baseline.get_or_insert(speed);
        let name = config.protocol_label();
        rows.push(BenchRow {
            name: format!("{name}: test accuracy"),
            value: accuracy,
            unit: "accuracy",
            ratio: None,
        });
        rows.push(BenchRow {
            name: format!("{name}: throughput"),
            value: speed,
            unit: "samples/s",
            ratio: Some((speed / base, ProtocolKind::ALL[0].as_str().into())),
        });
    }
    Ok(rows)
}
