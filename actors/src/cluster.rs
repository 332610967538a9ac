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
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_compute::{BatchStream, CpuBackend, Dataset, Device, Minibatches, Model, ModelSpec, Partition};
use rudra_transport::{Clock, LearnerId, ShardId};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::ActorError;
use crate::checkpoint::Checkpoints;
use crate::faults::{FaultPlan, LearnerLinks, Liveness, Lossy, Node};
use crate::learner::{LearnerActor, LearnerLoop, SchedulerLink, ShardLink, StopLearner, shard_ranges};
use crate::metrics::Metrics;
use crate::protocol::elastic::{DownpourLearner, ElasticLearner, ElasticSettings};
use crate::protocol::shard::SgdShardConfig;
use crate::protocol::{
    CenterRule, CenterShard, ElasticWorker, LearnerCore, LocalRule, LrModulation, LrSchedule, SchedulerCore,
    SgdShard, StalenessSummary, SyncRule,
};
use crate::scheduler::{Joined, LearnerHandle, Members, Note, SchedulerActor, ShardHandle, ShardRestarted};
use crate::shard::{ShardActor, ShardCore, crash_and_restart};
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
    /// The EASGD family instead of Rudra's SGD shards: the shards hold the center variable
    /// and `rule`, `modulation` and `max_staleness` do not apply.
    pub elastic: Option<ElasticSpec>,
}

/// A method of the EASGD family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ElasticMethod {
    /// Elastic averaging SGD, with a barrier round per exchange (`sync`) or without.
    Easgd {
        /// Synchronous rounds.
        sync: bool,
    },
    /// Asynchronous EASGD with Nesterov momentum at the learners.
    Eamsgd,
    /// Local SGD whose accumulated update is added to the center every τ steps.
    Downpour,
    /// DOWNPOUR with τ = 1 and Nesterov momentum kept at the shards.
    MDownpour,
}

/// Settings of the EASGD family (Zhang, Choromanska, LeCun); the learning rate η is the schedule's base.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ElasticSpec {
    /// The method.
    pub method: ElasticMethod,
    /// Communication period τ in local steps.
    pub tau: u64,
    /// Moving rate α (learner side).
    pub alpha: f32,
    /// Center rate β (sync EASGD).
    pub beta: f32,
    /// Momentum δ (EAMSGD, MDOWNPOUR).
    pub momentum: f32,
    /// Decay γ of `η_t = η / (1 + γ t)^0.5` on each learner's own clock.
    pub lr_decay_gamma: f32,
}

impl ElasticSpec {
    /// The center shards' rule with learning rate `lr`.
    #[must_use]
    pub fn center_rule(&self, lr: f32) -> CenterRule {
        match self.method {
            ElasticMethod::Easgd { sync: true } => CenterRule::ElasticSync { beta: self.beta },
            ElasticMethod::Easgd { sync: false } | ElasticMethod::Eamsgd => {
                CenterRule::ElasticAsync { alpha: self.alpha }
            }
            ElasticMethod::Downpour => CenterRule::Downpour,
            ElasticMethod::MDownpour => CenterRule::MDownpour { momentum: self.momentum, lr },
        }
    }

    /// The learners' local rule with learning rate `lr` over `len` parameters.
    #[must_use]
    pub fn local_rule(&self, lr: f32, len: usize) -> LocalRule {
        let momentum = if self.method == ElasticMethod::Eamsgd { self.momentum } else { 0.0 };
        let settings = ElasticSettings {
            tau: self.tau,
            alpha: self.alpha,
            lr,
            lr_decay_gamma: self.lr_decay_gamma,
            momentum,
        };
        match self.method {
            ElasticMethod::Easgd { .. } | ElasticMethod::Eamsgd => {
                LocalRule::Elastic(ElasticLearner::new(settings, len))
            }
            ElasticMethod::Downpour => LocalRule::Downpour(DownpourLearner::new(self.tau, lr, len)),
            ElasticMethod::MDownpour => LocalRule::MDownpour,
        }
    }

