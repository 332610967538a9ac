//! The CPU reference backend. GEMM goes through the `gemm` crate (packed, vectorised);
//! the element-wise kernels are plain loops the compiler vectorises.
//!
//! Buffers are host vectors behind an `Arc`, so a model can compute directly on parameters
//! it shares with a shard ([`Backend::view_host`]); a buffer is copied only when written while
//! shared.

mod image;

use std::sync::Arc;

use crate::backend::{Adam, Conv2d, Pool2d, Rate, conv_sizes, label_index, pool_sizes, span};
use crate::{Backend, ComputeError, Gemm};

/// The CPU backend. Single-threaded per instance: Rudra's parallelism is one learner per
/// thread, so kernels never spawn threads of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// `y += alpha · x`.
///
/// # Panics
/// If the slices differ in length (a caller bug, never input-dependent).
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy operands differ in length");
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// Heavy-ball momentum: `v ← μ v − η g; w ← w + v`.
///
/// # Panics
/// If the slices differ in length (a caller bug, never input-dependent).
pub fn momentum(r: Rate, g: &[f32], v: &mut [f32], w: &mut [f32]) {
    assert!(g.len() == v.len() && v.len() == w.len(), "momentum operands differ in length");
    for ((w, v), g) in w.iter_mut().zip(v).zip(g) {
        *v = r.momentum * *v - r.lr * g;
        *w += *v;
    }
}

/// One AdamW step, see [`Adam`]: the moments `(m, v)` advance with `g` and `w` moves.
///
/// # Panics
/// If the slices differ in length (a caller bug, never input-dependent).
pub fn adamw(step: Adam, g: &[f32], (m, v): (&mut [f32], &mut [f32]), w: &mut [f32]) {
    let same = g.len() == m.len() && m.len() == v.len() && v.len() == w.len();
    assert!(same, "adamw operands differ in length");
    let Adam { lr, beta1, beta2, eps, weight_decay, .. } = step;
    let (c1, c2) = step.corrections();
    for (((w, m), v), g) in w.iter_mut().zip(m).zip(v).zip(g) {
        *m = beta1 * *m + (1.0 - beta1) * g;
        *v = beta2 * *v + (1.0 - beta2) * g * g;
        *w -= lr * ((*m / c1) / ((*v / c2).sqrt() + eps) + weight_decay * *w);
    }
}

/// The widest kernels the CPU GEMM runs on this processor, chosen at run time: `avx512f`
/// where the processor has it, else `avx2+fma`, else `baseline`.
#[must_use]
pub fn gemm_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return "avx2+fma";
        }
    }
    "baseline"
}

/// Whether every value of `x` is finite (no NaN, no ±Inf), in one pass that vectorises: a
/// value is not finite exactly when its exponent bits are all ones, and an OR of those tests
/// is an integer reduction (a float sum would be kept in order, one value at a time).
#[must_use]
pub fn all_finite(x: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    x.iter().fold(0u32, |any, v| any | u32::from(v.to_bits() & EXPONENT == EXPONENT)) == 0
}

/// `y += alpha · x`, then `x = 0`, in one pass.
///
/// # Panics
/// If the slices differ in length (a caller bug, never input-dependent).
pub fn axpy_drain(alpha: f32, x: &mut [f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_drain operands differ in length");
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * *x;
        *x = 0.0;
    }
}

/// `y *= alpha`.
pub fn scale(alpha: f32, y: &mut [f32]) {
    for y in y {
        *y *= alpha;
    }
}

/// `buf[offset..offset + n]`, or a shape error naming `what`.
fn at<'a>(buf: &'a [f32], offset: usize, n: usize, what: &str) -> Result<&'a [f32], ComputeError> {
    Ok(&buf[span(buf.len(), offset, n, what)?])
}

/// `&mut buf[offset..offset + n]`, unsharing the buffer first, or a shape error naming `what`.
fn at_mut<'a>(
    buf: &'a mut Arc<Vec<f32>>,
    offset: usize,
    n: usize,
    what: &str,
) -> Result<&'a mut [f32], ComputeError> {
    let r = span(buf.len(), offset, n, what)?;
    Ok(&mut Arc::make_mut(buf)[r])
}

/// Row-major strides `(row stride, column stride)` of an operand stored `rows×cols`,
/// read as its transpose when `t`.
fn strides(cols: usize, t: bool) -> (isize, isize) {
    if t { (1, cols as isize) } else { (cols as isize, 1) }
}

impl Backend for CpuBackend {
    type Buffer = Arc<Vec<f32>>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc(&self, len: usize) -> Result<Arc<Vec<f32>>, ComputeError> {
        Ok(Arc::new(vec![0.0; len]))
    }

