//! The shard actor: a thin shell over its protocol core, an [`SgdShard`] (hardsync, softsync,
//! async) or a [`CenterShard`] (the EASGD family).

use std::collections::BTreeMap;

use actix::prelude::*;
use rudra_transport::{Clock, Floats, LearnerId};

use crate::ActorError;
use crate::checkpoint::Checkpoints;
use crate::metrics::ShardMetrics;
use crate::protocol::{CenterEvent, CenterShard, SgdShard, ShardEvent, ShardState, UpdateRecord, Weights};
use crate::tracker::Records;

/// A learner asks for the shard's weights; they are sent to `reply_to`, maybe later.
#[derive(Message)]
#[rtype(result = "()")]
#[derive(Clone)]
pub struct Pull {
    /// Who asks.
    pub learner: LearnerId,
    /// The learner's step it is for (see [`SgdShard::on_pull`]).
    pub seq: u64,
    /// Whether the learner has pushed its last gradient (see [`SgdShard::on_last_pull`]).
    pub last: bool,
    /// Where the weights go.
    pub reply_to: Recipient<Served>,
}

/// Weights served to a learner, answering its pull `seq` (0 for a center's answer).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Served {
    /// The weights.
    pub weights: Weights,
    /// The sequence number of the pull answered.
    pub seq: u64,
}

/// A learner's gradient for this shard's range, viewed in the learner's gradient buffer (or in
/// the frame it arrived in), never copied.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Push {
    /// Who computed it.
    pub learner: LearnerId,
    /// The learner's step, so the gradient is applied once however often it arrives.
    pub seq: u64,
    /// The clock of this shard's weights it was computed on.
    pub computed_on: Clock,
    /// This shard's part of the gradient.
    pub values: Floats,
}

/// A learner's exchange with a center shard: its values for the shard's range (x^i, DOWNPOUR's
/// `v`, or MDOWNPOUR's gradient); the center is sent to `reply_to`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Exchange {
    /// Who sends.
    pub learner: LearnerId,
    /// The values for this shard's range.
    pub values: Floats,
    /// Where the center goes.
    pub reply_to: Recipient<Served>,
}

/// The current weights, without gating, for evaluation and checkpoints.
#[derive(Message)]
#[rtype(result = "Weights")]
pub struct Snapshot;

/// The active learners changed; a hardsync round or an EASGD sync round waits only for them.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Membership {
    /// The learners now active.
    pub active: std::collections::BTreeSet<LearnerId>,
}

/// The shard crashes, as a process would: it loses everything in memory and ignores every
/// message until [`Restart`]. Answers the clock it had.
#[derive(Message)]
#[rtype(result = "Clock")]
pub struct Crash;

/// The crashed shard comes back from its last checkpoint. Answers the clock it resumes at.
#[derive(Message)]
#[rtype(result = "Result<Clock, ActorError>")]
pub struct Restart;

/// Crash `shard` (telling `crashed` the clock it had), leave it down for `down`, then bring it
/// back from its checkpoint: the clock it resumed at, or why it could not. `None` when the
/// shard had already stopped.
pub async fn crash_and_restart(
    shard: &Addr<ShardActor>,
    down: std::time::Duration,
    crashed: impl FnOnce(Clock),
) -> Option<Result<Clock, ActorError>> {
    crashed(shard.send(Crash).await.ok()?);
    tokio::time::sleep(down).await;
    Some(shard.send(Restart).await.map_err(ActorError::from).and_then(|r| r))
}

/// Flush reports and stop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopShard;

/// Records are sent to the tracker in batches of this many (and on every snapshot and stop) …
const REPORT_BATCH: usize = 256;
/// … and at least this often, so that what the tracker knows is never older than this.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The protocol core a shard runs.
#[derive(Debug)]
// One per shard actor, built once and never moved on a hot path.
#[allow(clippy::large_enum_variant)]
pub enum ShardCore {
    /// Rudra's SGD shard.
    Sgd(SgdShard),
    /// The EASGD family's center variable.
    Center(CenterShard),
}

impl ShardCore {
    fn snapshot(&self) -> Weights {
        match self {
            Self::Sgd(c) => c.snapshot(),
            Self::Center(c) => c.snapshot(),
        }
    }

