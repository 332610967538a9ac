//! The one place each role is started: the staleness tracker, a shard, a learner and the
//! scheduler, each from the run's spec and the handles of its peers. Fault wrappers, metrics
//! and checkpoints are attached here and nowhere else. Every deployment goes through these
//! calls: [`crate::Cluster`] with the addresses of actors in this process, a node of
//! `rudra-node --role …` with stand-ins for actors on other nodes, a service of your own with
//! whatever it has.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_compute::Dataset;
use rudra_proto::{ElasticWorker, LeaderGroups, LearnerCore, LearnerLoop};
use rudra_transport::{Clock, LearnerId, ShardId};
use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::Checkpoints;
use crate::faults::{FaultPlan, LearnerLinks, LinkPlan, Liveness, Lossy};
use crate::learner::{Behaviour, LearnerActor, LearnerParts};
use crate::links::{LearnerHandle, Members, SchedulerLink, ShardLink};
use crate::messages::{AnswerRoutes, Center, Crash, InjectedPanic, Records, Restart, Served, TrackerReport};
use crate::metrics::Metrics;
use crate::remote::codec::{Answer, Unexpected};
use crate::report::{RunEvent, RunReport, SchedulerState};
use crate::scheduler::{SchedulerActor, SchedulerParts, Summarise};
use crate::shard::ShardActor;
use crate::tracker::StalenessTracker;
use crate::{ActorError, ClusterSpec, Models, TrainingData};

/// Start the staleness tracker; it also counts every record into `metrics`, if given (a node
/// whose shards live elsewhere and report here), and credits each gradient of a group with
/// rounds of its own among `groups` to every member.
#[must_use]
pub fn start_tracker(metrics: Option<Arc<Metrics>>, groups: LeaderGroups) -> Addr<StalenessTracker> {
    StalenessTracker::new(metrics).with_groups(groups).start()
}

/// Start the staleness tracker of a run taken back by a restarted scheduler: it goes on from
/// `counts`.
#[must_use]
pub fn resume_tracker(metrics: Option<Arc<Metrics>>, counts: &TrackerReport) -> Addr<StalenessTracker> {
    StalenessTracker::new(metrics).resumed(counts).start()
}

/// Where a shard starts from.
#[derive(Clone, Debug)]
pub enum ShardStart {
    /// The run's initial parameters.
    Fresh,
    /// Its last checkpoint (a shard that restarted, or rejoins a running job).
    Resume,
}

/// Start shard `id` of `spec` on `arbiter`, reporting to `tracker`: from the initial parameters
/// of `models` or, with [`ShardStart::Resume`], from its checkpoint in `checkpoints` (then the
/// clock it resumed at is returned too). Its gradients and updates are counted in `metrics`, if
/// given, as they happen.
pub fn start_shard(
    (spec, models, train_len): (&ClusterSpec, &Models, usize),
    id: ShardId,
    tracker: Recipient<Records>,
    (metrics, checkpoints): (Option<&Arc<Metrics>>, Option<Checkpoints>),
    start: &ShardStart,
    arbiter: &ArbiterHandle,
) -> Result<(Addr<ShardActor>, Option<Clock>), ActorError> {
    let mut core = spec.shard_core(id.index(), train_len, models.init());
    let resumed = match start {
        ShardStart::Fresh => None,
        ShardStart::Resume => {
            let c = checkpoints.as_ref().ok_or_else(|| {
                crate::InvalidSetting::new(
                    "checkpoint.every_updates",
                    "is 0: this shard has no checkpoint to resume from",
                )
            })?;
            let state = c.read(id)?.ok_or_else(|| {
                let path = c.path(id);
                crate::InvalidSetting::new(
                    "--resume",
                    format!("{} does not exist: nothing to resume {id} from", path.display()),
                )
            })?;
            let clock = state.clock;
            core.restore(state)
                .map_err(|e| ActorError::Checkpoint { path: c.path(id), message: e.to_string() })?;
            tracing::info!(shard = %id, "resumed from {} at clock {clock}", c.path(id).display());
            Some(clock)
        }
    };
    let counters = metrics.map(|m| m.shard(id));
    let (weights, grace) = (spec.codecs.weights, spec.grace_window());
    let groups = LeaderGroups::of(spec.own_round_groups());
    let addr = ShardActor::start_in_arbiter(arbiter, move |_| {
        ShardActor::new(core, tracker, counters, checkpoints, weights).with_grace(grace).with_groups(groups)
    });
    Ok((addr, resumed))
}

