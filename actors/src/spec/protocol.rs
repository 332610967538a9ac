//! The protocol a run's shards and learners follow, with its settings: Rudra's SGD family or
//! the EASGD family, each checked on its own.

use std::collections::BTreeSet;

use rudra_transport::{LearnerId, ShardId};
use serde::{Deserialize, Serialize};

use crate::InvalidSetting;
use rudra_proto::{
    CenterRule, CenterShard, DownpourLearner, ElasticLearner, ElasticSettings, LateRule, LocalRule,
    LrModulation, OptimizerSpec, Quorum, SyncRule,
};
/// The longest grace window a quorum round may be given, in milliseconds.
pub const MAX_GRACE_MS: u64 = 60_000;

/// Which protocol the shards run: one of two families, each with its own settings only
/// (`docs/src/algorithms.md` §1–§3 and §4–§6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ProtocolSpec {
    /// Rudra's SGD shards: hardsync, n-softsync, async.
    Sgd(SgdSpec),
    /// The EASGD family (EASGD, EAMSGD, DOWNPOUR, MDOWNPOUR, DiLoCo): the shards hold the
    /// center variable.
    Elastic(ElasticSpec),
}

/// Settings of Rudra's SGD protocols.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SgdSpec {
    /// Hardsync or n-softsync (async is softsync with `n = λ`).
    pub rule: SyncRule,
    /// `α(σ)`.
    pub modulation: LrModulation,
    /// The staleness bound `s`, if any.
    pub max_staleness: Option<u64>,
    /// Hardsync's backup learners b (0 ≤ b < λ): a round completes with the first λ − b
    /// gradients on the current weights; the late ones are dropped and counted.
    pub backups: u32,
    /// Gradients a learner may push ahead of its answers, computing the next on the newest
    /// weights it holds (`docs/src/algorithms.md §4.1`; 0 for hardsync).
    #[serde(default)]
    pub prefetch: u32,
    /// Hardsync: quorum rounds, if any.
    #[serde(default)]
    pub quorum: Option<QuorumSpec>,
}

/// Quorum rounds of hardsync, sync EASGD and sync DiLoCo (`docs/src/algorithms.md` §5.2): a
/// round closes once q contributions on its weights are in and the grace window has passed,
/// or once all are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumSpec {
    /// q, at most λ.
    pub size: u32,
    /// What a contribution on older weights comes to.
    pub late: LateRule,
    /// The grace window's cap w_max, in milliseconds (0: a round closes at its quorum).
    pub grace_max_ms: u64,
}

impl QuorumSpec {
    /// What the shards' cores keep of it (the window is the shard actor's).
    #[must_use]
    pub fn rounds(&self) -> Quorum {
        Quorum { size: self.size, late: self.late }
    }
}

impl ProtocolSpec {
    /// The EASGD family's settings, for a protocol of that family.
    #[must_use]
    pub fn elastic(&self) -> Option<&ElasticSpec> {
        match self {
            Self::Sgd(_) => None,
            Self::Elastic(e) => Some(e),
        }
    }

    /// `α(σ)`: the SGD shards', or async DiLoCo's outer step's.
    #[must_use]
    pub fn modulation(&self) -> LrModulation {
        match self {
            Self::Sgd(s) => s.modulation,
            Self::Elastic(e) => e.modulation,
        }
    }

    /// The staleness bound `s`, if any: the SGD shards', or async DiLoCo's outer step's.
    #[must_use]
    pub fn max_staleness(&self) -> Option<u64> {
        match self {
            Self::Sgd(s) => s.max_staleness,
            Self::Elastic(e) => e.max_staleness,
        }
    }

    /// Hardsync's backup learners (none in any other protocol).
    #[must_use]
    pub fn backups(&self) -> u32 {
        match self {
            Self::Sgd(s) => s.backups,
            Self::Elastic(_) => 0,
        }
    }

    /// The quorum of the synchronous rounds, if any.
    #[must_use]
    pub fn quorum(&self) -> Option<&QuorumSpec> {
        match self {
            Self::Sgd(s) => s.quorum.as_ref(),
            Self::Elastic(e) => e.quorum.as_ref(),
        }
    }

    /// Whether its rounds wait for every learner (hardsync, sync EASGD, sync DiLoCo): the
    /// protocols a quorum is for.
    #[must_use]
    pub fn waits_for_all(&self) -> bool {
        match self {
            Self::Sgd(s) => s.rule == SyncRule::Hardsync,
            Self::Elastic(e) => {
                matches!(e.method, ElasticMethod::Easgd { sync: true } | ElasticMethod::Diloco { sync: true })
            }
        }
    }
}

