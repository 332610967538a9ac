//! One role per process: `rudra-node --role scheduler|shard|learner`.
//!
//! The scheduler listens, waits for the configured shards and learners to join, gives each its
//! id and the run configuration (learners also get the shards' addresses), starts the run,
//! writes the run directory and stops everyone. Shards and learners connect to each other
//! directly; the scheduler is not on the data path. Every connection is QUIC with mutual TLS.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_actors::checkpoint::Checkpoints;
use rudra_actors::faults::{Crash, LearnerLinks, Lossy, Node};
use rudra_actors::learner::{LearnerActor, SchedulerLink, ShardLink, StartLearner, StopLearner};
use rudra_actors::metrics::Metrics;
use rudra_actors::protocol::Weights;
use rudra_actors::remote::{AnswerSnapshot, Rebind, RemotePeer, SnapshotReply, records_from_wire};
use rudra_actors::scheduler::{
    Disconnected, Heartbeat, Joined, LearnerDone, LearnerHandle, Members, Progress, SchedulerActor,
    ShardHandle, ShardLost, ShardRestarted,
};
use rudra_actors::shard::{
    Exchange, Membership, Pull, Push, Served, ShardActor, ShardCore, Snapshot, StopShard,
};
use rudra_actors::tracker::StalenessTracker;
use rudra_actors::{RunReport, TrainingData};
use rudra_compute::{Device, Model};
use rudra_transport::quic::{Peer, QuicEndpoint, QuicSettings};
use rudra_transport::tls::CertDir;
use rudra_transport::{Clock, Inbound, LearnerId, Msg, Role, ShardId};
use tokio::sync::{mpsc, oneshot};

use crate::exporter::MetricsEndpoint;
use crate::local::{ProgressMode, show_progress};
use crate::{Config, RawConfig, RuntimeError};

/// How a node finds and authenticates its peers.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's name (its certificate `certs/NAME.pem`).
    pub name: String,
    /// The certificate directory.
    pub certs: PathBuf,
    /// Where this node listens (the scheduler: for nodes; a shard: for learners).
    pub listen: SocketAddr,
    /// The scheduler's address (shards and learners).
    pub scheduler: Option<SocketAddr>,
    /// How long to keep trying to reach a peer, and to wait for nodes to join.
    pub connect_timeout: Duration,
    /// Where to serve this node's metrics (the scheduler and shards), if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// A shard: resume from the checkpoint in this directory, and keep writing checkpoints
    /// there.
    pub resume: Option<PathBuf>,
    /// A shard: where to write checkpoints when not resuming (default: `checkpoint.dir`, else
    /// `checkpoints/`).
    pub checkpoints: Option<PathBuf>,
}

fn net(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Transport(rudra_transport::TransportError::Connection(e.to_string()))
}

fn endpoint(opts: &NodeOptions, role: Role) -> Result<QuicEndpoint, RuntimeError> {
    let identity = CertDir::new(&opts.certs).identity(&opts.name)?;
    if identity.role() != role {
        return Err(RuntimeError::Invalid {
            key: "--name",
            message: format!(
                "{} is a {} certificate; this node runs as {}",
                opts.name,
                identity.role().as_str(),
                role.as_str()
            ),
        });
    }
    Ok(QuicEndpoint::bind(opts.listen, identity, QuicSettings::default())?)
}

/// How long a stopping node waits for its peers to hang up.
const HANG_UP: Duration = Duration::from_secs(5);

/// Close every connection of `ep` and wait (briefly) until the peers have been told, so they
/// see a clean close rather than an idle timeout.
async fn hang_up(ep: &QuicEndpoint) {
    ep.close();
    let _ = tokio::time::timeout(HANG_UP, ep.wait_idle()).await;
}

/// Connect to `name` at `addr`, retrying with backoff until `timeout`.
async fn connect_with_retry(
    ep: &QuicEndpoint,
    addr: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Peer, RuntimeError> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(3), ep.connect(addr, name)).await;
        let why = match attempt {
            Ok(Ok(peer)) => return Ok(peer),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 3 s".to_owned(),
        };
        if start.elapsed() + backoff > timeout {
            return Err(net(format!(
                "gave up reaching {name} at {addr} after {:.0?}: {why}",
                start.elapsed()
            )));
        }
        tracing::info!("{name} at {addr} not reachable ({why}); retrying in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The next message, or an error naming what was expected.
async fn expect(
    rx: &mut mpsc::Receiver<Inbound>,
    what: &str,
    within: Duration,
) -> Result<Inbound, RuntimeError> {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(net(format!("the connection closed while waiting for {what}"))),
        Err(_) => Err(net(format!("no {what} within {within:?}"))),
    }
}

/// A node that has joined the scheduler.
struct Joiner {
    peer: Peer,
    rx: mpsc::Receiver<Inbound>,
    data_addr: String,
}

/// The join a node must send first: its messages from then on, and its data address. A node
/// that says anything else, or claims another name or role than its certificate's, is closed.
async fn read_join(peer: &Peer) -> Option<(mpsc::Receiver<Inbound>, String)> {
    let mut rx = peer.incoming(256);
    match expect(&mut rx, "a join", Duration::from_secs(10)).await {
        Ok(Inbound::Control(Msg::Join { role, name, data_addr }))
            if role == peer.role() && name == peer.name() =>
        {
            Some((rx, data_addr))
        }
        other => {
            tracing::warn!(peer = peer.name(), "did not join as its certificate says: {other:?}");
            peer.close("expected a join matching the certificate");
            None
        }
    }
}

