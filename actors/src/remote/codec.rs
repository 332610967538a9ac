//! The codec between actor messages and wire messages, both directions side by side: what a
//! stand-in sends for each actor message ([`ToWire`]), and what each receiver makes of a
//! validated [`Inbound`] message from each kind of peer. Past this module only actor messages
//! flow; a message a receiver does not take is [`Unexpected`], naming what it was.

use rudra_transport::wire::{AggregateMember, GradientReport, UpdateReport};
use rudra_transport::{Clock, Codec, Floats, Inbound, Kind, LearnerId, Msg, ShardId};

use std::sync::Arc;

use crate::messages::{
    Aggregate, BatchSizes, Center, Evaluate, Exchange, Heartbeat, LearnerDone, Measured, Membership,
    Progress, Pull, Push, Records, Resumed, Served, StartLearner,
};
use rudra_proto::{GradientRecord, NextPull, UpdateRecord, Weights};

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
                .map(|u| UpdateReport {
                    clock: u.clock,
                    gradients: u.gradients as u32,
                    payload_in: u.payload_in,
                })
                .collect(),
        }
    }
}

impl ToWire for Resumed {
    fn to_wire(self) -> Msg {
        Msg::Resumed { clock: self.0 }
    }
}

impl ToWire for StartLearner {
    fn to_wire(self) -> Msg {
        Msg::Start
    }
}

impl ToWire for BatchSizes {
    fn to_wire(self) -> Msg {
        Msg::BatchSizes { sizes: self.sizes.to_vec() }
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
        let Self {
            learner,
            session,
            samples,
            steps,
            loss_sum,
            payload_up,
            payload_down,
            wire_bytes,
            compute_seconds,
        } = self;
        Msg::Progress {
            learner,
            session,
            samples,
            steps,
            loss_sum,
            payload_up,
            payload_down,
            wire_bytes,
            compute_seconds,
        }
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
        let Self { learner, seq, computed_on, values, examples, then } = self;
        Msg::Push { learner, seq, computed_on, values, examples, next_seq: then.seq, last: then.last }
    }
}

impl ToWire for Exchange {
    fn to_wire(self) -> Msg {
        Msg::Exchange { learner: self.learner, values: self.values }
    }
}

impl ToWire for Aggregate {
    fn to_wire(self) -> Msg {
        let Self { members, computed_on, values, then } = self;
        let members = (members.iter().zip(&then))
            .map(|(c, pull)| AggregateMember {
                learner: c.learner,
                seq: c.seq,
                examples: c.examples,
                next_seq: pull.seq,
                last: pull.last,
            })
            .collect();
        Msg::Aggregate { members, computed_on, values }
    }
}

/// The weights `served` answering learner `learner`'s pull, as they travel.
#[must_use]
pub fn weights(learner: LearnerId, served: Served) -> Msg {
    let Served { shard, clock, seq, values } = served;
    Msg::Weights { shard, learner, seq, clock, values }
}

impl ToWire for Center {
    fn to_wire(self) -> Msg {
        let Self { shard, clock, values } = self;
        Msg::Center { shard, clock, values }
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
    /// The shard is alive.
    Heartbeat,
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
                .map(|u| UpdateRecord {
                    shard,
                    clock: u.clock,
                    gradients: u.gradients as usize,
                    payload_in: u.payload_in,
                })
                .collect(),
        })),
        Inbound::Snapshot { request, clock, values } => {
            Ok(FromShard::Snapshot { request, weights: Weights { shard, clock, values } })
        }
        Inbound::Control(Msg::Resumed { clock }) => Ok(FromShard::Resumed(clock)),
        Inbound::Control(Msg::Heartbeat) => Ok(FromShard::Heartbeat),
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
    /// The answer to an evaluation request.
    Evaluated {
        /// The request answered.
        request: u64,
        /// What the learner measured, if it evaluates.
        measured: Option<Measured>,
    },
}

