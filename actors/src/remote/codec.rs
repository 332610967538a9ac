//! The codec between actor messages and wire messages, both directions side by side: what a
//! stand-in sends for each actor message ([`ToWire`]), and what each receiver makes of a
//! validated [`Inbound`] message from each kind of peer. Past this module only actor messages
//! flow; a message a receiver does not take is [`Unexpected`], naming what it was.

use rudra_transport::wire::{GradientReport, UpdateReport};
use rudra_transport::{Clock, Inbound, Kind, LearnerId, Msg, ShardId};

use crate::messages::{
    Exchange, Heartbeat, LearnerDone, Membership, Progress, Pull, Push, Records, Served, StartLearner,
    StopLearner, StopShard,
};
use crate::protocol::{GradientRecord, UpdateRecord, Weights};

/// A message its receiver does not take from this peer: the connection misbehaves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct Unexpected {
    /// What arrived and why it is refused.
    pub what: String,
}

impl Unexpected {
    fn kind(kind: Kind, from: &str) -> Self {
        Self { what: format!("{kind:?} is not a message {from} sends") }
    }
}

// ---- actor → wire --------------------------------------------------------------------------

/// The wire message a stand-in sends for an actor message.
pub trait ToWire {
    /// This message on the wire.
    fn to_wire(self) -> Msg;
}

impl ToWire for Records {
    fn to_wire(self) -> Msg {
        Msg::Records {
            gradients: (self.gradients.iter())
                .map(|g| GradientReport {
                    learner: g.learner,
                    computed_on: g.computed_on,
                    staleness: g.staleness,
                    outcome: g.outcome,
                })
                .collect(),
            updates: (self.updates.iter())
                .map(|u| UpdateReport { clock: u.clock, gradients: u.gradients as u32 })
                .collect(),
        }
    }
}

impl ToWire for StopShard {
    fn to_wire(self) -> Msg {
        Msg::Stop
    }
}

impl ToWire for StopLearner {
    fn to_wire(self) -> Msg {
        Msg::Stop
    }
}

impl ToWire for StartLearner {
    fn to_wire(self) -> Msg {
        Msg::Start
    }
}

impl ToWire for Membership {
    fn to_wire(self) -> Msg {
        Msg::Membership { active: self.active.into_iter().collect() }
    }
}

impl ToWire for Heartbeat {
    fn to_wire(self) -> Msg {
        Msg::Heartbeat
    }
}

impl ToWire for Progress {
    fn to_wire(self) -> Msg {
        let Self { learner, samples, steps, loss_sum } = self;
        Msg::Progress { learner, samples, steps, loss_sum }
    }
}

impl ToWire for LearnerDone {
    fn to_wire(self) -> Msg {
        Msg::LearnerDone { error: self.error }
    }
}

impl ToWire for Pull {
    fn to_wire(self) -> Msg {
        Msg::Pull { learner: self.learner, seq: self.seq, last: self.last }
    }
}

impl ToWire for Push {
    fn to_wire(self) -> Msg {
        let Self { learner, seq, computed_on, values } = self;
        Msg::Push { learner, seq, computed_on, values }
    }
}

impl ToWire for Exchange {
    fn to_wire(self) -> Msg {
        Msg::Exchange { learner: self.learner, values: self.values }
    }
}

impl ToWire for Served {
    fn to_wire(self) -> Msg {
        let Weights { shard, clock, values } = self.weights;
        Msg::Weights { shard, seq: self.seq, clock, values }
    }
}

// ---- wire → actor: at the scheduler --------------------------------------------------------

/// What a shard's connection brings the scheduler.
#[derive(Debug)]
pub enum FromShard {
    /// Gradient and update records, for the tracker.
    Records(Records),
    /// The answer to a snapshot request.
    Snapshot {
        /// The request answered.
        request: u64,
        /// The shard's weights.
        weights: Weights,
    },
    /// The shard restarted and resumed from its checkpoint at this clock.
    Resumed(Clock),
}

