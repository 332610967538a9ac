//! The shard actor: a thin shell over its protocol core ([`ShardCore`]: an SGD shard for
//! hardsync, softsync and async, a center shard for the EASGD family). It answers learners,
//! reports every gradient and update to the staleness tracker, writes checkpoints, and can
//! crash and restart from them (fault injection).

use std::collections::BTreeMap;

use actix::prelude::*;
use rudra_transport::{Clock, Encoding, LearnerId, Payload};

use crate::ActorError;
use crate::checkpoint::Checkpoints;
use crate::messages::{
    Aggregate, Center, Crash, Exchange, InjectedPanic, Membership, Pull, Push, Records, Restart, Served,
    Snapshot, StopShard,
};
use crate::metrics::ShardMetrics;
use rudra_proto::{
    Contribution, CoreError, DropReason, GraceWindow, LeaderGroups, Outcome, ShardCore, ShardEvent, Weights,
};

/// Records are sent to the tracker in batches of this many (and on every snapshot and stop) …
const REPORT_BATCH: usize = 256;
/// … and at least this often, so that what the tracker knows is never older than this.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The shard actor.
pub struct ShardActor {
    core: ShardCore,
    tracker: Recipient<Records>,
    /// Where each learner takes the answers to its pulls …
    replies: BTreeMap<LearnerId, Recipient<Served>>,
    /// … and to its exchanges.
    centers: BTreeMap<LearnerId, Recipient<Center>>,
    pending: Records,
    metrics: Option<ShardMetrics>,
    checkpoints: Option<Checkpoints>,
    /// The clock of the last checkpoint written.
    saved: Clock,
    /// Crashed and not restarted yet: every message is lost.
    down: bool,
    /// Learners whose last gradient was dropped as non-finite: each burst is logged once.
    non_finite: std::collections::BTreeSet<LearnerId>,
    /// How weights are sent, and the weights last sent compressed with their clock: every
    /// learner pulling the same clock gets the same payload, encoded once.
    weights: Encoding,
    encoded: Option<(Clock, Payload)>,
    /// Hardsync with a quorum: chooses each round's grace window, on the actor's own clock.
    grace: Option<(GraceWindow, std::time::Instant)>,
    /// Payload bytes received since the last update.
    payload_in: u64,
    /// Groups with rounds of their own (`docs/src/algorithms.md` §4.3): the core serves each
    /// by its first member, active while any member is.
    groups: LeaderGroups,
}

impl ShardActor {
    /// A shard actor around `core`, reporting to `tracker`, counting into `metrics` and
    /// writing `checkpoints` (when the shard starts and after every `every_updates` updates).
    #[must_use]
    pub fn new(
        core: ShardCore,
        tracker: Recipient<Records>,
        metrics: Option<ShardMetrics>,
        checkpoints: Option<Checkpoints>,
        weights: Encoding,
    ) -> Self {
        Self {
            saved: core.clock(),
            core,
            tracker,
            replies: BTreeMap::new(),
            centers: BTreeMap::new(),
            pending: Records::default(),
            metrics,
            checkpoints,
            down: false,
            non_finite: std::collections::BTreeSet::new(),
            weights,
            encoded: None,
            grace: None,
            payload_in: 0,
            groups: LeaderGroups::default(),
        }
    }

    /// The learners push through `groups` with rounds of their own, when given.
    #[must_use]
    pub fn with_groups(mut self, groups: LeaderGroups) -> Self {
        self.groups = groups;
        self
    }

    /// Quorum rounds close at the end of grace windows that `window` chooses.
    #[must_use]
    pub fn with_grace(mut self, window: Option<GraceWindow>) -> Self {
        self.grace = window.map(|w| (w, std::time::Instant::now()));
        self
    }

    /// Write a checkpoint if one is due (or `now`); whether one was written. A checkpoint that
    /// cannot be written is logged and training goes on; the next one is tried at the next
    /// interval.
    fn checkpoint(&mut self, now: bool) -> bool {
        let Some(c) = &self.checkpoints else { return false };
        let clock = self.core.clock();
        if !now && clock.0 < self.saved.0 + c.every_updates.max(1) {
            return false;
        }
        self.saved = clock;
        match c.write(self.core.id(), &self.core.state()) {
            Ok(()) => tracing::debug!(shard = %self.core.id(), "checkpoint at clock {clock}"),
            Err(e) => {
                tracing::error!(shard = %self.core.id(), "{e}; training goes on");
                return false;
            }
        }
        true
    }

