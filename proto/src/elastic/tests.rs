//! The elastic cores (EASGD, EAMSGD, DOWNPOUR, MDOWNPOUR, DiLoCo) against exact arithmetic.

use super::*;
use crate::{LrModulation, OptimizerSpec, SgdShard, SgdShardConfig, SyncRule};

const L0: LearnerId = LearnerId(0);
const L1: LearnerId = LearnerId(1);

fn both() -> BTreeSet<LearnerId> {
    [L0, L1].into_iter().collect()
}

/// The centers served among `events`.
fn replies(events: Vec<ShardEvent>) -> Vec<(LearnerId, Vec<f32>)> {
    (events.into_iter())
        .filter_map(|e| match e {
            ShardEvent::Center { learner, weights } => Some((learner, weights.values.to_vec())),
            ShardEvent::Serve { .. } | ShardEvent::Quorum { .. } => {
                panic!("a center shard answered as an SGD one")
            }
            ShardEvent::Gradient(_) | ShardEvent::Update(_) => None,
        })
        .collect()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-6, "{a:?} != {b:?}");
    }
}

fn easgd(tau: u64, alpha: f32, lr: f32, momentum: f32) -> ElasticSettings {
    ElasticSettings { tau, alpha, lr, lr_decay_gamma: 0.0, momentum, optimizer: OptimizerSpec::Sgd }
}

#[test]
fn async_easgd_exchange_is_symmetric_and_gradient_is_taken_before_the_pull() {
    let mut shard =
        CenterShard::new(ShardId(0), CenterRule::ElasticAsync { alpha: 0.5 }, vec![1.0, 2.0], both());
    let mut learner = ElasticLearner::new(easgd(2, 0.5, 0.1, 0.0), 2);
    let mut x = vec![3.0, 6.0];
    assert!(learner.exchanges_now());
    let mut at = Vec::new();
    learner.gradient_point(&x, &mut at);
    assert_eq!(at, x, "EASGD: the gradient point is x before the elastic pull");
    let (_, center) = replies(shard.on_exchange(L0, &x).unwrap()).remove(0);
    assert_eq!(center, vec![1.0, 2.0], "the learner gets x̃ from before the exchange");
    close(&shard.snapshot().values, &[2.0, 4.0]); // x̃ + α (x − x̃)
    let g: Vec<f32> = at.iter().map(|v| v * 10.0).collect(); // g(x) = 10 x
    learner.step(&mut x, &g, Some(&center));
    // x − α (x − x̃) − η g(x) = [3 − 1 − 3, 6 − 2 − 6]
    close(&x, &[-1.0, -2.0]);
    assert_eq!(learner.clock(), 1);
    assert!(!learner.exchanges_now(), "τ = 2: no exchange at t = 1");
    learner.step(&mut x, &[1.0, 1.0], None);
    close(&x, &[-1.1, -2.1]);
    assert!(learner.exchanges_now());
}

#[test]
fn eamsgd_uses_nesterov_momentum_and_delta_zero_is_easgd() {
    let mut learner = ElasticLearner::new(easgd(1, 0.5, 0.1, 0.9), 1);
    let mut x = vec![2.0];
    let mut at = Vec::new();
    learner.gradient_point(&x, &mut at);
    assert_eq!(at, vec![2.0], "v = 0 at the start");
    learner.step(&mut x, &[1.0], Some(&[0.0])); // v = −0.1; x = 2 − 1 − 0.1
    close(&x, &[0.9]);
    learner.gradient_point(&x, &mut at);
    close(&at, &[0.9 - 0.09]); // x + δ v
    learner.step(&mut x, &[2.0], Some(&[1.0])); // v = 0.9·(−0.1) − 0.2 = −0.29; pull 0.5·(0.9 − 1)
    close(&x, &[0.9 + 0.05 - 0.29]);

    let (mut a, mut b) =
        (ElasticLearner::new(easgd(3, 0.3, 0.2, 0.0), 2), ElasticLearner::new(easgd(3, 0.3, 0.2, 0.0), 2));
    let (mut xa, mut xb) = (vec![1.0, -1.0], vec![1.0, -1.0]);
    for step in 0..7 {
        let g = [0.5 * step as f32, 1.0];
        let c = [0.2, 0.4];
        let center = a.exchanges_now().then_some(&c[..]);
        a.step(&mut xa, &g, center);
        b.step(&mut xb, &g, center);
    }
    assert_eq!(xa, xb);
}

