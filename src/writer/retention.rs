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

    pub(super) fn trim(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        queue: Arc<QueueState>,
        to: u64,
        reply: Sender<Result<u64, QueueError>>,
    ) {
        let first = queue.first_seq.load(Ordering::SeqCst);
        let written = self.next_seq.get(&queue.id).map_or(queue.last_seq(), |n| n - 1);
        let to = to.min(written);
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

    pub(super) fn reset_work_offset(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        group: Arc<crate::work::WorkGroupState>,
        offset: u64,
        reply: Sender<Result<(), ResetError>>,
    ) {
        {
            let mut p = group.progress();
            p.offset = offset;
            p.done.clear();
        }
        let prefix = &group.claim_prefix;
        wb.delete_range_cf(cfs.claims, keys::claim_key(prefix, 0), keys::claim_key(prefix, u64::MAX));
        wb.delete_cf(cfs.claims, keys::claim_key(prefix, u64::MAX));
        wb.put_cf(cfs.offsets, &group.key, records::encode_shared_offset(offset));
        r.on_done(move |res| {
            if res.is_ok() {
                group.reset(offset);
            }
            let _ = reply.send(res.map_err(|e| ResetError::Storage(e.clone())));
        });
    }

    pub(super) fn reset_offset(
        &mut self,
        wb: &mut WriteBatch,
        offsets: &rocksdb::ColumnFamily,
        r: &mut Round,
        group: Arc<GroupState>,
        offset: u64,
        reply: Sender<Result<(), ResetError>>,
    ) {
        wb.put_cf(offsets, &group.key, records::encode_offset(offset));
        r.on_done(move |res| {
            if res.is_ok() {
                // A reset may go backwards: store, not max.
                group.acked.store(offset, Ordering::SeqCst);
                group.durable.store(offset, Ordering::SeqCst);
            }
            let _ = reply.send(res.map_err(|e| ResetError::Storage(e.clone())));
        });
    }
}
