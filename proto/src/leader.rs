//! A learner group with rounds of its own in front of one shard (hierarchical rounds,
//! `docs/src/algorithms.md` §4.3). To its members it stands where the shard would: it holds
//! each member's push until every member still training has pushed ([`GroupRound`]) and
//! answers the members' pulls with the weights of the group's last round, all the same. To the
//! shard it is one learner, the group's first member: each round is one gradient of the group,
//! and the shard's answer goes on to every member waiting for it.
//!
//! The core keeps no values: `T` is what its driver holds with a member's push (the gradient),
//! `P` how it answers a member's pull (a reply address); the weights themselves stay with the
//! driver.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::{Batch, Clock, Contribution, CoreError, GroupRound, LearnerId};

/// A member's pull: its step, and how its driver answers it.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberPull<P> {
    /// The member.
    pub learner: LearnerId,
    /// The step it is for.
    pub seq: u64,
    /// The member has pushed its last gradient.
    pub last: bool,
    /// Where the answer goes.
    pub reply: P,
}

/// An effect of a group's core.
#[derive(Debug, PartialEq)]
pub enum LeaderEvent<T, P> {
    /// Push the round's mean over all its examples to the shard as the group's step `seq`,
    /// with the group's next pull (step `seq + 1`, its last if `last`) riding on it.
    Push {
        /// The group's step.
        seq: u64,
        /// The round: its members and what the driver holds of their pushes.
        batch: Batch<T>,
        /// Every member has finished: the pull riding on this push is the group's last.
        last: bool,
    },
    /// Pull alone as the group: its first pull, or its last once every member has finished.
    Pull {
        /// The step it is for.
        seq: u64,
        /// The group's last.
        last: bool,
    },
    /// Send the unanswered push again: a member retried its own, so the group's may be lost.
    Resend,
    /// Answer a member's pull `seq` with the group's weights now held.
    Serve {
        /// The step the member asked for.
        seq: u64,
        /// Where the answer goes.
        reply: P,
    },
}

/// One group's rounds in front of one shard.
#[derive(Debug)]
pub struct GroupLeader<T, P> {
    leader: LearnerId,
    round: GroupRound<T>,
    /// Each member's newest pull not answered yet, and the group's answer it waits for: the
    /// one to the group's push that carries the member's own push, or any.
    waiting: BTreeMap<LearnerId, (MemberPull<P>, u64)>,
    /// Rounds closed while a push of the group was unanswered, with their steps: each goes
    /// once the one before is answered, so the group has one push on its way at a time.
    ready: VecDeque<(u64, Batch<T>)>,
    /// Rounds closed so far: round k is the group's step k.
    closed: u64,
    /// The group's pushes sent so far: its next pull is step `pushed + 1`.
    pushed: u64,
    /// The newest answer of the shard to a pull of the group (0 before any).
    answered: u64,
    /// Each member's newest push, by the group's step it went out in.
    step_of: BTreeMap<LearnerId, u64>,
    /// The group's first pull is sent.
    asked: bool,
    /// The group's last pull is sent: every member has finished.
    finished: bool,
    events: Vec<LeaderEvent<T, P>>,
}

impl<T, P> GroupLeader<T, P> {
    /// The rounds of the group of `members`, named to the shard by `leader`, its first,
    /// n-softsync among them (1: hardsync).
    #[must_use]
    pub fn new(leader: LearnerId, members: impl IntoIterator<Item = LearnerId>, n: u32) -> Self {
        Self {
            leader,
            round: GroupRound::new(members).own_rounds(n),
            waiting: BTreeMap::new(),
            ready: VecDeque::new(),
            closed: 0,
            pushed: 0,
            answered: 0,
            step_of: BTreeMap::new(),
            asked: false,
            finished: false,
            events: Vec::new(),
        }
    }

    /// Whom the shard serves for the group.
    #[must_use]
    pub fn leader(&self) -> LearnerId {
        self.leader
    }

    /// A member's push of step `c.seq`, computed on `computed_on`, with its next pull riding
    /// on it. A push that cannot be taken (from outside the group, of a member not training)
    /// is refused with the reason, and the pull is still answered.
    pub fn on_push(
        &mut self,
        c: Contribution,
        computed_on: Clock,
        value: T,
        then: MemberPull<P>,
    ) -> (Vec<LeaderEvent<T, P>>, Option<CoreError>) {
        let learner = c.learner;
        let (mut rounds, refused) = match self.round.push(c, computed_on, value) {
            Ok(Some(rounds)) => (rounds, None),
            // A copy: the member retries, and so does the group if its answer is missing.
            Ok(None) => {
                if self.answered <= self.pushed && self.pushed > 0 {
                    self.events.push(LeaderEvent::Resend);
                }
                (Vec::new(), None)
            }
            Err(e) => (Vec::new(), Some(e)),
        };
        if then.last {
            rounds.extend(self.round.finish(learner));
        }
        self.close(rounds);
        self.answer(then);
        (std::mem::take(&mut self.events), refused)
    }

