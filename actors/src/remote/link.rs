//! One connection's incoming messages, driven to their end: each handed to the handler of its
//! peer's role (the codec's decoding, then the actor message it becomes); what the handler
//! refuses is logged, or closes the connection where the peer must not misbehave.

use rudra_transport::Inbound;
use rudra_transport::quic::{Ended, Peer};
use tokio::sync::mpsc;

use super::codec::Unexpected;

/// What a message the handler refuses does to its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnRefused {
    /// Logged; the connection goes on (the scheduler's links, a learner's link to a shard).
    Log,
    /// The connection is closed as a protocol violation (a learner's link to a shard: the
    /// shard never sees what it refused).
    Close,
}

/// Hand `early` (messages read before, such as those that overtook a hello), then every message
/// of `rx`, to `handle`, until the connection ends; how it ended.
pub async fn drive_link(
    peer: &Peer,
    early: Vec<Inbound>,
    rx: &mut mpsc::Receiver<Inbound>,
    mut handle: impl FnMut(Inbound) -> Result<(), Unexpected>,
    refused: OnRefused,
) -> Ended {
    let mut early = early.into_iter();
    loop {
        let m = match early.next() {
            Some(m) => m,
            None => match rx.recv().await {
                Some(m) => m,
                None => break,
            },
        };
        let Err(e) = handle(m) else { continue };
        if refused == OnRefused::Log {
            tracing::warn!(peer = peer.name(), "{e}");
            continue;
        }
        tracing::warn!(peer = peer.name(), "rejected {e}; closing the connection");
        peer.close("protocol violation");
        break;
    }
    peer.ended().await
}
