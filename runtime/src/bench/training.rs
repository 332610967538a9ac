//! Training throughput of in-process clusters against a bare single-threaded SGD loop over
//! the same kernels, measured in the same run.

use std::sync::Arc;
use std::time::Instant;

use rudra_actors::protocol::{LrModulation, SyncRule};
use rudra_actors::{ClusterSpec, TrainingData};
use rudra_compute::{BatchStream, CpuBackend, Minibatches, Model, Partition};

use super::{BenchRow, median};
use crate::local::{ProgressMode, run_local};
use crate::{Config, RuntimeError};

/// The bare loop: one model, one thread, `steps` SGD steps of `spec.batch_size`.
fn bare_sgd(spec: &ClusterSpec, data: &TrainingData, steps: usize) -> Result<f64, RuntimeError> {
    let mut model = Model::new(CpuBackend, spec.model.clone())?;
    model.write_params(0, &spec.model.init(spec.seed))?;
    let part = Partition::split(data.train.len(), 1, spec.seed).remove(0);
    let mut batches =
        Minibatches::new(Arc::clone(&data.train), BatchStream::new(part, spec.batch_size, spec.seed, 0));
    let start = Instant::now();
    for _ in 0..steps {
        let (x, y) = batches.next_batch();
        model.loss_and_gradient(x, y)?;
        model.apply_gradient(-spec.schedule.base)?;
    }
    Ok((steps * spec.batch_size) as f64 / start.elapsed().as_secs_f64())
}

/// A cluster shape: λ, shards, protocol.
type Shape = (u32, u32, SyncRule);

/// The cluster of `config` with `learners`, `shards` and `rule`, each learner doing `steps`
/// steps (one epoch over a training subset sized for that).
fn cluster(
    config: &Config,
    data: &TrainingData,
    (learners, shards, rule): Shape,
    steps: usize,
) -> Result<f64, RuntimeError> {
    let mut c = config.clone();
    c.cluster.learners = learners;
    c.cluster.shards = shards;
    c.cluster.protocol.rule = rule;
    c.cluster.epochs = 1;
    let examples = steps * c.cluster.batch_size * learners as usize;
    let data =
        TrainingData { train: Arc::new(data.train.head(examples)), test: Arc::new(data.test.head(1000)) };
    let report = run_local(&c, data, ProgressMode::Quiet, None)?;
    Ok(report.samples as f64 / report.wall_seconds)
}

/// Measure every setting `repeats` times and report medians and ratios to the bare loop.
pub fn run(
    config: &Config,
    data: &TrainingData,
    steps: usize,
    repeats: usize,
) -> Result<Vec<BenchRow>, RuntimeError> {
    let mut config = config.clone();
    config.cluster.protocol.modulation = LrModulation::None;
    let c = &config.cluster;
    let lambda = c.learners;
    let settings: Vec<(String, Option<Shape>)> = vec![
        ("bare SGD loop (1 thread)".into(), None),
        ("local λ=1, 1 shard".into(), Some((1, 1, SyncRule::Softsync { n: 1 }))),
        ("local λ=2, 1 shard, async".into(), Some((2, 1, SyncRule::Softsync { n: 2 }))),
        (
            format!("local λ={lambda}, {} shards, {:?}", c.shards, c.protocol.rule),
            Some((lambda, c.shards, c.protocol.rule)),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    // Interleave the settings so that machine noise spreads over all of them.
    for round in 0..repeats {
        for (i, (name, setting)) in settings.iter().enumerate() {
            let sps = match setting {
                None => bare_sgd(c, data, steps)?,
                Some(s) => cluster(&config, data, *s, steps)?,
            };
            tracing::info!(round, "{name}: {sps:.0} samples/s");
            samples[i].push(sps);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    Ok(settings
        .into_iter()
        .zip(&medians)
        .map(|((name, _), &m)| BenchRow {
            name,
            value: m,
            unit: "samples/s",
            ratio: Some((m / medians[0], "bare SGD loop".into())),
        })
        .collect())
}
