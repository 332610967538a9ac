//! Run configuration: defaults < TOML file < `RUDRA__SECTION__KEY` environment <
//! `--set section.key=value`, read by the `config` crate into [`RawConfig`] and turned once
//! into the typed [`Config`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rudra_actors::checkpoint::Checkpoints;
use rudra_actors::faults::{Crash, FaultPlan, LinkRule, Liveness, Node, Nodes, Partition, Slow};
use rudra_actors::protocol::{LrModulation, LrSchedule, SyncRule};
use rudra_actors::{ClusterSpec, ElasticMethod, ElasticSpec, ProtocolSpec, TrainingData};
use rudra_compute::{DeviceKind, ModelSpec};
use rudra_transport::{FaultWindow, LearnerId, LinkFaults, ShardId};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::simulate::{RawSimulation, Simulation};

/// The built-in defaults: `configs/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../configs/default.toml");

/// The configuration as written by the user, before validation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[cluster]`
    pub cluster: RawCluster,
    /// `[protocol]`
    pub protocol: RawProtocol,
    /// `[training]`
    pub training: RawTraining,
    /// `[compute]`
    pub compute: RawCompute,
    /// `[simulation]`, read by `rudra-node simulate` only.
    pub simulation: RawSimulation,
    /// `[faults]`: faults to inject (none by default).
    #[serde(default)]
    pub faults: RawFaults,
    /// `[checkpoint]`: the shards' checkpoints.
    #[serde(default)]
    pub checkpoint: RawCheckpoint,
}

/// `[checkpoint]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCheckpoint {
    /// Each shard writes a checkpoint after every this many updates (0: none).
    pub every_updates: u64,
    /// Where (default: `checkpoints/` in the run directory; for a shard process, its
    /// `--checkpoints` directory).
    pub dir: Option<PathBuf>,
}

impl Default for RawCheckpoint {
    fn default() -> Self {
        Self { every_updates: 500, dir: None }
    }
}

/// `[faults]`
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawFaults {
    /// Seeds the dice of every link.
    pub seed: u64,
    /// `[[faults.link]]`
    pub link: Vec<RawLinkRule>,
    /// `[[faults.partition]]`
    pub partition: Vec<RawPartition>,
    /// `[[faults.crash]]`
    pub crash: Vec<RawCrash>,
    /// `[[faults.slow]]`
    pub slow: Vec<RawSlow>,
}

/// `[[faults.link]]`: faults on the links between two sets of nodes, both ways.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLinkRule {
    /// The two ends: `*`, `learners`, `shards`, `scheduler`, `learner-N`, `shard-N`.
    pub between: [String; 2],
    /// Probabilities and delays.
    #[serde(default)]
    pub drop: f64,
    /// Probability that a message arrives twice.
    #[serde(default)]
    pub duplicate: f64,
    /// Probability that a message is held back behind later ones.
    #[serde(default)]
    pub reorder: f64,
    /// Delay of every message, milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Uniform jitter on the delay, ± milliseconds.
    #[serde(default)]
    pub jitter_ms: u64,
    /// From this time after the start, milliseconds.
    #[serde(default)]
    pub from_ms: u64,
    /// Until this time (none: to the end).
    pub until_ms: Option<u64>,
}

/// `[[faults.partition]]`: nodes cut off from every other, then healed.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartition {
    /// Who: `learner-N`, `learners`, …
    pub node: String,
    /// From this time after the start, milliseconds.
    pub from_ms: u64,
    /// Healed at this time (none: never).
    pub until_ms: Option<u64>,
}

/// `[[faults.crash]]`: a learner that stops for good, or a shard that restarts from its
/// last checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCrash {
    /// The learner id (give this or `shard`).
    pub learner: Option<u32>,
    /// The shard id.
    pub shard: Option<u32>,
    /// When, milliseconds after the start.
    pub at_ms: u64,
    /// A shard restarts this many milliseconds after it crashed.
    pub restart_after_ms: Option<u64>,
}

/// `[[faults.slow]]`: a learner that computes slowly.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlow {
    /// The learner id.
    pub learner: u32,
    /// How many times slower, at least 1.
    pub factor: f64,
}

