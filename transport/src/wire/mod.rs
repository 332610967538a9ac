//! The messages Rudra's nodes exchange, archived with rkyv, and their validated views.
//!
//! A received body is validated once ([`Inbound::decode`]); control messages are then small
//! owned values, and a weights or gradient payload is a [`Floats`] view into the receive buffer,
//! never copied element by element.

use std::sync::Arc;

use bytes::Bytes;
use rkyv::rancor::BoxedError;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use rudra_proto::floats::AsFloatVec;

mod samples;

pub use samples::{compressed_samples, samples};

use crate::frame::{BodyWriter, Frame};
use crate::payload::{Codec, Payload, in_frame};
use crate::{Clock, Floats, Kind, LearnerId, Outcome, Role, ShardId, Staleness, TransportError};

/// One gradient's fate, as a shard reports it to the scheduler's tracker.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub struct GradientReport {
    /// The learner.
    pub learner: LearnerId,
    /// The clock of the weights it was computed on.
    pub computed_on: Clock,
    /// σ.
    pub staleness: Staleness,
    /// Applied (with its rate) or dropped (with the reason).
    pub outcome: Outcome,
}

/// One update a shard applied.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub struct UpdateReport {
    /// The clock after the update.
    pub clock: Clock,
    /// Gradients combined into it.
    pub gradients: u32,
    /// Payload bytes the shard received since its previous update.
    pub payload_in: u64,
}

/// One member's part of an [`Msg::Aggregate`]: its gradient's step and examples, and the pull
/// that rides on it.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct AggregateMember {
    /// The member.
    pub learner: LearnerId,
    /// Its step.
    pub seq: u64,
    /// The examples its gradient is the mean over.
    pub examples: u32,
    /// The step of the pull it carries …
    pub next_seq: u64,
    /// … and whether that pull is its last.
    pub last: bool,
}

