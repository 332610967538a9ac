//! The harness over many seeded fault schedules per protocol family, and a broken rule it
//! must catch.

use super::*;
use crate::shard::broken;
use crate::{
    CenterRule, DownpourLearner, ElasticLearner, ElasticSettings, LocalRule, LrModulation, OptimizerSpec,
    SyncRule,
};
use rudra_compute::cpu;

/// Schedules per protocol in the property tests.
const SCHEDULES: u64 = 1000;

fn sgd(rule: SyncRule, max_staleness: Option<u64>) -> SgdSetup {
    SgdSetup {
        rule,
        max_staleness,
        prefetch: 0,
        quorum: None,
        modulation: LrModulation::PerGradient,
        learners: 4,
        shards: 2,
        init: (0..6).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect(),
        compute_ticks: Vec::new(),
        steps: 8,
        lr: 0.1,
        retry_every: 12,
        horizon: 20_000,
        groups: 1,
    }
}

/// Sequential SGD at batch μλ: every step, the λ gradients at the same weights averaged, in
/// learner order, as one update.
fn sequential(setup: &SgdSetup) -> Vec<f32> {
    let mut w = setup.init.clone();
    let scale = -setup.lr / setup.learners as f32;
    for step in 0..setup.steps {
        let at = w.clone();
        for l in 0..setup.learners {
            cpu::axpy(scale, &quadratic_gradient(crate::LearnerId(l), step, &at), &mut w);
        }
    }
    w
}

#[test]
fn hardsync_equals_sequential_sgd_under_every_link_fault_schedule() {
    let setup = SgdSetup { modulation: LrModulation::None, ..sgd(SyncRule::Hardsync, None) };
    let want = sequential(&setup);
    for seed in 0..SCHEDULES {
        let faults = FaultSchedule::links(seed, setup.learners, 200);
        let out = run_sgd(&setup, faults.clone(), seed, &mut quadratic_gradient)
            .unwrap_or_else(|v| panic!("seed {seed} ({faults:?}): {v}"));
        assert_eq!(out.params, want, "seed {seed}: hardsync under {faults:?}");
        assert!(out.clocks.iter().all(|c| c.0 == setup.steps), "one update per step: {:?}", out.clocks);
        assert!(out.records.iter().all(|r| r.staleness.0 == 0), "σ ≡ 0 in hardsync");
    }
}

#[test]
fn every_sgd_rule_keeps_its_invariants_through_node_failures() {
    let rules = [
        (SyncRule::Hardsync, None),
        (SyncRule::Softsync { n: 2 }, None),
        (SyncRule::Softsync { n: 4 }, Some(3)),
        (SyncRule::Softsync { n: 4 }, None),
    ];
    for (rule, bound) in rules {
        let setup = sgd(rule, bound);
        for seed in 0..SCHEDULES {
            let mut faults = FaultSchedule::nodes(seed, setup.learners, setup.shards, 150);
            if rule == SyncRule::Hardsync {
                // A restarted hardsync shard is rounds behind the others, and learners that
                // moved on wait on both: shards do not restart in hardsync runs (see the
                // faults chapter).
                faults.restarts.clear();
            }
            if let Err(v) = run_sgd(&setup, faults.clone(), seed, &mut quadratic_gradient) {
                panic!("{rule:?}, bound {bound:?}, seed {seed} ({faults:?}): {v}");
            }
        }
    }
}

#[test]
fn prefetch_keeps_every_invariant_under_link_faults_and_node_failures() {
    let rules = [
        (SyncRule::Async, None),
        (SyncRule::Softsync { n: 2 }, Some(4)),
        (SyncRule::Softsync { n: 4 }, Some(3)),
    ];
    for k in [1, 2] {
        for (rule, bound) in rules {
            let setup = SgdSetup { prefetch: k, ..sgd(rule, bound) };
            for seed in 0..SCHEDULES / 4 {
                let links = FaultSchedule::links(seed, setup.learners, 200);
                let nodes = FaultSchedule::nodes(seed, setup.learners, setup.shards, 150);
                for faults in [links, nodes] {
                    if let Err(v) = run_sgd(&setup, faults.clone(), seed, &mut quadratic_gradient) {
                        panic!("prefetch {k}, {rule:?}, bound {bound:?}, seed {seed} ({faults:?}): {v}");
                    }
                }
            }
        }
    }
}

