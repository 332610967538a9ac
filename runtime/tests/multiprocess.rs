//! A real distributed run: 1 scheduler, 2 shards and 2 learners as separate `rudra-node`
//! processes on 127.0.0.1, mutual TLS with fresh certificates, real MNIST; and the same run in
//! one process, in memory and over loopback QUIC.

mod common;
mod scrape;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::tensors;
use scrape::{scrape_until, value};

fn node(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rudra-node"));
    c.args(args).current_dir(dir).env("RUST_LOG", "warn").stdin(Stdio::null());
    c
}

fn ok(mut c: Command) {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A cluster CA in `dir/certs` and a certificate for each of `names`.
fn issue_certs(dir: &Path, names: &[&str]) {
    ok(node(dir, &["cert", "init", "--dir", "certs"]));
    for name in names {
        ok(node(dir, &["cert", "issue", "--dir", "certs", "--name", name]));
    }
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Wait for every child; kill them all if any runs past `limit`. A child that fails is named
/// with the end of its log, when its stderr went to `logs/NAME.log`.
fn wait_all(children: &mut [(String, Child)], limit: Duration, logs: Option<&Path>) {
    let start = Instant::now();
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (i, (name, child)) in children.iter_mut().enumerate() {
            if !done[i]
                && let Some(status) = child.try_wait().unwrap()
            {
                let log = || {
                    let file = logs?.join(format!("{}.log", name.split(' ').next()?));
                    let text = std::fs::read_to_string(file).ok()?;
                    Some(
                        text.lines()
                            .rev()
                            .take(30)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect::<Vec<_>>()
                            .join("\n"),
                    )
                };
                assert!(
                    status.success(),
                    "{name} exited with {status}; its log ends:\n{}",
                    log().unwrap_or_default()
                );
                done[i] = true;
            }
        }
        if start.elapsed() > limit {
            for (_, c) in children.iter_mut() {
                let _ = c.kill();
            }
            panic!("the cluster did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn hardsync_across_processes_trains_and_equals_local_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    issue_certs(dir, &["scheduler", "shard-0", "shard-1", "learner-0", "learner-1"]);
    let settings: Vec<String> = [
        "protocol.kind=hardsync",
        "cluster.learners=2",
        "cluster.shards=2",
        "training.train_examples=16000",
        "training.epochs=2",
        &format!("training.data_dir={}", data.display()),
    ]
    .iter()
    .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
    .collect();
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let addr = format!("127.0.0.1:{}", free_port());
    let [shard_metrics, scheduler_metrics] =
        [0, 1].map(|_| std::net::SocketAddr::from(([127, 0, 0, 1], free_port())));
    // Start order must not matter: the nodes come first and wait for the scheduler.
    let mut children: Vec<(String, Child)> = Vec::new();
    for name in ["shard-1", "learner-0", "shard-0", "learner-1"] {
        let role = name.split('-').next().unwrap();
        let mut args = vec!["--role", role, "--name", name, "--scheduler", &addr, "--certs", "certs"];
        let shard_metrics = shard_metrics.to_string();
        if name == "shard-0" {
            args.extend(["--metrics-addr", &shard_metrics]);
        }
        let child = node(dir, &args).stdout(Stdio::null()).spawn().unwrap();
        children.push((name.to_owned(), child));
    }
    std::thread::sleep(Duration::from_millis(500));
    let metrics_arg = scheduler_metrics.to_string();
    let sched_args = [
        &["--role", "scheduler", "--listen", &addr, "--certs", "certs", "--out", "quic"][..],
        &["--metrics-addr", &metrics_arg],
        &settings,
    ]
    .concat();
    children.push(("scheduler".into(), node(dir, &sched_args).stdout(Stdio::null()).spawn().unwrap()));
    // The scheduler hears every learner's samples and the shards' records; a shard counts
    // its own gradients and the learners connected to it. Both count their QUIC bytes.
    let s = scrape_until(&mut children[4].1, scheduler_metrics, |s| {
        value(s, "rudra_learner_samples_total", Some(("learner", "1"))) > 0.0
            && value(s, "rudra_staleness_count", None) > 0.0
    });
    assert_eq!(value(&s, "rudra_learners_alive", None), 2.0);
    assert!(value(&s, "rudra_transport_received_bytes_total", None) > 0.0);
    let s = scrape_until(&mut children[2].1, shard_metrics, |s| {
        value(s, "rudra_shard_clock", Some(("shard", "0"))) > 0.0
    });
    assert_eq!(value(&s, "rudra_learners_alive", None), 2.0);
    assert!(value(&s, "rudra_gradients_applied_total", Some(("shard", "0"))) > 0.0);
    assert!(value(&s, "rudra_transport_sent_bytes_total", None) > 0.0);
    wait_all(&mut children, Duration::from_secs(300), None);

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("quic/summary.json")).unwrap()).unwrap();
    let acc = summary["final_test_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.90, "test accuracy {acc} over QUIC");
    assert_eq!(summary["updates"], 500, "hardsync: one update per round of 2 learners");
    assert_eq!(summary["staleness"]["max"], 0);
    // Every learner's progress reached the scheduler under its own id: 250 steps of 32 per epoch.
    let csv = std::fs::read_to_string(dir.join("quic/metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let last: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
    for l in 0..2 {
        let at = header.iter().position(|h| *h == format!("samples_learner_{l}")).unwrap();
        assert_eq!(last[at], "16000");
    }

    ok(node(dir, &[&["local", "--out", "local"][..], &settings].concat()));
    // The same cluster in one process over loopback QUIC.
    ok(node(dir, &[&["local", "--transport", "quic", "--out", "loopback"][..], &settings].concat()));
    let checkpoint = |run: &str| -> PathBuf { dir.join(run).join("checkpoint.safetensors") };
    let local = tensors(&checkpoint("local"));
    for run in ["quic", "loopback"] {
        let q = tensors(&checkpoint(run));
        assert_eq!(
            q.iter().map(|t| &t.0).collect::<Vec<_>>(),
            ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        );
        for ((name, a), (_, b)) in q.iter().zip(&local) {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "{name}: {run} and in-memory hardsync differ by {worst}");
        }
    }
}

/// Sync EASGD has a barrier at every exchange, so over loopback QUIC (exchange frames, center
/// replies) it must give the same center as in memory.
#[test]
fn sync_easgd_over_loopback_quic_equals_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let settings: Vec<String> = [
        "protocol.kind=easgd",
        "protocol.sync=true",
        "protocol.tau=4",
        "training.learning_rate=0.1",
        "cluster.learners=3",
        "cluster.shards=2",
        "training.train_examples=6000",
        "training.test_examples=1000",
        "training.epochs=1",
        &format!("training.data_dir={}", data.display()),
    ]
    .iter()
    .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
    .collect();
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    ok(node(dir, &[&["local", "--out", "memory"][..], &settings].concat()));
    ok(node(dir, &[&["local", "--transport", "quic", "--out", "quic"][..], &settings].concat()));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("quic/summary.json")).unwrap()).unwrap();
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.8, "{summary}");
    assert_eq!(summary["elastic"]["tau"], 4);
    let (q, m) = (
        tensors(&dir.join("quic/checkpoint.safetensors")),
        tensors(&dir.join("memory/checkpoint.safetensors")),
    );
    for ((name, a), (_, b)) in q.iter().zip(&m) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{name}: sync EASGD over QUIC and in memory differ by {worst}");
    }
}

