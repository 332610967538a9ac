//! `rudra-node`: run a Rudra cluster. See `rudra-node --help`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use rudra_actors::RunReport;
use rudra_runtime::checkpoint::describe;
use rudra_runtime::local::{ProgressMode, run_local};
use rudra_runtime::node::{NodeOptions, run_learner, run_loopback, run_scheduler, run_shard};
use rudra_runtime::{Checkpoint, Config, RunDir, RuntimeError, bench, experiment, report, simulate};
use rudra_transport::tls::CertDir;
use rudra_transport::{LinkFaults, Relay, RelayRules};

#[derive(Parser)]
#[command(
    name = "rudra-node",
    version,
    about = "Rudra parameter-server runtime",
    after_help = "Run one node of a distributed cluster with --role (no subcommand):\n  \
        rudra-node --role scheduler --config FILE --listen 0.0.0.0:7070 --certs certs [--out DIR] [--metrics-addr ADDR]\n  \
        rudra-node --role shard --scheduler HOST:7070 --certs certs [--name shard-0] [--listen ADDR] [--resume DIR] [--metrics-addr ADDR]\n  \
        rudra-node --role learner --scheduler HOST:7070 --certs certs [--name learner-0]"
)]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Run one node of a distributed cluster in this process.
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    /// Node name, selecting the certificate certs/NAME.pem (default: scheduler, shard-0, learner-0).
    #[arg(long)]
    name: Option<String>,
    /// Certificate directory (from `rudra-node cert`).
    #[arg(long, default_value = "certs")]
    certs: PathBuf,
    /// Address to listen on (default: 0.0.0.0:7070 for the scheduler, any port for a shard).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The scheduler's address (shards and learners).
    #[arg(long)]
    scheduler: Option<SocketAddr>,
    /// How long to keep trying to reach peers and to wait for nodes to join, e.g. 60s, 5m.
    #[arg(long, default_value = "60s")]
    connect_timeout: humantime::Duration,
    /// Serve this node's metrics in the Prometheus text format at http://ADDR/metrics
    /// (scheduler and shards), e.g. 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// A shard: continue from the checkpoint in DIR (`DIR/shard-N.safetensors`) and keep
    /// writing checkpoints there. A shard that rejoins a running job resumes even without it,
    /// from `checkpoint.dir` or `checkpoints/`.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// The run configuration (scheduler).
    #[command(flatten)]
    config: ConfigArgs,
    /// Run directory (scheduler; default: `runs/<timestamp>-<protocol>`).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RoleArg {
    Scheduler,
    Shard,
    Learner,
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    Training,
    Transport,
    Simulator,
    Agreement,
    Compute,
}

