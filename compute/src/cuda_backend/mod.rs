//! The CUDA backend (cudarc): kernels in `.cu` files compiled at run time with NVRTC when the
//! backend opens, cuBLAS for GEMM, buffers that stay in device memory across steps. The
//! driver, NVRTC and cuBLAS are loaded dynamically, so the build needs no CUDA toolkit and a
//! machine without them gets a clear error rather than a crash.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use crate::backend::{Adam, Conv2d, Pool2d, PoolKind, Rate, conv_sizes, label_index, pool_sizes, span};
use crate::{Backend, ComputeError, Gemm, Images, Window};

/// Threads per block of the one-dimensional kernels.
const BLOCK: u32 = 256;
/// The most blocks of a grid-stride launch.
const MAX_BLOCKS: usize = 65_535;

/// A kernel: its `.cu` file and function name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kernel {
    AddBias,
    Relu,
    ReluBackward,
    Axpy,
    Momentum,
    Nesterov,
    AdamW,
    ElasticPull,
    SumRows,
    SoftmaxCrossEntropy,
    EvaluateLogits,
    Im2col,
    Col2im,
    Pool,
    PoolBackward,
}

const ELEMENTWISE: &str = include_str!("elementwise.cu");
const REDUCE: &str = include_str!("reduce.cu");
const SOFTMAX: &str = include_str!("softmax.cu");
const IMAGE: &str = include_str!("image.cu");

impl Kernel {
    const ALL: [Self; 15] = [
        Self::AddBias,
        Self::Relu,
        Self::ReluBackward,
        Self::Axpy,
        Self::Momentum,
        Self::Nesterov,
        Self::AdamW,
        Self::ElasticPull,
        Self::SumRows,
        Self::SoftmaxCrossEntropy,
        Self::EvaluateLogits,
        Self::Im2col,
        Self::Col2im,
        Self::Pool,
        Self::PoolBackward,
    ];

    /// `(source file, function name)`.
    fn source(self) -> (&'static str, &'static str) {
        match self {
            Self::AddBias => (ELEMENTWISE, "add_bias"),
            Self::Relu => (ELEMENTWISE, "relu"),
            Self::ReluBackward => (ELEMENTWISE, "relu_backward"),
            Self::Axpy => (ELEMENTWISE, "axpy"),
            Self::Momentum => (ELEMENTWISE, "momentum"),
            Self::Nesterov => (ELEMENTWISE, "nesterov"),
            Self::AdamW => (ELEMENTWISE, "adamw"),
            Self::ElasticPull => (ELEMENTWISE, "elastic_pull"),
            Self::SumRows => (REDUCE, "sum_rows"),
            Self::SoftmaxCrossEntropy => (SOFTMAX, "softmax_cross_entropy"),
            Self::EvaluateLogits => (SOFTMAX, "evaluate_logits"),
            Self::Im2col => (IMAGE, "im2col"),
            Self::Col2im => (IMAGE, "col2im"),
            Self::Pool => (IMAGE, "pool"),
            Self::PoolBackward => (IMAGE, "pool_backward"),
        }
    }
}

/// A CUDA device, its stream, cuBLAS handle and compiled kernels. Clones share them.
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: HashMap<Kernel, CudaFunction>,
}

/// A buffer of `f32` in device memory.
pub struct CudaBuffer {
    slice: CudaSlice<f32>,
    len: usize,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description())
    }
}

fn device_error(message: impl std::fmt::Display) -> ComputeError {
    ComputeError::Device { backend: "cuda", message: message.to_string() }
}

/// `n` as a kernel's `unsigned int`, or a shape error.
fn word(n: usize, what: &str) -> Result<u32, ComputeError> {
    u32::try_from(n)
        .map_err(|_| ComputeError::Shape(format!("{what}: {n} exceeds the CUDA kernels' 32-bit sizes")))
}

