//! The scheduler actor: a thin shell over [`SchedulerCore`] that also evaluates the model at
//! epoch boundaries and assembles the [`RunReport`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_compute::Dataset;
use rudra_transport::ShardId;
use tokio::sync::{mpsc, oneshot};

use crate::evaluation::{Ask, Evaluation};
use crate::goodput::{LearnerClocks, LearnerTime, goodput};
use crate::links::Members;
use crate::messages::{
    Disconnected, GetState, GetStats, Heartbeat, IsAlive, Joined, LearnerDone, Membership, Note, Progress,
    StartLearner, StopLearner, StopShard,
};
use crate::metrics::Metrics;
use crate::report::{
    BytesMoved, Diverged, MetricsRow, ProgressSnapshot, RunEvent, RunReport, SchedulerState, TimelineEntry,
};
use crate::{ActorError, Models};
use rudra_proto::{BatchPlanner, Divergence, SchedulerCore, SchedulerEvent};

mod batches;
mod shards;

/// Where the run's report goes.
pub type ReportSender = oneshot::Sender<Result<RunReport, ActorError>>;

/// The run's summary (`summary.json`) of its report, which the learners are given as they
/// are stopped.
pub type Summarise = Box<dyn Fn(&RunReport) -> Option<Arc<str>>>;

/// How often progress is sent to the observer.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// The scheduler actor.
pub struct SchedulerActor {
    core: SchedulerCore,
    members: Members,
    models: Models,
    test: Arc<Dataset>,
    total_samples: u64,
    learner_samples: Vec<u64>,
    /// Each learner's totals as last heard (what its next report is counted against).
    reported: Vec<Option<Progress>>,
    metrics: Option<Arc<Metrics>>,
    started: Option<Instant>,
    loss_window: (f64, u64),
    last_progress: Instant,
    rows: Vec<MetricsRow>,
    /// Whether an evaluation is under way.
    evaluating: bool,
    /// Evaluations asked for meanwhile (whether each is the final one), run in turn.
    queued: VecDeque<bool>,
    observer: Option<mpsc::UnboundedSender<RunEvent>>,
    report: Option<ReportSender>,
    /// When the scheduler was made: the failure detector's and the timeline's clock.
    born: Instant,
    /// How often the failure detector looks, if it runs.
    tick: Option<Duration>,
    timeline: Vec<TimelineEntry>,
    /// Updates shards made and then lost in a crash (rolled back to a checkpoint).
    updates_lost: u64,
    /// How long a lost shard may take to come back.
    shard_timeout: Duration,
    /// Shards lost and not back yet, with the number of times each was lost.
    shards_down: BTreeMap<ShardId, u64>,
    shard_losses: u64,
    /// Set when the run diverged.
    divergence: Option<Divergence>,
    /// What the learners' messages carried so far.
    bytes: BytesMoved,
    /// Each learner's compute time, and when it finished or left.
    clocks: LearnerClocks,
    summarise: Option<Summarise>,
    /// With adaptive batch sizes: their planner.
    planner: Option<BatchPlanner>,
}

/// What a scheduler needs besides its core (built by [`crate::roles`]).
pub struct SchedulerParts {
    /// The shards, learners and tracker it drives.
    pub members: Members,
    /// The models: the scheduler evaluates the assembled parameters on one of them.
    pub models: Models,
    /// The test set.
    pub test: Arc<Dataset>,
    /// Examples the learners will process over the run (for progress).
    pub total_samples: u64,
    /// λ.
    pub learners: u32,
    /// Who is told progress and evaluations, if anyone.
    pub observer: Option<mpsc::UnboundedSender<RunEvent>>,
    /// Where the run's report goes.
    pub report: ReportSender,
    /// Where learners alive and their samples are counted, if anywhere.
    pub metrics: Option<Arc<Metrics>>,
    /// How often the failure detector looks for silent learners (none: it does not run).
    pub detector_tick: Option<Duration>,
    /// How long a lost shard may take to come back before the run is stopped.
    pub shard_timeout: Duration,
    /// The run's summary, given to the learners at the end, if they are given one.
    pub summarise: Option<Summarise>,
    /// With adaptive batch sizes: their planner.
    pub planner: Option<BatchPlanner>,
}

