//! What every stand-in shares: its node's connection, sending in order with flow control, and
//! for the stand-in of a scheduler, what waits while that connection is down.

use std::collections::VecDeque;

use actix::prelude::*;
use rudra_transport::Msg;
use rudra_transport::quic::{Goodbye, Peer};

/// A stand-in that holds this many messages while its node is away drops the oldest past it.
pub const HELD_LIMIT: usize = 1 << 16;

/// One node's connection as a stand-in sends on it.
pub struct Outbox {
    /// The node's connection (none until it first connects, for the stand-in of a learner a
    /// restarted scheduler waits for).
    peer: Option<Peer>,
    /// With [`Outbox::holding`]: what could not be sent while the connection was down, in
    /// order, to go out on the next rebind. Without it a message that cannot go is lost.
    held: Option<VecDeque<Msg>>,
    /// With [`Outbox::holding`]: the last progress totals and the end a learner sent. Both
    /// say where the learner stands whenever they arrive, so they go again on every new
    /// connection: one sent into a connection that had just died is not lost.
    standing: [Option<Msg>; 2],
}

impl Outbox {
    /// Sends to the node behind `peer`.
    #[must_use]
    pub fn to(peer: Peer) -> Self {
        Self { peer: Some(peer), ..Self::unbound() }
    }

    /// For a node not connected yet: what it is sent is lost (or held, when
    /// [`Outbox::holding`]) until a rebind gives it a connection.
    #[must_use]
    pub fn unbound() -> Self {
        Self { peer: None, held: None, standing: [None, None] }
    }

    /// Keep what cannot be sent while the connection is down (heartbeats aside, at most
    /// [`HELD_LIMIT`] messages) and send it, in order, once the node is back: a node's reports
    /// to a scheduler that restarts.
    #[must_use]
    pub fn holding(mut self) -> Self {
        self.held = Some(VecDeque::new());
        self
    }

    /// The node's name, for the log.
    fn name(&self) -> &str {
        self.peer.as_ref().map_or("a node not connected yet", Peer::name)
    }

    /// Take `peer` as the node's connection: what goes out first on it, after `asked_again`
    /// (what the stand-in asked and was not answered), is what was held meanwhile, then where
    /// a learner stands.
    fn rebind(&mut self, peer: Peer, asked_again: Vec<Msg>) -> Vec<Msg> {
        self.peer = Some(peer);
        let waiting = self.held.as_mut().map(std::mem::take).unwrap_or_default();
        if !waiting.is_empty() {
            tracing::info!(peer = self.name(), "sending the {} messages kept meanwhile", waiting.len());
        }
        let standing = self.standing.iter().flatten().cloned();
        asked_again.into_iter().chain(waiting).chain(standing).collect()
    }
}

/// An actor standing in for a node on the other side of a connection.
pub trait StandIn: Actor<Context = Context<Self>> {
    /// Its connection.
    fn outbox(&mut self) -> &mut Outbox;

    /// What it asked and was not answered, to ask again on a new connection.
    fn asked_again(&mut self) -> Vec<Msg> {
        Vec::new()
    }
}

/// Send `msg` before `act` handles its next message (keeps order; waits on flow control).
pub(super) fn send<A: StandIn>(act: &mut A, msg: Msg, ctx: &mut Context<A>) {
    send_all(act, vec![msg], ctx);
}

/// Send `msgs` in order, as [`send`] sends one (several waits started in one handler would run
/// last first). A holding stand-in keeps those not sent, and keeps everything while the
/// connection is down or others wait before it.
pub(super) fn send_all<A: StandIn>(act: &mut A, mut msgs: Vec<Msg>, ctx: &mut Context<A>) {
    let out = act.outbox();
    if out.held.is_some() {
        for msg in &msgs {
            match msg {
                Msg::Progress { .. } => out.standing[0] = Some(msg.clone()),
                Msg::LearnerDone { .. } => out.standing[1] = Some(msg.clone()),
                _ => {}
            }
        }
    }
    let closed = out.peer.as_ref().is_none_or(Peer::is_closed);
    if let Some(held) = &mut out.held
        && (closed || !held.is_empty())
    {
        let name = out.peer.as_ref().map_or("", Peer::name);
        return msgs.into_iter().for_each(|msg| hold(held, msg, name));
    }
    let Some(peer) = out.peer.clone() else {
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
    ctx.wait(sending.into_actor(act).map(|unsent, act, _| {
        let Some((e, unsent)) = unsent else { return };
        let out = act.outbox();
        let name = out.name().to_owned();
        match &mut out.held {
            Some(held) => unsent.into_iter().for_each(|msg| hold(held, msg, &name)),
            None => tracing::warn!(peer = name, "{e}"),
        }
    }));
}

/// The end of the run for the node: a stop, or, when the run failed, a goodbye saying why
/// (after everything sent before it).
pub(super) fn stop<A: StandIn>(act: &mut A, failure: Option<String>, ctx: &mut Context<A>) {
    let Some(why) = failure else { return send(act, Msg::Stop, ctx) };
    let Some(peer) = act.outbox().peer.clone() else { return };
    ctx.wait(async move { peer.say_goodbye(Goodbye::RunFailed, &why) }.into_actor(act));
}

/// Take a new connection and send what goes first on it.
pub(super) fn rebind<A: StandIn>(act: &mut A, peer: Peer, ctx: &mut Context<A>) {
    let asked = act.asked_again();
    let msgs = act.outbox().rebind(peer, asked);
    send_all(act, msgs, ctx);
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
            payload_up: 4,
            payload_down: 6,
            compute_seconds: 0.5,
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
