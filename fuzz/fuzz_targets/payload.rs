//! Fuzz the payload path, structure-aware: a gradient, exchange or weights message built from
//! the input (any f32 values, NaN and ±Inf included, any ids and clocks, any codec and block
//! size), encoded, damaged at the bytes the input names, then decoded, checked by the codec as
//! a shard's learner service checks it, and applied to a shard core. Whatever arrives, the core's values stay finite and
//! its clock only moves forward.
//!
//!     cargo +nightly fuzz run payload fuzz/corpus/frame
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rudra_proto::{CenterRule, CenterShard, LrModulation, LrSchedule, SgdShard, SgdShardConfig, SyncRule};
use rudra_actors::remote::codec::{self, DataPolicy, LearnerData};
use rudra_transport::reader::{Accepts, decode_frame};
use rudra_transport::{Clock, Codec, Encoding, LearnerId, Msg, ShardId};

/// The values a shard of this target holds.
const RANGE: usize = 8;

#[derive(Arbitrary, Debug)]
enum Kind {
    Push,
    Exchange,
    Weights,
    Center,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: Kind,
    learner: u32,
    seq: u64,
    clock: u64,
    values: Vec<f32>,
    /// The codec the values are sent with, its block size, and the values `topk` keeps of
    /// each block.
    codec: CodecChoice,
    block: u16,
    keep: u16,
    /// Bytes of the frame to overwrite: (position, value).
    damage: Vec<(u16, u8)>,
}

#[derive(Arbitrary, Debug)]
enum CodecChoice {
    F32,
    Bf16,
    Fp16,
    Int8,
    TopK,
}

fuzz_target!(|input: Input| {
    let Input { kind, learner, seq, clock, values, codec, block, keep, damage } = input;
    let codec = match codec {
        CodecChoice::F32 => Codec::F32,
        CodecChoice::Bf16 => Codec::Bf16,
        CodecChoice::Fp16 => Codec::Fp16,
        CodecChoice::Int8 => Codec::Int8,
        CodecChoice::TopK => Codec::TopK,
    };
    let encoding = Encoding { codec, block: u32::from(block), keep: u32::from(keep) };
    let values = encoding.encode(&values.into(), None);
    let msg = match kind {
        Kind::Push => Msg::Push {
            learner: LearnerId(learner),
            seq,
            computed_on: Clock(clock),
            values,
            // 0 and more than the shard's μλ = 1 are refused; 1 is applied.
            examples: (seq % 3) as u32,
            next_seq: seq.wrapping_add(1),
            last: false,
        },
        Kind::Exchange => Msg::Exchange { learner: LearnerId(learner), values },
        Kind::Weights => Msg::Weights { shard: ShardId(learner), learner: LearnerId(learner), seq, clock: Clock(clock), values },
        Kind::Center => Msg::Center { shard: ShardId(learner), clock: Clock(clock), values },
    };
    let Ok(frame) = msg.encode() else { return };
    let mut bytes = frame.to_bytes().to_vec();
    for (at, b) in damage {
        if let Some(byte) = bytes.get_mut(usize::from(at)) {
            *byte = b;
        }
    }
    let accepts = Accepts { max_body: 1 << 20, ..Accepts::for_kind(msg.kind()) };
    let Ok(inbound) = decode_frame(&bytes, &accepts) else { return };
    if matches!(kind, Kind::Weights | Kind::Center) {
        let _ = codec::answer(inbound, codec);
        return;
    }
    let policy = DataPolicy { range_len: RANGE, push: codec, exchange: codec };
    let Ok(data) = codec::from_learner_data(&[LearnerId(0)], &policy, inbound) else { return };
    let one: BTreeSet<LearnerId> = [LearnerId(0)].into();
    match data {
        LearnerData::Push { seq, computed_on, values, examples, .. } => {
            let cfg = SgdShardConfig {
                id: ShardId(0),
                rule: SyncRule::Softsync { n: 1 },
                modulation: LrModulation::PerGradient,
                max_staleness: Some(4),
                backups: 0,
                quorum: None,
                schedule: LrSchedule { base: 0.1, decay: 1.0 },
                batch: 1,
                gradients_per_epoch: 10,
                prefetch: 0,
            };
            let mut shard = SgdShard::new(cfg, vec![1.0; RANGE], one);
            let _ = shard.on_pull(LearnerId(0), seq);
            let _ = shard.on_push_of(LearnerId(0), seq, computed_on, (&values, examples));
            assert!(shard.snapshot().values.iter().all(|v| v.is_finite()), "a gradient reached the weights as NaN or ±Inf");
            assert!(shard.clock() <= Clock(1));
        }
        LearnerData::Exchange(values) => {
            let mut center = CenterShard::new(ShardId(0), CenterRule::ElasticAsync { alpha: 0.5 }, vec![1.0; RANGE], one);
            let _ = center.on_exchange(LearnerId(0), &values);
            assert!(center.snapshot().values.iter().all(|v| v.is_finite()), "an exchange moved the center to NaN or ±Inf");
        }
        LearnerData::Pull { .. } | LearnerData::Aggregate { .. } => {}
    }
});
