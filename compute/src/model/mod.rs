//! Classifiers over one flat parameter buffer: fully connected networks (softmax regression,
//! MLPs) and convolutional networks, see [`ModelSpec`].
//!
//! Parameters are laid out layer by layer (`convN.weight`, `convN.bias`, …, `fcN.weight`,
//! `fcN.bias`) so shards can split the vector by plain ranges. Convolutions run as im2col and
//! a GEMM, on channels-last activations.

mod spec;

pub use spec::{ConvLayer, ConvSpec, ModelSpec, ParamLayout, TensorInfo};
use spec::{Op, Stage};

use crate::{Backend, ComputeError, Gemm};

/// The most examples one forward pass of [`Model::evaluate`] holds, to bound the memory of
/// convolutional activations; larger batches are evaluated in parts.
const EVAL_ROWS: usize = 256;

/// Per-stage activations and deltas for a batch of up to `capacity` rows.
struct Workspace<B: Backend> {
    capacity: usize,
    input: B::Buffer,
    /// `acts[l]` is the output of stage `l` (after its ReLU, if any; logits for the last).
    acts: Vec<B::Buffer>,
    /// `deltas[l]` is the loss gradient with respect to stage `l`'s output before its ReLU.
    deltas: Vec<B::Buffer>,
    /// The column matrix of each convolution (empty for other stages); in the backward pass it
    /// holds the column matrix's gradient.
    cols: Vec<B::Buffer>,
}

/// A classifier on a backend: parameters and gradient live in backend buffers.
pub struct Model<B: Backend> {
    spec: ModelSpec,
    layout: ParamLayout,
    stages: Vec<Stage>,
    backend: B,
    params: B::Buffer,
    grad: B::Buffer,
    work: Option<Workspace<B>>,
}

