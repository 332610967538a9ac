//! `rudra-node simulate`: thousands of virtual learners on the real protocol cores.
//!
//! A discrete-event driver feeds the pure cores of `rudra_actors::protocol` exactly the
//! inputs their actors would — [`SgdShard`] and [`LearnerCore`] for hardsync, n-softsync and
//! async; [`CenterShard`] and [`ElasticWorker`] for the EASGD family (EASGD, EAMSGD, DOWNPOUR,
//! MDOWNPOUR) — in virtual time. The protocol is the configuration's `[protocol]`, as in real
//! runs. Compute and network times come from models ([`settings::ComputeSpec`],
//! [`settings::NetworkSpec`]); every random draw comes from one generator seeded with
//! `simulation.seed`, and events at equal times are taken in the order they were scheduled,
//! so a configuration and seed give one event log, whose hash is printed at the end.
//!
//! The entry points are [`simulate`] (one run, returning a [`SimReport`]) and [`run_command`]
//! (the command: one run or a sweep, written to a run directory).

mod driver;
mod elastic;
mod events;
mod gradients;
mod model;
mod output;
pub(crate) mod progress;
pub mod settings;
mod sgd;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rudra_actors::{ClusterSpec, ElasticMethod, ElasticSpec, ProtocolSpec, SgdSpec};
use rudra_compute::{CpuBackend, Device};
use rudra_proto::shard_ranges;
use rudra_proto::{
    CenterShard, ElasticWorker, LeaderGroups, LearnerCore, LearnerLoop, SgdShard, SgdShardConfig, ShardCore,
};
use rudra_transport::{LearnerId, ShardId};

use driver::{Engine, Finished, World};
pub use driver::{EventCounts, LearnerReport, LossRow, ShardReport};
use elastic::ElasticWorld;
use gradients::Gradients;
use model::{ComputeModel, Network};
pub use output::{SimReport, SimSummary, Trend, write_run};
use progress::Progress;
use settings::GradientSource;
pub use settings::{RawSimulation, Simulation};
use sgd::SgdWorld;

use crate::local::ProgressMode;
use crate::{Config, RunDir, RuntimeError};

/// The protocol a simulation of `config` runs: `[protocol]`'s kind, with `-sync` for sync
/// EASGD and sync DiLoCo.
#[must_use]
pub fn protocol_label(config: &Config) -> String {
    let name = config.protocol_name();
    match config.cluster.protocol {
        ProtocolSpec::Elastic(ElasticSpec {
            method: ElasticMethod::Easgd { sync: true } | ElasticMethod::Diloco { sync: true },
            ..
        }) => format!("{name}-sync"),
        _ => name.to_owned(),
    }
}

/// Check what can be checked of `config` before any simulation runs (the dataset is checked
/// when a model simulation loads it).
pub fn validate(config: &Config) -> Result<(), RuntimeError> {
    let params = match config.simulation.gradients {
        GradientSource::Synthetic(q) => q.dimension,
        GradientSource::Model => config.model.param_count(),
    };
    config.cluster.validate_settings(params)?;
    if config.simulation.churn.is_some() && config.cluster.protocol.elastic().is_none() {
        return Err(RuntimeError::Invalid(rudra_actors::InvalidSetting::new(
            "simulation.churn",
            "learners leave and join again in simulations of the EASGD family and DiLoCo; use 0 with Rudra's \
             SGD rules",
        )));
    }
    Ok(())
}

