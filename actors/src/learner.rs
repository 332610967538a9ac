//! The learner actor: a thin shell over its loop core ([`LearnerCore`] for Rudra's SGD
//! protocols, [`ElasticWorker`] for the EASGD family) that computes gradients with a
//! [`GradientModel`] (a [`rudra_compute::Model`], or a model of your own) on its own partition
//! of the training set.

use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use rudra_compute::{GradientModel, Minibatches};
use rudra_transport::{Floats, LearnerId};

use crate::ActorError;
use crate::protocol::{ElasticWorker, LearnerCore, LearnerEvent, WorkerEvent};
use crate::scheduler::{LearnerDone, Progress};
use crate::shard::{Exchange, Pull, Push, Served, ShardActor};

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
    /// Where elastic exchanges go.
    pub exchange: Recipient<Exchange>,
}

impl ShardLink {
    /// The link to a shard actor in this process holding `range`.
    #[must_use]
    pub fn local(range: Range<usize>, shard: &Addr<ShardActor>) -> Self {
        Self {
            range,
            pull: shard.clone().recipient(),
            push: shard.clone().recipient(),
            exchange: shard.clone().recipient(),
        }
    }
}

/// The loop a learner runs.
#[derive(Debug)]
pub enum LearnerLoop {
    /// Pull, compute, push (hardsync, softsync, async).
    Sgd(LearnerCore),
    /// Local steps and periodic exchanges (the EASGD family).
    Elastic(ElasticWorker),
}

impl LearnerLoop {
    /// The learner running this loop.
    #[must_use]
    pub fn id(&self) -> LearnerId {
        match self {
            Self::Sgd(c) => c.id(),
            Self::Elastic(w) => w.id(),
        }
    }
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
    core: LearnerLoop,
    model: Box<dyn GradientModel>,
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
        core: LearnerLoop,
        model: impl GradientModel,
        batches: Minibatches,
        shards: Vec<ShardLink>,
        scheduler: SchedulerLink,
    ) -> Self {
        let grad = Arc::new(vec![0.0; model.param_count()]);
        let unreported = Progress::none(core.id());
        let model = Box::new(model);
        Self { core, model, batches, shards, scheduler, grad, shared: None, unreported }
    }

    /// Send the progress not yet reported.
    fn report(&mut self) {
        let fresh = Progress::none(self.id());
        self.scheduler.progress.do_send(std::mem::replace(&mut self.unreported, fresh));
    }

    fn id(&self) -> LearnerId {
        self.core.id()
    }

    /// Report `error` to the scheduler and stop.
    fn fail(&mut self, error: &ActorError, ctx: &mut Context<Self>) {
        self.scheduler.done.do_send(LearnerDone { learner: self.id(), error: Some(error.to_string()) });
        ctx.stop();
    }

    fn finish(&mut self) {
        self.report();
        self.scheduler.done.do_send(LearnerDone { learner: self.id(), error: None });
    }

    fn carry_out(&mut self, events: Vec<LearnerEvent>, ctx: &mut Context<Self>) {
        let LearnerLoop::Sgd(core) = &mut self.core else { return };
        let learner = core.id();
        for event in events {
            match event {
                LearnerEvent::Pull { shard, last } => self.shards[shard.index()].pull.do_send(Pull {
                    learner,
                    last,
                    reply_to: ctx.address().recipient(),
                }),
                LearnerEvent::Push { shard, computed_on } => {
                    let link = &self.shards[shard.index()];
                    let grad = Floats::from(Arc::clone(&self.grad));
                    if let Some(values) = grad.slice(link.range.clone()) {
                        link.push.do_send(Push { learner, computed_on, values });
                    }
                }
                LearnerEvent::Compute => {
                    let at = self.shared.take();
                    let next = self.gradient(at.as_ref()).and_then(|()| match &mut self.core {
                        LearnerLoop::Sgd(core) => core.on_computed(),
                        LearnerLoop::Elastic(_) => Ok(Vec::new()),
                    });
                    match next {
                        Ok(more) => self.carry_out(more, ctx),
                        Err(e) => self.fail(&e, ctx),
                    }
                }
                LearnerEvent::Finished => self.finish(),
            }
        }
    }

    fn carry_out_elastic(&mut self, events: Vec<WorkerEvent>, ctx: &mut Context<Self>) {
        for event in events {
            match event {
                WorkerEvent::Exchange(values) => {
                    let values = Floats::from(values);
                    for link in &self.shards {
                        if let Some(part) = values.slice(link.range.clone()) {
                            link.exchange.do_send(Exchange {
                                learner: self.id(),
                                values: part,
                                reply_to: ctx.address().recipient(),
                            });
                        }
                    }
                }
                WorkerEvent::Compute(point) => {
                    let computed = self.gradient(Some(&point));
                    drop(point);
                    let next = computed.and_then(|()| match &mut self.core {
                        LearnerLoop::Elastic(w) => w.on_gradient(&self.grad),
                        LearnerLoop::Sgd(_) => Ok(Vec::new()),
                    });
                    match next {
                        Ok(more) => self.carry_out_elastic(more, ctx),
                        Err(e) => self.fail(&e, ctx),
                    }
                }
                WorkerEvent::Finished => self.finish(),
            }
        }
    }

    /// One gradient on the next minibatch, at `at` or at the model's own parameters, into
    /// `self.grad`; progress is reported every few steps.
    fn gradient(&mut self, at: Option<&Arc<Vec<f32>>>) -> Result<(), ActorError> {
        let (x, y) = self.batches.next_batch();
        let samples = y.len() as u64;
        let loss = match at {
            Some(params) => self.model.loss_and_gradient_at(params, x, y)?,
            None => self.model.loss_and_gradient(x, y)?,
        };
        // The shards dropped last step's gradient before answering this step's pulls, so the
        // buffer is normally unshared: it is swapped with the model's, not copied.
        self.model.take_gradient(Arc::make_mut(&mut self.grad))?;
        let p = &mut self.unreported;
        (p.samples, p.steps, p.loss_sum) = (p.samples + samples, p.steps + 1, p.loss_sum + f64::from(loss));
        if p.steps >= REPORT_EVERY {
            self.report();
        }
        Ok(())
    }
}

