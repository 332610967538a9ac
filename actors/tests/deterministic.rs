//! The protocol cores under the deterministic harness (`rudra_proto::harness`): no threads,
//! no clocks, messages one tick long and integer compute times per learner.

use std::path::Path;

use rudra_compute::{BatchStream, CpuBackend, Dataset, Model, ModelSpec, Partition};
use rudra_proto::harness::{FaultSchedule, GradientFn, SgdOutcome, SgdSetup, run_sgd};
use rudra_proto::{Clock, LrModulation, Outcome, SyncRule};

/// `steps` steps of learners with these compute times over `shards` shards from `init`,
/// on links without faults.
fn run(
    (rule, bound): (SyncRule, Option<u64>),
    (init, shards): (Vec<f32>, u32),
    compute_ticks: Vec<u64>,
    (steps, lr): (u64, f32),
    grad: &mut GradientFn<'_>,
) -> SgdOutcome {
    let setup = SgdSetup {
        rule,
        max_staleness: bound,
        prefetch: 0,
        quorum: None,
        modulation: LrModulation::None,
        learners: compute_ticks.len() as u32,
        shards,
        init,
        compute_ticks,
        steps,
        lr,
        retry_every: 1_000_000,
        horizon: 1_000_000,
        groups: 1,
    };
    run_sgd(&setup, FaultSchedule { max_delay: 1, ..FaultSchedule::default() }, 0, grad)
        .unwrap_or_else(|v| panic!("{rule:?}: {v}"))
}

fn applied_sigmas(out: &SgdOutcome) -> Vec<u64> {
    (out.records.iter())
        .filter(|r| matches!(r.outcome, Outcome::Applied { .. }))
        .map(|r| r.staleness.0)
        .collect()
}

fn constant_grad(_: rudra_proto::LearnerId, _: u64, p: &[f32]) -> Vec<f32> {
    vec![1e-3; p.len()]
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

#[test]
fn softsync_staleness_is_about_n_for_equal_speed_learners() {
    let lambda = 8;
    for n in [1u32, 2, 4, 8] {
        let d = run(
            (SyncRule::Softsync { n }, None),
            (vec![0.0; 16], 2),
            vec![10; lambda],
            (200, 0.1),
            &mut constant_grad,
        );
        let sigmas = applied_sigmas(&d);
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
    let d =
        run((SyncRule::Hardsync, None), (vec![0.0; 9], 3), vec![3, 7, 10, 4], (50, 0.1), &mut constant_grad);
    let sigmas = applied_sigmas(&d);
    assert_eq!(sigmas.len(), 3 * 50 * 4);
    assert!(sigmas.iter().all(|&s| s == 0));
    assert!(d.clocks.iter().all(|&c| c == Clock(50)), "one update per round");
}

#[test]
fn the_staleness_bound_holds_with_slow_learners() {
    // Two learners 7× slower than the other six, async: unbounded, their gradients are
    // very stale; with s = 3 no applied gradient is older than 3.
    let ticks = vec![70, 70, 10, 10, 10, 10, 10, 10];
    let free = run(
        (SyncRule::Softsync { n: 8 }, None),
        (vec![0.0; 4], 1),
        ticks.clone(),
        (60, 0.1),
        &mut constant_grad,
    );
    let free_max = applied_sigmas(&free).into_iter().max().unwrap();
    assert!(free_max > 3, "the scenario must produce stale gradients without a bound (max σ {free_max})");

    for rule in [SyncRule::Softsync { n: 8 }, SyncRule::Softsync { n: 4 }, SyncRule::Softsync { n: 1 }] {
        let bounded = run((rule, Some(3)), (vec![0.0; 4], 2), ticks.clone(), (60, 0.1), &mut constant_grad);
        let sigmas = applied_sigmas(&bounded);
        let max = sigmas.iter().copied().max().unwrap();
        assert!(max <= 3, "{rule:?}: applied σ = {max} > s = 3");
        let dropped = bounded.records.iter().filter(|r| matches!(r.outcome, Outcome::Dropped(_))).count();
        let held = bounded.held;
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
    let mut grad = move |l: rudra_proto::LearnerId, _: u64, p: &[f32]| {
        let m = &mut models[l.index()];
        m.write_params(0, p).unwrap();
        data.gather(s[l.index()].next_batch(), &mut bx, &mut by);
        m.loss_and_gradient(&bx, &by).unwrap();
        let mut g = vec![0.0; p.len()];
        m.read_gradient(0, &mut g).unwrap();
        g
    };
    let d = run((SyncRule::Hardsync, None), (init.clone(), 2), vec![5, 9, 2, 7], (steps, lr), &mut grad);
    assert!(d.clocks.iter().all(|&c| c == Clock(steps)));
    let got = d.params;
    let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let moved = init.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "training moved the parameters (by {moved})");
    assert!(worst < 1e-5, "hardsync and sequential SGD differ by {worst} after {steps} updates");
}

/// A gradient that depends on where it is taken: θ − b, with b fixed.
fn pull_towards_b(_: rudra_proto::LearnerId, _: u64, p: &[f32]) -> Vec<f32> {
    p.iter().enumerate().map(|(i, &x)| x - (i as f32 * 0.25 - 1.0)).collect()
}

#[test]
fn prefetch_one_is_delayed_sgd_exactly() {
    // One learner, one shard, async, compute and each link one tick: with prefetch 1 the
    // learner computes gradient t on θ_{t−2} while gradient t − 1 travels (algorithms §4.1).
    let (steps, lr) = (30u64, 0.05f32);
    let init: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let setup = SgdSetup {
        rule: SyncRule::Async,
        max_staleness: None,
        prefetch: 1,
        quorum: None,
        modulation: LrModulation::None,
        learners: 1,
        shards: 1,
        init: init.clone(),
        compute_ticks: vec![1],
        steps,
        lr,
        retry_every: 1_000_000,
        horizon: 1_000_000,
        groups: 1,
    };
    let out =
        run_sgd(&setup, FaultSchedule { max_delay: 1, ..FaultSchedule::default() }, 0, &mut pull_towards_b)
            .expect("the run finishes");
    let mut thetas = vec![init];
    for t in 1..=steps as usize {
        let g = pull_towards_b(rudra_proto::LearnerId(0), 0, &thetas[t.saturating_sub(2)]);
        let mut next = thetas[t - 1].clone();
        rudra_compute::cpu::axpy(-lr, &g, &mut next);
        thetas.push(next);
    }
    assert_eq!(out.params, thetas[steps as usize], "θ_t = θ_(t−1) − α·g(θ_(t−2))");
    let sigmas = applied_sigmas(&out);
    assert_eq!(sigmas[..2], [0, 1]);
    assert!(sigmas.iter().skip(1).all(|&s| s == 1), "σ = 1 after the first: {sigmas:?}");
    assert_eq!(sigmas.len(), steps as usize);
}