/// Run one simulation of `config` (a sweep in it is not expanded).
pub fn simulate(config: &Config, progress: ProgressMode) -> Result<SimReport, RuntimeError> {
    let started = Instant::now();
    validate(config)?;
    let (spec, sim) = (&config.cluster, &config.simulation);
    let learners = spec.learners as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(sim.seed);
    // Model gradients: the learners' loops and minibatches exactly as the actors get them.
    let (gradients, init, model_run) = match sim.gradients {
        GradientSource::Synthetic(q) => (Gradients::Quadratic(q), q.init(), None),
        GradientSource::Model => {
            let data = config.data.load()?;
            let models = config.models(Device::Cpu(CpuBackend));
            spec.validate(&models, &data)?;
            let (train_len, init) = (data.train.len(), models.init().to_vec());
            let (loops, batches): (Vec<_>, Vec<_>) =
                (0..learners).map(|l| spec.learner_loop(l, Arc::clone(&data.train), &init)).unzip();
            let gradients =
                Gradients::model(config.model.builtin("the simulator")?.clone(), batches, data.test)?;
            (gradients, init, Some((loops, train_len)))
        }
    };
    let ranges = shard_ranges(init.len(), spec.shards as usize);
    let compute = ComputeModel::new(&sim.compute, learners, &mut rng);
    let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let net = Network::new(&sim.network, learners, &lens)?;
    let expected = model_run.as_ref().map(|(_, len)| spec.steps_per_learner(*len) * u64::from(spec.learners));
    let mut progress = Progress::new(progress);
    let run = (sim.loss_every, expected);
    let (finished, world) = match &spec.protocol {
        ProtocolSpec::Elastic(elastic) => {
            let (centers, workers) = match model_run {
                Some((loops, train_len)) => model_elastic_cores(spec, loops, (train_len, &init))?,
                None => synthetic_elastic_cores(spec, elastic, &init, &ranges),
            };
            let round_seconds = elastic.tau as f64 * sim.compute.mean_seconds;
            let (elastic, lr, len, parts) = (elastic.clone(), spec.schedule.base, init.len(), ranges.clone());
            let respawn: elastic::Respawn = Box::new(move |l, x0, steps| {
                ElasticWorker::new(l, elastic.local_rule(lr, len), x0, parts.clone(), steps)
            });
            let mut world = ElasticWorld::new(centers, ranges, workers, respawn);
            let engine = Engine::new(rng, compute, net, gradients, learners)
                .with_grace(spec.grace_window(), lens.len())
                .with_churn(sim.churn.map(|c| c.timing(round_seconds)))
                .ending_after((spec.learners - spec.not_waited_for()) as usize);
            (engine.run(&mut world, &sim.stop, run, &mut progress)?, summarize(&world))
        }
        ProtocolSpec::Sgd(sgd) => {
            let (shards, cores) = match model_run {
                Some((loops, train_len)) => model_sgd_cores(spec, loops, (train_len, &init))?,
                None => synthetic_cores(spec, sgd, &init, &ranges),
            };
            let batch = spec.batch_size as u32;
            let mut world = match spec.own_round_groups() {
                Some(groups) => {
                    SgdWorld::new(shards, ranges, cores).with_own_rounds(Some(groups), (batch, spec.group_n))
                }
                None => SgdWorld::new(shards, ranges, cores)
                    .with_groups(&spec.learner_groups(), (batch, spec.protocol.waits_for_all())),
            };
            let engine = Engine::new(rng, compute, net, gradients, learners)
                .with_grace(spec.grace_window(), lens.len())
                .crediting(LeaderGroups::of(spec.own_round_groups()));
            (engine.run(&mut world, &sim.stop, run, &mut progress)?, summarize(&world))
        }
    };
    drop(progress);
    let Finished { end, counts, staleness, learners, loss, hash, mut gradients, shard_payload_in } = finished;
    let (shards, updates, params) = world;
    let test = gradients.evaluate(&params)?;
    Ok(SimReport {
        protocol: protocol_label(config),
        virtual_seconds: events::seconds(end),
        wall_seconds: started.elapsed().as_secs_f64(),
        updates,
        counts,
        staleness: staleness.summary(),
        shards,
        learners,
        loss,
        trace_hash: hash.value(),
        params,
        test,
        shard_payload_in,
    })
}

/// A world's shard reports, updates and final parameters.
fn summarize<W: World>(world: &W) -> (Vec<ShardReport>, u64, Vec<f32>) {
    let params = world.values().iter().flat_map(|v| v.iter().copied()).collect();
    (world.shard_reports(), world.updates(), params)
}

fn mismatch(what: &str) -> RuntimeError {
    RuntimeError::Simulation(format!("internal error: the cluster built {what} for another protocol"))
}

/// The SGD shard and learner cores of a model run, as the actors get them.
fn model_sgd_cores(
    spec: &ClusterSpec,
    loops: Vec<LearnerLoop>,
    (train_len, init): (usize, &[f32]),
) -> Result<(Vec<SgdShard>, Vec<LearnerCore>), RuntimeError> {
    let shards = (0..spec.shards as usize)
        .map(|s| match spec.shard_core(s, train_len, init) {
            ShardCore::Sgd(shard) => Ok(shard),
            ShardCore::Center(_) => Err(mismatch("a shard")),
        })
        .collect::<Result<_, _>>()?;
    let cores = loops
        .into_iter()
        .map(|l| match l {
            LearnerLoop::Sgd(core) => Ok(core),
            LearnerLoop::Elastic(_) => Err(mismatch("a learner")),
        })
        .collect::<Result<_, _>>()?;
    Ok((shards, cores))
}

/// The center shards and elastic workers of a model run, as the actors get them.
fn model_elastic_cores(
    spec: &ClusterSpec,
    loops: Vec<LearnerLoop>,
    (train_len, init): (usize, &[f32]),
) -> Result<(Vec<CenterShard>, Vec<ElasticWorker>), RuntimeError> {
    let centers = (0..spec.shards as usize)
        .map(|s| match spec.shard_core(s, train_len, init) {
            ShardCore::Center(center) => Ok(center),
            ShardCore::Sgd(_) => Err(mismatch("a shard")),
        })
        .collect::<Result<_, _>>()?;
    let workers = loops
        .into_iter()
        .map(|l| match l {
            LearnerLoop::Elastic(worker) => Ok(*worker),
            LearnerLoop::Sgd(_) => Err(mismatch("a learner")),
        })
        .collect::<Result<_, _>>()?;
    Ok((centers, workers))
}

