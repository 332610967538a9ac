#![doc = include_str!("../README.md")]
//!
//! # Crates
//! - [`transport`]: identities and wire vocabulary.
//! - [`compute`]: backends, models, datasets.
//! - [`actors`]: protocol cores, actors, the in-process [`actors::Cluster`].
//! - [`runtime`]: configuration, run directories, the `rudra-node` binary.

pub use rudra_actors as actors;
pub use rudra_compute as compute;
pub use rudra_runtime as runtime;
pub use rudra_transport as transport;
