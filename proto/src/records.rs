//! What the shard cores report and keep: weights at a clock, the record of every gradient and
//! update, the effects a shard asks its driver to carry out, and the state a checkpoint holds.

use std::collections::BTreeMap;

use crate::{Clock, Floats, LearnerId, Outcome, PushWindow, ShardId, Staleness};
use serde::Serialize;

use super::CoreError;

/// A shard's weights at one clock, shared without copying between the shard and its readers.
#[derive(Clone, Debug)]
pub struct Weights {
    /// The shard that served them.
    pub shard: ShardId,
    /// Their timestamp `i`.
    pub clock: Clock,
    /// The values of the shard's parameter range.
    pub values: Floats,
}

/// What a shard keeps across a restart, in its checkpoints: everything that defines its
/// future updates. What is in flight (held gradients, an open round, deferred pulls) is not
/// kept: learners send their pulls again, and a gradient computed on weights newer than the
/// restored ones is refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardState {
    /// The clock `i`.
    pub clock: Clock,
    /// The parameters of the shard's range, or the center x̃ for the EASGD family.
    pub values: Vec<f32>,
    /// Optimizer state beside the values (MDOWNPOUR's velocity); empty when there is none.
    pub velocity: Vec<f32>,
    /// Gradients received so far: where the learning-rate schedule is.
    pub received: u64,
    /// The pushes accepted from each learner, so a push applied before the checkpoint is never
    /// applied again.
    pub last_pushed: BTreeMap<LearnerId, PushWindow>,
}

impl ShardState {
    /// Refuse a state that does not fit a shard of `len` values (`velocity`: whether the
    /// shard keeps a velocity).
    pub fn check(&self, len: usize, velocity: bool) -> Result<(), CoreError> {
        if self.values.len() != len {
            return Err(CoreError::Protocol(format!(
                "the saved state holds {} values; this shard holds {len}",
                self.values.len()
            )));
        }
        let want = if velocity { len } else { 0 };
        if self.velocity.len() != want {
            return Err(CoreError::Protocol(format!(
                "the saved state holds {} velocity values; this shard needs {want}",
                self.velocity.len()
            )));
        }
        Ok(())
    }
}

/// One gradient's fate at a shard.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GradientRecord {
    /// The shard.
    pub shard: ShardId,
    /// The learner that computed it.
    pub learner: LearnerId,
    /// The clock of the weights it was computed on, `j`.
    pub computed_on: Clock,
    /// `σ = i − j` at the moment it was applied or dropped.
    pub staleness: Staleness,
    /// Applied or dropped.
    pub outcome: Outcome,
}

/// One update a shard applied.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct UpdateRecord {
    /// The shard.
    pub shard: ShardId,
    /// The clock after the update.
    pub clock: Clock,
    /// Gradients combined into it.
    pub gradients: usize,
    /// Payload bytes of the pushes or exchanges the shard received since its previous update:
    /// filled by the shard's driver, which sees them encoded (0 from a core).
    pub payload_in: u64,
}

/// An effect of a shard core (SGD or center), for its driver to carry out.
#[derive(Clone, Debug)]
pub enum ShardEvent {
    /// Send these weights to the learner: the answer to its pull (possibly deferred).
    Serve {
        /// Who asked.
        learner: LearnerId,
        /// The sequence number of the pull answered.
        seq: u64,
        /// What to send.
        weights: Weights,
    },
    /// Send the center to the learner: a center shard's answer to its exchange.
    Center {
        /// Who exchanged.
        learner: LearnerId,
        /// The center of the shard's range.
        weights: Weights,
    },
    /// Report a gradient's (or an exchange's) fate to the staleness tracker.
    Gradient(GradientRecord),
    /// Report an applied update.
    Update(UpdateRecord),
    /// A synchronous round with a quorum (hardsync, sync EASGD, sync DiLoCo) holds it,
    /// `missing` contributions short of all: start its grace window, then call
    /// [`ShardCore::on_grace_over`](crate::ShardCore::on_grace_over).
    Quorum {
        /// The round's clock.
        clock: Clock,
        /// Contributions on its weights still to come.
        missing: usize,
    },
}
