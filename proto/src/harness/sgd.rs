//! The SGD family (hardsync, n-softsync, async) under the harness: SGD shard cores and
//! learner loops, their messages on faulty links, learners dying and rejoining, shards
//! restarting from checkpoints; with learner groups, each group's aggregator at the shard's
//! end of its members' links.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::ops::Range;
use std::sync::Arc;

use super::network::{FaultSchedule, Network};
use super::{Dice, Violation};
use crate::{
    Clock, CoreError, Floats, GradientRecord, GroupRound, LearnerCore, LearnerEvent, LearnerId, LrModulation,
    LrSchedule, NextPull, Outcome, SgdShard, SgdShardConfig, ShardEvent, ShardId, ShardState, SyncRule,
    learner_groups, shard_ranges,
};

/// What an SGD-family harness run trains.
#[derive(Clone, Debug)]
pub struct SgdSetup {
    /// When shards apply updates.
    pub rule: SyncRule,
    /// The staleness bound.
    pub max_staleness: Option<u64>,
    /// Gradients a learner may push ahead of its answers.
    pub prefetch: u32,
    /// Hardsync: a quorum and what late gradients come to; its rounds close as soon as they
    /// hold it (a grace window of 0).
    pub quorum: Option<crate::Quorum>,
    /// `α(σ)`.
    pub modulation: LrModulation,
    /// λ.
    pub learners: u32,
    /// Shards.
    pub shards: u32,
    /// The weights every run starts from.
    pub init: Vec<f32>,
    /// Each learner's compute time in ticks (empty: drawn from the seed, 1 to 4).
    pub compute_ticks: Vec<u64>,
    /// Steps per learner.
    pub steps: u64,
    /// Learning rate.
    pub lr: f32,
    /// A learner retries every this many ticks.
    pub retry_every: u64,
    /// The run must finish within this many ticks.
    pub horizon: u64,
    /// Learner groups (1: none): each group's aggregator for a shard sits at the shard's end
    /// of its members' links.
    pub groups: u32,
}

mod groups;

/// A push held at an aggregator: the gradient and the pull riding on it.
type Held = (Arc<Vec<f32>>, NextPull);

/// How an SGD-family harness run ended.
#[derive(Clone, Debug)]
pub struct SgdOutcome {
    /// The shards' weights, joined.
    pub params: Vec<f32>,
    /// Every gradient's fate, in the order reported.
    pub records: Vec<GradientRecord>,
    /// Each shard's final clock.
    pub clocks: Vec<Clock>,
    /// Gradients the shards hold for their next update.
    pub held: usize,
    /// The tick the last learner finished.
    pub ticks: u64,
}

/// A learner's gradient at its step on the weights it assembled.
pub type GradientFn<'g> = dyn FnMut(LearnerId, u64, &[f32]) -> Vec<f32> + 'g;