/// Center shards and elastic workers over the quadratic: the configured method's rules with
/// η = `training.learning_rate`, learners that run until the simulation stops.
fn synthetic_elastic_cores(
    spec: &ClusterSpec,
    elastic: &ElasticSpec,
    init: &[f32],
    ranges: &[std::ops::Range<usize>],
) -> (Vec<CenterShard>, Vec<ElasticWorker>) {
    let lr = spec.schedule.base;
    let active: BTreeSet<LearnerId> = (0..spec.learners).map(LearnerId).collect();
    let centers = ranges
        .iter()
        .enumerate()
        .map(|(s, r)| elastic.center_shard(ShardId(s as u32), lr, init[r.clone()].to_vec(), active.clone()))
        .collect();
    let workers = active
        .iter()
        .map(|&l| {
            let rule = elastic.local_rule(lr, init.len());
            ElasticWorker::new(l, rule, init.to_vec(), ranges.to_vec(), u64::MAX)
        })
        .collect();
    (centers, workers)
}

/// Shard and learner cores over the quadratic: the configured protocol with a constant α0
/// (there are no epochs), learners that run until the simulation stops.
fn synthetic_cores(
    spec: &ClusterSpec,
    sgd: &SgdSpec,
    init: &[f32],
    ranges: &[std::ops::Range<usize>],
) -> (Vec<SgdShard>, Vec<LearnerCore>) {
    let shards = ranges
        .iter()
        .enumerate()
        .map(|(s, r)| {
            // The quadratic has no epochs: the base rate stays where it starts.
            let cfg = SgdShardConfig { gradients_per_epoch: u64::MAX, ..spec.sgd_shard_config(sgd, s, 0) };
            SgdShard::new(cfg, init[r.clone()].to_vec(), spec.served())
        })
        .collect();
    let learners = (0..spec.learners)
        .map(LearnerId)
        .map(|l| LearnerCore::new(l, ranges.len(), u64::MAX).with_prefetch(sgd.prefetch))
        .collect();
    (shards, learners)
}

/// `rudra-node simulate`: load the configuration, run it (once, or once per point of its
/// sweep), write the run directory and print what happened.
pub fn run_command(
    file: Option<&Path>,
    overrides: &[String],
    out: Option<&Path>,
    progress: ProgressMode,
) -> Result<(), RuntimeError> {
    let base = Config::load(file, overrides)?;
    let points = base.simulation.sweep_points();
    // Every point is loaded and checked before the first one runs.
    let configs = points
        .iter()
        .map(|sets| {
            let config = Config::load(file, &[overrides, sets].concat())?;
            validate(&config)?;
            Ok((sets.clone(), config))
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    let dir = RunDir::create(out, &format!("sim-{}", protocol_label(&base)))?;
    dir.write_config(&base)?;
    tracing::info!(dir = %dir.path().display(), points = configs.len(), "simulation directory");
    if let [(_, config)] = configs.as_slice() {
        let report = simulate(config, progress)?;
        let summary = output::write_run(&dir, config, &report)?;
        println!("{}; wrote {}", summary.headline(), dir.path().display());
        println!("trace hash {}", summary.trace_hash);
        // A model run that diverged fails as a real run would; the quadratic's runs (stability
        // studies) report their trend and outcome and succeed.
        return match summary.run.diverged {
            Some(d) if config.simulation.gradients == GradientSource::Model => {
                Err(RuntimeError::diverged(&config.cluster, d))
            }
            _ => Ok(()),
        };
    }
    let mut rows = Vec::new();
    for (i, (sets, config)) in configs.into_iter().enumerate() {
        let report = simulate(&config, ProgressMode::Quiet)?;
        let sub = RunDir::create(Some(&dir.path().join(format!("point-{i:03}"))), "")?;
        sub.write_config(&config)?;
        let summary = output::write_run(&sub, &config, &report)?;
        println!("[{i:03}] {}: {}", sets.join(" "), summary.headline());
        rows.push((sets, summary));
    }
    let keys: Vec<String> = base.simulation.sweep.iter().flat_map(|a| a.keys.iter().cloned()).collect();
    dir.write_file("sweep.csv", &output::sweep_csv(&keys, &rows))?;
    println!("{} simulations; wrote {}", rows.len(), dir.path().join("sweep.csv").display());
    Ok(())
}
