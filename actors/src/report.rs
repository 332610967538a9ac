//! What a run reports: every evaluation ([`MetricsRow`]), progress between them, the timeline of
//! membership changes and faults, and the final [`RunReport`].

use actix::Message;
use rudra_transport::LearnerId;
use serde::{Deserialize, Serialize};

use crate::goodput::{LearnerClocks, LearnerCounts, LearnerSeconds, LearnerTime, goodput};
use rudra_proto::{SchedulerCore, StalenessSummary};

/// One evaluation of the model during a run (a row of `metrics.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// Seconds since the learners started.
    pub wall_seconds: f64,
    /// Epochs processed, over all learners.
    pub epoch: f64,
    /// Updates applied by the shards.
    pub updates: u64,
    /// Examples processed, over all learners.
    pub samples: u64,
    /// Mean minibatch loss since the previous row (NaN when none; JSON writes `null`).
    #[serde(deserialize_with = "nan_if_null")]
    pub train_loss: f64,
    /// Mean cross-entropy on the test set.
    pub test_loss: f64,
    /// Fraction of the test set classified correctly.
    pub test_accuracy: f64,
    /// ⟨σ⟩ of all gradients applied so far.
    pub mean_staleness: f64,
    /// `samples / wall_seconds`.
    pub samples_per_second: f64,
    /// Examples processed so far by each learner, by learner id.
    pub learner_samples: Vec<u64>,
    /// What the learners' messages carried so far.
    pub bytes: BytesMoved,
    /// Each learner's seconds so far, by learner id: computing, and the rest.
    #[serde(default)]
    pub learner_seconds: Vec<LearnerSeconds>,
    /// Goodput so far ([`goodput`]; NaN before any learner time).
    #[serde(default = "no_goodput", deserialize_with = "nan_if_null")]
    pub goodput: f64,
}

fn no_goodput() -> f64 {
    f64::NAN
}

/// What the learners' messages carried, summed over learners: payload bytes as encoded, in
/// all and in each direction, and the frame bytes their connections moved (0 in one process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytesMoved {
    /// Gradient steps taken.
    pub steps: u64,
    /// Bytes of payload values and scales sent and received.
    pub payload: u64,
    /// Of them, those the learners sent: gradients, and the exchanges of the elastic family
    /// (pseudo-gradients, for DiLoCo).
    #[serde(default)]
    pub payload_up: u64,
    /// Of them, those the learners received: weights and centers.
    #[serde(default)]
    pub payload_down: u64,
    /// Frame bytes sent and received on the wire.
    pub wire: u64,
}

impl BytesMoved {
    /// Payload bytes per gradient step (sent and received by one learner).
    #[must_use]
    pub fn payload_per_step(&self) -> f64 {
        self.payload as f64 / self.steps.max(1) as f64
    }

    /// Payload bytes a learner sent per gradient step.
    #[must_use]
    pub fn payload_up_per_step(&self) -> f64 {
        self.payload_up as f64 / self.steps.max(1) as f64
    }

    /// Payload bytes a learner received per gradient step.
    #[must_use]
    pub fn payload_down_per_step(&self) -> f64 {
        self.payload_down as f64 / self.steps.max(1) as f64
    }

    /// Add the progress `msg` reports.
    pub fn add(&mut self, msg: &Progress) {
        self.steps += msg.steps;
        self.payload += msg.payload_up + msg.payload_down;
        self.payload_up += msg.payload_up;
        self.payload_down += msg.payload_down;
        self.wire += msg.wire_bytes;
    }

    /// Wire bytes per gradient step.
    #[must_use]
    pub fn wire_per_step(&self) -> f64 {
        self.wire as f64 / self.steps.max(1) as f64
    }
}

