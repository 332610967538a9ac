//! The SGD shard core against exact arithmetic.

use std::ops::{Deref, DerefMut};

use super::*;
use crate::{DropReason, LrModulation, LrSchedule};

/// A shard core whose effects are kept, in order, until the test drains them.
struct Logged {
    core: SgdShard,
    log: VecDeque<ShardEvent>,
}

impl Deref for Logged {
    type Target = SgdShard;
    fn deref(&self) -> &SgdShard {
        &self.core
    }
}

impl DerefMut for Logged {
    fn deref_mut(&mut self) -> &mut SgdShard {
        &mut self.core
    }
}

impl Logged {
    fn keep(&mut self, events: Result<Vec<ShardEvent>, CoreError>) -> Result<(), CoreError> {
        self.log.extend(events?);
        Ok(())
    }
    fn on_pull(&mut self, l: LearnerId, seq: u64) -> Result<(), CoreError> {
        let events = self.core.on_pull(l, seq);
        self.keep(events)
    }
    fn on_push(&mut self, l: LearnerId, seq: u64, clock: Clock, g: &[f32]) -> Result<(), CoreError> {
        let events = self.core.on_push(l, seq, clock, g);
        self.keep(events)
    }
    fn on_membership(&mut self, active: BTreeSet<LearnerId>) {
        let events = self.core.on_membership(active);
        self.log.extend(events);
    }
    fn poll_event(&mut self) -> Option<ShardEvent> {
        self.log.pop_front()
    }
}

const L: [LearnerId; 4] = [LearnerId(0), LearnerId(1), LearnerId(2), LearnerId(3)];

fn shard(rule: SyncRule, modulation: LrModulation, bound: Option<u64>, learners: usize) -> Logged {
    let schedule = LrSchedule { base: 0.5, decay: 1.0 };
    let cfg = SgdShardConfig {
        id: ShardId(0),
        rule,
        modulation,
        max_staleness: bound,
        backups: 0,
        quorum: None,
        schedule,
        batch: 1,
        gradients_per_epoch: 1,
        prefetch: 0,
    };
    let core = SgdShard::new(cfg, vec![1.0, 2.0, 3.0], L[..learners].iter().copied().collect());
    Logged { core, log: VecDeque::new() }
}

/// The next step's pull from `l`.
fn pull(s: &mut Logged, l: LearnerId) -> Result<(), CoreError> {
    s.on_pull(l, s.last_pushed(l) + 1)
}

/// `l`'s gradient of its next step, computed on `clock`.
fn push(s: &mut Logged, l: LearnerId, clock: Clock, g: &[f32]) -> Result<(), CoreError> {
    s.on_push(l, s.last_pushed(l) + 1, clock, g)
}

/// Drain events; returns (served learners with clocks, records, updates).
fn drain(s: &mut Logged) -> (Vec<(LearnerId, Clock)>, Vec<GradientRecord>, Vec<UpdateRecord>) {
    let (mut served, mut grads, mut updates) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(e) = s.poll_event() {
        match e {
            ShardEvent::Serve { learner, weights, .. } => served.push((learner, weights.clock)),
            ShardEvent::Center { .. } => panic!("an SGD shard answered with a center"),
            ShardEvent::Gradient(g) => grads.push(g),
            ShardEvent::Update(u) => updates.push(u),
            ShardEvent::Quorum { .. } => {}
        }
    }
    (served, grads, updates)
}

fn values(s: &SgdShard) -> Vec<f32> {
    s.snapshot().values.to_vec()
}

fn close(a: &[f32], b: &[f32]) {
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-6, "{a:?} != {b:?}");
    }
}

#[test]
fn c_is_lambda_over_n_at_least_one() {
    for (n, c) in [(1, 4), (2, 2), (3, 1), (4, 1)] {
        assert_eq!(shard(SyncRule::Softsync { n }, LrModulation::None, None, 4).gradients_per_update(), c);
    }
    assert_eq!(shard(SyncRule::Hardsync, LrModulation::None, None, 4).gradients_per_update(), 4);
}

