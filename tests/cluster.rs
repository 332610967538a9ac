//! The in-process cluster over real actors and threads, checked against exact arithmetic.

use std::path::Path;
use std::sync::Arc;

use rudra::actors::protocol::{LrModulation, LrSchedule, SyncRule};
use rudra::actors::{Cluster, ClusterSpec, ProtocolSpec, TrainingData};
use rudra::compute::{BatchStream, CpuBackend, Dataset, Model, ModelSpec, Partition};

fn mnist() -> (Dataset, Dataset) {
    rudra::compute::data::load_mnist(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist")).unwrap()
}

fn spec(learners: u32, shards: u32, rule: SyncRule, batch_size: usize) -> ClusterSpec {
    ClusterSpec {
        learners,
        shards,
        protocol: ProtocolSpec { rule, modulation: LrModulation::PerGradient, max_staleness: None },
        model: ModelSpec::dense(784, vec![32], 10),
        batch_size,
        epochs: 1,
        schedule: LrSchedule { base: 0.1, decay: 1.0 },
        seed: 11,
    }
}

#[test]
fn hardsync_over_actors_is_sequential_sgd_with_batch_mu_lambda() -> anyhow::Result<()> {
    let (learners, mu, steps) = (3usize, 16usize, 24usize);
    let (train, test) = mnist();
    let train = train.head(learners * mu * steps);
    let spec = spec(learners as u32, 2, SyncRule::Hardsync, mu);
    let data = TrainingData { train: Arc::new(train.clone()), test: Arc::new(test.head(200)) };
    let cluster = Cluster::new(spec.clone(), data)?;
    let report = actix::System::new().block_on(async move { cluster.start().wait().await })?;
    assert_eq!(report.updates, steps as u64);
    assert_eq!(report.staleness.max, 0);
    assert_eq!(report.staleness.applied, (2 * steps * learners) as u64);

    let mut seq = Model::new(CpuBackend, spec.model.clone())?;
    let init = spec.model.init(spec.seed);
    seq.write_params(0, &init)?;
    let mut streams: Vec<BatchStream> = Partition::split(train.len(), learners, spec.seed)
        .into_iter()
        .enumerate()
        .map(|(l, p)| BatchStream::new(p, mu, spec.seed, l as u64))
        .collect();
    let (mut x, mut y, mut bx, mut by) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        x.clear();
        y.clear();
        for s in &mut streams {
            train.gather(s.next_batch(), &mut bx, &mut by);
            x.extend_from_slice(&bx);
            y.extend_from_slice(&by);
        }
        seq.loss_and_gradient(&x, &y)?;
        seq.apply_gradient(-spec.schedule.base)?;
    }
    let mut want = vec![0.0; init.len()];
    seq.read_params(0, &mut want)?;
    let worst = want.iter().zip(&report.params).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let moved = init.iter().zip(&report.params).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "training moved the parameters (by {moved})");
    assert!(worst < 1e-5, "hardsync over actors differs from sequential SGD by {worst}");
    Ok(())
}

#[test]
fn softsync_over_actors_applies_every_gradient_and_counts_updates() -> anyhow::Result<()> {
    let (learners, mu, steps) = (4usize, 8usize, 30usize);
    let (train, test) = mnist();
    for (n, c) in [(1u32, 4usize), (2, 2), (4, 1)] {
        let spec = spec(learners as u32, 3, SyncRule::Softsync { n }, mu);
        let data = TrainingData {
            train: Arc::new(train.head(learners * mu * steps)),
            test: Arc::new(test.head(100)),
        };
        let cluster = Cluster::new(spec, data)?;
        let report = actix::System::new().block_on(async move { cluster.start().wait().await })?;
        let gradients = (learners * steps) as u64;
        assert_eq!(report.staleness.applied + report.staleness.dropped, 3 * gradients, "n = {n}");
        assert_eq!(report.updates, gradients / c as u64, "n = {n}: one update per c = {c} gradients");
    }
    Ok(())
}
