//! Write the fuzzers' seed corpus: a valid frame of every message kind (each behind the byte
//! that names a link carrying it), and payload frames of
//! several lengths and values, into `fuzz/corpus/frame/` (or the directory given).
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --bin seeds [-- DIR]

use rudra_transport::{Clock, LearnerId, Msg, ShardId};

fn main() -> std::io::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/frame").into());
    std::fs::create_dir_all(&dir)?;
    let mut frames = rudra_transport::wire::samples();
    for n in [0, 1, 7, 64] {
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
        frames.push(Msg::Push { learner: LearnerId(0), seq: 1, computed_on: Clock(0), values: values.clone().into(), examples: 1, next_seq: 0, last: false });
        frames.push(Msg::Exchange { learner: LearnerId(0), values: values.clone().into() });
        frames.push(Msg::Weights { shard: ShardId(0), learner: LearnerId(0), seq: 1, clock: Clock(3), values: values.clone().into() });
        frames.push(Msg::Center { shard: ShardId(0), clock: Clock(3), values: values.into() });
    }
    frames.push(Msg::Push {
        learner: LearnerId(0),
        seq: 2,
        computed_on: Clock(0),
        values: vec![f32::NAN, f32::INFINITY, -0.0, f32::MIN_POSITIVE].into(),
        examples: 1,
        next_seq: 0,
        last: false,
    });
    frames.extend(rudra_transport::wire::compressed_samples());
    for (i, m) in frames.iter().enumerate() {
        let bytes = m.encode().map_err(std::io::Error::other)?.to_bytes();
        std::fs::write(format!("{dir}/{i:02}-{:?}", m.kind()), rudra_transport::reader::fuzz_input(m.kind(), &bytes))?;
    }
    println!("wrote {} frames to {dir}", frames.len());
    Ok(())
}