#[derive(Clone)]
enum Msg {
    Pull {
        learner: LearnerId,
        shard: ShardId,
        last: bool,
        seq: u64,
    },
    Push {
        learner: LearnerId,
        shard: ShardId,
        computed_on: Clock,
        seq: u64,
        grad: Arc<Vec<f32>>,
        pull: NextPull,
    },
    Weights {
        learner: LearnerId,
        shard: ShardId,
        clock: Clock,
        seq: u64,
        values: Floats,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Retry,
    Computed { learner: u32, incarnation: u32 },
    Die(usize),
    Detect(usize),
    Rejoin(usize),
    Restart(usize),
}

/// A learner and what the harness keeps of it across incarnations.
struct Learner {
    core: Option<LearnerCore>,
    incarnation: u32,
    params: Vec<f32>,
    /// The weights of the gradient being computed, as they were when it began.
    computing_on: Vec<f32>,
    grad: Arc<Vec<f32>>,
    /// Steps taken by earlier incarnations.
    offset: u64,
    compute_ticks: u64,
    done: bool,
    died: bool,
}

/// A shard and its checks.
struct Shard {
    core: SgdShard,
    clock: Clock,
    /// Pushes accepted whose effect stands, as (learner, seq).
    accepted: BTreeSet<(LearnerId, u64)>,
    /// Pushes whose effect a restart erased.
    erased: BTreeSet<(LearnerId, u64)>,
    checkpoint: (ShardState, BTreeSet<(LearnerId, u64)>),
}

struct Run<'a, 'g> {
    setup: &'a SgdSetup,
    grad: &'g mut GradientFn<'g>,
    ranges: Vec<Range<usize>>,
    shards: Vec<Shard>,
    learners: Vec<Learner>,
    active: BTreeSet<LearnerId>,
    net: Network<Msg>,
    timers: BinaryHeap<Reverse<(u64, u64, Timer)>>,
    armed: u64,
    now: u64,
    records: Vec<GradientRecord>,
    /// Rejoins still to come: the run is not over before them.
    pending: usize,
    /// With groups: each learner's group, and each group's round for each shard.
    group_of: Vec<usize>,
    rounds: Vec<Vec<GroupRound<Held>>>,
}

/// Run `setup` under `faults` with `seed` (link dice, compute times), learners computing
/// their gradients with `grad`, checking the harness's invariants throughout; the first one
/// broken ends the run.
pub fn run_sgd<'g>(
    setup: &SgdSetup,
    faults: FaultSchedule,
    seed: u64,
    grad: &'g mut GradientFn<'g>,
) -> Result<SgdOutcome, Violation> {
    Run::new(setup, faults, seed, grad).run()
}

impl<'a, 'g> Run<'a, 'g> {
    fn new(setup: &'a SgdSetup, faults: FaultSchedule, seed: u64, grad: &'g mut GradientFn<'g>) -> Self {
        let init = &setup.init;
        let ranges = shard_ranges(init.len(), setup.shards as usize);
        let active: BTreeSet<LearnerId> = (0..setup.learners).map(LearnerId).collect();
        let shards = (ranges.iter().enumerate())
            .map(|(s, r)| {
                let cfg = SgdShardConfig {
                    id: ShardId(s as u32),
                    rule: setup.rule,
                    modulation: setup.modulation,
                    max_staleness: setup.max_staleness,
                    backups: 0,
                    quorum: setup.quorum,
                    schedule: LrSchedule { base: setup.lr, decay: 1.0 },
                    batch: 1,
                    gradients_per_epoch: u64::MAX,
                    prefetch: setup.prefetch,
                };
                let core = SgdShard::new(cfg, init[r.clone()].to_vec(), active.clone());
                let checkpoint = (core.state(), BTreeSet::new());
                Shard {
                    core,
                    clock: Clock(0),
                    accepted: BTreeSet::new(),
                    erased: BTreeSet::new(),
                    checkpoint,
                }
            })
            .collect();
        let mut dice = Dice::new(seed ^ 0xc0ffee);
        let learners = (0..setup.learners)
            .map(|l| Learner {
                core: Some(
                    LearnerCore::new(LearnerId(l), ranges.len(), setup.steps).with_prefetch(setup.prefetch),
                ),
                incarnation: 0,
                params: init.clone(),
                computing_on: Vec::new(),
                grad: Arc::default(),
                offset: 0,
                compute_ticks: setup
                    .compute_ticks
                    .get(l as usize)
                    .copied()
                    .unwrap_or_else(|| 1 + dice.below(4)),
                done: false,
                died: false,
            })
            .collect();
        let mut run = Self {
            setup,
            grad,
            ranges,
            shards,
            learners,
            active,
            pending: 0,
            net: Network::new(faults, seed),
            timers: BinaryHeap::new(),
            armed: 0,
            now: 0,
            records: Vec::new(),
            group_of: Vec::new(),
            rounds: Vec::new(),
        };
        if setup.groups > 1 {
            let groups = learner_groups(setup.learners, setup.groups);
            run.group_of = vec![0; setup.learners as usize];
            for (g, members) in groups.iter().enumerate() {
                members.iter().for_each(|l| run.group_of[l.index()] = g);
            }
            let round = |m: &Vec<LearnerId>| {
                let r = GroupRound::new(m.iter().copied());
                if setup.rule == SyncRule::Hardsync { r.by_clock() } else { r }
            };
            run.rounds = groups.iter().map(|m| (0..run.ranges.len()).map(|_| round(m)).collect()).collect();
        }
        let faults = run.net.faults().clone();
        for (i, d) in faults.deaths.iter().enumerate() {
            run.arm(d.at, Timer::Die(i));
        }
        for (i, r) in faults.restarts.iter().enumerate() {
            run.arm(r.at, Timer::Restart(i));
        }
        run.arm(setup.retry_every, Timer::Retry);
        run
    }

