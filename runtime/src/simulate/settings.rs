//! The `[simulation]` section: raw as written, and typed after one validation.

use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// `[simulation]` as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSimulation {
    /// `synthetic | model`.
    pub gradients: String,
    /// Seed of every random draw the simulator makes.
    pub seed: u64,
    /// `constant | uniform | lognormal`.
    pub compute: String,
    /// Mean virtual seconds to compute one gradient.
    pub compute_seconds: f64,
    /// `uniform`: half-width as a fraction of the mean; `lognormal`: σ of the logarithm.
    pub compute_spread: f64,
    /// Fraction of learners that are stragglers.
    pub straggler_fraction: f64,
    /// How many times slower a straggler computes.
    pub straggler_factor: f64,
    /// Fraction of the learners that leave per `churn_rounds` rounds (EASGD family, DiLoCo).
    pub churn: f64,
    /// The rounds `churn` is per: a round is τ steps at the mean compute time.
    pub churn_rounds: f64,
    /// Rounds until a learner that left joins again.
    pub rejoin_rounds: f64,
    /// Seconds from send to arrival of any message, before its size is added.
    pub latency: f64,
    /// Per learner instead of `latency`, cycled over learner ids (empty: `latency` for all).
    #[serde(default)]
    pub learner_latency: Vec<f64>,
    /// Bytes per second of every learner–shard link.
    pub bandwidth: f64,
    /// Bytes per second into each shard, whatever link they come by (0: no limit).
    #[serde(default)]
    pub shard_bandwidth: f64,
    /// Extra delay of every message, uniform in `[0, jitter)` seconds.
    pub jitter: f64,
    /// Probability that a message is lost and sent again.
    pub drop_probability: f64,
    /// Seconds until a lost message is sent again.
    pub retransmit_seconds: f64,
    /// Synthetic: number of parameters.
    pub dimension: usize,
    /// Synthetic: `h` of `f(θ) = h/2 · |θ|²`.
    pub curvature: f32,
    /// Synthetic: standard deviation of the noise added to every gradient value.
    pub noise: f32,
    /// Synthetic: the initial value of every parameter.
    pub init: f32,
    /// Stop after this many gradients (0 = no limit).
    pub stop_gradients: u64,
    /// Stop after this many updates of a shard (0 = no limit).
    pub stop_updates: u64,
    /// Stop after this many virtual seconds (0 = no limit).
    pub stop_seconds: f64,
    /// A row of `loss.csv` every this many gradients.
    pub loss_every: u64,
    /// `[[simulation.sweep]]`: run once per combination of these settings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<RawSweepAxis>,
}

/// One `[[simulation.sweep]]` axis as written: `key` and a list of values, or `keys` and a list
/// of arrays, one value per key.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSweepAxis {
    /// The setting this axis varies, e.g. `protocol.n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The settings this axis varies together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// The values, in order.
    pub values: Vec<toml::Value>,
}

/// Where gradients come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GradientSource {
    /// The configured model on its dataset, as in real runs.
    Model,
    /// The noisy quadratic.
    Synthetic(Quadratic),
}

/// `f(θ) = h/2 · |θ|²`, whose gradient is observed with Gaussian noise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quadratic {
    /// Number of parameters.
    pub dimension: usize,
    /// `h`.
    pub curvature: f32,
    /// Standard deviation of the noise of every gradient value.
    pub noise: f32,
    /// Initial value of every parameter.
    pub init: f32,
}

/// The distribution of one gradient's compute time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ComputeDist {
    /// Always the mean.
    Constant,
    /// Uniform in `mean · [1 − spread, 1 + spread]`.
    Uniform {
        /// Half-width as a fraction of the mean, below 1.
        spread: f64,
    },
    /// `exp(N(ln mean − σ²/2, σ²))`, whose mean is the mean.
    LogNormal {
        /// σ of the logarithm.
        sigma: f64,
    },
}

/// How long learners compute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ComputeSpec {
    /// The distribution.
    pub dist: ComputeDist,
    /// Mean seconds per gradient of a learner that is not a straggler.
    pub mean_seconds: f64,
    /// Fraction of learners slowed down.
    pub straggler_fraction: f64,
    /// Their slow-down.
    pub straggler_factor: f64,
}

