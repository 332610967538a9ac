//! The learner loop of the EASGD family: local steps on the learner's own x^i, and every τ
//! steps an exchange with every shard. Like [`LearnerCore`](super::LearnerCore) it only says
//! what to do next; the actor computes gradients and carries the messages.
//!
//! One step, per method:
//! - EASGD / EAMSGD: the exchange (x^i to the shards, x̃ back) and the gradient at the point
//!   before the pull run side by side; the step then applies the pull and the local update.
//! - DOWNPOUR: the exchange first (the accumulated `v` out, x̃ back and adopted as x^i), then
//!   the gradient at the new x^i and the local step. The last `v` is sent before finishing,
//!   fragment by fragment with streaming fragments.
//! - Streaming DiLoCo (F > 1 fragments): a fragment's exchange overlaps the steps after it;
//!   its center arrives as x_start of the fragment, and the steps taken meanwhile go on from
//!   it (x ← x̃ + v). A fragment due again while its last answer is still away waits for it.
//! - MDOWNPOUR: the gradient first; it goes to the shards, which apply it with momentum, and
//!   their x̃ becomes x^i.

use std::ops::Range;
use std::sync::Arc;

use crate::{LearnerId, ShardId};

use super::CoreError;
use super::elastic::{DownpourLearner, ElasticLearner};

/// What the learner does between exchanges.
#[derive(Clone, Debug)]
pub enum LocalRule {
    /// EASGD or EAMSGD.
    Elastic(ElasticLearner),
    /// DOWNPOUR.
    Downpour(DownpourLearner),
    /// MDOWNPOUR: every gradient goes to the shards, which keep the momentum.
    MDownpour,
}

/// An effect the learner actor carries out.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerEvent {
    /// Send each shard of `shards` its range of `values`; each answers with its center.
    Exchange {
        /// The values, over the whole parameter vector.
        values: Arc<Vec<f32>>,
        /// The shards that take part: all of them, or a streaming fragment's.
        shards: Range<usize>,
    },
    /// Compute the gradient at this point on the next minibatch, then call
    /// [`ElasticWorker::on_gradient`].
    Compute(Arc<Vec<f32>>),
    /// Every step is done.
    Finished,
}

/// The learner side of the EASGD family over the whole parameter vector.
#[derive(Clone, Debug)]
pub struct ElasticWorker {
    id: LearnerId,
    rule: LocalRule,
    /// x^i, shared with the computation that reads it (no copy per step).
    x: Arc<Vec<f32>>,
    ranges: Vec<Range<usize>>,
    steps_total: u64,
    steps_done: u64,
    /// Shards whose answer to the current exchange has not arrived.
    awaiting: Vec<bool>,
    /// EASGD: this step exchanged, and the centers that came back.
    exchanged: bool,
    center: Vec<f32>,
    /// EASGD: the gradient, when it is in before the centers of this step's exchange.
    grad: Vec<f32>,
    has_grad: bool,
    /// EAMSGD: where the next gradient is taken, x + δv; reused once the actor let go of it.
    point: Arc<Vec<f32>>,
    /// DOWNPOUR and DiLoCo at the end: the last `v` goes out, the next fragment of how many.
    finishing: Option<(usize, usize)>,
    /// Streaming: the next step waits for a fragment's answer.
    blocked: bool,
}

impl ElasticWorker {
    /// Learner `id` starting at `x0`, whose shards hold `ranges` of it, for `steps_total` steps.
    #[must_use]
    pub fn new(
        id: LearnerId,
        rule: LocalRule,
        x0: Vec<f32>,
        ranges: Vec<Range<usize>>,
        steps_total: u64,
    ) -> Self {
        let elastic = matches!(rule, LocalRule::Elastic(_));
        let center = if elastic { vec![0.0; x0.len()] } else { Vec::new() };
        let awaiting = vec![false; ranges.len()];
        Self {
            id,
            rule,
            x: Arc::new(x0),
            ranges,
            steps_total,
            steps_done: 0,
            awaiting,
            exchanged: false,
            center,
            grad: Vec::new(),
            has_grad: false,
            point: Arc::new(Vec::new()),
            finishing: None,
            blocked: false,
        }
    }

    /// This learner.
    #[must_use]
    pub fn id(&self) -> LearnerId {
        self.id
    }

    /// Local steps taken.
    #[must_use]
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Local steps it takes in all.
    #[must_use]
    pub fn steps_total(&self) -> u64 {
        self.steps_total
    }

    /// Whether it waits for `shard`'s answer to an exchange.
    #[must_use]
    pub fn awaits(&self, shard: ShardId) -> bool {
        self.awaiting.get(shard.index()).copied().unwrap_or(false)
    }

