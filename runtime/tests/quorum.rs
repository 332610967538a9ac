//! Quorum rounds (`docs/src/algorithms.md` §5.2) with a learner slowed on purpose: rounds close
//! without it, and what it computes is folded into later rounds with its σ, or dropped and
//! counted, as the run's summary says.

mod common;

use common::{short_run, summary};

/// `protocol` at λ = 3 with a quorum of 2 and no grace window, learner 0 sixteen times slower
/// (far beyond what sharing the cores does to the others).
fn quorum_run(protocol: &[&str], late: &str) -> serde_json::Value {
    let tmp = tempfile::tempdir().unwrap();
    let late = format!("protocol.late=\"{late}\"");
    let settings = [
        "cluster.learners=3",
        "cluster.shards=1",
        "protocol.quorum=2",
        "protocol.grace_max_ms=0",
        &late,
        "faults.slow=[{learner = 0, factor = 16.0}]",
    ];
    short_run(tmp.path(), &[protocol, &settings[..]].concat());
    summary(tmp.path())
}

#[test]
fn a_quorum_round_folds_a_straggler_in_with_its_staleness() {
    let s = quorum_run(&["protocol.kind=hardsync"], "fold");
    let st = &s["staleness"];
    assert_eq!(s["outcome"], "completed", "{s}");
    assert_eq!(st["dropped"], 0, "folded, not dropped: {st}");
    assert!(st["max"].as_u64().unwrap() >= 1, "the straggler's gradients missed rounds: {st}");
    // Learners 1 and 2 make every quorum; learner 0's gradients ride along late.
    let applied: Vec<f64> = (0..3).map(|l| s["learner_time"][l]["applied"].as_f64().unwrap()).collect();
    assert!(applied[0] > 0.0 && applied[0] < applied[1].min(applied[2]), "{applied:?}");
}

#[test]
fn a_quorum_round_drops_a_straggler_as_a_stale_round() {
    let s = quorum_run(&["protocol.kind=hardsync"], "drop");
    let st = &s["staleness"];
    assert_eq!(s["outcome"], "completed", "{s}");
    let dropped = st["dropped"].as_u64().unwrap();
    assert!(dropped > 0, "{st}");
    assert_eq!(st["dropped_by"]["stale-round"].as_u64(), Some(dropped), "{st}");
    assert_eq!(st["max"], 0, "only gradients on the round's weights are applied: {st}");
}

#[test]
fn a_sync_diloco_quorum_round_folds_a_straggler_in_and_the_center_moves_on() {
    // A wider network and three times the examples of the short run: the fast learners' run
    // lasts long enough for the straggler to exchange several times (once, it can arrive
    // after they finished, on time), and its rounds are the learners' compute, not messages.
    let diloco = [
        "protocol.kind=diloco",
        "protocol.sync=true",
        "protocol.tau=4",
        "training.hidden=[256]",
        "training.train_examples=12000",
    ];
    let s = quorum_run(&diloco, "fold");
    let st = &s["staleness"];
    assert_eq!(s["outcome"], "completed", "{s}");
    assert_eq!(st["dropped"], 0, "folded, not dropped: {st}");
    assert!(st["max"].as_u64().unwrap() >= 1, "the straggler's Δ missed rounds: {st}");
    assert!(s["final_test_accuracy"].as_f64().unwrap() > 0.5, "{s}");
}