impl RawFaults {
    /// The checked plan for a cluster of `learners` learners and `shards` shards; `elastic`
    /// says whether the protocol is of the EASGD family, whose exchanges are not retried.
    fn plan(
        &self,
        learners: u32,
        shards: u32,
        elastic: bool,
        checkpoints: bool,
    ) -> Result<FaultPlan, RuntimeError> {
        let ms = Duration::from_millis;
        let nodes = |key: &'static str, s: &str| {
            let n = Nodes::parse(s).map_err(|e| invalid(key, e))?;
            match n {
                Nodes::Learner(l) if l.0 >= learners => {
                    Err(invalid(key, format!("{s}: there are {learners} learners")))
                }
                Nodes::Shard(x) if x.0 >= shards => {
                    Err(invalid(key, format!("{s}: there are {shards} shards")))
                }
                _ => Ok(n),
            }
        };
        let window = |key: &'static str, from: u64, until: Option<u64>| {
            let w = FaultWindow { from: ms(from), until: until.map(ms) };
            w.validate().map(|()| w).map_err(|e| invalid(key, e.to_string()))
        };
        let learner = |key: &'static str, l: u32| {
            if l < learners {
                Ok(LearnerId(l))
            } else {
                Err(invalid(key, format!("learner {l}: there are {learners}")))
            }
        };
        let lossy = self.link.iter().any(|r| r.drop > 0.0) || !self.partition.is_empty();
        if elastic && lossy {
            return Err(invalid(
                "faults",
                "dropped messages and partitions need hardsync, softsync or async: an EASGD exchange is not retried",
            ));
        }
        let mut links = Vec::new();
        for r in &self.link {
            let faults = LinkFaults {
                drop: r.drop,
                duplicate: r.duplicate,
                reorder: r.reorder,
                delay: ms(r.delay_ms),
                jitter: ms(r.jitter_ms),
            };
            faults.validate().map_err(|e| invalid("faults.link", e.to_string()))?;
            let (a, b) =
                (nodes("faults.link.between", &r.between[0])?, nodes("faults.link.between", &r.between[1])?);
            links.push(LinkRule {
                a,
                b,
                faults,
                window: window("faults.link.until_ms", r.from_ms, r.until_ms)?,
            });
        }
        let partitions = (self.partition.iter())
            .map(|p| {
                let nodes = nodes("faults.partition.node", &p.node)?;
                Ok(Partition { nodes, window: window("faults.partition.until_ms", p.from_ms, p.until_ms)? })
            })
            .collect::<Result<_, RuntimeError>>()?;
        let crashes = (self.crash.iter())
            .map(|c| {
                let node = match (c.learner, c.shard, c.restart_after_ms) {
                    (Some(l), None, None) => Node::Learner(learner("faults.crash.learner", l)?),
                    (Some(_), None, Some(_)) => {
                        return Err(invalid(
                            "faults.crash.restart_after_ms",
                            "a crashed learner stays down; start a new `rudra-node --role learner` to replace it",
                        ));
                    }
                    (None, Some(x), Some(_)) if x < shards => Node::Shard(ShardId(x)),
                    (None, Some(x), Some(_)) => {
                        return Err(invalid("faults.crash.shard", format!("shard {x}: there are {shards}")));
                    }
                    (None, Some(_), None) => {
                        return Err(invalid(
                            "faults.crash.restart_after_ms",
                            "a crashed shard must restart: the run cannot go on without its parameters",
                        ));
                    }
                    _ => return Err(invalid("faults.crash", "give either `learner` or `shard`")),
                };
                if matches!(node, Node::Shard(_)) && elastic {
                    return Err(invalid(
                        "faults.crash.shard",
                        "shard crashes need hardsync, softsync or async: an EASGD exchange is not retried",
                    ));
                }
                if matches!(node, Node::Shard(_)) && !checkpoints {
                    return Err(invalid(
                        "checkpoint.every_updates",
                        "is 0; a shard that crashes restarts from its checkpoint, so set it above 0",
                    ));
                }
                Ok(Crash { node, at: ms(c.at_ms), restart_after: c.restart_after_ms.map(ms) })
            })
            .collect::<Result<_, RuntimeError>>()?;
        let slow = (self.slow.iter())
            .map(|s| {
                if !(s.factor.is_finite() && s.factor >= 1.0) {
                    return Err(invalid(
                        "faults.slow.factor",
                        format!("is {}; it must be at least 1", s.factor),
                    ));
                }
                Ok(Slow { learner: learner("faults.slow.learner", s.learner)?, factor: s.factor })
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(FaultPlan { seed: self.seed, links, partitions, crashes, slow })
    }
}