    fn arm(&mut self, at: u64, timer: Timer) {
        self.armed += 1;
        self.timers.push(Reverse((at, self.armed, timer)));
    }

    fn violation(&self, what: String) -> Violation {
        Violation { tick: self.now, what }
    }

    fn run(mut self) -> Result<SgdOutcome, Violation> {
        for l in 0..self.learners.len() {
            let events = self.learners[l].core.as_mut().map(LearnerCore::on_start).unwrap_or_default();
            self.learner_events(l, events)?;
        }
        while !self.finished() {
            let timer_at = self.timers.peek().map(|Reverse((at, ..))| *at);
            let next = match (timer_at, self.net.next_tick()) {
                (Some(t), Some(m)) => t.min(m),
                (Some(t), None) => t,
                (None, Some(m)) => m,
                (None, None) => {
                    return Err(self.violation("nothing left to happen, and learners are not done".into()));
                }
            };
            if next > self.setup.horizon {
                return Err(
                    self.violation(format!("the run did not finish within {} ticks", self.setup.horizon))
                );
            }
            self.now = next;
            if timer_at == Some(next) {
                let Some(Reverse((_, _, timer))) = self.timers.pop() else { continue };
                self.on_timer(timer)?;
            } else if let Some((_, msg)) = self.net.next_before(next) {
                self.deliver(msg)?;
            }
        }
        self.check_exactly_once()?;
        let params = self.shards.iter().flat_map(|s| s.core.snapshot().values.to_vec()).collect();
        Ok(SgdOutcome {
            params,
            records: self.records,
            clocks: self.shards.iter().map(|s| s.clock).collect(),
            held: self.shards.iter().map(|s| s.core.held()).sum(),
            ticks: self.now,
        })
    }

    fn finished(&self) -> bool {
        self.pending == 0 && self.learners.iter().all(|l| l.done || l.core.is_none())
    }

