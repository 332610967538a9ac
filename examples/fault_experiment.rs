//! A fault-injection experiment from code: the same cluster twice with the same seed, once
//! clean and once with a learner that crashes, lossy delaying links and a slow learner, then
//! what the faults cost.
//!
//!     cargo run --release --example fault_experiment
//!
//! Four learners train an MLP on 12,000 MNIST images under async SGD with a staleness bound
//! of 6, across two shards. `rudra-node experiment --config configs/faults/NAME.toml` does the
//! same from a configuration file and writes a report.

use std::sync::Arc;
use std::time::Duration;

use rudra::actors::faults::{Crash, FaultPlan, LinkRule, Liveness, Node, Nodes, Slow};
use rudra::actors::{
    BatchSizing, Cluster, ClusterSpec, Models, ProtocolSpec, RunReport, SgdSpec, TrainingData,
};
use rudra::compute::{CpuBackend, Device, ModelSpec};
use rudra::proto::{LrModulation, LrSchedule, SyncRule};
use rudra::transport::{Codecs, FaultWindow, LearnerId, LinkFaults};

fn spec() -> ClusterSpec {
    ClusterSpec {
        learners: 4,
        shards: 2,
        protocol: ProtocolSpec::Sgd(SgdSpec {
            rule: SyncRule::Softsync { n: 4 },
            modulation: LrModulation::PerGradient,
            max_staleness: Some(6),
            backups: 0,
            prefetch: 0,
            quorum: None,
        }),
        batch_size: 32,
        epochs: 3,
        schedule: LrSchedule { base: 0.2, decay: 0.8 },
        seed: 1,
        evals_per_epoch: 2,
        codecs: Codecs::default(),
        batch_sizing: BatchSizing::Fixed,
        groups: 1,
        hierarchical: false,
        group_n: 1,
    }
}

/// Learner 3 crashes after 1.5 s, learner 0 computes three times slower, and 2% of the
/// messages between learners and shards are lost, the rest delayed 5 ms ± 2 ms.
fn faults() -> FaultPlan {
    let lossy = LinkFaults {
        drop: 0.02,
        delay: Duration::from_millis(5),
        jitter: Duration::from_millis(2),
        ..LinkFaults::default()
    };
    FaultPlan {
        seed: 7,
        links: vec![LinkRule {
            a: Nodes::Learners,
            b: Nodes::Shards,
            faults: lossy,
            window: FaultWindow::default(),
        }],
        partitions: Vec::new(),
        crashes: vec![Crash {
            node: Node::Learner(LearnerId(3)),
            at: Duration::from_millis(1500),
            restart_after: None,
        }],
        slow: vec![Slow { learner: LearnerId(0), factor: 3.0 }],
        panics: Vec::new(),
    }
}

fn run(data: &TrainingData, plan: FaultPlan) -> anyhow::Result<RunReport> {
    let liveness = Liveness {
        retry: Duration::from_millis(200),
        failure_timeout: Duration::from_secs(1),
        ..Liveness::default()
    };
    let spec = spec();
    let models = Models::builtin(&ModelSpec::dense(784, vec![128], 10), spec.seed, Device::Cpu(CpuBackend));
    let cluster = Cluster::new(spec, models, data.clone())?.with_liveness(liveness).with_faults(plan);
    Ok(actix::System::new().block_on(async move { cluster.start()?.wait().await })?)
}

fn main() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, test) = rudra::compute::data::load_mnist(&dir)?;
    let data = TrainingData { train: Arc::new(train.head(12_000)), test: Arc::new(test) };
    let clean = run(&data, FaultPlan::default())?;
    let faulty = run(&data, faults())?;
    for e in &faulty.timeline {
        println!("{:6.2} s  {:8}  {}", e.seconds, e.kind, e.what);
    }
    println!("                      clean   with faults");
    println!(
        "test accuracy        {:.4}        {:.4}",
        clean.final_test_accuracy, faulty.final_test_accuracy
    );
    println!("updates per shard    {:6}        {:6}", clean.updates, faulty.updates);
    println!("gradients dropped    {:6}        {:6}", clean.staleness.dropped, faulty.staleness.dropped);
    println!("max staleness        {:6}        {:6}", clean.staleness.max, faulty.staleness.max);
    println!("samples per learner  {:?}  {:?}", clean.learner_samples, faulty.learner_samples);
    Ok(())
}
