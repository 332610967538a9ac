//! The wgpu backend: WGSL compute shaders on any adapter wgpu finds (Vulkan, Metal, DX12,
//! GL; Mesa's lavapipe on a machine without a GPU). Buffers live on the device across steps;
//! only uploads of inputs and the read-back of results cross to the host. Every operation is
//! one dispatch, submitted at once; reads wait for the queue.

mod kernels;

use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::backend::{Adam, Conv2d, Pool2d, PoolKind, Rate, conv_sizes, label_index, pool_sizes, span};
use crate::{Backend, ComputeError, Gemm};
use kernels::{Kernel, Pipelines};

/// Invocations per workgroup of the one-dimensional kernels.
const WORKGROUP: usize = 256;
/// Rows and columns of the output tile of one GEMM workgroup.
const GEMM_TILE: usize = 64;
/// The most workgroups along one dimension of a dispatch.
const MAX_GROUPS: usize = 65_535;
/// A GEMM with fewer output tiles than this splits k across workgroups (split-K).
const SPLIT_K_GROUPS: usize = 128;
/// The fewest values of k one split-K workgroup covers: a multiple of the shader's 16.
const SPLIT_K_MIN: usize = 256;

/// A wgpu adapter, its queue and its compiled kernels. Clones share them.
#[derive(Clone)]
pub struct WgpuBackend {
    inner: Arc<Inner>,
}

struct Inner {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pipelines: Pipelines,
    /// The largest buffer, in bytes, the device binds.
    max_bytes: u64,
    /// The first error the device reported outside an error scope.
    error: Arc<Mutex<Option<String>>>,
}

/// A buffer of `f32` on the wgpu device.
pub struct WgpuBuffer {
    buffer: wgpu::Buffer,
    len: usize,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description())
    }
}

fn device_error(message: impl std::fmt::Display) -> ComputeError {
    ComputeError::Device { backend: "wgpu", message: message.to_string() }
}

/// `n` as a shader's `u32`, or a shape error.
fn word(n: usize, what: &str) -> Result<u32, ComputeError> {
    u32::try_from(n)
        .map_err(|_| ComputeError::Shape(format!("{what}: {n} exceeds the wgpu backend's 32-bit indices")))
}

/// A two-dimensional grid of workgroups with at least `groups` of them.
fn grid(groups: usize) -> (u32, u32, u32) {
    let x = groups.clamp(1, MAX_GROUPS);
    (x as u32, groups.div_ceil(x).max(1) as u32, 1)
}

/// How many values of k each GEMM workgroup covers when c has `tiles` output tiles: all of
/// them, unless too few tiles would keep the device busy and k is long enough to split into
/// slices of at least [`SPLIT_K_MIN`].
fn gemm_k_len(tiles: usize, k: usize) -> usize {
    let slices = SPLIT_K_GROUPS.div_ceil(tiles.max(1)).min(k / SPLIT_K_MIN);
    if slices < 2 { k } else { k.div_ceil(slices).next_multiple_of(16) }
}

