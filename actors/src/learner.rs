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
use crate::faults::Liveness;
use crate::protocol::{ElasticWorker, LearnerCore, LearnerEvent, WorkerEvent};
use crate::scheduler::{Heartbeat, LearnerDone, Progress};
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
    /// Where the shard's answers go (the learner itself unless set).
    pub reply_to: Option<Recipient<Served>>,
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
            reply_to: None,
        }
    }

    /// This link with its pulls, pushes and answers sent through these recipients instead
    /// (links that inject faults).
    #[must_use]
    pub fn faulty(self, pull: Recipient<Pull>, push: Recipient<Push>, reply_to: Recipient<Served>) -> Self {
        Self { pull, push, reply_to: Some(reply_to), ..self }
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
    /// The loop of a learner's `incarnation`-th start: its step numbers follow every earlier
    /// incarnation's (see [`LearnerCore::incarnation_base`]).
    #[must_use]
    pub fn incarnation(self, incarnation: u32) -> Self {
        match self {
            Self::Sgd(c) => Self::Sgd(c.with_seq_base(LearnerCore::incarnation_base(incarnation))),
            elastic @ Self::Elastic(_) => elastic,
        }
    }

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
    /// I am alive.
    pub heartbeat: Recipient<Heartbeat>,
}

impl SchedulerLink {
    /// The link to anything that takes a scheduler's learner messages.
    #[must_use]
    pub fn of<A>(addr: &Addr<A>) -> Self
    where
        A: Actor + Handler<Progress> + Handler<LearnerDone> + Handler<Heartbeat>,
        A::Context: actix::dev::ToEnvelope<A, Progress>
            + actix::dev::ToEnvelope<A, LearnerDone>
            + actix::dev::ToEnvelope<A, Heartbeat>,
    {
        Self {
            progress: addr.clone().recipient(),
            done: addr.clone().recipient(),
            heartbeat: addr.clone().recipient(),
        }
    }
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
    liveness: Liveness,
    /// Computation is stretched to this many times its length (a slow learner).
    slowdown: f64,
    /// When the learner last heard from a shard or asked one: pulls unanswered for longer
    /// than [`Liveness::retry`] are sent again.
    last_activity: std::time::Instant,
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
        Self {
            core,
            model,
            batches,
            shards,
            scheduler,
            grad,
            shared: None,
            unreported,
            liveness: Liveness::default(),
            slowdown: 1.0,
            last_activity: std::time::Instant::now(),
        }
    }

    /// Heartbeats and retries at these intervals instead of the defaults.
    #[must_use]
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = liveness;
        self
    }

    /// Take `factor` times as long for every gradient (fault injection: a slow learner).
    #[must_use]
    pub fn with_slowdown(mut self, factor: f64) -> Self {
        self.slowdown = factor.max(1.0);
        self
    }

    /// Send heartbeats, and pull again where an answer is overdue (Rudra's SGD protocols; an
    /// EASGD exchange is not retried).
    fn start_timers(&mut self, ctx: &mut Context<Self>) {
        let pulse = Pulse {
            learner: ctx.address().downgrade(),
            id: self.id(),
            to: self.scheduler.heartbeat.clone(),
            every: self.liveness.heartbeat,
        };
        Pulse::start_in_arbiter(&System::current().arbiter().clone(), move |_| pulse);
        ctx.run_interval(self.liveness.retry / 2, |act, ctx| {
            let LearnerLoop::Sgd(core) = &act.core else { return };
            if act.last_activity.elapsed() < act.liveness.retry {
                return;
            }
            let events = core.on_retry();
            if !events.is_empty() {
                tracing::debug!(learner = %core.id(), "pulling again: {} answers overdue", events.len());
                act.carry_out(events, ctx);
            }
        });
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
                LearnerEvent::Pull { shard, last, seq } => {
                    self.last_activity = std::time::Instant::now();
                    let link = &self.shards[shard.index()];
                    let reply_to = link.reply_to.clone().unwrap_or_else(|| ctx.address().recipient());
                    link.pull.do_send(Pull { learner, seq, last, reply_to });
                }
                LearnerEvent::Push { shard, computed_on, seq } => {
                    let link = &self.shards[shard.index()];
                    let grad = Floats::from(Arc::clone(&self.grad));
                    if let Some(values) = grad.slice(link.range.clone()) {
                        link.push.do_send(Push { learner, seq, computed_on, values });
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
        let started = std::time::Instant::now();
        let (x, y) = self.batches.next_batch();
        let samples = y.len() as u64;
        let loss = match at {
            Some(params) => self.model.loss_and_gradient_at(params, x, y)?,
            None => self.model.loss_and_gradient(x, y)?,
        };
        // The shards dropped last step's gradient before answering this step's pulls, so the
        // buffer is normally unshared: it is swapped with the model's, not copied.
        self.model.take_gradient(Arc::make_mut(&mut self.grad))?;
        if self.slowdown > 1.0 {
            // Each learner has a thread of its own: only this learner slows down.
            std::thread::sleep(started.elapsed().mul_f64(self.slowdown - 1.0));
        }
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

/// A learner's heartbeats, sent from the system's arbiter rather than the learner's own
/// thread, so that a long computation never looks like a failure. They stop with the learner.
struct Pulse {
    learner: actix::WeakAddr<LearnerActor>,
    id: LearnerId,
    to: Recipient<Heartbeat>,
    every: std::time::Duration,
}

impl Actor for Pulse {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |pulse, ctx| {
            if pulse.learner.upgrade().is_some_and(|l| l.connected()) {
                pulse.to.do_send(Heartbeat(pulse.id));
            } else {
                ctx.stop();
            }
        });
    }
}

impl Handler<StartLearner> for LearnerActor {
    type Result = ();
    fn handle(&mut self, _: StartLearner, ctx: &mut Context<Self>) {
        self.start_timers(ctx);
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
    fn handle(&mut self, Served { weights: w, seq }: Served, ctx: &mut Context<Self>) {
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
        self.last_activity = std::time::Instant::now();
        match core.on_weights(w.shard, w.clock, seq) {
            Ok(Some(event)) => {
                drop(w);
                self.carry_out(vec![event], ctx);
            }
            Ok(None) => {}
            Err(e @ ActorError::Duplicate(_)) => tracing::debug!(%learner, "ignored: {e}"),
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
