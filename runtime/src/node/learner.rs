//! A learner's process: join the scheduler, connect to every shard, start the learner role
//! over stand-ins for them, train when told, stop when told. A lost connection to a shard or to
//! the scheduler is made again (within `--connect-timeout`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use actix::prelude::*;
use rudra_actors::faults::Node;
use rudra_actors::links;
use rudra_actors::messages::{StartLearner, StopLearner};
use rudra_actors::remote::AnswerEvaluate;
use rudra_actors::remote::codec::{self, ToLearner};
use rudra_actors::roles::{LearnerPeers, LearnerRun, inject_panic, start_learner};
use rudra_actors::{InvalidSetting, Models, TrainingData};
use rudra_compute::Device;
use rudra_transport::quic::{Ended, Goodbye, QuicEndpoint};
use rudra_transport::{LearnerId, Msg, Role};
use tokio::sync::mpsc;

use super::join::{Welcome, join};
use super::link::UpLink;
use super::scheduler::{serve_metrics, set_ready};
use super::shards::{connect_shards, keep_shard};
use super::{NodeOptions, endpoint, leave, scheduler_gone};
use crate::exporter::{MetricsEndpoint, Serving};
use crate::{Config, RuntimeError, Summary};

/// Builds a learner's models from the run's configuration, which the learner is given when it
/// joins (a Python learner's model over the run's parameters, say).
pub type MakeModels<'a> = &'a (dyn Fn(&Config) -> Result<Models, RuntimeError> + Sync);

/// Run a learner: join, connect to every shard, train when told, stop when told. It trains on
/// `data` when given, else on the dataset the run configuration names, with the models `models`
/// makes when given, else the configured network on the configured device. A learner that restarted
/// and rejoins the running job starts at once, its step numbers after every earlier
/// incarnation's. A learner that fails tells the scheduler why as it goes. Returns the run's
/// `summary.json` as the scheduler gave it, checked to be one (none from a learner that crashed
/// by fault injection).
pub fn run_learner(
    opts: &NodeOptions,
    data: Option<TrainingData>,
    models: Option<MakeModels<'_>>,
) -> Result<Option<String>, RuntimeError> {
    let opts = opts.clone();
    let exporter = MetricsEndpoint::bind_if(opts.metrics_addr)?;
    actix::System::new().block_on(async move {
        let ep = endpoint(&opts, Role::Learner).await?;
        let serving = serve_metrics(exporter, &ep)?;
        let (sched, rx, welcome) = join(&ep, &opts, Role::Learner).await?;
        let mut link = UpLink::new((sched, rx), (Role::Learner, &welcome.job), welcome.config.liveness);
        let result = learn(&ep, &opts, &mut link, &welcome, (data, models), serving.as_ref()).await;
        let result = match result {
            Ok(Exit::Crashed) => return Ok(None),
            Ok(Exit::Stopped(summary)) => Ok(summary),
            Err(e) => Err(e),
        };
        leave(&ep, &result).await;
        let summary = result?;
        tracing::info!("stopped by the scheduler");
        Ok(summary)
    })
}

/// How a learner's run ended without an error.
enum Exit {
    /// The scheduler stopped it, with the run's summary if it gave one.
    Stopped(Option<String>),
    /// It crashed by fault injection: nothing is said to anyone.
    Crashed,
}

