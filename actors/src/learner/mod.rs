//! The learner actor: a thin shell over its protocol family's loop (a [`Behaviour`]: Rudra's SGD
//! loop [`LearnerCore`], whose pulls the shards answer with weights, or the EASGD family's
//! [`ElasticWorker`], whose exchanges they answer with centers) that computes gradients with a
//! [`GradientModel`] (a [`rudra_compute::Model`], or a model of your own) on its own partition
//! of the training set.

use std::sync::Arc;

use actix::prelude::*;
use rudra_compute::{GradientModel, Minibatches, cpu};
use rudra_transport::quic::Traffic;
use rudra_transport::{Codecs, Floats, LearnerId, Payload, ShardId};

mod buffers;

use buffers::{Gradients, WireState};

use crate::ActorError;
use crate::faults::Liveness;
use crate::links::{SchedulerLink, ShardLink};
use crate::messages::{
    AnswerRoutes, BatchSizes, Center, Evaluate, Exchange, Heartbeat, InjectedPanic, LearnerDone, Measured,
    Progress, Pull, Push, Served, StartLearner, StopLearner,
};
use rudra_proto::{CoreError, ElasticWorker, LearnerCore, LearnerEvent, NextPull, WorkerEvent};

/// A protocol family's learner loop, as the learner actor drives it.
pub trait Behaviour: Sized + Send + Unpin + 'static {
    /// What the shards answer this loop with: weights for a pull, or a center for an exchange.
    type Answer: Message<Result = ()> + Clone + Send + 'static;

    /// The learner's id.
    fn id(&self) -> LearnerId;

    /// Steps done so far.
    fn steps_done(&self) -> u64;

    /// Where the learner at `addr` takes its answers.
    fn answers_to(addr: &Addr<LearnerActor<Self>>) -> Recipient<Self::Answer>;

    /// Begin training.
    fn start(act: &mut LearnerActor<Self>, ctx: &mut Context<LearnerActor<Self>>);

    /// Answers have been overdue for longer than the retry interval: ask again (the EASGD
    /// family's exchanges are not retried).
    fn retry(_act: &mut LearnerActor<Self>, _ctx: &mut Context<LearnerActor<Self>>) {}

    /// The next epoch's batch sizes arrived while a step waited for them: compute it (only
    /// Rudra's SGD rules have adaptive batch sizes).
    fn resume(_act: &mut LearnerActor<Self>, _ctx: &mut Context<LearnerActor<Self>>) {}
}

/// The learner actor.
pub struct LearnerActor<B: Behaviour> {
    core: B,
    model: Box<dyn GradientModel>,
    batches: Minibatches,
    shards: Vec<ShardLink>,
    /// Where each shard sends its answers: this learner, maybe through a faulty link.
    answers: Vec<Recipient<B::Answer>>,
    scheduler: SchedulerLink,
    grads: Gradients,
    /// With a single shard, its weights are computed on in place rather than copied.
    shared: Option<Arc<Vec<f32>>>,
    /// What this learner has done, as last reported and since.
    totals: Progress,
    /// Steps already in a report.
    reported_steps: u64,
    liveness: Liveness,
    /// Computation is stretched to this many times its length (a slow learner).
    slowdown: f64,
    /// When the learner last heard from a shard or asked one: pulls unanswered for longer
    /// than [`Liveness::retry`] are sent again.
    last_activity: std::time::Instant,
    /// How payloads are encoded, and what compression has not sent yet (error feedback).
    wire: WireState,
    /// A step waits for the next epoch's batch sizes (adaptive batch sizes).
    awaiting_sizes: bool,
}

/// Progress is reported to the scheduler every this many steps (and at the end).
const REPORT_EVERY: u64 = 8;

