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

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rudra_compute::cpu;
use rudra_transport::{Clock, DropReason, LearnerId, Outcome, ShardId, Staleness};

use super::{CoreError, GradientRecord, ShardEvent, ShardState, UpdateRecord, Weights};

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
}

/// A shard holding the center variable x̃ of its range.
///
/// Every exchange it applies is recorded like a gradient: its staleness σ is the center's
/// clock when the exchange is applied minus the clock of the center the learner last received
/// (ALGORITHMS.md, "Staleness in the EASGD family"); in sync rounds σ ≡ 0. An exchange holding
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
    /// MDOWNPOUR's velocity.
    velocity: Vec<f32>,
    /// Effects of the input being handled, returned when it is done.
    events: Vec<ShardEvent>,
}

impl CenterShard {
    /// A center shard of `rule` starting at `center`, for the learners in `active`.
    #[must_use]
    pub fn new(id: ShardId, rule: CenterRule, center: Vec<f32>, active: BTreeSet<LearnerId>) -> Self {
        let len = center.len();
        let velocity = if matches!(rule, CenterRule::MDownpour { .. }) { vec![0.0; len] } else { Vec::new() };
        let round_sum =
            if matches!(rule, CenterRule::ElasticSync { .. }) { vec![0.0; len] } else { Vec::new() };
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

    /// What a checkpoint keeps: the center, the clock and MDOWNPOUR's velocity (see
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
    /// for DOWNPOUR, a gradient for MDOWNPOUR. Rejected without any change when malformed.
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
        if let CenterRule::ElasticSync { .. } = self.rule
            && !self.round.insert(learner)
        {
            return Err(CoreError::Protocol(format!("{learner} sent twice in round {}", self.clock)));
        }
        if !cpu::all_finite(values) {
            self.record(learner, Outcome::Dropped(DropReason::NonFinite));
            match self.rule {
                CenterRule::ElasticSync { .. } => self.close_round_if_complete(),
                _ => self.reply(learner),
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
        let staleness = match self.rule {
            CenterRule::ElasticSync { .. } => Staleness(0),
            _ => self.clock.staleness_of(computed_on).unwrap_or_default(),
        };
        let record = GradientRecord { shard: self.id, learner, computed_on, staleness, outcome };
        self.events.push(ShardEvent::Gradient(record));
    }

    fn reply(&mut self, learner: LearnerId) {
        let weights = self.snapshot();
        self.received.insert(learner, weights.clock);
        self.events.push(ShardEvent::Serve { learner, seq: 0, weights });
    }

    /// The center moved by an update combining `gradients` contributions.
    fn advance(&mut self, gradients: usize) {
        self.clock = self.clock.next();
        self.events.push(ShardEvent::Update(UpdateRecord { shard: self.id, clock: self.clock, gradients }));
    }

    fn close_round_if_complete(&mut self) {
        let CenterRule::ElasticSync { beta } = self.rule else { return };
        if !self.active.is_subset(&self.round) {
            return;
        }
        let before = self.snapshot();
        for &learner in &self.round {
            self.events.push(ShardEvent::Serve { learner, seq: 0, weights: before.clone() });
        }
        let p = self.round_values;
        if p > 0 {
            let center = Arc::make_mut(&mut self.center);
            // x̃ ← (1 − β) x̃ + β · mean_i x^i, over the learners whose x^i was finite
            cpu::scale(1.0 - beta, center);
            cpu::axpy_drain(beta / p as f32, &mut self.round_sum, center);
        }
        (self.round_values, self.round) = (0, BTreeSet::new());
        self.advance(p);
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
}

/// The learner side of EASGD / EAMSGD: local SGD (with Nesterov momentum for EAMSGD) and an
/// elastic pull toward the center every τ steps.
#[derive(Clone, Debug)]
pub struct ElasticLearner {
    s: ElasticSettings,
    t: u64,
    velocity: Vec<f32>,
}

impl ElasticLearner {
    /// A learner over `len` parameters.
    #[must_use]
    pub fn new(settings: ElasticSettings, len: usize) -> Self {
        let velocity = if settings.momentum == 0.0 { Vec::new() } else { vec![0.0; len] };
        Self { s: settings, t: 0, velocity }
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
        if self.velocity.is_empty() {
            cpu::axpy(-lr, g, x);
        } else {
            for (v, g) in self.velocity.iter_mut().zip(g) {
                *v = delta * *v - lr * g;
            }
            cpu::axpy(1.0, &self.velocity, x);
        }
        self.t += 1;
    }
}

/// The learner side of DOWNPOUR: local SGD that accumulates its updates in `v`; every τ
/// steps `v` goes to the shards and x^i is replaced by the center they answer with.
#[derive(Clone, Debug)]
pub struct DownpourLearner {
    tau: u64,
    lr: f32,
    t: u64,
    accumulated: Vec<f32>,
}

impl DownpourLearner {
    /// A learner over `len` parameters with period `tau` and rate `lr`.
    #[must_use]
    pub fn new(tau: u64, lr: f32, len: usize) -> Self {
        Self { tau: tau.max(1), lr, t: 0, accumulated: vec![0.0; len] }
    }

    /// Whether this step begins with an exchange (τ divides t^i).
    #[must_use]
    pub fn exchanges_now(&self) -> bool {
        self.t.is_multiple_of(self.tau)
    }

    /// The accumulated update to send, reset to zero.
    pub fn take_accumulated(&mut self) -> Vec<f32> {
        let zeros = vec![0.0; self.accumulated.len()];
        std::mem::replace(&mut self.accumulated, zeros)
    }

    /// One local step with the gradient `g` at x^i: `x ← x − η g; v ← v − η g`.
    pub fn step(&mut self, x: &mut [f32], g: &[f32]) {
        cpu::axpy(-self.lr, g, x);
        cpu::axpy(-self.lr, g, &mut self.accumulated);
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
