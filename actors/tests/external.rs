//! A run of an external model (a Python learner's): the learners compute on batches of example
//! indices, evaluate the model for the scheduler, and are handed the final weights; a learner
//! whose model fails is removed and the others carry on.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use rudra_actors::{
    BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, RunReport, SgdSpec, TrainingData,
};
use rudra_compute::{Batch, ComputeError, Dataset, GradientModel};
use rudra_proto::{LrModulation, LrSchedule, SyncRule};
use rudra_transport::Codecs;

/// What the learners' models saw: every batch's indices, and the final weights each was handed.
#[derive(Default)]
struct Seen {
    batches: Mutex<Vec<Vec<u32>>>,
    finals: Mutex<Vec<Vec<f32>>>,
}

/// A fake external model for these tests: `½|w − c|²` whatever the batch (its gradient is
/// `w − c`), measured as accuracy 0.25; the model of learner `fails` errs on its first step.
struct IndexedModel {
    params: Vec<f32>,
    grad: Vec<f32>,
    seen: Arc<Seen>,
    fails: bool,
}

const C: [f32; 3] = [1.0, -2.0, 0.5];

impl GradientModel for IndexedModel {
    fn param_count(&self) -> usize {
        self.params.len()
    }
    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        self.params[offset..offset + values.len()].copy_from_slice(values);
        Ok(())
    }
    fn loss_and_gradient(&mut self, _: &[f32], _: &[u8]) -> Result<f32, ComputeError> {
        unreachable!("an external model computes on indices")
    }
    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        out.copy_from_slice(&self.grad);
        Ok(())
    }
    fn evaluate(&mut self, _: &[f32], _: &[u8]) -> Result<(f64, usize), ComputeError> {
        unreachable!("an external model is evaluated by its learners")
    }
    fn gradient_on(&mut self, params: Option<&Arc<Vec<f32>>>, batch: Batch<'_>) -> Result<f32, ComputeError> {
        if self.fails {
            return Err(ComputeError::External("grad_fn raised the model's own error".into()));
        }
        assert!(batch.x.is_empty() && batch.labels.is_empty(), "no examples are held here");
        self.seen.batches.lock().unwrap().push(batch.indices.to_vec());
        let w = params.map_or(self.params.as_slice(), |p| p.as_slice());
        self.grad = w.iter().zip(C).map(|(w, c)| w - c).collect();
        Ok(self.grad.iter().map(|d| d * d).sum::<f32>() / 2.0)
    }
    fn evaluate_weights(
        &mut self,
        params: &Arc<Vec<f32>>,
        last: bool,
    ) -> Result<Option<(f64, f64)>, ComputeError> {
        if last {
            self.seen.finals.lock().unwrap().push(params.to_vec());
        }
        Ok(Some((1.5, 0.25)))
    }
}

fn spec(rule: SyncRule) -> ClusterSpec {
    ClusterSpec {
        learners: 2,
        shards: 1,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule,
            modulation: LrModulation::None,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 4,
        epochs: 1,
        schedule: LrSchedule { base: 0.1, decay: 1.0 },
        seed: 3,
        evals_per_epoch: 2,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    }
}

/// Run `spec` on 32 external examples, the models made `n`-th (from 0) failing where `fails(n)`.
fn run(
    spec: ClusterSpec,
    fails: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> (Result<RunReport, rudra_actors::ActorError>, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let made = Arc::new(Mutex::new(0usize));
    let make = {
        let seen = Arc::clone(&seen);
        move || {
            let mut n = made.lock().unwrap();
            *n += 1;
            let fails = fails(*n - 1);
            Ok(IndexedModel { params: vec![0.0; 3], grad: vec![0.0; 3], seen: Arc::clone(&seen), fails })
        }
    };
    let models = Models::external(Arc::new(vec![3.0; 3])).with_learners(make);
    let data = TrainingData { train: Arc::new(Dataset::external(32)), test: Arc::new(Dataset::external(0)) };
    let report =
        actix::System::new().block_on(async move { Cluster::new(spec, models, data)?.start()?.wait().await });
    (report, seen)
}

#[test]
fn an_external_model_is_evaluated_by_its_learners_and_each_is_handed_the_final_weights() {
    let (report, seen) = run(spec(SyncRule::Hardsync), |_| false);
    let report = report.expect("the run ends");
    // 32 examples, two learners of 16, μ = 4: four hardsync rounds of the mean gradient w − c.
    assert_eq!(report.updates, 4);
    let want: Vec<f32> = (0..3).map(|i| C[i] + 0.9f32.powi(4) * (3.0 - C[i])).collect();
    for (got, want) in report.params.iter().zip(&want) {
        assert!((got - want).abs() < 1e-5, "{:?} != {want:?}", report.params);
    }
    assert_eq!(report.final_test_accuracy, 0.25, "measured by a learner");
    assert!(report.metrics.iter().all(|row| row.test_accuracy == 0.25 && row.test_loss == 1.5));
    assert_eq!(
        *seen.finals.lock().unwrap(),
        vec![report.params.clone(); 2],
        "both learners hold the final weights"
    );
    // Every example's index given exactly once in the epoch, in batches of μ.
    let batches = seen.batches.lock().unwrap();
    assert!(batches.iter().all(|b| b.len() == 4));
    let indices: Vec<u32> = batches.iter().flatten().copied().collect();
    assert_eq!(indices.iter().copied().collect::<BTreeSet<_>>(), (0..32).collect());
    assert_eq!(indices.len(), 32);
}

#[test]
fn a_learner_whose_model_fails_is_removed_and_the_other_finishes() {
    let (report, seen) = run(spec(SyncRule::Async), |n| n == 1);
    let report = report.expect("the run goes on without the failed learner");
    assert_eq!((report.samples, report.samples_expected), (16, 32), "the failed learner's half is missing");
    assert!(
        report.timeline.iter().any(|e| e.what.contains("failed: grad_fn raised the model's own error")),
        "{:?}",
        report.timeline
    );
    assert_eq!(seen.finals.lock().unwrap().len(), 1, "only the learner left is handed the final weights");
    // The last learner's failure fails the run, with its error.
    let (report, _) = run(spec(SyncRule::Async), |_| true);
    let error = report.expect_err("no learner is left").to_string();
    assert!(error.contains("the model's own error"), "{error}");
}
