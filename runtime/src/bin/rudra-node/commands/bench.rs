//! `rudra-node bench`: measurements against a baseline in the same run.

use std::path::Path;

use clap::ValueEnum;
use rudra_runtime::{Config, RuntimeError, bench};

use crate::cli::{ConfigArgs, Suite};

/// Measure `suite` and print its table (and write it as markdown to `markdown`);
/// `(steps, frames, repeats)` size the measurements.
pub(crate) fn run(
    args: &ConfigArgs,
    suite: Suite,
    (steps, frames, repeats): (usize, usize, usize),
    markdown: Option<&Path>,
) -> Result<(), RuntimeError> {
    let (file, set) = (args.config.as_deref(), args.set.as_slice());
    let load = || Config::load(file, set);
    let rows = match suite {
        Suite::Training => {
            let config = load()?;
            bench::training::run(&config, &config.data.load()?, steps, repeats.max(1))?
        }
        Suite::Transport => bench::transport::run(frames, repeats)?,
        Suite::Protocols => bench::protocols::run(file, set, repeats)?,
        Suite::Simulator => bench::simulator::run(file, set, repeats)?,
        Suite::Agreement => bench::agreement::run(file, set, repeats)?,
        Suite::Cluster => bench::cluster::run(file, set, repeats)?,
        Suite::Latency => bench::latency::run(file, set, repeats)?,
        Suite::Groups => bench::groups::run(file, set, repeats)?,
        Suite::Compute => bench::compute::run(&load()?.data.load()?, repeats.max(1))?,
    };
    bench::print(&rows);
    if let Some(path) = markdown {
        let name = suite.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned());
        std::fs::write(path, bench::markdown(&name, &rows))
            .map_err(|source| RuntimeError::Io { path: path.to_owned(), source })?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