/// What a learner needs besides its loop: its model and minibatches, its peers, and how it
/// stays alive (built by [`crate::roles`]).
pub struct LearnerParts {
    /// The model gradients are computed on.
    pub model: Box<dyn GradientModel>,
    /// The learner's partition of the training set.
    pub batches: Minibatches,
    /// Every shard, in id order.
    pub shards: Vec<ShardLink>,
    /// Where progress, completion and heartbeats go.
    pub scheduler: SchedulerLink,
    /// Heartbeats and retries.
    pub liveness: Liveness,
    /// Each gradient takes this many times as long (fault injection; 1 for a normal learner).
    pub slowdown: f64,
    /// How payloads are encoded.
    pub codecs: Codecs,
    /// Whether exchanges add up like gradients ([`crate::ClusterSpec::exchanges_gradients`]).
    pub exchanges_gradients: bool,
    /// Where this learner's connections count their bytes (none in one process).
    pub traffic: Option<Arc<Traffic>>,
}

impl<B: Behaviour> LearnerActor<B> {
    /// A learner running `core` with `parts`; each shard's answers reach it at `answers`, in
    /// shard order.
    #[must_use]
    pub fn new(core: B, parts: LearnerParts, answers: Vec<Recipient<B::Answer>>) -> Self {
        let wire = WireState::new(&parts, parts.shards.len());
        let LearnerParts { model, batches, shards, scheduler, liveness, slowdown, .. } = parts;
        let grads = Gradients::new(model.param_count());
        let totals = Progress::start(core.id());
        Self {
            core,
            model,
            batches,
            shards,
            answers,
            scheduler,
            grads,
            shared: None,
            totals,
            reported_steps: 0,
            liveness,
            slowdown: slowdown.max(1.0),
            last_activity: std::time::Instant::now(),
            wire,
            awaiting_sizes: false,
        }
    }

    /// Send heartbeats, and pull again where an answer is overdue (Rudra's SGD protocols; an
    /// EASGD exchange is not retried).
    fn start_timers(&mut self, ctx: &mut Context<Self>) {
        let pulse = Pulse {
            learner: ctx.address().recipient().downgrade(),
            id: self.id(),
            to: self.scheduler.heartbeat.clone(),
            every: self.liveness.heartbeat,
        };
        Pulse::start_in_arbiter(&System::current().arbiter().clone(), move |_| pulse);
        ctx.run_interval(self.liveness.retry / 2, |act, ctx| {
            if act.last_activity.elapsed() >= act.liveness.retry {
                B::retry(act, ctx);
            }
        });
    }

    /// Report the totals so far.
    fn report(&mut self) {
        self.totals.wire_bytes += self.wire.traffic_since();
        self.reported_steps = self.totals.steps;
        self.scheduler.progress.do_send(self.totals.clone());
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

    /// One gradient on the next minibatch, at `at` or at the model's own parameters, into
    /// the newest gradient buffer; progress is reported every few steps.
    fn gradient(&mut self, at: Option<&Arc<Vec<f32>>>) -> Result<(), ActorError> {
        let started = std::time::Instant::now();
        let batch = self.batches.next_batch();
        let samples = batch.len() as u64;
        self.grads.examples = batch.len() as u32;
        let loss = self.model.gradient_on(at, batch)?;
        // The buffer is swapped with the model's, not copied.
        self.model.take_gradient(self.grads.next())?;
        if self.slowdown > 1.0 {
            // Each learner has a thread of its own: only this learner slows down.
            std::thread::sleep(started.elapsed().mul_f64(self.slowdown - 1.0));
        }
        let p = &mut self.totals;
        (p.samples, p.steps, p.loss_sum) = (p.samples + samples, p.steps + 1, p.loss_sum + f64::from(loss));
        p.compute_seconds += started.elapsed().as_secs_f64();
        let step = self.core.steps_done() + 1;
        if !loss.is_finite() {
            // The scheduler sees this loss and stops the run; nothing of this step is pushed.
            self.report();
            return Err(ActorError::NonFiniteLoss(format!(
                "{}: the train loss is {loss} at step {step}",
                self.id()
            )));
        }
        if !cpu::all_finite(&self.grads.newest) {
            return Err(ActorError::NonFiniteGradient(format!("{}: step {step}, loss {loss}", self.id())));
        }
        // The first step is reported at once: its loss is the run's baseline for divergence.
        if self.totals.steps - self.reported_steps >= REPORT_EVERY || step == 1 {
            self.report();
        }
        Ok(())
    }

    /// The step could not be finished: a non-finite loss leaves the learner waiting to be
    /// stopped (the run has diverged); any other error fails it.
    fn halt(&mut self, error: &ActorError, ctx: &mut Context<Self>) {
        match error {
            ActorError::NonFiniteLoss(why) => tracing::error!("{why}; nothing pushed, waiting to be stopped"),
            _ => self.fail(error, ctx),
        }
    }
}

/// Rudra's SGD protocols: pull weights from every shard, compute, push the gradient (with the
/// next pull riding on it).
impl Behaviour for LearnerCore {
    type Answer = Served;

