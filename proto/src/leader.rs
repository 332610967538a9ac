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

use std::collections::{BTreeMap, BTreeSet};

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
    /// Each member's newest pull that the group's next weights answer.
    waiting: BTreeMap<LearnerId, MemberPull<P>>,
    /// The group's weights are held (the driver holds them).
    served: bool,
    /// The group's pushes so far: its next pull is step `pushed + 1`.
    pushed: u64,
    /// A push of the group has not been answered.
    unanswered: bool,
    /// The group's first pull is sent.
    asked: bool,
    /// The group's last pull is sent: every member has finished.
    finished: bool,
    events: Vec<LeaderEvent<T, P>>,
}

impl<T, P> GroupLeader<T, P> {
    /// The rounds of the group of `members`, named to the shard by `leader`, its first.
    #[must_use]
    pub fn new(leader: LearnerId, members: impl IntoIterator<Item = LearnerId>) -> Self {
        Self {
            leader,
            round: GroupRound::new(members).own_rounds(),
            waiting: BTreeMap::new(),
            served: false,
            pushed: 0,
            unanswered: false,
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
                if self.unanswered {
                    self.events.push(LeaderEvent::Resend);
                }
                (Vec::new(), None)
            }
            Err(e) => (Vec::new(), Some(e)),
        };
        if then.last {
            rounds.extend(self.round.finish(learner));
        }
        self.go_on(rounds);
        self.answer(then);
        (std::mem::take(&mut self.events), refused)
    }

    /// A member's pull alone: its first, a retry, or the last of a member with no step left.
    pub fn on_pull(&mut self, pull: MemberPull<P>) -> Vec<LeaderEvent<T, P>> {
        let rounds = if pull.last { self.round.finish(pull.learner) } else { Vec::new() };
        self.go_on(rounds);
        self.answer(pull);
        std::mem::take(&mut self.events)
    }

    /// The shard's answer to the group's pull `seq`: the driver holds the weights it brought,
    /// unless it answers an earlier pull again ([`CoreError::Duplicate`]); every member
    /// waiting is served them.
    pub fn on_weights(&mut self, seq: u64) -> Result<Vec<LeaderEvent<T, P>>, CoreError> {
        if self.unanswered && seq <= self.pushed {
            return Err(CoreError::Duplicate(format!(
                "{}'s group got weights #{seq} again (awaiting #{})",
                self.leader,
                self.pushed + 1
            )));
        }
        (self.unanswered, self.served) = (false, true);
        let waiting = std::mem::take(&mut self.waiting).into_values();
        Ok(waiting.map(|p| LeaderEvent::Serve { seq: p.seq, reply: p.reply }).collect())
    }

    /// The run's active learners are `active`: no round waits for a member that is not.
    pub fn on_membership(&mut self, active: &BTreeSet<LearnerId>) -> Vec<LeaderEvent<T, P>> {
        self.waiting.retain(|l, _| active.contains(l));
        let rounds = self.round.on_membership(active);
        self.go_on(rounds);
        std::mem::take(&mut self.events)
    }

    /// Answer `pull` now with the group's weights, when it holds some, none of the member's
    /// push is in the open round and no push of the group is unanswered; else with its next
    /// (the group's first pull goes with the first member's).
    fn answer(&mut self, pull: MemberPull<P>) {
        if !self.asked {
            self.asked = true;
            self.events.push(LeaderEvent::Pull { seq: self.pushed + 1, last: false });
        }
        if self.served && !self.unanswered && !self.round.holds(pull.learner) {
            self.events.push(LeaderEvent::Serve { seq: pull.seq, reply: pull.reply });
        } else if self.waiting.get(&pull.learner).is_none_or(|p| p.seq <= pull.seq) {
            self.waiting.insert(pull.learner, pull);
        }
    }

    /// Push each completed round as one gradient of the group, and pull for the last time
    /// once every member has finished.
    fn go_on(&mut self, rounds: Vec<Batch<T>>) {
        let n = rounds.len();
        for (k, batch) in rounds.into_iter().enumerate() {
            self.pushed += 1;
            self.finished = k + 1 == n && self.round.done();
            self.unanswered = true;
            self.events.push(LeaderEvent::Push { seq: self.pushed, batch, last: self.finished });
        }
        if self.round.done() && !self.finished {
            self.finished = true;
            self.events.push(LeaderEvent::Pull { seq: self.pushed + 1, last: true });
        }
    }
}

/// Whose contributions a shard's record of a gradient counts: its learner's, or with groups
/// that run rounds of their own, every member of the group the record names by its first.
#[derive(Clone, Debug, Default)]
pub struct Credits(BTreeMap<LearnerId, Vec<LearnerId>>);

impl Credits {
    /// Credits for `groups` with rounds of their own, if any (none: each learner its own).
    #[must_use]
    pub fn of(groups: Option<Vec<Vec<LearnerId>>>) -> Self {
        Self(groups.into_iter().flatten().filter_map(|g| Some((*g.first()?, g))).collect())
    }

    /// Those a record naming `learner` counts for.
    #[must_use]
    pub fn members<'a>(&'a self, learner: &'a LearnerId) -> &'a [LearnerId] {
        self.0.get(learner).map_or(std::slice::from_ref(learner), Vec::as_slice)
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
        let mut g = Core::new(LearnerId(2), [LearnerId(2), LearnerId(3)]);
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
    fn the_group_s_last_push_or_pull_comes_once_every_member_has_finished() {
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)]);
        g.on_pull(pull(0, 1, false));
        g.on_weights(1).unwrap();
        assert!(push(&mut g, 0, 1, 0, true).is_empty());
        let events = push(&mut g, 1, 1, 0, true);
        assert!(matches!(events[..], [LeaderEvent::Push { seq: 1, last: true, .. }]), "{events:?}");
        // A member lost while the other has finished: the group pulls for the last time.
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)]);
        g.on_pull(pull(0, 1, false));
        g.on_weights(1).unwrap();
        assert!(push(&mut g, 0, 1, 0, true).is_empty());
        let events = g.on_membership(&[LearnerId(0)].into());
        assert!(matches!(events[..], [LeaderEvent::Push { seq: 1, last: true, .. }]), "{events:?}");
        let mut g = Core::new(LearnerId(0), [LearnerId(0), LearnerId(1)]);
        assert_eq!(g.on_pull(pull(0, 1, true))[0], LeaderEvent::Pull { seq: 1, last: false });
        assert_eq!(g.on_pull(pull(1, 1, true)), vec![LeaderEvent::Pull { seq: 1, last: true }]);
    }
}
