//! The public edge of the backends: [`Device`], one enum over every backend, and
//! [`Storage`], one enum over their buffers. A [`Model<Device>`](crate::Model) runs on
//! whichever backend was opened; nothing outside this crate knows which.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::backend::{Adam, Conv2d, Pool2d, Rate};
use crate::{Backend, ComputeError, CpuBackend, CudaBackend, Gemm, WgpuBackend, cuda_backend, wgpu_backend};

/// Which device to compute on, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The best present: a CUDA device, else a hardware wgpu adapter, else the CPU.
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
    /// Any adapter wgpu finds (Vulkan, Metal, DX12, GL), software ones included.
    Wgpu,
}

impl DeviceKind {
    /// Every kind, in the order of their names in messages.
    pub const ALL: [Self; 4] = [Self::Auto, Self::Cpu, Self::Cuda, Self::Wgpu];

    /// The configuration name: `auto`, `cpu`, `cuda` or `wgpu`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            format!("{s:?} is not one of {}", names.join(", "))
        })
    }
}

/// A backend, chosen at run time. Cloning shares the device (its queue, streams, compiled
/// kernels) rather than opening another.
#[derive(Clone, Debug)]
pub enum Device {
    /// The CPU reference backend.
    Cpu(CpuBackend),
    /// A wgpu adapter.
    Wgpu(WgpuBackend),
    /// A CUDA device.
    Cuda(CudaBackend),
}

/// A buffer of one of [`Device`]'s backends.
pub enum Storage {
    /// Host memory.
    Cpu(Arc<Vec<f32>>),
    /// A wgpu buffer.
    Wgpu(wgpu_backend::WgpuBuffer),
    /// CUDA device memory.
    Cuda(cuda_backend::CudaBuffer),
}

impl Storage {
    fn backend(&self) -> &'static str {
        match self {
            Self::Cpu(_) => "cpu",
            Self::Wgpu(_) => "wgpu",
            Self::Cuda(_) => "cuda",
        }
    }
}

impl Device {
    /// Open the device `kind` names. `Auto` tries CUDA, then a wgpu adapter that is not a
    /// software renderer, then the CPU, and logs what it picked and why.
    pub fn open(kind: DeviceKind) -> Result<Self, ComputeError> {
        match kind {
            DeviceKind::Cpu => Ok(Self::Cpu(CpuBackend)),
            DeviceKind::Cuda => CudaBackend::new().map(Self::Cuda),
            DeviceKind::Wgpu => WgpuBackend::new().map(Self::Wgpu),
            DeviceKind::Auto => Ok(Self::auto()),
        }
    }

    fn auto() -> Self {
        let cuda = match CudaBackend::new() {
            Ok(cuda) => {
                tracing::info!("compute.device = auto: using {}", cuda.description());
                return Self::Cuda(cuda);
            }
            Err(e) => e,
        };
        let wgpu = match WgpuBackend::new() {
            Ok(w) if !w.is_software() => {
                tracing::info!("compute.device = auto: no CUDA ({cuda}); using {}", w.description());
                return Self::Wgpu(w);
            }
            Ok(w) => format!("{} is a software renderer, slower than the CPU backend", w.description()),
            Err(e) => e.to_string(),
        };
        tracing::info!("compute.device = auto: using the CPU (no CUDA: {cuda}; no wgpu: {wgpu})");
        Self::Cpu(CpuBackend)
    }

    /// Every backend that can be opened here, the CPU first, with the reason for each that
    /// cannot. Software wgpu adapters count as present.
    #[must_use]
    pub fn present() -> (Vec<Self>, Vec<(DeviceKind, ComputeError)>) {
        let mut open = vec![Self::Cpu(CpuBackend)];
        let mut missing = Vec::new();
        for kind in [DeviceKind::Wgpu, DeviceKind::Cuda] {
            match Self::open(kind) {
                Ok(d) => open.push(d),
                Err(e) => missing.push((kind, e)),
            }
        }
        (open, missing)
    }

