//! The compute suite: the CPU backend's GEMM against numpy's (OpenBLAS) on the same machine,
//! through `bench/gemm.py`, and the training-step throughput of the MLP and the CNN on every
//! backend present.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rudra_actors::TrainingData;
use rudra_compute::{Backend, CpuBackend, Device, Gemm, ModelSpec};

use super::training::{Span, sgd_loop};
use super::{BenchRow, median};
use crate::RuntimeError;

/// Side of the square GEMM.
const GEMM_SIZE: usize = 1024;
/// Examples per training step.
const BATCH: usize = 32;
/// Learning rate of the training steps.
const LR: f32 = 0.05;
/// Each throughput measurement takes at least this many steps and this long.
const SPAN: Span = Span { steps: 3, time: Duration::from_secs(2) };

/// The numpy script, found from the working directory or the source tree.
fn script() -> PathBuf {
    let here = Path::new("bench/gemm.py");
    if here.exists() {
        here.to_owned()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/gemm.py")
    }
}

/// numpy's GEMM in GFLOP/s with `threads` BLAS threads (`None`: the library's choice), and
/// the name of the BLAS library.
fn numpy_gemm(threads: Option<usize>, repeats: usize) -> Result<(f64, String), RuntimeError> {
    let path = script();
    let fail = |message: String| RuntimeError::Input { path: path.clone(), message };
    let mut cmd = Command::new("python3");
    cmd.arg(&path).args(["--size", &GEMM_SIZE.to_string(), "--repeats", &repeats.to_string()]);
    if let Some(n) = threads {
        for var in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            cmd.env(var, n.to_string());
        }
    }
    let out = cmd.output().map_err(|e| fail(format!("cannot run python3 ({e}); install Python 3")))?;
    if !out.status.success() {
        return Err(fail(format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| fail(format!("printed {line:?}, not its JSON line: {e}")))?;
    let gflops = v["gflops"].as_f64().ok_or_else(|| fail(format!("printed no gflops: {line}")))?;
    Ok((gflops, v["blas"].as_str().unwrap_or("unknown BLAS").to_owned()))
}

/// The CPU backend's GEMM in GFLOP/s: the median of `repeats`.
fn cpu_gemm(repeats: usize) -> Result<f64, RuntimeError> {
    let n = GEMM_SIZE;
    let fill = |seed: f32| Arc::new((0..n * n).map(|i| ((i as f32) * seed).sin()).collect::<Vec<f32>>());
    let (a, b, mut c) = (fill(0.37), fill(0.11), Arc::new(vec![0.0; n * n]));
    let g = Gemm { m: n, n, k: n, a_t: false, b_t: false, alpha: 1.0, beta: 0.0 };
    CpuBackend.gemm(g, (&a, 0), (&b, 0), (&mut c, 0))?;
    let mut rates = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        CpuBackend.gemm(g, (&a, 0), (&b, 0), (&mut c, 0))?;
        rates.push(2.0 * (n * n * n) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    Ok(median(rates))
}

fn gemm_rows(repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let (one, blas) = numpy_gemm(Some(1), repeats)?;
    let (all, _) = numpy_gemm(None, repeats)?;
    let cpu = cpu_gemm(repeats)?;
    let base = format!("numpy ({blas}), 1 thread");
    let row = |name: String, value: f64| BenchRow {
        name,
        value,
        unit: "GFLOP/s",
        ratio: Some((value / one, base.clone())),
    };
    Ok(vec![
        row(format!("sgemm {GEMM_SIZE}³ numpy, 1 thread"), one),
        row(
            format!("sgemm {GEMM_SIZE}³ cpu backend ({}), 1 thread", rudra_compute::cpu::gemm_kernels()),
            cpu,
        ),
        row(format!("sgemm {GEMM_SIZE}³ numpy, all threads"), all),
    ])
}

/// Measure every setting `repeats` times: the GEMMs, then the MLP and CNN training steps on
/// every backend present (ratios to the CPU backend).
pub fn run(data: &TrainingData, repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let mut rows = gemm_rows(repeats)?;
    let (devices, missing) = Device::present();
    for (kind, reason) in missing {
        tracing::info!("not measured on {kind}: {reason}");
    }
    let models = [("mlp 784-256-10", ModelSpec::dense(784, vec![256], 10)), ("cnn", ModelSpec::cnn())];
    for (name, spec) in models {
        let mut cpu = None;
        for device in &devices {
            let rates = (0..repeats)
                .map(|_| sgd_loop(device, &spec, &data.train, (BATCH, LR, 1), SPAN))
                .collect::<Result<Vec<f64>, _>>()?;
            let rate = median(rates);
            tracing::info!("{name} on {}: {rate:.0} samples/s", device.description());
            let base = *cpu.get_or_insert(rate);
            rows.push(BenchRow {
                name: format!("{name} step, μ={BATCH}, {}", device.description()),
                value: rate,
                unit: "samples/s",
                ratio: Some((rate / base, format!("{name} on cpu"))),
            });
        }
    }
    Ok(rows)
}
