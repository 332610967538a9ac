//! Actors on the other side of a QUIC connection. [`RemotePeer`] stands in for a remote node:
//! the actor messages sent to it leave as wire messages ([`codec::ToWire`]), and what arrives
//! from the node is decoded by [`codec`] into actor messages. Shards, learners and the scheduler
//! hold the same `Recipient`s whether their peers live in this process or not.
//!
//! A gradient over QUIC reads: learner actor → [`Push`] → this stand-in → [`codec::ToWire`] →
//! frame → the shard node's receive loop → [`codec::from_learner_data`] → [`Push`] → shard
//! actor → core.

pub mod codec;

use std::collections::{HashMap, VecDeque};

use actix::prelude::*;
use codec::ToWire;
use rudra_transport::quic::{Goodbye, Peer};
use rudra_transport::{Clock, Msg, ShardId};
use tokio::sync::oneshot;

use crate::messages::{
    Exchange, Heartbeat, LearnerDone, Membership, Progress, Pull, Push, Records, Served, Snapshot,
    StartLearner, StopLearner, StopShard,
};
use rudra_proto::Weights;

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
/// Snapshot requests not answered yet are asked again there, and a learner's last progress
/// and end are sent again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Rebind(pub Peer);

/// A holding stand-in keeps at most this many messages while its node is away; past it the
/// oldest go first.
pub const HELD_LIMIT: usize = 1 << 16;

/// A remote node: local messages in, wire messages out, in order and with flow control.
pub struct RemotePeer {
    /// The node's connection (none until it first connects, for a scheduler that took its job
    /// back).
    peer: Option<Peer>,
    /// The shard id of the remote shard (for snapshots it answers).
    shard: ShardId,
    next_request: u64,
    pending: HashMap<u64, oneshot::Sender<Weights>>,
    /// Where the remote shard's answers go.
    reply_to: Option<Recipient<Served>>,
    /// With [`RemotePeer::holding`]: what could not be sent while the connection was down, in
    /// order, to go out on the next [`Rebind`]. Without it a message that cannot go is lost.
    held: Option<VecDeque<Msg>>,
    /// With [`RemotePeer::holding`]: the last progress totals and the end a learner sent. Both
    /// tell where the learner stands whenever they arrive, so they go again on every new
    /// connection: one sent into a connection that had just died is not lost.
    last_progress: Option<Msg>,
    /// See `last_progress`.
    end: Option<Msg>,
}

impl RemotePeer {
    /// A stand-in for the node behind `peer`; `shard` names it when it is a shard.
    #[must_use]
    pub fn new(peer: Peer, shard: ShardId) -> Self {
        Self { peer: Some(peer), ..Self::unbound(shard) }
    }

    /// A stand-in for a node not connected yet: what it is sent is lost (or held, when
    /// [`RemotePeer::holding`]) until a [`Rebind`] gives it a connection.
    #[must_use]
    pub fn unbound(shard: ShardId) -> Self {
        let (pending, reply_to) = (HashMap::new(), None);
        Self {
            peer: None,
            shard,
            next_request: 0,
            pending,
            reply_to,
            held: None,
            last_progress: None,
            end: None,
        }
    }

    /// The node's name, for the log.
    fn name(&self) -> &str {
        self.peer.as_ref().map_or("a node not connected yet", Peer::name)
    }

    /// Keep what cannot be sent while the connection is down (heartbeats aside, at most
    /// [`HELD_LIMIT`] messages) and send it, in order, once the node is back ([`Rebind`]): a
    /// node's reports to a scheduler that restarts.
    #[must_use]
    pub fn holding(mut self) -> Self {
        self.held = Some(VecDeque::new());
        self
    }

    /// Send `msg` before handling the next message (keeps order; waits on flow control). A
    /// holding stand-in keeps it while the connection is down or others wait before it.
    fn send(&mut self, msg: Msg, ctx: &mut Context<Self>) {
        self.send_all(vec![msg], ctx);
    }

