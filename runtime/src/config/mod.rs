//! Run configuration: defaults < TOML file < `RUDRA__SECTION__KEY` environment <
//! `--set section.key=value`, read by the `config` crate into [`RawConfig`] and turned once,
//! through [`TryFrom`], into the typed [`Config`]; nothing downstream reads the raw form.

mod data;
mod faults;
mod keys;
mod model;
mod raw;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use data::{DataSource, DatasetKind};
pub use faults::Kill;
pub use model::{ModelKind, ModelSource};
pub use raw::{
    RawCheckpoint, RawCluster, RawCompute, RawConfig, RawCrash, RawFaults, RawKill, RawLinkRule,
    RawPartition, RawProtocol, RawSlow, RawTraining, RawTransport,
};
use rudra_actors::checkpoint::Checkpoints;
use rudra_actors::faults::{FaultPlan, Liveness};
use rudra_actors::spec::backups_belong_to_hardsync;
use rudra_actors::{ClusterSpec, ElasticMethod, ElasticSpec, InvalidSetting, Models, ProtocolSpec, SgdSpec};
use rudra_compute::{Device, DeviceKind};
use rudra_proto::{LrModulation, LrSchedule, OptimizerSpec, SyncRule};

use crate::RuntimeError;
use crate::simulate::Simulation;
use crate::study::settings::Study;

/// The built-in defaults: `configs/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");

/// `protocol.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolKind {
    /// Rudra's hardsync.
    Hardsync,
    /// n-softsync.
    Softsync,
    /// Softsync with n = λ.
    Async,
    /// Elastic averaging SGD (sync or async).
    Easgd,
    /// EASGD with Nesterov momentum at the learners.
    Eamsgd,
    /// DOWNPOUR.
    Downpour,
    /// DOWNPOUR with momentum at the shards.
    MDownpour,
    /// DiLoCo: local training, an outer Nesterov step at the shards.
    Diloco,
}

impl ProtocolKind {
    /// Every protocol, Rudra's first.
    pub const ALL: [Self; 8] = [
        Self::Hardsync,
        Self::Softsync,
        Self::Async,
        Self::Easgd,
        Self::Eamsgd,
        Self::Downpour,
        Self::MDownpour,
        Self::Diloco,
    ];

    /// The name in the configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hardsync => "hardsync",
            Self::Softsync => "softsync",
            Self::Async => "async",
            Self::Easgd => "easgd",
            Self::Eamsgd => "eamsgd",
            Self::Downpour => "downpour",
            Self::MDownpour => "mdownpour",
            Self::Diloco => "diloco",
        }
    }

    fn parse(name: &str) -> Result<Self, RuntimeError> {
        one_of("protocol.kind", name, &Self::ALL, Self::as_str)
    }

    /// The kind of protocol `p`.
    #[must_use]
    pub fn of(p: &ProtocolSpec) -> Self {
        match p {
            ProtocolSpec::Sgd(s) => match s.rule {
                SyncRule::Hardsync => Self::Hardsync,
                SyncRule::Softsync { .. } => Self::Softsync,
                SyncRule::Async => Self::Async,
            },
            ProtocolSpec::Elastic(e) => match e.method {
                ElasticMethod::Easgd { .. } => Self::Easgd,
                ElasticMethod::Eamsgd => Self::Eamsgd,
                ElasticMethod::Downpour => Self::Downpour,
                ElasticMethod::MDownpour => Self::MDownpour,
                ElasticMethod::Diloco { .. } => Self::Diloco,
            },
        }
    }

    /// α0 (η for the EASGD family) when `training.learning_rate` is not set: the rate at which
    /// the protocol trains the default model at the default λ. With momentum δ the effective
    /// step is η / (1 − δ), so the momentum methods start lower.
    #[must_use]
    pub fn default_learning_rate(self) -> f32 {
        match self {
            Self::Eamsgd => 0.01,
            Self::MDownpour => 0.02,
            Self::Diloco => 0.05,
            _ => 0.2,
        }
    }

    /// δ when `protocol.momentum` is not set (read by EAMSGD and MDOWNPOUR).
    #[must_use]
    pub fn default_momentum(self) -> f32 {
        match self {
            Self::MDownpour => 0.9,
            _ => 0.99,
        }
    }
}

