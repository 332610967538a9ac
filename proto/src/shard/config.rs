//! What configures an SGD shard: its rule, its settings, and the parameter ranges of a run's
//! shards.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::{LrModulation, LrSchedule, ShardId};
#[cfg(doc)]
use crate::{SgdShard, ShardEvent};

/// When a shard applies an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncRule {
    /// Bulk synchronous: one gradient from each active learner, all on the current weights.
    Hardsync,
    /// Apply as soon as `c = ⌊λ/n⌋` (at least 1) gradients are held, from any learners.
    Softsync {
        /// The splitting parameter, `1 ≤ n ≤ λ`.
        n: u32,
    },
    /// Asynchronous SGD: every gradient is an update as it arrives (`c = 1`), as λ-softsync.
    Async,
}

/// What a quorum round does with a contribution computed on an earlier round's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LateRule {
    /// Apply it in the open round with α(σ), σ the rounds it missed.
    Fold,
    /// Drop it and count it (`stale-round`), as backup learners do.
    Drop,
}

/// The rounds of a quorum (`docs/src/algorithms.md` §5.2): how many contributions on the open
/// round's weights may close it, and what one of an earlier round comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quorum {
    /// q.
    pub size: u32,
    /// Folded into the open round, or dropped.
    pub late: LateRule,
}

/// Settings of an SGD shard.
#[derive(Clone, Debug, PartialEq)]
pub struct SgdShardConfig {
    /// The shard's id.
    pub id: ShardId,
    /// When updates are applied.
    pub rule: SyncRule,
    /// `α(σ)`.
    pub modulation: LrModulation,
    /// The staleness bound `s`, if any.
    pub max_staleness: Option<u64>,
    /// Hardsync: backup learners b; a round completes with the first λ − b gradients on the
    /// current weights, and the rest arrive late (dropped as `stale-round`).
    pub backups: u32,
    /// Hardsync: the quorum, if any. A round holding q contributions on the current weights
    /// may close before the rest arrive: the shard says [`ShardEvent::Quorum`], and closes it
    /// when told the grace window is over ([`SgdShard::on_grace_over`]) unless all arrived
    /// first (`docs/src/algorithms.md` §5.2).
    pub quorum: Option<Quorum>,
    /// The base learning rate `α0` per epoch.
    pub schedule: LrSchedule,
    /// μ, the nominal minibatch: a gradient over μ_k examples has the share μ_k / μ of an
    /// update (adaptive batch sizes, `docs/src/algorithms.md` §5.1).
    pub batch: u32,
    /// Gradients (from all learners) per epoch: the epoch of a gradient is the number received
    /// before it divided by this, so the schedule is exact and the same in every deployment.
    pub gradients_per_epoch: u64,
    /// Steps a learner may push ahead of its answers (`docs/src/algorithms.md §4.1`): with
    /// k > 0 the staleness gate counts what a learner owes at the weights its last push was
    /// computed on, which it may compute on again.
    pub prefetch: u32,
}

/// The ranges of `shards` contiguous, near-equal parts of a vector of `len` values: the
/// parameter ranges of a run's shards.
#[must_use]
pub fn shard_ranges(len: usize, shards: usize) -> Vec<Range<usize>> {
    let shards = shards.max(1);
    (0..shards).map(|s| (s * len / shards)..((s + 1) * len / shards)).collect()
}
