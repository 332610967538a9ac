//! `rudra-node local`: the whole cluster in this process, over memory or loopback QUIC.

use std::net::SocketAddr;
use std::path::Path;

use rudra_actors::RunReport;
use rudra_runtime::local::{ProgressMode, run_local};
use rudra_runtime::node::run_loopback;
use rudra_runtime::{Config, RunDir, RuntimeError};

use super::finish::finish;
use crate::cli::{ConfigArgs, Transport};

/// Train the configured run to its end and write its run directory.
pub(crate) fn run(
    args: &ConfigArgs,
    out: Option<&Path>,
    transport: Transport,
    metrics_addr: Option<SocketAddr>,
) -> Result<(), RuntimeError> {
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let data = config.data.load()?;
    let dir = RunDir::create(out, config.protocol_name())?;
    dir.write_config(&config)?;
    tracing::info!(dir = %dir.path().display(), "run directory");
    let run = match transport {
        Transport::Memory => run_local,
        Transport::Quic => run_loopback,
    };
    let report = run(&config, data, Some(dir.path()), ProgressMode::detect(), metrics_addr);
    finish(&dir, &config, report, RunReport::empty)
}
