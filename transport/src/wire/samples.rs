//! One message of every kind, and payload messages in every codec: the cases of the wire tests
//! and the seeds of the fuzzer.

use super::{AggregateMember, GradientReport, Msg, UpdateReport};
use crate::payload::{Codec, Encoding};
use crate::{Clock, DropReason, Floats, LearnerId, Outcome, Role, ShardId, Staleness};

/// One message of every kind, with representative values: the cases of the wire tests and
/// the seeds of the fuzzer.
#[must_use]
pub fn samples() -> Vec<Msg> {
    vec![
        Msg::Join { role: Role::Shard, name: "shard-0".into(), data_addr: "127.0.0.1:7071".into() },
        Msg::Welcome {
            id: 3,
            config_toml: "[cluster]\nlearners = 4\n".into(),
            train_examples: 60_000,
            shard_addrs: vec!["a:1".into()],
            shard_names: vec!["shard-0".into()],
            learner_names: vec!["learner-0".into(), "learner-1".into()],
            job: "0123456789abcdef".into(),
            incarnation: 1,
        },
        Msg::Ready,
        Msg::Start,
        Msg::Stop,
        Msg::Progress {
            learner: LearnerId(1),
            session: 0x5eed,
            samples: 256,
            steps: 8,
            loss_sum: 3.5,
            payload_up: 1 << 18,
            payload_down: 1 << 20,
            compute_seconds: 1.25,
            wire_bytes: 1 << 21,
        },
        Msg::LearnerDone { error: Some("out of memory".into()) },
        Msg::Records {
            gradients: vec![
                GradientReport {
                    learner: LearnerId(1),
                    computed_on: Clock(3),
                    staleness: Staleness(2),
                    outcome: Outcome::Applied { alpha: 0.5 },
                },
                GradientReport {
                    learner: LearnerId(0),
                    computed_on: Clock(1),
                    staleness: Staleness(6),
                    outcome: Outcome::Dropped(DropReason::TooStale),
                },
            ],
            updates: vec![UpdateReport { clock: Clock(7), gradients: 2, payload_in: 4096 }],
        },
        Msg::SnapshotRequest { request: 9 },
        Msg::Snapshot { request: 9, clock: Clock(4), values: vec![1.0, 2.0].into() },
        Msg::Heartbeat,
        Msg::Membership { active: vec![LearnerId(0), LearnerId(2), LearnerId(3)] },
        Msg::Resumed { clock: Clock(800) },
        Msg::Hello { learner: LearnerId(2), shard: ShardId(1) },
        Msg::Pull { learner: LearnerId(2), seq: 1, last: false },
        Msg::Weights {
            shard: ShardId(1),
            learner: LearnerId(2),
            seq: 1,
            clock: Clock(5),
            values: vec![0.5; 1000].into(),
        },
        Msg::Center { shard: ShardId(1), clock: Clock(6), values: vec![0.25; 1000].into() },
        Msg::Evaluate { request: 2, last: true, values: vec![0.75; 300].into() },
        Msg::Evaluated { request: 2, measured: Some((0.125, 0.97)) },
        Msg::Summary { json: r#"{"outcome":"completed"}"#.into() },
        Msg::BatchSizes { sizes: vec![vec![16, 16], vec![26, 6]] },
        Msg::Push {
            learner: LearnerId(2),
            seq: 9,
            computed_on: Clock(5),
            values: (0..777).map(|i| i as f32).collect::<Vec<f32>>().into(),
            examples: 1,
            next_seq: 10,
            last: false,
        },
        Msg::Exchange { learner: LearnerId(3), values: vec![0.25; 333].into() },
        Msg::Aggregate {
            members: vec![
                AggregateMember { learner: LearnerId(2), seq: 9, examples: 32, next_seq: 10, last: false },
                AggregateMember { learner: LearnerId(3), seq: 8, examples: 16, next_seq: 9, last: true },
            ],
            computed_on: Clock(5),
            values: vec![0.125; 555].into(),
        },
    ]
}

/// Payload messages with every codec: the compressed cases of the wire tests and the fuzzer's
/// seeds.
#[must_use]
pub fn compressed_samples() -> Vec<Msg> {
    let values: Floats = (0..700).map(|i| (i as f32 - 350.0) * 0.01).collect::<Vec<f32>>().into();
    let enc = |codec| Encoding { codec, block: 64, keep: 4 }.encode(&values, None);
    vec![
        Msg::Push {
            learner: LearnerId(1),
            seq: 4,
            computed_on: Clock(2),
            values: enc(Codec::Int8),
            examples: 1,
            next_seq: 5,
            last: false,
        },
        Msg::Push {
            learner: LearnerId(1),
            seq: 5,
            computed_on: Clock(3),
            values: enc(Codec::Fp16),
            examples: 1,
            next_seq: 6,
            last: true,
        },
        Msg::Weights {
            shard: ShardId(0),
            learner: LearnerId(1),
            seq: 2,
            clock: Clock(9),
            values: enc(Codec::Bf16),
        },
        Msg::Center { shard: ShardId(0), clock: Clock(9), values: enc(Codec::Bf16) },
        Msg::Weights {
            shard: ShardId(1),
            learner: LearnerId(1),
            seq: 3,
            clock: Clock(9),
            values: enc(Codec::Int8),
        },
        Msg::Exchange { learner: LearnerId(2), values: enc(Codec::Fp16) },
        Msg::Exchange { learner: LearnerId(2), values: enc(Codec::Bf16) },
        Msg::Push {
            learner: LearnerId(1),
            seq: 6,
            computed_on: Clock(4),
            values: enc(Codec::TopK),
            examples: 1,
            next_seq: 7,
            last: false,
        },
        Msg::Exchange { learner: LearnerId(2), values: enc(Codec::TopK) },
    ]
}