/// Wait for `config`'s shards and learners to join; returns them ordered by name.
async fn gather(
    ep: &QuicEndpoint,
    config: &Config,
    within: Duration,
) -> Result<(Vec<Joiner>, Vec<Joiner>), RuntimeError> {
    let (want_shards, want_learners) = (config.cluster.shards as usize, config.cluster.learners as usize);
    let (mut shards, mut learners) = (BTreeMap::new(), BTreeMap::new());
    let deadline = tokio::time::Instant::now() + within;
    while shards.len() < want_shards || learners.len() < want_learners {
        let Ok(next) = tokio::time::timeout_at(deadline, ep.accept()).await else {
            return Err(net(format!(
                "only {} of {want_shards} shards and {} of {want_learners} learners joined within {within:?}",
                shards.len(),
                learners.len()
            )));
        };
        let peer = match next {
            Some(Ok(peer)) => peer,
            Some(Err(e)) => {
                tracing::warn!("refused a node: {e}");
                continue;
            }
            None => return Err(net("the endpoint closed")),
        };
        let Some((rx, data_addr)) = read_join(&peer).await else { continue };
        let (slots, want) = match peer.role() {
            Role::Shard => (&mut shards, want_shards),
            Role::Learner => (&mut learners, want_learners),
            Role::Scheduler => {
                peer.close("only shards and learners join");
                continue;
            }
        };
        if slots.len() >= want || slots.contains_key(peer.name()) {
            tracing::warn!(peer = peer.name(), "refused: already joined, or no free slot");
            peer.close("no free slot for this node");
            continue;
        }
        tracing::info!(peer = peer.name(), "joined");
        slots.insert(peer.name().to_owned(), Joiner { peer, rx, data_addr });
    }
    Ok((shards.into_values().collect(), learners.into_values().collect()))
}

/// Run the scheduler of `config`: wait for the nodes, drive the run, stop everyone.
pub fn run_scheduler(
    config: &Config,
    data: TrainingData,
    opts: &NodeOptions,
    progress: ProgressMode,
) -> Result<RunReport, RuntimeError> {
    let config = config.clone();
    let opts = opts.clone();
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Scheduler)?;
        let metrics = serve_metrics(exporter, &ep)?;
        tracing::info!(
            "scheduler listening on {}; waiting for {} shards and {} learners",
            ep.local_addr()?,
            config.cluster.shards,
            config.cluster.learners
        );
        let (shards, learners) = gather(&ep, &config, opts.connect_timeout).await?;
        let invitation = Invitation {
            config_toml: config.to_toml()?,
            train_examples: data.train.len() as u64,
            shard_addrs: shards.iter().map(|j| j.data_addr.clone()).collect(),
            shard_names: shards.iter().map(|j| j.peer.name().to_owned()).collect(),
            learner_names: learners.iter().map(|j| j.peer.name().to_owned()).collect(),
        };
        for nodes in [&shards, &learners] {
            for (id, j) in nodes.iter().enumerate() {
                j.peer.send(&invitation.welcome(id, 0)).await?;
            }
        }
        let mut learners = learners;
        for j in &mut learners {
            match expect(&mut j.rx, "ready", opts.connect_timeout).await? {
                Inbound::Control(Msg::Ready) => {}
                other => return Err(net(format!("{} sent {:?} before ready", j.peer.name(), other.kind()))),
            }
        }
        let spec = &config.cluster;
        let tracker = StalenessTracker::new(metrics.clone()).start();
        let shard_peers: Vec<Addr<RemotePeer>> = shards
            .iter()
            .enumerate()
            .map(|(s, j)| RemotePeer::new(j.peer.clone(), ShardId(s as u32)).start())
            .collect();
        let learner_peers: Vec<Addr<RemotePeer>> =
            learners.iter().map(|j| RemotePeer::new(j.peer.clone(), ShardId(0)).start()).collect();
        let members = Members {
            shards: shard_peers.iter().map(ShardHandle::of).collect(),
            learners: learner_peers
                .iter()
                .map(|a| LearnerHandle { start: a.clone().recipient(), stop: a.clone().recipient() })
                .collect(),
            tracker: tracker.clone(),
        };
        let (tx, report) = oneshot::channel();
        let (obs_tx, obs_rx) = mpsc::unbounded_channel();
        let train_len = data.train.len();
        let core = spec.scheduler_core(train_len).with_failure_timeout(config.liveness.failure_timeout);
        let scheduler = SchedulerActor::new(core, members, spec, train_len, (data.test, Some(obs_tx), tx))
            .with_metrics(metrics)
            .with_failure_detector(config.liveness.heartbeat)
            .with_shard_timeout(opts.connect_timeout)
            .start();
        actix::spawn(show_progress(obs_rx, progress));
        let roster = Arc::new(Roster {
            invitation,
            shards: shard_peers.into_iter().map(Seat::new).collect(),
            learners: learner_peers.into_iter().map(Seat::new).collect(),
            tracker,
            scheduler: scheduler.clone(),
        });
        for (s, j) in shards.into_iter().enumerate() {
            roster.seat(ShardId(s as u32), j);
            scheduler.do_send(Joined::Shard(ShardId(s as u32)));
        }
        for (l, j) in learners.into_iter().enumerate() {
            roster.seat(LearnerId(l as u32), j);
            scheduler.do_send(Joined::Learner(LearnerId(l as u32)));
        }
        actix::spawn(accept_rejoins(ep.clone(), Arc::clone(&roster)));
        let report = report.await.map_err(|_| net("the scheduler stopped without a report"))??;
        // Every node was told to stop; give them a moment to hang up first.
        let _ = tokio::time::timeout(HANG_UP, async {
            for p in roster.peers() {
                p.closed().await;
            }
        })
        .await;
        hang_up(&ep).await;
        Ok(report)
    })
}

