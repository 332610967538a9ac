//! `[faults]` turned into a checked [`FaultPlan`], and `[[faults.kill]]` into the [`Kill`]s
//! that `rudra-node experiment` carries out on processes.

use std::time::Duration;

use rudra_actors::faults::{Crash, FaultPlan, LinkRule, Node, Nodes, Panic, Partition, Slow};
use rudra_transport::{FaultWindow, LearnerId, LinkFaults, ShardId};

use serde::Serialize;

use super::invalid;
use super::raw::RawFaults;
use crate::RuntimeError;

impl RawFaults {
    /// The checked plan for a cluster of `learners` learners and `shards` shards; `elastic`
    /// says whether the protocol is of the EASGD family, whose exchanges are not retried.
    pub(super) fn plan(
        &self,
        learners: u32,
        shards: u32,
        elastic: bool,
        checkpoints: bool,
    ) -> Result<FaultPlan, RuntimeError> {
        let ms = Duration::from_millis;
        let nodes = |key: &'static str, s: &str| {
            let n = Nodes::parse(s).map_err(|e| invalid(key, e))?;
            match n {
                Nodes::Learner(l) if l.0 >= learners => {
                    Err(invalid(key, format!("{s}: there are {learners} learners")))
                }
                Nodes::Shard(x) if x.0 >= shards => {
                    Err(invalid(key, format!("{s}: there are {shards} shards")))
                }
                _ => Ok(n),
            }
        };
        let window = |key: &'static str, from: u64, until: Option<u64>| {
            let w = FaultWindow { from: ms(from), until: until.map(ms) };
            w.validate().map(|()| w).map_err(|e| invalid(key, e.to_string()))
        };
        let learner = |key: &'static str, l: u32| {
            if l < learners {
                Ok(LearnerId(l))
            } else {
                Err(invalid(key, format!("learner {l}: there are {learners}")))
            }
        };
        let lossy = self.link.iter().any(|r| r.drop > 0.0) || !self.partition.is_empty();
        if elastic && lossy {
            return Err(invalid(
                "faults",
                "dropped messages and partitions need hardsync, softsync or async: an EASGD exchange is not retried",
            ));
        }
        let mut links = Vec::new();
        for r in &self.link {
            let faults = LinkFaults {
                drop: r.drop,
                duplicate: r.duplicate,
                reorder: r.reorder,
                delay: ms(r.delay_ms),
                jitter: ms(r.jitter_ms),
            };
            faults.validate().map_err(|e| invalid("faults.link", e.to_string()))?;
            let (a, b) =
                (nodes("faults.link.between", &r.between[0])?, nodes("faults.link.between", &r.between[1])?);
            links.push(LinkRule {
                a,
                b,
                faults,
                window: window("faults.link.until_ms", r.from_ms, r.until_ms)?,
            });
        }
        let partitions = (self.partition.iter())
            .map(|p| {
                let nodes = nodes("faults.partition.node", &p.node)?;
                Ok(Partition { nodes, window: window("faults.partition.until_ms", p.from_ms, p.until_ms)? })
            })
            .collect::<Result<_, RuntimeError>>()?;
        let crashes = (self.crash.iter())
            .map(|c| {
                let node = match (c.learner, c.shard, c.restart_after_ms) {
                    (Some(l), None, None) => Node::Learner(learner("faults.crash.learner", l)?),
                    (Some(_), None, Some(_)) => {
                        return Err(invalid(
                            "faults.crash.restart_after_ms",
                            "a crashed learner stays down; start a new `rudra-node --role learner` to replace it",
                        ));
                    }
                    (None, Some(x), Some(_)) if x < shards => Node::Shard(ShardId(x)),
                    (None, Some(x), Some(_)) => {
                        return Err(invalid("faults.crash.shard", format!("shard {x}: there are {shards}")));
                    }
                    (None, Some(_), None) => {
                        return Err(invalid(
                            "faults.crash.restart_after_ms",
                            "a crashed shard must restart: the run cannot go on without its parameters",
                        ));
                    }
                    _ => return Err(invalid("faults.crash", "give either `learner` or `shard`")),
                };
                if matches!(node, Node::Shard(_)) && elastic {
                    return Err(invalid(
                        "faults.crash.shard",
                        "shard crashes need hardsync, softsync or async: an EASGD exchange is not retried",
                    ));
                }
                if matches!(node, Node::Shard(_)) && !checkpoints {
                    return Err(invalid(
                        "checkpoint.every_updates",
                        "is 0; a shard that crashes restarts from its checkpoint, so set it above 0",
                    ));
                }
                Ok(Crash { node, at: ms(c.at_ms), restart_after: c.restart_after_ms.map(ms) })
            })
            .collect::<Result<_, RuntimeError>>()?;
        let slow = (self.slow.iter())
            .map(|s| {
                if !(s.factor.is_finite() && s.factor >= 1.0) {
                    return Err(invalid(
                        "faults.slow.factor",
                        format!("is {}; it must be at least 1", s.factor),
                    ));
                }
                Ok(Slow { learner: learner("faults.slow.learner", s.learner)?, factor: s.factor })
            })
            .collect::<Result<_, RuntimeError>>()?;
        let panics = (self.panic.iter())
            .map(|p| {
                let node = match nodes("faults.panic.node", &p.node)? {
                    Nodes::Learner(l) => Node::Learner(l),
                    Nodes::Shard(s) => Node::Shard(s),
                    _ => {
                        return Err(invalid(
                            "faults.panic.node",
                            format!("{}: name one shard-N or learner-N", p.node),
                        ));
                    }
                };
                Ok(Panic { node, at: ms(p.at_ms) })
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(FaultPlan { seed: self.seed, links, partitions, crashes, slow, panics })
    }
}

