//! Retention on the embedded engine: deciding how far each queue's head can be deleted (the
//! background task that runs a pass is `tasks.rs`; the etcd engine's pass is
//! `etcd/retention.rs`). The delete itself is the writer's (one range tombstone plus the new first sequence
//! in one batch, `writer/retention.rs`); readers always start at the first live sequence, so the
//! tombstones at a queue's head are never walked.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use super::Engine;
use super::registry::{QueueState, WorkGroupState};
use super::request::{Request, RetentionRequest, TrimCut};
use crate::error::{Error, FailedError};
use crate::retention::{ResetTo, Retention, TrimReport, micros};
use crate::store::{self, Store};

/// Most messages one pass scans to find a `MaxAge` cut (the rest waits for the next pass).
const AGE_SCAN: usize = 1 << 20;
/// A background pass that deleted at least this many messages compacts the trimmed ranges.
const AUTO_COMPACT: u64 = 64 * 1024;

/// Every queue's cut: the highest sequence its policy allows to delete now, with the policy
/// it was computed under. One look at each queue and each group (O(queues + groups)); blocking,
/// since a `MaxAge` cut reads the store, so it runs on the blocking pool.
fn cuts(engine: &Engine, store: &Store) -> Result<Vec<TrimCut>, Error> {
    // The lowest durable offset of each queue's groups (an ack not yet committed keeps its
    // message), computed once for all queues.
    let mut lowest: HashMap<u32, u64> = HashMap::new();
    let mut note = |queue: u32, durable: u64| {
        lowest.entry(queue).and_modify(|m| *m = (*m).min(durable)).or_insert(durable);
    };
    for g in engine.registry.ordered.iter() {
        note(g.queue.id, g.durable.load(Ordering::Acquire));
    }
    for g in engine.registry.work.iter() {
        note(g.queue.id, g.durable.load(Ordering::Acquire));
    }
    let mut out = Vec::new();
    let queues: Vec<Arc<QueueState>> = engine.registry.queues.iter().map(|q| q.clone()).collect();
    for q in queues {
        let first = q.first_seq.load(Ordering::Acquire);
        let last = q.last_seq();
        if last < first {
            continue;
        }
        let policy = q.retention();
        let to = match policy {
            Retention::Forever => None,
            Retention::UntilAcked => lowest.get(&q.id).copied(),
            Retention::MaxLen(n) => last.checked_sub(n),
            Retention::MaxAge(age) => {
                let cutoff =
                    engine.clock().wall_micros().saturating_sub(age.as_micros().min(u64::MAX as u128) as u64);
                store::last_enqueued_before(store, q.id, first, last, cutoff, AGE_SCAN)?
            }
        };
        if let Some(to) = to.filter(|&t| t >= first) {
            out.push(TrimCut { queue: q, to, policy });
        }
    }
    Ok(out)
}

/// One retention pass over every queue; compacts what it trimmed if `compact`. The cuts are
/// computed on the blocking pool and every trim goes to the writer in one request: one round,
/// one sync, however many queues.
pub(super) async fn pass(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    tx: &mpsc::Sender<Request>,
    runtime: &Handle,
    compact: Option<bool>,
) -> Result<TrimReport, Error> {
    let bytes = || {
        let store = store.clone();
        async move { runtime.spawn_blocking(move || store.disk_bytes()).await.unwrap_or(0) }
    };
    let mut report = TrimReport { bytes_before: bytes().await, ..TrimReport::default() };
    let (e, s) = (engine.clone(), store.clone());
    let cuts = runtime
        .spawn_blocking(move || cuts(&e, &s))
        .await
        .map_err(|e| Error::Failed(FailedError::internal(format!("retention scan failed: {e}"))))??;
    let mut compact_ranges = Vec::new();
    if !cuts.is_empty() {
        let queues: Vec<Arc<QueueState>> = cuts.iter().map(|c| c.queue.clone()).collect();
        let (reply, rx) = oneshot::channel();
        tx.send(Request::Retention(RetentionRequest::Trim { cuts, reply }))
            .await
            .map_err(|_| Error::Shutdown)?;
        crate::faults::reached("rockq-trim-queued");
        let deleted = rx.await.map_err(|_| Error::Shutdown)??;
        for (q, deleted) in queues.into_iter().zip(deleted) {
            if deleted > 0 {
                let first = q.first_seq.load(Ordering::Acquire);
                report.trimmed.push((q.name.to_string(), deleted, first));
                report.deleted += deleted;
                compact_ranges.push((q.id, first));
            }
        }
    }
    let compact = compact.unwrap_or(report.deleted >= AUTO_COMPACT);
    if compact && !compact_ranges.is_empty() {
        let s = store.clone();
        runtime
            .spawn_blocking(move || s.compact_trimmed(&compact_ranges))
            .await
            .map_err(|e| Error::Failed(FailedError::internal(format!("compaction task failed: {e}"))))??;
        report.compacted = true;
    }
    report.dedup_expired = expire_dedup(engine, store, tx, runtime).await?;
    report.outcomes_expired = expire_outcomes(engine, store, tx, runtime).await?;
    report.bytes_after = bytes().await;
    Ok(report)
}