/// Decode a message from learner `learner` to the scheduler; progress must be its own.
pub fn from_learner(learner: LearnerId, m: Inbound) -> Result<FromLearner, Unexpected> {
    match m {
        Inbound::Control(Msg::Progress {
            learner: l,
            session,
            samples,
            steps,
            loss_sum,
            payload_up,
            payload_down,
            wire_bytes,
            compute_seconds,
        }) if l == learner => Ok(FromLearner::Progress(Progress {
            learner,
            session,
            samples,
            steps,
            loss_sum,
            payload_up,
            payload_down,
            wire_bytes,
            compute_seconds,
        })),
        Inbound::Control(Msg::Progress { learner: l, .. }) => {
            Err(Unexpected { what: format!("{learner} reported the progress of {l}") })
        }
        Inbound::Control(Msg::LearnerDone { error }) => Ok(FromLearner::Done(LearnerDone { learner, error })),
        Inbound::Control(Msg::Heartbeat) => Ok(FromLearner::Heartbeat(Heartbeat(learner))),
        Inbound::Control(Msg::Evaluated { request, measured }) => Ok(FromLearner::Evaluated {
            request,
            measured: measured.map(|(loss, accuracy)| Measured { loss, accuracy }),
        }),
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
    /// The scheduler is alive.
    Heartbeat,
}

/// Decode a message from the scheduler to a shard.
pub fn to_shard(m: Inbound) -> Result<ToShard, Unexpected> {
    match m {
        Inbound::Control(Msg::SnapshotRequest { request }) => Ok(ToShard::SnapshotRequest(request)),
        Inbound::Control(Msg::Membership { active }) => {
            Ok(ToShard::Membership(Membership { active: active.into_iter().collect() }))
        }
        Inbound::Control(Msg::Stop) => Ok(ToShard::Stop),
        Inbound::Control(Msg::Heartbeat) => Ok(ToShard::Heartbeat),
        other => Err(Unexpected::kind(other.kind(), "the scheduler sends a shard")),
    }
}

/// What a learner's data connection brings a shard, checked at the boundary.
#[derive(Debug)]
pub enum LearnerData {
    /// A pull (its `reply_to` is the learner's stand-in, added by the receiver).
    Pull {
        /// Whose.
        learner: LearnerId,
        /// The learner's step.
        seq: u64,
        /// After its last push.
        last: bool,
    },
    /// A gradient, and the pull it carries (whose answer goes to the learner's stand-in).
    Push {
        /// Whose.
        learner: LearnerId,
        /// The learner's step.
        seq: u64,
        /// The clock of the weights it was computed on.
        computed_on: Clock,
        /// The gradient, decoded.
        values: Floats,
        /// The examples it is the mean over.
        examples: u32,
        /// The pull it carries.
        next: NextPull,
    },
    /// A learner group's gradients combined by its aggregator, with its members' pulls.
    Aggregate {
        /// The members, each at most once: their steps, examples and next pulls.
        members: Vec<AggregateMember>,
        /// The clock of the weights they were computed on.
        computed_on: Clock,
        /// The combined gradient, decoded.
        values: Floats,
    },
    /// An elastic exchange's values (the center goes back to the learner's stand-in).
    Exchange(Floats),
}

/// What a shard takes from a learner's data connection: payloads of its range's length, in the
/// job's codecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPolicy {
    /// Values in the shard's range.
    pub range_len: usize,
    /// The codec of pushes (the job's gradients codec).
    pub push: Codec,
    /// The codec of exchanges (the gradients codec for DOWNPOUR and MDOWNPOUR, whose
    /// exchanges add up like gradients; the weights codec for EASGD's parameters).
    pub exchange: Codec,
}

