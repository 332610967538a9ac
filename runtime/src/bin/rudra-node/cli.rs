//! The command line of `rudra-node`: clap's types, nothing else.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "rudra-node",
    version,
    about = "Rudra parameter-server runtime",
    after_help = "Run one node of a distributed cluster with --role (no subcommand):\n  \
        rudra-node --role scheduler --config FILE --listen 0.0.0.0:7070 --certs certs [--out DIR] [--metrics-addr ADDR]\n  \
        rudra-node --role scheduler --resume RUN_DIR --listen 0.0.0.0:7070 --certs certs   (take a job back)\n  \
        rudra-node --role shard --scheduler HOST:7070 --certs certs [--name shard-0] [--listen ADDR] [--advertise HOST:PORT] [--resume DIR]\n  \
        rudra-node --role learner --scheduler HOST:7070 --certs certs [--name learner-0] [--token TOKEN --ca ca.pem]\n  \
        rudra-node --role aggregator --scheduler HOST:7070 --certs certs [--name aggregator-0] [--listen ADDR] [--advertise HOST:PORT]\n\n\
        Every node flag can also come from a RUDRA_* variable (shown with each flag). Without --name a shard or\n\
        learner takes its ordinal: JOB_COMPLETION_INDEX (an Indexed Job) or a host name ending in -N (a StatefulSet pod).\n\n\
        Exit codes: 0 finished; 2 bad configuration, flags, input or join token (permanent: do not restart);\n\
        3 the run diverged (its results are written); any other code is worth a restart."
)]
pub(crate) struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "RUDRA_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
    /// Run one node of a distributed cluster in this process.
    #[arg(long, value_enum, env = "RUDRA_ROLE")]
    pub(crate) role: Option<RoleArg>,
    /// Node name, selecting the certificate certs/NAME.pem (default: scheduler; for a shard or
    /// learner its ordinal, else the name the scheduler assigns at enrolment, else ROLE-0).
    #[arg(long, env = "RUDRA_NAME")]
    pub(crate) name: Option<String>,
    /// Certificate directory (from `rudra-node cert`; an enrolled node keeps its certificate
    /// here).
    #[arg(long, default_value = "certs", env = "RUDRA_CERTS")]
    pub(crate) certs: PathBuf,
    /// Address to listen on (default: 0.0.0.0:7070 for the scheduler, UDP for nodes and TCP
    /// for enrolment; for a shard or an aggregator the interface that reaches the scheduler,
    /// any port).
    #[arg(long, env = "RUDRA_LISTEN")]
    pub(crate) listen: Option<SocketAddr>,
    /// The scheduler's address, HOST:PORT (every node but the scheduler); a DNS name is looked up at
    /// every attempt until --connect-timeout.
    #[arg(long, env = "RUDRA_SCHEDULER", value_name = "HOST:PORT")]
    pub(crate) scheduler: Option<String>,
    /// A shard or an aggregator: the address learners reach it at, HOST:PORT (e.g. a stable
    /// DNS name); default its listen address.
    #[arg(long, env = "RUDRA_ADVERTISE", value_name = "HOST:PORT")]
    pub(crate) advertise: Option<String>,
    /// How long to keep trying to reach peers and to wait for nodes to join, e.g. 60s, 5m.
    #[arg(long, default_value = "60s", env = "RUDRA_CONNECT_TIMEOUT")]
    pub(crate) connect_timeout: humantime::Duration,
    /// Serve this node's metrics at http://ADDR/metrics (Prometheus text format) and its
    /// health at /healthz and /readyz, e.g. 0.0.0.0:9100.
    #[arg(long, value_name = "ADDR", env = "RUDRA_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// A shard: continue from the checkpoint in DIR (`DIR/shard-N.safetensors`) and keep
    /// writing checkpoints there. A shard that rejoins a running job resumes even without it,
    /// from `checkpoint.dir` or `checkpoints/`. The scheduler: take back the job whose run
    /// directory is DIR (its `scheduler.json`), at the same address and with the same
    /// certificate; the nodes join again and the run ends there.
    #[arg(long, value_name = "DIR", env = "RUDRA_RESUME")]
    pub(crate) resume: Option<PathBuf>,
    /// A shard or learner without a certificate: enrol with this join token (from
    /// `rudra-node cert token`); the scheduler signs a certificate for it.
    #[arg(long, env = "RUDRA_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// The CA certificate an enrolling node checks the scheduler against (default
    /// CERTS/ca.pem).
    #[arg(long, value_name = "FILE", env = "RUDRA_CA")]
    pub(crate) ca: Option<PathBuf>,
    /// The run configuration (scheduler).
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// Run directory (scheduler; default: `runs/<timestamp>-<protocol>`).
    #[arg(long, env = "RUDRA_OUT")]
    pub(crate) out: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RoleArg {
    Scheduler,
    Shard,
    Learner,
    Aggregator,
}

