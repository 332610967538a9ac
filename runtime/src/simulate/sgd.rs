//! Rudra's SGD protocols (hardsync, n-softsync, async) in the simulator: the [`SgdShard`] and
//! [`LearnerCore`] cores, fed the inputs the shard and learner actors feed them, and with
//! learner groups the [`GroupRound`] of each group's aggregator (`docs/src/algorithms.md` §4.2),
//! or with rounds of their own each group's [`GroupLeader`] (§4.3).

use rudra_transport::Floats;
use std::ops::Range;
use std::sync::Arc;

use rudra_proto::{
    Batch, Contribution, GroupLeader, GroupRound, LeaderEvent, LearnerCore, LearnerEvent, MemberPull,
    NextPull, SgdShard, ShardEvent, Weights,
};
use rudra_transport::{Clock, LearnerId, ShardId};

use super::driver::{Engine, Message, ShardReport, World};
use super::events::TraceHash;
use super::gradients::Part;
use super::model::{Payload, Route};
use crate::RuntimeError;

/// A message of the SGD protocols.
pub enum SgdMsg {
    /// Learner → shard: send me your weights (`last`: once more, after my last push).
    Pull {
        /// Who asks.
        learner: LearnerId,
        /// Whom.
        shard: ShardId,
        /// After the last push.
        last: bool,
        /// The learner's step.
        seq: u64,
    },
    /// Learner → shard: a gradient; the shard reads its range of it.
    Push {
        /// Who computed it.
        learner: LearnerId,
        /// For whom.
        shard: ShardId,
        /// The clock of that shard's weights it was computed on.
        computed_on: Clock,
        /// The learner's step.
        seq: u64,
        /// The whole gradient, shared by the pushes to every shard.
        grad: Arc<Vec<f32>>,
        /// The pull it carries.
        pull: NextPull,
    },
    /// A group's aggregator → shard, by the link of the group's first learner (the aggregator
    /// sits with its group): its members' gradients on one clock, as one mean.
    Aggregate {
        /// The group's first learner, whose link it takes.
        via: LearnerId,
        /// For whom.
        shard: ShardId,
        /// The clock they were computed on.
        computed_on: Clock,
        /// Whose.
        members: Vec<Contribution>,
        /// The mean of the shard's range of their gradients, over all their examples.
        grad: Vec<f32>,
        /// The members' next pulls, in the order of `members`.
        pulls: Vec<NextPull>,
    },
    /// Shard → learner: weights.
    Weights {
        /// For whom.
        learner: LearnerId,
        /// The weights.
        weights: Weights,
        /// The pull answered.
        seq: u64,
    },
}

impl Message for SgdMsg {
    fn route(&self) -> Route {
        let (learner, shard, payload) = match self {
            Self::Pull { learner, shard, .. } => (*learner, *shard, Payload::Pull),
            Self::Push { learner, shard, .. } | Self::Aggregate { via: learner, shard, .. } => {
                (*learner, *shard, Payload::Up)
            }
            Self::Weights { learner, weights, .. } => (*learner, weights.shard, Payload::Down),
        };
        Route { learner, shard, payload }
    }

    fn trace(&self, hash: &mut TraceHash) {
        let (kind, clock) = match self {
            Self::Pull { last, .. } => (u64::from(*last), 0),
            Self::Push { computed_on, .. } => (2, computed_on.0),
            Self::Aggregate { computed_on, members, .. } => (4 + members.len() as u64, computed_on.0),
            Self::Weights { weights, .. } => (3, weights.clock.0),
        };
        let route = self.route();
        for v in [kind, u64::from(route.learner.0), u64::from(route.shard.0), clock] {
            hash.u64(v);
        }
    }
}

struct Learner {
    core: LearnerCore,
    /// The newest weights received, per shard.
    weights: Vec<Option<Floats>>,
    /// The gradient being computed, or the last one computed.
    grad: Option<Arc<Vec<f32>>>,
}

/// A held push at an aggregator: the whole gradient and the pull riding on it.
type Held = (Arc<Vec<f32>>, NextPull);

/// Learner groups: each learner's group, and each group's round for each shard.
struct Groups {
    of: Vec<usize>,
    rounds: Vec<Vec<GroupRound<Held>>>,
    /// Each group's first learner, where its aggregator sits.
    via: Vec<LearnerId>,
    /// μ: the examples of every gradient.
    batch: u32,
}

/// Groups with rounds of their own (§4.3): each learner's group, and each group's core and the
/// weights it holds for each shard. A group sits with its members, who reach it at no cost.
struct Leaders {
    of: Vec<usize>,
    cores: Vec<Vec<GroupLeader<Arc<Vec<f32>>, LearnerId>>>,
    weights: Vec<Vec<Option<Weights>>>,
    /// μ: the examples of every member's gradient.
    batch: u32,
}

