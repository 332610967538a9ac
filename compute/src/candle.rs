//! [`CandleModel`]: a network written with [candle](https://github.com/huggingface/candle)
//! (`candle-core`, `candle-nn`) as a [`GradientModel`], so it trains in a Rudra cluster.
//!
//! The model's parameters are the variables of a `candle_nn::VarMap`, laid out one after
//! another in the order of their names in Rudra's flat parameter vector; the shards split that
//! vector by ranges like any other. A forward closure maps a batch `[n, inputs]` to logits
//! `[n, classes]`; the loss is candle's softmax cross-entropy, and the gradient comes from
//! candle's own backward pass.
//!
//! ```no_run
//! use candle_core::{DType, Device};
//! use candle_nn::{Module, VarBuilder, VarMap};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let layer = candle_nn::linear(784, 10, vb.pp("fc"))?;
//! let model = rudra_compute::CandleModel::new(&varmap, 784, move |x| layer.forward(x))?;
//! # Ok(()) }
//! ```

use std::ops::Range;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::VarMap;

use crate::{ComputeError, GradientModel};

/// Logits of a batch.
type Forward = Box<dyn FnMut(&Tensor) -> candle_core::Result<Tensor> + Send>;

/// A candle network as a [`GradientModel`].
pub struct CandleModel {
    /// The variables in name order, each with its range of the flat vector.
    vars: Vec<(Var, Range<usize>)>,
    /// The flat parameter vector as Rudra last wrote it.
    params: Vec<f32>,
    /// Which variables the next computation must upload.
    stale: Vec<bool>,
    grad: Vec<f32>,
    forward: Forward,
    inputs: usize,
    device: Device,
}

fn candle(e: candle_core::Error) -> ComputeError {
    ComputeError::Device { backend: "candle", message: e.to_string() }
}

impl CandleModel {
    /// The variables of `varmap`, trained through `forward`, which maps a batch of `inputs`
    /// features per example to logits. The variables' current values are the model's
    /// parameters ([`CandleModel::params`]); they must be `f32`.
    pub fn new(
        varmap: &VarMap,
        inputs: usize,
        forward: impl FnMut(&Tensor) -> candle_core::Result<Tensor> + Send + 'static,
    ) -> Result<Self, ComputeError> {
        let mut named: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .map_err(|_| shape("the VarMap's lock is poisoned"))?
            .clone()
            .into_iter()
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let (mut vars, mut params) = (Vec::new(), Vec::new());
        for (name, var) in named {
            if var.dtype() != DType::F32 {
                return Err(shape(format!(
                    "variable {name} is {:?}; Rudra trains f32 parameters",
                    var.dtype()
                )));
            }
            let values = var.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(candle)?;
            let range = params.len()..params.len() + values.len();
            params.extend(values);
            vars.push((var, range));
        }
        if params.is_empty() {
            return Err(shape("the VarMap holds no variables"));
        }
        let device = vars[0].0.device().clone();
        let (stale, grad) = (vec![false; vars.len()], vec![0.0; params.len()]);
        Ok(Self { vars, params, stale, grad, forward: Box::new(forward), inputs, device })
    }

    /// The flat parameter vector: every variable's values, in name order.
    #[must_use]
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// Write the parameters Rudra changed into the variables.
    fn upload(&mut self) -> Result<(), ComputeError> {
        for ((var, range), stale) in self.vars.iter().zip(&mut self.stale) {
            if std::mem::take(stale) {
                let t = Tensor::from_slice(&self.params[range.clone()], var.shape(), &self.device)
                    .map_err(candle)?;
                var.set(&t).map_err(candle)?;
            }
        }
        Ok(())
    }

    /// The batch `x` and its labels as tensors.
    fn batch(&self, x: &[f32], labels: &[u8]) -> Result<(Tensor, Tensor), ComputeError> {
        if labels.is_empty() || x.len() != labels.len() * self.inputs {
            return Err(shape(format!(
                "{} values for {} examples of {} features",
                x.len(),
                labels.len(),
                self.inputs
            )));
        }
        let xs = Tensor::from_slice(x, (labels.len(), self.inputs), &self.device).map_err(candle)?;
        let ys: Vec<u32> = labels.iter().map(|&l| u32::from(l)).collect();
        let ys = Tensor::from_vec(ys, labels.len(), &self.device).map_err(candle)?;
        Ok((xs, ys))
    }
}

fn shape(message: impl Into<String>) -> ComputeError {
    ComputeError::Shape(message.into())
}

impl GradientModel for CandleModel {
    fn param_count(&self) -> usize {
        self.params.len()
    }

    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        let end = offset.checked_add(values.len()).filter(|&e| e <= self.params.len());
        let Some(end) = end else {
            return Err(shape(format!(
                "{} values at {offset} overrun {} parameters",
                values.len(),
                self.params.len()
            )));
        };
        self.params[offset..end].copy_from_slice(values);
        for ((_, range), stale) in self.vars.iter().zip(&mut self.stale) {
            *stale |= range.start < end && offset < range.end;
        }
        Ok(())
    }

    fn loss_and_gradient(&mut self, x: &[f32], labels: &[u8]) -> Result<f32, ComputeError> {
        self.upload()?;
        let (xs, ys) = self.batch(x, labels)?;
        let logits = (self.forward)(&xs).map_err(candle)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &ys).map_err(candle)?;
        let grads = loss.backward().map_err(candle)?;
        for (var, range) in &self.vars {
            let out = &mut self.grad[range.clone()];
            match grads.get(var.as_tensor()) {
                Some(g) => {
                    out.copy_from_slice(&g.flatten_all().and_then(|g| g.to_vec1::<f32>()).map_err(candle)?)
                }
                // A variable the loss does not depend on has a zero gradient.
                None => out.fill(0.0),
            }
        }
        loss.to_scalar::<f32>().map_err(candle)
    }

    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        if out.len() != self.grad.len() {
            return Err(shape(format!("a gradient of {} into {}", self.grad.len(), out.len())));
        }
        std::mem::swap(out, &mut self.grad);
        Ok(())
    }

    fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        self.upload()?;
        let (xs, ys) = self.batch(x, labels)?;
        let logits = (self.forward)(&xs).map_err(candle)?;
        let mean = candle_nn::loss::cross_entropy(&logits, &ys)
            .and_then(|l| l.to_scalar::<f32>())
            .map_err(candle)?;
        let predicted = logits.argmax(D::Minus1).and_then(|p| p.to_vec1::<u32>()).map_err(candle)?;
        let correct = predicted.iter().zip(labels).filter(|&(&p, &l)| p == u32::from(l)).count();
        Ok((f64::from(mean) * labels.len() as f64, correct))
    }
}