    fn on_timer(&mut self, timer: Timer) -> Result<(), Violation> {
        let faults = self.net.faults().clone();
        match timer {
            Timer::Retry => {
                for l in 0..self.learners.len() {
                    let events =
                        self.learners[l].core.as_ref().map(LearnerCore::on_retry).unwrap_or_default();
                    self.learner_events(l, events)?;
                }
                self.arm(self.now + self.setup.retry_every, Timer::Retry);
            }
            Timer::Computed { learner, incarnation } => {
                let l = learner as usize;
                let slot = &mut self.learners[l];
                let Some(core) = slot.core.as_mut().filter(|_| slot.incarnation == incarnation) else {
                    return Ok(());
                };
                slot.grad = Arc::new((self.grad)(
                    LearnerId(learner),
                    slot.offset + core.steps_done(),
                    &slot.computing_on,
                ));
                let events = core.on_computed().map_err(|e| self.violation(e.to_string()))?;
                self.learner_events(l, events)?;
            }
            Timer::Die(i) => {
                let d = faults.deaths[i];
                let slot = &mut self.learners[d.learner.index()];
                if let Some(core) = slot.core.take().filter(|_| !slot.done) {
                    slot.offset += core.steps_done();
                    slot.died = true;
                    self.arm(self.now + d.detect, Timer::Detect(i));
                    if let Some(after) = d.rejoin_after {
                        self.pending += 1;
                        self.arm(self.now + d.detect + after, Timer::Rejoin(i));
                    }
                } else {
                    slot.core = None;
                }
            }
            Timer::Detect(i) => {
                self.active.remove(&faults.deaths[i].learner);
                self.membership()?;
            }
            Timer::Rejoin(i) => {
                self.pending -= 1;
                let learner = faults.deaths[i].learner;
                self.active.insert(learner);
                self.membership()?;
                let slot = &mut self.learners[learner.index()];
                slot.incarnation += 1;
                let remaining = self.setup.steps - slot.offset;
                let base = LearnerCore::incarnation_base(slot.incarnation);
                let mut core = LearnerCore::new(learner, self.ranges.len(), remaining)
                    .with_seq_base(base)
                    .with_prefetch(self.setup.prefetch);
                let events = core.on_start();
                slot.core = Some(core);
                self.learner_events(learner.index(), events)?;
            }
            Timer::Restart(i) => {
                let s = faults.restarts[i].shard as usize;
                let shard = &mut self.shards[s];
                let (state, accepted) = shard.checkpoint.clone();
                shard.clock = state.clock;
                shard.core.restore(state).map_err(|e| Violation { tick: self.now, what: e.to_string() })?;
                let lost: Vec<_> = shard.accepted.difference(&accepted).copied().collect();
                shard.erased.extend(lost);
                shard.accepted = accepted;
            }
        }
        Ok(())
    }

    /// The active set changed: every shard and aggregator hears of it at once, as the
    /// scheduler tells them.
    fn membership(&mut self) -> Result<(), Violation> {
        for s in 0..self.shards.len() {
            let events = self.shards[s].core.on_membership(self.active.clone());
            self.shard_events(s, events)?;
        }
        for g in 0..self.rounds.len() {
            for s in 0..self.shards.len() {
                let batches = self.rounds[g][s].on_membership(&self.active);
                self.aggregates(s, batches)?;
            }
        }
        Ok(())
    }

    fn learner_events(&mut self, l: usize, events: Vec<LearnerEvent>) -> Result<(), Violation> {
        let learner = LearnerId(l as u32);
        for e in events {
            match e {
                LearnerEvent::Pull { shard, last, seq } => {
                    self.net.send(self.now, learner, Msg::Pull { learner, shard, last, seq });
                }
                LearnerEvent::Push { shard, computed_on, seq, pull } => {
                    let grad = Arc::new(self.learners[l].grad[self.ranges[shard.index()].clone()].to_vec());
                    self.net.send(
                        self.now,
                        learner,
                        Msg::Push { learner, shard, computed_on, seq, grad, pull },
                    );
                }
                LearnerEvent::Compute => {
                    let slot = &mut self.learners[l];
                    slot.computing_on.clone_from(&slot.params);
                    let timer = Timer::Computed { learner: learner.0, incarnation: slot.incarnation };
                    let at = self.now + slot.compute_ticks;
                    self.arm(at, timer);
                }
                LearnerEvent::Finished => self.learners[l].done = true,
            }
        }
        Ok(())
    }

    fn deliver(&mut self, msg: Msg) -> Result<(), Violation> {
        match msg {
            Msg::Pull { learner, shard, last, seq } => self.pull(shard.index(), learner, seq, last),
            Msg::Push { learner, shard, computed_on, seq, grad, pull } if !self.rounds.is_empty() => {
                self.at_aggregator(shard.index(), learner, (seq, computed_on, (grad, pull)))
            }
            Msg::Push { learner, shard, computed_on, seq, grad, pull } => {
                let s = shard.index();
                match self.shards[s].core.on_push(learner, seq, computed_on, &grad) {
                    Ok(events) => {
                        if !self.shards[s].accepted.insert((learner, seq)) {
                            return Err(
                                self.violation(format!("{shard} applied {learner}'s push #{seq} twice"))
                            );
                        }
                        self.shard_events(s, events)?;
                    }
                    Err(e) => self.refused(learner, &e)?,
                }
                self.pull(s, learner, pull.seq, pull.last)
            }
            Msg::Weights { learner, shard, clock, seq, values } => {
                let l = learner.index();
                let Some(core) = self.learners[l].core.as_mut() else { return Ok(()) };
                match core.on_weights(shard, clock, seq) {
                    Ok(answered) => {
                        if answered.newer {
                            self.learners[l].params[self.ranges[shard.index()].clone()]
                                .copy_from_slice(&values);
                        }
                        self.learner_events(l, answered.events)
                    }
                    Err(e) if e.is_duplicate() => Ok(()),
                    Err(e) => Err(self.violation(e.to_string())),
                }
            }
        }
    }

