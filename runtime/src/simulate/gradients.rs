//! Where the simulated learners' gradients come from: the noisy quadratic, or the real model
//! on the real data.

use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rudra_compute::{CpuBackend, Dataset, GradientModel, Minibatches, Model, ModelSpec};

use super::model::fill_normal;
use super::settings::Quadratic;
use crate::RuntimeError;

/// Test examples evaluated per forward pass.
const EVAL_CHUNK: usize = 1000;

/// Part of a parameter vector: its offset and values.
pub type Part<'a> = (usize, &'a [f32]);

/// A gradient source.
pub enum Gradients {
    /// `f(θ) = h/2 · |θ|²` with Gaussian noise on every gradient value.
    Quadratic(Quadratic),
    /// A classifier on its training set, one model shared by all learners (they compute one
    /// at a time in virtual time), each learner with its own minibatches.
    Model(Box<ModelGradients>),
}

/// The state of [`Gradients::Model`].
pub struct ModelGradients {
    model: Model<CpuBackend>,
    batches: Vec<Minibatches>,
    test: Arc<Dataset>,
}

impl Gradients {
    /// The model `spec` over each learner's `batches`, evaluated on `test`.
    pub fn model(
        spec: ModelSpec,
        batches: Vec<Minibatches>,
        test: Arc<Dataset>,
    ) -> Result<Self, RuntimeError> {
        let model = Model::new(CpuBackend, spec)?;
        Ok(Self::Model(Box::new(ModelGradients { model, batches, test })))
    }

    /// Learner `learner`'s gradient at the parameters assembled from `parts`, with the loss
    /// there (the minibatch loss for a model; the noise-free objective for the quadratic).
    pub fn compute(
        &mut self,
        learner: usize,
        parts: &[Part<'_>],
        rng: &mut ChaCha8Rng,
    ) -> Result<(Vec<f32>, f64), RuntimeError> {
        match self {
            Self::Quadratic(q) => {
                let mut grad = vec![0.0; q.dimension];
                fill_normal(rng, &mut grad, q.noise);
                for &(offset, values) in parts {
                    for (g, &v) in grad[offset..offset + values.len()].iter_mut().zip(values) {
                        *g += q.curvature * v;
                    }
                }
                Ok((grad, q.objective(parts.iter().map(|p| p.1))))
            }
            Self::Model(m) => {
                for &(offset, values) in parts {
                    m.model.write_params(offset, values)?;
                }
                let b = m.batches[learner].next_batch();
                let loss = m.model.loss_and_gradient(b.x, b.labels)?;
                let mut grad = vec![0.0; m.model.layout().len];
                m.model.read_gradient(0, &mut grad)?;
                Ok((grad, f64::from(loss)))
            }
        }
    }

    /// The exact objective at `parts` where it is known (the quadratic).
    pub fn objective<'a>(&self, parts: impl IntoIterator<Item = &'a [f32]>) -> Option<f64> {
        match self {
            Self::Quadratic(q) => Some(q.objective(parts)),
            Self::Model(_) => None,
        }
    }

    /// Test loss and accuracy of `params` (a model only).
    pub fn evaluate(&mut self, params: &[f32]) -> Result<Option<(f64, f64)>, RuntimeError> {
        match self {
            Self::Quadratic(_) => Ok(None),
            Self::Model(m) => {
                m.model.write_params(0, params)?;
                Ok(Some(m.model.evaluate_set(&m.test, EVAL_CHUNK)?))
            }
        }
    }
}

impl Quadratic {
    /// The initial parameters.
    #[must_use]
    pub fn init(&self) -> Vec<f32> {
        vec![self.init; self.dimension]
    }

    /// `h/2 · |θ|²` over the parts of θ.
    pub fn objective<'a>(&self, parts: impl IntoIterator<Item = &'a [f32]>) -> f64 {
        let sum: f64 = parts.into_iter().flatten().map(|&v| f64::from(v) * f64::from(v)).sum();
        0.5 * f64::from(self.curvature) * sum
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn quadratic_gradient_is_h_theta_plus_noise() {
        let q = Quadratic { dimension: 4, curvature: 2.0, noise: 0.0, init: 1.0 };
        let mut g = Gradients::Quadratic(q);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (grad, loss) = g.compute(0, &[(0, &[1.0, -1.0]), (2, &[0.5, 0.0])], &mut rng).unwrap();
        assert_eq!(grad, vec![2.0, -2.0, 1.0, 0.0]);
        assert_eq!(loss, 0.5 * 2.0 * 2.25);
        assert_eq!(g.objective([&[3.0f32][..]]), Some(9.0));
        assert_eq!(q.init(), vec![1.0; 4]);

        let mut noisy = Gradients::Quadratic(Quadratic { noise: 1.0, ..q });
        let (a, _) = noisy.compute(0, &[(0, &[0.0; 4])], &mut rng).unwrap();
        let (b, _) = noisy.compute(0, &[(0, &[0.0; 4])], &mut rng).unwrap();
        assert!(a != b && a.iter().all(|v| v.abs() < 6.0), "noise is drawn anew: {a:?} {b:?}");
    }
}
