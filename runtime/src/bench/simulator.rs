//! Simulator speed: 10,000 learners on the quadratic, async, until 1,000,000 gradients, in
//! gradients and events per wall-clock second.

use std::path::Path;

use super::{BenchRow, median};
use crate::local::ProgressMode;
use crate::simulate::simulate;
use crate::{Config, RuntimeError};

/// The scenario; `--set` flags given to the benchmark come after these and win.
const SCENARIO: [&str; 8] = [
    "cluster.learners=10000",
    "cluster.shards=1",
    "protocol.kind=async",
    "simulation.gradients=synthetic",
    "simulation.dimension=16",
    "simulation.stop_gradients=1000000",
    "simulation.stop_updates=0",
    "simulation.stop_seconds=0",
];

/// Simulate the scenario `repeats` times and report the medians.
pub fn run(file: Option<&Path>, overrides: &[String], repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let sets: Vec<String> =
        SCENARIO.iter().map(|s| (*s).to_owned()).chain(overrides.iter().cloned()).collect();
    let config = Config::load(file, &sets)?;
    let name =
        format!("simulate λ={}, {}", config.cluster.learners, crate::simulate::protocol_label(&config));
    let (mut gradients, mut events, mut seconds) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..repeats.max(1) {
        let r = simulate(&config, ProgressMode::Quiet)?;
        tracing::info!(
            round,
            "{} gradients, {} events in {:.2} s: {:.0} events/s",
            r.counts.gradients,
            r.counts.processed,
            r.wall_seconds,
            r.events_per_wall_second()
        );
        gradients.push(r.counts.gradients as f64 / r.wall_seconds);
        events.push(r.events_per_wall_second());
        seconds.push(r.wall_seconds);
    }
    let row =
        |what: &str, value, unit| BenchRow { name: format!("{name}: {what}"), value, unit, ratio: None };
    Ok(vec![
        row("gradients", median(gradients), "grads/s"),
        row("events", median(events), "events/s"),
        row("wall time", median(seconds), "s"),
    ])
}