/// Start serving `exporter`, if any, with the traffic of `ep` among its metrics.
fn serve_metrics(
    exporter: Option<MetricsEndpoint>,
    ep: &QuicEndpoint,
) -> Result<Option<Arc<Metrics>>, RuntimeError> {
    let metrics = exporter.map(MetricsEndpoint::start).transpose()?;
    if let Some(m) = &metrics {
        m.watch_traffic(ep.traffic());
    }
    Ok(metrics)
}

/// What every node is told when it joins; only the id and the incarnation differ.
struct Invitation {
    config_toml: String,
    train_examples: u64,
    shard_addrs: Vec<String>,
    shard_names: Vec<String>,
    learner_names: Vec<String>,
}

impl Invitation {
    fn welcome(&self, id: usize, incarnation: u32) -> Msg {
        Msg::Welcome {
            id: id as u32,
            config_toml: self.config_toml.clone(),
            train_examples: self.train_examples,
            shard_addrs: self.shard_addrs.clone(),
            shard_names: self.shard_names.clone(),
            learner_names: self.learner_names.clone(),
            incarnation,
        }
    }
}

/// One node's place in the running job: its stand-in (which outlives any one connection),
/// its current connection and how many times it joined.
struct Seat {
    remote: Addr<RemotePeer>,
    current: std::sync::Mutex<Option<(Peer, u32)>>,
    /// A shard's last clock reported (what it had when it was lost).
    clock: AtomicU64,
}

impl Seat {
    fn new(remote: Addr<RemotePeer>) -> Self {
        Self { remote, current: std::sync::Mutex::new(None), clock: AtomicU64::new(0) }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<(Peer, u32)>> {
        self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `peer` as this node's connection; returns its incarnation (0 for the first). An
    /// earlier connection is closed.
    fn take(&self, peer: &Peer) -> u32 {
        let mut current = self.current();
        let incarnation = current.as_ref().map_or(0, |(old, n)| {
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
    shards: Vec<Seat>,
    learners: Vec<Seat>,
    tracker: Addr<StalenessTracker>,
    scheduler: Addr<SchedulerActor>,
}

/// A seat's id: a shard's or a learner's.
trait SeatId: Copy + std::fmt::Display + Send + 'static {
    fn seat(self, roster: &Roster) -> &Seat;
    /// Serve the node's messages until its connection `incarnation` ends.
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32);
}

impl SeatId for ShardId {
    fn seat(self, roster: &Roster) -> &Seat {
        &roster.shards[self.index()]
    }
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32) {
        actix::spawn(dispatch_shard(self, j, roster, incarnation));
    }
}

impl SeatId for LearnerId {
    fn seat(self, roster: &Roster) -> &Seat {
        &roster.learners[self.index()]
    }
    fn dispatch(self, roster: Arc<Roster>, j: Joiner, incarnation: u32) {
        actix::spawn(dispatch_learner(self, j, roster, incarnation));
    }
}

impl Roster {
    /// Seat `j` as node `id` and serve it; returns its incarnation.
    fn seat<I: SeatId>(self: &Arc<Self>, id: I, j: Joiner) -> u32 {
        let seat = id.seat(self);
        let incarnation = seat.take(&j.peer);
        if incarnation > 0 {
            seat.remote.do_send(Rebind(j.peer.clone()));
        }
        id.dispatch(Arc::clone(self), j, incarnation);
        incarnation
    }

    fn peers(&self) -> Vec<Peer> {
        let current = |s: &Seat| s.current().as_ref().map(|(p, _)| p.clone());
        self.shards.iter().chain(&self.learners).filter_map(current).collect()
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
            let (names, role) = match peer.role() {
                Role::Shard => (&inv.shard_names, "shard"),
                _ => (&inv.learner_names, "learner"),
            };
            let Some(id) = names.iter().position(|n| n == peer.name()) else {
                tracing::warn!(peer = peer.name(), "refused: not a {role} of the running job");
                return peer.close("the job is running and this node is not one of its members");
            };
            if peer.role() == Role::Shard && inv.shard_addrs[id] != data_addr {
                tracing::error!(
                    peer = peer.name(),
                    "refused: it came back at {data_addr}, the learners know it at {}; restart it with --listen {}",
                    inv.shard_addrs[id],
                    inv.shard_addrs[id]
                );
                return peer.close("restart the shard at the address it had");
            }
            let j = Joiner { peer: peer.clone(), rx, data_addr };
            let incarnation = match peer.role() {
                Role::Shard => roster.seat(ShardId(id as u32), j),
                _ => roster.seat(LearnerId(id as u32), j),
            };
            tracing::info!(peer = peer.name(), incarnation, "rejoined the running job");
            if let Err(e) = peer.send(&inv.welcome(id, incarnation)).await {
                tracing::warn!(peer = peer.name(), "{e}");
            }
        });
    }
}