/// The learner's work once it joined over `link`.
async fn learn(
    ep: &QuicEndpoint,
    opts: &NodeOptions,
    link: &mut UpLink,
    welcome: &Welcome,
    (data, models): (Option<TrainingData>, Option<MakeModels<'_>>),
    serving: Option<&Serving>,
) -> Result<Exit, RuntimeError> {
    let (config, incarnation) = (&welcome.config, welcome.incarnation);
    let data = match data {
        Some(d) => d,
        None => config.data.load()?,
    };
    if data.train.len() != welcome.train_examples {
        return Err(InvalidSetting::new(
            "training.data_dir",
            format!(
                "this learner reads {} training examples, the scheduler {}; give every node the same dataset",
                data.train.len(),
                welcome.train_examples
            ),
        )
        .into());
    }
    let models = match models {
        Some(make) => make(config)?,
        None => config.models(Device::open(config.device)?),
    };
    let spec = &config.cluster;
    // The scheduler may stop the run while this learner reaches the shards (one failed).
    let (links, connections) = tokio::select! {
        connected = connect_shards(ep, opts, welcome, (LearnerId(welcome.id), models.param_count())) => connected?,
        ended = link.peer().ended() => return match ended {
            // The run ended before this learner took part (it joined late): a stop.
            Ended::Closed { goodbye: Some(Goodbye::Stopped), .. } => stopped(link, ep, opts).await,
            ended => Err(scheduler_gone(ended)),
        },
    };
    let me = LearnerId(welcome.id);
    // Fault injection: this learner's side of its links, its speed and its crash, timed
    // from when it joined.
    let run = LearnerRun {
        liveness: config.liveness,
        faults: config.faults.clone(),
        born: Instant::now(),
        incarnation,
        traffic: Some(ep.traffic()),
    };
    let arbiter = Arbiter::new();
    let peers = LearnerPeers { shards: links, scheduler: links::SchedulerLink::of(link.reports()) };
    let learner = start_learner((spec, &models, data.train), me, peers, &run, &arbiter.handle())?;
    let answers = learner.answer_routes().await?;
    let (lost_tx, mut lost_rx) = mpsc::channel(1);
    // Cleared as the learner stops, before its connections close: none is made again then.
    let training = Arc::new(AtomicBool::new(true));
    for (c, answer) in connections.into_iter().zip(answers) {
        let running = {
            let (learner, training) = (learner.clone(), Arc::clone(&training));
            move || training.load(Ordering::Relaxed) && learner.connected()
        };
        let deliver = move |a| answer.deliver(a);
        actix::spawn(keep_shard(c, (deliver, ep.clone(), opts.connect_timeout), running, lost_tx.clone()));
    }
    if let Some(at) = config.faults.panic_of(Node::Learner(me)).filter(|_| incarnation == 0) {
        inject_panic(at, learner.panic());
    }
    let crash = config.faults.crash_of(Node::Learner(me)).filter(|_| incarnation == 0);
    let crashed = async move {
        match crash {
            Some(c) => tokio::time::sleep_until((run.born + c.at).into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(crashed);
    set_ready(serving);
    if incarnation == 0 {
        link.peer().send(&Msg::Ready).await?;
    } else {
        learner.handle().start.do_send(StartLearner);
    }
    let mut summary = None;
    let result = loop {
        tokio::select! {
            m = link.next(ep, opts) => match m.map(codec::to_learner) {
                Ok(Ok(ToLearner::Start)) => learner.handle().start.do_send(StartLearner),
                Ok(Ok(ToLearner::Heartbeat)) => {}
                Ok(Ok(ToLearner::BatchSizes(sizes))) => learner.handle().sizes.do_send(sizes),
                Ok(Ok(ToLearner::Evaluate { request, evaluate })) => {
                    let asked = learner.handle().evaluate.send(evaluate);
                    let reports = link.reports().clone();
                    actix::spawn(async move {
                        let measured = asked.await.ok().flatten();
                        reports.do_send(AnswerEvaluate { request, measured });
                    });
                }
                Ok(Ok(ToLearner::Summary(json))) => summary = checked(json).or(summary),
                Ok(Ok(ToLearner::Stop)) => break Ok(Exit::Stopped(summary)),
                Ok(Err(e)) => tracing::warn!("from the scheduler: {e}"),
                Err(e) => break Err(e),
            },
            Some(e) = lost_rx.recv() => break Err(e),
            () = interrupted(opts) => break Err(RuntimeError::Interrupted),
            () = &mut crashed => {
                // As a crash: everything stops at once, no connection is closed.
                tracing::error!("crashed (fault injection)");
                ep.abort();
                arbiter.stop();
                return Ok(Exit::Crashed);
            }
        }
    };
    training.store(false, Ordering::Relaxed);
    learner.handle().stop.do_send(StopLearner::default());
    arbiter.stop();
    result
}

/// The scheduler's messages up to its stop, once it closed the connection: the run's summary
/// if it sent one.
async fn stopped(link: &mut UpLink, ep: &QuicEndpoint, opts: &NodeOptions) -> Result<Exit, RuntimeError> {
    let mut summary = None;
    loop {
        match codec::to_learner(link.next(ep, opts).await?) {
            Ok(ToLearner::Summary(json)) => summary = checked(json).or(summary),
            Ok(ToLearner::Stop) => return Ok(Exit::Stopped(summary)),
            _ => {}
        }
    }
}

/// The run's summary `json` if it is one.
fn checked(json: String) -> Option<String> {
    match serde_json::from_str::<Summary>(&json) {
        Ok(_) => Some(json),
        Err(e) => {
            tracing::warn!("the scheduler's summary of the run is not one: {e}");
            None
        }
    }
}

/// Resolves once the learner is interrupted; never without [`NodeOptions::interrupt`].
async fn interrupted(opts: &NodeOptions) {
    match &opts.interrupt {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}