#[test]
fn softsync_applies_mean_of_modulated_gradients_every_c() {
    // λ = 4, n = 2: c = 2. Per-gradient modulation, α0 = 0.5.
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::PerGradient, None, 4);
    for l in L {
        pull(&mut s, l).unwrap();
    }
    assert_eq!(drain(&mut s).0.len(), 4, "no barrier: all served at once");
    let (g0, g1, g2, g3) = ([1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 4.0], [8.0, 0.0, 0.0]);
    push(&mut s, L[0], Clock(0), &g0).unwrap();
    assert_eq!(s.clock(), Clock(0), "one gradient is not enough");
    push(&mut s, L[1], Clock(0), &g1).unwrap();
    assert_eq!(s.clock(), Clock(1));
    // θ ← θ − (1/2)(0.5·g0 + 0.5·g1)
    close(&values(&s), &[1.0 - 0.25, 2.0 - 0.5, 3.0]);
    pull(&mut s, L[0]).unwrap();
    push(&mut s, L[2], Clock(0), &g2).unwrap(); // σ = 1: α = 0.5
    push(&mut s, L[0], Clock(1), &g0).unwrap(); // σ = 0: α = 0.5
    close(&values(&s), &[0.75 - 0.25, 1.5, 3.0 - 1.0]);
    push(&mut s, L[3], Clock(0), &g3).unwrap(); // σ = 2: α = 0.25
    pull(&mut s, L[1]).unwrap();
    push(&mut s, L[1], Clock(2), &g1).unwrap(); // σ = 0
    close(&values(&s), &[0.5 - 0.5 * 0.25 * 8.0, 1.5 - 0.5 * 0.5 * 2.0, 2.0]);
    let (_, grads, updates) = drain(&mut s);
    assert_eq!(updates.len(), 3);
    assert_eq!(updates.iter().map(|u| u.clock.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    let sigmas: Vec<u64> = grads.iter().map(|g| g.staleness.0).collect();
    assert_eq!(sigmas, vec![0, 0, 1, 0, 2, 0]);
    let alphas: Vec<f32> = grads
        .iter()
        .map(|g| match g.outcome {
            Outcome::Applied { alpha } => alpha,
            Outcome::Dropped(r) => panic!("dropped: {r:?}"),
        })
        .collect();
    assert_eq!(alphas, vec![0.5, 0.5, 0.5, 0.5, 0.25, 0.5]);
}

#[test]
fn mean_modulation_scales_the_whole_update_by_running_mean() {
    // 1-softsync, λ = 2 (c = 2): ⟨σ⟩ = 0 → α = α0 / max(0, 1) = 0.5 for the update.
    let mut s = shard(SyncRule::Softsync { n: 1 }, LrModulation::Mean, None, 2);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    push(&mut s, L[0], Clock(0), &[1.0, 1.0, 1.0]).unwrap();
    push(&mut s, L[1], Clock(0), &[3.0, 3.0, 3.0]).unwrap();
    close(&values(&s), &[0.0, 1.0, 2.0]); // θ − 0.5 · (1 + 3) / 2
    // Async, λ = 3: L0 runs four steps while L1 and L2 compute on clock 0.
    let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::Mean, None, 3);
    for l in &L[..3] {
        pull(&mut s, *l).unwrap();
    }
    for j in 0..4 {
        push(&mut s, L[0], Clock(j), &[1.0; 3]).unwrap();
        pull(&mut s, L[0]).unwrap();
    }
    close(&values(&s), &[-1.0, 0.0, 1.0]);
    push(&mut s, L[1], Clock(0), &[0.0; 3]).unwrap(); // σ = 4, ⟨σ⟩ = 4/5
    push(&mut s, L[2], Clock(0), &[3.0, 0.0, 0.0]).unwrap(); // σ = 5, ⟨σ⟩ = 9/6 → α = 0.5 / 1.5
    close(&values(&s), &[-2.0, 0.0, 1.0]);
    let (_, grads, _) = drain(&mut s);
    let last = grads.last().unwrap();
    assert_eq!(last.staleness, Staleness(5));
    assert!(matches!(last.outcome, Outcome::Applied { alpha } if (alpha - 1.0 / 3.0).abs() < 1e-7));
}

#[test]
fn async_applies_every_gradient_on_arrival() {
    let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::None, None, 3);
    for l in &L[..3] {
        pull(&mut s, *l).unwrap();
    }
    for (k, l) in L[..3].iter().enumerate() {
        push(&mut s, *l, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
        assert_eq!(s.clock(), Clock(k as u64 + 1));
    }
    close(&values(&s), &[1.0 - 1.5, 2.0, 3.0]);
}

