//! Rudra's SGD shard: hardsync, n-softsync and async (n = λ) as one core parameterised by
//! its [`SyncRule`], with the staleness bound and learning-rate modulation.
//!
//! Update rule: once `c` gradients are held,
//! `θ ← θ − (1/c) Σ_k α(σ_k) g_k`, `i ← i + 1`; hardsync is the case `c = λ` with a barrier,
//! so every gradient has `σ = 0` and the update is `θ ← θ − α0 (1/λ) Σ_l g_l`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use rudra_compute::cpu;
use rudra_transport::{Clock, Floats, LearnerId, ShardId, Staleness};
use serde::{Deserialize, Serialize};

use super::{LrModulation, LrSchedule, StalenessStats};
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
    pub values: Floats,
}

/// What a shard keeps across a restart, in its checkpoints: everything that defines its
/// future updates. What is in flight (held gradients, an open round, deferred pulls) is not
/// kept: learners send their pulls again, and a gradient computed on weights newer than the
/// restored ones is refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardState {
    /// The clock `i`.
    pub clock: Clock,
    /// The parameters of the shard's range, or the center x̃ for the EASGD family.
    pub values: Vec<f32>,
    /// Optimizer state beside the values (MDOWNPOUR's velocity); empty when there is none.
    pub velocity: Vec<f32>,
    /// Gradients received so far: where the learning-rate schedule is.
    pub received: u64,
    /// Each learner's last accepted push, so a push applied before the checkpoint is never
    /// applied again.
    pub last_pushed: BTreeMap<LearnerId, u64>,
}

impl ShardState {
    /// Refuse a state that does not fit a shard of `len` values (`velocity`: whether the
    /// shard keeps a velocity).
    pub fn check(&self, len: usize, velocity: bool) -> Result<(), ActorError> {
        if self.values.len() != len {
            return Err(ActorError::Protocol(format!(
                "the saved state holds {} values; this shard holds {len}",
                self.values.len()
            )));
        }
        let want = if velocity { len } else { 0 };
        if self.velocity.len() != want {
            return Err(ActorError::Protocol(format!(
                "the saved state holds {} velocity values; this shard needs {want}",
                self.velocity.len()
            )));
        }
        Ok(())
    }
}

/// Why a gradient was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// Its staleness exceeded `max_staleness`.
    TooStale,
    /// Hardsync: it was computed on weights of an earlier round.
    StaleRound,
    /// It was computed on weights the shard lost in a crash (newer than its checkpoint).
    RolledBack,
    /// Its learner was declared lost after computing it: it rejoined, and starts afresh from
    /// the current weights.
    Lapsed,
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
        /// The sequence number of the pull answered.
        seq: u64,
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
    /// α0 when it arrived (for `mean` modulation).
    lr: f32,
}

/// Gradients a shard is waiting for: the clock each learner was first served for its step
/// (with that step's sequence number), and how many were served each clock, so the oldest is
/// found without a scan.
#[derive(Debug, Default)]
struct Outstanding {
    by_learner: BTreeMap<LearnerId, (Clock, u64)>,
    by_clock: BTreeMap<Clock, usize>,
}

impl Outstanding {
    fn get(&self, learner: LearnerId) -> Option<Clock> {
        self.by_learner.get(&learner).map(|&(clock, _)| clock)
    }

    fn seq(&self, learner: LearnerId) -> Option<u64> {
        self.by_learner.get(&learner).map(|&(_, seq)| seq)
    }

    fn insert(&mut self, learner: LearnerId, clock: Clock, seq: u64) {
        self.remove(learner);
        self.by_learner.insert(learner, (clock, seq));
        *self.by_clock.entry(clock).or_default() += 1;
    }

    fn remove(&mut self, learner: LearnerId) {
        let Some((clock, _)) = self.by_learner.remove(&learner) else { return };
        if let Some(n) = self.by_clock.get_mut(&clock) {
            *n -= 1;
            if *n == 0 {
                self.by_clock.remove(&clock);
            }
        }
    }

    fn retain(&mut self, active: &BTreeSet<LearnerId>) {
        let gone: Vec<LearnerId> = self.by_learner.keys().filter(|l| !active.contains(l)).copied().collect();
        for l in gone {
            self.remove(l);
        }
    }

    /// Whether a learner other than `learner` still owes a gradient on weights at or before
    /// `limit`, and is behind `learner` asking for its step `seq` (by step number, then id).
    /// Only a learner behind may hold another back, so no two learners ever wait for each
    /// other, whatever the shards: the one furthest behind is never held back.
    fn owed_by_one_behind(&self, learner: LearnerId, seq: u64, limit: Clock) -> bool {
        self.oldest_except(learner).is_some_and(|j| j <= limit)
            && (self.by_learner.iter())
                .any(|(&m, &(j, s))| m != learner && j <= limit && (s, m) < (seq, learner))
    }

