//! Staying alive through failures — how often learners say they are alive and retry, how
//! long the scheduler waits before it declares one lost — and a [`FaultPlan`] that injects
//! failures into a cluster in one process: lossy links ([`Lossy`]), partitions, crashes and
//! slow learners, seeded and reproducible.

use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_transport::{Fate, FaultDice, FaultWindow, LearnerId, LinkFaults, ShardId};
use serde::{Deserialize, Serialize};

/// Heartbeats, retries and the failure timeout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Liveness {
    /// A learner tells the scheduler it is alive this often.
    pub heartbeat: Duration,
    /// A learner asks a shard again when its pull has had no answer for this long.
    pub retry: Duration,
    /// The scheduler removes a learner it has not heard from for this long.
    pub failure_timeout: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(200),
            retry: Duration::from_secs(1),
            failure_timeout: Duration::from_secs(2),
        }
    }
}

/// Which nodes a fault rule names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Nodes {
    /// Every node.
    Any,
    /// Every learner.
    Learners,
    /// Every shard.
    Shards,
    /// The scheduler.
    Scheduler,
    /// One learner.
    Learner(LearnerId),
    /// One shard.
    Shard(ShardId),
}

impl std::fmt::Display for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Learners => f.write_str("learners"),
            Self::Shards => f.write_str("shards"),
            Self::Scheduler => f.write_str("scheduler"),
            Self::Learner(l) => write!(f, "{l}"),
            Self::Shard(s) => write!(f, "{s}"),
        }
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Learner(l) => write!(f, "{l}"),
            Self::Shard(s) => write!(f, "{s}"),
            Self::Scheduler => f.write_str("scheduler"),
        }
    }
}

/// A node on one end of a link, or one that crashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Node {
    /// A learner.
    Learner(LearnerId),
    /// A shard.
    Shard(ShardId),
    /// The scheduler.
    Scheduler,
}

impl Nodes {
    /// Parse `*`, `learner`, `shard`, `scheduler`, `learner-N` or `shard-N`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let id =
            |rest: &str| rest.parse::<u32>().map_err(|_| format!("{s:?}: {rest:?} is not a node number"));
        match s {
            "*" => Ok(Self::Any),
            "learner" | "learners" => Ok(Self::Learners),
            "shard" | "shards" => Ok(Self::Shards),
            "scheduler" => Ok(Self::Scheduler),
            _ => match s.split_once('-') {
                Some(("learner", n)) => Ok(Self::Learner(LearnerId(id(n)?))),
                Some(("shard", n)) => Ok(Self::Shard(ShardId(id(n)?))),
                _ => Err(format!(
                    "{s:?} is not a node: use *, learner, shard, scheduler, learner-N or shard-N"
                )),
            },
        }
    }

    /// Whether `node` is one of these.
    #[must_use]
    pub fn contains(self, node: Node) -> bool {
        match (self, node) {
            (Self::Any, _)
            | (Self::Learners, Node::Learner(_))
            | (Self::Shards, Node::Shard(_))
            | (Self::Scheduler, Node::Scheduler) => true,
            (Self::Learner(a), Node::Learner(b)) => a == b,
            (Self::Shard(a), Node::Shard(b)) => a == b,
            _ => false,
        }
    }
}

/// Faults on the links between two sets of nodes, in both directions, during a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkRule {
    /// One end.
    pub a: Nodes,
    /// The other end.
    pub b: Nodes,
    /// What happens to each message.
    pub faults: LinkFaults,
    /// When.
    pub window: FaultWindow,
}

/// A node cut off from every other during a window: everything it sends or is sent is lost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    /// Who is cut off.
    pub nodes: Nodes,
    /// From when until it heals (`until`).
    pub window: FaultWindow,
}

/// A node that crashes at a time after the start: a learner stops for good; a shard loses
/// everything in memory and comes back from its last checkpoint `restart_after` later.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Crash {
    /// Which node: a learner or a shard.
    pub node: Node,
    /// When, after the start.
    pub at: Duration,
    /// A shard's time down before it restarts.
    pub restart_after: Option<Duration>,
}

/// A learner whose computation takes `factor` times as long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slow {
    /// Which learner.
    pub learner: LearnerId,
    /// How much slower, at least 1.
    pub factor: f64,
}

/// Faults to inject into a run, seeded and reproducible.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// Seeds every link's dice.
    pub seed: u64,
    /// Lossy, slow, duplicating or reordering links.
    pub links: Vec<LinkRule>,
    /// Nodes cut off for a while.
    pub partitions: Vec<Partition>,
    /// Learners that crash.
    pub crashes: Vec<Crash>,
    /// Learners that compute slowly.
    pub slow: Vec<Slow>,
    /// Shard and learner processes whose actor panics.
    #[serde(default)]
    pub panics: Vec<Panic>,
}

/// A shard or learner process whose actor panics `at` after it joined, as a bug would: the
/// process ends, and its peers find it gone.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Panic {
    /// Which node.
    pub node: Node,
    /// When, after the node joined.
    pub at: Duration,
}