#[test]
fn hardsync_waits_for_everyone_and_defers_early_pulls() {
    let mut s = shard(SyncRule::Hardsync, LrModulation::PerGradient, None, 2);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    drain(&mut s);
    push(&mut s, L[0], Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    pull(&mut s, L[0]).unwrap();
    assert!(drain(&mut s).0.is_empty(), "the barrier defers L0 until the round ends");
    push(&mut s, L[1], Clock(0), &[0.0, 4.0, 0.0]).unwrap();
    let (served, grads, _) = drain(&mut s);
    assert_eq!(served, vec![(L[0], Clock(1))]);
    assert!(grads.iter().all(|g| g.staleness == Staleness(0)));
    close(&values(&s), &[1.0 - 0.5, 2.0 - 1.0, 3.0]);
}

#[test]
fn a_last_pull_for_the_step_served_finishes_a_learner_whose_push_will_not_come() {
    // A group whose last member training was lost tells the shard so with a last pull for
    // the step it was served: a hardsync round no longer waits for it.
    let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    push(&mut s, L[0], Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    push(&mut s, L[1], Clock(0), &[0.0, 2.0, 0.0]).unwrap();
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    drain(&mut s);
    push(&mut s, L[0], Clock(1), &[2.0, 0.0, 0.0]).unwrap();
    assert_eq!(s.clock(), Clock(1), "the round waits for L1's step 2");
    // A plain pull for that step again is a repeat and changes nothing; a last one finishes.
    s.on_pull(L[1], 2).unwrap();
    assert_eq!(s.clock(), Clock(1));
    let events = s.core.on_last_pull(L[1], 2);
    s.keep(events).unwrap();
    assert_eq!(s.clock(), Clock(2), "the round closed without L1");
}

#[test]
fn a_restored_shard_continues_from_its_checkpoint_exactly() {
    let new = || shard(SyncRule::Softsync { n: 2 }, LrModulation::PerGradient, None, 2);
    let (mut a, mut b) = (new(), new());
    for (l, g) in [(L[0], [1.0, 0.0, 0.0]), (L[1], [0.0, 2.0, 0.0]), (L[0], [0.0, 0.0, 3.0])] {
        pull(&mut a, l).unwrap();
        let clock = a.clock();
        push(&mut a, l, clock, &g).unwrap();
    }
    let saved = a.state();
    assert_eq!((saved.clock, saved.received), (Clock(3), 3));
    // What happens after the checkpoint is lost with the crash.
    pull(&mut a, L[1]).unwrap();
    push(&mut a, L[1], Clock(3), &[5.0, 5.0, 5.0]).unwrap();
    let lost_seq = a.last_pushed(L[1]);
    b.restore(saved.clone()).unwrap();
    assert_eq!(b.state(), saved);
    // A push applied before the checkpoint is a duplicate; one on the lost clock 4 is
    // dropped and changes nothing; the next step goes on from clock 3 as if never lost.
    assert!(matches!(b.on_push(L[0], 2, Clock(2), &[9.0; 3]), Err(CoreError::Duplicate(_))));
    b.on_push(L[1], lost_seq, Clock(4), &[9.0; 3]).unwrap();
    let (_, grads, updates) = drain(&mut b);
    assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::RolledBack));
    assert!(updates.is_empty());
    assert_eq!(b.state().values, saved.values);
    b.on_pull(L[0], 3).unwrap();
    assert_eq!(drain(&mut b).0, vec![(L[0], Clock(3))]);
    // A state of another size is refused and changes nothing.
    let wrong = ShardState { values: vec![0.0; 4], ..saved.clone() };
    assert!(b.restore(wrong).is_err());
    // So is one no run could have made: more updates than gradients received.
    let impossible = ShardState { clock: Clock(u64::MAX), ..saved.clone() };
    assert!(b.restore(impossible).unwrap_err().to_string().contains("at least one"));
    assert_eq!(b.clock(), Clock(3));
}

#[test]
fn a_restarted_learner_is_served_without_the_push_its_last_incarnation_owed() {
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, Some(1), 2);
    pull(&mut s, L[0]).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[0], Clock(0))]);
    // Learner 0 crashes before its push; restarted, it pulls as its next incarnation.
    s.on_pull(L[0], crate::LearnerCore::incarnation_base(1) + 1).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[0], Clock(0))]);
}

#[test]
fn bad_pushes_are_rejected_and_change_nothing() {
    let mut s = shard(SyncRule::Softsync { n: 1 }, LrModulation::None, None, 2);
    pull(&mut s, L[0]).unwrap();
    let before = values(&s);
    assert!(push(&mut s, L[0], Clock(0), &[1.0]).is_err(), "wrong length");
    assert!(push(&mut s, L[3], Clock(0), &[1.0; 3]).is_err(), "unknown learner");
    assert!(pull(&mut s, L[3]).is_err(), "unknown learner");
    assert!(push(&mut s, L[0], Clock(5), &[1.0; 3]).is_err(), "a clock the shard has not reached");
    assert_eq!(values(&s), before);
    assert_eq!(s.clock(), Clock(0));
    push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
    let dup = s.on_push(L[0], 1, Clock(0), &[1.0; 3]);
    assert!(matches!(dup, Err(CoreError::Duplicate(_))), "a duplicate push is not applied twice");
}