    fn pull(&mut self, s: usize, learner: LearnerId, seq: u64, last: bool) -> Result<(), Violation> {
        let core = &mut self.shards[s].core;
        match if last { core.on_last_pull(learner, seq) } else { core.on_pull(learner, seq) } {
            Ok(events) => self.shard_events(s, events),
            Err(e) => self.refused(learner, &e),
        }
    }

    /// A shard refused an input: a late copy, or a message from a learner it dropped, are
    /// what faulty links and failures make; anything else is a broken rule.
    fn refused(&self, learner: LearnerId, e: &CoreError) -> Result<(), Violation> {
        if e.is_duplicate() || !self.active.contains(&learner) {
            Ok(())
        } else {
            Err(self.violation(format!("a shard refused {learner}: {e}")))
        }
    }

    fn shard_events(&mut self, s: usize, events: Vec<ShardEvent>) -> Result<(), Violation> {
        for e in events {
            match e {
                ShardEvent::Serve { learner, seq, weights } => {
                    let msg = Msg::Weights {
                        learner,
                        shard: weights.shard,
                        clock: weights.clock,
                        seq,
                        values: weights.values,
                    };
                    self.net.send(self.now, learner, msg);
                }
                ShardEvent::Center { learner, .. } => {
                    return Err(self.violation(format!("an SGD shard answered {learner} with a center")));
                }
                ShardEvent::Quorum { clock, .. } => {
                    if self.setup.quorum.is_none() {
                        return Err(
                            self.violation(format!("a shard without a quorum announced one at {clock}"))
                        );
                    }
                    let closed = self.shards[s].core.on_grace_over(clock);
                    self.shard_events(s, closed)?;
                }
                ShardEvent::Gradient(r) => {
                    let bound = self.setup.max_staleness.unwrap_or(u64::MAX);
                    if matches!(r.outcome, Outcome::Applied { .. }) && r.staleness.0 > bound {
                        return Err(self.violation(format!(
                            "applied a gradient of σ = {} over the bound {bound}",
                            r.staleness
                        )));
                    }
                    self.records.push(r);
                }
                ShardEvent::Update(u) => {
                    let shard = &mut self.shards[s];
                    if u.clock != shard.clock.next() {
                        let was = shard.clock;
                        return Err(
                            self.violation(format!("{} moved its clock from {was} to {}", u.shard, u.clock))
                        );
                    }
                    shard.clock = u.clock;
                    let every = self.net.faults().checkpoint_every;
                    if every > 0 && u.clock.0 % every == 0 {
                        shard.checkpoint = (shard.core.state(), shard.accepted.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// Every step of a learner that never died reached every shard once, or was erased by a
    /// restart.
    fn check_exactly_once(&self) -> Result<(), Violation> {
        for (l, slot) in self.learners.iter().enumerate().filter(|(_, slot)| !slot.died) {
            let learner = LearnerId(l as u32);
            for (s, shard) in self.shards.iter().enumerate() {
                let missing = (1..=self.setup.steps).find(|&seq| {
                    !shard.accepted.contains(&(learner, seq)) && !shard.erased.contains(&(learner, seq))
                });
                if let Some(seq) = missing {
                    return Err(self.violation(format!("shard {s} never took {learner}'s step #{seq}")));
                }
            }
            debug_assert!(slot.done);
        }
        Ok(())
    }
}
