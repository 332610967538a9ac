//! The scheduler's core: waits for the configured shards and learners, starts the run, turns
//! learner progress into epochs (evaluation points), and stops the
//! run once every learner has finished.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::{LearnerId, ShardId};
use serde::{Deserialize, Serialize};

/// Base learning rate and its per-epoch decay: `α0(e) = base · decay^e`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Learning rate of epoch 0.
    pub base: f32,
    /// Multiplier applied at every epoch boundary (1 keeps the rate constant).
    pub decay: f32,
}

impl LrSchedule {
    /// The base rate for `epoch`.
    #[must_use]
    pub fn rate(&self, epoch: u64) -> f32 {
        self.base * self.decay.powi(i32::try_from(epoch).unwrap_or(i32::MAX))
    }
}

/// An effect of the scheduler core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SchedulerEvent {
    /// Everyone has joined: start the learners.
    Start,
    /// Evaluate the model: an epoch ended (`final_ = false`) or the run did.
    Evaluate {
        /// Whole epochs completed.
        epoch: u64,
        /// Whether this is the last evaluation of the run.
        final_: bool,
    },
    /// Tell every node to stop.
    Stop,
    /// No word from this learner within the failure timeout: it left the active set.
    Lost(LearnerId),
    /// A learner that was lost (or restarted) is heard from again and is active once more.
    Rejoined(LearnerId),
    /// The active set changed: tell every shard the new λ ([`SchedulerCore::active`]).
    Membership,
    /// A shard that sends heartbeats has been silent for the failure timeout: it is lost.
    ShardSilent(ShardId),
    /// A shard declared silent is heard from again (a partition healed).
    ShardBack(ShardId),
    /// The train loss became non-finite or exceeded ten times its first measured value: the
    /// run has diverged and stops (the final evaluation and the stop follow).
    Diverged(Divergence),
}

/// How a run diverged: the train loss that did it, and the first one measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The mean train loss of the window that crossed the line (possibly NaN or ±Inf).
    pub train_loss: f64,
    /// The first mean train loss the run measured.
    pub first_loss: f64,
}

/// A run has diverged when its train loss exceeds this many times its first measured value.
pub const DIVERGENCE_FACTOR: f64 = 10.0;

/// The scheduler's state (kept by a scheduler that may be restarted with `--resume`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SchedulerCore {
    learners: u32,
    shards: u32,
    joined_learners: BTreeSet<LearnerId>,
    joined_shards: BTreeSet<ShardId>,
    finished: BTreeSet<LearnerId>,
    examples_per_epoch: u64,
    epochs_total: u64,
    evals_per_epoch: u64,
    samples: u64,
    /// Evaluation points passed.
    evals: u64,
    started: bool,
    /// Learners removed from the active set by the failure detector.
    lost: BTreeSet<LearnerId>,
    /// When each learner was last heard from, since the scheduler started.
    last_heard: BTreeMap<LearnerId, Duration>,
    /// Silence longer than this removes a learner (none: never).
    failure_timeout: Option<Duration>,
    /// When each shard that sends heartbeats (one on another node) was last heard from.
    shard_heard: BTreeMap<ShardId, Duration>,
    /// Shards declared silent and not heard from since.
    shards_silent: BTreeSet<ShardId>,
    /// When the failure detector last looked.
    last_tick: Option<Duration>,
    stopping: bool,
    /// The first mean train loss measured.
    first_loss: Option<f64>,
    /// Hardsync's backup learners: the run ends once all but this many active learners have
    /// finished (the slowest are cut off, as their late gradients are).
    #[serde(default)]
    backups: u32,
}

impl SchedulerCore {
    /// A scheduler expecting `learners` and `shards` for a run of `epochs_total` epochs of
    /// `examples_per_epoch` samples each, across all learners.
    #[must_use]
    pub fn new(learners: u32, shards: u32, examples_per_epoch: u64, epochs_total: u64) -> Self {
        Self {
            learners,
            shards,
            joined_learners: BTreeSet::new(),
            joined_shards: BTreeSet::new(),
            finished: BTreeSet::new(),
            examples_per_epoch: examples_per_epoch.max(1),
            epochs_total,
            evals_per_epoch: 1,
            samples: 0,
            evals: 0,
            started: false,
            lost: BTreeSet::new(),
            last_heard: BTreeMap::new(),
            failure_timeout: None,
            shard_heard: BTreeMap::new(),
            shards_silent: BTreeSet::new(),
            last_tick: None,
            stopping: false,
            first_loss: None,
            backups: 0,
        }
    }

