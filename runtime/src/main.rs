//! `rudra-node`: run a Rudra cluster. See `rudra-node --help`.

mod cli;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cli::{CertAction, Cli, Command, ConfigArgs, LogFormat, RoleArg, Suite, Transport};
use rudra_actors::{InvalidSetting, RunReport};
use rudra_runtime::checkpoint::describe;
use rudra_runtime::local::{ProgressMode, run_local};
use rudra_runtime::node::{NodeOptions, run_learner, run_loopback, run_scheduler, run_shard};
use rudra_runtime::{Checkpoint, Config, RunDir, RuntimeError, bench, experiment, report, simulate};
use rudra_transport::tls::CertDir;
use rudra_transport::{LinkFaults, Relay, RelayRules};

/// Log to stderr at `RUST_LOG` (default `info`) as text (coloured on a terminal) or JSON lines.
fn init_tracing(format: LogFormat) {
    let (filter, refused) = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        Err(e) => {
            (tracing_subscriber::EnvFilter::new("info"), std::env::var("RUST_LOG").ok().map(|v| (v, e)))
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
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match (cli.command, cli.role) {
        (Some(command), None) => run(command),
        (None, Some(role)) => run_node(
            role,
            cli.name,
            cli.certs,
            (cli.listen, cli.scheduler, cli.connect_timeout.into(), cli.metrics_addr),
            cli.resume,
            cli.config,
            cli.out,
        ),
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
        Command::Local { config, out, transport, metrics_addr } => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), config.protocol_name())?;
            dir.write_config(&config)?;
            tracing::info!(dir = %dir.path().display(), "run directory");
            let report = match transport {
                Transport::Memory => {
                    run_local(&config, data, Some(dir.path()), ProgressMode::detect(), metrics_addr)?
                }
                Transport::Quic => {
                    run_loopback(&config, data, Some(dir.path()), ProgressMode::detect(), metrics_addr)?
                }
            };
            finish(&dir, &config, &report)
        }
        Command::Experiment { config, out, time_limit } => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), "experiment")?;
            let limit = std::time::Duration::from_secs(time_limit);
            let e = experiment::run(&config, &data, &dir, limit)?;
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
fn finish(dir: &RunDir, config: &Config, report: &RunReport) -> Result<(), RuntimeError> {
    let s = dir.record(config, report)?.summary;
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
        Some(d) => Err(RuntimeError::diverged(config, d)),
        None => Ok(()),
    }
}

/// One node of a distributed cluster.
fn run_node(
    role: RoleArg,
    name: Option<String>,
    certs: PathBuf,
    (listen, scheduler, connect_timeout, metrics_addr): (
        Option<SocketAddr>,
        Option<SocketAddr>,
        std::time::Duration,
        Option<SocketAddr>,
    ),
    resume: Option<PathBuf>,
    config: ConfigArgs,
    out: Option<PathBuf>,
) -> Result<(), RuntimeError> {
    if role != RoleArg::Shard && resume.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--resume",
            "only a shard resumes from a checkpoint",
        )));
    }
    if role == RoleArg::Learner && metrics_addr.is_some() {
        return Err(RuntimeError::Invalid(InvalidSetting::new(
            "--metrics-addr",
            "learners serve no metrics; give it to the scheduler or a shard",
        )));
    }
    let default_name = match role {
        RoleArg::Scheduler => "scheduler",
        RoleArg::Shard => "shard-0",
        RoleArg::Learner => "learner-0",
    };
    let listen = listen.unwrap_or_else(|| match (role, scheduler) {
        (RoleArg::Scheduler, _) => SocketAddr::from(([0, 0, 0, 0], 7070)),
        // A shard listens on the interface that reaches the scheduler, on any port.
        (_, Some(s)) => SocketAddr::new(local_ip_towards(s), 0),
        (_, None) => SocketAddr::from(([0, 0, 0, 0], 0)),
    });
    let opts = NodeOptions {
        name: name.unwrap_or_else(|| default_name.into()),
        certs,
        listen,
        scheduler,
        connect_timeout,
        metrics_addr,
        resume,
        checkpoints: None,
    };
    match role {
        RoleArg::Scheduler => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), config.protocol_name())?;
            dir.write_config(&config)?;
            let report = run_scheduler(&config, (data, None), &opts, ProgressMode::detect())?;
            finish(&dir, &config, &report)
        }
        RoleArg::Shard => run_shard(&opts, None),
        RoleArg::Learner => run_learner(&opts, None, None),
    }
}

/// The local address this host uses to reach `peer` (no packet is sent).
fn local_ip_towards(peer: SocketAddr) -> std::net::IpAddr {
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    std::net::UdpSocket::bind(unspecified)
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map_or(unspecified.ip(), |a| a.ip())
}
