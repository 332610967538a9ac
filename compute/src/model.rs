//! Fully connected classifiers over one flat parameter buffer.
//!
//! A [`ModelSpec`] with no hidden layers is multinomial logistic regression (`softmax`);
//! with hidden layers it is an MLP with ReLU activations. Parameters are laid out layer by
//! layer as `fcN.weight` (`out×in`, row-major) then `fcN.bias` (`out`), so shards can split
//! the vector by plain ranges.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::{Backend, ComputeError, Dataset, Gemm};

/// The shape of a classifier: input width, hidden widths, classes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    /// Features per example.
    pub inputs: usize,
    /// Widths of the hidden ReLU layers; empty for softmax regression.
    pub hidden: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
}

/// One named tensor inside the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Conventional name, e.g. `fc1.weight`.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Where the tensor sits in the flat vector.
    pub range: Range<usize>,
}

/// Where every tensor of a model sits in the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParamLayout {
    /// The tensors in storage order.
    pub tensors: Vec<TensorInfo>,
    /// Total number of parameters.
    pub len: usize,
}

impl ModelSpec {
    /// `(inputs, outputs)` of every fully connected layer.
    fn layers(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let widths: Vec<usize> = std::iter::once(self.inputs)
            .chain(self.hidden.iter().copied())
            .chain(std::iter::once(self.classes))
            .collect();
        (0..widths.len() - 1).map(move |i| (widths[i], widths[i + 1]))
    }

    /// The flat layout of this model's parameters.
    #[must_use]
    pub fn layout(&self) -> ParamLayout {
        let mut tensors = Vec::new();
        let mut at = 0;
        for (i, (inp, out)) in self.layers().enumerate() {
            for (suffix, shape) in [("weight", vec![out, inp]), ("bias", vec![out])] {
                let len: usize = shape.iter().product();
                tensors.push(TensorInfo {
                    name: format!("fc{}.{suffix}", i + 1),
                    shape,
                    range: at..at + len,
                });
                at += len;
            }
        }
        ParamLayout { tensors, len: at }
    }

    /// Glorot-uniform weights and zero biases, reproducible from `seed`.
    #[must_use]
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::with_capacity(self.layout().len);
        for (inp, out) in self.layers() {
            let limit = (6.0 / (inp + out) as f32).sqrt();
            params.extend((0..inp * out).map(|_| rng.random_range(-limit..limit)));
            params.extend(std::iter::repeat_n(0.0, out));
        }
        params
    }
}

/// Per-layer activations and deltas for a batch of up to `capacity` rows.
struct Workspace<B: Backend> {
    capacity: usize,
    input: B::Buffer,
    /// `acts[l]` is the output of layer `l` (post-ReLU for hidden layers, logits for the last).
    acts: Vec<B::Buffer>,
    /// `deltas[l]` is the loss gradient with respect to layer `l`'s pre-activation.
    deltas: Vec<B::Buffer>,
}

/// A classifier on a backend: parameters and gradient live in backend buffers.
pub struct Model<B: Backend> {
    spec: ModelSpec,
    layout: ParamLayout,
    backend: B,
    params: B::Buffer,
    grad: B::Buffer,
    work: Option<Workspace<B>>,
}

impl<B: Backend> Model<B> {
    /// A model of shape `spec` with zero parameters.
    pub fn new(backend: B, spec: ModelSpec) -> Result<Self, ComputeError> {
        let layout = spec.layout();
        let params = backend.alloc(layout.len)?;
        let grad = backend.alloc(layout.len)?;
        Ok(Self { spec, layout, backend, params, grad, work: None })
    }