    fn validate(&self) -> Result<(), ActorError> {
        // α and β above 1 are points of the stability analysis (`sync_easgd_is_stable`):
        // whether they converge is the run's question, not the configuration's.
        let positive = |key, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(spec_err(key, format!("is {v}; it must be positive")))
            }
        };
        if self.tau == 0 {
            return Err(spec_err("protocol.tau", "must be at least 1".into()));
        }
        if self.method == ElasticMethod::MDownpour && self.tau != 1 {
            return Err(spec_err(
                "protocol.tau",
                format!("is {}; MDOWNPOUR exchanges every step (τ = 1)", self.tau),
            ));
        }
        // β first: α defaults to β / λ.
        positive("protocol.beta", self.beta)?;
        positive("protocol.alpha", self.alpha)?;
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(spec_err("protocol.momentum", format!("is {}; it must be in [0, 1)", self.momentum)));
        }
        if !(self.lr_decay_gamma.is_finite() && self.lr_decay_gamma >= 0.0) {
            return Err(spec_err(
                "training.lr_decay_gamma",
                format!("is {}; it must be 0 or more", self.lr_decay_gamma),
            ));
        }
        Ok(())
    }
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
    /// Test-set evaluations per epoch (rows of `metrics.csv`).
    pub evals_per_epoch: u32,
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
    /// Examples processed so far by each learner, by learner id.
    pub learner_samples: Vec<u64>,
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
    /// Updates applied so far (by the shard that applied the most).
    pub updates: u64,
    /// ⟨σ⟩ of the gradients applied so far.
    pub mean_staleness: f64,
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
    /// Examples processed by each learner, by learner id.
    pub learner_samples: Vec<u64>,
    /// Seconds from start to the final evaluation.
    pub wall_seconds: f64,
    /// Test accuracy at the end.
    pub final_test_accuracy: f64,
    /// Mean training loss over the last evaluation window.
    pub final_train_loss: f64,
    /// What happened to the cluster's membership, and the faults injected, in order.
    pub timeline: Vec<TimelineEntry>,
    /// Updates shards made and lost when they crashed: the clock at the crash minus the
    /// clock of the checkpoint they restarted from (summed over shards). Each is at most the
    /// checkpoint interval.
    pub updates_lost: u64,
}

/// One event of a run's timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimelineEntry {
    /// Seconds since the scheduler started.
    pub seconds: f64,
    /// `injected` (a fault the plan caused), `detected` (what the cluster noticed) or
    /// `recovered` (a shard back from its checkpoint).
    pub kind: &'static str,
    /// What happened, e.g. `learner-2 lost`.
    pub what: String,
}

fn spec_err(key: &'static str, message: String) -> ActorError {
    ActorError::Spec { key, message }
}

