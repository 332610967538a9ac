//! `rudra-node --role …`: one node of a distributed cluster.

use rudra_actors::InvalidSetting;
use rudra_runtime::local::ProgressMode;
use rudra_runtime::node::{
    NodeOptions, STATE_FILE, recorded_so_far, resumed_config, run_aggregator, run_learner, run_scheduler,
    run_shard,
};
use rudra_runtime::{Config, RunDir, RunLock, RuntimeError};
use rudra_transport::Role;

use super::finish::finish;
use crate::cli::{Cli, RoleArg};

/// A shard's or learner's ordinal: `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job), or the
/// number ending `HOSTNAME` such as `shard-1` (a StatefulSet's pod; container engines set
/// `HOSTNAME`, shells do not export it).
fn ordinal() -> Option<u32> {
    let var = |name| std::env::var(name).ok().filter(|v: &String| !v.trim().is_empty());
    if let Some(index) = var("JOB_COMPLETION_INDEX") {
        return index.trim().parse().ok();
    }
    let host = var("HOSTNAME")?;
    let (_, n) = host.trim().rsplit_once('-')?;
    n.parse().ok()
}

/// The node options of `cli` for `role`; a shard's or learner's name defaults to its ordinal.
fn node_options(role: RoleArg, cli: &Cli) -> NodeOptions {
    let ordinal = || ordinal().map(|n| format!("{}-{n}", Role::from(role).as_str()));
    let name = match role {
        RoleArg::Scheduler => cli.name.clone(),
        RoleArg::Shard | RoleArg::Learner | RoleArg::Aggregator => cli.name.clone().or_else(ordinal),
    };
    NodeOptions {
        listen: cli.listen,
        scheduler: cli.scheduler.clone(),
        advertise: cli.advertise.clone(),
        connect_timeout: cli.connect_timeout.into(),
        metrics_addr: cli.metrics_addr,
        resume: cli.resume.clone(),
        token: cli.token.clone(),
        ca: cli.ca.clone(),
        ..NodeOptions::new(name, cli.certs.clone())
    }
}

/// One node of a distributed cluster.
pub(crate) fn run_node(role: RoleArg, cli: &Cli) -> Result<(), RuntimeError> {
    let mut opts = node_options(role, cli);
    let (config, out) = (&cli.config, cli.out.clone());
    if matches!(role, RoleArg::Learner | RoleArg::Aggregator) && opts.resume.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--resume",
            "only a shard or the scheduler takes it",
        )));
    }
    if !matches!(role, RoleArg::Shard | RoleArg::Aggregator) && opts.advertise.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--advertise",
            "only a shard or an aggregator takes it",
        )));
    }
    match role {
        RoleArg::Scheduler => {
            // One scheduler per run directory, taken before anything in it is read or written.
            let named = opts.resume.as_ref().or(out.as_ref()).map(|dir| RunLock::take(dir)).transpose()?;
            // A run directory holding the state of a job its scheduler did not end (it was
            // killed, or its host went down) is taken back, as with --resume: an engine
            // restarts a scheduler with the command it had.
            let unended = out.as_ref().filter(|d| opts.resume.is_none() && d.join(STATE_FILE).is_file());
            if let Some(dir) = unended {
                tracing::warn!(
                    "{} holds a run that did not end: taking it back (remove its {STATE_FILE} to start anew)",
                    dir.display()
                );
                opts.resume = Some(dir.clone());
            } else if opts.resume.is_some()
                && (config.config.is_some() || !config.set.is_empty() || out.is_some())
            {
                tracing::warn!(
                    "--config, --set and --out are ignored: the resumed job's own are in its run directory"
                );
            }
            // A scheduler taking its job back reads the job's configuration from its run directory.
            let (config, out) = match &opts.resume {
                Some(dir) => (resumed_config(dir)?, Some(dir.clone())),
                None => (Config::load(config.config.as_deref(), &config.set)?, out),
            };
            let dir = RunDir::create(out.as_deref(), config.protocol_name())?;
            let _lock = match named {
                Some(lock) => lock,
                None => RunLock::take(dir.path())?,
            };
            dir.write_config(&config)?;
            opts.run_dir = Some(dir.path().to_owned());
            let report = (config.data.load())
                .and_then(|data| run_scheduler(&config, (data, None), &opts, ProgressMode::detect()));
            let so_far = recorded_so_far(dir.path());
            let ended = finish(&dir, &config, report, || so_far);
            // The run ended, finished or failed, and its summary says how: there is no job left
            // to take back. (Without a summary, a full disk, `--resume` takes it back.)
            if dir.path().join("summary.json").is_file() {
                let _ = std::fs::remove_file(dir.path().join(STATE_FILE));
            }
            ended
        }
        RoleArg::Shard => run_shard(&opts, None),
        RoleArg::Aggregator => run_aggregator(&opts),
        // The run's summary is the scheduler's to write.
        RoleArg::Learner => run_learner(&opts, None, None).map(drop),
    }
}
