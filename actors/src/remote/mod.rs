//! Actors on the other side of a QUIC connection. A stand-in takes the actor messages its
//! node's role takes, and sends them as wire messages ([`codec::ToWire`]); what arrives from
//! the node is decoded by [`codec`] into actor messages for the actor it is meant for. Shards,
//! learners and the scheduler hold the same `Recipient`s whether their peers live in this
//! process or not. There is one stand-in per role, holding its node's real id:
//! - [`RemoteShard`] takes what a shard takes: pulls, pushes and exchanges from a learner, aggregates from a group's aggregator;
//!   snapshot requests, membership and the stop from the scheduler.
//! - [`RemoteLearner`] takes what a learner takes: a shard's weights and centers; the start and
//!   the stop.
//! - [`RemoteAggregator`] takes what a learner group's aggregator takes from the scheduler:
//!   membership.
//! - [`RemoteScheduler`] takes what the scheduler takes: a shard's records, snapshots and
//!   resumption, a learner's progress, end and heartbeats. It keeps them while the scheduler is
//!   away.
//!
//! Each connection's incoming messages are driven by [`drive_link`], with the handler of its peer's
//! role.
//!
//! A gradient over QUIC reads: learner actor → [`Push`] → [`RemoteShard`] →
//! [`codec::ToWire`] → frame → the shard node's link → [`codec::from_learner_data`] → [`Push`]
//! → shard actor → core; the answer goes back through the shard node's [`RemoteLearner`], and
//! the learner node's link hands it to the learner.

pub mod codec;
mod link;
mod outbox;

use std::collections::HashMap;

use actix::prelude::*;
use codec::ToWire;
pub use link::{OnRefused, drive_link};
pub use outbox::{HELD_LIMIT, Outbox, StandIn};
use outbox::{rebind, send, send_all, stop};
use rudra_transport::quic::Peer;
use rudra_transport::{Clock, Floats, LearnerId, Msg, ShardId};
use tokio::sync::oneshot;

use crate::messages::{
    Aggregate, BatchSizes, Center, Evaluate, Exchange, Heartbeat, LearnerDone, Measured, Membership,
    Progress, Pull, Push, Records, Resumed, Served, Snapshot, StartLearner, StopLearner, StopShard,
};
use rudra_proto::Weights;

/// The remote node reconnected (or restarted and rejoined): send to it on this connection from
/// now on. What its stand-in asked and was not answered is asked again there, and what a
/// holding stand-in kept follows.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Rebind(pub Peer);

/// A shard's answer to a snapshot request, handed by the shard's link to its stand-in.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SnapshotReply {
    /// The request answered.
    pub request: u64,
    /// The weights.
    pub weights: Weights,
}

/// Send a shard's answer to a snapshot request to the remote scheduler.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AnswerSnapshot {
    /// The request answered.
    pub request: u64,
    /// The weights.
    pub weights: Weights,
}

/// A learner's answer to an evaluation request, handed by the learner's link to its stand-in.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EvaluatedReply {
    /// The request answered.
    pub request: u64,
    /// What the learner measured, if it evaluates.
    pub measured: Option<Measured>,
}

/// Send a learner's answer to an evaluation request to the remote scheduler.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AnswerEvaluate {
    /// The request answered.
    pub request: u64,
    /// What the learner measured, if it evaluates.
    pub measured: Option<Measured>,
}

/// A stand-in's actor, its [`Rebind`], and the messages it sends as their wire form.
macro_rules! stand_in {
    ($t:ty, forwards: $($msg:ty),*) => {
        impl Actor for $t {
            type Context = Context<Self>;
        }

        impl Handler<Rebind> for $t {
            type Result = ();
            fn handle(&mut self, Rebind(peer): Rebind, ctx: &mut Context<Self>) {
                rebind(self, peer, ctx);
            }
        }

        $(
            impl Handler<$msg> for $t {
                type Result = ();
                fn handle(&mut self, m: $msg, ctx: &mut Context<Self>) {
                    send(self, m.to_wire(), ctx);
                }
            }
        )*
    };
}

/// A shard on another node.
pub struct RemoteShard {
    id: ShardId,
    out: Outbox,
    next_request: u64,
    /// Snapshot requests not answered yet.
    pending: HashMap<u64, oneshot::Sender<Weights>>,
}

impl RemoteShard {
    /// Shard `id`, behind `peer`.
    #[must_use]
    pub fn new(id: ShardId, peer: Peer) -> Self {
        Self { id, out: Outbox::to(peer), next_request: 0, pending: HashMap::new() }
    }
}

impl StandIn for RemoteShard {
    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }

    fn asked_again(&mut self) -> Vec<Msg> {
        let mut asked: Vec<u64> = self.pending.keys().copied().collect();
        asked.sort_unstable();
        asked.into_iter().map(|request| Msg::SnapshotRequest { request }).collect()
    }
}

stand_in!(RemoteShard, forwards: Pull, Push, Aggregate, Exchange, Membership);

impl Handler<StopShard> for RemoteShard {
    type Result = ();
    fn handle(&mut self, m: StopShard, ctx: &mut Context<Self>) {
        stop(self, m.failure, ctx);
    }
}

