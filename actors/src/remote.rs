//! Actors on the other side of a QUIC connection: [`RemotePeer`] stands in for a remote node
//! and turns the local actor messages sent to it into wire messages, so shards, learners and
//! the scheduler hold the same `Recipient`s whether their peers live in this process or not.

use std::collections::HashMap;

use actix::prelude::*;
use rudra_transport::quic::Peer;
use rudra_transport::wire::{GradientReport, UpdateReport};
use rudra_transport::{Clock, LearnerId, Msg, ShardId, Staleness};
use tokio::sync::oneshot;

use crate::learner::{StartLearner, StopLearner};
use crate::protocol::{DropReason, GradientRecord, Outcome, UpdateRecord, Weights};
use crate::scheduler::{Heartbeat, LearnerDone, Progress};
use crate::shard::{Exchange, Membership, Pull, Push, Served, Snapshot, StopShard};
use crate::tracker::Records;

/// A shard's answer to a snapshot request, delivered by the connection's reader.
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

/// The remote node reconnected (or restarted and rejoined): send to it on `peer` from now on.
/// Snapshot requests not answered yet are asked again there.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Rebind(pub Peer);

/// A remote node: local messages in, wire messages out, in order and with flow control.
pub struct RemotePeer {
    peer: Peer,
    /// The shard id of the remote shard (for snapshots it answers).
    shard: ShardId,
    next_request: u64,
    pending: HashMap<u64, oneshot::Sender<Weights>>,
}

impl RemotePeer {
    /// A stand-in for the node behind `peer`; `shard` names it when it is a shard.
    #[must_use]
    pub fn new(peer: Peer, shard: ShardId) -> Self {
        Self { peer, shard, next_request: 0, pending: HashMap::new() }
    }

    /// Send `msg` before handling the next message (keeps order; waits on flow control).
    fn send(&mut self, msg: Msg, ctx: &mut Context<Self>) {
        let peer = self.peer.clone();
        ctx.wait(
            async move {
                if let Err(e) = peer.send(&msg).await {
                    tracing::warn!(peer = peer.name(), "{e}");
                }
            }
            .into_actor(self),
        );
    }
}

impl Actor for RemotePeer {
    type Context = Context<Self>;
}

/// A shard's records as a wire message.
#[must_use]
pub fn records_to_wire(r: &Records) -> Msg {
    Msg::Records {
        gradients: r
            .gradients
            .iter()
            .map(|g| {
                let (alpha, dropped) = match g.outcome {
                    Outcome::Applied { alpha } => (alpha, 0),
                    Outcome::Dropped(DropReason::TooStale) => (0.0, 1),
                    Outcome::Dropped(DropReason::StaleRound) => (0.0, 2),
                    Outcome::Dropped(DropReason::RolledBack) => (0.0, 3),
                    Outcome::Dropped(DropReason::Lapsed) => (0.0, 4),
                };
                GradientReport {
                    learner: g.learner.0,
                    computed_on: g.computed_on.0,
                    staleness: g.staleness.0,
                    alpha,
                    dropped,
                }
            })
            .collect(),
        updates: r
            .updates
            .iter()
            .map(|u| UpdateReport { clock: u.clock.0, gradients: u.gradients as u32 })
            .collect(),
    }
}

/// Records received from shard `shard`, back as tracker input.
#[must_use]
pub fn records_from_wire(shard: ShardId, gradients: &[GradientReport], updates: &[UpdateReport]) -> Records {
    Records {
        gradients: gradients
            .iter()
            .map(|g| GradientRecord {
                shard,
                learner: LearnerId(g.learner),
                computed_on: Clock(g.computed_on),
                staleness: Staleness(g.staleness),
                outcome: match g.dropped {
                    0 => Outcome::Applied { alpha: g.alpha },
                    1 => Outcome::Dropped(DropReason::TooStale),
                    3 => Outcome::Dropped(DropReason::RolledBack),
                    4 => Outcome::Dropped(DropReason::Lapsed),
                    _ => Outcome::Dropped(DropReason::StaleRound),
                },
            })
            .collect(),
        updates: updates
            .iter()
            .map(|u| UpdateRecord { shard, clock: Clock(u.clock), gradients: u.gradients as usize })
            .collect(),
    }
}

/// Forwards a message to the remote node as the wire message `to_wire` makes of it.
macro_rules! forward {
    ($msg:ty, |$m:ident| $to_wire:expr) => {
        impl Handler<$msg> for RemotePeer {
            type Result = ();
            fn handle(&mut self, $m: $msg, ctx: &mut Context<Self>) {
                self.send($to_wire, ctx);
            }
        }
    };
}

forward!(Records, |m| records_to_wire(&m));
forward!(StopShard, |_m| Msg::Stop);
forward!(Membership, |m| Msg::Membership { active: m.active.iter().map(|l| l.0).collect() });
forward!(Heartbeat, |_m| Msg::Heartbeat);
forward!(StartLearner, |_m| Msg::Start);
forward!(StopLearner, |_m| Msg::Stop);
forward!(Progress, |m| Msg::Progress {
    learner: m.learner.0,
    samples: m.samples,
    steps: m.steps,
    loss_sum: m.loss_sum
});
forward!(LearnerDone, |m| Msg::LearnerDone { error: m.error });
forward!(Pull, |m| Msg::Pull { learner: m.learner.0, seq: m.seq, last: m.last });
forward!(Push, |m| Msg::Push {
    learner: m.learner.0,
    seq: m.seq,
    computed_on: m.computed_on.0,
    values: m.values,
});
forward!(Exchange, |m| Msg::Exchange { learner: m.learner.0, values: m.values });
forward!(AnswerSnapshot, |m| Msg::Snapshot {
    request: m.request,
    clock: m.weights.clock.0,
    values: m.weights.values
});
forward!(Served, |m| Msg::Weights {
    shard: m.weights.shard.0,
    seq: m.seq,
    clock: m.weights.clock.0,
    values: m.weights.values
});

impl Handler<Snapshot> for RemotePeer {
    type Result = ResponseFuture<Weights>;
    fn handle(&mut self, _: Snapshot, ctx: &mut Context<Self>) -> Self::Result {
        let request = self.next_request;
        self.next_request += 1;
        let (tx, rx) = oneshot::channel();
        self.pending.insert(request, tx);
        self.send(Msg::SnapshotRequest { request }, ctx);
        let shard = self.shard;
        Box::pin(async move {
            // A shard that goes away answers with nothing; evaluation then sees no weights.
            rx.await.unwrap_or(Weights { shard, clock: Clock(0), values: Vec::new().into() })
        })
    }
}

impl Handler<Rebind> for RemotePeer {
    type Result = ();
    fn handle(&mut self, Rebind(peer): Rebind, ctx: &mut Context<Self>) {
        self.peer = peer;
        let mut asked: Vec<u64> = self.pending.keys().copied().collect();
        asked.sort_unstable();
        for request in asked {
            self.send(Msg::SnapshotRequest { request }, ctx);
        }
    }
}

impl Handler<SnapshotReply> for RemotePeer {
    type Result = ();
    fn handle(&mut self, msg: SnapshotReply, _: &mut Context<Self>) {
        if let Some(tx) = self.pending.remove(&msg.request) {
            let _ = tx.send(msg.weights);
        }
    }
}
