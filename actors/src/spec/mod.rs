//! What defines a run, already typed: the cluster, the protocol and its settings
//! ([`ClusterSpec`]), and the data ([`TrainingData`]); the one place they are validated, and
//! the one place each role's protocol core is built from them.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use rudra_compute::{ADAPTIVE_WARMUP_STEPS, BatchStream, Dataset, Minibatches, Partition};
use rudra_transport::{Codecs, Encoding, LearnerId, ShardId};
use serde::{Deserialize, Serialize};

use crate::{InvalidSetting, Models};
pub use protocol::{
    ElasticMethod, ElasticSpec, MAX_GRACE_MS, ProtocolSpec, QuorumSpec, SgdSpec, backups_belong_to_hardsync,
};

mod protocol;
use rudra_proto::{
    BatchPlanner, ElasticWorker, GraceWindow, LeaderGroups, LearnerCore, LearnerLoop, LrSchedule,
    MAX_PREFETCH, SchedulerCore, SgdShard, SgdShardConfig, ShardCore, SyncRule, shard_ranges,
};

/// Everything that defines a run, already typed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSpec {
    /// λ, the number of learners.
    pub learners: u32,
    /// Parameter shards.
    pub shards: u32,
    /// The protocol.
    pub protocol: ProtocolSpec,
    /// μ, the minibatch size per learner.
    pub batch_size: usize,
    /// Passes over each learner's partition.
    pub epochs: u32,
    /// Base learning rate and decay.
    pub schedule: LrSchedule,
    /// Seed of initial weights, partitions and shuffles.
    pub seed: u64,
    /// Test-set evaluations per epoch (rows of `metrics.csv`).
    pub evals_per_epoch: u32,
    /// How gradients and weights travel (also in one process, where the codecs' effect on
    /// accuracy can be measured without a network).
    pub codecs: Codecs,
    /// Whether every learner's minibatch is μ, or follows its speed.
    #[serde(default)]
    pub batch_sizing: BatchSizing,
    /// G, the learner groups whose gradients are aggregated before they reach a shard
    /// (`docs/src/algorithms.md` §4.2); 1: none.
    #[serde(default = "one_group")]
    pub groups: u32,
    /// Each group runs rounds of its own and pushes each round's mean as one gradient of the
    /// group; the shards' rule counts groups (`docs/src/algorithms.md` §4.3).
    #[serde(default)]
    pub hierarchical: bool,
    /// With hierarchical groups: each group's rounds are n-softsync among its members (1, the
    /// default: hardsync).
    #[serde(default = "one_group")]
    pub group_n: u32,
}

fn one_group() -> u32 {
    1
}

/// How learners' minibatch sizes are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchSizing {
    /// μ for every learner.
    #[default]
    Fixed,
    /// μ_l from each learner's measured throughput, with Σ μ_l = μλ, chosen again once per
    /// epoch (`docs/src/algorithms.md` §5.1).
    Adaptive,
}

/// The training and test sets of a run.
#[derive(Clone, Debug)]
pub struct TrainingData {
    /// Split among the learners.
    pub train: Arc<Dataset>,
    /// Evaluated by the scheduler.
    pub test: Arc<Dataset>,
}

impl ClusterSpec {
    /// Check the spec against itself, the models and the data. This is the one place settings
    /// are validated; errors name the configuration key.
    pub fn validate(&self, models: &Models, data: &TrainingData) -> Result<(), InvalidSetting> {
        self.validate_settings(models.param_count())?;
        let share = data.train.len() / self.learners as usize;
        if self.batch_size > share {
            return Err(InvalidSetting::new(
                "training.batch_size",
                format!("is {}, larger than each learner's {share} training examples", self.batch_size),
            ));
        }
        models.check_data("training", &data.train)?;
        models.check_data("test", &data.test)?;
        // An external dataset's test set is the learners' (their own evaluation).
        if data.test.is_empty() && !data.test.is_external() {
            return Err(InvalidSetting::new("training.dataset", "the test set is empty"));
        }
        Ok(())
    }

