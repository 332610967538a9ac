//! A shard's process: join the scheduler, start the shard role (resuming from its checkpoint
//! when it rejoins a running job or is told to), serve the learners that connect, answer the
//! scheduler, stop when told.

use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use rudra_actors::Models;
use rudra_actors::checkpoint::Checkpoints;
use rudra_actors::faults::{Crash, Node};
use rudra_actors::messages::{Resumed, Snapshot, StopShard};
use rudra_actors::remote::codec::{self, DataPolicy, ToShard};
use rudra_actors::remote::{AnswerSnapshot, RemoteScheduler};
use rudra_actors::roles::{ShardStart, crash_and_restart, inject_panic, start_shard};
use rudra_actors::shard::ShardActor;
use rudra_compute::{CpuBackend, Device};
use rudra_transport::quic::{Peer, QuicEndpoint};
use rudra_transport::{Inbound, Role, ShardId};
use tokio::sync::mpsc;

use super::join::{Welcome, join};
use super::link::UpLink;
use super::scheduler::{serve_metrics, set_ready};
use super::serve::{Desk, LearnerPolicy, accept_learners};
use super::{NodeOptions, endpoint, leave, net};
use crate::exporter::{MetricsEndpoint, Serving};
use crate::{Config, RuntimeError};

/// Run a shard: join, serve learners, answer the scheduler, stop when told. A shard that
/// rejoins a running job (or is started with `--resume`) continues from its checkpoint. Its
/// initial parameters come from `models` (the configured network when `None`). It sends the
/// scheduler heartbeats, and tells it why if it fails.
pub fn run_shard(opts: &NodeOptions, models: Option<Models>) -> Result<(), RuntimeError> {
    let opts = opts.clone();
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Shard).await?;
        let serving = serve_metrics(exporter, &ep)?;
        let joined = join(&ep, &opts, Role::Shard).await?;
        let result = serve(&ep, &opts, joined, models, serving.as_ref()).await;
        leave(&ep, &result).await;
        result?;
        tracing::info!("stopped by the scheduler");
        Ok(())
    })
}

