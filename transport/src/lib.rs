//! How Rudra's nodes reach each other: the wire messages (rkyv), their framing and codecs,
//! QUIC endpoints with mutual TLS, enrolment, and the fault-injecting relay.
//!
//! Every message that crosses a process boundary is built from the identities, clocks and
//! payloads of `rudra-proto` ([`ShardId`], [`LearnerId`], [`Clock`], [`Floats`]), re-exported
//! here.
//!
//! # Layout
//! - [`wire`]: the messages (rkyv) and their validated views.
//! - [`kind`]: message kinds, and the roles that send and receive each.
//! - [`payload`]: payload codecs (`f32`, `bf16`, `fp16`, `int8`, `topk`) and error feedback.
//! - [`frame`]: the frame header, checked before any allocation.
//! - [`reader`]: the one frame reader, for the network and the fuzzer alike.
//! - [`faults`]: link fault rules and the seeded dice that apply them.
//! - [`relay`]: a UDP relay that applies fault rules between two real nodes.
//! - [`quic`]: QUIC endpoints and authenticated peers.
//! - `udp`: the socket under QUIC, its batches bounded to what UDP carries.
//! - [`tls`]: the cluster CA, node certificates, mutual-TLS settings.
//! - [`token`]: join tokens, minted and checked with the CA key.
//! - [`enrol`]: a node gets its certificate from the scheduler with a join token.
//! - [`error`]: the crate's error type.

pub mod enrol;
pub mod error;
pub mod faults;
pub mod frame;
pub mod kind;
// rkyv generates public archived and resolver types whose fields carry no docs.
#[allow(missing_docs)]
pub mod payload;
pub mod quic;
pub mod reader;
pub mod relay;
pub mod tls;
pub mod token;
mod udp;
// rkyv generates public archived and resolver types whose fields carry no docs.
#[allow(missing_docs)]
pub mod wire;

pub use error::TransportError;
pub use faults::{Fate, FaultDice, FaultWindow, LinkFaults};
pub use kind::Kind;
pub use payload::{Codec, Codecs, Encoding, Payload};
pub use relay::{Relay, RelayControl, RelayHandle, RelayLimits, RelayRules};
pub use rudra_proto::{Clock, DropReason, Floats, LearnerId, Outcome, Role, ShardId, Staleness};
pub use wire::{Inbound, Msg};
