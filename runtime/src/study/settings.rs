//! The `[study]` section: raw as written, and typed after one validation.

use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::simulate::settings::{RawSweepAxis, SweepAxis, sweep_axis};

/// `[study]` as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStudy {
    /// Where each point runs: `local` (real actors in this process) or `simulate`.
    pub runs: String,
    /// Every point runs once per seed (`training.seed`, and `simulation.seed` in the
    /// simulator); none: once, with the configured seed.
    pub seeds: Vec<u64>,
    /// `[[study.axis]]`: the settings the study varies, as `[[simulation.sweep]]` axes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axis: Vec<RawSweepAxis>,
}

impl Default for RawStudy {
    fn default() -> Self {
        Self { runs: "local".into(), seeds: Vec::new(), axis: Vec::new() }
    }
}

/// Where a study's points run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StudyRuns {
    /// `rudra-node local`: real actors in this process.
    Local,
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
}

impl RawStudy {
    /// The checked section.
    pub(crate) fn study(&self) -> Result<Study, RuntimeError> {
        let runs = match self.runs.as_str() {
            "local" => StudyRuns::Local,
            "simulate" => StudyRuns::Simulate,
            other => {
                return Err(RuntimeError::Invalid(rudra_actors::InvalidSetting::new(
                    "study.runs",
                    format!("{other:?} is not one of local, simulate"),
                )));
            }
        };
        let axes = self.axis.iter().map(|a| sweep_axis(a, "study.axis")).collect::<Result<_, _>>()?;
        Ok(Study { runs, seeds: self.seeds.clone(), axes })
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