    fn write(&self, dst: &mut Arc<Vec<f32>>, offset: usize, src: &[f32]) -> Result<(), ComputeError> {
        at_mut(dst, offset, src.len(), "write")?.copy_from_slice(src);
        Ok(())
    }

    fn read(&self, src: &Arc<Vec<f32>>, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        dst.copy_from_slice(at(src, offset, dst.len(), "read")?);
        Ok(())
    }

    fn view_host(&self, host: &Arc<Vec<f32>>) -> Option<Arc<Vec<f32>>> {
        Some(Arc::clone(host))
    }

    fn take(&self, src: &mut Arc<Vec<f32>>, host: &mut Vec<f32>) -> Result<(), ComputeError> {
        if src.len() != host.len() {
            return Err(ComputeError::Shape(format!(
                "take: {} values into a vector of {}",
                src.len(),
                host.len()
            )));
        }
        std::mem::swap(Arc::make_mut(src), host);
        Ok(())
    }

    fn gemm(
        &self,
        g: Gemm,
        (a, ao): (&Arc<Vec<f32>>, usize),
        (b, bo): (&Arc<Vec<f32>>, usize),
        (c, co): (&mut Arc<Vec<f32>>, usize),
    ) -> Result<(), ComputeError> {
        let a = at(a, ao, g.m * g.k, "gemm a")?;
        let b = at(b, bo, g.k * g.n, "gemm b")?;
        let c = at_mut(c, co, g.m * g.n, "gemm c")?;
        let (a_rs, a_cs) = strides(if g.a_t { g.m } else { g.k }, g.a_t);
        let (b_rs, b_cs) = strides(if g.b_t { g.k } else { g.n }, g.b_t);
        // SAFETY: the three spans were bounds-checked above for exactly m·k, k·n and m·n
        // elements, and the strides address only inside them; `c` is uniquely borrowed.
        unsafe {
            gemm::gemm(
                g.m,
                g.n,
                g.k,
                c.as_mut_ptr(),
                1,
                g.n as isize,
                g.beta != 0.0,
                a.as_ptr(),
                a_cs,
                a_rs,
                b.as_ptr(),
                b_cs,
                b_rs,
                g.beta,
                g.alpha,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        Ok(())
    }

    fn add_bias(
        &self,
        x: &mut Arc<Vec<f32>>,
        rows: usize,
        cols: usize,
        (bias, bo): (&Arc<Vec<f32>>, usize),
    ) -> Result<(), ComputeError> {
        let bias = at(bias, bo, cols, "bias")?;
        let x = at_mut(x, 0, rows * cols, "add_bias")?;
        for row in x.chunks_exact_mut(cols) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
        Ok(())
    }

    fn relu(&self, x: &mut Arc<Vec<f32>>, len: usize) -> Result<(), ComputeError> {
        for v in at_mut(x, 0, len, "relu")? {
            *v = v.max(0.0);
        }
        Ok(())
    }

    fn relu_backward(
        &self,
        grad: &mut Arc<Vec<f32>>,
        activation: &Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        let a = at(activation, 0, len, "relu_backward activation")?;
        for (g, a) in at_mut(grad, 0, len, "relu_backward grad")?.iter_mut().zip(a) {
            if *a <= 0.0 {
                *g = 0.0;
            }
        }
        Ok(())
    }

    fn sum_rows(
        &self,
        x: &Arc<Vec<f32>>,
        rows: usize,
        cols: usize,
        (out, oo): (&mut Arc<Vec<f32>>, usize),
    ) -> Result<(), ComputeError> {
        let x = at(x, 0, rows * cols, "sum_rows")?;
        let out = at_mut(out, oo, cols, "sum_rows out")?;
        out.fill(0.0);
        for row in x.chunks_exact(cols) {
            for (o, v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Arc<Vec<f32>>,
        labels: &[u8],
        cols: usize,
        grad: &mut Arc<Vec<f32>>,
    ) -> Result<f32, ComputeError> {
        let rows = labels.len();
        if rows == 0 {
            return Err(ComputeError::Shape("a batch of no rows has no loss".into()));
        }
        let l = at(logits, 0, rows * cols, "softmax logits")?;
        let g = at_mut(grad, 0, rows * cols, "softmax grad")?;
        let inv_rows = 1.0 / rows as f32;
        let mut loss = 0.0f64;
        for ((row, out), &label) in l.chunks_exact(cols).zip(g.chunks_exact_mut(cols)).zip(labels) {
            let label = label_index(label, cols)?;
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (o, &v) in out.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum += *o;
            }
            loss += f64::from(sum.ln() - (row[label] - max));
            let inv = inv_rows / sum;
            for o in out.iter_mut() {
                *o *= inv;
            }
            out[label] -= inv_rows;
        }
        Ok((loss / rows as f64) as f32)
    }

    fn evaluate_logits(
        &self,
        logits: &Arc<Vec<f32>>,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError> {
        let l = at(logits, 0, labels.len() * cols, "evaluate logits")?;
        let mut loss = 0.0f64;
        let mut correct = 0;
        for (row, &label) in l.chunks_exact(cols).zip(labels) {
            let label = label_index(label, cols)?;
            let (arg, max) = row
                .iter()
                .copied()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, v)| if v > best.1 { (i, v) } else { best });
            let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
            loss += f64::from(sum.ln() - (row[label] - max));
            correct += usize::from(arg == label);
        }
        Ok((loss, correct))
    }

    fn im2col(&self, conv: Conv2d, x: &Arc<Vec<f32>>, col: &mut Arc<Vec<f32>>) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        image::im2col(
            conv,
            conv.output_size()?,
            at(x, 0, nx, "im2col x")?,
            at_mut(col, 0, ncol, "im2col col")?,
        );
        Ok(())
    }

    fn col2im(&self, conv: Conv2d, col: &Arc<Vec<f32>>, dx: &mut Arc<Vec<f32>>) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        image::col2im(
            conv,
            conv.output_size()?,
            at(col, 0, ncol, "col2im col")?,
            at_mut(dx, 0, nx, "col2im dx")?,
        );
        Ok(())
    }