/// Decode a message to a shard from a connection that speaks for the learners `speaks` (the
/// learner it said hello as; for a group's aggregator, the group's members): anything but
/// their own pulls, and their own pushes, aggregates and exchanges of exactly the shard's
/// length in the job's codec (`policy`), is refused before the shard sees it. An aggregate
/// comes only from an aggregator, names each member once, and an exchange only from a learner.
pub fn from_learner_data(
    speaks: &[LearnerId],
    policy: &DataPolicy,
    m: Inbound,
) -> Result<LearnerData, Unexpected> {
    let kind = m.kind();
    let refuse = |what: String| Err(Unexpected { what: format!("{kind:?} {what}") });
    let theirs = |l: &LearnerId| speaks.contains(l);
    let whose = || speaks.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    match m {
        Inbound::Control(Msg::Pull { learner, seq, last }) if theirs(&learner) => {
            Ok(LearnerData::Pull { learner, seq, last })
        }
        Inbound::Push { learner: l, .. } if !theirs(&l) => refuse(format!("that is not {}'s own", whose())),
        Inbound::Exchange { learner: l, .. } if speaks != [l] => {
            refuse(format!("that is not {}'s own", whose()))
        }
        Inbound::Aggregate { ref members, .. }
            if speaks.len() < 2
                || members.is_empty()
                || members.len() > speaks.len()
                || !members.iter().all(|m| theirs(&m.learner))
                || (1..members.len())
                    .any(|i| members[..i].iter().any(|m| m.learner == members[i].learner)) =>
        {
            refuse(format!("that is not a group's, each of {} at most once", whose()))
        }
        Inbound::Push { ref values, .. }
        | Inbound::Exchange { ref values, .. }
        | Inbound::Aggregate { ref values, .. }
            if values.len() != policy.range_len =>
        {
            refuse(format!("of {} values to a shard of {}", values.len(), policy.range_len))
        }
        Inbound::Push { codec, .. } | Inbound::Aggregate { codec, .. } if codec != policy.push => {
            refuse(format!("in {codec}; this job sends gradients in {}", policy.push))
        }
        Inbound::Exchange { codec, .. } if codec != policy.exchange => {
            refuse(format!("in {codec}; this job sends exchanges in {}", policy.exchange))
        }
        Inbound::Push { learner, seq, computed_on, values, examples, next_seq, last, .. } => {
            Ok(LearnerData::Push {
                learner,
                seq,
                computed_on,
                values,
                examples,
                next: NextPull { seq: next_seq, last },
            })
        }
        Inbound::Aggregate { members, computed_on, values, .. } => {
            Ok(LearnerData::Aggregate { members, computed_on, values })
        }
        Inbound::Exchange { values, .. } => Ok(LearnerData::Exchange(values)),
        _ => refuse(format!("that is not {}'s own", whose())),
    }
}

// ---- wire → actor: at a learner ------------------------------------------------------------

/// What the scheduler's connection brings a learner.
#[derive(Debug)]
pub enum ToLearner {
    /// Begin training.
    Start,
    /// Evaluate these weights (echoing `request`).
    Evaluate {
        /// Echoed in the answer.
        request: u64,
        /// The weights, and whether they are the run's final ones.
        evaluate: Evaluate,
    },
    /// The run's summary (JSON), just before it stops.
    Summary(String),
    /// Adaptive batch sizes, per epoch and learner.
    BatchSizes(BatchSizes),
    /// The run is over.
    Stop,
    /// The scheduler is alive.
    Heartbeat,
}

/// Decode a message from the scheduler to a learner.
pub fn to_learner(m: Inbound) -> Result<ToLearner, Unexpected> {
    match m {
        Inbound::Control(Msg::Start) => Ok(ToLearner::Start),
        Inbound::Control(Msg::Stop) => Ok(ToLearner::Stop),
        Inbound::Control(Msg::Summary { json }) => Ok(ToLearner::Summary(json)),
        Inbound::Control(Msg::BatchSizes { sizes }) => {
            Ok(ToLearner::BatchSizes(BatchSizes { sizes: Arc::new(sizes) }))
        }
        Inbound::Control(Msg::Heartbeat) => Ok(ToLearner::Heartbeat),
        Inbound::Control(Msg::Evaluate { request, last, values }) => Ok(ToLearner::Evaluate {
            request,
            evaluate: Evaluate { params: Arc::new(values.to_vec()), last },
        }),
        other => Err(Unexpected::kind(other.kind(), "the scheduler sends a learner")),
    }
}