/// Decode a message from shard `shard` to the scheduler.
pub fn from_shard(shard: ShardId, m: Inbound) -> Result<FromShard, Unexpected> {
    match m {
        Inbound::Control(Msg::Records { gradients, updates }) => Ok(FromShard::Records(Records {
            gradients: (gradients.iter())
                .map(|g| GradientRecord {
                    shard,
                    learner: g.learner,
                    computed_on: g.computed_on,
                    staleness: g.staleness,
                    outcome: g.outcome,
                })
                .collect(),
            updates: (updates.iter())
                .map(|u| UpdateRecord { shard, clock: u.clock, gradients: u.gradients as usize })
                .collect(),
        })),
        Inbound::Snapshot { request, clock, values } => {
            Ok(FromShard::Snapshot { request, weights: Weights { shard, clock, values } })
        }
        Inbound::Control(Msg::Resumed { clock }) => Ok(FromShard::Resumed(clock)),
        other => Err(Unexpected::kind(other.kind(), "a shard")),
    }
}

/// What a learner's connection brings the scheduler.
#[derive(Debug, PartialEq)]
pub enum FromLearner {
    /// More gradients computed.
    Progress(Progress),
    /// Finished, or failed.
    Done(LearnerDone),
    /// Alive.
    Heartbeat(Heartbeat),
}

/// Decode a message from learner `learner` to the scheduler; progress must be its own.
pub fn from_learner(learner: LearnerId, m: Inbound) -> Result<FromLearner, Unexpected> {
    match m {
        Inbound::Control(Msg::Progress { learner: l, samples, steps, loss_sum }) if l == learner => {
            Ok(FromLearner::Progress(Progress { learner, samples, steps, loss_sum }))
        }
        Inbound::Control(Msg::Progress { learner: l, .. }) => {
            Err(Unexpected { what: format!("{learner} reported the progress of {l}") })
        }
        Inbound::Control(Msg::LearnerDone { error }) => Ok(FromLearner::Done(LearnerDone { learner, error })),
        Inbound::Control(Msg::Heartbeat) => Ok(FromLearner::Heartbeat(Heartbeat(learner))),
        other => Err(Unexpected::kind(other.kind(), "a learner")),
    }
}

// ---- wire → actor: at a shard --------------------------------------------------------------

/// What the scheduler's connection brings a shard.
#[derive(Debug, PartialEq)]
pub enum ToShard {
    /// Send the current weights, echoing `request`.
    SnapshotRequest(u64),
    /// The active learners changed.
    Membership(Membership),
    /// The run is over.
    Stop,
}

/// Decode a message from the scheduler to a shard.
pub fn to_shard(m: Inbound) -> Result<ToShard, Unexpected> {
    match m {
        Inbound::Control(Msg::SnapshotRequest { request }) => Ok(ToShard::SnapshotRequest(request)),
        Inbound::Control(Msg::Membership { active }) => {
            Ok(ToShard::Membership(Membership { active: active.into_iter().collect() }))
        }
        Inbound::Control(Msg::Stop) => Ok(ToShard::Stop),
        other => Err(Unexpected::kind(other.kind(), "the scheduler sends a shard")),
    }
}

/// What a learner's data connection brings a shard, checked at the boundary.
#[derive(Debug)]
pub enum LearnerData {
    /// A pull (its `reply_to` is the learner's stand-in, added by the receiver).
    Pull {
        /// The learner's step.
        seq: u64,
        /// After its last push.
        last: bool,
    },
    /// A gradient.
    Push(Push),
    /// An elastic exchange's values (the center goes back to the learner's stand-in).
    Exchange(rudra_transport::Floats),
}

/// Decode a message from learner `learner` (the one its connection said hello as) to a shard
/// holding `range_len` values: anything but its own pulls, and its own pushes and exchanges of
/// exactly that length, is refused before the shard sees it.
pub fn from_learner_data(
    learner: LearnerId,
    range_len: usize,
    m: Inbound,
) -> Result<LearnerData, Unexpected> {
    match m {
        Inbound::Control(Msg::Pull { learner: l, seq, last }) if l == learner => {
            Ok(LearnerData::Pull { seq, last })
        }
        Inbound::Push { learner: l, seq, computed_on, values }
            if l == learner && values.len() == range_len =>
        {
            Ok(LearnerData::Push(Push { learner, seq, computed_on, values }))
        }
        Inbound::Exchange { learner: l, values } if l == learner && values.len() == range_len => {
            Ok(LearnerData::Exchange(values))
        }
        Inbound::Push { ref values, .. } | Inbound::Exchange { ref values, .. }
            if values.len() != range_len =>
        {
            Err(Unexpected {
                what: format!("{:?} of {} values to a shard of {range_len}", m.kind(), values.len()),
            })
        }
        other => Err(Unexpected { what: format!("{:?} that is not {learner}'s own", other.kind()) }),
    }
}