    /// End the run once all but `backups` active learners have finished their epochs.
    #[must_use]
    pub fn with_backups(mut self, backups: u32) -> Self {
        self.backups = backups;
        self
    }

    /// Remove a learner not heard from for `timeout` from the active set.
    #[must_use]
    pub fn with_failure_timeout(mut self, timeout: Duration) -> Self {
        self.failure_timeout = Some(timeout);
        self
    }

    /// λ and the shards of the run, as configured.
    #[must_use]
    pub fn size(&self) -> (u32, u32) {
        (self.learners, self.shards)
    }

    /// Refuse a state no run could have produced (one read back from a file): ids beyond the
    /// run's learners and shards, lost or finished learners that never joined, a run of no
    /// epochs, backups not below λ.
    pub fn check(&self) -> Result<(), String> {
        let learners = (self.joined_learners.iter())
            .chain(&self.finished)
            .chain(&self.lost)
            .chain(self.last_heard.keys());
        if let Some(l) = learners.clone().find(|l| l.0 >= self.learners) {
            return Err(format!("names {l}, but the run has {} learners", self.learners));
        }
        let shards = self.joined_shards.iter().chain(&self.shards_silent).chain(self.shard_heard.keys());
        if let Some(s) = shards.clone().find(|s| s.0 >= self.shards) {
            return Err(format!("names {s}, but the run has {} shards", self.shards));
        }
        if let Some(l) = self.lost.iter().chain(&self.finished).find(|l| !self.joined_learners.contains(l)) {
            return Err(format!("has {l} lost or finished without having joined"));
        }
        if self.epochs_total == 0 || self.evals_per_epoch == 0 || self.learners == 0 || self.shards == 0 {
            return Err("is of a run with no epochs, evaluations, learners or shards".into());
        }
        if self.backups >= self.learners {
            return Err(format!("has {} backups for λ = {}", self.backups, self.learners));
        }
        Ok(())
    }

    /// How long a node may be silent before it is lost, if the detector runs.
    #[must_use]
    pub fn failure_timeout(&self) -> Option<Duration> {
        self.failure_timeout
    }

    /// Whether the run has started.
    #[must_use]
    pub fn started(&self) -> bool {
        self.started
    }

    /// The active learners that have not finished their epochs: those a scheduler that
    /// restarts waits for (a learner lost before may still join again later).
    #[must_use]
    pub fn running(&self) -> BTreeSet<LearnerId> {
        self.active().difference(&self.finished).copied().collect()
    }

    /// The learners the shards serve: joined, not lost.
    #[must_use]
    pub fn active(&self) -> BTreeSet<LearnerId> {
        self.joined_learners.difference(&self.lost).copied().collect()
    }

    /// A learner was heard from at `now` (a heartbeat, progress, or a restart joining). A lost
    /// learner is active again.
    #[must_use]
    pub fn on_heard(&mut self, learner: LearnerId, now: Duration) -> Vec<SchedulerEvent> {
        self.last_heard.insert(learner, now);
        if self.stopping || !self.lost.remove(&learner) {
            return Vec::new();
        }
        self.finished.remove(&learner);
        vec![SchedulerEvent::Rejoined(learner), SchedulerEvent::Membership]
    }

    /// A shard's heartbeat arrived at `now`. Only shards that send them are watched; one
    /// declared silent is back.
    #[must_use]
    pub fn on_shard_heard(&mut self, shard: ShardId, now: Duration) -> Vec<SchedulerEvent> {
        self.shard_heard.insert(shard, now);
        if self.shards_silent.remove(&shard) && !self.stopping {
            return vec![SchedulerEvent::ShardBack(shard)];
        }
        Vec::new()
    }