    /// Carry out the effects of an input the core took, or log why it refused it.
    fn carry_out(&mut self, events: Result<Vec<ShardEvent>, CoreError>, what: &str, ctx: &mut Context<Self>) {
        let events = match events {
            Ok(events) => events,
            Err(e) if e.is_duplicate() => {
                return tracing::debug!(shard = %self.core.id(), "ignored {what}: {e}");
            }
            Err(e) => return tracing::warn!(shard = %self.core.id(), "rejected {what}: {e}"),
        };
        for event in events {
            match event {
                ShardEvent::Serve { learner, seq, weights } => {
                    if let Some(to) = self.replies.get(&learner).cloned() {
                        let values = self.encoded(&weights);
                        to.do_send(Served { shard: weights.shard, clock: weights.clock, seq, values });
                    }
                }
                ShardEvent::Center { learner, weights } => {
                    if let Some(to) = self.centers.get(&learner).cloned() {
                        let values = self.encoded(&weights);
                        to.do_send(Center { shard: weights.shard, clock: weights.clock, values });
                    }
                }
                ShardEvent::Gradient(g) => {
                    if let Some(m) = &self.metrics {
                        m.record_gradient(&g);
                    }
                    self.note_non_finite(&g);
                    self.pending.gradients.push(g);
                }
                ShardEvent::Update(mut u) => {
                    u.payload_in = std::mem::take(&mut self.payload_in);
                    if let Some(m) = &self.metrics {
                        m.record_update(&u);
                    }
                    self.pending.updates.push(u);
                }
                ShardEvent::Quorum { clock, missing } => self.open_grace(clock, missing, ctx),
            }
        }
        if self.pending.gradients.len() + self.pending.updates.len() >= REPORT_BATCH {
            self.flush();
        }
        self.checkpoint(false);
    }

    /// `weights` in the job's weights codec: encoded once per clock, the same payload for every
    /// learner served at that clock.
    fn encoded(&mut self, weights: &Weights) -> Payload {
        match &self.encoded {
            Some((clock, p)) if *clock == weights.clock => p.clone(),
            _ => {
                let p = self.weights.encode(&weights.values, None);
                if p.codec() != rudra_transport::Codec::F32 {
                    self.encoded = Some((weights.clock, p.clone()));
                }
                p
            }
        }
    }

    /// Log the first of a burst of non-finite gradients from one learner; the rest are counted.
    fn note_non_finite(&mut self, g: &rudra_proto::GradientRecord) {
        if g.outcome != Outcome::Dropped(DropReason::NonFinite) {
            self.non_finite.remove(&g.learner);
        } else if self.non_finite.insert(g.learner) {
            tracing::warn!(
                shard = %self.core.id(),
                "dropped a gradient holding NaN or ±Inf from {}; more of its like are counted, not logged",
                g.learner
            );
        }
    }

    /// The round on `clock` holds its quorum: it closes when its grace window is over.
    fn open_grace(&mut self, clock: Clock, missing: usize, ctx: &mut Context<Self>) {
        let Some((window, born)) = &mut self.grace else { return };
        let wait = window.quorum(clock, missing, born.elapsed());
        ctx.run_later(wait, move |act, ctx| {
            if !act.down {
                let events = act.core.on_grace_over(clock);
                act.carry_out(Ok(events), "the end of a grace window", ctx);
            }
        });
    }

    fn pull(&mut self, msg: Pull, ctx: &mut Context<Self>) {
        self.replies.insert(msg.learner, msg.reply_to);
        let events = self.core.on_pull(msg.learner, msg.seq, msg.last);
        self.carry_out(events, "pull", ctx);
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.tracker.do_send(std::mem::take(&mut self.pending));
        }
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
    fn handle(&mut self, msg: Pull, ctx: &mut Context<Self>) {
        if self.down {
            return;
        }
        self.pull(msg, ctx);
    }
}

