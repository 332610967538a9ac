//! The scheduler's roster of the running job: each node's seat (its stand-in, its current
//! connection, its incarnations), its messages to the scheduler, the scheduler's heartbeats,
//! and nodes that restart or reconnect taking their seats again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use rudra_actors::messages::{
    AggregatorLost, Disconnected, Heartbeat, IsAlive, ShardAlive, ShardFailed, ShardLost, ShardRestarted,
};
use rudra_actors::remote::codec::{self, FromLearner, FromShard};
use rudra_actors::remote::{
    EvaluatedReply, OnRefused, Rebind, RemoteLearner, RemoteShard, SnapshotReply, drive_link,
};
use rudra_actors::scheduler::SchedulerActor;
use rudra_actors::tracker::StalenessTracker;
use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint};
use rudra_transport::{Clock, Inbound, LearnerId, Msg, Role, ShardId};

use super::join::{Invitation, Joiner, read_join};

/// One node's place in the running job: its stand-in (which outlives any one connection), its
/// current connection and how many times it joined.
pub(super) struct Seat<R: Actor> {
    remote: Addr<R>,
    /// The incarnation of its first connection (1 in a job a restarted scheduler took back).
    first: u32,
    current: std::sync::Mutex<Option<(Peer, u32)>>,
    /// A shard's last clock reported (what it had when it was lost).
    clock: AtomicU64,
}

impl<R: Actor> Seat<R> {
    pub(super) fn new(remote: Addr<R>, first: u32) -> Self {
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
pub(super) struct Roster {
    pub(super) invitation: Invitation,
    pub(super) shards: Vec<Seat<RemoteShard>>,
    pub(super) learners: Vec<Seat<RemoteLearner>>,
    /// The groups' aggregators' connections, by group (they do not rejoin).
    pub(super) aggregators: Vec<Peer>,
    pub(super) tracker: Addr<StalenessTracker>,
    pub(super) scheduler: Addr<SchedulerActor>,
    /// How long a rejoin waits for the scheduler's word on the node it would replace.
    pub(super) failure_timeout: Duration,
}

/// Every heartbeat period, tell every node of the job that the scheduler is alive.
pub(super) async fn send_heartbeats(roster: Arc<Roster>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        for p in roster.peers() {
            // A node whose connection is gone is the failure detector's business.
            let _ = p.send(&Msg::Heartbeat).await;
        }
    }
}

/// A seat's id: a shard's or a learner's.
pub(super) trait SeatId: Copy + std::fmt::Display + Send + 'static {
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
    pub(super) fn seat<I: SeatId>(self: &Arc<Self>, id: I, j: Joiner) -> u32 {
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

    pub(super) fn peers(&self) -> Vec<Peer> {
        let shards = self.shards.iter().map(|s| s.current().as_ref().map(|(p, _)| p.clone()));
        let learners = self.learners.iter().map(|s| s.current().as_ref().map(|(p, _)| p.clone()));
        shards.chain(learners).flatten().chain(self.aggregators.iter().cloned()).collect()
    }
}

/// After the start: a node of the job that restarted or lost its connection joins again and
/// takes its seat (a shard must come back at the address the learners know); anyone else is
/// refused.
pub(super) async fn accept_rejoins(ep: QuicEndpoint, roster: Arc<Roster>) {
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
            if let Err(e) = peer.send(&inv.welcome((role, id as usize), incarnation)).await {
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

/// Watch group `g`'s aggregator until its connection ends or it is silent (it sends heartbeats)
/// for longer than the failure timeout: a group's rounds live in its aggregator, so losing it
/// fails the run.
pub(super) async fn watch_aggregator(g: usize, mut j: Joiner, roster: Arc<Roster>) {
    let silence = roster.failure_timeout;
    let why = loop {
        match tokio::time::timeout(silence, j.rx.recv()).await {
            Ok(Some(Inbound::Control(Msg::Heartbeat))) => {}
            Ok(Some(other)) => {
                tracing::warn!(
                    peer = j.peer.name(),
                    "{:?} is not a message an aggregator sends the scheduler",
                    other.kind()
                );
            }
            Ok(None) => match j.peer.ended().await {
                Ended::Closed { goodbye: Some(Goodbye::Failed), reason } => break reason,
                other => break other.to_string(),
            },
            Err(_) => break format!("silent for {silence:?}"),
        }
    };
    j.peer.close("lost by the scheduler");
    roster.scheduler.do_send(AggregatorLost { group: g as u32, why });
}
