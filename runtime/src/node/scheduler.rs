//! The scheduler's process: wait for the job's shards and learners, welcome them, drive the run
//! with the scheduler role over stand-ins for them, take back nodes that restart or reconnect,
//! and stop everyone at the end.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use rudra_actors::links::{LearnerHandle, Members, ShardHandle};
use rudra_actors::messages::{
    Disconnected, Heartbeat, IsAlive, Joined, ShardAlive, ShardFailed, ShardLost, ShardRestarted,
    TrackerReport,
};
use rudra_actors::remote::codec::{self, FromLearner, FromShard};
use rudra_actors::remote::{
    EvaluatedReply, OnRefused, Rebind, RemoteLearner, RemoteShard, SnapshotReply, drive_link,
};
use rudra_actors::roles::{SchedulerRun, SchedulerSlot, resume_tracker, start_scheduler, start_tracker};
use rudra_actors::scheduler::SchedulerActor;
use rudra_actors::tracker::StalenessTracker;
use rudra_actors::{Models, RunReport, SchedulerState, TrainingData};
use rudra_compute::{CpuBackend, Device};
use rudra_proto::LeaderGroups;
use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint};
use rudra_transport::{Clock, LearnerId, Role, ShardId};
use tokio::sync::mpsc;

use super::enrol::Registrar;
use super::failover::{self, JobState, regather};
use super::join::{Invitation, Joiner, gather, read_join};
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
    config.refuse_groups()?;
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
    let (shards, mut learners) = gather(ep, config, within).await?;
    let invitation = Invitation {
        config_toml: config.to_toml().to_owned(),
        train_examples: data.train.len() as u64,
        shard_addrs: shards.iter().map(|j| j.data_addr.clone()).collect(),
        shard_names: shards.iter().map(|j| j.peer.name().to_owned()).collect(),
        learner_names: learners.iter().map(|j| j.peer.name().to_owned()).collect(),
        job: rudra_actors::checkpoint::new_job_id(),
    };
    for nodes in [&shards, &learners] {
        for (id, j) in nodes.iter().enumerate() {
            j.peer.send(&invitation.welcome(id, 0)).await?;
        }
    }
    let lost = await_ready(&shards, &mut learners, within).await?;
    Ok(Opening { invitation, shards, learners: learners.into_iter().map(Some).collect(), lost, resume: None })
}