// ---- wire → actor: at a learner ------------------------------------------------------------

/// What the scheduler's connection brings a learner.
#[derive(Debug, PartialEq, Eq)]
pub enum ToLearner {
    /// Begin training.
    Start,
    /// The run is over.
    Stop,
}

/// Decode a message from the scheduler to a learner.
pub fn to_learner(m: Inbound) -> Result<ToLearner, Unexpected> {
    match m {
        Inbound::Control(Msg::Start) => Ok(ToLearner::Start),
        Inbound::Control(Msg::Stop) => Ok(ToLearner::Stop),
        other => Err(Unexpected::kind(other.kind(), "the scheduler sends a learner")),
    }
}

/// Decode a shard's answer to a learner: weights.
pub fn served(m: Inbound) -> Result<Served, Unexpected> {
    match m {
        Inbound::Weights { shard, seq, clock, values } => {
            Ok(Served { weights: Weights { shard, clock, values }, seq })
        }
        other => Err(Unexpected::kind(other.kind(), "a shard sends a learner")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DropReason, Outcome};
    use rudra_transport::Staleness;
    use rudra_transport::wire::decode_frame;

    /// `m` as its receiver sees it: encoded, framed and validated.
    fn over_the_wire(m: Msg) -> Inbound {
        decode_frame(&m.encode().unwrap(), 1 << 20).unwrap()
    }

    #[test]
    fn records_keep_every_outcome_across_the_wire() {
        let (shard, learner) = (ShardId(1), LearnerId(2));
        let outcomes = std::iter::once(Outcome::Applied { alpha: 0.25 })
            .chain(DropReason::ALL.into_iter().map(Outcome::Dropped));
        let records = Records {
            gradients: outcomes
                .enumerate()
                .map(|(i, outcome)| GradientRecord {
                    shard,
                    learner,
                    computed_on: Clock(i as u64),
                    staleness: Staleness(7),
                    outcome,
                })
                .collect(),
            updates: vec![UpdateRecord { shard, clock: Clock(9), gradients: 3 }],
        };
        let FromShard::Records(back) = from_shard(shard, over_the_wire(records.clone().to_wire())).unwrap()
        else {
            panic!("not records")
        };
        assert_eq!(back, records);
    }

    #[test]
    fn a_learner_may_send_only_its_own_messages_of_the_shards_length() {
        let me = LearnerId(0);
        let push =
            |learner, n| Msg::Push { learner, seq: 1, computed_on: Clock(0), values: vec![1.0; n].into() };
        assert!(matches!(from_learner_data(me, 4, over_the_wire(push(me, 4))), Ok(LearnerData::Push(_))));
        assert!(from_learner_data(me, 4, over_the_wire(push(me, 3))).unwrap_err().what.contains("3 values"));
        assert!(from_learner_data(me, 4, over_the_wire(push(LearnerId(1), 4))).is_err());
        let pull = Msg::Pull { learner: LearnerId(1), seq: 1, last: false };
        assert!(from_learner_data(me, 4, over_the_wire(pull)).is_err());
        assert!(from_learner_data(me, 4, over_the_wire(Msg::Heartbeat)).is_err());
        let progress = Msg::Progress { learner: LearnerId(3), samples: 1, steps: 1, loss_sum: 0.0 };
        assert!(from_learner(me, over_the_wire(progress)).is_err(), "someone else's progress");
        assert_eq!(to_learner(over_the_wire(Msg::Start)), Ok(ToLearner::Start));
        assert!(to_shard(over_the_wire(Msg::Start)).is_err());
    }
}