/// A learner process killed mid-run: the scheduler stops hearing its heartbeats, removes it,
/// tells both shard processes the new λ over the wire, and the run finishes without it; every
/// other process exits 0.
#[test]
fn a_killed_learner_process_is_dropped_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    issue_certs(dir, &["scheduler", "shard-0", "shard-1", "learner-0", "learner-1", "learner-2"]);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut children: Vec<(String, Child)> = Vec::new();
    for name in ["shard-0", "shard-1", "learner-0", "learner-1", "learner-2"] {
        let role = name.split('-').next().unwrap();
        let args = ["--role", role, "--name", name, "--scheduler", &addr, "--certs", "certs"];
        children.push((name.to_owned(), node(dir, &args).stdout(Stdio::null()).spawn().unwrap()));
    }
    let log = std::fs::File::create(dir.join("scheduler.log")).unwrap();
    let data_dir = format!("training.data_dir={}", data.display());
    let sched_args = [
        &["--role", "scheduler", "--listen", &addr, "--certs", "certs", "--out", "run"][..],
        &["--set", "cluster.learners=3", "--set", "protocol.kind=softsync", "--set", "protocol.n=3"],
        &["--set", "training.train_examples=30000", "--set", "training.epochs=3", "--set", &data_dir],
        &["--set", "cluster.failure_timeout_ms=1000"],
    ]
    .concat();
    let scheduler =
        node(dir, &sched_args).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(log).spawn().unwrap();
    // Kill learner 2 once the run is under way.
    let started = Instant::now();
    while !std::fs::read_to_string(dir.join("scheduler.log")).unwrap().contains("evaluated") {
        assert!(started.elapsed() < Duration::from_secs(120), "the run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, mut killed) = children.remove(4);
    killed.kill().unwrap();
    killed.wait().unwrap();
    children.push(("scheduler".into(), scheduler));
    wait_all(&mut children, Duration::from_secs(300), None);
    let log = std::fs::read_to_string(dir.join("scheduler.log")).unwrap();
    assert!(log.contains("learner lost") && log.contains("learner-2"), "{log}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run/summary.json")).unwrap()).unwrap();
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.9, "{summary}");
    // Learner 2's examples were not all processed: the run says so.
    assert_eq!(summary["outcome"], "incomplete", "{summary}");
    let (samples, expected) =
        (summary["samples"].as_u64().unwrap(), summary["samples_expected"].as_u64().unwrap());
    // 30,000 examples over 3 learners in minibatches of 32: 312 steps an epoch, 3 epochs.
    assert!(samples < expected && expected == 312 * 3 * 32 * 3, "{samples} of {expected}");
    let csv = std::fs::read_to_string(dir.join("run/metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
    let samples = |l: usize| -> u64 {
        let column = header.iter().position(|&c| c == format!("samples_learner_{l}")).unwrap();
        row[column].parse().unwrap()
    };
    // Learner 2 stopped early; 0 and 1 processed all of theirs.
    let last = [samples(0), samples(1), samples(2)];
    assert!(last[2] < last[1] && last[0] == last[1], "samples per learner: {last:?}");
}

/// Wait until `log` contains `what`.
fn wait_for_log(log: &Path, what: &str, limit: Duration) {
    let started = Instant::now();
    while !std::fs::read_to_string(log).unwrap_or_default().contains(what) {
        assert!(started.elapsed() < limit, "no {what:?} in {} within {limit:?}", log.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A shard process killed mid-run and started again with `--resume` at the same address
/// continues from its checkpoint: the learners' connections to the dead process are reset by
/// the new one, they connect again and go on. Then a learner process killed and started again
/// rejoins the running job. The run finishes; every process still running exits 0.
#[test]
fn a_killed_shard_process_resumes_from_its_checkpoint_and_a_restarted_learner_rejoins() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    issue_certs(dir, &["scheduler", "shard-0", "shard-1", "learner-0", "learner-1"]);
    let addr = format!("127.0.0.1:{}", free_port());
    let listen: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let args = |name: &str| -> Vec<String> {
        let role = name.split('-').next().unwrap();
        let mut a: Vec<String> = ["--role", role, "--name", name, "--scheduler", &addr, "--certs", "certs"]
            .map(str::to_owned)
            .to_vec();
        if let Some(s) = name.strip_prefix("shard-") {
            a.extend(["--listen".to_owned(), listen[s.parse::<usize>().unwrap()].clone()]);
        }
        a
    };
    let spawn = |name: &str, extra: &[&str]| -> Child {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let mut a = args(name);
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        node(dir, &a).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(log).spawn().unwrap()
    };
    let mut children: Vec<(String, Child)> = ["shard-0", "shard-1", "learner-0", "learner-1"]
        .iter()
        .map(|n| ((*n).to_owned(), spawn(n, &[])))
        .collect();
    let data_dir = format!("training.data_dir={}", data.display());
    let sched_args = [
        &["--role", "scheduler", "--listen", &addr, "--certs", "certs", "--out", "run"][..],
        &["--set", "cluster.learners=2", "--set", "protocol.kind=softsync", "--set", "protocol.n=2"],
        &["--set", "training.train_examples=20000", "--set", "training.epochs=4", "--set", &data_dir],
        &["--set", "training.evals_per_epoch=4", "--set", "checkpoint.every_updates=50"],
        &["--set", "cluster.failure_timeout_ms=1000", "--set", "cluster.retry_ms=200"],
    ]
    .concat();
    let sched_log = dir.join("scheduler.log");
    let log = std::fs::File::create(&sched_log).unwrap();
    let scheduler =
        node(dir, &sched_args).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(log).spawn().unwrap();
    wait_for_log(&sched_log, "evaluated", Duration::from_secs(120));
    // Kill shard 1 and start it again from its checkpoint.
    let (_, mut killed) = children.remove(1);
    killed.kill().unwrap();
    killed.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    children.push(("shard-1 (restarted)".into(), spawn("shard-1", &["--resume", "checkpoints"])));
    wait_for_log(&sched_log, "shard-1 restarted from its checkpoint", Duration::from_secs(60));
    // Then learner 1: killed, and started again.
    let (_, mut killed) = children.remove(2);
    killed.kill().unwrap();
    killed.wait().unwrap();
    children.push(("learner-1 (restarted)".into(), spawn("learner-1", &[])));
    children.push(("scheduler".into(), scheduler));
    wait_all(&mut children, Duration::from_secs(300), Some(dir));
    let log = std::fs::read_to_string(&sched_log).unwrap();
    assert!(log.contains("rejoined the running job") && log.contains("learner-1"), "{log}");
    // The restarted shard reset learner 0's connection to the killed one: no idle timeout.
    let learner = std::fs::read_to_string(dir.join("learner-0.log")).unwrap();
    assert!(learner.contains("lost shard-1 (reset by peer)"), "{learner}");
    assert!(learner.contains("connected to shard-1 again"), "{learner}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run/summary.json")).unwrap()).unwrap();
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.9, "{summary}");
    let lost = summary["updates_lost"].as_u64().unwrap();
    assert!(lost <= 50, "{lost} updates lost; the checkpoint interval is 50");
    assert!(dir.join("checkpoints/shard-0.safetensors").is_file());
}