    /// The checks of [`Self::validate`] that need no data, for a parameter vector of `params`
    /// values (the model's, or another objective's).
    pub fn validate_settings(&self, params: usize) -> Result<(), InvalidSetting> {
        if self.learners == 0 {
            return Err(InvalidSetting::new("cluster.learners", "must be at least 1"));
        }
        if self.shards == 0 || self.shards as usize > params {
            return Err(InvalidSetting::new(
                "cluster.shards",
                format!("must be between 1 and the {params} parameters"),
            ));
        }
        match &self.protocol {
            ProtocolSpec::Elastic(e) => {
                e.validate()?;
                if !u64::from(self.shards).is_multiple_of(e.fragments) {
                    return Err(InvalidSetting::new(
                        "protocol.fragments",
                        format!(
                            "is {}; it must divide cluster.shards = {} (a fragment is a run of whole shards)",
                            e.fragments, self.shards
                        ),
                    ));
                }
            }
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Softsync { n }, .. })
                if !(1..=self.learners).contains(n) =>
            {
                return Err(InvalidSetting::new(
                    "protocol.n",
                    format!("is {n}; it must be between 1 and λ = {}", self.learners),
                ));
            }
            ProtocolSpec::Sgd(SgdSpec {
                rule: SyncRule::Softsync { .. } | SyncRule::Async,
                backups: b @ 1..,
                ..
            }) => {
                return Err(InvalidSetting::new("protocol.backups", backups_belong_to_hardsync(*b)));
            }
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Hardsync, prefetch: k @ 1.., .. }) => {
                return Err(InvalidSetting::new(
                    "protocol.prefetch",
                    format!(
                        "is {k}; hardsync needs every gradient on the current weights (σ = 0), so it computes \
                         nothing ahead: use 0, or softsync/async"
                    ),
                ));
            }
            ProtocolSpec::Sgd(SgdSpec { prefetch: k, .. }) if *k > MAX_PREFETCH => {
                return Err(InvalidSetting::new(
                    "protocol.prefetch",
                    format!("is {k}; at most {MAX_PREFETCH} gradients may be in flight"),
                ));
            }
            ProtocolSpec::Sgd(_) => {}
        }
        if let Some(q) = self.protocol.quorum() {
            self.check_quorum(q)?;
        }
        self.check_groups()?;
        let backups = self.protocol.backups();
        if backups >= self.learners {
            return Err(InvalidSetting::new(
                "protocol.backups",
                format!("is {backups}; it must be below λ = {}", self.learners),
            ));
        }
        if self.batch_size == 0 {
            return Err(InvalidSetting::new("training.batch_size", "must be at least 1"));
        }
        if self.batch_sizing == BatchSizing::Adaptive && self.protocol.elastic().is_some() {
            return Err(InvalidSetting::new(
                "training.batch_sizing",
                "is adaptive; adaptive batch sizes are for Rudra's SGD rules (hardsync, softsync, async), whose \
                 shards weigh every gradient by its examples; the EASGD family and DiLoCo use fixed",
            ));
        }
        if self.epochs == 0 {
            return Err(InvalidSetting::new("training.epochs", "must be at least 1"));
        }
        if self.evals_per_epoch == 0 {
            return Err(InvalidSetting::new("training.evals_per_epoch", "must be at least 1"));
        }
        if !(self.schedule.base.is_finite() && self.schedule.base > 0.0) {
            return Err(InvalidSetting::new(
                "training.learning_rate",
                format!("is {}; it must be positive", self.schedule.base),
            ));
        }
        if !(self.schedule.decay.is_finite() && self.schedule.decay > 0.0) {
            return Err(InvalidSetting::new(
                "training.lr_decay",
                format!("is {}; it must be positive", self.schedule.decay),
            ));
        }
        Ok(())
    }

    /// A quorum belongs to the rounds that wait for all (hardsync, sync EASGD, sync DiLoCo),
    /// within λ, on one shard, without backups, with a bounded window.
    fn check_quorum(&self, q: &QuorumSpec) -> Result<(), InvalidSetting> {
        let backups = self.protocol.backups();
        let why = if !self.protocol.waits_for_all() {
            "quorum rounds are for hardsync, sync EASGD and sync DiLoCo (the others never wait for all)"
                .to_owned()
        } else if !(1..=self.learners).contains(&q.size) {
            format!("it must be between 1 and λ = {}", self.learners)
        } else if self.shards > 1 {
            format!(
                "and cluster.shards is {}: quorum rounds need one shard (each shard would choose its own quorum; \
                 once the quorum is every learner left, two shards can each wait for a learner the other holds \
                 back, and never close)",
                self.shards
            )
        } else if backups > 0 {
            format!(
                "and protocol.backups is {backups}: backups = b is a quorum of λ − b that drops the late with no \
                 grace window; set one of the two"
            )
        } else if q.grace_max_ms > MAX_GRACE_MS {
            return Err(InvalidSetting::new(
                "protocol.grace_max_ms",
                format!("is {}; at most {MAX_GRACE_MS} ms", q.grace_max_ms),
            ));
        } else {
            return Ok(());
        };
        Err(InvalidSetting::new("protocol.quorum", format!("is {}; {why}", q.size)))
    }

    /// Learner groups are for Rudra's SGD rules, 1 to λ of them, with nothing that lets a
    /// learner wait on another member's push while the aggregator holds it.
    fn check_groups(&self) -> Result<(), InvalidSetting> {
        let g = self.groups;
        if self.hierarchical {
            return self.check_hierarchical();
        }
        if self.group_n != 1 {
            let why = format!(
                "is {}; it sets the rounds of groups with rounds of their own: set cluster.hierarchical",
                self.group_n
            );
            return Err(InvalidSetting::new("cluster.group_n", why));
        }
        if g == 1 {
            return Ok(());
        }
        let why = match &self.protocol {
            _ if !(1..=self.learners).contains(&g) => format!("it must be between 1 and λ = {}", self.learners),
            ProtocolSpec::Elastic(_) => {
                "learner groups aggregate gradients for Rudra's SGD rules (hardsync, softsync, async); the EASGD \
                 family and DiLoCo exchange with the center directly"
                    .to_owned()
            }
            ProtocolSpec::Sgd(s) if s.prefetch > 0 || s.backups > 0 || s.quorum.is_some() => {
                "and protocol.prefetch, protocol.backups or protocol.quorum is set: a group's aggregator holds \
                 every member's push until all have pushed, which none of them allows; use one or the other"
                    .to_owned()
            }
            ProtocolSpec::Sgd(s) if s.max_staleness.is_some() => {
                "and protocol.max_staleness is set: a group's aggregator holds a member's push until all have \
                 pushed, while the bound may hold another member back until that push arrives"
                    .to_owned()
            }
            ProtocolSpec::Sgd(_) => return Ok(()),
        };
        Err(InvalidSetting::new("cluster.groups", format!("is {g}; {why}")))
    }

    /// The groups, when they run rounds of their own (`docs/src/algorithms.md` §4.3).
    #[must_use]
    pub fn own_round_groups(&self) -> Option<Vec<Vec<LearnerId>>> {
        self.hierarchical.then(|| self.learner_groups())
    }

    /// Groups with rounds of their own: two or more, for the SGD rules, with softsync's n at
    /// most G (the shards count groups); the staleness bound holds between groups, and nothing
    /// that lets a member wait on another's push while its group's round holds it.
    fn check_hierarchical(&self) -> Result<(), InvalidSetting> {
        let g = self.groups;
        let why = match &self.protocol {
            _ if !(2..=self.learners).contains(&g) => {
                format!("and cluster.groups is {g}: groups with rounds of their own need 2 to λ = {} groups", self.learners)
            }
            ProtocolSpec::Elastic(_) => {
                "groups run rounds of their own under Rudra's SGD rules (hardsync, softsync, async); the EASGD \
                 family and DiLoCo exchange with the center directly"
                    .to_owned()
            }
            ProtocolSpec::Sgd(s) if s.prefetch > 0 || s.backups > 0 || s.quorum.is_some() => {
                "and protocol.prefetch, protocol.backups or protocol.quorum is set: a group's round waits for \
                 every member, which none of them allows; use one or the other"
                    .to_owned()
            }
            ProtocolSpec::Sgd(SgdSpec { rule: SyncRule::Softsync { n }, .. }) if *n > g => {
                format!("and protocol.n is {n}: between groups the shards count the G = {g} groups, so n is at most G")
            }
            ProtocolSpec::Sgd(_) => {
                let smallest = self.learner_groups().iter().map(Vec::len).min().unwrap_or(1) as u32;
                if (1..=smallest).contains(&self.group_n) {
                    return Ok(());
                }
                let why = format!(
                    "is {}; a group's rounds are n-softsync among its members, 1 ≤ n ≤ {smallest} (the smallest group)",
                    self.group_n
                );
                return Err(InvalidSetting::new("cluster.group_n", why));
            }
        };
        Err(InvalidSetting::new("cluster.hierarchical", format!("is true {why}")))
    }

    /// The learners of each of the [`Self::groups`] groups: contiguous runs of ids, of ⌊λ/G⌋
    /// or ⌈λ/G⌉ each.
    #[must_use]
    pub fn learner_groups(&self) -> Vec<Vec<LearnerId>> {
        rudra_proto::learner_groups(self.learners, self.groups)
    }

    /// With a quorum: the rule of its shards' grace windows.
    #[must_use]
    pub fn grace_window(&self) -> Option<GraceWindow> {
        let q = self.protocol.quorum()?;
        Some(GraceWindow::new(std::time::Duration::from_millis(q.grace_max_ms)))
    }

    /// Learners the run may end without: hardsync's backups b, or λ − q with a quorum.
    #[must_use]
    pub fn not_waited_for(&self) -> u32 {
        match self.protocol.quorum() {
            Some(q) => self.learners.saturating_sub(q.size),
            None => self.protocol.backups(),
        }
    }

    /// The parameter range of every shard over a parameter vector of `len` values.
    #[must_use]
    pub fn shard_ranges(&self, len: usize) -> Vec<Range<usize>> {
        shard_ranges(len, self.shards as usize)
    }

    /// The settings of SGD shard `s` of protocol `p` for a training set of `train_len`
    /// examples.
    #[must_use]
    pub fn sgd_shard_config(&self, p: &SgdSpec, s: usize, train_len: usize) -> SgdShardConfig {
        SgdShardConfig {
            id: ShardId(s as u32),
            rule: p.rule,
            modulation: p.modulation,
            max_staleness: p.max_staleness,
            backups: p.backups,
            quorum: p.quorum.map(|q| q.rounds()),
            schedule: self.schedule,
            // A group's gradient is over all its members' examples: its share is relative to
            // the largest group's.
            batch: self.batch_size as u32 * self.pushers_per_gradient(),
            gradients_per_epoch: self.steps_per_learner(train_len) / u64::from(self.epochs)
                * self.gradients_per_step(),
            prefetch: p.prefetch,
        }
    }

    /// Shard `s`'s core for this protocol, holding its range of the initial parameters `init`,
    /// for a training set of `train_len` examples: an SGD shard, or a center shard for the
    /// EASGD family.
    #[must_use]
    pub fn shard_core(&self, s: usize, train_len: usize, init: &[f32]) -> ShardCore {
        let values = init[self.shard_ranges(init.len())[s].clone()].to_vec();
        match &self.protocol {
            ProtocolSpec::Sgd(p) => {
                ShardCore::Sgd(SgdShard::new(self.sgd_shard_config(p, s, train_len), values, self.served()))
            }
            ProtocolSpec::Elastic(e) => ShardCore::Center(e.center_shard(
                ShardId(s as u32),
                self.schedule.base,
                values,
                self.served(),
            )),
        }
    }

    /// Whom the shards serve at the start: every learner, or with hierarchical groups every
    /// group, by its first member.
    #[must_use]
    pub fn served(&self) -> BTreeSet<LearnerId> {
        let all = (0..self.learners).map(LearnerId).collect();
        LeaderGroups::of(self.own_round_groups()).served(&all)
    }

    /// The gradients a shard takes per step of every learner: λ, or with hierarchical groups
    /// each group's rounds per step, ⌈m / ⌊m/n⌋⌉ for a group of m.
    fn gradients_per_step(&self) -> u64 {
        match self.own_round_groups() {
            Some(groups) => (groups.iter().map(|g| g.len() as u64))
                .map(|m| m.div_ceil((m / u64::from(self.group_n.max(1))).max(1)))
                .sum(),
            None => u64::from(self.learners),
        }
    }

    /// The learners behind one gradient a shard takes: 1, or the largest group's size with
    /// hierarchical groups.
    fn pushers_per_gradient(&self) -> u32 {
        match self.hierarchical {
            true => self.learner_groups().iter().map(Vec::len).max().unwrap_or(1) as u32,
            false => 1,
        }
    }

    /// Gradient steps each learner takes over the run, for a training set of `train_len`.
    #[must_use]
    pub fn steps_per_learner(&self, train_len: usize) -> u64 {
        (train_len / self.learners as usize / self.batch_size) as u64 * u64::from(self.epochs)
    }

    /// Learner `l`'s loop for this protocol, starting from the parameters `init`, and its
    /// minibatches over its partition of `train`.
    #[must_use]
    pub fn learner_loop(&self, l: usize, train: Arc<Dataset>, init: &[f32]) -> (LearnerLoop, Minibatches) {
        let steps = self.steps_per_learner(train.len());
        let stream = match self.batch_sizing {
            BatchSizing::Fixed => {
                let part = Partition::split(train.len(), self.learners as usize, self.seed).swap_remove(l);
                BatchStream::new(part, self.batch_size, self.seed, l as u64)
            }
            BatchSizing::Adaptive => {
                BatchStream::adaptive(train.len(), self.learners as usize, self.batch_size, self.seed, l)
            }
        };
        let batches = Minibatches::new(train, stream);
        let id = LearnerId(l as u32);
        let e = match &self.protocol {
            ProtocolSpec::Sgd(p) => {
                let core = LearnerCore::new(id, self.shards as usize, steps).with_prefetch(p.prefetch);
                return (LearnerLoop::Sgd(core), batches);
            }
            ProtocolSpec::Elastic(e) => e,
        };
        let worker = ElasticWorker::new(
            id,
            e.local_rule(self.schedule.base, init.len()),
            init.to_vec(),
            self.shard_ranges(init.len()),
            steps,
        );
        (LearnerLoop::Elastic(Box::new(worker)), batches)
    }

    /// The scheduler's core for a training set of `train_len`.
    #[must_use]
    pub fn scheduler_core(&self, train_len: usize) -> SchedulerCore {
        let per_epoch = self.steps_per_learner(train_len) / u64::from(self.epochs)
            * self.batch_size as u64
            * u64::from(self.learners);
        SchedulerCore::new(self.learners, self.shards, per_epoch, u64::from(self.epochs))
            .with_evals_per_epoch(u64::from(self.evals_per_epoch))
            .with_backups(self.not_waited_for())
    }

    /// With adaptive batch sizes, the scheduler's planner of them, for a training set of
    /// `train_len`.
    #[must_use]
    pub fn batch_planner(&self, train_len: usize) -> Option<BatchPlanner> {
        (self.batch_sizing == BatchSizing::Adaptive).then(|| {
            let per_epoch = self.total_samples(train_len) / u64::from(self.epochs);
            let steps = self.steps_per_learner(train_len) / u64::from(self.epochs);
            let warmup = steps.min(ADAPTIVE_WARMUP_STEPS as u64) * self.global_batch() as u64;
            BatchPlanner::new(
                self.learners,
                self.batch_size as u32,
                (warmup, per_epoch),
                u64::from(self.epochs),
            )
        })
    }

    /// Examples all learners process over the run, for a training set of `train_len`.
    #[must_use]
    pub fn total_samples(&self, train_len: usize) -> u64 {
        self.steps_per_learner(train_len) * self.batch_size as u64 * u64::from(self.learners)
    }

    /// Whether learners' exchanges add up like gradients (DOWNPOUR's accumulated update,
    /// MDOWNPOUR's gradient, DiLoCo's pseudo-gradient) rather than being parameters (EASGD's
    /// x^i).
    #[must_use]
    pub fn exchanges_gradients(&self) -> bool {
        matches!(
            self.protocol.elastic().map(|e| e.method),
            Some(ElasticMethod::Downpour | ElasticMethod::MDownpour | ElasticMethod::Diloco { .. })
        )
    }

    /// How learners' exchanges travel: in the gradients codec (with its error feedback) when
    /// they add up like gradients, in the weights codec otherwise.
    #[must_use]
    pub fn exchange_encoding(&self) -> Encoding {
        if self.exchanges_gradients() { self.codecs.gradients } else { self.codecs.weights }
    }

    /// μλ, the examples behind one hardsync update.
    #[must_use]
    pub fn global_batch(&self) -> usize {
        self.batch_size * self.learners as usize
    }
}
