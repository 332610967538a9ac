//! A learner group with rounds of its own in front of one shard (hierarchical rounds,
//! `docs/src/algorithms.md` §4.3): the actor around [`GroupLeader`]. It takes the members'
//! pushes and pulls as the shard would, pushes each round's mean to the shard as the group's
//! gradient, and answers the members with the weights the shard gives the group.

use actix::prelude::*;
use rudra_proto::{Contribution, GroupLeader, LeaderEvent, MemberPull};
use rudra_transport::{Encoding, Floats, LearnerId};

use crate::aggregator::GroupEncoder;
use crate::messages::{Membership, Pull, Push, Served};

/// How a member's pull is answered.
type Reply = Recipient<Served>;

/// One group's rounds in front of one shard.
pub struct GroupLeaderActor {
    core: GroupLeader<Floats, Reply>,
    /// The shard's pushes and pulls.
    shard: (Recipient<Push>, Recipient<Pull>),
    encoder: GroupEncoder,
    /// The weights of the group's last round, as the shard served them.
    weights: Option<Served>,
    /// The group's push not answered yet, sent again when the core says so.
    unanswered: Option<Push>,
}

impl GroupLeaderActor {
    /// The rounds of the group of `members`, the first of them `leader`, n-softsync among
    /// them, in front of the shard taking `shard`, encoding as `encoding` says.
    #[must_use]
    pub fn new(
        (leader, members, n): (LearnerId, Vec<LearnerId>, u32),
        shard: (Recipient<Push>, Recipient<Pull>),
        encoding: Encoding,
    ) -> Self {
        let core = GroupLeader::new(leader, members, n);
        Self { core, shard, encoder: GroupEncoder::new(encoding), weights: None, unanswered: None }
    }

    /// The group's pull of step `seq`, its answer to this actor.
    fn pull(&self, seq: u64, last: bool, ctx: &Context<Self>) -> Pull {
        Pull { learner: self.core.leader(), seq, last, reply_to: ctx.address().recipient() }
    }

    fn carry_out(&mut self, events: Vec<LeaderEvent<Floats, Reply>>, ctx: &Context<Self>) {
        for event in events {
            match event {
                LeaderEvent::Push { seq, batch, last } => {
                    let examples = batch.members.iter().map(|m| m.examples).sum();
                    let values = self.encoder.encode(batch.mean(|v| &v[..]));
                    let (learner, computed_on, then) =
                        (self.core.leader(), batch.computed_on, self.pull(seq + 1, last, ctx));
                    let push = Push { learner, seq, computed_on, values, examples, then };
                    self.unanswered = Some(push.clone());
                    self.shard.0.do_send(push);
                }
                LeaderEvent::Pull { seq, last } => self.shard.1.do_send(self.pull(seq, last, ctx)),
                LeaderEvent::Resend => {
                    if let Some(push) = &self.unanswered {
                        self.shard.0.do_send(push.clone());
                    }
                }
                LeaderEvent::Serve { seq, reply } => {
                    if let Some(w) = &self.weights {
                        reply.do_send(Served { seq, ..w.clone() });
                    }
                }
            }
        }
    }
}

/// A member's pull, as the core takes it.
fn member(pull: Pull) -> MemberPull<Reply> {
    MemberPull { learner: pull.learner, seq: pull.seq, last: pull.last, reply: pull.reply_to }
}

impl Actor for GroupLeaderActor {
    type Context = Context<Self>;
}

impl Handler<Push> for GroupLeaderActor {
    type Result = ();
    fn handle(&mut self, msg: Push, ctx: &mut Context<Self>) {
        let Push { learner, seq, computed_on, values, examples, then } = msg;
        let (events, refused) = match values.decode() {
            Ok(values) => {
                let c = Contribution { learner, seq, examples };
                let (events, refused) = self.core.on_push(c, computed_on, values, member(then));
                (events, refused.map(|e| e.to_string()))
            }
            Err(e) => (self.core.on_pull(member(then)), Some(e.to_string())),
        };
        if let Some(e) = refused {
            tracing::warn!(%learner, "a group's round rejected a push: {e}");
        }
        self.carry_out(events, ctx);
    }
}

impl Handler<Pull> for GroupLeaderActor {
    type Result = ();
    fn handle(&mut self, msg: Pull, ctx: &mut Context<Self>) {
        let events = self.core.on_pull(member(msg));
        self.carry_out(events, ctx);
    }
}

impl Handler<Served> for GroupLeaderActor {
    type Result = ();
    fn handle(&mut self, msg: Served, ctx: &mut Context<Self>) {
        let Ok(events) = self.core.on_weights(msg.seq) else { return };
        self.unanswered = None;
        self.weights = Some(msg);
        self.carry_out(events, ctx);
    }
}

impl Handler<Membership> for GroupLeaderActor {
    type Result = ();
    fn handle(&mut self, msg: Membership, ctx: &mut Context<Self>) {
        let events = self.core.on_membership(&msg.active);
        self.carry_out(events, ctx);
    }
}