/// Learners leaving and joining again (EASGD family, DiLoCo): each present learner leaves at
/// random, at a constant rate, and joins again, from the current center, a set time later.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnSpec {
    /// Fraction of the learners that leave per `rounds` rounds.
    pub fraction: f64,
    /// The rounds `fraction` is per (a round: τ steps at the mean compute time).
    pub rounds: f64,
    /// Rounds until a learner that left joins again.
    pub rejoin_rounds: f64,
}

impl ChurnSpec {
    /// Each present learner's rate of leaving, per virtual second, and the virtual seconds
    /// until it joins again, for rounds of `round_seconds`.
    #[must_use]
    pub fn timing(&self, round_seconds: f64) -> (f64, f64) {
        (self.fraction / (self.rounds * round_seconds), self.rejoin_rounds * round_seconds)
    }
}

/// How long messages travel.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSpec {
    /// Seconds per message.
    pub latency: f64,
    /// Seconds per message on learner l's links: `learner_latency[l % len]`, or `latency` when
    /// empty.
    pub learner_latency: Vec<f64>,
    /// Bytes per second.
    pub bandwidth: f64,
    /// Bytes per second into each shard (infinite: no limit).
    pub shard_bandwidth: f64,
    /// Uniform extra delay bound, seconds.
    pub jitter: f64,
    /// Probability a message is lost (and sent again).
    pub drop_probability: f64,
    /// Delay of a resend.
    pub retransmit_seconds: f64,
}

/// When a simulation stops: whichever limit comes first.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StopSpec {
    /// Gradients computed.
    pub gradients: Option<u64>,
    /// Updates of a shard.
    pub updates: Option<u64>,
    /// Virtual seconds.
    pub seconds: Option<f64>,
}

/// One sweep axis: the keys it sets and, per step, their values as TOML literals.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepAxis {
    /// The keys.
    pub keys: Vec<String>,
    /// One row of literals per step, one per key.
    pub values: Vec<Vec<String>>,
}

impl SweepAxis {
    /// One step of the axis (a row of its values) as `key=value` overrides.
    #[must_use]
    pub fn assignments(&self, row: &[String]) -> Vec<String> {
        self.keys.iter().zip(row).map(|(k, v)| format!("{k}={v}")).collect()
    }
}

/// The validated `[simulation]` section.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// Where gradients come from.
    pub gradients: GradientSource,
    /// Seed of the simulator's random draws.
    pub seed: u64,
    /// Compute times.
    pub compute: ComputeSpec,
    /// Message times.
    pub network: NetworkSpec,
    /// Learners leaving and joining again, if they do.
    pub churn: Option<ChurnSpec>,
    /// When to stop.
    pub stop: StopSpec,
    /// Gradients between rows of `loss.csv`.
    pub loss_every: u64,
    /// Settings to sweep over; empty for a single simulation.
    pub sweep: Vec<SweepAxis>,
}

fn invalid(key: &'static str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Invalid(rudra_actors::InvalidSetting::new(key, message))
}

/// `value` must be finite and within `range`; `what` says what the range is.
fn check(key: &'static str, value: f64, ok: bool, what: &str) -> Result<f64, RuntimeError> {
    if value.is_finite() && ok {
        Ok(value)
    } else {
        Err(invalid(key, format!("is {value}; it must be {what}")))
    }
}

fn nonzero<T: PartialEq + Default>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

