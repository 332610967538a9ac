//! The learner loop of every Rudra protocol: pull from every shard → compute one gradient on
//! the assembled weights → push each shard its slice tagged with that shard's clock → repeat.
//! One gradient is outstanding per learner. After its last push a learner pulls once more and
//! finishes when those weights arrive: they come after its last gradient was applied, so the
//! run never ends with a gradient still in flight.

use crate::{Clock, LearnerId, ShardId};

use super::CoreError;

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
        /// The step it is for; the answer carries it back.
        seq: u64,
    },
    /// Every shard has answered: compute a gradient on the assembled weights.
    Compute,
    /// Send this shard its slice of the gradient, computed on its weights `computed_on`, and
    /// with it, in the same message, the pull of the next step: one message and one round
    /// trip per step. The shard takes the push, then the pull.
    Push {
        /// The destination.
        shard: ShardId,
        /// The clock of that shard's weights the gradient was computed on.
        computed_on: Clock,
        /// The step, so that the shard applies each gradient once.
        seq: u64,
        /// The pull that rides on the push.
        pull: NextPull,
    },
    /// The learner has done all its steps and its last gradient has been applied.
    Finished,
}

/// The pull of the next step, carried by a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextPull {
    /// The step it is for.
    pub seq: u64,
    /// Whether it is the learner's last pull.
    pub last: bool,
}

/// The learner loop's state.
#[derive(Clone, Debug)]
pub struct LearnerCore {
    id: LearnerId,
    /// Clock of the weights received from each shard for the current step.
    received: Vec<Option<Clock>>,
    /// Clock of the weights each shard's part of the last gradient was computed on.
    pushed: Vec<Option<Clock>>,
    steps_done: u64,
    steps_total: u64,
    computing: bool,
    /// Added to every step's sequence number: a restarted learner counts on from a new base,
    /// so none of its messages looks like a copy of one sent before it restarted.
    seq_base: u64,
}

impl LearnerCore {
    /// A learner that will compute `steps_total` gradients against `shards` shards.
    #[must_use]
    pub fn new(id: LearnerId, shards: usize, steps_total: u64) -> Self {
        Self {
            id,
            received: vec![None; shards],
            pushed: vec![None; shards],
            steps_done: 0,
            steps_total,
            computing: false,
            seq_base: 0,
        }
    }

    /// Number this learner's steps from `base` (see [`LearnerCore::incarnation_base`]).
    #[must_use]
    pub fn with_seq_base(mut self, base: u64) -> Self {
        self.seq_base = base;
        self
    }

    /// The sequence base of a learner's `incarnation`-th start (0 for the first): above every
    /// sequence number its earlier incarnations can have used.
    #[must_use]
    pub fn incarnation_base(incarnation: u32) -> u64 {
        u64::from(incarnation) << 40
    }

    /// The sequence number of the current step's messages (the last pull's after the last step).
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.seq_base + self.steps_done + 1
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

    /// Begin: pull from every shard. A learner with no steps to take pulls for the last time
    /// at once, so that no shard waits for a gradient from it, and finishes on the answers.
    #[must_use]
    pub fn on_start(&mut self) -> Vec<LearnerEvent> {
        self.pull_all(self.steps_total == 0)
    }

    fn pull_all(&self, last: bool) -> Vec<LearnerEvent> {
        let seq = self.seq();
        (0..self.received.len() as u32).map(|s| LearnerEvent::Pull { shard: ShardId(s), last, seq }).collect()
    }

    /// Send again to every shard whose answer to this step's pull has not arrived the last
    /// push and the pull (either, or the answer, may have been lost; the shard applies each
    /// push once); nothing while computing or once finished.
    #[must_use]
    pub fn on_retry(&self) -> Vec<LearnerEvent> {
        if self.computing || self.received.iter().all(Option::is_some) {
            return Vec::new();
        }
        let (last, seq) = (self.steps_done >= self.steps_total, self.seq());
        let pull = NextPull { seq, last };
        (self.received.iter().zip(&self.pushed).enumerate())
            .filter(|(_, (answer, _))| answer.is_none())
            .map(|(s, (_, pushed))| {
                let shard = ShardId(s as u32);
                match pushed {
                    Some(computed_on) => {
                        LearnerEvent::Push { shard, computed_on: *computed_on, seq: seq - 1, pull }
                    }
                    None => LearnerEvent::Pull { shard, last, seq },
                }
            })
            .collect()
    }