/// A process of the run killed (SIGKILL) by `rudra-node experiment`, and perhaps started again
/// with the command it had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Kill {
    /// `scheduler`, `shard-N` or `learner-N`: the process's name.
    pub node: String,
    /// When, after the run started (the scheduler gathered its nodes).
    pub at: Duration,
    /// Started again this long after (none: it stays down).
    pub restart_after: Option<Duration>,
}

impl RawFaults {
    /// The checked `[[faults.kill]]` entries: one per process at most, each naming a process of
    /// the run. A killed scheduler must come back (the run's record is its to write), and a shard
    /// that comes back needs checkpoints and a protocol whose exchanges are retried.
    pub(super) fn kills(
        &self,
        learners: u32,
        shards: u32,
        elastic: bool,
        checkpoints: bool,
    ) -> Result<Vec<Kill>, RuntimeError> {
        let key = "faults.kill.node";
        let mut kills: Vec<Kill> = Vec::new();
        for k in &self.kill {
            let index = |prefix: &str| k.node.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
            match (k.node.as_str(), index("shard-"), index("learner-")) {
                ("scheduler", ..) if k.restart_after_ms.is_none() => {
                    return Err(invalid(
                        "faults.kill.restart_after_ms",
                        "a killed scheduler must restart in an experiment: the run's record is the scheduler's to write",
                    ));
                }
                ("scheduler", ..) => {}
                (_, Some(x), _) if x >= shards => {
                    return Err(invalid(key, format!("{}: there are {shards} shards", k.node)));
                }
                (_, Some(_), _) if k.restart_after_ms.is_some() && elastic => {
                    return Err(invalid(
                        key,
                        "a shard that restarts needs hardsync, softsync or async: an EASGD exchange is not retried",
                    ));
                }
                (_, Some(_), _) if k.restart_after_ms.is_some() && !checkpoints => {
                    return Err(invalid(
                        "checkpoint.every_updates",
                        "is 0; a shard that restarts goes on from its checkpoint, so set it above 0",
                    ));
                }
                (_, Some(_), _) => {}
                (_, _, Some(l)) if l >= learners => {
                    return Err(invalid(key, format!("{}: there are {learners} learners", k.node)));
                }
                (_, _, Some(_)) => {}
                _ => {
                    return Err(invalid(
                        key,
                        format!("is {:?}; give `scheduler`, `shard-N` or `learner-N`", k.node),
                    ));
                }
            }
            if kills.iter().any(|earlier| earlier.node == k.node) {
                return Err(invalid(key, format!("{} is killed twice; kill each process once", k.node)));
            }
            kills.push(Kill {
                node: k.node.clone(),
                at: Duration::from_millis(k.at_ms),
                restart_after: k.restart_after_ms.map(Duration::from_millis),
            });
        }
        Ok(kills)
    }
}
