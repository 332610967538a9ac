//! The EASGD family (EASGD sync and async, EAMSGD, DOWNPOUR, MDOWNPOUR, DiLoCo) in the simulator: one
//! [`ElasticWorker`] per learner and one [`CenterShard`] per shard, fed the inputs the learner
//! and shard actors feed them. The worker says when to exchange and where to compute; the
//! world only carries its messages and computes its gradients, as the learner actor does.
//! With churn, a learner that leaves loses what it was computing and sending, the centers stop
//! counting on it, and it joins again as a new worker starting from the current center, for
//! the steps it had left.

use rudra_transport::Floats;
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use rudra_proto::{CenterShard, ElasticWorker, ShardEvent, Weights, WorkerEvent};
use rudra_transport::{Clock, LearnerId, ShardId};

use super::driver::{Engine, Message, ShardReport, World};
use super::events::TraceHash;
use super::model::{Payload, Route};
use crate::RuntimeError;

/// A message of the EASGD family.
pub enum ElasticMsg {
    /// Learner → shard: the learner's side of an exchange (x^i, DOWNPOUR's accumulated update
    /// or MDOWNPOUR's gradient); the shard reads its range.
    Exchange {
        /// Who sends.
        learner: LearnerId,
        /// To whom.
        shard: ShardId,
        /// The whole vector, shared by the messages to every shard.
        values: Arc<Vec<f32>>,
        /// The sender's incarnation: what one that has left sent is lost.
        incarnation: u32,
    },
    /// Shard → learner: the center for the learner's side of the exchange.
    Center {
        /// For whom.
        learner: LearnerId,
        /// x̃ of the shard's range.
        center: Weights,
        /// The incarnation it is for.
        incarnation: u32,
    },
}

impl Message for ElasticMsg {
    fn route(&self) -> Route {
        match self {
            Self::Exchange { learner, shard, .. } => {
                Route { learner: *learner, shard: *shard, payload: Payload::Up }
            }
            Self::Center { learner, center, .. } => {
                Route { learner: *learner, shard: center.shard, payload: Payload::Down }
            }
        }
    }

    fn trace(&self, hash: &mut TraceHash) {
        let (kind, clock) = match self {
            Self::Exchange { .. } => (4, 0),
            Self::Center { center, .. } => (5, center.clock.0),
        };
        let route = self.route();
        for v in [kind, u64::from(route.learner.0), u64::from(route.shard.0), clock] {
            hash.u64(v);
        }
    }
}

struct Learner {
    worker: ElasticWorker,
    /// The gradient being computed, handed to the worker when its compute time is over.
    grad: Option<Vec<f32>>,
    /// Its worker has taken every step.
    finished: bool,
    /// It has left and not joined again (its worker stays as it was when it left).
    away: bool,
}

/// A new worker for a learner that joins again: its id, the point it starts from, its steps.
pub type Respawn = Box<dyn Fn(LearnerId, Vec<f32>, u64) -> ElasticWorker>;

/// Center shards and elastic learners.
pub struct ElasticWorld {
    centers: Vec<CenterShard>,
    ranges: Vec<Range<usize>>,
    learners: Vec<Learner>,
    respawn: Respawn,
}

impl ElasticWorld {
    /// A world of these cores; shard `s` holds `ranges[s]` of the parameter vector and
    /// `workers[l]` is learner `l`; a learner that joins again gets a worker from `respawn`.
    #[must_use]
    pub fn new(
        centers: Vec<CenterShard>,
        ranges: Vec<Range<usize>>,
        workers: Vec<ElasticWorker>,
        respawn: Respawn,
    ) -> Self {
        let learners = (workers.into_iter())
            .map(|worker| Learner { worker, grad: None, finished: false, away: false })
            .collect();
        Self { centers, ranges, learners, respawn }
    }

    /// The learners present with steps to take: those a sync round waits for.
    fn active(&self) -> BTreeSet<LearnerId> {
        let active = |l: &&Learner| !l.away && !l.finished;
        (self.learners.iter()).filter(active).map(|l| l.worker.id()).collect()
    }

    /// Whether `learner` is present in `incarnation` (what an incarnation that has left sent,
    /// or was sent, is lost).
    fn present(&self, eng: &Engine<ElasticMsg>, learner: LearnerId, incarnation: u32) -> bool {
        incarnation == eng.incarnation(learner) && !self.learners[learner.index()].away
    }

    /// Tell every center who is present and has steps to take now.
    fn membership(&mut self, eng: &mut Engine<ElasticMsg>) -> Result<(), RuntimeError> {
        let active = self.active();
        for s in 0..self.centers.len() {
            let events = self.centers[s].on_membership(active.clone());
            carry_out_center(eng, ShardId(s as u32), events)?;
        }
        Ok(())
    }

