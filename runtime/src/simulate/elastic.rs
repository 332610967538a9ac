//! Elastic averaging (sync and async EASGD, EAMSGD) in the simulator: the [`CenterShard`] and
//! [`ElasticLearner`] cores. A learner step: if τ divides its clock, send x^i to every shard
//! and wait for the centers; compute the gradient at the point before the elastic pull; then
//! take the step (elastic pull and local update).

use rudra_transport::Floats;
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use rudra_actors::protocol::Weights;
use rudra_actors::protocol::elastic::{
    CenterEvent, CenterRule, CenterShard, ElasticLearner, ElasticSettings,
};
use rudra_transport::{LearnerId, ShardId};

use super::driver::{Engine, Message, ShardReport, World};
use super::events::TraceHash;
use super::model::{Payload, Route};
use super::settings::{EasgdMode, EasgdSpec};
use crate::RuntimeError;

/// A message of elastic averaging.
pub enum ElasticMsg {
    /// Learner → shard: x^i; the shard reads its range.
    Exchange {
        /// Who sends.
        learner: LearnerId,
        /// To whom.
        shard: ShardId,
        /// The learner's whole x^i, shared by the messages to every shard.
        values: Arc<Vec<f32>>,
    },
    /// Shard → learner: the center for the learner's side of the exchange.
    Center {
        /// For whom.
        learner: LearnerId,
        /// x̃ of the shard's range.
        center: Weights,
    },
}

impl Message for ElasticMsg {
    fn route(&self) -> Route {
        match self {
            Self::Exchange { learner, shard, .. } => {
                Route { learner: *learner, shard: *shard, payload: Payload::Up }
            }
            Self::Center { learner, center } => {
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
    core: ElasticLearner,
    /// x^i.
    x: Vec<f32>,
    /// The centers received in this step's exchange, assembled.
    center: Vec<f32>,
    /// Shards yet to answer this step's exchange.
    awaiting: usize,
    exchanged: bool,
    /// Where the gradient is taken, and the gradient.
    point: Vec<f32>,
    grad: Vec<f32>,
}

/// Center shards and elastic learners.
pub struct ElasticWorld {
    centers: Vec<CenterShard>,
    ranges: Vec<Range<usize>>,
    learners: Vec<Learner>,
}

impl ElasticWorld {
    /// `learners` learners with rate `lr` and shards over `ranges`, all starting at `init`.
    #[must_use]
    pub fn new(spec: &EasgdSpec, lr: f32, init: &[f32], ranges: Vec<Range<usize>>, learners: u32) -> Self {
        let rule = match spec.mode {
            EasgdMode::Sync => CenterRule::ElasticSync { beta: spec.beta },
            EasgdMode::Async => CenterRule::ElasticAsync { alpha: spec.alpha },
        };
        let active: BTreeSet<LearnerId> = (0..learners).map(LearnerId).collect();
        let centers = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| CenterShard::new(ShardId(s as u32), rule, init[r.clone()].to_vec(), active.clone()))
            .collect();
        let settings = ElasticSettings {
            tau: spec.tau,
            alpha: spec.alpha,
            lr,
            lr_decay_gamma: spec.gamma,
            momentum: spec.momentum,
        };
        let learners = (0..learners)
            .map(|_| Learner {
                core: ElasticLearner::new(settings, init.len()),
                x: init.to_vec(),
                center: vec![0.0; init.len()],
                awaiting: 0,
                exchanged: false,
                point: Vec::with_capacity(init.len()),
                grad: Vec::new(),
            })
            .collect();
        Self { centers, ranges, learners }
    }

    fn begin_step(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<(), RuntimeError> {
        let me = &mut self.learners[learner.index()];
        if !me.core.exchanges_now() {
            return self.compute(eng, learner);
        }
        let values = Arc::new(me.x.clone());
        me.awaiting = self.centers.len();
        me.exchanged = true;
        for s in 0..self.centers.len() {
            eng.send(ElasticMsg::Exchange { learner, shard: ShardId(s as u32), values: Arc::clone(&values) });
        }
        Ok(())
    }

    fn compute(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<(), RuntimeError> {
        let me = &mut self.learners[learner.index()];
        me.core.gradient_point(&me.x, &mut me.point);
        me.grad = eng.start_compute(learner, &[(0, &me.point)])?;
        Ok(())
    }
}

impl World for ElasticWorld {
    type Msg = ElasticMsg;

    fn start(&mut self, eng: &mut Engine<ElasticMsg>) -> Result<(), RuntimeError> {
        (0..self.learners.len()).try_for_each(|l| self.begin_step(eng, LearnerId(l as u32)))
    }

    fn deliver(&mut self, eng: &mut Engine<ElasticMsg>, msg: ElasticMsg) -> Result<(), RuntimeError> {
        match msg {
            ElasticMsg::Exchange { learner, shard, values } => {
                let center = &mut self.centers[shard.index()];
                center.on_exchange(learner, &values[self.ranges[shard.index()].clone()])?;
                while let Some(CenterEvent::Reply { learner, center }) = center.poll_event() {
                    eng.send(ElasticMsg::Center { learner, center });
                }
            }
            ElasticMsg::Center { learner, center } => {
                let me = &mut self.learners[learner.index()];
                me.center[self.ranges[center.shard.index()].clone()].copy_from_slice(&center.values);
                me.awaiting -= 1;
                if me.awaiting == 0 {
                    self.compute(eng, learner)?;
                }
            }
        }
        Ok(())
    }

    fn computed(&mut self, eng: &mut Engine<ElasticMsg>, learner: LearnerId) -> Result<(), RuntimeError> {
        let Learner { core, x, center, exchanged, grad, .. } = &mut self.learners[learner.index()];
        core.step(x, grad, exchanged.then_some(center.as_slice()));
        *exchanged = false;
        self.begin_step(eng, learner)
    }

    fn updates(&self) -> u64 {
        self.centers.iter().map(|c| c.clock().0).max().unwrap_or(0)
    }

    fn values(&self) -> Vec<Floats> {
        self.centers.iter().map(|c| c.snapshot().values).collect()
    }

    fn shard_reports(&self) -> Vec<ShardReport> {
        self.centers
            .iter()
            .enumerate()
            .map(|(s, c)| ShardReport {
                shard: s as u32,
                updates: c.clock().0,
                applied: 0,
                dropped: 0,
                mean_staleness: 0.0,
                max_staleness: 0,
            })
            .collect()
    }
}
