//! The configuration as written: [`RawConfig`], layered from the built-in defaults, a TOML
//! file, the `RUDRA__…` environment and `--set` flags by the `config` crate. Nothing past
//! [`super::Config`]'s validation reads it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::DEFAULT_TOML;
use crate::RuntimeError;
use crate::simulate::RawSimulation;
use crate::study::settings::RawStudy;

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
    /// `[study]`, read by `rudra-node study` only.
    #[serde(default)]
    pub study: RawStudy,
    /// `[faults]`: faults to inject (none by default).
    #[serde(default)]
    pub faults: RawFaults,
    /// `[checkpoint]`: the shards' checkpoints.
    #[serde(default)]
    pub checkpoint: RawCheckpoint,
    /// `[transport]`: how payloads travel.
    #[serde(default)]
    pub transport: RawTransport,
}

/// `[transport]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTransport {
    /// `f32 | bf16 | fp16 | int8 | topk`: gradients and what adds up like them.
    pub gradient_codec: String,
    /// `f32 | bf16 | fp16 | int8`: weights and centers.
    pub weight_codec: String,
    /// Values per scale of `fp16`, `int8` and `topk`.
    pub codec_block: u32,
    /// `topk`: the fraction of each block sent, (0, 1].
    pub topk_fraction: f64,
}

impl Default for RawTransport {
    fn default() -> Self {
        Self {
            gradient_codec: "f32".into(),
            weight_codec: "f32".into(),
            codec_block: 256,
            topk_fraction: 0.02,
        }
    }
}

/// `[checkpoint]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCheckpoint {
    /// Each shard writes a checkpoint after every this many updates (0: none).
    pub every_updates: u64,
    /// Where (default: `checkpoints/` in the run directory of `local`, or in a shard
    /// process's working directory; a shard started with `--resume DIR` uses DIR).
    pub dir: Option<PathBuf>,
}

impl Default for RawCheckpoint {
    fn default() -> Self {
        Self { every_updates: 500, dir: None }
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
    /// Learner groups whose gradients are aggregated on the way to a shard (default 1: none).
    #[serde(default = "one")]
    pub groups: u32,
    /// Each group runs hardsync rounds of its own and pushes their means (default false).
    #[serde(default)]
    pub hierarchical: bool,
    /// With hierarchical groups, n-softsync among a group's members (default 1: hardsync).
    #[serde(default = "one")]
    pub group_n: u32,
}

fn one() -> u32 {
    1
}

/// `[protocol]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProtocol {
    /// `hardsync | softsync | async | easgd | eamsgd | downpour | mdownpour | diloco`.
    pub kind: String,
    /// Softsync splitting parameter.
    pub n: u32,
    /// `none | per-gradient | mean`.
    pub lr_modulation: String,
    /// Optional staleness bound.
    pub max_staleness: Option<u64>,
    /// Hardsync: backup learners (default 0).
    #[serde(default)]
    pub backups: u32,
    /// Softsync and async: gradients a learner may push ahead of its answers (default 0).
    #[serde(default)]
    pub prefetch: u32,
    /// Hardsync, sync EASGD, sync DiLoCo: the quorum q that may close a round (default 0: none).
    #[serde(default)]
    pub quorum: u32,
    /// With a quorum: `fold | drop` what arrives for a round already closed (default fold).
    pub late: Option<String>,
    /// With a quorum: the grace window's cap in milliseconds (default 50).
    pub grace_max_ms: Option<u64>,
    /// EASGD and DiLoCo: synchronous rounds (default false for EASGD, true for DiLoCo).
    pub sync: Option<bool>,
    /// EASGD family: communication period τ (default 10 for EASGD/EAMSGD/DiLoCo, 1 for
    /// DOWNPOUR).
    pub tau: Option<u64>,
    /// EASGD family: moving rate α (default β / λ).
    pub alpha: Option<f32>,
    /// EASGD family: center rate β (default 0.9).
    pub beta: Option<f32>,
    /// EAMSGD and MDOWNPOUR: Nesterov momentum δ (default 0.99; 0.9 for MDOWNPOUR).
    pub momentum: Option<f32>,
    /// DiLoCo: outer learning rate η_o (default 0.7).
    pub outer_lr: Option<f32>,
    /// DiLoCo: outer Nesterov momentum μ_o (default 0.9).
    pub outer_momentum: Option<f32>,
    /// DiLoCo: streaming fragments F (default 1).
    pub fragments: Option<u64>,
}

