//! The EASGD family (Zhang, Choromanska, LeCun): the center variable x̃ at the shards and the
//! local variables x^i at the learners, plus the DOWNPOUR and MDOWNPOUR baselines.
//!
//! Exchange rules:
//! - async EASGD / EAMSGD: the shard answers with its current x̃ and moves it by
//!   `d = α (x^i − x̃)`; the learner moves by `−d` with the same x̃.
//! - sync EASGD: a round gathers every active learner's x^i; each gets the x̃ from before the
//!   round, and then `x̃ ← (1 − β) x̃ + β · mean_i x^i`.
//! - DOWNPOUR: the shard adds the learner's accumulated `v` to x̃ and answers with the new x̃.
//! - MDOWNPOUR: the shard keeps Nesterov momentum `u ← δu − η g; x̃ ← x̃ + δu − η g`.
//! - DiLoCo: the learner sends DOWNPOUR's `v = x^i − x_start = −Δ`; the shard takes an outer
//!   Nesterov step `b ← μ_o b + Δ; x̃ ← x̃ − η_o (Δ + μ_o b)`, on the mean Δ of a round (sync,
//!   every learner then adopts the new x̃) or on each Δ as it arrives (async, η_o modulated by
//!   its staleness and Δ dropped past the bound).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::{Clock, DropReason, LearnerId, Outcome, ShardId, Staleness};
use rudra_compute::{Rate, cpu};

use super::{
    CoreError, GradientRecord, LocalOptimizer, LrModulation, OptimizerSpec, ShardEvent, ShardState,
    StalenessStats, UpdateRecord, Weights,
};

/// How a center shard combines what learners send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CenterRule {
    /// Async EASGD / EAMSGD: `x̃ ← x̃ + α (x^i − x̃)` at every exchange.
    ElasticAsync {
        /// The moving rate α.
        alpha: f32,
    },
    /// Sync EASGD: a barrier round over all learners, `x̃ ← (1 − β) x̃ + β · mean x^i`.
    ElasticSync {
        /// The center rate β.
        beta: f32,
    },
    /// DOWNPOUR: `x̃ ← x̃ + v` with the learner's accumulated update `v`.
    Downpour,
    /// MDOWNPOUR: a gradient `g` moves x̃ with Nesterov momentum δ and rate η.
    MDownpour {
        /// Momentum δ.
        momentum: f32,
        /// Learning rate η.
        lr: f32,
    },
    /// DiLoCo: Nesterov SGD (PyTorch's `nesterov=True`) on the pseudo-gradient Δ = −v that
    /// learners send.
    Diloco {
        /// A barrier round over the active learners and one outer step on their mean Δ (σ ≡ 0).
        sync: bool,
        /// η_o.
        outer_lr: f32,
        /// μ_o.
        outer_momentum: f32,
        /// Async: η_o(σ), as α0 is modulated for gradients.
        modulation: LrModulation,
        /// Async: a Δ with σ > s is dropped (`too-stale`).
        max_staleness: Option<u64>,
    },
}

impl CenterRule {
    /// Whether exchanges meet in barrier rounds.
    fn is_sync(self) -> bool {
        matches!(self, Self::ElasticSync { .. } | Self::Diloco { sync: true, .. })
    }

    /// Whether the shard keeps a velocity (checkpointed with the center).
    fn has_velocity(self) -> bool {
        matches!(self, Self::MDownpour { .. } | Self::Diloco { .. })
    }
}

/// DiLoCo's outer step on Δ = −scale·u (u: the learners' v, summed): `b ← μ b + Δ;
/// x̃ ← x̃ − η (Δ + μ b)`, with `velocity` holding b.
fn outer_step(center: &mut [f32], velocity: &mut [f32], u: &[f32], scale: f32, lr: f32, momentum: f32) {
    for ((x, b), &u) in center.iter_mut().zip(velocity.iter_mut()).zip(u) {
        let delta = -(scale * u);
        *b = momentum * *b + delta;
        *x -= lr * (delta + momentum * *b);
    }
}

