//! The discrete-event driver: one event queue in virtual time, the compute and network
//! models, the one seeded random generator, and the protocol world whose cores the events
//! are fed to.

use rudra_transport::Floats;

use rand_chacha::ChaCha8Rng;
use std::time::Duration;

use rudra_proto::{GraceWindow, GradientRecord, LeaderGroups, Outcome, StalenessStats, UpdateRecord};
use rudra_transport::{Clock, LearnerId, ShardId};
use serde::Serialize;

use super::events::{EventQueue, Nanos, TraceHash, seconds};
use super::gradients::{Gradients, Part};
use super::model::{ComputeModel, Network, Route};
use super::progress::Progress;
use super::settings::StopSpec;
use crate::RuntimeError;

/// A message between a learner and a shard.
pub trait Message {
    /// The link it travels and what it carries.
    fn route(&self) -> Route;
    /// Add what identifies it (kind, ends, clock) to the trace.
    fn trace(&self, hash: &mut TraceHash);
}

/// Something that happens at a virtual time.
pub enum Event<M> {
    /// A message arrives.
    Deliver(M),
    /// A learner finished computing its gradient (in its incarnation: a learner that left
    /// since never finishes it).
    Computed(LearnerId, u32),
    /// A learner leaves (churn).
    Leave(LearnerId),
    /// A learner that left joins again (churn).
    Join(LearnerId),
    /// A quorum round's grace window is over.
    Grace {
        /// The round's shard.
        shard: ShardId,
        /// The round's clock.
        clock: Clock,
    },
}

/// A protocol family on its cores: shards and learners, driven by delivered messages and
/// finished computations.
pub trait World {
    /// The messages its learners and shards exchange.
    type Msg: Message;
    /// Every learner starts.
    fn start(&mut self, eng: &mut Engine<Self::Msg>) -> Result<(), RuntimeError>;
    /// A message arrives.
    fn deliver(&mut self, eng: &mut Engine<Self::Msg>, msg: Self::Msg) -> Result<(), RuntimeError>;
    /// A learner's gradient is ready.
    fn computed(&mut self, eng: &mut Engine<Self::Msg>, learner: LearnerId) -> Result<(), RuntimeError>;
    /// The grace window of `shard`'s quorum round on `clock` is over.
    fn grace_over(
        &mut self,
        eng: &mut Engine<Self::Msg>,
        shard: ShardId,
        clock: Clock,
    ) -> Result<(), RuntimeError>;
    /// Updates applied by the shard that applied the most.
    fn updates(&self) -> u64;
    /// Every shard's current values, in shard order.
    fn values(&self) -> Vec<Floats>;
    /// Per-shard statistics.
    fn shard_reports(&self) -> Vec<ShardReport>;
    /// `learner` leaves: whatever it was computing or sending is lost, and the shards stop
    /// counting on it. Returns whether it left (a learner that has finished does not).
    fn leave(&mut self, _eng: &mut Engine<Self::Msg>, learner: LearnerId) -> Result<bool, RuntimeError> {
        Err(churn_unsupported(learner))
    }
    /// Learners the run no longer waits for: those that have taken all their steps, and those
    /// away (0 where the world does not count them).
    fn done(&self) -> usize {
        0
    }
    /// `learner`, which left, joins again as a new incarnation; or not yet (`false`), when
    /// what it left behind must settle first.
    fn join(&mut self, _eng: &mut Engine<Self::Msg>, learner: LearnerId) -> Result<bool, RuntimeError> {
        Err(churn_unsupported(learner))
    }
}

fn churn_unsupported(learner: LearnerId) -> RuntimeError {
    RuntimeError::Simulation(format!("internal error: {learner} churned in a protocol without churn"))
}

/// Per-shard statistics (`shards.csv`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardReport {
    /// The shard.
    pub shard: u32,
    /// Its clock: updates applied (or elastic exchanges and rounds).
    pub updates: u64,
    /// Gradients it applied.
    pub applied: u64,
    /// Gradients it dropped.
    pub dropped: u64,
    /// ⟨σ⟩ of the gradients it applied.
    pub mean_staleness: f64,
    /// Largest σ it applied.
    pub max_staleness: u64,
}