impl ClusterSpec {
    /// Check the spec against itself and the data. This is the one place settings are
    /// validated; errors name the configuration key.
    pub fn validate(&self, data: &TrainingData) -> Result<(), ActorError> {
        self.validate_settings(self.model.layout().len)?;
        let share = data.train.len() / self.learners as usize;
        if self.batch_size > share {
            return Err(spec_err(
                "training.batch_size",
                format!("is {}, larger than each learner's {share} training examples", self.batch_size),
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

    /// The checks of [`Self::validate`] that need no data, for a parameter vector of `params`
    /// values (the model's, or another objective's).
    pub fn validate_settings(&self, params: usize) -> Result<(), ActorError> {
        if self.learners == 0 {
            return Err(spec_err("cluster.learners", "must be at least 1".into()));
        }
        if self.shards == 0 || self.shards as usize > params {
            return Err(spec_err("cluster.shards", format!("must be between 1 and the {params} parameters")));
        }
        if let Some(e) = &self.protocol.elastic {
            e.validate()?;
        } else if let SyncRule::Softsync { n } = self.protocol.rule
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
        if self.epochs == 0 {
            return Err(spec_err("training.epochs", "must be at least 1".into()));
        }
        if self.evals_per_epoch == 0 {
            return Err(spec_err("training.evals_per_epoch", "must be at least 1".into()));
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
        SgdShard::new(cfg, self.model.init(self.seed)[range].to_vec(), self.active_learners())
    }

    /// Shard `s`'s core for this protocol: [`Self::shard_core`], or a center shard for the
    /// EASGD family.
    #[must_use]
    pub fn shard_actor_core(&self, s: usize, train_len: usize) -> ShardCore {
        match &self.protocol.elastic {
            None => ShardCore::Sgd(self.shard_core(s, train_len)),
            Some(e) => {
                let range = self.shard_ranges()[s].clone();
                ShardCore::Center(CenterShard::new(
                    ShardId(s as u32),
                    e.center_rule(self.schedule.base),
                    self.model.init(self.seed)[range].to_vec(),
                    self.active_learners(),
                ))
            }
        }
    }

    fn active_learners(&self) -> BTreeSet<LearnerId> {
        (0..self.learners).map(LearnerId).collect()
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

    /// Learner `l`'s loop for this protocol and its minibatches (see [`Self::learner_parts`]).
    #[must_use]
    pub fn learner_loop(&self, l: usize, train: Arc<Dataset>) -> (LearnerLoop, Minibatches) {
        let steps = self.steps_per_learner(train.len());
        let (core, batches) = self.learner_parts(l, train);
        let Some(e) = &self.protocol.elastic else { return (LearnerLoop::Sgd(core), batches) };
        let len = self.model.layout().len;
        let worker = ElasticWorker::new(
            core.id(),
            e.local_rule(self.schedule.base, len),
            self.model.init(self.seed),
            self.shard_ranges(),
            steps,
        );
        (LearnerLoop::Elastic(worker), batches)
    }

    /// The scheduler's core for a training set of `train_len`.
    #[must_use]
    pub fn scheduler_core(&self, train_len: usize) -> SchedulerCore {
        let per_epoch = self.steps_per_learner(train_len) / u64::from(self.epochs)
            * self.batch_size as u64
            * u64::from(self.learners);
        SchedulerCore::new(self.learners, self.shards, per_epoch, u64::from(self.epochs))
            .with_evals_per_epoch(u64::from(self.evals_per_epoch))
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
    metrics: Option<Arc<Metrics>>,
    /// One model per learner, on the device the learners compute on.
    models: Vec<Model<Device>>,
    liveness: Liveness,
    faults: FaultPlan,
    checkpoints: Option<Checkpoints>,
}

/// Carry out the timed parts of `plan`: learners and shards that crash (shards come back
/// from their checkpoints), and timeline notes of the windows in which links are faulty or
/// nodes cut off.
fn inject(
    plan: &FaultPlan,
    born: Instant,
    scheduler: &Addr<SchedulerActor>,
    learners: &[Recipient<StopLearner>],
    shards: &[Addr<ShardActor>],
) {
    let note = |when: Duration, what: String| {
        let scheduler = scheduler.clone();
        actix::spawn(async move {
            tokio::time::sleep_until((born + when).into()).await;
            scheduler.do_send(Note(what));
        });
    };
    for p in &plan.partitions {
        note(p.window.from, format!("{} cut off", p.nodes));
        if let Some(until) = p.window.until {
            note(until, format!("{} healed", p.nodes));
        }
    }
    for r in &plan.links {
        let f = &r.faults;
        let what = format!(
            "link faults {} ↔ {}: drop {}, duplicate {}, reorder {}, delay {:?} ± {:?}",
            r.a, r.b, f.drop, f.duplicate, f.reorder, f.delay, f.jitter
        );
        note(r.window.from, what);
    }
    for &c in &plan.crashes {
        match c.node {
            Node::Learner(l) => {
                let (stop, scheduler) = (learners.get(l.index()).cloned(), scheduler.clone());
                actix::spawn(async move {
                    tokio::time::sleep_until((born + c.at).into()).await;
                    if let Some(stop) = stop {
                        stop.do_send(StopLearner);
                    }
                    scheduler.do_send(Note(format!("{l} crashed")));
                });
            }
            Node::Shard(s) => {
                let (Some(shard), scheduler) = (shards.get(s.index()).cloned(), scheduler.clone()) else {
                    continue;
                };
                actix::spawn(async move {
                    tokio::time::sleep_until((born + c.at).into()).await;
                    let mut crashed_at = Clock(0);
                    let down = c.restart_after.unwrap_or_default();
                    let resumed = crash_and_restart(&shard, down, |clock| {
                        crashed_at = clock;
                        scheduler.do_send(Note(format!("{s} crashed at clock {clock}")));
                    });
                    let Some(resumed) = resumed.await else { return };
                    let resumed = resumed.map_err(|e| e.to_string());
                    scheduler.do_send(ShardRestarted { shard: s, crashed_at, resumed });
                });
            }
            Node::Scheduler => {}
        }
    }
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
        Self {
            spec,
            data,
            observer: None,
            metrics: None,
            models: Vec::new(),
            liveness: Liveness::default(),
            faults: FaultPlan::default(),
            checkpoints: None,
        }
        .on_device(&Device::Cpu(CpuBackend))
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

    /// Record the run's live metrics in `metrics`: the shards count every gradient and update,
    /// the scheduler the learners alive and their samples.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Heartbeats, retries and the failure timeout (see [`Liveness`]).
    #[must_use]
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = liveness;
        self
    }

    /// Each shard writes checkpoints as `checkpoints` says (none unless this is called); a
    /// shard that crashes comes back from its last one.
    #[must_use]
    pub fn with_checkpoints(mut self, checkpoints: Option<Checkpoints>) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// Inject the faults of `plan` into the run (see [`FaultPlan`]).
    #[must_use]
    pub fn with_faults(mut self, plan: FaultPlan) -> Self {
        self.faults = plan;
        self
    }

    /// Start every actor. Must be called from inside an actix `System`.
    #[must_use]
    pub fn start(self) -> ClusterHandle {
        let Self { spec, data, observer, metrics, models, liveness, faults, checkpoints } = self;
        let born = Instant::now();
        let (tx, rx) = oneshot::channel();
        let mut arbiters = Vec::new();
        let tracker = StalenessTracker::default().start();
        let shards: Vec<Addr<ShardActor>> = (0..spec.shards as usize)
            .map(|s| {
                let (core, recipient) =
                    (spec.shard_actor_core(s, data.train.len()), tracker.clone().recipient());
                let counters = metrics.as_ref().map(|m| m.shard(ShardId(s as u32)));
                let (arbiter, checkpoints) = (Arbiter::new(), checkpoints.clone());
                let addr = ShardActor::start_in_arbiter(&arbiter.handle(), move |_| {
                    ShardActor::new(core, recipient).with_metrics(counters).with_checkpoints(checkpoints)
                });
                arbiters.push(arbiter);
                addr
            })
            .collect();
        let links: Vec<ShardLink> =
            shards.iter().zip(spec.shard_ranges()).map(|(a, range)| ShardLink::local(range, a)).collect();
        let train_len = data.train.len();
        let mut learner_stops: Vec<Recipient<StopLearner>> = Vec::new();
        let scheduler = SchedulerActor::create(|ctx| {
            let me = ctx.address();
            let link = SchedulerLink::of(&me);
            let learners: Vec<Addr<LearnerActor>> = models
                .into_iter()
                .enumerate()
                .map(|(l, model)| {
                    let (core, batches) = spec.learner_loop(l, Arc::clone(&data.train));
                    let id = LearnerId(l as u32);
                    let mut link = link.clone();
                    let LearnerLinks { heartbeat, shards: plans } = faults.learner_links(id, spec.shards);
                    link.heartbeat = Lossy::wrap(link.heartbeat, heartbeat, born);
                    let (links, slowdown) = (links.clone(), faults.slowdown(id));
                    let arbiter = Arbiter::new();
                    let addr = LearnerActor::start_in_arbiter(&arbiter.handle(), move |ctx| {
                        let links = (links.into_iter().zip(plans))
                            .map(|(sl, [pull, push, reply])| {
                                let (p, q) = (sl.pull.clone(), sl.push.clone());
                                let answers = ctx.address().recipient();
                                sl.faulty(
                                    Lossy::wrap(p, pull, born),
                                    Lossy::wrap(q, push, born),
                                    Lossy::wrap(answers, reply, born),
                                )
                            })
                            .collect();
                        LearnerActor::new(core, model, batches, links, link)
                            .with_liveness(liveness)
                            .with_slowdown(slowdown)
                    });
                    arbiters.push(arbiter);
                    addr
                })
                .collect();
            learner_stops = learners.iter().map(|a| a.clone().recipient()).collect();
            let members = Members {
                shards: shards.iter().map(ShardHandle::local).collect(),
                learners: learners.iter().map(LearnerHandle::local).collect(),
                tracker,
            };
            SchedulerActor::new(
                spec.scheduler_core(train_len).with_failure_timeout(liveness.failure_timeout),
                members,
                &spec,
                train_len,
                (data.test, observer, tx),
            )
            .with_metrics(metrics)
            .with_failure_detector(liveness.heartbeat)
        });
        for s in 0..spec.shards {
            scheduler.do_send(Joined::Shard(ShardId(s)));
        }
        for l in 0..spec.learners {
            scheduler.do_send(Joined::Learner(LearnerId(l)));
        }
        inject(&faults, born, &scheduler, &learner_stops, &shards);
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
