//! The deterministic harness: the cores of one protocol family joined by links with seeded
//! faults, in virtual time. No threads, no clocks: a run is a function of its setup, its
//! fault schedule and its seed, so a failing schedule is replayed exactly from its seed.
//!
//! Links deliver each message after a delay drawn from `1..=max_delay` ticks (so messages
//! overtake each other), lose it, or deliver it twice; a partition cuts a learner off for a
//! window; learners die (and may come back as a new incarnation), and shards restart from
//! their last checkpoint. While it runs, the harness checks the invariants every deployment
//! relies on and stops at the first one broken ([`Violation`]):
//!
//! - a shard's clock only moves forward, one update at a time, except when it restarts, and
//!   then it continues from its checkpoint's clock;
//! - no gradient is applied twice: a shard accepts each push at most once (a push whose
//!   effect a restart erased may be accepted again);
//! - no applied gradient is staler than the configured bound;
//! - every step of a learner that never dies is accepted exactly once by every shard, unless
//!   a shard's restart erased it;
//! - the run finishes: every live learner completes its steps within the horizon.
//!
//! - `dice`: the seeded random source.
//! - `network`: links in virtual time, with their faults.
//! - `sgd`: the SGD family (hardsync, n-softsync, async) under the harness.
//! - `elastic`: the elastic family (EASGD, DOWNPOUR, DiLoCo) under the harness.

mod dice;
mod elastic;
mod network;
mod sgd;
#[cfg(test)]
mod tests;

use crate::LearnerId;

pub use dice::Dice;
pub use elastic::{ElasticOutcome, ElasticSetup, run_elastic};
pub use network::{Death, FaultSchedule, Partition, Restart};
pub use sgd::{GradientFn, SgdOutcome, SgdSetup, run_sgd};

/// An invariant the run broke, with the virtual time it broke at.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("at tick {tick}: {what}")]
pub struct Violation {
    /// When.
    pub tick: u64,
    /// What was broken, and by whom.
    pub what: String,
}

/// A gradient function for harness runs: a quadratic pull of every coordinate towards a
/// target that depends on the learner, its step and the coordinate, so that the order in
/// which gradients are applied shows in the weights.
#[must_use]
pub fn quadratic_gradient(learner: LearnerId, step: u64, params: &[f32]) -> Vec<f32> {
    let learner = learner.0;
    (params.iter().enumerate())
        .map(|(i, &w)| {
            let target = ((u64::from(learner) * 31 + step * 7 + i as u64 * 3) % 11) as f32 / 10.0 - 0.5;
            w - target
        })
        .collect()
}
