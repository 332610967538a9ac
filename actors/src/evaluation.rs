//! One evaluation of the run's model: the shards' weights assembled, the tracker's statistics,
//! and the test loss and accuracy measured by the scheduler's own model or, for a model of the
//! user's own, by the learners.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rudra_compute::Dataset;
use rudra_transport::ShardId;

use crate::links::ShardHandle;
use crate::messages::{Evaluate, GetStats, Measured, Snapshot, TrackerReport};
use crate::{ActorError, Models};

/// Test examples evaluated per forward pass.
const EVAL_CHUNK: usize = 1000;

/// What one evaluation measured.
pub(crate) struct Evaluation {
    pub params: Vec<f32>,
    pub tracker: TrackerReport,
    pub measured: Measured,
}

/// Everything an evaluation asks, taken from the scheduler when it starts.
pub(crate) struct Ask {
    pub shards: Vec<ShardHandle>,
    pub stats: Recipient<GetStats>,
    pub models: Models,
    pub test: Arc<Dataset>,
    /// The active learners, asked when the scheduler cannot evaluate the model itself and,
    /// at the end, given the final weights.
    pub learners: Vec<Recipient<Evaluate>>,
    pub final_: bool,
    /// How long a shard may take to give its weights (it may be coming back from a crash).
    pub shard_timeout: Duration,
    /// How long a learner may take to answer.
    pub learner_timeout: Duration,
}

impl Ask {
    /// Assemble the weights and measure them.
    pub async fn run(self) -> Result<Evaluation, ActorError> {
        let mut params = Vec::new();
        let timeout = self.shard_timeout;
        for (id, s) in self.shards.iter().enumerate() {
            // A shard that is down answers once it is back; one that never is ends the run.
            let weights =
                tokio::time::timeout(timeout, s.snapshot.send(Snapshot)).await.map_err(|_| {
                    let why = format!("gave no weights for an evaluation within {timeout:?}");
                    ActorError::ShardFailed(ShardId(id as u32), why)
                })??;
            params.extend_from_slice(&weights.values);
        }
        let tracker = self.stats.send(GetStats).await?;
        let params = Arc::new(params);
        let here = match self.models.evaluator() {
            Some(model) => {
                let (test, at) = (Arc::clone(&self.test), Arc::clone(&params));
                let measured = tokio::task::spawn_blocking(move || evaluate_on(model?, &test, &at))
                    .await
                    .map_err(|e| ActorError::Evaluation(e.to_string()))??;
                Some(measured)
            }
            None => None,
        };
        // The final weights go to every learner (a Python learner returns them).
        let asked = if self.final_ || here.is_none() {
            ask_learners(&self.learners, &params, self.final_, self.learner_timeout).await
        } else {
            None
        };
        let measured = here.or(asked).unwrap_or(Measured { loss: f64::NAN, accuracy: f64::NAN });
        let params = Arc::try_unwrap(params).unwrap_or_else(|shared| (*shared).clone());
        Ok(Evaluation { params, tracker, measured })
    }
}

/// Test loss and accuracy of `params` on `model`.
fn evaluate_on(
    mut model: Box<dyn rudra_compute::GradientModel>,
    test: &Dataset,
    params: &[f32],
) -> Result<Measured, ActorError> {
    model.write_params(0, params)?;
    let (loss, accuracy) = model.evaluate_set(test, EVAL_CHUNK)?;
    Ok(Measured { loss, accuracy })
}

/// The learners' own evaluation of `params` (an external model's): asked in turn until one
/// measures them; the final weights (`last`) go to every learner at once, which keep them as
/// their result. `None`: no learner evaluates.
async fn ask_learners(
    learners: &[Recipient<Evaluate>],
    params: &Arc<Vec<f32>>,
    last: bool,
    timeout: Duration,
) -> Option<Measured> {
    // Each ask runs out `timeout` after it is sent, however long the ones before it took.
    let ask = |l: &Recipient<Evaluate>| {
        let deadline = tokio::time::Instant::now() + timeout;
        let asked = l.send(Evaluate { params: Arc::clone(params), last });
        async move { tokio::time::timeout_at(deadline, asked).await.ok().and_then(Result::ok).flatten() }
    };
    let mut measured = None;
    if last {
        // Sent to all at once, so the learners measure side by side.
        let asked: Vec<_> = learners.iter().map(ask).collect();
        for answer in asked {
            measured = measured.or(answer.await);
        }
    } else {
        for l in learners {
            measured = ask(l).await;
            if measured.is_some() {
                break;
            }
        }
    }
    measured
}
