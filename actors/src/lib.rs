//! Rudra's actors and the protocols they run. The entry type is [`Cluster`]: give it a
//! [`ClusterSpec`], the [`Models`] to train (a built-in network or one of your own) and the
//! [`TrainingData`], call [`Cluster::start`] inside an actix `System`, and await the
//! [`RunReport`].
//!
//! Protocol logic lives in `rudra-proto` as pure state machines; the actors are thin shells
//! that turn messages into core inputs and carry out the effects.
//!
//! # Layout
//! - [`spec`]: what defines a run, validated once; it builds each role's core.
//! - [`roles`]: the one place each role (tracker, shard, learner, scheduler) is started, with
//!   its links, fault wrappers, metrics and checkpoints.
//! - [`messages`]: every actor message; [`links`]: how an actor reaches its peers.
//! - [`shard`], [`learner`], [`tracker`], [`scheduler`]: the actix actors.
//! - [`aggregator`], [`group_leader`]: a learner group's tree in front of a shard, and a group
//!   with rounds of its own.
//! - [`remote`]: stand-ins for actors on other nodes, and the codec between actor messages and
//!   wire messages.
//! - [`cluster`]: [`Cluster`], the roles started over local addresses.
//! - [`report`]: what a run reports.
//! - [`metrics`]: the live metrics a node serves in the Prometheus text format.
//! - [`checkpoint`]: a shard's checkpoint file, written atomically and read back.
//! - [`faults`]: heartbeats, retries and the failure timeout, and injected faults.
//! - [`goodput`]: each learner's compute and waiting time, and the run's goodput.
//! - [`error`]: the crate's error types.

pub mod aggregator;
pub mod checkpoint;
pub mod cluster;
pub mod error;
mod evaluation;
pub mod faults;
pub mod goodput;
pub mod group_leader;
pub mod learner;
pub mod links;
pub mod messages;
pub mod metrics;
mod models;
pub mod remote;
pub mod report;
pub mod roles;
pub mod scheduler;
pub mod shard;
pub mod spec;
pub mod tracker;

pub use cluster::{Cluster, ClusterHandle};
pub use error::{ActorError, InvalidSetting};
pub use models::Models;
pub use report::{
    BytesMoved, Diverged, MetricsRow, ProgressSnapshot, RunEvent, RunReport, SchedulerState, TimelineEntry,
};
pub use spec::{
    BatchSizing, ClusterSpec, ElasticMethod, ElasticSpec, MAX_GRACE_MS, ProtocolSpec, QuorumSpec, SgdSpec,
    TrainingData,
};
