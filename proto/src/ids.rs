//! Identity and time newtypes shared by every Rudra component.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Index of a parameter shard, `0..cluster.shards`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
pub struct ShardId(pub u32);

/// Index of a learner, `0..cluster.learners`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
pub struct LearnerId(pub u32);

/// A shard's weights timestamp `i`: 0 at start, +1 on every update the shard applies.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
pub struct Clock(pub u64);

/// Age `σ = i − j` of a gradient computed on weights `j` and applied at clock `i`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
pub struct Staleness(pub u64);

impl Clock {
    /// The next timestamp.
    #[must_use]
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// Staleness of a gradient computed on weights `computed_on` if applied at `self`;
    /// `None` when `computed_on` lies in the future of this clock.
    #[must_use]
    pub fn staleness_of(self, computed_on: Clock) -> Option<Staleness> {
        self.0.checked_sub(computed_on.0).map(Staleness)
    }
}

impl ShardId {
    /// The id as an index into per-shard tables.
    #[must_use]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl LearnerId {
    /// The id as an index into per-learner tables.
    #[must_use]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}

impl fmt::Display for LearnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "learner-{}", self.0)
    }
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Staleness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The role a node plays; also the prefix of its certificate name (`shard-0`).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug))]
pub enum Role {
    /// Membership, schedule, evaluation, the run directory.
    Scheduler,
    /// Holds a parameter range.
    Shard,
    /// Computes gradients.
    Learner,
    /// Stands for a learner group before every shard: the group's rounds
    /// (`docs/src/algorithms.md` §4.3).
    Aggregator,
}

impl Role {
    /// The name prefix of this role's certificates.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduler => "scheduler",
            Self::Shard => "shard",
            Self::Learner => "learner",
            Self::Aggregator => "aggregator",
        }
    }

    /// The role a certificate name such as `learner-3` belongs to.
    #[must_use]
    pub fn of_name(name: &str) -> Option<Self> {
        let prefix = name.split_once('-').map_or(name, |(p, _)| p);
        [Self::Scheduler, Self::Shard, Self::Learner, Self::Aggregator]
            .into_iter()
            .find(|r| r.as_str() == prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_is_clock_difference_and_never_negative() {
        assert_eq!(Clock(7).staleness_of(Clock(3)), Some(Staleness(4)));
        assert_eq!(Clock(3).staleness_of(Clock(3)), Some(Staleness(0)));
        assert_eq!(Clock(3).staleness_of(Clock(4)), None);
        assert_eq!(Clock(3).next(), Clock(4));
    }
}
