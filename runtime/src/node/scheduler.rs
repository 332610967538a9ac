//! The scheduler's process: wait for the job's shards and learners, welcome them, drive the run
//! with the scheduler role over stand-ins for them, take back nodes that restart or reconnect,
//! and stop everyone at the end.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rudra_actors::links::{LearnerHandle, Members, ShardHandle};
use rudra_actors::messages::{Disconnected, Joined, TrackerReport};
use rudra_actors::remote::{RemoteAggregator, RemoteLearner, RemoteShard};
use rudra_actors::roles::{SchedulerRun, SchedulerSlot, resume_tracker, start_scheduler, start_tracker};
use rudra_actors::{Models, RunReport, SchedulerState, TrainingData};
use rudra_compute::{CpuBackend, Device};
use rudra_proto::LeaderGroups;
use rudra_transport::quic::{Goodbye, QuicEndpoint};
use rudra_transport::{LearnerId, Role, ShardId};
use tokio::sync::mpsc;

use super::enrol::Registrar;
use super::failover::{self, JobState, regather};
use super::join::{Gathered, Invitation, Joiner, gather};
use super::roster::{Roster, Seat, accept_rejoins, send_heartbeats, watch_aggregator};
use super::{HANG_UP, NodeOptions, endpoint, hang_up, net};
use crate::exporter::{MetricsEndpoint, Serving};
use crate::local::{ProgressMode, show_progress};
use crate::summary::Summary;
use crate::{Config, RuntimeError};

/// Run the scheduler of `config`: wait for the nodes, drive the run, stop everyone. The
/// assembled parameters are evaluated with `models` (the configured network when `None`).
pub fn run_scheduler(
    config: &Config,
    (data, models): (TrainingData, Option<Models>),
    opts: &NodeOptions,
    progress: ProgressMode,
) -> Result<RunReport, RuntimeError> {
    config.refuse_kills()?;
    let config = config.clone();
    let opts = opts.clone();
    let models = models.unwrap_or_else(|| config.models(Device::Cpu(CpuBackend)));
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Scheduler).await?;
        let serving = serve_metrics(exporter, &ep)?;
        let metrics = serving.as_ref().map(|s| Arc::clone(s.metrics()));
        if let Some(registrar) = Registrar::open(&opts, ep.identity())? {
            registrar.serve(ep.local_addr()?)?;
        }
        set_ready(serving.as_ref());
        tracing::info!(
            "scheduler listening on {}; waiting for {} shards and {} learners",
            ep.local_addr()?,
            config.cluster.shards,
            config.cluster.learners
        );
        let result = drive(&ep, &config, (data, models), &opts, (metrics, progress)).await;
        match &result {
            // Every node is told why the run stopped; they exit with that reason. A lost node
            // never answers the goodbye: the wait for the others is that of the failure detector.
            Err(e) => {
                ep.say_goodbye(Goodbye::RunFailed, &e.to_string());
                let _ = tokio::time::timeout(config.liveness.failure_timeout, ep.wait_idle()).await;
            }
            Ok(_) => hang_up(&ep).await,
        }
        result
    })
}

/// How a run starts: the job, its nodes by id (a learner not back after a restart is `None`),
/// the learners lost already (failed before the start, or not back), and what the scheduler
/// and tracker go on from when it takes the job back.
struct Opening {
    invitation: Invitation,
    shards: Vec<Joiner>,
    learners: Vec<Option<Joiner>>,
    aggregators: Vec<Joiner>,
    lost: Vec<LearnerId>,
    resume: Option<(SchedulerState, TrackerReport)>,
}

/// A new job: wait for its nodes, welcome them, wait until every learner is ready.
async fn open_job(
    ep: &QuicEndpoint,
    config: &Config,
    data: &TrainingData,
    within: Duration,
) -> Result<Opening, RuntimeError> {
    let Gathered { shards, mut learners, aggregators } = gather(ep, config, within).await?;
    let names = |nodes: &[Joiner]| nodes.iter().map(|j| j.peer.name().to_owned()).collect();
    let addrs = |nodes: &[Joiner]| nodes.iter().map(|j| j.data_addr.clone()).collect();
    let invitation = Invitation {
        config_toml: config.to_toml().to_owned(),
        train_examples: data.train.len() as u64,
        shard_addrs: addrs(&shards),
        shard_names: names(&shards),
        learner_names: names(&learners),
        job: rudra_actors::checkpoint::new_job_id(),
        groups: if aggregators.is_empty() { Vec::new() } else { config.cluster.learner_groups() },
        hierarchical: config.cluster.hierarchical,
        aggregator_addrs: addrs(&aggregators),
        aggregator_names: names(&aggregators),
    };
    for (role, nodes) in
        [(Role::Shard, &shards), (Role::Aggregator, &aggregators), (Role::Learner, &learners)]
    {
        for (id, j) in nodes.iter().enumerate() {
            j.peer.send(&invitation.welcome((role, id), 0)).await?;
        }
    }
    let servers: Vec<&Joiner> = shards.iter().chain(&aggregators).collect();
    let lost = await_ready(&servers, &mut learners, within).await?;
    let learners = learners.into_iter().map(Some).collect();
    Ok(Opening { invitation, shards, learners, aggregators, lost, resume: None })
}

