//! An aggregator's process: one learner group in front of every shard. It joins the scheduler
//! as group `g`, connects to every shard, serves the group's members on behalf of each shard (a
//! member's hello says which), and stops when told; the members and the shards never talk to
//! each other. Per shard it runs the actor a cluster in one process puts there:
//! - an aggregation tree (`docs/src/algorithms.md` §4.2): an [`Aggregator`] sends the shard
//!   each round's aggregate, the members' pulls riding on it, and the shard's answers go to the
//!   member whose pull they answer;
//! - hierarchical groups (§4.3): a [`GroupLeaderActor`] pushes each round's mean to the shard
//!   as the group's gradient, as the group's leader, and answers the members with the weights
//!   the shard gives the group.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix::prelude::*;
use rudra_actors::aggregator::Aggregator;
use rudra_actors::group_leader::GroupLeaderActor;
use rudra_actors::links::ShardLink;
use rudra_actors::messages::{Membership, Pull, Push};
use rudra_actors::remote::codec::{self, Answer, ToShard, Unexpected};
use rudra_actors::roles::AnswerRoute;
use rudra_actors::{ClusterSpec, InvalidSetting};
use rudra_transport::quic::{Peer, QuicEndpoint};
use rudra_transport::{Inbound, LearnerId, Role, ShardId};
use tokio::sync::mpsc;

use super::join::{Welcome, join};
use super::link::UpLink;
use super::scheduler::{serve_metrics, set_ready};
use super::serve::{Desk, LearnerPolicy, Members, accept_learners};
use super::shard::data_policy;
use super::shards::{ShardConnection, connect_shards, keep_shard};
use super::{NodeOptions, endpoint, leave};
use crate::RuntimeError;
use crate::exporter::{MetricsEndpoint, Serving};

/// Run an aggregator: join, connect to the shards, serve the group's members, stop when told.
pub fn run_aggregator(opts: &NodeOptions) -> Result<(), RuntimeError> {
    let opts = opts.clone();
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Aggregator).await?;
        let serving = serve_metrics(exporter, &ep)?;
        let joined = join(&ep, &opts, Role::Aggregator).await?;
        let result = aggregate(&ep, &opts, joined, serving.as_ref()).await;
        leave(&ep, &result).await;
        result?;
        tracing::info!("stopped by the scheduler");
        Ok(())
    })
}

/// The aggregator's work once it joined as group `welcome.id`.
async fn aggregate(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    (sched, rx, welcome): (Peer, mpsc::Receiver<Inbound>, Welcome),
    serving: Option<&Serving>,
) -> Result<(), RuntimeError> {
    let (config, spec) = (&welcome.config, &welcome.config.cluster);
    let groups = spec.learner_groups();
    let Some(members) = groups.get(welcome.id as usize).filter(|_| spec.groups > 1) else {
        let why = "an aggregator serves a learner group; this job has none for it (`cluster.groups`)";
        return Err(InvalidSetting::new("--role aggregator", why).into());
    };
    let Some(&leader) = members.first() else {
        return Err(InvalidSetting::new("cluster.groups", "a group without members").into());
    };
    let mut link = UpLink::new((sched, rx), (Role::Aggregator, &welcome.job), config.liveness);
    // With hierarchical groups the group speaks to the shards as its leader; with a tree each
    // member's pulls and contributions are its own.
    let (links, connections) =
        connect_shards(ep, opts, &welcome, (leader, config.model.param_count())).await?;
    let running = Arc::new(AtomicBool::new(true));
    let (lost_tx, mut lost) = mpsc::channel(1);
    let (mut desks, mut rounds) = (Vec::new(), Vec::new());
    for (s, (shard, c)) in links.into_iter().zip(connections).enumerate() {
        let round = Round::start(spec, (leader, members), (&shard, &c));
        let still = Arc::clone(&running);
        let running = move || still.load(Ordering::Relaxed);
        let deliver = (round.deliver, ep.clone(), opts.connect_timeout);
        actix::spawn(keep_shard(c, deliver, running, lost_tx.clone()));
        desks.push(Desk {
            shard: ShardId(s as u32),
            data: data_policy(config, shard.range.len()),
            pull: round.pull,
            push: round.push,
            exchange: None,
            aggregate: None,
            members: round.members,
        });
        rounds.push(round.membership);
    }
    // Only the group's members are served, each as its own certificate.
    let names = (welcome.learners.iter().enumerate())
        .map(|(l, name)| if members.iter().any(|m| m.index() == l) { name.clone() } else { String::new() })
        .collect();
    let metrics = serving.map(|s| Arc::clone(s.metrics()));
    let policy = LearnerPolicy { names: Arc::new(names), desks: Arc::new(desks), metrics };
    actix::spawn(accept_learners(ep.clone(), policy));
    set_ready(serving);
    tracing::info!(group = welcome.id, members = members.len(), "serving the group");
    let result = loop {
        tokio::select! {
            m = link.next(ep, opts) => match m.map(codec::to_shard) {
                Ok(Ok(ToShard::Membership(m))) => rounds.iter().for_each(|r| r.do_send(m.clone())),
                Ok(Ok(ToShard::Heartbeat)) => {}
                Ok(Ok(ToShard::Stop)) => break Ok(()),
                Ok(Ok(ToShard::SnapshotRequest(_))) => tracing::warn!("a snapshot request: an aggregator holds no weights"),
                Ok(Err(e)) => tracing::warn!("from the scheduler: {e}"),
                Err(e) => break Err(e),
            },
            Some(e) = lost.recv() => break Err(e),
        }
    };
    running.store(false, Ordering::Relaxed);
    result
}