/// `[cluster]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// λ.
    pub learners: u32,
    /// Parameter shards.
    pub shards: u32,
    /// Heartbeat interval of the learners, milliseconds.
    pub heartbeat_ms: u64,
    /// A learner pulls again after this many milliseconds without an answer.
    pub retry_ms: u64,
    /// The scheduler removes a learner silent for this many milliseconds.
    pub failure_timeout_ms: u64,
}

/// `[protocol]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProtocol {
    /// `hardsync | softsync | async | easgd | eamsgd | downpour | mdownpour`.
    pub kind: String,
    /// Softsync splitting parameter.
    pub n: u32,
    /// `none | per-gradient | mean`.
    pub lr_modulation: String,
    /// Optional staleness bound.
    pub max_staleness: Option<u64>,
    /// EASGD: synchronous rounds.
    pub sync: bool,
    /// EASGD family: communication period τ (default 10 for EASGD/EAMSGD, 1 for DOWNPOUR).
    pub tau: Option<u64>,
    /// EASGD family: moving rate α (default β / λ).
    pub alpha: Option<f32>,
    /// EASGD family: center rate β (default 0.9).
    pub beta: Option<f32>,
    /// EAMSGD and MDOWNPOUR: Nesterov momentum δ (default 0.99).
    pub momentum: Option<f32>,
}

/// `[training]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraining {
    /// `mnist | fashion-mnist | cifar10`.
    pub dataset: String,
    /// Directory of the dataset files; MNIST and Fashion-MNIST have defaults, CIFAR-10 has
    /// none.
    pub data_dir: Option<PathBuf>,
    /// Use only the first N training examples (0 = all).
    pub train_examples: usize,
    /// Use only the first N test examples (0 = all).
    pub test_examples: usize,
    /// `softmax | mlp | cnn | cifar10-net`.
    pub model: String,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// μ.
    pub batch_size: usize,
    /// α0.
    pub learning_rate: f32,
    /// Per-epoch multiplier of α0.
    pub lr_decay: f32,
    /// Test-set evaluations per epoch.
    pub evals_per_epoch: u32,
    /// The accuracy whose time to reach the summary reports.
    pub target_accuracy: f64,
    /// EASGD family: γ in `η_t = η / (1 + γ t)^0.5` on each learner's clock (0 = off).
    pub lr_decay_gamma: f32,
    /// Passes over each learner's partition.
    pub epochs: u32,
    /// Seed of weights, partitions and shuffles.
    pub seed: u64,
}

/// `[compute]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompute {
    /// `auto | cpu | cuda | wgpu`.
    pub device: String,
}

/// A dataset Rudra reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// MNIST's IDX files (shipped in `data/mnist`).
    Mnist,
    /// Fashion-MNIST's IDX files (Debian's `dataset-fashion-mnist` installs them).
    FashionMnist,
    /// CIFAR-10's binary files.
    Cifar10,
}

impl DatasetKind {
    fn parse(name: &str) -> Result<Self, RuntimeError> {
        match name {
            "mnist" => Ok(Self::Mnist),
            "fashion-mnist" => Ok(Self::FashionMnist),
            "cifar10" => Ok(Self::Cifar10),
            other => Err(invalid(
                "training.dataset",
                format!("{other:?} is not a known dataset (mnist, fashion-mnist, cifar10)"),
            )),
        }
    }

    /// Features per example: 28×28 grey or 32×32 colour pixels.
    fn features(self) -> usize {
        match self {
            Self::Mnist | Self::FashionMnist => 28 * 28,
            Self::Cifar10 => 32 * 32 * 3,
        }
    }

    /// Where the files are when `training.data_dir` is not given.
    fn default_dir(self) -> Result<PathBuf, RuntimeError> {
        match self {
            Self::Mnist => Ok(PathBuf::from("data/mnist")),
            Self::FashionMnist => Ok(PathBuf::from("/usr/share/datasets/fashion-mnist")),
            Self::Cifar10 => Err(invalid(
                "training.data_dir",
                "cifar10 has no default; give the directory of the binary version's data_batch_1.bin … \
                 data_batch_5.bin and test_batch.bin",
            )),
        }
    }

