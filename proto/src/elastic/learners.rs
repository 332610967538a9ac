//! The learner side of the EASGD family: EASGD's and EAMSGD's elastic pull every τ local
//! steps, and DOWNPOUR's (and DiLoCo's) accumulated update.

use crate::{LocalOptimizer, OptimizerSpec};
use rudra_compute::{Rate, cpu};

/// Settings of an EASGD / EAMSGD learner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ElasticSettings {
    /// Communication period τ in local steps.
    pub tau: u64,
    /// Moving rate α.
    pub alpha: f32,
    /// Learning rate η.
    pub lr: f32,
    /// Decay γ of `η_t = η / (1 + γ t)^0.5` on the local clock (0 disables it).
    pub lr_decay_gamma: f32,
    /// Nesterov momentum δ (0 for EASGD).
    pub momentum: f32,
    /// EASGD's local optimizer (EAMSGD's is its Nesterov momentum).
    pub optimizer: OptimizerSpec,
}

/// The learner side of EASGD / EAMSGD: local SGD (with Nesterov momentum for EAMSGD) and an
/// elastic pull toward the center every τ steps.
#[derive(Clone, Debug)]
pub struct ElasticLearner {
    s: ElasticSettings,
    t: u64,
    velocity: Vec<f32>,
    /// EASGD's local optimizer (plain SGD unless set).
    optimizer: LocalOptimizer,
}

impl ElasticLearner {
    /// A learner over `len` parameters.
    #[must_use]
    pub fn new(settings: ElasticSettings, len: usize) -> Self {
        let velocity = if settings.momentum == 0.0 { Vec::new() } else { vec![0.0; len] };
        let optimizer = LocalOptimizer::new(settings.optimizer, len);
        Self { s: settings, t: 0, velocity, optimizer }
    }

    /// Whether it keeps a momentum (EAMSGD): its gradient is then taken at x + δv, not at x.
    #[must_use]
    pub fn has_momentum(&self) -> bool {
        !self.velocity.is_empty()
    }

    /// The local clock t^i.
    #[must_use]
    pub fn clock(&self) -> u64 {
        self.t
    }

    /// Whether this step begins with an exchange (τ divides t^i).
    #[must_use]
    pub fn exchanges_now(&self) -> bool {
        self.t.is_multiple_of(self.s.tau.max(1))
    }

    /// `η_t` on the local clock.
    #[must_use]
    pub fn lr(&self) -> f32 {
        self.s.lr / (1.0 + self.s.lr_decay_gamma * self.t as f32).sqrt()
    }

    /// Where the gradient of this step is taken: `x + δ v` (just `x` for EASGD), with `x`
    /// the value before any elastic pull.
    pub fn gradient_point(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(x);
        if self.has_momentum() {
            cpu::axpy(self.s.momentum, &self.velocity, out);
        }
    }

    /// Finish the step: with `center` (x̃ from this step's exchange) apply the elastic pull
    /// `x ← x − α (x − x̃)`, then the local update with `g` taken at [`Self::gradient_point`]:
    /// `v ← δ v − η_t g; x ← x + v`. Advances t^i.
    pub fn step(&mut self, x: &mut [f32], g: &[f32], center: Option<&[f32]>) {
        let lr = self.lr();
        let (alpha, delta) = (self.s.alpha, self.s.momentum);
        if let Some(c) = center {
            // x ← x − α (x − x̃) = (1 − α) x + α x̃
            cpu::scale(1.0 - alpha, x);
            cpu::axpy(alpha, c, x);
        }
        if self.has_momentum() {
            cpu::momentum(Rate { lr, momentum: delta }, g, &mut self.velocity, x);
        } else {
            self.optimizer.step(lr, x, g);
        }
        self.t += 1;
    }
}