impl SchedulerActor {
    /// A scheduler running `core` with `parts`.
    #[must_use]
    pub fn new(core: SchedulerCore, parts: SchedulerParts) -> Self {
        let SchedulerParts {
            members,
            models,
            test,
            total_samples,
            learners,
            observer,
            report,
            metrics,
            detector_tick,
            shard_timeout,
            summarise,
            planner,
        } = parts;
        Self {
            core,
            members,
            models,
            test,
            total_samples,
            learner_samples: vec![0; learners as usize],
            reported: vec![None; learners as usize],
            metrics,
            started: None,
            loss_window: (0.0, 0),
            last_progress: Instant::now(),
            rows: Vec::new(),
            evaluating: false,
            queued: VecDeque::new(),
            observer,
            report: Some(report),
            born: Instant::now(),
            tick: detector_tick,
            timeline: Vec::new(),
            updates_lost: 0,
            shard_timeout,
            shards_down: BTreeMap::new(),
            shard_losses: 0,
            divergence: None,
            bytes: BytesMoved::default(),
            clocks: LearnerClocks::new(learners as usize),
            summarise,
            planner,
        }
    }

    /// Go on from `state`, what an earlier scheduler of this run recorded: its clocks go on
    /// from where they were when the state was taken, plus the time since (the run went on
    /// while no scheduler was there).
    #[must_use]
    pub fn resumed(mut self, state: SchedulerState) -> Self {
        let since = (SchedulerState::now() - state.taken_at).max(0.0);
        let ago = |s: f64| Instant::now().checked_sub(Duration::from_secs_f64((s + since).max(0.0)));
        self.born = ago(state.born_seconds).unwrap_or(self.born);
        self.started = state.core.started().then(|| ago(state.wall_seconds)).flatten();
        self.core = state.core;
        self.learner_samples = state.learner_samples;
        self.reported = state.reported;
        self.reported.resize(self.learner_samples.len(), None);
        self.rows = state.rows;
        self.timeline = state.timeline;
        self.updates_lost = state.updates_lost;
        self.bytes = state.bytes;
        if state.clocks != LearnerClocks::default() {
            self.clocks = state.clocks;
        }
        if state.planner.is_some() {
            self.planner = state.planner;
        }
        self.note("recovered", "the scheduler resumed the run from its state".to_owned());
        self
    }

    /// Look for silent nodes every `tick`, from now on.
    fn watch(&self, ctx: &mut Context<Self>) {
        if let Some(tick) = self.tick {
            ctx.run_interval(tick, |act, ctx| {
                let events = act.core.on_tick(act.born.elapsed());
                act.carry_out(events, ctx);
            });
        }
    }

    fn note(&mut self, kind: &'static str, what: String) {
        let seconds = self.born.elapsed().as_secs_f64();
        self.timeline.push(TimelineEntry { seconds, kind: kind.to_owned(), what });
    }

    fn count_alive(&self) {
        if let Some(m) = &self.metrics {
            m.set_learners_alive(self.core.learners_alive());
        }
    }

