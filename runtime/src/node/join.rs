//! The join handshake. A node connects to the scheduler and says who it is ([`Msg::Join`]); the
//! scheduler checks that against the node's certificate and answers with a welcome: the node's
//! id, the run configuration, and the addresses and names of its peers.

use std::collections::BTreeMap;
use std::time::Duration;

use rudra_transport::quic::{Ended, Goodbye, Peer, QuicEndpoint};
use rudra_transport::{Inbound, LearnerId, Msg, Role, TransportError};
use tokio::sync::mpsc;

use super::{NodeOptions, advertised, connect_with_retry, expect, net, scheduler_addr};
use crate::{Config, RuntimeError};

/// A node that has joined the scheduler.
pub(super) struct Joiner {
    pub(super) peer: Peer,
    pub(super) rx: mpsc::Receiver<Inbound>,
    pub(super) data_addr: String,
}

/// The join a node must send first: its messages from then on, and its data address. A node
/// that says anything else, or claims another name or role than its certificate's, is closed.
pub(super) async fn read_join(peer: &Peer) -> Option<(mpsc::Receiver<Inbound>, String)> {
    let mut rx = peer.incoming(256);
    match expect(&mut rx, "a join", Duration::from_secs(10)).await {
        Ok(Inbound::Control(Msg::Join { role, name, data_addr }))
            if role == peer.role() && name == peer.name() =>
        {
            Some((rx, data_addr))
        }
        other => {
            tracing::warn!(peer = peer.name(), "did not join as its certificate says: {other:?}");
            peer.say_goodbye(Goodbye::Refused, "expected a join matching the certificate's name and role");
            None
        }
    }
}

/// The nodes of a job, each kind ordered by name.
pub(super) struct Gathered {
    pub(super) shards: Vec<Joiner>,
    pub(super) learners: Vec<Joiner>,
    /// One per learner group, else none.
    pub(super) aggregators: Vec<Joiner>,
}

/// Wait for `config`'s shards, learners and aggregators to join.
pub(super) async fn gather(
    ep: &QuicEndpoint,
    config: &Config,
    within: Duration,
) -> Result<Gathered, RuntimeError> {
    let spec = &config.cluster;
    let want_shards = spec.shards as usize;
    let want_learners = spec.learners as usize;
    let want_aggregators = if spec.groups > 1 { spec.groups as usize } else { 0 };
    let (mut shards, mut learners, mut aggregators) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let deadline = tokio::time::Instant::now() + within;
    while shards.len() < want_shards || learners.len() < want_learners || aggregators.len() < want_aggregators
    {
        let Ok(next) = tokio::time::timeout_at(deadline, ep.accept()).await else {
            return Err(net(format!(
                "only {} of {want_shards} shards, {} of {want_learners} learners and {} of {want_aggregators} \
                 aggregators joined within {within:?}",
                shards.len(),
                learners.len(),
                aggregators.len()
            )));
        };
        let peer = match next {
            Some(Ok(peer)) => peer,
            Some(Err(e)) => {
                tracing::warn!("refused a node: {e}");
                continue;
            }
            None => return Err(net("the endpoint closed")),
        };
        let Some((rx, data_addr)) = read_join(&peer).await else { continue };
        let (slots, want) = match peer.role() {
            Role::Shard => (&mut shards, want_shards),
            Role::Learner => (&mut learners, want_learners),
            Role::Aggregator => (&mut aggregators, want_aggregators),
            Role::Scheduler => {
                peer.say_goodbye(Goodbye::Refused, "only shards, learners and aggregators join");
                continue;
            }
        };
        if slots.contains_key(peer.name()) {
            tracing::warn!(peer = peer.name(), "refused a second process of this name");
            let why = format!("{} has joined already; a second process of that name is refused", peer.name());
            peer.say_goodbye(Goodbye::Duplicate, &why);
            continue;
        }
        if slots.len() >= want {
            tracing::warn!(peer = peer.name(), "refused: no free slot");
            let why = format!("the job has all its {want} {}s", peer.role().as_str());
            peer.say_goodbye(Goodbye::Refused, &why);
            continue;
        }
        tracing::info!(peer = peer.name(), "joined");
        slots.insert(peer.name().to_owned(), Joiner { peer, rx, data_addr });
    }
    Ok(Gathered {
        shards: shards.into_values().collect(),
        learners: learners.into_values().collect(),
        aggregators: aggregators.into_values().collect(),
    })
}