/// Training progress between evaluations.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressSnapshot {
    /// Examples processed so far.
    pub samples: u64,
    /// Examples the run will process.
    pub total_samples: u64,
    /// Epochs so far.
    pub epoch: f64,
    /// Mean loss of the latest minibatches.
    pub recent_loss: f64,
    /// Seconds since the learners started.
    pub wall_seconds: f64,
    /// Updates applied so far (by the shard that applied the most).
    pub updates: u64,
    /// ⟨σ⟩ of the gradients applied so far.
    pub mean_staleness: f64,
}

/// What an observer of a run is told.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEvent {
    /// Periodic progress.
    Progress(ProgressSnapshot),
    /// An evaluation finished.
    Evaluated(MetricsRow),
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Every evaluation, in order.
    pub metrics: Vec<MetricsRow>,
    /// The final parameters, assembled from the shards.
    pub params: Vec<f32>,
    /// Staleness over the run.
    pub staleness: StalenessSummary,
    /// Updates applied (per shard).
    pub updates: u64,
    /// Examples processed.
    pub samples: u64,
    /// Examples the run was to process: every learner's partition, every epoch (0 where not
    /// known, as in a simulation).
    pub samples_expected: u64,
    /// Examples processed by each learner, by learner id.
    pub learner_samples: Vec<u64>,
    /// Seconds from start to the final evaluation.
    pub wall_seconds: f64,
    /// Test accuracy at the end.
    pub final_test_accuracy: f64,
    /// Mean training loss over the last evaluation window.
    pub final_train_loss: f64,
    /// What happened to the cluster's membership, and the faults injected, in order.
    pub timeline: Vec<TimelineEntry>,
    /// Updates shards made and lost when they crashed: the clock at the crash minus the
    /// clock of the checkpoint they restarted from (summed over shards). Each is at most the
    /// checkpoint interval.
    pub updates_lost: u64,
    /// Whether and where the run diverged (it stopped then); `None` for a run that completed.
    pub diverged: Option<Diverged>,
    /// What the learners' messages carried over the run.
    pub bytes: BytesMoved,
    /// Each learner's compute and waiting time, and its contributions applied and dropped.
    pub learner_time: Vec<LearnerTime>,
    /// The learners' compute time that ended in applied contributions over all their time in
    /// the run (NaN where not measured).
    pub goodput: f64,
    /// With adaptive batch sizes, every learner's minibatch size in each epoch (`[e][l]`);
    /// empty with fixed sizes.
    pub batch_sizes: Vec<Vec<u32>>,
    /// Payload bytes each shard received (gradients or exchanges), by shard id.
    pub shard_payload_in: Vec<u64>,
}

impl RunReport {
    /// The report of a run that recorded nothing: it failed before its first evaluation.
    #[must_use]
    pub fn empty() -> Self {
        Self {
            metrics: Vec::new(),
            params: Vec::new(),
            staleness: StalenessSummary::default(),
            updates: 0,
            samples: 0,
            samples_expected: 0,
            learner_samples: Vec::new(),
            wall_seconds: 0.0,
            final_test_accuracy: f64::NAN,
            final_train_loss: f64::NAN,
            timeline: Vec::new(),
            updates_lost: 0,
            diverged: None,
            bytes: BytesMoved::default(),
            learner_time: Vec::new(),
            goodput: f64::NAN,
            batch_sizes: Vec::new(),
            shard_payload_in: Vec::new(),
        }
    }
}

/// Where a run diverged: its train loss became non-finite or exceeded
/// [`DIVERGENCE_FACTOR`](rudra_proto::DIVERGENCE_FACTOR) times its first measured value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diverged {
    /// Updates applied (per shard) when the run stopped.
    pub update: u64,
    /// The mean train loss that crossed the line (NaN or ±Inf when not finite; JSON writes
    /// those as `null`).
    #[serde(deserialize_with = "nan_if_null")]
    pub train_loss: f64,
    /// The first mean train loss the run measured.
    pub first_loss: f64,
}