/// A shard holding the center variable x̃ of its range.
///
/// Every exchange it applies is recorded like a gradient: its staleness σ is the center's
/// clock when the exchange is applied minus the clock of the center the learner last received
/// (docs/src/algorithms.md §6.9); in sync rounds σ ≡ 0. An exchange holding
/// a NaN or ±Inf is dropped (`non-finite`) and never moves the center; its learner still gets
/// the current center, so it goes on.
#[derive(Debug)]
pub struct CenterShard {
    id: ShardId,
    rule: CenterRule,
    center: Arc<Vec<f32>>,
    clock: Clock,
    active: BTreeSet<LearnerId>,
    /// Sync rounds: the x^i received so far, summed, how many, and who took their turn.
    round_sum: Vec<f32>,
    round_values: usize,
    round: BTreeSet<LearnerId>,
    /// The clock of the center each learner last received.
    received: BTreeMap<LearnerId, Clock>,
    /// MDOWNPOUR's velocity, or DiLoCo's outer momentum buffer.
    velocity: Vec<f32>,
    /// Async DiLoCo: the staleness of the Δ applied, for `mean` modulation.
    stats: StalenessStats,
    /// Effects of the input being handled, returned when it is done.
    events: Vec<ShardEvent>,
}

impl CenterShard {
    /// A center shard of `rule` starting at `center`, for the learners in `active`.
    #[must_use]
    pub fn new(id: ShardId, rule: CenterRule, center: Vec<f32>, active: BTreeSet<LearnerId>) -> Self {
        let len = center.len();
        let velocity = if rule.has_velocity() { vec![0.0; len] } else { Vec::new() };
        let round_sum = if rule.is_sync() { vec![0.0; len] } else { Vec::new() };
        Self {
            id,
            rule,
            center: Arc::new(center),
            clock: Clock(0),
            active,
            round_sum,
            round_values: 0,
            round: BTreeSet::new(),
            received: BTreeMap::new(),
            velocity,
            stats: StalenessStats::default(),
            events: Vec::new(),
        }
    }

    /// The shard's id.
    #[must_use]
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// The center x̃ now.
    #[must_use]
    pub fn snapshot(&self) -> Weights {
        Weights { shard: self.id, clock: self.clock, values: Arc::clone(&self.center).into() }
    }

    /// What a checkpoint keeps: the center, the clock and the velocity of MDOWNPOUR or DiLoCo (see
    /// [`ShardState`]).
    #[must_use]
    pub fn state(&self) -> ShardState {
        ShardState {
            clock: self.clock,
            values: self.center.to_vec(),
            velocity: self.velocity.clone(),
            ..ShardState::default()
        }
    }

    /// Continue from `state`; an open sync round is forgotten. A state of the wrong size is
    /// refused and changes nothing.
    pub fn restore(&mut self, state: ShardState) -> Result<(), CoreError> {
        state.check(self.center.len(), !self.velocity.is_empty())?;
        (self.clock, self.center, self.velocity) = (state.clock, Arc::new(state.values), state.velocity);
        self.round_sum.fill(0.0);
        (self.round_values, self.round) = (0, BTreeSet::new());
        self.events.clear();
        Ok(())
    }

