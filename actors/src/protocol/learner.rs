//! The learner loop of every Rudra protocol: pull from every shard → compute one gradient on
//! the assembled weights → push each shard its slice tagged with that shard's clock → repeat.
//! One gradient is outstanding per learner. After its last push a learner pulls once more and
//! finishes when those weights arrive: they come after its last gradient was applied, so the
//! run never ends with a gradient still in flight.

use rudra_transport::{Clock, LearnerId, ShardId};

use crate::ActorError;

/// An effect of the learner core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LearnerEvent {
    /// Ask this shard for its current weights; `last` after the final push (the answer only
    /// confirms that push was applied, and the shard expects no further gradient).
    Pull {
        /// The shard.
        shard: ShardId,
        /// Whether this is the learner's last pull.
        last: bool,
    },
    /// Every shard has answered: compute a gradient on the assembled weights.
    Compute,
    /// Send this shard its slice of the gradient, computed on its weights `computed_on`.
    Push {
        /// The destination.
        shard: ShardId,
        /// The clock of that shard's weights the gradient was computed on.
        computed_on: Clock,
    },
    /// The learner has done all its steps and its last gradient has been applied.
    Finished,
}

/// The learner loop's state.
#[derive(Clone, Debug)]
pub struct LearnerCore {
    id: LearnerId,
    /// Clock of the weights received from each shard for the current step.
    received: Vec<Option<Clock>>,
    steps_done: u64,
    steps_total: u64,
    computing: bool,
}

impl LearnerCore {
    /// A learner that will compute `steps_total` gradients against `shards` shards.
    #[must_use]
    pub fn new(id: LearnerId, shards: usize, steps_total: u64) -> Self {
        Self { id, received: vec![None; shards], steps_done: 0, steps_total, computing: false }
    }

    /// The learner's id.
    #[must_use]
    pub fn id(&self) -> LearnerId {
        self.id
    }

    /// Gradients computed so far (the learner's local clock).
    #[must_use]
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Begin: pull from every shard (or finish at once if there is nothing to do).
    #[must_use]
    pub fn on_start(&mut self) -> Vec<LearnerEvent> {
        if self.steps_total == 0 { vec![LearnerEvent::Finished] } else { self.pull_all(false) }
    }

    fn pull_all(&self, last: bool) -> Vec<LearnerEvent> {
        (0..self.received.len() as u32).map(|s| LearnerEvent::Pull { shard: ShardId(s), last }).collect()
    }

    /// Weights from `shard` at `clock` arrived. Once every shard answered: `Compute`, or
    /// `Finished` after the last step.
    pub fn on_weights(&mut self, shard: ShardId, clock: Clock) -> Result<Option<LearnerEvent>, ActorError> {
        let slot = self
            .received
            .get_mut(shard.index())
            .ok_or_else(|| ActorError::Protocol(format!("{} got weights from unknown {shard}", self.id)))?;
        if self.computing || slot.is_some() {
            return Err(ActorError::Protocol(format!("{} got unrequested weights from {shard}", self.id)));
        }
        *slot = Some(clock);
        if !self.received.iter().all(Option::is_some) {
            return Ok(None);
        }
        if self.steps_done >= self.steps_total {
            self.received.fill(None);
            return Ok(Some(LearnerEvent::Finished));
        }
        self.computing = true;
        Ok(Some(LearnerEvent::Compute))
    }

    /// The gradient is computed: push it to every shard, then pull again or finish.
    pub fn on_computed(&mut self) -> Result<Vec<LearnerEvent>, ActorError> {
        if !self.computing {
            return Err(ActorError::Protocol(format!("{} finished a computation it never started", self.id)));
        }
        self.computing = false;
        self.steps_done += 1;
        let mut events: Vec<LearnerEvent> = self
            .received
            .iter_mut()
            .enumerate()
            .filter_map(|(s, c)| {
                c.take().map(|computed_on| LearnerEvent::Push { shard: ShardId(s as u32), computed_on })
            })
            .collect();
        events.extend(self.pull_all(self.steps_done >= self.steps_total));
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_pulls_computes_pushes_and_finishes() {
        let mut l = LearnerCore::new(LearnerId(3), 2, 2);
        let pull = |s, last| LearnerEvent::Pull { shard: ShardId(s), last };
        assert_eq!(l.on_start(), vec![pull(0, false), pull(1, false)]);
        assert_eq!(l.on_weights(ShardId(1), Clock(5)).unwrap(), None);
        assert!(l.on_weights(ShardId(1), Clock(5)).is_err(), "twice from one shard");
        assert_eq!(l.on_weights(ShardId(0), Clock(4)).unwrap(), Some(LearnerEvent::Compute));
        let ev = l.on_computed().unwrap();
        assert_eq!(ev[0], LearnerEvent::Push { shard: ShardId(0), computed_on: Clock(4) });
        assert_eq!(ev[1], LearnerEvent::Push { shard: ShardId(1), computed_on: Clock(5) });
        assert_eq!(&ev[2..], &[pull(0, false), pull(1, false)]);
        l.on_weights(ShardId(0), Clock(6)).unwrap();
        l.on_weights(ShardId(1), Clock(6)).unwrap();
        let last = l.on_computed().unwrap();
        assert_eq!(&last[2..], &[pull(0, true), pull(1, true)], "the last pushes, then a last pull");
        assert_eq!(l.steps_done(), 2);
        assert_eq!(l.on_weights(ShardId(0), Clock(7)).unwrap(), None);
        assert_eq!(l.on_weights(ShardId(1), Clock(7)).unwrap(), Some(LearnerEvent::Finished));
        assert!(l.on_computed().is_err());
        assert!(l.on_weights(ShardId(9), Clock(0)).is_err());
    }
}