    /// The model's shape.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The parameter layout.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Overwrite parameters `offset..offset + values.len()`.
    pub fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        self.backend.write(&mut self.params, offset, values)
    }

    /// Copy parameters starting at `offset` into `out`.
    pub fn read_params(&self, offset: usize, out: &mut [f32]) -> Result<(), ComputeError> {
        self.backend.read(&self.params, offset, out)
    }

    /// Copy the last computed gradient starting at `offset` into `out`.
    pub fn read_gradient(&self, offset: usize, out: &mut [f32]) -> Result<(), ComputeError> {
        self.backend.read(&self.grad, offset, out)
    }

    /// Move the last computed gradient into `out` (of the parameter count), without a copy
    /// where the backend allows; the model's own gradient is then undefined until the next
    /// [`Model::loss_and_gradient`].
    pub fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        self.backend.take(&mut self.grad, out)
    }

    /// `params += alpha · gradient`: one plain SGD step with `alpha = −η`.
    pub fn apply_gradient(&mut self, alpha: f32) -> Result<(), ComputeError> {
        self.backend.axpy(alpha, &self.grad, &mut self.params, self.layout.len)
    }

    fn workspace(&mut self, rows: usize) -> Result<Workspace<B>, ComputeError> {
        match self.work.take() {
            Some(w) if w.capacity >= rows => Ok(w),
            _ => {
                let b = &self.backend;
                let widths: Vec<usize> = self.spec.layers().map(|(_, out)| out).collect();
                Ok(Workspace {
                    capacity: rows,
                    input: b.alloc(rows * self.spec.inputs)?,
                    acts: widths.iter().map(|w| b.alloc(rows * w)).collect::<Result<_, _>>()?,
                    deltas: widths.iter().map(|w| b.alloc(rows * w)).collect::<Result<_, _>>()?,
                })
            }
        }
    }

    fn check_batch(&self, x: &[f32], labels: &[u8]) -> Result<usize, ComputeError> {
        let rows = labels.len();
        if rows == 0 || x.len() != rows * self.spec.inputs {
            return Err(ComputeError::Shape(format!(
                "batch of {} features for {rows} labels does not match {} inputs per example",
                x.len(),
                self.spec.inputs
            )));
        }
        Ok(rows)
    }

    fn forward(&self, w: &mut Workspace<B>, rows: usize) -> Result<(), ComputeError> {
        let b = &self.backend;
        let n_layers = w.acts.len();
        for (l, (inp, out)) in self.spec.layers().enumerate() {
            let weight = &self.layout.tensors[2 * l];
            let bias = &self.layout.tensors[2 * l + 1];
            let (done, rest) = w.acts.split_at_mut(l);
            let src = if l == 0 { &w.input } else { &done[l - 1] };
            let dst = &mut rest[0];
            let g = Gemm { m: rows, n: out, k: inp, a_t: false, b_t: true, alpha: 1.0, beta: 0.0 };
            b.gemm(g, (src, 0), (&self.params, weight.range.start), (dst, 0))?;
            b.add_bias(dst, rows, out, (&self.params, bias.range.start))?;
            if l + 1 < n_layers {
                b.relu(dst, rows * out)?;
            }
        }
        Ok(())
    }

    /// Mean cross-entropy loss of the batch and its gradient, kept in the model
    /// (read it with [`Model::read_gradient`]). `x` is `rows×inputs`, row-major.
    pub fn loss_and_gradient(&mut self, x: &[f32], labels: &[u8]) -> Result<f32, ComputeError> {
        let rows = self.check_batch(x, labels)?;
        let mut w = self.workspace(rows)?;
        let result = self.backward(&mut w, x, labels, rows);
        self.work = Some(w);
        result
    }

    /// [`Model::loss_and_gradient`] at `params`, a whole parameter vector shared with its
    /// owner (a shard's weights). Backends over host memory read it in place and keep no
    /// reference afterwards, so the owner can keep updating it without a copy; device
    /// backends upload it.
    pub fn loss_and_gradient_at(
        &mut self,
        params: &std::sync::Arc<Vec<f32>>,
        x: &[f32],
        labels: &[u8],
    ) -> Result<f32, ComputeError> {
        if params.len() != self.layout.len {
            return Err(ComputeError::Shape(format!(
                "{} parameters for a model of {}",
                params.len(),
                self.layout.len
            )));
        }
        let Some(view) = self.backend.view_host(params) else {
            self.write_params(0, params)?;
            return self.loss_and_gradient(x, labels);
        };
        let own = std::mem::replace(&mut self.params, view);
        let result = self.loss_and_gradient(x, labels);
        self.params = own;
        result
    }

    fn backward(
        &mut self,
        w: &mut Workspace<B>,
        x: &[f32],
        labels: &[u8],
        rows: usize,
    ) -> Result<f32, ComputeError> {
        self.backend.write(&mut w.input, 0, x)?;
        self.forward(w, rows)?;
        let b = &self.backend;
        let last = w.acts.len() - 1;
        let loss = b.softmax_cross_entropy(&w.acts[last], labels, self.spec.classes, &mut w.deltas[last])?;
        let layers: Vec<(usize, usize)> = self.spec.layers().collect();
        for l in (0..layers.len()).rev() {
            let (inp, out) = layers[l];
            let weight = &self.layout.tensors[2 * l];
            let bias = &self.layout.tensors[2 * l + 1];
            let src = if l == 0 { &w.input } else { &w.acts[l - 1] };
            // dW = δᵀ · a_prev ; db = Σ_rows δ
            let gw = Gemm { m: out, n: inp, k: rows, a_t: true, b_t: false, alpha: 1.0, beta: 0.0 };
            b.gemm(gw, (&w.deltas[l], 0), (src, 0), (&mut self.grad, weight.range.start))?;
            b.sum_rows(&w.deltas[l], rows, out, (&mut self.grad, bias.range.start))?;
            if l > 0 {
                // δ_prev = (δ · W) ⊙ relu'(a_prev)
                let (prev, cur) = w.deltas.split_at_mut(l);
                let gd = Gemm { m: rows, n: inp, k: out, a_t: false, b_t: false, alpha: 1.0, beta: 0.0 };
                b.gemm(gd, (&cur[0], 0), (&self.params, weight.range.start), (&mut prev[l - 1], 0))?;
                b.relu_backward(&mut prev[l - 1], &w.acts[l - 1], rows * inp)?;
            }
        }
        Ok(loss)
    }

    /// Summed loss and number of correct predictions over a batch (no gradient).
    pub fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        let rows = self.check_batch(x, labels)?;
        let mut w = self.workspace(rows)?;
        let result =
            self.backend.write(&mut w.input, 0, x).and_then(|()| self.forward(&mut w, rows)).and_then(|()| {
                self.backend.evaluate_logits(&w.acts[w.acts.len() - 1], labels, self.spec.classes)
            });
        self.work = Some(w);
        result
    }

    /// Summed loss and number of correct predictions over all of `data`, `chunk` examples
    /// per forward pass.
    pub fn evaluate_dataset(&mut self, data: &Dataset, chunk: usize) -> Result<(f64, usize), ComputeError> {
        data.chunks(chunk.max(1)).try_fold((0.0, 0), |(loss, correct), (x, y)| {
            let (l, c) = self.evaluate(x, y)?;
            Ok((loss + l, correct + c))
        })
    }

    /// Mean loss and accuracy over all of `data`, evaluated in chunks of `chunk` rows.
    pub fn evaluate_set(&mut self, data: &Dataset, chunk: usize) -> Result<(f64, f64), ComputeError> {
        let (loss, correct) = self.evaluate_dataset(data, chunk)?;
        let n = data.len().max(1) as f64;
        Ok((loss / n, correct as f64 / n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    fn numeric_check(spec: ModelSpec) {
        let rows = 3;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let x: Vec<f32> = (0..rows * spec.inputs).map(|_| rng.random_range(-1.0..1.0)).collect();
        let labels: Vec<u8> = (0..rows).map(|r| (r % spec.classes) as u8).collect();
        // Non-zero biases so ReLU kinks are away from the probe points.
        let params: Vec<f32> = spec.init(3).iter().map(|p| p + 0.05).collect();
        let mut model = Model::new(CpuBackend, spec.clone()).unwrap();
        model.write_params(0, &params).unwrap();
        model.loss_and_gradient(&x, &labels).unwrap();
        let mut analytic = vec![0.0; params.len()];
        model.read_gradient(0, &mut analytic).unwrap();

        let loss_at = |p: &[f32]| -> f64 {
            let mut m = Model::new(CpuBackend, spec.clone()).unwrap();
            m.write_params(0, p).unwrap();
            m.evaluate(&x, &labels).unwrap().0 / rows as f64
        };
        let h = 1e-3f32;
        let mut worst = 0.0f64;
        for i in (0..params.len()).step_by(params.len() / 40 + 1).chain([params.len() - 1]) {
            let mut p = params.clone();
            p[i] += h;
            let up = loss_at(&p);
            p[i] -= 2.0 * h;
            let down = loss_at(&p);
            let numeric = (up - down) / (2.0 * f64::from(h));
            let err = (numeric - f64::from(analytic[i])).abs()
                / (numeric.abs() + f64::from(analytic[i]).abs()).max(1e-2);
            worst = worst.max(err);
        }
        assert!(worst < 2e-2, "relative gradient error {worst} for {spec:?}");
    }

    #[test]
    fn a_dataset_evaluated_in_chunks_matches_one_batch() {
        let spec = ModelSpec { inputs: 4, hidden: vec![3], classes: 3 };
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x: Vec<f32> = (0..7 * 4).map(|_| rng.random_range(0.0..1.0)).collect();
        let labels: Vec<u8> = (0..7).map(|r| (r % 3) as u8).collect();
        let data = crate::Dataset::new(4, 3, x.clone(), labels.clone()).unwrap();
        let mut model = Model::new(CpuBackend, spec.clone()).unwrap();
        model.write_params(0, &spec.init(5)).unwrap();
        let (loss, correct) = model.evaluate(&x, &labels).unwrap();
        let (chunked_loss, chunked_correct) = model.evaluate_dataset(&data, 3).unwrap();
        assert_eq!(chunked_correct, correct);
        assert!((chunked_loss - loss).abs() < 1e-5 * loss.abs(), "{chunked_loss} vs {loss}");
    }

    #[test]
    fn softmax_gradient_matches_finite_differences() {
        numeric_check(ModelSpec { inputs: 6, hidden: vec![], classes: 4 });
    }

    #[test]
    fn mlp_gradient_matches_finite_differences() {
        numeric_check(ModelSpec { inputs: 6, hidden: vec![5, 4], classes: 3 });
    }

    #[test]
    fn layout_names_and_ranges_tile_the_vector() {
        let layout = ModelSpec { inputs: 784, hidden: vec![256], classes: 10 }.layout();
        let names: Vec<&str> = layout.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
        assert_eq!(layout.len, 784 * 256 + 256 + 256 * 10 + 10);
        assert_eq!(layout.tensors[2].range.start, 784 * 256 + 256);
        assert_eq!(layout.tensors[0].shape, vec![256, 784]);
    }

    #[test]
    fn shared_parameters_give_the_same_gradient_and_are_released() {
        let spec = ModelSpec { inputs: 5, hidden: vec![4], classes: 3 };
        let shared = std::sync::Arc::new(spec.init(2));
        let x: Vec<f32> = (0..10).map(|i| i as f32 / 10.0).collect();
        let mut a = Model::new(CpuBackend, spec.clone()).unwrap();
        a.write_params(0, &shared).unwrap();
        let la = a.loss_and_gradient(&x, &[0, 2]).unwrap();
        let mut ga = vec![0.0; shared.len()];
        a.read_gradient(0, &mut ga).unwrap();
        let mut b = Model::new(CpuBackend, spec).unwrap();
        let lb = b.loss_and_gradient_at(&shared, &x, &[0, 2]).unwrap();
        let mut gb = vec![0.0; shared.len()];
        b.take_gradient(&mut gb).unwrap();
        assert_eq!((la, ga), (lb, gb));
        assert_eq!(std::sync::Arc::strong_count(&shared), 1, "the model keeps no reference");
        assert!(b.loss_and_gradient_at(&std::sync::Arc::new(vec![0.0; 3]), &x, &[0, 2]).is_err());
    }

    #[test]
    fn a_bad_batch_is_an_error() {
        let mut model = Model::new(CpuBackend, ModelSpec { inputs: 4, hidden: vec![], classes: 2 }).unwrap();
        assert!(model.loss_and_gradient(&[0.0; 7], &[0, 1]).is_err());
        assert!(model.loss_and_gradient(&[0.0; 8], &[0, 2]).is_err());
    }
}