/// The shard's work once it joined: serve learners and the scheduler until told to stop.
async fn serve(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    (sched, rx, welcome): (Peer, mpsc::Receiver<Inbound>, Welcome),
    models: Option<Models>,
    serving: Option<&Serving>,
) -> Result<(), RuntimeError> {
    let metrics = serving.map(|s| Arc::clone(s.metrics()));
    let (id, config) = (ShardId(welcome.id), &welcome.config);
    let models = models.unwrap_or_else(|| config.models(Device::Cpu(CpuBackend)));
    let mut link = UpLink::new((sched, rx), (Role::Shard, &welcome.job), config.liveness);
    let tracker = link.reports().clone();
    let checkpoints = shard_checkpoints(opts, config, &welcome.job);
    let resume = opts.resume.is_some() || welcome.incarnation > 0;
    let start = if resume { ShardStart::Resume } else { ShardStart::Fresh };
    let (shard, resumed) = start_shard(
        (&config.cluster, &models, welcome.train_examples),
        id,
        tracker.clone().recipient(),
        (metrics.as_ref(), checkpoints),
        &start,
        &Arbiter::current(),
    )?;
    if let Some(clock) = resumed {
        tracker.do_send(Resumed(clock));
    }
    let range_len = config.cluster.shard_ranges(models.param_count())[id.index()].len();
    let policy = LearnerPolicy {
        names: Arc::new(welcome.learners.clone()),
        desks: Arc::new(vec![desk(id, &shard, data_policy(config, range_len))]),
        metrics,
    };
    actix::spawn(accept_learners(ep.clone(), policy));
    set_ready(serving);
    if let Some(at) = config.faults.panic_of(Node::Shard(id)).filter(|_| !resume) {
        inject_panic(at, shard.clone().recipient());
    }
    let crash = config.faults.crash_of(Node::Shard(id)).filter(|_| !resume);
    let (failed_tx, mut failed) = mpsc::channel(1);
    if let Some(c) = crash {
        actix::spawn(injected_crash(c, shard.clone(), tracker.clone(), failed_tx));
    }
    // The learners are served meanwhile, also while the scheduler is away.
    let result = loop {
        tokio::select! {
            m = link.next(ep, opts) => match m {
                Ok(m) => match answer(m, &shard, &tracker).await {
                    Ok(true) => break Ok(()),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            },
            Some(e) = failed.recv() => return Err(e),
        }
    };
    // The shard's state is kept for a restart: on its way out it writes a checkpoint.
    let _ = shard.send(StopShard { failure: result.as_ref().err().map(ToString::to_string) }).await;
    result.map_err(|e| match e {
        e @ RuntimeError::RunFailed(_) => e,
        other => net(format!("{other}; restart this shard with --resume to continue from its checkpoint")),
    })
}

/// Carry out the scheduler's message `m`; whether it stopped the run.
async fn answer(
    m: Inbound,
    shard: &Addr<ShardActor>,
    tracker: &Addr<RemoteScheduler>,
) -> Result<bool, RuntimeError> {
    match codec::to_shard(m) {
        Ok(ToShard::SnapshotRequest(request)) => {
            // The shard flushes its records to the tracker's stand-in before answering; the
            // answer follows them through the same stand-in, in order.
            let weights = shard.send(Snapshot).await.map_err(net)?;
            tracker.do_send(AnswerSnapshot { request, weights });
        }
        Ok(ToShard::Membership(m)) => shard.do_send(m),
        Ok(ToShard::Heartbeat) => {}
        Ok(ToShard::Stop) => return Ok(true),
        Err(e) => tracing::warn!("from the scheduler: {e}"),
    }
    Ok(false)
}

/// An injected crash of this shard at `c.at` after it joined: it loses what it holds in
/// memory, and `c.restart_after` later comes back from its checkpoint and tells the scheduler.
async fn injected_crash(
    c: Crash,
    shard: Addr<ShardActor>,
    sched: Addr<RemoteScheduler>,
    failed: mpsc::Sender<RuntimeError>,
) {
    tokio::time::sleep(c.at).await;
    let down = c.restart_after.unwrap_or_default();
    let crashed = |clock| tracing::error!("crashed at clock {clock} (fault injection)");
    match crash_and_restart(&shard, down, crashed).await {
        // Through the scheduler's stand-in: on its current connection, or kept until it is back.
        Some(Ok(clock)) => sched.do_send(Resumed(clock)),
        Some(Err(e)) => drop(failed.send(e.into()).await),
        None => {}
    }
}

/// Shard `id`'s own desk: it takes every message a learner (or a group's aggregator) sends it.
fn desk(id: ShardId, shard: &Addr<ShardActor>, data: DataPolicy) -> Desk {
    let (pull, push) = (shard.clone().recipient(), shard.clone().recipient());
    let (exchange, aggregate) = (Some(shard.clone().recipient()), Some(shard.clone().recipient()));
    Desk { shard: id, data, pull, push, exchange, aggregate, members: None }
}

/// What a learner may send a shard of `range_len` values in the job of `config`.
pub(super) fn data_policy(config: &Config, range_len: usize) -> DataPolicy {
    DataPolicy {
        range_len,
        push: config.cluster.codecs.gradients.codec,
        exchange: config.cluster.exchange_encoding().codec,
    }
}

/// Where a shard process of the run `job` keeps its checkpoints: `--resume DIR`, else the
/// directory it was given, else `checkpoint.dir`, else `checkpoints/`; none when
/// `checkpoint.every_updates` is 0.
fn shard_checkpoints(opts: &NodeOptions, config: &Config, job: &str) -> Option<Checkpoints> {
    let dir = (opts.resume.clone().or_else(|| opts.checkpoints.clone()))
        .or_else(|| config.checkpoint.dir.clone())
        .unwrap_or_else(|| PathBuf::from("checkpoints"));
    config.checkpoints_in(dir, job)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    use std::time::Duration;

    use rudra_actors::messages::GetStats;
    use rudra_actors::roles::start_tracker;
    use rudra_proto::{
        CenterRule, CenterShard, LrModulation, LrSchedule, SgdShard, SgdShardConfig, ShardCore, SyncRule,
    };
    use rudra_proto::{DropReason, LeaderGroups};
    use rudra_transport::quic::QuicSettings;
    use rudra_transport::tls::CertDir;
    use rudra_transport::{Clock, Codec, Encoding, Inbound, LearnerId, Msg};

    use super::*;

    const WITHIN: Duration = Duration::from_secs(10);

    fn learner_endpoint(certs: &CertDir, name: &str) -> QuicEndpoint {
        let any = "127.0.0.1:0".parse().expect("an address");
        QuicEndpoint::bind(any, certs.identity(name).expect("issued"), QuicSettings::default())
            .expect("bound")
    }

    /// A learner connection that has said hello as `id`.
    async fn hello(certs: &CertDir, name: &str, id: u32, shard: SocketAddr) -> (QuicEndpoint, Peer) {
        let ep = learner_endpoint(certs, name);
        let peer = ep.connect(shard, "shard-0").await.expect("connected");
        peer.send(&Msg::Hello { learner: LearnerId(id), shard: ShardId(0) }).await.expect("sent");
        (ep, peer)
    }

    /// A CA with certificates for `shard-0` and two learners.
    fn cluster_certs(dir: &std::path::Path) -> CertDir {
        let certs = CertDir::new(dir);
        certs.init().expect("a CA");
        for name in ["shard-0", "learner-0", "learner-1"] {
            certs.issue(name).expect("a certificate");
        }
        certs
    }

    /// `core` as shard 0, serving learners 0 and 1 (4 values each) over QUIC: its address,
    /// its actor and its tracker.
    fn serve(
        certs: &CertDir,
        core: ShardCore,
    ) -> (QuicEndpoint, SocketAddr, Addr<ShardActor>, Addr<rudra_actors::tracker::StalenessTracker>) {
        let ep = QuicEndpoint::bind(
            "127.0.0.1:0".parse().expect("an address"),
            certs.identity("shard-0").expect("issued"),
            QuicSettings::default(),
        )
        .expect("bound");
        let addr = ep.local_addr().expect("an address");
        let tracker = start_tracker(None, LeaderGroups::default());
        let shard =
            ShardActor::new(core, tracker.clone().recipient(), None, None, Encoding::default()).start();
        let data = DataPolicy { range_len: 4, push: Codec::F32, exchange: Codec::F32 };
        let policy = LearnerPolicy {
            names: Arc::new(vec!["learner-0".into(), "learner-1".into()]),
            desks: Arc::new(vec![desk(ShardId(0), &shard, data)]),
            metrics: None,
        };
        actix::spawn(accept_learners(ep.clone(), policy));
        (ep, addr, shard, tracker)
    }

    fn learners() -> BTreeSet<LearnerId> {
        [LearnerId(0), LearnerId(1)].into()
    }

    /// Bad input from learners, over real QUIC connections to a shard's learner service: each
    /// misbehaving connection is closed, the shard's parameters and clock stay as they were,
    /// and a well-behaved learner is served before, during and after.
    #[test]
    fn bad_learner_input_is_refused_and_the_shard_is_unchanged() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let certs = cluster_certs(dir.path());
        actix::System::new().block_on(async {
            let cfg = SgdShardConfig {
                id: ShardId(0),
                rule: SyncRule::Softsync { n: 2 },
                modulation: LrModulation::None,
                max_staleness: None,
                backups: 0,
                quorum: None,
                schedule: LrSchedule { base: 0.5, decay: 1.0 },
                batch: 1,
                gradients_per_epoch: 100,
                prefetch: 0,
            };
            let core = ShardCore::Sgd(SgdShard::new(cfg, vec![1.0; 4], learners()));
            let (ep, addr, shard, tracker) = serve(&certs, core);

            let (_good_ep, good) = hello(&certs, "learner-0", 0, addr).await;
            let mut weights = good.incoming(4);
            good.send(&Msg::Pull { learner: LearnerId(0), seq: 1, last: false }).await.expect("sent");
            let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
            assert!(matches!(served, Some(Inbound::Weights { clock: Clock(0), .. })));
            let before = shard.send(Snapshot).await.expect("a snapshot");

            let push = |learner, n| Msg::Push {
                learner: LearnerId(learner),
                seq: 1,
                computed_on: Clock(0),
                values: vec![1.0; n].into(),
                examples: 1,
                next_seq: 2,
                last: false,
            };
            let cases: Vec<(&str, &str, u32, Vec<Msg>)> = vec![
                ("hello as another learner", "learner-1", 0, vec![]),
                ("hello as an unknown learner", "learner-1", 7, vec![]),
                ("push of the wrong length", "learner-0", 0, vec![push(0, 3)]),
                ("push as another learner", "learner-0", 0, vec![push(1, 4)]),
                (
                    "pull as another learner",
                    "learner-0",
                    0,
                    vec![Msg::Pull { learner: LearnerId(1), seq: 1, last: false }],
                ),
                ("heartbeat on the data path", "learner-0", 0, vec![Msg::Heartbeat]),
            ];
            for (what, name, id, msgs) in cases {
                let (_ep, peer) = hello(&certs, name, id, addr).await;
                for m in &msgs {
                    peer.send(m).await.unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                let why = tokio::time::timeout(WITHIN, peer.closed()).await;
                let why = why.unwrap_or_else(|_| panic!("{what}: the shard did not close the connection"));
                assert!(why.contains("protocol violation") || why.contains("hello"), "{what}: {why}");
                let now = shard.send(Snapshot).await.expect("a snapshot");
                assert_eq!((now.clock, &now.values), (before.clock, &before.values), "{what}");
            }

            // The well-behaved learner's connection was never disturbed: its push is applied, and
            // the pull it carries answered.
            good.send(&push(0, 4)).await.expect("sent");
            let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
            let Some(Inbound::Weights { clock, values, .. }) = served else { panic!("expected weights") };
            // 2-softsync with λ = 2 applies every gradient: θ − 0.5 · 1.
            assert_eq!((clock, &values[..]), (Clock(1), &[0.5; 4][..]));

            // NaN and Inf gradients over the wire are dropped: the connection stays, the
            // weights and the clock do not move, and the learner's next push applies.
            for (seq, bad) in [(2, f32::NAN), (3, f32::INFINITY)] {
                let values = vec![1.0, bad, 1.0, 1.0].into();
                let m = Msg::Push {
                    learner: LearnerId(0),
                    seq,
                    computed_on: Clock(1),
                    values,
                    examples: 1,
                    next_seq: seq + 1,
                    last: false,
                };
                good.send(&m).await.expect("sent");
                let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
                let Some(Inbound::Weights { clock, values, .. }) = served else { panic!("expected weights") };
                assert_eq!((clock, &values[..]), (Clock(1), &[0.5; 4][..]), "{bad} changed nothing");
            }
            good.send(&Msg::Push {
                learner: LearnerId(0),
                seq: 4,
                computed_on: Clock(1),
                values: vec![1.0; 4].into(),
                examples: 1,
                next_seq: 5,
                last: false,
            })
            .await
            .expect("sent");
            let served = tokio::time::timeout(WITHIN, weights.recv()).await.expect("weights in time");
            let Some(Inbound::Weights { clock, values, .. }) = served else { panic!("expected weights") };
            assert_eq!((clock, &values[..]), (Clock(2), &[0.0; 4][..]), "a finite push applies again");
            // A snapshot flushes the shard's records to the tracker, which counts the drops.
            assert_eq!(shard.send(Snapshot).await.expect("a snapshot").clock, Clock(2));
            let stats = tracker.send(GetStats).await.expect("the tracker's statistics");
            assert_eq!(stats.staleness.dropped_by.get(&DropReason::NonFinite), Some(&2));
            ep.close();
        });
    }

    /// NaN and ±Inf exchanges over a real connection to an EASGD center: the center and its
    /// clock stay as they were, the drops are counted, and the learner gets the current center
    /// back; its next finite exchange applies.
    #[test]
    fn non_finite_exchanges_leave_the_center_unchanged() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let certs = cluster_certs(dir.path());
        actix::System::new().block_on(async {
            let rule = CenterRule::ElasticAsync { alpha: 0.5 };
            let core = ShardCore::Center(CenterShard::new(ShardId(0), rule, vec![1.0; 4], learners()));
            let (ep, addr, shard, tracker) = serve(&certs, core);
            let (_learner_ep, learner) = hello(&certs, "learner-0", 0, addr).await;
            let mut centers = learner.incoming(4);
            let exchange =
                |v: f32| Msg::Exchange { learner: LearnerId(0), values: vec![3.0, v, 3.0, 3.0].into() };
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                learner.send(&exchange(bad)).await.expect("sent");
                let served = tokio::time::timeout(WITHIN, centers.recv()).await.expect("a center in time");
                let Some(Inbound::Center { clock, values, .. }) = served else {
                    panic!("expected the center, got {served:?}")
                };
                assert_eq!((clock, &values[..]), (Clock(0), &[1.0; 4][..]), "{bad} changed the center");
            }
            learner.send(&exchange(3.0)).await.expect("sent");
            let served = tokio::time::timeout(WITHIN, centers.recv()).await.expect("a center in time");
            let Some(Inbound::Center { clock, values, .. }) = served else { panic!("expected the center") };
            // The learner gets the center it exchanged with; the center then moves by
            // α (x − x̃) = 0.5 · 2.
            assert_eq!((clock, &values[..]), (Clock(0), &[1.0; 4][..]));
            let after = shard.send(Snapshot).await.expect("a snapshot");
            assert_eq!(
                (after.clock, &after.values[..]),
                (Clock(1), &[2.0; 4][..]),
                "a finite exchange applies"
            );
            let stats = tracker.send(GetStats).await.expect("the tracker's statistics");
            assert_eq!(stats.staleness.dropped_by.get(&DropReason::NonFinite), Some(&3));
            ep.close();
        });
    }
}
