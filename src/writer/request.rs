//! What producers, groups and the broker ask of the writer.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::consumer::StartFrom;
use crate::error::{AckError, CommitError, QueueError, RedriveError, StorageError, SubscribeError};
use crate::registry::{GroupState, QueueState};
use crate::store::records::ClaimRecord;
use crate::work::WorkGroupState;

pub(crate) enum Request {
    CreateQueue {
        name: String,
        reply: oneshot::Sender<Result<Arc<QueueState>, QueueError>>,
    },
    CreateGroup {
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: oneshot::Sender<Result<Arc<GroupState>, SubscribeError>>,
    },
    /// Creates a work-queue group (or returns the existing one).
    CreateWorkGroup {
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: oneshot::Sender<Result<Arc<WorkGroupState>, SubscribeError>>,
    },
    /// Persist claims (attempt counts) before their handlers run. Refused with `LeaseLost`
    /// if the group was reset since `epoch`.
    Claim {
        group: Arc<WorkGroupState>,
        epoch: u64,
        claims: Vec<(u64, ClaimRecord)>,
        reply: oneshot::Sender<Result<(), AckError>>,
    },
    /// Record the outcome of one attempt, claimed in reset epoch `epoch`. If the writer
    /// refuses it, it puts the message back to claimable itself.
    Settle {
        group: Arc<WorkGroupState>,
        seq: u64,
        attempt: u32,
        epoch: u64,
        outcome: Outcome,
        reply: oneshot::Sender<Result<(), AckError>>,
    },
    /// Move dead letters `(expected, last]` of `dlq` to their targets and advance its cursor.
    Redrive {
        dlq: Arc<QueueState>,
        expected: u64,
        last: u64,
        items: Vec<RedriveItem>,
        reply: RedriveReply,
    },
    /// Persist a queue's retention policy.
    SetRetention {
        queue: Arc<QueueState>,
        retention: crate::Retention,
        reply: oneshot::Sender<Result<(), QueueError>>,
    },
    /// Delete a queue's messages up to `to` (one range tombstone) and move its first sequence.
    /// `to` was computed under `policy`: the writer re-checks it when it applies the trim.
    Trim {
        queue: Arc<QueueState>,
        to: u64,
        policy: crate::Retention,
        reply: oneshot::Sender<Result<u64, QueueError>>,
    },
    /// Set an ordered group's offset (replay).
    ResetOffset {
        group: Arc<GroupState>,
        offset: u64,
        reply: oneshot::Sender<Result<(), crate::error::ResetError>>,
    },
    /// Set a work-queue group's offset (replay): its claims are deleted.
    ResetWorkOffset {
        group: Arc<WorkGroupState>,
        offset: u64,
        reply: oneshot::Sender<Result<(), crate::error::ResetError>>,
    },
    /// Change a group's settings record (pause, dead-letter queue).
    GroupSettings {
        queue: Arc<QueueState>,
        group: String,
        change: SettingsChange,
        reply: oneshot::Sender<Result<(), crate::error::PauseError>>,
    },
    /// Wake-up only: a group became dirty while the writer was idle.
    Commit,
    /// Reply once every acknowledgement recorded before this request is durable.
    Flush {
        reply: oneshot::Sender<Result<(), CommitError>>,
    },
    /// Finish everything queued before this, sync the WAL, and stop.
    Shutdown {
        reply: oneshot::Sender<Result<(), StorageError>>,
    },
}

/// One change to a group's settings; the writer applies it to the latest record, so
/// concurrent changes of different fields do not undo each other.
#[derive(Debug, Clone)]
pub(crate) enum SettingsChange {
    Paused(bool),
    DeadLetterQueue(String),
}

/// What became of one attempt of a work-queue message.
pub(crate) enum Outcome {
    /// Finished: the offset may pass it.
    Ack,
    /// Failed; try again after `delay` (the record holds the retry time and the error).
    Retry { record: ClaimRecord, delay: std::time::Duration },
    /// Move it to the dead-letter queue `dlq`.
    DeadLetter { reason: String, dlq: Arc<str> },
}

/// Answer to a redrive: the queue and new sequence of each moved message.
pub(crate) type RedriveReply = oneshot::Sender<Result<Vec<(Arc<str>, u64)>, RedriveError>>;

/// One dead letter on its way back.
pub(crate) struct RedriveItem {
    pub dlq_seq: u64,
    pub target: Arc<str>,
    pub envelope: Vec<u8>,
}