/// What a shard's connection brings a learner: the answer to a pull or to an exchange.
#[derive(Debug)]
pub enum Answer {
    /// Weights, answering learner `to`'s pull.
    Weights {
        /// Whose pull.
        to: LearnerId,
        /// The weights.
        served: Served,
    },
    /// The center, answering an exchange.
    Center(Center),
}

/// Decode a shard's answer to a learner, in the job's weights codec (`codec`).
pub fn answer(m: Inbound, codec: Codec) -> Result<Answer, Unexpected> {
    match m {
        Inbound::Weights { codec: c, .. } | Inbound::Center { codec: c, .. } if c != codec => {
            Err(Unexpected { what: format!("weights in {c}; this job sends weights in {codec}") })
        }
        Inbound::Weights { shard, learner, seq, clock, values, .. } => {
            Ok(Answer::Weights { to: learner, served: Served { shard, clock, seq, values: values.into() } })
        }
        Inbound::Center { shard, clock, values, .. } => {
            Ok(Answer::Center(Center { shard, clock, values: values.into() }))
        }
        other => Err(Unexpected::kind(other.kind(), "a shard sends a learner")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rudra_proto::{DropReason, Outcome};
    use rudra_transport::reader::{Accepts, decode_frame};
    use rudra_transport::{Encoding, Staleness};

    /// `m` as its receiver sees it: encoded, framed and validated.
    fn over_the_wire(m: Msg) -> Inbound {
        decode_frame(&m.encode().unwrap().to_bytes(), &Accepts::for_kind(m.kind())).unwrap()
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
            updates: vec![UpdateRecord { shard, clock: Clock(9), gradients: 3, payload_in: 512 }],
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
        let push = |learner, n| Msg::Push {
            learner,
            seq: 1,
            computed_on: Clock(0),
            values: vec![1.0; n].into(),
            examples: 1,
            next_seq: 2,
            last: true,
        };
        let policy = DataPolicy { range_len: 4, push: Codec::F32, exchange: Codec::Bf16 };
        let data = |m| from_learner_data(&[me], &policy, over_the_wire(m));
        assert!(matches!(
            data(push(me, 4)),
            Ok(LearnerData::Push { seq: 1, next: NextPull { seq: 2, last: true }, .. })
        ));
        // A group's aggregator speaks for its members: their pushes and aggregates, each member
        // once; a learner sends no aggregate, an aggregator no exchange.
        let group = [LearnerId(0), LearnerId(1)];
        let member = |l, seq| AggregateMember {
            learner: LearnerId(l),
            seq,
            examples: 32,
            next_seq: seq + 1,
            last: false,
        };
        let aggregate = |members: Vec<AggregateMember>, n| Msg::Aggregate {
            members,
            computed_on: Clock(0),
            values: vec![1.0; n].into(),
        };
        let from_group = |m| from_learner_data(&group, &policy, over_the_wire(m));
        assert!(matches!(
            from_group(aggregate(vec![member(0, 3), member(1, 2)], 4)),
            Ok(LearnerData::Aggregate { ref members, computed_on: Clock(0), .. }) if members.len() == 2
        ));
        assert!(matches!(
            from_group(push(LearnerId(1), 4)),
            Ok(LearnerData::Push { learner: LearnerId(1), .. })
        ));
        for (what, m) in [
            ("a member twice", aggregate(vec![member(0, 3), member(0, 4)], 4)),
            ("another group's member", aggregate(vec![member(0, 3), member(2, 1)], 4)),
            ("no member", aggregate(Vec::new(), 4)),
            ("more members than the group", aggregate(vec![member(0, 3); 1000], 4)),
        ] {
            assert!(from_group(m).unwrap_err().what.contains("not a group's"), "{what}");
        }
        assert!(from_group(aggregate(vec![member(1, 1)], 3)).unwrap_err().what.contains("3 values"));
        assert!(data(aggregate(vec![member(0, 1)], 4)).unwrap_err().what.contains("not a group's"));
        let exchange = Msg::Exchange { learner: me, values: vec![1.0; 4].into() };
        assert!(from_group(exchange).unwrap_err().what.contains("not learner-0, learner-1's own"));
        assert!(data(push(me, 3)).unwrap_err().what.contains("3 values"));
        assert!(data(push(LearnerId(1), 4)).unwrap_err().what.contains("not learner-0's own"));
        let bf16 = |values: Vec<f32>| {
            Encoding { codec: Codec::Bf16, ..Encoding::default() }.encode(&values.into(), None)
        };
        assert!(matches!(
            data(Msg::Exchange { learner: me, values: bf16(vec![1.0; 4]) }),
            Ok(LearnerData::Exchange(_))
        ));
        let f32_exchange = Msg::Exchange { learner: me, values: vec![1.0; 4].into() };
        assert!(data(f32_exchange).unwrap_err().what.contains("in f32; this job sends exchanges in bf16"));
        let bf16_push = Msg::Push {
            learner: me,
            seq: 1,
            computed_on: Clock(0),
            values: bf16(vec![1.0; 4]),
            examples: 1,
            next_seq: 2,
            last: false,
        };
        assert!(data(bf16_push).unwrap_err().what.contains("in bf16; this job sends gradients in f32"));
        let weights = |values| Msg::Weights {
            shard: ShardId(0),
            learner: LearnerId(0),
            seq: 1,
            clock: Clock(3),
            values,
        };
        assert!(matches!(
            answer(over_the_wire(weights(vec![1.0; 4].into())), Codec::F32),
            Ok(Answer::Weights { .. })
        ));
        assert!(
            answer(over_the_wire(weights(bf16(vec![1.0; 4]))), Codec::F32).unwrap_err().what.contains("bf16")
        );
        let center = Msg::Center { shard: ShardId(0), clock: Clock(3), values: vec![1.0; 4].into() };
        assert!(matches!(answer(over_the_wire(center), Codec::F32), Ok(Answer::Center(_))));
        let pull = Msg::Pull { learner: LearnerId(1), seq: 1, last: false };
        assert!(data(pull).is_err());
        assert!(data(Msg::Heartbeat).is_err());
        let progress = Msg::Progress {
            learner: LearnerId(3),
            session: 1,
            samples: 1,
            steps: 1,
            loss_sum: 0.0,
            payload_up: 0,
            payload_down: 0,
            wire_bytes: 0,
            compute_seconds: 0.0,
        };
        assert!(from_learner(me, over_the_wire(progress)).is_err(), "someone else's progress");
        assert!(matches!(to_learner(over_the_wire(Msg::Start)), Ok(ToLearner::Start)));
        assert!(to_shard(over_the_wire(Msg::Start)).is_err());
    }

    #[test]
    fn an_evaluation_crosses_the_wire_both_ways() {
        let params = vec![0.5, -1.0, 2.0];
        let asked = Msg::Evaluate { request: 7, last: true, values: params.clone().into() };
        let Ok(ToLearner::Evaluate { request: 7, evaluate }) = to_learner(over_the_wire(asked)) else {
            panic!("an evaluation request reaches the learner");
        };
        assert_eq!((evaluate.params.as_slice(), evaluate.last), (params.as_slice(), true));
        let me = LearnerId(1);
        let answer = |measured| from_learner(me, over_the_wire(Msg::Evaluated { request: 7, measured }));
        assert_eq!(
            answer(Some((0.25, 0.9))),
            Ok(FromLearner::Evaluated { request: 7, measured: Some(Measured { loss: 0.25, accuracy: 0.9 }) })
        );
        assert_eq!(answer(None), Ok(FromLearner::Evaluated { request: 7, measured: None }));
        let refused = Msg::Evaluate { request: 1, last: false, values: params.into() };
        assert!(from_learner(me, over_the_wire(refused)).is_err(), "learners do not ask");
    }
}
