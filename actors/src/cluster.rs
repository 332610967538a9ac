//! Starting a whole cluster in one process.
//!
//! ```no_run
//! # use rudra_actors::{Cluster, ClusterSpec, Models, TrainingData};
//! # async fn run(spec: ClusterSpec, models: Models, data: TrainingData) -> Result<(), rudra_actors::ActorError> {
//! // inside an actix System:
//! let report = Cluster::new(spec, models, data)?.start()?.wait().await?;
//! println!("test accuracy {:.4}", report.final_test_accuracy);
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_proto::LeaderGroups;
use rudra_transport::{Clock, LearnerId, ShardId};
use tokio::sync::{mpsc, oneshot};

use crate::aggregator::Aggregator;
use crate::checkpoint::Checkpoints;
use crate::faults::{FaultPlan, Liveness, Node};
use crate::group_leader::GroupLeaderActor;
use crate::links::{Members, ShardHandle, ShardLink};
use crate::messages::{Joined, Membership, Note, ShardRestarted, StopLearner};
use crate::metrics::Metrics;
use crate::report::{RunEvent, RunReport};
use crate::roles::{
    LearnerPeers, LearnerRun, SchedulerRun, SchedulerSlot, ShardStart, StartedLearner, crash_and_restart,
    start_learner, start_scheduler, start_shard, start_tracker,
};
use crate::scheduler::SchedulerActor;
use crate::shard::ShardActor;
use crate::{ActorError, ClusterSpec, Models, TrainingData};

/// How long the scheduler of a cluster in one process waits for a crashed shard to come back.
const SHARD_TIMEOUT: Duration = Duration::from_secs(60);

