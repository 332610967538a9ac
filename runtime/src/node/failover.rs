//! Scheduler failover. The scheduler keeps its job's state in the run directory
//! (`scheduler.json`: the invitation every node was given, the scheduler's core and what the
//! run recorded, the tracker's counts), rewritten every [`STATE_EVERY`]. Shards and learners
//! go on training while it is away and keep their reports. A scheduler started with
//! `--resume RUN_DIR` reads the state back, waits for the job's nodes to join again and drives
//! the run to its end, into the same run directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use actix::Addr;
use rudra_actors::messages::{GetState, GetStats, TrackerReport};
use rudra_actors::scheduler::SchedulerActor;
use rudra_actors::tracker::StalenessTracker;
use rudra_actors::{RunReport, SchedulerState};
use rudra_transport::LearnerId;
use rudra_transport::quic::{Goodbye, QuicEndpoint};
use rudra_transport::{Role, ShardId};
use serde::{Deserialize, Serialize};

use super::join::{Invitation, Joiner, read_join};
use super::net;
use crate::{Config, RunDir, RuntimeError};

/// The state file in the run directory.
pub const STATE_FILE: &str = "scheduler.json";
/// How often the scheduler rewrites its state: a restarted scheduler loses at most the records
/// of this long before the crash.
pub const STATE_EVERY: Duration = Duration::from_secs(1);

/// What a restarted scheduler needs to take its job back.
#[derive(Serialize, Deserialize)]
pub(super) struct JobState {
    /// What every node of the job was told.
    pub(super) invitation: Invitation,
    /// The scheduler's state.
    pub(super) scheduler: SchedulerState,
    /// The tracker's counts.
    pub(super) tracker: TrackerReport,
}

impl JobState {
    /// Read the state in run directory `dir`, naming the file in any error.
    pub(super) fn read(dir: &Path) -> Result<Self, RuntimeError> {
        let path = dir.join(STATE_FILE);
        let input = |message: String| RuntimeError::Input { path: path.clone(), message };
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => input(
                "no scheduler state: the run in this directory has finished (see its summary.json) or never \
                 started; there is nothing to take back"
                    .into(),
            ),
            _ => input(format!("cannot read: {e}")),
        })?;
        let state: Self =
            serde_json::from_str(&text).map_err(|e| input(format!("not a scheduler's state: {e}")))?;
        state.check().map_err(|why| input(format!("is not a state any run writes: it {why}")))?;
        Ok(state)
    }

    /// Refuse what no run could have written: node counts that disagree, ids out of range,
    /// negative or unordered times.
    fn check(&self) -> Result<(), String> {
        let s = &self.scheduler;
        s.core.check()?;
        let (learners, shards) = s.core.size();
        let inv = &self.invitation;
        if inv.learner_names.len() != learners as usize
            || inv.shard_names.len() != shards as usize
            || inv.shard_addrs.len() != shards as usize
        {
            return Err(format!(
                "invites {} learners and {} shards ({} addresses) to a run of {learners} and {shards}",
                inv.learner_names.len(),
                inv.shard_names.len(),
                inv.shard_addrs.len()
            ));
        }
        if s.learner_samples.len() > learners as usize || s.reported.len() > learners as usize {
            return Err(format!("counts the samples of more than the run's {learners} learners"));
        }
        let time = |t: f64| t.is_finite() && t >= 0.0;
        if !(time(s.born_seconds) && time(s.wall_seconds) && time(s.taken_at)) {
            return Err("has a negative or non-finite time".into());
        }
        let walls: Vec<f64> = s.rows.iter().map(|r| r.wall_seconds).collect();
        if !walls.iter().all(|&t| time(t)) || walls.windows(2).any(|w| w[1] < w[0]) {
            return Err("has evaluations out of time order".into());
        }
        Ok(())
    }

    /// Write the state into `dir`.
    pub(super) fn write(&self, dir: &RunDir) -> Result<(), RuntimeError> {
        let text = serde_json::to_string(self).map_err(|e| RuntimeError::Config(e.to_string()))?;
        dir.write_file(STATE_FILE, &text)
    }

    /// What the run had recorded when the state was written.
    fn so_far(&self) -> RunReport {
        self.scheduler.report_so_far(&self.tracker)
    }
}

