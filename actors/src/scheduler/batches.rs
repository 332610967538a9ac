//! The scheduler's side of adaptive batch sizes (`docs/src/algorithms.md` §5.1): each next
//! epoch's sizes chosen from the learners' throughput, sent to every learner, and again to a
//! learner that rejoins.

use std::sync::Arc;

use rudra_transport::LearnerId;

use super::SchedulerActor;
use crate::messages::{BatchSizes, Progress};

impl SchedulerActor {
    /// The examples and compute time in `heard` count towards the next epoch's sizes; once
    /// they are chosen, every learner is told.
    pub(super) fn sizes_heard(&mut self, heard: &Progress) {
        let Some(planner) = &mut self.planner else { return };
        let done = self.core.samples();
        let Some(epoch) = planner.on_progress(heard.learner, heard.samples, heard.compute_seconds, done)
        else {
            return;
        };
        let sizes = Arc::new(planner.sizes().to_vec());
        let chosen = &sizes[epoch as usize];
        tracing::info!(epoch, "batch sizes {chosen:?} from the learners' throughput");
        self.note("batch sizes", format!("epoch {epoch}: {chosen:?}"));
        for l in &self.members.learners {
            l.sizes.do_send(BatchSizes { sizes: Arc::clone(&sizes) });
        }
    }

    /// Tell `learner` every size chosen so far (it rejoined).
    pub(super) fn send_sizes(&self, learner: LearnerId) {
        let (Some(planner), Some(l)) = (&self.planner, self.members.learners.get(learner.index())) else {
            return;
        };
        l.sizes.do_send(BatchSizes { sizes: Arc::new(planner.sizes().to_vec()) });
    }

    /// Every epoch's sizes, for the report (empty with fixed sizes).
    pub(super) fn batch_sizes(&self) -> Vec<Vec<u32>> {
        self.planner.as_ref().map(|p| p.sizes().to_vec()).unwrap_or_default()
    }
}
