//! Goodput (`docs/src/algorithms.md` §4.4): how much of the learners' time went into
//! contributions the shards applied. Each learner's compute time and waiting time, the share of
//! its contributions applied, and over all learners the compute time that ended in applied
//! contributions divided by their time in the run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use rudra_transport::LearnerId;

/// One learner's contributions the shards applied and dropped (a step counts once per shard
/// it reached).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnerCounts {
    /// The learner.
    pub learner: LearnerId,
    /// Applied.
    pub applied: u64,
    /// Dropped.
    pub dropped: u64,
}

/// One learner's time over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnerTime {
    /// Seconds it spent computing gradients (injected slowness included).
    pub compute_seconds: f64,
    /// Its other seconds between the run's start and its end, or its leaving: waiting for
    /// weights, for the network, for its turn.
    pub wait_seconds: f64,
    /// Its contributions the shards applied (a step counts once per shard it reached).
    pub applied: u64,
    /// Its contributions the shards dropped.
    pub dropped: u64,
    /// Of its compute seconds, those that never reached a shard: computed before it left
    /// and not sent (measured by the simulator's churn; 0 elsewhere).
    #[serde(default)]
    pub lost_seconds: f64,
}

impl LearnerTime {
    /// Its seconds computing and the rest, as a row of `metrics.csv` keeps them.
    #[must_use]
    pub fn seconds(&self) -> LearnerSeconds {
        LearnerSeconds { compute: self.compute_seconds, wait: self.wait_seconds }
    }

    /// Its compute seconds that ended in applied contributions: its compute time that reached
    /// a shard, in the share of its contributions the shards applied.
    #[must_use]
    pub fn useful_seconds(&self) -> f64 {
        match self.applied + self.dropped {
            0 => 0.0,
            n => (self.compute_seconds - self.lost_seconds).max(0.0) * self.applied as f64 / n as f64,
        }
    }
}

/// One learner's seconds in the run so far: computing gradients, and the rest (waiting for
/// weights, for the network, for its turn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnerSeconds {
    /// Computing.
    pub compute: f64,
    /// The rest.
    pub wait: f64,
}

/// The compute seconds of `learners` that ended in applied contributions over all their
/// seconds in the run; NaN when they had none.
#[must_use]
pub fn goodput(learners: &[LearnerTime]) -> f64 {
    let time: f64 = learners.iter().map(|l| l.compute_seconds + l.wait_seconds).sum();
    if time > 0.0 { learners.iter().map(LearnerTime::useful_seconds).sum::<f64>() / time } else { f64::NAN }
}

/// What the scheduler hears of each learner's time: the compute seconds it reports, and when
/// it finished or left (seconds since the start).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnerClocks {
    compute: Vec<f64>,
    ended: Vec<Option<f64>>,
}

impl LearnerClocks {
    /// The clocks of `learners` learners.
    #[must_use]
    pub fn new(learners: usize) -> Self {
        Self { compute: vec![0.0; learners], ended: vec![None; learners] }
    }

    /// Learner `l` computed for `seconds` more.
    pub fn computed(&mut self, l: LearnerId, seconds: f64) {
        if let Some(c) = self.compute.get_mut(l.index()) {
            *c += seconds.max(0.0);
        }
    }

    /// Learner `l` finished or left at `at`, unless it had already.
    pub fn ended(&mut self, l: LearnerId, at: f64) {
        if let Some(e) = self.ended.get_mut(l.index()) {
            e.get_or_insert(at);
        }
    }

    /// Learner `l` is back: its time runs on.
    pub fn back(&mut self, l: LearnerId) {
        if let Some(e) = self.ended.get_mut(l.index()) {
            *e = None;
        }
    }

    /// Each learner's time at `now` (seconds since the start), with the contributions the
    /// shards applied and dropped of it, `counts`.
    #[must_use]
    pub fn times(&self, now: f64, counts: &[LearnerCounts]) -> Vec<LearnerTime> {
        let by_learner: BTreeMap<usize, (u64, u64)> =
            counts.iter().map(|c| (c.learner.index(), (c.applied, c.dropped))).collect();
        (self.compute.iter().zip(&self.ended).enumerate())
            .map(|(l, (&compute_seconds, ended))| {
                let (applied, dropped) = by_learner.get(&l).copied().unwrap_or_default();
                let wall = ended.unwrap_or(now).min(now);
                LearnerTime {
                    compute_seconds,
                    wait_seconds: (wall - compute_seconds).max(0.0),
                    applied,
                    dropped,
                    lost_seconds: 0.0,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodput_is_the_applied_share_of_compute_over_all_the_learners_time() {
        let mut clocks = LearnerClocks::new(3);
        clocks.computed(LearnerId(0), 6.0);
        clocks.computed(LearnerId(1), 2.0);
        clocks.computed(LearnerId(1), 2.0);
        clocks.computed(LearnerId(9), 100.0);
        clocks.ended(LearnerId(1), 5.0);
        clocks.ended(LearnerId(1), 7.0);
        clocks.ended(LearnerId(2), 1.0);
        clocks.back(LearnerId(2));
        let counts = [
            LearnerCounts { learner: LearnerId(0), applied: 3, dropped: 1 },
            LearnerCounts { learner: LearnerId(1), applied: 8, dropped: 0 },
        ];
        let times = clocks.times(10.0, &counts);
        let time = |compute_seconds, wait_seconds, applied, dropped| LearnerTime {
            compute_seconds,
            wait_seconds,
            applied,
            dropped,
            lost_seconds: 0.0,
        };
        // Learner 1 left at 5 s (the first time it was said); learner 2 came back and never
        // computed: ten seconds of waiting.
        assert_eq!(times, [time(6.0, 4.0, 3, 1), time(4.0, 1.0, 8, 0), time(0.0, 10.0, 0, 0)]);
        // (6 · 3/4 + 4) / (10 + 5 + 10)
        assert_eq!(goodput(&times), 8.5 / 25.0);
        assert!(goodput(&[]).is_nan());
    }
}
