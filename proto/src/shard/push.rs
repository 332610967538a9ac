//! The SGD shard's pushes: one learner's gradient, or a learner group's aggregate of its
//! members' gradients on one clock (`docs/src/algorithms.md` §4.2), each member counted as if its
//! gradient had arrived alone.

use rudra_compute::cpu;

use super::{Held, SgdShard, SyncRule, broken};
use crate::{Clock, CoreError, DropReason, GradientRecord, LearnerId, Outcome, ShardEvent};

/// One learner's part of a pushed gradient: who computed it, at which of its steps, over how
/// many examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contribution {
    /// Who computed it.
    pub learner: LearnerId,
    /// The learner's step, so it is applied once however often it arrives.
    pub seq: u64,
    /// The examples it is the mean over.
    pub examples: u32,
}

impl SgdShard {
    /// A learner pushes its gradient of step `seq` over μ examples (the nominal minibatch);
    /// see [`Self::on_push_of`].
    pub fn on_push(
        &mut self,
        learner: LearnerId,
        seq: u64,
        computed_on: Clock,
        grad: &[f32],
    ) -> Result<Vec<ShardEvent>, CoreError> {
        self.on_push_of(learner, seq, computed_on, (grad, self.cfg.batch))
    }

    /// A learner pushes its gradient of step `seq` for this shard's range, the mean over
    /// `examples` examples, computed on weights `computed_on`. A push that is malformed or
    /// comes from the future is rejected and changes nothing; a copy of a push already
    /// accepted is [`CoreError::Duplicate`], applied once.
    pub fn on_push_of(
        &mut self,
        learner: LearnerId,
        seq: u64,
        computed_on: Clock,
        (grad, examples): (&[f32], u32),
    ) -> Result<Vec<ShardEvent>, CoreError> {
        self.on_aggregate(&[Contribution { learner, seq, examples }], computed_on, grad)
    }

    /// A learner group's aggregate: the mean over all the examples of `members`' gradients,
    /// every one computed on `computed_on` (`ḡ = Σ_k μ_k g_k / Σ_k μ_k`). The members are taken
    /// one after another, in order, each as if its own push of ḡ had arrived then: its step,
    /// its staleness at its turn, its α(σ) and share, its record, one of the `c` gradients of
    /// an update. A malformed aggregate is refused whole, changing nothing; a member that could
    /// not push alone is left out (one no longer active is recorded as lapsed), and the
    /// aggregate is refused only if no member is left.
    pub fn on_aggregate(
        &mut self,
        members: &[Contribution],
        computed_on: Clock,
        grad: &[f32],
    ) -> Result<Vec<ShardEvent>, CoreError> {
        self.check_push(members, computed_on, grad)?;
        let (mut refused, mut gone, mut taken) = (None, Vec::new(), 0);
        for &member in members {
            match self.admit(member, computed_on) {
                Ok(()) => {
                    self.take(member, computed_on, grad);
                    taken += 1;
                }
                Err(e) => {
                    if !self.active.contains(&member.learner) {
                        gone.push(member.learner);
                    }
                    refused.get_or_insert(e);
                }
            }
        }
        if let (0, Some(e)) = (taken, refused) {
            return Err(e);
        }
        for learner in gone {
            self.lapsed(learner, computed_on);
        }
        // A new clock, the oldest outstanding gradient, or this learner's own push may each
        // open the gate for a deferred pull.
        self.release_deferred();
        Ok(self.take_events())
    }

    /// Record the gradient of `learner`, no longer active, as lapsed.
    fn lapsed(&mut self, learner: LearnerId, computed_on: Clock) {
        let staleness = self.clock.staleness_of(computed_on).unwrap_or_default();
        self.stats.record_dropped(DropReason::Lapsed);
        let outcome = Outcome::Dropped(DropReason::Lapsed);
        let record = GradientRecord { shard: self.cfg.id, learner, computed_on, staleness, outcome };
        self.events.push(ShardEvent::Gradient(record));
    }

