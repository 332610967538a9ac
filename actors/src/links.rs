//! How each actor reaches its peers: bundles of `Recipient`s, the same whether the peer is an
//! actor in this process or a stand-in for one on another node ([`crate::remote::RemoteShard`],
//! [`crate::remote::RemoteLearner`], [`crate::remote::RemoteScheduler`]).

use std::ops::Range;

use actix::dev::ToEnvelope;
use actix::prelude::*;

use crate::messages::{
    BatchSizes, Evaluate, Exchange, GetStats, Heartbeat, LearnerDone, Membership, Progress, Pull, Push,
    Snapshot, StartLearner, StopLearner, StopShard,
};

/// How a learner reaches one shard.
#[derive(Clone)]
pub struct ShardLink {
    /// The shard's parameter range in the flat vector.
    pub range: Range<usize>,
    /// Where pulls go.
    pub pull: Recipient<Pull>,
    /// Where pushes go.
    pub push: Recipient<Push>,
    /// Where elastic exchanges go.
    pub exchange: Recipient<Exchange>,
}

impl ShardLink {
    /// The link to anything that takes a shard's learner messages, holding `range`.
    #[must_use]
    pub fn of<A>(range: Range<usize>, addr: &Addr<A>) -> Self
    where
        A: Actor + Handler<Pull> + Handler<Push> + Handler<Exchange>,
        A::Context: ToEnvelope<A, Pull> + ToEnvelope<A, Push> + ToEnvelope<A, Exchange>,
    {
        Self {
            range,
            pull: addr.clone().recipient(),
            push: addr.clone().recipient(),
            exchange: addr.clone().recipient(),
        }
    }
}

/// Where a learner reports.
#[derive(Clone)]
pub struct SchedulerLink {
    /// Per-step progress.
    pub progress: Recipient<Progress>,
    /// Completion or failure.
    pub done: Recipient<LearnerDone>,
    /// I am alive.
    pub heartbeat: Recipient<Heartbeat>,
}

impl SchedulerLink {
    /// The link to anything that takes a scheduler's learner messages.
    #[must_use]
    pub fn of<A>(addr: &Addr<A>) -> Self
    where
        A: Actor + Handler<Progress> + Handler<LearnerDone> + Handler<Heartbeat>,
        A::Context: ToEnvelope<A, Progress> + ToEnvelope<A, LearnerDone> + ToEnvelope<A, Heartbeat>,
    {
        Self {
            progress: addr.clone().recipient(),
            done: addr.clone().recipient(),
            heartbeat: addr.clone().recipient(),
        }
    }
}

/// How the scheduler reaches one shard.
#[derive(Clone)]
pub struct ShardHandle {
    /// Weights for evaluation.
    pub snapshot: Recipient<Snapshot>,
    /// The end of the run.
    pub stop: Recipient<StopShard>,
    /// The active learners changed.
    pub membership: Recipient<Membership>,
}

impl ShardHandle {
    /// The handle of anything that takes a shard's scheduler messages.
    #[must_use]
    pub fn of<A>(addr: &Addr<A>) -> Self
    where
        A: Actor + Handler<Snapshot> + Handler<StopShard> + Handler<Membership>,
        A::Context: ToEnvelope<A, Snapshot> + ToEnvelope<A, StopShard> + ToEnvelope<A, Membership>,
    {
        Self {
            snapshot: addr.clone().recipient(),
            stop: addr.clone().recipient(),
            membership: addr.clone().recipient(),
        }
    }
}

/// How the scheduler reaches one learner.
#[derive(Clone)]
pub struct LearnerHandle {
    /// The start of the run.
    pub start: Recipient<StartLearner>,
    /// The end of the run.
    pub stop: Recipient<StopLearner>,
    /// Weights to evaluate with the learner's own model (an external model's).
    pub evaluate: Recipient<Evaluate>,
    /// Adaptive batch sizes.
    pub sizes: Recipient<BatchSizes>,
}

impl LearnerHandle {
    /// The handle of anything that takes a learner's scheduler messages.
    #[must_use]
    pub fn of<A>(addr: &Addr<A>) -> Self
    where
        A: Actor + Handler<StartLearner> + Handler<StopLearner> + Handler<Evaluate> + Handler<BatchSizes>,
        A::Context: ToEnvelope<A, StartLearner>
            + ToEnvelope<A, StopLearner>
            + ToEnvelope<A, Evaluate>
            + ToEnvelope<A, BatchSizes>,
    {
        Self {
            start: addr.clone().recipient(),
            stop: addr.clone().recipient(),
            evaluate: addr.clone().recipient(),
            sizes: addr.clone().recipient(),
        }
    }
}

/// The nodes the scheduler drives.
#[derive(Clone)]
pub struct Members {
    /// Shards, in id order.
    pub shards: Vec<ShardHandle>,
    /// Learners, in id order.
    pub learners: Vec<LearnerHandle>,
    /// The staleness tracker's statistics.
    pub stats: Recipient<GetStats>,
    /// The learner groups' aggregators, told who is active as the shards are.
    pub aggregators: Vec<Recipient<Membership>>,
}