    fn id(&self) -> rudra_transport::ShardId {
        match self {
            Self::Sgd(c) => c.id(),
            Self::Center(c) => c.id(),
        }
    }

    fn clock(&self) -> Clock {
        match self {
            Self::Sgd(c) => c.clock(),
            Self::Center(c) => c.clock(),
        }
    }

    /// What a checkpoint keeps.
    #[must_use]
    pub fn state(&self) -> ShardState {
        match self {
            Self::Sgd(c) => c.state(),
            Self::Center(c) => c.state(),
        }
    }

    /// Continue from a checkpoint's `state` (see [`SgdShard::restore`]).
    pub fn restore(&mut self, state: ShardState) -> Result<(), ActorError> {
        match self {
            Self::Sgd(c) => c.restore(state),
            Self::Center(c) => c.restore(state),
        }
    }
}

/// The shard actor.
pub struct ShardActor {
    core: ShardCore,
    tracker: Recipient<Records>,
    replies: BTreeMap<LearnerId, Recipient<Served>>,
    pending: Records,
    metrics: Option<ShardMetrics>,
    checkpoints: Option<Checkpoints>,
    /// The clock of the last checkpoint written.
    saved: Clock,
    /// Crashed and not restarted yet: every message is lost.
    down: bool,
}

impl ShardActor {
    /// A shard actor around `core`, reporting to `tracker`.
    #[must_use]
    pub fn new(core: ShardCore, tracker: Recipient<Records>) -> Self {
        Self {
            core,
            tracker,
            replies: BTreeMap::new(),
            pending: Records::default(),
            metrics: None,
            checkpoints: None,
            saved: Clock(0),
            down: false,
        }
    }

    /// Write a checkpoint when the shard starts and after every `every_updates` updates.
    #[must_use]
    pub fn with_checkpoints(mut self, checkpoints: Option<Checkpoints>) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// Write a checkpoint if one is due (or `now`). A checkpoint that cannot be written is
    /// logged and training goes on; the next one is tried at the next interval.
    fn checkpoint(&mut self, now: bool) {
        let Some(c) = &self.checkpoints else { return };
        let clock = self.core.clock();
        if !now && clock.0 < self.saved.0 + c.every_updates.max(1) {
            return;
        }
        self.saved = clock;
        match c.write(self.core.id(), &self.core.state()) {
            Ok(()) => tracing::debug!(shard = %self.core.id(), "checkpoint at clock {clock}"),
            Err(e) => tracing::error!(shard = %self.core.id(), "{e}; training goes on"),
        }
    }

    /// Also count every gradient and update in `metrics`, if given, as it happens.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Option<ShardMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Carry out the core's effects; `updated` says whether a center moved.
    fn drain(&mut self, updated: bool) {
        match &mut self.core {
            ShardCore::Sgd(core) => {
                while let Some(event) = core.poll_event() {
                    match event {
                        ShardEvent::Serve { learner, seq, weights } => {
                            serve(&self.replies, learner, weights, seq)
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
            }
            ShardCore::Center(core) => {
                if updated {
                    let u = UpdateRecord { shard: core.id(), clock: core.clock(), gradients: 1 };
                    if let Some(m) = &self.metrics {
                        m.record_update(&u);
                    }
                    self.pending.updates.push(u);
                }
                while let Some(CenterEvent::Reply { learner, center }) = core.poll_event() {
                    serve(&self.replies, learner, center, 0);
                }
            }
        }
        if self.pending.gradients.len() + self.pending.updates.len() >= REPORT_BATCH {
            self.flush();
        }
        self.checkpoint(false);
    }

    /// Carry out the effects of a pull or push the core took, or log why it did not.
    fn after(&mut self, result: Result<(), ActorError>, what: &str) {
        match result {
            Ok(()) => self.drain(false),
            Err(e @ ActorError::Duplicate(_)) => {
                tracing::debug!(shard = %self.core.id(), "ignored {what}: {e}")
            }
            Err(e) => tracing::warn!(shard = %self.core.id(), "rejected {what}: {e}"),
        }
    }

    fn flush(&mut self) {
        if !self.pending.gradients.is_empty() || !self.pending.updates.is_empty() {
            self.tracker.do_send(std::mem::take(&mut self.pending));
        }
    }
}

fn serve(replies: &BTreeMap<LearnerId, Recipient<Served>>, learner: LearnerId, weights: Weights, seq: u64) {
    if let Some(to) = replies.get(&learner) {
        to.do_send(Served { weights, seq });
    }
}

impl Actor for ShardActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.checkpoint(true);
        ctx.run_interval(REPORT_EVERY, |act, _| act.flush());
    }
}

impl Handler<Pull> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Pull, _: &mut Context<Self>) {
        if self.down {
            return;
        }
        let ShardCore::Sgd(core) = &mut self.core else {
            return tracing::warn!(shard = %self.core.id(), "rejected a pull: this shard holds a center");
        };
        self.replies.insert(msg.learner, msg.reply_to);
        let (learner, seq) = (msg.learner, msg.seq);
        let result = if msg.last { core.on_last_pull(learner, seq) } else { core.on_pull(learner, seq) };
        self.after(result, "pull");
    }
}

