//! The distributed path against the in-memory run, on the peers' workload: MNIST, the MLP
//! 784-256-10, μ = 32, plain SGD at 0.1 (no modulation), async with λ = 2 and one shard, two
//! epochs. The same settings run in one process (in memory) and as four `rudra-node` processes
//! (scheduler, shard, two learners) over loopback QUIC with mutual TLS, once per payload codec
//! and once with `f32` and prefetch 1; each reports samples/s, its ratio to the in-memory run,
//! and the time to 96% test accuracy.

use std::path::Path;
use std::time::Duration;

use rudra_actors::TrainingData;

use super::{BenchRow, interleaved, throughput_rows};
use crate::local::{ProgressMode, run_local};
use crate::processes::{Launch, Processes, ShardFront, issue_certs, names};
use crate::summary::RecordedRun;
use crate::{Config, RuntimeError};

/// The workload's settings, over whatever configuration the bench was given. Neither run
/// writes checkpoints (the in-memory run has no directory for them, and a shard process
/// would write them into the working directory).
const WORKLOAD: [&str; 13] = [
    "protocol.kind=async",
    "protocol.lr_modulation=none",
    "cluster.learners=2",
    "cluster.shards=1",
    "training.model=mlp",
    "training.hidden=[256]",
    "training.batch_size=32",
    "training.learning_rate=0.1",
    "training.lr_decay=1.0",
    "training.epochs=2",
    "training.evals_per_epoch=8",
    "training.target_accuracy=0.96",
    "checkpoint.every_updates=0",
];

/// The workload's processes: one shard, two learners, no groups.
pub(super) const NODES: (u32, u32, u32) = (1, 2, 1);

/// The codecs compared across processes: (gradients, weights).
const CODECS: [(&str, &str); 4] = [("f32", "f32"), ("bf16", "bf16"), ("int8", "bf16"), ("topk", "bf16")];

/// A run's throughput and its time to the target accuracy (NaN if never reached).
type Measured = [f64; 2];

fn bench_error(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(format!("cluster benchmark: {what}"))
}

/// The workload's settings, then the caller's `base` (`--set` flags), then `codec`'s and
/// `prefetch`.
pub(super) fn workload(base: &[String], codec: (&str, &str), prefetch: u32) -> Vec<String> {
    let mut sets: Vec<String> = WORKLOAD.iter().map(|s| (*s).to_owned()).collect();
    sets.extend(base.iter().cloned());
    sets.push(format!("transport.gradient_codec={}", codec.0));
    sets.push(format!("transport.weight_codec={}", codec.1));
    sets.push(format!("protocol.prefetch={prefetch}"));
    sets
}

fn measured(run: &RecordedRun) -> Measured {
    [run.summary.samples_per_second, run.summary.time_to_target.unwrap_or(f64::NAN)]
}

/// The workload in one process, in memory.
fn in_memory(config: &Config, data: &TrainingData, dir: &Path) -> Result<Measured, RuntimeError> {
    let report = run_local(config, data.clone(), None, ProgressMode::Quiet, None)?;
    Ok(measured(&RecordedRun::of(dir, config, &report)))
}

/// The workload as processes over loopback QUIC, `nodes` shards, learners and groups (the
/// shard behind `front`, if given): the run as recorded in `dir/run`.
pub(super) fn processes(
    (file, sets): (Option<&Path>, &[String]),
    nodes: (u32, u32, u32),
    (certs, dir): (&Path, &Path),
    front: Option<&ShardFront<'_>>,
) -> Result<RecordedRun, RuntimeError> {
    let run = dir.join("run");
    let launch = Launch {
        certs,
        logs: dir,
        run_dir: &run,
        config: (file, sets),
        nodes,
        connect_timeout: Duration::from_secs(60),
        log_filter: "warn",
        shard_front: front,
    };
    Processes::start(&launch)?.run(&[], Duration::from_secs(600))?.require_success("cluster benchmark")?;
    RecordedRun::read(&run)
}

/// Measure the in-memory run and the process runs `repeats` times, interleaved.
pub fn run(file: Option<&Path>, base: &[String], repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let memory_config = Config::load(file, &workload(base, ("f32", "f32"), 0))?;
    let data = memory_config.data.load()?;
    let tmp = tempfile::tempdir().map_err(bench_error)?;
    let cert_dir = tmp.path().join("certs");
    issue_certs(&cert_dir, &names(NODES))?;
    let over_quic = CODECS
        .iter()
        .map(|&(g, w)| (format!("4 processes over QUIC, gradients {g}, weights {w}"), Some(((g, w), 0))))
        .chain(std::iter::once((
            "4 processes over QUIC, f32, prefetch 1".to_owned(),
            Some((("f32", "f32"), 1)),
        )));
    // None: the in-memory run; Some((codecs, prefetch)): processes over QUIC.
    type Setting<'a> = Option<((&'a str, &'a str), u32)>;
    let settings: Vec<(String, Setting)> =
        std::iter::once(("in memory, f32".to_owned(), None)).chain(over_quic).collect();
    let measured = interleaved(settings.len(), repeats, tmp.path(), |i, dir| {
        let (name, setting) = &settings[i];
        let [sps, to_target] = match setting {
            None => in_memory(&memory_config, &data, dir)?,
            Some((codec, k)) => {
                measured(&processes((file, &workload(base, *codec, *k)), NODES, (&cert_dir, dir), None)?)
            }
        };
        tracing::info!("{name}: {sps:.0} samples/s, {to_target:.2} s to 96%");
        Ok([sps, to_target])
    })?;
    let names = settings.into_iter().map(|(name, _)| name).collect();
    Ok(throughput_rows(names, measured, "in memory", &[("time to 96%", "s")]))
}