    /// Take one learner's checked push of `grad`, computed on `computed_on`: held, applied
    /// when it completes an update, or dropped with its reason.
    fn take(
        &mut self,
        Contribution { learner, seq, examples }: Contribution,
        computed_on: Clock,
        grad: &[f32],
    ) {
        let folded = self.folds() && computed_on < self.clock;
        if self.outstanding.seq(learner).is_some_and(|s| s <= seq) {
            self.outstanding.remove(learner);
        }
        self.last_pushed.entry(learner).or_default().insert(seq);
        if self.cfg.prefetch > 0 {
            self.used.insert(learner, computed_on.min(self.clock));
        }
        let lr = self.learning_rate();
        self.received += 1;
        let staleness = self.clock.staleness_of(computed_on).unwrap_or_default();
        let drop = match (self.cfg.rule, self.cfg.max_staleness) {
            _ if !cpu::all_finite(grad) => Some(DropReason::NonFinite),
            _ if computed_on > self.clock => Some(DropReason::RolledBack),
            _ if self.removed_at.get(&learner).is_some_and(|&c| computed_on < c) => Some(DropReason::Lapsed),
            (SyncRule::Hardsync, _) if staleness.0 > 0 && !folded => Some(DropReason::StaleRound),
            (_, Some(bound)) if staleness.0 > bound => Some(DropReason::TooStale),
            _ => None,
        };
        if let Some(reason) = drop {
            self.stats.record_dropped(reason);
            self.events.push(ShardEvent::Gradient(GradientRecord {
                shard: self.cfg.id,
                learner,
                computed_on,
                staleness,
                outcome: Outcome::Dropped(reason),
            }));
            // A hardsync round does not wait for a gradient that can never be applied.
            if reason == DropReason::NonFinite
                && self.cfg.rule == SyncRule::Hardsync
                && computed_on == self.clock
            {
                self.voided.insert(learner);
                if self.round_complete() {
                    self.apply(None);
                }
            }
            return;
        }
        self.stats.record_applied(staleness);
        let alpha = self.cfg.modulation.alpha(lr, staleness, self.stats.mean());
        let share = examples as f32 / self.cfg.batch.max(1) as f32;
        let weight = (if self.cfg.modulation.is_per_gradient() { alpha } else { 1.0 }) * share;
        self.held.push(Held { learner, computed_on, staleness, alpha, lr, share });
        // A push overtaken by its learner's last pull is applied rather than left held.
        let complete = self.round_complete() || self.all_finished();
        if self.cfg.rule == SyncRule::Hardsync {
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(grad);
            self.round.insert((learner, computed_on), (weight, buf));
            if complete {
                self.apply(None);
            }
        } else if complete {
            self.apply(Some((weight, grad)));
        } else {
            cpu::axpy(weight, grad, &mut self.acc);
        }
    }

    /// Whether `members` may push `grad` on `computed_on` as a message: at least one, each
    /// once, over 1 to μλ examples (all of them together too), the values as long as the
    /// range, from no clock after this shard's.
    fn check_push(
        &self,
        members: &[Contribution],
        computed_on: Clock,
        grad: &[f32],
    ) -> Result<(), CoreError> {
        let id = self.cfg.id;
        let most = self.cfg.batch.saturating_mul(self.learners.max(1) as u32); // μλ at the start
        let total = members.iter().map(|m| u64::from(m.examples)).sum::<u64>();
        let Some(first) = members.first().map(|m| m.learner) else {
            return Err(CoreError::Protocol(format!("a push to {id} from no learner")));
        };
        if total > u64::from(most) {
            let n = members.len();
            return Err(CoreError::Protocol(format!(
                "a push to {id} of {n} learners' gradients over {total} examples; at most {most}"
            )));
        }
        for (k, &Contribution { learner, examples, .. }) in members.iter().enumerate() {
            if members[..k].iter().any(|m| m.learner == learner) {
                return Err(CoreError::Protocol(format!(
                    "{learner} is twice in one aggregate pushed to {id}"
                )));
            }
            if examples == 0 || examples > most {
                let why =
                    format!("{learner} pushed a gradient over {examples} examples to {id}; at most {most}");
                return Err(CoreError::Protocol(why));
            }
        }
        if grad.len() != self.params.len() {
            let (n, holds) = (grad.len(), self.params.len());
            return Err(CoreError::Protocol(format!(
                "{first} pushed {n} gradient values to {id}, which holds {holds}"
            )));
        }
        if computed_on > self.clock && !self.restored {
            return Err(CoreError::Protocol(format!(
                "{first} pushed a gradient on clock {computed_on} to {id}, which is at {}",
                self.clock
            )));
        }
        Ok(())
    }

    /// Whether `learner` may push its step `seq` now: an active learner, a step not taken
    /// before, and for hardsync not twice in the open round.
    fn admit(
        &self,
        Contribution { learner, seq, .. }: Contribution,
        computed_on: Clock,
    ) -> Result<(), CoreError> {
        self.check_member(learner)?;
        if self.window(learner).contains(seq) && !broken::accepts_duplicates() {
            return Err(self.duplicate(learner, seq, "push"));
        }
        // A gradient on weights a restart lost is no part of the open round: it is dropped as
        // rolled back, not refused as a second turn; nor is a late one folded in.
        let folded = self.folds() && computed_on < self.clock;
        if self.cfg.rule == SyncRule::Hardsync
            && self.in_round(learner)
            && computed_on <= self.clock
            && !folded
        {
            return Err(self.duplicate(learner, seq, "push in a round it already pushed to"));
        }
        Ok(())
    }
}
