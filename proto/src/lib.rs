//! Rudra's protocols as pure state machines, with the identities, clocks and payloads they
//! speak of. Inputs go in through `on_*` methods, each returning the effects it causes, in
//! order; nothing in this crate touches a socket, a clock, a thread or an actor, so the same
//! cores run inside the actors, in the simulator and under the deterministic harness. The
//! equations they implement are specified in `docs/src/algorithms.md`.
//!
//! # Layout
//! - [`ids`]: identity and time newtypes ([`ShardId`], [`LearnerId`], [`Clock`],
//!   [`Staleness`], [`Role`]).
//! - [`floats`]: float payloads shared without copying ([`Floats`]).
//! - `outcome`: what becomes of a gradient at a shard ([`Outcome`], [`DropReason`]).
//! - `shard`: the SGD shard behaviours of Rudra (hardsync, n-softsync, async), with the
//!   staleness bound and learning-rate modulation.
//! - `elastic`: the EASGD family's center shard and local update rules, and
//!   `elastic_worker`: its learner loop.
//! - `group`: a learner group's round at its aggregator ([`GroupRound`]): one aggregate per
//!   shard and weights clock for the group's pushes.
//! - `batches`: adaptive batch sizes, μ_l from each learner's throughput ([`BatchPlanner`]).
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
//! - [`harness`]: the deterministic harness: the cores on seeded faulty links, in virtual
//!   time, with their invariants checked.
//! - `window`: which of a learner's pushes a shard has taken ([`PushWindow`]).
//! - `error`: why a core refuses an input.

mod batches;
mod cores;
mod elastic;
mod elastic_worker;
mod error;
pub mod floats;
mod group;
pub mod harness;
pub mod ids;
mod leader;
mod learner;
mod modulation;
mod optimizer;
mod outcome;
mod quorum;
mod records;
mod scheduler;
mod shard;
mod staleness;
mod window;

pub use batches::{BatchPlanner, sizes_for};
pub use cores::{LearnerLoop, ShardCore};
pub use elastic::{
    CenterRule, CenterShard, DownpourLearner, ElasticLearner, ElasticSettings, sync_easgd_is_stable,
};
pub use elastic_worker::{ElasticWorker, LocalRule, WorkerEvent};
pub use error::CoreError;
pub use floats::Floats;
pub use group::{Batch, GroupRound, learner_groups};
pub use ids::{Clock, LearnerId, Role, ShardId, Staleness};
pub use leader::{GroupLeader, LeaderEvent, LeaderGroups, MemberPull};
pub use learner::{Answered, LearnerCore, LearnerEvent, MAX_PREFETCH, NextPull};
pub use modulation::LrModulation;
pub use optimizer::{LocalOptimizer, OptimizerSpec};
pub use outcome::{DropReason, Outcome};
pub use quorum::GraceWindow;
pub use records::{GradientRecord, ShardEvent, ShardState, UpdateRecord, Weights};
pub use scheduler::{DIVERGENCE_FACTOR, Divergence, LrSchedule, SchedulerCore, SchedulerEvent};
pub use shard::{Contribution, LateRule, Quorum, SgdShard, SgdShardConfig, SyncRule, shard_ranges};
pub use staleness::{StalenessStats, StalenessSummary};
pub use window::PushWindow;
