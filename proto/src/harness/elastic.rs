//! The elastic family (EASGD, EAMSGD, DOWNPOUR, MDOWNPOUR, DiLoCo) under the harness: center
//! shards and elastic workers, their exchanges delayed and overtaking each other, learners
//! dying for good.
//!
//! An exchange travels on a reliable stream and is not retried, so links here delay and
//! reorder but never lose or repeat a message; a schedule with loss, repeats, partitions,
//! rejoins or restarts is refused.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Range;

use super::network::{FaultSchedule, Network};
use super::{Dice, GradientFn, Violation};
use crate::{
    CenterRule, CenterShard, Clock, ElasticWorker, LearnerId, LocalRule, Outcome, ShardEvent, ShardId,
    WorkerEvent, shard_ranges,
};

/// What an elastic-family harness run trains.
#[derive(Clone, Debug)]
pub struct ElasticSetup {
    /// The shards' rule.
    pub center: CenterRule,
    /// The learners' local rule (each learner starts from a copy).
    pub local: LocalRule,
    /// λ.
    pub learners: u32,
    /// Shards.
    pub shards: u32,
    /// The weights every run starts from: the centers' and every learner's.
    pub init: Vec<f32>,
    /// Local steps per learner.
    pub steps: u64,
    /// The staleness bound the shards enforce, if any (async DiLoCo).
    pub max_staleness: Option<u64>,
    /// The run must finish within this many ticks.
    pub horizon: u64,
}

/// How an elastic-family harness run ended.
#[derive(Clone, Debug)]
pub struct ElasticOutcome {
    /// The centers, joined.
    pub center: Vec<f32>,
    /// Each learner's x^i at its end.
    pub learners: Vec<Vec<f32>>,
    /// Each shard's final clock.
    pub clocks: Vec<Clock>,
    /// Exchanges each shard recorded (applied or dropped).
    pub exchanges: u64,
}

#[derive(Clone)]
enum Msg {
    Exchange { learner: LearnerId, shard: usize, values: Vec<f32> },
    Center { learner: LearnerId, shard: usize, values: Vec<f32> },
}

struct Run<'a, 'g> {
    setup: &'a ElasticSetup,
    grad: &'g mut GradientFn<'g>,
    ranges: Vec<Range<usize>>,
    centers: Vec<CenterShard>,
    clocks: Vec<Clock>,
    workers: Vec<Option<ElasticWorker>>,
    done: Vec<bool>,
    compute_ticks: Vec<u64>,
    active: BTreeSet<LearnerId>,
    /// Exchanges sent and recorded per (learner, shard).
    sent: BTreeMap<(LearnerId, usize), u64>,
    recorded: BTreeMap<(LearnerId, usize), u64>,
    net: Network<Msg>,
    /// Timers by (tick, order armed); what each does by its order.
    timers: BinaryHeap<Reverse<(u64, u64)>>,
    due: BTreeMap<u64, Timer>,
    armed: u64,
    now: u64,
}

#[derive(Clone, Debug)]
enum Timer {
    Computed { learner: usize, point: Vec<f32> },
    Die(usize),
    Detect(usize),
}

/// Run `setup` under `faults` (delays and permanent learner deaths) with `seed`, checking
/// the harness's invariants throughout.
pub fn run_elastic<'g>(
    setup: &ElasticSetup,
    faults: FaultSchedule,
    seed: u64,
    grad: &'g mut GradientFn<'g>,
) -> Result<ElasticOutcome, Violation> {
    let unreliable = faults.loss > 0.0
        || faults.duplicate > 0.0
        || !faults.partitions.is_empty()
        || !faults.restarts.is_empty()
        || faults.deaths.iter().any(|d| d.rejoin_after.is_some());
    if unreliable {
        return Err(Violation {
            tick: 0,
            what: "exchanges ride reliable streams: give the elastic family delays and deaths only".into(),
        });
    }
    Run::new(setup, faults, seed, grad).run()
}