    /// The local variable x^i.
    #[must_use]
    pub fn params(&self) -> &[f32] {
        &self.x
    }

    /// Begin the loop.
    pub fn on_start(&mut self) -> Vec<WorkerEvent> {
        self.begin_step()
    }

    /// Shard `shard` answered the exchange with `values`, its center for this learner.
    pub fn on_center(&mut self, shard: ShardId, values: &[f32]) -> Result<Vec<WorkerEvent>, CoreError> {
        let s = shard.index();
        if !self.awaiting.get(s).copied().unwrap_or(false) {
            return Err(CoreError::Protocol(format!("{} got an unexpected center from {shard}", self.id)));
        }
        let range = self.ranges[s].clone();
        if values.len() != range.len() {
            return Err(CoreError::Protocol(format!(
                "{shard} answered {} with {} values for a range of {}",
                self.id,
                values.len(),
                range.len()
            )));
        }
        self.awaiting[s] = false;
        match &self.rule {
            LocalRule::Elastic(_) => self.center[range].copy_from_slice(values),
            LocalRule::Downpour(d) if d.fragments() > 1 => {
                // The steps taken while the fragment was away go on from its new center.
                let x = &mut Arc::make_mut(&mut self.x)[range.clone()];
                for ((x, c), v) in x.iter_mut().zip(values).zip(d.pending(range)) {
                    *x = c + v;
                }
            }
            _ => Arc::make_mut(&mut self.x)[range].copy_from_slice(values),
        }
        if self.streaming() && self.finishing.is_none() {
            return Ok(if std::mem::take(&mut self.blocked) { self.begin_step() } else { Vec::new() });
        }
        if self.awaiting.iter().any(|&a| a) {
            return Ok(Vec::new());
        }
        if self.finishing.is_some() {
            return Ok(self.flush());
        }
        Ok(match self.rule {
            LocalRule::Elastic(_) => self.finish_elastic_step(),
            LocalRule::Downpour(_) => vec![self.compute_at_x()],
            LocalRule::MDownpour => {
                self.steps_done += 1;
                self.begin_step()
            }
        })
    }

    /// The gradient asked for by the last [`WorkerEvent::Compute`]. Drop the point of that
    /// event first: x^i is then updated in place rather than copied.
    pub fn on_gradient(&mut self, g: &[f32]) -> Result<Vec<WorkerEvent>, CoreError> {
        if g.len() != self.x.len() {
            return Err(CoreError::Protocol(format!(
                "a gradient of {} values for {} parameters",
                g.len(),
                self.x.len()
            )));
        }
        Ok(match &mut self.rule {
            LocalRule::Elastic(_) if self.awaiting.iter().any(|&a| a) => {
                // The centers are still on their way: keep the gradient for the step.
                self.grad.clear();
                self.grad.extend_from_slice(g);
                self.has_grad = true;
                Vec::new()
            }
            LocalRule::Elastic(_) => self.elastic_step(g),
            LocalRule::Downpour(d) => {
                d.step(Arc::make_mut(&mut self.x).as_mut_slice(), g);
                self.steps_done += 1;
                self.begin_step()
            }
            LocalRule::MDownpour => self.exchange(Arc::new(g.to_vec())),
        })
    }

    /// Whether fragments are exchanged while the learner computes (Streaming DiLoCo).
    fn streaming(&self) -> bool {
        matches!(&self.rule, LocalRule::Downpour(d) if d.fragments() > 1)
    }

    /// Ask for the gradient at x^i itself.
    fn compute_at_x(&mut self) -> WorkerEvent {
        WorkerEvent::Compute(Arc::clone(&self.x))
    }

    /// Exchange `values` with every shard.
    fn exchange(&mut self, values: Arc<Vec<f32>>) -> Vec<WorkerEvent> {
        self.exchange_with(values, 0..self.ranges.len())
    }

    fn exchange_with(&mut self, values: Arc<Vec<f32>>, shards: Range<usize>) -> Vec<WorkerEvent> {
        self.awaiting[shards.clone()].fill(true);
        vec![WorkerEvent::Exchange { values, shards }]
    }