#[test]
fn retried_duplicated_and_reordered_messages_apply_each_gradient_once() {
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, None, 2);
    s.on_pull(L[0], 1).unwrap();
    s.on_pull(L[0], 1).unwrap(); // a retry is answered again
    let (served, _, _) = drain(&mut s);
    assert_eq!(served, vec![(L[0], Clock(0)), (L[0], Clock(0))]);
    // Step 2's pull overtakes step 1's push; both gradients count, each once.
    s.on_pull(L[0], 2).unwrap();
    s.on_push(L[0], 1, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
    assert!(matches!(s.on_push(L[0], 1, Clock(0), &[1.0; 3]), Err(CoreError::Duplicate(_))));
    drain(&mut s);
    s.on_pull(L[0], 1).unwrap();
    let (served, _, _) = drain(&mut s);
    assert_eq!(served, vec![(L[0], Clock(1))], "a late copy of a pull is answered again, nothing changes");
    s.on_push(L[0], 2, Clock(0), &[1.0, 0.0, 0.0]).unwrap();
    assert!(matches!(s.on_push(L[0], 2, Clock(0), &[1.0; 3]), Err(CoreError::Duplicate(_))));
    assert_eq!(s.clock(), Clock(2));
    close(&values(&s), &[0.0, 2.0, 3.0]);
    // A step lost on the way (its push dropped) leaves nothing waiting.
    s.on_pull(L[1], 1).unwrap();
    s.on_pull(L[1], 2).unwrap();
    s.on_push(L[1], 2, Clock(2), &[0.0; 3]).unwrap();
    assert_eq!((s.clock(), s.last_pushed(L[1])), (Clock(3), 2));
}

#[test]
fn a_pull_that_overtakes_its_push_waits_for_it_unless_asked_again() {
    let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
    for l in &L[..2] {
        s.on_pull(*l, 1).unwrap();
    }
    drain(&mut s);
    s.on_pull(L[0], 2).unwrap(); // learner 0's push of step 1 is still on its way
    s.on_push(L[1], 1, Clock(0), &[0.0; 3]).unwrap();
    assert_eq!(drain(&mut s).0, vec![], "not served on the weights its own push will change");
    s.on_push(L[0], 1, Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[0], Clock(1))], "served once the round it completes is applied");
    // Learner 1's push of step 2 is lost: its pull waits until the retry sends it again.
    s.on_pull(L[1], 2).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[1], Clock(1))]);
    s.on_pull(L[1], 3).unwrap();
    s.on_pull(L[1], 3).unwrap();
    assert_eq!(drain(&mut s).0, vec![], "a copy of the pull does not stop the wait");
    s.on_push(L[1], 2, Clock(1), &[0.0; 3]).unwrap();
    assert_eq!(s.clock(), Clock(1), "hardsync waits for learner 0's step 2");
    s.on_push(L[0], 2, Clock(1), &[0.0; 3]).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[1], Clock(2))]);
}

#[test]
fn hardsync_takes_one_gradient_per_learner_per_round() {
    let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
    s.on_pull(L[0], 1).unwrap();
    s.on_pull(L[0], 1).unwrap();
    s.on_push(L[0], 1, Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    // A second reply to the retried pull led the learner to push step 2 on the same clock.
    assert!(matches!(s.on_push(L[0], 2, Clock(0), &[2.0; 3]), Err(CoreError::Duplicate(_))));
    s.on_pull(L[1], 1).unwrap();
    s.on_push(L[1], 1, Clock(0), &[0.0, 4.0, 0.0]).unwrap();
    assert_eq!(s.clock(), Clock(1));
    close(&values(&s), &[1.0 - 0.5, 2.0 - 1.0, 3.0]);
}

#[test]
fn gradients_over_the_bound_are_dropped_and_reported() {
    // Async, s = 1. L0 and L1 both served at 0; L1's gradient is applied; L0's is σ = 1;
    // then L2 (served at 0 before the gate closed) arrives with σ = 2 and is dropped.
    let mut s = shard(SyncRule::Softsync { n: 3 }, LrModulation::None, Some(1), 3);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    pull(&mut s, L[2]).unwrap();
    push(&mut s, L[1], Clock(0), &[1.0; 3]).unwrap();
    push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
    let before = values(&s);
    push(&mut s, L[2], Clock(0), &[1.0; 3]).unwrap();
    assert_eq!(values(&s), before, "a dropped gradient changes nothing");
    let (_, grads, _) = drain(&mut s);
    assert_eq!(grads.last().unwrap().outcome, Outcome::Dropped(DropReason::TooStale));
    assert_eq!(s.stats().summary().dropped, 1);
    assert_eq!(s.stats().summary().max, 1);
}

#[test]
fn the_bound_defers_pulls_while_an_old_gradient_is_outstanding() {
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, Some(1), 2);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    push(&mut s, L[1], Clock(0), &[1.0; 3]).unwrap(); // clock 1, L0 outstanding at 0
    drain(&mut s);
    pull(&mut s, L[1]).unwrap();
    assert!(drain(&mut s).0.is_empty(), "i − j = 1 is not below s = 1: wait");
    push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap(); // σ = 1, applied
    let (served, grads, _) = drain(&mut s);
    assert_eq!(served, vec![(L[1], Clock(2))]);
    assert_eq!(grads[0].staleness, Staleness(1));
}