/// A cluster to run in this process: a scheduler, a staleness tracker, `shards` shard actors
/// and `learners` learner actors, each shard and learner on its own thread (actix `Arbiter`).
pub struct Cluster {
    spec: ClusterSpec,
    models: Models,
    data: TrainingData,
    observer: Option<mpsc::UnboundedSender<RunEvent>>,
    metrics: Option<Arc<Metrics>>,
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
                        stop.do_send(StopLearner::default());
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

/// Each learner's links to the shards: the shards' own, or with learner groups its group's
/// aggregators' (one per group and shard, each group's on a thread of its own; with
/// hierarchical groups, the groups' rounds), which are returned too.
fn grouped(
    spec: &ClusterSpec,
    links: Vec<ShardLink>,
    shards: &[Addr<ShardActor>],
    on_own_thread: &mut impl FnMut() -> ArbiterHandle,
) -> (Vec<Vec<ShardLink>>, Vec<Recipient<Membership>>) {
    if spec.groups <= 1 {
        return (vec![links; spec.learners as usize], Vec::new());
    }
    let mut by_learner = vec![Vec::new(); spec.learners as usize];
    let mut aggregators = Vec::new();
    // Groups are for the SGD rules: rounds that wait for all are hardsync's.
    let hardsync = spec.protocol.waits_for_all();
    let encoding = spec.codecs.gradients;
    for members in spec.learner_groups() {
        let Some(&leader) = members.first() else { continue };
        let thread = on_own_thread();
        let group: Vec<ShardLink> = (links.iter().zip(shards))
            .map(|(link, shard)| {
                let (pull, push, membership) = if spec.hierarchical {
                    let (group, to) =
                        ((leader, members.clone(), spec.group_n), (link.push.clone(), link.pull.clone()));
                    let a = GroupLeaderActor::start_in_arbiter(&thread, move |_| {
                        GroupLeaderActor::new(group, to, encoding)
                    });
                    (a.clone().recipient(), a.clone().recipient(), a.recipient())
                } else {
                    let (group, to) =
                        ((members.clone(), hardsync), (shard.clone().recipient(), link.pull.clone()));
                    let a =
                        Aggregator::start_in_arbiter(&thread, move |_| Aggregator::new(group, to, encoding));
                    (a.clone().recipient(), a.clone().recipient(), a.recipient())
                };
                aggregators.push(membership);
                ShardLink { pull, push, ..link.clone() }
            })
            .collect();
        for l in members {
            by_learner[l.index()].clone_from(&group);
        }
    }
    (by_learner, aggregators)
}

/// A started cluster; [`ClusterHandle::wait`] gives its report.
pub struct ClusterHandle {
    report: oneshot::Receiver<Result<RunReport, ActorError>>,
    arbiters: Vec<Arbiter>,
}

impl Cluster {
    /// A cluster for `spec` training `models` on `data`, validated.
    pub fn new(spec: ClusterSpec, models: Models, data: TrainingData) -> Result<Self, ActorError> {
        spec.validate(&models, &data)?;
        Ok(Self {
            spec,
            models,
            data,
            observer: None,
            metrics: None,
            liveness: Liveness::default(),
            faults: FaultPlan::default(),
            checkpoints: None,
        })
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

    /// Start every actor, each shard and learner on a thread of its own. Must be called from
    /// inside an actix `System`; fails if a learner's model cannot be made.
    pub fn start(self) -> Result<ClusterHandle, ActorError> {
        let Self { spec, models, data, observer, metrics, liveness, faults, checkpoints } = self;
        let born = Instant::now();
        let mut arbiters = Vec::new();
        let mut on_own_thread = || {
            let arbiter = Arbiter::new();
            let handle = arbiter.handle();
            arbiters.push(arbiter);
            handle
        };
        let tracker = start_tracker(None, LeaderGroups::of(spec.own_round_groups()));
        let train_len = data.train.len();
        let shards = (0..spec.shards)
            .map(|s| {
                let stores = (metrics.as_ref(), checkpoints.clone());
                let (addr, _) = start_shard(
                    (&spec, &models, train_len),
                    ShardId(s),
                    tracker.clone().recipient(),
                    stores,
                    &ShardStart::Fresh,
                    &on_own_thread(),
                )?;
                Ok(addr)
            })
            .collect::<Result<Vec<Addr<ShardActor>>, ActorError>>()?;
        let links: Vec<ShardLink> = (shards.iter().zip(spec.shard_ranges(models.param_count())))
            .map(|(a, range)| ShardLink::of(range, a))
            .collect();
        let (links, aggregators) = grouped(&spec, links, &shards, &mut on_own_thread);
        let slot = SchedulerSlot::default();
        let run = LearnerRun { liveness, faults: faults.clone(), born, incarnation: 0, traffic: None };
        let learners = (0..spec.learners)
            .map(|l| {
                let peers = LearnerPeers { shards: links[l as usize].clone(), scheduler: slot.link() };
                let on = on_own_thread();
                start_learner((&spec, &models, Arc::clone(&data.train)), LearnerId(l), peers, &run, &on)
            })
            .collect::<Result<Vec<_>, ActorError>>()?;
        let members = Members {
            shards: shards.iter().map(ShardHandle::of).collect(),
            learners: learners.iter().map(StartedLearner::handle).collect(),
            stats: tracker.recipient(),
            aggregators,
        };
        let run = SchedulerRun {
            observer,
            metrics,
            liveness,
            shard_timeout: SHARD_TIMEOUT,
            resume: None,
            summarise: None,
        };
        let (scheduler, report) = start_scheduler((&spec, &models, &data), members, run, slot);
        for s in 0..spec.shards {
            scheduler.do_send(Joined::Shard(ShardId(s)));
        }
        for l in 0..spec.learners {
            scheduler.do_send(Joined::Learner(LearnerId(l)));
        }
        let stops: Vec<Recipient<StopLearner>> = learners.iter().map(|l| l.handle().stop).collect();
        inject(&faults, born, &scheduler, &stops, &shards);
        Ok(ClusterHandle { report, arbiters })
    }
}

impl ClusterHandle {
    /// Wait for the run to end; stops the cluster's threads.
    pub async fn wait(self) -> Result<RunReport, ActorError> {
        let result = self.report.await;
        for a in self.arbiters {
            a.stop();
        }
        result.unwrap_or(Err(ActorError::NoReport))
    }
}