#[test]
fn learning_rate_decays_on_the_local_clock() {
    let mut l = ElasticLearner::new(ElasticSettings { lr_decay_gamma: 0.5, ..easgd(1, 0.1, 0.4, 0.0) }, 1);
    assert_eq!(l.lr(), 0.4);
    l.step(&mut [0.0], &[0.0], None);
    l.step(&mut [0.0], &[0.0], None);
    assert!((l.lr() - 0.4 / 2f32.sqrt()).abs() < 1e-7);
}

/// The staleness of every exchange a center records.
fn sigmas(events: &[ShardEvent]) -> Vec<(LearnerId, u64, Outcome)> {
    (events.iter())
        .filter_map(|e| match e {
            ShardEvent::Gradient(g) => Some((g.learner, g.staleness.0, g.outcome)),
            _ => None,
        })
        .collect()
}

#[test]
fn every_exchange_is_recorded_with_the_staleness_of_the_center_its_learner_last_received() {
    let three: BTreeSet<LearnerId> = (0..3).map(LearnerId).collect();
    for rule in [
        CenterRule::ElasticAsync { alpha: 0.5 },
        CenterRule::Downpour,
        CenterRule::MDownpour { momentum: 0.5, lr: 0.1 },
    ] {
        let mut s = CenterShard::new(ShardId(0), rule, vec![1.0], three.clone());
        // Round robin over three learners, each starting from the center at clock 0: once
        // all have exchanged, a learner's exchange finds the two made by the others since
        // its own (async EASGD's learner moves by −d as the center moves by d, so it knows
        // the center after its own exchange, as DOWNPOUR's adopts it).
        let expected: [u64; 7] = [0, 1, 2, 2, 2, 2, 2];
        for (k, l) in [0, 1, 2, 0, 1, 2, 0].into_iter().enumerate() {
            let events = s.on_exchange(LearnerId(l), &[0.5]).unwrap();
            assert!(matches!(sigmas(&events)[0].2, Outcome::Applied { .. }), "{rule:?}");
            assert_eq!(sigmas(&events)[0].1, expected[k], "{rule:?}: exchange {k}");
        }
        // A non-finite exchange is dropped and counted; the center stays; the learner is
        // answered with it and goes on.
        let before = s.snapshot();
        let events = s.on_exchange(LearnerId(1), &[f32::NAN]).unwrap();
        assert_eq!(sigmas(&events)[0].2, Outcome::Dropped(DropReason::NonFinite), "{rule:?}");
        assert_eq!(replies(events), vec![(LearnerId(1), before.values.to_vec())], "{rule:?}");
        assert_eq!((s.clock(), s.snapshot().values.to_vec()), (before.clock, before.values.to_vec()));
        // The next finite exchange applies as usual.
        let events = s.on_exchange(LearnerId(2), &[0.5]).unwrap();
        assert!(matches!(sigmas(&events)[0].2, Outcome::Applied { .. }), "{rule:?}");
        assert_eq!(s.clock().0, before.clock.0 + 1, "{rule:?}");
    }
    // Sync rounds: σ ≡ 0, and a non-finite x^i leaves the round's mean to the others.
    let mut s = CenterShard::new(ShardId(0), CenterRule::ElasticSync { beta: 1.0 }, vec![0.0], both());
    let mut events = s.on_exchange(L0, &[f32::INFINITY]).unwrap();
    events.extend(s.on_exchange(L1, &[4.0]).unwrap());
    assert_eq!(
        sigmas(&events),
        vec![(L0, 0, Outcome::Dropped(DropReason::NonFinite)), (L1, 0, Outcome::Applied { alpha: 1.0 })]
    );
    assert_eq!(
        (s.clock(), s.snapshot().values.to_vec()),
        (Clock(1), vec![4.0]),
        "the mean of the finite x^i"
    );
}