#[test]
fn the_staleness_gate_never_holds_two_learners_back_for_each_other_across_shards() {
    // Learner 0 owes shard A a gradient and waits for B; learner 1 owes B and waits for A;
    // learner 2's gradients have made both debts old. Were both held back, nobody would
    // move again: the one behind (here by id, as their steps are equal) goes on.
    let new = || shard(SyncRule::Softsync { n: 3 }, LrModulation::None, Some(1), 3);
    let (mut a, mut b) = (new(), new());
    pull(&mut a, L[0]).unwrap();
    pull(&mut b, L[1]).unwrap();
    for s in [&mut a, &mut b] {
        pull(s, L[2]).unwrap();
        push(s, L[2], Clock(0), &[1.0; 3]).unwrap();
        drain(s);
    }
    pull(&mut a, L[1]).unwrap();
    assert!(drain(&mut a).0.is_empty(), "learner 1 waits at A for learner 0, who is behind");
    pull(&mut b, L[0]).unwrap();
    assert_eq!(drain(&mut b).0, vec![(L[0], Clock(1))], "learner 0 is not held back at B");
    push(&mut a, L[0], Clock(0), &[1.0; 3]).unwrap();
    assert_eq!(drain(&mut a).0, vec![(L[1], Clock(2))], "its push lets learner 1 go on at A");
}

#[test]
fn the_oldest_outstanding_clock_is_kept_per_clock() {
    let mut o = Outstanding::default();
    o.insert(L[0], Clock(3), 1);
    o.insert(L[1], Clock(5), 1);
    assert_eq!(o.oldest_except(L[2]), Some(Clock(3)));
    assert_eq!(o.oldest_except(L[0]), Some(Clock(5)), "a learner's own gradient does not count");
    o.insert(L[2], Clock(3), 1);
    assert_eq!(o.oldest_except(L[0]), Some(Clock(3)));
    o.insert(L[2], Clock(6), 1);
    o.remove(L[0]);
    assert_eq!(o.oldest_except(L[3]), Some(Clock(5)));
    o.retain(&[L[2]].into_iter().collect());
    assert_eq!((o.get(L[1]), o.oldest_except(L[2]), o.oldest_except(L[0])), (None, None, Some(Clock(6))));
}

#[test]
fn a_gradient_from_before_its_learner_was_lost_is_dropped_when_it_rejoins() {
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, None, 2);
    pull(&mut s, L[0]).unwrap();
    pull(&mut s, L[1]).unwrap();
    push(&mut s, L[0], Clock(0), &[1.0; 3]).unwrap();
    s.on_membership([L[0]].into_iter().collect());
    pull(&mut s, L[0]).unwrap();
    push(&mut s, L[0], Clock(1), &[1.0; 3]).unwrap();
    drain(&mut s);
    let before = values(&s);
    // Learner 1 comes back and sends what it computed before it was declared lost.
    s.on_membership([L[0], L[1]].into_iter().collect());
    push(&mut s, L[1], Clock(0), &[9.0; 3]).unwrap();
    let (_, grads, _) = drain(&mut s);
    assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::Lapsed));
    assert_eq!((s.clock(), values(&s)), (Clock(2), before));
    pull(&mut s, L[1]).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[1], Clock(2))], "it starts again from the current weights");
}

#[test]
fn losing_a_learner_completes_the_hardsync_round() {
    let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 3);
    for l in &L[..3] {
        pull(&mut s, *l).unwrap();
    }
    push(&mut s, L[0], Clock(0), &[3.0, 0.0, 0.0]).unwrap();
    push(&mut s, L[1], Clock(0), &[3.0, 0.0, 0.0]).unwrap();
    assert_eq!(s.clock(), Clock(0));
    s.on_membership(L[..2].iter().copied().collect());
    assert_eq!(s.clock(), Clock(1));
    close(&values(&s), &[1.0 - 1.5, 2.0, 3.0]);
}

#[test]
fn non_finite_gradients_are_dropped_and_counted_and_never_reach_the_weights() {
    for rule in [SyncRule::Softsync { n: 2 }, SyncRule::Softsync { n: 1 }, SyncRule::Hardsync] {
        let mut s = shard(rule, LrModulation::None, None, 2);
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        drain(&mut s);
        let before = values(&s);
        push(&mut s, L[0], Clock(0), &[1.0, f32::NAN, 0.0]).unwrap();
        let (_, grads, updates) = drain(&mut s);
        assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::NonFinite), "{rule:?}");
        assert!(updates.is_empty(), "{rule:?}: no update from a dropped gradient alone");
        assert_eq!((values(&s), s.clock()), (before.clone(), Clock(0)), "{rule:?}");
        // The other learner's gradient applies normally; for hardsync it completes the round.
        push(&mut s, L[1], Clock(0), &[f32::INFINITY, 0.0, 0.0]).unwrap();
        assert_eq!(values(&s), before, "{rule:?}: ±Inf is dropped too");
        pull(&mut s, L[0]).unwrap();
        pull(&mut s, L[1]).unwrap();
        let (served, grads, _) = drain(&mut s);
        assert_eq!(grads[0].outcome, Outcome::Dropped(DropReason::NonFinite), "{rule:?}");
        assert_eq!(served.len(), 2, "{rule:?}: nobody waits for a gradient that was dropped");
        let clock = s.clock();
        push(&mut s, L[0], clock, &[2.0, 0.0, 0.0]).unwrap();
        push(&mut s, L[1], clock, &[2.0, 0.0, 0.0]).unwrap();
        assert!(values(&s)[0] < before[0], "{rule:?}: finite gradients apply again");
        assert_eq!(s.stats().summary().dropped_by.get(&DropReason::NonFinite), Some(&2), "{rule:?}");
    }
}

