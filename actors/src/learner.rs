//! The learner actor: a thin shell over [`LearnerCore`] that computes gradients with a
//! [`Model`] on its own partition of the training set.

use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use rudra_compute::{Device, Minibatches, Model};
use rudra_transport::Floats;

use crate::ActorError;
use crate::protocol::{LearnerCore, LearnerEvent};
use crate::scheduler::{LearnerDone, Progress};
use crate::shard::{Pull, Push, Served};

/// Begin the loop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartLearner;

/// Stop the actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopLearner;

/// How a learner reaches one shard.
#[derive(Clone)]
pub struct ShardLink {
    /// The shard's parameter range in the flat vector.
    pub range: Range<usize>,
    /// Where pulls go.
    pub pull: Recipient<Pull>,
    /// Where pushes go.
    pub push: Recipient<Push>,
}

/// Where a learner reports.
#[derive(Clone)]
pub struct SchedulerLink {
    /// Per-step progress.
    pub progress: Recipient<Progress>,
    /// Completion or failure.
    pub done: Recipient<LearnerDone>,
}

/// The learner actor.
pub struct LearnerActor {
    core: LearnerCore,
    model: Model<Device>,
    batches: Minibatches,
    shards: Vec<ShardLink>,
    scheduler: SchedulerLink,
    grad: Arc<Vec<f32>>,
    /// With a single shard, its weights are computed on in place rather than copied.
    shared: Option<Arc<Vec<f32>>>,
    unreported: Progress,
}

/// Progress is reported to the scheduler every this many steps (and at the end).
const REPORT_EVERY: u64 = 8;

impl LearnerActor {
    /// A learner that computes on `model` over `batches`.
    #[must_use]
    pub fn new(
        core: LearnerCore,
        model: Model<Device>,
        batches: Minibatches,
        shards: Vec<ShardLink>,
        scheduler: SchedulerLink,
    ) -> Self {
        let grad = Arc::new(vec![0.0; model.layout().len]);
        Self { core, model, batches, shards, scheduler, grad, shared: None, unreported: Progress::default() }
    }

    fn carry_out(&mut self, events: Vec<LearnerEvent>, ctx: &mut Context<Self>) {
        for event in events {
            match event {
                LearnerEvent::Pull { shard, last } => self.shards[shard.index()].pull.do_send(Pull {
                    learner: self.core.id(),
                    last,
                    reply_to: ctx.address().recipient(),
                }),
                LearnerEvent::Push { shard, computed_on } => {
                    let link = &self.shards[shard.index()];
                    let grad = Floats::from(Arc::clone(&self.grad));
                    if let Some(values) = grad.slice(link.range.clone()) {
                        link.push.do_send(Push { learner: self.core.id(), computed_on, values });
                    }
                }
                LearnerEvent::Compute => match self.compute() {
                    Ok(more) => self.carry_out(more, ctx),
                    Err(e) => {
                        self.scheduler
                            .done
                            .do_send(LearnerDone { learner: self.core.id(), error: Some(e.to_string()) });
                        ctx.stop();
                    }
                },
                LearnerEvent::Finished => {
                    self.scheduler.progress.do_send(std::mem::take(&mut self.unreported));
                    self.scheduler.done.do_send(LearnerDone { learner: self.core.id(), error: None });
                }
            }
        }
    }

    /// One gradient on the next minibatch; its pushes and next pulls.
    fn compute(&mut self) -> Result<Vec<LearnerEvent>, ActorError> {
        let (x, y) = self.batches.next_batch();
        let samples = y.len() as u64;
        let loss = match self.shared.take() {
            Some(params) => self.model.loss_and_gradient_at(&params, x, y)?,
            None => self.model.loss_and_gradient(x, y)?,
        };
        // The shards dropped last step's gradient before answering this step's pulls, so the
        // buffer is normally unshared: it is swapped with the model's, not copied.
        self.model.take_gradient(Arc::make_mut(&mut self.grad))?;
        let p = &mut self.unreported;
        (p.samples, p.steps, p.loss_sum) = (p.samples + samples, p.steps + 1, p.loss_sum + f64::from(loss));
        if p.steps >= REPORT_EVERY {
            self.scheduler.progress.do_send(std::mem::take(p));
        }
        self.core.on_computed()
    }
}

impl Actor for LearnerActor {
    type Context = Context<Self>;
}

impl Handler<StartLearner> for LearnerActor {
    type Result = ();
    fn handle(&mut self, _: StartLearner, ctx: &mut Context<Self>) {
        let events = self.core.on_start();
        self.carry_out(events, ctx);
    }
}

impl Handler<Served> for LearnerActor {
    type Result = ();
    fn handle(&mut self, Served(w): Served, ctx: &mut Context<Self>) {
        let Some(link) = self.shards.get(w.shard.index()) else {
            tracing::warn!(learner = %self.core.id(), "weights from unknown {}", w.shard);
            return;
        };
        if let Some(whole) = w.values.whole_vec().filter(|v| v.len() == self.model.layout().len) {
            self.shared = Some(Arc::clone(whole));
        } else if let Err(e) = self.model.write_params(link.range.start, &w.values) {
            tracing::warn!(learner = %self.core.id(), "weights from {} rejected: {e}", w.shard);
            return;
        }
        match self.core.on_weights(w.shard, w.clock) {
            Ok(Some(event)) => {
                drop(w);
                self.carry_out(vec![event], ctx);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(learner = %self.core.id(), "{e}"),
        }
    }
}

impl Handler<StopLearner> for LearnerActor {
    type Result = ();
    fn handle(&mut self, _: StopLearner, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// The ranges of `shards` contiguous, near-equal parts of a vector of `len` values.
#[must_use]
pub fn shard_ranges(len: usize, shards: usize) -> Vec<Range<usize>> {
    let shards = shards.max(1);
    (0..shards).map(|s| (s * len / shards)..((s + 1) * len / shards)).collect()
}
