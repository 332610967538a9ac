//! The `Backend` trait: the operations models and updates need, on buffers the backend owns,
//! and the geometry of the operations over images.

use crate::ComputeError;

/// One general matrix multiply, row-major: `c[m×n] = alpha · op(a) · op(b) + beta · c`,
/// where `op(a)` is `m×k` (`a` stored `k×m` when `a_t`) and `op(b)` is `k×n` (`b` stored
/// `n×k` when `b_t`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The shared inner dimension.
    pub k: usize,
    /// Whether `a` is stored transposed.
    pub a_t: bool,
    /// Whether `b` is stored transposed.
    pub b_t: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the existing output (0 overwrites it).
    pub beta: f32,
}

/// A batch of images stored channels-last: element `(n, y, x, c)` of a batch is at
/// `((n · height + y) · width + x) · channels + c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Images {
    /// Images in the batch.
    pub batch: usize,
    /// Channels per pixel.
    pub channels: usize,
    /// Rows of pixels.
    pub height: usize,
    /// Columns of pixels.
    pub width: usize,
}

impl Images {
    /// Elements in the whole batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.height * self.width
    }

    /// Whether the batch holds no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A square sliding window over [`Images`]: its side, step and the zero padding around each
/// image. Convolutions and pooling share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Window {
    /// Side of the window.
    pub size: usize,
    /// Step between window positions.
    pub stride: usize,
    /// Padding added on every side of the image.
    pub pad: usize,
}

impl Window {
    /// Window positions along an axis of `len` pixels, or `None` when the window does not fit.
    #[must_use]
    pub fn positions(&self, len: usize) -> Option<usize> {
        let padded = len + 2 * self.pad;
        (self.size > 0 && self.stride > 0 && padded >= self.size)
            .then(|| (padded - self.size) / self.stride + 1)
    }

    /// The output images of this window over `input`, `channels` deep, or a shape error.
    pub fn output(&self, input: Images, channels: usize) -> Result<Images, ComputeError> {
        match (self.positions(input.height), self.positions(input.width)) {
            (Some(height), Some(width)) => Ok(Images { batch: input.batch, channels, height, width }),
            _ => Err(ComputeError::Shape(format!(
                "a {0}×{0} window with stride {1} and padding {2} does not fit {3}×{4} images",
                self.size, self.stride, self.pad, input.height, input.width
            ))),
        }
    }
}

/// A 2-D convolution by im2col: every window position of every image becomes a row of the
/// column matrix (`rows()` × `patch()`), whose columns are ordered `(channel, dy, dx)` so that
/// a weight tensor `[out, in, size, size]` multiplies it as a plain `out × patch` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// The input batch.
    pub input: Images,
    /// The window.
    pub window: Window,
}

impl Conv2d {
    /// The same convolution over a batch of `batch` images.
    #[must_use]
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.input.batch = batch;
        self
    }

    /// `(output height, output width)`, or a shape error when the window does not fit.
    pub fn output_size(&self) -> Result<(usize, usize), ComputeError> {
        let out = self.window.output(self.input, 1)?;
        Ok((out.height, out.width))
    }

    /// Rows of the column matrix: output pixels over the batch.
    pub fn rows(&self) -> Result<usize, ComputeError> {
        let (h, w) = self.output_size()?;
        Ok(self.input.batch * h * w)
    }

    /// Columns of the column matrix: `channels · size²`.
    #[must_use]
    pub fn patch(&self) -> usize {
        self.input.channels * self.window.size * self.window.size
    }
}

/// Which value a pooling window keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// The largest value in the window; its gradient goes to the first largest element in
    /// row-major window order.
    Max,
    /// The mean of the window's pixels inside the image (padding is not counted).
    Avg,
}

/// Pooling of each channel of [`Images`] over a [`Window`]; the output has the same channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    /// The input batch.
    pub input: Images,
    /// The window; its padding must be smaller than its size, so that every window covers
    /// at least one pixel.
    pub window: Window,
    /// Maximum or mean.
    pub kind: PoolKind,
}

