//! A learner group's aggregator for one shard (Rudra-adv trees, `docs/src/algorithms.md` §4.2):
//! it stands where the shard would for the group's members, holds each round's pushes until
//! every member still training has pushed ([`GroupRound`]), and sends the shard one
//! [`Aggregate`] per weights clock among them, every member's pull riding on it. Pulls that
//! ride on no push go straight through.

use actix::prelude::*;
use rudra_proto::{Batch, Contribution, GroupRound};
use rudra_transport::{Encoding, Floats, LearnerId, Payload};

use crate::messages::{Aggregate, Membership, Pull, Push};

/// What the aggregator keeps of a held push: its values and the pull riding on it.
type Held = (Floats, Pull);

/// One group's aggregator in front of one shard.
pub struct Aggregator {
    /// The shard's aggregates …
    shard: Recipient<Aggregate>,
    /// … and its pulls.
    pulls: Recipient<Pull>,
    round: GroupRound<Held>,
    encoder: GroupEncoder,
}

/// How a group's gradients leave for a shard: the job's gradients codec, with the group's own
/// error feedback below 16 bits.
pub(crate) struct GroupEncoder {
    encoding: Encoding,
    feedback: Vec<f32>,
}

impl GroupEncoder {
    pub(crate) fn new(encoding: Encoding) -> Self {
        Self { encoding, feedback: Vec::new() }
    }

    /// `mean`, encoded.
    pub(crate) fn encode(&mut self, mean: Vec<f32>) -> Payload {
        let feedback = self.encoding.codec.needs_feedback().then(|| {
            self.feedback.resize(mean.len(), 0.0);
            &mut self.feedback[..]
        });
        self.encoding.encode(&Floats::from(mean), feedback)
    }
}

impl Aggregator {
    /// The aggregator of the group of `members` (whose rounds are hardsync's, told by their
    /// clock, if `hardsync`), in front of the shard taking `shard` and `pulls`, encoding as
    /// `encoding` says.
    #[must_use]
    pub fn new(
        (members, hardsync): (Vec<LearnerId>, bool),
        (shard, pulls): (Recipient<Aggregate>, Recipient<Pull>),
        encoding: Encoding,
    ) -> Self {
        let round = GroupRound::new(members);
        let round = if hardsync { round.by_clock() } else { round };
        Self { shard, pulls, round, encoder: GroupEncoder::new(encoding) }
    }

    /// `learner` has sent its last gradient: no round waits for it.
    fn finished(&mut self, learner: LearnerId) {
        let batches = self.round.finish(learner);
        self.send(batches);
    }

    /// Send the shard each batch of a round as one aggregate.
    fn send(&mut self, batches: Vec<Batch<Held>>) {
        for batch in batches {
            let values_out = self.encoder.encode(batch.mean(|(v, _)| &v[..]));
            let Batch { computed_on, members, values } = batch;
            let then = values.into_iter().map(|(_, pull)| pull).collect();
            self.shard.do_send(Aggregate { members, computed_on, values: values_out, then });
        }
    }
}

impl Actor for Aggregator {
    type Context = Context<Self>;
}

impl Handler<Push> for Aggregator {
    type Result = ();
    fn handle(&mut self, msg: Push, _: &mut Context<Self>) {
        let Push { learner, seq, computed_on, values, examples, then } = msg;
        let last = then.last;
        let values = match values.decode() {
            Ok(values) => values,
            Err(e) => return tracing::warn!(%learner, "an aggregator rejected a push: {e}"),
        };
        let contribution = Contribution { learner, seq, examples };
        match self.round.push(contribution, computed_on, (values, then.clone())) {
            Ok(Some(batches)) => self.send(batches),
            // A copy of a push held: the shard answers the pull riding on it.
            Ok(None) => self.pulls.do_send(then),
            Err(e) => {
                tracing::warn!(%learner, "an aggregator rejected a push: {e}");
                return self.pulls.do_send(then);
            }
        }
        if last {
            self.finished(learner);
        }
    }
}

impl Handler<Pull> for Aggregator {
    type Result = ();
    fn handle(&mut self, msg: Pull, _: &mut Context<Self>) {
        // A pull alone is a learner's first or a retry: its last push, not its last pull,
        // ends its part in the rounds.
        self.pulls.do_send(msg);
    }
}

impl Handler<Membership> for Aggregator {
    type Result = ();
    fn handle(&mut self, msg: Membership, _: &mut Context<Self>) {
        let batches = self.round.on_membership(&msg.active);
        self.send(batches);
    }
}
