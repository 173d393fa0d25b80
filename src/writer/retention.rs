//! The writer's half of retention: persisting policies, trimming a queue's head with one range
//! tombstone (and moving the first sequence in the same batch), and resetting group offsets.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rocksdb::WriteBatch;
use tokio::sync::oneshot::Sender;

use super::{Round, Writer};
use crate::Event;
use crate::error::{QueueError, ResetError};
use crate::registry::{GroupState, QueueState};
use crate::store::records::{self, QueueRecord};
use crate::store::{Cfs, keys};

impl Writer {
    fn queue_record(queue: &QueueState) -> QueueRecord {
        QueueRecord {
            id: queue.id,
            first_seq: queue.first_seq.load(Ordering::SeqCst),
            retention: queue.retention(),
        }
    }

    pub(super) fn set_retention(
        &mut self,
        wb: &mut WriteBatch,
        meta: &rocksdb::ColumnFamily,
        r: &mut Round,
        queue: Arc<QueueState>,
        retention: crate::Retention,
        reply: Sender<Result<(), QueueError>>,
    ) {
        // Only this thread changes policies and first sequences, so the record written here
        // is the latest state.
        *queue.retention.lock().unwrap_or_else(|p| p.into_inner()) = retention;
        wb.put_cf(meta, keys::queue_key(&queue.name), Self::queue_record(&queue).encode());
        r.on_done(move |res| drop(reply.send(res.map_err(|e| QueueError::Storage(e.clone())))));
    }

