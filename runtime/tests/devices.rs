//! `compute.device`: the CNN learns a subset of MNIST on the GPU backends exactly as on the
//! CPU (a short version of `configs/cnn.toml`), and a device that cannot be opened stops the
//! run with a clear error. The GPU runs are ignored unless asked for (`--ignored`): CI runs the
//! wgpu one on lavapipe; the CUDA one needs a device.

mod common;

use std::path::Path;

use common::{short_run, summary};

/// The settings of ten deterministic SGD steps (one learner, hardsync) of the CNN on 320
/// MNIST examples, evaluated on 500 test examples, on `device`.
fn cnn_steps(device: &str) -> Vec<String> {
    [
        &format!("compute.device={device}"),
        "training.model=cnn",
        "cluster.learners=1",
        "cluster.shards=1",
        "protocol.kind=hardsync",
        "training.train_examples=320",
        "training.test_examples=500",
        "training.epochs=1",
        "training.learning_rate=0.1",
    ]
    .map(String::from)
    .to_vec()
}

fn accuracy(dir: &Path) -> f64 {
    summary(dir)["final_test_accuracy"].as_f64().unwrap()
}

/// The device's accuracy equals the CPU's (the same steps, up to rounding), well above chance.
fn matches_the_cpu(device: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cpu_dir = tmp.path().join("cpu");
    short_run(&cpu_dir, &cnn_steps("cpu").iter().map(String::as_str).collect::<Vec<_>>());
    let cpu = accuracy(&cpu_dir);
    assert!(cpu > 0.3, "ten steps lift the CNN well above chance, not to {cpu}");
    let dir = tmp.path().join(device);
    short_run(&dir, &cnn_steps(device).iter().map(String::as_str).collect::<Vec<_>>());
    let acc = accuracy(&dir);
    assert!((acc - cpu).abs() <= 0.01, "{device}: test accuracy {acc}, the CPU's {cpu}");
}

#[test]
#[ignore = "needs a wgpu adapter (CI runs it on Mesa's lavapipe)"]
fn cnn_learns_on_wgpu_as_on_the_cpu() {
    matches_the_cpu("wgpu");
}

#[test]
#[ignore = "needs a CUDA device"]
fn cnn_learns_on_cuda_as_on_the_cpu() {
    matches_the_cpu("cuda");
}

/// A device that cannot be opened stops the run at once with exit code 2, naming the
/// setting to change. CUDA is hidden from the run, so the device is absent on every machine.
#[test]
fn an_absent_device_stops_the_run_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["local".to_owned(), "--out".into(), tmp.path().to_str().unwrap().into()];
    for s in cnn_steps("cuda") {
        args.extend(["--set".into(), s]);
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rudra-node"))
        .args(&args)
        .env("RUST_LOG", "warn")
        .env("CUDA_VISIBLE_DEVICES", "")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the cuda backend is not available"), "{stderr}");
    assert!(stderr.contains("compute.device"), "the message says what to change: {stderr}");
}
