//! Train a model of your own with Rudra: implement `GradientModel` and give the cluster a
//! factory for it.
//!
//!     cargo run --release --example custom_model
//!
//! The model is softmax regression on 2×2-pooled MNIST images (196 features) with L2 weight
//! decay, written in plain Rust. Two learners train it under 2-softsync (async) with
//! per-gradient learning-rate modulation across two shards, and the scheduler evaluates the
//! shards' weights on the test set with one more of the same model.

use std::path::Path;
use std::sync::Arc;

use rudra::actors::{BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, SgdSpec, TrainingData};
use rudra::compute::{ComputeError, GradientModel};
use rudra::proto::{LrModulation, LrSchedule, SyncRule};
use rudra::transport::Codecs;

const SIDE: usize = 28;
const FEATURES: usize = (SIDE / 2) * (SIDE / 2);
const CLASSES: usize = 10;
const WEIGHTS: usize = CLASSES * FEATURES;

/// Softmax regression over 2×2 averages of a 28×28 image; parameters are the `CLASSES ×
/// FEATURES` weights, row-major, then the biases.
struct PooledSoftmax {
    params: Vec<f32>,
    grad: Vec<f32>,
    /// The L2 penalty λ/2 · |W|².
    decay: f32,
}

impl PooledSoftmax {
    fn new(decay: f32) -> Self {
        Self { params: vec![0.0; WEIGHTS + CLASSES], grad: vec![0.0; WEIGHTS + CLASSES], decay }
    }

    /// The 2×2 block averages of one image.
    fn pool(image: &[f32]) -> [f32; FEATURES] {
        let mut out = [0.0; FEATURES];
        for (i, v) in out.iter_mut().enumerate() {
            let (r, c) = (2 * (i / (SIDE / 2)), 2 * (i % (SIDE / 2)));
            *v = (image[r * SIDE + c]
                + image[r * SIDE + c + 1]
                + image[(r + 1) * SIDE + c]
                + image[(r + 1) * SIDE + c + 1])
                / 4.0;
        }
        out
    }

    /// Class probabilities of one pooled image.
    fn probabilities(&self, x: &[f32; FEATURES]) -> [f32; CLASSES] {
        let mut p = [0.0f32; CLASSES];
        for (k, pk) in p.iter_mut().enumerate() {
            let w = &self.params[k * FEATURES..(k + 1) * FEATURES];
            *pk = self.params[WEIGHTS + k] + w.iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
        }
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = p
            .iter_mut()
            .map(|v| {
                *v = (*v - max).exp();
                *v
            })
            .sum();
        p.map(|v| v / total)
    }

    fn rows(x: &[f32], labels: &[u8]) -> Result<usize, ComputeError> {
        if labels.is_empty() || x.len() != labels.len() * SIDE * SIDE {
            return Err(ComputeError::Shape(format!(
                "{} values for {} images of {SIDE}×{SIDE}",
                x.len(),
                labels.len()
            )));
        }
        Ok(labels.len())
    }
}

impl GradientModel for PooledSoftmax {
    fn param_count(&self) -> usize {
        self.params.len()
    }

    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        let end = offset.checked_add(values.len()).filter(|&e| e <= self.params.len());
        let Some(end) = end else {
            return Err(ComputeError::Shape(format!(
                "{} values at {offset} overrun {} parameters",
                values.len(),
                self.params.len()
            )));
        };
        self.params[offset..end].copy_from_slice(values);
        Ok(())
    }

    fn loss_and_gradient(&mut self, x: &[f32], labels: &[u8]) -> Result<f32, ComputeError> {
        let n = Self::rows(x, labels)? as f32;
        // The penalty's gradient λW, then the mean cross-entropy's.
        for (g, w) in self.grad.iter_mut().zip(&self.params[..WEIGHTS]) {
            *g = self.decay * w;
        }
        self.grad[WEIGHTS..].fill(0.0);
        let mut loss = 0.5 * self.decay * self.params[..WEIGHTS].iter().map(|w| w * w).sum::<f32>();
        for (image, &label) in x.chunks_exact(SIDE * SIDE).zip(labels) {
            let pooled = Self::pool(image);
            let p = self.probabilities(&pooled);
            let label = usize::from(label);
            loss -= p.get(label).copied().unwrap_or(f32::MIN_POSITIVE).max(f32::MIN_POSITIVE).ln() / n;
            for (k, pk) in p.iter().enumerate() {
                let d = (pk - if k == label { 1.0 } else { 0.0 }) / n;
                for (g, v) in self.grad[k * FEATURES..(k + 1) * FEATURES].iter_mut().zip(&pooled) {
                    *g += d * v;
                }
                self.grad[WEIGHTS + k] += d;
            }
        }
        Ok(loss)
    }

    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        if out.len() != self.grad.len() {
            return Err(ComputeError::Shape(format!("a gradient of {} into {}", self.grad.len(), out.len())));
        }
        // The next gradient overwrites every value, so the buffers are swapped, not copied.
        std::mem::swap(out, &mut self.grad);
        Ok(())
    }

    fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        Self::rows(x, labels)?;
        let (mut loss, mut correct) = (0.0, 0);
        for (image, &label) in x.chunks_exact(SIDE * SIDE).zip(labels) {
            let p = self.probabilities(&Self::pool(image));
            let label = usize::from(label);
            loss -= f64::from(p.get(label).copied().unwrap_or(0.0).max(f32::MIN_POSITIVE).ln());
            let best = (0..CLASSES).max_by(|&a, &b| p[a].total_cmp(&p[b]));
            correct += usize::from(best == Some(label));
        }
        Ok((loss, correct))
    }
}

fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let data = TrainingData { train: Arc::new(train.head(12_000)), test: Arc::new(test) };
    let spec = ClusterSpec {
        learners: 2,
        shards: 2,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 2 },
            modulation: LrModulation::PerGradient,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 32,
        epochs: 3,
        schedule: LrSchedule { base: 0.5, decay: 0.9 },
        seed: 1,
        evals_per_epoch: 1,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    };
    let decay = 1e-4;
    let models = Models::custom(vec![0.0; WEIGHTS + CLASSES], move || Ok(PooledSoftmax::new(decay)));
    let cluster = Cluster::new(spec, models, data)?;
    let report = actix::System::new().block_on(async move { cluster.start()?.wait().await })?;
    println!("trained on {} examples", report.samples);
    println!("test accuracy {:.4}", report.final_test_accuracy);
    Ok(())
}