    /// Weights from `shard` at `clock` arrived, answering the pull of step `seq`. Once every
    /// shard answered: `Compute`, or `Finished` after the last step. A late or repeated answer
    /// is [`CoreError::Duplicate`] and changes nothing: a driver writes the weights it got into
    /// its model only once this accepted them.
    pub fn on_weights(
        &mut self,
        shard: ShardId,
        clock: Clock,
        seq: u64,
    ) -> Result<Vec<LearnerEvent>, CoreError> {
        let (id, current) = (self.id, self.seq());
        let slot = self
            .received
            .get_mut(shard.index())
            .ok_or_else(|| CoreError::Protocol(format!("{id} got weights from unknown {shard}")))?;
        if self.computing || slot.is_some() || seq != current {
            return Err(CoreError::Duplicate(format!(
                "{id} got weights #{seq} from {shard} on step #{current}"
            )));
        }
        *slot = Some(clock);
        if !self.received.iter().all(Option::is_some) {
            return Ok(Vec::new());
        }
        if self.steps_done >= self.steps_total {
            // Every slot stays filled: nothing is retried and later answers are duplicates.
            return Ok(vec![LearnerEvent::Finished]);
        }
        self.computing = true;
        Ok(vec![LearnerEvent::Compute])
    }

    /// The gradient is computed: push it to every shard, each push carrying the next pull (the
    /// last one after the last step).
    pub fn on_computed(&mut self) -> Result<Vec<LearnerEvent>, CoreError> {
        if !self.computing {
            return Err(CoreError::Protocol(format!("{} finished a computation it never started", self.id)));
        }
        self.computing = false;
        let seq = self.seq();
        self.steps_done += 1;
        let pull = NextPull { seq: self.seq(), last: self.steps_done >= self.steps_total };
        self.pushed.clone_from(&self.received);
        Ok((self.received.iter_mut().enumerate())
            .filter_map(|(s, c)| {
                c.take().map(|computed_on| LearnerEvent::Push {
                    shard: ShardId(s as u32),
                    computed_on,
                    seq,
                    pull,
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_pulls_computes_pushes_and_finishes() {
        let mut l = LearnerCore::new(LearnerId(3), 2, 2);
        let pull = |s, last, seq| LearnerEvent::Pull { shard: ShardId(s), last, seq };
        let push = |s, c, seq, last| LearnerEvent::Push {
            shard: ShardId(s),
            computed_on: Clock(c),
            seq,
            pull: NextPull { seq: seq + 1, last },
        };
        assert_eq!(l.on_start(), vec![pull(0, false, 1), pull(1, false, 1)]);
        assert_eq!(l.on_weights(ShardId(1), Clock(5), 1).unwrap(), vec![]);
        assert!(matches!(l.on_weights(ShardId(1), Clock(5), 1), Err(CoreError::Duplicate(_))), "twice");
        assert_eq!(l.on_retry(), vec![pull(0, false, 1)], "only the shard that has not answered");
        assert_eq!(l.on_weights(ShardId(0), Clock(4), 1).unwrap(), vec![LearnerEvent::Compute]);
        assert_eq!(l.on_retry(), vec![], "nothing to retry while computing");
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 4, 1, false), push(1, 5, 1, false)],
            "each push carries the next step's pull: one message per shard"
        );
        assert!(l.on_weights(ShardId(0), Clock(5), 1).is_err(), "a late answer to step 1");
        assert_eq!(
            l.on_retry(),
            vec![push(0, 4, 1, false), push(1, 5, 1, false)],
            "the last push and pull again"
        );
        l.on_weights(ShardId(0), Clock(6), 2).unwrap();
        assert_eq!(l.on_retry(), vec![push(1, 5, 1, false)], "only where no answer came");
        l.on_weights(ShardId(1), Clock(6), 2).unwrap();
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 6, 2, true), push(1, 6, 2, true)],
            "the last pushes carry the last pull"
        );
        assert_eq!(l.steps_done(), 2);
        assert_eq!(l.on_retry()[..1], [push(0, 6, 2, true)]);
        assert_eq!(l.on_weights(ShardId(0), Clock(7), 3).unwrap(), vec![]);
        assert_eq!(l.on_weights(ShardId(1), Clock(7), 3).unwrap(), vec![LearnerEvent::Finished]);
        assert!(l.on_computed().is_err());
        assert_eq!(l.on_retry(), vec![], "nothing to retry once finished");
        assert!(l.on_weights(ShardId(9), Clock(0), 3).is_err());
        let mut idle = LearnerCore::new(LearnerId(1), 2, 0);
        assert_eq!(
            idle.on_start(),
            vec![pull(0, true, 1), pull(1, true, 1)],
            "no steps: the last pull at once"
        );
        assert_eq!(idle.on_retry(), vec![pull(0, true, 1), pull(1, true, 1)]);
        assert_eq!(idle.on_weights(ShardId(0), Clock(2), 1).unwrap(), vec![]);
        assert_eq!(idle.on_weights(ShardId(1), Clock(2), 1).unwrap(), vec![LearnerEvent::Finished]);
        let again = LearnerCore::new(LearnerId(3), 1, 5).with_seq_base(LearnerCore::incarnation_base(1));
        assert!(again.seq() > 1 << 40, "a restarted learner's steps follow every earlier one");
    }
}
