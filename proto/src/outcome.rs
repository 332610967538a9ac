//! What becomes of a gradient or an exchange at a shard: applied with a rate, or dropped
//! for a reason.

/// Why a gradient (or an exchange) was not applied.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// Its staleness exceeded `max_staleness`.
    TooStale,
    /// Hardsync: it was computed on weights of an earlier round.
    StaleRound,
    /// It was computed on weights the shard lost in a crash (newer than its checkpoint).
    RolledBack,
    /// Its learner was declared lost after computing it: it rejoined, and starts afresh from
    /// the current weights.
    Lapsed,
    /// It held a NaN or ±Inf: such values never reach the weights.
    NonFinite,
}

impl DropReason {
    /// Every reason, in the order reports list them.
    pub const ALL: [Self; 5] =
        [Self::TooStale, Self::StaleRound, Self::RolledBack, Self::Lapsed, Self::NonFinite];

    /// The reason as reports and metrics name it, e.g. `too-stale`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooStale => "too-stale",
            Self::StaleRound => "stale-round",
            Self::RolledBack => "rolled-back",
            Self::Lapsed => "lapsed",
            Self::NonFinite => "non-finite",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to one gradient at a shard.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq))]
pub enum Outcome {
    /// Applied with this learning rate.
    Applied {
        /// The rate `α` it was applied with.
        alpha: f32,
    },
    /// Dropped, counted, and reported.
    Dropped(DropReason),
}
