//! The scheduler's core: waits for the configured shards and learners, starts the run, turns
//! learner progress into epochs (evaluation points), and stops the
//! run once every learner has finished.

use std::collections::BTreeSet;

use rudra_transport::{LearnerId, ShardId};
use serde::{Deserialize, Serialize};

/// Base learning rate and its per-epoch decay: `α0(e) = base · decay^e`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Learning rate of epoch 0.
    pub base: f32,
    /// Multiplier applied at every epoch boundary (1 keeps the rate constant).
    pub decay: f32,
}

impl LrSchedule {
    /// The base rate for `epoch`.
    #[must_use]
    pub fn rate(&self, epoch: u64) -> f32 {
        self.base * self.decay.powi(i32::try_from(epoch).unwrap_or(i32::MAX))
    }
}

/// An effect of the scheduler core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SchedulerEvent {
    /// Everyone has joined: start the learners.
    Start,
    /// Evaluate the model: an epoch ended (`final_ = false`) or the run did.
    Evaluate {
        /// Whole epochs completed.
        epoch: u64,
        /// Whether this is the last evaluation of the run.
        final_: bool,
    },
    /// Tell every node to stop.
    Stop,
}

/// The scheduler's state.
#[derive(Clone, Debug)]
pub struct SchedulerCore {
    learners: u32,
    shards: u32,
    joined_learners: BTreeSet<LearnerId>,
    joined_shards: BTreeSet<ShardId>,
    finished: BTreeSet<LearnerId>,
    examples_per_epoch: u64,
    epochs_total: u64,
    evals_per_epoch: u64,
    samples: u64,
    /// Evaluation points passed.
    evals: u64,
    started: bool,
}

impl SchedulerCore {
    /// A scheduler expecting `learners` and `shards` for a run of `epochs_total` epochs of
    /// `examples_per_epoch` samples each, across all learners.
    #[must_use]
    pub fn new(learners: u32, shards: u32, examples_per_epoch: u64, epochs_total: u64) -> Self {
        Self {
            learners,
            shards,
            joined_learners: BTreeSet::new(),
            joined_shards: BTreeSet::new(),
            finished: BTreeSet::new(),
            examples_per_epoch: examples_per_epoch.max(1),
            epochs_total,
            evals_per_epoch: 1,
            samples: 0,
            evals: 0,
            started: false,
        }
    }

    /// Evaluate `k` times per epoch (at equal sample counts) instead of once.
    #[must_use]
    pub fn with_evals_per_epoch(mut self, k: u64) -> Self {
        self.evals_per_epoch = k.max(1);
        self
    }

    /// The learners that joined.
    #[must_use]
    pub fn active_learners(&self) -> &BTreeSet<LearnerId> {
        &self.joined_learners
    }

    /// Learners that joined and have not finished.
    #[must_use]
    pub fn learners_alive(&self) -> usize {
        self.joined_learners.difference(&self.finished).count()
    }

    /// Samples processed so far, over all learners.
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Epochs so far, fractional.
    #[must_use]
    pub fn epochs(&self) -> f64 {
        self.samples as f64 / self.examples_per_epoch as f64
    }

    /// A shard joined.
    #[must_use]
    pub fn on_shard_joined(&mut self, shard: ShardId) -> Vec<SchedulerEvent> {
        self.joined_shards.insert(shard);
        self.maybe_start()
    }

    /// A learner joined.
    #[must_use]
    pub fn on_learner_joined(&mut self, learner: LearnerId) -> Vec<SchedulerEvent> {
        self.joined_learners.insert(learner);
        self.maybe_start()
    }

    fn maybe_start(&mut self) -> Vec<SchedulerEvent> {
        let all = self.joined_learners.len() as u32 >= self.learners
            && self.joined_shards.len() as u32 >= self.shards;
        if self.started || !all {
            return Vec::new();
        }
        self.started = true;
        vec![SchedulerEvent::Start]
    }

    /// A learner processed `samples` more examples. Every evaluation point (each epoch
    /// boundary, or each `1/k` of an epoch) but the last, which the final evaluation covers,
    /// asks for an evaluation.
    #[must_use]
    pub fn on_progress(&mut self, samples: u64) -> Vec<SchedulerEvent> {
        self.samples += samples;
        let k = self.evals_per_epoch;
        let per_eval = (self.examples_per_epoch / k).max(1);
        let point = (self.samples / per_eval).min((self.epochs_total * k).saturating_sub(1));
        let mut events = Vec::new();
        while self.evals < point {
            self.evals += 1;
            events.push(SchedulerEvent::Evaluate { epoch: self.evals / k, final_: false });
        }
        events
    }

    /// A learner finished all its steps. Once every learner has, the run ends.
    #[must_use]
    pub fn on_learner_finished(&mut self, learner: LearnerId) -> Vec<SchedulerEvent> {
        let fresh = self.finished.insert(learner);
        if fresh && self.finished.len() == self.joined_learners.len() {
            let epoch = self.evals / self.evals_per_epoch;
            vec![SchedulerEvent::Evaluate { epoch, final_: true }, SchedulerEvent::Stop]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_when_all_joined_schedules_epochs_and_stops() {
        let mut s = SchedulerCore::new(2, 1, 100, 3);
        assert!(s.on_learner_joined(LearnerId(0)).is_empty());
        assert!(s.on_shard_joined(ShardId(0)).is_empty());
        assert_eq!(s.on_learner_joined(LearnerId(1)), vec![SchedulerEvent::Start]);
        assert!(s.on_learner_joined(LearnerId(1)).is_empty(), "starts once");
        assert_eq!(s.learners_alive(), 2);
        assert!(s.on_progress(99).is_empty());
        assert_eq!(
            s.on_progress(102),
            vec![
                SchedulerEvent::Evaluate { epoch: 1, final_: false },
                SchedulerEvent::Evaluate { epoch: 2, final_: false },
            ]
        );
        assert!(s.on_progress(100).is_empty(), "the last boundary is left to the final evaluation");
        assert!(s.on_learner_finished(LearnerId(0)).is_empty());
        assert!(s.on_learner_finished(LearnerId(0)).is_empty(), "finishing twice counts once");
        assert_eq!(
            s.on_learner_finished(LearnerId(1)),
            vec![SchedulerEvent::Evaluate { epoch: 2, final_: true }, SchedulerEvent::Stop]
        );
    }

    #[test]
    fn evaluates_k_times_per_epoch() {
        let mut s = SchedulerCore::new(1, 1, 100, 2).with_evals_per_epoch(4);
        let points: Vec<u64> = (0..10)
            .flat_map(|_| s.on_progress(25))
            .map(|e| match e {
                SchedulerEvent::Evaluate { epoch, final_: false } => epoch,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(points, vec![0, 0, 0, 1, 1, 1, 1], "7 points; the 8th is the final evaluation");
    }
}