    /// The failure detector's clock ticked: learners (and shards that send heartbeats) silent
    /// for longer than the timeout are lost; once every active learner has finished the run
    /// ends.
    #[must_use]
    pub fn on_tick(&mut self, now: Duration) -> Vec<SchedulerEvent> {
        let Some(timeout) = self.failure_timeout.filter(|_| self.started && !self.stopping) else {
            return Vec::new();
        };
        // A learner not heard from yet is given a whole timeout from the first tick.
        for &l in &self.joined_learners {
            self.last_heard.entry(l).or_insert(now);
        }
        // A detector that did not look for half a timeout (its scheduler was busy, e.g.
        // waiting for a restarting shard) may not have read the heartbeats that arrived
        // meanwhile: it accuses nobody until it has looked again.
        if self.last_tick.replace(now).is_some_and(|prev| now.saturating_sub(prev) > timeout / 2) {
            return Vec::new();
        }
        let shards: Vec<ShardId> = (self.shard_heard.iter())
            .filter(|&(s, &t)| now.saturating_sub(t) > timeout && !self.shards_silent.contains(s))
            .map(|(&s, _)| s)
            .collect();
        self.shards_silent.extend(shards.iter().copied());
        let mut events: Vec<SchedulerEvent> = shards.into_iter().map(SchedulerEvent::ShardSilent).collect();
        let silent: Vec<LearnerId> = (self.joined_learners.iter())
            .filter(|l| !self.lost.contains(l) && !self.finished.contains(l))
            .filter(|l| self.last_heard.get(l).is_some_and(|&t| now.saturating_sub(t) > timeout))
            .copied()
            .collect();
        events.extend(self.remove(silent));
        events
    }

    /// Examples the run is to process: every epoch of every learner's partition.
    #[must_use]
    pub fn samples_expected(&self) -> u64 {
        self.examples_per_epoch * self.epochs_total
    }

    /// Whether learner `learner` holds its place in the run at `now`: it joined, is not lost,
    /// and was heard from within the failure timeout (if the detector runs). A second process
    /// of its name is refused while it does.
    #[must_use]
    pub fn learner_alive(&self, learner: LearnerId, now: Duration) -> bool {
        self.joined_learners.contains(&learner)
            && !self.lost.contains(&learner)
            && self.last_heard.get(&learner).is_none_or(|&t| self.heard_within(t, now))
    }

    /// Whether shard `shard` holds its place at `now`: not declared silent, and heard from
    /// within the failure timeout (if it sends heartbeats and the detector runs).
    #[must_use]
    pub fn shard_alive(&self, shard: ShardId, now: Duration) -> bool {
        !self.shards_silent.contains(&shard)
            && self.shard_heard.get(&shard).is_none_or(|&t| self.heard_within(t, now))
    }

    fn heard_within(&self, heard: Duration, now: Duration) -> bool {
        self.failure_timeout.is_none_or(|timeout| now.saturating_sub(heard) <= timeout)
    }

    /// The transport saw `learner`'s connection close: it is lost at once.
    #[must_use]
    pub fn on_disconnected(&mut self, learner: LearnerId) -> Vec<SchedulerEvent> {
        if self.stopping || self.finished.contains(&learner) || self.lost.contains(&learner) {
            return Vec::new();
        }
        self.remove(vec![learner])
    }

    fn remove(&mut self, gone: Vec<LearnerId>) -> Vec<SchedulerEvent> {
        if gone.is_empty() {
            return Vec::new();
        }
        self.lost.extend(gone.iter().copied());
        let mut events: Vec<SchedulerEvent> = gone.into_iter().map(SchedulerEvent::Lost).collect();
        events.push(SchedulerEvent::Membership);
        events.extend(self.finish_if_done());
        events
    }

    fn finish_if_done(&mut self) -> Vec<SchedulerEvent> {
        let active = self.active();
        let finished = active.intersection(&self.finished).count();
        let enough = active.len().saturating_sub(self.backups as usize).max(1);
        if self.stopping || !(active.is_subset(&self.finished) || finished >= enough) {
            return Vec::new();
        }
        self.stopping = true;
        let epoch = self.evals / self.evals_per_epoch;
        vec![SchedulerEvent::Evaluate { epoch, final_: true }, SchedulerEvent::Stop]
    }

    /// Evaluate `k` times per epoch (at equal sample counts) instead of once.
    #[must_use]
    pub fn with_evals_per_epoch(mut self, k: u64) -> Self {
        self.evals_per_epoch = k.max(1);
        self
    }

