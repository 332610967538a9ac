//! One role per process: `rudra-node --role scheduler|shard|learner`, each built by the same
//! calls of [`rudra_actors::roles`] as a cluster in one process, over stand-ins for the remote
//! actors ([`rudra_actors::remote`]).
//!
//! The scheduler listens, waits for the configured shards and learners to join, gives each its
//! id and the run configuration (learners also get the shards' addresses), starts the run,
//! writes the run directory and stops everyone. Shards and learners connect to each other
//! directly; the scheduler is not on the data path. Every connection is QUIC with mutual TLS.
//!
//! - `enrol`: a node's identity (its certificate, or one the scheduler signs for its join
//!   token), and the scheduler's enrolment service.
//! - `join`: the join handshake on both sides, and the welcome.
//! - `link`: a shard's or a learner's uplink to the scheduler: liveness, and joining again.
//! - `failover`: the scheduler's state in the run directory, and taking a job back with it.
//! - `scheduler`, `shard`, `learner`: one file per role.
//! - `loopback`: every role on its own thread in one process, over loopback QUIC.

mod aggregator;
mod enrol;
mod failover;
mod join;
mod learner;
mod link;
mod loopback;
mod roster;
mod scheduler;
mod serve;
mod shard;
mod shards;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use aggregator::run_aggregator;
pub use failover::{STATE_FILE, recorded_so_far, resumed_config};
pub use learner::run_learner;
pub use loopback::run_loopback;
use rudra_actors::InvalidSetting;
use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint, QuicSettings};
use rudra_transport::{Inbound, Role};
pub use scheduler::run_scheduler;
pub use shard::run_shard;
use tokio::sync::{Notify, mpsc};

use crate::RuntimeError;

/// How a node finds and authenticates its peers.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's name (its certificate `certs/NAME.pem`). `None`: `scheduler` for the
    /// scheduler; a shard or learner takes the name the scheduler assigns when it enrols with
    /// a join token, or else `shard-0` / `learner-0`.
    pub name: Option<String>,
    /// The certificate directory: the CA's certificate (and the scheduler's key), this node's
    /// certificate; where an enrolled node keeps the certificate it was given.
    pub certs: PathBuf,
    /// Where this node listens (the scheduler: for nodes; a shard: for learners). `None`: the
    /// scheduler `0.0.0.0:7070`, a shard the interface that reaches the scheduler on any port,
    /// a learner any.
    pub listen: Option<SocketAddr>,
    /// The scheduler's address, `HOST:PORT` (shards and learners); a DNS name is looked up at
    /// every attempt, so it may appear later (a headless Service).
    pub scheduler: Option<String>,
    /// A shard: the address learners reach it at, `HOST:PORT` (a stable DNS name where the
    /// shard may move); default its listen address.
    pub advertise: Option<String>,
    /// How long to keep trying to reach a peer, and to wait for nodes to join.
    pub connect_timeout: Duration,
    /// Where to serve this node's metrics and health, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// A shard: resume from the checkpoint in this directory, and keep writing checkpoints
    /// there. The scheduler: take back the job whose run directory this is.
    pub resume: Option<PathBuf>,
    /// A shard: where to write checkpoints when not resuming (default: `checkpoint.dir`, else
    /// `checkpoints/`).
    pub checkpoints: Option<PathBuf>,
    /// A shard or learner without a certificate: the join token it enrols with.
    pub token: Option<String>,
    /// The CA certificate an enrolling node checks the scheduler against (default
    /// `certs/ca.pem`).
    pub ca: Option<PathBuf>,
    /// The scheduler: its run directory, where it records the join tokens used.
    pub run_dir: Option<PathBuf>,
    /// A learner: ends cleanly, saying goodbye, when notified (a Python learner's Ctrl-C).
    pub interrupt: Option<Arc<Notify>>,
}

impl NodeOptions {
    /// Options for node `name` with certificates in `certs`, everything else at its default.
    #[must_use]
    pub fn new(name: Option<String>, certs: PathBuf) -> Self {
        Self {
            name,
            certs,
            listen: None,
            scheduler: None,
            advertise: None,
            connect_timeout: Duration::from_secs(60),
            metrics_addr: None,
            resume: None,
            checkpoints: None,
            token: None,
            ca: None,
            run_dir: None,
            interrupt: None,
        }
    }
}

pub(crate) fn net(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Transport(rudra_transport::TransportError::Connection(e.to_string()))
}

/// The scheduler's address, which shards and learners need.
fn scheduler_addr(opts: &NodeOptions) -> Result<&str, RuntimeError> {
    opts.scheduler.as_deref().ok_or_else(|| {
        RuntimeError::Invalid(InvalidSetting::new(
            "--scheduler",
            "shards and learners need the scheduler's address (HOST:PORT)",
        ))
    })
}