/// Learner groups with each group's aggregator a process of its own: 1 shard, 4 learners in 2
/// groups, 2 aggregators. Hierarchical groups train, each group round one gradient at the
/// shard; an aggregation tree trains, every member's gradient counted at the shard; then an
/// aggregator killed mid-run stops the run with its group named (its rounds are gone with it).
#[test]
fn aggregator_processes_run_their_groups_and_a_killed_one_stops_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let nodes =
        ["shard-0", "aggregator-0", "aggregator-1", "learner-0", "learner-1", "learner-2", "learner-3"];
    issue_certs(dir, &[&["scheduler"][..], &nodes].concat());
    let data_dir = format!("training.data_dir={}", data.display());
    let run = |out: &str, settings: &[&str]| {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut children: Vec<(String, Child)> = Vec::new();
        for name in nodes {
            let role = name.split('-').next().unwrap();
            let args = ["--role", role, "--name", name, "--scheduler", &addr, "--certs", "certs"];
            let child = node(dir, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            children.push((name.to_owned(), child));
        }
        let log = std::fs::File::create(dir.join(format!("{out}.log"))).unwrap();
        let sched_args = [
            &["--role", "scheduler", "--listen", &addr, "--certs", "certs", "--out", out][..],
            &["--set", "cluster.learners=4", "--set", "cluster.shards=1", "--set", "protocol.kind=async"],
            &["--set", "cluster.groups=2", "--set", &data_dir],
            &settings.iter().flat_map(|s| ["--set", s]).collect::<Vec<_>>(),
        ]
        .concat();
        let scheduler =
            node(dir, &sched_args).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(log).spawn().unwrap();
        children.push(("scheduler".into(), scheduler));
        children
    };

    let short = ["training.train_examples=4000", "training.epochs=2"];
    // 31 steps a learner, 2 epochs: 62 rounds a group, each one gradient and one update with
    // hierarchical groups; each of the 4 members' 62 gradients one update with a tree.
    for (out, hierarchical, applied) in [("hierarchical", "true", 2 * 62), ("tree", "false", 4 * 62)] {
        let kind = format!("cluster.hierarchical={hierarchical}");
        let mut children = run(out, &[&short[..], &[kind.as_str()]].concat());
        wait_all(&mut children, Duration::from_secs(300), None);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(out).join("summary.json")).unwrap())
                .unwrap();
        assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.8, "{summary}");
        assert_eq!(summary["gradients_applied"], applied, "{out}: {summary}");
        assert_eq!(summary["updates"], applied, "{out}: {summary}");
    }

    let long = [
        "training.train_examples=60000",
        "training.epochs=20",
        "cluster.hierarchical=true",
        "cluster.failure_timeout_ms=1000",
    ];
    let mut children = run("killed", &long);
    wait_for_log(&dir.join("killed.log"), "evaluated", Duration::from_secs(120));
    let (_, killed) = &mut children[2];
    killed.kill().unwrap();
    killed.wait().unwrap();
    let (_, scheduler) = children.last_mut().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = scheduler.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the run did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(dir.join("killed.log")).unwrap();
    assert!(!status.success() && log.contains("aggregator of learner group 1 was lost"), "{log}");
    for (_, c) in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}
