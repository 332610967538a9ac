//! The peers' workload as processes with the learners' links to the shard through a relay
//! that delays every datagram, at round trips of 0, 1, 5 and 20 ms, each with prefetch 0, 1
//! and 4, against the same processes linked directly without prefetch: samples/s, ⟨σ⟩ and the
//! final test accuracy of each.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rudra_transport::{LinkFaults, Relay, RelayHandle, RelayRules};

use super::cluster::{NODES, processes, workload};
use super::{BenchRow, interleaved, throughput_rows};
use crate::RuntimeError;
use crate::processes::{issue_certs, names};

/// Round trips measured through the relay, milliseconds (each way half of it).
const ROUND_TRIPS: [f64; 4] = [0.0, 1.0, 5.0, 20.0];

/// Gradients a learner may push ahead of its answers, at each round trip.
const PREFETCH: [u32; 3] = [0, 1, 4];

fn bench_error(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(format!("latency benchmark: {what}"))
}

/// Relays delaying each datagram by `one_way`, started on `runtime` in front of shards.
struct Fronts<'r> {
    runtime: &'r tokio::runtime::Runtime,
    one_way: Duration,
    running: RefCell<Vec<RelayHandle>>,
}

impl Fronts<'_> {
    /// A relay in front of the shard listening at `shard`: where learners reach it.
    fn front(&self, shard: SocketAddr) -> Result<SocketAddr, RuntimeError> {
        let delay = LinkFaults { delay: self.one_way, ..LinkFaults::default() };
        let rules = RelayRules { to_upstream: delay.clone(), to_client: delay, ..RelayRules::default() };
        let relay = Relay::bind(SocketAddr::from(([127, 0, 0, 1], 0)), shard, rules, 1)?;
        let addr = relay.local_addr()?;
        let _entered = self.runtime.enter();
        self.running.borrow_mut().push(relay.spawn());
        Ok(addr)
    }
}

/// Measure every round trip (and the direct link) `repeats` times, interleaved.
pub fn run(file: Option<&Path>, base: &[String], repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let tmp = tempfile::tempdir().map_err(bench_error)?;
    let certs = tmp.path().join("certs");
    issue_certs(&certs, &names(NODES))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(bench_error)?;
    let relayed = ROUND_TRIPS.iter().flat_map(|&rtt| {
        PREFETCH.iter().map(move |&k| (format!("through a relay, RTT {rtt} ms, prefetch {k}"), Some(rtt), k))
    });
    let settings: Vec<(String, Option<f64>, u32)> =
        std::iter::once(("direct".to_owned(), None, 0)).chain(relayed).collect();
    let measured = interleaved(settings.len(), repeats, tmp.path(), |i, dir| {
        let (name, rtt, k) = &settings[i];
        let sets = workload(base, ("f32", "f32"), *k);
        let fronts = rtt.map(|rtt| Fronts {
            runtime: &runtime,
            one_way: Duration::from_secs_f64(rtt / 2000.0),
            running: RefCell::new(Vec::new()),
        });
        let front = |shard| fronts.as_ref().map_or(Ok(shard), |f| f.front(shard));
        let run = processes((file, &sets), NODES, (&certs, dir), rtt.map(|_| &front as _))?;
        drop(fronts);
        let s = &run.summary;
        let (sps, sigma, accuracy) = (s.samples_per_second, s.staleness.mean, s.final_test_accuracy);
        tracing::info!("{name}: {sps:.0} samples/s, mean staleness {sigma:.2}, accuracy {accuracy:.4}");
        Ok([sps, sigma, accuracy])
    })?;
    let names = settings.into_iter().map(|(name, ..)| name).collect();
    Ok(throughput_rows(names, measured, "direct", &[("mean staleness", "σ"), ("test accuracy", "fraction")]))
}