/// The learner side of DOWNPOUR: local SGD that accumulates its updates in `v`; every τ
/// steps `v` goes to the shards and x^i is replaced by the center they answer with.
#[derive(Clone, Debug)]
pub struct DownpourLearner {
    tau: u64,
    /// Streaming DiLoCo: `v` goes out in this many fragments, one every τ/F steps (1: all of
    /// it every τ steps).
    fragments: u64,
    lr: f32,
    t: u64,
    accumulated: Vec<f32>,
    /// The local optimizer (plain SGD unless set; DiLoCo's inner optimizer), and x^i before
    /// its step.
    optimizer: LocalOptimizer,
    before: Vec<f32>,
}

impl DownpourLearner {
    /// A learner over `len` parameters with period `tau` and rate `lr`.
    #[must_use]
    pub fn new(tau: u64, lr: f32, len: usize) -> Self {
        let optimizer = LocalOptimizer::new(OptimizerSpec::Sgd, 0);
        let accumulated = vec![0.0; len];
        Self { tau: tau.max(1), fragments: 1, lr, t: 0, accumulated, optimizer, before: Vec::new() }
    }

    /// Exchange `v` in `fragments` parts in turn (F divides τ, checked with the configuration).
    #[must_use]
    pub fn with_fragments(mut self, fragments: u64) -> Self {
        self.fragments = fragments.clamp(1, self.tau);
        self
    }

    /// Local steps by `optimizer` rather than plain SGD, each added to `v` as it moved x^i.
    #[must_use]
    pub fn with_optimizer(mut self, optimizer: OptimizerSpec) -> Self {
        self.optimizer = LocalOptimizer::new(optimizer, self.accumulated.len());
        self
    }

    /// Whether this step begins with an exchange.
    #[must_use]
    pub fn exchanges_now(&self) -> bool {
        self.fragment_now().is_some()
    }

    /// How many fragments `v` goes out in.
    #[must_use]
    pub fn fragments(&self) -> usize {
        self.fragments as usize
    }

    /// The fragment this step begins by exchanging, of how many: fragment f at the steps
    /// t ≡ f·τ/F (mod τ), so every value goes out once every τ steps.
    #[must_use]
    pub fn fragment_now(&self) -> Option<(usize, usize)> {
        let every = self.tau / self.fragments;
        let f = (self.t / every) % self.fragments;
        self.t.is_multiple_of(every).then_some((f as usize, self.fragments as usize))
    }

    /// The accumulated update to send, reset to zero.
    pub fn take_accumulated(&mut self) -> Vec<f32> {
        let zeros = vec![0.0; self.accumulated.len()];
        std::mem::replace(&mut self.accumulated, zeros)
    }

    /// The accumulated update of `range` not sent yet.
    #[must_use]
    pub fn pending(&self, range: std::ops::Range<usize>) -> &[f32] {
        &self.accumulated[range]
    }

    /// The accumulated update of the values in `range` (zero elsewhere), reset to zero there.
    pub fn take_accumulated_of(&mut self, range: std::ops::Range<usize>) -> Vec<f32> {
        if range == (0..self.accumulated.len()) {
            return self.take_accumulated();
        }
        let mut part = vec![0.0; self.accumulated.len()];
        part[range.clone()].copy_from_slice(&self.accumulated[range.clone()]);
        self.accumulated[range].fill(0.0);
        part
    }

    /// One local step with the gradient `g` at x^i: `x ← x − η g; v ← v − η g` (with another
    /// optimizer, its step on x, and `v ← v + (x_after − x_before)`).
    pub fn step(&mut self, x: &mut [f32], g: &[f32]) {
        if self.optimizer.is_sgd() {
            cpu::axpy(-self.lr, g, x);
            cpu::axpy(-self.lr, g, &mut self.accumulated);
        } else {
            self.before.clear();
            self.before.extend_from_slice(x);
            self.optimizer.step(self.lr, x, g);
            for ((v, after), before) in self.accumulated.iter_mut().zip(&*x).zip(&self.before) {
                *v += after - before;
            }
        }
        self.t += 1;
    }
}