/// What a learner has done since it started: the totals of one learner actor's life, told
/// again every few steps. Totals rather than increments, so a report lost on the way (a
/// scheduler that died, a connection that dropped) loses nothing: the next one carries it.
#[derive(Message, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Progress {
    /// The learner.
    pub learner: LearnerId,
    /// Which life of the learner these totals count: a learner started again starts from 0
    /// under a new session.
    pub session: u64,
    /// Examples in the minibatches computed.
    pub samples: u64,
    /// Gradients computed.
    pub steps: u64,
    /// Sum of the minibatches' mean training losses.
    pub loss_sum: f64,
    /// Payload bytes (values and scales, as encoded) the learner sent: gradients and exchanges.
    pub payload_up: u64,
    /// Payload bytes it received: weights and centers.
    pub payload_down: u64,
    /// Frame bytes its connections sent and received (0 in one process).
    pub wire_bytes: u64,
    /// Seconds it spent computing gradients.
    pub compute_seconds: f64,
}

impl Progress {
    /// Nothing computed yet by `learner` in a new session, unlike any other's.
    #[must_use]
    pub fn start(learner: LearnerId) -> Self {
        // Each `RandomState` draws fresh keys: its hash of a constant is a random number.
        let session = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        Self {
            learner,
            session,
            samples: 0,
            steps: 0,
            loss_sum: 0.0,
            payload_up: 0,
            payload_down: 0,
            wire_bytes: 0,
            compute_seconds: 0.0,
        }
    }

    /// What these totals add to `earlier`, the last totals taken from the same learner: the
    /// difference within a session, all of them from a new one, nothing from an older report
    /// of the same session.
    #[must_use]
    pub fn since(&self, earlier: Option<&Progress>) -> Option<Progress> {
        let Some(e) = earlier.filter(|e| e.session == self.session) else { return Some(self.clone()) };
        (self.steps >= e.steps && self.samples >= e.samples).then(|| Progress {
            samples: self.samples - e.samples,
            steps: self.steps - e.steps,
            loss_sum: self.loss_sum - e.loss_sum,
            payload_up: self.payload_up.saturating_sub(e.payload_up),
            payload_down: self.payload_down.saturating_sub(e.payload_down),
            compute_seconds: (self.compute_seconds - e.compute_seconds).max(0.0),
            wire_bytes: self.wire_bytes.saturating_sub(e.wire_bytes),
            ..self.clone()
        })
    }
}

/// What a scheduler restarted with `--resume` takes back: its core and what the run recorded
/// so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SchedulerState {
    /// The membership, epochs and evaluation points.
    pub core: SchedulerCore,
    /// Seconds since the scheduler started (its failure detector's clock).
    pub born_seconds: f64,
    /// Seconds the learners have trained.
    pub wall_seconds: f64,
    /// When the state was taken: seconds since the Unix epoch, by the system clock (the run
    /// goes on while no scheduler is there, and a resumed scheduler counts that time).
    pub taken_at: f64,
    /// Examples processed so far by each learner.
    pub learner_samples: Vec<u64>,
    /// Each learner's totals as last heard: a report that did not reach the scheduler before
    /// it went is counted from these by the next one.
    #[serde(default)]
    pub reported: Vec<Option<Progress>>,
    /// The evaluations so far.
    pub rows: Vec<MetricsRow>,
    /// The timeline so far.
    pub timeline: Vec<TimelineEntry>,
    /// Updates lost in shard crashes.
    pub updates_lost: u64,
    /// What the learners' messages carried.
    pub bytes: BytesMoved,
    /// Each learner's compute time, and when it finished or left.
    #[serde(default)]
    pub clocks: LearnerClocks,
    /// With adaptive batch sizes: the sizes chosen so far, and what counts towards the next.
    #[serde(default)]
    pub planner: Option<rudra_proto::BatchPlanner>,
}