    /// Carry out a worker's effects, as the learner actor does.
    fn carry_out(
        &mut self,
        eng: &mut Engine<ElasticMsg>,
        learner: LearnerId,
        events: Vec<WorkerEvent>,
    ) -> Result<(), RuntimeError> {
        for event in events {
            match event {
                WorkerEvent::Exchange { values, shards } => {
                    let incarnation = eng.incarnation(learner);
                    for s in shards {
                        let (shard, values) = (ShardId(s as u32), Arc::clone(&values));
                        eng.send(ElasticMsg::Exchange { learner, shard, values, incarnation });
                    }
                }
                WorkerEvent::Compute(point) => {
                    let grad = eng.start_compute(learner, &[(0, &point)])?;
                    self.learners[learner.index()].grad = Some(grad);
                }
                WorkerEvent::Finished => {
                    self.learners[learner.index()].finished = true;
                    self.membership(eng)?;
                }
            }
        }
        Ok(())
    }
}

/// Carry out a center shard's effects, as the shard and tracker actors do.
fn carry_out_center(
    eng: &mut Engine<ElasticMsg>,
    shard: ShardId,
    events: Vec<ShardEvent>,
) -> Result<(), RuntimeError> {
    for event in events {
        match event {
            ShardEvent::Center { learner, weights } => {
                let incarnation = eng.incarnation(learner);
                eng.send(ElasticMsg::Center { learner, center: weights, incarnation });
            }
            ShardEvent::Serve { .. } => {
                return Err(RuntimeError::Simulation("internal error: a center shard served weights".into()));
            }
            ShardEvent::Quorum { clock, missing } => eng.quorum(shard, clock, missing)?,
            ShardEvent::Gradient(g) => eng.record_gradient(&g),
            ShardEvent::Update(u) => eng.record_update(&u),
        }
    }
    Ok(())
}

impl World for ElasticWorld {
    type Msg = ElasticMsg;

    fn start(&mut self, eng: &mut Engine<ElasticMsg>) -> Result<(), RuntimeError> {
        for l in 0..self.learners.len() {
            let events = self.learners[l].worker.on_start();
            self.carry_out(eng, LearnerId(l as u32), events)?;
        }
        Ok(())
    }

    fn deliver(&mut self, eng: &mut Engine<ElasticMsg>, msg: ElasticMsg) -> Result<(), RuntimeError> {
        match msg {
            ElasticMsg::Exchange { incarnation, learner, .. } if !self.present(eng, learner, incarnation) => {
                eng.lost_in_flight(learner);
            }
            ElasticMsg::Exchange { learner, shard, values, .. } => {
                let center = &mut self.centers[shard.index()];
                eng.arrived(shard, center.round_of(learner));
                let events = center.on_exchange(learner, &values[self.ranges[shard.index()].clone()])?;
                drop(values);
                carry_out_center(eng, shard, events)?;
            }
            // The answer to an exchange of an incarnation that has left, or one that no worker
            // waits for any more (sent to the incarnation that left, served after it rejoined).
            ElasticMsg::Center { learner, center, incarnation }
                if !self.present(eng, learner, incarnation)
                    || !self.learners[learner.index()].worker.awaits(center.shard) => {}
            ElasticMsg::Center { learner, center, .. } => {
                let events = self.learners[learner.index()].worker.on_center(center.shard, &center.values)?;
                self.carry_out(eng, learner, events)?;
            }
        }
        Ok(())
    }

    fn computed(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<(), RuntimeError> {
        let me = &mut self.learners[learner.index()];
        let grad = me.grad.take().ok_or_else(|| {
            RuntimeError::Simulation(format!("internal error: {learner} computed without a gradient"))
        })?;
        let events = me.worker.on_gradient(&grad)?;
        self.carry_out(eng, learner, events)
    }

    fn grace_over(
        &mut self,
        eng: &mut Engine<ElasticMsg>,
        shard: ShardId,
        clock: Clock,
    ) -> Result<(), RuntimeError> {
        let events = self.centers[shard.index()].on_grace_over(clock);
        carry_out_center(eng, shard, events)
    }

    fn updates(&self) -> u64 {
        self.centers.iter().map(|c| c.clock().0).max().unwrap_or(0)
    }

    fn done(&self) -> usize {
        self.learners.iter().filter(|l| l.finished || l.away).count()
    }

    fn leave(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<bool, RuntimeError> {
        let me = &mut self.learners[learner.index()];
        if me.finished || me.away {
            return Ok(false);
        }
        (me.away, me.grad) = (true, None);
        self.membership(eng)?;
        Ok(true)
    }

    fn join(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<bool, RuntimeError> {
        // Its last exchange is still in an open round: it joins once that round is over.
        if self.centers.iter().any(|c| c.holds(learner)) {
            return Ok(false);
        }
        let center: Vec<f32> = self.values().iter().flat_map(|v| v.iter().copied()).collect();
        let me = &mut self.learners[learner.index()];
        let left = me.worker.steps_total().saturating_sub(me.worker.steps_done());
        (me.worker, me.away) = ((self.respawn)(learner, center, left), false);
        self.membership(eng)?;
        let events = self.learners[learner.index()].worker.on_start();
        self.carry_out(eng, learner, events)?;
        Ok(true)
    }

    fn values(&self) -> Vec<Floats> {
        self.centers.iter().map(|c| c.snapshot().values).collect()
    }

    fn shard_reports(&self) -> Vec<ShardReport> {
        self.centers
            .iter()
            .map(|c| ShardReport {
                shard: c.id().0,
                updates: c.clock().0,
                applied: 0,
                dropped: 0,
                mean_staleness: 0.0,
                max_staleness: 0,
            })
            .collect()
    }
}