    /// Send `msgs` in order, as [`RemotePeer::send`] sends one (several waits started in one
    /// handler would run last first). Of a holding stand-in, those not sent are kept.
    fn send_all(&mut self, mut msgs: Vec<Msg>, ctx: &mut Context<Self>) {
        if self.held.is_some() {
            for msg in &msgs {
                match msg {
                    Msg::Progress { .. } => self.last_progress = Some(msg.clone()),
                    Msg::LearnerDone { .. } => self.end = Some(msg.clone()),
                    _ => {}
                }
            }
        }
        let closed = self.peer.as_ref().is_none_or(Peer::is_closed);
        if let Some(held) = &mut self.held
            && (closed || !held.is_empty())
        {
            let name = self.peer.as_ref().map_or("", Peer::name);
            return msgs.into_iter().for_each(|msg| hold(held, msg, name));
        }
        let Some(peer) = self.peer.clone() else {
            return tracing::debug!("{} messages not sent: the node has not connected", msgs.len());
        };
        let sending = async move {
            for (i, msg) in msgs.iter().enumerate() {
                if let Err(e) = peer.send(msg).await {
                    return Some((e, msgs.split_off(i)));
                }
            }
            None
        };
        ctx.wait(sending.into_actor(self).map(|unsent, act, _| {
            let Some((e, unsent)) = unsent else { return };
            let name = act.name().to_owned();
            match &mut act.held {
                Some(held) => unsent.into_iter().for_each(|msg| hold(held, msg, &name)),
                None => tracing::warn!(peer = name, "{e}"),
            }
        }));
    }
}

/// Keep `msg` for later: a heartbeat is stale by then and is not kept, and a progress report
/// replaces the one before it in a row (each carries the learner's totals).
fn hold(held: &mut VecDeque<Msg>, msg: Msg, peer: &str) {
    if matches!(msg, Msg::Heartbeat) {
        return;
    }
    if let (Some(last @ Msg::Progress { .. }), Msg::Progress { .. }) = (held.back_mut(), &msg) {
        *last = msg;
        return;
    }
    if held.is_empty() {
        tracing::info!(peer, "the connection is down: keeping what is sent until it is back");
    }
    let full = held.len() == HELD_LIMIT;
    if full {
        held.pop_front();
    }
    held.push_back(msg);
    if !full && held.len() == HELD_LIMIT {
        tracing::warn!(
            peer,
            "{HELD_LIMIT} messages wait for the connection; from now on the oldest are dropped"
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
        let Some(peer) = self.peer.clone() else { return };
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
            None => tracing::warn!(peer = self.name(), "weights nobody asked for"),
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
        self.peer = Some(peer);
        let mut asked: Vec<u64> = self.pending.keys().copied().collect();
        asked.sort_unstable();
        let waiting = self.held.as_mut().map(std::mem::take).unwrap_or_default();
        if !waiting.is_empty() {
            tracing::info!(peer = self.name(), "sending the {} messages kept meanwhile", waiting.len());
        }
        let asked = asked.into_iter().map(|request| Msg::SnapshotRequest { request });
        let standing = self.last_progress.iter().chain(&self.end).cloned();
        self.send_all(asked.chain(waiting).chain(standing).collect(), ctx);
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

#[cfg(test)]
mod tests {
    use rudra_transport::LearnerId;

    use super::*;

    fn progress(samples: u64) -> Msg {
        let learner = LearnerId(0);
        Msg::Progress {
            learner,
            session: 7,
            samples,
            steps: 1,
            loss_sum: 0.5,
            payload_bytes: 10,
            wire_bytes: 20,
        }
    }

    #[test]
    fn held_reports_keep_their_order_keep_the_latest_totals_and_drop_heartbeats() {
        let mut held = VecDeque::new();
        for m in [progress(32), Msg::Heartbeat, progress(64), Msg::Ready, progress(96)] {
            hold(&mut held, m, "scheduler");
        }
        assert_eq!(Vec::from(held), vec![progress(64), Msg::Ready, progress(96)]);
    }

    #[test]
    fn a_full_hold_drops_the_oldest() {
        let mut held = VecDeque::new();
        for n in 0..=HELD_LIMIT as u64 {
            hold(&mut held, Msg::Ready, "scheduler");
            hold(&mut held, progress(n), "scheduler");
        }
        assert_eq!(held.len(), HELD_LIMIT);
        assert_eq!(held.back(), Some(&progress(HELD_LIMIT as u64)));
    }
}
