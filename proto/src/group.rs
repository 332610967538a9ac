//! A learner group's round at its aggregator (`docs/src/algorithms.md` §4.2): each member's
//! push for one shard is held until every member still training has pushed; the round's
//! pushes then leave as one aggregate per weights clock among them, the mean over all their
//! examples (members that got the same weights share a clock, so it is usually one). A group
//! with rounds of its own (§4.3) sends the round on as one gradient of the group instead.

use std::collections::{BTreeMap, BTreeSet};

use rudra_compute::cpu;

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

impl<T> Batch<T> {
    /// The mean over all the members' examples of their gradients, each the mean over its
    /// own (`Σ_k μ_k g_k / Σ_k μ_k`), each seen in its value by `gradient`.
    #[must_use]
    pub fn mean<'a>(&'a self, gradient: impl Fn(&'a T) -> &'a [f32]) -> Vec<f32> {
        let mut mean = Vec::new();
        for (m, value) in self.members.iter().zip(&self.values) {
            let g = gradient(value);
            mean.resize(g.len(), 0.0);
            cpu::axpy(m.examples as f32, g, &mut mean);
        }
        let total: u64 = self.members.iter().map(|m| u64::from(m.examples)).sum();
        if total > 0 {
            cpu::scale(1.0 / total as f32, &mut mean);
        }
        mean
    }
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
    /// Each member's newest step sent on, and the clock it was computed on: an older or
    /// repeated push is not taken again.
    sent: BTreeMap<LearnerId, (u64, Clock)>,
    mode: Mode,
}

/// How a group's rounds are told apart and leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A round waits for a push from every member, so that a group's rounds keep step at
    /// every shard, and leaves as one aggregate per clock, every member counted at the shard.
    Aggregate,
    /// Hardsync: a round of pushes on clock j is the shard's round j, and does not wait for a
    /// member that sent one on j or later (one back from a failure joins the shard's round,
    /// which the others may have pushed to).
    ByClock,
    /// The group's own round (§4.3), n-softsync among its members: it leaves once it holds
    /// ⌊t/n⌋ (at least 1) pushes of the t members training, as one gradient of the group on
    /// the oldest clock among them (n = 1: every member, hardsync); a push is never sent on
    /// twice, and a member's later step takes the place of the one held.
    Own {
        /// n.
        n: u32,
    },
}

impl<T> GroupRound<T> {
    /// The round of a group of `members`.
    #[must_use]
    pub fn new(members: impl IntoIterator<Item = LearnerId>) -> Self {
        let members: BTreeSet<LearnerId> = members.into_iter().collect();
        let (held, sent, finished) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
        Self { active: members.clone(), members, finished, held, sent, mode: Mode::Aggregate }
    }

    /// Rounds are the shard's hardsync rounds, told by their clock.
    #[must_use]
    pub fn by_clock(mut self) -> Self {
        self.mode = Mode::ByClock;
        self
    }

    /// Rounds are the group's own (§4.3), n-softsync among its members (1: hardsync): each
    /// leaves as one batch, the group's gradient.
    #[must_use]
    pub fn own_rounds(mut self, n: u32) -> Self {
        self.mode = Mode::Own { n: n.max(1) };
        self
    }

    /// Whether a push of `learner` is held in the open round.
    #[must_use]
    pub fn holds(&self, learner: LearnerId) -> bool {
        self.held.contains_key(&learner)
    }

    /// Whether no member is training any more: each has finished or is not active.
    #[must_use]
    pub fn done(&self) -> bool {
        !self.active.iter().any(|&l| self.training(l))
    }

    /// A member's push: the round's batches once it is complete. `Ok(None)` for a copy of a
    /// push held (its driver forwards the pull it carries alone); a copy of one sent on goes
    /// again, alone. A later step of a member sends the one held on alone, and is held in its
    /// place. A push from a learner outside the group, or not training, is refused. In the
    /// group's own rounds a copy of one sent on is `Ok(None)` too, and the held one a later
    /// step replaces is dropped.
    pub fn push(
        &mut self,
        c: Contribution,
        computed_on: Clock,
        value: T,
    ) -> Result<Option<Vec<Batch<T>>>, CoreError> {
        let l = c.learner;
        let own = matches!(self.mode, Mode::Own { .. });
        if self.sent.get(&l).is_some_and(|&(s, _)| c.seq <= s) {
            if own {
                return Ok(None);
            }
            // Sent on before, and pushed again: the shard may have lost it (a restart from a
            // checkpoint). It goes again, alone; a shard that has it takes it once.
            return Ok(Some(vec![Batch { computed_on, members: vec![c], values: vec![value] }]));
        }
        if self.held.get(&l).is_some_and(|h| c.seq <= h.0.seq) {
            return Ok(None);
        }
        if !self.training(l) {
            return Err(CoreError::Protocol(format!(
                "{l} pushed to the aggregator of a group it is not training in"
            )));
        }
        // A member that moved on (its pull answered by a shard that lost the push it rode on,
        // or a new incarnation) sends the step held on at once, alone.
        let mut batches = Vec::new();
        if let Some((c, computed_on, value)) = self.held.insert(l, (c, computed_on, value))
            && !own
        {
            self.sent.insert(l, (c.seq, computed_on));
            batches.push(Batch { computed_on, members: vec![c], values: vec![value] });
        }
        batches.extend(self.take_if_complete());
        Ok(Some(batches))
    }