    /// What the directory must hold, for messages.
    fn files(self) -> &'static str {
        match self {
            Self::Mnist | Self::FashionMnist => "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
            Self::Cifar10 => "data_batch_{1..5}.bin and test_batch.bin",
        }
    }
}

/// Where the examples come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSource {
    /// Which dataset.
    pub kind: DatasetKind,
    /// Directory with its files.
    pub dir: PathBuf,
    /// Training examples to use (`None` = all).
    pub train_examples: Option<usize>,
    /// Test examples to use (`None` = all).
    pub test_examples: Option<usize>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster and training settings.
    pub cluster: ClusterSpec,
    /// The dataset.
    pub data: DataSource,
    /// The learners' compute device.
    pub device: DeviceKind,
    /// Heartbeats, retries and the failure timeout.
    pub liveness: Liveness,
    /// Faults to inject.
    pub faults: FaultPlan,
    /// The simulator's settings.
    pub simulation: Simulation,
    /// The configuration as resolved, for the run directory.
    pub raw: RawConfig,
}

fn invalid(key: &'static str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Invalid { key, message: message.into() }
}

/// One `--set key=value` as a TOML line: the value is TOML if it parses as such
/// (`4`, `0.1`, `[256, 128]`, `true`), otherwise a string (`softsync`).
fn override_line(assignment: &str) -> Result<String, RuntimeError> {
    let (key, value) = assignment.split_once('=').ok_or_else(|| {
        RuntimeError::Config(format!("--set {assignment:?} is not of the form section.key=value"))
    })?;
    let (key, value) = (key.trim(), value.trim());
    let valid_key = !key.is_empty()
        && key.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if !valid_key {
        return Err(RuntimeError::Config(format!(
            "--set {assignment:?}: {key:?} is not a key like training.batch_size"
        )));
    }
    let probe = format!("v = {value}");
    if toml::from_str::<toml::Table>(&probe).is_ok() {
        Ok(format!("{key} = {value}\n"))
    } else {
        Ok(format!("{key} = {}\n", toml::Value::String(value.to_owned())))
    }
}