#[test]
fn sync_round_uses_every_learners_x_before_the_pull() {
    let mut s = CenterShard::new(ShardId(0), CenterRule::ElasticSync { beta: 0.5 }, vec![0.0, 4.0], both());
    assert!(replies(s.on_exchange(L0, &[1.0, 0.0]).unwrap()).is_empty(), "the round waits for every learner");
    assert!(s.on_exchange(L0, &[1.0, 0.0]).is_err(), "twice in one round");
    let r = replies(s.on_exchange(L1, &[3.0, 8.0]).unwrap());
    assert_eq!(r, vec![(L0, vec![0.0, 4.0]), (L1, vec![0.0, 4.0])], "both get x̃ from before the round");
    close(&s.snapshot().values, &[0.5 * 0.0 + 0.5 * 2.0, 0.5 * 4.0 + 0.5 * 4.0]);
    assert_eq!(s.clock(), Clock(1));
    s.on_exchange(L0, &[0.0, 0.0]).unwrap();
    let events = s.on_membership([L0].into_iter().collect());
    assert!(events.iter().any(|e| matches!(e, ShardEvent::Update(u) if u.clock == Clock(2))));
    assert_eq!(replies(events).len(), 1, "a round stops waiting for a learner that left");
}

#[test]
fn downpour_adds_v_and_mdownpour_keeps_nesterov_momentum() {
    let mut d = CenterShard::new(ShardId(0), CenterRule::Downpour, vec![1.0], both());
    let events = d.on_exchange(L1, &[-0.25]).unwrap();
    let update = UpdateRecord { shard: ShardId(0), clock: Clock(1), gradients: 1, payload_in: 0 };
    assert!(
        events.iter().any(|e| matches!(e, ShardEvent::Update(u) if *u == update)),
        "every exchange is an update"
    );
    assert_eq!(replies(events), vec![(L1, vec![0.75])], "DOWNPOUR answers with the new center");
    let mut m =
        CenterShard::new(ShardId(0), CenterRule::MDownpour { momentum: 0.5, lr: 0.1 }, vec![1.0], both());
    m.on_exchange(L0, &[2.0]).unwrap(); // u = −0.2; x̃ = 1 + 0.5·(−0.2) − 0.2
    close(&m.snapshot().values, &[0.7]);
    m.on_exchange(L0, &[0.0]).unwrap(); // u = −0.1; x̃ = 0.7 − 0.05
    close(&m.snapshot().values, &[0.65]);
    assert!(m.on_exchange(L0, &[0.0, 1.0]).is_err(), "wrong length");
    assert!(m.on_exchange(LearnerId(9), &[0.0]).is_err(), "unknown learner");
    close(&m.snapshot().values, &[0.65]);
    let mut dl = DownpourLearner::new(2, 0.5, 1);
    let mut x = vec![1.0];
    assert!(dl.exchanges_now());
    dl.step(&mut x, &[1.0]);
    dl.step(&mut x, &[1.0]);
    assert_eq!(x, vec![0.0]);
    assert_eq!(dl.take_accumulated(), vec![-1.0]);
    assert_eq!(dl.take_accumulated(), vec![0.0]);
}

/// Sync EASGD on f(x) = h x²/2 with `p` learners, all through the real cores.
fn sync_easgd_on_quadratic(eta_h: f32, alpha: f32, beta: f32, rounds: usize) -> f32 {
    let p = 4;
    let active: BTreeSet<LearnerId> = (0..p).map(LearnerId).collect();
    let mut shard = CenterShard::new(ShardId(0), CenterRule::ElasticSync { beta }, vec![1.0], active);
    let mut learners: Vec<ElasticLearner> =
        (0..p).map(|_| ElasticLearner::new(easgd(1, alpha, eta_h, 0.0), 1)).collect();
    let mut xs: Vec<Vec<f32>> = (0..p).map(|i| vec![1.0 + i as f32 * 0.1]).collect();
    for _ in 0..rounds {
        let mut centers = Vec::new();
        for (i, x) in xs.iter().enumerate() {
            centers.extend(replies(shard.on_exchange(LearnerId(i as u32), x).unwrap()));
        }
        for ((l, x), (_, c)) in learners.iter_mut().zip(&mut xs).zip(centers) {
            let g = vec![x[0]]; // h = 1: g(x) = x, so η is ηh
            l.step(x, &g, Some(&c));
        }
    }
    // NaN (overflow) counts as divergence.
    let worst = xs.iter().map(|x| x[0].abs()).fold(shard.snapshot().values[0].abs(), f32::max);
    if xs.iter().any(|x| x[0].is_nan()) { f32::INFINITY } else { worst }
}