impl Handler<Push> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Push, ctx: &mut Context<Self>) {
        if self.down {
            return;
        }
        let Push { learner, seq, computed_on, values, examples, then } = msg;
        let members = [Contribution { learner, seq, examples }];
        self.push(&members, computed_on, values, ctx);
        self.pull(then, ctx);
    }
}

impl Handler<Aggregate> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Aggregate, ctx: &mut Context<Self>) {
        if self.down {
            return;
        }
        let Aggregate { members, computed_on, values, then } = msg;
        self.push(&members, computed_on, values, ctx);
        for then in then {
            self.pull(then, ctx);
        }
    }
}

impl ShardActor {
    /// Take the gradient of one learner or of a group's `members`.
    fn push(
        &mut self,
        members: &[Contribution],
        computed_on: Clock,
        values: Payload,
        ctx: &mut Context<Self>,
    ) {
        self.payload_in += values.bytes() as u64;
        if let Some((window, born)) = &mut self.grace {
            window.arrived(computed_on, born.elapsed());
        }
        match values.decode() {
            Ok(decoded) => {
                let events = self.core.on_push(members, computed_on, &decoded);
                drop(decoded);
                self.carry_out(events, "push", ctx);
            }
            Err(e) => {
                let from = members.first().map(|m| m.learner.to_string()).unwrap_or_default();
                tracing::warn!(shard = %self.core.id(), "rejected a push from {from}: {e}");
            }
        }
    }
}

impl Handler<Exchange> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Exchange, ctx: &mut Context<Self>) {
        if self.down {
            return;
        }
        self.centers.insert(msg.learner, msg.reply_to);
        self.payload_in += msg.values.bytes() as u64;
        if let Some((window, born)) = &mut self.grace {
            window.arrived(self.core.round_of(msg.learner), born.elapsed());
        }
        match msg.values.decode() {
            Ok(values) => {
                let events = self.core.on_exchange(msg.learner, &values);
                self.carry_out(events, "exchange", ctx);
            }
            Err(e) => {
                tracing::warn!(shard = %self.core.id(), "rejected an exchange from {}: {e}", msg.learner)
            }
        }
    }
}

impl Handler<Membership> for ShardActor {
    type Result = ();
    fn handle(&mut self, msg: Membership, ctx: &mut Context<Self>) {
        let active = self.groups.served(&msg.active);
        tracing::info!(shard = %self.core.id(), "λ = {}", active.len());
        let events = self.core.on_membership(active);
        self.carry_out(Ok(events), "membership", ctx);
    }
}

impl Handler<Snapshot> for ShardActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        self.flush();
        MessageResult(self.core.snapshot())
    }
}

impl Handler<InjectedPanic> for ShardActor {
    type Result = ();
    fn handle(&mut self, _: InjectedPanic, _: &mut Context<Self>) {
        panic!("{}: injected panic (faults.panic)", self.core.id());
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
        self.centers.clear();
        self.down = true;
        MessageResult(clock)
    }
}

impl Handler<Restart> for ShardActor {
    type Result = Result<Clock, ActorError>;
    fn handle(&mut self, _: Restart, _: &mut Context<Self>) -> Self::Result {
        let id = self.core.id();
        let c = (self.checkpoints.as_ref())
            .ok_or_else(|| ActorError::ShardFailed(id, "it writes no checkpoints to restart from".into()))?;
        let state = c.read(id)?.ok_or_else(|| ActorError::Checkpoint {
            path: c.path(id),
            message: "missing: the shard cannot restart".into(),
        })?;
        self.core
            .restore(state)
            .map_err(|e| ActorError::Checkpoint { path: c.path(id), message: e.to_string() })?;
        (self.down, self.saved, self.encoded) = (false, self.core.clock(), None);
        tracing::info!(shard = %id, "restarted from its checkpoint at clock {}", self.saved);
        Ok(self.saved)
    }
}

impl Handler<StopShard> for ShardActor {
    type Result = ();
    fn handle(&mut self, _: StopShard, ctx: &mut Context<Self>) {
        // What it holds is written down on its way out (a crashed shard holds nothing).
        if !self.down && self.core.clock() != self.saved && self.checkpoint(true) {
            tracing::info!(shard = %self.core.id(), "wrote a checkpoint at clock {} on its way out", self.saved);
        }
        self.flush();
        ctx.stop();
    }
}