async fn dispatch_shard(id: ShardId, mut j: Joiner, roster: Arc<Roster>, incarnation: u32) {
    let seat = id.seat(&roster);
    while let Some(m) = j.rx.recv().await {
        match m {
            Inbound::Control(Msg::Records { gradients, updates }) => {
                if let Some(last) = updates.iter().map(|u| u.clock).max() {
                    seat.clock.store(last, Ordering::Relaxed);
                }
                roster.tracker.do_send(records_from_wire(id, &gradients, &updates));
            }
            Inbound::Snapshot { request, clock, values } => {
                let weights = Weights { shard: id, clock, values };
                seat.remote.do_send(SnapshotReply { request, weights });
            }
            Inbound::Control(Msg::Resumed { clock }) => {
                let crashed_at = Clock(seat.clock.swap(clock, Ordering::Relaxed));
                roster.scheduler.do_send(ShardRestarted { shard: id, crashed_at, resumed: Ok(Clock(clock)) });
            }
            other => tracing::warn!(peer = j.peer.name(), "unexpected {:?}", other.kind()),
        }
    }
    if seat.is_current(incarnation) {
        roster.scheduler.do_send(ShardLost(id));
    }
}

async fn dispatch_learner(id: LearnerId, mut j: Joiner, roster: Arc<Roster>, incarnation: u32) {
    let scheduler = &roster.scheduler;
    while let Some(m) = j.rx.recv().await {
        match m {
            Inbound::Control(Msg::Progress { learner, samples, steps, loss_sum }) if learner == id.0 => {
                scheduler.do_send(Progress { learner: id, samples, steps, loss_sum });
            }
            Inbound::Control(Msg::LearnerDone { error }) => {
                scheduler.do_send(LearnerDone { learner: id, error })
            }
            Inbound::Control(Msg::Heartbeat) => scheduler.do_send(Heartbeat(id)),
            other => tracing::warn!(peer = j.peer.name(), "unexpected {:?}", other.kind()),
        }
    }
    // The connection is gone: the learner crashed, or was stopped at the end of the run. A
    // connection already replaced by a newer one says nothing.
    if id.seat(&roster).is_current(incarnation) {
        scheduler.do_send(Disconnected(id));
    }
}

/// What the scheduler tells a node that joins.
struct Welcome {
    /// Shard or learner id.
    id: u32,
    /// The run configuration.
    config: Config,
    /// Size of the scheduler's training set.
    train_examples: usize,
    /// Shard addresses and certificate names (for learners).
    shards: Vec<(String, String)>,
    /// Learner certificate names, by learner id (for shards).
    learners: Vec<String>,
    /// 0 when the run starts; more when this node rejoins the running job.
    incarnation: u32,
}

/// Join the scheduler at `opts.scheduler`: returns the connection, its messages, and the welcome.
async fn join(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    role: Role,
) -> Result<(Peer, mpsc::Receiver<Inbound>, Welcome), RuntimeError> {
    let addr = opts.scheduler.ok_or_else(|| RuntimeError::Invalid {
        key: "--scheduler",
        message: "shards and learners need the scheduler's address".into(),
    })?;
    let sched = connect_with_retry(ep, addr, "scheduler", opts.connect_timeout).await?;
    let mut rx = sched.incoming(256);
    let data_addr = if role == Role::Shard { ep.local_addr()?.to_string() } else { String::new() };
    sched.send(&Msg::Join { role, name: opts.name.clone(), data_addr }).await?;
    let Inbound::Control(Msg::Welcome {
        id,
        config_toml,
        train_examples,
        shard_addrs,
        shard_names,
        learner_names,
        incarnation,
    }) = expect(&mut rx, "the welcome", Duration::from_secs(3600)).await?
    else {
        return Err(net("the scheduler did not answer the join with a welcome"));
    };
    let raw: RawConfig =
        toml::from_str(&config_toml).map_err(|e| RuntimeError::Config(format!("from the scheduler: {e}")))?;
    tracing::info!(id, incarnation, "joined the run");
    let welcome = Welcome {
        id,
        config: raw.try_into()?,
        train_examples: train_examples as usize,
        shards: shard_addrs.into_iter().zip(shard_names).collect(),
        learners: learner_names,
        incarnation,
    };
    Ok((sched, rx, welcome))
}