/// Expired idempotency keys one writer round forgets: small enough that the round's point
/// reads do not hold up the producers behind it; a pass goes on, round after round, until the
/// expiry index has nothing expired left.
const DEDUP_CHUNK: usize = 8192;

/// Forgets idempotency keys whose window has passed: read from the expiry index (in expiry
/// order, so the scan touches only expired entries) on the blocking pool, deleted by the
/// writer a chunk per round. Returns how many went.
async fn expire_dedup(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    tx: &mpsc::Sender<Request>,
    runtime: &Handle,
) -> Result<u64, Error> {
    let mut total = 0;
    loop {
        let (s, now) = (store.clone(), engine.clock().wall_micros());
        let expired = runtime
            .spawn_blocking(move || {
                let guard = s.lock();
                let Some(db) = guard.inspect(&s.path) else { return Ok(Vec::new()) };
                db.expired_dedup(now, DEDUP_CHUNK)
            })
            .await
            .map_err(|e| Error::Failed(FailedError::internal(format!("dedup expiry scan failed: {e}"))))?
            .map_err(Error::from)?;
        let last_chunk = expired.len() < DEDUP_CHUNK;
        if expired.is_empty() {
            return Ok(total);
        }
        let (reply, rx) = oneshot::channel();
        tx.send(Request::Retention(RetentionRequest::ExpireDedup { expired, reply }))
            .await
            .map_err(|_| Error::Shutdown)?;
        total += rx.await.map_err(|_| Error::Shutdown)??;
        if last_chunk {
            return Ok(total);
        }
    }
}

/// Outcomes one writer round deletes (each a point read and a delete in the round).
const OUTCOME_CHUNK: usize = 8192;

/// Unexpired outcomes a scan reads past before it stops (see `WorkGroup::keep_outcomes`).
const OUTCOME_LOOKAHEAD: usize = 1024;

/// Deletes job outcomes past their group's retention (every outcome of a group that keeps
/// none any more): read from the head of each group's outcomes on the blocking pool, deleted
/// by the writer a chunk per round. Returns how many went.
async fn expire_outcomes(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    tx: &mpsc::Sender<Request>,
    runtime: &Handle,
) -> Result<u64, Error> {
    let groups: Vec<Arc<WorkGroupState>> =
        engine.registry.work.iter().map(|g| g.clone()).filter(|g| !g.is_deleted()).collect();
    let mut total = 0;
    for g in groups {
        let keep = g.settings().map_or(std::time::Duration::ZERO, |s| s.keep_outcomes);
        let mut from = 0;
        loop {
            let now = engine.clock().wall_micros();
            let before = now.saturating_sub(u64::try_from(keep.as_micros()).unwrap_or(u64::MAX));
            let (s, gs) = (store.clone(), g.clone());
            let expired = runtime
                .spawn_blocking(move || {
                    let guard = s.lock();
                    let Some(db) = guard.inspect(&s.path) else { return Ok(Vec::new()) };
                    db.expired_outcomes(
                        &gs.name,
                        &gs.queue.name,
                        from,
                        before,
                        OUTCOME_CHUNK,
                        OUTCOME_LOOKAHEAD,
                    )
                })
                .await
                .map_err(|e| {
                    Error::Failed(FailedError::internal(format!("outcome expiry scan failed: {e}")))
                })?
                .map_err(Error::from)?;
            if expired.is_empty() {
                break;
            }
            let last_chunk = expired.len() < OUTCOME_CHUNK;
            // The next chunk goes on after this one (not from the head again, over the
            // tombstones this one leaves).
            from = expired.last().map_or(from, |&(seq, _)| seq.saturating_add(1));
            let (reply, rx) = oneshot::channel();
            let req = RetentionRequest::ExpireOutcomes { group: g.clone(), expired, reply };
            tx.send(Request::Retention(req)).await.map_err(|_| Error::Shutdown)?;
            let deleted = rx.await.map_err(|_| Error::Shutdown)??;
            total += deleted;
            // Nothing deleted: every listed one changed meanwhile; the next pass looks again.
            if last_chunk || deleted == 0 {
                break;
            }
        }
    }
    Ok(total)
}

/// The sequence a reset to `to` starts at, if it is retained.
pub(super) async fn reset_target(
    store: &Arc<Store>,
    runtime: &Handle,
    queue: &Arc<QueueState>,
    to: ResetTo,
) -> Result<u64, Error> {
    let first = queue.first_seq.load(Ordering::Acquire);
    let next = queue.last_seq() + 1;
    let seq = match to {
        ResetTo::Sequence(s) => s,
        ResetTo::Time(t) => {
            let at = micros(t);
            let (s, id) = (store.clone(), queue.id);
            let found = runtime
                .spawn_blocking(move || store::first_enqueued_at(&s, id, first, next - 1, at))
                .await
                .map_err(|e| Error::Internal(e.to_string()))??;
            match found {
                // Older than everything retained: the messages it asks for are gone.
                Some(s) if s == first && first > 1 => {
                    return Err(Error::OutOfRange { requested: 0, first, next });
                }
                Some(s) => s,
                None => next,
            }
        }
    };
    if !(first..=next).contains(&seq) {
        return Err(Error::OutOfRange { requested: seq, first, next });
    }
    Ok(seq)
}