impl WgpuBackend {
    /// Open the adapter wgpu prefers (`WGPU_BACKEND` narrows the choice, e.g. to `vulkan`)
    /// and compile every kernel.
    pub fn new() -> Result<Self, ComputeError> {
        let unavailable = |reason: String| ComputeError::Unavailable { backend: "wgpu", reason };
        // Vulkan, Metal or DX12 (no GL: probing EGL prints to stderr on headless machines).
        let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
        descriptor.backends = wgpu::Backends::PRIMARY;
        let instance = wgpu::Instance::new(descriptor.with_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| {
            unavailable(format!(
                "no adapter ({e}); install a GPU driver, or Mesa's lavapipe (Debian: mesa-vulkan-drivers libvulkan1)"
            ))
        })?;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("rudra"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| unavailable(format!("the adapter refused a device: {e}")))?;
        let error = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&error);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("wgpu: {e}");
            if let Ok(mut slot) = slot.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipelines = Pipelines::new(&device);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(device_error(format!("compiling the kernels: {e}")));
        }
        let max_bytes = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let info = adapter.get_info();
        Ok(Self { inner: Arc::new(Inner { device, queue, info, pipelines, max_bytes, error }) })
    }

    /// The adapter, its graphics API and kind, e.g.
    /// `wgpu: llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    #[must_use]
    pub fn description(&self) -> String {
        let i = &self.inner.info;
        format!("wgpu: {} ({:?}, {:?})", i.name, i.backend, i.device_type)
    }

    /// Whether the adapter renders in software on the CPU (lavapipe, llvmpipe, WARP).
    #[must_use]
    pub fn is_software(&self) -> bool {
        self.inner.info.device_type == wgpu::DeviceType::Cpu
    }

    /// An error the device reported since it opened, if any.
    fn check(&self) -> Result<(), ComputeError> {
        match self.inner.error.lock() {
            Ok(slot) => slot.as_ref().map_or(Ok(()), |e| Err(device_error(e))),
            Err(_) => Err(device_error("a thread panicked while recording a device error")),
        }
    }

    /// A buffer of `bytes` with `usage`, or an error when the device cannot make it.
    fn buffer(&self, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, ComputeError> {
        if bytes > self.inner.max_bytes {
            return Err(device_error(format!(
                "a buffer of {bytes} bytes exceeds the adapter's limit of {}",
                self.inner.max_bytes
            )));
        }
        let device = &self.inner.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(device_error(format!("allocating {bytes} bytes: {e}"))),
            None => Ok(buffer),
        }
    }

    /// A storage buffer holding `data` for one dispatch.
    fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> wgpu::Buffer {
        self.inner.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE,
        })
    }

    /// Run `kernel` once over `groups` workgroups with `params` (32-bit words) at binding 0
    /// and `buffers` at their bindings.
    fn dispatch(
        &self,
        kernel: Kernel,
        params: &[u32],
        buffers: &[(u32, &wgpu::Buffer)],
        groups: (u32, u32, u32),
    ) {
        let inner = &self.inner;
        let mut words = params.to_vec();
        words.resize(params.len().div_ceil(4) * 4, 0);
        let uniform = inner.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let (pipeline, layout) = inner.pipelines.get(kernel);
        let entries: Vec<wgpu::BindGroupEntry<'_>> = std::iter::once((0, &uniform))
            .chain(buffers.iter().copied())
            .map(|(binding, b)| wgpu::BindGroupEntry { binding, resource: b.as_entire_binding() })
            .collect();
        let bind_group = inner.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        });
        let mut encoder =
            inner.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        }
        inner.queue.submit([encoder.finish()]);
    }

    /// Run a one-dimensional `kernel` over `n` invocations.
    fn dispatch_1d(&self, kernel: Kernel, params: &[u32], buffers: &[(u32, &wgpu::Buffer)], n: usize) {
        self.dispatch(kernel, params, buffers, grid(n.div_ceil(WORKGROUP)));
    }

    /// Copy `len` values starting at element `offset` of `src` to the host.
    fn download(&self, src: &wgpu::Buffer, offset: usize, len: usize) -> Result<Vec<f32>, ComputeError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let bytes = (len * 4) as u64;
        let staging = self.buffer(bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)?;
        let inner = &self.inner;
        let mut encoder =
            inner.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(src, (offset * 4) as u64, &staging, 0, bytes);
        inner.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            // The receiver waits below; it is gone only if this thread already returned.
            let _ = tx.send(r);
        });
        inner.device.poll(wgpu::PollType::wait_indefinitely()).map_err(device_error)?;
        rx.recv().map_err(device_error)?.map_err(device_error)?;
        let out = {
            let view = staging.get_mapped_range(..).map_err(device_error)?;
            bytemuck::cast_slice::<u8, f32>(&view).to_vec()
        };
        staging.unmap();
        self.check()?;
        Ok(out)
    }

    /// Labels as the shaders read them, each checked to be below `cols`.
    fn labels(&self, labels: &[u8], cols: usize) -> Result<wgpu::Buffer, ComputeError> {
        if labels.is_empty() {
            return Err(ComputeError::Shape("a batch of no rows has no loss".into()));
        }
        let words =
            labels.iter().map(|&l| label_index(l, cols).map(|l| l as u32)).collect::<Result<Vec<_>, _>>()?;
        Ok(self.upload(&words))
    }

    /// The 12 parameter words of the image kernels.
    fn image_params(
        &self,
        input: crate::Images,
        window: crate::Window,
        out: (usize, usize),
        len: usize,
        kind: u32,
    ) -> Result<[u32; 12], ComputeError> {
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
            w(len)?,
            kind,
            0,
        ])
    }

    /// An element-wise kernel over `len` elements with `x` at binding 1, `y` at 2 and `z` at 3
    /// where given, and `(alpha, beta)`.
    fn elementwise(
        &self,
        kernel: Kernel,
        len: usize,
        (alpha, beta): (f32, f32),
        x: Option<&WgpuBuffer>,
        y: &mut WgpuBuffer,
        z: Option<&mut WgpuBuffer>,
    ) -> Result<(), ComputeError> {
        let what = format!("{kernel:?}");
        let mut buffers = vec![(2, &y.buffer)];
        span(y.len, 0, len, &what)?;
        if let Some(x) = x {
            span(x.len, 0, len, &what)?;
            buffers.push((1, &x.buffer));
        }
        if let Some(z) = &z {
            span(z.len, 0, len, &what)?;
            buffers.push((3, &z.buffer));
        }
        let params = [word(len, &what)?, 0, 0, 0, alpha.to_bits(), beta.to_bits(), 0, 0];
        self.dispatch_1d(kernel, &params, &buffers, len);
        Ok(())
    }
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn alloc(&self, len: usize) -> Result<WgpuBuffer, ComputeError> {
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        // wgpu zero-fills new buffers; an empty one still needs a binding of four bytes.
        let buffer = self.buffer((len.max(1) * 4) as u64, usage)?;
        Ok(WgpuBuffer { buffer, len })
    }

    fn write(&self, dst: &mut WgpuBuffer, offset: usize, src: &[f32]) -> Result<(), ComputeError> {
        span(dst.len, offset, src.len(), "write")?;
        self.inner.queue.write_buffer(&dst.buffer, (offset * 4) as u64, bytemuck::cast_slice(src));
        Ok(())
    }

    fn read(&self, src: &WgpuBuffer, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        span(src.len, offset, dst.len(), "read")?;
        dst.copy_from_slice(&self.download(&src.buffer, offset, dst.len())?);
        Ok(())
    }

    fn gemm(
        &self,
        g: Gemm,
        (a, ao): (&WgpuBuffer, usize),
        (b, bo): (&WgpuBuffer, usize),
        (c, co): (&mut WgpuBuffer, usize),
    ) -> Result<(), ComputeError> {
        span(a.len, ao, g.m * g.k, "gemm a")?;
        span(b.len, bo, g.k * g.n, "gemm b")?;
        span(c.len, co, g.m * g.n, "gemm c")?;
        let w = |n| word(n, "gemm");
        let col_tiles = g.n.div_ceil(GEMM_TILE).max(1);
        if col_tiles > MAX_GROUPS {
            return Err(ComputeError::Shape(format!(
                "gemm: {} output columns are too many for one dispatch",
                g.n
            )));
        }
        let k_len = gemm_k_len(col_tiles * g.m.div_ceil(GEMM_TILE), g.k);
        let params =
            |c_off: usize, m_base: usize, alpha: f32, beta: f32| -> Result<[u32; 12], ComputeError> {
                Ok([
                    w(g.m)?,
                    w(g.n)?,
                    w(g.k)?,
                    u32::from(g.a_t),
                    u32::from(g.b_t),
                    w(ao)?,
                    w(bo)?,
                    w(c_off)?,
                    w(m_base)?,
                    alpha.to_bits(),
                    beta.to_bits(),
                    w(k_len)?,
                ])
            };
        if k_len < g.k {
            // Split-K: one slab of partial products per slice of k, then their sum into c.
            let slices = g.k.div_ceil(k_len);
            // The shader indexes the slabs with 32 bits.
            let slabs = self.alloc(w(slices * g.m * g.n)? as usize)?;
            let groups = (col_tiles as u32, w(g.m.div_ceil(GEMM_TILE))?, w(slices)?);
            let inputs = [(1, &a.buffer), (2, &b.buffer), (3, &slabs.buffer)];
            self.dispatch(Kernel::Gemm, &params(0, 0, 1.0, 0.0)?, &inputs, groups);
            let sum = params(co, 0, g.alpha, g.beta)?;
            self.dispatch_1d(Kernel::GemmSumSlices, &sum, &[(1, &slabs.buffer), (3, &c.buffer)], g.m * g.n);
            return Ok(());
        }
        let rows_per_dispatch = MAX_GROUPS * GEMM_TILE;
        for m_base in (0..g.m).step_by(rows_per_dispatch) {
            let rows = (g.m - m_base).min(rows_per_dispatch);
            let groups = (col_tiles as u32, w(rows.div_ceil(GEMM_TILE))?, 1);
            let inputs = [(1, &a.buffer), (2, &b.buffer), (3, &c.buffer)];
            self.dispatch(Kernel::Gemm, &params(co, m_base, g.alpha, g.beta)?, &inputs, groups);
        }
        Ok(())
    }

    fn add_bias(
        &self,
        x: &mut WgpuBuffer,
        rows: usize,
        cols: usize,
        (bias, bo): (&WgpuBuffer, usize),
    ) -> Result<(), ComputeError> {
        span(bias.len, bo, cols, "bias")?;
        let len = rows * cols;
        span(x.len, 0, len, "add_bias")?;
        let params = [word(len, "add_bias")?, word(cols, "add_bias")?, word(bo, "add_bias")?, 0, 0, 0, 0, 0];
        self.dispatch_1d(Kernel::AddBias, &params, &[(1, &bias.buffer), (2, &x.buffer)], len);
        Ok(())
    }

    fn relu(&self, x: &mut WgpuBuffer, len: usize) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Relu, len, (0.0, 0.0), None, x, None)
    }

    fn relu_backward(
        &self,
        grad: &mut WgpuBuffer,
        activation: &WgpuBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::ReluBackward, len, (0.0, 0.0), Some(activation), grad, None)
    }

    fn sum_rows(
        &self,
        x: &WgpuBuffer,
        rows: usize,
        cols: usize,
        (out, oo): (&mut WgpuBuffer, usize),
    ) -> Result<(), ComputeError> {
        span(x.len, 0, rows * cols, "sum_rows")?;
        span(out.len, oo, cols, "sum_rows out")?;
        let params = [word(rows, "sum_rows")?, word(cols, "sum_rows")?, word(oo, "sum_rows")?, 0];
        self.dispatch(Kernel::SumRows, &params, &[(1, &x.buffer), (2, &out.buffer)], grid(cols));
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &WgpuBuffer,
        labels: &[u8],
        cols: usize,
        grad: &mut WgpuBuffer,
    ) -> Result<f32, ComputeError> {
        let rows = labels.len();
        span(logits.len, 0, rows * cols, "softmax logits")?;
        span(grad.len, 0, rows * cols, "softmax grad")?;
        let label_buf = self.labels(labels, cols)?;
        let losses = self.alloc(rows)?;
        let params = [word(rows, "softmax")?, word(cols, "softmax")?, 0, 0];
        let buffers = [(1, &logits.buffer), (2, &label_buf), (3, &grad.buffer), (4, &losses.buffer)];
        self.dispatch_1d(Kernel::SoftmaxCrossEntropy, &params, &buffers, rows);
        let losses = self.download(&losses.buffer, 0, rows)?;
        Ok((losses.iter().map(|&l| f64::from(l)).sum::<f64>() / rows as f64) as f32)
    }

    fn evaluate_logits(
        &self,
        logits: &WgpuBuffer,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError> {
        let rows = labels.len();
        if rows == 0 {
            return Ok((0.0, 0));
        }
        span(logits.len, 0, rows * cols, "evaluate logits")?;
        let label_buf = self.labels(labels, cols)?;
        let out = self.alloc(2 * rows)?;
        let params = [word(rows, "evaluate")?, word(cols, "evaluate")?, 0, 0];
        let buffers = [(1, &logits.buffer), (2, &label_buf), (4, &out.buffer)];
        self.dispatch_1d(Kernel::EvaluateLogits, &params, &buffers, rows);
        let out = self.download(&out.buffer, 0, 2 * rows)?;
        let loss = out.iter().step_by(2).map(|&l| f64::from(l)).sum();
        let correct = out.iter().skip(1).step_by(2).filter(|&&c| c != 0.0).count();
        Ok((loss, correct))
    }

    fn im2col(&self, conv: Conv2d, x: &WgpuBuffer, col: &mut WgpuBuffer) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        span(x.len, 0, nx, "im2col x")?;
        span(col.len, 0, ncol, "im2col col")?;
        let rows = conv.rows()?;
        let params = self.image_params(conv.input, conv.window, conv.output_size()?, rows, 0)?;
        self.dispatch_1d(Kernel::Im2col, &params, &[(1, &x.buffer), (2, &col.buffer)], rows);
        Ok(())
    }

    fn col2im(&self, conv: Conv2d, col: &WgpuBuffer, dx: &mut WgpuBuffer) -> Result<(), ComputeError> {
        let (nx, ncol) = conv_sizes(conv)?;
        span(col.len, 0, ncol, "col2im col")?;
        span(dx.len, 0, nx, "col2im dx")?;
        let pixels = nx / conv.input.channels.max(1);
        let params = self.image_params(conv.input, conv.window, conv.output_size()?, pixels, 0)?;
        self.dispatch_1d(Kernel::Col2im, &params, &[(1, &col.buffer), (2, &dx.buffer)], pixels);
        Ok(())
    }

    fn pool(&self, pool: Pool2d, x: &WgpuBuffer, y: &mut WgpuBuffer) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        span(x.len, 0, nx, "pool x")?;
        span(y.len, 0, ny, "pool y")?;
        let out = pool.output()?;
        let kind = u32::from(pool.kind == PoolKind::Avg);
        let pixels = ny / out.channels.max(1);
        let params = self.image_params(pool.input, pool.window, (out.height, out.width), pixels, kind)?;
        self.dispatch_1d(Kernel::Pool, &params, &[(1, &x.buffer), (3, &y.buffer)], pixels);
        Ok(())
    }

    fn pool_backward(
        &self,
        pool: Pool2d,
        x: &WgpuBuffer,
        dy: &WgpuBuffer,
        dx: &mut WgpuBuffer,
    ) -> Result<(), ComputeError> {
        let (nx, ny) = pool_sizes(pool)?;
        span(x.len, 0, nx, "pool_backward x")?;
        span(dy.len, 0, ny, "pool_backward dy")?;
        span(dx.len, 0, nx, "pool_backward dx")?;
        let out = pool.output()?;
        let kind = u32::from(pool.kind == PoolKind::Avg);
        let pixels = nx / pool.input.channels.max(1);
        let params = self.image_params(pool.input, pool.window, (out.height, out.width), pixels, kind)?;
        let buffers = [(1, &x.buffer), (2, &dy.buffer), (3, &dx.buffer)];
        self.dispatch_1d(Kernel::PoolBackward, &params, &buffers, pixels);
        Ok(())
    }

    fn axpy(&self, alpha: f32, x: &WgpuBuffer, y: &mut WgpuBuffer, len: usize) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Axpy, len, (alpha, 0.0), Some(x), y, None)
    }

    fn momentum(
        &self,
        r: Rate,
        grad: &WgpuBuffer,
        velocity: &mut WgpuBuffer,
        weights: &mut WgpuBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Momentum, len, (r.lr, r.momentum), Some(grad), velocity, Some(weights))
    }

    fn nesterov(
        &self,
        r: Rate,
        grad: &WgpuBuffer,
        velocity: &mut WgpuBuffer,
        weights: &mut WgpuBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::Nesterov, len, (r.lr, r.momentum), Some(grad), velocity, Some(weights))
    }

    fn adamw(
        &self,
        step: Adam,
        grad: &WgpuBuffer,
        (m, v): (&mut WgpuBuffer, &mut WgpuBuffer),
        weights: &mut WgpuBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        for b in [grad, &*m, &*v, &*weights] {
            span(b.len, 0, len, "adamw")?;
        }
        let (c1, c2) = step.corrections();
        let scalars = [step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, c1, c2];
        let mut params = vec![word(len, "adamw")?, 0, 0, 0];
        params.extend(scalars.map(f32::to_bits));
        let buffers = [(1, &grad.buffer), (2, &m.buffer), (3, &v.buffer), (4, &weights.buffer)];
        self.dispatch_1d(Kernel::AdamW, &params, &buffers, len);
        Ok(())
    }

    fn elastic_pull(
        &self,
        alpha: f32,
        toward: &WgpuBuffer,
        x: &mut WgpuBuffer,
        len: usize,
    ) -> Result<(), ComputeError> {
        self.elementwise(Kernel::ElasticPull, len, (alpha, 0.0), Some(toward), x, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_few_tiles_over_a_long_k_split_it() {
        // The CNN's first weight gradient: one tile, k = 32 images × 28 × 28.
        let k_len = gemm_k_len(1, 25_088);
        assert_eq!(k_len % 16, 0);
        assert!((SPLIT_K_MIN..25_088).contains(&k_len), "{k_len}");
        assert_eq!(25_088usize.div_ceil(k_len), 98);
        // Enough tiles, or too short a k: one slice.
        assert_eq!(gemm_k_len(SPLIT_K_GROUPS, 25_088), 25_088);
        assert_eq!(gemm_k_len(1, 2 * SPLIT_K_MIN - 1), 2 * SPLIT_K_MIN - 1);
        assert_eq!(gemm_k_len(0, 0), 0);
    }
}
