//! The vocabulary Rudra's nodes speak: typed identities ([`ShardId`], [`LearnerId`]),
//! weight timestamps ([`Clock`]) and gradient ages ([`Staleness`]).
//!
//! Every message that crosses a process boundary is built from these types, and so is every
//! input of the protocol cores in `rudra-actors`.
//!
//! # Layout
//! - [`ids`]: identity and time newtypes.

pub mod ids;

pub use ids::{Clock, LearnerId, ShardId, Staleness};
