//! The `[study]` section: raw as written, and typed after one validation.

use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::simulate::settings::{RawSweepAxis, SweepAxis, sweep_axis};

/// The most points one study runs.
pub const MAX_POINTS: u64 = 1_000;

/// `[study]` as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStudy {
    /// Where each point runs: `local` (real actors in this process), `quic` (every node on a
    /// thread of its own, over QUIC with mutual TLS on loopback) or `simulate`.
    pub runs: String,
    /// Every point runs once per seed (`training.seed`, and `simulation.seed` in the
    /// simulator); none: once, with the configured seed.
    pub seeds: Vec<u64>,
    /// `[[study.axis]]`: the settings the study varies, as `[[simulation.sweep]]` axes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axis: Vec<RawSweepAxis>,
    /// The figures drawn: a measure against the first axis (`test_error`, `time_to_target`,
    /// `updates_to_target`, `mean_staleness`, `samples_per_second`, `payload_bytes`), `curves`
    /// (every point's test accuracy and train loss on shared axes) or `staleness` (every
    /// point's σ histogram, side by side).
    pub figures: Vec<String>,
}

impl Default for RawStudy {
    fn default() -> Self {
        let figures = vec!["test_error".into()];
        Self { runs: "local".into(), seeds: Vec::new(), axis: Vec::new(), figures }
    }
}

/// Where a study's points run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StudyRuns {
    /// `rudra-node local`: real actors in this process.
    Local,
    /// `rudra-node local --transport quic`: the nodes over QUIC on loopback.
    Quic,
    /// `rudra-node simulate`: virtual learners in virtual time.
    Simulate,
}

/// The validated `[study]` section.
#[derive(Clone, Debug, PartialEq)]
pub struct Study {
    /// Where points run.
    pub runs: StudyRuns,
    /// The seeds each point runs with (empty: the configured one).
    pub seeds: Vec<u64>,
    /// The axes, in order.
    pub axes: Vec<SweepAxis>,
    /// The figures, in order.
    pub figures: Vec<Figure>,
}

/// A figure of a study.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// A measure of each point against the first axis, one line per combination of the others.
    Measure(Measure),
    /// Every point's accuracy and loss curves on shared axes (real runs only).
    Curves,
    /// Every point's staleness histogram.
    Staleness,
}

/// What a measure figure shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// 1 − final test accuracy.
    TestError,
    /// Seconds to the target accuracy.
    TimeToTarget,
    /// Updates to the target accuracy.
    UpdatesToTarget,
    /// ⟨σ⟩.
    MeanStaleness,
    /// Samples per second.
    SamplesPerSecond,
    /// Payload bytes moved.
    PayloadBytes,
    /// Goodput (`docs/src/algorithms.md` §5.3).
    Goodput,
    /// Payload bytes into the busiest shard per update.
    ShardBytesPerUpdate,
}

impl Measure {
    const ALL: [(&'static str, Measure); 8] = [
        ("test_error", Self::TestError),
        ("time_to_target", Self::TimeToTarget),
        ("updates_to_target", Self::UpdatesToTarget),
        ("mean_staleness", Self::MeanStaleness),
        ("samples_per_second", Self::SamplesPerSecond),
        ("payload_bytes", Self::PayloadBytes),
        ("goodput", Self::Goodput),
        ("shard_bytes_per_update", Self::ShardBytesPerUpdate),
    ];

    /// Its name in a study file, its figure's file and its axis label.
    #[must_use]
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, m)| *m == self).map_or("", |(n, _)| n)
    }
}

impl Figure {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "curves" => Some(Self::Curves),
            "staleness" => Some(Self::Staleness),
            _ => Measure::ALL.iter().find(|(n, _)| *n == name).map(|&(_, m)| Self::Measure(m)),
        }
    }
}

pub(super) fn invalid(key: &'static str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Invalid(rudra_actors::InvalidSetting::new(key, message))
}

impl RawStudy {
    /// The checked section.
    pub(crate) fn study(&self) -> Result<Study, RuntimeError> {
        let runs = match self.runs.as_str() {
            "local" => StudyRuns::Local,
            "quic" => StudyRuns::Quic,
            "simulate" => StudyRuns::Simulate,
            other => {
                return Err(invalid("study.runs", format!("{other:?} is not one of local, quic, simulate")));
            }
        };
        // Counted from the file before any point is built: a point costs a configuration.
        let points = (self.axis.iter())
            .try_fold(self.seeds.len().max(1) as u64, |n, a| n.checked_mul(a.values.len() as u64));
        if points.is_none_or(|n| n > MAX_POINTS) {
            let n = points.map_or_else(|| "more than 2^64".to_owned(), |n| n.to_string());
            return Err(invalid(
                "study.axis",
                format!(
                    "the study has {n} points (axes' values × seeds); one study runs at most {MAX_POINTS}: split it"
                ),
            ));
        }
        let axes: Vec<SweepAxis> =
            self.axis.iter().map(|a| sweep_axis(a, "study.axis")).collect::<Result<_, _>>()?;
        let mut keys = std::collections::BTreeSet::new();
        for k in axes.iter().flat_map(|a| &a.keys) {
            if k.starts_with("study.") {
                return Err(invalid(
                    "study.axis",
                    format!("an axis cannot vary {k}: the study's own settings are fixed"),
                ));
            }
            if !keys.insert(k) {
                return Err(invalid("study.axis", format!("two axes vary {k}: give each key one axis")));
            }
        }
        let figures = (self.figures.iter())
            .map(|name| {
                let figure = Figure::parse(name).ok_or_else(|| {
                    let measures = Measure::ALL.map(|(n, _)| n).join(", ");
                    invalid("study.figures", format!("{name:?} is not one of {measures}, curves, staleness"))
                })?;
                if figure == Figure::Curves && runs == StudyRuns::Simulate {
                    return Err(invalid(
                        "study.figures",
                        "curves need real runs: the simulator evaluates once",
                    ));
                }
                Ok(figure)
            })
            .collect::<Result<_, _>>()?;
        Ok(Study { runs, seeds: self.seeds.clone(), axes, figures })
    }
}

impl Study {
    /// The keys of the axes, in order, then `seed` when the study has seeds.
    #[must_use]
    pub fn columns(&self) -> Vec<String> {
        let keys = self.axes.iter().flat_map(|a| a.keys.iter().cloned());
        keys.chain((!self.seeds.is_empty()).then(|| "seed".to_owned())).collect()
    }

    /// Every point: each combination of the axes' steps (the first axis slowest), once per
    /// seed, as `key=value` overrides.
    #[must_use]
    pub fn points(&self) -> Vec<Vec<String>> {
        let mut points = vec![Vec::new()];
        for axis in &self.axes {
            points = (points.iter())
                .flat_map(|p| axis.values.iter().map(move |row| [p.clone(), axis.assignments(row)].concat()))
                .collect();
        }
        if self.seeds.is_empty() {
            return points;
        }
        let seeded = |p: &Vec<String>, s: u64| {
            let mut p = p.clone();
            p.push(format!("training.seed={s}"));
            if self.runs == StudyRuns::Simulate {
                p.push(format!("simulation.seed={s}"));
            }
            p
        };
        points.iter().flat_map(|p| self.seeds.iter().map(move |&s| seeded(p, s))).collect()
    }
}