#[test]
fn learner_groups_keep_every_invariant_under_link_faults_and_node_failures() {
    // Two groups of two: hardsync still equals sequential SGD (to float rounding: an aggregate
    // is a mean) on lossy, repeating, reordering links; every rule keeps its invariants
    // through learner deaths, rejoins and (but for hardsync) shard restarts.
    let want = sequential(&SgdSetup { modulation: LrModulation::None, ..sgd(SyncRule::Hardsync, None) });
    for rule in [SyncRule::Hardsync, SyncRule::Softsync { n: 2 }, SyncRule::Async] {
        let setup = SgdSetup { groups: 2, modulation: LrModulation::None, ..sgd(rule, None) };
        for seed in 0..SCHEDULES / 2 {
            let links = FaultSchedule::links(seed, setup.learners, 200);
            let out = run_sgd(&setup, links.clone(), seed, &mut quadratic_gradient)
                .unwrap_or_else(|v| panic!("{rule:?} in groups, seed {seed} ({links:?}): {v}"));
            if rule == SyncRule::Hardsync {
                let worst = out.params.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(worst < 1e-5, "seed {seed}: hardsync in groups is {worst} off sequential SGD");
                assert!(out.records.iter().all(|r| r.staleness.0 == 0));
            }
            let mut nodes = FaultSchedule::nodes(seed, setup.learners, setup.shards, 150);
            if rule == SyncRule::Hardsync {
                nodes.restarts.clear(); // as for every hardsync run: shards do not restart
            }
            if let Err(v) = run_sgd(&setup, nodes.clone(), seed, &mut quadratic_gradient) {
                panic!("{rule:?} in groups, seed {seed} ({nodes:?}): {v}");
            }
        }
    }
}

#[test]
fn quorum_rounds_keep_every_invariant_under_link_faults_and_learner_failures() {
    for late in [crate::LateRule::Fold, crate::LateRule::Drop] {
        // One shard: with several, quorums chosen per shard can wait on each other for ever
        // (the configuration refuses them).
        let setup = SgdSetup {
            quorum: Some(crate::Quorum { size: 3, late }),
            shards: 1,
            ..sgd(SyncRule::Hardsync, None)
        };
        for seed in 0..SCHEDULES / 4 {
            let links = FaultSchedule::links(seed, setup.learners, 200);
            let mut nodes = FaultSchedule::nodes(seed, setup.learners, setup.shards, 150);
            nodes.restarts.clear(); // as for every hardsync run: shards do not restart
            for faults in [links, nodes] {
                if let Err(v) = run_sgd(&setup, faults.clone(), seed, &mut quadratic_gradient) {
                    panic!("quorum 3 of 4, {late:?}, seed {seed} ({faults:?}): {v}");
                }
            }
        }
    }
}

#[test]
fn prefetch_overlaps_the_round_trip() {
    let setup = SgdSetup { compute_ticks: vec![4; 4], ..sgd(SyncRule::Async, None) };
    let slow_links = FaultSchedule { max_delay: 1, ..FaultSchedule::default() };
    let ticks = |k| {
        let out = run_sgd(
            &SgdSetup { prefetch: k, ..setup.clone() },
            slow_links.clone(),
            0,
            &mut quadratic_gradient,
        );
        out.unwrap().ticks
    };
    let (k0, k1) = (ticks(0), ticks(1));
    // A step is 4 ticks of compute and 2 of round trip; with prefetch the trip is hidden.
    assert_eq!((k0, k1), (2 + 8 * 6, 2 + 8 * 4 + 2), "prefetch 0: {k0} ticks, prefetch 1: {k1}");
}

#[test]
fn a_seed_replays_its_run_exactly() {
    let setup = sgd(SyncRule::Softsync { n: 4 }, Some(2));
    let faults = FaultSchedule::nodes(7, setup.learners, setup.shards, 150);
    let (a, b) = (
        run_sgd(&setup, faults.clone(), 7, &mut quadratic_gradient).unwrap(),
        run_sgd(&setup, faults, 7, &mut quadratic_gradient).unwrap(),
    );
    assert_eq!((a.params, a.records, a.ticks), (b.params, b.records, b.ticks));
}

#[test]
fn a_shard_that_applies_a_repeated_push_is_caught() {
    let setup = sgd(SyncRule::Softsync { n: 4 }, None);
    let faults = |seed| FaultSchedule { duplicate: 0.3, max_delay: 3, ..FaultSchedule::links(seed, 4, 200) };
    assert!(
        (0..20).all(|seed| run_sgd(&setup, faults(seed), seed, &mut quadratic_gradient).is_ok()),
        "the rule holds"
    );
    broken::accept_duplicates(true);
    let caught = (0..20)
        .filter_map(|seed| run_sgd(&setup, faults(seed), seed, &mut quadratic_gradient).err())
        .collect::<Vec<_>>();
    broken::accept_duplicates(false);
    assert!(!caught.is_empty(), "the harness missed a shard applying repeated pushes");
    assert!(caught.iter().any(|v| v.what.contains("twice")), "{caught:?}");
}