/// `[checkpoint]`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Each shard writes a checkpoint after every this many updates (0: none).
    pub every_updates: u64,
    /// Where, if set (else the run directory's `checkpoints/`, or a shard process's own).
    pub dir: Option<PathBuf>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster and training settings.
    pub cluster: ClusterSpec,
    /// The network trained.
    pub model: ModelSource,
    /// `training.model`.
    pub model_kind: ModelKind,
    /// The dataset.
    pub data: DataSource,
    /// The learners' compute device.
    pub device: DeviceKind,
    /// Heartbeats, retries and the failure timeout.
    pub liveness: Liveness,
    /// Faults to inject.
    pub faults: FaultPlan,
    /// Processes `rudra-node experiment` kills (`[[faults.kill]]`).
    pub kills: Vec<Kill>,
    /// The simulator's settings.
    pub simulation: Simulation,
    /// A study's axes and seeds (`rudra-node study`).
    pub study: Study,
    /// The shards' checkpoints.
    pub checkpoint: CheckpointSettings,
    /// `summary.json` reports the time and updates to reach this test accuracy.
    pub target_accuracy: f64,
    /// The configuration as resolved, TOML, for the run directory and the nodes of a run.
    resolved: String,
}

fn invalid(key: &'static str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Invalid(InvalidSetting::new(key, message))
}

/// The largest minibatch a learner takes.
pub const MAX_BATCH: usize = 1 << 20;
/// `value`, refused when it is an empty path.
fn non_empty(key: &'static str, value: Option<PathBuf>) -> Result<Option<PathBuf>, RuntimeError> {
    match value {
        Some(p) if p.as_os_str().is_empty() => {
            Err(invalid(key, "is empty; give a directory or leave the key out"))
        }
        other => Ok(other),
    }
}

/// The one of `all` named `name`, or an error for `key` listing the names.
fn one_of<T: Copy>(
    key: &'static str,
    name: &str,
    all: &[T],
    as_str: fn(T) -> &'static str,
) -> Result<T, RuntimeError> {
    all.iter().copied().find(|&k| as_str(k) == name).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&k| as_str(k)).collect();
        invalid(key, format!("{name:?} is not one of {}", names.join(", ")))
    })
}

impl TryFrom<RawConfig> for Config {
    type Error = RuntimeError;