/// A member's push as its group's core takes it: its step, the clock it was computed on and
/// the whole gradient.
type MemberPush = (u64, Clock, Arc<Vec<f32>>);

/// Shards and learners of an SGD protocol.
pub struct SgdWorld {
    shards: Vec<SgdShard>,
    ranges: Vec<Range<usize>>,
    learners: Vec<Learner>,
    groups: Option<Groups>,
    leaders: Option<Leaders>,
}

impl SgdWorld {
    /// A world of these cores; shard `s` holds `ranges[s]` of the parameter vector.
    #[must_use]
    pub fn new(shards: Vec<SgdShard>, ranges: Vec<Range<usize>>, learners: Vec<LearnerCore>) -> Self {
        let learners = learners
            .into_iter()
            .map(|core| Learner { core, weights: vec![None; ranges.len()], grad: None })
            .collect();
        Self { shards, ranges, learners, groups: None, leaders: None }
    }

    /// The learners' groups run rounds of their own, when `groups` are given, n-softsync among
    /// their members; every member's gradient is over `batch` examples.
    #[must_use]
    pub fn with_own_rounds(mut self, groups: Option<Vec<Vec<LearnerId>>>, (batch, n): (u32, u32)) -> Self {
        let Some(groups) = groups else { return self };
        let (of, groups) = indexed(&groups, self.learners.len());
        let shards = self.shards.len();
        let cores: Vec<Vec<_>> = (groups.iter())
            .map(|&(leader, members)| {
                (0..shards).map(|_| GroupLeader::new(leader, members.iter().copied(), n)).collect()
            })
            .collect();
        let weights = vec![vec![None; shards]; cores.len()];
        self.leaders = Some(Leaders { of, cores, weights, batch });
        self
    }

    /// Feed a member's pull, or its push with the pull riding on it, to its group's core for
    /// `shard`, and carry out what the core does.
    fn lead(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        (learner, shard): (LearnerId, ShardId),
        (pull, push): (MemberPull<LearnerId>, Option<MemberPush>),
    ) -> Result<(), RuntimeError> {
        let Some(leaders) = &mut self.leaders else { return Ok(()) };
        let g = leaders.of[learner.index()];
        let core = &mut leaders.cores[g][shard.index()];
        let events = match push {
            Some((seq, computed_on, grad)) => {
                let c = Contribution { learner, seq, examples: leaders.batch };
                let (events, refused) = core.on_push(c, computed_on, grad, pull);
                if let Some(e) = refused {
                    return Err(e.into());
                }
                events
            }
            None => core.on_pull(pull),
        };
        self.carry_out_group(eng, (g, shard), events)
    }

    /// Carry out a group's core's effects for `shard`: its pushes and pulls to the shard over
    /// its first member's link, its answers to its members at once.
    fn carry_out_group(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        (g, shard): (usize, ShardId),
        events: Vec<LeaderEvent<Arc<Vec<f32>>, LearnerId>>,
    ) -> Result<(), RuntimeError> {
        let Some(leaders) = &self.leaders else { return Ok(()) };
        let leader = leaders.cores[g][shard.index()].leader();
        let range = self.ranges[shard.index()].clone();
        for event in events {
            match event {
                LeaderEvent::Push { seq, batch, last } => {
                    let examples = batch.members.iter().map(|m| m.examples).sum();
                    let grad = batch.mean(|grad| &grad[range.clone()]);
                    let members = vec![Contribution { learner: leader, seq, examples }];
                    let (computed_on, pulls) = (batch.computed_on, vec![NextPull { seq: seq + 1, last }]);
                    eng.send(SgdMsg::Aggregate { via: leader, shard, computed_on, members, grad, pulls });
                }
                LeaderEvent::Pull { seq, last } => {
                    eng.send(SgdMsg::Pull { learner: leader, shard, last, seq })
                }
                // The simulated network loses nothing: no member retries.
                LeaderEvent::Resend => {}
                LeaderEvent::Serve { seq, reply } => {
                    let held = self.leaders.as_ref().and_then(|l| l.weights[g][shard.index()].clone());
                    let weights = held.ok_or_else(|| internal("a group served weights it does not hold"))?;
                    self.weights_to_learner(eng, reply, weights, seq)?;
                }
            }
        }
        Ok(())
    }

