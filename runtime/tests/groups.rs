//! Learner groups (Rudra-adv trees) through `rudra-node`: the bytes into a shard per update,
//! reported in `summary.json`; groups across processes, each group's aggregator a node of its
//! own; and where groups are refused.

mod common;

use std::path::Path;

use common::{node, short_run, short_run_with, summary, tensors};
use serde_json::Value;

#[test]
fn two_groups_of_two_halve_the_bytes_each_update_brings_the_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let hardsync = ["protocol.kind=hardsync", "cluster.learners=4", "cluster.shards=1"];
    let mut per_update = Vec::new();
    for groups in ["1", "2"] {
        let dir = tmp.path().join(groups);
        let set = format!("cluster.groups={groups}");
        short_run(&dir, &[&hardsync[..], &[set.as_str()]].concat());
        let s = summary(&dir);
        assert_eq!(s["groups"].as_u64().unwrap().to_string(), groups);
        assert_eq!(s["staleness"]["max"], 0, "{s}");
        assert!(s["final_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
        per_update.push(s["shard_payload_in_per_update"].as_f64().unwrap());
    }
    // λ = 4 f32 gradients of the whole model (784·32 + 32 + 32·10 + 10 values) against 2.
    let model_bytes = 4.0 * (784.0 * 32.0 + 32.0 + 32.0 * 10.0 + 10.0);
    assert_eq!(per_update, vec![4.0 * model_bytes, 2.0 * model_bytes]);
}

#[test]
fn hierarchical_groups_train_and_each_group_round_is_one_gradient() {
    let tmp = tempfile::tempdir().unwrap();
    let hierarchical = ["cluster.groups=2", "cluster.hierarchical=true", "cluster.shards=1"];
    short_run(tmp.path(), &[&hierarchical[..], &["protocol.kind=async", "cluster.learners=4"]].concat());
    let s = summary(tmp.path());
    assert!(s["final_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    // 4,000 examples over λ = 4 at μ = 32 is 31 steps a learner, 2 epochs: 62 rounds a group.
    assert_eq!(s["gradients_applied"], 2 * 62, "{s}");
    assert_eq!(s["updates"], 2 * 62, "async between groups: every group's round an update");
}

/// Under hardsync, `settings` over `local --transport quic` (every node, each group's
/// aggregator too, on QUIC with mutual TLS) end on exactly the weights they end on in one
/// process; the two runs' summaries.
fn hardsync_across_processes_as_in_one(dir: &Path, settings: &[&str]) -> (Value, Value) {
    let hardsync = [settings, &["protocol.kind=hardsync"]].concat();
    let (one, quic) = (dir.join("one"), dir.join("quic"));
    short_run(&one, &hardsync);
    short_run_with(&quic, &["--transport", "quic"], &hardsync);
    let weights = |run: &Path| tensors(&run.join("checkpoint.safetensors"));
    assert_eq!(weights(&one), weights(&quic), "{settings:?}");
    let (one, quic) = (summary(&one), summary(&quic));
    for key in ["final_test_accuracy", "gradients_applied", "updates", "shard_payload_in_per_update"] {
        assert_eq!(one[key], quic[key], "{key}: {one} against {quic}");
    }
    (one, quic)
}

/// An aggregation tree across processes, each group's aggregator a node of its own: hardsync
/// ends on the weights of one process (sequential SGD with a batch of μλ, `tests/cluster.rs`),
/// and λ = 4 learners in 2 groups bring each shard half the bytes per update of 4 alone.
#[test]
fn an_aggregation_tree_across_processes_trains_exactly_as_in_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = ["cluster.shards=2", "cluster.learners=4"];
    let (_, alone) = hardsync_across_processes_as_in_one(&tmp.path().join("1"), &tree);
    let (_, grouped) = hardsync_across_processes_as_in_one(
        &tmp.path().join("2"),
        &[&tree[..], &["cluster.groups=2"]].concat(),
    );
    // 4,000 examples at μλ = 128: 31 rounds an epoch, 2 epochs; each of 2 shards takes every
    // learner's gradient, through its group's aggregate or alone.
    assert_eq!(grouped["updates"], 62, "{grouped}");
    assert_eq!(grouped["gradients_applied"], 2 * 4 * 62, "{grouped}");
    let per_update = |s: &Value| s["shard_payload_in_per_update"].as_f64().unwrap();
    assert_eq!(per_update(&grouped) * 2.0, per_update(&alone), "{grouped} against {alone}");
}

/// Hierarchical groups across processes train exactly as in one process; under async every
/// group round is one gradient at each shard.
#[test]
fn hierarchical_groups_across_processes_train_exactly_as_in_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let groups = ["cluster.groups=2", "cluster.hierarchical=true", "cluster.shards=2", "cluster.learners=5"];
    let (_, quic) = hardsync_across_processes_as_in_one(tmp.path(), &groups);
    // 4,000 examples at μλ = 160: 25 rounds an epoch, one gradient a group each, at each shard.
    assert_eq!(quic["updates"], 50, "{quic}");
    assert_eq!(quic["gradients_applied"], 2 * 2 * 50, "{quic}");
    assert_eq!(quic["staleness"]["max"], 0, "{quic}");

    let dir = tmp.path().join("async");
    let asynchronous =
        ["cluster.groups=2", "cluster.hierarchical=true", "cluster.shards=2", "cluster.learners=4"];
    short_run_with(&dir, &["--transport", "quic"], &[&asynchronous[..], &["protocol.kind=async"]].concat());
    let s = summary(&dir);
    assert!(s["final_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    // 31 steps a learner, 2 epochs: 62 rounds a group, each an update, at each of 2 shards.
    assert_eq!(s["gradients_applied"], 2 * 2 * 62, "{s}");
    assert_eq!(s["updates"], 2 * 62, "{s}");
    assert_eq!(s["staleness"]["applied"], 2 * 2 * 62, "σ is counted per group gradient: {s}");
}

#[test]
fn groups_are_refused_beside_what_would_hold_a_push() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    // More groups than learners.
    let o = node(&["local", "--out", out, "--set", "cluster.groups=5", "--set", "cluster.learners=4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cluster.groups"), "{err}");
    // Rounds of their own need groups, and the shards count groups.
    for (set, also) in [("cluster.groups=1", "protocol.n=1"), ("cluster.groups=2", "protocol.n=3")] {
        let args = ["--set", set, "--set", "cluster.hierarchical=true", "--set", also];
        let o = node(&[&["local", "--out", out, "--set", "protocol.kind=softsync"][..], &args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("cluster.hierarchical"), "{set} {also}: {err}");
    }
    // n-softsync inside groups of 2 has n ≤ 2, and needs groups with rounds of their own.
    for also in ["cluster.hierarchical=true", "cluster.hierarchical=false"] {
        let args = ["--set", "cluster.groups=2", "--set", "cluster.group_n=3", "--set", also];
        let o = node(&[&["local", "--out", out, "--set", "protocol.kind=async"][..], &args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("cluster.group_n"), "{also}: {err}");
    }
    for refused in ["protocol.max_staleness=4", "protocol.prefetch=1", "protocol.kind=diloco"] {
        let o = node(&[
            "local",
            "--out",
            out,
            "--set",
            "cluster.groups=2",
            "--set",
            "protocol.kind=async",
            "--set",
            refused,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("cluster.groups"), "{refused}: {err}");
    }
}
