//! The kind of each message, as frame headers carry it, and which roles send and receive it.

use crate::Role;

/// Message kinds, as written in frame headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[allow(missing_docs)]
pub enum Kind {
    Join = 1,
    Welcome,
    Ready,
    Start,
    Stop,
    Progress,
    LearnerDone,
    Records,
    SnapshotRequest,
    Snapshot,
    Heartbeat,
    Hello,
    Pull,
    Weights,
    Push,
    Exchange,
    Membership,
    Resumed,
    Center,
    Evaluate,
    Evaluated,
    Summary,
    BatchSizes,
    Aggregate,
}

const KINDS: [Kind; 24] = [
    Kind::Join,
    Kind::Welcome,
    Kind::Ready,
    Kind::Start,
    Kind::Stop,
    Kind::Progress,
    Kind::LearnerDone,
    Kind::Records,
    Kind::SnapshotRequest,
    Kind::Snapshot,
    Kind::Heartbeat,
    Kind::Hello,
    Kind::Pull,
    Kind::Weights,
    Kind::Push,
    Kind::Exchange,
    Kind::Membership,
    Kind::Resumed,
    Kind::Center,
    Kind::Evaluate,
    Kind::Evaluated,
    Kind::Summary,
    Kind::BatchSizes,
    Kind::Aggregate,
];

impl Kind {
    /// The kind with this header code.
    #[must_use]
    pub fn from_u16(code: u16) -> Option<Self> {
        KINDS.iter().copied().find(|k| *k as u16 == code)
    }

    /// The roles allowed to send this kind.
    #[must_use]
    pub fn senders(self) -> &'static [Role] {
        match self {
            Self::Join => &[Role::Shard, Role::Learner, Role::Aggregator],
            Self::Heartbeat => &[Role::Shard, Role::Learner, Role::Scheduler, Role::Aggregator],
            Self::Welcome
            | Self::Start
            | Self::Stop
            | Self::SnapshotRequest
            | Self::Membership
            | Self::Evaluate
            | Self::Summary
            | Self::BatchSizes => &[Role::Scheduler],
            Self::Ready | Self::Evaluated | Self::Progress | Self::LearnerDone | Self::Exchange => {
                &[Role::Learner]
            }
            // An aggregator speaks for its group to the shards.
            Self::Hello | Self::Pull | Self::Push => &[Role::Learner, Role::Aggregator],
            Self::Aggregate => &[Role::Aggregator],
            Self::Records | Self::Snapshot | Self::Center | Self::Resumed => &[Role::Shard],
            // An aggregator answers its members with the weights the shard gave the group.
            Self::Weights => &[Role::Shard, Role::Aggregator],
        }
    }
}

impl Kind {
    /// The roles allowed to receive this kind.
    #[must_use]
    pub fn receivers(self) -> &'static [Role] {
        match self {
            Self::Join
            | Self::Ready
            | Self::Progress
            | Self::LearnerDone
            | Self::Records
            | Self::Snapshot
            | Self::Resumed
            | Self::Evaluated => &[Role::Scheduler],
            Self::Heartbeat | Self::Stop => &[Role::Shard, Role::Learner, Role::Scheduler, Role::Aggregator],
            Self::Welcome => &[Role::Shard, Role::Learner, Role::Aggregator],
            Self::Start => &[Role::Shard, Role::Learner],
            Self::SnapshotRequest | Self::Exchange | Self::Aggregate => &[Role::Shard],
            Self::Hello | Self::Pull | Self::Push | Self::Membership => &[Role::Shard, Role::Aggregator],
            Self::Weights => &[Role::Learner, Role::Aggregator],
            Self::Center | Self::Evaluate | Self::Summary | Self::BatchSizes => &[Role::Learner],
        }
    }

    /// Whether this kind carries a large float payload on the data path, and so gets a stream
    /// of its own. (Snapshots, once per evaluation, stay on the control stream, in order with
    /// the staleness records they must follow.)
    #[must_use]
    pub fn is_payload(self) -> bool {
        matches!(self, Self::Weights | Self::Center | Self::Push | Self::Aggregate | Self::Exchange)
    }
}