/// What every node is told when it joins; only the id and the incarnation differ.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Invitation {
    pub(super) config_toml: String,
    pub(super) train_examples: u64,
    pub(super) shard_addrs: Vec<String>,
    pub(super) shard_names: Vec<String>,
    pub(super) learner_names: Vec<String>,
    /// The run's identity.
    pub(super) job: String,
    /// With learner groups: each group's members, whether the groups are hierarchical, and
    /// each group's aggregator's data address and certificate name.
    #[serde(default)]
    pub(super) groups: Vec<Vec<LearnerId>>,
    #[serde(default)]
    pub(super) hierarchical: bool,
    #[serde(default)]
    pub(super) aggregator_addrs: Vec<String>,
    #[serde(default)]
    pub(super) aggregator_names: Vec<String>,
}

impl Invitation {
    /// The welcome of node `id` of `role`. Where groups have aggregators, a member is given its
    /// group's aggregator in place of every shard, and a shard takes a group's messages from
    /// its aggregator and from no member: every member's with an aggregation tree, the
    /// leader's alone with hierarchical groups (the group speaks as its leader).
    pub(super) fn welcome(&self, (role, id): (Role, usize), incarnation: u32) -> Msg {
        let (mut shard_addrs, mut shard_names) = (self.shard_addrs.clone(), self.shard_names.clone());
        let mut learner_names = self.learner_names.clone();
        let group_of = |l: usize| self.groups.iter().position(|g| g.iter().any(|m| m.index() == l));
        match role {
            Role::Learner => {
                if let Some(g) = group_of(id) {
                    shard_addrs.fill(self.aggregator_addrs[g].clone());
                    shard_names.fill(self.aggregator_names[g].clone());
                }
            }
            Role::Shard => {
                for (l, name) in learner_names.iter_mut().enumerate() {
                    if let Some(g) = group_of(l) {
                        let leads = self.groups[g].first().is_some_and(|m| m.index() == l);
                        let speaks = leads || !self.hierarchical;
                        *name = if speaks { self.aggregator_names[g].clone() } else { String::new() };
                    }
                }
            }
            Role::Aggregator | Role::Scheduler => {}
        }
        Msg::Welcome {
            id: id as u32,
            config_toml: self.config_toml.clone(),
            train_examples: self.train_examples,
            shard_addrs,
            shard_names,
            learner_names,
            job: self.job.clone(),
            incarnation,
        }
    }
}

/// What the scheduler tells a node that joins.
pub(super) struct Welcome {
    /// Shard or learner id.
    pub(super) id: u32,
    /// The run configuration.
    pub(super) config: Config,
    /// Size of the scheduler's training set.
    pub(super) train_examples: usize,
    /// Shard addresses and certificate names (for learners).
    pub(super) shards: Vec<(String, String)>,
    /// Learner certificate names, by learner id (for shards).
    pub(super) learners: Vec<String>,
    /// 0 when the run starts; more when this node rejoins the running job.
    pub(super) incarnation: u32,
    /// The run's identity.
    pub(super) job: String,
}