    /// The lowest offset of any group on `queue`, ordered or work-queue, as this thread knows
    /// it now: resets and commits already in a batch count, and so do groups created but not
    /// yet synced. `None` if the queue has no group.
    fn min_group_offset(&self, queue: &QueueState) -> Option<u64> {
        let r = &self.engine.registry;
        let ordered = r
            .groups
            .iter()
            .map(|g| g.clone())
            .chain(self.groups.values().cloned())
            .filter(|g| g.queue.id == queue.id)
            // `acked` is set by a reset as it enters a batch; `durable` trails a commit.
            .map(|g| g.acked.load(Ordering::SeqCst).min(g.durable.load(Ordering::SeqCst)));
        let work = r
            .work_groups
            .iter()
            .map(|g| g.clone())
            .chain(self.work_groups.values().cloned())
            .filter(|g| g.queue.id == queue.id)
            .map(|g| g.progress().offset.min(g.durable.load(Ordering::SeqCst)));
        ordered.chain(work).min()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn trim(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        queue: Arc<QueueState>,
        to: u64,
        policy: crate::Retention,
        reply: Sender<Result<u64, QueueError>>,
    ) {
        let first = queue.first_seq.load(Ordering::SeqCst);
        let written = self.next_seq.get(&queue.id).map_or(queue.last_seq(), |n| n - 1);
        let mut to = to.min(written);
        // The cut was computed a while ago, from durable offsets. Re-checked here, where every
        // offset change is ordered: a policy changed since voids it, and under `UntilAcked` a
        // backwards reset or a new `Earliest` group since must keep its messages.
        if queue.retention() != policy {
            to = 0;
        } else if policy == crate::Retention::UntilAcked {
            to = to.min(self.min_group_offset(&queue).unwrap_or(0));
        }
        if to < first {
            let _ = reply.send(Ok(0));
            return;
        }
        // Readers switch to the new first sequence before the range disappears, so none walks
        // into deleted keys (a read already in flight that finds them gone re-checks it).
        queue.first_seq.store(to + 1, Ordering::SeqCst);
        wb.delete_range_cf(
            cfs.messages,
            keys::message_key(queue.id, first),
            keys::message_key(queue.id, to + 1),
        );
        wb.put_cf(cfs.meta, keys::queue_key(&queue.name), Self::queue_record(&queue).encode());
        self.ordered_trimmed(wb, cfs.claims, &queue, to);

        // Work-queue groups behind the cut jump past it: their claims there go too.
        let behind: Vec<_> = self
            .engine
            .registry
            .work_groups
            .iter()
            .map(|g| g.clone())
            .chain(self.work_groups.values().cloned())
            .filter(|g| g.queue.id == queue.id)
            .collect();
        for g in behind {
            let mut p = g.progress();
            if p.offset >= to {
                continue;
            }
            let from = p.offset + 1;
            p.offset = to;
            p.done = p.done.split_off(&(to + 1));
            drop(p);
            wb.delete_range_cf(
                cfs.claims,
                keys::claim_key(&g.claim_prefix, 0),
                keys::claim_key(&g.claim_prefix, to + 1),
            );
            if !r.work_offsets.iter().any(|x| Arc::ptr_eq(x, &g)) {
                r.work_offsets.push(g.clone());
            }
            let engine = self.engine.clone();
            r.on_done(move |res| {
                if res.is_ok() {
                    g.skip_to(to);
                    g.skipped.fetch_add(to - from + 1, Ordering::Relaxed);
                    tracing::warn!(queue = %g.queue.name, group = %g.name, from, to, "rockq: retention skipped messages a group had not finished");
                    engine.emit(|| Event::Skipped { queue: g.queue.name.clone(), group: g.name.clone(), from, to });
                }
            });
        }
        let deleted = to - first + 1;
        let engine = self.engine.clone();
        r.on_done(move |res| {
            if res.is_ok() {
                tracing::info!(queue = %queue.name, deleted, first_seq = to + 1, "rockq: trimmed");
                crate::telemetry::queue_counter(crate::telemetry::TRIMMED, &queue.name, deleted);
                engine.emit(|| Event::Trimmed { queue: queue.name.clone(), deleted, first_seq: to + 1 });
            }
            let _ = reply.send(res.map(|()| deleted).map_err(|e| QueueError::Storage(e.clone())));
        });
    }

    /// A reset target was checked against retention when it was asked for; a trim applied
    /// since may have deleted it.
    fn still_retained(&self, queue: &QueueState, offset: u64) -> Result<(), ResetError> {
        let first = queue.first_seq.load(Ordering::SeqCst);
        if offset + 1 >= first {
            return Ok(());
        }
        let next = self.next_seq.get(&queue.id).copied().unwrap_or(first);
        Err(ResetError::OutOfRetention { requested: offset + 1, first, next })
    }

    pub(super) fn reset_work_offset(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        group: Arc<crate::work::WorkGroupState>,
        offset: u64,
        reply: Sender<Result<(), ResetError>>,
    ) {
        // Checked again here: a subscription or job could have appeared since the caller
        // looked, and nothing changes a group's claims between here and the batch's write.
        if group.subscriptions.load(Ordering::Acquire) > 0 || group.held(self.engine.clock().now()) {
            let (group, queue) = (group.name.to_string(), group.queue.name.to_string());
            let _ = reply.send(Err(ResetError::Active { group, queue }));
            return;
        }
        if let Err(e) = self.still_retained(&group.queue, offset) {
            let _ = reply.send(Err(e));
            return;
        }
        {
            let mut p = group.progress();
            p.offset = offset;
            p.done.clear();
        }
        // In memory now, not when durable: outcomes, claims and acks decided before the reset
        // but arriving after it carry the old epoch and are refused; queued acks are dropped.
        group.reset(offset);
        let prefix = &group.claim_prefix;
        wb.delete_range_cf(cfs.claims, keys::claim_key(prefix, 0), keys::claim_key(prefix, u64::MAX));
        wb.delete_cf(cfs.claims, keys::claim_key(prefix, u64::MAX));
        wb.put_cf(cfs.offsets, &group.key, records::encode_shared_offset(offset));
        r.work_offsets.retain(|g| !Arc::ptr_eq(g, &group));
        r.on_done(move |res| {
            if res.is_ok() {
                // A reset may go backwards: store, not max.
                group.durable.store(offset, Ordering::SeqCst);
            }
            let _ = reply.send(res.map_err(|e| ResetError::Storage(e.clone())));
        });
    }

    pub(super) fn reset_offset(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        group: Arc<GroupState>,
        offset: u64,
        reply: Sender<Result<(), ResetError>>,
    ) {
        if let Err(e) = self.still_retained(&group.queue, offset) {
            group.active.store(false, Ordering::Release);
            let _ = reply.send(Err(e));
            return;
        }
        // Set here, before the round's commit loop reads it: acks made before the reset and
        // not yet committed must not be written after it in the same batch (the reset holds
        // the active slot, so no ack can arrive meanwhile).
        group.acked.store(offset, Ordering::SeqCst);
        // Its delivery records describe the old position: they go in the same batch (and
        // only with a reset that lands).
        self.ordered_reset(wb, cfs.claims, &group);
        wb.put_cf(cfs.offsets, &group.key, records::encode_offset(offset));
        r.on_done(move |res| {
            if res.is_ok() {
                // A reset may go backwards: store, not max. Runs after the round's commits.
                group.durable.store(offset, Ordering::SeqCst);
            }
            // The caller handed the active slot to the writer with the request, so that a
            // dropped `reset_to` future cannot let a subscriber start before the reset lands.
            group.active.store(false, Ordering::Release);
            let _ = reply.send(res.map_err(|e| ResetError::Storage(e.clone())));
        });
    }
}
