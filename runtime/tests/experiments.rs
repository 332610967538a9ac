//! The shipped scenarios that kill processes, run by `rudra-node experiment` as real
//! `rudra-node` processes over loopback QUIC. Each experiment runs a clean and a faulty cluster
//! of five processes, so they run one at a time.

use std::sync::Mutex;

/// Held by the running experiment.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `rudra-node experiment` of the shipped scenario `config` (its runs as processes), shortened
/// by `set`, with every process's `--connect-timeout` 10 s: the output directory and its
/// `experiment.json`.
fn process_experiment(config: &str, set: &[&str]) -> (tempfile::TempDir, serde_json::Value) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = tempfile::tempdir().expect("a temporary directory");
    let root = env!("CARGO_MANIFEST_DIR");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rudra-node"));
    command.args(["experiment", "--config", &format!("{root}/../configs/faults/{config}")]);
    let short = [
        "cluster.learners=2",
        "training.train_examples=10000",
        "training.test_examples=2000",
        "compute.device=cpu",
        "checkpoint.every_updates=100",
    ];
    for s in short.iter().chain(set) {
        command.args(["--set", s]);
    }
    let status = (command.args(["--set", &format!("training.data_dir={root}/../data/mnist")]))
        .args(["--connect-timeout", "10s", "--time-limit", "240", "--out"])
        .arg(out.path())
        .status()
        .expect("rudra-node runs");
    assert!(status.success(), "the experiment failed");
    let text = std::fs::read_to_string(out.path().join("experiment.json")).expect("experiment.json");
    let json = serde_json::from_str(&text).expect("JSON");
    (out, json)
}

/// The seconds of the first timeline entry whose text contains `what`.
fn when(json: &serde_json::Value, what: &str) -> f64 {
    let timeline = json["timeline"].as_array().expect("a timeline");
    let entry = timeline.iter().find(|e| e["what"].as_str().is_some_and(|w| w.contains(what)));
    entry.and_then(|e| e["seconds"].as_f64()).unwrap_or_else(|| panic!("no {what:?} in {timeline:?}"))
}

/// The shipped `scheduler-restarted` scenario, as processes: the scheduler is killed and
/// started again, takes the run back, and the run ends with one summary, every process 0.
#[test]
fn scheduler_restarted_experiment_kills_the_scheduler_process_and_the_run_ends() {
    let kill = "faults.kill=[{node = \"scheduler\", at_ms = 2000, restart_after_ms = 3000}]";
    let (out, json) =
        process_experiment("scheduler-restarted.toml", &["protocol.n=2", "training.epochs=20", kill]);
    assert!(json["stopped"].is_null(), "{json}");
    let exits = json["exits"].as_array().expect("exits");
    assert_eq!(exits.len(), 5, "{exits:?}");
    assert!(exits.iter().all(|e| e[1] == 0), "every process's last incarnation exits 0: {exits:?}");
    let (killed, again) = (when(&json, "scheduler killed"), when(&json, "scheduler started again"));
    assert!((2.0..2.5).contains(&killed) && (again - killed - 3.0).abs() < 0.5, "{killed} {again}");
    let acc: Vec<f64> = json["accuracy"].as_array().unwrap().iter().map(|a| a.as_f64().unwrap()).collect();
    assert!(acc[0] > 0.85 && acc[1] > acc[0] - 0.02, "{acc:?}");
    let summary = std::fs::read_to_string(out.path().join("faulty/summary.json")).expect("one summary");
    assert!(summary.contains("\"outcome\": \"completed\""), "{summary}");
    let log = std::fs::read_to_string(out.path().join("logs/faulty/scheduler.log")).unwrap();
    assert!(log.contains("taking it back"), "the restarted scheduler takes its run back: {log}");
}

/// The shipped `shard-lost` scenario, as processes: the killed shard is named within the
/// failure timeout and a second, the run stops within `--connect-timeout` and two seconds,
/// every other process exits non-zero, and the faulty run's directory records the failure.
#[test]
fn shard_lost_experiment_stops_the_run_and_every_node_exits_non_zero() {
    let kill = "faults.kill=[{node = \"shard-1\", at_ms = 2000}]";
    let (out, json) = process_experiment("shard-lost.toml", &["training.epochs=20", kill]);
    let stopped = json["stopped"].as_str().expect("the faulty run stopped");
    assert!(stopped.contains("shard-1"), "{stopped}");
    let killed = when(&json, "shard-1 killed");
    let lost = when(&json, "shard-1 lost");
    assert!(lost - killed < 1.0 + 1.0, "shard-1 was named {:.2} s after its kill", lost - killed);
    for exit in json["exits"].as_array().expect("exits") {
        match exit[0].as_str().unwrap() {
            "shard-1" => assert!(exit[1].is_null(), "shard-1 stays killed: {exit}"),
            name => assert!(exit[1].as_i64().is_some_and(|c| c != 0), "{name}: {exit}"),
        }
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("faulty/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["outcome"], "failed", "{summary}");
    assert!(summary["error"].as_str().is_some_and(|e| e.contains("shard-1")), "{summary}");
    assert!(summary["updates"].as_u64().is_some_and(|u| u > 0), "what the run measured is kept: {summary}");
    let scheduler = std::fs::read_to_string(out.path().join("logs/faulty/scheduler.log")).unwrap();
    let stop = scheduler.lines().rev().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(stop.contains("shard-1") && stop.contains("not back within 10s"), "{scheduler}");
}
