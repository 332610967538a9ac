//! Rudra's SGD shard: hardsync, n-softsync and async (n = λ) as one core parameterised by
//! its [`SyncRule`], with the staleness bound and learning-rate modulation.
//!
//! Update rule: once `c` gradients are held,
//! `θ ← θ − (1/c) Σ_k α(σ_k) g_k`, `i ← i + 1`; hardsync is the case `c = λ` with a barrier,
//! so every gradient has `σ = 0` and the update is `θ ← θ − α0 (1/λ) Σ_l g_l`. With adaptive
//! batch sizes (`docs/src/algorithms.md` §5.1) a gradient over μ_k examples has the share
//! s_k = μ_k / μ and `1/c` becomes `1/Σ_k s_k`: every example weighs the same.

pub(crate) mod broken;
mod config;
mod outstanding;
mod push;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::{Clock, LearnerId, Outcome, PushWindow, ShardId, Staleness};
pub use config::{LateRule, Quorum, SgdShardConfig, SyncRule, shard_ranges};
use outstanding::Outstanding;
pub use push::Contribution;
use rudra_compute::cpu;

use super::{CoreError, GradientRecord, ShardEvent, ShardState, StalenessStats, UpdateRecord, Weights};

#[derive(Clone, Copy, Debug)]
struct Held {
    learner: LearnerId,
    computed_on: Clock,
    staleness: Staleness,
    alpha: f32,
    /// α0 when it arrived (for `mean` modulation).
    lr: f32,
    /// Its examples over the nominal μ (1 without adaptive batch sizes).
    share: f32,
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

/// The SGD shard core. Owns the shard's parameter range, its clock, the gradients held for the
/// next update, and the pulls it is deferring.
#[derive(Debug)]
pub struct SgdShard {
    cfg: SgdShardConfig,
    params: Arc<Vec<f32>>,
    clock: Clock,
    active: BTreeSet<LearnerId>,
    /// λ at the start: a quorum of q lets λ − q of the learners present miss a round.
    learners: usize,
    acc: Vec<f32>,
    held: Vec<Held>,
    /// Hardsync: the round's gradients with their weights, by learner and the clock they were
    /// computed on (older ones folded in from earlier rounds), summed in that order when the
    /// round completes, so the result never depends on arrival order.
    round: BTreeMap<(LearnerId, Clock), (f32, Vec<f32>)>,
    /// Hardsync: learners whose gradient of this round was dropped as non-finite; the round
    /// completes without them.
    voided: BTreeSet<LearnerId>,
    /// Buffers of earlier rounds, reused.
    spare: Vec<Vec<f32>>,
    /// Learners served weights whose gradient has not arrived yet, with the clock served.
    outstanding: Outstanding,
    /// The pushes accepted from each learner: a push taken before is a duplicate or a late
    /// copy and is ignored, and a pull for a step already pushed is answered again.
    last_pushed: BTreeMap<LearnerId, PushWindow>,
    /// With prefetch: the clock each learner's newest push was computed on.
    used: BTreeMap<LearnerId, Clock>,
    /// Active learners whose last pull was served, with its step: they send no more
    /// gradients, so no update waits for them, and a late copy of an earlier pull does not
    /// open them again (only a later incarnation's pull does).
    finished: BTreeMap<LearnerId, u64>,
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
    /// The clock of the last round whose quorum was announced.
    quorum_said: Option<Clock>,
    /// Effects of the input being handled, returned when it is done.
    events: Vec<ShardEvent>,
}

impl SgdShard {
    /// A shard holding `params`, serving the learners in `active`.
    #[must_use]
    pub fn new(cfg: SgdShardConfig, params: Vec<f32>, active: BTreeSet<LearnerId>) -> Self {
        let acc = vec![0.0; params.len()];
        Self {
            learners: active.len(),
            cfg,
            params: Arc::new(params),
            clock: Clock(0),
            active,
            acc,
            held: Vec::new(),
            round: BTreeMap::new(),
            voided: BTreeSet::new(),
            spare: Vec::new(),
            outstanding: Outstanding::default(),
            last_pushed: BTreeMap::new(),
            used: BTreeMap::new(),
            deferred: VecDeque::new(),
            deferred_set: BTreeSet::new(),
            finished: BTreeMap::new(),
            stats: StalenessStats::default(),
            received: 0,
            removed_at: BTreeMap::new(),
            restored: false,
            quorum_said: None,
            events: Vec::new(),
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
    pub fn restore(&mut self, state: ShardState) -> Result<(), CoreError> {
        state.check(self.params.len(), false)?;
        if state.clock.0 > state.received {
            return Err(CoreError::Protocol(format!(
                "the saved state is at clock {} after {} gradients; every update takes at least one",
                state.clock, state.received
            )));
        }
        let ShardState { clock, values, received, last_pushed, .. } = state;
        (self.clock, self.params, self.received, self.last_pushed) =
            (clock, Arc::new(values), received, last_pushed);
        self.restored = true;
        // A learner removed on the lost clocks lapsed at most at the restored one: otherwise,
        // back before its removal, everything it computes after rejoining would lapse too.
        for at in self.removed_at.values_mut() {
            *at = (*at).min(self.clock);
        }
        self.acc.fill(0.0);
        self.held.clear();
        self.spare.extend(std::mem::take(&mut self.round).into_values().map(|(_, g)| g));
        self.voided.clear();
        self.outstanding = Outstanding::default();
        self.used.clear();
        self.deferred.clear();
        self.deferred_set.clear();
        self.quorum_said = None;
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

    /// Gradients needed per update: `λ − b` (at least 1) for hardsync with b backups, λ
    /// counting the active learners that have not finished; `⌊λ/n⌋` (at least 1) for
    /// softsync.
    #[must_use]
    pub fn gradients_per_update(&self) -> usize {
        match self.cfg.rule {
            SyncRule::Hardsync => {
                // A round waits for no learner that has finished, unless its last gradient is
                // part of the round.
                let finished = self.finished.keys().filter(|&&l| !self.in_round(l)).count();
                let lambda = self.active.len().saturating_sub(finished).max(1);
                lambda.saturating_sub(self.cfg.backups as usize).max(1)
            }
            SyncRule::Softsync { n } => (self.active.len().max(1) / n.max(1) as usize).max(1),
            SyncRule::Async => 1,
        }
    }

    /// The base learning rate `α0` for the next gradient.
    #[must_use]
    pub fn learning_rate(&self) -> f32 {
        self.cfg.schedule.rate(self.received / self.cfg.gradients_per_epoch.max(1))
    }

    /// The sequence number of `learner`'s newest accepted push (0 before any).
    #[must_use]
    pub fn last_pushed(&self, learner: LearnerId) -> u64 {
        self.window(learner).newest
    }

    fn window(&self, learner: LearnerId) -> PushWindow {
        self.last_pushed.get(&learner).copied().unwrap_or_default()
    }

    /// A learner asks for the current weights for its step `seq`. They are served now, or
    /// deferred while the hardsync barrier or the staleness bound says wait, or while the
    /// learner's push of its previous step is still on its way (a pull can overtake it; a
    /// learner that retries sends that push again first). Asking again for a step already
    /// answered, already pushed, or older than the one outstanding (a retry, or a late copy)
    /// is answered again with the current weights and changes nothing: the answer tells a
    /// learner that the push this pull rode on was taken.
    pub fn on_pull(&mut self, learner: LearnerId, seq: u64) -> Result<Vec<ShardEvent>, CoreError> {
        self.pull(learner, seq, false)
    }

    /// A learner that has pushed its last gradient asks for the weights once more, to know it
    /// was applied: served once that push is in, never gated, and no gradient is expected.
    pub fn on_last_pull(&mut self, learner: LearnerId, seq: u64) -> Result<Vec<ShardEvent>, CoreError> {
        self.pull(learner, seq, true)
    }

    fn pull(&mut self, learner: LearnerId, seq: u64, last: bool) -> Result<Vec<ShardEvent>, CoreError> {
        self.check_member(learner)?;
        // A learner that restarted never pushes what its earlier incarnation was served.
        if self.outstanding.seq(learner).is_some_and(|s| incarnation(s) < incarnation(seq)) {
            self.outstanding.remove(learner);
        }
        let old = |s: u64| s >= seq;
        // A last pull for the step a learner was served says its push will not come (a group
        // whose last member was lost, §4.3): it finishes the learner, unlike a repeat.
        let owed = |s: u64| if last { s > seq } else { s >= seq };
        if seq <= self.last_pushed(learner)
            || self.outstanding.seq(learner).is_some_and(owed)
            || self.finished.get(&learner).copied().is_some_and(old)
        {
            self.events.push(ShardEvent::Serve { learner, seq, weights: self.snapshot() });
            return Ok(self.take_events());
        }
        if self.deferred_set.insert(learner) {
            self.deferred.push_back(Deferred { learner, seq, last });
        } else if let Some(d) = self.deferred.iter_mut().find(|d| d.learner == learner) {
            (d.seq, d.last) = (d.seq.max(seq), last);
        }
        self.release_deferred();
        Ok(self.take_events())
    }

    /// The set of active learners changed (λ changes): pending work is re-evaluated so that
    /// no round waits for a learner that is gone.
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) -> Vec<ShardEvent> {
        for &gone in self.active.difference(&active) {
            self.removed_at.insert(gone, self.clock);
        }
        self.outstanding.retain(&active);
        self.used.retain(|l, _| active.contains(l));
        self.deferred.retain(|d| active.contains(&d.learner));
        self.deferred_set.retain(|l| active.contains(l));
        self.finished.retain(|l, _| active.contains(l));
        self.active = active;
        self.voided.retain(|l| self.active.contains(l));
        if !(self.held.is_empty() && self.voided.is_empty()) && self.round_complete() {
            self.apply(None);
        }
        self.release_deferred();
        self.take_events()
    }

    /// The quorum's round is over its grace window: it closes if it is still open and holds
    /// its quorum (an update since, or a quorum lost to a membership change, leaves it).
    pub fn on_grace_over(&mut self, clock: Clock) -> Vec<ShardEvent> {
        if clock == self.clock && self.quorum().is_some_and(|q| self.contributions() >= q) {
            self.apply(None);
            self.release_deferred();
        }
        self.take_events()
    }

    /// Whether late contributions are folded into the open round.
    fn folds(&self) -> bool {
        self.cfg.rule == SyncRule::Hardsync && self.cfg.quorum.is_some_and(|q| q.late == LateRule::Fold)
    }

    /// The contributions that count towards the update: for hardsync, those on the current
    /// weights and those voided (folded ones ride along); otherwise every one held.
    fn contributions(&self) -> usize {
        match self.cfg.rule {
            SyncRule::Hardsync => {
                self.held.iter().filter(|h| h.computed_on == self.clock).count() + self.voided.len()
            }
            _ => self.held.len(),
        }
    }

    /// Whether the contributions held make an update.
    fn round_complete(&self) -> bool {
        self.contributions() >= self.gradients_per_update()
    }

    /// Hardsync with a quorum: q, or all the round waits for if fewer.
    fn quorum(&self) -> Option<usize> {
        let q = self.cfg.quorum.filter(|_| self.cfg.rule == SyncRule::Hardsync)?;
        let gone = self.learners.saturating_sub(self.active.len());
        Some((q.size as usize).saturating_sub(gone).clamp(1, self.gradients_per_update()))
    }

    /// Whether every active learner has had its last pull served.
    fn all_finished(&self) -> bool {
        self.active.iter().all(|l| self.finished.contains_key(l))
    }

    /// Hardsync: whether `learner` already took its turn in the open round.
    fn in_round(&self, learner: LearnerId) -> bool {
        self.held.iter().any(|h| h.learner == learner && h.computed_on == self.clock)
            || self.voided.contains(&learner)
    }

    /// The effects of the input just handled, in order; the open round's quorum is announced
    /// once, when first reached.
    fn take_events(&mut self) -> Vec<ShardEvent> {
        if let Some(q) = self.quorum() {
            let have = self.contributions();
            if have >= q && self.quorum_said != Some(self.clock) {
                self.quorum_said = Some(self.clock);
                let missing = self.gradients_per_update().saturating_sub(have);
                self.events.push(ShardEvent::Quorum { clock: self.clock, missing });
            }
        }
        std::mem::take(&mut self.events)
    }

    fn duplicate(&self, learner: LearnerId, seq: u64, what: &str) -> CoreError {
        CoreError::Duplicate(format!("{learner} {what} #{seq} at {}: a late or repeated copy", self.cfg.id))
    }

    fn check_member(&self, learner: LearnerId) -> Result<(), CoreError> {
        if self.active.contains(&learner) {
            Ok(())
        } else {
            Err(CoreError::Protocol(format!("{learner} is not an active learner of {}", self.cfg.id)))
        }
    }

    fn may_serve(&self, &Deferred { learner, seq, last }: &Deferred) -> bool {
        if self.outstanding.seq(learner).is_some_and(|s| s < seq) {
            return false;
        }
        if last {
            return true;
        }
        if self.cfg.rule == SyncRule::Hardsync && self.in_round(learner) {
            return false;
        }
        let Some(bound) = self.cfg.max_staleness else { return true };
        let Some(limit) = self.clock.0.checked_sub(bound) else { return true };
        !self.outstanding.owed_by_one_behind(learner, seq, Clock(limit))
    }

    fn serve(&mut self, learner: LearnerId, seq: u64) {
        // With prefetch the learner may compute its next gradient on the weights of its last
        // push rather than on these: the gate counts the older.
        let owed = self.used.get(&learner).map_or(self.clock, |&j| j.min(self.clock));
        self.outstanding.insert(learner, owed, seq);
        self.events.push(ShardEvent::Serve { learner, seq, weights: self.snapshot() });
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
                self.events.push(ShardEvent::Serve { learner: d.learner, seq: d.seq, weights });
                self.finished.insert(d.learner, d.seq);
                // A round may have waited only for this learner; and once every learner has
                // finished, what is held is applied rather than left out.
                if !(self.held.is_empty() && self.voided.is_empty())
                    && (self.round_complete() || self.all_finished())
                {
                    self.apply(None);
                }
            } else {
                // A learner that comes back as a new incarnation sends gradients again.
                self.finished.remove(&d.learner);
                self.serve(d.learner, d.seq);
            }
        }
    }