impl SchedulerState {
    /// Seconds since the Unix epoch, by the system clock: what `taken_at` counts.
    #[must_use]
    pub fn now() -> f64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
    }

    /// What the run had recorded when this state was taken, as a report with no parameters:
    /// a run that stopped on an error keeps what it measured, with the `tracker`'s counts.
    #[must_use]
    pub fn report_so_far(&self, tracker: &TrackerReport) -> RunReport {
        let last = self.rows.last();
        let learner_time = self.clocks.times(self.wall_seconds, &tracker.by_learner);
        let (staleness, updates) = (tracker.staleness.clone(), tracker.updates);
        RunReport {
            batch_sizes: Vec::new(),
            shard_payload_in: tracker.shard_payload_in.clone(),
            metrics: self.rows.clone(),
            params: Vec::new(),
            staleness,
            updates,
            samples: self.learner_samples.iter().sum(),
            samples_expected: self.core.samples_expected(),
            learner_samples: self.learner_samples.clone(),
            wall_seconds: self.wall_seconds,
            final_test_accuracy: last.map_or(f64::NAN, |r| r.test_accuracy),
            final_train_loss: last.map_or(f64::NAN, |r| r.train_loss),
            timeline: self.timeline.clone(),
            updates_lost: self.updates_lost,
            diverged: None,
            bytes: self.bytes,
            goodput: goodput(&learner_time),
            learner_time,
        }
    }
}

/// One event of a run's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// Seconds since the scheduler started.
    pub seconds: f64,
    /// `injected` (a fault the plan caused), `detected` (what the cluster noticed) or
    /// `recovered` (a shard back from its checkpoint).
    pub kind: String,
    /// What happened, e.g. `learner-2 lost`.
    pub what: String,
}

/// Read a number that JSON may hold as `null` (serde_json writes NaN and ±Inf so) as NaN.
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// What the tracker knows (kept in a restarting scheduler's state).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TrackerReport {
    /// Staleness over all shards' gradients.
    pub staleness: StalenessSummary,
    /// Updates applied by the shard that applied the most (shards advance together).
    pub updates: u64,
    /// Each learner's contributions the shards applied and dropped, by learner id.
    #[serde(default)]
    pub by_learner: Vec<LearnerCounts>,
    /// Payload bytes each shard received, by shard id.
    #[serde(default)]
    pub shard_payload_in: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(p: &Progress, samples: u64, steps: u64) -> Progress {
        let loss_sum = steps as f64 * 0.5;
        let (payload_up, payload_down, wire_bytes) = (3 * steps, 7 * steps, 20 * steps);
        Progress { samples, steps, loss_sum, payload_up, payload_down, wire_bytes, ..p.clone() }
    }

    #[test]
    fn totals_count_what_a_lost_report_carried_once() {
        let first = Progress::start(LearnerId(2));
        let (a, b, c) = (totals(&first, 64, 2), totals(&first, 128, 4), totals(&first, 320, 10));
        assert_eq!(a.since(None), Some(a.clone()));
        // `b` was lost on the way: `c` carries its steps, and the three add up to c's totals.
        let after_a = c.since(Some(&a)).unwrap();
        assert_eq!((after_a.samples, after_a.steps, after_a.loss_sum), (256, 8, 4.0));
        let bytes = (after_a.payload_up, after_a.payload_down, after_a.wire_bytes);
        assert_eq!((bytes, after_a.learner), ((24, 56, 160), LearnerId(2)));
        let mut moved = BytesMoved::default();
        moved.add(&after_a);
        assert_eq!(moved, BytesMoved { steps: 8, payload: 80, payload_up: 24, payload_down: 56, wire: 160 });
        assert_eq!((moved.payload_up_per_step(), moved.payload_down_per_step()), (3.0, 7.0));
        assert_eq!(b.since(Some(&c)), None, "an older report of the same session adds nothing");
        assert_eq!(c.since(Some(&c)).map(|d| d.samples), Some(0));
    }

    #[test]
    fn a_new_session_counts_from_zero() {
        let (old, new) = (Progress::start(LearnerId(0)), Progress::start(LearnerId(0)));
        assert_ne!(old.session, new.session);
        let restarted = totals(&new, 32, 1);
        assert_eq!(restarted.since(Some(&totals(&old, 640, 20))), Some(restarted.clone()));
    }
}
