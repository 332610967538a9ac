#![doc = include_str!("../README.md")]
//!
//! # Crates
//! - [`proto`]: the protocols as pure state machines; identities, clocks, payloads.
//! - [`transport`]: wire messages, framing, QUIC, enrolment, the fault relay.
//! - [`compute`]: backends, models, datasets.
//! - [`actors`]: the actors that drive the cores, the in-process [`actors::Cluster`].
//! - [`runtime`]: configuration, run directories, the `rudra-node` binary.

pub use rudra_actors as actors;
pub use rudra_compute as compute;
pub use rudra_proto as proto;
pub use rudra_runtime as runtime;
pub use rudra_transport as transport;
