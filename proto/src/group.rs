//! A learner group's round at its aggregator (`docs/src/algorithms.md` §4.2): each member's
//! push for one shard is held until every member still training has pushed; the round's
//! pushes then leave as one aggregate per weights clock among them, the mean over all their
//! examples (members that got the same weights share a clock, so it is usually one).

use std::collections::{BTreeMap, BTreeSet};

use crate::{Clock, Contribution, CoreError, LearnerId};

/// The pushes of one round that were computed on one clock: what one aggregate carries.
#[derive(Debug, PartialEq)]
pub struct Batch<T> {
    /// The clock they were computed on.
    pub computed_on: Clock,
    /// Whose, in learner order.
    pub members: Vec<Contribution>,
    /// Their values (and whatever the driver keeps with them), in the order of `members`.
    pub values: Vec<T>,
}

/// One group's open round for one shard.
#[derive(Debug)]
pub struct GroupRound<T> {
    /// The group's members.
    members: BTreeSet<LearnerId>,
    /// Those active in the run (a learner lost and back is active again) …
    active: BTreeSet<LearnerId>,
    /// … and those whose last push is in: each round waits for a push from every member
    /// active and not finished.
    finished: BTreeSet<LearnerId>,
    /// The pushes of the open round.
    held: BTreeMap<LearnerId, (Contribution, Clock, T)>,
    /// Each member's newest step sent on: an older or repeated push is not taken again.
    sent: BTreeMap<LearnerId, u64>,
}

impl<T> GroupRound<T> {
    /// The round of a group of `members`.
    #[must_use]
    pub fn new(members: impl IntoIterator<Item = LearnerId>) -> Self {
        let members: BTreeSet<LearnerId> = members.into_iter().collect();
        let (held, sent, finished) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
        Self { active: members.clone(), members, finished, held, sent }
    }

    /// A member's push. `Ok(None)` for a copy of a push already sent on (its driver forwards
    /// the pull it carries alone); the round's batches once it is complete. A push from a
    /// learner outside the group, or a second push of a member in one round, is refused.
    pub fn push(
        &mut self,
        c: Contribution,
        computed_on: Clock,
        value: T,
    ) -> Result<Option<Vec<Batch<T>>>, CoreError> {
        let l = c.learner;
        if !self.training(l) {
            return Err(CoreError::Protocol(format!(
                "{l} pushed to the aggregator of a group it is not training in"
            )));
        }
        if self.sent.get(&l).is_some_and(|&s| c.seq <= s)
            || self.held.get(&l).is_some_and(|h| h.0.seq == c.seq)
        {
            return Ok(None);
        }
        if self.held.contains_key(&l) {
            return Err(CoreError::Protocol(format!(
                "{l} pushed step {} before its group's round was sent",
                c.seq
            )));
        }
        self.held.insert(l, (c, computed_on, value));
        Ok(Some(self.take_if_complete()))
    }

    /// `learner`'s last push is in: no round waits for it. The open round's batches if that
    /// completes it.
    pub fn finish(&mut self, learner: LearnerId) -> Vec<Batch<T>> {
        self.finished.insert(learner);
        self.take_if_complete()
    }

    /// The run's active learners are `active`: no round waits for a member that is not.
    pub fn on_membership(&mut self, active: &BTreeSet<LearnerId>) -> Vec<Batch<T>> {
        self.active = self.members.intersection(active).copied().collect();
        self.take_if_complete()
    }

    fn training(&self, l: LearnerId) -> bool {
        self.active.contains(&l) && !self.finished.contains(&l)
    }

    /// The held pushes, by clock, if every member training has pushed (the held ones of
    /// members that left go too).
    fn take_if_complete(&mut self) -> Vec<Batch<T>> {
        let waiting = self.active.iter().any(|&l| self.training(l) && !self.held.contains_key(&l));
        if self.held.is_empty() || waiting {
            return Vec::new();
        }
        let mut by_clock: BTreeMap<Clock, Batch<T>> = BTreeMap::new();
        for (l, (c, computed_on, value)) in std::mem::take(&mut self.held) {
            self.sent.insert(l, c.seq);
            let batch = by_clock.entry(computed_on).or_insert_with(|| Batch {
                computed_on,
                members: Vec::new(),
                values: Vec::new(),
            });
            batch.members.push(c);
            batch.values.push(value);
        }
        by_clock.into_values().collect()
    }
}