    fn elapsed(&self) -> f64 {
        self.started.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    fn emit(&self, event: RunEvent) {
        if let Some(tx) = &self.observer {
            // A dropped receiver only means nobody is watching.
            let _ = tx.send(event);
        }
    }

    fn carry_out(&mut self, events: Vec<SchedulerEvent>, ctx: &mut Context<Self>) {
        for event in events {
            match event {
                SchedulerEvent::Start => {
                    self.started = Some(Instant::now());
                    for l in &self.members.learners {
                        l.start.do_send(StartLearner);
                    }
                    self.watch(ctx);
                }
                SchedulerEvent::Lost(l) => {
                    self.clocks.ended(l, self.elapsed());
                    tracing::warn!(learner = %l, "learner lost; the run goes on without it");
                    self.note("detected", format!("{l} lost"));
                }
                SchedulerEvent::Rejoined(l) => {
                    self.clocks.back(l);
                    self.send_sizes(l);
                    // Noted with the clock it rejoins at, once the tracker has said what it is.
                    let seconds = self.born.elapsed().as_secs_f64();
                    let stats = self.members.stats.send(GetStats);
                    ctx.spawn(stats.into_actor(self).map(move |stats, act, _| {
                        let clock = stats.map(|s| format!(" at clock {}", s.updates)).unwrap_or_default();
                        tracing::info!(learner = %l, "learner rejoined{clock}");
                        let what = format!("{l} rejoined{clock}");
                        act.timeline.push(TimelineEntry { seconds, kind: "detected".to_owned(), what });
                    }));
                }
                SchedulerEvent::Diverged(d) => {
                    tracing::error!(
                        "the run diverged: train loss {:.4} (the first measured was {:.4}); stopping",
                        d.train_loss,
                        d.first_loss
                    );
                    self.note("detected", format!("diverged: train loss {:.4}", d.train_loss));
                    self.divergence = Some(d);
                }
                SchedulerEvent::Membership => {
                    let active = self.core.active();
                    self.note("detected", format!("λ = {}", active.len()));
                    self.count_alive();
                    let aggregators = self.members.aggregators.iter();
                    for s in self.members.shards.iter().map(|s| &s.membership).chain(aggregators) {
                        s.do_send(Membership { active: active.clone() });
                    }
                }
                SchedulerEvent::ShardSilent(shard) => {
                    let why = format!("silent for {:?}", self.core.failure_timeout().unwrap_or_default());
                    self.shard_lost(shard, &why, ctx);
                }
                SchedulerEvent::ShardBack(shard) => {
                    tracing::info!(%shard, "shard heard from again");
                    self.shards_down.remove(&shard);
                    self.note("detected", format!("{shard} heard from again"));
                }
                SchedulerEvent::Evaluate { final_, .. } => self.evaluate(final_, ctx),
                // The final evaluation, queued just before, stops the nodes once it is done.
                SchedulerEvent::Stop => {}
            }
        }
    }

    /// Evaluate the weights now, or after the evaluation under way. Evaluations run beside the
    /// scheduler's other work: a shard lost meanwhile is noted when its connection ends, not
    /// once the evaluation waiting for its weights gives up.
    fn evaluate(&mut self, final_: bool, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.evaluating, true) {
            self.queued.push_back(final_);
            return;
        }
        let ask = Ask {
            shards: self.members.shards.clone(),
            stats: self.members.stats.clone(),
            models: self.models.clone(),
            test: Arc::clone(&self.test),
            // A model the scheduler cannot evaluate is evaluated by the active learners' own.
            learners: (self.core.active().iter())
                .filter_map(|l| self.members.learners.get(l.index()))
                .map(|l| l.evaluate.clone())
                .collect(),
            final_,
            shard_timeout: self.shard_timeout,
            learner_timeout: self.core.failure_timeout().unwrap_or(self.shard_timeout),
        };
        let window = std::mem::take(&mut self.loss_window);
        let at = (
            self.elapsed(),
            self.core.samples(),
            self.core.epochs(),
            self.learner_samples.clone(),
            self.bytes,
        );
        ctx.spawn(ask.run().into_actor(self).map(move |result, act, ctx| {
            act.evaluating = false;
            match result {
                Ok(eval) => act.on_evaluated(eval, window, at, final_, ctx),
                // A shard known to be down has its own deadline: the evaluation waits for it
                // again, and the shard's timer stops the run if it is not back.
                Err(ActorError::ShardFailed(shard, _)) if act.shards_down.contains_key(&shard) => {
                    act.loss_window = (act.loss_window.0 + window.0, act.loss_window.1 + window.1);
                    act.queued.push_front(final_);
                }
                Err(e) => act.finish(Err(e), ctx),
            }
            if let Some(next) = act.queued.pop_front() {
                act.evaluate(next, ctx);
            }
        }));
    }