/// Every message of the wire protocol.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub enum Msg {
    /// Node → scheduler: I am `name`; learners reach me (a shard) at `data_addr`.
    Join {
        /// Role claimed (checked against the certificate).
        role: Role,
        /// Node name (checked against the certificate).
        name: String,
        /// Where this shard accepts learners; empty for learners.
        data_addr: String,
    },
    /// Scheduler → node: your id, the run configuration, and the shards' addresses.
    Welcome {
        /// Shard or learner id.
        id: u32,
        /// The resolved run configuration, TOML.
        config_toml: String,
        /// Examples in the training set (fixes the epoch length at the shards).
        train_examples: u64,
        /// `shard_addrs[s]` is shard `s`'s data address (for learners).
        shard_addrs: Vec<String>,
        /// `shard_names[s]` is shard `s`'s certificate name (for learners).
        shard_names: Vec<String>,
        /// `learner_names[l]` is learner `l`'s certificate name (for shards, which accept
        /// learner `l` only from that certificate).
        learner_names: Vec<String>,
        /// The run's identity (its checkpoints carry it).
        job: String,
        /// How many times this node joined before: 0 at the start of the run; more for a node
        /// that restarted and rejoins the running job (a shard then resumes from its
        /// checkpoint, a learner starts at once with step numbers after every earlier one).
        incarnation: u32,
    },
    /// Learner → scheduler: connected to every shard, ready to start.
    Ready,
    /// Scheduler → learners: begin.
    Start,
    /// Scheduler → everyone: the run is over; exit.
    Stop,
    /// Learner → scheduler: more gradients computed.
    Progress {
        /// The learner that computed them.
        learner: LearnerId,
        /// Which start of the learner the totals count from.
        session: u64,
        /// Examples.
        samples: u64,
        /// Gradients.
        steps: u64,
        /// Sum of minibatch losses.
        loss_sum: f64,
        /// Payload bytes sent: gradients and exchanges.
        payload_up: u64,
        /// Payload bytes received: weights and centers.
        payload_down: u64,
        /// Frame bytes sent and received.
        wire_bytes: u64,
        /// Seconds spent computing gradients.
        compute_seconds: f64,
    },
    /// Learner → scheduler: all steps done, or failed.
    LearnerDone {
        /// Why it stopped early.
        error: Option<String>,
    },
    /// Shard → scheduler: gradient and update records.
    Records {
        /// Gradients applied or dropped.
        gradients: Vec<GradientReport>,
        /// Updates applied.
        updates: Vec<UpdateReport>,
    },
    /// Scheduler → shard: send your current weights.
    SnapshotRequest {
        /// Echoed in the answer.
        request: u64,
    },
    /// Shard → scheduler: the weights asked for.
    Snapshot {
        /// The request answered.
        request: u64,
        /// Shard clock.
        clock: Clock,
        /// The shard's parameter range.
        #[rkyv(with = AsFloatVec)]
        values: Floats,
    },
    /// Anyone: I am alive.
    Heartbeat,
    /// Scheduler → shard: the active learners changed (a learner was lost or rejoined).
    Membership {
        /// The learners now active.
        active: Vec<LearnerId>,
    },
    /// Shard → scheduler: restarted, I resumed from my checkpoint at `clock`.
    Resumed {
        /// The clock of the checkpoint.
        clock: Clock,
    },
    /// Learner → shard, first on a connection: I am learner `learner`, and take you for shard
    /// `shard`. (An aggregator serves its group on behalf of every shard, told apart by this;
    /// an aggregator says hello to a shard as its group's leader.)
    Hello {
        /// The learner id the scheduler assigned.
        learner: LearnerId,
        /// The shard this connection is for.
        shard: ShardId,
    },
    /// Learner → shard: send me your weights.
    Pull {
        /// Who.
        learner: LearnerId,
        /// The learner's step it is for; the answer carries it back.
        seq: u64,
        /// After the learner's last push: answer once, expect no gradient.
        last: bool,
    },
    /// Shard → learner: weights, the answer to a pull.
    Weights {
        /// From which shard.
        shard: ShardId,
        /// Whose pull it answers (an aggregator's connection carries its members' pulls).
        learner: LearnerId,
        /// The pull answered.
        seq: u64,
        /// Their clock.
        clock: Clock,
        /// The values, encoded with the job's weights codec.
        values: Payload,
    },
    /// Learner → shard: a gradient slice.
    Push {
        /// Who.
        learner: LearnerId,
        /// The learner's step: a copy of a push already applied is ignored.
        seq: u64,
        /// The clock of the weights it was computed on.
        computed_on: Clock,
        /// The values, encoded with the job's gradients codec.
        values: Payload,
        /// The examples it is the mean over (μ, or the learner's own μ_l with adaptive batch
        /// sizes).
        examples: u32,
        /// The learner's next pull rides on the push: its step …
        next_seq: u64,
        /// … and whether it is the learner's last.
        last: bool,
    },
    /// Aggregator → shard: a learner group's gradients on one clock combined, the mean over
    /// all the members' examples, with every member's next pull riding on it.
    Aggregate {
        /// Whose gradients, at which of their steps, over how many examples each, and their
        /// next pulls.
        members: Vec<AggregateMember>,
        /// The clock of the weights they were all computed on.
        computed_on: Clock,
        /// The values, encoded with the job's gradients codec.
        values: Payload,
    },
    /// Learner → center shard (EASGD family): x^i, DOWNPOUR's accumulated update, or
    /// MDOWNPOUR's gradient for the shard's range; answered with `Center`.
    Exchange {
        /// Who.
        learner: LearnerId,
        /// The values, encoded with the job's codec for their kind.
        values: Payload,
    },
    /// Center shard → learner: the center variable of its range, the answer to an exchange.
    Center {
        /// From which shard.
        shard: ShardId,
        /// Its clock.
        clock: Clock,
        /// The values, encoded with the job's weights codec.
        values: Payload,
    },
    /// Scheduler → learner: evaluate these weights with your model's own evaluation (an
    /// external model's); `last`: they are the run's final weights, keep them.
    Evaluate {
        /// Echoed in the answer.
        request: u64,
        /// The run's final weights.
        last: bool,
        /// The whole parameter vector.
        #[rkyv(with = AsFloatVec)]
        values: Floats,
    },
    /// Learner → scheduler: the evaluation asked for, `(loss, accuracy)`, or nothing from a
    /// learner whose model has none.
    Evaluated {
        /// The request answered.
        request: u64,
        /// Mean test loss and accuracy.
        measured: Option<(f64, f64)>,
    },
    /// Scheduler → learners, just before `Stop` on the same ordered stream: the run's
    /// `summary.json`, which a learner embedded in a program hands back to it.
    Summary {
        /// The summary, JSON.
        json: String,
    },
    /// Scheduler → learners: with adaptive batch sizes, every learner's minibatch size in each
    /// epoch chosen so far, from epoch 0 (`sizes[e][l]`).
    BatchSizes {
        /// The sizes, per epoch and learner.
        sizes: Vec<Vec<u32>>,
    },
}

