//! Retention: deciding how far each queue's head can be deleted, and the background task that
//! does it. The delete itself is the writer's (one range tombstone plus the new first sequence
//! in one batch, `writer/retention.rs`); readers always start at the first live sequence, so the
//! tombstones at a queue's head are never walked.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use super::registry::QueueState;
use super::request::{Request, RetentionRequest};
use super::shared::{Shared, spawn_periodic};
use crate::error::{QueueError, ReceiveError, ResetError};
use crate::retention::{ResetTo, Retention, TrimReport, micros};
use crate::store;

/// Most messages one pass scans to find a `MaxAge` cut (the rest waits for the next pass).
const AGE_SCAN: usize = 1 << 20;
/// A background pass that deleted at least this many messages compacts the trimmed ranges.
const AUTO_COMPACT: u64 = 64 * 1024;

/// The highest sequence of `q` its policy allows to delete now, if any.
/// Returns it with the policy it was computed under.
async fn cut(shared: &Arc<Shared>, q: &Arc<QueueState>) -> Result<Option<(u64, Retention)>, QueueError> {
    let engine = &shared.engine;
    let first = q.first_seq.load(Ordering::Acquire);
    let last = q.last_seq();
    if last < first {
        return Ok(None);
    }
    let policy = q.retention();
    let to = match policy {
        Retention::Forever => None,
        Retention::UntilAcked => {
            // Durable offsets only: an ack not yet committed keeps its message.
            let ordered = engine
                .registry
                .ordered
                .iter()
                .filter(|g| g.queue.id == q.id)
                .map(|g| g.durable.load(Ordering::Acquire));
            let work = engine
                .registry
                .work
                .iter()
                .filter(|g| g.queue.id == q.id)
                .map(|g| g.durable.load(Ordering::Acquire));
            ordered.chain(work).min()
        }
        Retention::MaxLen(n) => last.checked_sub(n),
        Retention::MaxAge(age) => {
            let cutoff =
                engine.clock().wall_micros().saturating_sub(age.as_micros().min(u64::MAX as u128) as u64);
            let (s, id) = (shared.clone(), q.id);
            shared
                .runtime
                .spawn_blocking(move || {
                    store::last_enqueued_before(&s.engine.store, id, first, last, cutoff, AGE_SCAN)
                })
                .await
                .map_err(|e| QueueError::Failed(format!("retention scan failed: {e}")))??
        }
    };
    Ok(to.filter(|&t| t >= first).map(|t| (t, policy)))
}

/// One retention pass over every queue; compacts what it trimmed if `compact`.
pub(crate) async fn pass(shared: &Arc<Shared>, compact: Option<bool>) -> Result<TrimReport, QueueError> {
    if shared.is_closed() {
        return Err(QueueError::Shutdown);
    }
    let bytes = |s: Arc<Shared>| async move {
        s.runtime.clone().spawn_blocking(move || s.engine.store.disk_bytes()).await.unwrap_or(0)
    };
    let mut report = TrimReport { bytes_before: bytes(shared.clone()).await, ..TrimReport::default() };
    let queues: Vec<Arc<QueueState>> = shared.engine.registry.queues.iter().map(|q| q.clone()).collect();
    let mut compact_ranges = Vec::new();
    for q in queues {
        let Some((to, policy)) = cut(shared, &q).await? else { continue };
        let (reply, rx) = oneshot::channel();
        shared
            .tx
            .send(Request::Retention(RetentionRequest::Trim { queue: q.clone(), to, policy, reply }))
            .await
            .map_err(|_| QueueError::Shutdown)?;
        crate::faults::reached("rockq-trim-queued");
        let deleted = rx.await.map_err(|_| QueueError::Shutdown)??;
        if deleted > 0 {
            let first = q.first_seq.load(Ordering::Acquire);
            report.trimmed.push((q.name.to_string(), deleted, first));
            report.deleted += deleted;
            compact_ranges.push((q.id, first));
        }
    }
    let compact = compact.unwrap_or(report.deleted >= AUTO_COMPACT);
    if compact && !compact_ranges.is_empty() {
        let s = shared.clone();
        shared
            .runtime
            .spawn_blocking(move || {
                compact_ranges
                    .into_iter()
                    .try_for_each(|(id, below)| s.engine.store.compact_trimmed(id, below))
            })
            .await
            .map_err(|e| QueueError::Failed(format!("compaction task failed: {e}")))??;
        report.compacted = true;
    }
    report.bytes_after = bytes(shared.clone()).await;
    Ok(report)
}

/// Runs a pass every `interval` on the broker's clock until shutdown. Holds the broker only
/// weakly, so dropping every handle still closes it.
pub(crate) fn spawn_background(shared: &Arc<Shared>, interval: Duration) {
    spawn_periodic(shared, interval, |shared| async move {
        match pass(&shared, None).await {
            Ok(_) => true,
            Err(QueueError::Shutdown) => false,
            Err(e) => {
                tracing::warn!(error = %e, "rockq: retention pass failed");
                true
            }
        }
    });
}

/// The sequence a reset to `to` starts at, if it is retained.
pub(crate) async fn reset_target(
    shared: &Arc<Shared>,
    queue: &Arc<QueueState>,
    to: ResetTo,
) -> Result<u64, ResetError> {
    let first = queue.first_seq.load(Ordering::Acquire);
    let next = queue.last_seq() + 1;
    let seq = match to {
        ResetTo::Sequence(s) => s,
        ResetTo::Time(t) => {
            let at = micros(t);
            let (s, id) = (shared.clone(), queue.id);
            let found = shared
                .runtime
                .spawn_blocking(move || store::first_enqueued_at(&s.engine.store, id, first, next - 1, at))
                .await
                .map_err(|e| ResetError::Receive(ReceiveError::Internal(e.to_string())))??;
            match found {
                // Older than everything retained: the messages it asks for are gone.
                Some(s) if s == first && first > 1 => {
                    return Err(ResetError::OutOfRetention { requested: 0, first, next });
                }
                Some(s) => s,
                None => next,
            }
        }
    };
    if !(first..=next).contains(&seq) {
        return Err(ResetError::OutOfRetention { requested: seq, first, next });
    }
    Ok(seq)
}