impl Pool2d {
    /// The same pooling over a batch of `batch` images.
    #[must_use]
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.input.batch = batch;
        self
    }

    /// The output batch, or a shape error when the window does not fit or covers only padding.
    pub fn output(&self) -> Result<Images, ComputeError> {
        if self.window.pad >= self.window.size {
            return Err(ComputeError::Shape(format!(
                "pooling padding {} must be smaller than the window size {}",
                self.window.pad, self.window.size
            )));
        }
        self.window.output(self.input, self.input.channels)
    }
}

/// A compute backend: owns device buffers and runs kernels on them.
///
/// Offsets and lengths are in elements (`f32`); every buffer argument is `(buffer, offset)`
/// or a whole buffer starting at element 0. Implementations check bounds and report
/// [`ComputeError::Shape`] instead of panicking.
pub trait Backend: Send + 'static {
    /// A buffer of `f32` on the backend's device.
    type Buffer: Send + 'static;

    /// Short name for logs and reports.
    fn name(&self) -> &'static str;
    /// A zero-filled buffer of `len` elements.
    fn alloc(&self, len: usize) -> Result<Self::Buffer, ComputeError>;
    /// Copy host values into `dst` starting at `offset`.
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<(), ComputeError>;
    /// Copy `dst.len()` values out of `src` starting at `offset`.
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError>;
    /// A buffer that refers to `host` without copying it, for backends that compute on host
    /// memory; `None` for device backends.
    fn view_host(&self, host: &std::sync::Arc<Vec<f32>>) -> Option<Self::Buffer> {
        let _ = host;
        None
    }
    /// Move the contents of `src` into `host`, a vector of the same length, leaving `src`
    /// with unspecified contents. The default copies; host-memory backends swap instead.
    fn take(&self, src: &mut Self::Buffer, host: &mut Vec<f32>) -> Result<(), ComputeError> {
        self.read(src, 0, host)
    }
    /// `c = alpha · op(a) · op(b) + beta · c`, see [`Gemm`].
    fn gemm(
        &self,
        spec: Gemm,
        a: (&Self::Buffer, usize),
        b: (&Self::Buffer, usize),
        c: (&mut Self::Buffer, usize),
    ) -> Result<(), ComputeError>;
    /// Add `bias[cols]` to every row of `x[rows×cols]`.
    fn add_bias(
        &self,
        x: &mut Self::Buffer,
        rows: usize,
        cols: usize,
        bias: (&Self::Buffer, usize),
    ) -> Result<(), ComputeError>;
    /// `x = max(x, 0)` on the first `len` elements.
    fn relu(&self, x: &mut Self::Buffer, len: usize) -> Result<(), ComputeError>;
    /// `grad[i] = 0` wherever `activation[i] <= 0`, on the first `len` elements.
    fn relu_backward(
        &self,
        grad: &mut Self::Buffer,
        activation: &Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
    /// `out[c] = Σ_r x[r×cols + c]`: column sums of `x[rows×cols]`.
    fn sum_rows(
        &self,
        x: &Self::Buffer,
        rows: usize,
        cols: usize,
        out: (&mut Self::Buffer, usize),
    ) -> Result<(), ComputeError>;
    /// Mean softmax cross-entropy of `logits[rows×cols]` against `labels`, and its gradient
    /// `(softmax − onehot) / rows` written to `grad`.
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buffer,
        labels: &[u8],
        cols: usize,
        grad: &mut Self::Buffer,
    ) -> Result<f32, ComputeError>;
    /// Summed cross-entropy and the number of rows whose arg-max equals the label (ties go
    /// to the first class).
    fn evaluate_logits(
        &self,
        logits: &Self::Buffer,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError>;
    /// The column matrix of `conv` over the images in `x`, written to `col`
    /// (`rows × patch`, see [`Conv2d`]); positions in the padding read as zero.
    fn im2col(&self, conv: Conv2d, x: &Self::Buffer, col: &mut Self::Buffer) -> Result<(), ComputeError>;
    /// The adjoint of [`Backend::im2col`]: every image element of `dx` becomes the sum of the
    /// column-matrix entries in `col` that were read from it (`dx` is overwritten).
    fn col2im(&self, conv: Conv2d, col: &Self::Buffer, dx: &mut Self::Buffer) -> Result<(), ComputeError>;
    /// Pool the images in `x` into `y`, see [`Pool2d`].
    fn pool(&self, pool: Pool2d, x: &Self::Buffer, y: &mut Self::Buffer) -> Result<(), ComputeError>;
    /// The gradient `dx` of a [`Backend::pool`] with input `x`, given the output gradient `dy`
    /// (`dx` is overwritten).
    fn pool_backward(
        &self,
        pool: Pool2d,
        x: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<(), ComputeError>;
    /// `y += alpha · x` on the first `len` elements: the SGD step with `alpha = −η`.
    fn axpy(
        &self,
        alpha: f32,
        x: &Self::Buffer,
        y: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
    /// Heavy-ball momentum on the first `len` elements: `v ← μ v − η g; w ← w + v`.
    fn momentum(
        &self,
        rate: Rate,
        grad: &Self::Buffer,
        velocity: &mut Self::Buffer,
        weights: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
    /// Nesterov momentum on the first `len` elements: `v ← μ v − η g; w ← w + μ v − η g`.
    fn nesterov(
        &self,
        rate: Rate,
        grad: &Self::Buffer,
        velocity: &mut Self::Buffer,
        weights: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
    /// One AdamW step on the first `len` elements, see [`Adam`]: the moments `m`, `v` advance
    /// with `grad` and `weights` take the bias-corrected step with decoupled weight decay.
    fn adamw(
        &self,
        step: Adam,
        grad: &Self::Buffer,
        moments: (&mut Self::Buffer, &mut Self::Buffer),
        weights: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
    /// The elastic pull of EASGD on the first `len` elements: `x ← x + α (toward − x)`.
    /// A learner pulls its variable toward the center with it, and the center is moved
    /// toward a learner's variable with the same operation and the roles swapped.
    fn elastic_pull(
        &self,
        alpha: f32,
        toward: &Self::Buffer,
        x: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
}

/// Learning rate and momentum of the momentum updates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// η.
    pub lr: f32,
    /// μ.
    pub momentum: f32,
}

/// One step of AdamW (Loshchilov & Hutter): `m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²;
/// w ← w − η (m / c1 / (√(v / c2) + ε) + λ w)` with the bias corrections `c1 = 1 − β1^t`,
/// `c2 = 1 − β2^t` of step `t` (counted from 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// η.
    pub lr: f32,
    /// β1.
    pub beta1: f32,
    /// β2.
    pub beta2: f32,
    /// ε.
    pub eps: f32,
    /// Decoupled weight decay λ.
    pub weight_decay: f32,
    /// The step number t, from 1.
    pub t: i32,
}

impl Adam {
    /// The bias corrections `(1 − β1^t, 1 − β2^t)`.
    #[must_use]
    pub fn corrections(&self) -> (f32, f32) {
        (1.0 - self.beta1.powi(self.t), 1.0 - self.beta2.powi(self.t))
    }
}

/// `offset..offset + n` if it lies inside a buffer of `len`, or a shape error naming `what`.
pub(crate) fn span(
    len: usize,
    offset: usize,
    n: usize,
    what: &str,
) -> Result<std::ops::Range<usize>, ComputeError> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(ComputeError::Shape(format!(
            "{what}: {n} elements at offset {offset} exceed a buffer of {len}"
        ))),
    }
}

/// The element counts `(x, col)` of an im2col, checked.
pub(crate) fn conv_sizes(conv: Conv2d) -> Result<(usize, usize), ComputeError> {
    Ok((conv.input.len(), conv.rows()? * conv.patch()))
}

/// The element counts `(x, y)` of a pooling, checked.
pub(crate) fn pool_sizes(pool: Pool2d) -> Result<(usize, usize), ComputeError> {
    Ok((pool.input.len(), pool.output()?.len()))
}

/// The label of each row as an index below `cols`, or a shape error.
pub(crate) fn label_index(label: u8, cols: usize) -> Result<usize, ComputeError> {
    let label = usize::from(label);
    if label < cols {
        Ok(label)
    } else {
        Err(ComputeError::Shape(format!("label {label} is not below the {cols} classes")))
    }
}
