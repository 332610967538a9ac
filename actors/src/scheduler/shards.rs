//! The scheduler's side of the shards' lives: lost, alive again, failed, restarted from a
//! checkpoint; and of the learner groups' aggregators on other nodes: lost.

use actix::prelude::*;
use rudra_transport::ShardId;

use super::SchedulerActor;
use crate::ActorError;
use crate::messages::{AggregatorLost, Membership, ShardAlive, ShardFailed, ShardLost, ShardRestarted};

impl Handler<ShardLost> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, ShardLost(shard): ShardLost, ctx: &mut Context<Self>) {
        self.shard_lost(shard, "its connection ended", ctx);
    }
}

impl Handler<ShardAlive> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, ShardAlive(shard): ShardAlive, ctx: &mut Context<Self>) {
        let events = self.core.on_shard_heard(shard, self.born.elapsed());
        self.carry_out(events, ctx);
    }
}

impl Handler<ShardFailed> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ShardFailed, ctx: &mut Context<Self>) {
        if self.report.is_some() {
            tracing::error!(shard = %msg.shard, "shard failed: {}", msg.reason);
            self.note("detected", format!("{} failed: {}", msg.shard, msg.reason));
            self.finish(Err(ActorError::ShardFailed(msg.shard, msg.reason)), ctx);
        }
    }
}

impl Handler<AggregatorLost> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: AggregatorLost, ctx: &mut Context<Self>) {
        if self.report.is_some() {
            tracing::error!(group = msg.group, "aggregator lost: {}", msg.why);
            self.note("detected", format!("the aggregator of group {} lost: {}", msg.group, msg.why));
            self.finish(Err(ActorError::AggregatorLost(msg.group, msg.why)), ctx);
        }
    }
}

impl SchedulerActor {
    /// `shard` is gone (`why`): unless it is back within the shard timeout, the run stops.
    pub(super) fn shard_lost(&mut self, shard: ShardId, why: &str, ctx: &mut Context<Self>) {
        if self.report.is_none() || self.shards_down.contains_key(&shard) {
            return; // The run is over and the shards are hanging up, or it is known.
        }
        tracing::warn!(%shard, "shard lost ({why}); waiting {:?} for it to come back", self.shard_timeout);
        self.note("detected", format!("{shard} lost"));
        self.shard_losses += 1;
        let loss = self.shard_losses;
        self.shards_down.insert(shard, loss);
        ctx.run_later(self.shard_timeout, move |act, ctx| {
            if act.shards_down.get(&shard) == Some(&loss) {
                let why = format!(
                    "not back within {:?}; restart it (`rudra-node --role shard --resume DIR`) and the run",
                    act.shard_timeout
                );
                act.finish(Err(ActorError::ShardFailed(shard, why)), ctx);
            }
        });
    }
}

impl Handler<ShardRestarted> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ShardRestarted, ctx: &mut Context<Self>) {
        match msg.resumed {
            Ok(resumed) => {
                self.shards_down.remove(&msg.shard);
                // The restarted shard learns who is active now.
                if let Some(s) = self.members.shards.get(msg.shard.index()) {
                    s.membership.do_send(Membership { active: self.core.active() });
                }
                let lost = msg.crashed_at.0.saturating_sub(resumed.0);
                self.updates_lost += lost;
                let what = format!(
                    "{} restarted from its checkpoint at clock {resumed}: {lost} updates lost",
                    msg.shard
                );
                tracing::info!("{what}");
                self.note("recovered", what);
            }
            Err(error) => {
                tracing::error!(shard = %msg.shard, "could not restart: {error}");
                self.finish(Err(ActorError::ShardFailed(msg.shard, error)), ctx);
            }
        }
    }
}