/// Hardsync with b backup learners: every round applies exactly the first λ − b gradients on
/// the current weights (σ ≡ 0); a gradient that comes late is dropped as `stale-round`, and its
/// learner's next pull gets the new weights at once. With b = 0 it is hardsync.
#[test]
fn hardsync_with_backups_applies_the_first_lambda_minus_b_gradients_of_every_round() {
    let with = |backups| {
        let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 4);
        s.core.cfg.backups = backups;
        s
    };
    assert_eq!(with(0).gradients_per_update(), 4);
    assert_eq!(with(3).gradients_per_update(), 1);
    let mut s = with(1);
    let g = [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 4.0], [8.0, 8.0, 8.0]];
    for round in 0..3u64 {
        for l in L {
            pull(&mut s, l).unwrap();
        }
        let before = values(&s);
        // Learner `round` is the straggler of this round; the others push first.
        let (late, first): (Vec<LearnerId>, Vec<LearnerId>) = L.iter().partition(|l| l.0 as u64 == round);
        for &l in &first {
            push(&mut s, l, Clock(round), &g[l.0 as usize]).unwrap();
        }
        let (_, records, updates) = drain(&mut s);
        assert_eq!(updates.len(), 1, "round {round}");
        assert_eq!(updates[0].gradients, 3, "λ − b = 3 gradients per round");
        assert!(records.iter().all(|r| r.staleness.0 == 0 && matches!(r.outcome, Outcome::Applied { .. })));
        let mean: Vec<f32> =
            (0..3).map(|i| first.iter().map(|l| g[l.0 as usize][i]).sum::<f32>() / 3.0).collect();
        close(&values(&s), &before.iter().zip(&mean).map(|(w, m)| w - 0.5 * m).collect::<Vec<_>>());
        push(&mut s, late[0], Clock(round), &g[late[0].0 as usize]).unwrap();
        let (_, records, updates) = drain(&mut s);
        assert!(updates.is_empty());
        assert_eq!(records[0].outcome, Outcome::Dropped(DropReason::StaleRound), "late");
    }
    assert_eq!(s.stats().summary().dropped, 3);
}