impl Actor for LearnerActor {
    type Context = Context<Self>;
}

impl Handler<StartLearner> for LearnerActor {
    type Result = ();
    fn handle(&mut self, _: StartLearner, ctx: &mut Context<Self>) {
        match &mut self.core {
            LearnerLoop::Sgd(core) => {
                let events = core.on_start();
                self.carry_out(events, ctx);
            }
            LearnerLoop::Elastic(worker) => {
                let events = worker.on_start();
                self.carry_out_elastic(events, ctx);
            }
        }
    }
}

impl Handler<Served> for LearnerActor {
    type Result = ();
    fn handle(&mut self, Served(w): Served, ctx: &mut Context<Self>) {
        let learner = self.id();
        let Some(link) = self.shards.get(w.shard.index()) else {
            return tracing::warn!(%learner, "weights from unknown {}", w.shard);
        };
        let core = match &mut self.core {
            LearnerLoop::Sgd(core) => core,
            LearnerLoop::Elastic(worker) => {
                match worker.on_center(w.shard, &w.values) {
                    Ok(events) => self.carry_out_elastic(events, ctx),
                    Err(e) => tracing::warn!(%learner, "{e}"),
                }
                return;
            }
        };
        if let Some(whole) = w.values.whole_vec().filter(|v| v.len() == self.model.param_count()) {
            self.shared = Some(Arc::clone(whole));
        } else if let Err(e) = self.model.write_params(link.range.start, &w.values) {
            return tracing::warn!(%learner, "weights from {} rejected: {e}", w.shard);
        }
        match core.on_weights(w.shard, w.clock) {
            Ok(Some(event)) => {
                drop(w);
                self.carry_out(vec![event], ctx);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(%learner, "{e}"),
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