    /// Exchanges (or sync rounds) completed.
    #[must_use]
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// A learner sends its values for this shard's range: x^i for EASGD, the accumulated `v`
    /// for DOWNPOUR and DiLoCo, a gradient for MDOWNPOUR. Rejected without any change when
    /// malformed.
    pub fn on_exchange(&mut self, learner: LearnerId, values: &[f32]) -> Result<Vec<ShardEvent>, CoreError> {
        if !self.active.contains(&learner) {
            return Err(CoreError::Protocol(format!("{learner} is not an active learner of {}", self.id)));
        }
        if values.len() != self.center.len() {
            return Err(CoreError::Protocol(format!(
                "{learner} sent {} values to {}, which holds {}",
                values.len(),
                self.id,
                self.center.len()
            )));
        }
        if self.rule.is_sync() && !self.round.insert(learner) {
            return Err(CoreError::Protocol(format!("{learner} sent twice in round {}", self.clock)));
        }
        if !cpu::all_finite(values) {
            self.record(learner, Outcome::Dropped(DropReason::NonFinite));
            if self.rule.is_sync() {
                self.close_round_if_complete();
            } else {
                self.reply(learner);
            }
            return Ok(std::mem::take(&mut self.events));
        }
        match self.rule {
            CenterRule::ElasticAsync { alpha } => {
                self.record(learner, Outcome::Applied { alpha });
                self.reply(learner);
                let center = Arc::make_mut(&mut self.center);
                // x̃ ← x̃ + α (x − x̃) = (1 − α) x̃ + α x
                cpu::scale(1.0 - alpha, center);
                cpu::axpy(alpha, values, center);
                self.advance(1);
                // The learner moved by −d as the center moved by d: it knows this clock.
                self.received.insert(learner, self.clock);
            }
            CenterRule::ElasticSync { beta } => {
                self.record(learner, Outcome::Applied { alpha: beta });
                cpu::axpy(1.0, values, &mut self.round_sum);
                self.round_values += 1;
                self.close_round_if_complete();
            }
            CenterRule::Downpour => {
                self.record(learner, Outcome::Applied { alpha: 1.0 });
                cpu::axpy(1.0, values, Arc::make_mut(&mut self.center).as_mut_slice());
                self.advance(1);
                self.reply(learner);
            }
            CenterRule::MDownpour { momentum, lr } => {
                self.record(learner, Outcome::Applied { alpha: lr });
                let center = Arc::make_mut(&mut self.center);
                for ((u, x), g) in self.velocity.iter_mut().zip(center.iter_mut()).zip(values) {
                    *u = momentum * *u - lr * g;
                    *x += momentum * *u - lr * g;
                }
                self.advance(1);
                self.reply(learner);
            }
            CenterRule::Diloco { sync: true, outer_lr, .. } => {
                self.record(learner, Outcome::Applied { alpha: outer_lr });
                cpu::axpy(1.0, values, &mut self.round_sum);
                self.round_values += 1;
                self.close_round_if_complete();
            }
            CenterRule::Diloco { sync: false, outer_lr, outer_momentum, modulation, max_staleness } => {
                let computed_on = self.received.get(&learner).copied().unwrap_or_default();
                let sigma = self.clock.staleness_of(computed_on).unwrap_or_default();
                if max_staleness.is_some_and(|s| sigma.0 > s) {
                    self.record(learner, Outcome::Dropped(DropReason::TooStale));
                } else {
                    // As an SGD shard: count σ, then α(σ) (`mean` includes it).
                    self.stats.record_applied(sigma);
                    let lr = modulation.alpha(outer_lr, sigma, self.stats.mean());
                    self.record(learner, Outcome::Applied { alpha: lr });
                    let center = Arc::make_mut(&mut self.center);
                    outer_step(center, &mut self.velocity, values, 1.0, lr, outer_momentum);
                    self.advance(1);
                }
                // Applied or dropped, the learner adopts the current center as its next x_start.
                self.reply(learner);
            }
        }
        Ok(std::mem::take(&mut self.events))
    }

    /// The active learners changed; a sync round waits only for those still active.
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) -> Vec<ShardEvent> {
        self.active = active;
        if !self.round.is_empty() {
            self.close_round_if_complete();
        }
        std::mem::take(&mut self.events)
    }

    /// Record `learner`'s exchange, applied now or dropped, with its staleness.
    fn record(&mut self, learner: LearnerId, outcome: Outcome) {
        let computed_on = self.received.get(&learner).copied().unwrap_or_default();
        let staleness = if self.rule.is_sync() {
            Staleness(0)
        } else {
            self.clock.staleness_of(computed_on).unwrap_or_default()
        };
        let record = GradientRecord { shard: self.id, learner, computed_on, staleness, outcome };
        self.events.push(ShardEvent::Gradient(record));
    }

    fn reply(&mut self, learner: LearnerId) {
        let weights = self.snapshot();
        self.received.insert(learner, weights.clock);
        self.events.push(ShardEvent::Center { learner, weights });
    }

    /// The center moved by an update combining `gradients` contributions.
    fn advance(&mut self, gradients: usize) {
        self.clock = self.clock.next();
        self.events.push(ShardEvent::Update(UpdateRecord { shard: self.id, clock: self.clock, gradients }));
    }

    /// Close a sync round once every active learner has taken its turn: EASGD serves the center
    /// from before the round and then moves it; DiLoCo steps first and serves the new center
    /// (each learner's next x_start).
    fn close_round_if_complete(&mut self) {
        if !self.rule.is_sync() || !self.active.is_subset(&self.round) {
            return;
        }
        let p = self.round_values;
        let serve = |shard: &mut Self| {
            let weights = shard.snapshot();
            for learner in std::mem::take(&mut shard.round) {
                shard.received.insert(learner, weights.clock);
                shard.events.push(ShardEvent::Center { learner, weights: weights.clone() });
            }
        };
        match self.rule {
            CenterRule::ElasticSync { beta } => {
                serve(self);
                if p > 0 {
                    let center = Arc::make_mut(&mut self.center);
                    // x̃ ← (1 − β) x̃ + β · mean_i x^i, over the learners whose x^i was finite
                    cpu::scale(1.0 - beta, center);
                    cpu::axpy_drain(beta / p as f32, &mut self.round_sum, center);
                }
                self.advance(p);
            }
            CenterRule::Diloco { outer_lr, outer_momentum, .. } => {
                if p > 0 {
                    // Δ = the mean of the round's finite Δ^i
                    let center = Arc::make_mut(&mut self.center);
                    outer_step(
                        center,
                        &mut self.velocity,
                        &self.round_sum,
                        1.0 / p as f32,
                        outer_lr,
                        outer_momentum,
                    );
                    self.round_sum.fill(0.0);
                }
                self.advance(p);
                serve(self);
            }
            _ => {}
        }
        self.round_values = 0;
    }
}