/// Run a shard: join, serve learners, answer the scheduler, stop when told. A shard that
/// rejoins a running job (or is started with `--resume`) continues from its checkpoint.
pub fn run_shard(opts: &NodeOptions) -> Result<(), RuntimeError> {
    let opts = opts.clone();
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Shard)?;
        let metrics = serve_metrics(exporter, &ep)?;
        let (sched, mut rx, welcome) = join(&ep, &opts, Role::Shard).await?;
        let id = ShardId(welcome.id);
        let tracker = RemotePeer::new(sched.clone(), id).start();
        let mut core = welcome.config.cluster.shard_actor_core(id.index(), welcome.train_examples);
        let checkpoints = shard_checkpoints(&opts, &welcome.config);
        if opts.resume.is_some() || welcome.incarnation > 0 {
            let clock = resume(&mut core, checkpoints.as_ref(), id)?;
            sched.send(&Msg::Resumed { clock: clock.0 }).await?;
        }
        let counters = metrics.as_ref().map(|m| m.shard(id));
        let shard = ShardActor::new(core, tracker.clone().recipient())
            .with_metrics(counters)
            .with_checkpoints(checkpoints)
            .start();
        let policy = LearnerPolicy {
            names: Arc::new(welcome.learners),
            range_len: welcome.config.cluster.shard_ranges()[id.index()].len(),
            metrics,
        };
        actix::spawn(accept_learners(ep.clone(), shard.clone(), policy));
        let crash = welcome.config.faults.crash_of(Node::Shard(id));
        let crash = crash.filter(|_| welcome.incarnation == 0 && opts.resume.is_none());
        let (failed_tx, mut failed) = mpsc::channel(1);
        if let Some(c) = crash {
            actix::spawn(crash_and_restart(c, shard.clone(), sched.clone(), failed_tx));
        }
        let mut stopped = false;
        while let Some(m) = tokio::select! {
            m = rx.recv() => m,
            Some(e) = failed.recv() => return Err(e),
        } {
            match m {
                Inbound::Control(Msg::SnapshotRequest { request }) => {
                    // The shard flushes its records to the tracker's stand-in before answering;
                    // the answer follows them through the same stand-in, in order.
                    let weights = shard.send(Snapshot).await.map_err(net)?;
                    tracker.do_send(AnswerSnapshot { request, weights });
                }
                Inbound::Control(Msg::Membership { active }) => {
                    let active = active.into_iter().map(LearnerId).collect();
                    shard.do_send(Membership { active });
                }
                Inbound::Control(Msg::Stop) => {
                    stopped = true;
                    break;
                }
                other => tracing::warn!("unexpected {:?} from the scheduler", other.kind()),
            }
        }
        let _ = shard.send(StopShard).await;
        if !stopped {
            // No clean close: the learners take this like a crash and connect again to the
            // shard restarted in its place.
            return Err(net(format!(
                "lost the scheduler ({}); restart this shard with --resume to continue from its checkpoint",
                sched.closed().await
            )));
        }
        sched.close("stopped");
        hang_up(&ep).await;
        tracing::info!("stopped by the scheduler");
        Ok(())
    })
}

/// An injected crash of this shard at `c.at` after it joined: it loses what it holds in
/// memory, and `c.restart_after` later comes back from its checkpoint and tells the scheduler.
async fn crash_and_restart(
    c: Crash,
    shard: Addr<ShardActor>,
    sched: Peer,
    failed: mpsc::Sender<RuntimeError>,
) {
    tokio::time::sleep(c.at).await;
    let down = c.restart_after.unwrap_or_default();
    let crashed = |clock| tracing::error!("crashed at clock {clock} (fault injection)");
    let Some(resumed) = rudra_actors::shard::crash_and_restart(&shard, down, crashed).await else { return };
    let sent = match resumed {
        Ok(clock) => sched.send(&Msg::Resumed { clock: clock.0 }).await.map_err(RuntimeError::from),
        Err(e) => Err(e.into()),
    };
    if let Err(e) = sent {
        let _ = failed.send(e).await;
    }
}

/// Where a shard process keeps its checkpoints: `--resume DIR`, else the directory it was
/// given, else `checkpoint.dir`, else `checkpoints/`; none when `checkpoint.every_updates` is 0.
fn shard_checkpoints(opts: &NodeOptions, config: &Config) -> Option<Checkpoints> {
    let every_updates = config.raw.checkpoint.every_updates;
    let dir = (opts.resume.clone().or_else(|| opts.checkpoints.clone()))
        .or_else(|| config.raw.checkpoint.dir.clone())
        .unwrap_or_else(|| PathBuf::from("checkpoints"));
    (every_updates > 0).then_some(Checkpoints { dir, every_updates })
}

/// Restore `core` from its checkpoint; the clock it resumes at.
fn resume(
    core: &mut ShardCore,
    checkpoints: Option<&Checkpoints>,
    id: ShardId,
) -> Result<Clock, RuntimeError> {
    let c = checkpoints.ok_or_else(|| RuntimeError::Invalid {
        key: "checkpoint.every_updates",
        message: "is 0: this shard has no checkpoint to resume from".into(),
    })?;
    let state = c.read(id)?.ok_or_else(|| RuntimeError::Invalid {
        key: "--resume",
        message: format!("{} does not exist: nothing to resume {id} from", c.path(id).display()),
    })?;
    let clock = state.clock;
    core.restore(state)?;
    tracing::info!(shard = %id, "resumed from {} at clock {clock}", c.path(id).display());
    Ok(clock)
}

/// What a shard accepts from learners, checked at the boundary before the shard sees anything.
#[derive(Clone)]
struct LearnerPolicy {
    /// `names[l]`: the certificate learner `l` must connect with.
    names: Arc<Vec<String>>,
    /// Values in this shard's range: the length of every push.
    range_len: usize,
    /// Where connected learners are counted.
    metrics: Option<Arc<Metrics>>,
}

async fn accept_learners(ep: QuicEndpoint, shard: Addr<ShardActor>, policy: LearnerPolicy) {
    while let Some(next) = ep.accept().await {
        match next {
            Ok(peer) if peer.role() == Role::Learner => {
                actix::spawn(serve_learner(peer, shard.clone(), policy.clone()));
            }
            Ok(peer) => peer.close("only learners connect to a shard"),
            Err(e) => tracing::warn!("refused a connection: {e}"),
        }
    }
}