impl From<RoleArg> for rudra_transport::Role {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Scheduler => Self::Scheduler,
            RoleArg::Shard => Self::Shard,
            RoleArg::Learner => Self::Learner,
            RoleArg::Aggregator => Self::Aggregator,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Suite {
    Training,
    Protocols,
    Transport,
    Simulator,
    Agreement,
    Compute,
    Cluster,
    Latency,
    Groups,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Transport {
    Memory,
    Quic,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
pub(crate) struct ConfigArgs {
    /// TOML configuration file (default: the built-in configs/default.toml).
    #[arg(long, env = "RUDRA_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Override one key, e.g. `--set protocol.kind=hardsync` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Make the cluster's certificates: `cert init` once, then `cert issue` per node, or join
    /// tokens (`cert token`, `cert secret`) with which nodes enrol.
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
        /// With `[[faults.kill]]` (runs as processes): every process's --connect-timeout, how
        /// long a node waits for a peer that went away before it gives up, e.g. 20s.
        #[arg(long, default_value = "20s")]
        connect_timeout: humantime::Duration,
    },
    /// Forward UDP datagrams (a node's QUIC traffic) from `--listen` to `--to` and back,
    /// losing, delaying, duplicating and reordering them as told, seeded: put it between two
    /// real hosts to inject link faults. Runs until stopped.
    Relay(RelayArgs),
    /// Simulate the configured cluster with virtual learners on the real protocol cores, in
    /// virtual time (see the `[simulation]` settings); one run, or one per point of a sweep.
    Simulate {
        #[command(flatten)]
        config: ConfigArgs,
        /// Output directory (default: `runs/<timestamp>-sim-<protocol>`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run a study: the configuration in FILE once per point of its `[study]` axes (and
    /// seeds), each point in its own run directory, into `study.csv`, `study.md` and a figure.
    Study {
        /// The study file: a configuration with a `[study]` section.
        file: PathBuf,
        /// Override one key of every point, e.g. `--set training.epochs=1` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Output directory (default: `runs/<timestamp>-study`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Keep the points already complete in --out and run the rest.
        #[arg(long)]
        resume: bool,
    },
    /// Measure against baselines in the same run: training throughput against a bare SGD
    /// loop (`--suite training`), QUIC against TCP loopback and memcpy (`--suite transport`),
    /// the simulator's events per second with 10,000 learners (`--suite simulator`), or its
    /// ⟨σ⟩ against the local cluster's on the same settings (`--suite agreement`), or
    /// the CPU GEMM against numpy and MLP and CNN steps on every backend present
    /// (`--suite compute`), or every protocol with its defaults: test accuracy and throughput
    /// (`--suite protocols`), or the peers' workload as processes over loopback QUIC per
    /// payload codec against the same run in memory (`--suite cluster`), or with the
    /// learners' links through a relay at round trips of 0, 1, 5 and 20 ms against the direct
    /// link (`--suite latency`), or 4 learners as processes in 2 groups of either kind, each
    /// group's aggregator a process, against no groups (`--suite groups`).
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
        /// Also write the table as markdown, headed by the CPU and the date, to this file.
        #[arg(long, value_name = "FILE")]
        markdown: Option<PathBuf>,
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

/// The link a relay stands in for, and the faults it injects.
#[derive(clap::Args)]
pub(crate) struct RelayArgs {
    /// Where clients send (point the connecting node here).
    #[arg(long)]
    pub(crate) listen: SocketAddr,
    /// The node datagrams are forwarded to.
    #[arg(long)]
    pub(crate) to: SocketAddr,
    /// Probability that a datagram is lost (each way).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) drop: f64,
    /// Probability that a datagram arrives twice.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) duplicate: f64,
    /// Probability that a datagram is held back behind later ones.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) reorder: f64,
    /// Delay of every datagram, milliseconds (fractions allowed, e.g. 2.5).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) delay_ms: f64,
    /// Uniform jitter on the delay, ± milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) jitter_ms: f64,
    /// Bandwidth of each direction, Mbit/s (0: unlimited); the link buffers a round trip of
    /// backlog (at least 5 ms) and drops beyond it.
    #[arg(long = "rate-mbit", alias = "rate", default_value_t = 0.0)]
    pub(crate) rate_mbit: f64,
    /// Seed of the fault dice.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Cut the link (a partition) this many milliseconds after start …
    #[arg(long)]
    pub(crate) down_at_ms: Option<u64>,
    /// … and heal it at this time.
    #[arg(long)]
    pub(crate) up_at_ms: Option<u64>,
}

#[derive(Subcommand)]
pub(crate) enum CertAction {
    /// Create the cluster's certificate authority (ca.pem, ca.key) in DIR.
    Init {
        /// Certificate directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue NAME.pem and NAME.key, signed by the CA in DIR. NAME starts with the node's
    /// role: scheduler, shard-N, learner-N, aggregator-N.
    Issue {
        /// Certificate directory.
        #[arg(long)]
        dir: PathBuf,
        /// Node name.
        #[arg(long)]
        name: String,
    },
    /// Print a join token: a node of ROLE presenting it to the scheduler (which holds the CA
    /// in DIR) gets a certificate, until the token expires or its uses are taken.
    Token {
        /// Certificate directory holding the CA's key.
        #[arg(long)]
        dir: PathBuf,
        /// The role it admits: shard, learner or aggregator.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// How long it is valid, e.g. 1h, 30m.
        #[arg(long, default_value = "1h")]
        ttl: humantime::Duration,
        /// How many nodes may enrol with it (a node that restarts without its certificate
        /// enrols again).
        #[arg(long, default_value_t = 1)]
        uses: u32,
    },
    /// Write Kubernetes Secret manifests: NAME-ca (ca.pem, ca.key: the scheduler's) and
    /// NAME-join (ca.pem and a shard, a learner and an aggregator join token: every node's).
    Secret {
        /// Certificate directory holding the CA.
        #[arg(long)]
        dir: PathBuf,
        /// How long the tokens are valid.
        #[arg(long, default_value = "24h")]
        ttl: humantime::Duration,
        /// Enrolments each token allows (every pod that starts without its certificate takes one).
        #[arg(long, default_value_t = 100)]
        uses: u32,
        /// Prefix of the Secrets' names.
        #[arg(long, default_value = "rudra")]
        name: String,
        /// Namespace of the Secrets (default: none, kubectl's current one).
        #[arg(long)]
        namespace: Option<String>,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}
