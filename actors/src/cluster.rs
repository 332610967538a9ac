//! Starting a whole cluster in one process, and what a run reports.
//!
//! ```no_run
//! # async fn run(spec: rudra_actors::ClusterSpec, data: rudra_actors::TrainingData) -> Result<(), rudra_actors::ActorError> {
//! // inside an actix System:
//! let report = rudra_actors::Cluster::new(spec, data)?.start().wait().await?;
//! println!("test accuracy {:.4}", report.final_test_accuracy);
//! # Ok(()) }
//! ```

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use rudra_compute::{BatchStream, CpuBackend, Dataset, Device, Minibatches, Model, ModelSpec, Partition};
use rudra_transport::{LearnerId, ShardId};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::ActorError;
use crate::learner::{LearnerActor, SchedulerLink, ShardLink, shard_ranges};
use crate::protocol::shard::SgdShardConfig;
use crate::protocol::{
    LearnerCore, LrModulation, LrSchedule, SchedulerCore, SgdShard, StalenessSummary, SyncRule,
};
use crate::scheduler::{Joined, LearnerHandle, Members, SchedulerActor, ShardHandle};
use crate::shard::ShardActor;
use crate::tracker::StalenessTracker;

/// Which protocol the shards run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProtocolSpec {
    /// Hardsync or n-softsync (async is softsync with `n = λ`).
    pub rule: SyncRule,
    /// `α(σ)`.
    pub modulation: LrModulation,
    /// The staleness bound `s`, if any.
    pub max_staleness: Option<u64>,
}

/// Everything that defines a run, already typed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterSpec {
    /// λ, the number of learners.
    pub learners: u32,
    /// Parameter shards.
    pub shards: u32,
    /// The protocol.
    pub protocol: ProtocolSpec,
    /// The model.
    pub model: ModelSpec,
    /// μ, the minibatch size per learner.
    pub batch_size: usize,
    /// Passes over each learner's partition.
    pub epochs: u32,
    /// Base learning rate and decay.
    pub schedule: LrSchedule,
    /// Seed of initial weights, partitions and shuffles.
    pub seed: u64,
}

/// The training and test sets of a run.
#[derive(Clone, Debug)]
pub struct TrainingData {
    /// Split among the learners.
    pub train: Arc<Dataset>,
    /// Evaluated by the scheduler.
    pub test: Arc<Dataset>,
}

/// One evaluation of the model during a run (a row of `metrics.csv`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricsRow {
    /// Seconds since the learners started.
    pub wall_seconds: f64,
    /// Epochs processed, over all learners.
    pub epoch: f64,
    /// Updates applied by the shards.
    pub updates: u64,
    /// Examples processed, over all learners.
    pub samples: u64,
    /// Mean minibatch loss since the previous row.
    pub train_loss: f64,
    /// Mean cross-entropy on the test set.
    pub test_loss: f64,
    /// Fraction of the test set classified correctly.
    pub test_accuracy: f64,
    /// ⟨σ⟩ of all gradients applied so far.
    pub mean_staleness: f64,
    /// `samples / wall_seconds`.
    pub samples_per_second: f64,
}

/// Training progress between evaluations.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressSnapshot {
    /// Examples processed so far.
    pub samples: u64,
    /// Examples the run will process.
    pub total_samples: u64,
    /// Epochs so far.
    pub epoch: f64,
    /// Mean loss of the latest minibatches.
    pub recent_loss: f64,
    /// Seconds since the learners started.
    pub wall_seconds: f64,
}

/// What an observer of a run is told.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEvent {
    /// Periodic progress.
    Progress(ProgressSnapshot),
    /// An evaluation finished.
    Evaluated(MetricsRow),
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Every evaluation, in order.
    pub metrics: Vec<MetricsRow>,
    /// The final parameters, assembled from the shards.
    pub params: Vec<f32>,
    /// Staleness over the run.
    pub staleness: StalenessSummary,
    /// Updates applied (per shard).
    pub updates: u64,
    /// Examples processed.
    pub samples: u64,
    /// Seconds from start to the final evaluation.
    pub wall_seconds: f64,
    /// Test accuracy at the end.
    pub final_test_accuracy: f64,
    /// Mean training loss over the last evaluation window.
    pub final_train_loss: f64,
}

fn spec_err(key: &'static str, message: String) -> ActorError {
    ActorError::Spec { key, message }
}