    /// What the backend runs on, e.g. `wgpu: llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    #[must_use]
    pub fn description(&self) -> String {
        match self {
            Self::Cpu(_) => "cpu".into(),
            Self::Wgpu(w) => w.description(),
            Self::Cuda(c) => c.description(),
        }
    }
}

/// A backend whose buffers are one variant of [`Storage`].
trait Member: Backend {
    fn get(s: &Storage) -> Option<&Self::Buffer>;
    fn get_mut(s: &mut Storage) -> Option<&mut Self::Buffer>;
    fn wrap(b: Self::Buffer) -> Storage;
}

macro_rules! member {
    ($backend:ty, $variant:ident) => {
        impl Member for $backend {
            fn get(s: &Storage) -> Option<&Self::Buffer> {
                match s {
                    Storage::$variant(b) => Some(b),
                    _ => None,
                }
            }
            fn get_mut(s: &mut Storage) -> Option<&mut Self::Buffer> {
                match s {
                    Storage::$variant(b) => Some(b),
                    _ => None,
                }
            }
            fn wrap(b: Self::Buffer) -> Storage {
                Storage::$variant(b)
            }
        }
    };
}

member!(CpuBackend, Cpu);
member!(WgpuBackend, Wgpu);
member!(CudaBackend, Cuda);

fn mismatch<B: Member>(b: &B, kind: &str) -> ComputeError {
    ComputeError::Shape(format!("a {kind} buffer was passed to the {} backend", b.name()))
}

/// `s` as a buffer of `b`'s backend.
fn buf<'a, B: Member>(b: &B, s: &'a Storage) -> Result<&'a B::Buffer, ComputeError> {
    B::get(s).ok_or_else(|| mismatch(b, s.backend()))
}

/// `s` as a mutable buffer of `b`'s backend.
fn buf_mut<'a, B: Member>(b: &B, s: &'a mut Storage) -> Result<&'a mut B::Buffer, ComputeError> {
    let kind = s.backend();
    B::get_mut(s).ok_or_else(|| mismatch(b, kind))
}

/// Run `$body` with `$b` bound to the backend inside `$device`, whichever it is.
macro_rules! dispatch {
    ($device:expr, $b:ident => $body:expr) => {
        match $device {
            Device::Cpu($b) => $body,
            Device::Wgpu($b) => $body,
            Device::Cuda($b) => $body,
        }
    };
}

fn wrap<B: Member>(_: &B, b: B::Buffer) -> Storage {
    B::wrap(b)
}

impl Backend for Device {
    type Buffer = Storage;

