//! A node's links to the shards: a learner's own, or an aggregator's on behalf of its group.
//! Each is one connection per shard, said hello on as one learner, with the shard's stand-in
//! in front of it; a connection lost (the shard restarted, or the network failed for longer
//! than the idle timeout) is made again and the stand-in rebound.

use std::time::Duration;

use actix::prelude::*;
use rudra_actors::links::ShardLink;
use rudra_actors::remote::codec::{self, Answer, Unexpected};
use rudra_actors::remote::{OnRefused, Rebind, RemoteShard, drive_link};
use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint};
use rudra_transport::{Codec, LearnerId, Msg, ShardId};
use tokio::sync::mpsc;

use super::join::Welcome;
use super::{NodeOptions, connect_with_retry};
use crate::RuntimeError;

/// Connect to every shard of `welcome` and say hello as learner `me`: each shard's link over
/// a model of `param_count` parameters, and its connection.
pub(super) async fn connect_shards(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    welcome: &Welcome,
    (me, param_count): (LearnerId, usize),
) -> Result<(Vec<ShardLink>, Vec<ShardConnection>), RuntimeError> {
    let spec = &welcome.config.cluster;
    let (mut links, mut connections) = (Vec::new(), Vec::new());
    for (s, ((addr, name), range)) in welcome.shards.iter().zip(spec.shard_ranges(param_count)).enumerate() {
        let shard = ShardId(s as u32);
        let peer = connect_with_retry(ep, addr, name, opts.connect_timeout).await?;
        peer.send(&Msg::Hello { learner: me, shard }).await?;
        let remote = RemoteShard::new(shard, peer.clone()).start();
        links.push(ShardLink::of(range, &remote));
        let weights = spec.codecs.weights.codec;
        let (addr, name) = (addr.clone(), name.clone());
        connections.push(ShardConnection { peer, me, shard, addr, name, remote, weights });
    }
    Ok((links, connections))
}

/// A node's connection to one shard.
pub(super) struct ShardConnection {
    peer: Peer,
    /// The learner it says hello as, and the shard it is for.
    me: LearnerId,
    shard: ShardId,
    /// `HOST:PORT`, looked up again at every reconnection.
    addr: String,
    name: String,
    /// The shard's stand-in: the pulls and pushes leave through it.
    remote: Addr<RemoteShard>,
    /// The job's weights codec: answers in another are refused.
    weights: Codec,
}

impl ShardConnection {
    /// The shard's stand-in.
    pub(super) fn remote(&self) -> &Addr<RemoteShard> {
        &self.remote
    }
}

/// Hand the shard's answers to `deliver` (where the node takes them from this shard: as its
/// protocol family takes them, or to the member whose pull they answer); when the connection is
/// lost, connect again and go on, while `running` says the node still runs. A shard not
/// reachable within `timeout` is an error on `lost`.
pub(super) async fn keep_shard(
    mut c: ShardConnection,
    (deliver, ep, timeout): (impl Fn(Answer) -> Result<(), Unexpected>, QuicEndpoint, Duration),
    running: impl Fn() -> bool,
    lost: mpsc::Sender<RuntimeError>,
) {
    loop {
        let mut inbox = c.peer.incoming(8);
        let handle = |m| deliver(codec::answer(m, c.weights)?);
        let ended = drive_link(&c.peer, Vec::new(), &mut inbox, handle, OnRefused::Log).await;
        if !running() {
            return; // The node stopped: the run is over.
        }
        match ended {
            // A shard that failed may be started again in its place.
            Ended::Closed { goodbye: Some(Goodbye::Failed), reason } => {
                tracing::warn!("{} failed ({reason}); connecting again", c.name);
            }
            why @ Ended::Closed { .. } => return tracing::info!("{} closed the connection ({why})", c.name),
            Ended::Lost(why) => tracing::warn!("lost {} ({why}); connecting again", c.name),
        }
        let again = async {
            let peer = connect_with_retry(&ep, &c.addr, &c.name, timeout).await?;
            peer.send(&Msg::Hello { learner: c.me, shard: c.shard }).await?;
            Ok::<_, RuntimeError>(peer)
        };
        match again.await {
            Ok(peer) => {
                tracing::info!("connected to {} again", c.name);
                c.remote.do_send(Rebind(peer.clone()));
                c.peer = peer;
            }
            Err(e) => {
                let _ = lost.send(e).await;
                return;
            }
        }
    }
}