/// This node's QUIC endpoint, with its identity (enrolling first if it has none) and at its
/// listen address.
async fn endpoint(opts: &NodeOptions, role: Role) -> Result<QuicEndpoint, RuntimeError> {
    let identity = enrol::identity(opts, role).await?;
    if identity.role() != role {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--name",
            format!(
                "{} is a {} certificate; this node runs as {}",
                identity.name(),
                identity.role().as_str(),
                role.as_str()
            ),
        )));
    }
    let listen = match (opts.listen, role) {
        (Some(listen), _) => listen,
        (None, Role::Scheduler) => SocketAddr::from(([0, 0, 0, 0], 7070)),
        (None, Role::Learner) => SocketAddr::from(([0, 0, 0, 0], 0)),
        // A shard or an aggregator listens on the interface that reaches the scheduler, on any
        // port.
        (None, Role::Shard | Role::Aggregator) => {
            let target = scheduler_addr(opts)?;
            let sched = retry(target, opts.connect_timeout, || async { resolve(target).await }).await?;
            SocketAddr::new(local_ip_towards(sched), 0)
        }
    };
    Ok(QuicEndpoint::bind(listen, identity, QuicSettings::default())?)
}

/// The address a shard tells learners to reach it at: `--advertise`, else its bound address
/// (with the interface that reaches `scheduler` when bound to all).
async fn advertised(opts: &NodeOptions, ep: &QuicEndpoint) -> Result<String, RuntimeError> {
    if let Some(a) = &opts.advertise {
        return Ok(a.clone());
    }
    let bound = ep.local_addr()?;
    if !bound.ip().is_unspecified() {
        return Ok(bound.to_string());
    }
    let sched = resolve(scheduler_addr(opts)?).await.map_err(net)?;
    Ok(SocketAddr::new(local_ip_towards(sched), bound.port()).to_string())
}

/// The local address this host uses to reach `peer` (no packet is sent).
fn local_ip_towards(peer: SocketAddr) -> std::net::IpAddr {
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    std::net::UdpSocket::bind(unspecified)
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map_or(unspecified.ip(), |a| a.ip())
}

/// `target` (`HOST:PORT`) looked up now: its first address, or why there is none.
async fn resolve(target: &str) -> Result<SocketAddr, String> {
    match tokio::net::lookup_host(target).await {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("{target} has no address")),
        Err(e) => Err(format!("cannot look up {target}: {e}")),
    }
}

/// Call `attempt` until it succeeds, backing off between tries, for at most `timeout`; its
/// `Err` says why it should be tried again. `what` names the peer in the log and the error.
async fn retry<T, F, Fut>(what: &str, timeout: Duration, mut attempt: F) -> Result<T, RuntimeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let why = match attempt().await {
            Ok(t) => return Ok(t),
            Err(why) => why,
        };
        if start.elapsed() + backoff > timeout {
            return Err(net(format!("gave up reaching {what} after {:.0?}: {why}", start.elapsed())));
        }
        tracing::info!("{what} not reachable ({why}); retrying in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// What the end of a node's connection to the scheduler means for the node: the run stopped
/// for a failure (with its reason), a refusal, or a lost scheduler.
fn scheduler_gone(ended: Ended) -> RuntimeError {
    match ended {
        Ended::Closed { goodbye: Some(Goodbye::RunFailed), reason } => RuntimeError::RunFailed(reason),
        Ended::Closed { goodbye: Some(Goodbye::Refused), reason } => {
            RuntimeError::Transport(rudra_transport::TransportError::Refused(reason))
        }
        other => net(format!("lost the scheduler ({other})")),
    }
}

/// End this node: close every connection, with this node's failure and its reason when
/// `result` is one, and wait (briefly) until the peers have been told.
async fn leave<T>(ep: &QuicEndpoint, result: &Result<T, RuntimeError>) {
    match result {
        Err(e) if !matches!(e, RuntimeError::RunFailed(_)) => ep.say_goodbye(Goodbye::Failed, &e.to_string()),
        _ => ep.close(),
    }
    let _ = tokio::time::timeout(HANG_UP, ep.wait_idle()).await;
}

/// How long a stopping node waits for its peers to hang up.
const HANG_UP: Duration = Duration::from_secs(5);

/// Close every connection of `ep` and wait (briefly) until the peers have been told, so they
/// see a clean close rather than an idle timeout.
async fn hang_up(ep: &QuicEndpoint) {
    ep.close();
    let _ = tokio::time::timeout(HANG_UP, ep.wait_idle()).await;
}

/// Connect to node `name` at `target` (`HOST:PORT`, looked up at every attempt), retrying
/// with backoff until `timeout`.
async fn connect_with_retry(
    ep: &QuicEndpoint,
    target: &str,
    name: &str,
    timeout: Duration,
) -> Result<Peer, RuntimeError> {
    retry(&format!("{name} at {target}"), timeout, || async {
        let addr = resolve(target).await?;
        match tokio::time::timeout(Duration::from_secs(3), ep.connect(addr, name)).await {
            Ok(Ok(peer)) => Ok(peer),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer from {addr} within 3 s")),
        }
    })
    .await
}

/// The next message, or an error naming what was expected.
async fn expect(
    rx: &mut mpsc::Receiver<Inbound>,
    what: &str,
    within: Duration,
) -> Result<Inbound, RuntimeError> {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(net(format!("the connection closed while waiting for {what}"))),
        Err(_) => Err(net(format!("no {what} within {within:?}"))),
    }
}
