//! Learner groups under the harness: each group's aggregator for a shard ([`GroupRound`]) at
//! the shard's end of its members' links, and the shard taking its aggregates.

use super::{Held, Run, Violation};
use crate::{Batch, Clock, Contribution, LearnerId};

impl Run<'_, '_> {
    /// A push reached `learner`'s group's aggregator for shard `s`: held, or sent on with its
    /// round; a copy, or a push of a learner no longer training, has its pull go on alone.
    pub(super) fn at_aggregator(
        &mut self,
        s: usize,
        learner: LearnerId,
        (seq, computed_on, held): (u64, Clock, Held),
    ) -> Result<(), Violation> {
        let g = self.group_of[learner.index()];
        let pull = held.1;
        let c = Contribution { learner, seq, examples: 1 };
        let mut batches = match self.rounds[g][s].push(c, computed_on, held) {
            Ok(Some(batches)) => batches,
            Ok(None) | Err(_) => return self.pull(s, learner, pull.seq, pull.last),
        };
        if pull.last {
            batches.extend(self.rounds[g][s].finish(learner));
        }
        self.aggregates(s, batches)
    }

    /// Shard `s` takes each batch as one aggregate, then the pulls riding on it.
    pub(super) fn aggregates(&mut self, s: usize, batches: Vec<Batch<Held>>) -> Result<(), Violation> {
        for batch in batches {
            let mean = batch.mean(|(g, _)| &g[..]);
            let Batch { computed_on, members, values } = batch;
            let fresh: Vec<Contribution> = members
                .iter()
                .copied()
                .filter(|m| !self.shards[s].accepted.contains(&(m.learner, m.seq)))
                .collect();
            match self.shards[s].core.on_aggregate(&members, computed_on, &mean) {
                Ok(events) => {
                    let shard = &mut self.shards[s];
                    for m in fresh.iter().filter(|m| shard.core.last_pushed(m.learner) >= m.seq) {
                        shard.accepted.insert((m.learner, m.seq));
                    }
                    self.shard_events(s, events)?;
                }
                Err(e) if e.is_duplicate() || members.iter().any(|m| !self.active.contains(&m.learner)) => {}
                Err(e) => return Err(self.violation(format!("a shard refused an aggregate: {e}"))),
            }
            for (m, (_, pull)) in members.iter().zip(values) {
                self.pull(s, m.learner, pull.seq, pull.last)?;
            }
        }
        Ok(())
    }
}
