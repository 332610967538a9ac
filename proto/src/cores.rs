//! The core a shard runs ([`ShardCore`]: Rudra's SGD shard or the EASGD family's center), one
//! enum so that one shard actor drives either, and the loop a learner runs ([`LearnerLoop`]),
//! built once from the run's protocol; the learner actor is generic over the loop inside.

use std::collections::BTreeSet;

use crate::{Clock, Contribution, LearnerId, ShardId};

use super::{CenterShard, CoreError, ElasticWorker, LearnerCore, SgdShard, ShardEvent, ShardState, Weights};

/// The protocol core a shard runs.
#[derive(Debug)]
// One per shard actor, built once and never moved on a hot path.
#[allow(clippy::large_enum_variant)]
pub enum ShardCore {
    /// Rudra's SGD shard.
    Sgd(SgdShard),
    /// The EASGD family's center variable.
    Center(CenterShard),
}

impl ShardCore {
    /// The current weights (or center), without gating.
    #[must_use]
    pub fn snapshot(&self) -> Weights {
        match self {
            Self::Sgd(c) => c.snapshot(),
            Self::Center(c) => c.snapshot(),
        }
    }

    /// The shard's id.
    #[must_use]
    pub fn id(&self) -> ShardId {
        match self {
            Self::Sgd(c) => c.id(),
            Self::Center(c) => c.id(),
        }
    }

    /// The shard's clock: updates (or exchanges) applied.
    #[must_use]
    pub fn clock(&self) -> Clock {
        match self {
            Self::Sgd(c) => c.clock(),
            Self::Center(c) => c.clock(),
        }
    }

    /// What a checkpoint keeps.
    #[must_use]
    pub fn state(&self) -> ShardState {
        match self {
            Self::Sgd(c) => c.state(),
            Self::Center(c) => c.state(),
        }
    }

    /// Continue from a checkpoint's `state` (see [`SgdShard::restore`]).
    pub fn restore(&mut self, state: ShardState) -> Result<(), CoreError> {
        match self {
            Self::Sgd(c) => c.restore(state),
            Self::Center(c) => c.restore(state),
        }
    }

    /// A learner's pull for its step `seq` (`last`: after its last push); a center refuses it.
    pub fn on_pull(
        &mut self,
        learner: LearnerId,
        seq: u64,
        last: bool,
    ) -> Result<Vec<ShardEvent>, CoreError> {
        match self {
            Self::Sgd(c) if last => c.on_last_pull(learner, seq),
            Self::Sgd(c) => c.on_pull(learner, seq),
            Self::Center(_) => Err(refused("a pull", "holds a center")),
        }
    }

    /// The gradient for this shard's range of one learner, or a group's aggregate of its
    /// `members`' gradients (see [`SgdShard::on_aggregate`]); a center refuses it.
    pub fn on_push(
        &mut self,
        members: &[Contribution],
        computed_on: Clock,
        gradient: &[f32],
    ) -> Result<Vec<ShardEvent>, CoreError> {
        match self {
            Self::Sgd(c) => c.on_aggregate(members, computed_on, gradient),
            Self::Center(_) => Err(refused("a push", "holds a center")),
        }
    }

    /// A learner's exchange with the center; an SGD shard refuses it.
    pub fn on_exchange(&mut self, learner: LearnerId, values: &[f32]) -> Result<Vec<ShardEvent>, CoreError> {
        match self {
            Self::Center(c) => c.on_exchange(learner, values),
            Self::Sgd(_) => Err(refused("an exchange", "runs SGD")),
        }
    }

    /// A quorum round's grace window is over (see [`ShardEvent::Quorum`]).
    pub fn on_grace_over(&mut self, clock: Clock) -> Vec<ShardEvent> {
        match self {
            Self::Sgd(c) => c.on_grace_over(clock),
            Self::Center(c) => c.on_grace_over(clock),
        }
    }

    /// The round `learner`'s next exchange with a center belongs to (the clock for an SGD
    /// shard, whose pushes carry theirs).
    #[must_use]
    pub fn round_of(&self, learner: LearnerId) -> Clock {
        match self {
            Self::Sgd(c) => c.clock(),
            Self::Center(c) => c.round_of(learner),
        }
    }

    /// The active learners changed.
    pub fn on_membership(&mut self, active: BTreeSet<LearnerId>) -> Vec<ShardEvent> {
        match self {
            Self::Sgd(c) => c.on_membership(active),
            Self::Center(c) => c.on_membership(active),
        }
    }
}

fn refused(what: &str, because: &str) -> CoreError {
    CoreError::Protocol(format!("{what} to a shard that {because}"))
}

/// The loop a learner runs.
#[derive(Debug)]
pub enum LearnerLoop {
    /// Pull, compute, push (hardsync, softsync, async).
    Sgd(LearnerCore),
    /// Local steps and periodic exchanges (the EASGD family).
    Elastic(Box<ElasticWorker>),
}

impl LearnerLoop {
    /// The loop of a learner's `incarnation`-th start: its step numbers follow every earlier
    /// incarnation's (see [`LearnerCore::incarnation_base`]).
    #[must_use]
    pub fn incarnation(self, incarnation: u32) -> Self {
        match self {
            Self::Sgd(c) => Self::Sgd(c.with_seq_base(LearnerCore::incarnation_base(incarnation))),
            elastic @ Self::Elastic(_) => elastic,
        }
    }
}
