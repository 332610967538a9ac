//! `rudra-node experiment`: a fault scenario beside the same run without faults.

use std::path::Path;
use std::time::Duration;

use rudra_runtime::{Config, RunDir, RuntimeError, experiment};

use crate::cli::ConfigArgs;

/// Run both, write the experiment's directory and print what the faults cost.
pub(crate) fn run(
    args: &ConfigArgs,
    out: Option<&Path>,
    time_limit: u64,
    connect_timeout: Duration,
) -> Result<(), RuntimeError> {
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let data = config.data.load()?;
    let dir = RunDir::create(out, "experiment")?;
    let bounds = experiment::Bounds { limit: Duration::from_secs(time_limit), connect_timeout };
    let e = experiment::run(&config, &data, &dir, &bounds)?;
    println!(
        "test accuracy {:.4} clean, {:.4} with faults; {} updates lost in crashes, {} fewer made; \
         {} timeline events; wrote {}",
        e.accuracy.0,
        e.accuracy.1,
        e.updates_lost,
        e.updates_missing,
        e.timeline.len(),
        dir.path().display()
    );
    if let Some(why) = &e.stopped {
        println!("the run with faults stopped before its end: {why}");
    }
    Ok(())
}
