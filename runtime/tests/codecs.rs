//! Compressed exchanges train, end to end: sparse `topk` gradients with error feedback against
//! `f32`, in SGD and in DiLoCo, in one process.

mod common;

use common::{short_run, summary};

/// (final test accuracy, payload bytes per step up, and down) of a short run with `settings`.
fn run(dir: &std::path::Path, settings: &[&str]) -> (f64, f64, f64) {
    short_run(dir, settings);
    let s = summary(dir);
    let number = |key: &str| s[key].as_f64().unwrap();
    (
        number("final_test_accuracy"),
        number("payload_bytes_up_per_step"),
        number("payload_bytes_down_per_step"),
    )
}

#[test]
fn topk_gradients_train_at_a_fraction_of_the_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let sgd = ["protocol.kind=async", "cluster.learners=2", "cluster.shards=1"];
    let (dense, dense_up, dense_down) = run(&tmp.path().join("f32"), &sgd);
    let topk: Vec<&str> =
        sgd.iter().copied().chain(["transport.gradient_codec=topk", "transport.topk_fraction=0.1"]).collect();
    let (sparse, sparse_up, sparse_down) = run(&tmp.path().join("topk"), &topk);
    // Up, 26 of each block of 256 values at 2.25 bytes, and a 4-byte scale: 0.061 of f32's 4
    // bytes a value. Down, the same f32 weights.
    let ratio = sparse_up / dense_up;
    assert!((0.055..0.065).contains(&ratio), "up: {sparse_up} vs {dense_up}");
    assert_eq!(sparse_down, dense_down, "weights travel whole either way");
    assert!(sparse > 0.8 && sparse > dense - 0.05, "topk {sparse}, f32 {dense}");

    // DiLoCo's pseudo-gradients, sparse: a sync run is deterministic (f32: 0.858, 10%: 0.840).
    let diloco = ["protocol.kind=diloco", "cluster.learners=2", "cluster.shards=1"];
    let (dense, _, _) = run(&tmp.path().join("diloco-f32"), &diloco);
    let topk: Vec<&str> = diloco
        .iter()
        .copied()
        .chain(["transport.gradient_codec=topk", "transport.topk_fraction=0.1"])
        .collect();
    let (sparse, _, _) = run(&tmp.path().join("diloco-topk"), &topk);
    assert!(sparse > 0.8 && sparse > dense - 0.05, "DiLoCo: topk {sparse}, f32 {dense}");
}
