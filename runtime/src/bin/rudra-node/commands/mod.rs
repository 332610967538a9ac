//! One module per `rudra-node` command; [`run`] hands a parsed command to its handler.

mod bench;
mod cert;
mod experiment;
mod finish;
mod inspect;
mod local;
mod node;
mod relay;

pub(crate) use node::run_node;

use rudra_runtime::local::ProgressMode;
use rudra_runtime::{RuntimeError, simulate, study};

use crate::cli::Command;

/// Run `command` to its end.
pub(crate) fn run(command: Command) -> Result<(), RuntimeError> {
    match command {
        Command::Cert { action } => cert::run(action),
        Command::Local { config, out, transport, metrics_addr } => {
            local::run(&config, out.as_deref(), transport, metrics_addr)
        }
        Command::Experiment { config, out, time_limit, connect_timeout } => {
            experiment::run(&config, out.as_deref(), time_limit, connect_timeout.into())
        }
        Command::Relay(args) => relay::run(args),
        Command::Study { file, set, out, resume } => {
            study::run_command(&file, &set, (out.as_deref(), resume), ProgressMode::detect()).map(drop)
        }
        Command::Simulate { config, out } => simulate::run_command(
            config.config.as_deref(),
            &config.set,
            out.as_deref(),
            ProgressMode::detect(),
        ),
        Command::Bench { config, suite, steps, frames, repeats, markdown } => {
            bench::run(&config, suite, (steps, frames, repeats), markdown.as_deref())
        }
        Command::Report { runs, out, target } => inspect::report(&runs, &out, target),
        Command::Eval { checkpoint, config, dataset, data_dir } => {
            inspect::eval(&checkpoint, config, dataset, data_dir)
        }
    }
}
