//! Nodes that die, fail or are confused, across real `rudra-node` processes on 127.0.0.1: each
//! is seen in seconds and named with its reason, nobody is left waiting, and every test ends
//! within its bound.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The tests start clusters of processes whose nodes must be ready within a few seconds (the
/// failure and connect timeouts they measure): on two cores, two at once starve each other, so
/// each test holds this while it runs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A cluster's processes in one directory, each logging to `NAME.log`.
struct Cluster {
    dir: tempfile::TempDir,
    scheduler: String,
    data: PathBuf,
}

impl Cluster {
    /// A CA and certificates for `names` (and the scheduler), a free scheduler port.
    fn new(names: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let o =
                Command::new(env!("CARGO_BIN_EXE_rudra-node")).args(args).current_dir(dir.path()).output();
            assert!(o.unwrap().status.success(), "{args:?}");
        };
        run(&["cert", "init", "--dir", "certs"]);
        for name in names.iter().chain(&["scheduler"]) {
            run(&["cert", "issue", "--dir", "certs", "--name", name]);
        }
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
        Self { dir, scheduler: format!("127.0.0.1:{port}"), data }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Start `rudra-node args` from `cwd` (the cluster's directory when `None`), logging to
    /// `log`.log.
    fn spawn_in(&self, cwd: Option<&Path>, log: &str, args: &[&str]) -> Child {
        let certs = self.path("certs");
        let file = std::fs::File::create(self.path(&format!("{log}.log"))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_rudra-node"))
            .args(args)
            .args(["--certs", certs.to_str().unwrap()])
            .current_dir(cwd.unwrap_or(self.dir.path()))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap()
    }

    /// Start node `name` (a shard or learner) with `extra` flags.
    fn node(&self, name: &str, extra: &[&str]) -> Child {
        let role = name.split('-').next().unwrap();
        let args = [&["--role", role, "--name", name, "--scheduler", &self.scheduler][..], extra].concat();
        self.spawn_in(None, name, &args)
    }

    /// Start the scheduler with `settings` (`--set`) over a short asynchronous MNIST run.
    fn start_scheduler(&self, extra: &[&str], settings: &[&str]) -> Child {
        let data_dir = format!("training.data_dir={}", self.data.display());
        let mut args = vec!["--role", "scheduler", "--listen", &self.scheduler, "--out", "run"];
        args.extend(extra);
        let base = [
            "protocol.kind=async",
            "training.test_examples=2000",
            "cluster.failure_timeout_ms=1000",
            &data_dir,
        ];
        for s in base.iter().chain(settings) {
            args.extend(["--set", s]);
        }
        self.spawn_in(None, "scheduler", &args)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    /// Wait until `name`'s log holds `what`; the time it took.
    fn wait_for(&self, name: &str, what: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        while !self.log(name).contains(what) {
            assert!(start.elapsed() < limit, "no {what:?} from {name} within {limit:?}:\n{}", self.log(name));
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }
}

/// Wait for `child` to exit within `limit` (killing it and failing if it does not).
fn exit_within(name: &str, child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{name} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shard SIGKILLed mid-run and not restarted: the scheduler names it within the failure
/// timeout and a second, and stops the run once `--connect-timeout` has passed without it;
/// every node exits non-zero, saying why.
#[test]
fn a_killed_shard_is_named_in_seconds_and_every_node_exits_non_zero_with_the_reason() {
    let _one = one_at_a_time();
    let names = ["shard-0", "shard-1", "learner-0", "learner-1"];
    let c = Cluster::new(&names);
    let timeout = ["--connect-timeout", "4s"];
    let mut nodes: Vec<(&str, Child)> = names.iter().map(|n| (*n, c.node(n, &timeout))).collect();
    let settings =
        ["cluster.learners=2", "cluster.shards=2", "training.train_examples=20000", "training.epochs=50"];
    let mut scheduler = c.start_scheduler(&timeout, &settings);
    c.wait_for("scheduler", "evaluated", Duration::from_secs(120));
    let (_, mut shard) = nodes.remove(1);
    shard.kill().unwrap();
    let killed = Instant::now();
    shard.wait().unwrap();
    c.wait_for("scheduler", "shard lost", Duration::from_secs(10));
    let named = killed.elapsed();
    assert!(c.log("scheduler").contains("shard=shard-1"), "{}", c.log("scheduler"));
    assert!(named <= Duration::from_secs(2), "named after {named:?}; the failure timeout is 1 s");
    let status = exit_within("the scheduler", &mut scheduler, Duration::from_secs(10));
    let stopped = killed.elapsed();
    assert!(stopped <= Duration::from_secs(4 + 2) + named, "stopped after {stopped:?}");
    assert!(!status.success(), "the scheduler exited 0");
    assert!(c.log("scheduler").contains("shard-1"), "{}", c.log("scheduler"));
    for (name, mut child) in nodes {
        let status = exit_within(name, &mut child, Duration::from_secs(10));
        assert!(!status.success(), "{name} exited 0");
        let log = c.log(name);
        assert!(log.contains("shard-1") && log.contains("stopped the run"), "{name}: {log}");
    }
}

/// A learner that cannot read its data tells the scheduler why as it leaves: the scheduler
/// names it within two seconds and the run goes on without it.
#[test]
fn a_learner_that_fails_on_bad_data_is_named_and_the_run_goes_on() {
    let _one = one_at_a_time();
    let names = ["shard-0", "learner-0", "learner-1"];
    let c = Cluster::new(&names);
    // The data directory is relative: learner 1 runs where it does not exist.
    std::os::unix::fs::symlink(&c.data, c.path("mnist")).unwrap();
    let elsewhere = c.path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let mut nodes = vec![("shard-0", c.node("shard-0", &[])), ("learner-0", c.node("learner-0", &[]))];
    let args = ["--role", "learner", "--name", "learner-1", "--scheduler", &c.scheduler];
    let mut bad = c.spawn_in(Some(&elsewhere), "learner-1", &args);
    let settings = [
        "cluster.learners=2",
        "cluster.shards=1",
        "training.train_examples=4000",
        "training.epochs=2",
        "training.data_dir=mnist",
    ];
    let mut scheduler = c.start_scheduler(&[], &settings);
    let status = exit_within("learner-1", &mut bad, Duration::from_secs(60));
    let left = Instant::now();
    assert_eq!(status.code(), Some(2), "{}", c.log("learner-1"));
    let named = left.elapsed() + c.wait_for("scheduler", "left before the start", Duration::from_secs(2));
    assert!(named <= Duration::from_secs(2), "named after {named:?}");
    let log = c.log("scheduler");
    assert!(log.contains("learner-1") && log.contains("training.data_dir"), "{log}");
    assert!(exit_within("the scheduler", &mut scheduler, Duration::from_secs(120)).success(), "{log}");
    for (name, mut child) in nodes.drain(..) {
        assert!(exit_within(name, &mut child, Duration::from_secs(10)).success(), "{name}: {}", c.log(name));
    }
    let summary = summary(&c.path("run"));
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.8, "{summary}");
}

/// A second process named `learner-0` while the first is alive is refused, ten times over,
/// and the run finishes undisturbed.
#[test]
fn a_second_process_of_one_name_is_refused_every_time_and_the_run_finishes() {
    let _one = one_at_a_time();
    let names = ["shard-0", "learner-0", "learner-1"];
    let c = Cluster::new(&names);
    let nodes: Vec<(&str, Child)> = names.iter().map(|n| (*n, c.node(n, &[]))).collect();
    let settings =
        ["cluster.learners=2", "cluster.shards=1", "training.train_examples=20000", "training.epochs=12"];
    let mut scheduler = c.start_scheduler(&[], &settings);
    c.wait_for("scheduler", "evaluated", Duration::from_secs(120));
    for attempt in 0..10 {
        let args = ["--role", "learner", "--name", "learner-0", "--scheduler", &c.scheduler];
        let mut second = c.spawn_in(None, "second", &[&args[..], &["--connect-timeout", "1s"]].concat());
        let status = exit_within("the second learner-0", &mut second, Duration::from_secs(15));
        let log = c.log("second");
        assert_eq!(status.code(), Some(2), "attempt {attempt}: {log}");
        assert!(log.contains("connected and alive"), "attempt {attempt}: {log}");
        assert!(scheduler.try_wait().unwrap().is_none(), "the run ended during attempt {attempt}");
    }
    assert!(exit_within("the scheduler", &mut scheduler, Duration::from_secs(180)).success());
    for (name, mut child) in nodes {
        assert!(exit_within(name, &mut child, Duration::from_secs(10)).success(), "{name}");
    }
    let summary = summary(&c.path("run"));
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.9, "{summary}");
}

/// `--resume` at the start of a new job, on the checkpoint of an earlier one: the shard refuses
/// it (naming the file and the other job) and exits non-zero, and the run stops with that reason
/// rather than hang.
#[test]
fn resume_at_the_start_of_a_new_job_is_refused_and_nothing_hangs() {
    let _one = one_at_a_time();
    let names = ["shard-0", "learner-0"];
    let c = Cluster::new(&names);
    let settings = [
        "cluster.learners=1",
        "cluster.shards=1",
        "training.train_examples=2000",
        "checkpoint.every_updates=10",
    ];
    let first = [c.node("shard-0", &[]), c.node("learner-0", &[]), c.start_scheduler(&[], &settings)];
    for (name, mut child) in ["shard-0", "learner-0", "scheduler"].into_iter().zip(first) {
        let status = exit_within("the first run", &mut child, Duration::from_secs(120));
        assert!(status.success(), "{name}: {status}:\n{}", c.log(name));
    }
    assert!(c.path("checkpoints/shard-0.safetensors").is_file());
    let mut shard = c.node("shard-0", &["--resume", "checkpoints"]);
    let mut learner = c.node("learner-0", &[]);
    std::fs::remove_dir_all(c.path("run")).unwrap();
    // Whenever the scheduler hears of the refusal, it stops within its connect timeout.
    let mut scheduler = c.start_scheduler(&["--connect-timeout", "8s"], &settings);
    // A checkpoint of another job is a permanent error: exit 2, which engines do not restart.
    let status = exit_within("shard-0", &mut shard, Duration::from_secs(60));
    let log = c.log("shard-0");
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("shard-0.safetensors") && log.contains("another run"), "{log}");
    assert!(!exit_within("the scheduler", &mut scheduler, Duration::from_secs(20)).success());
    assert!(c.log("scheduler").contains("shard-0"), "{}", c.log("scheduler"));
    assert!(!exit_within("learner-0", &mut learner, Duration::from_secs(20)).success());
}

/// The clock in shard `name`'s checkpoint in `dir`.
fn checkpoint_clock(dir: &Path, name: &str) -> u64 {
    let bytes = std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    header.metadata().as_ref().unwrap()["clock"].parse().unwrap()
}

/// The settings of the failover runs: long enough that the learners train on while the
/// scheduler is away.
const FAILOVER_RUN: [&str; 5] = [
    "cluster.learners=2",
    "cluster.shards=1",
    "training.train_examples=10000",
    "training.epochs=30",
    "checkpoint.every_updates=100",
];

/// A whole failover run in `c`: the scheduler SIGKILLed 5 s after it started and, when
/// `restart`, started again with `--resume` at 15 s. Returns the shards, learners and
/// scheduler that are still to exit (the restarted one, or none).
fn kill_the_scheduler(
    c: &Cluster,
    restart: bool,
    timeout: &[&str],
) -> (Vec<(&'static str, Child)>, Option<Child>) {
    let nodes: Vec<(&str, Child)> =
        ["shard-0", "learner-0", "learner-1"].into_iter().map(|n| (n, c.node(n, timeout))).collect();
    let started = Instant::now();
    let mut scheduler = c.start_scheduler(timeout, &FAILOVER_RUN);
    c.wait_for("scheduler", "evaluated", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    scheduler.kill().unwrap();
    scheduler.wait().unwrap();
    assert!(c.path("run/scheduler.json").is_file(), "the scheduler keeps its state in the run directory");
    if !restart {
        return (nodes, None);
    }
    std::thread::sleep(Duration::from_secs(15).saturating_sub(started.elapsed()));
    let args = ["--role", "scheduler", "--listen", &c.scheduler, "--resume", "run"];
    (nodes, Some(c.spawn_in(None, "resumed", &[&args[..], timeout].concat())))
}

/// SIGKILL of the scheduler at 5 s and a restart with `--resume` at 15 s: the shard and the
/// learners train on meanwhile, join the restarted scheduler, and the run ends with one
/// summary whose update count is the shard's and an accuracy within a point of a clean run.
#[test]
fn a_killed_scheduler_restarted_with_resume_takes_the_run_back() {
    let _one = one_at_a_time();
    let timeout = ["--connect-timeout", "30s"];
    let clean = Cluster::new(&["shard-0", "learner-0", "learner-1"]);
    let mut nodes: Vec<Child> =
        ["shard-0", "learner-0", "learner-1"].into_iter().map(|n| clean.node(n, &timeout)).collect();
    nodes.push(clean.start_scheduler(&timeout, &FAILOVER_RUN));
    for mut child in nodes {
        assert!(exit_within("the clean run", &mut child, Duration::from_secs(180)).success());
    }
    let c = Cluster::new(&["shard-0", "learner-0", "learner-1"]);
    let (nodes, resumed) = kill_the_scheduler(&c, true, &timeout);
    let mut resumed = resumed.unwrap();
    let status = exit_within("the resumed scheduler", &mut resumed, Duration::from_secs(180));
    assert!(status.success(), "{}", c.log("resumed"));
    for (name, mut child) in nodes {
        assert!(exit_within(name, &mut child, Duration::from_secs(10)).success(), "{name}: {}", c.log(name));
        assert!(c.log(name).contains("joined the scheduler again"), "{name}: {}", c.log(name));
    }
    let (faulty, clean_run) = (summary(&c.path("run")), summary(&clean.path("run")));
    let accuracy = |s: &serde_json::Value| s["final_test_accuracy"].as_f64().unwrap();
    assert!(accuracy(&faulty) >= accuracy(&clean_run) - 0.01, "{faulty} against {clean_run}");
    assert_eq!(faulty["updates"].as_u64().unwrap(), checkpoint_clock(&c.path("checkpoints"), "shard-0"));
    // What the learners did while no scheduler heard them is counted once, as in the clean run.
    assert_eq!(faulty["samples"], clean_run["samples"], "{faulty} against {clean_run}");
    let metrics = std::fs::read_to_string(c.path("run/metrics.csv")).unwrap();
    let epochs: Vec<f64> =
        metrics.lines().skip(1).map(|l| l.split(',').nth(1).unwrap().parse().unwrap()).collect();
    assert!(epochs.len() >= 2 && epochs.windows(2).all(|w| w[0] < w[1]), "one record, in order: {metrics}");
}

/// SIGKILL of the scheduler without a restart: every node exits non-zero within
/// `--connect-timeout` + 10 s, naming the scheduler, and the shard's checkpoint holds its last
/// clock.
#[test]
fn without_its_scheduler_every_node_exits_non_zero_and_keeps_its_checkpoint() {
    let _one = one_at_a_time();
    let c = Cluster::new(&["shard-0", "learner-0", "learner-1"]);
    let (nodes, _) = kill_the_scheduler(&c, false, &["--connect-timeout", "4s"]);
    let killed = Instant::now();
    for (name, mut child) in nodes {
        let status =
            exit_within(name, &mut child, Duration::from_secs(4 + 10).saturating_sub(killed.elapsed()));
        assert!(!status.success(), "{name} exited 0");
        assert!(c.log(name).contains("not back within"), "{name}: {}", c.log(name));
    }
    // The shard wrote what it held on its way out: nothing it applied is lost.
    let log = c.log("shard-0");
    let last: Option<u64> =
        (log.lines().rev().filter_map(|l| l.split("wrote a checkpoint at clock ").nth(1)))
            .find_map(|rest| rest.split_whitespace().next()?.parse().ok());
    assert!(last.is_some_and(|n| n > 0), "{log}");
    assert_eq!(Some(checkpoint_clock(&c.path("checkpoints"), "shard-0")), last, "{log}");
}

/// A run directory's `summary.json`.
fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// A scheduler that cannot start (its metrics address is taken) leaves no half run directory:
/// `summary.json` says the run failed, and why.
#[test]
fn a_failed_start_marks_the_run_directory_as_failed() {
    let _one = one_at_a_time();
    let c = Cluster::new(&[]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut scheduler = c.start_scheduler(&["--metrics-addr", &addr], &[]);
    let status = exit_within("the scheduler", &mut scheduler, Duration::from_secs(30));
    assert!(!status.success());
    let summary = summary(&c.path("run"));
    assert_eq!(summary["outcome"], "failed", "{summary}");
    assert!(summary["error"].as_str().is_some_and(|e| e.contains(&addr)), "{summary}");
    assert_eq!(summary["updates"], 0, "{summary}");
}

/// A second scheduler pointed at a live run's directory is refused with exit code 2, naming
/// the process that holds it, and changes nothing in the directory.
#[test]
fn a_second_scheduler_on_a_live_run_directory_exits_2_and_changes_nothing() {
    let _one = one_at_a_time();
    let c = Cluster::new(&[]);
    let mut first = c.start_scheduler(&[], &[]);
    c.wait_for("scheduler", "waiting for", Duration::from_secs(30));
    let snapshot = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = (std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()))
            .map(|p| (p.clone(), std::fs::read(&p).unwrap_or_default()))
            .collect();
        files.sort();
        files
    };
    let before = snapshot(&c.path("run"));
    let mut args = vec!["--role", "scheduler", "--out", "run", "--listen", "127.0.0.1:0"];
    args.extend(["--certs", "certs"]);
    let second =
        Command::new(env!("CARGO_BIN_EXE_rudra-node")).args(&args).current_dir(c.path("")).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("another scheduler (process {})", first.id())), "{stderr}");
    assert_eq!(snapshot(&c.path("run")), before, "the live run directory changed");
    first.kill().unwrap();
    let _ = first.wait();
}

/// SIGTERM stops a node at once, as a crash, with exit code 143 (128 + 15).
#[test]
fn sigterm_stops_a_node_at_once_with_exit_code_143() {
    let _one = one_at_a_time();
    let c = Cluster::new(&[]);
    let mut scheduler = c.start_scheduler(&[], &[]);
    c.wait_for("scheduler", "waiting for", Duration::from_secs(30));
    // The shell's own `kill`: no procps needed.
    let term = format!("kill -TERM {}", scheduler.id());
    let sent = Command::new("sh").args(["-c", &term]).status().unwrap();
    assert!(sent.success());
    let stopped = Instant::now();
    let status = exit_within("the scheduler", &mut scheduler, Duration::from_secs(2));
    assert_eq!(status.code(), Some(143), "{}", c.log("scheduler"));
    assert!(c.log("scheduler").contains("stopped by SIGTERM"), "{}", c.log("scheduler"));
    assert!(stopped.elapsed() < Duration::from_secs(2));
}

/// A shard whose actor panics (`[[faults.panic]]`) ends its process at once, exit code 70
/// after the panic's message: the scheduler names it within the failure timeout and a second,
/// and the run stops as for any lost shard. No node lives on with a dead actor.
#[test]
fn a_node_whose_actor_panics_exits_at_once_and_is_named() {
    let _one = one_at_a_time();
    let names = ["shard-0", "learner-0"];
    let c = Cluster::new(&names);
    let timeout = ["--connect-timeout", "4s"];
    let mut nodes: Vec<(&str, Child)> = names.iter().map(|n| (*n, c.node(n, &timeout))).collect();
    let settings = [
        "cluster.learners=1",
        "cluster.shards=1",
        "training.train_examples=20000",
        "training.epochs=50",
        "faults.panic=[{node = \"shard-0\", at_ms = 3000}]",
    ];
    let mut scheduler = c.start_scheduler(&timeout, &settings);
    c.wait_for("shard-0", "injected panic", Duration::from_secs(120));
    let panicked = Instant::now();
    let (_, mut shard) = nodes.remove(0);
    let status = exit_within("shard-0", &mut shard, Duration::from_secs(2));
    assert_eq!(status.code(), Some(70), "{}", c.log("shard-0"));
    assert!(c.log("shard-0").contains("the node stops"), "{}", c.log("shard-0"));
    c.wait_for("scheduler", "shard lost", Duration::from_secs(10));
    let named = panicked.elapsed();
    assert!(named <= Duration::from_secs(2), "named after {named:?}; the failure timeout is 1 s");
    assert!(c.log("scheduler").contains("shard=shard-0"), "{}", c.log("scheduler"));
    assert!(!exit_within("the scheduler", &mut scheduler, Duration::from_secs(15)).success());
    for (name, mut child) in nodes {
        assert!(!exit_within(name, &mut child, Duration::from_secs(15)).success(), "{name} exited 0");
    }
}

/// The scheduler's run directory removed while the run goes on is made again, and the run
/// ends with its summary, metrics and checkpoint written there.
#[test]
fn a_run_directory_removed_mid_run_is_made_again_and_the_results_written() {
    let _one = one_at_a_time();
    let names = ["shard-0", "learner-0"];
    let c = Cluster::new(&names);
    let mut nodes: Vec<(&str, Child)> = names.iter().map(|n| (*n, c.node(n, &[]))).collect();
    let settings =
        ["cluster.learners=1", "cluster.shards=1", "training.train_examples=8000", "training.epochs=4"];
    let mut scheduler = c.start_scheduler(&[], &settings);
    c.wait_for("scheduler", "evaluated", Duration::from_secs(120));
    std::fs::remove_dir_all(c.path("run")).unwrap();
    assert!(
        exit_within("the scheduler", &mut scheduler, Duration::from_secs(120)).success(),
        "{}",
        c.log("scheduler")
    );
    for (name, mut child) in nodes.drain(..) {
        assert!(exit_within(name, &mut child, Duration::from_secs(10)).success(), "{name}: {}", c.log(name));
    }
    let summary = summary(&c.path("run"));
    assert_eq!(summary["outcome"], "completed", "{summary}");
    for file in ["metrics.csv", "checkpoint.safetensors"] {
        assert!(c.path("run").join(file).is_file(), "{file} was not written");
    }
    assert!(!c.path("run").join("scheduler.json").exists(), "a finished run leaves no state to take back");
}

/// A run whose disk fills up (a 256 KiB tmpfs: the summary fits, the checkpoint does not)
/// still writes `summary.json` first, prints its summary line, and leaves no `.tmp` files.
#[test]
#[ignore = "mounts a small tmpfs: needs root (CI runs it as root)"]
fn a_full_disk_still_leaves_the_summary_and_no_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"]).arg(&disk).status();
    assert!(mounted.is_ok_and(|s| s.success()), "cannot mount a tmpfs (run as root)");
    let out = disk.join("run");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let o = Command::new(env!("CARGO_BIN_EXE_rudra-node"))
        .args(["local", "--out", out.to_str().unwrap()])
        .args(["--set", "training.train_examples=4000", "--set", "training.test_examples=1000"])
        .args(["--set", "training.epochs=1", "--set", &format!("training.data_dir={}", data.display())])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let _ = Command::new("umount").arg(&disk).status();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("test accuracy"), "the summary line: {stdout}");
    assert!(stderr.contains("checkpoint was not written"), "{stderr}");
    assert!(files.iter().any(|f| f == "summary.json"), "{files:?}");
    assert!(!files.iter().any(|f| f.ends_with(".tmp")), "{files:?}");
    assert!(!files.iter().any(|f| f == "checkpoint.safetensors"), "{files:?}");
}
