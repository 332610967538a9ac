//! `rudra-node local`: the whole cluster in this process, with progress shown while it runs.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use rudra_actors::{Cluster, Models, RunEvent, RunReport, TrainingData};
use rudra_compute::Device;
use tokio::sync::mpsc;

use crate::exporter::MetricsEndpoint;
use crate::{Config, RuntimeError};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A progress bar (stderr is a terminal).
    Bar,
    /// A log line at every evaluation and every tenth of the run.
    Log,
    /// Nothing (benchmarks, tests).
    Quiet,
}

impl ProgressMode {
    /// A bar when stderr is a terminal, log lines otherwise.
    #[must_use]
    pub fn detect() -> Self {
        if std::io::stderr().is_terminal() { Self::Bar } else { Self::Log }
    }
}

/// Run `config`'s cluster on `data` in this process and return its report; the shards write
/// their checkpoints into `run_dir` (see [`Config::checkpoints`]); serve the live metrics at
/// `metrics_addr` while it runs, if given.
pub fn run_local(
    config: &Config,
    data: TrainingData,
    run_dir: Option<&Path>,
    progress: ProgressMode,
    metrics_addr: Option<SocketAddr>,
) -> Result<RunReport, RuntimeError> {
    let models = config.models(Device::open(config.device)?);
    run_local_with(config, models, data, run_dir, progress, metrics_addr)
}

/// [`run_local`] with `models` in place of the configured ones (a Python learner's, say).
pub fn run_local_with(
    config: &Config,
    models: Models,
    data: TrainingData,
    run_dir: Option<&Path>,
    progress: ProgressMode,
    metrics_addr: Option<SocketAddr>,
) -> Result<RunReport, RuntimeError> {
    config.refuse_kills()?;
    config.refuse_panics()?;
    let mut cluster = Cluster::new(config.cluster.clone(), models, data)?
        .with_liveness(config.liveness)
        .with_faults(config.faults.clone())
        .with_checkpoints(config.checkpoints(run_dir, &rudra_actors::checkpoint::new_job_id()));
    let endpoint = MetricsEndpoint::bind_if(metrics_addr)?;
    actix::System::new()
        .block_on(async move {
            let serving = endpoint.map(MetricsEndpoint::start).transpose()?;
            if let Some(serving) = &serving {
                cluster = cluster.with_metrics(Arc::clone(serving.metrics()));
                serving.set_ready(true);
            }
            let (tx, rx) = mpsc::unbounded_channel();
            let handle = cluster.observe(tx).start()?;
            let shown = actix::spawn(show_progress(rx, progress));
            let report = handle.wait().await;
            // The observer channel closes with the scheduler; the display task then ends.
            let _ = shown.await;
            Ok(report?)
        })
        .inspect(|report| warn_unfired(config, report))
}

/// Warn of every configured fault the run ended before: it tested nothing.
pub(crate) fn warn_unfired(config: &Config, report: &RunReport) {
    for fault in config.faults.unfired(std::time::Duration::from_secs_f64(report.wall_seconds)) {
        tracing::warn!(
            "{fault} never happened: the run lasted {:.1} s; move it earlier or lengthen the run (training.epochs)",
            report.wall_seconds
        );
    }
}

/// The progress bar of long runs: bar, percentage, message, elapsed and remaining time.
pub(crate) fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{bar:30} {percent:>3}% {msg} [{elapsed_precise}<{eta_precise}]")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

pub(crate) async fn show_progress(mut rx: mpsc::UnboundedReceiver<RunEvent>, mode: ProgressMode) {
    let mut bar: Option<ProgressBar> = None;
    let mut next_log = 0.1;
    let mut last_acc = f64::NAN;
    while let Some(event) = rx.recv().await {
        match (event, mode) {
            (_, ProgressMode::Quiet) => {}
            (RunEvent::Evaluated(row), ProgressMode::Bar) => last_acc = row.test_accuracy,
            (RunEvent::Evaluated(_), ProgressMode::Log) => {} // the scheduler logs evaluations
            (RunEvent::Progress(p), ProgressMode::Bar) => {
                let bar = bar.get_or_insert_with(|| {
                    let b = ProgressBar::new(p.total_samples);
                    b.set_style(bar_style());
                    b
                });
                bar.set_position(p.samples);
                let acc = if last_acc.is_nan() { "-".to_owned() } else { format!("{last_acc:.4}") };
                bar.set_message(format!(
                    "epoch {:.2} updates {} loss {:.4} test acc {acc} ⟨σ⟩ {:.2} {:.0} samples/s",
                    p.epoch,
                    p.updates,
                    p.recent_loss,
                    p.mean_staleness,
                    p.samples as f64 / p.wall_seconds.max(1e-9)
                ));
            }
            (RunEvent::Progress(p), ProgressMode::Log) => {
                let done = p.samples as f64 / p.total_samples.max(1) as f64;
                if done >= next_log {
                    next_log = (done * 10.0).floor() / 10.0 + 0.1;
                    tracing::info!(
                        "{:>3.0}% epoch {:.2} updates {} loss {:.4} ⟨σ⟩ {:.2} {:.0} samples/s",
                        done * 100.0,
                        p.epoch,
                        p.updates,
                        p.recent_loss,
                        p.mean_staleness,
                        p.samples as f64 / p.wall_seconds.max(1e-9)
                    );
                }
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}
