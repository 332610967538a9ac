//! Every message the actors exchange, one struct each with its reply type, grouped by the
//! actor that handles it. A sender names only the message and a `Recipient`, never the actor
//! behind it, so the same shard or learner runs next to local peers or remote stand-ins.

use std::collections::BTreeSet;

use actix::prelude::*;
use rudra_transport::{Clock, LearnerId, Payload, ShardId};
use serde::{Deserialize, Serialize};

use crate::ActorError;
use crate::protocol::{GradientRecord, StalenessSummary, UpdateRecord, Weights};

// ---- to a shard --------------------------------------------------------------------------

/// A learner asks for the shard's weights; they are sent to `reply_to`, maybe later.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Pull {
    /// Who asks.
    pub learner: LearnerId,
    /// The learner's step it is for (see [`SgdShard::on_pull`](crate::protocol::SgdShard::on_pull)).
    pub seq: u64,
    /// Whether the learner has pushed its last gradient (see
    /// [`SgdShard::on_last_pull`](crate::protocol::SgdShard::on_last_pull)).
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
    /// The learner's next pull, carried by the push: the shard takes the push, then the pull.
    pub then: Pull,
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
    pub reply_to: Recipient<Served>,
}

/// The current weights, without gating, for evaluation and checkpoints.
#[derive(Message)]
#[rtype(result = "Weights")]
pub struct Snapshot;

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

/// Weights served to a learner, answering its pull `seq` (0 for a center's answer).
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

/// Begin the loop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartLearner;

/// Stop the actor.
#[derive(Message, Clone, Debug, Default)]
#[rtype(result = "()")]
pub struct StopLearner {
    /// Why the run was stopped, when it failed: a node on another host is told.
    pub failure: Option<String>,
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

/// What a learner has done since it started: the totals of one learner actor's life, told
/// again every few steps. Totals rather than increments, so a report lost on the way (a
/// scheduler that died, a connection that dropped) loses nothing: the next one carries it.
#[derive(Message, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Progress {
    /// The learner.
    pub learner: LearnerId,
    /// Which life of the learner these totals count: a learner started again starts from 0
    /// under a new session.
    pub session: u64,
    /// Examples in the minibatches computed.
    pub samples: u64,
    /// Gradients computed.
    pub steps: u64,
    /// Sum of the minibatches' mean training losses.
    pub loss_sum: f64,
    /// Payload bytes (values and scales, as encoded) the learner sent and received.
    pub payload_bytes: u64,
    /// Frame bytes its connections sent and received (0 in one process).
    pub wire_bytes: u64,
}

impl Progress {
    /// Nothing computed yet by `learner` in a new session, unlike any other's.
    #[must_use]
    pub fn start(learner: LearnerId) -> Self {
        // Each `RandomState` draws fresh keys: its hash of a constant is a random number.
        let session = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        Self { learner, session, samples: 0, steps: 0, loss_sum: 0.0, payload_bytes: 0, wire_bytes: 0 }
    }

    /// What these totals add to `earlier`, the last totals taken from the same learner: the
    /// difference within a session, all of them from a new one, nothing from an older report
    /// of the same session.
    #[must_use]
    pub fn since(&self, earlier: Option<&Progress>) -> Option<Progress> {
        let Some(e) = earlier.filter(|e| e.session == self.session) else { return Some(self.clone()) };
        (self.steps >= e.steps && self.samples >= e.samples).then(|| Progress {
            samples: self.samples - e.samples,
            steps: self.steps - e.steps,
            loss_sum: self.loss_sum - e.loss_sum,
            payload_bytes: self.payload_bytes.saturating_sub(e.payload_bytes),
            wire_bytes: self.wire_bytes.saturating_sub(e.wire_bytes),
            ..self.clone()
        })
    }
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

/// What the tracker knows (kept in a restarting scheduler's state).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TrackerReport {
    /// Staleness over all shards' gradients.
    pub staleness: StalenessSummary,
    /// Updates applied by the shard that applied the most (shards advance together).
    pub updates: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(p: &Progress, samples: u64, steps: u64) -> Progress {
        let loss_sum = steps as f64 * 0.5;
        Progress { samples, steps, loss_sum, payload_bytes: 10 * steps, wire_bytes: 20 * steps, ..p.clone() }
    }

    #[test]
    fn totals_count_what_a_lost_report_carried_once() {
        let first = Progress::start(LearnerId(2));
        let (a, b, c) = (totals(&first, 64, 2), totals(&first, 128, 4), totals(&first, 320, 10));
        assert_eq!(a.since(None), Some(a.clone()));
        // `b` was lost on the way: `c` carries its steps, and the three add up to c's totals.
        let after_a = c.since(Some(&a)).unwrap();
        assert_eq!((after_a.samples, after_a.steps, after_a.loss_sum), (256, 8, 4.0));
        assert_eq!((after_a.payload_bytes, after_a.wire_bytes, after_a.learner), (80, 160, LearnerId(2)));
        assert_eq!(b.since(Some(&c)), None, "an older report of the same session adds nothing");
        assert_eq!(c.since(Some(&c)).map(|d| d.samples), Some(0));
    }

    #[test]
    fn a_new_session_counts_from_zero() {
        let (old, new) = (Progress::start(LearnerId(0)), Progress::start(LearnerId(0)));
        assert_ne!(old.session, new.session);
        let restarted = totals(&new, 32, 1);
        assert_eq!(restarted.since(Some(&totals(&old, 640, 20))), Some(restarted.clone()));
    }
}
