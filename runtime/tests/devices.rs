//! `compute.device`: the CNN learns a subset of MNIST on the GPU backends exactly as on the
//! CPU (a short version of `configs/cnn.toml`), and a device that cannot be opened stops the
//! run with a clear error. A backend that is not present is skipped with the reason, unless
//! `RUDRA_REQUIRE_BACKENDS` (e.g. `wgpu`) names it.

mod common;

use std::path::Path;

use common::{node, short_run, summary};

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

fn required(device: &str) -> bool {
    std::env::var("RUDRA_REQUIRE_BACKENDS").unwrap_or_default().split(',').any(|r| r.trim() == device)
}

/// The device's accuracy equals the CPU's (the same steps, up to rounding), well above chance;
/// or, where the device is absent, the run stops with exit code 2 and says why.
fn matches_the_cpu(device: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cpu_dir = tmp.path().join("cpu");
    short_run(&cpu_dir, &cnn_steps("cpu").iter().map(String::as_str).collect::<Vec<_>>());
    let cpu = accuracy(&cpu_dir);
    assert!(cpu > 0.3, "ten steps lift the CNN well above chance, not to {cpu}");
    let dir = tmp.path().join(device);
    let mut args = vec!["local".to_owned(), "--out".into(), dir.to_str().unwrap().into()];
    for s in cnn_steps(device) {
        args.extend(["--set".into(), s]);
    }
    let o = node(&args.iter().map(String::as_str).collect::<Vec<_>>());
    if o.status.success() {
        let acc = accuracy(&dir);
        assert!((acc - cpu).abs() <= 0.01, "{device}: test accuracy {acc}, the CPU's {cpu}");
        return;
    }
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!required(device), "{device} is required but failed: {stderr}");
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("the {device} backend is not available")), "{stderr}");
    assert!(stderr.contains("compute.device"), "the message says what to change: {stderr}");
    eprintln!("skipped {device}: {}", stderr.trim());
}

#[test]
fn cnn_learns_on_wgpu_as_on_the_cpu() {
    matches_the_cpu("wgpu");
}

#[test]
fn cnn_learns_on_cuda_as_on_the_cpu_or_says_why_not() {
    matches_the_cpu("cuda");
}
