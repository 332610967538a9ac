//! What the examples share: a stand-in for Rudra's scheduler that gathers the learners'
//! progress and says when they have all finished.

use std::sync::Arc;

use actix::prelude::*;
use rudra::actors::learner::SchedulerLink;
use rudra::actors::metrics::Metrics;
use rudra::actors::scheduler::{Heartbeat, LearnerDone, Progress};
use tokio::sync::oneshot;

/// Print the mean training loss every this many examples.
const PRINT_EVERY: u64 = 4000;

/// Counts the examples the learners processed; reports the total once all are done.
pub struct Coordinator {
    learners: usize,
    finished: usize,
    samples: u64,
    printed: u64,
    loss: (f64, u64),
    metrics: Option<Arc<Metrics>>,
    done: Option<oneshot::Sender<anyhow::Result<u64>>>,
}

impl Coordinator {
    /// Start one for `learners` learners, recording into `metrics` if given. The receiver
    /// gets the examples processed once every learner has finished, or the first failure.
    pub fn start(
        learners: usize,
        metrics: Option<Arc<Metrics>>,
    ) -> (SchedulerLink, oneshot::Receiver<anyhow::Result<u64>>) {
        let (tx, rx) = oneshot::channel();
        if let Some(m) = &metrics {
            m.set_learners_alive(learners);
        }
        let me =
            Self { learners, finished: 0, samples: 0, printed: 0, loss: (0.0, 0), metrics, done: Some(tx) }
                .start();
        (SchedulerLink::of(&me), rx)
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

impl Handler<Progress> for Coordinator {
    type Result = ();
    fn handle(&mut self, p: Progress, _: &mut Context<Self>) {
        if let Some(m) = &self.metrics {
            m.add_learner_samples(p.learner, p.samples);
        }
        self.samples += p.samples;
        self.loss = (self.loss.0 + p.loss_sum, self.loss.1 + p.steps);
        if self.samples >= self.printed + PRINT_EVERY {
            println!(
                "{} examples, training loss {:.4}",
                self.samples,
                self.loss.0 / self.loss.1.max(1) as f64
            );
            (self.printed, self.loss) = (self.samples, (0.0, 0));
        }
    }
}

/// The examples run in one process: nobody is lost, so heartbeats need no answer.
impl Handler<Heartbeat> for Coordinator {
    type Result = ();
    fn handle(&mut self, _: Heartbeat, _: &mut Context<Self>) {}
}

impl Handler<LearnerDone> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: LearnerDone, _: &mut Context<Self>) {
        self.finished += 1;
        if let Some(m) = &self.metrics {
            m.set_learners_alive(self.learners - self.finished);
        }
        let outcome = match msg.error {
            Some(e) => Err(anyhow::anyhow!("{} failed: {e}", msg.learner)),
            None if self.finished == self.learners => Ok(self.samples),
            None => return,
        };
        if let Some(tx) = self.done.take() {
            // Nobody waiting means nobody to tell.
            let _ = tx.send(outcome);
        }
    }
}
