//! The protocols as pure state machines: inputs through `on_*` methods, effects out through
//! `poll_event`. No actix, threads, sockets or clocks in here, so the same cores run inside the
//! actors and under a deterministic driver.
//!
//! - [`shard`]: the SGD shard behaviours of Rudra (hardsync, n-softsync, async), with the
//!   staleness bound and learning-rate modulation.
//! - [`learner`]: the learner loop (pull → compute → push).
//! - [`staleness`]: staleness statistics (histogram, mean, max, dropped), shared by shards and
//!   the tracker.
//! - [`scheduler`]: registration, evaluation points and the stop; the learning-rate schedule
//!   (applied by each shard on its own gradient count, so it is exact in every deployment).
//! - [`modulation`]: the staleness-dependent learning rate α(σ).
//! - [`elastic`]: the EASGD family's center shard and local update rules, and
//!   [`elastic_worker`]: its learner loop.

pub mod elastic;
pub mod elastic_worker;
pub mod learner;
pub mod modulation;
pub mod scheduler;
pub mod shard;
pub mod staleness;

pub use elastic::{CenterEvent, CenterRule, CenterShard};
pub use elastic_worker::{ElasticWorker, LocalRule, WorkerEvent};
pub use learner::{LearnerCore, LearnerEvent};
pub use modulation::LrModulation;
pub use scheduler::{LrSchedule, SchedulerCore, SchedulerEvent};
pub use shard::{
    DropReason, GradientRecord, Outcome, SgdShard, ShardEvent, ShardState, SyncRule, UpdateRecord, Weights,
};
pub use staleness::{StalenessStats, StalenessSummary};