impl Msg {
    /// This message's kind.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Join { .. } => Kind::Join,
            Self::Welcome { .. } => Kind::Welcome,
            Self::Ready => Kind::Ready,
            Self::Start => Kind::Start,
            Self::Stop => Kind::Stop,
            Self::Progress { .. } => Kind::Progress,
            Self::LearnerDone { .. } => Kind::LearnerDone,
            Self::Records { .. } => Kind::Records,
            Self::SnapshotRequest { .. } => Kind::SnapshotRequest,
            Self::Snapshot { .. } => Kind::Snapshot,
            Self::Heartbeat => Kind::Heartbeat,
            Self::Membership { .. } => Kind::Membership,
            Self::Resumed { .. } => Kind::Resumed,
            Self::Hello { .. } => Kind::Hello,
            Self::Pull { .. } => Kind::Pull,
            Self::Weights { .. } => Kind::Weights,
            Self::Push { .. } => Kind::Push,
            Self::Aggregate { .. } => Kind::Aggregate,
            Self::Exchange { .. } => Kind::Exchange,
            Self::Center { .. } => Kind::Center,
            Self::Evaluate { .. } => Kind::Evaluate,
            Self::Evaluated { .. } => Kind::Evaluated,
            Self::Summary { .. } => Kind::Summary,
            Self::BatchSizes { .. } => Kind::BatchSizes,
        }
    }

    /// The frame of this message, ready to write. The body is archived exactly as rkyv
    /// archives the message on its own; a payload's values go out from where they lie, as a
    /// chunk of the frame, and are not copied first.
    pub fn encode(&self) -> Result<Frame, TransportError> {
        let spans = self.payload_spans();
        let body = rkyv::api::high::to_bytes_in::<_, BoxedError>(self, BodyWriter::new(&spans, 256))
            .map_err(|e| TransportError::Encode(e.to_string()))?;
        Frame::new(self.kind(), body)
    }

    /// The bytes of its payload's values, where they lie.
    fn payload_spans(&self) -> Vec<Bytes> {
        match self {
            Self::Weights { values, .. }
            | Self::Center { values, .. }
            | Self::Push { values, .. }
            | Self::Aggregate { values, .. }
            | Self::Exchange { values, .. } => vec![values.values_bytes()],
            Self::Snapshot { values, .. } | Self::Evaluate { values, .. } => vec![values.as_bytes()],
            _ => Vec::new(),
        }
    }
}

