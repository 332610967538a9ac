//! The staleness tracker actor: gathers every shard's gradient and update records into the
//! run's staleness statistics.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;

use crate::goodput::LearnerCounts;
use crate::messages::{GetStats, Records, TrackerReport};
use crate::metrics::Metrics;
use rudra_proto::{LeaderGroups, LearnerId, Outcome, StalenessStats};

/// The tracker actor.
#[derive(Default)]
pub struct StalenessTracker {
    stats: StalenessStats,
    updates: Vec<u64>,
    /// Payload bytes received, by shard.
    payload_in: Vec<u64>,
    /// Each learner's contributions applied and dropped.
    by_learner: BTreeMap<LearnerId, LearnerCounts>,
    /// Whose contributions each record counts (groups with rounds of their own).
    groups: LeaderGroups,
    metrics: Option<Arc<Metrics>>,
}

impl StalenessTracker {
    /// A tracker that also records every shard's gradients and updates in `metrics`, if
    /// given (for a node whose shards live elsewhere and report here).
    #[must_use]
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        Self { metrics, ..Self::default() }
    }

    /// The shards' records of each of `groups` (rounds of their own, recorded under the
    /// group's first member) count for each of its members.
    #[must_use]
    pub fn with_groups(mut self, groups: LeaderGroups) -> Self {
        self.groups = groups;
        self
    }

    /// Go on from the counts of `report` (a scheduler restarted from its state).
    #[must_use]
    pub fn resumed(mut self, report: &TrackerReport) -> Self {
        self.stats = StalenessStats::from_summary(&report.staleness);
        self.updates = vec![report.updates];
        self.payload_in.clone_from(&report.shard_payload_in);
        self.by_learner = report.by_learner.iter().map(|c| (c.learner, *c)).collect();
        self
    }
}

impl Actor for StalenessTracker {
    type Context = Context<Self>;
}

impl Handler<Records> for StalenessTracker {
    type Result = ();
    fn handle(&mut self, msg: Records, _: &mut Context<Self>) {
        if let Some(m) = &self.metrics {
            m.record(&msg.gradients, &msg.updates);
        }
        for g in &msg.gradients {
            for &learner in self.groups.members(&g.learner) {
                let fresh = LearnerCounts { learner, applied: 0, dropped: 0 };
                let counts = self.by_learner.entry(learner).or_insert(fresh);
                match g.outcome {
                    Outcome::Applied { .. } => counts.applied += 1,
                    Outcome::Dropped(_) => counts.dropped += 1,
                }
            }
            match g.outcome {
                Outcome::Applied { .. } => self.stats.record_applied(g.staleness),
                Outcome::Dropped(reason) => {
                    tracing::debug!(shard = %g.shard, learner = %g.learner, sigma = g.staleness.0, ?reason, "gradient dropped");
                    self.stats.record_dropped(reason);
                }
            }
        }
        for u in &msg.updates {
            let i = u.shard.index();
            for counts in [&mut self.updates, &mut self.payload_in] {
                if counts.len() <= i {
                    counts.resize(i + 1, 0);
                }
            }
            self.updates[i] = self.updates[i].max(u.clock.0);
            self.payload_in[i] += u.payload_in;
        }
    }
}

impl Handler<GetStats> for StalenessTracker {
    type Result = MessageResult<GetStats>;
    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(TrackerReport {
            staleness: self.stats.summary(),
            updates: self.updates.iter().copied().max().unwrap_or(0),
            by_learner: self.by_learner.values().copied().collect(),
            shard_payload_in: self.payload_in.clone(),
        })
    }
}