/// A method of the EASGD family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ElasticMethod {
    /// Elastic averaging SGD, with a barrier round per exchange (`sync`) or without.
    Easgd {
        /// Synchronous rounds.
        sync: bool,
    },
    /// Asynchronous EASGD with Nesterov momentum at the learners.
    Eamsgd,
    /// Local SGD whose accumulated update is added to the center every τ steps.
    Downpour,
    /// DOWNPOUR with τ = 1 and Nesterov momentum kept at the shards.
    MDownpour,
    /// DiLoCo: DOWNPOUR's learners (H = τ local steps, then the pseudo-gradient
    /// Δ = x_start − x^i, and the new center adopted) and an outer Nesterov step at the shards.
    Diloco {
        /// One outer step per round, on the mean Δ of the round's active learners (σ ≡ 0).
        sync: bool,
    },
}

/// Settings of the EASGD family (Zhang, Choromanska, LeCun); the learning rate η is the schedule's base.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElasticSpec {
    /// The method.
    pub method: ElasticMethod,
    /// Communication period τ in local steps.
    pub tau: u64,
    /// Moving rate α (learner side).
    pub alpha: f32,
    /// Center rate β (sync EASGD).
    pub beta: f32,
    /// Momentum δ (EAMSGD, MDOWNPOUR).
    pub momentum: f32,
    /// Decay γ of `η_t = η / (1 + γ t)^0.5` on each learner's own clock.
    pub lr_decay_gamma: f32,
    /// DiLoCo: outer learning rate η_o.
    pub outer_lr: f32,
    /// DiLoCo: outer Nesterov momentum μ_o.
    pub outer_momentum: f32,
    /// The learners' local optimizer (EASGD, DOWNPOUR, DiLoCo; plain SGD for the others).
    pub optimizer: OptimizerSpec,
    /// DiLoCo: the parameter vector goes out in this many fragments in turn, each a run of
    /// whole shards, one every τ/F steps (Streaming DiLoCo); 1: all of it every τ steps.
    #[serde(default = "one_fragment")]
    pub fragments: u64,
    /// Async DiLoCo's outer step: `α(σ)` of each pseudo-gradient (no other method reads it).
    #[serde(default)]
    pub modulation: LrModulation,
    /// Async DiLoCo's outer step: pseudo-gradients staler than this are dropped (no other
    /// method reads it).
    #[serde(default)]
    pub max_staleness: Option<u64>,
    /// Sync EASGD and sync DiLoCo: quorum rounds, if any.
    #[serde(default)]
    pub quorum: Option<QuorumSpec>,
}

/// Why backup learners are refused outside hardsync.
#[must_use]
pub fn backups_belong_to_hardsync(backups: u32) -> String {
    format!(
        "is {backups}; backup learners belong to hardsync (softsync, async and the EASGD family never wait for all)"
    )
}

fn one_fragment() -> u64 {
    1
}

impl ElasticSpec {
    /// Center shard `id` with learning rate `lr`, holding `values`, serving `active`.
    #[must_use]
    pub fn center_shard(
        &self,
        id: ShardId,
        lr: f32,
        values: Vec<f32>,
        active: BTreeSet<LearnerId>,
    ) -> CenterShard {
        CenterShard::new(id, self.center_rule(lr), values, active)
            .with_quorum(self.quorum.map(|q| q.rounds()))
    }

    /// The center shards' rule with learning rate `lr`.
    #[must_use]
    pub fn center_rule(&self, lr: f32) -> CenterRule {
        match self.method {
            ElasticMethod::Easgd { sync: true } => CenterRule::ElasticSync { beta: self.beta },
            ElasticMethod::Easgd { sync: false } | ElasticMethod::Eamsgd => {
                CenterRule::ElasticAsync { alpha: self.alpha }
            }
            ElasticMethod::Downpour => CenterRule::Downpour,
            ElasticMethod::MDownpour => CenterRule::MDownpour { momentum: self.momentum, lr },
            ElasticMethod::Diloco { sync } => CenterRule::Diloco {
                sync,
                outer_lr: self.outer_lr,
                outer_momentum: self.outer_momentum,
                modulation: self.modulation,
                max_staleness: self.max_staleness,
            },
        }
    }