/// Join the scheduler at `opts.scheduler`: returns the connection, its messages, and the welcome.
/// While another live process holds this node's name the scheduler refuses it as a duplicate;
/// the node tries again until `--connect-timeout` (the first may be lost meanwhile), as it does
/// when the connection is lost before the welcome (a refusal whose closing packet was lost
/// arrives as a reset). Any other refusal is final.
pub(super) async fn join(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    role: Role,
) -> Result<(Peer, mpsc::Receiver<Inbound>, Welcome), RuntimeError> {
    let start = std::time::Instant::now();
    let mut backoff = Duration::from_millis(200);
    loop {
        let out_of_time = start.elapsed() + backoff >= opts.connect_timeout;
        let why = match join_once(ep, opts, role).await {
            Ok(joined) => return Ok(joined),
            Err(Refusal::Other(e)) => return Err(e),
            Err(Refusal::Duplicate(why)) if out_of_time => {
                return Err(RuntimeError::Transport(TransportError::Refused(format!(
                    "refused by the scheduler for {:.0?}: {why}",
                    start.elapsed()
                ))));
            }
            Err(Refusal::Lost(why)) if out_of_time => {
                return Err(net(format!("the scheduler closed the connection before the welcome: {why}")));
            }
            Err(Refusal::Duplicate(why)) => format!("refused by the scheduler: {why}"),
            Err(Refusal::Lost(why)) => {
                format!("the connection to the scheduler was lost before the welcome: {why}")
            }
        };
        tracing::warn!("{why}; trying again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The connection to the scheduler ended as `ended`: the run's end for this node (it failed, or
/// refused this node), or else why it was lost, for [`rejoin`].
pub(super) fn lost_or_final(ended: Ended) -> Result<String, RuntimeError> {
    match super::scheduler_gone(ended) {
        e @ (RuntimeError::RunFailed(_) | RuntimeError::Transport(TransportError::Refused(_))) => Err(e),
        lost => Ok(lost.to_string()),
    }
}

/// The scheduler was lost (`why`): close `old` and join it again as a node of run `job`, within
/// `--connect-timeout` (a scheduler restarted with `--resume` takes its job back). The node
/// goes on with its work meanwhile. Returns the new connection and its messages.
pub(super) async fn rejoin(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    (role, job): (Role, &str),
    old: &Peer,
    why: &str,
) -> Result<(Peer, mpsc::Receiver<Inbound>), RuntimeError> {
    tracing::warn!("{why}; joining again (the work goes on meanwhile)");
    // The scheduler takes a new connection for this name only once the old one is gone.
    old.close("joining again");
    let (peer, inbox, again) = join(ep, opts, role)
        .await
        .map_err(|e| net(format!("{why}, and it was not back within {:?}: {e}", opts.connect_timeout)))?;
    if again.job != job {
        let role = role.as_str();
        return Err(net(format!(
            "the scheduler came back with another run (job {}, this {role} was in {job}); exiting so that \
             this {role} is started again for it",
            again.job
        )));
    }
    tracing::info!("joined the scheduler again");
    Ok((peer, inbox))
}

/// Why a join failed: another live process of this name, the connection lost before an
/// answer, or anything else.
enum Refusal {
    Duplicate(String),
    Lost(String),
    Other(RuntimeError),
}

impl<E: Into<RuntimeError>> From<E> for Refusal {
    fn from(e: E) -> Self {
        Self::Other(e.into())
    }
}

async fn join_once(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    role: Role,
) -> Result<(Peer, mpsc::Receiver<Inbound>, Welcome), Refusal> {
    let addr = scheduler_addr(opts)?;
    let sched = connect_with_retry(ep, addr, "scheduler", opts.connect_timeout).await?;
    let mut rx = sched.incoming(256);
    let data_addr = if role == Role::Learner { String::new() } else { advertised(opts, ep).await? };
    let name = ep.identity().name().to_owned();
    sched.send(&Msg::Join { role, name, data_addr }).await?;
    let answer = match tokio::time::timeout(opts.connect_timeout, rx.recv()).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Err(match sched.ended().await {
                Ended::Closed { goodbye: Some(Goodbye::Duplicate), reason } => Refusal::Duplicate(reason),
                Ended::Closed { goodbye: Some(Goodbye::Refused), reason } => {
                    TransportError::Refused(format!("refused by the scheduler: {reason}")).into()
                }
                Ended::Lost(why) => Refusal::Lost(why),
                other => {
                    net(format!("the scheduler closed the connection before the welcome: {other}")).into()
                }
            });
        }
        Err(_) => return Err(net(format!("no welcome within {:?}", opts.connect_timeout)).into()),
    };
    let Inbound::Control(Msg::Welcome {
        id,
        config_toml,
        train_examples,
        shard_addrs,
        shard_names,
        learner_names,
        job,
        incarnation,
    }) = answer
    else {
        return Err(net("the scheduler did not answer the join with a welcome").into());
    };
    let config = Config::from_toml(&config_toml).map_err(|e| match e {
        RuntimeError::Config(why) => RuntimeError::Config(format!("from the scheduler: {why}")),
        other => other,
    })?;
    tracing::info!(id, incarnation, "joined the run");
    let welcome = Welcome {
        id,
        config,
        train_examples: train_examples as usize,
        shards: shard_addrs.into_iter().zip(shard_names).collect(),
        learners: learner_names,
        incarnation,
        job,
    };
    Ok((sched, rx, welcome))
}