    /// Apply the held gradients: a hardsync round in learner order, or those summed in `acc`
    /// plus `last` (weight, gradient) when the update is triggered by a gradient that has not
    /// been accumulated.
    fn apply(&mut self, last: Option<(f32, &[f32])>) {
        self.voided.clear();
        let c = self.held.len();
        if c == 0 {
            // A hardsync round whose every gradient was dropped: the weights stay as they are.
            self.clock = self.clock.next();
            self.events.push(ShardEvent::Update(UpdateRecord {
                shard: self.cfg.id,
                clock: self.clock,
                gradients: 0,
                payload_in: 0,
            }));
            return;
        }
        let lr = self.held.last().map_or(0.0, |h| h.lr);
        let alpha_update = (!self.cfg.modulation.is_per_gradient())
            .then(|| self.cfg.modulation.alpha(lr, Staleness(0), self.stats.mean()));
        // Σ s_k is exactly c when every gradient is over μ examples.
        let shares: f32 = self.held.iter().map(|h| h.share).sum();
        let scale = -alpha_update.unwrap_or(1.0) / shares;
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
            self.events.push(ShardEvent::Gradient(GradientRecord {
                shard: self.cfg.id,
                learner: h.learner,
                computed_on: h.computed_on,
                staleness: h.staleness,
                outcome: Outcome::Applied { alpha: alpha_update.unwrap_or(h.alpha) },
            }));
        }
        self.clock = self.clock.next();
        self.events.push(ShardEvent::Update(UpdateRecord {
            shard: self.cfg.id,
            clock: self.clock,
            gradients: c,
            payload_in: 0,
        }));
    }
}