    fn id(&self) -> LearnerId {
        self.id()
    }

    fn steps_done(&self) -> u64 {
        self.steps_done()
    }

    fn answers_to(addr: &Addr<LearnerActor<Self>>) -> Recipient<Served> {
        addr.clone().recipient()
    }

    fn start(act: &mut LearnerActor<Self>, ctx: &mut Context<LearnerActor<Self>>) {
        let events = act.core.on_start();
        act.carry_out(events, ctx);
    }

    fn retry(act: &mut LearnerActor<Self>, ctx: &mut Context<LearnerActor<Self>>) {
        let events = act.core.on_retry();
        if !events.is_empty() {
            tracing::debug!(learner = %act.core.id(), "pulling again: {} answers overdue", events.len());
            act.carry_out(events, ctx);
        }
    }

    fn resume(act: &mut LearnerActor<Self>, ctx: &mut Context<LearnerActor<Self>>) {
        act.carry_out(vec![LearnerEvent::Compute], ctx);
    }
}

impl LearnerActor<LearnerCore> {
    fn carry_out(&mut self, events: Vec<LearnerEvent>, ctx: &mut Context<Self>) {
        let learner = self.core.id();
        for event in events {
            match event {
                LearnerEvent::Pull { shard, last, seq } => {
                    self.last_activity = std::time::Instant::now();
                    let reply_to = self.answers[shard.index()].clone();
                    self.shards[shard.index()].pull.do_send(Pull { learner, seq, last, reply_to });
                }
                LearnerEvent::Push { shard, computed_on, seq, pull: NextPull { seq: next, last } } => {
                    self.last_activity = std::time::Instant::now();
                    let Some((values, examples)) = self.push_payload(shard.index(), seq) else { continue };
                    self.totals.payload_up += values.bytes() as u64;
                    let then =
                        Pull { learner, seq: next, last, reply_to: self.answers[shard.index()].clone() };
                    let push = Push { learner, seq, computed_on, values, examples, then };
                    self.shards[shard.index()].push.do_send(push);
                    // The next minibatch is gathered while the weights are on their way.
                    self.batches.prepare();
                }
                LearnerEvent::Compute if !self.batches.ready() => {
                    tracing::debug!(%learner, "waiting for the next epoch's batch sizes");
                    self.awaiting_sizes = true;
                }
                LearnerEvent::Compute => {
                    // Without prefetch the next gradient is always on new weights: the shard
                    // gets its buffer back unshared.
                    let at = if self.core.prefetch() == 0 { self.shared.take() } else { self.shared.clone() };
                    let next = self.gradient(at.as_ref()).and_then(|()| Ok(self.core.on_computed()?));
                    match next {
                        Ok(more) => self.carry_out(more, ctx),
                        Err(e) => self.halt(&e, ctx),
                    }
                }
                LearnerEvent::Finished => self.finish(),
            }
        }
    }

    /// Shard `s`'s part of the gradient of step `seq`, encoded, and the examples it is over:
    /// the payload sent before when this is a retry of it, else fresh from the newest gradient
    /// (with error feedback), kept until the push is answered.
    fn push_payload(&mut self, s: usize, seq: u64) -> Option<(Payload, u32)> {
        if let Some((_, p, examples)) = self.wire.sent[s].iter().find(|(sent, ..)| *sent == seq) {
            return Some((p.clone(), *examples));
        }
        let range = self.shards[s].range.clone();
        let values = Floats::from(Arc::clone(&self.grads.newest)).slice(range.clone())?;
        let payload = self.wire.gradient(&values, range);
        let examples = self.grads.examples;
        self.wire.sent[s].push_back((seq, payload.clone(), examples));
        Some((payload, examples))
    }

