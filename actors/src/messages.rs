//! Every message the actors exchange, one struct each with its reply type, grouped by the
//! actor that handles it. A sender names only the message and a `Recipient`, never the actor
//! behind it, so the same shard or learner runs next to local peers or remote stand-ins.

use std::collections::BTreeSet;
use std::sync::Arc;

use actix::prelude::*;
use rudra_transport::{Clock, LearnerId, Payload, ShardId};

use crate::ActorError;
pub use crate::report::{Progress, TrackerReport};
use rudra_proto::{Contribution, GradientRecord, UpdateRecord, Weights};

// ---- to a shard --------------------------------------------------------------------------

/// A learner asks for the shard's weights; they are sent to `reply_to`, maybe later.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Pull {
    /// Who asks.
    pub learner: LearnerId,
    /// The learner's step it is for (see [`SgdShard::on_pull`](rudra_proto::SgdShard::on_pull)).
    pub seq: u64,
    /// Whether the learner has pushed its last gradient (see
    /// [`SgdShard::on_last_pull`](rudra_proto::SgdShard::on_last_pull)).
    pub last: bool,
    /// Where the weights go.
    pub reply_to: Recipient<Served>,
}

/// A learner's gradient for this shard's range, viewed in the learner's gradient buffer (or in
/// the frame it arrived in), never copied.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Push {
    /// Who computed it.
    pub learner: LearnerId,
    /// The learner's step, so the gradient is applied once however often it arrives.
    pub seq: u64,
    /// The clock of this shard's weights it was computed on.
    pub computed_on: Clock,
    /// This shard's part of the gradient, encoded with the job's gradients codec.
    pub values: Payload,
    /// The examples it is the mean over.
    pub examples: u32,
    /// The learner's next pull, carried by the push: the shard takes the push, then the pull.
    pub then: Pull,
}

/// A learner group's gradients for this shard on one clock, combined by the group's aggregator
/// (`docs/src/algorithms.md` §4.2): the mean over all the members' examples, with every member's
/// pull riding on it.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Aggregate {
    /// Whose gradients, at which of their steps, over how many examples each.
    pub members: Vec<Contribution>,
    /// The clock of this shard's weights they were all computed on.
    pub computed_on: Clock,
    /// The combined gradient, encoded with the job's gradients codec.
    pub values: Payload,
    /// The members' next pulls, in the order of `members`.
    pub then: Vec<Pull>,
}

/// A learner's exchange with a center shard: its values for the shard's range (x^i, DOWNPOUR's
/// `v`, or MDOWNPOUR's gradient); the center is sent to `reply_to`.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Exchange {
    /// Who sends.
    pub learner: LearnerId,
    /// The values for this shard's range, encoded with the job's codec for their kind.
    pub values: Payload,
    /// Where the center goes.
    pub reply_to: Recipient<Center>,
}

/// The current weights, without gating, for evaluation and checkpoints.
#[derive(Message)]
#[rtype(result = "Weights")]
pub struct Snapshot;

/// Scheduler → learner: measure these weights with the model's own evaluation (a run whose
/// scheduler cannot evaluate its model: an external model's); `last` marks the run's final
/// weights, which the learner keeps as its result. Answers `(loss, accuracy)`, or `None` from a
/// learner whose model has no evaluation.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Option<Measured>")]
pub struct Evaluate {
    /// The whole parameter vector.
    pub params: Arc<Vec<f32>>,
    /// These are the run's final weights.
    pub last: bool,
}

/// A learner's evaluation of some weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Mean test loss.
    pub loss: f64,
    /// Test accuracy in `[0, 1]`.
    pub accuracy: f64,
}

/// The active learners changed; a hardsync round or an EASGD sync round waits only for them.
#[derive(Message, Clone, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Membership {
    /// The learners now active.
    pub active: BTreeSet<LearnerId>,
}

/// The shard crashes, as a process would: it loses everything in memory and ignores every
/// message until [`Restart`]. Answers the clock it had.
#[derive(Message)]
#[rtype(result = "Clock")]
pub struct Crash;

/// The crashed shard comes back from its last checkpoint. Answers the clock it resumes at.
#[derive(Message)]
#[rtype(result = "Result<Clock, ActorError>")]
pub struct Restart;

/// Flush reports and stop.
#[derive(Message, Clone, Debug, Default)]
#[rtype(result = "()")]
pub struct StopShard {
    /// Why the run was stopped, when it failed: a node on another host is told.
    pub failure: Option<String>,
}

// ---- to a learner ------------------------------------------------------------------------

/// Weights served to a learner, answering its pull `seq`.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Served {
    /// The shard that served them.
    pub shard: ShardId,
    /// Their timestamp `i`.
    pub clock: Clock,
    /// The sequence number of the pull answered.
    pub seq: u64,
    /// The values of the shard's range, encoded with the job's weights codec.
    pub values: Payload,
}

