//! Rudra's SGD shard: hardsync, n-softsync and async (n = λ) as one core parameterised by
//! its [`SyncRule`], with the staleness bound and learning-rate modulation.
//!
//! Update rule (ALGORITHMS.md): once `c` gradients are held,
//! `θ ← θ − (1/c) Σ_k α(σ_k) g_k`, `i ← i + 1`; hardsync is the case `c = λ` with a barrier,
//! so every gradient has `σ = 0` and the update is `θ ← θ − α0 (1/λ) Σ_l g_l`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use rudra_compute::cpu;
use rudra_transport::{Clock, LearnerId, ShardId, Staleness};
use serde::{Deserialize, Serialize};

use super::{LrModulation, StalenessStats};
use crate::ActorError;

/// When a shard applies an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncRule {
    /// Bulk synchronous: one gradient from each active learner, all on the current weights.
    Hardsync,
    /// Apply as soon as `c = ⌊λ/n⌋` (at least 1) gradients are held, from any learners.
    Softsync {
        /// The splitting parameter, `1 ≤ n ≤ λ`; `n = λ` is async SGD.
        n: u32,
    },
}

/// A shard's weights at one clock, shared without copying between the shard and its readers.
#[derive(Clone, Debug)]
pub struct Weights {
    /// The shard that served them.
    pub shard: ShardId,
    /// Their timestamp `i`.
    pub clock: Clock,
    /// The values of the shard's parameter range.
    pub values: Arc<Vec<f32>>,
}

/// Why a gradient was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// Its staleness exceeded `max_staleness`.
    TooStale,
    /// Hardsync: it was computed on weights of an earlier round.
    StaleRound,
}

/// What happened to one gradient.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Outcome {
    /// Applied with this learning rate.
    Applied {
        /// The rate `α` it was applied with.
        alpha: f32,
    },
    /// Dropped, counted, and reported.
    Dropped(DropReason),
}

/// One gradient's fate at a shard.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GradientRecord {
    /// The shard.
    pub shard: ShardId,
    /// The learner that computed it.
    pub learner: LearnerId,
    /// The clock of the weights it was computed on, `j`.
    pub computed_on: Clock,
    /// `σ = i − j` at the moment it was applied or dropped.
    pub staleness: Staleness,
    /// Applied or dropped.
    pub outcome: Outcome,
}

/// One update a shard applied.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct UpdateRecord {
    /// The shard.
    pub shard: ShardId,
    /// The clock after the update.
    pub clock: Clock,
    /// Gradients combined into it.
    pub gradients: usize,
}

/// An effect of the shard core, for its driver to carry out.
#[derive(Clone, Debug)]
pub enum ShardEvent {
    /// Send these weights to the learner (an answer to its pull, possibly deferred).
    Serve {
        /// Who asked.
        learner: LearnerId,
        /// What to send.
        weights: Weights,
    },
    /// Report a gradient's fate to the staleness tracker.
    Gradient(GradientRecord),
    /// Report an applied update.
    Update(UpdateRecord),
}

#[derive(Clone, Copy, Debug)]
struct Held {
    learner: LearnerId,
    computed_on: Clock,
    staleness: Staleness,
    alpha: f32,
}

/// Settings of an SGD shard.
#[derive(Clone, Debug, PartialEq)]
pub struct SgdShardConfig {
    /// The shard's id.
    pub id: ShardId,
    /// When updates are applied.
    pub rule: SyncRule,
    /// `α(σ)`.
    pub modulation: LrModulation,
    /// The staleness bound `s`, if any.
    pub max_staleness: Option<u64>,
    /// The base learning rate `α0` (the scheduler may change it later).
    pub learning_rate: f32,
}

/// The SGD shard core. Owns the shard's parameter range, its clock, the gradients held for the
/// next update, and the pulls it is deferring.
#[derive(Debug)]
pub struct SgdShard {
    cfg: SgdShardConfig,
    params: Arc<Vec<f32>>,
    clock: Clock,
    active: BTreeSet<LearnerId>,
    acc: Vec<f32>,
    held: Vec<Held>,
    /// Learners served weights whose gradient has not arrived yet, with the clock served.
    outstanding: BTreeMap<LearnerId, Clock>,
    deferred: VecDeque<LearnerId>,
    stats: StalenessStats,
    events: VecDeque<ShardEvent>,
}

impl SgdShard {
    /// A shard holding `params`, serving the learners in `active`.
    #[must_use]
    pub fn new(cfg: SgdShardConfig, params: Vec<f32>, active: BTreeSet<LearnerId>) -> Self {
        let acc = vec![0.0; params.len()];
        Self {
            cfg,
            params: Arc::new(params),
            clock: Clock(0),
            active,
            acc,
            held: Vec::new(),
            outstanding: BTreeMap::new(),
            deferred: VecDeque::new(),
            stats: StalenessStats::default(),
            events: VecDeque::new(),
        }
    }

    /// The shard's id.
    #[must_use]
    pub fn id(&self) -> ShardId {
        self.cfg.id
    }

    /// The current clock `i`.
    #[must_use]
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The current weights, without gating (for evaluation and checkpoints).
    #[must_use]
    pub fn snapshot(&self) -> Weights {
        Weights { shard: self.cfg.id, clock: self.clock, values: Arc::clone(&self.params) }
    }

    /// Staleness counts of the gradients this shard has seen.
    #[must_use]
    pub fn stats(&self) -> &StalenessStats {
        &self.stats
    }

