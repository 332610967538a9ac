//! Rudra's actors and the protocols they run. The entry type is [`Cluster`]: give it a
//! [`ClusterSpec`] and the data, call [`Cluster::start`] inside an actix `System`, and await
//! the [`RunReport`].
//!
//! Protocol logic lives in [`protocol`] as pure state machines; the actors are thin shells
//! that turn messages into core inputs and carry out the effects.
//!
//! # Layout
//! - [`protocol`]: shard, learner, staleness and scheduler cores.
//! - [`shard`], [`learner`], [`tracker`], [`scheduler`]: the actix actors and their messages.
//! - [`remote`]: stand-ins for actors on other nodes, over QUIC.
//! - [`metrics`]: the live metrics a node serves in the Prometheus text format.
//! - [`checkpoint`]: a shard's checkpoint file, written atomically and read back.
//! - [`faults`]: heartbeats, retries and the failure timeout.
//! - [`cluster`]: the spec, the builder that starts everything in one process, the report.
//! - [`error`]: the crate's error type.

pub mod checkpoint;
pub mod cluster;
pub mod error;
pub mod faults;
pub mod learner;
pub mod metrics;
pub mod protocol;
pub mod remote;
pub mod scheduler;
pub mod shard;
pub mod tracker;

pub use cluster::{
    Cluster, ClusterHandle, ClusterSpec, ElasticMethod, ElasticSpec, MetricsRow, ProtocolSpec, RunEvent,
    RunReport, TrainingData,
};
pub use error::ActorError;
