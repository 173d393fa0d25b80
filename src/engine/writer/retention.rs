//! The writer's half of retention: persisting policies, and trimming a queue's head with one
//! range tombstone and the new first sequence in the same batch (the marks and claims of the
//! queue's groups below the cut go in it too).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::round::Round;
use super::{ordered, work};
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::{Reply, RetentionRequest, TrimCut};
use crate::error::Error;
use crate::events::Event;

use crate::retention::Retention;
use crate::telemetry;

pub(super) fn apply(r: &mut Round<'_>, req: RetentionRequest) {
    match req {
        RetentionRequest::SetPolicy { queue, retention, reply } => set_policy(r, queue, retention, reply),
        RetentionRequest::Trim { cuts, reply } => {
            let deleted: Vec<u64> = cuts.into_iter().map(|c| trim(r, c)).collect();
            if deleted.iter().all(|&d| d == 0) {
                // Every cut was clamped to nothing: nothing was written, so there is nothing to
                // wait for (a sync held up elsewhere must not hold up an empty pass).
                let _ = reply.send(Ok(deleted));
                return;
            }
            r.on_done(move |res| {
                drop(reply.send(res.map(|()| deleted).map_err(|e| Error::Storage(e.clone()))))
            });
        }
        RetentionRequest::ExpireOutcomes { group, expired, reply } => {
            let deleted = expire_outcomes(r, &group, expired);
            if deleted == 0 {
                let _ = reply.send(Ok(0));
                return;
            }
            r.on_done(move |res| {
                drop(reply.send(res.map(|()| deleted).map_err(|e| Error::Storage(e.clone()))))
            });
        }
        RetentionRequest::ExpireDedup { expired, reply } => {
            let deleted = expire_dedup(r, expired);
            r.on_done(move |res| {
                drop(reply.send(res.map(|()| deleted).map_err(|e| Error::Storage(e.clone()))))
            });
        }
    }
}

/// Deletes the listed outcomes of `g` whose records still carry the finish time the scan read
/// (a job finished again since, after a reset, has a new one, and stays). Returns how many went.
fn expire_outcomes(r: &mut Round<'_>, g: &WorkGroupState, expired: Vec<(u64, u64)>) -> u64 {
    if g.is_deleted() {
        return 0;
    }
    let mut deleted = 0;
    for (seq, at) in expired {
        match r.batch.outcome(&g.keys, seq) {
            Ok(Some(o)) if crate::store::micros_of(o.finished_at) == at => {
                r.batch.delete_outcome(&g.keys, seq);
                deleted += 1;
            }
            Ok(_) => {}
            Err(e) => {
                // Unreadable: left for an operator (the job's lookup reports the corruption).
                tracing::warn!(queue = %g.queue.name, group = %g.name, seq, error = %e, "rockq: an outcome record could not be read; not expired");
            }
        }
    }
    deleted
}

/// Deletes the idempotency keys whose records still carry the expiry the index listed them
/// under (a key sent again after it expired has a new record, and stays), then the listed
/// part of the expiry index with one range tombstone. Returns how many keys went.
fn expire_dedup(r: &mut Round<'_>, expired: Vec<(u64, u32, Vec<u8>)>) -> u64 {
    let mut deleted = 0;
    let Some((e, q, k)) = expired.last().cloned() else { return 0 };
    for (expires, queue_id, key) in expired {
        // Recorded again in this very round: the store does not show it yet.
        if let Ok(text) = std::str::from_utf8(&key)
            && r.jobs.dedup(queue_id, text).is_some()
        {
            continue;
        }
        match r.batch.dedup(queue_id, &key) {
            Ok(Some(rec)) if rec.expires_micros == expires => {
                r.batch.delete_dedup(queue_id, &key);
                deleted += 1;
            }
            Ok(_) => {}
            // Its index entry goes all the same; the record is checked again (and still
            // honoured only within its window) whenever the key comes back.
            Err(err) => {
                tracing::warn!(queue_id, error = %err, "rockq: an idempotency key's record does not read")
            }
        }
    }
    r.batch.delete_dedup_expiry_through(e, q, &k);
    deleted
}

fn set_policy(r: &mut Round<'_>, queue: Arc<QueueState>, retention: Retention, reply: Reply<(), Error>) {
    if queue.is_deleted() {
        // Its record is gone: writing it would bring the queue back.
        let _ = reply.send(Err(Error::QueueDeleted { queue: queue.name.to_string() }));
        return;
    }
    // Only this thread changes policies and first sequences, so the record written here is the
    // latest state.
    *queue.retention.lock().unwrap_or_else(|p| p.into_inner()) = retention;
    r.batch.put_queue(&queue.name, &super::queue::meta(&queue));
    r.on_done(move |res| drop(reply.send(res.map_err(|e| Error::Storage(e.clone())))));
}

/// The lowest offset of any group on `queue`, ordered or work-queue, as this thread knows it
/// now: resets and commits already in a batch count, and so do groups created but not yet
/// synced. `None` if the queue has no group.
fn min_group_offset(r: &Round<'_>, queue: &QueueState) -> Option<u64> {
    let ordered = r
        .written
        .ordered_groups_of(queue.id)
        .iter()
        // `acked` is set by a reset as it enters a batch; `durable` trails a commit.
        .map(|g| g.acked.load(Ordering::SeqCst).min(g.durable.load(Ordering::SeqCst)));
    let work = r
        .written
        .work_groups_of(queue.id)
        .iter()
        .map(|g| g.progress().offset.min(g.durable.load(Ordering::SeqCst)));
    ordered.chain(work).min()
}

/// Trims one queue in the round's batch; returns how many messages it deletes.
fn trim(r: &mut Round<'_>, cut: TrimCut) -> u64 {
    let queue = cut.queue;
    if queue.is_deleted() {
        return 0;
    }
    let first = queue.first_seq.load(Ordering::SeqCst);
    let written = r.written.next_seq.get(&queue.id).map_or(queue.last_seq(), |n| n - 1);
    let mut to = cut.to.min(written);
    // The cut was computed a while ago, from durable offsets. Re-checked here, where every
    // offset change is ordered: a policy changed since voids it, and under `UntilAcked` a
    // backwards reset or a new `Earliest` group since must keep its messages.
    if queue.retention() != cut.policy {
        to = 0;
    } else if cut.policy == Retention::UntilAcked {
        to = to.min(min_group_offset(r, &queue).unwrap_or(0));
    }
    if to < first {
        return 0;
    }
    // Readers switch to the new first sequence before the range disappears, so none walks into
    // deleted keys (a read already in flight that finds them gone re-checks it).
    queue.first_seq.store(to + 1, Ordering::SeqCst);
    super::queue::trim(r, &queue, first, to);
    r.batch.put_queue(&queue.name, &super::queue::meta(&queue));
    ordered::trimmed(r, &queue, to);
    // Work-queue groups behind the cut jump past it: their claims there go too.
    work::trimmed(r, &queue, to, true);
    let deleted = to - first + 1;
    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            tracing::info!(queue = %queue.name, deleted, first_seq = to + 1, "rockq: trimmed");
            telemetry::queue_counter(telemetry::TRIMMED, &queue.name, deleted);
            engine.emit(|| Event::Trimmed { queue: queue.name.clone(), deleted, first_seq: to + 1 });
        }
    });
    deleted
}
