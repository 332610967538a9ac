//! The learner loop of every Rudra protocol: pull from every shard → compute one gradient on
//! the assembled weights → push each shard its slice tagged with that shard's clock → repeat.
//! With `prefetch = k` (`docs/src/algorithms.md §4.1`) up to k pushed gradients may be
//! unanswered while the next is computed on the newest weights held; k = 0 is the base loop,
//! one gradient outstanding. After its last push a learner pulls once more and finishes when
//! those weights arrive and every push has been answered: the run never ends with a gradient
//! still in flight.

use std::collections::VecDeque;

use crate::{Clock, LearnerId, ShardId};

use super::CoreError;

/// The most gradients a learner may push ahead of its answers.
pub const MAX_PREFETCH: u32 = 8;

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
    /// Compute a gradient on the weights held now (a driver that computes while answers
    /// arrive computes on those it held when this came).
    Compute,
    /// Send this shard its slice of the gradient, computed on its weights `computed_on`, and
    /// with it, in the same message, the pull of the next step: one message and one round
    /// trip per step. The shard takes the push, then the pull; the pull's answer tells the
    /// learner the push was taken.
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

/// What an answer from a shard did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// Its weights are newer than those held from that shard: the driver writes them into
    /// its model (before carrying out `events`). An older answer only confirms a push.
    pub newer: bool,
    /// What follows.
    pub events: Vec<LearnerEvent>,
}

/// A pushed step not yet answered by every shard.
#[derive(Clone, Debug)]
struct InFlight {
    seq: u64,
    /// Per shard, the clock its slice was computed on, or `None` once that shard answered.
    awaiting: Vec<Option<Clock>>,
}

/// The learner loop's state.
#[derive(Clone, Debug)]
pub struct LearnerCore {
    id: LearnerId,
    prefetch: u32,
    /// Per shard, the clock of the newest weights held.
    held: Vec<Option<Clock>>,
    /// Per shard, the newest step whose pull it answered (0 before any).
    answered: Vec<u64>,
    /// Pushed steps some shard has not answered yet, oldest first.
    in_flight: VecDeque<InFlight>,
    /// While computing: the clocks of the weights the gradient is computed on.
    computing: Option<Vec<Clock>>,
    steps_done: u64,
    steps_total: u64,
    finished: bool,
    /// Added to every step's sequence number: a restarted learner counts on from a new base,
    /// so none of its messages looks like a copy of one sent before it restarted.
    seq_base: u64,
}

impl LearnerCore {
    /// A learner that will compute `steps_total` gradients against `shards` shards, one at a
    /// time.
    #[must_use]
    pub fn new(id: LearnerId, shards: usize, steps_total: u64) -> Self {
        Self {
            id,
            prefetch: 0,
            held: vec![None; shards],
            answered: vec![0; shards],
            in_flight: VecDeque::new(),
            computing: None,
            steps_done: 0,
            steps_total,
            finished: false,
            seq_base: 0,
        }
    }