impl<'a, 'g> Run<'a, 'g> {
    fn new(setup: &'a ElasticSetup, faults: FaultSchedule, seed: u64, grad: &'g mut GradientFn<'g>) -> Self {
        let init = &setup.init;
        let ranges = shard_ranges(init.len(), setup.shards as usize);
        let active: BTreeSet<LearnerId> = (0..setup.learners).map(LearnerId).collect();
        let centers = (ranges.iter().enumerate())
            .map(|(s, r)| {
                CenterShard::new(ShardId(s as u32), setup.center, init[r.clone()].to_vec(), active.clone())
            })
            .collect();
        let workers = (0..setup.learners)
            .map(|l| {
                let rule = setup.local.clone();
                Some(ElasticWorker::new(LearnerId(l), rule, init.clone(), ranges.clone(), setup.steps))
            })
            .collect();
        let mut dice = Dice::new(seed ^ 0xe1a5);
        let mut run = Self {
            setup,
            grad,
            clocks: vec![Clock(0); ranges.len()],
            ranges,
            centers,
            workers,
            done: vec![false; setup.learners as usize],
            compute_ticks: (0..setup.learners).map(|_| 1 + dice.below(4)).collect(),
            active,
            sent: BTreeMap::new(),
            recorded: BTreeMap::new(),
            net: Network::new(faults, seed),
            timers: BinaryHeap::new(),
            due: BTreeMap::new(),
            armed: 0,
            now: 0,
        };
        for (i, d) in run.net.faults().deaths.clone().iter().enumerate() {
            run.arm(d.at, Timer::Die(i));
        }
        run
    }

    fn arm(&mut self, at: u64, timer: Timer) {
        self.armed += 1;
        self.timers.push(Reverse((at, self.armed)));
        self.due.insert(self.armed, timer);
    }

    fn violation(&self, what: String) -> Violation {
        Violation { tick: self.now, what }
    }

    fn run(mut self) -> Result<ElasticOutcome, Violation> {
        for l in 0..self.workers.len() {
            let events = self.workers[l].as_mut().map(ElasticWorker::on_start).unwrap_or_default();
            self.worker_events(l, events)?;
        }
        while !(0..self.workers.len()).all(|l| self.done[l] || self.workers[l].is_none()) {
            let timer_at = self.timers.peek().map(|Reverse((at, ..))| *at);
            let next = [timer_at, self.net.next_tick()].into_iter().flatten().min();
            let Some(next) = next.filter(|&t| t <= self.setup.horizon) else {
                return Err(
                    self.violation(format!("the run did not finish within {} ticks", self.setup.horizon))
                );
            };
            self.now = next;
            if timer_at == Some(next) {
                let Some(Reverse((_, armed))) = self.timers.pop() else { continue };
                let Some(timer) = self.due.remove(&armed) else { continue };
                self.on_timer(timer)?;
            } else if let Some((_, msg)) = self.net.next_before(next) {
                self.deliver(msg)?;
            }
        }
        self.check_exactly_once()?;
        Ok(ElasticOutcome {
            center: self.centers.iter().flat_map(|c| c.snapshot().values.to_vec()).collect(),
            learners: self
                .workers
                .iter()
                .map(|w| w.as_ref().map(|w| w.params().to_vec()).unwrap_or_default())
                .collect(),
            clocks: self.clocks,
            exchanges: self.recorded.values().sum(),
        })
    }

    fn on_timer(&mut self, timer: Timer) -> Result<(), Violation> {
        match timer {
            Timer::Computed { learner, point } => {
                let Some(worker) = self.workers[learner].as_mut() else { return Ok(()) };
                let g = (self.grad)(LearnerId(learner as u32), worker.steps_done(), &point);
                let events =
                    worker.on_gradient(&g).map_err(|e| Violation { tick: self.now, what: e.to_string() })?;
                self.worker_events(learner, events)
            }
            Timer::Die(i) => {
                let d = self.net.faults().deaths[i];
                if !self.done[d.learner.index()] && self.workers[d.learner.index()].take().is_some() {
                    self.arm(self.now + d.detect, Timer::Detect(i));
                }
                Ok(())
            }
            Timer::Detect(i) => {
                self.active.remove(&self.net.faults().deaths[i].learner);
                for s in 0..self.centers.len() {
                    let events = self.centers[s].on_membership(self.active.clone());
                    self.center_events(s, events)?;
                }
                Ok(())
            }
        }
    }