    /// Weights reach `learner`, answering its pull `seq`.
    fn weights_to_learner(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        learner: LearnerId,
        weights: Weights,
        seq: u64,
    ) -> Result<(), RuntimeError> {
        let me = &mut self.learners[learner.index()];
        // The core decides first, as in the learner actor: a refused answer is not kept.
        let answered = me.core.on_weights(weights.shard, weights.clock, seq)?;
        if answered.newer {
            me.weights[weights.shard.index()] = Some(weights.values);
        }
        self.carry_out(eng, learner, answered.events)
    }

    /// The learners push through their groups' aggregators: `groups` (more than one) lists
    /// each group's learners; every gradient is over `batch` examples; under hardsync a round
    /// is told by its clock.
    #[must_use]
    pub fn with_groups(mut self, groups: &[Vec<LearnerId>], (batch, hardsync): (u32, bool)) -> Self {
        if groups.len() > 1 {
            let (of, groups) = indexed(groups, self.learners.len());
            let rounds = (groups.iter())
                .map(|&(_, members)| {
                    let round = || GroupRound::new(members.iter().copied());
                    (0..self.shards.len())
                        .map(|_| if hardsync { round().by_clock() } else { round() })
                        .collect()
                })
                .collect();
            let via = groups.iter().map(|&(first, _)| first).collect();
            self.groups = Some(Groups { of, rounds, via, batch });
        }
        self
    }

    /// A learner's push reaches its group's aggregator; what the round sends on, sent.
    fn aggregate(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        (learner, shard): (LearnerId, ShardId),
        (seq, computed_on, held): (u64, Clock, Held),
    ) -> Result<(), RuntimeError> {
        let Some(groups) = &mut self.groups else { return Ok(()) };
        let g = groups.of[learner.index()];
        let round = &mut groups.rounds[g][shard.index()];
        let last = held.1.last;
        let c = Contribution { learner, seq, examples: groups.batch };
        let mut batches = round.push(c, computed_on, held)?.unwrap_or_default();
        if last {
            batches.extend(round.finish(learner));
        }
        let (via, range) = (groups.via[g], self.ranges[shard.index()].clone());
        for batch in batches {
            let grad = batch.mean(|(g, _)| &g[range.clone()]);
            let Batch { computed_on, members, values } = batch;
            let pulls = values.into_iter().map(|(_, pull)| pull).collect();
            eng.send(SgdMsg::Aggregate { via, shard, computed_on, members, grad, pulls });
        }
        Ok(())
    }

    /// Carry out a learner core's effects, as the learner actor does.
    fn carry_out(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        learner: LearnerId,
        events: impl IntoIterator<Item = LearnerEvent>,
    ) -> Result<(), RuntimeError> {
        for event in events {
            let me = &mut self.learners[learner.index()];
            match event {
                LearnerEvent::Pull { shard, last, seq } if self.leaders.is_some() => {
                    let pull = MemberPull { learner, seq, last, reply: learner };
                    self.lead(eng, (learner, shard), (pull, None))?;
                }
                LearnerEvent::Pull { shard, last, seq } => {
                    eng.send(SgdMsg::Pull { learner, shard, last, seq });
                }
                LearnerEvent::Push { shard, computed_on, seq, pull } => {
                    let grad = me.grad.clone().ok_or_else(|| internal("a push without a gradient"))?;
                    if self.leaders.is_some() {
                        let then = MemberPull { learner, seq: pull.seq, last: pull.last, reply: learner };
                        self.lead(eng, (learner, shard), (then, Some((seq, computed_on, grad))))?;
                    } else if self.groups.is_some() {
                        self.aggregate(eng, (learner, shard), (seq, computed_on, (grad, pull)))?;
                    } else {
                        eng.send(SgdMsg::Push { learner, shard, computed_on, seq, grad, pull });
                    }
                }
                LearnerEvent::Compute => {
                    let weights: Vec<Floats> = me.weights.iter().flatten().cloned().collect();
                    let parts: Vec<Part<'_>> =
                        self.ranges.iter().zip(&weights).map(|(r, w)| (r.start, &w[..])).collect();
                    me.grad = Some(Arc::new(eng.start_compute(learner, &parts)?));
                }
                LearnerEvent::Finished => {}
            }
        }
        Ok(())
    }

    /// Carry out `shard`'s effects, as the shard and tracker actors do.
    fn carry_out_shard(
        eng: &mut Engine<SgdMsg>,
        shard: ShardId,
        events: Vec<ShardEvent>,
    ) -> Result<(), RuntimeError> {
        for event in events {
            match event {
                ShardEvent::Serve { learner, seq, weights } => {
                    eng.send(SgdMsg::Weights { learner, weights, seq })
                }
                ShardEvent::Center { .. } => return Err(internal("an SGD shard answered with a center")),
                ShardEvent::Quorum { clock, missing } => eng.quorum(shard, clock, missing)?,
                ShardEvent::Gradient(g) => eng.record_gradient(&g),
                ShardEvent::Update(u) => eng.record_update(&u),
            }
        }
        Ok(())
    }
}

