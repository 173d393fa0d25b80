//! Group resets on etcd (`Group::reset_to`, `WorkGroup::reset_to`, `Broker::reset_group`), with
//! the embedded engine's semantics across processes.
//!
//! - **Ordered group**: refused with `Active` while any process's subscription owns it (the
//!   transaction compares the owner key absent — or this process's own, being released); the
//!   new offset and the deletion of every mark go in one transaction, and the next owner, here
//!   or elsewhere, reads them when it takes the group.
//! - **Work group**: refused with `Active` while a subscription of it runs here or any claim
//!   record holds a lease not yet run out (the transaction compares every claim record
//!   unchanged since they were read). Every claim record goes (attempts start again, as
//!   embedded), and the reset mark tells every process's claim watch to start the group again
//!   at the new offset. Subscriptions in *other* processes are not seen (etcd holds no record of
//!   them): they keep running and follow the reset once their watch brings it; an outcome they
//!   decided before is refused by etcd (its claim record is gone).
//! - Both: the target is checked against the queue's first sequence as etcd holds it, and the
//!   transaction compares the queue record (a trim in between makes it read again); the queue
//!   record is put back unchanged, so that a trim planned before the reset plans again.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::side::{EtcdSide, retrying};
use super::writer::Writer;
use crate::engine::registry::{OrderedGroupState, QueueState, WorkGroupState};
use crate::error::{Error, StorageError};
use crate::model::{Claim, QueueMeta};
use crate::retention::{ResetTo, micros};
use crate::store::etcd::reset::{OwnerCheck, ResetOutcome};

/// Tries of a reset whose compares keep failing (the queue trimmed, claims written meanwhile)
/// before it gives up: a work group whose claims keep changing is being worked on.
const TRIES: usize = 8;

impl Writer {
    /// Resets ordered group `group` to `offset`. Releases the group's active slot, which the
    /// caller handed over with the request, whatever the outcome.
    pub(super) async fn reset_ordered(
        &mut self,
        group: Arc<OrderedGroupState>,
        offset: u64,
    ) -> Result<(), Error> {
        let res = self.try_reset_ordered(&group, offset).await;
        group.active.store(false, Ordering::Release);
        res
    }

