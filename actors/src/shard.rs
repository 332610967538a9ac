//! The shard actor: a thin shell over [`SgdShard`].

use std::collections::BTreeMap;

use actix::prelude::*;
use rudra_transport::{Clock, Floats, LearnerId};

use crate::metrics::ShardMetrics;
use crate::protocol::{SgdShard, ShardEvent, Weights};
use crate::tracker::Records;

/// A learner asks for the shard's weights; they are sent to `reply_to`, maybe later.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Pull {
    /// Who asks.
    pub learner: LearnerId,
    /// Whether the learner has pushed its last gradient (see [`SgdShard::on_last_pull`]).
    pub last: bool,
    /// Where the weights go.
    pub reply_to: Recipient<Served>,
}

/// Weights served to a learner.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Served(pub Weights);

/// A learner's gradient for this shard's range, viewed in the learner's gradient buffer (or in
/// the frame it arrived in), never copied.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Push {
    /// Who computed it.
    pub learner: LearnerId,
    /// The clock of this shard's weights it was computed on.
    pub computed_on: Clock,
    /// This shard's part of the gradient.
    pub values: Floats,
}

/// The current weights, without gating, for evaluation and checkpoints.
#[derive(Message)]
#[rtype(result = "Weights")]
pub struct Snapshot;

/// Flush reports and stop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopShard;

/// Records are sent to the tracker in batches of this many (and on every snapshot and stop).
const REPORT_BATCH: usize = 256;

/// The shard actor.
pub struct ShardActor {
    core: SgdShard,
    tracker: Recipient<Records>,
    replies: BTreeMap<LearnerId, Recipient<Served>>,
    pending: Records,
    metrics: Option<ShardMetrics>,
}

impl ShardActor {
    /// A shard actor around `core`, reporting to `tracker`.
    #[must_use]
    pub fn new(core: SgdShard, tracker: Recipient<Records>) -> Self {
        Self { core, tracker, replies: BTreeMap::new(), pending: Records::default(), metrics: None }
    }

    /// Also count every gradient and update in `metrics`, if given, as it happens.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Option<ShardMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    fn drain(&mut self) {
        while let Some(event) = self.core.poll_event() {
            match event {
                ShardEvent::Serve { learner, weights } => {
                    if let Some(to) = self.replies.get(&learner) {
                        to.do_send(Served(weights));
                    }
                }
                ShardEvent::Gradient(g) => {
                    if let Some(m) = &self.metrics {
                        m.record_gradient(&g);
                    }
                    self.pending.gradients.push(g);
                }
                ShardEvent::Update(u) => {
                    if let Some(m) = &self.metrics {
                        m.record_update(&u);
                    }
                    self.pending.updates.push(u);
                }
            }
        }
        if self.pending.gradients.len() >= REPORT_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.pending.gradients.is_empty() || !self.pending.updates.is_empty() {
            self.tracker.do_send(std::mem::take(&mut self.pending));
        }
    }
}

impl Actor for ShardActor {
    type Context = Context<Self>;
}

impl Handler<Pull> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Pull, _: &mut Context<Self>) {
        self.replies.insert(msg.learner, msg.reply_to);
        let result =
            if msg.last { self.core.on_last_pull(msg.learner) } else { self.core.on_pull(msg.learner) };
        match result {
            Ok(()) => self.drain(),
            Err(e) => tracing::warn!(shard = %self.core.id(), "rejected pull: {e}"),
        }
    }
}

impl Handler<Push> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Push, _: &mut Context<Self>) {
        match self.core.on_push(msg.learner, msg.computed_on, &msg.values) {
            Ok(()) => self.drain(),
            Err(e) => tracing::warn!(shard = %self.core.id(), "rejected push: {e}"),
        }
    }
}

impl Handler<Snapshot> for ShardActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        self.flush();
        MessageResult(self.core.snapshot())
    }
}

impl Handler<StopShard> for ShardActor {
    type Result = ();
    fn handle(&mut self, _: StopShard, ctx: &mut Context<Self>) {
        self.flush();
        ctx.stop();
    }
}