    /// A member's pull alone: its first, a retry, or the last of a member with no step left.
    pub fn on_pull(&mut self, pull: MemberPull<P>) -> Vec<LeaderEvent<T, P>> {
        let rounds = if pull.last { self.round.finish(pull.learner) } else { Vec::new() };
        self.close(rounds);
        self.answer(pull);
        std::mem::take(&mut self.events)
    }

    /// The shard's answer to the group's pull `seq`: the driver holds the weights it brought,
    /// unless it is no newer than one already taken ([`CoreError::Duplicate`]); every member
    /// waiting for it is served them, and the next round ready goes.
    pub fn on_weights(&mut self, seq: u64) -> Result<Vec<LeaderEvent<T, P>>, CoreError> {
        if seq <= self.answered {
            return Err(CoreError::Duplicate(format!(
                "{}'s group got weights #{seq} again (answered #{})",
                self.leader, self.answered
            )));
        }
        self.answered = seq;
        let (now, later) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(_, (_, need))| *need <= seq);
        self.waiting = later;
        let now: BTreeMap<_, _> = now;
        self.events.extend(now.into_values().map(|(p, _)| LeaderEvent::Serve { seq: p.seq, reply: p.reply }));
        self.go_on();
        Ok(std::mem::take(&mut self.events))
    }

    /// The run's active learners are `active`: no round waits for a member that is not.
    pub fn on_membership(&mut self, active: &BTreeSet<LearnerId>) -> Vec<LeaderEvent<T, P>> {
        self.waiting.retain(|l, _| active.contains(l));
        let rounds = self.round.on_membership(active);
        self.close(rounds);
        std::mem::take(&mut self.events)
    }

    /// Answer `pull` now with the group's weights when they are the answer it waits for, else
    /// when that answer comes: the answer to the group's push that carries the member's own,
    /// or, of a member with a push in the open round, to the push of that round. The group's
    /// first pull goes with the first member's.
    fn answer(&mut self, pull: MemberPull<P>) {
        if !self.asked {
            self.asked = true;
            self.events.push(LeaderEvent::Pull { seq: 1, last: false });
        }
        let l = pull.learner;
        let need = match self.round.holds(l) {
            true => self.closed + 2,
            false => self.step_of.get(&l).map_or(1, |k| k + 1),
        };
        if self.answered >= need {
            self.events.push(LeaderEvent::Serve { seq: pull.seq, reply: pull.reply });
        } else if self.waiting.get(&l).is_none_or(|(p, _)| p.seq <= pull.seq) {
            self.waiting.insert(l, (pull, need));
        }
    }

    /// Number the rounds just closed as the group's next steps, and send what may go.
    fn close(&mut self, rounds: Vec<Batch<T>>) {
        for batch in rounds {
            self.closed += 1;
            for m in &batch.members {
                self.step_of.insert(m.learner, self.closed);
            }
            self.ready.push_back((self.closed, batch));
        }
        self.go_on();
    }

    /// Push the next round ready as the group's gradient once its push before is answered,
    /// and pull for the last time once every member has finished and every round has gone.
    fn go_on(&mut self) {
        if self.finished || (self.pushed > 0 && self.answered <= self.pushed) {
            return;
        }
        if let Some((seq, batch)) = self.ready.pop_front() {
            self.pushed = seq;
            self.finished = self.ready.is_empty() && self.round.done();
            self.events.push(LeaderEvent::Push { seq, batch, last: self.finished });
        } else if self.round.done() {
            self.finished = true;
            self.events.push(LeaderEvent::Pull { seq: self.pushed + 1, last: true });
        }
    }
}

/// Groups with rounds of their own as the shards see them, each named by its first member
/// (none: every learner stands for itself).
#[derive(Clone, Debug, Default)]
pub struct LeaderGroups(BTreeMap<LearnerId, Vec<LearnerId>>);

impl LeaderGroups {
    /// `groups` with rounds of their own, if any.
    #[must_use]
    pub fn of(groups: Option<Vec<Vec<LearnerId>>>) -> Self {
        Self(groups.into_iter().flatten().filter_map(|g| Some((*g.first()?, g))).collect())
    }

    /// Those a shard's record naming `learner` counts for: its group's members.
    #[must_use]
    pub fn members<'a>(&'a self, learner: &'a LearnerId) -> &'a [LearnerId] {
        self.0.get(learner).map_or(std::slice::from_ref(learner), Vec::as_slice)
    }

