//! Staleness-dependent learning rates `α(σ)` (Rudra, Gupta, Zhang, Wang).

use std::fmt;

use crate::Staleness;
use serde::{Deserialize, Serialize};

/// How the base learning rate `α0` is modulated by staleness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrModulation {
    /// `α(σ) = α0`.
    None,
    /// `α(σ) = α0 / σ` for `σ > 0`, `α0` for `σ = 0` (staleness-aware async SGD).
    #[default]
    PerGradient,
    /// `α = α0 / max(⟨σ⟩, 1)` for a whole update, `⟨σ⟩` the running mean staleness.
    Mean,
}

impl LrModulation {
    /// The rate one gradient of staleness `sigma` gets, given the running mean `mean`
    /// (used only by [`LrModulation::Mean`]).
    #[must_use]
    pub fn alpha(self, base: f32, sigma: Staleness, mean: f64) -> f32 {
        match self {
            Self::None => base,
            Self::PerGradient if sigma.0 > 0 => base / sigma.0 as f32,
            Self::PerGradient => base,
            Self::Mean => (f64::from(base) / mean.max(1.0)) as f32,
        }
    }

    /// Whether the rate is fixed per gradient on arrival (`none`, `per-gradient`), rather than
    /// once per update (`mean`).
    #[must_use]
    pub fn is_per_gradient(self) -> bool {
        !matches!(self, Self::Mean)
    }
}

impl fmt::Display for LrModulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::PerGradient => "per-gradient",
            Self::Mean => "mean",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_follows_the_definitions() {
        let s = |v| Staleness(v);
        assert_eq!(LrModulation::None.alpha(0.6, s(3), 9.0), 0.6);
        assert_eq!(LrModulation::PerGradient.alpha(0.6, s(0), 9.0), 0.6);
        assert_eq!(LrModulation::PerGradient.alpha(0.6, s(1), 9.0), 0.6);
        assert_eq!(LrModulation::PerGradient.alpha(0.6, s(3), 9.0), 0.2);
        assert_eq!(LrModulation::Mean.alpha(0.6, s(7), 4.0), 0.15);
        assert_eq!(LrModulation::Mean.alpha(0.6, s(7), 0.5), 0.6, "mean below 1 does not raise the rate");
    }
}
