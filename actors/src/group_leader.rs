//! A learner group with rounds of its own, in front of one shard (hierarchical rounds,
//! `docs/src/algorithms.md` §4.3). To its members it stands where the shard would: it holds each
//! member's push until every member still training has pushed ([`GroupRound`]) and answers
//! the members' pulls with the weights of the group's last round, all the same. To the shard it
//! is one learner, the group's first member: each round's mean over all its members' examples
//! is one gradient of the group, on the clock the round computed on, and the shard's answer
//! fans out to the members.

use std::collections::BTreeMap;

use actix::prelude::*;
use rudra_proto::{Batch, Contribution, GroupRound};
use rudra_transport::{Encoding, Floats, LearnerId};

use crate::aggregator::GroupEncoder;
use crate::messages::{Membership, Pull, Push, Served};

/// One group's rounds in front of one shard.
pub struct GroupLeader {
    /// Whom the shard serves for the group: its first member.
    leader: LearnerId,
    /// The shard's pushes and pulls.
    shard: (Recipient<Push>, Recipient<Pull>),
    round: GroupRound<Floats>,
    encoder: GroupEncoder,
    /// Each member's pull that the group's next weights answer.
    waiting: BTreeMap<LearnerId, Pull>,
    /// The weights of the group's last round, as the shard served them.
    weights: Option<Served>,
    /// The group's pushes so far: its next pull is step `pushed + 1`.
    pushed: u64,
    /// The group's push whose answer has not come, sent again when a member retries its own.
    unanswered: Option<Push>,
    /// The group's first pull is sent.
    asked: bool,
    /// The group's last pull is sent: every member has finished.
    finished: bool,
}

impl GroupLeader {
    /// The rounds of the group of `members`, the first of them `leader`, in front of the shard
    /// taking `shard`, encoding as `encoding` says.
    #[must_use]
    pub fn new(
        (leader, members): (LearnerId, Vec<LearnerId>),
        shard: (Recipient<Push>, Recipient<Pull>),
        encoding: Encoding,
    ) -> Self {
        Self {
            leader,
            shard,
            round: GroupRound::new(members).own_rounds(),
            encoder: GroupEncoder::new(encoding),
            waiting: BTreeMap::new(),
            weights: None,
            pushed: 0,
            unanswered: None,
            asked: false,
            finished: false,
        }
    }

    /// Answer `pull` now with the group's weights, or with its next (the group's first pull
    /// goes with the first member's).
    fn answer(&mut self, pull: Pull, ctx: &Context<Self>) {
        if !self.asked {
            self.asked = true;
            self.shard.1.do_send(self.pull(false, ctx));
        }
        match &self.weights {
            Some(w) if self.unanswered.is_none() && !self.round.holds(pull.learner) => {
                pull.reply_to.do_send(Served { seq: pull.seq, ..w.clone() });
            }
            _ => {
                let newest = self.waiting.get(&pull.learner).is_none_or(|p| p.seq <= pull.seq);
                if newest {
                    self.waiting.insert(pull.learner, pull);
                }
            }
        }
    }

    /// The group's next pull, riding on a push or alone.
    fn pull(&self, last: bool, ctx: &Context<Self>) -> Pull {
        let reply_to = ctx.address().recipient();
        Pull { learner: self.leader, seq: self.pushed + 1, last, reply_to }
    }

    /// Send the shard each completed round as one gradient of the group, and the group's last
    /// pull once every member has finished.
    fn go_on(&mut self, rounds: Vec<Batch<Floats>>, ctx: &Context<Self>) {
        let n = rounds.len();
        for (k, batch) in rounds.into_iter().enumerate() {
            let examples = batch.members.iter().map(|m| m.examples).sum();
            let values = self.encoder.encode(batch.mean(|v| &v[..]));
            let seq = self.pushed + 1;
            self.pushed = seq;
            self.finished = k + 1 == n && self.round.done();
            let then = self.pull(self.finished, ctx);
            let push =
                Push { learner: self.leader, seq, computed_on: batch.computed_on, values, examples, then };
            self.unanswered = Some(push.clone());
            self.shard.0.do_send(push);
        }
        if self.round.done() && !self.finished {
            self.finished = true;
            self.shard.1.do_send(self.pull(true, ctx));
        }
    }
}

impl Actor for GroupLeader {
    type Context = Context<Self>;
}

impl Handler<Push> for GroupLeader {
    type Result = ();
    fn handle(&mut self, msg: Push, ctx: &mut Context<Self>) {
        let Push { learner, seq, computed_on, values, examples, then } = msg;
        let last = then.last;
        let held = match values.decode() {
            Ok(values) => self.round.push(Contribution { learner, seq, examples }, computed_on, values),
            Err(e) => Err(rudra_proto::CoreError::Protocol(e.to_string())),
        };
        let mut rounds = match held {
            Ok(Some(rounds)) => rounds,
            // A copy: the member retries, and so does the group if its answer is missing.
            Ok(None) => {
                if let Some(push) = &self.unanswered {
                    self.shard.0.do_send(push.clone());
                }
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(%learner, "a group's round rejected a push: {e}");
                Vec::new()
            }
        };
        if last {
            rounds.extend(self.round.finish(learner));
        }
        self.go_on(rounds, ctx);
        self.answer(then, ctx);
    }
}

impl Handler<Pull> for GroupLeader {
    type Result = ();
    fn handle(&mut self, msg: Pull, ctx: &mut Context<Self>) {
        // A pull alone is a member's first or a retry; a last one, of a member with no step
        // left.
        let rounds = if msg.last { self.round.finish(msg.learner) } else { Vec::new() };
        self.go_on(rounds, ctx);
        self.answer(msg, ctx);
    }
}

impl Handler<Served> for GroupLeader {
    type Result = ();
    fn handle(&mut self, msg: Served, _: &mut Context<Self>) {
        if self.unanswered.as_ref().is_some_and(|p| p.then.seq > msg.seq) {
            return; // an answer again to an earlier pull
        }
        self.unanswered = None;
        for (_, pull) in std::mem::take(&mut self.waiting) {
            pull.reply_to.do_send(Served { seq: pull.seq, ..msg.clone() });
        }
        self.weights = Some(msg);
    }
}

impl Handler<Membership> for GroupLeader {
    type Result = ();
    fn handle(&mut self, msg: Membership, ctx: &mut Context<Self>) {
        self.waiting.retain(|l, _| msg.active.contains(l));
        let rounds = self.round.on_membership(&msg.active);
        self.go_on(rounds, ctx);
    }
}