/// What the run in directory `dir` had recorded by the scheduler's last state (nothing if it
/// wrote none): a run that stops on an error keeps it.
#[must_use]
pub fn recorded_so_far(dir: &Path) -> RunReport {
    JobState::read(dir).map_or_else(|_| RunReport::empty(), |s| s.so_far())
}

/// The configuration of the job whose state is in run directory `dir`.
pub fn resumed_config(dir: &Path) -> Result<Config, RuntimeError> {
    Config::from_toml(&JobState::read(dir)?.invitation.config_toml)
}

/// Every [`STATE_EVERY`], write the job's state (the scheduler's and the tracker's) into `dir`,
/// with `metrics.csv` and `timeline.json` of what the run has recorded, until the scheduler
/// stops.
pub(super) async fn keep_state(
    dir: RunDir,
    invitation: Invitation,
    scheduler: Addr<SchedulerActor>,
    tracker: Addr<StalenessTracker>,
) {
    let mut tick = tokio::time::interval(STATE_EVERY);
    loop {
        tick.tick().await;
        let (Ok(scheduler_state), Ok(counts)) =
            (scheduler.send(GetState).await, tracker.send(GetStats).await)
        else {
            return; // The run is over.
        };
        let job = JobState { invitation: invitation.clone(), scheduler: scheduler_state, tracker: counts };
        if let Err(e) = job.write(&dir).and_then(|()| dir.record_so_far(&job.so_far())) {
            tracing::warn!("{e}; a restarted scheduler would go on from an older state");
        }
    }
}

/// The nodes of a resumed job that joined again: every shard, and the learners that did within
/// the time given (by id).
pub(super) struct Rejoined {
    pub(super) shards: Vec<Joiner>,
    pub(super) learners: BTreeMap<LearnerId, Joiner>,
}

/// Wait for the nodes of the job `inv` to join again: every shard (at the address the learners
/// know), and the learners in `waiting` (those running when the scheduler went), within
/// `within`. A shard that is not back in time is an error; a learner that is not counts as lost
/// (and may join again later).
pub(super) async fn regather(
    ep: &QuicEndpoint,
    inv: &Invitation,
    waiting: &BTreeSet<LearnerId>,
    within: Duration,
) -> Result<Rejoined, RuntimeError> {
    let mut shards: BTreeMap<ShardId, Joiner> = BTreeMap::new();
    let mut learners = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + within;
    while shards.len() < inv.shard_names.len() || !waiting.iter().all(|l| learners.contains_key(l)) {
        let next = match tokio::time::timeout_at(deadline, ep.accept()).await {
            Ok(Some(Ok(peer))) => peer,
            Ok(Some(Err(e))) => {
                tracing::warn!("refused a node: {e}");
                continue;
            }
            Ok(None) => return Err(net("the endpoint closed")),
            Err(_) if shards.len() == inv.shard_names.len() => break,
            Err(_) => {
                let missing: Vec<&str> = (inv.shard_names.iter().enumerate())
                    .filter(|(s, _)| !shards.contains_key(&ShardId(*s as u32)))
                    .map(|(_, n)| n.as_str())
                    .collect();
                return Err(net(format!("shards {missing:?} did not join again within {within:?}")));
            }
        };
        let Some((rx, data_addr)) = read_join(&next).await else { continue };
        let j = Joiner { peer: next, rx, data_addr };
        let (role, id) = match inv.seat_of(&j) {
            Ok(seat) => seat,
            Err((goodbye, why)) => {
                j.peer.say_goodbye(goodbye, &why);
                continue;
            }
        };
        let taken = match role {
            Role::Shard => shards.contains_key(&ShardId(id)),
            _ => learners.contains_key(&LearnerId(id)),
        };
        if taken {
            let why = format!("{} has joined again already", j.peer.name());
            j.peer.say_goodbye(Goodbye::Duplicate, &why);
            continue;
        }
        tracing::info!(peer = j.peer.name(), "joined again");
        match role {
            Role::Shard => shards.insert(ShardId(id), j),
            _ => learners.insert(LearnerId(id), j),
        };
    }
    Ok(Rejoined { shards: shards.into_values().collect(), learners })
}

