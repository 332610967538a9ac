//! Train a network written with candle through Rudra: a `VarMap` and a forward closure become a
//! model the cluster trains like its own.
//!
//!     cargo run --release --example candle_model
//!
//! A 784-64-10 MLP with ReLU, built with `candle_nn`, trained by two learners under async SGD
//! with per-gradient learning-rate modulation across two shards, on 12,000 MNIST images.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use candle_nn::{Module, VarBuilder, VarMap};
use rudra::actors::{BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, SgdSpec, TrainingData};
use rudra::compute::{CandleModel, ComputeError};
use rudra::proto::{LrModulation, LrSchedule, SyncRule};
use rudra::transport::Codecs;

/// A new copy of the network: its own variables, trained through a closure over its layers.
fn mlp() -> Result<CandleModel, ComputeError> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layers = (|| {
        Ok::<_, candle_core::Error>((
            candle_nn::linear(784, 64, vb.pp("fc1"))?,
            candle_nn::linear(64, 10, vb.pp("fc2"))?,
        ))
    })();
    let (fc1, fc2) = layers.map_err(|e| ComputeError::Shape(e.to_string()))?;
    CandleModel::new(&varmap, 784, move |x| fc2.forward(&fc1.forward(x)?.relu()?))
}

fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let data = TrainingData { train: Arc::new(train.head(12_000)), test: Arc::new(test) };
    let spec = ClusterSpec {
        learners: 2,
        shards: 2,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 2 },
            modulation: LrModulation::PerGradient,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 32,
        epochs: 3,
        schedule: LrSchedule { base: 0.2, decay: 0.8 },
        seed: 1,
        evals_per_epoch: 1,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    };
    // The shards start from the parameters of one copy; every learner and the evaluator get
    // copies of their own.
    let models = Models::custom(mlp()?.params().to_vec(), mlp);
    let report = actix::System::new()
        .block_on(async move { Cluster::new(spec, models, data)?.start()?.wait().await })?;
    println!("{} updates, test accuracy {:.4}", report.updates, report.final_test_accuracy);
    Ok(())
}