    /// `learner`'s last push is in: no round waits for it. The open round's batches if that
    /// completes it.
    pub fn finish(&mut self, learner: LearnerId) -> Vec<Batch<T>> {
        self.finished.insert(learner);
        self.take_if_complete()
    }

    /// The run's active learners are `active`: no round waits for a member that is not, and
    /// what one that is not had pushed is dropped (the shards would refuse it).
    pub fn on_membership(&mut self, active: &BTreeSet<LearnerId>) -> Vec<Batch<T>> {
        self.active = self.members.intersection(active).copied().collect();
        self.held.retain(|l, _| active.contains(l));
        self.take_if_complete()
    }

    fn training(&self, l: LearnerId) -> bool {
        self.active.contains(&l) && !self.finished.contains(&l)
    }

    /// The held pushes, by clock, once every member training has pushed in this round: its
    /// push is held (or, by clock, it sent one on a clock no older than the oldest held).
    fn take_if_complete(&mut self) -> Vec<Batch<T>> {
        let Some(oldest) = self.held.values().map(|h| h.1).min() else { return Vec::new() };
        let by_clock = self.mode == Mode::ByClock;
        let turn_taken = |l: &LearnerId| by_clock && self.sent.get(l).is_some_and(|&(_, j)| j >= oldest);
        let pushed = |l: &LearnerId| self.held.contains_key(l) || turn_taken(l);
        let training = || self.active.iter().filter(|&&l| self.training(l));
        let needed = match (self.mode, training().count()) {
            (Mode::Own { n }, t) if t > 0 => (t / n as usize).max(1),
            (_, t) => t,
        };
        if training().filter(|l| pushed(l)).count() < needed {
            return Vec::new();
        }
        let own = matches!(self.mode, Mode::Own { .. });
        let mut batches: BTreeMap<Clock, Batch<T>> = BTreeMap::new();
        for (l, (c, computed_on, value)) in std::mem::take(&mut self.held) {
            self.sent.insert(l, (c.seq, computed_on));
            let clock = if own { oldest } else { computed_on };
            let batch = batches.entry(clock).or_insert_with(|| Batch {
                computed_on: clock,
                members: Vec::new(),
                values: Vec::new(),
            });
            batch.members.push(c);
            batch.values.push(value);
        }
        batches.into_values().collect()
    }
}