impl Simulation {
    /// Validate `[simulation]` as written.
    pub fn from_raw(s: &RawSimulation) -> Result<Self, RuntimeError> {
        let gradients = match s.gradients.as_str() {
            "model" => GradientSource::Model,
            "synthetic" => {
                if s.dimension == 0 {
                    return Err(invalid("simulation.dimension", "must be at least 1"));
                }
                let curvature = check("simulation.curvature", f64::from(s.curvature), true, "finite")?;
                let noise = check("simulation.noise", f64::from(s.noise), s.noise >= 0.0, "0 or more")?;
                check("simulation.init", f64::from(s.init), true, "finite")?;
                GradientSource::Synthetic(Quadratic {
                    dimension: s.dimension,
                    curvature: curvature as f32,
                    noise: noise as f32,
                    init: s.init,
                })
            }
            other => {
                return Err(invalid(
                    "simulation.gradients",
                    format!("{other:?} is not one of model, synthetic"),
                ));
            }
        };
        let spread = s.compute_spread;
        let dist = match s.compute.as_str() {
            "constant" => ComputeDist::Constant,
            "uniform" => ComputeDist::Uniform {
                spread: check(
                    "simulation.compute_spread",
                    spread,
                    (0.0..1.0).contains(&spread),
                    "in [0, 1)",
                )?,
            },
            "lognormal" => ComputeDist::LogNormal {
                sigma: check("simulation.compute_spread", spread, spread >= 0.0, "0 or more")?,
            },
            other => {
                return Err(invalid(
                    "simulation.compute",
                    format!("{other:?} is not one of constant, uniform, lognormal"),
                ));
            }
        };
        let compute = ComputeSpec {
            dist,
            mean_seconds: check(
                "simulation.compute_seconds",
                s.compute_seconds,
                s.compute_seconds > 0.0,
                "positive",
            )?,
            straggler_fraction: check(
                "simulation.straggler_fraction",
                s.straggler_fraction,
                (0.0..=1.0).contains(&s.straggler_fraction),
                "in [0, 1]",
            )?,
            straggler_factor: check(
                "simulation.straggler_factor",
                s.straggler_factor,
                s.straggler_factor > 0.0,
                "positive",
            )?,
        };
        let churn = ChurnSpec {
            fraction: check("simulation.churn", s.churn, (0.0..=1.0).contains(&s.churn), "in [0, 1]")?,
            rounds: check("simulation.churn_rounds", s.churn_rounds, s.churn_rounds > 0.0, "positive")?,
            rejoin_rounds: check(
                "simulation.rejoin_rounds",
                s.rejoin_rounds,
                s.rejoin_rounds >= 0.0,
                "0 or more",
            )?,
        };
        let churn = (churn.fraction > 0.0).then_some(churn);
        let network = NetworkSpec {
            latency: check("simulation.latency", s.latency, s.latency >= 0.0, "0 or more")?,
            learner_latency: (s.learner_latency.iter())
                .map(|&l| check("simulation.learner_latency", l, l >= 0.0, "a list of 0 or more"))
                .collect::<Result<_, _>>()?,
            bandwidth: check("simulation.bandwidth", s.bandwidth, s.bandwidth > 0.0, "positive")?,
            shard_bandwidth: match check(
                "simulation.shard_bandwidth",
                s.shard_bandwidth,
                s.shard_bandwidth >= 0.0,
                "0 or more",
            )? {
                0.0 => f64::INFINITY,
                b => b,
            },
            jitter: check("simulation.jitter", s.jitter, s.jitter >= 0.0, "0 or more")?,
            drop_probability: check(
                "simulation.drop_probability",
                s.drop_probability,
                (0.0..1.0).contains(&s.drop_probability),
                "in [0, 1)",
            )?,
            retransmit_seconds: check(
                "simulation.retransmit_seconds",
                s.retransmit_seconds,
                s.retransmit_seconds > 0.0,
                "positive",
            )?,
        };
        let stop = StopSpec {
            gradients: nonzero(s.stop_gradients),
            updates: nonzero(s.stop_updates),
            seconds: nonzero(check(
                "simulation.stop_seconds",
                s.stop_seconds,
                s.stop_seconds >= 0.0,
                "0 or more",
            )?),
        };
        let unbounded = stop == StopSpec::default();
        if unbounded && gradients != GradientSource::Model {
            return Err(invalid(
                "simulation.stop_gradients",
                "this simulation has no natural end: set stop_gradients, stop_updates or stop_seconds",
            ));
        }
        if s.loss_every == 0 {
            return Err(invalid("simulation.loss_every", "must be at least 1"));
        }
        let sweep = s.sweep.iter().map(|a| sweep_axis(a, "simulation.sweep")).collect::<Result<_, _>>()?;
        Ok(Self { gradients, seed: s.seed, compute, network, churn, stop, loss_every: s.loss_every, sweep })
    }