#[test]
fn an_unfinished_run_is_a_violation() {
    let setup = SgdSetup { horizon: 5, ..sgd(SyncRule::Hardsync, None) };
    let v = run_sgd(&setup, FaultSchedule::default(), 1, &mut quadratic_gradient).unwrap_err();
    assert!(v.what.contains("did not finish"), "{v}");
}

fn elastic(center: CenterRule, local: LocalRule, max_staleness: Option<u64>) -> ElasticSetup {
    let init = (0..6).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
    ElasticSetup { center, local, learners: 4, shards: 2, init, steps: 12, max_staleness, horizon: 20_000 }
}

/// Delays up to `max_delay` ticks and, for some seeds, learners that die for good.
fn reliable(seed: u64, learners: u32) -> FaultSchedule {
    let nodes = FaultSchedule::nodes(seed, learners, 1, 100);
    let deaths = nodes.deaths.into_iter().map(|d| Death { rejoin_after: None, ..d }).collect();
    FaultSchedule { max_delay: nodes.max_delay, deaths, ..FaultSchedule::default() }
}

#[test]
fn every_elastic_rule_keeps_its_invariants_through_delays_and_deaths() {
    let settings = ElasticSettings {
        tau: 3,
        alpha: 0.2,
        lr: 0.1,
        lr_decay_gamma: 0.0,
        momentum: 0.0,
        optimizer: OptimizerSpec::Sgd,
    };
    let easgd = LocalRule::Elastic(ElasticLearner::new(settings, 6));
    let eamsgd = LocalRule::Elastic(ElasticLearner::new(ElasticSettings { momentum: 0.9, ..settings }, 6));
    let downpour = LocalRule::Downpour(DownpourLearner::new(3, 0.1, 6));
    let diloco = |sync| CenterRule::Diloco {
        sync,
        outer_lr: 0.7,
        outer_momentum: 0.9,
        modulation: LrModulation::PerGradient,
        max_staleness: Some(4),
    };
    let setups = [
        elastic(CenterRule::ElasticAsync { alpha: 0.2 }, easgd.clone(), None),
        elastic(CenterRule::ElasticSync { beta: 0.8 }, easgd, None),
        elastic(CenterRule::ElasticAsync { alpha: 0.2 }, eamsgd, None),
        elastic(CenterRule::Downpour, downpour.clone(), None),
        elastic(CenterRule::MDownpour { momentum: 0.9, lr: 0.05 }, LocalRule::MDownpour, None),
        elastic(diloco(true), downpour.clone(), None),
        elastic(diloco(false), downpour, Some(4)),
    ];
    for setup in &setups {
        for seed in 0..SCHEDULES {
            let faults = reliable(seed, setup.learners);
            let out = run_elastic(setup, faults.clone(), seed, &mut quadratic_gradient)
                .unwrap_or_else(|v| panic!("{:?}, seed {seed} ({faults:?}): {v}", setup.center));
            assert!(out.center.iter().all(|v| v.is_finite()), "{:?}: {:?}", setup.center, out.center);
        }
    }
}

#[test]
fn sync_easgd_without_faults_moves_the_center_once_per_round() {
    let settings = ElasticSettings {
        tau: 2,
        alpha: 0.2,
        lr: 0.1,
        lr_decay_gamma: 0.0,
        momentum: 0.0,
        optimizer: OptimizerSpec::Sgd,
    };
    let setup = elastic(
        CenterRule::ElasticSync { beta: 0.8 },
        LocalRule::Elastic(ElasticLearner::new(settings, 6)),
        None,
    );
    let out = run_elastic(
        &setup,
        FaultSchedule { max_delay: 4, ..FaultSchedule::default() },
        3,
        &mut quadratic_gradient,
    )
    .unwrap();
    // τ = 2 over 12 steps: exchanges at steps 0, 2, …, 10, one round each.
    assert_eq!(out.clocks, vec![crate::Clock(6); 2]);
    assert_eq!(out.exchanges, 6 * 4 * 2, "every learner's exchange with every shard, once");
}

#[test]
fn the_elastic_harness_refuses_lossy_links() {
    let setup = elastic(CenterRule::Downpour, LocalRule::Downpour(DownpourLearner::new(3, 0.1, 6)), None);
    let v = run_elastic(
        &setup,
        FaultSchedule { loss: 0.1, ..FaultSchedule::default() },
        1,
        &mut quadratic_gradient,
    )
    .unwrap_err();
    assert!(v.what.contains("reliable"), "{v}");
}