    fn try_from(raw: RawConfig) -> Result<Self, RuntimeError> {
        let p = &raw.protocol;
        let kind = ProtocolKind::parse(&p.kind)?;
        keys::check_every_protocol_key(&raw)?;
        let optimizer = keys::optimizer(&raw.training)?;
        let quorum = keys::quorum(&raw)?;
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
        let elastic = |method| {
            let default_tau = if matches!(
                method,
                ElasticMethod::Easgd { .. } | ElasticMethod::Eamsgd | ElasticMethod::Diloco { .. }
            ) {
                10
            } else {
                1
            };
            let beta = p.beta.unwrap_or(0.9);
            ProtocolSpec::Elastic(ElasticSpec {
                method,
                tau: p.tau.unwrap_or(default_tau),
                alpha: p.alpha.unwrap_or(beta / raw.cluster.learners.max(1) as f32),
                beta,
                momentum: p.momentum.unwrap_or(kind.default_momentum()),
                lr_decay_gamma: raw.training.lr_decay_gamma,
                outer_lr: p.outer_lr.unwrap_or(0.7),
                outer_momentum: p.outer_momentum.unwrap_or(0.9),
                optimizer,
                fragments: p.fragments.unwrap_or(1),
                modulation,
                max_staleness: p.max_staleness,
                quorum,
            })
        };
        let sgd = |rule| {
            ProtocolSpec::Sgd(SgdSpec {
                rule,
                modulation,
                max_staleness: p.max_staleness,
                backups: p.backups,
                prefetch: p.prefetch,
                quorum,
            })
        };
        let protocol = match kind {
            ProtocolKind::Hardsync => sgd(SyncRule::Hardsync),
            ProtocolKind::Softsync => sgd(SyncRule::Softsync { n: p.n }),
            ProtocolKind::Async => sgd(SyncRule::Async),
            ProtocolKind::Easgd => elastic(ElasticMethod::Easgd { sync: p.sync.unwrap_or(false) }),
            ProtocolKind::Diloco => elastic(ElasticMethod::Diloco { sync: p.sync.unwrap_or(true) }),
            ProtocolKind::Eamsgd => elastic(ElasticMethod::Eamsgd),
            ProtocolKind::Downpour => elastic(ElasticMethod::Downpour),
            ProtocolKind::MDownpour => elastic(ElasticMethod::MDownpour),
        };
        if let ProtocolSpec::Elastic(_) = protocol {
            if p.backups > 0 {
                return Err(invalid("protocol.backups", backups_belong_to_hardsync(p.backups)));
            }
            if p.prefetch > 0 {
                return Err(invalid(
                    "protocol.prefetch",
                    format!(
                        "is {}; it is for hardsync, softsync and async, whose learners wait on every step \
                         (the EASGD family already exchanges only every τ steps)",
                        p.prefetch
                    ),
                ));
            }
        }
        if let ProtocolSpec::Sgd(_) = protocol
            && optimizer != OptimizerSpec::Sgd
        {
            return Err(invalid(
                "training.optimizer",
                format!(
                    "is {:?}; a local optimizer is for easgd, downpour and diloco, whose learners step on their own \
                     ({} applies gradients at the shards)",
                    raw.training.optimizer, p.kind
                ),
            ));
        }
        let t = &raw.training;
        if !(t.target_accuracy > 0.0 && t.target_accuracy <= 1.0) {
            return Err(invalid(
                "training.target_accuracy",
                format!("is {}; it must be in (0, 1]", t.target_accuracy),
            ));
        }
        let dataset = DatasetKind::parse(&t.dataset)?;
        let model_kind = ModelKind::parse(&t.model)?;
        let model = ModelSource::configured(model_kind, dataset, t)?;
        let device = raw.compute.device.parse().map_err(|e| invalid("compute.device", e))?;
        let batch_size = match t.global_batch_size {
            0 => t.batch_size,
            global => ((global as f64 / f64::from(raw.cluster.learners.max(1))).round() as usize).max(1),
        };
        let cluster = ClusterSpec {
            learners: raw.cluster.learners,
            shards: raw.cluster.shards,
            protocol,
            batch_size,
            epochs: t.epochs,
            schedule: LrSchedule {
                base: t.learning_rate.unwrap_or(kind.default_learning_rate()),
                decay: t.lr_decay,
            },
            seed: t.seed,
            evals_per_epoch: t.evals_per_epoch,
            codecs: keys::codecs(&raw.transport)?,
            batch_sizing: keys::batch_sizing(t)?,
            groups: raw.cluster.groups,
            hierarchical: raw.cluster.hierarchical,
            group_n: raw.cluster.group_n,
        };
        if batch_size > MAX_BATCH {
            return Err(invalid("training.batch_size", format!("is {batch_size}; at most {MAX_BATCH}")));
        }
        let data = DataSource {
            kind: dataset,
            dir: non_empty("training.data_dir", t.data_dir.clone())?
                .map_or_else(|| dataset.default_dir(), Ok)?,
            train_examples: (t.train_examples > 0).then_some(t.train_examples),
            test_examples: (t.test_examples > 0).then_some(t.test_examples),
        };
        // Settings checks that need no data, once for every command; the data-dependent ones
        // run where the data is loaded.
        cluster.validate_settings(model.param_count())?;
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
        let elastic = cluster.protocol.elastic().is_some();
        let checkpoint = CheckpointSettings {
            every_updates: raw.checkpoint.every_updates,
            dir: non_empty("checkpoint.dir", raw.checkpoint.dir.clone())?,
        };
        let checkpoints = checkpoint.every_updates > 0;
        let faults = raw.faults.plan(cluster.learners, cluster.shards, elastic, checkpoints)?;
        let kills = raw.faults.kills(cluster.learners, cluster.shards, elastic, checkpoints)?;
        let resolved = toml::to_string_pretty(&raw).map_err(|e| RuntimeError::Config(e.to_string()))?;
        Ok(Self {
            cluster,
            model,
            model_kind,
            data,
            device,
            liveness,
            faults,
            kills,
            simulation,
            study: raw.study.study()?,
            checkpoint,
            target_accuracy: t.target_accuracy,
            resolved,
        })
    }
}

impl Config {
    /// Load and validate, see [`RawConfig::load`].
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, RuntimeError> {
        RawConfig::load(file, overrides)?.try_into()
    }

