//! Train a model of your own with Rudra's shards and learners: implement `GradientModel` and
//! hand it to the learner actors.
//!
//!     cargo run --release --example custom_model
//!
//! The model is softmax regression on 2×2-pooled MNIST images (196 features) with L2 weight
//! decay, written in plain Rust. Two learners train it under 2-softsync (async) with
//! per-gradient learning-rate modulation across two shards; the shards' final weights are then
//! evaluated on the test set.

mod common;

use std::path::Path;
use std::sync::Arc;

use actix::prelude::*;
use rudra::actors::learner::{LearnerActor, LearnerLoop, ShardLink, StartLearner, shard_ranges};
use rudra::actors::protocol::shard::SgdShardConfig;
use rudra::actors::protocol::{LearnerCore, LrModulation, LrSchedule, SgdShard, SyncRule};
use rudra::actors::shard::{ShardActor, ShardCore, Snapshot};
use rudra::actors::tracker::StalenessTracker;
use rudra::compute::{BatchStream, ComputeError, GradientModel, Minibatches, Partition};
use rudra::transport::{LearnerId, ShardId};

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
}

fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let train = Arc::new(train.head(12_000));
    let (learners, shards, batch, epochs, seed) = (2, 2, 32, 3, 1);
    let decay = 1e-4;
    let params = PooledSoftmax::new(decay).param_count();
    let steps = (train.len() / learners / batch * epochs) as u64;

    let accuracy = actix::System::new().block_on(async move {
        let tracker = StalenessTracker::default().start();
        let mut threads = Vec::new();
        let mut shard_addrs = Vec::new();
        let mut links = Vec::new();
        for (s, range) in shard_ranges(params, shards).into_iter().enumerate() {
            let cfg = SgdShardConfig {
                id: ShardId(s as u32),
                rule: SyncRule::Softsync { n: learners as u32 },
                modulation: LrModulation::PerGradient,
                max_staleness: None,
                schedule: LrSchedule { base: 0.5, decay: 0.9 },
                gradients_per_epoch: steps / epochs as u64 * learners as u64,
            };
            let active = (0..learners as u32).map(LearnerId).collect();
            let core = SgdShard::new(cfg, vec![0.0; range.len()], active);
            let (arbiter, recipient) = (Arbiter::new(), tracker.clone().recipient());
            let addr = ShardActor::start_in_arbiter(&arbiter.handle(), move |_| {
                ShardActor::new(ShardCore::Sgd(core), recipient)
            });
            links.push(ShardLink::local(range, &addr));
            shard_addrs.push(addr);
            threads.push(arbiter);
        }
        let (link, done) = common::Coordinator::start(learners, None);
        for (l, part) in Partition::split(train.len(), learners, seed).into_iter().enumerate() {
            let batches = Minibatches::new(Arc::clone(&train), BatchStream::new(part, batch, seed, l as u64));
            let core = LearnerLoop::Sgd(LearnerCore::new(LearnerId(l as u32), shards, steps));
            let (arbiter, links, link) = (Arbiter::new(), links.clone(), link.clone());
            let learner = LearnerActor::start_in_arbiter(&arbiter.handle(), move |_| {
                LearnerActor::new(core, PooledSoftmax::new(decay), batches, links, link)
            });
            learner.do_send(StartLearner);
            threads.push(arbiter);
        }
        let samples = done.await??;
        let mut model = PooledSoftmax::new(decay);
        for (addr, link) in shard_addrs.iter().zip(&links) {
            model.write_params(link.range.start, &addr.send(Snapshot).await?.values)?;
        }
        for t in threads {
            t.stop();
        }
        let correct = test
            .chunks(1)
            .filter(|(x, y)| {
                let p = model.probabilities(&PooledSoftmax::pool(x));
                let best = (0..CLASSES).max_by(|&a, &b| p[a].total_cmp(&p[b]));
                best == Some(usize::from(y[0]))
            })
            .count();
        println!("trained on {samples} examples");
        anyhow::Ok(correct as f64 / test.len() as f64)
    })?;
    println!("test accuracy {accuracy:.4}");
    Ok(())
}