/// Settings of an EASGD / EAMSGD learner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ElasticSettings {
    /// Communication period τ in local steps.
    pub tau: u64,
    /// Moving rate α.
    pub alpha: f32,
    /// Learning rate η.
    pub lr: f32,
    /// Decay γ of `η_t = η / (1 + γ t)^0.5` on the local clock (0 disables it).
    pub lr_decay_gamma: f32,
    /// Nesterov momentum δ (0 for EASGD).
    pub momentum: f32,
    /// EASGD's local optimizer (EAMSGD's is its Nesterov momentum).
    pub optimizer: OptimizerSpec,
}

/// The learner side of EASGD / EAMSGD: local SGD (with Nesterov momentum for EAMSGD) and an
/// elastic pull toward the center every τ steps.
#[derive(Clone, Debug)]
pub struct ElasticLearner {
    s: ElasticSettings,
    t: u64,
    velocity: Vec<f32>,
    /// EASGD's local optimizer (plain SGD unless set).
    optimizer: LocalOptimizer,
}

impl ElasticLearner {
    /// A learner over `len` parameters.
    #[must_use]
    pub fn new(settings: ElasticSettings, len: usize) -> Self {
        let velocity = if settings.momentum == 0.0 { Vec::new() } else { vec![0.0; len] };
        let optimizer = LocalOptimizer::new(settings.optimizer, len);
        Self { s: settings, t: 0, velocity, optimizer }
    }

    /// Whether it keeps a momentum (EAMSGD): its gradient is then taken at x + δv, not at x.
    #[must_use]
    pub fn has_momentum(&self) -> bool {
        !self.velocity.is_empty()
    }

    /// The local clock t^i.
    #[must_use]
    pub fn clock(&self) -> u64 {
        self.t
    }

    /// Whether this step begins with an exchange (τ divides t^i).
    #[must_use]
    pub fn exchanges_now(&self) -> bool {
        self.t.is_multiple_of(self.s.tau.max(1))
    }

    /// `η_t` on the local clock.
    #[must_use]
    pub fn lr(&self) -> f32 {
        self.s.lr / (1.0 + self.s.lr_decay_gamma * self.t as f32).sqrt()
    }

    /// Where the gradient of this step is taken: `x + δ v` (just `x` for EASGD), with `x`
    /// the value before any elastic pull.
    pub fn gradient_point(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(x);
        if self.has_momentum() {
            cpu::axpy(self.s.momentum, &self.velocity, out);
        }
    }

    /// Finish the step: with `center` (x̃ from this step's exchange) apply the elastic pull
    /// `x ← x − α (x − x̃)`, then the local update with `g` taken at [`Self::gradient_point`]:
    /// `v ← δ v − η_t g; x ← x + v`. Advances t^i.
    pub fn step(&mut self, x: &mut [f32], g: &[f32], center: Option<&[f32]>) {
        let lr = self.lr();
        let (alpha, delta) = (self.s.alpha, self.s.momentum);
        if let Some(c) = center {
            // x ← x − α (x − x̃) = (1 − α) x + α x̃
            cpu::scale(1.0 - alpha, x);
            cpu::axpy(alpha, c, x);
        }
        if self.has_momentum() {
            cpu::momentum(Rate { lr, momentum: delta }, g, &mut self.velocity, x);
        } else {
            self.optimizer.step(lr, x, g);
        }
        self.t += 1;
    }
}