    /// The oldest clock served to a learner other than `learner`.
    fn oldest_except(&self, learner: LearnerId) -> Option<Clock> {
        let own = self.get(learner);
        self.by_clock.iter().find(|&(c, n)| Some(*c) != own || *n > 1).map(|(c, _)| *c)
    }
}

/// The incarnation a learner's step number belongs to (see
/// [`LearnerCore::incarnation_base`](super::LearnerCore::incarnation_base)).
fn incarnation(seq: u64) -> u64 {
    seq / super::LearnerCore::incarnation_base(1)
}

/// A pull waiting to be answered.
#[derive(Clone, Copy, Debug)]
struct Deferred {
    learner: LearnerId,
    seq: u64,
    last: bool,
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
    /// The base learning rate `α0` per epoch.
    pub schedule: LrSchedule,
    /// Gradients (from all learners) per epoch: the epoch of a gradient is the number received
    /// before it divided by this, so the schedule is exact and the same in every deployment.
    pub gradients_per_epoch: u64,
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
    /// Hardsync: the round's gradients with their weights, summed in learner order when the
    /// round completes, so the result never depends on arrival order.
    round: BTreeMap<LearnerId, (f32, Vec<f32>)>,
    /// Buffers of earlier rounds, reused.
    spare: Vec<Vec<f32>>,
    /// Learners served weights whose gradient has not arrived yet, with the clock served.
    outstanding: Outstanding,
    /// The sequence number of each learner's last accepted push: a push or pull at or below
    /// it is a duplicate or a late copy and is ignored.
    last_pushed: BTreeMap<LearnerId, u64>,
    /// Pulls waiting for the gate, first come first served.
    deferred: VecDeque<Deferred>,
    /// The learners in `deferred`.
    deferred_set: BTreeSet<LearnerId>,
    stats: StalenessStats,
    /// Gradients received and validated, applied or dropped.
    received: u64,
    /// The clock at which each learner was last removed from the active set: what it
    /// computed before is dropped as [`DropReason::Lapsed`].
    removed_at: BTreeMap<LearnerId, Clock>,
    /// Restarted from a checkpoint: learners may still push gradients computed on the
    /// newer weights that were lost; they are dropped as [`DropReason::RolledBack`].
    restored: bool,
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
            round: BTreeMap::new(),
            spare: Vec::new(),
            outstanding: Outstanding::default(),
            last_pushed: BTreeMap::new(),
            deferred: VecDeque::new(),
            deferred_set: BTreeSet::new(),
            stats: StalenessStats::default(),
            received: 0,
            removed_at: BTreeMap::new(),
            restored: false,
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
        Weights { shard: self.cfg.id, clock: self.clock, values: Arc::clone(&self.params).into() }
    }

    /// What a checkpoint keeps (see [`ShardState`]).
    #[must_use]
    pub fn state(&self) -> ShardState {
        ShardState {
            clock: self.clock,
            values: self.params.to_vec(),
            velocity: Vec::new(),
            received: self.received,
            last_pushed: self.last_pushed.clone(),
        }
    }

    /// Continue from `state`, as a shard restarted from its checkpoint: everything in flight
    /// is forgotten (see [`ShardState`]). A state of the wrong size is refused and changes
    /// nothing.
    pub fn restore(&mut self, state: ShardState) -> Result<(), ActorError> {
        state.check(self.params.len(), false)?;
        let ShardState { clock, values, received, last_pushed, .. } = state;
        (self.clock, self.params, self.received, self.last_pushed) =
            (clock, Arc::new(values), received, last_pushed);
        self.restored = true;
        self.acc.fill(0.0);
        self.held.clear();
        self.spare.extend(std::mem::take(&mut self.round).into_values().map(|(_, g)| g));
        self.outstanding = Outstanding::default();
        self.deferred.clear();
        self.deferred_set.clear();
        self.events.clear();
        Ok(())
    }

    /// Staleness counts of the gradients this shard has seen.
    #[must_use]
    pub fn stats(&self) -> &StalenessStats {
        &self.stats
    }

    /// Gradients received and accepted but waiting for the next update.
    #[must_use]
    pub fn held(&self) -> usize {
        self.held.len()
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

    /// The base learning rate `α0` for the next gradient.
    #[must_use]
    pub fn learning_rate(&self) -> f32 {
        self.cfg.schedule.rate(self.received / self.cfg.gradients_per_epoch.max(1))
    }

    /// The sequence number of `learner`'s last accepted push (0 before any).
    #[must_use]
    pub fn last_pushed(&self, learner: LearnerId) -> u64 {
        self.last_pushed.get(&learner).copied().unwrap_or(0)
    }

    /// A learner asks for the current weights for its step `seq`. They are served now, or
    /// deferred while the hardsync barrier or the staleness bound says wait, or while the
    /// learner's push of its previous step is still on its way (a pull can overtake it; a
    /// learner that retries sends that push again first). Asking again for a step already
    /// answered (a retry) is answered again. A pull for a step already pushed, or older than
    /// the one outstanding, is a late copy: [`ActorError::Duplicate`].
    pub fn on_pull(&mut self, learner: LearnerId, seq: u64) -> Result<(), ActorError> {
        self.pull(learner, seq, false)
    }

    /// A learner that has pushed its last gradient asks for the weights once more, to know it
    /// was applied: served once that push is in, never gated, and no gradient is expected.
    pub fn on_last_pull(&mut self, learner: LearnerId, seq: u64) -> Result<(), ActorError> {
        self.pull(learner, seq, true)
    }

    fn pull(&mut self, learner: LearnerId, seq: u64, last: bool) -> Result<(), ActorError> {
        self.check_member(learner)?;
        self.check_fresh(learner, seq, "pull")?;
        // A learner that restarted never pushes what its earlier incarnation was served.
        if self.outstanding.seq(learner).is_some_and(|s| incarnation(s) < incarnation(seq)) {
            self.outstanding.remove(learner);
        }
        match self.outstanding.seq(learner) {
            Some(s) if s > seq => return Err(self.duplicate(learner, seq, "pull")),
            Some(s) if s == seq => {
                self.events.push_back(ShardEvent::Serve { learner, seq, weights: self.snapshot() });
                return Ok(());
            }
            _ => {}
        }
        if self.deferred_set.insert(learner) {
            self.deferred.push_back(Deferred { learner, seq, last });
        } else if let Some(d) = self.deferred.iter_mut().find(|d| d.learner == learner) {
            (d.seq, d.last) = (d.seq.max(seq), last);
        }
        self.release_deferred();
        Ok(())
    }

    /// A learner pushes its gradient of step `seq` for this shard's range, computed on weights
    /// `computed_on`. A push that is malformed or comes from the future is rejected and changes
    /// nothing; a copy of a push already accepted is [`ActorError::Duplicate`], applied once.
    pub fn on_push(
        &mut self,
        learner: LearnerId,
        seq: u64,
        computed_on: Clock,
        grad: &[f32],
    ) -> Result<(), ActorError> {
        self.check_member(learner)?;
        self.check_fresh(learner, seq, "push")?;
        if grad.len() != self.params.len() {
            return Err(ActorError::Protocol(format!(
                "{} pushed {} gradient values to {}, which holds {}",
                learner,
                grad.len(),
                self.cfg.id,
                self.params.len()
            )));
        }
        if computed_on > self.clock && !self.restored {
            return Err(ActorError::Protocol(format!(
                "{learner} pushed a gradient on clock {computed_on} to {}, which is at {}",
                self.cfg.id, self.clock
            )));
        }
        if self.cfg.rule == SyncRule::Hardsync && self.round.contains_key(&learner) {
            return Err(self.duplicate(learner, seq, "push in a round it already pushed to"));
        }
        if self.outstanding.seq(learner).is_some_and(|s| s <= seq) {
            self.outstanding.remove(learner);
        }
        self.last_pushed.insert(learner, seq);
        let lr = self.learning_rate();
        self.received += 1;
        let staleness = self.clock.staleness_of(computed_on).unwrap_or_default();
        let drop = match (self.cfg.rule, self.cfg.max_staleness) {
            _ if computed_on > self.clock => Some(DropReason::RolledBack),
            _ if self.removed_at.get(&learner).is_some_and(|&c| computed_on < c) => Some(DropReason::Lapsed),
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
            let alpha = self.cfg.modulation.alpha(lr, staleness, self.stats.mean());
            let weight = if self.cfg.modulation.is_per_gradient() { alpha } else { 1.0 };
            self.held.push(Held { learner, computed_on, staleness, alpha, lr });
            let complete = self.held.len() >= self.gradients_per_update();
            if self.cfg.rule == SyncRule::Hardsync {
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(grad);
                self.round.insert(learner, (weight, buf));
                if complete {
                    self.apply(None);
                }
            } else if complete {
                self.apply(Some((weight, grad)));
            } else {
                cpu::axpy(weight, grad, &mut self.acc);
            }
        }
        // A new clock, the oldest outstanding gradient, or this learner's own push may each
        // open the gate for a deferred pull.
        self.release_deferred();
        Ok(())
    }

    /// The set of active learners changed (λ changes): pending work is re-evaluated so that
    /// no round waits for a learner that is gone.
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) {
        for &gone in self.active.difference(&active) {
            self.removed_at.insert(gone, self.clock);
        }
        self.outstanding.retain(&active);
        self.deferred.retain(|d| active.contains(&d.learner));
        self.deferred_set.retain(|l| active.contains(l));
        self.active = active;
        if !self.held.is_empty() && self.held.len() >= self.gradients_per_update() {
            self.apply(None);
        }
        self.release_deferred();
    }

    fn check_fresh(&self, learner: LearnerId, seq: u64, what: &str) -> Result<(), ActorError> {
        if seq <= self.last_pushed(learner) { Err(self.duplicate(learner, seq, what)) } else { Ok(()) }
    }

    fn duplicate(&self, learner: LearnerId, seq: u64, what: &str) -> ActorError {
        ActorError::Duplicate(format!("{learner} {what} #{seq} at {}: a late or repeated copy", self.cfg.id))
    }

    fn check_member(&self, learner: LearnerId) -> Result<(), ActorError> {
        if self.active.contains(&learner) {
            Ok(())
        } else {
            Err(ActorError::Protocol(format!("{learner} is not an active learner of {}", self.cfg.id)))
        }
    }

    fn may_serve(&self, &Deferred { learner, seq, last }: &Deferred) -> bool {
        if self.outstanding.seq(learner).is_some_and(|s| s < seq) {
            return false;
        }
        if last {
            return true;
        }
        if self.cfg.rule == SyncRule::Hardsync && self.round.contains_key(&learner) {
            return false;
        }
        let Some(bound) = self.cfg.max_staleness else { return true };
        let Some(limit) = self.clock.0.checked_sub(bound) else { return true };
        !self.outstanding.owed_by_one_behind(learner, seq, Clock(limit))
    }

    fn serve(&mut self, learner: LearnerId, seq: u64) {
        self.outstanding.insert(learner, self.clock, seq);
        self.events.push_back(ShardEvent::Serve { learner, seq, weights: self.snapshot() });
    }

    fn release_deferred(&mut self) {
        for _ in 0..self.deferred.len() {
            let Some(d) = self.deferred.pop_front() else { break };
            if !self.may_serve(&d) {
                self.deferred.push_back(d);
                continue;
            }
            self.deferred_set.remove(&d.learner);
            if d.last {
                let weights = self.snapshot();
                self.events.push_back(ShardEvent::Serve { learner: d.learner, seq: d.seq, weights });
            } else {
                self.serve(d.learner, d.seq);
            }
        }
    }

    /// Apply the held gradients: a hardsync round in learner order, or those summed in `acc`
    /// plus `last` (weight, gradient) when the update is triggered by a gradient that has not
    /// been accumulated.
    fn apply(&mut self, last: Option<(f32, &[f32])>) {
        let c = self.held.len();
        let lr = self.held.last().map_or(0.0, |h| h.lr);
        let alpha_update = (!self.cfg.modulation.is_per_gradient())
            .then(|| self.cfg.modulation.alpha(lr, Staleness(0), self.stats.mean()));
        let scale = -alpha_update.unwrap_or(1.0) / c as f32;
        let params = Arc::make_mut(&mut self.params);
        if !self.round.is_empty() {
            for (_, (weight, grad)) in std::mem::take(&mut self.round) {
                cpu::axpy(scale * weight, &grad, params);
                self.spare.push(grad);
            }
        } else if c > usize::from(last.is_some()) {
            cpu::axpy_drain(scale, &mut self.acc, params);
        }
        if let Some((weight, grad)) = last {
            cpu::axpy(scale * weight, grad, params);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const L: [LearnerId; 4] = [LearnerId(0), LearnerId(1), LearnerId(2), LearnerId(3)];

    fn shard(rule: SyncRule, modulation: LrModulation, bound: Option<u64>, learners: usize) -> SgdShard {
        let schedule = LrSchedule { base: 0.5, decay: 1.0 };
        let cfg = SgdShardConfig {
            id: ShardId(0),
            rule,
            modulation,
            max_staleness: bound,
            schedule,
            gradients_per_epoch: 1,
        };
        SgdShard::new(cfg, vec![1.0, 2.0, 3.0], L[..learners].iter().copied().collect())
    }

    /// The next step's pull from `l`.
    fn pull(s: &mut SgdShard, l: LearnerId) -> Result<(), ActorError> {
        s.on_pull(l, s.last_pushed(l) + 1)
    }

    /// `l`'s gradient of its next step, computed on `clock`.
    fn push(s: &mut SgdShard, l: LearnerId, clock: Clock, g: &[f32]) -> Result<(), ActorError> {
        s.on_push(l, s.last_pushed(l) + 1, clock, g)
    }

    /// Drain events; returns (served learners with clocks, records, updates).
    fn drain(s: &mut SgdShard) -> (Vec<(LearnerId, Clock)>, Vec<GradientRecord>, Vec<UpdateRecord>) {
        let (mut served, mut grads, mut updates) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(e) = s.poll_event() {
            match e {
                ShardEvent::Serve { learner, weights, .. } => served.push((learner, weights.clock)),
                ShardEvent::Gradient(g) => grads.push(g),
                ShardEvent::Update(u) => updates.push(u),
            }
        }
        (served, grads, updates)
    }

    fn values(s: &SgdShard) -> Vec<f32> {
        s.snapshot().values.to_vec()
    }

    fn close(a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn c_is_lambda_over_n_at_least_one() {
        for (n, c) in [(1, 4), (2, 2), (3, 1), (4, 1)] {
            assert_eq!(
                shard(SyncRule::Softsync { n }, LrModulation::None, None, 4).gradients_per_update(),
                c
            );
        }
        assert_eq!(shard(SyncRule::Hardsync, LrModulation::None, None, 4).gradients_per_update(), 4);
    }

    #[test]
    fn softsync_applies_mean_of_modulated_gradients_every_c() {
        // λ = 4, n = 2: c = 2. Per-gradient modulation, α0 = 0.5.
        let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::PerGradient, None, 4);
        for l in L {
            pull(&mut s, l).unwrap();
        }
        assert_eq!(drain(&mut s).0.len(), 4, "no barrier: all served at once");
        let (g0, g1, g2, g3) = ([1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 4.0], [8.0, 0.0, 0.0]);
        push(&mut s, L[0], Clock(0), &g0).unwrap();
        assert_eq!(s.clock(), Clock(0), "one gradient is not enough");
        push(&mut s, L[1], Clock(0), &g1).unwrap();
        assert_eq!(s.clock(), Clock(1));
        // θ ← θ − (1/2)(0.5·g0 + 0.5·g1)
        close(&values(&s), &[1.0 - 0.25, 2.0 - 0.5, 3.0]);
        pull(&mut s, L[0]).unwrap();
        push(&mut s, L[2], Clock(0), &g2).unwrap(); // σ = 1: α = 0.5
        push(&mut s, L[0], Clock(1), &g0).unwrap(); // σ = 0: α = 0.5
        close(&values(&s), &[0.75 - 0.25, 1.5, 3.0 - 1.0]);
        push(&mut s, L[3], Clock(0), &g3).unwrap(); // σ = 2: α = 0.25
        pull(&mut s, L[1]).unwrap();
        push(&mut s, L[1], Clock(2), &g1).unwrap(); // σ = 0
        close(&values(&s), &[0.5 - 0.5 * 0.25 * 8.0, 1.5 - 0.5 * 0.5 * 2.0, 2.0]);
        let (_, grads, updates) = drain(&mut s);
        assert_eq!(updates.len(), 3);
        assert_eq!(updates.iter().map(|u| u.clock.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        let sigmas: Vec<u64> = grads.iter().map(|g| g.staleness.0).collect();
        assert_eq!(sigmas, vec![0, 0, 1, 0, 2, 0]);
        let alphas: Vec<f32> = grads
            .iter()
            .map(|g| match g.outcome {
                Outcome::Applied { alpha } => alpha,
                Outcome::Dropped(r) => panic!("dropped: {r:?}"),
            })
            .collect();
        assert_eq!(alphas, vec![0.5, 0.5, 0.5, 0.5, 0.25, 0.5]);
    }

    #[test]
    fn mean_modulation_scales_the_whole_update_by_running_mean() {
        // 1-softsync, λ = 2 (c = 2): ⟨σ⟩ = 0 → α = α0 / max(0, 1) = 0.5 for the update.
        let mut s = shard(SyncRule::Softsync { n: 1 }, LrModulation::Mean, None, 2);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        push(&mut s, L[0], Clock(0), &[1.0, 1.0, 1.0]).unwrap();
        push(&mut s, L[1], Clock(0), &[3.0, 3.0, 3.0]).unwrap();
        close(&values(&s), &[0.0, 1.0, 2.0]); // θ − 0.5 · (1 + 3) / 2
        // Async, λ = 3: L0 runs four steps while L1 and L2 compute on clock 0.
        let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::Mean, None, 3);
        for l in &L[..3] {
            pull(&mut s, *l).unwrap();
        }
        for j in 0..4 {
            push(&mut s, L[0], Clock(j), &[1.0; 3]).unwrap();
            pull(&mut s, L[0]).unwrap();
        }
        close(&values(&s), &[-1.0, 0.0, 1.0]);
        push(&mut s, L[1], Clock(0), &[0.0; 3]).unwrap(); // σ = 4, ⟨σ⟩ = 4/5
        push(&mut s, L[2], Clock(0), &[3.0, 0.0, 0.0]).unwrap(); // σ = 5, ⟨σ⟩ = 9/6 → α = 0.5 / 1.5
        close(&values(&s), &[-2.0, 0.0, 1.0]);
        let (_, grads, _) = drain(&mut s);
        let last = grads.last().unwrap();
        assert_eq!(last.staleness, Staleness(5));
        assert!(matches!(last.outcome, Outcome::Applied { alpha } if (alpha - 1.0 / 3.0).abs() < 1e-7));
    }

    #[test]
    fn async_applies_every_gradient_on_arrival() {
        let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::None, None, 3);
        for l in &L[..3] {
            pull(&mut s, *l).unwrap();
        }
        for (k, l) in L[..3].iter().enumerate() {
            push(&mut s, *l, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
            assert_eq!(s.clock(), Clock(k as u64 + 1));
        }
        close(&values(&s), &[1.0 - 1.5, 2.0, 3.0]);
    }

    #[test]
    fn hardsync_waits_for_everyone_and_defers_early_pulls() {
        let mut s = shard(SyncRule::Hardsync, LrModulation::PerGradient, None, 2);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        drain(&mut s);
        push(&mut s, L[0], Clock(0), &[2.0, 0.0, 0.0]).unwrap();
        pull(&mut s, L[0]).unwrap();
        assert!(drain(&mut s).0.is_empty(), "the barrier defers L0 until the round ends");
        push(&mut s, L[1], Clock(0), &[0.0, 4.0, 0.0]).unwrap();
        let (served, grads, _) = drain(&mut s);
        assert_eq!(served, vec![(L[0], Clock(1))]);
        assert!(grads.iter().all(|g| g.staleness == Staleness(0)));
        close(&values(&s), &[1.0 - 0.5, 2.0 - 1.0, 3.0]);
    }

    #[test]
    fn a_restored_shard_continues_from_its_checkpoint_exactly() {
        let new = || shard(SyncRule::Softsync { n: 2 }, LrModulation::PerGradient, None, 2);
        let (mut a, mut b) = (new(), new());
        for (l, g) in [(L[0], [1.0, 0.0, 0.0]), (L[1], [0.0, 2.0, 0.0]), (L[0], [0.0, 0.0, 3.0])] {
            pull(&mut a, l).unwrap();
            let clock = a.clock();
            push(&mut a, l, clock, &g).unwrap();
        }
        let saved = a.state();
        assert_eq!((saved.clock, saved.received), (Clock(3), 3));
        // What happens after the checkpoint is lost with the crash.
        pull(&mut a, L[1]).unwrap();
        push(&mut a, L[1], Clock(3), &[5.0, 5.0, 5.0]).unwrap();
        let lost_seq = a.last_pushed(L[1]);
        b.restore(saved.clone()).unwrap();
        assert_eq!(b.state(), saved);
        // A push applied before the checkpoint is a duplicate; one on the lost clock 4 is
        // dropped and changes nothing; the next step goes on from clock 3 as if never lost.
        assert!(matches!(b.on_push(L[0], 2, Clock(2), &[9.0; 3]), Err(ActorError::Duplicate(_))));
        b.on_push(L[1], lost_seq, Clock(4), &[9.0; 3]).unwrap();
        let (_, grads, updates) = drain(&mut b);
        assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::RolledBack));
        assert!(updates.is_empty());
        assert_eq!(b.state().values, saved.values);
        b.on_pull(L[0], 3).unwrap();
        assert_eq!(drain(&mut b).0, vec![(L[0], Clock(3))]);
        // A state of another size is refused and changes nothing.
        let wrong = ShardState { values: vec![0.0; 4], ..saved.clone() };
        assert!(b.restore(wrong).is_err());
        assert_eq!(b.clock(), Clock(3));
    }

    #[test]
    fn a_restarted_learner_is_served_without_the_push_its_last_incarnation_owed() {
        let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, Some(1), 2);
        pull(&mut s, L[0]).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[0], Clock(0))]);
        // Learner 0 crashes before its push; restarted, it pulls as its next incarnation.
        s.on_pull(L[0], crate::protocol::LearnerCore::incarnation_base(1) + 1).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[0], Clock(0))]);
    }

    #[test]
    fn bad_pushes_are_rejected_and_change_nothing() {
        let mut s = shard(SyncRule::Softsync { n: 1 }, LrModulation::None, None, 2);
        pull(&mut s, L[0]).unwrap();
        let before = values(&s);
        assert!(push(&mut s, L[0], Clock(0), &[1.0]).is_err(), "wrong length");
        assert!(push(&mut s, L[3], Clock(0), &[1.0; 3]).is_err(), "unknown learner");
        assert!(pull(&mut s, L[3]).is_err(), "unknown learner");
        assert!(push(&mut s, L[0], Clock(5), &[1.0; 3]).is_err(), "a clock the shard has not reached");
        assert_eq!(values(&s), before);
        assert_eq!(s.clock(), Clock(0));
        push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
        let dup = s.on_push(L[0], 1, Clock(0), &[1.0; 3]);
        assert!(matches!(dup, Err(ActorError::Duplicate(_))), "a duplicate push is not applied twice");
    }

    #[test]
    fn retried_duplicated_and_reordered_messages_apply_each_gradient_once() {
        let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, None, 2);
        s.on_pull(L[0], 1).unwrap();
        s.on_pull(L[0], 1).unwrap(); // a retry is answered again
        let (served, _, _) = drain(&mut s);
        assert_eq!(served, vec![(L[0], Clock(0)), (L[0], Clock(0))]);
        // Step 2's pull overtakes step 1's push; both gradients count, each once.
        s.on_pull(L[0], 2).unwrap();
        s.on_push(L[0], 1, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
        assert!(matches!(s.on_push(L[0], 1, Clock(0), &[1.0; 3]), Err(ActorError::Duplicate(_))));
        assert!(matches!(s.on_pull(L[0], 1), Err(ActorError::Duplicate(_))), "a late copy of a pull");
        s.on_push(L[0], 2, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
        assert!(matches!(s.on_push(L[0], 2, Clock(0), &[1.0; 3]), Err(ActorError::Duplicate(_))));
        assert_eq!(s.clock(), Clock(2));
        close(&values(&s), &[0.0, 2.0, 3.0]);
        // A step lost on the way (its push dropped) leaves nothing waiting.
        s.on_pull(L[1], 1).unwrap();
        s.on_pull(L[1], 2).unwrap();
        s.on_push(L[1], 2, Clock(2), &[0.0; 3]).unwrap();
        assert_eq!((s.clock(), s.last_pushed(L[1])), (Clock(3), 2));
    }

    #[test]
    fn a_pull_that_overtakes_its_push_waits_for_it_unless_asked_again() {
        let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
        for l in &L[..2] {
            s.on_pull(*l, 1).unwrap();
        }
        drain(&mut s);
        s.on_pull(L[0], 2).unwrap(); // learner 0's push of step 1 is still on its way
        s.on_push(L[1], 1, Clock(0), &[0.0; 3]).unwrap();
        assert_eq!(drain(&mut s).0, vec![], "not served on the weights its own push will change");
        s.on_push(L[0], 1, Clock(0), &[2.0, 0.0, 0.0]).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[0], Clock(1))], "served once the round it completes is applied");
        // Learner 1's push of step 2 is lost: its pull waits until the retry sends it again.
        s.on_pull(L[1], 2).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[1], Clock(1))]);
        s.on_pull(L[1], 3).unwrap();
        s.on_pull(L[1], 3).unwrap();
        assert_eq!(drain(&mut s).0, vec![], "a copy of the pull does not stop the wait");
        s.on_push(L[1], 2, Clock(1), &[0.0; 3]).unwrap();
        assert_eq!(s.clock(), Clock(1), "hardsync waits for learner 0's step 2");
        s.on_push(L[0], 2, Clock(1), &[0.0; 3]).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[1], Clock(2))]);
    }

    #[test]
    fn hardsync_takes_one_gradient_per_learner_per_round() {
        let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
        s.on_pull(L[0], 1).unwrap();
        s.on_pull(L[0], 1).unwrap();
        s.on_push(L[0], 1, Clock(0), &[2.0, 0.0, 0.0]).unwrap();
        // A second reply to the retried pull led the learner to push step 2 on the same clock.
        assert!(matches!(s.on_push(L[0], 2, Clock(0), &[2.0; 3]), Err(ActorError::Duplicate(_))));
        s.on_pull(L[1], 1).unwrap();
        s.on_push(L[1], 1, Clock(0), &[0.0, 4.0, 0.0]).unwrap();
        assert_eq!(s.clock(), Clock(1));
        close(&values(&s), &[1.0 - 0.5, 2.0 - 1.0, 3.0]);
    }

    #[test]
    fn gradients_over_the_bound_are_dropped_and_reported() {
        // Async, s = 1. L0 and L1 both served at 0; L1's gradient is applied; L0's is σ = 1;
        // then L2 (served at 0 before the gate closed) arrives with σ = 2 and is dropped.
        let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::None, Some(1), 3);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        pull(&mut s, L[2]).unwrap();
        push(&mut s, L[1], Clock(0), &[1.0; 3]).unwrap();
        push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
        let before = values(&s);
        push(&mut s, L[2], Clock(0), &[1.0; 3]).unwrap();
        assert_eq!(values(&s), before, "a dropped gradient changes nothing");
        let (_, grads, _) = drain(&mut s);
        assert_eq!(grads.last().unwrap().outcome, Outcome::Dropped(DropReason::TooStale));
        assert_eq!(s.stats().summary().dropped, 1);
        assert_eq!(s.stats().summary().max, 1);
    }

    #[test]
    fn the_bound_defers_pulls_while_an_old_gradient_is_outstanding() {
        let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, Some(1), 2);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        push(&mut s, L[1], Clock(0), &[1.0; 3]).unwrap(); // clock 1, L0 outstanding at 0
        drain(&mut s);
        pull(&mut s, L[1]).unwrap();
        assert!(drain(&mut s).0.is_empty(), "i − j = 1 is not below s = 1: wait");
        push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap(); // σ = 1, applied
        let (served, grads, _) = drain(&mut s);
        assert_eq!(served, vec![(L[1], Clock(2))]);
        assert_eq!(grads[0].staleness, Staleness(1));
    }

    #[test]
    fn the_staleness_gate_never_holds_two_learners_back_for_each_other_across_shards() {
        // Learner 0 owes shard A a gradient and waits for B; learner 1 owes B and waits for A;
        // learner 2's gradients have made both debts old. Were both held back, nobody would
        // move again: the one behind (here by id, as their steps are equal) goes on.
        let new = || shard(SyncRule::Softsync { n: 3 }, LrModulation::None, Some(1), 3);
        let (mut a, mut b) = (new(), new());
        pull(&mut a, L[0]).unwrap();
        pull(&mut b, L[1]).unwrap();
        for s in [&mut a, &mut b] {
            pull(s, L[2]).unwrap();
            push(s, L[2], Clock(0), &[1.0; 3]).unwrap();
            drain(s);
        }
        pull(&mut a, L[1]).unwrap();
        assert!(drain(&mut a).0.is_empty(), "learner 1 waits at A for learner 0, who is behind");
        pull(&mut b, L[0]).unwrap();
        assert_eq!(drain(&mut b).0, vec![(L[0], Clock(1))], "learner 0 is not held back at B");
        push(&mut a, L[0], Clock(0), &[1.0; 3]).unwrap();
        assert_eq!(drain(&mut a).0, vec![(L[1], Clock(2))], "its push lets learner 1 go on at A");
    }

    #[test]
    fn the_oldest_outstanding_clock_is_kept_per_clock() {
        let mut o = Outstanding::default();
        o.insert(L[0], Clock(3), 1);
        o.insert(L[1], Clock(5), 1);
        assert_eq!(o.oldest_except(L[2]), Some(Clock(3)));
        assert_eq!(o.oldest_except(L[0]), Some(Clock(5)), "a learner's own gradient does not count");
        o.insert(L[2], Clock(3), 1);
        assert_eq!(o.oldest_except(L[0]), Some(Clock(3)));
        o.insert(L[2], Clock(6), 1);
        o.remove(L[0]);
        assert_eq!(o.oldest_except(L[3]), Some(Clock(5)));
        o.retain(&[L[2]].into_iter().collect());
        assert_eq!((o.get(L[1]), o.oldest_except(L[2]), o.oldest_except(L[0])), (None, None, Some(Clock(6))));
    }

    #[test]
    fn a_gradient_from_before_its_learner_was_lost_is_dropped_when_it_rejoins() {
        let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, None, 2);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
        s.on_membership([L[0]].into_iter().collect());
        pull(&mut s, L[0]).unwrap();
        push(&mut s, L[0], Clock(1), &[1.0; 3]).unwrap();
        drain(&mut s);
        let before = values(&s);
        // Learner 1 comes back and sends what it computed before it was declared lost.
        s.on_membership([L[0], L[1]].into_iter().collect());
        push(&mut s, L[1], Clock(0), &[9.0; 3]).unwrap();
        let (_, grads, _) = drain(&mut s);
        assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::Lapsed));
        assert_eq!((s.clock(), values(&s)), (Clock(2), before));
        pull(&mut s, L[1]).unwrap();
        assert_eq!(drain(&mut s).0, vec![(L[1], Clock(2))], "it starts again from the current weights");
    }

    #[test]
    fn losing_a_learner_completes_the_hardsync_round() {
        let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 3);
        for l in &L[..3] {
            pull(&mut s, *l).unwrap();
        }
        push(&mut s, L[0], Clock(0), &[3.0, 0.0, 0.0]).unwrap();
        push(&mut s, L[1], Clock(0), &[3.0, 0.0, 0.0]).unwrap();
        assert_eq!(s.clock(), Clock(0));
        s.on_membership(L[..2].iter().copied().collect());
        assert_eq!(s.clock(), Clock(1));
        close(&values(&s), &[1.0 - 1.5, 2.0, 3.0]);
    }
}