/// A grid-stride launch over `n` items.
fn launch_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    /// Open CUDA device 0 and compile every kernel. An error, not a crash, when the driver,
    /// NVRTC, cuBLAS or a device is missing.
    pub fn new() -> Result<Self, ComputeError> {
        let unavailable = |reason: String| ComputeError::Unavailable { backend: "cuda", reason };
        // SAFETY: these only try to open the shared libraries by name; cudarc's wrappers
        // panic when a library is missing, so they are checked before any call into them.
        let present = unsafe {
            [
                ("the CUDA driver (libcuda)", cudarc::driver::sys::is_culib_present()),
                ("NVRTC (libnvrtc)", cudarc::nvrtc::sys::is_culib_present()),
                ("cuBLAS (libcublas)", cudarc::cublas::sys::is_culib_present()),
            ]
        };
        if let Some((missing, _)) = present.iter().find(|(_, found)| !found) {
            return Err(unavailable(format!("{missing} is not installed")));
        }
        let count =
            CudaContext::device_count().map_err(|e| unavailable(format!("the driver reports {e}")))?;
        if count < 1 {
            return Err(unavailable("the driver finds no CUDA device".into()));
        }
        let ctx = CudaContext::new(0).map_err(|e| unavailable(format!("device 0 cannot be opened: {e}")))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(device_error)?;
        let mut modules = HashMap::new();
        let mut kernels = HashMap::new();
        for kernel in Kernel::ALL {
            let (source, name) = kernel.source();
            if !modules.contains_key(source) {
                let ptx = cudarc::nvrtc::compile_ptx(source)
                    .map_err(|e| device_error(format!("compiling the kernel of {name}: {e}")))?;
                modules.insert(source, ctx.load_module(ptx).map_err(device_error)?);
            }
            let function = modules[source].load_function(name).map_err(device_error)?;
            kernels.insert(kernel, function);
        }
        let name = ctx.name().map_err(device_error)?;
        Ok(Self { inner: Arc::new(Inner { name, stream, blas, kernels }) })
    }

    /// The device, e.g. `cuda: NVIDIA H200`.
    #[must_use]
    pub fn description(&self) -> String {
        format!("cuda: {}", self.inner.name)
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    fn kernel(&self, kernel: Kernel) -> &CudaFunction {
        &self.inner.kernels[&kernel]
    }

    /// Copy `values` to a new device buffer.
    fn upload<T: cudarc::driver::DeviceRepr>(&self, values: &[T]) -> Result<CudaSlice<T>, ComputeError> {
        self.stream().clone_htod(values).map_err(device_error)
    }

    /// Wait for the stream and copy `src` to the host.
    fn download(&self, src: &CudaSlice<f32>) -> Result<Vec<f32>, ComputeError> {
        let out = self.stream().clone_dtoh(src).map_err(device_error)?;
        self.stream().synchronize().map_err(device_error)?;
        Ok(out)
    }

    /// Labels as the kernels read them, each checked to be below `cols`.
    fn labels(&self, labels: &[u8], cols: usize) -> Result<CudaSlice<u32>, ComputeError> {
        if labels.is_empty() {
            return Err(ComputeError::Shape("a batch of no rows has no loss".into()));
        }
        let words =
            labels.iter().map(|&l| label_index(l, cols).map(|l| l as u32)).collect::<Result<Vec<_>, _>>()?;
        self.upload(&words)
    }

    /// The nine geometry words the image kernels take last.
    fn geometry(input: Images, window: Window, out: (usize, usize)) -> Result<[u32; 9], ComputeError> {
        let w = |n| word(n, "image kernel");
        Ok([
            w(input.batch)?,
            w(input.channels)?,
            w(input.height)?,
            w(input.width)?,
            w(window.size)?,
            w(window.stride)?,
            w(window.pad)?,
            w(out.0)?,
            w(out.1)?,
        ])
    }

    /// Launch an image kernel over `items` with `buffers` (inputs, then the output), the
    /// item count, the pooling kind where given, and the geometry.
    fn image_kernel(
        &self,
        kernel: Kernel,
        (inputs, output): (&[&CudaSlice<f32>], &mut CudaSlice<f32>),
        items: usize,
        kind: Option<u32>,
        geometry: [u32; 9],
    ) -> Result<(), ComputeError> {
        let items_word = word(items, "image kernel")?;
        let mut launch = self.stream().launch_builder(self.kernel(kernel));
        for input in inputs {
            launch.arg(*input);
        }
        launch.arg(output).arg(&items_word);
        if let Some(kind) = &kind {
            launch.arg(kind);
        }
        for g in &geometry {
            launch.arg(g);
        }
        // SAFETY: the kernel's parameters are the buffers, the item count, the kind where
        // it takes one, and the nine geometry words, in this order; the buffers were checked
        // to hold what the geometry addresses.
        unsafe { launch.launch(launch_for(items)) }.map_err(device_error)?;
        Ok(())
    }

    /// An element-wise kernel over the first `len` elements of its outputs `outs` (updated in
    /// place) and its input `x`.
    fn elementwise(
        &self,
        kernel: Kernel,
        outs: &mut [&mut CudaBuffer],
        x: Option<&CudaBuffer>,
        scalars: &[f32],
        len: usize,
    ) -> Result<(), ComputeError> {
        let what = format!("{kernel:?}");
        let n = word(len, &what)?;
        let mut launch = self.stream().launch_builder(self.kernel(kernel));
        for out in outs.iter_mut() {
            span(out.len, 0, len, &what)?;
            launch.arg(&mut out.slice);
        }
        if let Some(x) = x {
            span(x.len, 0, len, &what)?;
            launch.arg(&x.slice);
        }
        for s in scalars {
            launch.arg(s);
        }
        launch.arg(&n);
        // SAFETY: every element-wise kernel takes its outputs, its input, its scalars and
        // the length, in this order, and touches only the first `len` elements, which every
        // buffer was checked to hold.
        unsafe { launch.launch(launch_for(len)) }.map_err(device_error)?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer, ComputeError> {
        let slice = self.stream().alloc_zeros::<f32>(len.max(1)).map_err(device_error)?;
        Ok(CudaBuffer { slice, len })
    }

    fn write(&self, dst: &mut CudaBuffer, offset: usize, src: &[f32]) -> Result<(), ComputeError> {
        let r = span(dst.len, offset, src.len(), "write")?;
        self.stream().memcpy_htod(src, &mut dst.slice.slice_mut(r)).map_err(device_error)
    }

    fn read(&self, src: &CudaBuffer, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        let r = span(src.len, offset, dst.len(), "read")?;
        self.stream().memcpy_dtoh(&src.slice.slice(r), dst).map_err(device_error)?;
        self.stream().synchronize().map_err(device_error)
    }

    fn gemm(
        &self,
        g: Gemm,
        (a, ao): (&CudaBuffer, usize),
        (b, bo): (&CudaBuffer, usize),
        (c, co): (&mut CudaBuffer, usize),
    ) -> Result<(), ComputeError> {
        let ra = span(a.len, ao, g.m * g.k, "gemm a")?;
        let rb = span(b.len, bo, g.k * g.n, "gemm b")?;
        let rc = span(c.len, co, g.m * g.n, "gemm c")?;
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        let int = |n: usize| {
            i32::try_from(n).map_err(|_| ComputeError::Shape(format!("gemm: {n} exceeds cuBLAS's sizes")))
        };
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        // Row-major c = op(a)·op(b) is column-major cᵀ = op(b)ᵀ·op(a)ᵀ: cuBLAS multiplies b by a.
        let cfg = GemmConfig {
            transa: op(g.b_t),
            transb: op(g.a_t),
            m: int(g.n)?,
            n: int(g.m)?,
            k: int(g.k)?,
            alpha: g.alpha,
            lda: int(if g.b_t { g.k.max(1) } else { g.n })?,
            ldb: int(if g.a_t { g.m } else { g.k.max(1) })?,
            beta: g.beta,
            ldc: int(g.n)?,
        };
        // SAFETY: the three views hold exactly the m·k, k·n and m·n elements the
        // configuration addresses, with the leading dimensions of their row-major storage.
        unsafe {
            self.inner.blas.gemm(cfg, &b.slice.slice(rb), &a.slice.slice(ra), &mut c.slice.slice_mut(rc))
        }
        .map_err(device_error)
    }

    fn add_bias(
        &self,
        x: &mut CudaBuffer,
        rows: usize,
        cols: usize,
        (bias, bo): (&CudaBuffer, usize),
    ) -> Result<(), ComputeError> {
        let len = rows * cols;
        span(x.len, 0, len, "add_bias")?;
        let bias = bias.slice.slice(span(bias.len, bo, cols, "bias")?);
        let (n, cols) = (word(len, "add_bias")?, word(cols.max(1), "add_bias")?);
        let mut launch = self.stream().launch_builder(self.kernel(Kernel::AddBias));
        launch.arg(&mut x.slice).arg(&bias).arg(&n).arg(&cols);
        // SAFETY: add_bias(y, bias, len, cols) touches y[..len] and bias[..cols], both checked.
        unsafe { launch.launch(launch_for(len)) }.map_err(device_error)?;
        Ok(())
    }

    fn relu(&self, x: &mut CudaBuffer, len: usize) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Relu, &mut [x], None, &[], len)
    }

    fn relu_backward(
        &self,
        grad: &mut CudaBuffer,
        activation: &CudaBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::ReluBackward, &mut [grad], Some(activation), &[], len)
    }

    fn sum_rows(
        &self,
        x: &CudaBuffer,
        rows: usize,
        cols: usize,
        (out, oo): (&mut CudaBuffer, usize),
    ) -> Result<(), ComputeError> {
        span(x.len, 0, rows * cols, "sum_rows")?;
        let r = span(out.len, oo, cols, "sum_rows out")?;
        if cols == 0 {
            return Ok(());
        }
        let mut out = out.slice.slice_mut(r);
        let (rows_word, cols_word) = (word(rows, "sum_rows")?, word(cols, "sum_rows")?);
        let mut launch = self.stream().launch_builder(self.kernel(Kernel::SumRows));
        launch.arg(&x.slice).arg(&mut out).arg(&rows_word).arg(&cols_word);
        let cfg = LaunchConfig { grid_dim: (cols_word, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: one block per column; sum_rows(x, out, rows, cols) reads x[..rows·cols] and
        // writes out[..cols], both checked.
        unsafe { launch.launch(cfg) }.map_err(device_error)?;
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &CudaBuffer,
        labels: &[u8],
        cols: usize,
        grad: &mut CudaBuffer,
    ) -> Result<f32, ComputeError> {
        let rows = labels.len();
        span(logits.len, 0, rows * cols, "softmax logits")?;
        span(grad.len, 0, rows * cols, "softmax grad")?;
        let labels = self.labels(labels, cols)?;
        let mut losses = self.stream().alloc_zeros::<f32>(rows).map_err(device_error)?;
        let (rows_word, cols_word) = (word(rows, "softmax")?, word(cols, "softmax")?);
        let mut launch = self.stream().launch_builder(self.kernel(Kernel::SoftmaxCrossEntropy));
        launch
            .arg(&logits.slice)
            .arg(&labels)
            .arg(&mut grad.slice)
            .arg(&mut losses)
            .arg(&rows_word)
            .arg(&cols_word);
        let cfg = LaunchConfig {
            grid_dim: (rows_word.div_ceil(BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one thread per row; the kernel reads logits[..rows·cols] and labels[..rows]
        // (each below cols) and writes grad[..rows·cols] and losses[..rows], all checked.
        unsafe { launch.launch(cfg) }.map_err(device_error)?;
        let losses = self.download(&losses)?;
        Ok((losses.iter().map(|&l| f64::from(l)).sum::<f64>() / rows as f64) as f32)
    }

    fn evaluate_logits(
        &self,
        logits: &CudaBuffer,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError> {
        let rows = labels.len();
        if rows == 0 {
            return Ok((0.0, 0));
        }
        span(logits.len, 0, rows * cols, "evaluate logits")?;
        let labels = self.labels(labels, cols)?;
        let mut out = self.stream().alloc_zeros::<f32>(2 * rows).map_err(device_error)?;
        let (rows_word, cols_word) = (word(rows, "evaluate")?, word(cols, "evaluate")?);
        let mut launch = self.stream().launch_builder(self.kernel(Kernel::EvaluateLogits));
        launch.arg(&logits.slice).arg(&labels).arg(&mut out).arg(&rows_word).arg(&cols_word);
        let cfg = LaunchConfig {
            grid_dim: (rows_word.div_ceil(BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one thread per row; the kernel reads logits[..rows·cols] and labels[..rows]
        // and writes out[..2·rows], all checked.
        unsafe { launch.launch(cfg) }.map_err(device_error)?;
        let out = self.download(&out)?;
        let loss = out.iter().step_by(2).map(|&l| f64::from(l)).sum();
        let correct = out.iter().skip(1).step_by(2).filter(|&&c| c != 0.0).count();
        Ok((loss, correct))
    }

    fn im2col(&self, conv: Conv2d, x: &CudaBuffer, col: &mut CudaBuffer) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        span(x.len, 0, nx, "im2col x")?;
        span(col.len, 0, ncol, "im2col col")?;
        let geometry = Self::geometry(conv.input, conv.window, conv.output_size()?)?;
        self.image_kernel(Kernel::Im2col, (&[&x.slice], &mut col.slice), conv.rows()?, None, geometry)
    }

    fn col2im(&self, conv: Conv2d, col: &CudaBuffer, dx: &mut CudaBuffer) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        span(col.len, 0, ncol, "col2im col")?;
        span(dx.len, 0, nx, "col2im dx")?;
        let geometry = Self::geometry(conv.input, conv.window, conv.output_size()?)?;
        let pixels = nx / conv.input.channels.max(1);
        self.image_kernel(Kernel::Col2im, (&[&col.slice], &mut dx.slice), pixels, None, geometry)
    }

    fn pool(&self, pool: Pool2d, x: &CudaBuffer, y: &mut CudaBuffer) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        span(x.len, 0, nx, "pool x")?;
        span(y.len, 0, ny, "pool y")?;
        let out = pool.output()?;
        let geometry = Self::geometry(pool.input, pool.window, (out.height, out.width))?;
        let kind = u32::from(pool.kind == PoolKind::Avg);
        let pixels = ny / out.channels.max(1);
        self.image_kernel(Kernel::Pool, (&[&x.slice], &mut y.slice), pixels, Some(kind), geometry)
    }

    fn pool_backward(
        &self,
        pool: Pool2d,
        x: &CudaBuffer,
        dy: &CudaBuffer,
        dx: &mut CudaBuffer,
    ) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        span(x.len, 0, nx, "pool_backward x")?;
        span(dy.len, 0, ny, "pool_backward dy")?;
        span(dx.len, 0, nx, "pool_backward dx")?;
        let out = pool.output()?;
        let geometry = Self::geometry(pool.input, pool.window, (out.height, out.width))?;
        let kind = u32::from(pool.kind == PoolKind::Avg);
        let pixels = nx / pool.input.channels.max(1);
        self.image_kernel(
            Kernel::PoolBackward,
            (&[&x.slice, &dy.slice], &mut dx.slice),
            pixels,
            Some(kind),
            geometry,
        )
    }

    fn axpy(&self, alpha: f32, x: &CudaBuffer, y: &mut CudaBuffer, len: usize) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Axpy, &mut [y], Some(x), &[alpha], len)
    }

    fn momentum(
        &self,
        r: Rate,
        grad: &CudaBuffer,
        velocity: &mut CudaBuffer,
        weights: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Momentum, &mut [velocity, weights], Some(grad), &[r.lr, r.momentum], len)
    }

    fn nesterov(
        &self,
        r: Rate,
        grad: &CudaBuffer,
        velocity: &mut CudaBuffer,
        weights: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Nesterov, &mut [velocity, weights], Some(grad), &[r.lr, r.momentum], len)
    }

    fn adamw(
        &self,
        step: Adam,
        grad: &CudaBuffer,
        (m, v): (&mut CudaBuffer, &mut CudaBuffer),
        weights: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        let (c1, c2) = step.corrections();
        let scalars = [step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, c1, c2];
        self.elementwise(Kernel::AdamW, &mut [m, v, weights], Some(grad), &scalars, len)
    }

    fn elastic_pull(
        &self,
        alpha: f32,
        toward: &CudaBuffer,
        x: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::ElasticPull, &mut [x], Some(toward), &[alpha], len)
    }
}
