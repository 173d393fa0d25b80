//! An operator's action on one job of a work group — retry it now, delete it, dead-letter it
//! — as Sidekiq's and BullMQ's consoles offer. The job is taken the way a holder settles it
//! (`WorkGroupState::operator_take` fences it: nobody claims or settles it meanwhile), then
//! the outcome goes to the writer as a holder's would: the same records, the same events, the
//! same atomicity (a dead letter's copy, its claim and the offset move in one batch).
//!
//! A job held by a live lease is refused, not stolen: its handler may be running, and taking
//! it would let two parties decide its outcome.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::engine::boundary::{
    Capability, Outcome, Refused, Request, Shared, TakenFrom, WorkGroupState, WorkRequest,
};
use crate::error::Error;
use crate::model::Claim;

/// What an operator does to one job.
#[derive(Debug, Clone)]
pub(crate) enum JobAction {
    /// A job waiting for a retry becomes claimable now, its attempts unchanged.
    RetryNow,
    /// Finished without running: the group moves past it as if it were acked.
    Delete,
    /// Moved to the group's dead-letter queue with this reason.
    DeadLetter(String),
}

impl JobAction {
    fn name(&self) -> &'static str {
        match self {
            JobAction::RetryNow => "retry now",
            JobAction::Delete => "delete",
            JobAction::DeadLetter(_) => "dead-letter",
        }
    }
}

/// Refuses job actions on an engine that does not carry them out (before any lookup, so the
/// refusal names what is missing).
pub(crate) fn check(shared: &Shared) -> Result<(), Error> {
    shared.check(Capability::JobActions)
}

/// Carries out `action` on message `seq` of work group `group`.
pub(crate) async fn act(
    shared: &Arc<Shared>,
    group: &Arc<WorkGroupState>,
    seq: u64,
    action: JobAction,
) -> Result<(), Error> {
    shared.check(Capability::JobActions)?;
    if shared.is_closed() {
        return Err(Error::Shutdown);
    }
    if group.is_deleted() {
        return Err(Error::GroupDeleted {
            queue: group.queue.name.to_string(),
            group: group.name.to_string(),
        });
    }
    let (queue, name) = (group.queue.name.to_string(), group.name.to_string());
    let clock = shared.clock();
    let now = clock.now();
    let taken =
        group.operator_take(seq, now, matches!(action, JobAction::RetryNow)).map_err(|r| match r {
            Refused::Finished | Refused::NotSent => {
                Error::NoSuchJob { queue: queue.clone(), group: name.clone(), seq }
            }
            Refused::State(state) => Error::JobState {
                queue: queue.clone(),
                group: name.clone(),
                seq,
                state,
                action: action.name(),
            },
            Refused::TooFarAhead => Error::JobState {
                queue: queue.clone(),
                group: name.clone(),
                seq,
                state: "more than 100,000 messages beyond what the group has claimed",
                action: action.name(),
            },
        })?;
    // Cancelled before the writer has it (or refused by the channel): as it was.
    let mut revert = OperatorGuard { group, seq, previous: Some(taken.previous) };
    let dlq = group.settings().map_or_else(|| group.recorded_dlq(), |s| s.dead_letter_queue.clone());
    let action_name = action.name();
    let mut waiting = None;
    let outcome = match action {
        JobAction::Delete => Outcome::Deleted,
        JobAction::DeadLetter(reason) => Outcome::DeadLetter { reason, dlq },
        JobAction::RetryNow => {
            // Durable: a restart finds it due, not waiting for the old retry time.
            let claim = Claim::Waiting {
                attempt: taken.attempt,
                token: taken.token,
                not_before_micros: clock.wall_micros_at(now),
                last_error: taken.last_error.clone(),
            };
            waiting = Some(taken.last_error.clone());
            Outcome::Retry { claim, delay: std::time::Duration::ZERO }
        }
    };
    let (reply, rx) = oneshot::channel();
    let req = Request::Work(WorkRequest::Outcome {
        group: group.clone(),
        seq,
        attempt: taken.attempt,
        epoch: taken.epoch,
        outcome,
        taken_from: Some(taken.previous),
        reply,
    });
    shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
    revert.previous = None;
    // A retry is due here once the writer has answered — or at once if this future is
    // dropped first. Not before: the etcd engine's writer writes it only over a slot still
    // settled by this action (anything its watch learned meanwhile moved the slot, and then
    // the action is refused rather than written over what another process did); made due
    // before, the slot would no longer say so. Unchanged by a refusal: the slot is no longer
    // settling then.
    let _due = waiting.map(|error| DueOnDrop { group, seq, now, error: Some(error) });
    let res = match rx.await {
        Ok(res) => res,
        Err(_) => Err(Error::Shutdown),
    };
    res.map_err(|e| match e {
        // The job changed since the action was decided: another process (on etcd) claimed
        // or settled it, or the group was reset. Nothing was written.
        Error::LeaseLost { .. } => Error::JobState {
            queue,
            group: name,
            seq,
            state: "changed meanwhile (claimed or settled by another process, or reset)",
            action: action_name,
        },
        other => other,
    })
}

/// Makes an operator's retry due here when dropped (see `act`).
struct DueOnDrop<'a> {
    group: &'a WorkGroupState,
    seq: u64,
    now: std::time::Instant,
    error: Option<String>,
}

impl Drop for DueOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(error) = self.error.take() {
            self.group.to_waiting(self.seq, self.now, error);
        }
    }
}

struct OperatorGuard<'a> {
    group: &'a WorkGroupState,
    seq: u64,
    previous: Option<TakenFrom>,
}

impl Drop for OperatorGuard<'_> {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            self.group.operator_revert(self.seq, previous);
        }
    }
}