impl Handler<Push> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Push, _: &mut Context<Self>) {
        if self.down {
            return;
        }
        let ShardCore::Sgd(core) = &mut self.core else {
            return tracing::warn!(shard = %self.core.id(), "rejected a push: this shard holds a center");
        };
        let result = core.on_push(msg.learner, msg.seq, msg.computed_on, &msg.values);
        self.after(result, "push");
    }
}

impl Handler<Exchange> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Exchange, _: &mut Context<Self>) {
        if self.down {
            return;
        }
        let ShardCore::Center(core) = &mut self.core else {
            return tracing::warn!(shard = %self.core.id(), "rejected an exchange: this shard runs SGD");
        };
        self.replies.insert(msg.learner, msg.reply_to);
        let before = core.clock();
        match core.on_exchange(msg.learner, &msg.values) {
            Ok(()) => {
                let updated = core.clock() != before;
                self.drain(updated);
            }
            Err(e) => tracing::warn!(shard = %self.core.id(), "rejected exchange: {e}"),
        }
    }
}

impl Handler<Membership> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Membership, _: &mut Context<Self>) {
        tracing::info!(shard = %self.core.id(), "λ = {}", msg.active.len());
        let updated = match &mut self.core {
            ShardCore::Sgd(core) => {
                core.on_membership(msg.active);
                false
            }
            ShardCore::Center(core) => {
                let before = core.clock();
                core.on_membership(msg.active);
                core.clock() != before
            }
        };
        self.drain(updated);
    }
}

impl Handler<Snapshot> for ShardActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        self.flush();
        MessageResult(self.core.snapshot())
    }
}

impl Handler<Crash> for ShardActor {
    type Result = MessageResult<Crash>;
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) -> Self::Result {
        let clock = self.core.clock();
        tracing::warn!(shard = %self.core.id(), "crashed at clock {clock}");
        // What the tracker was sent is the run's record; what was not is lost with the process.
        self.pending = Records::default();
        self.replies.clear();
        self.down = true;
        MessageResult(clock)
    }
}

impl Handler<Restart> for ShardActor {
    type Result = Result<Clock, ActorError>;
    fn handle(&mut self, _: Restart, _: &mut Context<Self>) -> Self::Result {
        let id = self.core.id();
        let c = self
            .checkpoints
            .as_ref()
            .ok_or_else(|| ActorError::Protocol(format!("{id} cannot restart: it writes no checkpoints")))?;
        let state = c.read(id)?.ok_or_else(|| ActorError::Checkpoint {
            path: c.path(id),
            message: "missing: the shard cannot restart".into(),
        })?;
        self.core.restore(state)?;
        (self.down, self.saved) = (false, self.core.clock());
        tracing::info!(shard = %id, "restarted from its checkpoint at clock {}", self.saved);
        Ok(self.saved)
    }
}

impl Handler<StopShard> for ShardActor {
    type Result = ();
    fn handle(&mut self, _: StopShard, ctx: &mut Context<Self>) {
        self.flush();
        ctx.stop();
    }
}