#[test]
fn sync_easgd_stability_matches_the_analysis() {
    assert!(sync_easgd_is_stable(0.5, 0.225, 0.9));
    assert!(sync_easgd_on_quadratic(0.5, 0.225, 0.9, 400) < 1e-6, "ηh = 0.5, α = 0.225, β = 0.9 converges");
    assert!(!sync_easgd_is_stable(1.9, 0.9, 0.9));
    assert!(sync_easgd_on_quadratic(1.9, 0.9, 0.9, 60) > 1e6, "ηh = 1.9, α = β = 0.9 diverges");
}

#[test]
fn stability_inequalities_agree_with_the_spectral_radius() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut checked = 0;
    for _ in 0..20_000 {
        let (eh, a, b) =
            (rng.random_range(-0.5..2.5), rng.random_range(-0.5..2.0), rng.random_range(-0.5..2.5));
        // M = [[1 − ηh − α, α], [β, 1 − β]]
        let (m11, m12, m21, m22): (f64, f64, f64, f64) = (1.0 - eh - a, a, b, 1.0 - b);
        let (tr, det) = (m11 + m22, m11 * m22 - m12 * m21);
        let disc = tr * tr - 4.0 * det;
        let rho = if disc >= 0.0 {
            ((tr + disc.sqrt()) / 2.0).abs().max(((tr - disc.sqrt()) / 2.0).abs())
        } else {
            det.sqrt()
        };
        if (rho - 1.0).abs() < 1e-6 {
            continue;
        }
        assert_eq!(sync_easgd_is_stable(eh, a, b), rho < 1.0, "ηh = {eh}, α = {a}, β = {b}: ρ = {rho}");
        checked += 1;
    }
    assert!(checked > 19_000);
}

/// With β = 1 the center after every round is the plain average of the learners' models
/// (model averaging every τ steps); with α = 1/p each learner keeps (1 − 1/p) of its own
/// model and takes 1/p of the previous average.
#[test]
fn sync_easgd_with_alpha_one_over_p_and_beta_one_is_model_averaging() {
    let (p, tau, lr) = (4u32, 3u64, 0.1f32);
    let active: BTreeSet<LearnerId> = (0..p).map(LearnerId).collect();
    let init = vec![1.0, -1.0];
    let mut shard = CenterShard::new(ShardId(0), CenterRule::ElasticSync { beta: 1.0 }, init.clone(), active);
    let alpha = 1.0 / p as f32;
    let mut learners: Vec<ElasticLearner> =
        (0..p).map(|_| ElasticLearner::new(easgd(tau, alpha, lr, 0.0), 2)).collect();
    let mut xs: Vec<Vec<f32>> = vec![init.clone(); p as usize];
    // Learner i minimises |x − c_i|²/2: each drifts toward its own optimum between rounds.
    let optimum = |i: usize| [i as f32, -(i as f32)];
    let mut average = init;
    for t in 0..4 * tau {
        let exchange = learners[0].exchanges_now();
        let centers: Vec<Option<Vec<f32>>> = if exchange {
            let mean: Vec<f32> = (0..2).map(|k| xs.iter().map(|x| x[k]).sum::<f32>() / p as f32).collect();
            let mut served = Vec::new();
            for (i, x) in xs.iter().enumerate() {
                served.extend(replies(shard.on_exchange(LearnerId(i as u32), x).unwrap()));
            }
            let before = std::mem::replace(&mut average, mean);
            close(&shard.snapshot().values, &average);
            served
                .into_iter()
                .map(|(_, c)| {
                    assert_eq!(c, before, "each learner is pulled toward the previous average");
                    Some(c)
                })
                .collect()
        } else {
            vec![None; p as usize]
        };
        for (i, ((l, x), c)) in learners.iter_mut().zip(&mut xs).zip(&centers).enumerate() {
            let expected: Vec<f32> = (0..2)
                .map(|k| {
                    let pull = c.as_ref().map_or(0.0, |c| alpha * (x[k] - c[k]));
                    x[k] - pull - lr * (x[k] - optimum(i)[k])
                })
                .collect();
            let g: Vec<f32> = (0..2).map(|k| x[k] - optimum(i)[k]).collect();
            l.step(x, &g, c.as_deref());
            close(x, &expected);
        }
        assert_eq!(shard.clock(), Clock(t / tau + 1), "one round per τ steps");
    }
}