    /// Let up to `k` pushed gradients be unanswered while the next is computed (at most
    /// [`MAX_PREFETCH`]).
    #[must_use]
    pub fn with_prefetch(mut self, k: u32) -> Self {
        self.prefetch = k.min(MAX_PREFETCH);
        self
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

    /// The sequence number of the next step's messages (the last pull's after the last step).
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

    /// Gradients that may be unanswered while the next is computed.
    #[must_use]
    pub fn prefetch(&self) -> u32 {
        self.prefetch
    }

    /// Whether the push of step `seq` to `shard` is still unanswered (a driver keeps its
    /// payload for a retry until it is not).
    #[must_use]
    pub fn awaits(&self, shard: ShardId, seq: u64) -> bool {
        (self.in_flight.iter())
            .any(|p| p.seq == seq && p.awaiting.get(shard.index()).is_some_and(Option::is_some))
    }

    /// Begin: pull from every shard. A learner with no steps to take pulls for the last time
    /// at once, so that no shard waits for a gradient from it, and finishes on the answers.
    #[must_use]
    pub fn on_start(&mut self) -> Vec<LearnerEvent> {
        let (last, seq) = (self.steps_total == 0, self.seq());
        (0..self.held.len() as u32).map(|s| LearnerEvent::Pull { shard: ShardId(s), last, seq }).collect()
    }

    /// The pull riding on the push of step `seq`.
    fn pull_after(&self, seq: u64) -> NextPull {
        NextPull { seq: seq + 1, last: seq + 1 - self.seq_base > self.steps_total }
    }

    /// Send again whatever some shard has not answered: each unanswered push with the pull
    /// riding on it (the shard applies each push once and answers every pull), or the pull
    /// of a shard that never answered; nothing once finished.
    #[must_use]
    pub fn on_retry(&self) -> Vec<LearnerEvent> {
        if self.finished {
            return Vec::new();
        }
        let mut events = Vec::new();
        for (s, &answered) in self.answered.iter().enumerate() {
            let shard = ShardId(s as u32);
            let pushes = (self.in_flight.iter()).filter_map(|p| Some((p.seq, p.awaiting[s]?))).map(
                |(seq, computed_on)| LearnerEvent::Push {
                    shard,
                    computed_on,
                    seq,
                    pull: self.pull_after(seq),
                },
            );
            let before = events.len();
            events.extend(pushes);
            if events.len() == before && answered < self.seq() {
                let last = self.steps_done >= self.steps_total;
                events.push(LearnerEvent::Pull { shard, last, seq: self.seq() });
            }
        }
        events
    }

    /// Weights from `shard` at `clock` arrived, answering the pull of step `seq`. They are
    /// newer than those held when no later pull of that shard was answered; the answer also
    /// confirms the push that pull rode on. A repeated answer that does neither is
    /// [`CoreError::Duplicate`] and changes nothing: a driver writes the weights it got into
    /// its model only when [`Answered::newer`] says so.
    pub fn on_weights(&mut self, shard: ShardId, clock: Clock, seq: u64) -> Result<Answered, CoreError> {
        let (id, current) = (self.id, self.seq());
        let s = shard.index();
        let Some(&answered) = self.answered.get(s) else {
            return Err(CoreError::Protocol(format!("{id} got weights from unknown {shard}")));
        };
        if seq > current {
            return Err(CoreError::Protocol(format!(
                "{id} got weights #{seq} from {shard} before asking for them (step #{current})"
            )));
        }
        let confirmed =
            self.in_flight.iter_mut().find(|p| p.seq + 1 == seq).and_then(|p| p.awaiting[s].take());
        let newer = seq > answered;
        if !newer && confirmed.is_none() {
            return Err(CoreError::Duplicate(format!(
                "{id} got weights #{seq} from {shard} again (answered #{answered}, on step #{current})"
            )));
        }
        self.in_flight.retain(|p| p.awaiting.iter().any(Option::is_some));
        if newer {
            (self.answered[s], self.held[s]) = (seq, Some(clock));
        }
        Ok(Answered { newer, events: self.next() })
    }

    /// What the learner does next, when it is not computing: finish once every shard answered
    /// the last pull and every push; compute while steps remain, weights from every shard are
    /// held and at most `prefetch` pushes are unanswered.
    fn next(&mut self) -> Vec<LearnerEvent> {
        if self.computing.is_some() || self.finished {
            return Vec::new();
        }
        if self.steps_done >= self.steps_total {
            let current = self.seq();
            self.finished = self.in_flight.is_empty() && self.answered.iter().all(|&a| a >= current);
            return if self.finished { vec![LearnerEvent::Finished] } else { Vec::new() };
        }
        let held: Option<Vec<Clock>> = self.held.iter().copied().collect();
        match held {
            Some(clocks) if self.in_flight.len() <= self.prefetch as usize => {
                self.computing = Some(clocks);
                vec![LearnerEvent::Compute]
            }
            _ => Vec::new(),
        }
    }

    /// The gradient is computed: push it to every shard, each push carrying the next pull (the
    /// last one after the last step); with prefetch room left, compute the next at once.
    pub fn on_computed(&mut self) -> Result<Vec<LearnerEvent>, CoreError> {
        let Some(clocks) = self.computing.take() else {
            return Err(CoreError::Protocol(format!("{} finished a computation it never started", self.id)));
        };
        let seq = self.seq();
        self.steps_done += 1;
        let pull = self.pull_after(seq);
        let mut events: Vec<LearnerEvent> = (clocks.iter().enumerate())
            .map(|(s, &computed_on)| LearnerEvent::Push { shard: ShardId(s as u32), computed_on, seq, pull })
            .collect();
        self.in_flight.push_back(InFlight { seq, awaiting: clocks.into_iter().map(Some).collect() });
        events.extend(self.next());
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(s: u32, last: bool, seq: u64) -> LearnerEvent {
        LearnerEvent::Pull { shard: ShardId(s), last, seq }
    }

    fn push(s: u32, c: u64, seq: u64, last: bool) -> LearnerEvent {
        LearnerEvent::Push {
            shard: ShardId(s),
            computed_on: Clock(c),
            seq,
            pull: NextPull { seq: seq + 1, last },
        }
    }

    fn events(l: &mut LearnerCore, s: u32, c: u64, seq: u64) -> Vec<LearnerEvent> {
        l.on_weights(ShardId(s), Clock(c), seq).unwrap().events
    }

    #[test]
    fn loop_pulls_computes_pushes_and_finishes() {
        let mut l = LearnerCore::new(LearnerId(3), 2, 2);
        assert_eq!(l.on_start(), vec![pull(0, false, 1), pull(1, false, 1)]);
        assert_eq!(events(&mut l, 1, 5, 1), vec![]);
        assert!(matches!(l.on_weights(ShardId(1), Clock(5), 1), Err(CoreError::Duplicate(_))), "twice");
        assert_eq!(l.on_retry(), vec![pull(0, false, 1)], "only the shard that has not answered");
        assert_eq!(events(&mut l, 0, 4, 1), vec![LearnerEvent::Compute]);
        assert_eq!(l.on_retry(), vec![], "nothing to retry while computing");
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 4, 1, false), push(1, 5, 1, false)],
            "each push carries the next step's pull: one message per shard"
        );
        assert!(l.awaits(ShardId(0), 1) && !l.awaits(ShardId(0), 2));
        assert!(l.on_weights(ShardId(0), Clock(5), 1).is_err(), "a late answer to step 1");
        assert!(l.on_weights(ShardId(0), Clock(5), 3).is_err(), "an answer to a pull never sent");
        assert_eq!(
            l.on_retry(),
            vec![push(0, 4, 1, false), push(1, 5, 1, false)],
            "the last push and pull again"
        );
        assert_eq!(l.on_weights(ShardId(0), Clock(6), 2).unwrap(), Answered { newer: true, events: vec![] });
        assert!(!l.awaits(ShardId(0), 1) && l.awaits(ShardId(1), 1));
        assert_eq!(l.on_retry(), vec![push(1, 5, 1, false)], "only where no answer came");
        assert_eq!(events(&mut l, 1, 6, 2), vec![LearnerEvent::Compute]);
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 6, 2, true), push(1, 6, 2, true)],
            "the last pushes carry the last pull"
        );
        assert_eq!(l.steps_done(), 2);
        assert_eq!(l.on_retry()[..1], [push(0, 6, 2, true)]);
        assert_eq!(events(&mut l, 0, 7, 3), vec![]);
        assert_eq!(events(&mut l, 1, 7, 3), vec![LearnerEvent::Finished]);
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
        assert_eq!(events(&mut idle, 0, 2, 1), vec![]);
        assert_eq!(events(&mut idle, 1, 2, 1), vec![LearnerEvent::Finished]);
        let again = LearnerCore::new(LearnerId(3), 1, 5).with_seq_base(LearnerCore::incarnation_base(1));
        assert!(again.seq() > 1 << 40, "a restarted learner's steps follow every earlier one");
    }

    #[test]
    fn prefetch_computes_ahead_on_the_newest_weights_held_and_counts_each_gradient_on_its_own() {
        let mut l = LearnerCore::new(LearnerId(0), 1, 4).with_prefetch(1);
        assert_eq!(l.on_start(), vec![pull(0, false, 1)]);
        assert_eq!(events(&mut l, 0, 0, 1), vec![LearnerEvent::Compute]);
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 0, 1, false), LearnerEvent::Compute],
            "one push unanswered: the next gradient at once, on the same weights"
        );
        assert_eq!(l.on_computed().unwrap(), vec![push(0, 0, 2, false)], "two unanswered: wait");
        assert_eq!(l.on_retry(), vec![push(0, 0, 1, false), push(0, 0, 2, false)], "both, oldest first");
        assert_eq!(
            l.on_weights(ShardId(0), Clock(2), 3).unwrap(),
            Answered { newer: true, events: vec![LearnerEvent::Compute] },
            "the answer to step 3's pull overtook step 2's: push 2 is taken, push 1 may not be"
        );
        assert_eq!(l.on_retry(), vec![push(0, 0, 1, false)]);
        assert_eq!(
            l.on_computed().unwrap(),
            vec![push(0, 2, 3, false)],
            "computed on clock 2; push 1 and 3 unanswered"
        );
        assert_eq!(
            l.on_weights(ShardId(0), Clock(1), 2).unwrap(),
            Answered { newer: false, events: vec![LearnerEvent::Compute] },
            "an older answer confirms push 1 without replacing the newer weights"
        );
        assert_eq!(l.on_computed().unwrap(), vec![push(0, 2, 4, true)]);
        assert_eq!(events(&mut l, 0, 3, 4), vec![], "push 4 still unanswered");
        assert_eq!(events(&mut l, 0, 4, 5), vec![LearnerEvent::Finished]);
        assert_eq!(l.on_retry(), vec![]);
    }
}
