//! A shard's, a learner's or an aggregator's uplink to the scheduler: its connection and messages, the
//! scheduler's silence against the failure timeout, and joining again when the scheduler is
//! lost (the node's reports wait in its [`RemoteScheduler`] meanwhile and follow on the new
//! connection).

use std::time::{Duration, Instant};

use actix::Addr;
use rudra_actors::faults::Liveness;
use rudra_actors::remote::{Rebind, RemoteScheduler};
use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint};
use rudra_transport::{Inbound, Msg, Role};
use tokio::sync::mpsc;
use tokio::time::Interval;

use super::NodeOptions;
use super::join::{lost_or_final, rejoin};
use crate::RuntimeError;

/// A node's link to the scheduler (its uplink).
pub(super) struct UpLink {
    peer: Peer,
    rx: mpsc::Receiver<Inbound>,
    /// This node's role and the job it is in, to join again as.
    role: Role,
    job: String,
    /// Where the node's reports leave; rebound on every new connection.
    reports: Addr<RemoteScheduler>,
    /// When the scheduler was last heard from. It is watched once its heartbeats have begun
    /// (it starts them when every node has joined).
    heard: Option<Instant>,
    timeout: Duration,
    tick: Interval,
}

impl UpLink {
    /// The link over `peer` (and its messages `rx`) of a node of `role` in run `job`.
    pub(super) fn new(
        (peer, rx): (Peer, mpsc::Receiver<Inbound>),
        (role, job): (Role, &str),
        liveness: Liveness,
    ) -> Self {
        let reports = actix::Actor::start(RemoteScheduler::new(peer.clone()));
        // A node slow to get going (loading its data) sends one heartbeat when it looks, not a
        // burst of those it missed.
        let mut tick = tokio::time::interval(liveness.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            peer,
            rx,
            role,
            job: job.to_owned(),
            reports,
            heard: None,
            timeout: liveness.failure_timeout,
            tick,
        }
    }

    /// Where the node's reports to the scheduler go.
    pub(super) fn reports(&self) -> &Addr<RemoteScheduler> {
        &self.reports
    }

    /// The current connection.
    pub(super) fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The scheduler's next message. A lost connection, or a scheduler silent for longer than
    /// the failure timeout, is joined again here; an error ends the node's run: the run failed
    /// or this node was refused, or the scheduler was not back within `--connect-timeout`. A
    /// shard or an aggregator sends its heartbeat on every tick (a learner's come from its actor).
    pub(super) async fn next(
        &mut self,
        ep: &QuicEndpoint,
        opts: &NodeOptions,
    ) -> Result<Inbound, RuntimeError> {
        loop {
            let lost = tokio::select! {
                m = self.rx.recv() => match m {
                    Some(m) => {
                        self.heard = Some(Instant::now());
                        return Ok(m);
                    }
                    None => match self.peer.ended().await {
                        // The scheduler ended the run (or gave this node's seat to a newer
                        // process of it) while this node was away: as good as a stop.
                        Ended::Closed { goodbye: Some(Goodbye::Stopped), reason } => {
                            tracing::warn!("the scheduler closed the connection ({reason}): the run is over for this node");
                            return Ok(Inbound::Control(Msg::Stop));
                        }
                        ended => lost_or_final(ended)?,
                    },
                },
                _ = self.tick.tick() => match self.heard.map(|t| t.elapsed()).filter(|&d| d > self.timeout) {
                    Some(silent) => format!("the scheduler was silent for {silent:.1?}"),
                    None => {
                        if self.role != Role::Learner {
                            let _ = self.peer.send(&Msg::Heartbeat).await;
                        }
                        continue;
                    }
                },
            };
            let (peer, rx) = rejoin(ep, opts, (self.role, &self.job), &self.peer, &lost).await?;
            self.reports.do_send(Rebind(peer.clone()));
            (self.peer, self.rx, self.heard) = (peer, rx, Some(Instant::now()));
        }
    }
}