    /// Weights from a shard the SGD loop accepted as the answer to this step's pull: computed on
    /// in place (a single shard's whole vector) or written into the model.
    fn take_weights(&mut self, shard: usize, values: &Floats) -> Result<(), ActorError> {
        match values.whole_vec().filter(|v| v.len() == self.model.param_count()) {
            Some(whole) => self.shared = Some(Arc::clone(whole)),
            None => self.model.write_params(self.shards[shard].range.start, values)?,
        }
        Ok(())
    }
}

/// The EASGD family: local steps, and every τ an exchange with each center shard.
impl Behaviour for ElasticWorker {
    type Answer = Center;

    fn id(&self) -> LearnerId {
        self.id()
    }

    fn steps_done(&self) -> u64 {
        self.steps_done()
    }

    fn answers_to(addr: &Addr<LearnerActor<Self>>) -> Recipient<Center> {
        addr.clone().recipient()
    }

    fn start(act: &mut LearnerActor<Self>, ctx: &mut Context<LearnerActor<Self>>) {
        let events = act.core.on_start();
        act.carry_out(events, ctx);
    }
}

impl LearnerActor<ElasticWorker> {
    fn carry_out(&mut self, events: Vec<WorkerEvent>, ctx: &mut Context<Self>) {
        for event in events {
            match event {
                WorkerEvent::Exchange { values, shards } => {
                    let values = Floats::from(values);
                    let links = self.shards.iter().zip(&self.answers).skip(shards.start).take(shards.len());
                    for (link, reply_to) in links {
                        let Some(part) = values.slice(link.range.clone()) else { continue };
                        let payload = if self.wire.exchanges_gradients {
                            self.wire.gradient(&part, link.range.clone())
                        } else {
                            self.wire.codecs.weights.encode(&part, None)
                        };
                        self.totals.payload_up += payload.bytes() as u64;
                        let reply_to = reply_to.clone();
                        link.exchange.do_send(Exchange {
                            learner: self.core.id(),
                            values: payload,
                            reply_to,
                        });
                    }
                }
                WorkerEvent::Compute(point) => {
                    let computed = self.gradient(Some(&point));
                    drop(point);
                    let next = computed.and_then(|()| Ok(self.core.on_gradient(&self.grads.newest)?));
                    match next {
                        Ok(more) => self.carry_out(more, ctx),
                        Err(e) => self.halt(&e, ctx),
                    }
                }
                WorkerEvent::Finished => self.finish(),
            }
        }
    }
}

impl<B: Behaviour> Actor for LearnerActor<B> {
    type Context = Context<Self>;
}

/// A learner's heartbeats, sent from the system's arbiter rather than the learner's own
/// thread, so that a long computation never looks like a failure. They stop with the learner.
struct Pulse {
    learner: actix::WeakRecipient<StopLearner>,
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

impl<B: Behaviour> Handler<BatchSizes> for LearnerActor<B> {
    type Result = ();
    fn handle(&mut self, BatchSizes { sizes }: BatchSizes, ctx: &mut Context<Self>) {
        if let Err(why) = self.batches.set_sizes(&sizes) {
            let error = CoreError::Protocol(format!("the scheduler's batch sizes: {why}"));
            return self.fail(&error.into(), ctx);
        }
        if self.awaiting_sizes && self.batches.ready() {
            self.awaiting_sizes = false;
            B::resume(self, ctx);
        }
    }
}

impl<B: Behaviour> Handler<StartLearner> for LearnerActor<B> {
    type Result = ();
    fn handle(&mut self, _: StartLearner, ctx: &mut Context<Self>) {
        self.start_timers(ctx);
        B::start(self, ctx);
    }
}

impl<B: Behaviour> LearnerActor<B> {
    /// An answer of `len` values from `shard` arrived: its bytes as it travelled, or `None`
    /// (logged) when it cannot be this learner's.
    fn answered(&mut self, shard: ShardId, len: usize) -> Option<u64> {
        let learner = self.id();
        let Some(link) = self.shards.get(shard.index()) else {
            tracing::warn!(%learner, "an answer from unknown {shard}");
            return None;
        };
        if len != link.range.len() {
            let want = link.range.len();
            tracing::warn!(%learner, "an answer from {shard} rejected: {len} values for a range of {want}");
            return None;
        }
        self.last_activity = std::time::Instant::now();
        // As the answer travelled: one from the network arrives decoded, in the job's codec.
        Some(self.wire.codecs.weights.bytes(len) as u64)
    }
}

impl Handler<Served> for LearnerActor<LearnerCore> {
    type Result = ();
    fn handle(&mut self, Served { shard, clock, seq, values }: Served, ctx: &mut Context<Self>) {
        let Some(bytes) = self.answered(shard, values.len()) else { return };
        // The core decides first: a late or repeated answer must not overwrite weights the
        // learner already holds for this step.
        match self.core.on_weights(shard, clock, seq) {
            Ok(answered) => {
                self.totals.payload_down += bytes;
                let core = &self.core;
                self.wire.sent[shard.index()].retain(|(seq, ..)| core.awaits(shard, *seq));
                if answered.newer {
                    let taken = decoded(values).and_then(|v| self.take_weights(shard.index(), &v));
                    if let Err(e) = taken {
                        return self.fail(&e, ctx);
                    }
                }
                self.carry_out(answered.events, ctx);
            }
            Err(e) => refused(self.id(), &e.into()),
        }
    }
}

impl Handler<Center> for LearnerActor<ElasticWorker> {
    type Result = ();
    fn handle(&mut self, Center { shard, values, .. }: Center, ctx: &mut Context<Self>) {
        let Some(bytes) = self.answered(shard, values.len()) else { return };
        match decoded(values).and_then(|v| Ok(self.core.on_center(shard, &v)?)) {
            Ok(events) => {
                self.totals.payload_down += bytes;
                self.carry_out(events, ctx);
            }
            Err(e) => refused(self.id(), &e),
        }
    }
}

/// A shard's answer decoded into `f32` values (a payload from this process was encoded here;
/// one from the network was checked and decoded at the boundary).
fn decoded(values: Payload) -> Result<Floats, ActorError> {
    Ok(values.decode()?)
}

/// Log an answer the loop refused: a duplicate at debug, anything else as a warning.
fn refused(learner: LearnerId, e: &ActorError) {
    match e {
        ActorError::Core(c) if c.is_duplicate() => tracing::debug!(%learner, "ignored: {c}"),
        _ => tracing::warn!(%learner, "{e}"),
    }
}

impl<B: Behaviour> Handler<InjectedPanic> for LearnerActor<B> {
    type Result = ();
    fn handle(&mut self, _: InjectedPanic, _: &mut Context<Self>) {
        panic!("{}: injected panic (faults.panic)", self.id());
    }
}

impl<B: Behaviour> Handler<AnswerRoutes<B::Answer>> for LearnerActor<B> {
    type Result = MessageResult<AnswerRoutes<B::Answer>>;
    fn handle(&mut self, _: AnswerRoutes<B::Answer>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.answers.clone())
    }
}

impl<B: Behaviour> Handler<Evaluate> for LearnerActor<B> {
    type Result = MessageResult<Evaluate>;
    fn handle(&mut self, m: Evaluate, _: &mut Context<Self>) -> Self::Result {
        match self.model.evaluate_weights(&m.params, m.last) {
            Ok(measured) => MessageResult(measured.map(|(loss, accuracy)| Measured { loss, accuracy })),
            Err(e) => {
                tracing::error!(learner = %self.id(), "the evaluation failed: {e}");
                MessageResult(None)
            }
        }
    }
}

impl<B: Behaviour> Handler<StopLearner> for LearnerActor<B> {
    type Result = ();
    fn handle(&mut self, _: StopLearner, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