    /// The learners that joined.
    #[must_use]
    pub fn active_learners(&self) -> &BTreeSet<LearnerId> {
        &self.joined_learners
    }

    /// Learners that joined, are not lost and have not finished.
    #[must_use]
    pub fn learners_alive(&self) -> usize {
        self.active().difference(&self.finished).count()
    }

    /// Samples processed so far, over all learners.
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Epochs so far, fractional.
    #[must_use]
    pub fn epochs(&self) -> f64 {
        self.samples as f64 / self.examples_per_epoch as f64
    }

    /// A shard joined.
    #[must_use]
    pub fn on_shard_joined(&mut self, shard: ShardId) -> Vec<SchedulerEvent> {
        self.joined_shards.insert(shard);
        self.maybe_start()
    }

    /// A learner joined.
    #[must_use]
    pub fn on_learner_joined(&mut self, learner: LearnerId) -> Vec<SchedulerEvent> {
        self.joined_learners.insert(learner);
        self.maybe_start()
    }

    fn maybe_start(&mut self) -> Vec<SchedulerEvent> {
        let all = self.joined_learners.len() as u32 >= self.learners
            && self.joined_shards.len() as u32 >= self.shards;
        if self.started || !all {
            return Vec::new();
        }
        self.started = true;
        vec![SchedulerEvent::Start]
    }

    /// A learner processed `samples` more examples. Every evaluation point (each epoch
    /// boundary, or each `1/k` of an epoch) but the last, which the final evaluation covers,
    /// asks for an evaluation; points passed at once ask for one.
    #[must_use]
    pub fn on_progress(&mut self, samples: u64) -> Vec<SchedulerEvent> {
        self.samples += samples;
        // Once every epoch's examples are in, the final evaluation follows the learners' end.
        if self.stopping || self.samples >= self.examples_per_epoch * self.epochs_total {
            return Vec::new();
        }
        let k = self.evals_per_epoch;
        let per_eval = (self.examples_per_epoch / k).max(1);
        let point = (self.samples / per_eval).min((self.epochs_total * k).saturating_sub(1));
        // Points passed in one step (the reports a scheduler that was away receives at once)
        // are one evaluation: the weights of the ones before are gone.
        if self.evals >= point {
            return Vec::new();
        }
        self.evals = point;
        vec![SchedulerEvent::Evaluate { epoch: point / k, final_: false }]
    }

    /// A learner's mean train loss over its last `steps` minibatches was `loss_sum / steps`. A
    /// non-finite loss, or one above [`DIVERGENCE_FACTOR`] times the first measured, means the
    /// run has diverged: it stops.
    #[must_use]
    pub fn on_loss(&mut self, steps: u64, loss_sum: f64) -> Vec<SchedulerEvent> {
        if steps == 0 || self.stopping {
            return Vec::new();
        }
        let loss = loss_sum / steps as f64;
        let first = *self.first_loss.get_or_insert(loss);
        if loss.is_finite() && loss <= DIVERGENCE_FACTOR * first {
            return Vec::new();
        }
        self.stopping = true;
        let epoch = self.evals / self.evals_per_epoch;
        let diverged = Divergence { train_loss: loss, first_loss: first };
        vec![
            SchedulerEvent::Diverged(diverged),
            SchedulerEvent::Evaluate { epoch, final_: true },
            SchedulerEvent::Stop,
        ]
    }