/// Hardsync with a quorum of 2 of 3: the round is announced at its second contribution and
/// closes at the end of its grace window, or at once if the third comes first. A late gradient
/// is folded into the open round with its σ and counted in its mean (`late = "fold"`), or
/// dropped (`"drop"`).
#[test]
fn a_quorum_round_closes_after_its_grace_window_and_folds_or_drops_the_late() {
    let quorum = |late| {
        let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 3);
        s.core.cfg.quorum = Some(crate::Quorum { size: 2, late });
        s
    };
    let quorum_said = |s: &mut Logged| {
        let said: Vec<_> = s
            .log
            .iter()
            .filter_map(|e| match e {
                ShardEvent::Quorum { clock, missing } => Some((*clock, *missing)),
                _ => None,
            })
            .collect();
        drain(s);
        said
    };
    let mut s = quorum(LateRule::Fold);
    for l in &L[..3] {
        pull(&mut s, *l).unwrap();
    }
    drain(&mut s);
    push(&mut s, L[0], Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    assert!(quorum_said(&mut s).is_empty(), "one of two");
    push(&mut s, L[1], Clock(0), &[0.0, 2.0, 0.0]).unwrap();
    assert_eq!(quorum_said(&mut s), [(Clock(0), 1)], "the quorum, one short of all");
    assert!(s.on_grace_over(Clock(1)).is_empty(), "a window of another round changes nothing");
    assert_eq!(s.clock(), Clock(0));
    let events = s.on_grace_over(Clock(0));
    assert!(events.iter().any(|e| matches!(e, ShardEvent::Update(u) if u.gradients == 2)));
    close(&values(&s), &[0.5, 1.5, 3.0]);
    assert!(s.on_grace_over(Clock(0)).is_empty(), "closed once");

    // Round 1: learner 2's gradient of round 0 arrives late and is folded in with σ = 1; the
    // round still waits for its quorum on the current weights.
    for l in &L[..2] {
        pull(&mut s, *l).unwrap();
    }
    push(&mut s, L[2], Clock(0), &[0.0, 0.0, 3.0]).unwrap();
    pull(&mut s, L[2]).unwrap();
    let (served, _, updates) = drain(&mut s);
    assert_eq!(served, [(L[0], Clock(1)), (L[1], Clock(1)), (L[2], Clock(1))], "the late one at once too");
    assert!(updates.is_empty(), "a folded gradient is no part of the quorum");
    for l in &L[..3] {
        push(&mut s, *l, Clock(1), &[0.0, 0.0, 1.0]).unwrap();
    }
    let (_, records, updates) = drain(&mut s);
    assert_eq!(updates.len(), 1, "all three arrived: closed without waiting for the window");
    assert_eq!(updates[0].gradients, 4, "three on the weights and one folded");
    let sigmas: Vec<_> = records.iter().map(|r| (r.learner, r.staleness.0, r.outcome)).collect();
    let applied = Outcome::Applied { alpha: 0.5 };
    assert_eq!(sigmas, [(L[2], 1, applied), (L[0], 0, applied), (L[1], 0, applied), (L[2], 0, applied)]);
    // (3 + 1 + 1 + 1) / 4 · 0.5 off the last value.
    close(&values(&s), &[0.5, 1.5, 3.0 - 0.75]);

    // Dropping instead: the late gradient is counted, not applied.
    let mut s = quorum(LateRule::Drop);
    for l in &L[..3] {
        pull(&mut s, *l).unwrap();
    }
    push(&mut s, L[0], Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    push(&mut s, L[1], Clock(0), &[0.0, 2.0, 0.0]).unwrap();
    s.on_grace_over(Clock(0));
    drain(&mut s);
    push(&mut s, L[2], Clock(0), &[0.0, 0.0, 3.0]).unwrap();
    let (_, records, _) = drain(&mut s);
    assert_eq!(records[0].outcome, Outcome::Dropped(DropReason::StaleRound));
    close(&values(&s), &[0.5, 1.5, 3.0]);
}

#[test]
fn prefetched_pushes_are_taken_once_in_any_order_and_every_riding_pull_is_answered() {
    let mut s = shard(SyncRule::Async, LrModulation::None, None, 2);
    s.core.cfg.prefetch = 1;
    s.on_pull(L[0], 1).unwrap();
    drain(&mut s);
    // Steps 1 and 2, both on clock 0, arrive in reverse order: each is taken once.
    s.on_push(L[0], 2, Clock(0), &[0.0, 2.0, 0.0]).unwrap();
    s.on_pull(L[0], 3).unwrap();
    s.on_push(L[0], 1, Clock(0), &[2.0, 0.0, 0.0]).unwrap();
    s.on_pull(L[0], 2).unwrap();
    let (served, records, _) = drain(&mut s);
    assert_eq!(served, vec![(L[0], Clock(1)), (L[0], Clock(2))], "step 1's pull answered again at once");
    assert_eq!(records.iter().map(|r| r.staleness.0).collect::<Vec<_>>(), [0, 1]);
    close(&values(&s), &[0.0, 1.0, 3.0]);
    for seq in [1, 2] {
        assert!(matches!(s.on_push(L[0], seq, Clock(0), &[9.0; 3]), Err(CoreError::Duplicate(_))));
    }
    assert_eq!(s.clock(), Clock(2));
    // The gate counts what learner 0 owes at the weights of its last push (clock 0), which it
    // may compute on again, not at those served for step 3 (clock 1).
    assert_eq!(s.core.outstanding.get(L[0]), Some(Clock(0)));
    s.on_push(L[0], 3, Clock(1), &[0.0; 3]).unwrap();
    s.on_pull(L[0], 4).unwrap();
    assert_eq!(s.core.outstanding.get(L[0]), Some(Clock(1)), "step 3 was computed on clock 1");
}

#[test]
fn a_late_copy_of_an_earlier_pull_does_not_reopen_a_finished_learner() {
    let mut s = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, Some(1), 2);
    s.on_pull(L[0], 1).unwrap();
    s.on_push(L[0], 1, Clock(0), &[0.0; 3]).unwrap();
    let events = s.core.on_last_pull(L[0], 2).unwrap();
    s.log.extend(events);
    drain(&mut s);
    s.on_pull(L[0], 1).unwrap();
    assert_eq!(drain(&mut s).0, vec![(L[0], Clock(1))], "answered again");
    // Learner 0 owes nothing: learner 1 is never held back for it.
    for step in 1..=3 {
        s.on_pull(L[1], step).unwrap();
        assert_eq!(drain(&mut s).0.len(), 1, "step {step}");
        s.on_push(L[1], step, s.clock(), &[0.0; 3]).unwrap();
    }
}

