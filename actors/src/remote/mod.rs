//! Actors on the other side of a QUIC connection. [`RemotePeer`] stands in for a remote node:
//! the actor messages sent to it leave as wire messages ([`codec::ToWire`]), and what arrives
//! from the node is decoded by [`codec`] into actor messages. Shards, learners and the scheduler
//! hold the same `Recipient`s whether their peers live in this process or not.
//!
//! A gradient over QUIC reads: learner actor → [`Push`] → this stand-in → [`codec::ToWire`] →
//! frame → the shard node's receive loop → [`codec::from_learner_data`] → [`Push`] → shard
//! actor → core.

pub mod codec;

use std::collections::HashMap;

use actix::prelude::*;
use codec::ToWire;
use rudra_transport::quic::{Goodbye, Peer};
use rudra_transport::{Clock, Msg, ShardId};
use tokio::sync::oneshot;

use crate::messages::{
    Exchange, Heartbeat, LearnerDone, Membership, Progress, Pull, Push, Records, Served, Snapshot,
    StartLearner, StopLearner, StopShard,
};
use crate::protocol::Weights;

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

/// Weights that arrived from the remote shard: handed to whoever asked last (the `reply_to` of
/// the latest pull or exchange sent through this stand-in), as a local shard would answer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Arrived(pub Served);

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
    /// Where the remote shard's answers go.
    reply_to: Option<Recipient<Served>>,
}

impl RemotePeer {
    /// A stand-in for the node behind `peer`; `shard` names it when it is a shard.
    #[must_use]
    pub fn new(peer: Peer, shard: ShardId) -> Self {
        Self { peer, shard, next_request: 0, pending: HashMap::new(), reply_to: None }
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

/// Forwards a message to the remote node as its wire form.
macro_rules! forward {
    ($($msg:ty),*) => {$(
        impl Handler<$msg> for RemotePeer {
            type Result = ();
            fn handle(&mut self, m: $msg, ctx: &mut Context<Self>) {
                self.send(m.to_wire(), ctx);
            }
        }
    )*};
}

forward!(Records, Membership, Heartbeat, StartLearner, Progress, LearnerDone, Push, Served);

impl RemotePeer {
    /// The end of the run: a stop, or, when the run failed, a goodbye saying why (after
    /// everything sent before it).
    fn stop(&mut self, failure: Option<String>, ctx: &mut Context<Self>) {
        let Some(why) = failure else { return self.send(Msg::Stop, ctx) };
        let peer = self.peer.clone();
        ctx.wait(async move { peer.say_goodbye(Goodbye::RunFailed, &why) }.into_actor(self));
    }
}

impl Handler<StopShard> for RemotePeer {
    type Result = ();
    fn handle(&mut self, m: StopShard, ctx: &mut Context<Self>) {
        self.stop(m.failure, ctx);
    }
}

impl Handler<StopLearner> for RemotePeer {
    type Result = ();
    fn handle(&mut self, m: StopLearner, ctx: &mut Context<Self>) {
        self.stop(m.failure, ctx);
    }
}

impl Handler<Pull> for RemotePeer {
    type Result = ();
    fn handle(&mut self, m: Pull, ctx: &mut Context<Self>) {
        self.reply_to = Some(m.reply_to.clone());
        self.send(m.to_wire(), ctx);
    }
}

impl Handler<Exchange> for RemotePeer {
    type Result = ();
    fn handle(&mut self, m: Exchange, ctx: &mut Context<Self>) {
        self.reply_to = Some(m.reply_to.clone());
        self.send(m.to_wire(), ctx);
    }
}

impl Handler<Arrived> for RemotePeer {
    type Result = ();
    fn handle(&mut self, Arrived(served): Arrived, _: &mut Context<Self>) {
        match &self.reply_to {
            Some(to) => to.do_send(served),
            None => tracing::warn!(peer = self.peer.name(), "weights nobody asked for"),
        }
    }
}

impl Handler<AnswerSnapshot> for RemotePeer {
    type Result = ();
    fn handle(&mut self, m: AnswerSnapshot, ctx: &mut Context<Self>) {
        let Weights { clock, values, .. } = m.weights;
        self.send(Msg::Snapshot { request: m.request, clock, values }, ctx);
    }
}

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