    /// A learner finished all its steps. Once every active learner has, the run ends.
    #[must_use]
    pub fn on_learner_finished(&mut self, learner: LearnerId) -> Vec<SchedulerEvent> {
        if self.finished.insert(learner) { self.finish_if_done() } else { Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_ten_times_the_first_or_not_finite_is_divergence() {
        let started = || {
            let mut s = SchedulerCore::new(1, 1, 100, 2);
            let _ = s.on_shard_joined(ShardId(0));
            let _ = s.on_learner_joined(LearnerId(0));
            s
        };
        let mut s = started();
        assert!(s.on_loss(8, 8.0 * 2.3).is_empty(), "the first loss is the baseline");
        assert!(s.on_loss(8, 8.0 * 23.0).is_empty(), "ten times the first is not yet divergence");
        let events = s.on_loss(4, 4.0 * 23.5);
        let d = Divergence { train_loss: 23.5, first_loss: 2.3 };
        assert_eq!(events[0], SchedulerEvent::Diverged(d));
        assert!(matches!(events[1], SchedulerEvent::Evaluate { final_: true, .. }));
        assert_eq!(events[2], SchedulerEvent::Stop);
        assert!(s.on_loss(1, f64::NAN).is_empty(), "it stops once");
        let mut s = started();
        let _ = s.on_loss(1, 2.0);
        assert!(matches!(s.on_loss(2, f64::NAN)[0], SchedulerEvent::Diverged(d) if d.train_loss.is_nan()));
        let mut s = started();
        assert!(matches!(s.on_loss(1, f64::INFINITY)[0], SchedulerEvent::Diverged(_)), "even the first");
        assert!(started().on_loss(0, 0.0).is_empty(), "no steps, no loss");
    }

    #[test]
    fn with_backups_the_run_ends_once_all_but_the_backups_have_finished() {
        let mut s = SchedulerCore::new(3, 1, 100, 1).with_backups(1);
        let _ = s.on_shard_joined(ShardId(0));
        for l in 0..3 {
            let _ = s.on_learner_joined(LearnerId(l));
        }
        assert!(s.on_learner_finished(LearnerId(2)).is_empty(), "one of the two needed");
        let events = s.on_learner_finished(LearnerId(0));
        assert!(matches!(events[0], SchedulerEvent::Evaluate { final_: true, .. }), "{events:?}");
        assert_eq!(events[1], SchedulerEvent::Stop, "learner 1 is cut off");
    }

    #[test]
    fn starts_when_all_joined_schedules_epochs_and_stops() {
        let mut s = SchedulerCore::new(2, 1, 100, 3);
        assert!(s.on_learner_joined(LearnerId(0)).is_empty());
        assert!(s.on_shard_joined(ShardId(0)).is_empty());
        assert_eq!(s.on_learner_joined(LearnerId(1)), vec![SchedulerEvent::Start]);
        assert!(s.on_learner_joined(LearnerId(1)).is_empty(), "starts once");
        assert_eq!(s.learners_alive(), 2);
        assert!(s.on_progress(99).is_empty());
        assert_eq!(
            s.on_progress(102),
            vec![SchedulerEvent::Evaluate { epoch: 2, final_: false }],
            "two points passed at once are one evaluation"
        );
        assert!(s.on_progress(100).is_empty(), "the last boundary is left to the final evaluation");
        assert!(s.on_learner_finished(LearnerId(0)).is_empty());
        assert!(s.on_learner_finished(LearnerId(0)).is_empty(), "finishing twice counts once");
        assert_eq!(
            s.on_learner_finished(LearnerId(1)),
            vec![SchedulerEvent::Evaluate { epoch: 2, final_: true }, SchedulerEvent::Stop]
        );
    }

    #[test]
    fn a_detector_that_did_not_look_for_a_while_reads_its_heartbeats_before_it_accuses() {
        let ms = Duration::from_millis;
        let mut s = SchedulerCore::new(2, 1, 100, 1).with_failure_timeout(ms(500));
        let _ = s.on_shard_joined(ShardId(0));
        for l in 0..2 {
            let _ = s.on_learner_joined(LearnerId(l));
            assert!(s.on_heard(LearnerId(l), ms(0)).is_empty());
        }
        assert!(s.on_tick(ms(100)).is_empty());
        assert!(s.on_tick(ms(2000)).is_empty(), "the scheduler was busy from 100 to 2000 ms");
        // The heartbeat learner 0 sent while the scheduler was busy is read now.
        assert!(s.on_heard(LearnerId(0), ms(2010)).is_empty());
        assert_eq!(s.on_tick(ms(2100)), vec![SchedulerEvent::Lost(LearnerId(1)), SchedulerEvent::Membership]);
    }

    #[test]
    fn silent_learners_are_lost_and_rejoin_and_the_run_ends_with_those_alive() {
        let ms = Duration::from_millis;
        let mut s = SchedulerCore::new(3, 1, 100, 1).with_failure_timeout(ms(500));
        let _ = s.on_shard_joined(ShardId(0));
        for l in 0..3 {
            let _ = s.on_learner_joined(LearnerId(l));
            assert!(s.on_heard(LearnerId(l), ms(0)).is_empty());
        }
        assert!(s.on_tick(ms(400)).is_empty());
        assert!(s.on_heard(LearnerId(0), ms(450)).is_empty());
        assert!(s.on_heard(LearnerId(1), ms(450)).is_empty());
        let lost = s.on_tick(ms(600));
        assert_eq!(lost, vec![SchedulerEvent::Lost(LearnerId(2)), SchedulerEvent::Membership]);
        assert_eq!(s.active(), [LearnerId(0), LearnerId(1)].into_iter().collect());
        assert_eq!(s.learners_alive(), 2);
        // Healed: it is heard again and rejoins.
        assert_eq!(
            s.on_heard(LearnerId(2), ms(700)),
            vec![SchedulerEvent::Rejoined(LearnerId(2)), SchedulerEvent::Membership]
        );
        assert!(s.on_learner_finished(LearnerId(0)).is_empty());
        assert!(s.on_learner_finished(LearnerId(1)).is_empty());
        // Learner 2 crashes for good: its connection closes and the run ends without it.
        assert_eq!(
            s.on_disconnected(LearnerId(2)),
            vec![
                SchedulerEvent::Lost(LearnerId(2)),
                SchedulerEvent::Membership,
                SchedulerEvent::Evaluate { epoch: 0, final_: true },
                SchedulerEvent::Stop
            ]
        );
        assert!(s.on_tick(ms(5000)).is_empty(), "nothing after the end");
    }

    #[test]
    fn a_shard_that_sends_heartbeats_is_lost_when_silent_and_back_when_heard() {
        let ms = Duration::from_millis;
        let mut s = SchedulerCore::new(1, 2, 100, 1).with_failure_timeout(ms(500));
        for shard in 0..2 {
            let _ = s.on_shard_joined(ShardId(shard));
        }
        let _ = s.on_learner_joined(LearnerId(0));
        assert!(s.on_shard_heard(ShardId(1), ms(0)).is_empty());
        assert!(s.on_heard(LearnerId(0), ms(0)).is_empty());
        assert!(s.on_tick(ms(200)).is_empty());
        assert!(s.on_tick(ms(400)).is_empty());
        assert!(s.on_heard(LearnerId(0), ms(400)).is_empty());
        // Shard 0 never sent a heartbeat (it lives in this process): it is never accused.
        assert_eq!(s.on_tick(ms(600)), vec![SchedulerEvent::ShardSilent(ShardId(1))]);
        assert!(s.on_heard(LearnerId(0), ms(700)).is_empty());
        assert!(s.on_tick(ms(800)).is_empty(), "once");
        assert_eq!(s.on_shard_heard(ShardId(1), ms(900)), vec![SchedulerEvent::ShardBack(ShardId(1))]);
        assert!(s.on_shard_heard(ShardId(1), ms(950)).is_empty());
    }

    #[test]
    fn evaluates_k_times_per_epoch() {
        let mut s = SchedulerCore::new(1, 1, 100, 2).with_evals_per_epoch(4);
        let points: Vec<u64> = (0..10)
            .flat_map(|_| s.on_progress(25))
            .map(|e| match e {
                SchedulerEvent::Evaluate { epoch, final_: false } => epoch,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(points, vec![0, 0, 0, 1, 1, 1, 1], "7 points; the 8th is the final evaluation");
    }

    #[test]
    fn a_report_that_brings_every_example_leaves_the_evaluation_to_the_end() {
        let mut s = SchedulerCore::new(1, 1, 100, 3);
        let _ = (s.on_shard_joined(ShardId(0)), s.on_learner_joined(LearnerId(0)));
        assert_eq!(s.on_progress(150), vec![SchedulerEvent::Evaluate { epoch: 1, final_: false }]);
        // A scheduler that was away hears the rest at once: one evaluation, the final one.
        assert!(s.on_progress(150).is_empty());
        assert_eq!(
            s.on_learner_finished(LearnerId(0)),
            vec![SchedulerEvent::Evaluate { epoch: 1, final_: true }, SchedulerEvent::Stop]
        );
    }
}