impl ClusterSpec {
    /// Check the spec against itself and the data. This is the one place settings are
    /// validated; errors name the configuration key.
    pub fn validate(&self, data: &TrainingData) -> Result<(), ActorError> {
        if self.learners == 0 {
            return Err(spec_err("cluster.learners", "must be at least 1".into()));
        }
        let params = self.model.layout().len;
        if self.shards == 0 || self.shards as usize > params {
            return Err(spec_err("cluster.shards", format!("must be between 1 and the {params} parameters")));
        }
        if let SyncRule::Softsync { n } = self.protocol.rule
            && !(1..=self.learners).contains(&n)
        {
            return Err(spec_err(
                "protocol.n",
                format!("is {n}; it must be between 1 and λ = {}", self.learners),
            ));
        }
        if self.batch_size == 0 {
            return Err(spec_err("training.batch_size", "must be at least 1".into()));
        }
        let share = data.train.len() / self.learners as usize;
        if self.batch_size > share {
            return Err(spec_err(
                "training.batch_size",
                format!("is {}, larger than each learner's {share} training examples", self.batch_size),
            ));
        }
        if self.epochs == 0 {
            return Err(spec_err("training.epochs", "must be at least 1".into()));
        }
        if !(self.schedule.base.is_finite() && self.schedule.base > 0.0) {
            return Err(spec_err(
                "training.learning_rate",
                format!("is {}; it must be positive", self.schedule.base),
            ));
        }
        if !(self.schedule.decay.is_finite() && self.schedule.decay > 0.0) {
            return Err(spec_err(
                "training.lr_decay",
                format!("is {}; it must be positive", self.schedule.decay),
            ));
        }
        for (name, set) in [("training", &data.train), ("test", &data.test)] {
            if set.features() != self.model.inputs || set.classes() != self.model.classes {
                return Err(spec_err(
                    "training.dataset",
                    format!(
                        "the {name} set has {} features and {} classes; the model expects {} and {}",
                        set.features(),
                        set.classes(),
                        self.model.inputs,
                        self.model.classes
                    ),
                ));
            }
        }
        if data.test.is_empty() {
            return Err(spec_err("training.dataset", "the test set is empty".into()));
        }
        Ok(())
    }

    /// The parameter range of every shard.
    #[must_use]
    pub fn shard_ranges(&self) -> Vec<Range<usize>> {
        shard_ranges(self.model.layout().len, self.shards as usize)
    }

    /// Shard `s`'s core, holding its range of the initial weights, for a training set of
    /// `train_len` examples.
    #[must_use]
    pub fn shard_core(&self, s: usize, train_len: usize) -> SgdShard {
        let range = self.shard_ranges()[s].clone();
        let cfg = SgdShardConfig {
            id: ShardId(s as u32),
            rule: self.protocol.rule,
            modulation: self.protocol.modulation,
            max_staleness: self.protocol.max_staleness,
            schedule: self.schedule,
            gradients_per_epoch: self.steps_per_learner(train_len) / u64::from(self.epochs)
                * u64::from(self.learners),
        };
        let active: BTreeSet<LearnerId> = (0..self.learners).map(LearnerId).collect();
        SgdShard::new(cfg, self.model.init(self.seed)[range].to_vec(), active)
    }

    /// Gradient steps each learner takes over the run, for a training set of `train_len`.
    #[must_use]
    pub fn steps_per_learner(&self, train_len: usize) -> u64 {
        (train_len / self.learners as usize / self.batch_size) as u64 * u64::from(self.epochs)
    }

    /// Learner `l`'s loop core and minibatches over its partition of `train`.
    #[must_use]
    pub fn learner_parts(&self, l: usize, train: Arc<Dataset>) -> (LearnerCore, Minibatches) {
        let part = Partition::split(train.len(), self.learners as usize, self.seed).swap_remove(l);
        let stream = BatchStream::new(part, self.batch_size, self.seed, l as u64);
        let core =
            LearnerCore::new(LearnerId(l as u32), self.shards as usize, self.steps_per_learner(train.len()));
        (core, Minibatches::new(train, stream))
    }

    /// The scheduler's core for a training set of `train_len`.
    #[must_use]
    pub fn scheduler_core(&self, train_len: usize) -> SchedulerCore {
        let per_epoch = self.steps_per_learner(train_len) / u64::from(self.epochs)
            * self.batch_size as u64
            * u64::from(self.learners);
        SchedulerCore::new(self.learners, self.shards, per_epoch, u64::from(self.epochs))
    }