impl RawConfig {
    /// Layer the sources: built-in defaults, `file`, the `RUDRA__…` environment, `overrides`.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, RuntimeError> {
        use config::{Environment, File, FileFormat};
        let mut builder =
            config::Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(RuntimeError::Config(format!(
                    "configuration file {} does not exist",
                    path.display()
                )));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        builder = builder.add_source(
            Environment::with_prefix("RUDRA").prefix_separator("__").separator("__").try_parsing(true),
        );
        // One source per override, so that a later one of the same key wins.
        for o in overrides {
            builder = builder.add_source(File::from_str(&override_line(o)?, FileFormat::Toml));
        }
        builder
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| RuntimeError::Config(e.to_string()))
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = RuntimeError;

    fn try_from(raw: RawConfig) -> Result<Self, RuntimeError> {
        let p = &raw.protocol;
        let elastic = |method| {
            let default_tau =
                if matches!(method, ElasticMethod::Easgd { .. } | ElasticMethod::Eamsgd) { 10 } else { 1 };
            let beta = p.beta.unwrap_or(0.9);
            ElasticSpec {
                method,
                tau: p.tau.unwrap_or(default_tau),
                alpha: p.alpha.unwrap_or(beta / raw.cluster.learners.max(1) as f32),
                beta,
                momentum: p.momentum.unwrap_or(0.99),
                lr_decay_gamma: raw.training.lr_decay_gamma,
            }
        };
        let (rule, elastic) = match p.kind.as_str() {
            "hardsync" => (SyncRule::Hardsync, None),
            "softsync" => (SyncRule::Softsync { n: p.n }, None),
            "async" => (SyncRule::Softsync { n: raw.cluster.learners }, None),
            "easgd" => (SyncRule::Hardsync, Some(elastic(ElasticMethod::Easgd { sync: p.sync }))),
            "eamsgd" => (SyncRule::Hardsync, Some(elastic(ElasticMethod::Eamsgd))),
            "downpour" => (SyncRule::Hardsync, Some(elastic(ElasticMethod::Downpour))),
            "mdownpour" => (SyncRule::Hardsync, Some(elastic(ElasticMethod::MDownpour))),
            other => {
                return Err(invalid(
                    "protocol.kind",
                    format!(
                        "{other:?} is not one of hardsync, softsync, async, easgd, eamsgd, downpour, mdownpour"
                    ),
                ));
            }
        };
        let modulation = match p.lr_modulation.as_str() {
            "none" => LrModulation::None,
            "per-gradient" => LrModulation::PerGradient,
            "mean" => LrModulation::Mean,
            other => {
                return Err(invalid(
                    "protocol.lr_modulation",
                    format!("{other:?} is not one of none, per-gradient, mean"),
                ));
            }
        };
        let t = &raw.training;
        if !(t.target_accuracy > 0.0 && t.target_accuracy <= 1.0) {
            return Err(invalid(
                "training.target_accuracy",
                format!("is {}; it must be in (0, 1]", t.target_accuracy),
            ));
        }
        let dataset = DatasetKind::parse(&t.dataset)?;
        let fits = |spec: ModelSpec, reads: &str| {
            if spec.inputs == dataset.features() {
                Ok(spec)
            } else {
                Err(invalid(
                    "training.model",
                    format!("{} reads {reads}, not those of {}", t.model, t.dataset),
                ))
            }
        };
        let model = match t.model.as_str() {
            "mlp" if t.hidden.is_empty() || t.hidden.contains(&0) => {
                return Err(invalid("training.hidden", "an mlp needs one or more non-zero layer widths"));
            }
            "mlp" => ModelSpec::dense(dataset.features(), t.hidden.clone(), 10),
            "softmax" => ModelSpec::dense(dataset.features(), Vec::new(), 10),
            "cnn" => fits(ModelSpec::cnn(), "28×28 grey images (mnist, fashion-mnist)")?,
            "cifar10-net" => fits(ModelSpec::cifar10_net(), "32×32 colour images (cifar10)")?,
            other => {
                return Err(invalid(
                    "training.model",
                    format!("{other:?} is not one of softmax, mlp, cnn, cifar10-net"),
                ));
            }
        };
        let device = raw.compute.device.parse().map_err(|e| invalid("compute.device", e))?;
        let cluster = ClusterSpec {
            learners: raw.cluster.learners,
            shards: raw.cluster.shards,
            protocol: ProtocolSpec { rule, modulation, max_staleness: p.max_staleness, elastic },
            model,
            batch_size: t.batch_size,
            epochs: t.epochs,
            schedule: LrSchedule { base: t.learning_rate, decay: t.lr_decay },
            seed: t.seed,
            evals_per_epoch: t.evals_per_epoch,
        };
        let data = DataSource {
            kind: dataset,
            dir: t.data_dir.clone().map_or_else(|| dataset.default_dir(), Ok)?,
            train_examples: (t.train_examples > 0).then_some(t.train_examples),
            test_examples: (t.test_examples > 0).then_some(t.test_examples),
        };
        // Settings checks that need no data, once for every command; the data-dependent ones
        // run where the data is loaded.
        cluster.validate_settings(cluster.model.layout().len)?;
        let simulation = Simulation::from_raw(&raw.simulation)?;
        let c = &raw.cluster;
        if !(c.heartbeat_ms > 0 && c.heartbeat_ms < c.failure_timeout_ms) {
            return Err(invalid(
                "cluster.failure_timeout_ms",
                format!(
                    "is {}; it must be longer than cluster.heartbeat_ms ({})",
                    c.failure_timeout_ms, c.heartbeat_ms
                ),
            ));
        }
        if c.retry_ms == 0 {
            return Err(invalid("cluster.retry_ms", "must be positive"));
        }
        let liveness = Liveness {
            heartbeat: Duration::from_millis(c.heartbeat_ms),
            retry: Duration::from_millis(c.retry_ms),
            failure_timeout: Duration::from_millis(c.failure_timeout_ms),
        };
        let elastic = cluster.protocol.elastic.is_some();
        let every = raw.checkpoint.every_updates;
        let faults = raw.faults.plan(cluster.learners, cluster.shards, elastic, every > 0)?;
        Ok(Self { cluster, data, device, liveness, faults, simulation, raw })
    }
}