    fn begin_step(&mut self) -> Vec<WorkerEvent> {
        if self.steps_done >= self.steps_total {
            return match &mut self.rule {
                // DOWNPOUR's updates since its last exchange still belong to the center.
                // Streaming: the answers still away come first.
                LocalRule::Downpour(_) if self.awaiting.iter().any(|&a| a) => {
                    self.blocked = true;
                    Vec::new()
                }
                LocalRule::Downpour(d) if self.steps_total > 0 => {
                    self.finishing = Some((0, d.fragments()));
                    self.flush()
                }
                _ => vec![WorkerEvent::Finished],
            };
        }
        match &mut self.rule {
            LocalRule::Elastic(l) => {
                self.exchanged = l.exchanges_now();
                // EASGD takes its gradient at x^i itself, shared; EAMSGD at x + δv.
                let point = if l.has_momentum() {
                    l.gradient_point(&self.x, Arc::make_mut(&mut self.point));
                    Arc::clone(&self.point)
                } else {
                    Arc::clone(&self.x)
                };
                let mut events = if self.exchanged { self.exchange(Arc::clone(&self.x)) } else { Vec::new() };
                events.push(WorkerEvent::Compute(point));
                events
            }
            LocalRule::Downpour(d) => match d.fragment_now() {
                Some(f) if f.1 > 1 => {
                    if self.awaiting[fragment(f, self.ranges.len())].iter().any(|&a| a) {
                        self.blocked = true;
                        return Vec::new();
                    }
                    let mut events = self.exchange_fragment(f);
                    events.push(self.compute_at_x());
                    events
                }
                Some(f) => self.exchange_fragment(f),
                None => vec![self.compute_at_x()],
            },
            LocalRule::MDownpour => vec![self.compute_at_x()],
        }
    }

    /// DOWNPOUR / DiLoCo: send fragment `f` of the accumulated `v` to its shards.
    fn exchange_fragment(&mut self, f: (usize, usize)) -> Vec<WorkerEvent> {
        let LocalRule::Downpour(d) = &mut self.rule else { return Vec::new() };
        let shards = fragment(f, self.ranges.len());
        let values = self.ranges[shards.start].start..self.ranges[shards.end - 1].end;
        let v = Arc::new(d.take_accumulated_of(values));
        self.exchange_with(v, shards)
    }

    /// At the end: the next fragment of the last `v`, one after the other (so the end moves
    /// no more at once than a step did), then done.
    fn flush(&mut self) -> Vec<WorkerEvent> {
        match self.finishing {
            Some((f, of)) if f < of => {
                self.finishing = Some((f + 1, of));
                self.exchange_fragment((f, of))
            }
            _ => vec![WorkerEvent::Finished],
        }
    }

    /// EASGD: the centers are in; the gradient too, if it came first.
    fn finish_elastic_step(&mut self) -> Vec<WorkerEvent> {
        if !std::mem::take(&mut self.has_grad) {
            return Vec::new();
        }
        let g = std::mem::take(&mut self.grad);
        let events = self.elastic_step(&g);
        self.grad = g;
        events
    }

    /// EASGD: with the centers (if this step exchanged) and the gradient `g` in, the pull and
    /// the local update, in place.
    fn elastic_step(&mut self, g: &[f32]) -> Vec<WorkerEvent> {
        let LocalRule::Elastic(l) = &mut self.rule else { return Vec::new() };
        l.step(Arc::make_mut(&mut self.x).as_mut_slice(), g, self.exchanged.then_some(&self.center[..]));
        self.steps_done += 1;
        self.begin_step()
    }
}