    /// Gradients needed per update: `λ` for hardsync, `⌊λ/n⌋` (at least 1) for softsync.
    #[must_use]
    pub fn gradients_per_update(&self) -> usize {
        let lambda = self.active.len().max(1);
        match self.cfg.rule {
            SyncRule::Hardsync => lambda,
            SyncRule::Softsync { n } => (lambda / n.max(1) as usize).max(1),
        }
    }

    /// The next effect to carry out, if any.
    pub fn poll_event(&mut self) -> Option<ShardEvent> {
        self.events.pop_front()
    }

    /// Change the base learning rate `α0` for gradients from now on.
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.cfg.learning_rate = lr;
    }

    /// A learner asks for the current weights. They are served now, or deferred while the
    /// hardsync barrier or the staleness bound says wait.
    pub fn on_pull(&mut self, learner: LearnerId) -> Result<(), ActorError> {
        self.check_member(learner)?;
        if self.may_serve(learner) {
            self.serve(learner);
        } else if !self.deferred.contains(&learner) {
            self.deferred.push_back(learner);
        }
        Ok(())
    }

    /// A learner pushes its gradient for this shard's range, computed on weights `computed_on`.
    /// A push that is malformed or was never asked for is rejected and changes nothing.
    pub fn on_push(
        &mut self,
        learner: LearnerId,
        computed_on: Clock,
        grad: &[f32],
    ) -> Result<(), ActorError> {
        self.check_member(learner)?;
        if grad.len() != self.params.len() {
            return Err(ActorError::Protocol(format!(
                "{} pushed {} gradient values to {}, which holds {}",
                learner,
                grad.len(),
                self.cfg.id,
                self.params.len()
            )));
        }
        if self.outstanding.get(&learner) != Some(&computed_on) {
            return Err(ActorError::Protocol(format!(
                "{learner} pushed a gradient on clock {computed_on} to {}, which served it {:?}",
                self.cfg.id,
                self.outstanding.get(&learner)
            )));
        }
        self.outstanding.remove(&learner);
        let staleness = self.clock.staleness_of(computed_on).unwrap_or_default();
        let drop = match (self.cfg.rule, self.cfg.max_staleness) {
            (SyncRule::Hardsync, _) if staleness.0 > 0 => Some(DropReason::StaleRound),
            (_, Some(bound)) if staleness.0 > bound => Some(DropReason::TooStale),
            _ => None,
        };
        if let Some(reason) = drop {
            self.stats.record_dropped();
            self.events.push_back(ShardEvent::Gradient(GradientRecord {
                shard: self.cfg.id,
                learner,
                computed_on,
                staleness,
                outcome: Outcome::Dropped(reason),
            }));
        } else {
            self.stats.record_applied(staleness);
            let alpha = self.cfg.modulation.alpha(self.cfg.learning_rate, staleness, self.stats.mean());
            let weight = if self.cfg.modulation.is_per_gradient() { alpha } else { 1.0 };
            cpu::axpy(weight, grad, &mut self.acc);
            self.held.push(Held { learner, computed_on, staleness, alpha });
            if self.held.len() >= self.gradients_per_update() {
                self.apply();
            }
        }
        self.release_deferred();
        Ok(())
    }

    /// The set of active learners changed (λ changes): pending work is re-evaluated so that
    /// no round waits for a learner that is gone.
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) {
        self.outstanding.retain(|l, _| active.contains(l));
        self.deferred.retain(|l| active.contains(l));
        self.active = active;
        if !self.held.is_empty() && self.held.len() >= self.gradients_per_update() {
            self.apply();
        }
        self.release_deferred();
    }

    fn check_member(&self, learner: LearnerId) -> Result<(), ActorError> {
        if self.active.contains(&learner) {
            Ok(())
        } else {
            Err(ActorError::Protocol(format!("{learner} is not an active learner of {}", self.cfg.id)))
        }
    }

    fn may_serve(&self, learner: LearnerId) -> bool {
        if self.cfg.rule == SyncRule::Hardsync && self.held.iter().any(|h| h.learner == learner) {
            return false;
        }
        let Some(bound) = self.cfg.max_staleness else { return true };
        let oldest = self.outstanding.iter().filter(|(l, _)| **l != learner).map(|(_, c)| *c).min();
        oldest.is_none_or(|j| self.clock.0 - j.0 < bound)
    }

    fn serve(&mut self, learner: LearnerId) {
        self.outstanding.insert(learner, self.clock);
        self.events.push_back(ShardEvent::Serve { learner, weights: self.snapshot() });
    }

    fn release_deferred(&mut self) {
        for _ in 0..self.deferred.len() {
            let Some(learner) = self.deferred.pop_front() else { break };
            if self.may_serve(learner) {
                self.serve(learner);
            } else {
                self.deferred.push_back(learner);
            }
        }
    }

    fn apply(&mut self) {
        let c = self.held.len();
        let alpha_update = (!self.cfg.modulation.is_per_gradient())
            .then(|| self.cfg.modulation.alpha(self.cfg.learning_rate, Staleness(0), self.stats.mean()));
        let params = Arc::make_mut(&mut self.params);
        cpu::axpy(-alpha_update.unwrap_or(1.0) / c as f32, &self.acc, params);
        self.acc.fill(0.0);
        for h in self.held.drain(..) {
            self.events.push_back(ShardEvent::Gradient(GradientRecord {
                shard: self.cfg.id,
                learner: h.learner,
                computed_on: h.computed_on,
                staleness: h.staleness,
                outcome: Outcome::Applied { alpha: alpha_update.unwrap_or(h.alpha) },
            }));
        }
        self.clock = self.clock.next();
        self.events.push_back(ShardEvent::Update(UpdateRecord {
            shard: self.cfg.id,
            clock: self.clock,
            gradients: c,
        }));
    }
}