impl<B: Backend> Model<B> {
    /// A model of shape `spec` with zero parameters, or a shape error when its parts do not fit.
    pub fn new(backend: B, spec: ModelSpec) -> Result<Self, ComputeError> {
        spec.check()?;
        let layout = spec.layout();
        let stages = spec.stages().into_iter().map(|(stage, _)| stage).collect();
        let params = backend.alloc(layout.len)?;
        let grad = backend.alloc(layout.len)?;
        Ok(Self { spec, layout, stages, backend, params, grad, work: None })
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
                let alloc_each = |len: &dyn Fn(&Stage) -> usize| -> Result<Vec<B::Buffer>, ComputeError> {
                    self.stages.iter().map(|s| b.alloc(rows * len(s))).collect()
                };
                Ok(Workspace {
                    capacity: rows,
                    input: b.alloc(rows * self.spec.inputs)?,
                    acts: alloc_each(&|s| s.width)?,
                    deltas: alloc_each(&|s| s.width)?,
                    cols: alloc_each(&|s| match s.op {
                        Op::Conv { conv, .. } => conv.rows().map_or(0, |r| r * conv.patch()),
                        _ => 0,
                    })?,
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
        for (l, stage) in self.stages.iter().enumerate() {
            let (done, rest) = w.acts.split_at_mut(l);
            let src = if l == 0 { &w.input } else { &done[l - 1] };
            let dst = &mut rest[0];
            match stage.op {
                Op::Conv { conv, outputs, weight, bias } => {
                    let conv = conv.with_batch(rows);
                    let col = &mut w.cols[l];
                    b.im2col(conv, src, col)?;
                    let m = conv.rows()?;
                    let g =
                        Gemm { m, n: outputs, k: conv.patch(), a_t: false, b_t: true, alpha: 1.0, beta: 0.0 };
                    b.gemm(g, (col, 0), (&self.params, weight), (dst, 0))?;
                    b.add_bias(dst, m, outputs, (&self.params, bias))?;
                }
                Op::Pool(pool) => b.pool(pool.with_batch(rows), src, dst)?,
                Op::Dense { inputs, outputs, weight, bias } => {
                    let g =
                        Gemm { m: rows, n: outputs, k: inputs, a_t: false, b_t: true, alpha: 1.0, beta: 0.0 };
                    b.gemm(g, (src, 0), (&self.params, weight), (dst, 0))?;
                    b.add_bias(dst, rows, outputs, (&self.params, bias))?;
                }
            }
            if stage.relu {
                b.relu(dst, rows * stage.width)?;
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
        let last = self.stages.len() - 1;
        let loss = b.softmax_cross_entropy(&w.acts[last], labels, self.spec.classes, &mut w.deltas[last])?;
        for (l, stage) in self.stages.iter().enumerate().rev() {
            let src = if l == 0 { &w.input } else { &w.acts[l - 1] };
            let (prev, cur) = w.deltas.split_at_mut(l);
            let (delta, prev) = (&cur[0], prev.last_mut());
            match stage.op {
                Op::Conv { conv, outputs, weight, bias } => {
                    let conv = conv.with_batch(rows);
                    let (m, patch) = (conv.rows()?, conv.patch());
                    let col = &mut w.cols[l];
                    // dW = δᵀ · col ; db = Σ_rows δ ; then col ← δ · W and dx = col2im(col)
                    let gw =
                        Gemm { m: outputs, n: patch, k: m, a_t: true, b_t: false, alpha: 1.0, beta: 0.0 };
                    b.gemm(gw, (delta, 0), (col, 0), (&mut self.grad, weight))?;
                    b.sum_rows(delta, m, outputs, (&mut self.grad, bias))?;
                    if let Some(prev) = prev {
                        let gd =
                            Gemm { m, n: patch, k: outputs, a_t: false, b_t: false, alpha: 1.0, beta: 0.0 };
                        b.gemm(gd, (delta, 0), (&self.params, weight), (col, 0))?;
                        b.col2im(conv, col, prev)?;
                    }
                }
                Op::Pool(pool) => {
                    if let Some(prev) = prev {
                        b.pool_backward(pool.with_batch(rows), src, delta, prev)?;
                    }
                }
                Op::Dense { inputs, outputs, weight, bias } => {
                    // dW = δᵀ · a_prev ; db = Σ_rows δ ; δ_prev = δ · W
                    let gw =
                        Gemm { m: outputs, n: inputs, k: rows, a_t: true, b_t: false, alpha: 1.0, beta: 0.0 };
                    b.gemm(gw, (delta, 0), (src, 0), (&mut self.grad, weight))?;
                    b.sum_rows(delta, rows, outputs, (&mut self.grad, bias))?;
                    if let Some(prev) = prev {
                        let gd = Gemm {
                            m: rows,
                            n: inputs,
                            k: outputs,
                            a_t: false,
                            b_t: false,
                            alpha: 1.0,
                            beta: 0.0,
                        };
                        b.gemm(gd, (delta, 0), (&self.params, weight), (prev, 0))?;
                    }
                }
            }
            if l > 0 && self.stages[l - 1].relu {
                // δ_prev ⊙= relu'(a_prev)
                b.relu_backward(&mut w.deltas[l - 1], &w.acts[l - 1], rows * self.stages[l - 1].width)?;
            }
        }
        Ok(loss)
    }

    /// Summed loss and number of correct predictions over a batch (no gradient).
    pub fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        self.check_batch(x, labels)?;
        x.chunks(EVAL_ROWS * self.spec.inputs).zip(labels.chunks(EVAL_ROWS)).try_fold(
            (0.0, 0),
            |(loss, correct), (x, labels)| {
                let (l, c) = self.evaluate_part(x, labels)?;
                Ok((loss + l, correct + c))
            },
        )
    }

    fn evaluate_part(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        let rows = labels.len();
        let mut w = self.workspace(rows)?;
        let result =
            self.backend.write(&mut w.input, 0, x).and_then(|()| self.forward(&mut w, rows)).and_then(|()| {
                self.backend.evaluate_logits(&w.acts[w.acts.len() - 1], labels, self.spec.classes)
            });
        self.work = Some(w);
        result
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::backend::{PoolKind, Window};
    use crate::{CpuBackend, GradientModel};

    /// Compare the analytic gradient `g` with central differences along it, tensor by
    /// tensor: moving a tensor by `±h · g_t / |g_t|` must change the loss at the rate `|g_t|`.
    /// A wrong gradient fails this unless its error is orthogonal to the true one and of the
    /// same norm; stepping along the gradient gives a difference well above the f32 rounding
    /// of the loss, which single-entry probes of a large network do not.
    fn numeric_check(spec: ModelSpec, rows: usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let x: Vec<f32> = (0..rows * spec.inputs).map(|_| rng.random_range(-1.0..1.0)).collect();
        let labels: Vec<u8> = (0..rows).map(|r| (r % spec.classes) as u8).collect();
        // Non-zero biases, so that ReLUs are not all at their kink on zero inputs.
        let mut params = spec.init(3);
        for t in spec.layout().tensors.iter().filter(|t| t.name.ends_with("bias")) {
            params[t.range.clone()].fill(0.05);
        }
        let mut model = Model::new(CpuBackend, spec.clone()).unwrap();
        model.write_params(0, &params).unwrap();
        model.loss_and_gradient(&x, &labels).unwrap();
        let mut g = vec![0.0; params.len()];
        model.read_gradient(0, &mut g).unwrap();

        let mut probe = Model::new(CpuBackend, spec.clone()).unwrap();
        let mut loss_at = |p: &[f32]| -> f64 {
            probe.write_params(0, p).unwrap();
            probe.evaluate(&x, &labels).unwrap().0 / rows as f64
        };
        let h = 3e-4f32;
        for t in &model.layout().tensors {
            let norm = g[t.range.clone()].iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
            let step = |sign: f32| {
                let mut p = params.clone();
                for i in t.range.clone() {
                    p[i] += sign * h * g[i] / norm as f32;
                }
                p
            };
            let rate = (loss_at(&step(1.0)) - loss_at(&step(-1.0))) / (2.0 * f64::from(h));
            let err = (rate - norm).abs() / norm.max(1e-4);
            assert!(err < 1e-2, "loss changes at {rate} along {}'s gradient of norm {norm}", t.name);
        }
    }

    #[test]
    fn a_dataset_evaluated_in_chunks_matches_one_batch() {
        let spec = ModelSpec::dense(4, vec![3], 3);
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
        numeric_check(ModelSpec::dense(6, vec![], 4), 3);
    }

    #[test]
    fn mlp_gradient_matches_finite_differences() {
        numeric_check(ModelSpec::dense(6, vec![5, 4], 3), 3);
    }

    fn layer(
        channels: usize,
        (size, pad): (usize, usize),
        pool: PoolKind,
        (p_size, p_stride, p_pad): (usize, usize, usize),
    ) -> ConvLayer {
        ConvLayer {
            channels,
            window: Window { size, stride: 1, pad },
            pool,
            pool_window: Window { size: p_size, stride: p_stride, pad: p_pad },
        }
    }

    #[test]
    fn small_convolutional_gradient_matches_finite_differences() {
        let layers =
            vec![layer(3, (3, 1), PoolKind::Max, (2, 2, 0)), layer(4, (3, 0), PoolKind::Avg, (3, 2, 1))];
        let conv = ConvSpec::new(2, 8, 7, layers).unwrap();
        numeric_check(ModelSpec { inputs: 2 * 8 * 7, conv: Some(conv), hidden: vec![5], classes: 3 }, 3);
    }

    #[test]
    fn cnn_gradient_matches_finite_differences() {
        numeric_check(ModelSpec::cnn(), 2);
    }

    #[test]
    fn cifar10_net_gradient_matches_finite_differences() {
        numeric_check(ModelSpec::cifar10_net(), 2);
    }

    #[test]
    fn built_in_networks_have_conventional_names_and_sizes() {
        let names = |s: &ModelSpec| s.layout().tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        let cnn = ModelSpec::cnn().layout();
        assert_eq!(cnn.len, 28_938);
        assert_eq!(
            names(&ModelSpec::cnn()),
            ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias"]
        );
        assert_eq!(cnn.tensors[2].shape, vec![32, 16, 5, 5]);
        assert_eq!(cnn.tensors[4].shape, vec![10, 1568]);
        let cifar = ModelSpec::cifar10_net();
        assert_eq!(cifar.layout().len, 89_578);
        assert_eq!(cifar.inputs, 3072);
        assert_eq!(cifar.layout().tensors[6].shape, vec![10, 1024]);
        assert_eq!(names(&cifar)[4], "conv3.weight");
        assert_eq!(
            cifar.conv.as_ref().unwrap().to_string(),
            "32×32×3 conv5x5x32 max3/2 conv5x5x32 avg3/2 conv5x5x64 avg3/2"
        );
    }

    #[test]
    fn parts_that_do_not_fit_are_errors() {
        assert!(
            ConvSpec::new(1, 4, 4, vec![layer(2, (5, 0), PoolKind::Max, (2, 2, 0))]).is_err(),
            "window larger than the image"
        );
        assert!(
            ConvSpec::new(1, 4, 4, vec![layer(2, (3, 1), PoolKind::Max, (2, 2, 2))]).is_err(),
            "padding as large as the pool"
        );
        assert!(ConvSpec::new(1, 4, 4, vec![]).is_err());
        let mut spec = ModelSpec::cnn();
        spec.inputs = 100;
        assert!(Model::new(CpuBackend, spec).is_err(), "inputs that are not the image");
        assert!(Model::new(CpuBackend, ModelSpec::dense(4, vec![0], 2)).is_err());
    }

    #[test]
    fn layout_names_and_ranges_tile_the_vector() {
        let layout = ModelSpec::dense(784, vec![256], 10).layout();
        let names: Vec<&str> = layout.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
        assert_eq!(layout.len, 784 * 256 + 256 + 256 * 10 + 10);
        assert_eq!(layout.tensors[2].range.start, 784 * 256 + 256);
        assert_eq!(layout.tensors[0].shape, vec![256, 784]);
    }

    #[test]
    fn shared_parameters_give_the_same_gradient_and_are_released() {
        let spec = ModelSpec::dense(5, vec![4], 3);
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
        let mut model = Model::new(CpuBackend, ModelSpec::dense(4, vec![], 2)).unwrap();
        assert!(model.loss_and_gradient(&[0.0; 7], &[0, 1]).is_err());
        assert!(model.loss_and_gradient(&[0.0; 8], &[0, 2]).is_err());
    }
}