/// A validated incoming message: small messages owned, payloads viewed in place.
#[derive(Clone, Debug)]
pub enum Inbound {
    /// Anything without a float payload, deserialized.
    Control(Msg),
    /// Weights from a shard.
    Weights {
        /// The shard.
        shard: ShardId,
        /// Whose pull they answer.
        learner: LearnerId,
        /// The pull answered.
        seq: u64,
        /// Their clock.
        clock: Clock,
        /// The values, decoded.
        values: Floats,
        /// The codec they travelled with.
        codec: Codec,
    },
    /// A gradient slice from a learner, and the pull that rides on it.
    Push {
        /// The learner.
        learner: LearnerId,
        /// The learner's step.
        seq: u64,
        /// The clock it was computed on.
        computed_on: Clock,
        /// The values, decoded.
        values: Floats,
        /// The codec they travelled with.
        codec: Codec,
        /// The examples it is the mean over.
        examples: u32,
        /// The step of the pull it carries.
        next_seq: u64,
        /// Whether that pull is the learner's last.
        last: bool,
    },
    /// A learner group's combined gradients from its aggregator, and its members' pulls.
    Aggregate {
        /// The members, their steps, examples and next pulls.
        members: Vec<AggregateMember>,
        /// The clock they were computed on.
        computed_on: Clock,
        /// The values, decoded.
        values: Floats,
        /// The codec they travelled with.
        codec: Codec,
    },
    /// A center shard's center for a learner.
    Center {
        /// The shard.
        shard: ShardId,
        /// Its clock.
        clock: Clock,
        /// The values, decoded.
        values: Floats,
        /// The codec they travelled with.
        codec: Codec,
    },
    /// Values for an elastic exchange from a learner.
    Exchange {
        /// The learner.
        learner: LearnerId,
        /// The values, decoded.
        values: Floats,
        /// The codec they travelled with.
        codec: Codec,
    },
    /// A shard's weights for the scheduler.
    Snapshot {
        /// The request answered.
        request: u64,
        /// The shard clock.
        clock: Clock,
        /// The values.
        values: Floats,
    },
}

impl Inbound {
    /// Validate `body` (exactly the body bytes, 16-byte aligned) as a message of `kind`, read
    /// under a frame limit of `max_body` bytes: a compressed payload decodes to no more values
    /// than an `f32` payload of that size holds.
    pub fn decode(kind: Kind, body: AlignedVec, max_body: u32) -> Result<Self, TransportError> {
        Self::decode_shared(kind, &Arc::new(body), max_body)
    }

    /// [`Inbound::decode`] of a body that may be shared; payload views keep it alive.
    pub fn decode_shared(kind: Kind, buf: &Arc<AlignedVec>, max_body: u32) -> Result<Self, TransportError> {
        let max_len = max_body as usize / 4;
        let archived = rkyv::access::<ArchivedMsg, BoxedError>(buf)
            .map_err(|e| TransportError::BadFrame(format!("{kind:?} body failed validation: {e}")))?;
        let inbound = match archived {
            ArchivedMsg::Weights { shard, learner, seq, clock, values } => Self::Weights {
                shard: ShardId(shard.0.to_native()),
                learner: LearnerId(learner.0.to_native()),
                seq: seq.to_native(),
                clock: Clock(clock.0.to_native()),
                codec: values.codec(),
                values: values.decode_in(buf, max_len)?,
            },
            ArchivedMsg::Center { shard, clock, values } => Self::Center {
                shard: ShardId(shard.0.to_native()),
                clock: Clock(clock.0.to_native()),
                codec: values.codec(),
                values: values.decode_in(buf, max_len)?,
            },
            ArchivedMsg::Push { learner, seq, computed_on, values, examples, next_seq, last } => Self::Push {
                learner: LearnerId(learner.0.to_native()),
                seq: seq.to_native(),
                computed_on: Clock(computed_on.0.to_native()),
                codec: values.codec(),
                values: values.decode_in(buf, max_len)?,
                examples: examples.to_native(),
                next_seq: next_seq.to_native(),
                last: *last,
            },
            ArchivedMsg::Aggregate { members, computed_on, values } => Self::Aggregate {
                members: (members.iter())
                    .map(|m| AggregateMember {
                        learner: LearnerId(m.learner.0.to_native()),
                        seq: m.seq.to_native(),
                        examples: m.examples.to_native(),
                        next_seq: m.next_seq.to_native(),
                        last: m.last,
                    })
                    .collect(),
                computed_on: Clock(computed_on.0.to_native()),
                codec: values.codec(),
                values: values.decode_in(buf, max_len)?,
            },
            ArchivedMsg::Exchange { learner, values } => Self::Exchange {
                learner: LearnerId(learner.0.to_native()),
                codec: values.codec(),
                values: values.decode_in(buf, max_len)?,
            },
            ArchivedMsg::Snapshot { request, clock, values } => Self::Snapshot {
                request: request.to_native(),
                clock: Clock(clock.0.to_native()),
                values: in_frame(buf, values)?,
            },
            other => Self::Control(
                rkyv::deserialize::<Msg, BoxedError>(other)
                    .map_err(|e| TransportError::BadFrame(format!("{kind:?} body: {e}")))?,
            ),
        };
        if inbound.kind() != kind {
            return Err(TransportError::BadFrame(format!(
                "header says {kind:?} but the body holds {:?}",
                inbound.kind()
            )));
        }
        Ok(inbound)
    }