/// Each of `learners`' group among `groups`, and the groups with their first learners.
fn indexed(groups: &[Vec<LearnerId>], learners: usize) -> (Vec<usize>, Vec<(LearnerId, &[LearnerId])>) {
    let groups: Vec<(LearnerId, &[LearnerId])> =
        groups.iter().filter_map(|m| Some((*m.first()?, m.as_slice()))).collect();
    let mut of = vec![0; learners];
    for (g, (_, members)) in groups.iter().enumerate() {
        members.iter().for_each(|l| of[l.index()] = g);
    }
    (of, groups)
}

fn internal(what: &str) -> RuntimeError {
    RuntimeError::Simulation(format!("internal error: {what}"))
}

impl World for SgdWorld {
    type Msg = SgdMsg;

    fn start(&mut self, eng: &mut Engine<SgdMsg>) -> Result<(), RuntimeError> {
        for l in 0..self.learners.len() {
            let events = self.learners[l].core.on_start();
            self.carry_out(eng, LearnerId(l as u32), events)?;
        }
        Ok(())
    }

    fn deliver(&mut self, eng: &mut Engine<SgdMsg>, msg: SgdMsg) -> Result<(), RuntimeError> {
        match msg {
            SgdMsg::Pull { learner, shard, last, seq } => {
                let core = &mut self.shards[shard.index()];
                let events =
                    (if last { core.on_last_pull(learner, seq) } else { core.on_pull(learner, seq) })?;
                Self::carry_out_shard(eng, shard, events)?;
            }
            SgdMsg::Push { learner, shard, computed_on, seq, grad, pull } => {
                let range = self.ranges[shard.index()].clone();
                let core = &mut self.shards[shard.index()];
                eng.arrived(shard, computed_on);
                let mut events = core.on_push(learner, seq, computed_on, &grad[range])?;
                drop(grad);
                events.extend(if pull.last {
                    core.on_last_pull(learner, pull.seq)
                } else {
                    core.on_pull(learner, pull.seq)
                }?);
                Self::carry_out_shard(eng, shard, events)?;
            }
            SgdMsg::Aggregate { shard, computed_on, members, grad, pulls, .. } => {
                let core = &mut self.shards[shard.index()];
                eng.arrived(shard, computed_on);
                let mut events = core.on_aggregate(&members, computed_on, &grad)?;
                for (m, pull) in members.iter().zip(pulls) {
                    events.extend(if pull.last {
                        core.on_last_pull(m.learner, pull.seq)
                    } else {
                        core.on_pull(m.learner, pull.seq)
                    }?);
                }
                Self::carry_out_shard(eng, shard, events)?;
            }
            // With rounds of their own the shards serve only the groups, by their first member.
            SgdMsg::Weights { learner, weights, seq } => match &mut self.leaders {
                Some(leaders) => {
                    let (g, shard) = (leaders.of[learner.index()], weights.shard);
                    let events = leaders.cores[g][shard.index()].on_weights(seq)?;
                    leaders.weights[g][shard.index()] = Some(weights);
                    self.carry_out_group(eng, (g, shard), events)?;
                }
                None => self.weights_to_learner(eng, learner, weights, seq)?,
            },
        }
        Ok(())
    }

    fn computed(&mut self, eng: &mut Engine<SgdMsg>, learner: LearnerId) -> Result<(), RuntimeError> {
        let events = self.learners[learner.index()].core.on_computed()?;
        self.carry_out(eng, learner, events)
    }

    fn grace_over(
        &mut self,
        eng: &mut Engine<SgdMsg>,
        shard: ShardId,
        clock: Clock,
    ) -> Result<(), RuntimeError> {
        let events = self.shards[shard.index()].on_grace_over(clock);
        Self::carry_out_shard(eng, shard, events)
    }

    fn updates(&self) -> u64 {
        self.shards.iter().map(|s| s.clock().0).max().unwrap_or(0)
    }

    fn values(&self) -> Vec<Floats> {
        self.shards.iter().map(|s| s.snapshot().values).collect()
    }

    fn shard_reports(&self) -> Vec<ShardReport> {
        self.shards
            .iter()
            .map(|s| {
                let st = s.stats().summary();
                ShardReport {
                    shard: s.id().0,
                    updates: s.clock().0,
                    applied: st.applied,
                    dropped: st.dropped,
                    mean_staleness: st.mean,
                    max_staleness: st.max,
                }
            })
            .collect()
    }
}