/// The job in run directory `dir`, taken back by a restarted scheduler: wait for its nodes to
/// join again and welcome them back.
async fn reopen_job(ep: &QuicEndpoint, dir: &Path, within: Duration) -> Result<Opening, RuntimeError> {
    let JobState { invitation, scheduler: state, tracker: counts } = JobState::read(dir)?;
    tracing::info!(job = invitation.job, "taking the job back; waiting for its nodes");
    let mut back = regather(ep, &invitation, &state.core.running(), within).await?;
    for (id, j) in back.shards.iter().enumerate() {
        j.peer.send(&invitation.welcome(id, 1)).await?;
    }
    for (l, j) in &back.learners {
        j.peer.send(&invitation.welcome(l.index(), 1)).await?;
    }
    let ids = (0..invitation.learner_names.len()).map(|l| LearnerId(l as u32));
    let lost = ids.clone().filter(|l| !back.learners.contains_key(l)).collect();
    let learners = ids.map(|l| back.learners.remove(&l)).collect();
    Ok(Opening { invitation, shards: back.shards, learners, lost, resume: Some((state, counts)) })
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
    let Opening { invitation, shards, learners, lost, resume } = match &opts.resume {
        Some(dir) => reopen_job(ep, dir, opts.connect_timeout).await?,
        None => open_job(ep, config, &data, opts.connect_timeout).await?,
    };
    let tracker = match &resume {
        Some((_, counts)) => resume_tracker(metrics.clone(), counts),
        None => start_tracker(metrics.clone(), LeaderGroups::default()),
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
        aggregators: Vec::new(),
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
/// shard that fails or is lost meanwhile stops the run at once.
async fn await_ready(
    shards: &[Joiner],
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

/// One node's place in the running job: its stand-in (which outlives any one connection), its
/// current connection and how many times it joined.
struct Seat<R: Actor> {
    remote: Addr<R>,
    /// The incarnation of its first connection (1 in a job a restarted scheduler took back).
    first: u32,
    current: std::sync::Mutex<Option<(Peer, u32)>>,
    /// A shard's last clock reported (what it had when it was lost).
    clock: AtomicU64,
}

impl<R: Actor> Seat<R> {
    fn new(remote: Addr<R>, first: u32) -> Self {
        Self { remote, first, current: std::sync::Mutex::new(None), clock: AtomicU64::new(0) }
    }

    /// Whether the node's current connection is open.
    fn connected(&self) -> bool {
        self.current().as_ref().is_some_and(|(p, _)| !p.is_closed())
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<(Peer, u32)>> {
        self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `peer` as this node's connection; returns its incarnation (`first` for the first).
    /// An earlier connection is closed.
    fn take(&self, peer: &Peer) -> u32 {
        let mut current = self.current();
        let incarnation = current.as_ref().map_or(self.first, |(old, n)| {
            old.close("replaced by a new connection of the same node");
            n + 1
        });
        *current = Some((peer.clone(), incarnation));
        incarnation
    }

    /// Whether `incarnation` is still this node's current connection.
    fn is_current(&self, incarnation: u32) -> bool {
        self.current().as_ref().is_some_and(|(_, n)| *n == incarnation)
    }
}

/// The nodes of the running job, so that one that restarts or reconnects takes its seat again.
struct Roster {
    invitation: Invitation,
    shards: Vec<Seat<RemoteShard>>,
    learners: Vec<Seat<RemoteLearner>>,
    tracker: Addr<StalenessTracker>,
    scheduler: Addr<SchedulerActor>,
    /// How long a rejoin waits for the scheduler's word on the node it would replace.
    failure_timeout: Duration,
}

/// Every heartbeat period, tell every node of the job that the scheduler is alive.
async fn send_heartbeats(roster: Arc<Roster>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        for p in roster.peers() {
            // A node whose connection is gone is the failure detector's business.
            let _ = p.send(&rudra_transport::Msg::Heartbeat).await;
        }
    }
}

/// A seat's id: a shard's or a learner's.
trait SeatId: Copy + std::fmt::Display + Send + 'static {
    /// The node's stand-in.
    type Remote: Actor<Context = Context<Self::Remote>> + Handler<Rebind>;
    fn seat(self, roster: &Roster) -> &Seat<Self::Remote>;
    /// Serve the node's messages until its connection `incarnation` ends.
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32);
    /// Whether the failure detector holds the node alive.
    fn is_alive(self) -> IsAlive;
    /// Tell the failure detector the node was heard from.
    fn heard(self, scheduler: &Addr<SchedulerActor>);
}

impl SeatId for ShardId {
    type Remote = RemoteShard;
    fn seat(self, roster: &Roster) -> &Seat<RemoteShard> {
        &roster.shards[self.index()]
    }
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32) {
        actix::spawn(dispatch_shard(self, j, roster, incarnation));
    }
    fn is_alive(self) -> IsAlive {
        IsAlive::Shard(self)
    }
    fn heard(self, scheduler: &Addr<SchedulerActor>) {
        scheduler.do_send(ShardAlive(self));
    }
}

impl SeatId for LearnerId {
    type Remote = RemoteLearner;
    fn seat(self, roster: &Roster) -> &Seat<RemoteLearner> {
        &roster.learners[self.index()]
    }
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32) {
        actix::spawn(dispatch_learner(self, j, roster, incarnation));
    }
    fn is_alive(self) -> IsAlive {
        IsAlive::Learner(self)
    }
    fn heard(self, scheduler: &Addr<SchedulerActor>) {
        scheduler.do_send(Heartbeat(self));
    }
}

impl Roster {
    /// Seat `j` as node `id` and serve it; returns its incarnation. A node back in the running
    /// job (a later incarnation) is heard from as it takes its seat, so that a second process
    /// of its name arriving before its first heartbeat is refused, and its stand-in sends on
    /// the new connection.
    fn seat<I: SeatId>(self: &Arc<Self>, id: I, j: Joiner) -> u32 {
        let seat = id.seat(self);
        let incarnation = seat.take(&j.peer);
        if incarnation > 0 {
            id.heard(&self.scheduler);
            seat.remote.do_send(Rebind(j.peer.clone()));
        }
        id.dispatch(Arc::clone(self), j, incarnation);
        incarnation
    }

    /// Whether node `id` holds its seat: its connection is open and the failure detector
    /// holds it alive. A scheduler too busy to answer within the failure timeout (an
    /// evaluation waiting on a shard that is restarting) lets the newcomer in: the node it
    /// would replace is most likely that restarted one.
    async fn held<I: SeatId>(&self, id: I) -> bool {
        if !id.seat(self).connected() {
            return false;
        }
        match tokio::time::timeout(self.failure_timeout, self.scheduler.send(id.is_alive())).await {
            Ok(answer) => answer.unwrap_or(false),
            Err(_) => {
                tracing::warn!("the scheduler is busy; {id} joins again in place of its silent connection");
                false
            }
        }
    }