impl Config {
    /// Where the shards write their checkpoints and how often: `checkpoint.dir` if set, else
    /// `checkpoints/` in `run_dir`; `None` when `checkpoint.every_updates` is 0 or there is
    /// no directory to write to.
    #[must_use]
    pub fn checkpoints(&self, run_dir: Option<&Path>) -> Option<Checkpoints> {
        let c = &self.raw.checkpoint;
        let dir = c.dir.clone().or_else(|| run_dir.map(|d| d.join("checkpoints")))?;
        (c.every_updates > 0).then_some(Checkpoints { dir, every_updates: c.every_updates })
    }

    /// Load and validate, see [`RawConfig::load`].
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, RuntimeError> {
        RawConfig::load(file, overrides)?.try_into()
    }

    /// Protocol name for reports: `hardsync`, `softsync` or `async`.
    #[must_use]
    pub fn protocol_name(&self) -> &str {
        &self.raw.protocol.kind
    }

    /// The protocol and its key settings, e.g. `softsync n=4` or `easgd τ=10 α=0.225`.
    #[must_use]
    pub fn protocol_label(&self) -> String {
        let p = &self.cluster.protocol;
        match (&p.elastic, p.rule) {
            (Some(e), _) => match e.method {
                ElasticMethod::Easgd { sync: true } => {
                    format!("easgd sync τ={} α={} β={}", e.tau, e.alpha, e.beta)
                }
                ElasticMethod::Easgd { sync: false } => format!("easgd τ={} α={}", e.tau, e.alpha),
                ElasticMethod::Eamsgd => format!("eamsgd τ={} α={} δ={}", e.tau, e.alpha, e.momentum),
                ElasticMethod::Downpour => format!("downpour τ={}", e.tau),
                ElasticMethod::MDownpour => format!("mdownpour δ={}", e.momentum),
            },
            (None, SyncRule::Hardsync) => "hardsync".into(),
            (None, SyncRule::Softsync { n }) => format!("{} n={n}", self.protocol_name()),
        }
    }

    /// Softsync's `n` as reports give it: λ for async, 0 for hardsync.
    #[must_use]
    pub fn sync_n(&self) -> u32 {
        match self.cluster.protocol.rule {
            SyncRule::Hardsync => 0,
            SyncRule::Softsync { n } => n,
        }
    }

    /// The resolved configuration as TOML.
    pub fn to_toml(&self) -> Result<String, RuntimeError> {
        toml::to_string_pretty(&self.raw).map_err(|e| RuntimeError::Config(e.to_string()))
    }
}

impl DataSource {
    /// The directory, looked up relative to the working directory first and then to the
    /// source tree the binary was built from (so the shipped MNIST is found from anywhere).
    fn resolve_dir(&self) -> PathBuf {
        if self.dir.is_absolute() || self.dir.exists() {
            return self.dir.clone();
        }
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(&self.dir);
        if shipped.exists() { shipped } else { self.dir.clone() }
    }

