//! Serving learners' data connections: a shard serves every learner for its own range (and a
//! group's aggregator speaking for the group); an aggregator serves its group's members on
//! behalf of every shard. Either way a connection says hello as a learner its certificate may
//! speak for and as meant for one shard, and then brings only those learners' pulls, pushes,
//! aggregates and exchanges of that shard's length: anything else closes it before the actors
//! behind see it.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dashmap::DashMap;
use rudra_actors::messages::{Aggregate, Exchange, Pull, Push, Served};
use rudra_actors::metrics::Metrics;
use rudra_actors::remote::codec::{self, DataPolicy, LearnerData, Unexpected};
use rudra_actors::remote::{OnRefused, RemoteLearner, drive_link};
use rudra_proto::Contribution;
use rudra_transport::quic::{Peer, QuicEndpoint};
use rudra_transport::{Inbound, LearnerId, Msg, Role, ShardId};
use tokio::sync::mpsc;

use super::expect;

/// Where a learner's messages for one shard go: the shard itself, or the group's rounds in
/// front of it.
#[derive(Clone)]
pub(super) struct Desk {
    /// The shard they are for.
    pub(super) shard: ShardId,
    /// What a learner may send it: payloads of the shard's length, in the job's codecs.
    pub(super) data: DataPolicy,
    pub(super) pull: Recipient<Pull>,
    pub(super) push: Recipient<Push>,
    /// Where exchanges go; `None` where none is taken (a group's rounds).
    pub(super) exchange: Option<Recipient<Exchange>>,
    /// Where a group aggregator's aggregates go; `None` where none is taken (at an aggregator).
    pub(super) aggregate: Option<Recipient<Aggregate>>,
    /// At an aggregator: where each member connected for this shard is answered, for the
    /// shard's answers to its pulls to reach it.
    pub(super) members: Option<Members>,
}

/// Each member's stand-in, by learner, for one shard.
pub(super) type Members = Arc<DashMap<LearnerId, Recipient<Served>>>;

/// What a node accepts from learners, checked at the boundary before its actors see anything.
#[derive(Clone)]
pub(super) struct LearnerPolicy {
    /// `names[l]`: the certificate that speaks for learner `l` (at a shard serving groups, a
    /// group member's is its aggregator's: every member's with an aggregation tree, the
    /// leader's alone with hierarchical groups); empty where learner `l` is not served here.
    pub(super) names: Arc<Vec<String>>,
    /// The shards served, each at its desk.
    pub(super) desks: Arc<Vec<Desk>>,
    /// Where connected learners are counted.
    pub(super) metrics: Option<Arc<Metrics>>,
}

/// Accept connections on `ep` and serve those of learners and aggregators; refuse the others.
pub(super) async fn accept_learners(ep: QuicEndpoint, policy: LearnerPolicy) {
    while let Some(next) = ep.accept().await {
        match next {
            Ok(peer) if matches!(peer.role(), Role::Learner | Role::Aggregator) => {
                actix::spawn(serve_learner(peer, policy.clone()));
            }
            Ok(peer) => peer.close("only learners (and their groups' aggregators) connect here"),
            Err(e) => tracing::warn!("refused a connection: {e}"),
        }
    }
}

/// Payloads a learner's connection may bring before its hello: each travels on a stream of its
/// own, so a learner's first exchange (or a push) may overtake the hello on the control stream.
const BEFORE_HELLO: usize = 4;