    /// The learners' local rule with learning rate `lr` over `len` parameters.
    #[must_use]
    pub fn local_rule(&self, lr: f32, len: usize) -> LocalRule {
        let momentum = if self.method == ElasticMethod::Eamsgd { self.momentum } else { 0.0 };
        let settings = ElasticSettings {
            tau: self.tau,
            alpha: self.alpha,
            lr,
            lr_decay_gamma: self.lr_decay_gamma,
            momentum,
            optimizer: self.optimizer,
        };
        match self.method {
            ElasticMethod::Easgd { .. } | ElasticMethod::Eamsgd => {
                LocalRule::Elastic(ElasticLearner::new(settings, len))
            }
            ElasticMethod::Downpour | ElasticMethod::Diloco { .. } => {
                let learner = DownpourLearner::new(self.tau, lr, len).with_optimizer(self.optimizer);
                LocalRule::Downpour(learner.with_fragments(self.fragments))
            }
            ElasticMethod::MDownpour => LocalRule::MDownpour,
        }
    }

    /// The EASGD family's own settings in range.
    pub(super) fn validate(&self) -> Result<(), InvalidSetting> {
        // α and β above 1 are points of the stability analysis (`sync_easgd_is_stable`):
        // whether they converge is the run's question, not the configuration's.
        let positive = |key, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(InvalidSetting::new(key, format!("is {v}; it must be positive")))
            }
        };
        if self.tau == 0 {
            return Err(InvalidSetting::new("protocol.tau", "must be at least 1"));
        }
        if self.method == ElasticMethod::MDownpour && self.tau != 1 {
            return Err(InvalidSetting::new(
                "protocol.tau",
                format!("is {}; MDOWNPOUR exchanges every step (τ = 1)", self.tau),
            ));
        }
        // β first: α defaults to β / λ.
        positive("protocol.beta", self.beta)?;
        positive("protocol.alpha", self.alpha)?;
        for (key, momentum) in
            [("protocol.momentum", self.momentum), ("protocol.outer_momentum", self.outer_momentum)]
        {
            if !(momentum.is_finite() && (0.0..1.0).contains(&momentum)) {
                return Err(InvalidSetting::new(key, format!("is {momentum}; it must be in [0, 1)")));
            }
        }
        positive("protocol.outer_lr", self.outer_lr)?;
        self.validate_fragments()?;
        self.validate_optimizer()?;
        if !(self.lr_decay_gamma.is_finite() && self.lr_decay_gamma >= 0.0) {
            return Err(InvalidSetting::new(
                "training.lr_decay_gamma",
                format!("is {}; it must be 0 or more", self.lr_decay_gamma),
            ));
        }
        Ok(())
    }
}

impl ElasticSpec {
    /// Streaming fragments: DiLoCo's, at most τ of them and dividing it (the shards are checked
    /// with the cluster).
    fn validate_fragments(&self) -> Result<(), InvalidSetting> {
        let f = self.fragments;
        let why = if f == 0 {
            "must be at least 1".to_owned()
        } else if f > 1 && !matches!(self.method, ElasticMethod::Diloco { .. }) {
            format!("is {f}; streaming fragments belong to diloco")
        } else if !self.tau.is_multiple_of(f) {
            format!("is {f}; it must divide protocol.tau = {} (one fragment every τ/F steps)", self.tau)
        } else {
            return Ok(());
        };
        Err(InvalidSetting::new("protocol.fragments", why))
    }

    /// The local optimizer: its settings in range, and only for the methods whose learners
    /// take plain SGD steps between exchanges (EAMSGD has its own momentum, MDOWNPOUR takes no
    /// local step).
    fn validate_optimizer(&self) -> Result<(), InvalidSetting> {
        let fraction = |key, v: f32| {
            if v.is_finite() && (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(InvalidSetting::new(key, format!("is {v}; it must be in [0, 1)")))
            }
        };
        match self.optimizer {
            OptimizerSpec::Sgd => return Ok(()),
            OptimizerSpec::Momentum { momentum } => fraction("training.momentum", momentum)?,
            OptimizerSpec::AdamW { beta1, beta2, eps, weight_decay } => {
                fraction("training.beta1", beta1)?;
                fraction("training.beta2", beta2)?;
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(InvalidSetting::new(
                        "training.eps",
                        format!("is {eps}; it must be positive"),
                    ));
                }
                if !(weight_decay.is_finite() && weight_decay >= 0.0) {
                    return Err(InvalidSetting::new(
                        "training.weight_decay",
                        format!("is {weight_decay}; it must be 0 or more"),
                    ));
                }
            }
        }
        if matches!(self.method, ElasticMethod::Eamsgd | ElasticMethod::MDownpour) {
            return Err(InvalidSetting::new(
                "training.optimizer",
                "is for easgd, downpour and diloco, whose learners take plain SGD steps between exchanges \
                 (eamsgd keeps its own Nesterov momentum; mdownpour takes no local step)",
            ));
        }
        Ok(())
    }
}