    /// Every combination of the sweep's steps, each as `key=value` overrides (one empty
    /// combination when there is no sweep).
    #[must_use]
    pub fn sweep_points(&self) -> Vec<Vec<String>> {
        let mut points = vec![Vec::new()];
        for axis in &self.sweep {
            points = points
                .iter()
                .flat_map(|point| {
                    axis.values.iter().map(move |row| [point.clone(), axis.assignments(row)].concat())
                })
                .collect();
        }
        points
    }
}

/// An axis as written into the checked one; errors name `key` (the section's list).
pub(crate) fn sweep_axis(raw: &RawSweepAxis, key: &'static str) -> Result<SweepAxis, RuntimeError> {
    let keys = match (&raw.key, &raw.keys) {
        (Some(k), None) => vec![k.clone()],
        (None, Some(ks)) if !ks.is_empty() => ks.clone(),
        _ => return Err(invalid(key, "each axis needs either `key` or a non-empty `keys`")),
    };
    if let Some(k) = keys.iter().find(|k| k.starts_with(key)) {
        return Err(invalid(key, format!("an axis cannot set {k}")));
    }
    if raw.values.is_empty() {
        return Err(invalid(key, format!("the axis over {} has no values", keys.join(", "))));
    }
    let values = raw
        .values
        .iter()
        .map(|v| match (v, raw.key.is_some()) {
            (v, true) => Ok(vec![v.to_string()]),
            (toml::Value::Array(row), false) if row.len() == keys.len() => {
                Ok(row.iter().map(toml::Value::to_string).collect())
            }
            (v, false) => Err(invalid(
                key,
                format!("{v} is not an array of {} values, one for each of {}", keys.len(), keys.join(", ")),
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(SweepAxis { keys, values })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn load(toml: &str) -> Result<Config, RuntimeError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sim.toml");
        std::fs::write(&file, toml).unwrap();
        Config::load(Some(&file), &[])
    }

    #[test]
    fn sweeps_are_the_product_of_their_axes_in_order() {
        let c = load(
            r#"
[[simulation.sweep]]
keys = ["protocol.kind", "protocol.n"]
values = [["hardsync", 1], ["softsync", 2]]

[[simulation.sweep]]
key = "simulation.compute_spread"
values = [0.0, 0.25, 0.5]
"#,
        )
        .unwrap();
        let points = c.simulation.sweep_points();
        assert_eq!(points.len(), 6);
        assert_eq!(
            points[0],
            ["protocol.kind=\"hardsync\"", "protocol.n=1", "simulation.compute_spread=0.0"]
        );
        assert_eq!(
            points[5],
            ["protocol.kind=\"softsync\"", "protocol.n=2", "simulation.compute_spread=0.5"]
        );
        let point = Config::load(None, &points[4]).unwrap();
        assert_eq!(point.simulation.compute.dist, ComputeDist::Uniform { spread: 0.25 });
        let softsync = rudra_proto::SyncRule::Softsync { n: 2 };
        assert!(matches!(&point.cluster.protocol, rudra_actors::ProtocolSpec::Sgd(s) if s.rule == softsync));
        assert_eq!(Config::load(None, &[]).unwrap().simulation.sweep_points(), vec![Vec::<String>::new()]);
    }

    #[test]
    fn malformed_sweeps_name_the_problem() {
        let message = |toml: &str| match load(toml) {
            Err(RuntimeError::Invalid(e)) => format!("{}: {}", e.key, e.message),
            other => panic!("expected an invalid setting, got {other:?}"),
        };
        let axis = "[[simulation.sweep]]\n";
        assert!(message(&format!("{axis}values = [1]")).contains("either `key` or"));
        assert!(message(&format!("{axis}key = \"protocol.n\"\nvalues = []")).contains("no values"));
        assert!(
            message(&format!("{axis}keys = [\"a.b\", \"c.d\"]\nvalues = [[1]]")).contains("one for each")
        );
        assert!(message(&format!("{axis}key = \"simulation.sweep\"\nvalues = [1]")).contains("cannot set"));
    }
}
