//! Adaptive batch sizes (`docs/src/algorithms.md` §5.1): each learner's minibatch size μ_l
//! follows its measured throughput r_l, so that a step takes every learner about the same
//! time, while Σ_l μ_l = μλ holds (the μλ rule for uneven hardware). Epoch 0 starts with a
//! short warm-up at μ everywhere; its sizes are chosen halfway through the warm-up, and those
//! of epoch e + 1 halfway through epoch e, each from the throughput each learner showed since
//! the previous choice: once per epoch.

use serde::{Deserialize, Serialize};

use crate::LearnerId;

/// μ_l for learners of throughput `rates` (examples per second), summing to `total`:
/// proportional to the rates, rounded by largest remainders, each at least 1. A rate that is
/// not a positive finite number (a learner not measured yet) counts as the mean of the others;
/// with none measured every learner gets an equal share. `total` must be at least the number
/// of learners.
#[must_use]
pub fn sizes_for(rates: &[f64], total: u32) -> Vec<u32> {
    let n = rates.len();
    if n == 0 {
        return Vec::new();
    }
    let known: Vec<f64> = rates.iter().copied().filter(|r| r.is_finite() && *r > 0.0).collect();
    let fill = if known.is_empty() { 1.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
    let rates: Vec<f64> = rates.iter().map(|&r| if r.is_finite() && r > 0.0 { r } else { fill }).collect();
    let sum: f64 = rates.iter().sum();
    let ideal: Vec<f64> = rates.iter().map(|r| f64::from(total) * r / sum).collect();
    let mut sizes: Vec<u32> = ideal.iter().map(|&x| (x.floor() as u32).max(1)).collect();
    // Added by largest remainder (ties to the lower id, so the choice is the same wherever it
    // is made); what the floor of 1 gave too much is taken back from the largest sizes.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        (ideal[b] - ideal[b].floor()).total_cmp(&(ideal[a] - ideal[a].floor())).then(a.cmp(&b))
    });
    let mut given: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let mut i = 0;
    while given < u64::from(total) {
        sizes[order[i % n]] += 1;
        (given, i) = (given + 1, i + 1);
    }
    while given > u64::from(total) {
        let Some(l) = (0..n).filter(|&l| sizes[l] > 1).max_by_key(|&l| sizes[l]) else { break };
        sizes[l] -= 1;
        given -= 1;
    }
    sizes
}

/// The scheduler's side of adaptive batch sizes: the sizes chosen for each epoch so far, and
/// what each learner computed since the last choice.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BatchPlanner {
    /// `sizes[e][l]` is learner l's minibatch size in epoch e.
    sizes: Vec<Vec<u32>>,
    /// Per learner: examples and compute seconds since the last choice.
    window: Vec<(u64, f64)>,
    /// Per learner: the throughput behind the last choice (kept for a learner silent since).
    rates: Vec<f64>,
    /// μλ.
    total: u32,
    /// Examples of epoch 0's warm-up, at μ everywhere.
    warmup: u64,
    examples_per_epoch: u64,
    epochs: u64,
}

impl BatchPlanner {
    /// The planner of `learners` learners with nominal minibatch `batch` (μ), over `epochs`
    /// epochs of `examples_per_epoch` examples, whose first `warmup` examples all learners
    /// take at μ.
    #[must_use]
    pub fn new(learners: u32, batch: u32, (warmup, examples_per_epoch): (u64, u64), epochs: u64) -> Self {
        let n = learners as usize;
        Self {
            sizes: Vec::new(),
            window: vec![(0, 0.0); n],
            rates: vec![0.0; n],
            total: batch.saturating_mul(learners),
            warmup,
            examples_per_epoch,
            epochs,
        }
    }

    /// Every epoch's sizes chosen so far, from epoch 0 (whose apply after its warm-up).
    #[must_use]
    pub fn sizes(&self) -> &[Vec<u32>] {
        &self.sizes
    }