/// A center shard's answer to a learner's exchange: the center variable of its range.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Center {
    /// The shard.
    pub shard: ShardId,
    /// Its clock.
    pub clock: Clock,
    /// The values of the shard's range, encoded with the job's weights codec.
    pub values: Payload,
}

/// Begin the loop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartLearner;

/// Adaptive batch sizes: every learner's minibatch size in each epoch chosen so far, from
/// epoch 0 (`sizes[e][l]`, [`rudra_proto::BatchPlanner`]).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct BatchSizes {
    /// The sizes, per epoch and learner.
    pub sizes: Arc<Vec<Vec<u32>>>,
}

/// Stop the actor.
#[derive(Message, Clone, Debug, Default)]
#[rtype(result = "()")]
pub struct StopLearner {
    /// Why the run was stopped, when it failed: a node on another host is told.
    pub failure: Option<String>,
    /// The run's summary (`summary.json`), when it ended without an error and the scheduler
    /// makes one: a learner on another host is given it.
    pub summary: Option<Arc<str>>,
}

/// Where each shard's answers to this learner go, in shard order (through the faulty links the
/// run gives it, if any): a learner's node hands the answers that arrive over the network
/// there. `M` is what its protocol family's shards answer with ([`Served`] or [`Center`]).
pub struct AnswerRoutes<M>(std::marker::PhantomData<fn() -> M>);

impl<M> Default for AnswerRoutes<M> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<M: Message<Result = ()> + Send + 'static> Message for AnswerRoutes<M> {
    type Result = Vec<Recipient<M>>;
}

// ---- to the scheduler --------------------------------------------------------------------

/// A node joined the run.
#[derive(Message)]
#[rtype(result = "()")]
pub enum Joined {
    /// A shard.
    Shard(ShardId),
    /// A learner.
    Learner(LearnerId),
}

/// A shard restarted and resumed from its checkpoint at this clock (to the scheduler).
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Resumed(pub Clock);

/// Panic inside the actor, as a bug would (`[[faults.panic]]`): the process ends.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct InjectedPanic;

/// Whether a node holds its place in the run, as the failure detector sees it: a second
/// process of its name is refused while it does.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "bool")]
pub enum IsAlive {
    /// A shard.
    Shard(ShardId),
    /// A learner.
    Learner(LearnerId),
}

/// A learner is alive (sent every [`Liveness::heartbeat`](crate::faults::Liveness)).
#[derive(Message, Clone, Copy, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Heartbeat(pub LearnerId);

/// A shard is alive (sent every [`Liveness::heartbeat`](crate::faults::Liveness) by a shard on
/// another node).
#[derive(Message, Clone, Copy, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct ShardAlive(pub ShardId);

/// A shard failed and said why: the run cannot go on without it and stops.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct ShardFailed {
    /// Which shard.
    pub shard: ShardId,
    /// Its reason.
    pub reason: String,
}

/// The connection to a learner group's aggregator (on another node) ended: the group's rounds
/// are gone with it, and the run stops.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct AggregatorLost {
    /// The group.
    pub group: u32,
    /// How its connection ended.
    pub why: String,
}

/// The transport lost its connection to a learner.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Disconnected(pub LearnerId);

/// Add an entry to the run's timeline (a fault injected by a fault plan).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Note(pub String);

/// The connection to a shard is gone: it crashed or is cut off. Unless it is back (a
/// [`ShardRestarted`]) within the scheduler's shard timeout, the run is stopped.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct ShardLost(pub ShardId);

/// A crashed shard came back from its checkpoint at clock `resumed`, or could not.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct ShardRestarted {
    /// Which shard.
    pub shard: ShardId,
    /// Its clock when it crashed.
    pub crashed_at: Clock,
    /// The clock it resumed at, or why it could not.
    pub resumed: Result<Clock, String>,
}

/// A learner finished its steps, or failed with `error`.
#[derive(Message, Clone, Debug, PartialEq)]
#[rtype(result = "()")]
pub struct LearnerDone {
    /// Who.
    pub learner: LearnerId,
    /// Why it stopped early, if it did.
    pub error: Option<String>,
}

/// Ask the scheduler for what a restarted scheduler would need to go on.
#[derive(Message)]
#[rtype(result = "crate::report::SchedulerState")]
pub struct GetState;

// ---- to the staleness tracker ------------------------------------------------------------

/// A batch of records from one shard.
#[derive(Message, Clone, Default, Debug, PartialEq)]
#[rtype(result = "()")]
pub struct Records {
    /// Gradients applied or dropped.
    pub gradients: Vec<GradientRecord>,
    /// Updates applied.
    pub updates: Vec<UpdateRecord>,
}

impl Records {
    /// Whether there is nothing to report.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.gradients.is_empty() && self.updates.is_empty()
    }
}

/// Ask for the statistics so far.
#[derive(Message)]
#[rtype(result = "TrackerReport")]
pub struct GetStats;