/// Where one shard's answers go at an aggregator.
type Deliver = Box<dyn Fn(Answer) -> Result<(), Unexpected>>;

/// The group's actor in front of one shard, and its ends.
struct Round {
    /// Where the members' pulls and pushes go.
    pull: Recipient<Pull>,
    push: Recipient<Push>,
    /// Who is active, from the scheduler.
    membership: Recipient<Membership>,
    /// Where the shard's answers go.
    deliver: Deliver,
    /// With a tree: each member's stand-in, which the shard's answers to it reach.
    members: Option<Members>,
}

impl Round {
    /// The round of the group of `members` (the first of them `leader`) in front of the shard
    /// reached by `shard` over `c`: hierarchical rounds, or an aggregation tree's.
    fn start(
        spec: &ClusterSpec,
        (leader, members): (LearnerId, &[LearnerId]),
        (shard, c): (&ShardLink, &ShardConnection),
    ) -> Self {
        let encoding = spec.codecs.gradients;
        if spec.hierarchical {
            let to = (shard.push.clone(), shard.pull.clone());
            let round = GroupLeaderActor::new((leader, members.to_vec(), spec.group_n), to, encoding).start();
            // Every answer is to the group's own pull.
            let answers = AnswerRoute::Weights(round.clone().recipient());
            return Self {
                pull: round.clone().recipient(),
                push: round.clone().recipient(),
                membership: round.recipient(),
                deliver: Box::new(move |a| answers.deliver(a)),
                members: None,
            };
        }
        let to = (c.remote().clone().recipient(), shard.pull.clone());
        let round = Aggregator::new((members.to_vec(), spec.protocol.waits_for_all()), to, encoding).start();
        let answers = Members::default();
        let to_members = Arc::clone(&answers);
        Self {
            pull: round.clone().recipient(),
            push: round.clone().recipient(),
            membership: round.recipient(),
            deliver: Box::new(move |a| to_member(&to_members, a)),
            members: Some(answers),
        }
    }
}

/// An aggregation tree's answers go to the member whose pull they answer, on its connection.
fn to_member(members: &Members, a: Answer) -> Result<(), Unexpected> {
    match a {
        Answer::Weights { to, served } => {
            match members.get(&to) {
                Some(member) => member.do_send(served),
                // A member not connected now asks again when it is back.
                None => tracing::debug!(learner = %to, "weights for a member not connected"),
            }
            Ok(())
        }
        Answer::Center(_) => Err(Unexpected { what: "a center, answering nothing a group asks".into() }),
    }
}