impl Invitation {
    /// The seat of a node of this job that joins again: its role and id, or why it is refused.
    pub(super) fn seat_of(&self, j: &Joiner) -> Result<(Role, u32), (Goodbye, String)> {
        let (names, role) = match j.peer.role() {
            Role::Shard => (&self.shard_names, "shard"),
            Role::Learner => (&self.learner_names, "learner"),
            // A group's rounds lived in its aggregator: it does not take a seat again.
            other => {
                let why = format!("a {} does not rejoin a running job", other.as_str());
                return Err((Goodbye::Refused, why));
            }
        };
        let name = j.peer.name();
        let Some(id) = names.iter().position(|n| n == name) else {
            tracing::warn!(peer = name, "refused: not a {role} of the running job");
            return Err((
                Goodbye::Refused,
                format!("the job is running and {name} is not one of its {role}s"),
            ));
        };
        if j.peer.role() == Role::Shard && self.shard_addrs[id] != j.data_addr {
            let known = &self.shard_addrs[id];
            tracing::error!(
                peer = name,
                "refused: it came back at {}, the learners know it at {known}; restart it with --listen {known}",
                j.data_addr
            );
            return Err((Goodbye::Refused, format!("restart {name} at the address it had, {known}")));
        }
        Ok((j.peer.role(), id as u32))
    }
}

#[cfg(test)]
mod tests {
    use rudra_actors::goodput::LearnerClocks;
    use rudra_actors::messages::TrackerReport;
    use rudra_actors::{BytesMoved, SchedulerState};
    use rudra_proto::SchedulerCore;

    use super::*;

    /// The state of a run of 2 learners and 1 shard just started.
    fn state() -> JobState {
        let invitation = Invitation {
            config_toml: String::new(),
            train_examples: 100,
            shard_addrs: vec!["127.0.0.1:7071".into()],
            shard_names: vec!["shard-0".into()],
            learner_names: vec!["learner-0".into(), "learner-1".into()],
            job: "0123456789abcdef".into(),
            groups: Vec::new(),
            hierarchical: false,
            aggregator_addrs: Vec::new(),
            aggregator_names: Vec::new(),
        };
        let scheduler = SchedulerState {
            core: SchedulerCore::new(2, 1, 100, 1),
            born_seconds: 1.0,
            wall_seconds: 0.5,
            taken_at: 1.7e9,
            learner_samples: vec![32, 32],
            reported: Vec::new(),
            rows: Vec::new(),
            timeline: Vec::new(),
            updates_lost: 0,
            bytes: BytesMoved::default(),
            clocks: LearnerClocks::new(2),
            planner: None,
        };
        JobState { invitation, scheduler, tracker: TrackerReport::default() }
    }

    #[test]
    fn a_state_no_run_writes_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let write =
            |s: &JobState| std::fs::write(dir.path().join(STATE_FILE), serde_json::to_string(s).unwrap());
        write(&state()).unwrap();
        assert!(JobState::read(dir.path()).is_ok());
        let mut three = state();
        three.scheduler.learner_samples = vec![1, 2, 3];
        let mut unnamed = state();
        unnamed.invitation.learner_names.pop();
        let mut negative = state();
        negative.scheduler.wall_seconds = -1.0;
        let mut core = state();
        core.scheduler.core = SchedulerCore::new(2, 1, 100, 0);
        for (bad, why) in [
            (three, "more than the run's 2 learners"),
            (unnamed, "invites 1 learners"),
            (negative, "negative"),
            (core, "no epochs"),
        ] {
            write(&bad).unwrap();
            let Err(e) = JobState::read(dir.path()) else { panic!("{why}: accepted") };
            let e = e.to_string();
            assert!(e.contains(STATE_FILE) && e.contains(why), "{e}");
        }
    }
}