#[derive(Clone, Copy, ValueEnum)]
enum Transport {
    Memory,
    Quic,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct ConfigArgs {
    /// TOML configuration file (default: the built-in configs/default.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key, e.g. `--set protocol.kind=hardsync` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Make the cluster's certificates: `cert init` once, then `cert issue` per node.
    Cert {
        #[command(subcommand)]
        action: CertAction,
    },
    /// Run the whole cluster (scheduler, tracker, shards, learners) in this process.
    Local {
        #[command(flatten)]
        config: ConfigArgs,
        /// Run directory (default: `runs/<timestamp>-<protocol>`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// How the nodes talk: actor messages in memory, or QUIC with mutual TLS over
        /// loopback with every node on its own thread, as separate processes would.
        #[arg(long, value_enum, default_value_t = Transport::Memory)]
        transport: Transport,
        /// Serve the run's live metrics in the Prometheus text format at
        /// http://ADDR/metrics while it runs, e.g. 127.0.0.1:9100.
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<SocketAddr>,
    },
    /// Run a fault-injection scenario (a configuration with a `[faults]` section) next to the
    /// same run without faults, with the same seed, and report what the faults cost.
    Experiment {
        #[command(flatten)]
        config: ConfigArgs,
        /// Output directory (default: `runs/<timestamp>-experiment`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Give up on a run that has not finished after this many seconds.
        #[arg(long, default_value_t = 1800)]
        time_limit: u64,
    },
    /// Forward UDP datagrams (a node's QUIC traffic) from `--listen` to `--to` and back,
    /// losing, delaying, duplicating and reordering them as told, seeded: put it between two
    /// real hosts to inject link faults. Runs until stopped.
    Relay {
        /// Where clients send (point the connecting node here).
        #[arg(long)]
        listen: SocketAddr,
        /// The node datagrams are forwarded to.
        #[arg(long)]
        to: SocketAddr,
        /// Probability that a datagram is lost (each way).
        #[arg(long, default_value_t = 0.0)]
        drop: f64,
        /// Probability that a datagram arrives twice.
        #[arg(long, default_value_t = 0.0)]
        duplicate: f64,
        /// Probability that a datagram is held back behind later ones.
        #[arg(long, default_value_t = 0.0)]
        reorder: f64,
        /// Delay of every datagram, milliseconds.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Uniform jitter on the delay, ± milliseconds.
        #[arg(long, default_value_t = 0)]
        jitter_ms: u64,
        /// Seed of the fault dice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Cut the link (a partition) this many milliseconds after start …
        #[arg(long)]
        down_at_ms: Option<u64>,
        /// … and heal it at this time.
        #[arg(long)]
        up_at_ms: Option<u64>,
    },
    /// Simulate the configured cluster with virtual learners on the real protocol cores, in
    /// virtual time (see the `[simulation]` settings); one run, or one per point of a sweep.
    Simulate {
        #[command(flatten)]
        config: ConfigArgs,
        /// Output directory (default: `runs/<timestamp>-sim-<protocol>`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Measure against baselines in the same run: training throughput against a bare SGD
    /// loop (`--suite training`), QUIC against TCP loopback and memcpy (`--suite transport`),
    /// the simulator's events per second with 10,000 learners (`--suite simulator`), or its
    /// ⟨σ⟩ against the local cluster's on the same settings (`--suite agreement`), or
    /// the CPU GEMM against numpy and MLP and CNN steps on every backend present
    /// (`--suite compute`).
    Bench {
        #[command(flatten)]
        config: ConfigArgs,
        /// What to measure.
        #[arg(long, value_enum, default_value_t = Suite::Training)]
        suite: Suite,
        /// SGD steps per learner in each training measurement.
        #[arg(long, default_value_t = 600)]
        steps: usize,
        /// 4 MiB frames per transport measurement.
        #[arg(long, default_value_t = 64)]
        frames: usize,
        /// Measurements per setting; the median is reported.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// Compare finished runs: print a table (also written as report.md and report.csv) and
    /// draw their accuracy and loss on the same axes.
    Report {
        /// Run directories, as written by `local` or the scheduler.
        #[arg(required = true, value_name = "RUN_DIR")]
        runs: Vec<PathBuf>,
        /// Where the table and plots go.
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// Test accuracy for the time-to-target column.
        #[arg(long, default_value_t = 0.97)]
        target: f64,
    },
    /// Print the test accuracy of a checkpoint. The model comes from the checkpoint; the
    /// configuration chooses the test set (a run's own config.toml gives the set it was
    /// evaluated on).
    Eval {
        /// A checkpoint.safetensors.
        #[arg(long)]
        checkpoint: PathBuf,
        #[command(flatten)]
        config: ConfigArgs,
        /// Dataset format (sets training.dataset).
        #[arg(long)]
        dataset: Option<String>,
        /// Directory of the dataset files (sets training.data_dir).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CertAction {
    /// Create the cluster's certificate authority (ca.pem, ca.key) in DIR.
    Init {
        /// Certificate directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue NAME.pem and NAME.key, signed by the CA in DIR. NAME starts with the node's
    /// role: scheduler, shard-N, learner-N.
    Issue {
        /// Certificate directory.
        #[arg(long)]
        dir: PathBuf,
        /// Node name.
        #[arg(long)]
        name: String,
    },
}

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
                Suite::Simulator => bench::simulator::run(config.config.as_deref(), &config.set, repeats)?,
                Suite::Agreement => bench::agreement::run(config.config.as_deref(), &config.set, repeats)?,
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
    let s = dir.record(config, report)?;
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
    Ok(())
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
        return Err(RuntimeError::Invalid {
            key: "--resume",
            message: "only a shard resumes from a checkpoint".into(),
        });
    }
    if role == RoleArg::Learner && metrics_addr.is_some() {
        return Err(RuntimeError::Invalid {
            key: "--metrics-addr",
            message: "learners serve no metrics; give it to the scheduler or a shard".into(),
        });
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
            let report = run_scheduler(&config, data, &opts, ProgressMode::detect())?;
            finish(&dir, &config, &report)
        }
        RoleArg::Shard => run_shard(&opts),
        RoleArg::Learner => run_learner(&opts),
    }
}

/// The local address this host uses to reach `peer` (no packet is sent).
fn local_ip_towards(peer: SocketAddr) -> std::net::IpAddr {
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    std::net::UdpSocket::bind(unspecified)
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map_or(unspecified.ip(), |a| a.ip())
}
