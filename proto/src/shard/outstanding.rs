//! The gradients a shard is waiting for, and the staleness gate's question over them.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Clock, LearnerId};

/// Gradients a shard is waiting for: the clock each learner was first served for its step
/// (with that step's sequence number), and how many were served each clock, so the oldest is
/// found without a scan.
#[derive(Debug, Default)]
pub(super) struct Outstanding {
    by_learner: BTreeMap<LearnerId, (Clock, u64)>,
    by_clock: BTreeMap<Clock, usize>,
}

impl Outstanding {
    pub(super) fn get(&self, learner: LearnerId) -> Option<Clock> {
        self.by_learner.get(&learner).map(|&(clock, _)| clock)
    }

    pub(super) fn seq(&self, learner: LearnerId) -> Option<u64> {
        self.by_learner.get(&learner).map(|&(_, seq)| seq)
    }

    pub(super) fn insert(&mut self, learner: LearnerId, clock: Clock, seq: u64) {
        self.remove(learner);
        self.by_learner.insert(learner, (clock, seq));
        *self.by_clock.entry(clock).or_default() += 1;
    }

    pub(super) fn remove(&mut self, learner: LearnerId) {
        let Some((clock, _)) = self.by_learner.remove(&learner) else { return };
        if let Some(n) = self.by_clock.get_mut(&clock) {
            *n -= 1;
            if *n == 0 {
                self.by_clock.remove(&clock);
            }
        }
    }

    pub(super) fn retain(&mut self, active: &BTreeSet<LearnerId>) {
        let gone: Vec<LearnerId> = self.by_learner.keys().filter(|l| !active.contains(l)).copied().collect();
        for l in gone {
            self.remove(l);
        }
    }

    /// Whether a learner other than `learner` still owes a gradient on weights at or before
    /// `limit`, and is behind `learner` asking for its step `seq` (by step number, then id).
    /// Only a learner behind may hold another back, so no two learners ever wait for each
    /// other, whatever the shards: the one furthest behind is never held back.
    pub(super) fn owed_by_one_behind(&self, learner: LearnerId, seq: u64, limit: Clock) -> bool {
        self.oldest_except(learner).is_some_and(|j| j <= limit)
            && (self.by_learner.iter())
                .any(|(&m, &(j, s))| m != learner && j <= limit && (s, m) < (seq, learner))
    }

    /// The oldest clock served to a learner other than `learner`.
    pub(super) fn oldest_except(&self, learner: LearnerId) -> Option<Clock> {
        let own = self.get(learner);
        self.by_clock.iter().find(|&(c, n)| Some(*c) != own || *n > 1).map(|(c, _)| *c)
    }
}
