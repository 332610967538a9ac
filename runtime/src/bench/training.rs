//! Training throughput of in-process clusters against a bare single-threaded SGD loop over
//! the same kernels, measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rudra_actors::{ElasticMethod, ElasticSpec, ProtocolSpec, SgdSpec, TrainingData};
use rudra_compute::{BatchStream, CpuBackend, Dataset, Device, Minibatches, Model, ModelSpec, Partition};
use rudra_proto::{LrModulation, OptimizerSpec, SyncRule};

use super::{BenchRow, median};
use crate::local::{ProgressMode, run_local};
use crate::{Config, RuntimeError};

/// How long a bare SGD loop runs: at least `steps` steps and at least `time`, after one
/// untimed step that allocates and warms up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) steps: usize,
    pub(crate) time: Duration,
}

/// The bare loop: one `model` on `device` taking SGD steps of `batch` examples of `train`
/// with rate `lr`, for `span`: samples per second.
pub(crate) fn sgd_loop(
    device: &Device,
    model: &ModelSpec,
    train: &Arc<Dataset>,
    (batch, lr, seed): (usize, f32, u64),
    span: Span,
) -> Result<f64, RuntimeError> {
    let mut m = Model::new(device.clone(), model.clone())?;
    m.write_params(0, &model.init(seed))?;
    let part = Partition::split(train.len(), 1, seed).remove(0);
    let mut batches = Minibatches::new(Arc::clone(train), BatchStream::new(part, batch, seed, 0));
    let mut step = |m: &mut Model<Device>| -> Result<(), RuntimeError> {
        let b = batches.next_batch();
        m.loss_and_gradient(b.x, b.labels)?;
        m.apply_gradient(-lr)?;
        Ok(())
    };
    step(&mut m)?;
    let start = Instant::now();
    let mut steps = 0;
    while steps < span.steps || start.elapsed() < span.time {
        step(&mut m)?;
        steps += 1;
    }
    // The last step's gradient is read back, so that queued device work is counted.
    let mut grad = vec![0.0; m.layout().len];
    m.read_gradient(0, &mut grad)?;
    Ok((steps * batch) as f64 / start.elapsed().as_secs_f64())
}

/// The bare loop of the training suite: the CPU, one thread, `steps` SGD steps of
/// `training.batch_size`.
fn bare_sgd(config: &Config, data: &TrainingData, steps: usize) -> Result<f64, RuntimeError> {
    let spec = &config.cluster;
    let settings = (spec.batch_size, spec.schedule.base, spec.seed);
    sgd_loop(
        &Device::Cpu(CpuBackend),
        config.model.builtin("bench --suite training")?,
        &data.train,
        settings,
        Span { steps, time: Duration::ZERO },
    )
}

/// A cluster shape: λ, shards, and the protocol: an SGD rule, or a method of the EASGD family
/// with its τ.
type Shape = (u32, u32, Protocol);

/// The protocol of a measured cluster.
#[derive(Clone, Copy, Debug)]
enum Protocol {
    Sgd(SyncRule),
    Elastic(ElasticMethod, u64),
}

/// The cluster of `config` with `learners`, `shards` and `rule`, each learner doing `steps`
/// steps (one epoch over a training subset sized for that).
fn cluster(
    config: &Config,
    data: &TrainingData,
    (learners, shards, protocol): Shape,
    steps: usize,
) -> Result<f64, RuntimeError> {
    let mut c = config.clone();
    c.cluster.learners = learners;
    c.cluster.shards = shards;
    match protocol {
        Protocol::Sgd(rule) => {
            let (modulation, max_staleness, backups, prefetch, quorum) =
                (LrModulation::None, None, 0, 0, None);
            c.cluster.protocol =
                ProtocolSpec::Sgd(SgdSpec { rule, modulation, max_staleness, backups, prefetch, quorum });
        }
        Protocol::Elastic(method, tau) => {
            let beta = 0.9;
            c.cluster.protocol = ProtocolSpec::Elastic(ElasticSpec {
                method,
                tau,
                alpha: beta / learners as f32,
                beta,
                momentum: 0.0,
                lr_decay_gamma: 0.0,
                outer_lr: 0.7,
                outer_momentum: 0.9,
                optimizer: OptimizerSpec::Sgd,
                fragments: 1,
                modulation: LrModulation::None,
                max_staleness: None,
                quorum: None,
            });
        }
    }
    c.cluster.epochs = 1;
    let examples = steps * c.cluster.batch_size * learners as usize;
    let data =
        TrainingData { train: Arc::new(data.train.head(examples)), test: Arc::new(data.test.head(1000)) };
    let report = run_local(&c, data, None, ProgressMode::Quiet, None)?;
    Ok(report.samples as f64 / report.wall_seconds)
}

/// Measure every setting `repeats` times and report medians and ratios to the bare loop.
pub fn run(
    config: &Config,
    data: &TrainingData,
    steps: usize,
    repeats: usize,
) -> Result<Vec<BenchRow>, RuntimeError> {
    let c = &config.cluster;
    let lambda = c.learners;
    // The configured SGD rule (async for a protocol of the EASGD family).
    let rule = match &c.protocol {
        ProtocolSpec::Sgd(s) => s.rule,
        ProtocolSpec::Elastic(_) => SyncRule::Softsync { n: lambda },
    };
    let settings: Vec<(String, Option<Shape>)> = vec![
        ("bare SGD loop (1 thread)".into(), None),
        ("local λ=1, 1 shard".into(), Some((1, 1, Protocol::Sgd(SyncRule::Softsync { n: 1 })))),
        (
            "local λ=1, 1 shard, EASGD τ=10".into(),
            Some((1, 1, Protocol::Elastic(ElasticMethod::Easgd { sync: false }, 10))),
        ),
        (
            "local λ=1, 1 shard, DOWNPOUR τ=1".into(),
            Some((1, 1, Protocol::Elastic(ElasticMethod::Downpour, 1))),
        ),
        ("local λ=2, 1 shard, async".into(), Some((2, 1, Protocol::Sgd(SyncRule::Softsync { n: 2 })))),
        (
            format!("local λ={lambda}, {} shards, {rule:?}", c.shards),
            Some((lambda, c.shards, Protocol::Sgd(rule))),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    // Interleave the settings so that machine noise spreads over all of them.
    for round in 0..repeats {
        for (i, (name, setting)) in settings.iter().enumerate() {
            let sps = match setting {
                None => bare_sgd(config, data, steps)?,
                Some(s) => cluster(config, data, *s, steps)?,
            };
            tracing::info!(round, "{name}: {sps:.0} samples/s");
            samples[i].push(sps);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    // The EASGD family is measured against async SGD with the same learner and shard.
    Ok(settings
        .into_iter()
        .zip(&medians)
        .map(|((name, shape), &m)| {
            let ratio = match shape {
                Some((_, _, Protocol::Elastic(..))) => (m / medians[1], "local λ=1 (async SGD)".into()),
                _ => (m / medians[0], "bare SGD loop".into()),
            };
            BenchRow { name, value: m, unit: "samples/s", ratio: Some(ratio) }
        })
        .collect())
}