    /// Validate a configuration given as TOML text (as the scheduler hands it to its nodes).
    pub fn from_toml(text: &str) -> Result<Self, RuntimeError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| RuntimeError::Config(e.to_string()))?;
        raw.try_into()
    }

    /// This configuration without its `[faults]`: the clean run beside a faulty one.
    pub fn without_faults(&self) -> Result<Self, RuntimeError> {
        self.with_faults_changed(|f| *f = RawFaults::default())
    }

    /// This configuration without its `[[faults.kill]]`: what the processes of an experiment
    /// run, the experiment killing them.
    pub fn without_kills(&self) -> Result<Self, RuntimeError> {
        self.with_faults_changed(|f| f.kill.clear())
    }

    fn with_faults_changed(&self, change: impl FnOnce(&mut RawFaults)) -> Result<Self, RuntimeError> {
        let mut raw: RawConfig =
            toml::from_str(&self.resolved).map_err(|e| RuntimeError::Config(e.to_string()))?;
        change(&mut raw.faults);
        raw.try_into()
    }

    /// Refuse `[[faults.kill]]` where no processes are killed: in one process, or a scheduler
    /// started by hand.
    pub fn refuse_kills(&self) -> Result<(), RuntimeError> {
        if self.kills.is_empty() {
            return Ok(());
        }
        Err(invalid(
            "faults.kill",
            "kills processes, which `rudra-node experiment --config FILE` does; run the scenario with it",
        ))
    }

    /// Refuse `[[faults.panic]]` in a run of one process: a panic ends the process, so it is
    /// for the shard and learner processes of a distributed run.
    pub fn refuse_panics(&self) -> Result<(), RuntimeError> {
        if self.faults.panics.is_empty() {
            return Ok(());
        }
        Err(invalid(
            "faults.panic",
            "ends the process whose actor panics; it is for `rudra-node --role shard|learner` processes",
        ))
    }

    /// The configured network, initialised from `training.seed`, its learners computing on
    /// `device`; for an external model, its initial weights (its learners bring their own
    /// model: see [`Models::external`]).
    #[must_use]
    pub fn models(&self, device: Device) -> Models {
        match &self.model {
            ModelSource::Builtin(spec) => Models::builtin(spec, self.cluster.seed, device),
            ModelSource::External(init) => Models::external(Arc::clone(&init.params)),
        }
    }

    /// Where the shards of the run `job` write their checkpoints and how often:
    /// `checkpoint.dir` if set, else `checkpoints/` in `run_dir`; `None` when
    /// `checkpoint.every_updates` is 0 or there is no directory to write to.
    #[must_use]
    pub fn checkpoints(&self, run_dir: Option<&Path>, job: &str) -> Option<Checkpoints> {
        let dir = self.checkpoint.dir.clone().or_else(|| run_dir.map(|d| d.join("checkpoints")))?;
        self.checkpoints_in(dir, job)
    }

    /// The shards of the run `job` keep their checkpoints in `dir` (none when
    /// `checkpoint.every_updates` is 0).
    #[must_use]
    pub fn checkpoints_in(&self, dir: PathBuf, job: &str) -> Option<Checkpoints> {
        let every_updates = self.checkpoint.every_updates;
        (every_updates > 0).then(|| Checkpoints {
            dir,
            every_updates,
            job: job.to_owned(),
            learners: self.cluster.learners,
        })
    }

    /// `protocol.kind`, of the protocol built from the configuration.
    #[must_use]
    pub fn kind(&self) -> ProtocolKind {
        ProtocolKind::of(&self.cluster.protocol)
    }

    /// Protocol name for reports: `protocol.kind`.
    #[must_use]
    pub fn protocol_name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The protocol and its key settings, e.g. `softsync n=4` or `easgd τ=10 α=0.225`.
    #[must_use]
    pub fn protocol_label(&self) -> String {
        match &self.cluster.protocol {
            ProtocolSpec::Elastic(e) => match e.method {
                ElasticMethod::Easgd { sync: true } => {
                    format!("easgd sync τ={} α={} β={}", e.tau, e.alpha, e.beta)
                }
                ElasticMethod::Easgd { sync: false } => format!("easgd τ={} α={}", e.tau, e.alpha),
                ElasticMethod::Eamsgd => format!("eamsgd τ={} α={} δ={}", e.tau, e.alpha, e.momentum),
                ElasticMethod::Downpour => format!("downpour τ={}", e.tau),
                ElasticMethod::MDownpour => format!("mdownpour δ={}", e.momentum),
                ElasticMethod::Diloco { sync } => format!(
                    "diloco{} H={} η_o={} μ_o={}",
                    if sync { " sync" } else { "" },
                    e.tau,
                    e.outer_lr,
                    e.outer_momentum
                ),
            },
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Hardsync, quorum: Some(q), .. }) => {
                format!("hardsync quorum={}", q.size)
            }
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Hardsync, .. }) => "hardsync".into(),
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Softsync { n }, .. }) => format!("softsync n={n}"),
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Async, .. }) => {
                format!("async n={}", self.cluster.learners)
            }
        }
    }

    /// Softsync's `n` as reports give it: λ for async, 0 for hardsync and the EASGD family.
    #[must_use]
    pub fn sync_n(&self) -> u32 {
        match self.cluster.protocol {
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Softsync { n }, .. }) => n,
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Async, .. }) => self.cluster.learners,
            _ => 0,
        }
    }

    /// The resolved configuration as TOML.
    #[must_use]
    pub fn to_toml(&self) -> &str {
        &self.resolved
    }
}
