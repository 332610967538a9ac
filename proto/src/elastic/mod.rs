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

mod learners;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::{Clock, DropReason, LateRule, LearnerId, Outcome, Quorum, ShardId, Staleness};
pub use learners::{DownpourLearner, ElasticLearner, ElasticSettings};
use rudra_compute::cpu;

use super::{
    CoreError, GradientRecord, LrModulation, ShardEvent, ShardState, StalenessStats, UpdateRecord, Weights,
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
    /// Sync rounds with a quorum (`docs/src/algorithms.md` §5.2): the quorum, the round each
    /// learner's next exchange belongs to, the round's exchanges on time, and the last round
    /// whose quorum was announced.
    quorum: Option<Quorum>,
    /// λ when the shard was made: a quorum of q lets λ − q of the learners present miss a
    /// round, so a learner that leaves lowers it by one.
    learners: usize,
    due: BTreeMap<LearnerId, Clock>,
    on_time: usize,
    quorum_said: Option<Clock>,
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
        let learners = active.len();
        Self {
            id,
            rule,
            center: Arc::new(center),
            clock: Clock(0),
            active,
            round_sum,
            round_values: 0,
            round: BTreeSet::new(),
            quorum: None,
            learners,
            due: BTreeMap::new(),
            on_time: 0,
            quorum_said: None,
            received: BTreeMap::new(),
            velocity,
            stats: StalenessStats::default(),
            events: Vec::new(),
        }
    }

    /// Sync rounds close once `quorum`'s q exchanges on time are in and the grace window is
    /// over (none: once all are in).
    #[must_use]
    pub fn with_quorum(mut self, quorum: Option<Quorum>) -> Self {
        self.quorum = quorum.filter(|_| self.rule.is_sync());
        self
    }

    /// The shard's id.
    #[must_use]
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Whether the open sync round holds an exchange of `learner`.
    #[must_use]
    pub fn holds(&self, learner: LearnerId) -> bool {
        self.round.contains(&learner)
    }

    /// The round `learner`'s next exchange belongs to (sync rounds; the clock otherwise).
    #[must_use]
    pub fn round_of(&self, learner: LearnerId) -> Clock {
        if self.rule.is_sync() { self.due.get(&learner).copied().unwrap_or_default() } else { self.clock }
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
        (self.round_values, self.round, self.on_time, self.quorum_said) = (0, BTreeSet::new(), 0, None);
        // Every learner's next exchange belongs to the restored round, as at a start.
        self.due.clear();
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
        if self.rule.is_sync() && self.round.contains(&learner) {
            return Err(CoreError::Protocol(format!("{learner} sent twice in round {}", self.clock)));
        }
        // A sync exchange of a round that closed without it (a quorum's straggler).
        let missed = self.missed(learner);
        if self.rule.is_sync() && missed.0 > 0 && self.quorum.is_some_and(|q| q.late == LateRule::Drop) {
            self.record(learner, Outcome::Dropped(DropReason::StaleRound));
            self.reply(learner);
            return Ok(self.take_events());
        }
        // A late exchange folded into the open round is not one of its turns: its learner is
        // served the current center at once rather than held until the round closes.
        let on_turn = self.rule.is_sync() && missed.0 == 0;
        if on_turn {
            self.round.insert(learner);
            self.on_time += 1;
        }
        if !cpu::all_finite(values) {
            self.record(learner, Outcome::Dropped(DropReason::NonFinite));
            if on_turn {
                self.close_round_if_complete();
            } else {
                self.reply(learner);
            }
            return Ok(self.take_events());
        }
        // A folded exchange counts in the round's mean at the weight of its staleness.
        let fold = match self.rule {
            CenterRule::Diloco { modulation, .. } if missed.0 > 0 => modulation.alpha(1.0, missed, 0.0),
            _ => 1.0,
        };
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
                cpu::axpy(fold, values, &mut self.round_sum);
                self.round_values += 1;
                self.turn_taken(learner, on_turn);
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
                self.record(learner, Outcome::Applied { alpha: outer_lr * fold });
                cpu::axpy(fold, values, &mut self.round_sum);
                self.round_values += 1;
                self.turn_taken(learner, on_turn);
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
        Ok(self.take_events())
    }

    /// A quorum round's grace window is over: it closes if it is still open and holds its
    /// quorum.
    pub fn on_grace_over(&mut self, clock: Clock) -> Vec<ShardEvent> {
        if clock == self.clock && self.quorum().is_some_and(|q| self.on_time >= q) {
            self.close_round();
        }
        self.take_events()
    }

    /// Sync rounds with a quorum: the rounds that closed since the one `learner`'s next
    /// exchange belongs to (0 without a quorum: every round waits for all).
    fn missed(&self, learner: LearnerId) -> Staleness {
        match self.quorum {
            None => Staleness(0),
            Some(_) => self.clock.staleness_of(self.round_of(learner)).unwrap_or_default(),
        }
    }

    /// A sync round's quorum: q less the learners that have left (all but λ − q of those
    /// present), at least 1.
    fn quorum(&self) -> Option<usize> {
        let gone = self.learners.saturating_sub(self.active.len());
        self.quorum.map(|q| (q.size as usize).saturating_sub(gone).clamp(1, self.active.len().max(1)))
    }

    /// The effects of the input just handled; the open round's quorum is announced once.
    fn take_events(&mut self) -> Vec<ShardEvent> {
        if let Some(q) = self.quorum()
            && self.on_time >= q
            && self.quorum_said != Some(self.clock)
        {
            self.quorum_said = Some(self.clock);
            let missing = self.active.difference(&self.round).count();
            self.events.push(ShardEvent::Quorum { clock: self.clock, missing });
        }
        std::mem::take(&mut self.events)
    }

    /// The active learners changed; a sync round waits only for those still active, and a
    /// learner that joins belongs to the open round (it starts from the current center).
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) -> Vec<ShardEvent> {
        for &joined in active.difference(&self.active) {
            self.due.insert(joined, self.clock);
        }
        self.active = active;
        if !self.round.is_empty() {
            self.close_round_if_complete();
        }
        self.take_events()
    }

    /// Record `learner`'s exchange, applied now or dropped, with its staleness: in sync rounds
    /// the rounds it missed (0 but for a quorum's stragglers).
    fn record(&mut self, learner: LearnerId, outcome: Outcome) {
        let computed_on = self.received.get(&learner).copied().unwrap_or_default();
        let staleness = if self.rule.is_sync() {
            self.missed(learner)
        } else {
            self.clock.staleness_of(computed_on).unwrap_or_default()
        };
        let record = GradientRecord { shard: self.id, learner, computed_on, staleness, outcome };
        self.events.push(ShardEvent::Gradient(record));
    }

    /// A sync exchange is in the open round: on its turn, the round may be complete; folded
    /// late, its learner is served at once.
    fn turn_taken(&mut self, learner: LearnerId, on_turn: bool) {
        if on_turn {
            self.close_round_if_complete();
        } else {
            self.reply(learner);
        }
    }

    fn reply(&mut self, learner: LearnerId) {
        let weights = self.snapshot();
        self.received.insert(learner, weights.clock);
        self.due.insert(learner, self.clock);
        self.events.push(ShardEvent::Center { learner, weights });
    }

    /// The center moved by an update combining `gradients` contributions.
    fn advance(&mut self, gradients: usize) {
        self.clock = self.clock.next();
        self.events.push(ShardEvent::Update(UpdateRecord {
            shard: self.id,
            clock: self.clock,
            gradients,
            payload_in: 0,
        }));
    }

    /// Close a sync round once every active learner has taken its turn: EASGD serves the center
    /// from before the round and then moves it; DiLoCo steps first and serves the new center
    /// (each learner's next x_start).
    fn close_round_if_complete(&mut self) {
        if self.rule.is_sync() && self.active.is_subset(&self.round) {
            self.close_round();
        }
    }

    /// Close the open sync round with the exchanges it holds; each learner in it is served
    /// and its next exchange belongs to the next round.
    fn close_round(&mut self) {
        let p = self.round_values;
        let serve = |shard: &mut Self, next: Clock| {
            let weights = shard.snapshot();
            for learner in std::mem::take(&mut shard.round) {
                shard.received.insert(learner, weights.clock);
                shard.due.insert(learner, next);
                shard.events.push(ShardEvent::Center { learner, weights: weights.clone() });
            }
        };
        match self.rule {
            CenterRule::ElasticSync { beta } => {
                let next = self.clock.next();
                serve(self, next);
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
                let next = self.clock;
                serve(self, next);
            }
            _ => {}
        }
        (self.round_values, self.on_time) = (0, 0);
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
