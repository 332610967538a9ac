//! `rudra-node local --transport quic`: every node of a cluster on its own thread of this
//! process, each with a certificate of its own, talking QUIC with mutual TLS over loopback.

use std::net::SocketAddr;
use std::path::Path;

use rudra_actors::{RunReport, TrainingData};
use rudra_transport::tls::CertDir;

use super::{NodeOptions, net, run_aggregator, run_learner, run_scheduler, run_shard};
use crate::local::ProgressMode;
use crate::{Config, RuntimeError};

/// `rudra-node local --transport quic`: the cluster of `config` in this process with every
/// node (and with learner groups, each group's aggregator) on its own thread, talking QUIC
/// with mutual TLS over loopback exactly as separate processes would (fresh certificates in a
/// temporary directory). The shards write their checkpoints into `run_dir` (see [`Config::checkpoints`]); the scheduler serves its metrics
/// at `metrics_addr`, if given.
pub fn run_loopback(
    config: &Config,
    data: TrainingData,
    run_dir: Option<&Path>,
    progress: ProgressMode,
    metrics_addr: Option<SocketAddr>,
) -> Result<RunReport, RuntimeError> {
    config.refuse_kills()?;
    config.refuse_panics()?;
    let dir =
        tempfile::tempdir().map_err(|source| RuntimeError::Io { path: std::env::temp_dir(), source })?;
    let certs = CertDir::new(dir.path());
    certs.init()?;
    let names = |role: &str, n: u32| (0..n).map(|i| format!("{role}-{i}")).collect::<Vec<_>>();
    let shards = names("shard", config.cluster.shards);
    let learners = names("learner", config.cluster.learners);
    let groups = config.cluster.groups;
    let aggregators = names("aggregator", if groups > 1 { groups } else { 0 });
    let nodes = shards.iter().chain(&learners).chain(&aggregators);
    for name in std::iter::once("scheduler").chain(nodes.map(String::as_str)) {
        certs.issue(name)?;
    }
    // The scheduler's port is fixed before anyone starts; the others listen on any port.
    let scheduler = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_err(|e| net(format!("no loopback port: {e}")))?;
    let opts = |name: &str, listen: SocketAddr| NodeOptions {
        listen: Some(listen),
        scheduler: Some(scheduler.to_string()),
        checkpoints: config.checkpoint.dir.clone().or_else(|| run_dir.map(|d| d.join("checkpoints"))),
        ..NodeOptions::new(Some(name.to_owned()), dir.path().to_owned())
    };
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut nodes = Vec::new();
    for name in &shards {
        let o = opts(name, any);
        nodes.push(std::thread::spawn(move || run_shard(&o, None)));
    }
    for name in &aggregators {
        let o = opts(name, any);
        nodes.push(std::thread::spawn(move || run_aggregator(&o)));
    }
    for name in &learners {
        let (o, d) = (opts(name, any), data.clone());
        nodes.push(std::thread::spawn(move || run_learner(&o, Some(d), None).map(drop)));
    }
    let scheduler_opts = NodeOptions { metrics_addr, ..opts("scheduler", scheduler) };
    let report = run_scheduler(config, (data, None), &scheduler_opts, progress)?;
    for node in nodes {
        node.join().map_err(|_| net("a node's thread panicked"))??;
    }
    Ok(report)
}