/// The job in run directory `dir`, taken back by a restarted scheduler: wait for its nodes to
/// join again and welcome them back.
async fn reopen_job(ep: &QuicEndpoint, dir: &Path, within: Duration) -> Result<Opening, RuntimeError> {
    let JobState { invitation, scheduler: state, tracker: counts } = JobState::read(dir)?;
    if !invitation.groups.is_empty() {
        return Err(net(
            "this job's learner groups ran on aggregators, whose rounds a restarted scheduler cannot take back; \
             start the job again (its shards from their checkpoints)",
        ));
    }
    tracing::info!(job = invitation.job, "taking the job back; waiting for its nodes");
    let mut back = regather(ep, &invitation, &state.core.running(), within).await?;
    for (id, j) in back.shards.iter().enumerate() {
        j.peer.send(&invitation.welcome((Role::Shard, id), 1)).await?;
    }
    for (l, j) in &back.learners {
        j.peer.send(&invitation.welcome((Role::Learner, l.index()), 1)).await?;
    }
    let ids = (0..invitation.learner_names.len()).map(|l| LearnerId(l as u32));
    let lost = ids.clone().filter(|l| !back.learners.contains_key(l)).collect();
    let learners = ids.map(|l| back.learners.remove(&l)).collect();
    let (shards, aggregators) = (back.shards, Vec::new());
    Ok(Opening { invitation, shards, learners, aggregators, lost, resume: Some((state, counts)) })
}

/// The run, once the scheduler listens: gather the nodes (or take the job back), start, drive,
/// stop everyone.
async fn drive(
    ep: &QuicEndpoint,
    config: &Config,
    (data, models): (TrainingData, Models),
    opts: &NodeOptions,
    (metrics, progress): (Option<Arc<rudra_actors::metrics::Metrics>>, ProgressMode),
) -> Result<RunReport, RuntimeError> {
    let Opening { invitation, shards, learners, aggregators, lost, resume } = match &opts.resume {
        Some(dir) => reopen_job(ep, dir, opts.connect_timeout).await?,
        None => open_job(ep, config, &data, opts.connect_timeout).await?,
    };
    let tracker = match &resume {
        Some((_, counts)) => resume_tracker(metrics.clone(), counts),
        None => start_tracker(metrics.clone(), LeaderGroups::of(config.cluster.own_round_groups())),
    };
    let shard_peers: Vec<Addr<RemoteShard>> = (shards.iter().enumerate())
        .map(|(s, j)| RemoteShard::new(ShardId(s as u32), j.peer.clone()).start())
        .collect();
    let learner_peers: Vec<Addr<RemoteLearner>> = (learners.iter().enumerate())
        .map(|(l, j)| {
            let l = LearnerId(l as u32);
            j.as_ref().map_or_else(|| RemoteLearner::unbound(l), |j| RemoteLearner::new(l, j.peer.clone()))
        })
        .map(Actor::start)
        .collect();
    let members = Members {
        shards: shard_peers.iter().map(ShardHandle::of).collect(),
        learners: learner_peers.iter().map(LearnerHandle::of).collect(),
        stats: tracker.clone().recipient(),
        aggregators: (aggregators.iter())
            .map(|j| RemoteAggregator::new(j.peer.clone()).start().recipient())
            .collect(),
    };
    let (obs_tx, obs_rx) = mpsc::unbounded_channel();
    let resumed = resume.is_some();
    let run = SchedulerRun {
        observer: Some(obs_tx),
        metrics,
        liveness: config.liveness,
        shard_timeout: opts.connect_timeout,
        resume: resume.map(|(state, _)| state),
        summarise: Some(summarise(config)),
    };
    let (scheduler, report) =
        start_scheduler((&config.cluster, &models, &data), members, run, SchedulerSlot::default());
    actix::spawn(show_progress(obs_rx, progress));
    let first = u32::from(resumed);
    let roster = Arc::new(Roster {
        invitation: invitation.clone(),
        shards: shard_peers.into_iter().map(|r| Seat::new(r, first)).collect(),
        learners: learner_peers.into_iter().map(|r| Seat::new(r, first)).collect(),
        aggregators: aggregators.iter().map(|j| j.peer.clone()).collect(),
        tracker: tracker.clone(),
        scheduler: scheduler.clone(),
        failure_timeout: config.liveness.failure_timeout,
    });
    // A node that comes back to a resumed run is heard from as it takes its seat; a new one
    // joins.
    for (s, j) in shards.into_iter().enumerate() {
        let s = ShardId(s as u32);
        roster.seat(s, j);
        if !resumed {
            scheduler.do_send(Joined::Shard(s));
        }
    }
    for (l, j) in learners.into_iter().enumerate() {
        let l = LearnerId(l as u32);
        if let Some(j) = j {
            roster.seat(l, j);
            if !resumed {
                scheduler.do_send(Joined::Learner(l));
            }
        }
    }
    for (g, j) in aggregators.into_iter().enumerate() {
        actix::spawn(watch_aggregator(g, j, Arc::clone(&roster)));
    }
    // A learner that failed before the start (or is not back after a restart) is lost at
    // once; it may join again.
    for l in lost {
        scheduler.do_send(Disconnected(l));
    }
    actix::spawn(accept_rejoins(ep.clone(), Arc::clone(&roster)));
    actix::spawn(send_heartbeats(Arc::clone(&roster), config.liveness.heartbeat));
    if let Some(dir) = &opts.run_dir {
        let dir = crate::RunDir::create(Some(dir), config.protocol_name())?;
        actix::spawn(failover::keep_state(dir, invitation, scheduler.clone(), tracker));
    }
    let report = report.await.map_err(|_| net("the scheduler stopped without a report"))??;
    // The aggregators are told to stop as the scheduler told the shards and learners.
    for p in &roster.aggregators {
        let _ = p.send(&rudra_transport::Msg::Stop).await;
    }
    // Every node was told to stop; give them a moment to hang up first.
    let _ = tokio::time::timeout(HANG_UP, async {
        for p in roster.peers() {
            p.closed().await;
        }
    })
    .await;
    Ok(report)
}