    fn peers(&self) -> Vec<Peer> {
        let shards = self.shards.iter().map(|s| s.current().as_ref().map(|(p, _)| p.clone()));
        let learners = self.learners.iter().map(|s| s.current().as_ref().map(|(p, _)| p.clone()));
        shards.chain(learners).flatten().collect()
    }
}

/// After the start: a node of the job that restarted or lost its connection joins again and
/// takes its seat (a shard must come back at the address the learners know); anyone else is
/// refused.
async fn accept_rejoins(ep: QuicEndpoint, roster: Arc<Roster>) {
    while let Some(next) = ep.accept().await {
        let peer = match next {
            Ok(peer) => peer,
            Err(e) => {
                tracing::warn!("refused a node: {e}");
                continue;
            }
        };
        let roster = Arc::clone(&roster);
        actix::spawn(async move {
            let Some((rx, data_addr)) = read_join(&peer).await else { return };
            let inv = &roster.invitation;
            let j = Joiner { peer: peer.clone(), rx, data_addr };
            let (role, id) = match inv.seat_of(&j) {
                Ok(seat) => seat,
                Err((goodbye, why)) => return peer.say_goodbye(goodbye, &why),
            };
            let alive = match role {
                Role::Shard => roster.held(ShardId(id)).await,
                _ => roster.held(LearnerId(id)).await,
            };
            if alive {
                tracing::warn!(
                    peer = peer.name(),
                    "refused a second process of this name: the first is alive"
                );
                let why = format!(
                    "{} is connected and alive in this job; a second process of that name is refused until the first is lost",
                    peer.name()
                );
                return peer.say_goodbye(Goodbye::Duplicate, &why);
            }
            let incarnation = match role {
                Role::Shard => roster.seat(ShardId(id), j),
                _ => roster.seat(LearnerId(id), j),
            };
            tracing::info!(peer = peer.name(), incarnation, "rejoined the running job");
            if let Err(e) = peer.send(&inv.welcome(id as usize, incarnation)).await {
                tracing::warn!(peer = peer.name(), "{e}");
            }
        });
    }
}

/// Serve shard `id`'s messages to the scheduler until its connection `incarnation` ends.
async fn dispatch_shard(id: ShardId, mut j: Joiner, roster: Arc<Roster>, incarnation: u32) {
    let seat = id.seat(&roster);
    let handle = |m| {
        match codec::from_shard(id, m)? {
            FromShard::Heartbeat => roster.scheduler.do_send(ShardAlive(id)),
            FromShard::Records(records) => {
                if let Some(last) = records.updates.iter().map(|u| u.clock).max() {
                    seat.clock.store(last.0, Ordering::Relaxed);
                }
                roster.tracker.do_send(records);
            }
            FromShard::Snapshot { request, weights } => {
                seat.remote.do_send(SnapshotReply { request, weights });
            }
            FromShard::Resumed(clock) => {
                let crashed_at = Clock(seat.clock.swap(clock.0, Ordering::Relaxed));
                roster.scheduler.do_send(ShardRestarted { shard: id, crashed_at, resumed: Ok(clock) });
            }
        }
        Ok(())
    };
    let ended = drive_link(&j.peer, Vec::new(), &mut j.rx, handle, OnRefused::Log).await;
    if seat.is_current(incarnation) {
        match ended {
            Ended::Closed { goodbye: Some(Goodbye::Failed), reason } => {
                roster.scheduler.do_send(ShardFailed { shard: id, reason });
            }
            _ => roster.scheduler.do_send(ShardLost(id)),
        }
    }
}

/// Serve learner `id`'s messages to the scheduler until its connection `incarnation` ends.
async fn dispatch_learner(id: LearnerId, mut j: Joiner, roster: Arc<Roster>, incarnation: u32) {
    let scheduler = &roster.scheduler;
    let seat = id.seat(&roster);
    let handle = |m| {
        match codec::from_learner(id, m)? {
            FromLearner::Progress(p) => scheduler.do_send(p),
            FromLearner::Done(d) => scheduler.do_send(d),
            FromLearner::Heartbeat(h) => scheduler.do_send(h),
            FromLearner::Evaluated { request, measured } => {
                seat.remote.do_send(EvaluatedReply { request, measured });
            }
        }
        Ok(())
    };
    let ended = drive_link(&j.peer, Vec::new(), &mut j.rx, handle, OnRefused::Log).await;
    // The connection is gone: the learner crashed, or was stopped at the end of the run. A
    // connection already replaced by a newer one says nothing.
    if seat.is_current(incarnation) {
        if let Ended::Closed { goodbye: Some(Goodbye::Failed), reason } = ended {
            tracing::error!(learner = %id, "learner failed: {reason}; the run goes on without it");
        }
        scheduler.do_send(Disconnected(id));
    }
}