/// Crash `shard` (telling `crashed` the clock it had), leave it down for `down`, then bring it
/// back from its checkpoint: the clock it resumed at, or why it could not. `None` when the
/// shard had already stopped.
pub async fn crash_and_restart(
    shard: &Addr<ShardActor>,
    down: Duration,
    crashed: impl FnOnce(Clock),
) -> Option<Result<Clock, ActorError>> {
    crashed(shard.send(Crash).await.ok()?);
    tokio::time::sleep(down).await;
    Some(shard.send(Restart).await.map_err(ActorError::from).and_then(|r| r))
}

/// `[[faults.panic]]`: make the actor at `to` panic `at` from now.
pub fn inject_panic(at: Duration, to: Recipient<InjectedPanic>) {
    actix::spawn(async move {
        tokio::time::sleep(at).await;
        to.do_send(InjectedPanic);
    });
}

/// A learner's peers: every shard in id order, and the scheduler.
pub struct LearnerPeers {
    /// The shards.
    pub shards: Vec<ShardLink>,
    /// The scheduler.
    pub scheduler: SchedulerLink,
}

/// How a learner is run: its liveness settings, the faults of the run (its own links, speed
/// and crash are taken from them) and when the run started for it.
#[derive(Clone, Debug)]
pub struct LearnerRun {
    /// Heartbeats and retries.
    pub liveness: Liveness,
    /// The run's faults.
    pub faults: FaultPlan,
    /// Fault times count from here.
    pub born: Instant,
    /// 0 when the run starts; more when the learner restarted and rejoins.
    pub incarnation: u32,
    /// Where the learner's connections count their bytes (none in one process).
    pub traffic: Option<Arc<rudra_transport::quic::Traffic>>,
}

/// A learner started by [`start_learner`], of its protocol family.
#[derive(Clone)]
pub enum StartedLearner {
    /// Rudra's SGD loop: the shards answer its pulls with weights.
    Sgd(Addr<LearnerActor<LearnerCore>>),
    /// The EASGD family's worker: the shards answer its exchanges with centers.
    Elastic(Addr<LearnerActor<ElasticWorker>>),
}

/// Where one shard's answers reach a learner, as its family takes them.
#[derive(Clone)]
pub enum AnswerRoute {
    /// Weights, answering pulls.
    Weights(Recipient<Served>),
    /// Centers, answering exchanges.
    Centers(Recipient<Center>),
}

impl AnswerRoute {
    /// Hand `answer` to the learner, if it is what its protocol family takes.
    pub fn deliver(&self, answer: Answer) -> Result<(), Unexpected> {
        match (answer, self) {
            (Answer::Weights { served, .. }, Self::Weights(to)) => to.do_send(served),
            (Answer::Center(c), Self::Centers(to)) => to.do_send(c),
            (other, _) => {
                return Err(Unexpected { what: format!("{other:?} answers nothing this learner asks") });
            }
        }
        Ok(())
    }
}

impl StartedLearner {
    /// How the scheduler starts and stops it.
    #[must_use]
    pub fn handle(&self) -> LearnerHandle {
        match self {
            Self::Sgd(a) => LearnerHandle::of(a),
            Self::Elastic(a) => LearnerHandle::of(a),
        }
    }

    /// Where `[[faults.panic]]` reaches it.
    #[must_use]
    pub fn panic(&self) -> Recipient<InjectedPanic> {
        match self {
            Self::Sgd(a) => a.clone().recipient(),
            Self::Elastic(a) => a.clone().recipient(),
        }
    }

    /// Whether it still runs.
    #[must_use]
    pub fn connected(&self) -> bool {
        match self {
            Self::Sgd(a) => a.connected(),
            Self::Elastic(a) => a.connected(),
        }
    }

    /// Where each shard's answers reach it, in shard order (through its faulty links).
    pub async fn answer_routes(&self) -> Result<Vec<AnswerRoute>, ActorError> {
        Ok(match self {
            Self::Sgd(a) => {
                a.send(AnswerRoutes::default()).await?.into_iter().map(AnswerRoute::Weights).collect()
            }
            Self::Elastic(a) => {
                a.send(AnswerRoutes::default()).await?.into_iter().map(AnswerRoute::Centers).collect()
            }
        })
    }
}