/// The shards of fragment `f` of `of`: a run of whole shards, `shards / of` of them (the
/// configuration checks that `of` divides the shards).
fn fragment((f, of): (usize, usize), shards: usize) -> Range<usize> {
    let per = (shards / of.max(1)).max(1);
    (f * per).min(shards - 1)..((f + 1) * per).min(shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elastic::ElasticSettings;

    const S0: ShardId = ShardId(0);
    const S1: ShardId = ShardId(1);

    fn worker(rule: LocalRule, steps: u64) -> ElasticWorker {
        ElasticWorker::new(LearnerId(0), rule, vec![1.0, 2.0, 3.0], vec![0..2, 2..3], steps)
    }

    fn easgd(tau: u64, momentum: f32) -> LocalRule {
        let s = ElasticSettings {
            tau,
            alpha: 0.5,
            lr: 0.1,
            lr_decay_gamma: 0.0,
            momentum,
            optimizer: crate::OptimizerSpec::Sgd,
        };
        LocalRule::Elastic(ElasticLearner::new(s, 3))
    }

    fn exchange(v: &[f32]) -> WorkerEvent {
        WorkerEvent::Exchange { values: Arc::new(v.to_vec()), shards: 0..2 }
    }

    fn compute(v: &[f32]) -> WorkerEvent {
        WorkerEvent::Compute(Arc::new(v.to_vec()))
    }

    #[test]
    fn easgd_exchanges_and_computes_side_by_side_then_steps() {
        let mut w = worker(easgd(2, 0.0), 2);
        assert_eq!(w.on_start(), vec![exchange(&[1.0, 2.0, 3.0]), compute(&[1.0, 2.0, 3.0])]);
        assert!(w.on_gradient(&[10.0, 10.0, 10.0]).unwrap().is_empty(), "waits for the centers");
        assert!(w.on_center(S1, &[1.0]).unwrap().is_empty(), "waits for shard 0");
        assert!(w.on_center(S1, &[1.0]).is_err(), "one answer per shard and exchange");
        // x − α (x − x̃) − η g with x̃ = [0, 0, 1]; t = 1 is not a multiple of τ = 2.
        let next = w.on_center(S0, &[0.0, 0.0]).unwrap();
        let x = [1.0 - 0.5 - 1.0, 2.0 - 1.0 - 1.0, 3.0 - 1.0 - 1.0];
        assert_eq!(w.params(), &x);
        assert_eq!(next, vec![compute(&x)], "no exchange at t = 1");
        assert_eq!(w.on_gradient(&[0.0; 3]).unwrap(), vec![WorkerEvent::Finished]);
        assert_eq!(w.steps_done(), 2);
    }

    #[test]
    fn eamsgd_takes_the_gradient_at_the_nesterov_point() {
        let mut w = worker(easgd(1, 0.5), 2);
        w.on_start();
        w.on_gradient(&[1.0; 3]).unwrap();
        w.on_center(S0, &[1.0, 2.0]).unwrap();
        let events = w.on_center(S1, &[3.0]).unwrap();
        // v = −0.1; x = x − 0.1 (the centers equal x: no pull); next point x + δ v.
        assert_eq!(events[1], compute(&[0.9 - 0.05, 1.9 - 0.05, 2.9 - 0.05]));
    }

    #[test]
    fn downpour_exchanges_first_adopts_the_center_and_sends_its_last_update() {
        let mut w = worker(LocalRule::Downpour(DownpourLearner::new(1, 0.5, 3)), 1);
        assert_eq!(w.on_start(), vec![exchange(&[0.0; 3])]);
        assert!(w.on_center(S0, &[5.0, 6.0]).unwrap().is_empty());
        assert_eq!(w.on_center(S1, &[7.0]).unwrap(), vec![compute(&[5.0, 6.0, 7.0])]);
        // x ← x − η g and v ← v − η g; the run is over, but v still goes to the center.
        assert_eq!(w.on_gradient(&[2.0; 3]).unwrap(), vec![exchange(&[-1.0; 3])]);
        assert_eq!(w.params(), &[4.0, 5.0, 6.0]);
        w.on_center(S0, &[0.0, 0.0]).unwrap();
        assert_eq!(w.on_center(S1, &[0.0]).unwrap(), vec![WorkerEvent::Finished]);
    }

    #[test]
    fn mdownpour_sends_each_gradient_and_adopts_the_center() {
        let mut w = worker(LocalRule::MDownpour, 1);
        assert_eq!(w.on_start(), vec![compute(&[1.0, 2.0, 3.0])]);
        assert_eq!(w.on_gradient(&[0.5; 3]).unwrap(), vec![exchange(&[0.5; 3])]);
        w.on_center(S0, &[9.0, 8.0]).unwrap();
        assert_eq!(w.on_center(S1, &[7.0]).unwrap(), vec![WorkerEvent::Finished]);
        assert_eq!(w.params(), &[9.0, 8.0, 7.0]);
    }

    #[test]
    fn streaming_fragments_carry_their_values_in_turn_and_each_once_per_period() {
        // 4 shards of one value each, F = 2 fragments of two shards, H = 4: fragment 0 at
        // t ≡ 0, fragment 1 at t ≡ 2 (mod 4).
        let rule = LocalRule::Downpour(DownpourLearner::new(4, 1.0, 4).with_fragments(2));
        let ranges = vec![0..1, 1..2, 2..3, 3..4];
        let mut w = ElasticWorker::new(LearnerId(0), rule, vec![0.0; 4], ranges, 8);
        let mut events = w.on_start();
        let (mut sent, mut v) = (Vec::new(), [0.0f32; 4]);
        for t in 0..8u8 {
            if let Some(WorkerEvent::Exchange { values, shards }) = events.first().cloned() {
                let rest = events.split_off(1);
                // Exactly the fragment's accumulated values, nothing of the others.
                let inside = |i: usize| (shards.start..shards.end).contains(&i);
                let expected: Vec<f32> = (0..4).map(|i| if inside(i) { v[i] } else { 0.0 }).collect();
                assert_eq!(*values, expected, "t = {t}");
                for i in shards.clone() {
                    v[i] = 0.0;
                }
                sent.push((t, shards.clone()));
                for s in shards {
                    // The exchange overlaps the step: its answer asks for nothing.
                    assert!(w.on_center(ShardId(s as u32), &[w.params()[s]]).unwrap().is_empty());
                }
                events = rest;
            }
            assert!(matches!(events[..], [WorkerEvent::Compute(_)]), "t = {t}: {events:?}");
            let g: Vec<f32> = (0..4).map(|i| f32::from(t) + i as f32).collect();
            for (v, g) in v.iter_mut().zip(&g) {
                *v -= g;
            }
            events = w.on_gradient(&g).unwrap();
        }
        // Every 2 steps one fragment, in turn: over H = 4 steps every value went out once.
        assert_eq!(sent, vec![(0, 0..2), (2, 2..4), (4, 0..2), (6, 2..4)]);
        // The last update goes out before the end, a fragment at a time.
        assert!(matches!(&events[..], [WorkerEvent::Exchange { shards, .. }] if *shards == (0..2)));
        assert!(w.on_center(ShardId(0), &[0.0]).unwrap().is_empty());
        let next = w.on_center(ShardId(1), &[0.0]).unwrap();
        assert!(matches!(&next[..], [WorkerEvent::Exchange { shards, .. }] if *shards == (2..4)), "{next:?}");
        w.on_center(ShardId(2), &[0.0]).unwrap();
        assert_eq!(w.on_center(ShardId(3), &[0.0]).unwrap(), vec![WorkerEvent::Finished]);
    }

    #[test]
    fn a_streamed_fragment_lands_under_the_steps_taken_meanwhile_and_is_waited_for_when_due() {
        // 2 shards of one value, F = 2, H = 2: fragment 0 at even steps, fragment 1 at odd ones.
        let rule = LocalRule::Downpour(DownpourLearner::new(2, 1.0, 2).with_fragments(2));
        let mut w = ElasticWorker::new(LearnerId(0), rule, vec![0.0; 2], vec![0..1, 1..2], 4);
        let start = w.on_start();
        assert!(
            matches!(&start[..], [WorkerEvent::Exchange { shards, .. }, WorkerEvent::Compute(_)] if *shards == (0..1))
        );
        // Step 0 (g = 1) while fragment 0 is away; step 1 sends fragment 1.
        let next = w.on_gradient(&[1.0, 1.0]).unwrap();
        assert!(
            matches!(&next[..], [WorkerEvent::Exchange { shards, .. }, WorkerEvent::Compute(_)] if *shards == (1..2))
        );
        // Fragment 0's center arrives: x = x̃ + v, the step taken meanwhile on top of it.
        assert!(w.on_center(S0, &[10.0]).unwrap().is_empty());
        assert_eq!(w.params(), &[9.0, -1.0]);
        // Step 1 done; step 2 is fragment 0's turn again, and it is back: it goes out at once,
        // carrying both steps since its last exchange.
        let next = w.on_gradient(&[1.0, 1.0]).unwrap();
        assert!(
            matches!(&next[..], [WorkerEvent::Exchange { values, shards }, WorkerEvent::Compute(_)] if *shards == (0..1) && values[0] == -2.0)
        );
        // Step 3 is fragment 1's turn, still away: the step waits, and goes on with its answer.
        assert!(w.on_gradient(&[1.0, 1.0]).unwrap().is_empty());
        let next = w.on_center(S1, &[5.0]).unwrap();
        assert_eq!(w.params(), &[7.0, 5.0 - 2.0]);
        assert!(
            matches!(&next[..], [WorkerEvent::Exchange { shards, .. }, WorkerEvent::Compute(_)] if *shards == (1..2))
        );
    }

    #[test]
    fn malformed_input_changes_nothing() {
        let mut w = worker(LocalRule::MDownpour, 3);
        w.on_start();
        assert!(w.on_center(S0, &[0.0, 0.0]).is_err(), "no exchange in flight");
        assert!(w.on_gradient(&[0.0; 2]).is_err(), "wrong gradient length");
        w.on_gradient(&[0.0; 3]).unwrap();
        assert!(w.on_center(S0, &[0.0]).is_err(), "wrong range length");
        assert!(w.on_center(ShardId(5), &[0.0]).is_err(), "unknown shard");
        assert_eq!(w.params(), &[1.0, 2.0, 3.0]);
    }
}
