//! Local optimizers for the learners that step on their own between exchanges (EASGD,
//! DOWNPOUR, DiLoCo): plain SGD, heavy-ball momentum, and AdamW (Loshchilov & Hutter, with
//! bias correction and decoupled weight decay). The state stays with the learner across
//! exchanges, as DiLoCo's inner optimizer's does.
//!
//! A learner's variable x^i lives in host memory, where its model reads it at every step, so
//! the steps run there, on the CPU backend's kernels ([`cpu::momentum`], [`cpu::adamw`]); the
//! same kernels of [`rudra_compute::Backend`] on wgpu and CUDA are held to them by the parity
//! tests.

use rudra_compute::{Adam, Rate, cpu};
use serde::{Deserialize, Serialize};

/// `training.optimizer` and its settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum OptimizerSpec {
    /// `x ← x − η g`.
    Sgd,
    /// Heavy ball: `b ← μ b − η g; x ← x + b` (PyTorch's SGD with momentum while η is fixed).
    Momentum {
        /// μ.
        momentum: f32,
    },
    /// `m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²; m̂ = m / (1 − β1^t);
    /// v̂ = v / (1 − β2^t); x ← x − η (m̂ / (√v̂ + ε) + w x)`.
    AdamW {
        /// β1.
        beta1: f32,
        /// β2.
        beta2: f32,
        /// ε.
        eps: f32,
        /// Decoupled weight decay w.
        weight_decay: f32,
    },
}

/// A learner's optimizer and its state.
#[derive(Clone, Debug)]
pub struct LocalOptimizer {
    spec: OptimizerSpec,
    /// Momentum's buffer, or AdamW's first moment.
    m: Vec<f32>,
    /// AdamW's second moment.
    v: Vec<f32>,
    /// AdamW's step count.
    t: i32,
}

impl LocalOptimizer {
    /// `spec` over `len` parameters, its state at zero.
    #[must_use]
    pub fn new(spec: OptimizerSpec, len: usize) -> Self {
        let (m, v) = match spec {
            OptimizerSpec::Sgd => (0, 0),
            OptimizerSpec::Momentum { .. } => (len, 0),
            OptimizerSpec::AdamW { .. } => (len, len),
        };
        Self { spec, m: vec![0.0; m], v: vec![0.0; v], t: 0 }
    }

    /// Whether it is plain SGD (whose step DOWNPOUR takes on x^i and v in one pass).
    #[must_use]
    pub fn is_sgd(&self) -> bool {
        self.spec == OptimizerSpec::Sgd
    }

    /// One step of rate `lr` on `x` with the gradient `g` taken at `x`; advances the state.
    ///
    /// # Panics
    /// If `x` or `g` is not as long as the optimizer (a caller bug: lengths are fixed by the
    /// model).
    pub fn step(&mut self, lr: f32, x: &mut [f32], g: &[f32]) {
        match self.spec {
            OptimizerSpec::Sgd => cpu::axpy(-lr, g, x),
            OptimizerSpec::Momentum { momentum } => cpu::momentum(Rate { lr, momentum }, g, &mut self.m, x),
            OptimizerSpec::AdamW { beta1, beta2, eps, weight_decay } => {
                self.t = self.t.saturating_add(1);
                let step = Adam { lr, beta1, beta2, eps, weight_decay, t: self.t };
                cpu::adamw(step, g, (&mut self.m, &mut self.v), x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gradient that changes sign and size from step to step.
    fn grad(k: usize, x: &[f32]) -> Vec<f32> {
        x.iter().enumerate().map(|(i, x)| x * (1.0 + i as f32) - ((k * 7 + i) % 5) as f32 * 0.3).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-5 * (1.0 + b.abs())
    }

    #[test]
    fn adamw_matches_a_reference_with_bias_correction_and_decoupled_decay() {
        let (lr, b1, b2, eps, w) = (0.01f32, 0.9f32, 0.999f32, 1e-8f32, 0.01f32);
        let spec = OptimizerSpec::AdamW { beta1: b1, beta2: b2, eps, weight_decay: w };
        let mut opt = LocalOptimizer::new(spec, 3);
        let mut x = vec![1.0f32, -0.5, 2.0];
        let (mut rx, mut m, mut v) = ([1.0f64, -0.5, 2.0], [0.0f64; 3], [0.0f64; 3]);
        for k in 0..50 {
            let g = grad(k, &x);
            opt.step(lr, &mut x, &g);
            let t = (k + 1) as i32;
            for i in 0..3 {
                let g = f64::from(g[i]);
                m[i] = f64::from(b1) * m[i] + (1.0 - f64::from(b1)) * g;
                v[i] = f64::from(b2) * v[i] + (1.0 - f64::from(b2)) * g * g;
                let mh = m[i] / (1.0 - f64::from(b1).powi(t));
                let vh = v[i] / (1.0 - f64::from(b2).powi(t));
                rx[i] -= f64::from(lr) * (mh / (vh.sqrt() + f64::from(eps)) + f64::from(w) * rx[i]);
            }
            assert!((0..3).all(|i| close(f64::from(x[i]), rx[i])), "step {k}: {x:?} vs {rx:?}");
        }
        // The first step of Adam moves every coordinate by about η (m̂/√v̂ = ±1).
        let (mut fresh, mut x) = (LocalOptimizer::new(spec, 1), [0.0]);
        fresh.step(lr, &mut x, &[123.0]);
        assert!((x[0] + lr).abs() < 1e-6, "{x:?}");
    }

    #[test]
    fn momentum_is_the_heavy_ball_and_sgd_is_the_plain_step() {
        let (mut opt, mut x) = (LocalOptimizer::new(OptimizerSpec::Momentum { momentum: 0.5 }, 1), [0.0]);
        opt.step(0.1, &mut x, &[2.0]); // b = −0.2
        assert!((x[0] + 0.2).abs() < 1e-7);
        opt.step(0.1, &mut x, &[-1.0]); // b = 0.5·(−0.2) + 0.1 = 0
        assert!((x[0] + 0.2).abs() < 1e-7);
        opt.step(0.1, &mut x, &[4.0]); // b = −0.4
        assert!((x[0] + 0.6).abs() < 1e-7);
        let (mut sgd, mut x) = (LocalOptimizer::new(OptimizerSpec::Sgd, 2), [9.0, 9.0]);
        assert!(sgd.is_sgd() && !opt.is_sgd());
        sgd.step(0.5, &mut x, &[1.0, -2.0]);
        assert_eq!(x, [8.5, 10.0]);
    }
}