impl Handler<Snapshot> for RemoteShard {
    type Result = ResponseFuture<Weights>;
    fn handle(&mut self, _: Snapshot, ctx: &mut Context<Self>) -> Self::Result {
        let request = self.next_request;
        self.next_request += 1;
        let (tx, rx) = oneshot::channel();
        self.pending.insert(request, tx);
        send(self, Msg::SnapshotRequest { request }, ctx);
        let shard = self.id;
        Box::pin(async move {
            // A shard that goes away answers with nothing; evaluation then sees no weights.
            rx.await.unwrap_or(Weights { shard, clock: Clock(0), values: Vec::new().into() })
        })
    }
}

impl Handler<SnapshotReply> for RemoteShard {
    type Result = ();
    fn handle(&mut self, msg: SnapshotReply, _: &mut Context<Self>) {
        match self.pending.remove(&msg.request) {
            Some(tx) => drop(tx.send(msg.weights)),
            None => tracing::debug!(shard = %self.id, "a snapshot nobody waits for: request {}", msg.request),
        }
    }
}

/// A learner group's aggregator on another node: told who is active, as the shards are.
pub struct RemoteAggregator {
    out: Outbox,
}

impl RemoteAggregator {
    /// The aggregator behind `peer`.
    #[must_use]
    pub fn new(peer: Peer) -> Self {
        Self { out: Outbox::to(peer) }
    }
}

impl StandIn for RemoteAggregator {
    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }
}

stand_in!(RemoteAggregator, forwards: Membership);

/// A learner on another node.
pub struct RemoteLearner {
    id: LearnerId,
    out: Outbox,
    next_request: u64,
    /// Evaluation requests not answered yet (a request lost with its connection is not asked
    /// again: the scheduler's wait for it times out).
    pending: HashMap<u64, oneshot::Sender<Option<Measured>>>,
}

impl RemoteLearner {
    /// Learner `id`, behind `peer`.
    #[must_use]
    pub fn new(id: LearnerId, peer: Peer) -> Self {
        Self { id, out: Outbox::to(peer), next_request: 0, pending: HashMap::new() }
    }

    /// Learner `id`, not connected yet (a restarted scheduler waits for it to come back).
    #[must_use]
    pub fn unbound(id: LearnerId) -> Self {
        Self { id, out: Outbox::unbound(), next_request: 0, pending: HashMap::new() }
    }

    /// The learner's id.
    #[must_use]
    pub fn id(&self) -> LearnerId {
        self.id
    }
}

impl StandIn for RemoteLearner {
    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }
}

stand_in!(RemoteLearner, forwards: Center, StartLearner, BatchSizes);

impl Handler<Served> for RemoteLearner {
    type Result = ();
    fn handle(&mut self, m: Served, ctx: &mut Context<Self>) {
        send(self, codec::weights(self.id, m), ctx);
    }
}

impl Handler<StopLearner> for RemoteLearner {
    type Result = ();
    fn handle(&mut self, m: StopLearner, ctx: &mut Context<Self>) {
        match (m.failure, m.summary) {
            // In one send: the summary arrives before the stop.
            (None, Some(json)) => {
                send_all(self, vec![Msg::Summary { json: json.to_string() }, Msg::Stop], ctx)
            }
            (failure, _) => stop(self, failure, ctx),
        }
    }
}

impl Handler<Evaluate> for RemoteLearner {
    type Result = ResponseFuture<Option<Measured>>;
    fn handle(&mut self, m: Evaluate, ctx: &mut Context<Self>) -> Self::Result {
        let request = self.next_request;
        self.next_request += 1;
        let (tx, rx) = oneshot::channel();
        self.pending.insert(request, tx);
        send(self, Msg::Evaluate { request, last: m.last, values: Floats::from(m.params) }, ctx);
        Box::pin(async move { rx.await.ok().flatten() })
    }
}

impl Handler<EvaluatedReply> for RemoteLearner {
    type Result = ();
    fn handle(&mut self, msg: EvaluatedReply, _: &mut Context<Self>) {
        match self.pending.remove(&msg.request) {
            Some(tx) => drop(tx.send(msg.measured)),
            None => {
                tracing::debug!(learner = %self.id, "an evaluation nobody waits for: request {}", msg.request)
            }
        }
    }
}

/// The scheduler on another node, as a shard or a learner reports to it. What cannot be sent
/// while it is away is kept and follows once it is back.
pub struct RemoteScheduler {
    out: Outbox,
}

impl RemoteScheduler {
    /// The scheduler behind `peer`.
    #[must_use]
    pub fn new(peer: Peer) -> Self {
        Self { out: Outbox::to(peer).holding() }
    }
}

impl StandIn for RemoteScheduler {
    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }
}

stand_in!(RemoteScheduler, forwards: Records, Resumed, Progress, LearnerDone, Heartbeat);

impl Handler<AnswerEvaluate> for RemoteScheduler {
    type Result = ();
    fn handle(&mut self, m: AnswerEvaluate, ctx: &mut Context<Self>) {
        let measured = m.measured.map(|Measured { loss, accuracy }| (loss, accuracy));
        send(self, Msg::Evaluated { request: m.request, measured }, ctx);
    }
}

impl Handler<AnswerSnapshot> for RemoteScheduler {
    type Result = ();
    fn handle(&mut self, m: AnswerSnapshot, ctx: &mut Context<Self>) {
        let Weights { clock, values, .. } = m.weights;
        send(self, Msg::Snapshot { request: m.request, clock, values }, ctx);
    }
}
