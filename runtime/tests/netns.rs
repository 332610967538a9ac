//! A partition across real processes on real network links: the scheduler, 2 shards and 3
//! learners each in a network namespace of its own, joined by veth pairs to a bridge in a hub
//! namespace. Learner 1's link is taken down for 3 s (`ip link set … down`) and brought up
//! again: the scheduler removes it and tells the shards the new λ, then takes it back once its
//! heartbeats come through, and the run finishes with every process exiting 0. Learner 2
//! reaches the scheduler through `rudra-node relay`, which drops 5% of its datagrams and
//! delays the rest by 20 ms ± 10 ms on the way.
//!
//! Needs root and iproute2, so it is ignored unless asked for (`--ignored`; CI runs it). It creates
//! and removes its own namespaces and reaches only their addresses.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODES: [&str; 6] = ["scheduler", "shard-0", "shard-1", "learner-0", "learner-1", "learner-2"];

/// The namespaces of one test run, removed on drop.
struct Net {
    prefix: String,
}

impl Net {
    fn ns(&self, node: usize) -> String {
        format!("{}-{node}", self.prefix)
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The hub side of `node`'s veth pair.
    fn port(&self, node: usize) -> String {
        format!("{}h{node}", self.prefix)
    }

    fn addr(node: usize) -> String {
        format!("10.213.0.{}", 10 + node)
    }

    fn create() -> Result<Self, String> {
        let net = Self { prefix: format!("rn{}", std::process::id() % 100_000) };
        ip(&["netns", "add", &net.hub()])?;
        ip(&["-n", &net.hub(), "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &net.hub(), "link", "set", "br0", "up"])?;
        for node in 0..NODES.len() {
            let (ns, port, inner) = (net.ns(node), net.port(node), format!("{}n{node}", net.prefix));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &inner, "type", "veth", "peer", "name", &port])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &port, "netns", &net.hub()])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Self::addr(node)), "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &net.hub(), "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &net.hub(), "link", "set", &port, "up"])?;
        }
        Ok(net)
    }

    fn link(&self, node: usize, up: bool) {
        ip(&["-n", &self.hub(), "link", "set", &self.port(node), if up { "up" } else { "down" }]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for node in 0..NODES.len() {
            let _ = ip(&["netns", "del", &self.ns(node)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// `rudra-node args` inside `node`'s namespace, logging to `dir/NAME.log`.
fn spawn(net: &Net, dir: &Path, node: usize, args: &[&str]) -> Child {
    spawn_as(net, dir, node, NODES[node], args)
}

/// [`spawn`], logging to `dir/{name}.log`.
fn spawn_as(net: &Net, dir: &Path, node: usize, name: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Command::new("ip")
        .args(["netns", "exec", &net.ns(node), env!("CARGO_BIN_EXE_rudra-node")])
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "rudra_transport::relay=trace,info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn log(dir: &Path, node: usize) -> String {
    std::fs::read_to_string(dir.join(format!("{}.log", NODES[node]))).unwrap_or_default()
}

#[test]
#[ignore = "needs root and iproute2 for network namespaces (CI runs it)"]
fn a_learner_cut_off_by_a_link_taken_down_is_lost_then_rejoins() {
    let net = Net::create()
        .unwrap_or_else(|e| panic!("network namespaces are not available here ({e}); run as root"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let node = |args: &[&str]| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_rudra-node")).args(args).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    node(&["cert", "init", "--dir", "certs"]);
    for name in NODES {
        node(&["cert", "issue", "--dir", "certs", "--name", name]);
    }
    let scheduler = format!("{}:7070", Net::addr(0));
    let relay = format!("{}:7171", Net::addr(0));
    let relay_args = ["relay", "--listen", &relay, "--to", &scheduler, "--drop", "0.05", "--delay-ms", "20"];
    let mut relay_process =
        spawn_as(&net, dir, 0, "relay", &[&relay_args[..], &["--jitter-ms", "10", "--seed", "7"]].concat());
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data_dir = format!("training.data_dir={}", data.display());
    let mut children: Vec<(usize, Child)> = Vec::new();
    for (i, name) in NODES.iter().enumerate().skip(1) {
        let role = name.split('-').next().unwrap();
        let listen = format!("{}:0", Net::addr(i));
        let args = [
            "--role",
            role,
            "--name",
            name,
            "--scheduler",
            if *name == "learner-2" { &relay } else { &scheduler },
            "--certs",
            "certs",
            "--listen",
            &listen,
        ];
        children.push((i, spawn(&net, dir, i, &args)));
    }
    let settings = [
        "cluster.learners=3",
        "protocol.kind=softsync",
        "protocol.n=3",
        "training.train_examples=30000",
        "training.epochs=4",
        "training.evals_per_epoch=4",
        "cluster.failure_timeout_ms=1000",
        "cluster.retry_ms=500",
        &data_dir,
    ];
    let mut args = vec!["--role", "scheduler", "--listen", &scheduler, "--certs", "certs", "--out", "run"];
    for s in &settings {
        args.extend(["--set", s]);
    }
    children.push((0, spawn(&net, dir, 0, &args)));

    let until = |what: &str, limit: Duration| {
        let start = Instant::now();
        while !log(dir, 0).contains(what) {
            assert!(start.elapsed() < limit, "no {what:?} within {limit:?}: {}", log(dir, 0));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    until("evaluated", Duration::from_secs(120));
    net.link(4, false);
    until("learner lost", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    net.link(4, true);
    until("learner rejoined", Duration::from_secs(60));

    let start = Instant::now();
    for (i, child) in &mut children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "{} exited with {status}: {}", NODES[*i], log(dir, *i));
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "{} did not finish: {}",
                NODES[*i],
                log(dir, *i)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let sched = log(dir, 0);
    let said = |what: &str| sched.lines().any(|l| l.contains(what) && l.contains("learner=learner-1"));
    assert!(said("learner lost") && said("learner rejoined"), "{sched}");
    for shard in [1, 2] {
        assert!(log(dir, shard).contains("λ = 2"), "{}: {}", NODES[shard], log(dir, shard));
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run/summary.json")).unwrap()).unwrap();
    assert!(summary["final_test_accuracy"].as_f64().unwrap() > 0.9, "{summary}");
    relay_process.kill().unwrap();
    relay_process.wait().unwrap();
    let relayed = std::fs::read_to_string(dir.join("relay.log")).unwrap();
    assert!(relayed.contains("relay forwarding") && relayed.contains("datagram dropped"), "{relayed}");
    // Learner 2 trained through the lossy relay all the same: every learner did its share.
    let csv = std::fs::read_to_string(dir.join("run/metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let last: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
    let samples = |l: usize| last[header.iter().position(|&c| c == format!("samples_learner_{l}")).unwrap()];
    assert_eq!(samples(0), samples(2), "samples of learners 0 and 2: {last:?}");
}