    /// The message kind.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Control(m) => m.kind(),
            Self::Weights { .. } => Kind::Weights,
            Self::Center { .. } => Kind::Center,
            Self::Push { .. } => Kind::Push,
            Self::Aggregate { .. } => Kind::Aggregate,
            Self::Exchange { .. } => Kind::Exchange,
            Self::Snapshot { .. } => Kind::Snapshot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{HEADER_LEN, MAGIC, VERSION};
    use crate::payload::Encoding;
    use crate::reader::Accepts;

    const MAX: u32 = 64 << 20;

    #[test]
    fn a_frame_body_is_the_message_archived_on_its_own() {
        for msg in samples().into_iter().chain(compressed_samples()) {
            let frame = msg.encode().unwrap().to_bytes();
            let alone = rkyv::to_bytes::<BoxedError>(&msg).unwrap();
            assert_eq!(&frame[HEADER_LEN..], &alone[..], "{:?}", msg.kind());
        }
    }

    #[test]
    fn a_payload_goes_out_from_where_it_lies_as_a_chunk_of_its_frame() {
        let values: Floats = (0..4096).map(|i| i as f32 * 0.25).collect::<Vec<f32>>().into();
        for codec in Codec::ALL {
            let payload = Payload::encode(Encoding { codec, ..Encoding::default() }, &values, None);
            let lies = payload.values_bytes();
            let msg = Msg::Push {
                learner: LearnerId(0),
                seq: 1,
                computed_on: Clock(0),
                values: payload,
                examples: 1,
                next_seq: 2,
                last: false,
            };
            let chunks = msg.encode().unwrap().into_chunks();
            assert!(chunks.iter().any(|c| c.as_ptr() == lies.as_ptr() && c.len() == lies.len()), "{codec}");
            let alone = rkyv::to_bytes::<BoxedError>(&msg).unwrap();
            assert_eq!(&chunks.concat()[HEADER_LEN..], &alone[..], "{codec}");
        }
    }

    #[test]
    fn every_message_round_trips() {
        for msg in samples().into_iter().chain(compressed_samples()) {
            let bytes = msg.encode().unwrap().to_bytes();
            let back = decode_frame(&bytes, MAX).unwrap();
            assert_eq!(back.kind(), msg.kind());
            match (&back, &msg) {
                (Inbound::Control(m), _) => assert_eq!(m, &msg),
                (
                    Inbound::Weights { shard, learner, seq, clock, values, codec },
                    Msg::Weights { shard: s, learner: l, seq: q, clock: c, values: v },
                ) => {
                    assert_eq!(*codec, v.codec());
                    let sent = (s, l, q, c, &v.clone().decode().unwrap()[..]);
                    assert_eq!((shard, learner, seq, clock, &values[..]), sent);
                }
                (
                    Inbound::Aggregate { members, computed_on, values, codec },
                    Msg::Aggregate { members: m, computed_on: c, values: v },
                ) => {
                    assert_eq!(*codec, v.codec());
                    assert_eq!((members, computed_on, &values[..]), (m, c, &v.clone().decode().unwrap()[..]));
                }
                (
                    Inbound::Push { learner, seq, computed_on, values, codec, examples, next_seq, last },
                    Msg::Push {
                        learner: l,
                        seq: q,
                        computed_on: c,
                        values: v,
                        examples: e,
                        next_seq: n,
                        last: t,
                    },
                ) => {
                    assert_eq!(*codec, v.codec());
                    assert_eq!((learner, seq, computed_on, examples, next_seq, last), (l, q, c, e, n, t));
                    assert_eq!(&values[..], &v.clone().decode().unwrap()[..]);
                }
                (
                    Inbound::Center { shard, clock, values, codec },
                    Msg::Center { shard: s, clock: c, values: v },
                ) => {
                    assert_eq!(*codec, v.codec());
                    assert_eq!((shard, clock, &values[..]), (s, c, &v.clone().decode().unwrap()[..]));
                }
                (Inbound::Exchange { learner, values, codec }, Msg::Exchange { learner: l, values: v }) => {
                    assert_eq!(*codec, v.codec());
                    assert_eq!((learner, &values[..]), (l, &v.clone().decode().unwrap()[..]));
                }
                (
                    Inbound::Snapshot { request, clock, values },
                    Msg::Snapshot { request: r, clock: c, values: v },
                ) => {
                    assert_eq!((request, clock, &values[..]), (r, c, &v[..]));
                }
                other => panic!("decoded to the wrong shape: {other:?}"),
            }
        }
    }