#[test]
fn a_gradient_weighs_as_many_examples_as_it_is_over() {
    // Hardsync, μ = 4, λ = 2: a mean over 6 examples and one over 2 are one batch of 8.
    let mut s = shard(SyncRule::Hardsync, LrModulation::None, None, 2);
    s.cfg.batch = 4;
    for l in [L[0], L[1]] {
        pull(&mut s, l).unwrap();
    }
    for bad in [0, 9] {
        assert!(s.core.on_push_of(L[0], 1, Clock(0), (&[1.0, 0.0, 0.0], bad)).is_err(), "{bad} examples");
    }
    s.core.on_push_of(L[0], 1, Clock(0), (&[1.0, 0.0, 0.0], 6)).unwrap();
    s.core.on_push_of(L[1], 1, Clock(0), (&[0.0, 4.0, 0.0], 2)).unwrap();
    // θ − 0.5 (6 g0 + 2 g1) / 8
    assert_eq!(values(&s), vec![0.625, 1.5, 3.0]);
    // 2-softsync of λ = 2 (c = 1) applies each alone: its share is the whole update.
    let mut a = shard(SyncRule::Softsync { n: 2 }, LrModulation::None, None, 2);
    a.cfg.batch = 4;
    pull(&mut a, L[0]).unwrap();
    a.core.on_push_of(L[0], 1, Clock(0), (&[1.0, 0.0, 0.0], 1)).unwrap();
    assert_eq!(values(&a), vec![0.5, 2.0, 3.0]);
}

#[test]
fn a_group_aggregate_counts_each_member_as_if_it_had_arrived_alone() {
    // Hardsync, λ = 4 in two groups of two: the same update as four pushes, one record per
    // learner, all four pulls answered once the round completes.
    let member = |l: LearnerId| Contribution { learner: l, seq: 1, examples: 1 };
    let mut s = shard(SyncRule::Hardsync, LrModulation::PerGradient, None, 4);
    for l in L {
        pull(&mut s, l).unwrap();
    }
    drain(&mut s);
    let events = s.core.on_aggregate(&[member(L[0]), member(L[1])], Clock(0), &[2.0, 0.0, 0.0]);
    s.keep(events).unwrap();
    assert_eq!((s.held(), s.clock()), (2, Clock(0)), "two of the four contributions");
    assert!(s.core.on_aggregate(&[member(L[1])], Clock(0), &[0.0; 3]).is_err(), "L1 took its turn");
    let twice = s.core.on_aggregate(&[member(L[2]), member(L[2])], Clock(0), &[0.0; 3]);
    assert!(twice.is_err_and(|e| e.to_string().contains("twice")));
    let events = s.core.on_aggregate(&[member(L[2]), member(L[3])], Clock(0), &[0.0, 4.0, 0.0]);
    s.keep(events).unwrap();
    let (_, grads, updates) = drain(&mut s);
    assert_eq!(grads.iter().map(|g| g.learner).collect::<Vec<_>>(), L.to_vec());
    assert_eq!(updates.iter().map(|u| u.gradients).collect::<Vec<_>>(), vec![4]);
    // θ − 0.5 · (2 · ḡ_a + 2 · ḡ_b) / 4, each aggregate the mean of its two members.
    assert_eq!(values(&s), vec![0.5, 1.0, 3.0]);
    let mut alone = shard(SyncRule::Hardsync, LrModulation::PerGradient, None, 4);
    for (l, g) in L.iter().zip([[4.0, 0.0, 0.0], [0.0; 3], [0.0, 8.0, 0.0], [0.0; 3]]) {
        pull(&mut alone, *l).unwrap();
        push(&mut alone, *l, Clock(0), &g).unwrap();
    }
    assert_eq!(values(&alone), values(&s));
    // Async (c = 1): an aggregate of two members is two updates, one per member in order,
    // each with the entry's mean and the α(σ) of its own turn: σ = 1, then σ = 2.
    let mut a = shard(SyncRule::Async, LrModulation::PerGradient, None, 3);
    for l in &L[..3] {
        pull(&mut a, *l).unwrap();
    }
    push(&mut a, L[2], Clock(0), &[0.0, 0.0, 1.0]).unwrap();
    drain(&mut a);
    let events = a.core.on_aggregate(&[member(L[0]), member(L[1])], Clock(0), &[1.0, 0.0, 0.0]);
    a.keep(events).unwrap();
    let (_, grads, updates) = drain(&mut a);
    assert_eq!(grads.iter().map(|g| g.staleness).collect::<Vec<_>>(), vec![Staleness(1), Staleness(2)]);
    assert_eq!(updates.iter().map(|u| u.gradients).collect::<Vec<_>>(), vec![1, 1]);
    // θ − (α0/1)·ḡ − (α0/2)·ḡ, α0 = 0.5.
    close(&values(&a), &[1.0 - 0.5 - 0.25, 2.0, 3.0 - 0.5]);
    assert_eq!(a.clock(), Clock(3));
}
