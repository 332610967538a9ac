//! The protocols as pure state machines: inputs through `on_*` methods, each returning the
//! effects it causes, in order. No actix, threads, sockets or clocks in here, so the same cores
//! run inside the actors and under a deterministic driver.
//!
//! - `shard`: the SGD shard behaviours of Rudra (hardsync, n-softsync, async), with the
//!   staleness bound and learning-rate modulation.
//! - `elastic`: the EASGD family's center shard and local update rules, and
//!   `elastic_worker`: its learner loop.
//! - `cores`: the one enum over the shard cores and the one over the learner loops.
//! - `records`: what shards report (weights, gradient and update records, their effects)
//!   and keep across a restart.
//! - `learner`: the learner loop (pull → compute → push).
//! - `staleness`: staleness statistics (histogram, mean, max, dropped), shared by shards and
//!   the tracker.
//! - `scheduler`: registration, evaluation points and the stop; the learning-rate schedule
//!   (applied by each shard on its own gradient count, so it is exact in every deployment).
//! - `modulation`: the staleness-dependent learning rate α(σ).
//! - `optimizer`: the local optimizers of learners that step on their own (SGD, momentum,
//!   AdamW).
//! - `error`: why a core refuses an input.

mod cores;
mod elastic;
mod elastic_worker;
mod error;
mod learner;
mod modulation;
mod optimizer;
mod records;
mod scheduler;
mod shard;
mod staleness;

pub use cores::{LearnerLoop, ShardCore};
pub use elastic::{
    CenterRule, CenterShard, DownpourLearner, ElasticLearner, ElasticSettings, sync_easgd_is_stable,
};
pub use elastic_worker::{ElasticWorker, LocalRule, WorkerEvent};
pub use error::CoreError;
pub use learner::{LearnerCore, LearnerEvent, NextPull};
pub use modulation::LrModulation;
pub use optimizer::{LocalOptimizer, OptimizerSpec};
pub use records::{GradientRecord, ShardEvent, ShardState, UpdateRecord, Weights};
pub use rudra_transport::{DropReason, Outcome};
pub use scheduler::{DIVERGENCE_FACTOR, Divergence, LrSchedule, SchedulerCore, SchedulerEvent};
pub use shard::{SgdShard, SgdShardConfig, SyncRule};
pub use staleness::{StalenessStats, StalenessSummary};
