//! The protocol cores under a deterministic driver: no threads, no clocks, zero-latency
//! messages and integer compute times, ties broken by learner id.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use rudra_compute::{BatchStream, CpuBackend, Dataset, Model, ModelSpec, Partition};
use rudra_proto::shard_ranges;
use rudra_proto::{
    GradientRecord, LearnerCore, LearnerEvent, LrModulation, LrSchedule, NextPull, Outcome, SgdShard,
    SgdShardConfig, ShardEvent, SyncRule,
};
use rudra_transport::{Clock, LearnerId, ShardId};

enum Msg {
    Pull(ShardId, LearnerId, bool, u64),
    Push(ShardId, LearnerId, Clock, u64, Arc<Vec<f32>>, NextPull),
    Weights(LearnerId, ShardId, Clock, u64, rudra_transport::Floats),
}

/// Computes learner `l`'s gradient on `params`.
type GradFn<'a> = Box<dyn FnMut(usize, &[f32]) -> Vec<f32> + 'a>;

struct Driver<'a> {
    shards: Vec<SgdShard>,
    ranges: Vec<Range<usize>>,
    learners: Vec<LearnerCore>,
    params: Vec<Vec<f32>>,
    compute_ticks: Vec<u64>,
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    queue: VecDeque<Msg>,
    now: u64,
    grad: GradFn<'a>,
    records: Vec<GradientRecord>,
}

impl<'a> Driver<'a> {
    fn new(
        (rule, bound): (SyncRule, Option<u64>),
        (init, shards): (Vec<f32>, usize),
        compute_ticks: Vec<u64>,
        (steps, lr): (u64, f32),
        grad: GradFn<'a>,
    ) -> Self {
        let lambda = compute_ticks.len();
        let active: BTreeSet<LearnerId> = (0..lambda as u32).map(LearnerId).collect();
        let ranges = shard_ranges(init.len(), shards);
        let shards = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| {
                let cfg = SgdShardConfig {
                    id: ShardId(s as u32),
                    rule,
                    modulation: LrModulation::None,
                    max_staleness: bound,
                    backups: 0,
                    schedule: LrSchedule { base: lr, decay: 1.0 },
                    gradients_per_epoch: u64::MAX,
                };
                SgdShard::new(cfg, init[r.clone()].to_vec(), active.clone())
            })
            .collect();
        let learners =
            (0..lambda).map(|l| LearnerCore::new(LearnerId(l as u32), ranges.len(), steps)).collect();
        Self {
            shards,
            ranges,
            learners,
            params: vec![init.clone(); lambda],
            compute_ticks,
            timers: BinaryHeap::new(),
            queue: VecDeque::new(),
            now: 0,
            grad,
            records: Vec::new(),
        }
    }

    fn learner_events(&mut self, l: usize, events: Vec<LearnerEvent>, grad: Option<&Arc<Vec<f32>>>) {
        let id = LearnerId(l as u32);
        for e in events {
            match e {
                LearnerEvent::Pull { shard, last, seq } => {
                    self.queue.push_back(Msg::Pull(shard, id, last, seq))
                }
                LearnerEvent::Push { shard, computed_on, seq, pull } => {
                    let g = grad.expect("pushes follow a computation");
                    let slice = Arc::new(g[self.ranges[shard.index()].clone()].to_vec());
                    self.queue.push_back(Msg::Push(shard, id, computed_on, seq, slice, pull));
                }
                LearnerEvent::Compute => self.timers.push(Reverse((self.now + self.compute_ticks[l], l))),
                LearnerEvent::Finished => {}
            }
        }
    }

    fn deliver(&mut self) {
        while let Some(m) = self.queue.pop_front() {
            let (s, events) = match m {
                Msg::Pull(s, l, last, seq) => {
                    let shard = &mut self.shards[s.index()];
                    (s, if last { shard.on_last_pull(l, seq) } else { shard.on_pull(l, seq) }.unwrap())
                }
                Msg::Push(s, l, c, seq, g, pull) => {
                    let shard = &mut self.shards[s.index()];
                    let mut events = shard.on_push(l, seq, c, &g).unwrap();
                    let then =
                        if pull.last { shard.on_last_pull(l, pull.seq) } else { shard.on_pull(l, pull.seq) };
                    events.extend(then.unwrap());
                    (s, events)
                }
                Msg::Weights(l, s, c, seq, v) => {
                    let events = self.learners[l.index()].on_weights(s, c, seq).unwrap();
                    self.params[l.index()][self.ranges[s.index()].clone()].copy_from_slice(&v);
                    self.learner_events(l.index(), events, None);
                    continue;
                }
            };
            for e in events {
                match e {
                    ShardEvent::Serve { learner, seq, weights } => {
                        self.queue.push_back(Msg::Weights(learner, s, weights.clock, seq, weights.values));
                    }
                    ShardEvent::Gradient(g) => self.records.push(g),
                    ShardEvent::Update(_) => {}
                }
            }
        }
    }

    /// Run until every learner has finished.
    fn run(&mut self) {
        for l in 0..self.learners.len() {
            let events = self.learners[l].on_start();
            self.learner_events(l, events, None);
        }
        self.deliver();
        while let Some(Reverse((t, l))) = self.timers.pop() {
            self.now = t;
            let g = Arc::new((self.grad)(l, &self.params[l]));
            let events = self.learners[l].on_computed().unwrap();
            self.learner_events(l, events, Some(&g));
            self.deliver();
        }
    }

    fn applied_sigmas(&self) -> Vec<u64> {
        self.records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Applied { .. }))
            .map(|r| r.staleness.0)
            .collect()
    }

    fn params(&self) -> Vec<f32> {
        self.shards.iter().flat_map(|s| s.snapshot().values.to_vec()).collect()
    }
}

