//! Links in virtual time: each message is delivered after a seeded delay, lost, or delivered
//! twice, and a partitioned learner's messages are lost both ways; and the node faults a run
//! is put through.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::Dice;
use crate::LearnerId;

/// A learner cut off from every shard from tick `from` until tick `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Who.
    pub learner: LearnerId,
    /// First tick cut off.
    pub from: u64,
    /// First tick connected again.
    pub until: u64,
}

/// A learner that dies at tick `at`; the shards hear of it `detect` ticks later and, with
/// `rejoin_after`, it comes back as a new incarnation that many ticks after its death.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Death {
    /// Who.
    pub learner: LearnerId,
    /// When it dies.
    pub at: u64,
    /// How long until the shards drop it from the active set.
    pub detect: u64,
    /// How long until it comes back, if it does.
    pub rejoin_after: Option<u64>,
}

/// A shard that crashes at tick `at` and comes back at once from its last checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart {
    /// Which shard (its index).
    pub shard: u32,
    /// When.
    pub at: u64,
}

/// The faults of one harness run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultSchedule {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Messages take `1..=max_delay` ticks (at least 1): above 1, they overtake each other.
    pub max_delay: u64,
    /// Learners cut off for a while.
    pub partitions: Vec<Partition>,
    /// Learners that die.
    pub deaths: Vec<Death>,
    /// Shards that restart.
    pub restarts: Vec<Restart>,
    /// A shard writes a checkpoint every this many updates (0: only its initial state).
    pub checkpoint_every: u64,
}

impl FaultSchedule {
    /// Links that lose, duplicate and reorder messages, and partitions that heal, drawn from
    /// `seed` for `learners` learners over about `horizon` ticks; no node fails.
    #[must_use]
    pub fn links(seed: u64, learners: u32, horizon: u64) -> Self {
        let mut dice = Dice::new(seed);
        let loss = [0.0, 0.02, 0.1, 0.3][dice.below(4) as usize];
        let duplicate = [0.0, 0.05, 0.2][dice.below(3) as usize];
        let max_delay = 1 + dice.below(8);
        let partitions = (0..dice.below(3))
            .map(|_| {
                let from = dice.below(horizon.max(1));
                Partition {
                    learner: LearnerId(dice.below(u64::from(learners)) as u32),
                    from,
                    until: from + 1 + dice.below(50),
                }
            })
            .collect();
        Self { loss, duplicate, max_delay, partitions, ..Self::default() }
    }

    /// [`FaultSchedule::links`] and node failures besides: learners that die (most come back)
    /// and shards that restart from checkpoints written every few updates.
    #[must_use]
    pub fn nodes(seed: u64, learners: u32, shards: u32, horizon: u64) -> Self {
        let mut dice = Dice::new(seed ^ 0x5eed_fa17);
        let links = Self::links(seed, learners, horizon);
        // At least one learner never dies, so that the run has something to finish.
        let deaths = (0..dice.below(u64::from(learners)))
            .map(|k| Death {
                learner: LearnerId(k as u32 + 1),
                at: dice.below(horizon.max(1)),
                detect: 1 + dice.below(20),
                rejoin_after: dice.chance(0.7).then(|| 1 + dice.below(40)),
            })
            .collect();
        let restarts = (0..dice.below(3))
            .map(|_| Restart { shard: dice.below(u64::from(shards)) as u32, at: dice.below(horizon.max(1)) })
            .collect();
        Self { deaths, restarts, checkpoint_every: 1 + dice.below(5), ..links }
    }

    /// Whether `learner`'s link is cut at `tick`.
    #[must_use]
    pub fn cut(&self, learner: LearnerId, tick: u64) -> bool {
        self.partitions.iter().any(|p| p.learner == learner && (p.from..p.until).contains(&tick))
    }
}

/// Messages in flight, in virtual time.
pub(crate) struct Network<M> {
    dice: Dice,
    faults: FaultSchedule,
    /// Delivery tick, then the order sent: each names a message in `flight`.
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    /// The messages by the order sent, with the learner whose link they cross.
    flight: BTreeMap<u64, (LearnerId, M)>,
    sent: u64,
}

impl<M: Clone> Network<M> {
    pub(crate) fn new(faults: FaultSchedule, seed: u64) -> Self {
        Self { dice: Dice::new(seed), faults, queue: BinaryHeap::new(), flight: BTreeMap::new(), sent: 0 }
    }

    pub(crate) fn faults(&self) -> &FaultSchedule {
        &self.faults
    }

    /// Send `msg` across `learner`'s link at `now`: lost, delayed, or delivered twice.
    pub(crate) fn send(&mut self, now: u64, learner: LearnerId, msg: M) {
        if self.faults.cut(learner, now) || self.dice.chance(self.faults.loss) {
            return;
        }
        let copies = if self.dice.chance(self.faults.duplicate) { 2 } else { 1 };
        for _ in 0..copies {
            let at = now + 1 + self.dice.below(self.faults.max_delay.max(1));
            self.sent += 1;
            self.queue.push(Reverse((at, self.sent)));
            self.flight.insert(self.sent, (learner, msg.clone()));
        }
    }

    /// The next message due at or before `until`, with its delivery tick; one whose link is
    /// cut when it arrives is lost.
    pub(crate) fn next_before(&mut self, until: u64) -> Option<(u64, M)> {
        while self.queue.peek().is_some_and(|Reverse((at, _))| *at <= until) {
            let Reverse((at, sent)) = self.queue.pop()?;
            let (learner, msg) = self.flight.remove(&sent)?;
            if !self.faults.cut(learner, at) {
                return Some((at, msg));
            }
        }
        None
    }

    /// The tick of the next delivery.
    pub(crate) fn next_tick(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, _))| *at)
    }
}
