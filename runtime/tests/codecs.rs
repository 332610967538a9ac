//! Compressed exchanges train, end to end: sparse `topk` gradients with error feedback against
//! `f32`, in SGD and in DiLoCo, in one process.

mod common;

use common::{short_run, summary};

/// (final test accuracy, payload bytes per step) of a short run with `settings`.
fn run(dir: &std::path::Path, settings: &[&str]) -> (f64, f64) {
    short_run(dir, settings);
    let s = summary(dir);
    (s["final_test_accuracy"].as_f64().unwrap(), s["payload_bytes_per_step"].as_f64().unwrap())
}

#[test]
fn topk_gradients_train_at_a_fraction_of_the_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let sgd = ["protocol.kind=async", "cluster.learners=2", "cluster.shards=1"];
    let (dense, dense_bytes) = run(&tmp.path().join("f32"), &sgd);
    let topk: Vec<&str> =
        sgd.iter().copied().chain(["transport.gradient_codec=topk", "transport.topk_fraction=0.1"]).collect();
    let (sparse, sparse_bytes) = run(&tmp.path().join("topk"), &topk);
    // Weights come down whole (4 bytes a value); gradients go up as about a tenth of the values
    // at 2.25 bytes each plus a scale per block: about 0.58 of the f32 run's bytes.
    assert!(sparse_bytes < 0.6 * dense_bytes, "{sparse_bytes} vs {dense_bytes}");
    assert!(sparse > 0.8 && sparse > dense - 0.05, "topk {sparse}, f32 {dense}");

    // DiLoCo's pseudo-gradients, sparse: a sync run is deterministic (f32: 0.858, 10%: 0.840).
    let diloco = ["protocol.kind=diloco", "cluster.learners=2", "cluster.shards=1"];
    let (dense, _) = run(&tmp.path().join("diloco-f32"), &diloco);
    let topk: Vec<&str> = diloco
        .iter()
        .copied()
        .chain(["transport.gradient_codec=topk", "transport.topk_fraction=0.1"])
        .collect();
    let (sparse, _) = run(&tmp.path().join("diloco-topk"), &topk);
    assert!(sparse > 0.8 && sparse > dense - 0.05, "DiLoCo: topk {sparse}, f32 {dense}");
}