    #[test]
    fn payloads_are_viewed_in_the_receive_buffer() {
        let bytes = Msg::Push {
            learner: LearnerId(0),
            seq: 1,
            computed_on: Clock(0),
            values: vec![3.0; 4096].into(),
            examples: 1,
            next_seq: 2,
            last: false,
        }
        .encode()
        .unwrap()
        .to_bytes();
        let mut body = AlignedVec::new();
        body.extend_from_slice(&bytes[HEADER_LEN..]);
        let range = body.as_ptr_range();
        let Inbound::Push { values, .. } = Inbound::decode(Kind::Push, body, 1 << 20).unwrap() else {
            panic!()
        };
        let view = &values[..].as_ptr_range();
        assert!(range.start as usize <= view.start as usize && view.end as usize <= range.end as usize);
    }

    /// Read `bytes` as the one frame reader does, on a link whose roles may carry the kind
    /// the header names (a learner's to a shard where the kind is unknown).
    fn decode_frame(bytes: &[u8], max: u32) -> Result<Inbound, TransportError> {
        let kind = bytes.get(6..8).and_then(|k| Kind::from_u16(u16::from_le_bytes([k[0], k[1]])));
        let accepts = kind.map_or(
            Accepts { from_name: "peer", from: Role::Learner, to: Role::Shard, max_body: max },
            |kind| Accepts { max_body: max, ..Accepts::for_kind(kind) },
        );
        crate::reader::decode_frame(bytes, &accepts)
    }

    fn rejected(bytes: &[u8], max: u32) -> String {
        match decode_frame(bytes, max) {
            Err(TransportError::BadFrame(why)) => why,
            other => panic!("accepted a bad frame: {other:?}"),
        }
    }

    #[test]
    fn bad_frames_are_rejected_with_a_reason() {
        let good = Msg::Push {
            learner: LearnerId(1),
            seq: 1,
            computed_on: Clock(2),
            values: vec![1.0; 64].into(),
            examples: 1,
            next_seq: 2,
            last: false,
        }
        .encode()
        .unwrap()
        .to_bytes()
        .to_vec();
        assert!(rejected(&good[..10], MAX).contains("truncated header"));
        assert!(rejected(&good[..good.len() - 3], MAX).contains("truncated"));
        assert!(rejected(&good, 100).contains("exceeds"));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(rejected(&bad, MAX).contains("magic"));
        let mut bad = good.clone();
        bad[4..6].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert!(rejected(&bad, MAX).contains("version"));
        let mut bad = good.clone();
        bad[6..8].copy_from_slice(&999u16.to_le_bytes());
        assert!(rejected(&bad, MAX).contains("unknown message kind"));
        let mut bad = good.clone();
        bad[6..8].copy_from_slice(&(Kind::Weights as u16).to_le_bytes());
        assert!(rejected(&bad, MAX).contains("header says Weights"));
        let mut bad = good.clone();
        bad[HEADER_LEN..].fill(0xff); // no message has this tag or these pointers
        assert!(rejected(&bad, MAX).contains("validation"));
    }