    fn on_evaluated(
        &mut self,
        eval: Evaluation,
        (loss_sum, loss_n): (f64, u64),
        (wall, samples, epochs, learner_samples, bytes): (f64, u64, f64, Vec<u64>, BytesMoved),
        final_: bool,
        ctx: &mut Context<Self>,
    ) {
        let learner_time = self.clocks.times(wall, &eval.tracker.by_learner);
        let row = MetricsRow {
            wall_seconds: wall,
            epoch: epochs,
            updates: eval.tracker.updates,
            samples,
            train_loss: if loss_n == 0 { f64::NAN } else { loss_sum / loss_n as f64 },
            test_loss: eval.measured.loss,
            test_accuracy: eval.measured.accuracy,
            mean_staleness: eval.tracker.staleness.mean,
            samples_per_second: if wall > 0.0 { samples as f64 / wall } else { 0.0 },
            learner_samples,
            bytes,
            learner_seconds: learner_time.iter().map(LearnerTime::seconds).collect(),
            goodput: goodput(&learner_time),
        };
        tracing::info!(
            epoch = format!("{:.2}", row.epoch),
            updates = row.updates,
            train_loss = format!("{:.4}", row.train_loss),
            test_accuracy = format!("{:.4}", row.test_accuracy),
            mean_staleness = format!("{:.2}", row.mean_staleness),
            samples_per_second = format!("{:.0}", row.samples_per_second),
            "evaluated"
        );
        self.emit(RunEvent::Evaluated(row.clone()));
        self.rows.push(row.clone());
        if let Some(m) = &self.metrics {
            m.set_learner_time(&learner_time);
        }
        if final_ {
            let report = RunReport {
                metrics: std::mem::take(&mut self.rows),
                params: eval.params,
                staleness: eval.tracker.staleness,
                updates: eval.tracker.updates,
                samples,
                samples_expected: self.total_samples,
                learner_samples: row.learner_samples.clone(),
                wall_seconds: wall,
                final_test_accuracy: row.test_accuracy,
                final_train_loss: row.train_loss,
                timeline: std::mem::take(&mut self.timeline),
                updates_lost: self.updates_lost,
                diverged: self.divergence.map(|d| Diverged {
                    update: eval.tracker.updates,
                    train_loss: d.train_loss,
                    first_loss: d.first_loss,
                }),
                bytes,
                goodput: row.goodput,
                learner_time,
                batch_sizes: self.batch_sizes(),
                shard_payload_in: eval.tracker.shard_payload_in,
            };
            self.finish(Ok(report), ctx);
        }
    }

    fn finish(&mut self, result: Result<RunReport, ActorError>, ctx: &mut Context<Self>) {
        let failure = result.as_ref().err().map(ToString::to_string);
        let summary =
            result.as_ref().ok().zip(self.summarise.as_ref()).and_then(|(r, summarise)| summarise(r));
        for s in &self.members.shards {
            s.stop.do_send(StopShard { failure: failure.clone() });
        }
        for l in &self.members.learners {
            l.stop.do_send(StopLearner { failure: failure.clone(), summary: summary.clone() });
        }
        if let Some(tx) = self.report.take() {
            // The receiver is gone only if the caller stopped waiting.
            let _ = tx.send(result);
        }
        ctx.stop();
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // A resumed run is under way: its failure detector looks from the start.
        if self.core.started() {
            self.watch(ctx);
        }
    }
}

impl Handler<GetState> for SchedulerActor {
    type Result = MessageResult<GetState>;
    fn handle(&mut self, _: GetState, _: &mut Context<Self>) -> Self::Result {
        MessageResult(SchedulerState {
            core: self.core.clone(),
            born_seconds: self.born.elapsed().as_secs_f64(),
            wall_seconds: self.elapsed(),
            taken_at: SchedulerState::now(),
            learner_samples: self.learner_samples.clone(),
            reported: self.reported.clone(),
            rows: self.rows.clone(),
            timeline: self.timeline.clone(),
            updates_lost: self.updates_lost,
            bytes: self.bytes,
            clocks: self.clocks.clone(),
            planner: self.planner.clone(),
        })
    }
}

impl Handler<Joined> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: Joined, ctx: &mut Context<Self>) {
        let events = match msg {
            Joined::Shard(s) => self.core.on_shard_joined(s),
            Joined::Learner(l) => self.core.on_learner_joined(l),
        };
        self.count_alive();
        self.carry_out(events, ctx);
    }
}