    async fn try_reset_ordered(&mut self, group: &Arc<OrderedGroupState>, offset: u64) -> Result<(), Error> {
        let t = self.side.settings.request_timeout;
        let marked = self.marked(t).await?;
        let store = &self.side.store;
        let deadline = tokio::time::Instant::now() + t;
        let mut tries = 0;
        while tries < TRIES {
            tries += 1;
            // Held here still: the last subscription's release has not run yet. What it
            // acknowledged and did not commit goes with the reset, as embedded.
            let owner = match self.side.owners.holds(group) {
                true => OwnerCheck::This(&self.side.owner_id),
                false => OwnerCheck::Nobody,
            };
            let record = retained(&self.side, &group.queue, offset).await?;
            let rec = (&record.0, record.1);
            let reset = || store.reset_ordered(&group.name, &group.queue.name, owner, rec, offset, marked);
            let mut outcome = retrying(t, reset).await?;
            if matches!(outcome, ResetOutcome::Moved | ResetOutcome::Owned(_)) {
                // Refused: perhaps by this call's own reset, applied by a try whose answer was
                // lost (it moved the queue record; a subscriber elsewhere may own the group
                // since). Its marker tells.
                if let Some(rev) = retrying(t, || store.marker_revision(marked.nonce)).await? {
                    outcome = ResetOutcome::Done { rev };
                }
            }
            match outcome {
                ResetOutcome::Done { .. } => {
                    group.acked.store(offset, Ordering::SeqCst);
                    group.durable.store(offset, Ordering::SeqCst);
                    let dropped = {
                        let mut rec = group.records();
                        rec.failed.clear();
                        rec.dead.clear();
                        rec.stored.clear();
                        std::mem::take(&mut rec.pending)
                    };
                    // Dropped outside the lock: a pending record may hold a subscription's
                    // last handle, whose drop takes it.
                    drop(dropped);
                    return Ok(());
                }
                // This process's own lease, being revoked right now (the subscription is
                // gone, as embedded): wait for it, as a new subscription does.
                ResetOutcome::Owned(holder)
                    if holder == self.side.owner_id && tokio::time::Instant::now() < deadline =>
                {
                    tries -= 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                ResetOutcome::Owned(_) => return Err(active(&group.name, &group.queue.name)),
                ResetOutcome::NoGroup => return Err(no_group(&group.name, &group.queue.name)),
                ResetOutcome::Moved => continue,
            }
        }
        Err(Error::Storage(StorageError::new("etcd: the queue kept changing under a group reset; try again")))
    }

    /// Resets work group `group` to `offset`.
    pub(super) async fn reset_work(&mut self, group: Arc<WorkGroupState>, offset: u64) -> Result<(), Error> {
        let busy = || active(&group.name, &group.queue.name);
        let clock = self.engine.clock().clone();
        if group.subscriptions.load(Ordering::Acquire) > 0 || group.held(clock.now()) {
            return Err(busy());
        }
        let Some(ws) =
            self.side.work.get(&crate::store::group_id(&group.name, &group.queue.name)).map(|w| w.clone())
        else {
            return Err(no_group(&group.name, &group.queue.name));
        };
        let t = self.side.settings.request_timeout;
        let marked = self.marked(t).await?;
        let store = &self.side.store;
        // Held across the transaction: the watch applies nothing of this group meanwhile, and
        // learns the reset this process wrote as already known.
        let mut known = ws.known.lock().await;
        for _ in 0..TRIES {
            let Some(loaded) = retrying(t, || store.load_claims(&group.name, &group.queue.name)).await?
            else {
                return Err(Error::GroupDeleted {
                    group: group.name.to_string(),
                    queue: group.queue.name.to_string(),
                });
            };
            let now = clock.wall_micros();
            let live =
                |c: &Claim| matches!(c, Claim::Leased { deadline_micros, .. } if *deadline_micros > now);
            if loaded.records.iter().any(|r| live(&r.claim)) {
                return Err(busy());
            }
            let record = retained(&self.side, &group.queue, offset).await?;
            let rec = (&record.0, record.1);
            let read_at = loaded.rev;
            let reset = || store.reset_work(&group.name, &group.queue.name, read_at, rec, offset, marked);
            let rev = match retrying(t, reset).await? {
                ResetOutcome::Done { rev } => rev,
                ResetOutcome::NoGroup => return Err(no_group(&group.name, &group.queue.name)),
                // Refused: perhaps by this call's own reset, applied by a try whose answer was
                // lost (its mark is newer than `read_at`). Its marker tells, with its revision;
                // else a claim or a reset came from elsewhere: read again.
                ResetOutcome::Moved | ResetOutcome::Owned(_) => {
                    match retrying(t, || store.marker_revision(marked.nonce)).await? {
                        Some(rev) => rev,
                        None => continue,
                    }
                }
            };
            known.reset(&group, offset, rev);
            return Ok(());
        }
        // Claims kept being written: a subscription of the group runs in another process.
        Err(busy())
    }
}

/// The sequence a reset of a group on `queue` to `to` starts at, as etcd holds the queue now.
pub(crate) async fn target(side: &EtcdSide, queue: &QueueState, to: ResetTo) -> Result<u64, Error> {
    let t = side.settings.request_timeout;
    let store = &side.store;
    let (meta, _) = queue_record(side, queue).await?;
    queue.first_seq.fetch_max(meta.first_seq, Ordering::AcqRel);
    let (last, _) = retrying(t, || store.tail_record(queue.id)).await?;
    let (first, next) = (meta.first_seq, last + 1);
    let seq = match to {
        ResetTo::Sequence(s) => s,
        ResetTo::Time(at) => {
            // The first message enqueued at or after `at`, by bisection: enqueue times do not
            // decrease along a queue written by one process (across processes they follow
            // their clocks; docs/DISTRIBUTED.md). A message gone meanwhile (trimmed) counts as
            // older.
            let at = micros(at);
            let (mut lo, mut hi) = (first, next);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match retrying(t, || store.enqueued_at(queue.id, mid)).await? {
                    Some(when) if when >= at => hi = mid,
                    _ => lo = mid + 1,
                }
            }
            // Older than everything retained: the messages it asks for are gone.
            if lo == first && first > 1 && lo < next {
                return Err(Error::OutOfRange { requested: 0, first, next });
            }
            lo
        }
    };
    if !(first..=next).contains(&seq) {
        return Err(Error::OutOfRange { requested: seq, first, next });
    }
    Ok(seq)
}

/// The queue record and its `mod_revision`, if a reset to `offset` still finds the messages
/// after it retained.
async fn retained(side: &EtcdSide, queue: &QueueState, offset: u64) -> Result<(QueueMeta, i64), Error> {
    let (meta, rev) = queue_record(side, queue).await?;
    queue.first_seq.fetch_max(meta.first_seq, Ordering::AcqRel);
    if offset + 1 >= meta.first_seq {
        return Ok((meta, rev));
    }
    let store = &side.store;
    let (last, _) = retrying(side.settings.request_timeout, || store.tail_record(queue.id)).await?;
    Err(Error::OutOfRange { requested: offset + 1, first: meta.first_seq, next: last + 1 })
}

async fn queue_record(side: &EtcdSide, queue: &QueueState) -> Result<(QueueMeta, i64), Error> {
    let store = &side.store;
    match retrying(side.settings.request_timeout, || store.queue_record(&queue.name)).await? {
        Some((meta, rev)) if meta.id == queue.id => Ok((meta, rev)),
        _ => Err(Error::NoSuchQueue { queue: queue.name.to_string() }),
    }
}

fn active(group: &str, queue: &str) -> Error {
    Error::Active { group: group.to_string(), queue: queue.to_string() }
}

fn no_group(group: &str, queue: &str) -> Error {
    Error::NoSuchGroup { group: group.to_string(), queue: queue.to_string() }
}