/// `[training]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraining {
    /// `mnist | fashion-mnist | cifar10 | external`.
    pub dataset: String,
    /// Directory of the dataset files; MNIST and Fashion-MNIST have defaults, CIFAR-10 has
    /// none.
    pub data_dir: Option<PathBuf>,
    /// Use only the first N training examples (0 = all).
    pub train_examples: usize,
    /// Use only the first N test examples (0 = all).
    pub test_examples: usize,
    /// `softmax | mlp | cnn | cifar10-net | external`.
    pub model: String,
    /// `model = "external"`: its initial weights, a safetensors file whose tensors, in file
    /// order, make the flat parameter vector.
    pub init: Option<PathBuf>,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// μ.
    pub batch_size: usize,
    /// μλ: when above 0, μ = this / λ (rounded, at least 1) in place of `batch_size`, so
    /// learners added share the same global minibatch.
    pub global_batch_size: usize,
    /// `fixed | adaptive` (default fixed): adaptive gives each learner a minibatch that follows
    /// its speed, summing to μλ.
    pub batch_sizing: Option<String>,
    /// α0.
    pub learning_rate: Option<f32>,
    /// Per-epoch multiplier of α0.
    pub lr_decay: f32,
    /// Test-set evaluations per epoch.
    pub evals_per_epoch: u32,
    /// The accuracy whose time to reach the summary reports.
    pub target_accuracy: f64,
    /// EASGD family: γ in `η_t = η / (1 + γ t)^0.5` on each learner's clock (0 = off).
    pub lr_decay_gamma: f32,
    /// Learners' local optimizer (EASGD, DOWNPOUR, DiLoCo): `sgd | momentum | adamw`.
    #[serde(default = "sgd")]
    pub optimizer: String,
    /// `momentum`: μ (default 0.9).
    pub momentum: Option<f32>,
    /// `adamw`: β1 (default 0.9).
    pub beta1: Option<f32>,
    /// `adamw`: β2 (default 0.999).
    pub beta2: Option<f32>,
    /// `adamw`: ε (default 1e-8).
    pub eps: Option<f32>,
    /// `adamw`: decoupled weight decay w (default 0.01).
    pub weight_decay: Option<f32>,
    /// Passes over each learner's partition.
    pub epochs: u32,
    /// Seed of weights, partitions and shuffles.
    pub seed: u64,
}

/// `training.optimizer`'s default.
fn sgd() -> String {
    "sgd".into()
}

/// `[compute]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompute {
    /// `auto | cpu | cuda | wgpu`.
    pub device: String,
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
    /// `[[faults.kill]]`
    pub kill: Vec<RawKill>,
    /// `[[faults.panic]]`
    pub panic: Vec<RawPanic>,
}

/// `[[faults.panic]]`: a shard or learner process whose actor panics, as a bug would: the
/// process ends (exit code 70) and its peers find it gone.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPanic {
    /// `shard-N` or `learner-N`.
    pub node: String,
    /// When, milliseconds after the node joined.
    pub at_ms: u64,
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

/// `[[faults.kill]]`: a process of the run killed by `rudra-node experiment` (SIGKILL), and
/// perhaps started again with the command it had.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKill {
    /// `scheduler`, `shard-N` or `learner-N`.
    pub node: String,
    /// When, milliseconds after the run started (the scheduler gathered its nodes).
    pub at_ms: u64,
    /// Started again this many milliseconds after it was killed (none: it stays down).
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

/// A configuration file larger than this is refused before it is read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The text of the configuration file `path`: a regular file of at most [`MAX_FILE_BYTES`].
fn read_file(path: &Path) -> Result<String, RuntimeError> {
    use std::io::Read;
    let refuse = |why: String| RuntimeError::Config(format!("configuration file {}: {why}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| refuse(format!("cannot be read ({e})")))?;
    if meta.is_dir() {
        return Err(refuse("is a directory; give a TOML file".into()));
    }
    if !meta.is_file() {
        return Err(refuse("is not a regular file; give a TOML file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(refuse(format!(
            "is {} bytes, more than the {MAX_FILE_BYTES} a configuration may hold",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| refuse(format!("cannot be read as text ({e})")))?;
    Ok(text)
}

/// `message` with every ``floating point `…` `` written briefly: serde spells 1e300 out in
/// three hundred digits.
fn short_floats(message: &str) -> String {
    const MARK: &str = "floating point `";
    let Some(start) = message.find(MARK).map(|i| i + MARK.len()) else { return message.to_owned() };
    let Some(len) = message[start..].find('`') else { return message.to_owned() };
    match message[start..start + len].parse::<f64>() {
        Ok(v) if v.is_finite() && v.abs() >= 1e15 => {
            format!("{}{v:e}{}", &message[..start], short_floats(&message[start + len..]))
        }
        _ => message.to_owned(),
    }
}

/// The key written on the line of `text` that holds byte `at`, with the table it is in
/// (`section.key`): what a TOML parse error points into. `None` where that line holds no key.
fn key_at(text: &str, at: usize) -> Option<String> {
    let start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let key = line.split_once('=')?.0.trim();
    let table = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    (!key.is_empty()).then(|| table.map_or_else(|| key.to_owned(), |t| format!("{t}.{key}")))
}

impl RawConfig {
    /// Layer the sources: built-in defaults, `file`, the `RUDRA__…` environment, `overrides`.
    /// Values keep the types they were written with: a fraction, NaN or a number out of range
    /// for an integer key is an error naming the key, never rounded or saturated.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, RuntimeError> {
        use config::{Environment, File, FileFormat};
        let mut builder =
            config::Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            let text = read_file(path)?;
            toml::from_str::<toml::Table>(&text).map_err(|e| {
                let key = e.span().and_then(|at| key_at(&text, at.start));
                let key = key.map(|k| format!(" (key `{k}`)")).unwrap_or_default();
                RuntimeError::Config(format!("configuration file {}{key}: {e}", path.display()))
            })?;
            builder = builder.add_source(File::from_str(&text, FileFormat::Toml));
        }
        builder = builder.add_source(
            Environment::with_prefix("RUDRA").prefix_separator("__").separator("__").try_parsing(true),
        );
        // One source per override, so that a later one of the same key wins.
        for o in overrides {
            builder = builder.add_source(File::from_str(&override_line(o)?, FileFormat::Toml));
        }
        // The `config` crate merges the sources; serde then reads the merged values with their
        // own types (the crate's own deserializer would round 4.5 to 5 and NaN to 0).
        let merged: toml::Value = builder
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        serde_path_to_error::deserialize(merged).map_err(|e| {
            RuntimeError::Config(format!("`{}`: {}", e.path(), short_floats(&e.inner().to_string())))
        })
    }
}