fn constant_grad<'a>() -> GradFn<'a> {
    Box::new(|_, p: &[f32]| vec![1e-3; p.len()])
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

#[test]
fn softsync_staleness_is_about_n_for_equal_speed_learners() {
    let lambda = 8;
    for n in [1u32, 2, 4, 8] {
        let mut d = Driver::new(
            (SyncRule::Softsync { n }, None),
            (vec![0.0; 16], 2),
            vec![10; lambda],
            (200, 0.1),
            constant_grad(),
        );
        d.run();
        let sigmas = d.applied_sigmas();
        assert_eq!(sigmas.len(), 2 * 200 * lambda, "every gradient reaches both shards and is applied");
        let m = mean(&sigmas);
        let n = f64::from(n);
        eprintln!("n = {n}: ⟨σ⟩ = {m:.3}, max σ = {:?}", sigmas.iter().max());
        assert!((0.7 * n..=1.3 * n).contains(&m), "n = {n}: ⟨σ⟩ = {m} outside [0.7n, 1.3n]");
        assert!(sigmas.iter().all(|&s| s as f64 <= 2.0 * n), "n = {n}: σ above 2n");
    }
}

#[test]
fn hardsync_staleness_is_always_zero_even_with_unequal_learners() {
    let mut d = Driver::new(
        (SyncRule::Hardsync, None),
        (vec![0.0; 9], 3),
        vec![3, 7, 10, 4],
        (50, 0.1),
        constant_grad(),
    );
    d.run();
    let sigmas = d.applied_sigmas();
    assert_eq!(sigmas.len(), 3 * 50 * 4);
    assert!(sigmas.iter().all(|&s| s == 0));
    assert!(d.shards.iter().all(|s| s.clock() == Clock(50)), "one update per round");
}

#[test]
fn the_staleness_bound_holds_with_slow_learners() {
    // Two learners 7× slower than the other six, async: unbounded, their gradients are
    // very stale; with s = 3 no applied gradient is older than 3.
    let ticks = vec![70, 70, 10, 10, 10, 10, 10, 10];
    let mut free = Driver::new(
        (SyncRule::Softsync { n: 8 }, None),
        (vec![0.0; 4], 1),
        ticks.clone(),
        (60, 0.1),
        constant_grad(),
    );
    free.run();
    let free_max = free.applied_sigmas().into_iter().max().unwrap();
    assert!(free_max > 3, "the scenario must produce stale gradients without a bound (max σ {free_max})");

    for rule in [SyncRule::Softsync { n: 8 }, SyncRule::Softsync { n: 4 }, SyncRule::Softsync { n: 1 }] {
        let mut bounded =
            Driver::new((rule, Some(3)), (vec![0.0; 4], 2), ticks.clone(), (60, 0.1), constant_grad());
        bounded.run();
        let sigmas = bounded.applied_sigmas();
        let max = sigmas.iter().copied().max().unwrap();
        assert!(max <= 3, "{rule:?}: applied σ = {max} > s = 3");
        let dropped = bounded.records.iter().filter(|r| matches!(r.outcome, Outcome::Dropped(_))).count();
        let held: usize = bounded.shards.iter().map(SgdShard::held).sum();
        assert_eq!(
            sigmas.len() + dropped + held,
            2 * 60 * 8,
            "{rule:?}: every gradient is applied, reported dropped, or held for the next update"
        );
    }
}

fn mnist_head(n: usize) -> Dataset {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    rudra_compute::data::load_mnist(&dir).expect("the shipped MNIST files").0.head(n)
}

#[test]
fn hardsync_is_sequential_sgd_with_batch_mu_lambda() {
    let (lambda, mu, steps, lr, seed) = (4usize, 8usize, 25u64, 0.1f32, 7u64);
    let data = mnist_head(lambda * mu * steps as usize);
    let spec = ModelSpec::dense(784, vec![32], 10);
    let init = spec.init(seed);
    let parts = Partition::split(data.len(), lambda, seed);
    let streams = || -> Vec<BatchStream> {
        parts.iter().enumerate().map(|(l, p)| BatchStream::new(p.clone(), mu, seed, l as u64)).collect()
    };

    // Sequential SGD: each step one batch of μλ, the learners' batches side by side.
    let mut seq = Model::new(CpuBackend, spec.clone()).unwrap();
    seq.write_params(0, &init).unwrap();
    let mut s = streams();
    let (mut x, mut y, mut bx, mut by) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        x.clear();
        y.clear();
        for stream in &mut s {
            data.gather(stream.next_batch(), &mut bx, &mut by);
            x.extend_from_slice(&bx);
            y.extend_from_slice(&by);
        }
        seq.loss_and_gradient(&x, &y).unwrap();
        seq.apply_gradient(-lr).unwrap();
    }
    let mut want = vec![0.0; init.len()];
    seq.read_params(0, &mut want).unwrap();

    // Hardsync with λ learners of unequal speed, two shards.
    let mut models: Vec<Model<CpuBackend>> =
        (0..lambda).map(|_| Model::new(CpuBackend, spec.clone()).unwrap()).collect();
    let mut s = streams();
    let grad: GradFn = Box::new(move |l, p| {
        let m = &mut models[l];
        m.write_params(0, p).unwrap();
        data.gather(s[l].next_batch(), &mut bx, &mut by);
        m.loss_and_gradient(&bx, &by).unwrap();
        let mut g = vec![0.0; p.len()];
        m.read_gradient(0, &mut g).unwrap();
        g
    });
    let mut d =
        Driver::new((SyncRule::Hardsync, None), (init.clone(), 2), vec![5, 9, 2, 7], (steps, lr), grad);
    d.run();
    assert!(d.shards.iter().all(|s| s.clock() == Clock(steps)));
    let got = d.params();
    let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let moved = init.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "training moved the parameters (by {moved})");
    assert!(worst < 1e-5, "hardsync and sequential SGD differ by {worst} after {steps} updates");
}