    fn name(&self) -> &'static str {
        dispatch!(self, b => b.name())
    }

    fn alloc(&self, len: usize) -> Result<Storage, ComputeError> {
        dispatch!(self, b => Ok(wrap(b, b.alloc(len)?)))
    }

    fn write(&self, dst: &mut Storage, offset: usize, src: &[f32]) -> Result<(), ComputeError> {
        dispatch!(self, b => b.write(buf_mut(b, dst)?, offset, src))
    }

    fn read(&self, src: &Storage, offset: usize, dst: &mut [f32]) -> Result<(), ComputeError> {
        dispatch!(self, b => b.read(buf(b, src)?, offset, dst))
    }

    fn view_host(&self, host: &Arc<Vec<f32>>) -> Option<Storage> {
        dispatch!(self, b => b.view_host(host).map(|v| wrap(b, v)))
    }

    fn take(&self, src: &mut Storage, host: &mut Vec<f32>) -> Result<(), ComputeError> {
        dispatch!(self, b => b.take(buf_mut(b, src)?, host))
    }

    fn gemm(
        &self,
        spec: Gemm,
        (a, ao): (&Storage, usize),
        (bb, bo): (&Storage, usize),
        (c, co): (&mut Storage, usize),
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.gemm(spec, (buf(b, a)?, ao), (buf(b, bb)?, bo), (buf_mut(b, c)?, co)))
    }

    fn add_bias(
        &self,
        x: &mut Storage,
        rows: usize,
        cols: usize,
        (bias, bo): (&Storage, usize),
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.add_bias(buf_mut(b, x)?, rows, cols, (buf(b, bias)?, bo)))
    }

    fn relu(&self, x: &mut Storage, len: usize) -> Result<(), ComputeError> {
        dispatch!(self, b => b.relu(buf_mut(b, x)?, len))
    }

    fn relu_backward(
        &self,
        grad: &mut Storage,
        activation: &Storage,
        len: usize,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.relu_backward(buf_mut(b, grad)?, buf(b, activation)?, len))
    }

    fn sum_rows(
        &self,
        x: &Storage,
        rows: usize,
        cols: usize,
        (out, oo): (&mut Storage, usize),
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.sum_rows(buf(b, x)?, rows, cols, (buf_mut(b, out)?, oo)))
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Storage,
        labels: &[u8],
        cols: usize,
        grad: &mut Storage,
    ) -> Result<f32, ComputeError> {
        dispatch!(self, b => b.softmax_cross_entropy(buf(b, logits)?, labels, cols, buf_mut(b, grad)?))
    }

    fn evaluate_logits(
        &self,
        logits: &Storage,
        labels: &[u8],
        cols: usize,
    ) -> Result<(f64, usize), ComputeError> {
        dispatch!(self, b => b.evaluate_logits(buf(b, logits)?, labels, cols))
    }

    fn im2col(&self, conv: Conv2d, x: &Storage, col: &mut Storage) -> Result<(), ComputeError> {
        dispatch!(self, b => b.im2col(conv, buf(b, x)?, buf_mut(b, col)?))
    }

    fn col2im(&self, conv: Conv2d, col: &Storage, dx: &mut Storage) -> Result<(), ComputeError> {
        dispatch!(self, b => b.col2im(conv, buf(b, col)?, buf_mut(b, dx)?))
    }

    fn pool(&self, pool: Pool2d, x: &Storage, y: &mut Storage) -> Result<(), ComputeError> {
        dispatch!(self, b => b.pool(pool, buf(b, x)?, buf_mut(b, y)?))
    }

    fn pool_backward(
        &self,
        pool: Pool2d,
        x: &Storage,
        dy: &Storage,
        dx: &mut Storage,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.pool_backward(pool, buf(b, x)?, buf(b, dy)?, buf_mut(b, dx)?))
    }

    fn axpy(&self, alpha: f32, x: &Storage, y: &mut Storage, len: usize) -> Result<(), ComputeError> {
        dispatch!(self, b => b.axpy(alpha, buf(b, x)?, buf_mut(b, y)?, len))
    }

    fn momentum(
        &self,
        rate: Rate,
        grad: &Storage,
        velocity: &mut Storage,
        weights: &mut Storage,
        len: usize,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.momentum(rate, buf(b, grad)?, buf_mut(b, velocity)?, buf_mut(b, weights)?, len))
    }

    fn nesterov(
        &self,
        rate: Rate,
        grad: &Storage,
        velocity: &mut Storage,
        weights: &mut Storage,
        len: usize,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.nesterov(rate, buf(b, grad)?, buf_mut(b, velocity)?, buf_mut(b, weights)?, len))
    }

    fn adamw(
        &self,
        step: Adam,
        grad: &Storage,
        (m, v): (&mut Storage, &mut Storage),
        weights: &mut Storage,
        len: usize,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.adamw(step, buf(b, grad)?, (buf_mut(b, m)?, buf_mut(b, v)?), buf_mut(b, weights)?, len))
    }

    fn elastic_pull(
        &self,
        alpha: f32,
        toward: &Storage,
        x: &mut Storage,
        len: usize,
    ) -> Result<(), ComputeError> {
        dispatch!(self, b => b.elastic_pull(alpha, buf(b, toward)?, buf_mut(b, x)?, len))
    }
}
