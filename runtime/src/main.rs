//! `rudra-node`: run a Rudra cluster. See `rudra-node --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use rudra_runtime::local::{ProgressMode, run_local};
use rudra_runtime::{Config, RunDir, RuntimeError, bench};
use rudra_transport::tls::CertDir;

#[derive(Parser)]
#[command(name = "rudra-node", version, about = "Rudra parameter-server runtime")]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    Training,
    Transport,
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
    },
    /// Measure against baselines in the same run: training throughput against a bare SGD
    /// loop (`--suite training`), or QUIC against TCP loopback and memcpy (`--suite transport`).
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

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match run(cli.command) {
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
        Command::Local { config, out } => {
            let config = Config::load(config.config.as_deref(), &config.set)?;
            let data = config.data.load()?;
            let dir = RunDir::create(out.as_deref(), config.protocol_name())?;
            dir.write_config(&config)?;
            tracing::info!(dir = %dir.path().display(), "run directory");
            let report = run_local(&config, data, ProgressMode::detect())?;
            let s = dir.write_report(&config, &report)?;
            println!(
                "{} n={} λ={} μ={} μλ={}: test accuracy {:.4}, train loss {:.4}, ⟨σ⟩ {:.2} (max {}), {} updates, {:.0} samples/s over {:.1} s; wrote {}",
                s.protocol,
                s.n,
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
        Command::Bench { config, suite, steps, frames, repeats } => {
            let rows = match suite {
                Suite::Training => {
                    let config = Config::load(config.config.as_deref(), &config.set)?;
                    let data = config.data.load()?;
                    bench::training::run(&config, &data, steps, repeats.max(1))?
                }
                Suite::Transport => bench::transport::run(frames, repeats)?,
            };
            bench::print(&rows);
            Ok(())
        }
    }
}