/// The gradient of a separable quadratic, `x_i (1 + i) − 0.5`, for the exchange-by-exchange
/// comparisons.
fn grad(x: &[f32]) -> Vec<f32> {
    x.iter().enumerate().map(|(i, v)| v * (1.0 + i as f32) - 0.5).collect()
}

#[test]
fn downpour_with_tau_one_is_async_sgd_without_modulation() {
    let lr = 0.1;
    let init = vec![1.0, -2.0, 0.5];
    let cfg = SgdShardConfig {
        id: ShardId(0),
        rule: SyncRule::Softsync { n: 2 },
        modulation: LrModulation::None,
        max_staleness: None,
        backups: 0,
        quorum: None,
        schedule: crate::LrSchedule { base: lr, decay: 1.0 },
        batch: 1,
        gradients_per_epoch: u64::MAX,
        prefetch: 0,
    };
    let mut sgd = SgdShard::new(cfg, init.clone(), both());
    let mut center = CenterShard::new(ShardId(0), CenterRule::Downpour, init.clone(), both());
    let mut learners = [DownpourLearner::new(1, lr, 3), DownpourLearner::new(1, lr, 3)];
    let mut xs = [init.clone(), init.clone()];
    let mut pulled: [(Clock, Vec<f32>); 2] = [(Clock(0), init.clone()), (Clock(0), init.clone())];
    for l in [L0, L1] {
        sgd.on_pull(l, 1).unwrap();
    }
    // Both DOWNPOUR learners take their first step (the exchange of v = 0 returns x̃₀).
    for (dl, x) in learners.iter_mut().zip(&mut xs) {
        let g = grad(x);
        dl.step(x, &g);
    }
    for &who in &[0usize, 1, 1, 0, 0, 0, 1, 0, 1, 1] {
        let id = LearnerId(who as u32);
        // Async SGD: push the gradient at the pulled weights, pull again.
        let (j, w) = &pulled[who];
        let seq = sgd.last_pushed(id) + 1;
        let mut events = sgd.on_push(id, seq, *j, &grad(w)).unwrap();
        events.extend(sgd.on_pull(id, seq + 1).unwrap());
        for e in events {
            if let ShardEvent::Serve { weights, .. } = e {
                pulled[who] = (weights.clock, weights.values.to_vec());
            }
        }
        // DOWNPOUR τ = 1: send v, adopt the new center, take a local step.
        let v = learners[who].take_accumulated();
        let (_, c) = replies(center.on_exchange(id, &v).unwrap()).remove(0);
        xs[who] = c;
        let g = grad(&xs[who]);
        learners[who].step(&mut xs[who], &g);
        assert_eq!(center.snapshot().values, sgd.snapshot().values);
    }
}

fn diloco(sync: bool, outer_lr: f32, mu: f32, modulation: LrModulation, bound: Option<u64>) -> CenterRule {
    CenterRule::Diloco { sync, outer_lr, outer_momentum: mu, modulation, max_staleness: bound }
}

/// H = 1, SGD inside, η_o = 1, μ_o = 0 is DOWNPOUR τ = 1: the same answers and σ at every
/// exchange and the same center, to the bit (x̃ − 1·(−v + 0·b) = x̃ + v).
#[test]
fn diloco_with_one_inner_step_unit_outer_rate_and_no_momentum_is_downpour_tau_one() {
    let lr = 0.1;
    let init = vec![1.0, -2.0, 0.5];
    let rules = [CenterRule::Downpour, diloco(false, 1.0, 0.0, LrModulation::None, None)];
    let mut centers = rules.map(|r| CenterShard::new(ShardId(0), r, init.clone(), both()));
    let mut learners: [[DownpourLearner; 2]; 2] =
        std::array::from_fn(|_| std::array::from_fn(|_| DownpourLearner::new(1, lr, 3)));
    let mut xs = [[init.clone(), init.clone()], [init.clone(), init.clone()]];
    for &who in &[0usize, 1, 1, 0, 0, 0, 1, 0, 1, 1] {
        let id = LearnerId(who as u32);
        let mut seen = Vec::new();
        for k in 0..2 {
            // The worker's DOWNPOUR step: send v (0 at first), adopt the answer, one local step.
            let v = learners[k][who].take_accumulated();
            let events = centers[k].on_exchange(id, &v).unwrap();
            let s = sigmas(&events);
            let (_, c) = replies(events).remove(0);
            xs[k][who].clone_from(&c);
            let g = grad(&xs[k][who]);
            learners[k][who].step(&mut xs[k][who], &g);
            seen.push((s, c));
        }
        assert_eq!(seen[0], seen[1], "exchange of {id}");
    }
    assert_eq!(centers[0].snapshot().values, centers[1].snapshot().values);
    assert_eq!(centers[0].clock(), centers[1].clock());
}

