//! Each learner's compute and waiting time, and the run's goodput, as a run reports them.

mod common;

use common::{short_run, summary};

#[test]
fn a_slow_learner_computes_longer_and_the_learners_time_adds_up() {
    let tmp = tempfile::tempdir().unwrap();
    let slow = "faults.slow=[{learner = 1, factor = 4.0}]";
    short_run(tmp.path(), &["protocol.kind=async", "cluster.learners=2", "cluster.shards=1", slow]);
    let s = summary(tmp.path());
    let wall = s["wall_seconds"].as_f64().unwrap();
    let times = s["learner_time"].as_array().unwrap();
    assert_eq!(times.len(), 2, "{s}");
    let field = |l: usize, key: &str| times[l][key].as_f64().unwrap();
    for l in 0..2 {
        let (compute, wait) = (field(l, "compute_seconds"), field(l, "wait_seconds"));
        assert!(compute > 0.0 && wait >= 0.0, "learner {l}: {compute} s computing, {wait} s waiting");
        assert!(compute + wait <= wall + 1e-6, "learner {l}: {compute} + {wait} within the run's {wall} s");
        assert_eq!(field(l, "dropped"), 0.0, "no bound: nothing dropped");
        assert!(field(l, "applied") > 0.0);
    }
    // Both learners take the same number of steps; learner 1 takes four times as long on each.
    assert!(field(1, "compute_seconds") > 2.0 * field(0, "compute_seconds"), "{times:?}");
    // Nothing was dropped: goodput is the learners' compute over all their time.
    let compute: f64 = (0..2).map(|l| field(l, "compute_seconds")).sum();
    let all: f64 = (0..2).map(|l| field(l, "compute_seconds") + field(l, "wait_seconds")).sum();
    let goodput = s["goodput"].as_f64().unwrap();
    assert!((goodput - compute / all).abs() < 1e-9 && goodput > 0.0 && goodput <= 1.0, "{goodput}");
}
