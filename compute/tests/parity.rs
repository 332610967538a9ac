//! Every backend operation, on every backend present, against the CPU reference: one test
//! body per operation. The comparisons need a GPU backend, so they are ignored unless asked for
//! (`cargo test -p rudra-compute --test parity -- --ignored`; CI runs them on Mesa's
//! lavapipe). A backend that cannot be opened is left out with its reason printed, unless
//! `RUDRA_REQUIRE_BACKENDS` (a comma-separated list such as `wgpu,cuda`) names it; with none
//! open at all the tests fail, since they would compare nothing.

use std::sync::{Arc, OnceLock};

use rudra_compute::{
    Adam, Backend, Conv2d, ConvLayer, ConvSpec, CpuBackend, Device, DeviceKind, Gemm, Images, Model,
    ModelSpec, Pool2d, PoolKind, Rate, Storage, Window,
};

/// The devices to compare with the CPU, opened once for all tests.
fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let (open, missing) = Device::present();
        let required = std::env::var("RUDRA_REQUIRE_BACKENDS").unwrap_or_default();
        for (kind, reason) in missing {
            assert!(
                !required.split(',').any(|r| r.trim() == kind.name()),
                "{kind} is required by RUDRA_REQUIRE_BACKENDS but cannot be opened: {reason}"
            );
            eprintln!("parity: skipping {kind}: {reason}");
        }
        let others: Vec<Device> = open.into_iter().filter(|d| !matches!(d, Device::Cpu(_))).collect();
        assert!(!others.is_empty(), "no GPU backend can be opened here: nothing to compare with the CPU");
        others
    })
}

/// Values in `[-1, 1]` that differ from test to test.
fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + 1.0) * seed).sin()).collect()
}

fn upload(d: &Device, v: &[f32]) -> Storage {
    let mut s = d.alloc(v.len()).unwrap();
    d.write(&mut s, 0, v).unwrap();
    s
}

fn download(d: &Device, s: &Storage, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    d.read(s, 0, &mut v).unwrap();
    v
}