/// The run's `summary.json` of its report, for the learners (an embedded learner hands it back
/// to its program).
fn summarise(config: &Config) -> rudra_actors::scheduler::Summarise {
    let config = config.clone();
    Box::new(move |report| serde_json::to_string(&Summary::new(&config, report)).ok().map(Arc::from))
}

/// Wait until every learner is ready. A learner that fails first (its data, its device) says
/// why: the run starts without it, and it may rejoin; the learners that left are returned. A
/// shard (or an aggregator) that fails or is lost meanwhile stops the run at once.
async fn await_ready(
    shards: &[&Joiner],
    learners: &mut [Joiner],
    within: Duration,
) -> Result<Vec<LearnerId>, RuntimeError> {
    let (gone_tx, mut gone) = mpsc::channel(shards.len().max(1));
    for j in shards {
        let (peer, gone_tx) = (j.peer.clone(), gone_tx.clone());
        actix::spawn(async move {
            let ended = peer.ended().await;
            let _ = gone_tx.send((peer.name().to_owned(), ended)).await;
        });
    }
    // Every learner is waited for at once: one that fails is named as it leaves, whatever the
    // others are doing.
    let deadline = tokio::time::Instant::now() + within;
    let mut waiting: Vec<usize> = (0..learners.len()).collect();
    let mut failed = Vec::new();
    while !waiting.is_empty() {
        let next = std::future::poll_fn(|cx| {
            for (i, &l) in waiting.iter().enumerate() {
                if let std::task::Poll::Ready(message) = learners[l].rx.poll_recv(cx) {
                    return std::task::Poll::Ready((i, message));
                }
            }
            std::task::Poll::Pending
        });
        let (i, message) = tokio::select! {
            next = tokio::time::timeout_at(deadline, next) => match next {
                Ok(next) => next,
                Err(_) => {
                    let slow = learners[waiting[0]].peer.name();
                    return Err(net(format!("{slow} was not ready within {within:?}")));
                }
            },
            Some((shard, ended)) = gone.recv() => {
                tracing::error!(peer = shard, "left before the start: {ended}");
                return Err(net(format!("{shard} failed before the start: {ended}")));
            }
        };
        let l = waiting.remove(i);
        let j = &learners[l];
        match message {
            Some(rudra_transport::Inbound::Control(rudra_transport::Msg::Ready)) => {}
            Some(other) => {
                return Err(net(format!("{} sent {:?} before ready", j.peer.name(), other.kind())));
            }
            None => {
                tracing::error!(peer = j.peer.name(), "left before the start: {}", j.peer.ended().await);
                failed.push(LearnerId(l as u32));
            }
        }
    }
    if failed.len() == learners.len() {
        return Err(net("every learner left before the start"));
    }
    Ok(failed)
}

/// Start serving `exporter`, if any, with the traffic of `ep` among its metrics.
pub(super) fn serve_metrics(
    exporter: Option<MetricsEndpoint>,
    ep: &QuicEndpoint,
) -> Result<Option<Serving>, RuntimeError> {
    let serving = exporter.map(MetricsEndpoint::start).transpose()?;
    if let Some(s) = &serving {
        s.metrics().watch_traffic(ep.traffic());
    }
    Ok(serving)
}

/// Say on `/readyz`, if served, that the node has joined and serves its peers.
pub(super) fn set_ready(serving: Option<&Serving>) {
    if let Some(s) = serving {
        s.set_ready(true);
    }
}