/// Sync, λ = 1, η_o = 1, μ_o = 0 is plain local SGD; modulation and the bound do not apply in
/// rounds.
#[test]
fn sync_diloco_with_one_learner_unit_outer_rate_and_no_momentum_is_local_training() {
    let (tau, lr) = (3u64, 0.1f32);
    let rule = diloco(true, 1.0, 0.0, LrModulation::PerGradient, Some(0));
    let init = vec![1.0, -1.0];
    let mut shard = CenterShard::new(ShardId(0), rule, init.clone(), [L0].into_iter().collect());
    let mut dl = DownpourLearner::new(tau, lr, 2);
    let grad = |x: &[f32]| -> Vec<f32> { vec![x[0] - 2.0, 3.0 * x[1] + 1.0] }; // another quadratic
    let (mut x, mut local) = (init.clone(), init);
    for t in 0..4 * tau {
        if dl.exchanges_now() {
            let events = shard.on_exchange(L0, &dl.take_accumulated()).unwrap();
            assert_eq!(sigmas(&events), vec![(L0, 0, Outcome::Applied { alpha: 1.0 })]);
            let (_, c) = replies(events).remove(0);
            close(&c, &x); // x_start + Σ(−ηg) = x, to rounding
            x = c;
            assert_eq!(shard.clock(), Clock(t / tau + 1), "one outer step per H steps");
        }
        let g = grad(&x);
        dl.step(&mut x, &g);
        let g = grad(&local);
        cpu::axpy(-lr, &g, &mut local);
        close(&x, &local);
    }
    let events = shard.on_exchange(L0, &dl.take_accumulated()).unwrap(); // the finishing exchange
    close(&replies(events)[0].1, &local);
}

/// PyTorch's SGD(nesterov=True) on Δ = −v: b ← μ b + Δ; x̃ ← x̃ − η (Δ + μ b), by hand and
/// against an f64 reference.
#[test]
fn diloco_outer_step_is_nesterov_sgd_on_the_pseudo_gradient() {
    let rule = diloco(false, 0.5, 0.5, LrModulation::None, None);
    let mut s = CenterShard::new(ShardId(0), rule, vec![1.0], both());
    s.on_exchange(L0, &[-0.4]).unwrap(); // Δ = 0.4: b = 0.4; x̃ = 1 − 0.5·(0.4 + 0.2)
    close(&s.snapshot().values, &[0.7]);
    s.on_exchange(L0, &[0.0]).unwrap(); // Δ = 0: b = 0.2; x̃ = 0.7 − 0.5·0.1
    close(&s.snapshot().values, &[0.65]);
    s.on_exchange(L1, &[0.2]).unwrap(); // Δ = −0.2: b = −0.1; x̃ = 0.65 − 0.5·(−0.2 − 0.05)
    close(&s.snapshot().values, &[0.775]);
    close(&s.state().velocity, &[-0.1]);
    let (lr, mu) = (0.7f32, 0.9f32);
    let rule = diloco(false, lr, mu, LrModulation::None, None);
    let mut s = CenterShard::new(ShardId(0), rule, vec![0.3, -0.2], both());
    let (mut x, mut b) = ([0.3f64, -0.2], [0.0f64; 2]);
    for k in 0u32..20 {
        let u = [((k * 7 % 5) as f32 - 2.0) * 0.05, ((k * 3 % 4) as f32 - 1.5) * 0.1];
        s.on_exchange(LearnerId(k % 2), &u).unwrap();
        for i in 0..2 {
            let d = -f64::from(u[i]);
            b[i] = f64::from(mu) * b[i] + d;
            x[i] -= f64::from(lr) * (d + f64::from(mu) * b[i]);
        }
        let got = s.snapshot().values;
        assert!((0..2).all(|i| (f64::from(got[i]) - x[i]).abs() < 1e-5), "{k}: {got:?} vs {x:?}");
    }
}