/// The learners of each of `groups` groups of `learners`: contiguous runs of ids, of ⌊λ/G⌋ or
/// ⌈λ/G⌉ each.
#[must_use]
pub fn learner_groups(learners: u32, groups: u32) -> Vec<Vec<LearnerId>> {
    let (g, l) = (u64::from(groups.max(1)), u64::from(learners));
    (0..g).map(|k| ((k * l / g)..((k + 1) * l / g)).map(|i| LearnerId(i as u32)).collect()).collect()
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
        // A copy of a held push is not taken twice; a later step sends the held one on alone.
        assert_eq!(r.push(push(0, 1), Clock(4), 'x').unwrap(), None);
        let alone = r.push(push(0, 1 << 40), Clock(4), 'a').unwrap().unwrap();
        assert_eq!((alone.len(), alone[0].members.clone()), (1, vec![push(0, 1)]));
        assert!(r.push(push(7, 1), Clock(4), 'x').is_err(), "not a member");
        let batches = r.push(push(1, 1), Clock(4), 'b').unwrap().unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!((batches[0].computed_on, batches[0].values.clone()), (Clock(3), vec!['c']));
        assert_eq!((batches[1].computed_on, batches[1].values.clone()), (Clock(4), vec!['a', 'b']));
        assert_eq!(batches[1].members, vec![push(0, 1 << 40), push(1, 1)]);
        // A late copy of a step already sent on goes again, alone (the shard may have lost it).
        let again = r.push(push(1, 1), Clock(4), 'y').unwrap().unwrap();
        assert_eq!((again.len(), again[0].members.clone()), (1, vec![push(1, 1)]));
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
        // A member lost while its push is held: the push goes with it, and the round leaves
        // without it.
        assert_eq!(r.push(push(1, 2), Clock(1), 7).unwrap().unwrap().len(), 1);
        assert_eq!(r.push(push(1, 3), Clock(2), 7).unwrap(), Some(vec![]));
        let batches = r.on_membership(&[LearnerId(0)].into());
        assert!(batches.is_empty(), "nothing held but the lost member's: {batches:?}");
        assert_eq!(r.push(push(0, 3), Clock(2), 1).unwrap().unwrap()[0].members, vec![push(0, 3)]);
        // By clock (hardsync), a member back joins the round the others already sent theirs
        // to: it is not held for their next.
        let mut back = GroupRound::new([LearnerId(0), LearnerId(1)]).by_clock();
        back.on_membership(&[LearnerId(0)].into());
        assert_eq!(back.push(push(0, 1), Clock(3), 1).unwrap().unwrap().len(), 1);
        back.on_membership(&[LearnerId(0), LearnerId(1)].into());
        assert_eq!(
            back.push(push(1, 1 << 40), Clock(3), 2).unwrap().unwrap()[0].members,
            vec![push(1, 1 << 40)]
        );
        assert_eq!(back.push(push(1, (1 << 40) + 1), Clock(4), 2).unwrap(), Some(vec![]), "now in step");
        assert_eq!(back.push(push(0, 2), Clock(4), 1).unwrap().unwrap()[0].members.len(), 2);
    }

    #[test]
    fn a_group_s_own_round_leaves_as_one_batch_on_its_oldest_clock_and_nothing_goes_twice() {
        let mut r = GroupRound::new([LearnerId(0), LearnerId(1), LearnerId(2)]).own_rounds(1);
        assert_eq!(r.push(push(0, 1), Clock(3), 'a').unwrap(), Some(vec![]));
        // A member's later step takes the place of the one held; nothing leaves alone.
        assert_eq!(r.push(push(0, 2), Clock(4), 'b').unwrap(), Some(vec![]));
        assert_eq!(r.push(push(1, 1), Clock(4), 'c').unwrap(), Some(vec![]));
        assert!(!r.done());
        let batches = r.push(push(2, 1), Clock(5), 'd').unwrap().unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].computed_on, Clock(4));
        assert_eq!(batches[0].members, vec![push(0, 2), push(1, 1), push(2, 1)]);
        assert_eq!(batches[0].values, vec!['b', 'c', 'd']);
        // A copy of a step sent on is a copy: the group's gradient went once.
        assert_eq!(r.push(push(1, 1), Clock(4), 'x').unwrap(), None);
        assert!(r.finish(LearnerId(0)).is_empty() && r.finish(LearnerId(1)).is_empty());
        assert!(!r.done());
        assert_eq!(r.push(push(2, 2), Clock(6), 'e').unwrap().unwrap()[0].members, vec![push(2, 2)]);
        r.finish(LearnerId(2));
        assert!(r.done());
    }

    #[test]
    fn a_softsync_round_of_its_own_leaves_with_a_share_of_the_members() {
        // Four members, n = 2: a round leaves with ⌊4/2⌋ = 2 pushes; the others join the next.
        let mut r = GroupRound::new((0..4).map(LearnerId)).own_rounds(2);
        assert_eq!(r.push(push(3, 1), Clock(0), 'd').unwrap(), Some(vec![]));
        let batches = r.push(push(1, 1), Clock(0), 'b').unwrap().unwrap();
        assert_eq!(batches[0].members, vec![push(1, 1), push(3, 1)]);
        assert_eq!(r.push(push(0, 1), Clock(0), 'a').unwrap(), Some(vec![]));
        // With one of four finished, ⌊3/2⌋ = 1 push of those training is a round.
        assert_eq!(r.finish(LearnerId(1))[0].members, vec![push(0, 1)]);
        assert!(r.finish(LearnerId(3)).is_empty());
        assert_eq!(r.push(push(2, 1), Clock(0), 'c').unwrap().unwrap()[0].members, vec![push(2, 1)]);
    }

    #[test]
    fn the_mean_over_examples_weighs_every_example_the_same() {
        let member = |l, examples| Contribution { learner: LearnerId(l), seq: 1, examples };
        let batch = Batch {
            computed_on: Clock(0),
            members: vec![member(0, 6), member(1, 2)],
            values: vec![vec![1.0, 2.0], vec![5.0, -2.0]],
        };
        assert_eq!(batch.mean(|g| &g[..]), vec![2.0, 1.0]);
    }
}
