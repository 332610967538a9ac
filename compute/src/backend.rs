//! The `Backend` trait: the operations models and updates need, on buffers the backend owns.

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

/// A compute backend: owns device buffers and runs kernels on them.
///
/// Offsets and lengths are in elements (`f32`); every buffer argument is `(buffer, offset)`.
/// Implementations check bounds and report [`ComputeError::Shape`] instead of panicking.
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
    /// Summed cross-entropy and the number of rows whose arg-max equals the label.
    fn evaluate_logits(
        &self,
        logits: &Self::Buffer,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError>;
    /// `y += alpha · x` on the first `len` elements.
    fn axpy(
        &self,
        alpha: f32,
        x: &Self::Buffer,
        y: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), ComputeError>;
}
