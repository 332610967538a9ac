//! Scraping a node's `/metrics` during a run, as a Prometheus server would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value};

/// A `GET /metrics`, parsed; `None` while nothing answers.
fn get(addr: SocketAddr) -> Option<Scrape> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: rudra\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    // Header names are case-insensitive.
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    Some(Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("a Prometheus text exposition"))
}

/// Scrape `addr` until `done` holds; fails if `node` exits or a minute passes first.
pub fn scrape_until(node: &mut Child, addr: SocketAddr, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(status) = node.try_wait().expect("the node's status") {
            panic!("the node exited ({status}) before the scrape it was waiting for");
        }
        match get(addr) {
            Some(s) if done(&s) => return s,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    panic!("no such scrape of {addr} within a minute");
}

/// The value of the counter or gauge `name` whose label `label.0` is `label.1` (or that has
/// no label); 0 when there is none yet.
pub fn value(scrape: &Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map_or(0.0, |s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name} is {other:?}"),
        })
}