    fn worker_events(&mut self, l: usize, events: Vec<WorkerEvent>) -> Result<(), Violation> {
        let learner = LearnerId(l as u32);
        for e in events {
            match e {
                WorkerEvent::Exchange { values, shards } => {
                    for s in shards {
                        *self.sent.entry((learner, s)).or_default() += 1;
                        let values = values[self.ranges[s].clone()].to_vec();
                        self.net.send(self.now, learner, Msg::Exchange { learner, shard: s, values });
                    }
                }
                WorkerEvent::Compute(point) => {
                    let timer = Timer::Computed { learner: l, point: point.to_vec() };
                    self.arm(self.now + self.compute_ticks[l], timer);
                }
                WorkerEvent::Finished => self.done[l] = true,
            }
        }
        Ok(())
    }

    fn deliver(&mut self, msg: Msg) -> Result<(), Violation> {
        match msg {
            Msg::Exchange { learner, shard, values } => {
                match self.centers[shard].on_exchange(learner, &values) {
                    Ok(events) => self.center_events(shard, events),
                    // An exchange sent before its learner was dropped.
                    Err(_) if !self.active.contains(&learner) => Ok(()),
                    Err(e) => Err(self.violation(e.to_string())),
                }
            }
            Msg::Center { learner, shard, values } => {
                let Some(worker) = self.workers[learner.index()].as_mut() else { return Ok(()) };
                let events = (worker.on_center(ShardId(shard as u32), &values))
                    .map_err(|e| Violation { tick: self.now, what: e.to_string() })?;
                self.worker_events(learner.index(), events)
            }
        }
    }

    fn center_events(&mut self, s: usize, events: Vec<ShardEvent>) -> Result<(), Violation> {
        for e in events {
            match e {
                ShardEvent::Center { learner, weights } => {
                    let msg = Msg::Center { learner, shard: s, values: weights.values.to_vec() };
                    self.net.send(self.now, learner, msg);
                }
                ShardEvent::Serve { learner, .. } => {
                    return Err(self.violation(format!("a center shard answered {learner} with weights")));
                }
                ShardEvent::Quorum { clock, .. } => {
                    return Err(self.violation(format!("a center shard announced a quorum at {clock}")));
                }
                ShardEvent::Gradient(r) => {
                    let count = self.recorded.entry((r.learner, s)).or_default();
                    *count += 1;
                    if *count > self.sent.get(&(r.learner, s)).copied().unwrap_or(0) {
                        return Err(self.violation(format!(
                            "shard {s} took more exchanges from {} than it sent",
                            r.learner
                        )));
                    }
                    let bound = self.setup.max_staleness.unwrap_or(u64::MAX);
                    if matches!(r.outcome, Outcome::Applied { .. }) && r.staleness.0 > bound {
                        return Err(self.violation(format!(
                            "applied an exchange of σ = {} over the bound {bound}",
                            r.staleness
                        )));
                    }
                }
                ShardEvent::Update(u) => {
                    if u.clock != self.clocks[s].next() {
                        return Err(self.violation(format!(
                            "{} moved its clock from {} to {}",
                            u.shard, self.clocks[s], u.clock
                        )));
                    }
                    self.clocks[s] = u.clock;
                }
            }
        }
        Ok(())
    }

    /// Every exchange of a learner that finished was recorded exactly once by its shard.
    fn check_exactly_once(&self) -> Result<(), Violation> {
        for ((learner, s), sent) in &self.sent {
            let recorded = self.recorded.get(&(*learner, *s)).copied().unwrap_or(0);
            if self.done[learner.index()] && recorded != *sent {
                return Err(
                    self.violation(format!("shard {s} recorded {recorded} of {learner}'s {sent} exchanges"))
                );
            }
        }
        Ok(())
    }
}
