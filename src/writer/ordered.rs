//! The writer's half of ordered groups' poison-message handling: persisting delivery counts
//! and redelivery times of deliveries that came back, dead-lettering messages that used up
//! `max_deliveries`, and deleting those records once the offset passes them (or a reset or a
//! trim makes them moot).
//!
//! Records are `ordered:<group>:<queue>:<seq>` in the claims column family (a prefix apart
//! from the work groups' `claim:` records). A dead letter's copy and its record (marking the
//! message done for the group) go into one `WriteBatch`: a crash leaves either both — the
//! message is never delivered to the group again — or neither — it is delivered again, and
//! no dead letter exists. The subscription counts it acknowledged as the batch is built, so the
//! offset passes it in the same batch when nothing before it is outstanding (the record is then
//! deleted in that batch too); otherwise the record stays until the offset passes it.

use std::sync::Arc;

use rocksdb::WriteBatch;

use super::{Round, Writer};
use crate::Event;
use crate::consumer::PendingRecord;
use crate::registry::{GroupState, QueueState};
use crate::store::records::DeliveryRecord;
use crate::store::{Cfs, envelope, keys};
use crate::telemetry;

impl Writer {
    /// Writes the pending records of the dirty ordered group `g`, whose offset in this round
    /// is `offset` (written in this batch, or durable before it), and deletes its records the
    /// offset passed. Costs one lock and a few comparisons for a group without records.
    pub(super) fn ordered_records(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        g: &Arc<GroupState>,
        offset: u64,
    ) {
        // Records of messages retention deleted are moot too, wherever the offset is.
        let floor = g.records_moot_through(offset);
        let (pending, passed) = {
            let mut rec = g.records();
            let passed_any = rec.stored.first().is_some_and(|&s| s <= floor)
                || rec.failed.first_key_value().is_some_and(|(&s, _)| s <= floor)
                || rec.dead.first().is_some_and(|&s| s <= floor);
            if rec.pending.is_empty() && !passed_any {
                return;
            }
            let passed = rec.forget_through(floor);
            (std::mem::take(&mut rec.pending), passed)
        };
        let prefix = keys::ordered_prefix(&g.name, &g.queue.name);
        for seq in passed {
            wb.delete_cf(cfs.claims, keys::claim_key(&prefix, seq));
        }
        for p in pending {
            match p {
                // The offset passed it already (it was acked after coming back), or it was
                // trimmed: nothing will read the record.
                PendingRecord::Failed { seq, .. } if seq <= floor => {}
                PendingRecord::Failed { seq, deliveries, not_before_micros } => {
                    let record = DeliveryRecord { deliveries, not_before_micros, dead_lettered: false };
                    wb.put_cf(cfs.claims, keys::claim_key(&prefix, seq), record.encode());
                    g.records().stored.insert(seq);
                }
                PendingRecord::DeadLetter { msg, deliveries, reason, sub } => {
                    let trimmed = msg.seq <= floor;
                    self.ordered_dead_letter(
                        wb, cfs, r, g, &prefix, msg, deliveries, reason, sub, offset, trimmed,
                    )
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ordered_dead_letter(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        g: &Arc<GroupState>,
        prefix: &[u8],
        msg: crate::store::RawMessage,
        deliveries: u32,
        reason: String,
        sub: Arc<crate::consumer::SubShared>,
        offset: u64,
        trimmed: bool,
    ) {
        let seq = msg.seq;
        if seq <= offset {
            // Retention deleted it and the group moved past it meanwhile: nothing to move.
            return;
        }
        // The subscription holds the message as delivered: no need to read it back.
        let env = envelope::Envelope {
            enqueued_at_micros: msg.enqueued_at_micros,
            headers: msg.headers.clone(),
            payload: msg.payload.clone(),
        };
        let dlq = sub.poison.dlq.clone();
        match self.append_dead_letter(wb, cfs, r, &g.queue, &g.name, seq, deliveries, &reason, env, &dlq) {
            Ok((dlq_seq, reason)) => {
                // The subscription still had the message to hand: its dead letter is written
                // even if retention deleted the original meanwhile, but no mark is needed
                // (nothing reads the queue there again).
                if !trimmed {
                    let record = DeliveryRecord { deliveries, not_before_micros: 0, dead_lettered: true };
                    wb.put_cf(cfs.claims, keys::claim_key(prefix, seq), record.encode());
                    g.records().stored.insert(seq);
                }
                // Done for the group now, in memory: remembered for its next subscription and
                // counted acknowledged, so that the caller writes the offset past it in this
                // same batch (the copy, its mark and the offset land together or not at all;
                // if the write fails, the broker fails closed and memory no longer matters).
                g.records().dead.insert(seq);
                sub.ack(seq);
                let engine = self.engine.clone();
                let g = g.clone();
                r.on_done(move |res| {
                    if res.is_err() {
                        return; // the broker fails closed; it is delivered again after reopening
                    }
                    let (queue, group) = (g.queue.name.clone(), g.name.clone());
                    tracing::warn!(%queue, %group, seq, attempt = deliveries, %reason, %dlq, dlq_seq, "rockq: dead-lettered");
                    telemetry::group_counter(telemetry::DEAD_LETTERED, &queue, &group, 1);
                    // The subscription (and its active slot) is held until the dead letter is
                    // durable, and released before anyone hears of it: a listener may then
                    // subscribe or reset at once.
                    drop(sub);
                    engine.emit(|| Event::DeadLettered {
                        queue,
                        group,
                        seq,
                        attempts: deliveries,
                        reason,
                        dlq,
                        dlq_seq,
                    });
                });
            }
            Err(e) => {
                // Nothing was written: deliver it again rather than lose it.
                tracing::error!(queue = %g.queue.name, group = %g.name, seq, error = %e, "rockq: dead-lettering failed; delivering again");
                r.on_done(move |_| sub.redeliver(msg, deliveries));
            }
        }
    }

    /// A reset of `g`: its records describe messages of the old position, so they all go
    /// (with what is pending for them), in the same batch as the new offset.
    pub(super) fn ordered_reset(
        &mut self,
        wb: &mut WriteBatch,
        claims: &rocksdb::ColumnFamily,
        g: &GroupState,
    ) {
        let dropped = {
            let mut rec = g.records();
            rec.failed.clear();
            rec.dead.clear();
            rec.stored.clear();
            // A queued dead letter holds its subscription, and so the active slot the reset
            // holds: there is none. Were there one, its mark would outlive the reset below.
            debug_assert!(!rec.pending.iter().any(|p| matches!(p, PendingRecord::DeadLetter { .. })));
            std::mem::take(&mut rec.pending)
        };
        // Dropped outside the lock: dropping a subscription's last handle takes it.
        drop(dropped);
        let prefix = keys::ordered_prefix(&g.name, &g.queue.name);
        wb.delete_range_cf(claims, keys::claim_key(&prefix, 0), keys::claim_key(&prefix, u64::MAX));
        wb.delete_cf(claims, keys::claim_key(&prefix, u64::MAX));
    }

    /// Retention deleted `queue`'s messages up to `to`: the records of every ordered group on
    /// it there go too.
    pub(super) fn ordered_trimmed(
        &mut self,
        wb: &mut WriteBatch,
        claims: &rocksdb::ColumnFamily,
        queue: &QueueState,
        to: u64,
    ) {
        for g in self.ordered_groups().into_iter().filter(|g| g.queue.id == queue.id) {
            let gone = g.records().forget_through(to);
            if gone.is_empty() {
                continue;
            }
            let prefix = keys::ordered_prefix(&g.name, &g.queue.name);
            for seq in gone {
                wb.delete_cf(claims, keys::claim_key(&prefix, seq));
            }
        }
    }

    /// Nothing more will be written (the broker failed, or the writer stops): the groups'
    /// queued records go. A queued dead letter holds its subscription, which holds the group
    /// that queues it: left there, they would keep each other — and the group's active slot —
    /// alive for good. The messages are delivered again after the next open.
    pub(super) fn ordered_abandon(&self) {
        for g in self.engine.take_dirty() {
            g.dirty.swap(false, std::sync::atomic::Ordering::AcqRel);
        }
        for g in self.ordered_groups() {
            // Taken under the lock, dropped after it (see `ordered_reset`).
            let pending = std::mem::take(&mut g.records().pending);
            drop(pending);
        }
    }

    /// Every ordered group: the registry's and those this writer created, possibly not yet
    /// synced into it (a group may come twice; every caller's work is idempotent).
    fn ordered_groups(&self) -> Vec<Arc<GroupState>> {
        self.engine.registry.groups.iter().map(|g| g.clone()).chain(self.groups.values().cloned()).collect()
    }
}