impl Handler<IsAlive> for SchedulerActor {
    type Result = bool;
    fn handle(&mut self, msg: IsAlive, _: &mut Context<Self>) -> bool {
        let now = self.born.elapsed();
        match msg {
            IsAlive::Shard(s) => self.core.shard_alive(s, now),
            IsAlive::Learner(l) => self.core.learner_alive(l, now),
        }
    }
}

impl Handler<Heartbeat> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, Heartbeat(learner): Heartbeat, ctx: &mut Context<Self>) {
        let events = self.core.on_heard(learner, self.born.elapsed());
        self.carry_out(events, ctx);
    }
}

impl Handler<Disconnected> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, Disconnected(learner): Disconnected, ctx: &mut Context<Self>) {
        let events = self.core.on_disconnected(learner);
        self.carry_out(events, ctx);
    }
}

impl Handler<Note> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, Note(what): Note, _: &mut Context<Self>) {
        tracing::info!("fault injected: {what}");
        self.note("injected", what);
    }
}

impl Handler<Progress> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, totals: Progress, ctx: &mut Context<Self>) {
        let heard = self.core.on_heard(totals.learner, self.born.elapsed());
        self.carry_out(heard, ctx);
        let Some(last) = self.reported.get_mut(totals.learner.index()) else {
            return tracing::warn!("progress from unknown {}", totals.learner);
        };
        let Some(msg) = totals.since(last.as_ref()) else { return };
        *last = Some(totals);
        self.loss_window.0 += msg.loss_sum;
        self.loss_window.1 += msg.steps;
        self.bytes.add(&msg);
        self.clocks.computed(msg.learner, msg.compute_seconds);
        self.learner_samples[msg.learner.index()] += msg.samples;
        if let Some(m) = &self.metrics {
            m.add_learner_samples(msg.learner, msg.samples);
            m.add_payload_bytes(msg.payload_up, msg.payload_down);
        }
        let mut events = self.core.on_progress(msg.samples);
        self.sizes_heard(&msg);
        events.extend(self.core.on_loss(msg.steps, msg.loss_sum));
        if self.last_progress.elapsed() >= PROGRESS_EVERY {
            self.last_progress = Instant::now();
            let mut snapshot = ProgressSnapshot {
                samples: self.core.samples(),
                total_samples: self.total_samples,
                epoch: self.core.epochs(),
                recent_loss: msg.loss_sum / msg.steps.max(1) as f64,
                wall_seconds: self.elapsed(),
                updates: 0,
                mean_staleness: 0.0,
            };
            // Updates and ⟨σ⟩ come from the tracker; the snapshot goes out once it answers.
            let stats = self.members.stats.send(GetStats);
            ctx.spawn(stats.into_actor(self).map(move |stats, act, _| {
                if let Ok(stats) = stats {
                    (snapshot.updates, snapshot.mean_staleness) = (stats.updates, stats.staleness.mean);
                }
                act.emit(RunEvent::Progress(snapshot));
            }));
        }
        self.carry_out(events, ctx);
    }
}

impl Handler<LearnerDone> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: LearnerDone, ctx: &mut Context<Self>) {
        self.clocks.ended(msg.learner, self.elapsed());
        let events = match msg.error {
            // The last learner's failure ends the run with its error; one of several is a lost
            // learner, and the others carry on.
            Some(error) if !self.core.active().iter().any(|&l| l != msg.learner) => {
                tracing::error!(learner = %msg.learner, "learner failed: {error}");
                self.finish(Err(ActorError::LearnerFailed(msg.learner, error)), ctx);
                return;
            }
            Some(error) => {
                tracing::error!(learner = %msg.learner, "learner failed: {error}; the others carry on");
                self.note("detected", format!("{} failed: {error}", msg.learner));
                // Its process ends rather than wait for the end of the run.
                if let Some(l) = self.members.learners.get(msg.learner.index()) {
                    l.stop.do_send(StopLearner { failure: Some(error), summary: None });
                }
                self.core.on_disconnected(msg.learner)
            }
            None => self.core.on_learner_finished(msg.learner),
        };
        self.count_alive();
        self.carry_out(events, ctx);
    }
}