/// How many things happened (`summary.json` key `events`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    /// Events taken from the queue.
    pub processed: u64,
    /// Messages sent.
    pub messages: u64,
    /// Messages lost and sent again.
    pub resent: u64,
    /// Frame bytes of the messages sent.
    pub bytes: u64,
    /// Bytes of the values they carried from the learners: gradients and exchanges.
    pub payload_up_bytes: u64,
    /// Bytes of the values they carried to the learners: weights and centers.
    pub payload_down_bytes: u64,
    /// The most frame bytes on their way at one time.
    pub peak_bytes_in_flight: u64,
    /// Gradients computed.
    pub gradients: u64,
    /// Gradients a shard applied (summed over shards).
    pub applied: u64,
    /// Gradients a shard dropped (summed over shards).
    pub dropped: u64,
    /// Updates applied (summed over shards).
    pub updates: u64,
}

/// One row of `loss.csv`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossRow {
    /// Virtual time.
    pub virtual_seconds: f64,
    /// Gradients computed so far.
    pub gradients: u64,
    /// Updates so far (the shard with the most).
    pub updates: u64,
    /// The objective at the shards' values (quadratic), or the mean minibatch loss since the
    /// previous row (model).
    pub loss: f64,
}

/// A learner's time (`learners.csv`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LearnerReport {
    /// The learner.
    pub learner: u32,
    /// Whether it is a straggler.
    pub straggler: bool,
    /// Gradients it computed.
    pub gradients: u64,
    /// Virtual seconds spent computing.
    pub compute_seconds: f64,
    /// Virtual seconds spent waiting for weights or the center (while present).
    pub wait_seconds: f64,
    /// Of its compute seconds, those lost when it left: computed and never sent.
    pub lost_seconds: f64,
    /// `compute / (compute + wait)`.
    pub utilisation: f64,
    /// Its contributions the shards applied (once per shard a step reached).
    pub applied: u64,
    /// Its contributions the shards dropped.
    pub dropped: u64,
}

#[derive(Clone, Copy)]
struct LearnerTime {
    busy: Nanos,
    since: Option<Nanos>,
    gradients: u64,
    applied: u64,
    dropped: u64,
    /// Its incarnation: one more each time it leaves.
    incarnation: u32,
    /// Present since then, or away.
    joined: Option<Nanos>,
    /// Time present before that.
    present: Nanos,
    /// Compute since its last contribution was sent.
    unsent: Nanos,
    /// Compute it lost by leaving.
    lost: Nanos,
}

impl Default for LearnerTime {
    fn default() -> Self {
        let (busy, since, gradients, applied, dropped) = (0, None, 0, 0, 0);
        let (incarnation, joined, present, unsent, lost) = (0, Some(0), 0, 0, 0);
        Self { busy, since, gradients, applied, dropped, incarnation, joined, present, unsent, lost }
    }
}

/// Churn on the virtual clock: each present learner's rate of leaving, and how long it stays
/// away.
#[derive(Clone, Copy)]
struct Churn {
    rate: f64,
    away: Nanos,
}

/// Shared machinery of a simulation: the clock, the queue, the models, the random generator,
/// the statistics and the trace.
pub struct Engine<M> {
    now: Nanos,
    queue: EventQueue<Event<M>>,
    rng: ChaCha8Rng,
    compute: ComputeModel,
    net: Network,
    gradients: Gradients,
    hash: TraceHash,
    counts: EventCounts,
    staleness: StalenessStats,
    learners: Vec<LearnerTime>,
    loss_window: (f64, u64),
    loss_rows: Vec<LossRow>,
    /// With a quorum: each shard's grace windows, on the virtual clock.
    grace: Vec<GraceWindow>,
    churn: Option<Churn>,
    /// The run ends once this many learners are done (a quorum's run does not wait for the
    /// rest, nor does any run wait for a learner away).
    end_after: Option<usize>,
    /// Whose contributions each gradient record counts (groups with rounds of their own).
    credits: LeaderGroups,
}

/// What a finished run of the driver leaves.
pub struct Finished {
    /// Virtual end time.
    pub end: Nanos,
    /// Event counts.
    pub counts: EventCounts,
    /// Staleness over all shards.
    pub staleness: StalenessStats,
    /// Per-learner time.
    pub learners: Vec<LearnerReport>,
    /// `loss.csv`.
    pub loss: Vec<LossRow>,
    /// The hash of the ordered event log.
    pub hash: TraceHash,
    /// The gradient source, for a final evaluation.
    pub gradients: Gradients,
    /// Payload bytes each shard received.
    pub shard_payload_in: Vec<u64>,
}