/// Start learner `id` of `spec` on `arbiter`: a model of `models`, its partition of `train`,
/// talking to `peers` through the faulty links `run.faults` gives it.
pub fn start_learner(
    (spec, models, train): (&ClusterSpec, &Models, Arc<Dataset>),
    id: LearnerId,
    peers: LearnerPeers,
    run: &LearnerRun,
    arbiter: &ArbiterHandle,
) -> Result<StartedLearner, ActorError> {
    let model = models.learner()?;
    let (core, batches) = spec.learner_loop(id.index(), train, models.init());
    let core = core.incarnation(run.incarnation);
    let LearnerLinks { heartbeat, shards: plans } = run.faults.learner_links(id, spec.shards);
    let LearnerPeers { shards, mut scheduler } = peers;
    let born = run.born;
    scheduler.heartbeat = Lossy::wrap(scheduler.heartbeat, heartbeat, born);
    let parts = LearnerParts {
        model,
        batches,
        shards,
        scheduler,
        liveness: run.liveness,
        slowdown: run.faults.slowdown(id),
        codecs: spec.codecs,
        exchanges_gradients: spec.exchanges_gradients(),
        traffic: run.traffic.clone(),
    };
    Ok(match core {
        LearnerLoop::Sgd(core) => StartedLearner::Sgd(spawn_learner(core, parts, (plans, born), arbiter)),
        LearnerLoop::Elastic(worker) => {
            StartedLearner::Elastic(spawn_learner(*worker, parts, (plans, born), arbiter))
        }
    })
}

/// Start a learner running `core` on `arbiter`, its pulls, pushes and answers passing through
/// the faulty links of `plans` (one `[pull, push, answer]` per shard), timed from `born`.
fn spawn_learner<B: Behaviour>(
    core: B,
    mut parts: LearnerParts,
    (plans, born): (Vec<[Option<LinkPlan>; 3]>, Instant),
    arbiter: &ArbiterHandle,
) -> Addr<LearnerActor<B>> {
    LearnerActor::start_in_arbiter(arbiter, move |ctx| {
        let mut answers = Vec::new();
        let shards = std::mem::take(&mut parts.shards);
        for (link, [pull, push, reply]) in shards.into_iter().zip(plans) {
            answers.push(Lossy::wrap(B::answers_to(&ctx.address()), reply, born));
            let (pull, push) = (Lossy::wrap(link.pull, pull, born), Lossy::wrap(link.push, push, born));
            parts.shards.push(ShardLink { pull, push, ..link });
        }
        LearnerActor::new(core, parts, answers)
    })
}

/// The scheduler's address before it runs, so that peers reporting to it (learners in this
/// process) can be started first.
pub struct SchedulerSlot(Context<SchedulerActor>);

impl Default for SchedulerSlot {
    fn default() -> Self {
        Self(Context::new())
    }
}

impl SchedulerSlot {
    /// Where a learner reports to this scheduler.
    #[must_use]
    pub fn link(&self) -> SchedulerLink {
        SchedulerLink::of(&self.0.address())
    }

    /// The scheduler's address.
    #[must_use]
    pub fn address(&self) -> Addr<SchedulerActor> {
        self.0.address()
    }
}

/// How the scheduler runs besides the spec: its observer and metrics, how long it waits for a
/// lost shard, and the liveness settings of its failure detector.
pub struct SchedulerRun {
    /// Who is told progress and evaluations.
    pub observer: Option<mpsc::UnboundedSender<RunEvent>>,
    /// Where learners alive and their samples are counted.
    pub metrics: Option<Arc<Metrics>>,
    /// Heartbeats and the failure timeout.
    pub liveness: Liveness,
    /// How long a lost shard may take to come back.
    pub shard_timeout: Duration,
    /// What an earlier scheduler of this run recorded, when this one takes the run back.
    pub resume: Option<SchedulerState>,
    /// The run's summary, given to the learners at the end (none: they are not given one).
    pub summarise: Option<Summarise>,
}

/// Start the scheduler of `spec` in `slot` (on the current arbiter), driving `members`,
/// evaluating on `data.test` with a model of `models`. The receiver gets the run's report.
pub fn start_scheduler(
    (spec, models, data): (&ClusterSpec, &Models, &TrainingData),
    members: Members,
    run: SchedulerRun,
    slot: SchedulerSlot,
) -> (Addr<SchedulerActor>, oneshot::Receiver<Result<RunReport, ActorError>>) {
    let train_len = data.train.len();
    let (report, rx) = oneshot::channel();
    let core = spec.scheduler_core(train_len).with_failure_timeout(run.liveness.failure_timeout);
    let parts = SchedulerParts {
        members,
        models: models.clone(),
        test: Arc::clone(&data.test),
        total_samples: spec.total_samples(train_len),
        learners: spec.learners,
        observer: run.observer,
        report,
        metrics: run.metrics,
        detector_tick: Some(run.liveness.heartbeat),
        shard_timeout: run.shard_timeout,
        summarise: run.summarise,
        planner: spec.batch_planner(train_len),
    };
    let scheduler = SchedulerActor::new(core, parts);
    let scheduler = match run.resume {
        Some(state) => scheduler.resumed(state),
        None => scheduler,
    };
    (slot.0.run(scheduler), rx)
}