/// Sync: one outer step per round on the mean Δ, and every learner adopts the center after it.
#[test]
fn sync_diloco_steps_once_per_round_on_the_mean_and_serves_the_new_center() {
    let rule = diloco(true, 0.5, 0.5, LrModulation::None, None);
    let mut s = CenterShard::new(ShardId(0), rule, vec![1.0, 2.0], both());
    assert!(replies(s.on_exchange(L0, &[-0.2, 0.4]).unwrap()).is_empty(), "the round waits");
    assert!(s.on_exchange(L0, &[0.0, 0.0]).is_err(), "twice in one round");
    let events = s.on_exchange(L1, &[-0.6, 0.0]).unwrap(); // mean Δ = [0.4, −0.2] = b
    assert!(sigmas(&events).iter().all(|&(_, s, _)| s == 0));
    let r = replies(events); // x̃ = [1 − 0.5·(0.4 + 0.2), 2 − 0.5·(−0.2 − 0.1)]
    assert_eq!(r.iter().map(|(l, _)| *l).collect::<Vec<_>>(), vec![L0, L1]);
    r.iter().for_each(|(_, c)| close(c, &[0.7, 2.15]));
    assert_eq!(s.clock(), Clock(1));
    s.on_exchange(L0, &[0.0, 0.0]).unwrap();
    s.on_exchange(L1, &[0.0, 0.0]).unwrap(); // Δ = 0: b = [0.2, −0.1]; x̃ −= 0.5·μ·b
    close(&s.snapshot().values, &[0.65, 2.175]);
    s.on_exchange(L0, &[f32::NAN, 0.0]).unwrap(); // dropped: the round's mean is L1's alone
    assert!(replies(s.on_membership([L0, L1].into_iter().collect())).is_empty(), "waits for L1");
    assert_eq!(replies(s.on_exchange(L1, &[0.0, 0.0]).unwrap()).len(), 2, "both learners are served");
}

/// Async: σ = outer steps since the learner's x_start; η_o(σ) by `lr_modulation`; a Δ with
/// σ > s is dropped as too stale, and its learner adopts the current center.
#[test]
fn async_diloco_modulates_the_outer_rate_and_drops_what_is_too_stale() {
    let rule = diloco(false, 0.8, 0.0, LrModulation::PerGradient, Some(2));
    let mut s = CenterShard::new(ShardId(0), rule, vec![0.0], (0..3).map(LearnerId).collect());
    let mut got = Vec::new();
    for l in [0, 1, 2, 1, 0, 0] {
        let events = s.on_exchange(LearnerId(l), &[1.0]).unwrap(); // Δ = −1
        got.extend(sigmas(&events));
        assert_eq!(replies(events)[0].1, s.snapshot().values.to_vec(), "adopts the current center");
    }
    let (a, l) = (|a| Outcome::Applied { alpha: a }, LearnerId);
    let expected = vec![
        (l(0), 0, a(0.8)),
        (l(1), 1, a(0.8)),
        (l(2), 2, a(0.4)),
        (l(1), 1, a(0.8)),
        (l(0), 3, Outcome::Dropped(DropReason::TooStale)),
        (l(0), 0, a(0.8)),
    ];
    assert_eq!(got, expected);
    close(&s.snapshot().values, &[3.6]); // 0.8 + 0.8 + 0.4 + 0.8 + (dropped) + 0.8
    assert_eq!(s.clock(), Clock(5));
}

/// DiLoCo's outer momentum is checkpointed with the center: a restored shard goes on exactly.
#[test]
fn diloco_outer_velocity_is_checkpointed() {
    let rule = diloco(false, 0.5, 0.5, LrModulation::None, None);
    let mut a = CenterShard::new(ShardId(0), rule, vec![1.0], both());
    a.on_exchange(L0, &[-0.4]).unwrap();
    let saved = a.state();
    close(&saved.velocity, &[0.4]);
    let mut b = CenterShard::new(ShardId(0), rule, vec![0.0], both());
    b.restore(saved.clone()).unwrap();
    a.on_exchange(L1, &[0.0]).unwrap();
    b.on_exchange(L1, &[0.0]).unwrap();
    assert_eq!(a.snapshot().values, b.snapshot().values);
    assert!(b.restore(ShardState { velocity: Vec::new(), ..saved }).is_err(), "no outer velocity: refused");
}

