//! One role per process: `rudra-node --role scheduler|shard|learner`, each built by the same
//! calls of [`rudra_actors::roles`] as a cluster in one process, over stand-ins for the remote
//! actors ([`rudra_actors::remote`]).
//!
//! The scheduler listens, waits for the configured shards and learners to join, gives each its
//! id and the run configuration (learners also get the shards' addresses), starts the run,
//! writes the run directory and stops everyone. Shards and learners connect to each other
//! directly; the scheduler is not on the data path. Every connection is QUIC with mutual TLS.
//!
//! - `join`: the join handshake on both sides, and the welcome.
//! - `scheduler`, `shard`, `learner`: one file per role.
//! - `loopback`: every role on its own thread in one process, over loopback QUIC.

mod join;
mod learner;
mod loopback;
mod scheduler;
mod shard;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use learner::run_learner;
pub use loopback::run_loopback;
use rudra_actors::InvalidSetting;
use rudra_transport::quic::{Peer, QuicEndpoint, QuicSettings};
use rudra_transport::tls::CertDir;
use rudra_transport::{Inbound, Role};
pub use scheduler::run_scheduler;
pub use shard::run_shard;
use tokio::sync::mpsc;

use crate::RuntimeError;

/// How a node finds and authenticates its peers.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's name (its certificate `certs/NAME.pem`).
    pub name: String,
    /// The certificate directory.
    pub certs: PathBuf,
    /// Where this node listens (the scheduler: for nodes; a shard: for learners).
    pub listen: SocketAddr,
    /// The scheduler's address (shards and learners).
    pub scheduler: Option<SocketAddr>,
    /// How long to keep trying to reach a peer, and to wait for nodes to join.
    pub connect_timeout: Duration,
    /// Where to serve this node's metrics (the scheduler and shards), if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// A shard: resume from the checkpoint in this directory, and keep writing checkpoints
    /// there.
    pub resume: Option<PathBuf>,
    /// A shard: where to write checkpoints when not resuming (default: `checkpoint.dir`, else
    /// `checkpoints/`).
    pub checkpoints: Option<PathBuf>,
}

pub(crate) fn net(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Transport(rudra_transport::TransportError::Connection(e.to_string()))
}

fn endpoint(opts: &NodeOptions, role: Role) -> Result<QuicEndpoint, RuntimeError> {
    let identity = CertDir::new(&opts.certs).identity(&opts.name)?;
    if identity.role() != role {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--name",
            format!(
                "{} is a {} certificate; this node runs as {}",
                opts.name,
                identity.role().as_str(),
                role.as_str()
            ),
        )));
    }
    Ok(QuicEndpoint::bind(opts.listen, identity, QuicSettings::default())?)
}

/// How long a stopping node waits for its peers to hang up.
const HANG_UP: Duration = Duration::from_secs(5);

/// Close every connection of `ep` and wait (briefly) until the peers have been told, so they
/// see a clean close rather than an idle timeout.
async fn hang_up(ep: &QuicEndpoint) {
    ep.close();
    let _ = tokio::time::timeout(HANG_UP, ep.wait_idle()).await;
}

/// Connect to `name` at `addr`, retrying with backoff until `timeout`.
async fn connect_with_retry(
    ep: &QuicEndpoint,
    addr: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Peer, RuntimeError> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(3), ep.connect(addr, name)).await;
        let why = match attempt {
            Ok(Ok(peer)) => return Ok(peer),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 3 s".to_owned(),
        };
        if start.elapsed() + backoff > timeout {
            return Err(net(format!(
                "gave up reaching {name} at {addr} after {:.0?}: {why}",
                start.elapsed()
            )));
        }
        tracing::info!("{name} at {addr} not reachable ({why}); retrying in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
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