    /// `learner` computed `examples` more examples in `seconds`; with `done` examples computed
    /// by all learners, the sizes of the next epoch are chosen once the run is halfway through
    /// the warm-up (for epoch 0) or the epoch before. Returns the new sizes' epoch when it
    /// chose them.
    pub fn on_progress(&mut self, learner: LearnerId, examples: u64, seconds: f64, done: u64) -> Option<u64> {
        if let Some(w) = self.window.get_mut(learner.index()) {
            (w.0, w.1) = (w.0 + examples, w.1 + seconds.max(0.0));
        }
        let next = self.sizes.len() as u64;
        let halfway = match next {
            0 => self.warmup / 2,
            e => (2 * e - 1) * self.examples_per_epoch / 2,
        };
        if next >= self.epochs || done < halfway {
            return None;
        }
        for (rate, w) in self.rates.iter_mut().zip(&mut self.window) {
            let (n, s) = std::mem::take(w);
            if n > 0 && s > 0.0 {
                *rate = n as f64 / s;
            }
        }
        self.sizes.push(sizes_for(&self.rates, self.total));
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_throughput_sum_to_the_total_and_are_at_least_one() {
        assert_eq!(sizes_for(&[1.0; 8], 128), vec![16; 8]);
        assert_eq!(
            sizes_for(&[4.0, 4.0, 4.0, 4.0, 1.0, 1.0, 1.0, 1.0], 128),
            vec![26, 26, 26, 26, 6, 6, 6, 6]
        );
        assert_eq!(sizes_for(&[1000.0, 1.0, 1.0], 10), vec![8, 1, 1], "at least one each");
        assert_eq!(sizes_for(&[2.0, 0.0, f64::NAN], 12), vec![4, 4, 4], "unmeasured: the mean of the rest");
        assert_eq!(sizes_for(&[0.0, 0.0], 7), vec![4, 3], "none measured: equal shares");
        for (rates, total) in [(vec![3.0, 1.0, 7.5, 0.2], 64), (vec![1e-9, 1e9], 5), (vec![5.0], 3)] {
            let s = sizes_for(&rates, total);
            assert_eq!(s.iter().sum::<u32>(), total, "{rates:?}");
            assert!(s.iter().all(|&m| m >= 1));
        }
    }

    #[test]
    fn the_next_epochs_sizes_are_chosen_once_halfway_through_from_the_recent_throughput() {
        let mut p = BatchPlanner::new(2, 8, (256, 1600), 3);
        assert!(p.sizes().is_empty());
        assert_eq!(p.on_progress(LearnerId(0), 64, 0.25, 64), None);
        assert_eq!(p.on_progress(LearnerId(1), 64, 0.25, 128), Some(0), "halfway through the warm-up");
        assert_eq!(p.sizes(), [vec![8, 8]], "as fast as each other");
        assert_eq!(p.on_progress(LearnerId(0), 400, 1.0, 528), None);
        assert_eq!(p.on_progress(LearnerId(1), 271, 2.0, 799), None, "not halfway through epoch 0 yet");
        assert_eq!(p.on_progress(LearnerId(1), 129, 1.0, 928), Some(1));
        assert_eq!(p.sizes()[1], vec![12, 4], "400/s against 133/s");
        assert_eq!(p.on_progress(LearnerId(0), 800, 1.0, 1600), None, "epoch 2's at 2400");
        assert_eq!(p.on_progress(LearnerId(0), 800, 1.0, 2400), Some(2));
        assert_eq!(p.sizes()[2], vec![14, 2], "800/s, and a learner silent since keeps its 133/s");
        assert_eq!(p.on_progress(LearnerId(0), 800, 1.0, 4000), None, "no epoch after the last");
        assert_eq!(p.on_progress(LearnerId(7), 800, 1.0, 4000), None, "an unknown learner changes nothing");
    }
}