    fn pool(&self, pool: Pool2d, x: &Arc<Vec<f32>>, y: &mut Arc<Vec<f32>>) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        image::pool(pool, pool.output()?, at(x, 0, nx, "pool x")?, at_mut(y, 0, ny, "pool y")?);
        Ok(())
    }

    fn pool_backward(
        &self,
        pool: Pool2d,
        x: &Arc<Vec<f32>>,
        dy: &Arc<Vec<f32>>,
        dx: &mut Arc<Vec<f32>>,
    ) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        let (x, dy) = (at(x, 0, nx, "pool_backward x")?, at(dy, 0, ny, "pool_backward dy")?);
        image::pool_backward(pool, pool.output()?, x, dy, at_mut(dx, 0, nx, "pool_backward dx")?);
        Ok(())
    }

    fn axpy(
        &self,
        alpha: f32,
        x: &Arc<Vec<f32>>,
        y: &mut Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        axpy(alpha, at(x, 0, len, "axpy x")?, at_mut(y, 0, len, "axpy y")?);
        Ok(())
    }

    fn momentum(
        &self,
        r: Rate,
        grad: &Arc<Vec<f32>>,
        velocity: &mut Arc<Vec<f32>>,
        weights: &mut Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        let g = at(grad, 0, len, "momentum grad")?;
        let v = at_mut(velocity, 0, len, "momentum velocity")?;
        momentum(r, g, v, at_mut(weights, 0, len, "momentum weights")?);
        Ok(())
    }

    fn adamw(
        &self,
        step: Adam,
        grad: &Arc<Vec<f32>>,
        (m, v): (&mut Arc<Vec<f32>>, &mut Arc<Vec<f32>>),
        weights: &mut Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        let g = at(grad, 0, len, "adamw grad")?;
        let moments = (at_mut(m, 0, len, "adamw m")?, at_mut(v, 0, len, "adamw v")?);
        adamw(step, g, moments, at_mut(weights, 0, len, "adamw weights")?);
        Ok(())
    }

    fn nesterov(
        &self,
        r: Rate,
        grad: &Arc<Vec<f32>>,
        velocity: &mut Arc<Vec<f32>>,
        weights: &mut Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        let g = at(grad, 0, len, "nesterov grad")?;
        let v = at_mut(velocity, 0, len, "nesterov velocity")?;
        for ((w, v), g) in at_mut(weights, 0, len, "nesterov weights")?.iter_mut().zip(v).zip(g) {
            *v = r.momentum * *v - r.lr * g;
            *w += r.momentum * *v - r.lr * g;
        }
        Ok(())
    }

    fn elastic_pull(
        &self,
        alpha: f32,
        toward: &Arc<Vec<f32>>,
        x: &mut Arc<Vec<f32>>,
        len: usize,
    ) -> Result<(), ComputeError> {
        let t = at(toward, 0, len, "elastic_pull toward")?;
        for (x, t) in at_mut(x, 0, len, "elastic_pull x")?.iter_mut().zip(t) {
            *x += alpha * (t - *x);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn all_finite_finds_any_nan_or_infinity() {
        assert!(all_finite(&[]) && all_finite(&[0.0, -1e38, 3.0e38, f32::MIN_POSITIVE]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![1.0; 1000];
            x[777] = bad;
            assert!(!all_finite(&x), "{bad}");
        }
        // Large finite values whose differences would overflow are still finite.
        assert!(all_finite(&[f32::MAX, f32::MAX, -f32::MAX]));
    }

    use super::*;

    fn naive(g: Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut s = 0.0;
                for p in 0..g.k {
                    let av = if g.a_t { a[p * g.m + i] } else { a[i * g.k + p] };
                    let bv = if g.b_t { b[j * g.k + p] } else { b[p * g.n + j] };
                    s += av * bv;
                }
                c[i * g.n + j] = g.alpha * s + g.beta * c[i * g.n + j];
            }
        }
    }

    #[test]
    fn gemm_matches_definition_for_every_transpose() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
            for beta in [0.0, 0.5] {
                let g = Gemm { m, n, k, a_t, b_t, alpha: 1.5, beta };
                let mut want: Vec<f32> = (0..m * n).map(|i| i as f32).collect();
                let mut got = want.clone();
                naive(g, &a, &b, &mut want);
                let mut c = Arc::new(got.clone());
                CpuBackend
                    .gemm(g, (&Arc::new(a.clone()), 0), (&Arc::new(b.clone()), 0), (&mut c, 0))
                    .unwrap();
                got = c.to_vec();
                for (w, g) in want.iter().zip(&got) {
                    assert!((w - g).abs() < 1e-5, "a_t={a_t} b_t={b_t}: {w} vs {g}");
                }
            }
        }
    }

    #[test]
    fn out_of_bounds_is_an_error_not_a_panic() {
        let g = Gemm { m: 4, n: 4, k: 4, a_t: false, b_t: false, alpha: 1.0, beta: 0.0 };
        let small = Arc::new(vec![0.0; 8]);
        let mut c = Arc::new(vec![0.0; 16]);
        assert!(matches!(
            CpuBackend.gemm(g, (&small, 0), (&small, 0), (&mut c, 0)),
            Err(ComputeError::Shape(_))
        ));
        let mut grad = Arc::new(vec![0.0; 4]);
        assert!(CpuBackend.softmax_cross_entropy(&Arc::new(vec![0.0; 4]), &[7, 0], 2, &mut grad).is_err());
    }

    #[test]
    fn update_kernels_follow_their_formulas() {
        let close = |got: &[f32], want: &[f32]| {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        };
        let rate = Rate { lr: 0.1, momentum: 0.9 };
        let g = Arc::new(vec![1.0, -2.0]);
        let (mut v, mut w) = (Arc::new(vec![0.5, 0.5]), Arc::new(vec![1.0, 1.0]));
        CpuBackend.momentum(rate, &g, &mut v, &mut w, 2).unwrap();
        close(&v, &[0.35, 0.65]);
        close(&w, &[1.35, 1.65]);
        let (mut v, mut w) = (Arc::new(vec![0.5, 0.5]), Arc::new(vec![1.0, 1.0]));
        CpuBackend.nesterov(rate, &g, &mut v, &mut w, 2).unwrap();
        close(&v, &[0.35, 0.65]);
        close(&w, &[1.215, 1.785]);
        // AdamW's first step: m̂ = g, v̂ = g², so each weight moves by η (sign(g) + λ w).
        let step = Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, t: 1 };
        let (mut m, mut v, mut w) =
            (Arc::new(vec![0.0; 2]), Arc::new(vec![0.0; 2]), Arc::new(vec![1.0, 1.0]));
        CpuBackend.adamw(step, &g, (&mut m, &mut v), &mut w, 2).unwrap();
        close(&m, &[0.1, -0.2]);
        close(&v, &[0.001, 0.004]);
        close(&w, &[0.899, 1.099]);
        assert!(CpuBackend.adamw(step, &g, (&mut m, &mut v), &mut w, 3).is_err());
        let mut x = Arc::new(vec![1.0, 3.0]);
        CpuBackend.elastic_pull(0.25, &Arc::new(vec![3.0, -1.0]), &mut x, 2).unwrap();
        close(&x, &[1.5, 2.0]);
        CpuBackend.axpy(-0.5, &g, &mut x, 2).unwrap();
        close(&x, &[1.0, 3.0]);
        assert!(CpuBackend.elastic_pull(0.25, &g, &mut x, 3).is_err());
    }

    #[test]
    fn softmax_cross_entropy_of_uniform_logits_is_log_classes() {
        let logits = Arc::new(vec![0.0; 2 * 4]);
        let mut grad = Arc::new(vec![0.0; 8]);
        let loss = CpuBackend.softmax_cross_entropy(&logits, &[1, 3], 4, &mut grad).unwrap();
        assert!((loss - 4f32.ln()).abs() < 1e-6);
        assert!((grad[1] - (0.25 - 1.0) / 2.0).abs() < 1e-7);
        assert!((grad[0] - 0.25 / 2.0).abs() < 1e-7);
        let (sum, correct) = CpuBackend.evaluate_logits(&logits, &[0, 3], 4).unwrap();
        assert!((sum - 2.0 * 4f64.ln()).abs() < 1e-6);
        assert_eq!(correct, 1, "ties go to the first class");
    }
}