    /// Compressed payloads are checked at the boundary like the rest of a frame: scales that do
    /// not fit the codes, or are not finite, make the whole frame a bad one.
    #[test]
    fn malformed_compressed_payloads_are_bad_frames() {
        let push = |values: Payload| {
            let m = Msg::Push {
                learner: LearnerId(1),
                seq: 1,
                computed_on: Clock(2),
                values,
                examples: 1,
                next_seq: 2,
                last: false,
            };
            m.encode().unwrap().to_bytes().to_vec()
        };
        let int8 = |block, scales: Vec<f32>, n| Payload::Int8 {
            block,
            scales: scales.into(),
            values: vec![3; n].into(),
        };
        let fp16 =
            |scales: Vec<f32>| Payload::Fp16 { block: 4, scales: scales.into(), values: vec![0; 8].into() };
        // One of each block of 4 (65,536 for the oversized one) kept.
        let topk = |len: u64, scales: Vec<f32>, indices: Vec<u16>| Payload::TopK {
            len,
            block: if len > 8 { 1 << 16 } else { 4 },
            keep: 1,
            codes: vec![0; indices.len().div_ceil(4)].into(),
            scales: scales.into(),
            indices: indices.into(),
        };
        for (frame, why) in [
            (push(int8(4, vec![1.0], 8)), "has 1 scales, not 2"),
            (push(int8(4, vec![1.0; 5], 8)), "has 5 scales, not 2"),
            (push(int8(0, vec![], 8)), "blocks of 0"),
            (push(int8(4, vec![1.0, f32::NAN], 8)), "scale NaN"),
            (push(int8(4, vec![f32::NEG_INFINITY, 1.0], 8)), "scale -inf"),
            (push(fp16(vec![1.0, -2.0])), "scale -2"),
            (push(fp16(vec![f32::INFINITY, 1.0])), "scale inf"),
            (push(topk(1 << 30, vec![0.0; 1 << 14], vec![0; 1 << 14])), "stands for more than 16777216"),
            (push(topk(8, vec![1.0, 1.0], vec![0, 5])), "has index 5 in block 1 of 4 values"),
            (push(topk(8, vec![1.0], vec![0, 1])), "has 1 scales, not 2"),
        ] {
            assert!(rejected(&frame, MAX).contains(why), "{why}: {}", rejected(&frame, MAX));
        }
        let Inbound::Push { values, codec, .. } =
            decode_frame(&push(int8(4, vec![0.5, 2.0], 7)), MAX).unwrap()
        else {
            panic!("a push")
        };
        assert_eq!((codec, &values[..]), (Codec::Int8, &[1.5, 1.5, 1.5, 1.5, 6.0, 6.0, 6.0][..]));
        // A truncated compressed body fails validation before any scale is read.
        let good = push(Payload::Bf16(vec![0x3f80; 16].into()));
        assert!(rejected(&good[..good.len() - 8], MAX).contains("truncated"));
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let good = Msg::Weights {
            shard: ShardId(0),
            learner: LearnerId(0),
            seq: 1,
            clock: Clock(1),
            values: vec![1.0; 16].into(),
        }
        .encode()
        .unwrap()
        .to_bytes()
        .to_vec();
        for i in 0..20_000 {
            let mut bytes: Vec<u8> = if i % 2 == 0 {
                (0..rng.random_range(0..200)).map(|_| rng.random()).collect()
            } else {
                let mut b = good.clone();
                for _ in 0..rng.random_range(1..6) {
                    let at = rng.random_range(0..b.len());
                    b[at] = rng.random();
                }
                b
            };
            if i % 4 == 1 {
                bytes[..4].copy_from_slice(&MAGIC);
            }
            let _ = decode_frame(&bytes, MAX);
        }
    }

    #[test]
    fn kinds_and_roles() {
        for msg in samples() {
            assert_eq!(Kind::from_u16(msg.kind() as u16), Some(msg.kind()));
        }
        assert_eq!(Kind::from_u16(0), None);
        assert_eq!(Role::of_name("learner-3"), Some(Role::Learner));
        assert_eq!(Role::of_name("shard-0"), Some(Role::Shard));
        assert_eq!(Role::of_name("scheduler"), Some(Role::Scheduler));
        assert_eq!(Role::of_name("mallory-1"), None);
        assert!(!Kind::Push.senders().contains(&Role::Shard));
        assert!(Kind::Weights.senders().contains(&Role::Shard));
    }
}