/// Run `op` on the CPU and on every other device; each result must match the CPU's within
/// `tol` relative to the largest magnitude of the CPU's result (at least 1).
fn check(what: &str, tol: f32, op: impl Fn(&Device) -> Vec<f32>) {
    let want = op(&Device::Cpu(CpuBackend));
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for d in devices() {
        let got = op(d);
        assert_eq!(got.len(), want.len(), "{what} on {}", d.name());
        let (worst, at) = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / scale)
            .enumerate()
            .fold((0.0f32, 0), |best, (i, e)| if e > best.0 || e.is_nan() { (e, i) } else { best });
        assert!(
            worst <= tol,
            "{what} on {}: element {at} is {} where the CPU has {} (relative error {worst}, tolerance {tol})",
            d.description(),
            got[at],
            want[at]
        );
    }
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn gemm_with_every_transpose_and_offsets() {
    // Relative tolerance 1e-5: sums of up to 3000 products of values in [-1, 1]. The last
    // shape has one output tile over a long k, which devices may split across workgroups.
    for (m, n, k) in [(1, 1, 1), (37, 29, 45), (130, 70, 300), (64, 64, 64), (25, 16, 3000)] {
        for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
            for beta in [0.0, 0.5] {
                let spec = Gemm { m, n, k, a_t, b_t, alpha: 1.5, beta };
                check(&format!("gemm {spec:?}"), 1e-5, |d| {
                    let a = upload(d, &values(m * k + 3, 0.37));
                    let b = upload(d, &values(k * n + 5, 0.11));
                    let mut c = upload(d, &values(m * n + 7, 0.23));
                    d.gemm(spec, (&a, 3), (&b, 5), (&mut c, 7)).unwrap();
                    download(d, &c, m * n + 7)
                });
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn bias_relu_and_column_sums() {
    // Exact operations (the bias: 1e-6) except the column sums of 300 rows, which other
    // devices add in another order: 1e-5.
    let (rows, cols) = (300, 17);
    check("add_bias", 1e-6, |d| {
        let mut x = upload(d, &values(rows * cols, 0.3));
        d.add_bias(&mut x, rows, cols, (&upload(d, &values(cols + 2, 0.7)), 2)).unwrap();
        download(d, &x, rows * cols)
    });
    check("relu", 0.0, |d| {
        let mut x = upload(d, &values(rows * cols + 1, 0.3));
        d.relu(&mut x, rows * cols).unwrap();
        download(d, &x, rows * cols + 1)
    });
    check("relu_backward", 0.0, |d| {
        let mut g = upload(d, &values(rows * cols, 0.9));
        d.relu_backward(&mut g, &upload(d, &values(rows * cols, 0.3)), rows * cols).unwrap();
        download(d, &g, rows * cols)
    });
    check("sum_rows", 1e-5, |d| {
        let mut out = upload(d, &values(cols + 4, 0.5));
        d.sum_rows(&upload(d, &values(rows * cols, 0.3)), rows, cols, (&mut out, 4)).unwrap();
        download(d, &out, cols + 4)
    });
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn softmax_cross_entropy_and_evaluation() {
    // Exponentials and logarithms differ in the last bits between devices: 1e-5.
    let (rows, cols) = (67, 10);
    let labels: Vec<u8> = (0..rows).map(|r| (r * 7 % cols) as u8).collect();
    let logits: Vec<f32> = values(rows * cols, 0.77).iter().map(|v| 8.0 * v).collect();
    check("softmax_cross_entropy", 1e-5, |d| {
        let mut grad = d.alloc(rows * cols).unwrap();
        let loss = d.softmax_cross_entropy(&upload(d, &logits), &labels, cols, &mut grad).unwrap();
        let mut out = download(d, &grad, rows * cols);
        out.push(loss);
        out
    });
    check("evaluate_logits", 1e-5, |d| {
        let (loss, correct) = d.evaluate_logits(&upload(d, &logits), &labels, cols).unwrap();
        vec![loss as f32, correct as f32]
    });
}

fn convs() -> [Conv2d; 3] {
    let conv = |batch, channels, height, width, size, stride, pad| Conv2d {
        input: Images { batch, channels, height, width },
        window: Window { size, stride, pad },
    };
    [conv(2, 3, 9, 7, 5, 1, 2), conv(3, 1, 8, 8, 3, 2, 0), conv(1, 4, 5, 6, 3, 1, 1)]
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn im2col_and_its_adjoint() {
    // im2col copies exactly; col2im sums at most 25 entries: 1e-6.
    for conv in convs() {
        let (nx, ncol) = (conv.input.len(), conv.rows().unwrap() * conv.patch());
        check(&format!("im2col {conv:?}"), 0.0, |d| {
            let mut col = upload(d, &vec![f32::NAN; ncol]);
            d.im2col(conv, &upload(d, &values(nx, 0.41)), &mut col).unwrap();
            download(d, &col, ncol)
        });
        check(&format!("col2im {conv:?}"), 1e-6, |d| {
            let mut dx = upload(d, &vec![f32::NAN; nx]);
            d.col2im(conv, &upload(d, &values(ncol, 0.29)), &mut dx).unwrap();
            download(d, &dx, nx)
        });
    }
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn pooling_and_its_gradient() {
    // Maxima route exactly; means of at most 9 values: 1e-6.
    let input = Images { batch: 2, channels: 5, height: 9, width: 8 };
    for kind in [PoolKind::Max, PoolKind::Avg] {
        for (size, stride, pad) in [(2, 2, 0), (3, 2, 1), (3, 1, 1)] {
            let pool = Pool2d { input, window: Window { size, stride, pad }, kind };
            let (nx, ny) = (input.len(), pool.output().unwrap().len());
            // Repeated values, so that ties in a window are common.
            let x: Vec<f32> = values(nx, 0.61).iter().map(|v| (v * 4.0).round()).collect();
            check(&format!("pool {pool:?}"), 1e-6, |d| {
                let mut y = d.alloc(ny).unwrap();
                d.pool(pool, &upload(d, &x), &mut y).unwrap();
                download(d, &y, ny)
            });
            check(&format!("pool_backward {pool:?}"), 1e-6, |d| {
                let mut dx = upload(d, &vec![f32::NAN; nx]);
                d.pool_backward(pool, &upload(d, &x), &upload(d, &values(ny, 0.37)), &mut dx).unwrap();
                download(d, &dx, nx)
            });
        }
    }
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn update_kernels() {
    // One or two multiply-adds per element: 1e-6.
    let len = 1000;
    let rate = Rate { lr: 0.05, momentum: 0.9 };
    check("axpy", 1e-6, |d| {
        let mut y = upload(d, &values(len, 0.3));
        d.axpy(-0.1, &upload(d, &values(len, 0.7)), &mut y, len - 1).unwrap();
        download(d, &y, len)
    });
    type Momentum = fn(
        &Device,
        Rate,
        &Storage,
        &mut Storage,
        &mut Storage,
        usize,
    ) -> Result<(), rudra_compute::ComputeError>;
    let rules: [(&str, Momentum); 2] = [
        ("momentum", |d, r, g, v, w, n| d.momentum(r, g, v, w, n)),
        ("nesterov", |d, r, g, v, w, n| d.nesterov(r, g, v, w, n)),
    ];
    for (name, rule) in rules {
        check(name, 1e-6, |d| {
            let (mut v, mut w) = (upload(d, &values(len, 0.2)), upload(d, &values(len, 0.3)));
            rule(d, rate, &upload(d, &values(len, 0.7)), &mut v, &mut w, len).unwrap();
            let mut out = download(d, &v, len);
            out.extend(download(d, &w, len));
            out
        });
    }
    // Several steps from a state of earlier ones, so the bias corrections change; a square
    // root and a division per element.
    let second_moment: Vec<f32> = values(len, 0.4).iter().map(|x| 0.1 * x * x).collect();
    check("adamw", 1e-5, |d| {
        let (mut m, mut v) = (upload(d, &values(len, 0.2)), upload(d, &second_moment));
        let mut w = upload(d, &values(len, 0.3));
        for t in 1..=3 {
            let step = Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, t };
            let g = upload(d, &values(len, 0.7 + t as f32));
            d.adamw(step, &g, (&mut m, &mut v), &mut w, len).unwrap();
        }
        [&m, &v, &w].into_iter().flat_map(|s| download(d, s, len)).collect()
    });
    check("elastic_pull", 1e-6, |d| {
        let mut x = upload(d, &values(len, 0.3));
        d.elastic_pull(0.3, &upload(d, &values(len, 0.8)), &mut x, len).unwrap();
        download(d, &x, len)
    });
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn bad_sizes_are_errors_on_every_backend() {
    let all = std::iter::once(Device::Cpu(CpuBackend)).chain(devices().iter().cloned());
    for d in all {
        let small = upload(&d, &[0.0; 8]);
        let mut c = upload(&d, &[0.0; 16]);
        let g = Gemm { m: 4, n: 4, k: 4, a_t: false, b_t: false, alpha: 1.0, beta: 0.0 };
        assert!(d.gemm(g, (&small, 0), (&small, 0), (&mut c, 0)).is_err(), "{}", d.name());
        assert!(d.softmax_cross_entropy(&small, &[0, 9], 4, &mut c).is_err(), "{}: label 9 of 4", d.name());
        assert!(d.relu(&mut c, 17).is_err(), "{}", d.name());
        let mut out = vec![0.0; 9];
        assert!(d.read(&small, 0, &mut out).is_err(), "{}", d.name());
        let pool = Pool2d {
            input: Images { batch: 1, channels: 1, height: 4, width: 4 },
            window: Window { size: 2, stride: 2, pad: 0 },
            kind: PoolKind::Max,
        };
        assert!(d.pool(pool, &small, &mut c).is_err(), "{}: 16 inputs from a buffer of 8", d.name());
        if !matches!(d, Device::Cpu(_)) {
            let mut cpu = upload(&Device::Cpu(CpuBackend), &[0.0; 8]);
            assert!(d.relu(&mut cpu, 8).is_err(), "a CPU buffer on {}", d.name());
            assert!(d.axpy(1.0, &cpu, &mut c, 8).is_err(), "a CPU buffer on {}", d.name());
        }
    }
}

/// A small network with every kind of stage: both poolings, padding, stride, hidden layer.
fn small_convnet() -> ModelSpec {
    let layer = |channels, size, pad, pool, pool_window| ConvLayer {
        channels,
        window: Window { size, stride: 1, pad },
        pool,
        pool_window,
    };
    let layers = vec![
        layer(6, 5, 2, PoolKind::Max, Window { size: 2, stride: 2, pad: 0 }),
        layer(8, 3, 1, PoolKind::Avg, Window { size: 3, stride: 2, pad: 1 }),
    ];
    let conv = ConvSpec::new(2, 12, 11, layers).unwrap();
    ModelSpec { inputs: conv.image().len(), conv: Some(conv), hidden: vec![12], classes: 5 }
}

#[test]
#[ignore = "needs a GPU backend: a wgpu adapter (CI: Mesa's lavapipe) or a CUDA device"]
fn model_loss_gradient_and_evaluation() {
    // A whole forward and backward pass: 1e-4 of the largest gradient entry.
    for spec in [ModelSpec::dense(20, vec![16, 8], 5), small_convnet(), ModelSpec::cnn()] {
        let rows = 6;
        let x: Vec<f32> = values(rows * spec.inputs, 0.13).iter().map(|v| v.abs()).collect();
        let labels: Vec<u8> = (0..rows).map(|r| (r % spec.classes) as u8).collect();
        let params = Arc::new(spec.init(11));
        check(&format!("model gradient {spec:?}"), 1e-4, |d| {
            let mut m = Model::new(d.clone(), spec.clone()).unwrap();
            let loss = m.loss_and_gradient_at(&params, &x, &labels).unwrap();
            let mut grad = vec![0.0; params.len()];
            m.take_gradient(&mut grad).unwrap();
            grad.push(loss);
            grad
        });
        check(&format!("model step and evaluation {spec:?}"), 1e-4, |d| {
            let mut m = Model::new(d.clone(), spec.clone()).unwrap();
            m.write_params(0, &params).unwrap();
            m.loss_and_gradient(&x, &labels).unwrap();
            m.apply_gradient(-0.5).unwrap();
            let (loss, correct) = m.evaluate(&x, &labels).unwrap();
            vec![loss as f32, correct as f32]
        });
    }
}

#[test]
fn device_kinds_parse_and_cpu_always_opens() {
    assert_eq!("wgpu".parse::<DeviceKind>(), Ok(DeviceKind::Wgpu));
    assert!("tpu".parse::<DeviceKind>().unwrap_err().contains("auto, cpu, cuda, wgpu"));
    assert!(matches!(Device::open(DeviceKind::Cpu), Ok(Device::Cpu(_))));
    assert!(Device::open(DeviceKind::Auto).is_ok(), "auto falls back to the CPU");
}