/// Serve one learner's connection. Anything but its own pulls and pushes of the right length
/// closes the connection; the shard never sees it.
async fn serve_learner(peer: Peer, shard: Addr<ShardActor>, policy: LearnerPolicy) {
    let mut rx = peer.incoming(64);
    let learner = match expect(&mut rx, "a hello", Duration::from_secs(10)).await {
        Ok(Inbound::Control(Msg::Hello { learner }))
            if policy.names.get(learner as usize).is_some_and(|n| n == peer.name()) =>
        {
            LearnerId(learner)
        }
        other => {
            tracing::warn!(
                peer = peer.name(),
                "refused: expected a hello as the learner this certificate names, got {other:?}"
            );
            peer.close("expected a hello matching the certificate");
            return;
        }
    };
    let _alive = policy.metrics.as_ref().map(Metrics::learner_connected);
    let reply = RemotePeer::new(peer.clone(), ShardId(0)).start().recipient::<Served>();
    // A push travels on its own stream and a pull on the control stream, so a pull may overtake
    // the push before it: the shard orders them by their sequence numbers.
    while let Some(m) = rx.recv().await {
        match m {
            Inbound::Control(Msg::Pull { learner: l, seq, last }) if l == learner.0 => {
                shard.do_send(Pull { learner, seq, last, reply_to: reply.clone() });
            }
            Inbound::Exchange { learner: l, values } if l == learner && values.len() == policy.range_len => {
                shard.do_send(Exchange { learner, values, reply_to: reply.clone() });
            }
            Inbound::Push { learner: l, seq, computed_on, values }
                if l == learner && values.len() == policy.range_len =>
            {
                shard.do_send(Push { learner, seq, computed_on, values });
            }
            other => {
                let why = match &other {
                    Inbound::Push { values, .. } | Inbound::Exchange { values, .. }
                        if values.len() != policy.range_len =>
                    {
                        format!(
                            "{:?} of {} values to a shard of {}",
                            other.kind(),
                            values.len(),
                            policy.range_len
                        )
                    }
                    _ => format!("{:?} that is not {learner}'s own", other.kind()),
                };
                tracing::warn!(peer = peer.name(), "rejected {why}; closing the connection");
                peer.close("protocol violation");
                break;
            }
        }
    }
}

/// Run a learner: join, connect to every shard, train when told, stop when told.
pub fn run_learner(opts: &NodeOptions) -> Result<(), RuntimeError> {
    learner_node(opts, None)
}

/// A learner on `data` when given, else on the dataset the run configuration names. A lost
/// connection to a shard or to the scheduler is made again (within `--connect-timeout`); a
/// learner that restarted and rejoins the running job starts at once, its step numbers after
/// every earlier incarnation's.
fn learner_node(opts: &NodeOptions, data: Option<TrainingData>) -> Result<(), RuntimeError> {
    let opts = opts.clone();
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Learner)?;
        let (mut sched, mut rx, welcome) = join(&ep, &opts, Role::Learner).await?;
        let Welcome { id, config, train_examples, shards, incarnation, .. } = welcome;
        let spec = config.cluster.clone();
        let data = match data {
            Some(d) => d,
            None => config.data.load()?,
        };
        if data.train.len() != train_examples {
            return Err(RuntimeError::Invalid {
                key: "training.data_dir",
                message: format!(
                    "this learner reads {} training examples, the scheduler {train_examples}; give every node the same dataset",
                    data.train.len()
                ),
            });
        }
        // Fault injection: this learner's side of its links, its speed and its crash, timed
        // from when it joined.
        let (me, born) = (LearnerId(id), Instant::now());
        let LearnerLinks { heartbeat, shards: plans } = config.faults.learner_links(me, spec.shards);
        let mut links = Vec::new();
        let mut connections = Vec::new();
        for (((s, (addr, name)), range), [pull, push, answers]) in
            shards.iter().enumerate().zip(spec.shard_ranges()).zip(plans)
        {
            let addr: SocketAddr = addr.parse().map_err(|e| net(format!("shard address {addr:?}: {e}")))?;
            let peer = connect_with_retry(&ep, addr, name, opts.connect_timeout).await?;
            peer.send(&Msg::Hello { learner: id }).await?;
            let remote = RemotePeer::new(peer.clone(), ShardId(s as u32)).start();
            links.push(ShardLink {
                reply_to: None,
                range,
                pull: Lossy::wrap(remote.clone().recipient(), pull, born),
                push: Lossy::wrap(remote.clone().recipient(), push, born),
                exchange: remote.clone().recipient(),
            });
            connections.push((ShardConnection { peer, addr, name: name.clone(), remote }, answers));
        }
        let to_sched = RemotePeer::new(sched.clone(), ShardId(0)).start();
        let mut link = SchedulerLink::of(&to_sched);
        link.heartbeat = Lossy::wrap(link.heartbeat, heartbeat, born);
        let (core, batches) = spec.learner_loop(id as usize, data.train);
        let core = core.incarnation(incarnation);
        let model = Model::new(Device::open(config.device)?, spec.model.clone())?;
        let (liveness, slowdown) = (config.liveness, config.faults.slowdown(me));
        let arbiter = Arbiter::new();
        let learner = LearnerActor::start_in_arbiter(&arbiter.handle(), move |_| {
            LearnerActor::new(core, model, batches, links, link).with_liveness(liveness).with_slowdown(slowdown)
        });
        let (lost_tx, mut lost_rx) = mpsc::channel(1);
        for (c, answers) in connections {
            let answers = Lossy::wrap(learner.clone().recipient(), answers, born);
            let (ep, learner, lost) = (ep.clone(), learner.clone(), lost_tx.clone());
            actix::spawn(keep_shard(c, ep, id, (learner, answers), opts.connect_timeout, lost));
        }
        let crash = config.faults.crash_of(Node::Learner(me)).filter(|_| incarnation == 0);
        let crashed = async move {
            match crash {
                Some(c) => tokio::time::sleep_until((born + c.at).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(crashed);
        if incarnation == 0 {
            sched.send(&Msg::Ready).await?;
        } else {
            learner.do_send(StartLearner);
        }
        let result = loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(Inbound::Control(Msg::Start)) => learner.do_send(StartLearner),
                    Some(Inbound::Control(Msg::Stop)) => break Ok(()),
                    Some(other) => tracing::warn!("unexpected {:?} from the scheduler", other.kind()),
                    None => {
                        tracing::warn!("lost the scheduler ({}); joining again", sched.closed().await);
                        match join(&ep, &opts, Role::Learner).await {
                            Ok((peer, inbox, _)) => {
                                to_sched.do_send(Rebind(peer.clone()));
                                (sched, rx) = (peer, inbox);
                            }
                            Err(e) => break Err(e),
                        }
                    }
                },
                Some(e) = lost_rx.recv() => break Err(e),
                () = &mut crashed => {
                    // As a crash: everything stops at once, no connection is closed.
                    tracing::error!("crashed (fault injection)");
                    ep.abort();
                    arbiter.stop();
                    return Ok(());
                }
            }
        };
        learner.do_send(StopLearner);
        arbiter.stop();
        sched.close("stopped");
        hang_up(&ep).await;
        result?;
        tracing::info!("stopped by the scheduler");
        Ok(())
    })
}

