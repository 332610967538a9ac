//! Run configuration: defaults < TOML file < `RUDRA__SECTION__KEY` environment <
//! `--set section.key=value`, read by the `config` crate into [`RawConfig`] and turned once
//! into the typed [`Config`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rudra_actors::protocol::{LrModulation, LrSchedule, SyncRule};
use rudra_actors::{ClusterSpec, ProtocolSpec, TrainingData};
use rudra_compute::{DeviceKind, ModelSpec};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;

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
}

/// `[cluster]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// λ.
    pub learners: u32,
    /// Parameter shards.
    pub shards: u32,
}

/// `[protocol]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProtocol {
    /// `hardsync | softsync | async`.
    pub kind: String,
    /// Softsync splitting parameter.
    pub n: u32,
    /// `none | per-gradient | mean`.
    pub lr_modulation: String,
    /// Optional staleness bound.
    pub max_staleness: Option<u64>,
}

/// `[training]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraining {
    /// `mnist` (also reads Fashion-MNIST, same format, from another `data_dir`).
    pub dataset: String,
    /// Directory of the dataset files.
    pub data_dir: PathBuf,
    /// Use only the first N training examples (0 = all).
    pub train_examples: usize,
    /// Use only the first N test examples (0 = all).
    pub test_examples: usize,
    /// `mlp | softmax`.
    pub model: String,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// μ.
    pub batch_size: usize,
    /// α0.
    pub learning_rate: f32,
    /// Per-epoch multiplier of α0.
    pub lr_decay: f32,
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

/// Where the examples come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSource {
    /// Directory with the IDX files.
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
        let rule = match p.kind.as_str() {
            "hardsync" => SyncRule::Hardsync,
            "softsync" => SyncRule::Softsync { n: p.n },
            "async" => SyncRule::Softsync { n: raw.cluster.learners },
            other => {
                return Err(invalid(
                    "protocol.kind",
                    format!("{other:?} is not one of hardsync, softsync, async"),
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
        if t.dataset != "mnist" {
            return Err(invalid(
                "training.dataset",
                format!("{:?} is not a known dataset (mnist)", t.dataset),
            ));
        }
        let hidden = match t.model.as_str() {
            "mlp" if t.hidden.is_empty() || t.hidden.contains(&0) => {
                return Err(invalid("training.hidden", "an mlp needs one or more non-zero layer widths"));
            }
            "mlp" => t.hidden.clone(),
            "softmax" => Vec::new(),
            other => return Err(invalid("training.model", format!("{other:?} is not one of mlp, softmax"))),
        };
        let device = raw.compute.device.parse().map_err(|e| invalid("compute.device", e))?;
        let cluster = ClusterSpec {
            learners: raw.cluster.learners,
            shards: raw.cluster.shards,
            protocol: ProtocolSpec { rule, modulation, max_staleness: p.max_staleness },
            model: ModelSpec::dense(28 * 28, hidden, 10),
            batch_size: t.batch_size,
            epochs: t.epochs,
            schedule: LrSchedule { base: t.learning_rate, decay: t.lr_decay },
            seed: t.seed,
        };
        let data = DataSource {
            dir: t.data_dir.clone(),
            train_examples: (t.train_examples > 0).then_some(t.train_examples),
            test_examples: (t.test_examples > 0).then_some(t.test_examples),
        };
        Ok(Self { cluster, data, device, raw })
    }
}

impl Config {
    /// Load and validate, see [`RawConfig::load`].
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, RuntimeError> {
        RawConfig::load(file, overrides)?.try_into()
    }

    /// Protocol name for reports: `hardsync`, `softsync` or `async`.
    #[must_use]
    pub fn protocol_name(&self) -> &str {
        &self.raw.protocol.kind
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
                format!("{} is not a directory with the MNIST IDX files", self.dir.display()),
            ));
        }
        let (train, test) = rudra_compute::data::load_mnist(&dir)?;
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
    fn bad_values_name_their_key() {
        let key_of = |set: &[&str]| match load(set) {
            Err(RuntimeError::Invalid { key, .. }) => key.to_string(),
            Err(RuntimeError::Config(m)) => m,
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(key_of(&["protocol.kind=paxos"]), "protocol.kind");
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
