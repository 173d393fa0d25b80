//! Failpoints for fault-injection tests (cargo feature `failpoints`, using the `fail` crate).
//! Without the feature every check compiles to nothing.
//!
//! Points: `rockq-writer-write` (the round's WriteBatch), `rockq-syncer-sync` (the pipelined WAL
//! sync under `Fsync`), `rockq-read` (a consumer's batch read), `rockq-trim-queued` (a
//! retention pass has queued a trim with the writer: a test's callback learns the order of
//! requests), `rockq-etcd-append-request` and `rockq-etcd-append-answer` (the etcd engine's
//! append transaction is lost before it is sent, or its answer is lost after it was applied),
//! `rockq-etcd-claim-request` and `rockq-etcd-claim-answer` (the same for a claim write: claims,
//! outcomes, lease extensions), `rockq-etcd-claim-watch-apply` and
//! `rockq-etcd-claim-watch-applied` (a claim watch is about to apply a batch of events, and
//! has applied it: a test's callbacks hold it back and learn when it went through; the same
//! for the group-deletion watch: `rockq-etcd-group-deletions-apply` and `…-applied`, and the
//! namespace watch: `rockq-etcd-namespace-apply` and `…-applied`), `rockq-etcd-revoke-late` (an ordered group's owner lease is
//! revoked 200 ms late, as on a busy runtime), `rockq-etcd-redrive-received` and
//! `rockq-etcd-redrive-planned` (the writer has a redrive batch and has not read the cursor
//! yet; it has read the cursor it will compare and the marks: another process may settle a
//! letter now), `rockq-etcd-flow-request` and `rockq-etcd-flow-answer` (a flow's submit or
//! the application of a flow change is lost before it is sent, or its answer after it was
//! applied; `rockq-etcd-flow-request-late` and `rockq-etcd-flow-steps-late`, for a flow's
//! write and a large submit's part: the request is sent late, by a task, once
//! `rockq-etcd-flow-late-send`'s callback returns, `rockq-etcd-flow-late-sent` after it was
//! answered), `rockq-etcd-message-read` (the etcd engine's point read of one stored message: an
//! operator's delete or a dead letter reading the job it finishes), `rockq-etcd-queue-delete-landed`
//! and `rockq-etcd-queue-delete-answer` (a queue deletion's transaction was answered, and its
//! answer is lost), `rockq-etcd-cancel-answer`, `rockq-etcd-schedule-answer`,
//! `rockq-etcd-group-delete-answer`, `rockq-etcd-flow-delete-answer` and
//! `rockq-etcd-reset-answer` (a delayed message's cancel, a schedule's write or deletion, a
//! group's or a flow's deletion, a group's reset, was applied and its answer is lost;
//! `rockq-etcd-reset-landed` is reached just before, when a test's callback may act as
//! another process).

use crate::error::StorageError;

/// Returns an injected storage error if the failpoint `name` is configured to `return`.
#[cfg(feature = "failpoints")]
pub(crate) fn check(name: &str) -> Result<(), StorageError> {
    fail::fail_point!(name, |_| Err(StorageError::new(format!("IO error: failpoint {name}"))));
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn check(_name: &str) -> Result<(), StorageError> {
    Ok(())
}

/// Runs the callback configured for the failpoint `name`, if any (no error to inject).
#[cfg(feature = "failpoints")]
pub(crate) fn reached(name: &str) {
    fail::fail_point!(name);
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn reached(_name: &str) {}
