//! `rudra-node report` and `rudra-node eval`: finished runs and checkpoints, read back.

use std::path::{Path, PathBuf};

use rudra_runtime::checkpoint::describe;
use rudra_runtime::{Checkpoint, Config, RuntimeError, report};

use crate::cli::ConfigArgs;

/// Compare the runs in `runs`: print their table, write it and their plots to `out`.
pub(crate) fn report(runs: &[PathBuf], out: &Path, target: f64) -> Result<(), RuntimeError> {
    let (table, plots) = report::report(runs, out, target)?;
    print!("{}", table.to_markdown());
    println!("wrote report.md, report.csv and {} plots to {}", plots.len(), out.display());
    Ok(())
}

/// Print the test accuracy of `checkpoint` on the test set the configuration names.
pub(crate) fn eval(
    checkpoint: &Path,
    config: ConfigArgs,
    dataset: Option<String>,
    data_dir: Option<PathBuf>,
) -> Result<(), RuntimeError> {
    let checkpoint = Checkpoint::read(checkpoint)?;
    let mut set = config.set;
    set.extend(dataset.map(|d| format!("training.dataset={d}")));
    set.extend(data_dir.map(|d| format!("training.data_dir={}", d.display())));
    let config = Config::load(config.config.as_deref(), &set)?;
    let e = checkpoint.evaluate(&config.data.load()?.test)?;
    println!(
        "{}: test accuracy {:.4} ({} of {} correct), test loss {:.4}",
        describe(&checkpoint.spec),
        e.accuracy(),
        e.correct,
        e.examples,
        e.loss
    );
    Ok(())
}