/// The hello a learner's connection must bring first, as a learner its certificate speaks for
/// and for a shard served here, with the payloads that overtook it; `None` (logged) for anything
/// else.
async fn read_hello(
    peer: &Peer,
    rx: &mut mpsc::Receiver<Inbound>,
    policy: &LearnerPolicy,
) -> Option<(LearnerId, Desk, Vec<Inbound>)> {
    let mut early = Vec::new();
    loop {
        match expect(rx, "a hello", Duration::from_secs(10)).await {
            Ok(Inbound::Control(Msg::Hello { learner, shard }))
                if policy.names.get(learner.index()).is_some_and(|n| n == peer.name()) =>
            {
                let Some(desk) = policy.desks.iter().find(|d| d.shard == shard) else {
                    tracing::warn!(
                        peer = peer.name(),
                        "refused: a hello for {shard}, which is not served here"
                    );
                    return None;
                };
                return Some((learner, desk.clone(), early));
            }
            Ok(m) if early.len() < BEFORE_HELLO && !matches!(m, Inbound::Control(_)) => early.push(m),
            other => {
                tracing::warn!(
                    peer = peer.name(),
                    "refused: expected a hello as the learner this certificate names, got {other:?}"
                );
                return None;
            }
        }
    }
}

/// Serve one learner's connection (or a group aggregator's, speaking for every learner its
/// certificate speaks for). Anything but those learners' own pulls, pushes, aggregates and
/// exchanges of the right length closes the connection; the actors behind never see it.
async fn serve_learner(peer: Peer, policy: LearnerPolicy) {
    let mut rx = peer.incoming(64);
    let Some((learner, desk, early)) = read_hello(&peer, &mut rx, &policy).await else {
        peer.close("expected a hello matching the certificate, for a shard served here");
        return;
    };
    let _alive = policy.metrics.as_ref().map(Metrics::learner_connected);
    let speaks: Vec<LearnerId> = (policy.names.iter().enumerate())
        .filter(|(_, n)| *n == peer.name())
        .map(|(l, _)| LearnerId(l as u32))
        .collect();
    // One stand-in per learner spoken for: the shard's answers say whose pull they answer.
    let remotes: Vec<Addr<RemoteLearner>> =
        speaks.iter().map(|&l| RemoteLearner::new(l, peer.clone()).start()).collect();
    // Every learner named in a message is one of `speaks` (the codec checks it first).
    let remote = |l: LearnerId| remotes[speaks.iter().position(|&s| s == l).unwrap_or_default()].clone();
    if let Some(members) = &desk.members {
        members.insert(learner, remote(learner).recipient());
    }
    // A push travels on its own stream with the pull it carries, and a lone pull (a learner's
    // first, or a retry) on the control stream, so a pull may overtake the push before it: the
    // shard orders them by their sequence numbers.
    let handle = |m| {
        match codec::from_learner_data(&speaks, &desk.data, m)? {
            LearnerData::Pull { learner, seq, last } => {
                desk.pull.do_send(Pull { learner, seq, last, reply_to: remote(learner).recipient() });
            }
            LearnerData::Push { learner, seq, computed_on, values, examples, next } => {
                let reply_to = remote(learner).recipient();
                let then = Pull { learner, seq: next.seq, last: next.last, reply_to };
                desk.push.do_send(Push { learner, seq, computed_on, values: values.into(), examples, then });
            }
            LearnerData::Aggregate { members, computed_on, values } => {
                let Some(aggregate) = &desk.aggregate else {
                    return Err(Unexpected { what: "an aggregate, which only a shard takes".into() });
                };
                let then = (members.iter())
                    .map(|m| Pull {
                        learner: m.learner,
                        seq: m.next_seq,
                        last: m.last,
                        reply_to: remote(m.learner).recipient(),
                    })
                    .collect();
                let members = (members.iter())
                    .map(|m| Contribution { learner: m.learner, seq: m.seq, examples: m.examples })
                    .collect();
                aggregate.do_send(Aggregate { members, computed_on, values: values.into(), then });
            }
            LearnerData::Exchange(values) => {
                let Some(exchange) = &desk.exchange else {
                    return Err(Unexpected {
                        what: "an exchange, which a group's rounds do not take".into(),
                    });
                };
                exchange.do_send(Exchange {
                    learner,
                    values: values.into(),
                    reply_to: remote(learner).recipient(),
                });
            }
        }
        Ok(())
    };
    drive_link(&peer, early, &mut rx, handle, OnRefused::Close).await;
}