/// Sync DiLoCo with a quorum of 2 of 3 (learners send v = −Δ): a round closes at the end of
/// its grace window with the two on time; the straggler's Δ, two rounds late, is folded into the open round at weight
/// α(σ)/α = 1/2 and counted in its mean (`late = "fold"`), or dropped and answered with the
/// current center at once (`"drop"`).
#[test]
fn a_sync_quorum_round_closes_without_its_straggler_and_folds_or_drops_it() {
    let three: BTreeSet<LearnerId> = (0..3).map(LearnerId).collect();
    let l2 = LearnerId(2);
    let rule = diloco(true, 1.0, 0.0, LrModulation::PerGradient, None);
    let quorum_of = |events: &[ShardEvent]| {
        (events.iter())
            .filter_map(|e| match e {
                ShardEvent::Quorum { clock, missing } => Some((*clock, *missing)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    for late in [LateRule::Fold, LateRule::Drop] {
        let mut s = CenterShard::new(ShardId(0), rule, vec![1.0], three.clone())
            .with_quorum(Some(crate::Quorum { size: 2, late }));
        assert!(quorum_of(&s.on_exchange(L0, &[-0.2]).unwrap()).is_empty());
        assert_eq!(quorum_of(&s.on_exchange(L1, &[-0.4]).unwrap()), [(Clock(0), 1)], "{late:?}");
        assert!(s.on_grace_over(Clock(1)).is_empty(), "another round's window changes nothing");
        let r = replies(s.on_grace_over(Clock(0)));
        assert_eq!(r.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [L0, L1], "the straggler is not served");
        close(&s.snapshot().values, &[0.7]); // x̃ − η_o · mean Δ, Δ = −v = 0.2, 0.4
        s.on_exchange(L0, &[0.0]).unwrap();
        s.on_exchange(L1, &[0.0]).unwrap();
        s.on_grace_over(Clock(1));
        assert_eq!((s.clock(), s.round_of(l2)), (Clock(2), Clock(0)), "two rounds closed without L2");
        let events = s.on_exchange(l2, &[-0.6]).unwrap();
        match late {
            LateRule::Fold => {
                assert_eq!(sigmas(&events), [(l2, 2, Outcome::Applied { alpha: 0.5 })]);
                assert_eq!(replies(events), [(l2, vec![0.7])], "served the current center at once");
                assert_eq!(s.round_of(l2), Clock(2), "its next exchange is on the open round");
                s.on_exchange(L0, &[-0.1]).unwrap();
                s.on_exchange(L1, &[-0.2]).unwrap();
                let r = replies(s.on_grace_over(Clock(2)));
                assert_eq!(
                    r.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
                    [L0, L1],
                    "its turns, served at the close"
                );
                close(&s.snapshot().values, &[0.5]); // 0.7 − (0.5·0.6 + 0.1 + 0.2) / 3
            }
            LateRule::Drop => {
                assert_eq!(sigmas(&events), [(l2, 2, Outcome::Dropped(DropReason::StaleRound))]);
                assert_eq!(replies(events), [(l2, vec![0.7])], "the current center at once");
                assert_eq!(s.round_of(l2), Clock(2));
            }
        }
    }
}

#[test]
fn a_learner_that_joins_again_belongs_to_the_open_round() {
    // Sync DiLoCo with a quorum: L2 leaves, two rounds close without it, and it joins again
    // from the current center; its next Δ is on time (σ = 0), not two rounds late.
    let three: BTreeSet<LearnerId> = (0..3).map(LearnerId).collect();
    let l2 = LearnerId(2);
    let rule = diloco(true, 1.0, 0.0, LrModulation::PerGradient, None);
    let mut s = CenterShard::new(ShardId(0), rule, vec![1.0], three.clone())
        .with_quorum(Some(crate::Quorum { size: 2, late: LateRule::Fold }));
    s.on_membership([L0, L1].into());
    for _ in 0..2 {
        s.on_exchange(L0, &[0.0]).unwrap();
        s.on_exchange(L1, &[0.0]).unwrap();
    }
    assert!(!s.holds(l2));
    s.on_membership(three);
    assert_eq!((s.clock(), s.round_of(l2)), (Clock(2), Clock(2)));
    let events = s.on_exchange(l2, &[-0.3]).unwrap();
    assert_eq!(sigmas(&events), [(l2, 0, Outcome::Applied { alpha: 1.0 })]);
    assert!(s.holds(l2));
}