/// The mean over all examples of gradients each the mean over its own (`Σ μ_k g_k / Σ μ_k`),
/// into `out`; the gradients must be as long as each other.
pub fn mean_over_examples<'a>(parts: impl IntoIterator<Item = (u32, &'a [f32])>, out: &mut Vec<f32>) {
    out.clear();
    let mut total = 0.0f32;
    for (examples, g) in parts {
        if out.is_empty() {
            out.resize(g.len(), 0.0);
        }
        let w = examples as f32;
        total += w;
        for (o, &v) in out.iter_mut().zip(g) {
            *o += w * v;
        }
    }
    if total > 0.0 {
        let inv = 1.0 / total;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(l: u32, seq: u64) -> Contribution {
        Contribution { learner: LearnerId(l), seq, examples: 4 }
    }

    #[test]
    fn a_round_leaves_once_every_member_training_pushed_one_batch_per_clock() {
        let mut r = GroupRound::new([LearnerId(0), LearnerId(1), LearnerId(2)]);
        assert_eq!(r.push(push(2, 1), Clock(3), 'c').unwrap(), Some(vec![]));
        assert_eq!(r.push(push(0, 1), Clock(4), 'a').unwrap(), Some(vec![]));
        // A copy of a held push is not taken twice; a second step before the round left is refused.
        assert_eq!(r.push(push(0, 1), Clock(4), 'x').unwrap(), None);
        assert!(r.push(push(0, 2), Clock(4), 'x').is_err());
        assert!(r.push(push(7, 1), Clock(4), 'x').is_err(), "not a member");
        let batches = r.push(push(1, 1), Clock(4), 'b').unwrap().unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!((batches[0].computed_on, batches[0].values.clone()), (Clock(3), vec!['c']));
        assert_eq!((batches[1].computed_on, batches[1].values.clone()), (Clock(4), vec!['a', 'b']));
        assert_eq!(batches[1].members, vec![push(0, 1), push(1, 1)]);
        // A late copy of a step already sent on is not taken again.
        assert_eq!(r.push(push(1, 1), Clock(4), 'y').unwrap(), None);
    }

    #[test]
    fn members_that_leave_are_not_waited_for() {
        let mut r = GroupRound::new([LearnerId(0), LearnerId(1)]);
        assert_eq!(r.push(push(0, 5), Clock(9), 1).unwrap(), Some(vec![]));
        let batches = r.finish(LearnerId(1));
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].members, vec![push(0, 5)]);
        // From now on each of the member's pushes leaves at once.
        assert_eq!(r.push(push(0, 6), Clock(10), 2).unwrap().unwrap().len(), 1);
        assert!(r.push(push(1, 1), Clock(10), 3).is_err(), "a member that left pushes no more");
        assert!(r.on_membership(&BTreeSet::new()).is_empty());
        // A member lost and back trains again.
        let mut r = GroupRound::new([LearnerId(0), LearnerId(1)]);
        assert!(r.on_membership(&[LearnerId(0)].into()).is_empty());
        assert_eq!(r.push(push(0, 1), Clock(0), 1).unwrap().unwrap().len(), 1, "not waiting for 1");
        assert!(r.on_membership(&[LearnerId(0), LearnerId(1)].into()).is_empty());
        assert_eq!(r.push(push(0, 2), Clock(1), 1).unwrap(), Some(vec![]), "waiting for 1 again");
    }

    #[test]
    fn the_mean_over_examples_weighs_every_example_the_same() {
        let mut out = Vec::new();
        mean_over_examples([(6, &[1.0, 2.0][..]), (2, &[5.0, -2.0][..])], &mut out);
        assert_eq!(out, vec![2.0, 1.0]);
    }
}
