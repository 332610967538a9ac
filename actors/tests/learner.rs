//! The learner actor between stand-in shards that record what it sends: an answer the loop
//! refuses (a duplicate) changes neither the model nor the clock the gradient is tagged with.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use rudra_actors::faults::{FaultPlan, Liveness};
use rudra_actors::links::{SchedulerLink, ShardLink};
use rudra_actors::messages::{Exchange, Heartbeat, LearnerDone, Progress, Pull, Push, Served, StartLearner};
use rudra_actors::roles::{LearnerPeers, LearnerRun, start_learner};
use rudra_actors::{BatchSizing, ClusterSpec, Models, ProtocolSpec, SgdSpec};
use rudra_compute::{ComputeError, Dataset, GradientModel};
use rudra_proto::{LrModulation, LrSchedule, SyncRule};
use rudra_transport::Codecs;
use rudra_transport::{Clock, LearnerId, ShardId};

/// Parameters the fake model held at every gradient it computed.
type Seen = Arc<Mutex<Vec<Vec<f32>>>>;

/// A fake model for this test: its gradient is zero, and it records the parameters it was
/// asked to compute on.
struct RecordingModel {
    params: Vec<f32>,
    seen: Seen,
}

impl GradientModel for RecordingModel {
    fn param_count(&self) -> usize {
        self.params.len()
    }
    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        self.params[offset..offset + values.len()].copy_from_slice(values);
        Ok(())
    }
    fn loss_and_gradient(&mut self, _: &[f32], _: &[u8]) -> Result<f32, ComputeError> {
        self.seen.lock().unwrap().push(self.params.clone());
        Ok(1.0)
    }
    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        out.fill(0.0);
        Ok(())
    }
    fn evaluate(&mut self, _: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        Ok((0.0, labels.len()))
    }
}

/// A fake shard for this test: it records the pulls and pushes it gets and answers nothing.
#[derive(Default)]
struct RecordingShard {
    pulls: Arc<Mutex<Vec<Pull>>>,
    pushes: Arc<Mutex<Vec<Push>>>,
}

impl Actor for RecordingShard {
    type Context = Context<Self>;
}

impl Handler<Pull> for RecordingShard {
    type Result = ();
    fn handle(&mut self, m: Pull, _: &mut Context<Self>) {
        self.pulls.lock().unwrap().push(m);
    }
}

impl Handler<Push> for RecordingShard {
    type Result = ();
    fn handle(&mut self, m: Push, _: &mut Context<Self>) {
        self.pushes.lock().unwrap().push(m);
    }
}

impl Handler<Exchange> for RecordingShard {
    type Result = ();
    fn handle(&mut self, _: Exchange, _: &mut Context<Self>) {}
}

/// A fake scheduler for this test: it takes the learner's reports and ignores them.
struct QuietScheduler;

impl Actor for QuietScheduler {
    type Context = Context<Self>;
}

impl Handler<Progress> for QuietScheduler {
    type Result = ();
    fn handle(&mut self, _: Progress, _: &mut Context<Self>) {}
}

impl Handler<LearnerDone> for QuietScheduler {
    type Result = ();
    fn handle(&mut self, _: LearnerDone, _: &mut Context<Self>) {}
}

impl Handler<Heartbeat> for QuietScheduler {
    type Result = ();
    fn handle(&mut self, _: Heartbeat, _: &mut Context<Self>) {}
}

/// Wait until `ready` holds, for at most five seconds.
async fn until(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn served(shard: u32, clock: u64, value: f32) -> Served {
    Served { shard: ShardId(shard), clock: Clock(clock), seq: 1, values: vec![value; 2].into() }
}

#[test]
fn a_duplicated_answer_changes_neither_the_model_nor_the_clock_the_gradient_is_computed_on() {
    let spec = ClusterSpec {
        learners: 1,
        shards: 2,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 1 },
            modulation: LrModulation::None,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 1,
        epochs: 1,
        schedule: LrSchedule { base: 0.1, decay: 1.0 },
        seed: 1,
        evals_per_epoch: 1,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    };
    let seen: Seen = Arc::default();
    let make = {
        let seen = Arc::clone(&seen);
        move || Ok(RecordingModel { params: vec![0.0; 4], seen: Arc::clone(&seen) })
    };
    let models = Models::custom(vec![0.0; 4], make);
    let train = Arc::new(Dataset::new(1, 2, vec![0.0, 1.0], vec![0, 1]).unwrap());
    actix::System::new().block_on(async move {
        let shards: Vec<RecordingShard> = (0..2).map(|_| RecordingShard::default()).collect();
        let (pulls, pushes): (Vec<_>, Vec<_>) =
            shards.iter().map(|s| (Arc::clone(&s.pulls), Arc::clone(&s.pushes))).unzip();
        let links = (shards.into_iter().zip([0..2, 2..4]))
            .map(|(s, range)| ShardLink::of(range, &s.start()))
            .collect();
        let scheduler = SchedulerLink::of(&QuietScheduler.start());
        let run = LearnerRun {
            liveness: Liveness::default(),
            faults: FaultPlan::default(),
            born: Instant::now(),
            incarnation: 0,
            traffic: None,
        };
        let arbiter = Arbiter::new();
        let peers = LearnerPeers { shards: links, scheduler };
        let learner = start_learner((&spec, &models, train), LearnerId(0), peers, &run, &arbiter.handle())
            .expect("a learner");
        learner.handle().start.do_send(StartLearner);
        until("both pulls", || pulls.iter().all(|p| !p.lock().unwrap().is_empty())).await;
        let reply = |s: usize| pulls[s].lock().unwrap()[0].reply_to.clone();
        reply(0).do_send(served(0, 5, 1.0));
        // A duplicate of shard 0's answer with other weights and another clock, before shard 1
        // has answered: refused by the loop, so it must not reach the model.
        reply(0).do_send(served(0, 9, 7.0));
        reply(1).do_send(served(1, 3, 2.0));
        until("the first push", || pushes.iter().all(|p| !p.lock().unwrap().is_empty())).await;
        assert_eq!(seen.lock().unwrap()[0], vec![1.0, 1.0, 2.0, 2.0], "the parameters computed on");
        let tags: Vec<Clock> = pushes.iter().map(|p| p.lock().unwrap()[0].computed_on).collect();
        assert_eq!(tags, vec![Clock(5), Clock(3)], "each gradient is tagged with the clock first served");
        arbiter.stop();
    });
}
