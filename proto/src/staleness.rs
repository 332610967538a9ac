//! Staleness statistics: the tracker's core, also kept by every shard for `mean` modulation.

use std::collections::BTreeMap;

use crate::{DropReason, Staleness};
use serde::{Deserialize, Serialize};

/// Running counts of gradient staleness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StalenessStats {
    /// `histogram[σ]` = applied gradients of staleness σ.
    histogram: Vec<u64>,
    applied: u64,
    dropped: BTreeMap<DropReason, u64>,
    sum: u128,
}

/// A snapshot of [`StalenessStats`] for reports (`summary.json` key `staleness`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StalenessSummary {
    /// Mean staleness ⟨σ⟩ of applied gradients (0 when none).
    pub mean: f64,
    /// Largest staleness of an applied gradient.
    pub max: u64,
    /// `histogram[σ]` = applied gradients of staleness σ.
    pub histogram: Vec<u64>,
    /// Gradients applied.
    pub applied: u64,
    /// Gradients dropped, for any reason.
    pub dropped: u64,
    /// Gradients dropped, by reason (`too-stale`, `stale-round`, `rolled-back`, `lapsed`,
    /// `non-finite`); reasons that never happened are left out.
    pub dropped_by: BTreeMap<DropReason, u64>,
}

impl StalenessStats {
    /// Count an applied gradient of staleness `sigma`.
    pub fn record_applied(&mut self, sigma: Staleness) {
        let i = usize::try_from(sigma.0).unwrap_or(usize::MAX);
        if self.histogram.len() <= i {
            self.histogram.resize(i + 1, 0);
        }
        self.histogram[i] += 1;
        self.applied += 1;
        self.sum += u128::from(sigma.0);
    }

    /// Count a gradient dropped for `reason`.
    pub fn record_dropped(&mut self, reason: DropReason) {
        *self.dropped.entry(reason).or_default() += 1;
    }

    /// Mean staleness of applied gradients, 0 when none.
    #[must_use]
    pub fn mean(&self) -> f64 {
        if self.applied == 0 { 0.0 } else { self.sum as f64 / self.applied as f64 }
    }

    /// The counts a [`StalenessSummary`] reports.
    #[must_use]
    pub fn from_summary(s: &StalenessSummary) -> Self {
        let sum = (s.histogram.iter().enumerate()).map(|(sigma, &n)| sigma as u128 * u128::from(n)).sum();
        Self { histogram: s.histogram.clone(), applied: s.applied, dropped: s.dropped_by.clone(), sum }
    }

    /// Add another set of counts to these.
    pub fn merge(&mut self, other: &Self) {
        if self.histogram.len() < other.histogram.len() {
            self.histogram.resize(other.histogram.len(), 0);
        }
        for (a, b) in self.histogram.iter_mut().zip(&other.histogram) {
            *a += b;
        }
        self.applied += other.applied;
        for (&reason, n) in &other.dropped {
            *self.dropped.entry(reason).or_default() += n;
        }
        self.sum += other.sum;
    }

    /// A report of the counts so far.
    #[must_use]
    pub fn summary(&self) -> StalenessSummary {
        StalenessSummary {
            mean: self.mean(),
            max: self.histogram.len().saturating_sub(1) as u64,
            histogram: self.histogram.clone(),
            applied: self.applied,
            dropped: self.dropped.values().sum(),
            dropped_by: self.dropped.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_mean_max_and_merge() {
        let mut a = StalenessStats::default();
        for s in [0, 2, 2, 4] {
            a.record_applied(Staleness(s));
        }
        a.record_dropped(DropReason::NonFinite);
        let sa = a.summary();
        assert_eq!(sa.dropped_by, BTreeMap::from([(DropReason::NonFinite, 1)]));
        assert_eq!(sa.histogram, vec![1, 0, 2, 0, 1]);
        assert_eq!((sa.mean, sa.max, sa.applied, sa.dropped), (2.0, 4, 4, 1));
        let mut b = StalenessStats::default();
        b.record_applied(Staleness(1));
        b.merge(&a);
        assert_eq!(b.summary().histogram, vec![1, 1, 2, 0, 1]);
        assert_eq!(b.summary().mean, 9.0 / 5.0);
        assert_eq!(StalenessStats::default().summary().max, 0);
        assert_eq!(StalenessStats::from_summary(&b.summary()), b, "the summary holds every count");
    }
}