    /// Whom a shard serves while the learners in `active` are active: each group with an
    /// active member, by its first.
    #[must_use]
    pub fn served(&self, active: &BTreeSet<LearnerId>) -> BTreeSet<LearnerId> {
        if self.0.is_empty() {
            return active.clone();
        }
        let any_active = |members: &Vec<LearnerId>| members.iter().any(|l| active.contains(l));
        self.0.iter().filter(|(_, members)| any_active(members)).map(|(&leader, _)| leader).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Core = GroupLeader<char, u32>;

    fn push(core: &mut Core, l: u32, seq: u64, on: u64, last: bool) -> Vec<LeaderEvent<char, u32>> {
        let c = Contribution { learner: LearnerId(l), seq, examples: 4 };
        let then = MemberPull { learner: LearnerId(l), seq: seq + 1, last, reply: l };
        let (events, refused) = core.on_push(c, Clock(on), 'g', then);
        assert!(refused.is_none(), "{refused:?}");
        events
    }

    fn pull(l: u32, seq: u64, last: bool) -> MemberPull<u32> {
        MemberPull { learner: LearnerId(l), seq, last, reply: l }
    }

    fn serve(seq: u64, reply: u32) -> LeaderEvent<char, u32> {
        LeaderEvent::Serve { seq, reply }
    }

    #[test]
    fn a_round_is_one_push_of_the_group_and_its_answer_serves_every_member() {
        let mut g = Core::new(LearnerId(2), [LearnerId(2), LearnerId(3)], 1);
        // The first member's pull is the group's first; the other waits for the same answer.
        assert_eq!(g.on_pull(pull(3, 1, false)), vec![LeaderEvent::Pull { seq: 1, last: false }]);
        assert!(g.on_pull(pull(2, 1, false)).is_empty());
        assert_eq!(g.on_weights(1).unwrap(), vec![serve(1, 2), serve(1, 3)]);
        // A member's pull with nothing of the open round held is answered at once.
        assert_eq!(g.on_pull(pull(3, 1, false)), vec![serve(1, 3)]);
        assert!(push(&mut g, 2, 1, 0, false).is_empty(), "waiting for member 3");
        let events = push(&mut g, 3, 1, 0, false);
        let [LeaderEvent::Push { seq: 1, batch, last: false }] = &events[..] else { panic!("{events:?}") };
        assert_eq!((batch.computed_on, batch.members.len()), (Clock(0), 2));
        // While the group's push is unanswered a member's retry waits, and makes the group
        // send its push again.
        assert_eq!(push(&mut g, 3, 1, 0, false), vec![LeaderEvent::Resend]);
        assert!(g.on_weights(1).is_err(), "an earlier answer again");
        assert_eq!(g.on_weights(2).unwrap(), vec![serve(2, 2), serve(2, 3)]);
    }

    #[test]
    fn a_round_complete_while_the_group_s_push_is_unanswered_goes_after_the_answer() {
        // n = 2 among two members: each push is a round of its own.
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)], 2);
        g.on_pull(pull(0, 1, false));
        g.on_weights(1).unwrap();
        assert!(matches!(push(&mut g, 0, 1, 0, false)[..], [LeaderEvent::Push { seq: 1, .. }]));
        assert!(push(&mut g, 1, 1, 0, false).is_empty(), "held behind the unanswered push");
        // The answer serves the member whose push it took, then the held round goes; its
        // member is served by that one's answer.
        let events = g.on_weights(2).unwrap();
        let [a, LeaderEvent::Push { seq: 2, .. }] = &events[..] else { panic!("{events:?}") };
        assert_eq!(a, &serve(2, 0));
        assert_eq!(g.on_weights(3).unwrap(), vec![serve(2, 1)]);
        // The last member training lost after its push was answered: the group's last pull
        // is for the step it was served.
        assert_eq!(g.on_pull(pull(0, 2, true)), vec![serve(2, 0)], "member 0 finished");
        assert_eq!(g.on_membership(&[LearnerId(0)].into()), vec![LeaderEvent::Pull { seq: 3, last: true }]);
    }

    #[test]
    fn the_group_s_last_push_or_pull_comes_once_every_member_has_finished() {
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)], 1);
        g.on_pull(pull(0, 1, false));
        g.on_weights(1).unwrap();
        assert!(push(&mut g, 0, 1, 0, true).is_empty());
        let events = push(&mut g, 1, 1, 0, true);
        assert!(matches!(events[..], [LeaderEvent::Push { seq: 1, last: true, .. }]), "{events:?}");
        // A member lost while the other has finished: the group pulls for the last time.
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)], 1);
        g.on_pull(pull(0, 1, false));
        g.on_weights(1).unwrap();
        assert!(push(&mut g, 0, 1, 0, true).is_empty());
        let events = g.on_membership(&[LearnerId(0)].into());
        assert!(matches!(events[..], [LeaderEvent::Push { seq: 1, last: true, .. }]), "{events:?}");
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)], 1);
        assert_eq!(g.on_pull(pull(0, 1, true))[0], LeaderEvent::Pull { seq: 1, last: false });
        assert_eq!(g.on_pull(pull(1, 1, true)), vec![LeaderEvent::Pull { seq: 1, last: true }]);
    }
}
