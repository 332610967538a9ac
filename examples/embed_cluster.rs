//! Run a small Rudra cluster from your own code, without the `rudra-node` binary:
//!
//!     cargo run --release --example embed_cluster
//!
//! Three learners train softmax regression on 6,000 MNIST images under 3-softsync (async)
//! with per-gradient learning-rate modulation, across two parameter shards.

use std::sync::Arc;

use rudra::actors::{
    BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, RunEvent, SgdSpec, TrainingData,
};
use rudra::compute::{CpuBackend, Device, ModelSpec};
use rudra::proto::{LrModulation, LrSchedule, SyncRule};
use rudra::transport::Codecs;

fn main() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let data = TrainingData { train: Arc::new(train.head(6000)), test: Arc::new(test) };
    let spec = ClusterSpec {
        learners: 3,
        shards: 2,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 3 },
            modulation: LrModulation::PerGradient,
            max_staleness: None,
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 16,
        epochs: 3,
        schedule: LrSchedule { base: 0.2, decay: 0.9 },
        seed: 1,
        evals_per_epoch: 1,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    };
    let models = Models::builtin(&ModelSpec::dense(784, vec![], 10), spec.seed, Device::Cpu(CpuBackend));
    let cluster = Cluster::new(spec, models, data)?;
    let report = actix::System::new().block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = cluster.observe(tx).start()?;
        actix::spawn(async move {
            while let Some(event) = rx.recv().await {
                if let RunEvent::Evaluated(row) = event {
                    println!(
                        "epoch {:.1}: test accuracy {:.4}, ⟨σ⟩ {:.2}",
                        row.epoch, row.test_accuracy, row.mean_staleness
                    );
                }
            }
        });
        handle.wait().await
    })?;
    println!(
        "{} updates, final test accuracy {:.4}, staleness histogram {:?}",
        report.updates, report.final_test_accuracy, report.staleness.histogram
    );
    Ok(())
}