/// A learner's connection to one shard.
struct ShardConnection {
    peer: Peer,
    addr: SocketAddr,
    name: String,
    remote: Addr<RemotePeer>,
}

/// Hand the shard's answers to the learner (through `answers`); when the connection is lost (the shard restarted,
/// or the network failed for longer than the idle timeout), connect again and go on. A shard
/// not reachable within `timeout` is an error on `lost`.
async fn keep_shard(
    mut c: ShardConnection,
    ep: QuicEndpoint,
    id: u32,
    (learner, answers): (Addr<LearnerActor>, Recipient<Served>),
    timeout: Duration,
    lost: mpsc::Sender<RuntimeError>,
) {
    loop {
        let mut inbox = c.peer.incoming(8);
        while let Some(m) = inbox.recv().await {
            if let Inbound::Weights { shard, seq, clock, values } = m {
                answers.do_send(Served { weights: Weights { shard, clock, values }, seq });
            }
        }
        if !learner.connected() {
            return; // The learner stopped: the run is over.
        }
        match c.peer.ended().await {
            Ok(why) => return tracing::info!("{} closed the connection ({why})", c.name),
            Err(why) => tracing::warn!("lost {} ({why}); connecting again", c.name),
        }
        let again = async {
            let peer = connect_with_retry(&ep, c.addr, &c.name, timeout).await?;
            peer.send(&Msg::Hello { learner: id }).await?;
            Ok::<_, RuntimeError>(peer)
        };
        match again.await {
            Ok(peer) => {
                tracing::info!("connected to {} again", c.name);
                c.remote.do_send(Rebind(peer.clone()));
                c.peer = peer;
            }
            Err(e) => {
                let _ = lost.send(e).await;
                return;
            }
        }
    }
}