impl<M: Message> Engine<M> {
    /// An engine for `learners` learners.
    pub fn new(
        rng: ChaCha8Rng,
        compute: ComputeModel,
        net: Network,
        gradients: Gradients,
        learners: usize,
    ) -> Self {
        Self {
            now: 0,
            queue: EventQueue::default(),
            rng,
            compute,
            net,
            gradients,
            hash: TraceHash::default(),
            counts: EventCounts::default(),
            staleness: StalenessStats::default(),
            learners: vec![LearnerTime::default(); learners],
            loss_window: (0.0, 0),
            loss_rows: Vec::new(),
            grace: Vec::new(),
            churn: None,
            end_after: None,
            credits: LeaderGroups::default(),
        }
    }

    /// Credit each record of a group's gradient to its members, as `credits` says.
    #[must_use]
    pub fn crediting(mut self, credits: LeaderGroups) -> Self {
        self.credits = credits;
        self
    }

    /// End the run once `learners` learners are done ([`World::done`]).
    #[must_use]
    pub fn ending_after(mut self, learners: usize) -> Self {
        self.end_after = Some(learners);
        self
    }

    /// Learners leave at `rate` per present learner and virtual second and join again `away`
    /// seconds later.
    #[must_use]
    pub fn with_churn(mut self, churn: Option<(f64, f64)>) -> Self {
        self.churn = churn.map(|(rate, away)| Churn { rate, away: super::events::nanos(away) });
        self
    }

    /// Schedule `learner`'s next leaving, a random time from now.
    fn schedule_leave(&mut self, learner: LearnerId) {
        if let Some(Churn { rate, .. }) = self.churn {
            let u: f64 = rand::Rng::random_range(&mut self.rng, f64::EPSILON..1.0);
            let after = super::events::nanos(-u.ln() / rate);
            self.queue.push(self.now.saturating_add(after), Event::Leave(learner));
        }
    }

    /// `learner` left now: what it was computing and what it had not sent are lost.
    fn left(&mut self, learner: LearnerId) {
        let now = self.now;
        let t = &mut self.learners[learner.index()];
        let partial = t.since.take().map_or(0, |s| now - s);
        t.busy += partial;
        t.lost += t.unsent + partial;
        t.unsent = 0;
        t.present += t.joined.take().map_or(0, |j| now - j);
        t.incarnation += 1;
        if let Some(Churn { away, .. }) = self.churn {
            self.queue.push(now.saturating_add(away), Event::Join(learner));
        }
    }

    /// The incarnation of `learner` now (the world stamps its messages with it).
    pub fn incarnation(&self, learner: LearnerId) -> u32 {
        self.learners.get(learner.index()).map_or(0, |t| t.incarnation)
    }

    /// A contribution an earlier incarnation of `learner` sent arrived after it left: dropped.
    pub fn lost_in_flight(&mut self, learner: LearnerId) {
        if let Some(t) = self.learners.get_mut(learner.index()) {
            t.dropped += 1;
        }
    }

    /// Quorum rounds on each of `shards` shards close at the end of windows `window` chooses.
    #[must_use]
    pub fn with_grace(mut self, window: Option<GraceWindow>, shards: usize) -> Self {
        self.grace = window.map_or_else(Vec::new, |w| vec![w; shards]);
        self
    }

    /// A contribution to `shard`'s round on `clock` arrived now (for the grace window).
    pub fn arrived(&mut self, shard: ShardId, clock: Clock) {
        let now = Duration::from_nanos(self.now);
        if let Some(w) = self.grace.get_mut(shard.index()) {
            w.arrived(clock, now);
        }
    }

    /// `shard`'s round on `clock` holds its quorum, `missing` short of all: its grace window
    /// starts now.
    pub fn quorum(&mut self, shard: ShardId, clock: Clock, missing: usize) -> Result<(), RuntimeError> {
        let now = Duration::from_nanos(self.now);
        let w = self.grace.get_mut(shard.index()).ok_or_else(|| {
            RuntimeError::Simulation(format!("internal error: {shard} announced a quorum it does not have"))
        })?;
        let wait = u64::try_from(w.quorum(clock, missing, now).as_nanos()).unwrap_or(u64::MAX);
        self.queue.push(self.now.saturating_add(wait), Event::Grace { shard, clock });
        Ok(())
    }