/// The learner side of DOWNPOUR: local SGD that accumulates its updates in `v`; every τ
/// steps `v` goes to the shards and x^i is replaced by the center they answer with.
#[derive(Clone, Debug)]
pub struct DownpourLearner {
    tau: u64,
    /// Streaming DiLoCo: `v` goes out in this many fragments, one every τ/F steps (1: all of
    /// it every τ steps).
    fragments: u64,
    lr: f32,
    t: u64,
    accumulated: Vec<f32>,
    /// The local optimizer (plain SGD unless set; DiLoCo's inner optimizer), and x^i before
    /// its step.
    optimizer: LocalOptimizer,
    before: Vec<f32>,
}

impl DownpourLearner {
    /// A learner over `len` parameters with period `tau` and rate `lr`.
    #[must_use]
    pub fn new(tau: u64, lr: f32, len: usize) -> Self {
        let optimizer = LocalOptimizer::new(OptimizerSpec::Sgd, 0);
        let accumulated = vec![0.0; len];
        Self { tau: tau.max(1), fragments: 1, lr, t: 0, accumulated, optimizer, before: Vec::new() }
    }

    /// Exchange `v` in `fragments` parts in turn (F divides τ, checked with the configuration).
    #[must_use]
    pub fn with_fragments(mut self, fragments: u64) -> Self {
        self.fragments = fragments.clamp(1, self.tau);
        self
    }

    /// Local steps by `optimizer` rather than plain SGD, each added to `v` as it moved x^i.
    #[must_use]
    pub fn with_optimizer(mut self, optimizer: OptimizerSpec) -> Self {
        self.optimizer = LocalOptimizer::new(optimizer, self.accumulated.len());
        self
    }

    /// Whether this step begins with an exchange.
    #[must_use]
    pub fn exchanges_now(&self) -> bool {
        self.fragment_now().is_some()
    }

    /// How many fragments `v` goes out in.
    #[must_use]
    pub fn fragments(&self) -> usize {
        self.fragments as usize
    }

    /// The fragment this step begins by exchanging, of how many: fragment f at the steps
    /// t ≡ f·τ/F (mod τ), so every value goes out once every τ steps.
    #[must_use]
    pub fn fragment_now(&self) -> Option<(usize, usize)> {
        let every = self.tau / self.fragments;
        let f = (self.t / every) % self.fragments;
        self.t.is_multiple_of(every).then_some((f as usize, self.fragments as usize))
    }

    /// The accumulated update to send, reset to zero.
    pub fn take_accumulated(&mut self) -> Vec<f32> {
        let zeros = vec![0.0; self.accumulated.len()];
        std::mem::replace(&mut self.accumulated, zeros)
    }

    /// The accumulated update of `range` not sent yet.
    #[must_use]
    pub fn pending(&self, range: std::ops::Range<usize>) -> &[f32] {
        &self.accumulated[range]
    }

    /// The accumulated update of the values in `range` (zero elsewhere), reset to zero there.
    pub fn take_accumulated_of(&mut self, range: std::ops::Range<usize>) -> Vec<f32> {
        if range == (0..self.accumulated.len()) {
            return self.take_accumulated();
        }
        let mut part = vec![0.0; self.accumulated.len()];
        part[range.clone()].copy_from_slice(&self.accumulated[range.clone()]);
        self.accumulated[range].fill(0.0);
        part
    }

    /// One local step with the gradient `g` at x^i: `x ← x − η g; v ← v − η g` (with another
    /// optimizer, its step on x, and `v ← v + (x_after − x_before)`).
    pub fn step(&mut self, x: &mut [f32], g: &[f32]) {
        if self.optimizer.is_sgd() {
            cpu::axpy(-self.lr, g, x);
            cpu::axpy(-self.lr, g, &mut self.accumulated);
        } else {
            self.before.clear();
            self.before.extend_from_slice(x);
            self.optimizer.step(self.lr, x, g);
            for ((v, after), before) in self.accumulated.iter_mut().zip(&*x).zip(&self.before) {
                *v += after - before;
            }
        }
        self.t += 1;
    }
}

/// Whether sync EASGD's mean dynamics on `f(x) = h x² / 2` are stable:
/// `ηhβ > 0`, `(2 − ηh)(2 − β) > 2α` and `|(1 − ηh)(1 − β) − α| < 1`.
#[must_use]
pub fn sync_easgd_is_stable(eta_h: f64, alpha: f64, beta: f64) -> bool {
    eta_h * beta > 0.0
        && (2.0 - eta_h) * (2.0 - beta) > 2.0 * alpha
        && ((1.0 - eta_h) * (1.0 - beta) - alpha).abs() < 1.0
}
