//! The metrics endpoint as a monitoring system sees it: `rudra-node local --metrics-addr`
//! scraped twice during a short MNIST run, each scrape read by a Prometheus text-format parser.

mod scrape;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use prometheus_parse::{Sample, Scrape, Value};
use scrape::{scrape_until, value};

/// Kills the node if the test fails before it exits.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn samples<'a>(scrape: &'a Scrape, name: &'a str) -> impl Iterator<Item = &'a Sample> {
    scrape.samples.iter().filter(move |s| s.metric == name)
}

/// The single value of `name`, checking its type.
fn single(scrape: &Scrape, name: &str) -> f64 {
    let all: Vec<&Sample> = samples(scrape, name).collect();
    assert_eq!(all.len(), 1, "{name}: {all:?}");
    match all[0].value {
        Value::Gauge(v) | Value::Counter(v) | Value::Untyped(v) => v,
        ref other => panic!("{name} is {other:?}"),
    }
}

/// The values of a labelled counter or gauge by label, checking its type.
fn labelled(scrape: &Scrape, name: &str, label: &str, counter: bool) -> Vec<(u32, f64)> {
    let mut values: Vec<(u32, f64)> = samples(scrape, name)
        .map(|s| {
            let v = match (s.value.clone(), counter) {
                (Value::Counter(v), true) | (Value::Gauge(v), false) => v,
                (other, _) => panic!("{name} is {other:?}"),
            };
            (s.labels.get(label).expect("labelled").parse().expect("a numeric label"), v)
        })
        .collect();
    values.sort_by_key(|(id, _)| *id);
    values
}

fn clock(scrape: &Scrape) -> f64 {
    labelled(scrape, "rudra_shard_clock", "shard", false).iter().map(|(_, v)| *v).fold(0.0, f64::max)
}

/// Everything one scrape must say about a run of 4 learners and 2 shards.
fn check(s: &Scrape) {
    let clocks = labelled(s, "rudra_shard_clock", "shard", false);
    assert_eq!(clocks.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [0, 1]);
    let applied = labelled(s, "rudra_gradients_applied_total", "shard", true);
    let dropped = labelled(s, "rudra_gradients_dropped_total", "shard", true);
    assert_eq!((applied.len(), dropped.len()), (2, 2));
    let histogram = samples(s, "rudra_staleness").next().expect("the staleness histogram");
    let Value::Histogram(buckets) = &histogram.value else { panic!("rudra_staleness is {histogram:?}") };
    let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
    assert_eq!(bounds, [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, f64::INFINITY]);
    assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count), "cumulative buckets: {buckets:?}");
    let count = single(s, "rudra_staleness_count");
    let sum = single(s, "rudra_staleness_sum");
    assert_eq!(buckets.last().map(|b| b.count), Some(count), "the +Inf bucket is the count");
    let applied_total: f64 = applied.iter().map(|(_, v)| v).sum();
    assert!(
        applied_total > 0.0 && applied_total <= count,
        "{applied_total} applied, {count} in the histogram"
    );
    let mean = single(s, "rudra_staleness_mean");
    assert!((mean - sum / count).abs() < 1e-9, "⟨σ⟩ {mean} vs {sum}/{count}");
    // Every update applies at least one gradient.
    for ((_, c), (_, a)) in clocks.iter().zip(&applied) {
        assert!(c <= a, "clock {c} after {a} gradients");
    }
    assert!(single(s, "rudra_updates_per_second") >= 0.0);
    let alive = single(s, "rudra_learners_alive");
    assert!((1.0..=4.0).contains(&alive), "{alive} learners alive");
    let per_learner = labelled(s, "rudra_learner_samples_total", "learner", true);
    assert!(per_learner.iter().all(|&(l, n)| l < 4 && n <= 8000.0 && n % 32.0 == 0.0), "{per_learner:?}");
    // The in-memory transport moves no bytes.
    assert_eq!(single(s, "rudra_transport_sent_bytes_total"), 0.0);
    assert_eq!(single(s, "rudra_transport_received_bytes_total"), 0.0);
}

/// A `METHOD PATH` request to `addr`: the status code and the body.
fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the endpoint answers");
    let head =
        format!("{method} {path} HTTP/1.1\r\nHost: rudra\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("an answer");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    (code, body.to_owned())
}

#[test]
fn a_local_run_serves_prometheus_metrics_while_it_trains() {
    let addr = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let out = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rudra-node"))
        .args(["local", "--set", "training.train_examples=16000", "--set", "training.epochs=2"])
        .args(["--metrics-addr", &addr.to_string(), "--out"])
        .arg(out.path().join("run"))
        .env("RUST_LOG", "warn")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .stdout(Stdio::null())
        .spawn()
        .expect("rudra-node starts");
    let mut node = Node(child);
    let first = scrape_until(&mut node.0, addr, |s| clock(s) > 0.0);
    // Beside the metrics: liveness and readiness probes, and clear answers to anything else.
    assert_eq!(request(addr, "GET", "/healthz"), (200, "alive\n".to_owned()));
    assert_eq!(request(addr, "GET", "/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(request(addr, "HEAD", "/readyz"), (200, String::new()));
    assert_eq!(request(addr, "GET", "/").0, 404);
    assert_eq!(request(addr, "POST", "/metrics").0, 405);
    let second = scrape_until(&mut node.0, addr, |s| clock(s) > clock(&first));
    check(&first);
    check(&second);
    let count = |s: &Scrape| single(s, "rudra_staleness_count");
    assert!(count(&second) > count(&first));
    assert!(value(&second, "rudra_updates_per_second", None) > 0.0);
    let status = node.0.wait().expect("the run ends");
    assert!(status.success(), "{status}");
}
