//! `rudra-node`: run a Rudra cluster. See `rudra-node --help`.

mod cli;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use cli::{CertAction, Cli, Command, ConfigArgs, LogFormat, RoleArg, Suite, Transport};
use rudra_actors::{InvalidSetting, RunReport};
use rudra_runtime::checkpoint::describe;
use rudra_runtime::local::{ProgressMode, run_local};
use rudra_runtime::node::{
    NodeOptions, STATE_FILE, recorded_so_far, resumed_config, run_learner, run_loopback, run_scheduler,
    run_shard,
};
use rudra_runtime::{
    Checkpoint, Config, RunDir, RuntimeError, bench, experiment, report, secret, simulate, study,
};
use rudra_transport::tls::CertDir;
use rudra_transport::{LinkFaults, Relay, RelayRules, Role};

/// mimalloc keeps freed pages for the next allocation of their size: a node allocates and
/// frees a frame-sized buffer for every payload it sends and receives, which the system
/// allocator returns to the kernel and faults in again each time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What is logged when `RUST_LOG` is unset: `info`, but only warnings from the HTTP server's
/// workers (their start and stop).
const DEFAULT_LOG: &str = "info,actix_server=warn";

/// Log to stderr at `RUST_LOG` (default `info`) as text (coloured on a terminal) or JSON lines.
fn init_tracing(format: LogFormat) {
    let (filter, refused) = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        Err(_) if std::env::var_os("RUST_LOG").is_none() => {
            (tracing_subscriber::EnvFilter::new(DEFAULT_LOG), None)
        }
        Err(e) => {
            (tracing_subscriber::EnvFilter::new(DEFAULT_LOG), std::env::var("RUST_LOG").ok().map(|v| (v, e)))
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if let Some((value, e)) = refused {
        tracing::warn!("RUST_LOG={value:?} is not a valid filter ({e}); logging at info");
    }
}

fn main() -> ExitCode {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // Mesa's Vulkan device-selection layer connects to a Wayland or X display when wgpu
        // opens, printing an error line on headless nodes; the adapter is chosen here anyway.
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
    let matches = Cli::command().get_matches();
    // A role from the environment (a container's RUDRA_ROLE) does not stop a subcommand run
    // in the same container, such as `cert token`.
    let role_from_env = matches.value_source("role") == Some(clap::parser::ValueSource::EnvVariable);
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if cli.command.is_some() && role_from_env {
        cli.role = None;
    }
    init_tracing(cli.log_format);
    stop_on_signals();
    let result = match (cli.command.take(), cli.role) {
        (Some(command), None) => run(command),
        (None, Some(role)) => run_node(role, node_options(role, &cli), cli.config, cli.out),
        (Some(_), Some(_)) => {
            Err(RuntimeError::Config("--role runs a node; give it without a subcommand".into()))
        }
        (None, None) => Err(RuntimeError::Config("give a subcommand (see --help) or --role".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn run(command: Command) -> Result<(), RuntimeError> {
    match command {
        Command::Cert { action: CertAction::Init { dir } } => {
            CertDir::new(&dir).init()?;
            println!("created the cluster CA in {}", dir.display());
            Ok(())
        }
        Command::Cert { action: CertAction::Issue { dir, name } } => {
            CertDir::new(&dir).issue(&name)?;
            println!("issued {}", dir.join(format!("{name}.pem")).display());
            Ok(())
        }
        Command::Cert { action: CertAction::Token { dir, role, ttl, uses } } => {
            let token = CertDir::new(&dir).authority()?.tokens().mint(role.into(), ttl.into(), uses)?;
            println!("{token}");
            Ok(())
        }
        Command::Cert { action: CertAction::Secret { dir, ttl, uses, name, namespace, out } } => {
            let manifest =
                secret::manifest(&CertDir::new(&dir), ttl.into(), uses, &name, namespace.as_deref())?;
            match out {
                Some(path) => {
                    std::fs::write(&path, manifest).map_err(|source| RuntimeError::Io { path, source })
                }
                None => {
                    print!("{manifest}");
                    Ok(())
                }
            }
        }
        Command::Local { config, out, transport, metrics_addr } => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), config.protocol_name())?;
            dir.write_config(&config)?;
            tracing::info!(dir = %dir.path().display(), "run directory");
            let report = match transport {
                Transport::Memory => {
                    run_local(&config, data, Some(dir.path()), ProgressMode::detect(), metrics_addr)
                }
                Transport::Quic => {
                    run_loopback(&config, data, Some(dir.path()), ProgressMode::detect(), metrics_addr)
                }
            };
            finish(&dir, &config, report, RunReport::empty)
        }
        Command::Experiment { config, out, time_limit, connect_timeout } => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), "experiment")?;
            let bounds = experiment::Bounds {
                limit: std::time::Duration::from_secs(time_limit),
                connect_timeout: connect_timeout.into(),
            };
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
        Command::Relay {
            listen,
            to,
            drop,
            duplicate,
            reorder,
            delay_ms,
            jitter_ms,
            seed,
            down_at_ms,
            up_at_ms,
        } => {
            let ms = std::time::Duration::from_millis;
            let faults = LinkFaults { drop, duplicate, reorder, delay: ms(delay_ms), jitter: ms(jitter_ms) };
            let rules =
                RelayRules { to_upstream: faults.clone(), to_client: faults, ..RelayRules::default() };
            actix::System::new().block_on(async move {
                let relay = Relay::bind(listen, to, rules, seed)?;
                tracing::info!("relaying {} → {to}", relay.local_addr()?);
                let control = relay.control();
                let switch = |at: Option<u64>, down: bool| {
                    let control = control.clone();
                    at.map(|at| {
                        actix::spawn(async move {
                            tokio::time::sleep(ms(at)).await;
                            tracing::info!("link {}", if down { "cut" } else { "healed" });
                            control.set_down(down);
                        })
                    })
                };
                let _down = switch(down_at_ms, true);
                let _up = switch(up_at_ms, false);
                Ok(relay.run().await?)
            })
        }
        Command::Study { file, set, out, resume } => {
            study::run_command(&file, &set, (out.as_deref(), resume), ProgressMode::detect()).map(drop)
        }
        Command::Simulate { config, out } => simulate::run_command(
            config.config.as_deref(),
            &config.set,
            out.as_deref(),
            ProgressMode::detect(),
        ),
        Command::Bench { config, suite, steps, frames, repeats } => {
            let rows = match suite {
                Suite::Training => {
                    let config = Config::load(config.config.as_deref(), &config.set)?;
                    let data = config.data.load()?;
                    bench::training::run(&config, &data, steps, repeats.max(1))?
                }
                Suite::Transport => bench::transport::run(frames, repeats)?,
                Suite::Protocols => bench::protocols::run(config.config.as_deref(), &config.set, repeats)?,
                Suite::Simulator => bench::simulator::run(config.config.as_deref(), &config.set, repeats)?,
                Suite::Agreement => bench::agreement::run(config.config.as_deref(), &config.set, repeats)?,
                Suite::Cluster => bench::cluster::run(config.config.as_deref(), &config.set, repeats)?,
                Suite::Compute => {
                    let config = Config::load(config.config.as_deref(), &config.set)?;
                    bench::compute::run(&config.data.load()?, repeats.max(1))?
                }
            };
            bench::print(&rows);
            Ok(())
        }
        Command::Report { runs, out, target } => {
            let (table, plots) = report::report(&runs, &out, target)?;
            print!("{}", table.to_markdown());
            println!("wrote report.md, report.csv and {} plots to {}", plots.len(), out.display());
            Ok(())
        }
        Command::Eval { checkpoint, config, dataset, data_dir } => {
            let checkpoint = Checkpoint::read(&checkpoint)?;
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
    }
}

/// Write the run directory's report and plots and print the summary line. A plot that cannot
/// be drawn is a warning: the run itself succeeded.
/// A run's end: its results written and printed; or, for a run that failed, what it had
/// recorded (`so_far`) and why it stopped, in its run directory.
fn finish(
    dir: &RunDir,
    config: &Config,
    run: Result<RunReport, RuntimeError>,
    so_far: impl FnOnce() -> RunReport,
) -> Result<(), RuntimeError> {
    let report = match run {
        Ok(report) => report,
        Err(e) => {
            if let Err(not_written) = dir.record_failure(config, &so_far(), &e) {
                tracing::warn!("the failed run's record was not written: {not_written}");
            }
            return Err(e);
        }
    };
    let s = dir.record(config, &report)?.summary;
    let reached = s.time_to_target.map_or_else(
        || format!("{} never reached", s.target_accuracy),
        |t| format!("{} reached after {t:.1} s", s.target_accuracy),
    );
    println!(
        "{} λ={} μ={} μλ={}: test accuracy {:.4} ({reached}), train loss {:.4}, ⟨σ⟩ {:.2} (max {}), {} updates, {:.0} samples/s over {:.1} s; wrote {}",
        config.protocol_label(),
        s.learners,
        s.batch_size,
        s.global_batch,
        s.final_test_accuracy,
        s.final_train_loss,
        s.staleness.mean,
        s.staleness.max,
        s.updates,
        s.samples_per_second,
        s.wall_seconds,
        dir.path().display()
    );
    match s.diverged {
        Some(d) => Err(RuntimeError::diverged(&config.cluster, d)),
        None => Ok(()),
    }
}

/// Stop at once on SIGTERM or SIGINT, as a crash would (exit code 128 + the signal), even as
/// a container's first process, which the kernel otherwise shields from both: peers find the
/// node gone, and an engine restarts it if its policy says so.
fn stop_on_signals() {
    let watch = || -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let (mut term, mut int) = runtime.block_on(async {
            Ok::<_, std::io::Error>((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))
        })?;
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let (name, code) = runtime.block_on(async {
                tokio::select! {
                    _ = term.recv() => ("SIGTERM", 143),
                    _ = int.recv() => ("SIGINT", 130),
                }
            });
            tracing::warn!("stopped by {name}");
            std::process::exit(code);
        })?;
        Ok(())
    };
    if let Err(e) = watch() {
        tracing::warn!("cannot watch for SIGTERM and SIGINT: {e}");
    }
}

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
        RoleArg::Shard | RoleArg::Learner => cli.name.clone().or_else(ordinal),
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
fn run_node(
    role: RoleArg,
    mut opts: NodeOptions,
    config: ConfigArgs,
    out: Option<PathBuf>,
) -> Result<(), RuntimeError> {
    if role == RoleArg::Learner && opts.resume.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--resume",
            "only a shard or the scheduler takes it",
        )));
    }
    if role != RoleArg::Shard && opts.advertise.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new("--advertise", "only a shard takes it")));
    }
    match role {
        RoleArg::Scheduler => {
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
            dir.write_config(&config)?;
            opts.run_dir = Some(dir.path().to_owned());
            let report = (config.data.load())
                .and_then(|data| run_scheduler(&config, (data, None), &opts, ProgressMode::detect()));
            let so_far = recorded_so_far(dir.path());
            // The run ended, finished or failed: there is no job left to take back.
            let _ = std::fs::remove_file(dir.path().join(STATE_FILE));
            finish(&dir, &config, report, || so_far)
        }
        RoleArg::Shard => run_shard(&opts, None),
        RoleArg::Learner => run_learner(&opts, None, None),
    }
}