/// `rudra-node local --transport quic`: the cluster of `config` in this process with every
/// node on its own thread, talking QUIC with mutual TLS over loopback exactly as separate
/// processes would (fresh certificates in a temporary directory). The shards write their
/// checkpoints into `run_dir` (see [`Config::checkpoints`]); the scheduler serves its metrics
/// at `metrics_addr`, if given.
pub fn run_loopback(
    config: &Config,
    data: TrainingData,
    run_dir: Option<&Path>,
    progress: ProgressMode,
    metrics_addr: Option<SocketAddr>,
) -> Result<RunReport, RuntimeError> {
    let dir =
        tempfile::tempdir().map_err(|source| RuntimeError::Io { path: std::env::temp_dir(), source })?;
    let certs = CertDir::new(dir.path());
    certs.init()?;
    let names = |role: &str, n: u32| (0..n).map(|i| format!("{role}-{i}")).collect::<Vec<_>>();
    let shards = names("shard", config.cluster.shards);
    let learners = names("learner", config.cluster.learners);
    for name in std::iter::once("scheduler").chain(shards.iter().chain(&learners).map(String::as_str)) {
        certs.issue(name)?;
    }
    // The scheduler's port is fixed before anyone starts; the others listen on any port.
    let scheduler = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_err(|e| net(format!("no loopback port: {e}")))?;
    let opts = |name: &str, listen: SocketAddr| NodeOptions {
        name: name.to_owned(),
        certs: dir.path().to_owned(),
        listen,
        scheduler: Some(scheduler),
        connect_timeout: Duration::from_secs(60),
        metrics_addr: None,
        resume: None,
        checkpoints: config.checkpoints(run_dir).map(|c| c.dir),
    };
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut nodes = Vec::new();
    for name in &shards {
        let o = opts(name, any);
        nodes.push(std::thread::spawn(move || run_shard(&o)));
    }
    for name in &learners {
        let (o, d) = (opts(name, any), data.clone());
        nodes.push(std::thread::spawn(move || learner_node(&o, Some(d))));
    }
    let scheduler_opts = NodeOptions { metrics_addr, ..opts("scheduler", scheduler) };
    let report = run_scheduler(config, data, &scheduler_opts, progress)?;
    for node in nodes {
        node.join().map_err(|_| net("a node's thread panicked"))??;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rudra_actors::protocol::shard::SgdShardConfig;
    use rudra_actors::protocol::{LrModulation, LrSchedule, SgdShard, SyncRule};
    use rudra_actors::shard::ShardCore;
    use rudra_transport::Clock;

    use super::*;

    const WITHIN: Duration = Duration::from_secs(10);

    fn learner_endpoint(certs: &CertDir, name: &str) -> QuicEndpoint {
        let any = "127.0.0.1:0".parse().expect("an address");
        QuicEndpoint::bind(any, certs.identity(name).expect("issued"), QuicSettings::default())
            .expect("bound")
    }

    /// A learner connection that has said hello as `id`.
    async fn hello(certs: &CertDir, name: &str, id: u32, shard: SocketAddr) -> (QuicEndpoint, Peer) {
        let ep = learner_endpoint(certs, name);
        let peer = ep.connect(shard, "shard-0").await.expect("connected");
        peer.send(&Msg::Hello { learner: id }).await.expect("sent");
        (ep, peer)
    }

    /// Bad input from learners, over real QUIC connections to a shard's learner service: each
    /// misbehaving connection is closed, the shard's parameters and clock stay as they were,
    /// and a well-behaved learner is served before, during and after.
    #[test]
    fn bad_learner_input_is_refused_and_the_shard_is_unchanged() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let certs = CertDir::new(dir.path());
        certs.init().expect("a CA");
        for name in ["shard-0", "learner-0", "learner-1"] {
            certs.issue(name).expect("a certificate");
        }
        actix::System::new().block_on(async {
            let ep = QuicEndpoint::bind(
                "127.0.0.1:0".parse().expect("an address"),
                certs.identity("shard-0").expect("issued"),
                QuicSettings::default(),
            )
            .expect("bound");
            let addr = ep.local_addr().expect("an address");
            let cfg = SgdShardConfig {
                id: ShardId(0),
                rule: SyncRule::Softsync { n: 2 },
                modulation: LrModulation::None,
                max_staleness: None,
                schedule: LrSchedule { base: 0.5, decay: 1.0 },
                gradients_per_epoch: 100,
            };
            let learners: BTreeSet<_> = [LearnerId(0), LearnerId(1)].into();
            let core = SgdShard::new(cfg, vec![1.0; 4], learners);
            let tracker = StalenessTracker::default().start().recipient();
            let shard = ShardActor::new(ShardCore::Sgd(core), tracker).start();
            let policy = LearnerPolicy {
                names: Arc::new(vec!["learner-0".into(), "learner-1".into()]),
                range_len: 4,
                metrics: None,
            };
            actix::spawn(accept_learners(ep.clone(), shard.clone(), policy));

            let (_good_ep, good) = hello(&certs, "learner-0", 0, addr).await;
            let mut weights = good.incoming(4);
            good.send(&Msg::Pull { learner: 0, seq: 1, last: false }).await.expect("sent");
            let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
            assert!(matches!(served, Some(Inbound::Weights { clock: Clock(0), .. })));
            let before = shard.send(Snapshot).await.expect("a snapshot");

            let push =
                |learner, n| Msg::Push { learner, seq: 1, computed_on: 0, values: vec![1.0; n].into() };
            let cases: Vec<(&str, &str, u32, Vec<Msg>)> = vec![
                ("hello as another learner", "learner-1", 0, vec![]),
                ("hello as an unknown learner", "learner-1", 7, vec![]),
                ("push of the wrong length", "learner-0", 0, vec![push(0, 3)]),
                ("push as another learner", "learner-0", 0, vec![push(1, 4)]),
                (
                    "pull as another learner",
                    "learner-0",
                    0,
                    vec![Msg::Pull { learner: 1, seq: 1, last: false }],
                ),
                ("heartbeat on the data path", "learner-0", 0, vec![Msg::Heartbeat]),
            ];
            for (what, name, id, msgs) in cases {
                let (_ep, peer) = hello(&certs, name, id, addr).await;
                for m in &msgs {
                    peer.send(m).await.unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                let why = tokio::time::timeout(WITHIN, peer.closed()).await;
                let why = why.unwrap_or_else(|_| panic!("{what}: the shard did not close the connection"));
                assert!(why.contains("protocol violation") || why.contains("hello"), "{what}: {why}");
                let now = shard.send(Snapshot).await.expect("a snapshot");
                assert_eq!((now.clock, &now.values), (before.clock, &before.values), "{what}");
            }

            // The well-behaved learner's connection was never disturbed: its push is applied.
            good.send(&push(0, 4)).await.expect("sent");
            // The next step's pull may overtake the push: the shard answers it once the push is in.
            good.send(&Msg::Pull { learner: 0, seq: 2, last: false }).await.expect("sent");
            let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
            let Some(Inbound::Weights { clock, values, .. }) = served else { panic!("expected weights") };
            // 2-softsync with λ = 2 applies every gradient: θ − 0.5 · 1.
            assert_eq!((clock, &values[..]), (Clock(1), &[0.5; 4][..]));
            ep.close();
        });
    }
}
