//! The simulator against the real runtime: ⟨σ⟩ of `rudra-node simulate` and of
//! `rudra-node local` on the same configuration (λ = 4 by default, model gradients), for
//! n ∈ {1, 2, λ}. The simulated learners each compute on a device of their own; the real ones
//! share this machine's cores, so the two agree where there is a core for every learner.

use std::path::Path;

use super::{BenchRow, median};
use crate::local::{ProgressMode, run_local};
use crate::simulate::simulate;
use crate::{Config, RuntimeError};

/// The scenario; `--set` flags given to the benchmark come after these and win.
const SCENARIO: [&str; 8] = [
    "cluster.learners=4",
    "protocol.kind=softsync",
    "training.train_examples=16000",
    "training.test_examples=500",
    "training.epochs=1",
    "training.batch_size=32",
    "simulation.gradients=model",
    "simulation.stop_gradients=0",
];

/// Run the local cluster `repeats` times and the simulator once (it is deterministic) for
/// every n; report both ⟨σ⟩ and their ratio.
pub fn run(file: Option<&Path>, overrides: &[String], repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let scenario: Vec<String> =
        SCENARIO.iter().map(|s| (*s).to_owned()).chain(overrides.iter().cloned()).collect();
    let lambda = Config::load(file, &scenario)?.cluster.learners;
    let mut ns = vec![1, 2, lambda];
    ns.retain(|&n| n <= lambda);
    ns.dedup();
    let mut rows = Vec::new();
    for n in ns {
        let sets: Vec<String> = scenario.iter().cloned().chain([format!("protocol.n={n}")]).collect();
        let config = Config::load(file, &sets)?;
        let data = config.data.load()?;
        let sim = simulate(&config, ProgressMode::Quiet)?.staleness.mean;
        let mut local = Vec::new();
        for round in 0..repeats.max(1) {
            let mean = run_local(&config, data.clone(), None, ProgressMode::Quiet, None)?.staleness.mean;
            tracing::info!(round, n, "local ⟨σ⟩ {mean:.3}, simulator ⟨σ⟩ {sim:.3}");
            local.push(mean);
        }
        let local = median(local);
        let name = |what: &str| format!("λ={lambda}, n={n}: {what} ⟨σ⟩");
        rows.push(BenchRow { name: name("local"), value: local, unit: "σ", ratio: None });
        rows.push(BenchRow {
            name: name("simulator"),
            value: sim,
            unit: "σ",
            ratio: Some((sim / local, "local".into())),
        });
    }
    Ok(rows)
}