    /// μλ, the examples behind one hardsync update.
    #[must_use]
    pub fn global_batch(&self) -> usize {
        self.batch_size * self.learners as usize
    }
}

/// A cluster to run in this process: a scheduler, a staleness tracker, `shards` shard actors
/// and `learners` learner actors, each shard and learner on its own thread (actix `Arbiter`).
pub struct Cluster {
    spec: ClusterSpec,
    data: TrainingData,
    observer: Option<mpsc::UnboundedSender<RunEvent>>,
    /// One model per learner, on the device the learners compute on.
    models: Vec<Model<Device>>,
}

/// A started cluster; [`ClusterHandle::wait`] gives its report.
pub struct ClusterHandle {
    report: oneshot::Receiver<Result<RunReport, ActorError>>,
    arbiters: Vec<Arbiter>,
}

impl Cluster {
    /// A cluster for `spec` over `data`, validated.
    pub fn new(spec: ClusterSpec, data: TrainingData) -> Result<Self, ActorError> {
        spec.validate(&data)?;
        Self { spec, data, observer: None, models: Vec::new() }.on_device(&Device::Cpu(CpuBackend))
    }

    /// Compute the learners' gradients on `device` (the CPU unless this is called).
    pub fn on_device(mut self, device: &Device) -> Result<Self, ActorError> {
        self.models = (0..self.spec.learners)
            .map(|_| Model::new(device.clone(), self.spec.model.clone()))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Send progress and evaluations to `tx` while the run goes on.
    #[must_use]
    pub fn observe(mut self, tx: mpsc::UnboundedSender<RunEvent>) -> Self {
        self.observer = Some(tx);
        self
    }

    /// Start every actor. Must be called from inside an actix `System`.
    #[must_use]
    pub fn start(self) -> ClusterHandle {
        let Self { spec, data, observer, models } = self;
        let (tx, rx) = oneshot::channel();
        let mut arbiters = Vec::new();
        let tracker = StalenessTracker::default().start();
        let shards: Vec<Addr<ShardActor>> = (0..spec.shards as usize)
            .map(|s| {
                let (core, recipient) = (spec.shard_core(s, data.train.len()), tracker.clone().recipient());
                let arbiter = Arbiter::new();
                let addr = ShardActor::start_in_arbiter(&arbiter.handle(), move |_| {
                    ShardActor::new(core, recipient)
                });
                arbiters.push(arbiter);
                addr
            })
            .collect();
        let links: Vec<ShardLink> = shards
            .iter()
            .zip(spec.shard_ranges())
            .map(|(a, range)| ShardLink { range, pull: a.clone().recipient(), push: a.clone().recipient() })
            .collect();
        let train_len = data.train.len();
        let scheduler = SchedulerActor::create(|ctx| {
            let me = ctx.address();
            let link = SchedulerLink { progress: me.clone().recipient(), done: me.recipient() };
            let learners: Vec<Addr<LearnerActor>> = models
                .into_iter()
                .enumerate()
                .map(|(l, model)| {
                    let (core, batches) = spec.learner_parts(l, Arc::clone(&data.train));
                    let (links, link) = (links.clone(), link.clone());
                    let arbiter = Arbiter::new();
                    let addr = LearnerActor::start_in_arbiter(&arbiter.handle(), move |_| {
                        LearnerActor::new(core, model, batches, links, link)
                    });
                    arbiters.push(arbiter);
                    addr
                })
                .collect();
            let members = Members {
                shards: shards.iter().map(ShardHandle::local).collect(),
                learners: learners.iter().map(LearnerHandle::local).collect(),
                tracker,
            };
            SchedulerActor::new(
                spec.scheduler_core(train_len),
                members,
                &spec,
                train_len,
                (data.test, observer, tx),
            )
        });
        for s in 0..spec.shards {
            scheduler.do_send(Joined::Shard(ShardId(s)));
        }
        for l in 0..spec.learners {
            scheduler.do_send(Joined::Learner(LearnerId(l)));
        }
        ClusterHandle { report: rx, arbiters }
    }
}

impl ClusterHandle {
    /// Wait for the run to end; stops the cluster's threads.
    pub async fn wait(self) -> Result<RunReport, ActorError> {
        let result = self.report.await;
        for a in self.arbiters {
            a.stop();
        }
        result.unwrap_or_else(|_| Err(ActorError::Protocol("the scheduler stopped without a report".into())))
    }
}