impl FaultPlan {
    /// Whether the plan injects nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
            && self.partitions.is_empty()
            && self.crashes.is_empty()
            && self.slow.is_empty()
            && self.panics.is_empty()
    }

    /// The timed faults of this plan that a run lasting `ran` never reached, each described
    /// with its time: a scenario whose fault comes after the end tests nothing.
    #[must_use]
    pub fn unfired(&self, ran: Duration) -> Vec<String> {
        let after = |at: Duration| at > ran;
        let crashes = (self.crashes.iter().filter(|c| after(c.at)))
            .map(|c| format!("the crash of {:?} at {} ms", c.node, c.at.as_millis()));
        let partitions = (self.partitions.iter().filter(|p| after(p.window.from)))
            .map(|p| format!("the partition of {:?} from {} ms", p.nodes, p.window.from.as_millis()));
        let links = (self.links.iter().filter(|l| after(l.window.from))).map(|l| {
            format!("the link faults between {:?} and {:?} from {} ms", l.a, l.b, l.window.from.as_millis())
        });
        crashes.chain(partitions).chain(links).collect()
    }

    /// How much slower `learner` computes (1 if it is not slowed).
    #[must_use]
    pub fn slowdown(&self, learner: LearnerId) -> f64 {
        self.slow.iter().filter(|s| s.learner == learner).map(|s| s.factor).fold(1.0, f64::max)
    }

    /// The rules of the link from `from` to `to`, with a stream of dice of its own.
    #[must_use]
    pub fn link(&self, from: Node, to: Node, stream: u64) -> Option<LinkPlan> {
        let touches =
            |a: Nodes, b: Nodes| (a.contains(from) && b.contains(to)) || (a.contains(to) && b.contains(from));
        let rules: Vec<(FaultWindow, LinkFaults)> =
            self.links.iter().filter(|r| touches(r.a, r.b)).map(|r| (r.window, r.faults.clone())).collect();
        let down: Vec<FaultWindow> = (self.partitions.iter())
            .filter(|p| p.nodes.contains(from) || p.nodes.contains(to))
            .map(|p| p.window)
            .collect();
        (!rules.is_empty() || !down.is_empty()).then(|| LinkPlan {
            rules,
            down,
            dice: FaultDice::with_stream(self.seed, stream),
        })
    }
}

/// The faulty links of one learner, seen from the learner: to the scheduler, and to and
/// from each shard.
#[derive(Clone, Debug, Default)]
pub struct LearnerLinks {
    /// Heartbeats to the scheduler.
    pub heartbeat: Option<LinkPlan>,
    /// For each shard: pulls to it, pushes to it, and its answers back.
    pub shards: Vec<[Option<LinkPlan>; 3]>,
}

impl FaultPlan {
    /// The links of learner `learner` in a cluster of `shards` shards, each with its own dice.
    #[must_use]
    pub fn learner_links(&self, learner: LearnerId, shards: u32) -> LearnerLinks {
        let me = Node::Learner(learner);
        let plan = |from, to, stream| self.link(from, to, (u64::from(learner.0) << 8) | stream);
        LearnerLinks {
            heartbeat: plan(me, Node::Scheduler, 0),
            shards: (0..shards)
                .map(|s| {
                    let (shard, stream) = (Node::Shard(ShardId(s)), 1 + 3 * u64::from(s));
                    [plan(me, shard, stream), plan(me, shard, stream + 1), plan(shard, me, stream + 2)]
                })
                .collect(),
        }
    }

    /// When `learner` crashes, if it does.
    #[must_use]
    pub fn crash_of(&self, node: Node) -> Option<Crash> {
        self.crashes.iter().find(|c| c.node == node).copied()
    }

    /// When `node`'s actor panics, if it does.
    #[must_use]
    pub fn panic_of(&self, node: Node) -> Option<Duration> {
        self.panics.iter().find(|p| p.node == node).map(|p| p.at)
    }
}

/// The faults of one directed link.
#[derive(Clone, Debug)]
pub struct LinkPlan {
    rules: Vec<(FaultWindow, LinkFaults)>,
    down: Vec<FaultWindow>,
    dice: FaultDice,
}

impl LinkPlan {
    /// The fate of a message sent `elapsed` after the start.
    pub fn fate(&mut self, elapsed: Duration) -> Fate {
        if self.down.iter().any(|w| w.contains(elapsed)) {
            return Fate::Drop;
        }
        let clean = LinkFaults::default();
        let rules = self.rules.iter().find(|(w, _)| w.contains(elapsed)).map_or(&clean, |(_, r)| r);
        self.dice.roll(rules)
    }
}

/// A link that injects its plan's faults into the messages it forwards to `target`: each is
/// lost, delayed or delivered twice as the dice say.
pub struct Lossy<M: Message<Result = ()> + Clone + Send + 'static> {
    target: Recipient<M>,
    plan: LinkPlan,
    born: Instant,
}

impl<M: Message<Result = ()> + Clone + Send + 'static> Lossy<M> {
    /// Start one in front of `target`, or hand back `target` itself when `plan` is `None`.
    #[must_use]
    pub fn wrap(target: Recipient<M>, plan: Option<LinkPlan>, born: Instant) -> Recipient<M> {
        match plan {
            Some(plan) => Self { target, plan, born }.start().recipient(),
            None => target,
        }
    }
}

impl<M: Message<Result = ()> + Clone + Send + 'static> Actor for Lossy<M> {
    type Context = Context<Self>;
}

impl<M: Message<Result = ()> + Clone + Send + 'static> Handler<M> for Lossy<M> {
    type Result = ();
    fn handle(&mut self, msg: M, ctx: &mut Context<Self>) {
        let Fate::Deliver { delay, copies } = self.plan.fate(self.born.elapsed()) else { return };
        for _ in 0..copies {
            if delay.is_zero() {
                self.target.do_send(msg.clone());
            } else {
                let msg = msg.clone();
                ctx.run_later(delay, move |act, _| act.target.do_send(msg));
            }
        }
    }
}