    /// Read the training and test sets.
    pub fn load(&self) -> Result<TrainingData, RuntimeError> {
        let dir = self.resolve_dir();
        if !dir.is_dir() {
            return Err(invalid(
                "training.data_dir",
                format!("{} is not a directory with {}", self.dir.display(), self.kind.files()),
            ));
        }
        let (train, test) = match self.kind {
            DatasetKind::Mnist | DatasetKind::FashionMnist => rudra_compute::data::load_mnist(&dir)?,
            DatasetKind::Cifar10 => rudra_compute::data::load_cifar10(&dir)?,
        };
        let cut = |set: rudra_compute::Dataset, n: Option<usize>| {
            Arc::new(n.map_or_else(|| set.clone(), |n| set.head(n)))
        };
        Ok(TrainingData { train: cut(train, self.train_examples), test: cut(test, self.test_examples) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(set: &[&str]) -> Result<Config, RuntimeError> {
        Config::load(None, &set.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_the_shipped_default_config() {
        let c = load(&[]).unwrap();
        assert_eq!(c.cluster.learners, 4);
        assert_eq!(c.cluster.shards, 2);
        assert_eq!(c.cluster.protocol.rule, SyncRule::Softsync { n: 4 });
        assert_eq!(c.cluster.protocol.modulation, LrModulation::PerGradient);
        assert_eq!(c.cluster.model.hidden, vec![256]);
        assert_eq!(c.cluster.batch_size, 32);
        assert_eq!(c.cluster.protocol.max_staleness, None);
    }

    #[test]
    fn set_overrides_with_typed_values() {
        let c = load(&[
            "protocol.kind=hardsync",
            "training.hidden=[64, 32]",
            "training.learning_rate=0.05",
            "protocol.max_staleness=3",
            "protocol.lr_modulation=mean",
        ])
        .unwrap();
        assert_eq!(c.cluster.protocol.rule, SyncRule::Hardsync);
        assert_eq!(c.cluster.model.hidden, vec![64, 32]);
        assert_eq!(c.cluster.schedule.base, 0.05);
        assert_eq!(c.cluster.protocol.max_staleness, Some(3));
        assert_eq!(c.cluster.protocol.modulation, LrModulation::Mean);
        let a = load(&["protocol.kind=async", "cluster.learners=6"]).unwrap();
        assert_eq!(a.cluster.protocol.rule, SyncRule::Softsync { n: 6 });
        let twice = load(&["training.epochs=1", "training.epochs=3"]).unwrap();
        assert_eq!(twice.cluster.epochs, 3, "the last --set of a key wins");
    }

    #[test]
    fn elastic_protocols_take_the_papers_defaults() {
        let e = |set: &[&str]| load(set).unwrap().cluster.protocol.elastic.expect("an elastic protocol");
        let easgd = e(&["protocol.kind=easgd", "cluster.learners=6"]);
        assert_eq!(easgd.method, ElasticMethod::Easgd { sync: false });
        assert_eq!((easgd.tau, easgd.beta), (10, 0.9));
        assert!((easgd.alpha - 0.9 / 6.0).abs() < 1e-7, "α = β / λ");
        let sync =
            e(&["protocol.kind=easgd", "protocol.sync=true", "protocol.alpha=0.25", "protocol.beta=1"]);
        assert_eq!((sync.method, sync.alpha, sync.beta), (ElasticMethod::Easgd { sync: true }, 0.25, 1.0));
        assert_eq!(e(&["protocol.kind=eamsgd"]).momentum, 0.99);
        assert_eq!(e(&["protocol.kind=downpour"]).tau, 1);
        let gamma = e(&["protocol.kind=mdownpour", "training.lr_decay_gamma=0.5"]);
        assert_eq!((gamma.method, gamma.lr_decay_gamma), (ElasticMethod::MDownpour, 0.5));
        assert_eq!(load(&[]).unwrap().cluster.protocol.elastic, None);
    }

    /// The key an invalid configuration's error names (or its message).
    fn key_of(set: &[&str]) -> String {
        match load(set) {
            Err(RuntimeError::Invalid { key, .. }) => key.to_string(),
            Err(RuntimeError::Config(m)) => m,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn models_datasets_and_devices() {
        let c = load(&["training.model=cnn", "compute.device=wgpu"]).unwrap();
        assert_eq!(c.cluster.model, ModelSpec::cnn());
        assert_eq!(c.device, DeviceKind::Wgpu);
        assert_eq!(c.data.dir, PathBuf::from("data/mnist"));
        let f = load(&["training.dataset=fashion-mnist", "training.model=cnn"]).unwrap();
        assert_eq!(
            (f.data.kind, f.data.dir),
            (DatasetKind::FashionMnist, "/usr/share/datasets/fashion-mnist".into())
        );
        let cifar = ["training.dataset=cifar10", "training.data_dir=/data/cifar"];
        assert_eq!(load(&cifar).unwrap().cluster.model.inputs, 3072, "an mlp on colour images");
        let net = load(&[cifar[0], cifar[1], "training.model=cifar10-net"]).unwrap();
        assert_eq!(net.cluster.model.layout().len, 89_578);
        assert_eq!(key_of(&["training.dataset=cifar10"]), "training.data_dir", "cifar10 has no default");
        assert_eq!(key_of(&[cifar[0], cifar[1], "training.model=cnn"]), "training.model");
        assert_eq!(key_of(&["training.model=cifar10-net"]), "training.model");
        assert_eq!(key_of(&["training.dataset=imagenet"]), "training.dataset");
    }

    #[test]
    fn cifar10_is_read_from_its_binary_files() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "data_batch_1.bin",
            "data_batch_2.bin",
            "data_batch_3.bin",
            "data_batch_4.bin",
            "data_batch_5.bin",
        ];
        for (i, name) in names.iter().chain(&["test_batch.bin"]).enumerate() {
            // Two records: label, then 3072 pixel bytes.
            let bytes: Vec<u8> =
                (0..2).flat_map(|r| std::iter::once((i + r) as u8).chain([128; 3072])).collect();
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let set = format!("training.data_dir={}", dir.path().display());
        let c = load(&["training.dataset=cifar10", &set, "training.model=cifar10-net"]).unwrap();
        let data = c.data.load().unwrap();
        assert_eq!((data.train.len(), data.test.len(), data.test.features()), (10, 2, 3072));
        std::fs::write(dir.path().join("test_batch.bin"), [0u8; 100]).unwrap();
        let err = c.data.load().unwrap_err().to_string();
        assert!(err.contains("test_batch.bin") && err.contains("3073-byte"), "{err}");
    }

    #[test]
    fn fashion_mnist_is_read_from_the_debian_package() {
        let c = load(&["training.dataset=fashion-mnist"]).unwrap();
        if !c.data.dir.is_dir() {
            eprintln!("skipped: {} is missing (apt-get install dataset-fashion-mnist)", c.data.dir.display());
            return;
        }
        let data = c.data.load().unwrap();
        assert_eq!((data.train.len(), data.test.len()), (60_000, 10_000));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        data.test.gather(&(0..10_000).collect::<Vec<u32>>(), &mut x, &mut y);
        assert!((0..10).all(|class| y.iter().filter(|&&l| l == class).count() == 1000));
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64 * 255.0;
        assert!((mean - 73.1).abs() < 1.0, "mean test pixel {mean}");
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(key_of(&["protocol.kind=paxos"]), "protocol.kind");
        for (set, key) in [
            ("protocol.tau=0", "protocol.tau"),
            ("protocol.alpha=0", "protocol.alpha"),
            ("protocol.alpha=-1", "protocol.alpha"),
            ("protocol.alpha=nan", "protocol.alpha"),
            ("protocol.beta=0", "protocol.beta"),
            ("protocol.beta=inf", "protocol.beta"),
            ("protocol.momentum=1", "protocol.momentum"),
            ("training.lr_decay_gamma=-1", "training.lr_decay_gamma"),
        ] {
            let got = match load(&["protocol.kind=easgd", set]) {
                Err(RuntimeError::Actor(rudra_actors::ActorError::Spec { key, .. })) => key,
                other => panic!("{set}: expected an error naming {key}, got {other:?}"),
            };
            assert_eq!(got, key, "{set}");
        }
        assert!(load(&["protocol.kind=mdownpour", "protocol.tau=2"]).is_err(), "MDOWNPOUR has τ = 1");
        let wide = load(&["protocol.kind=easgd", "protocol.alpha=1.5", "protocol.beta=1.95"]).unwrap();
        let e = wide.cluster.protocol.elastic.unwrap();
        assert_eq!((e.alpha, e.beta), (1.5, 1.95), "α and β above 1 are points of the stability analysis");
        assert_eq!(key_of(&["training.target_accuracy=1.5"]), "training.target_accuracy");
        assert_eq!(key_of(&["protocol.lr_modulation=cubic"]), "protocol.lr_modulation");
        assert_eq!(key_of(&["training.model=resnet"]), "training.model");
        assert_eq!(key_of(&["compute.device=tpu"]), "compute.device");
        assert!(key_of(&["training.batch_size=-3"]).contains("batch_size"));
        assert!(key_of(&["training.bogus=1"]).contains("bogus"));
        assert!(key_of(&["nonsense"]).contains("section.key=value"));
    }

    #[test]
    fn missing_file_and_missing_dataset_are_clear() {
        assert!(matches!(Config::load(Some(Path::new("/no/such.toml")), &[]), Err(RuntimeError::Config(_))));
        let c = load(&["training.data_dir=/no/such/dir"]).unwrap();
        assert!(matches!(c.data.load(), Err(RuntimeError::Invalid { key: "training.data_dir", .. })));
    }
}