    /// Send `msg`; it arrives when the network model says.
    pub fn send(&mut self, msg: M) {
        let route = msg.route();
        let at = self.net.arrival(self.now, route, &mut self.rng);
        self.counts.messages += 1;
        if route.payload == super::model::Payload::Up {
            self.learners[route.learner.index()].unsent = 0;
        }
        self.queue.push(at, Event::Deliver(msg));
    }

    /// `learner` starts computing its gradient at the parameters made of `parts`: the gradient
    /// is taken now and is ready after a compute time drawn from the model.
    pub fn start_compute(
        &mut self,
        learner: LearnerId,
        parts: &[Part<'_>],
    ) -> Result<Vec<f32>, RuntimeError> {
        let l = learner.index();
        let took = self.compute.sample(l, &mut self.rng);
        let (grad, loss) = self.gradients.compute(l, parts, &mut self.rng)?;
        self.loss_window.0 += loss;
        self.loss_window.1 += 1;
        self.learners[l].since = Some(self.now);
        self.queue.push(self.now + took, Event::Computed(learner, self.learners[l].incarnation));
        Ok(grad)
    }

    /// A shard reported a gradient's fate (the staleness tracker's part).
    pub fn record_gradient(&mut self, g: &GradientRecord) {
        let h = &mut self.hash;
        for v in [u64::from(g.shard.0), u64::from(g.learner.0), g.computed_on.0, g.staleness.0] {
            h.u64(v);
        }
        match g.outcome {
            Outcome::Applied { alpha } => {
                h.u64(u64::from(alpha.to_bits()));
                self.staleness.record_applied(g.staleness);
                self.counts.applied += 1;
            }
            Outcome::Dropped(reason) => {
                h.u64(u64::MAX);
                self.staleness.record_dropped(reason);
                self.counts.dropped += 1;
            }
        }
        let applied = matches!(g.outcome, Outcome::Applied { .. });
        for learner in self.credits.members(&g.learner) {
            if let Some(t) = self.learners.get_mut(learner.index()) {
                (t.applied, t.dropped) = (t.applied + u64::from(applied), t.dropped + u64::from(!applied));
            }
        }
    }

    /// A shard applied an update.
    pub fn record_update(&mut self, u: &UpdateRecord) {
        self.hash.u64(u64::from(u.shard.0));
        self.hash.u64(u.clock.0);
        self.counts.updates += 1;
    }

    /// A row of `loss.csv`; none while a model has computed no minibatch since the last row.
    fn loss_row<W: World<Msg = M>>(&mut self, world: &W) {
        let values = world.values();
        let loss = match self.gradients.objective(values.iter().map(|v| &v[..])) {
            Some(exact) => exact,
            None => match std::mem::take(&mut self.loss_window) {
                (_, 0) => return,
                (sum, n) => sum / n as f64,
            },
        };
        self.loss_rows.push(LossRow {
            virtual_seconds: seconds(self.now),
            gradients: self.counts.gradients,
            updates: world.updates(),
            loss,
        });
    }

    /// The learners' times up to `end`, counting computations still under way.
    fn learner_reports(&self, end: Nanos) -> Vec<LearnerReport> {
        self.learners
            .iter()
            .enumerate()
            .map(|(l, t)| {
                let busy = t.busy + t.since.map_or(0, |s| end.saturating_sub(s));
                let present = t.present + t.joined.map_or(0, |j| end.saturating_sub(j));
                let (compute, total) = (seconds(busy), seconds(present));
                LearnerReport {
                    learner: l as u32,
                    straggler: self.compute.is_straggler(l),
                    gradients: t.gradients,
                    compute_seconds: compute,
                    wait_seconds: (total - compute).max(0.0),
                    lost_seconds: seconds(t.lost),
                    utilisation: if present == 0 { 0.0 } else { compute / total },
                    applied: t.applied,
                    dropped: t.dropped,
                }
            })
            .collect()
    }

    /// Run `world` until the queue is empty (every learner finished) or a limit of `stop` is
    /// reached; a row of `loss.csv` every `loss_every` gradients. `expected` is the number of
    /// gradients of a run that ends by itself, for the progress display.
    pub fn run<W: World<Msg = M>>(
        mut self,
        world: &mut W,
        stop: &StopSpec,
        (loss_every, expected): (u64, Option<u64>),
        progress: &mut Progress,
    ) -> Result<Finished, RuntimeError> {
        let limit = stop.seconds.map(super::events::nanos);
        world.start(&mut self)?;
        for l in 0..self.learners.len() {
            self.schedule_leave(LearnerId(l as u32));
        }
        self.loss_row(world);
        let mut end = None;
        // The time of the last event that did something: a leaving planned for a learner
        // that has finished by then does not lengthen the run.
        let mut last = 0;
        while let Some((at, event)) = self.queue.pop() {
            if limit.is_some_and(|t| at > t) {
                end = limit;
                break;
            }
            self.now = at;
            if let Event::Leave(learner) = event {
                if world.leave(&mut self, learner)? {
                    self.hash.u64(u64::from(learner.0));
                    self.left(learner);
                    last = at;
                }
                continue;
            }
            last = at;
            self.counts.processed += 1;
            self.hash.u64(at);
            match event {
                Event::Deliver(msg) => {
                    msg.trace(&mut self.hash);
                    world.deliver(&mut self, msg)?;
                }
                Event::Computed(learner, incarnation) => {
                    let t = &mut self.learners[learner.index()];
                    if incarnation != t.incarnation {
                        continue;
                    }
                    let took = t.since.take().map_or(0, |s| at - s);
                    (t.busy, t.unsent, t.gradients) = (t.busy + took, t.unsent + took, t.gradients + 1);
                    self.hash.u64(u64::from(learner.0));
                    self.counts.gradients += 1;
                    world.computed(&mut self, learner)?;
                    if self.counts.gradients.is_multiple_of(loss_every) {
                        self.loss_row(world);
                    }
                }
                Event::Grace { shard, clock } => {
                    self.hash.u64(u64::from(shard.0));
                    self.hash.u64(clock.0);
                    world.grace_over(&mut self, shard, clock)?;
                }
                Event::Join(learner) => {
                    self.hash.u64(u64::from(learner.0));
                    if world.join(&mut self, learner)? {
                        self.learners[learner.index()].joined = Some(at);
                        self.schedule_leave(learner);
                    } else if let Some(Churn { away, .. }) = self.churn {
                        self.queue.push(at.saturating_add((away / 10).max(1)), Event::Join(learner));
                    }
                }
                // Taken before the match: a leaving that does nothing is no event of the run.
                Event::Leave(_) => {}
            }
            let updates = world.updates();
            if stop.gradients.is_some_and(|g| self.counts.gradients >= g)
                || stop.updates.is_some_and(|u| updates >= u)
                || self.end_after.is_some_and(|n| world.done() >= n)
            {
                break;
            }
            if self.counts.processed.is_multiple_of(4096) {
                let done = [
                    stop.gradients.zip(Some(self.counts.gradients)),
                    stop.updates.zip(Some(updates)),
                    limit.zip(Some(self.now)),
                    expected.zip(Some(self.counts.gradients)),
                ]
                .into_iter()
                .flatten()
                .map(|(of, at)| at as f64 / of.max(1) as f64)
                .fold(0.0, f64::max);
                progress.update(done, || {
                    format!(
                        "{:.1} virtual s, {} gradients, {updates} updates, ⟨σ⟩ {:.2}",
                        seconds(self.now),
                        self.counts.gradients,
                        self.staleness.mean()
                    )
                });
            }
        }
        let end = end.unwrap_or(last);
        self.now = end;
        if self.loss_rows.last().is_none_or(|r| r.gradients != self.counts.gradients) {
            self.loss_row(world);
        }
        (self.counts.resent, self.counts.bytes) = (self.net.resent, self.net.bytes);
        [self.counts.payload_up_bytes, self.counts.payload_down_bytes] = self.net.payload();
        self.counts.peak_bytes_in_flight = self.net.peak_in_flight;
        for values in world.values() {
            for v in values.iter() {
                self.hash.u64(u64::from(v.to_bits()));
            }
        }
        Ok(Finished {
            end,
            learners: self.learner_reports(end),
            counts: self.counts,
            staleness: self.staleness,
            loss: self.loss_rows,
            hash: self.hash,
            gradients: self.gradients,
            shard_payload_in: self.net.payload_in,
        })
    }
}
