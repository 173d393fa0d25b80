//! The writer's half of ordered groups: creating them, committing their offsets (one record per
//! dirty group per round), resets, and poison-message handling — persisting delivery counts and
//! redelivery times of deliveries that came back, dead-lettering messages that used up
//! `max_deliveries`, and deleting those marks once the offset passes them (or a reset or a trim
//! makes them moot).
//!
//! Marks are `ordered:<group>:<queue>:<seq>` records. A dead letter's copy and its mark (the
//! message is done for the group) go into one batch: a crash leaves either both — the message
//! is never delivered to the group again — or neither — it is delivered again, and no dead
//! letter exists. The subscription counts it acknowledged as the batch is built, so the offset
//! passes it in the same batch when nothing before it is outstanding (the mark is then deleted
//! in that batch too); otherwise the mark stays until the offset passes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::dead_letter;
use super::groups;
use super::round::Round;
use crate::engine::Engine;
use crate::engine::registry::{LiveSubscription, OrderedGroupState, PendingRecord, QueueState};
use crate::engine::request::{OrderedRequest, Reply};
use crate::error::Error;
use crate::events::Event;
use crate::model::{GroupMode, GroupOffset, OrderedMark};
use crate::store::RawMessage;
use crate::telemetry;

pub(super) fn apply(r: &mut Round<'_>, req: OrderedRequest) {
    match req {
        OrderedRequest::Create { queue, group, start, reply } => {
            groups::create::<OrderedGroupState>(r, queue, group, start, reply)
        }
        OrderedRequest::Reset { group, offset, reply } => reset(r, group, offset, reply),
    }
}

/// Coalesced offset commits: one record per dirty group per round. The flag is cleared (an
/// acquiring swap) before `acked` is read, so an ack racing with this either lands in the value
/// read here or re-marks the group for the next round.
pub(super) fn commit_dirty(r: &mut Round<'_>) {
    for g in r.engine.take_dirty() {
        g.dirty.swap(false, Ordering::AcqRel);
        if g.is_deleted() {
            // Its records are gone: nothing of it is written again. Queued records are
            // dropped (a queued dead letter holds its subscription).
            let pending = std::mem::take(&mut g.records().pending);
            drop(pending);
            continue;
        }
        // Delivery counts and dead letters first: a dead letter counts its message
        // acknowledged at once, so the offset below passes it in this same batch.
        let before = g.acked.load(Ordering::SeqCst);
        write_marks(r, &g, before);
        let acked = g.acked.load(Ordering::SeqCst);
        if acked > g.durable.load(Ordering::SeqCst) {
            r.batch.put_offset(&g.keys, GroupOffset { mode: GroupMode::Ordered, committed: acked });
            r.done.commits.push((g.clone(), acked));
        }
        if acked > before {
            // Deletes the marks the new offset passed (those just written too).
            write_marks(r, &g, acked);
        }
    }
}

/// Writes the pending marks of the dirty group `g`, whose offset in this round is `offset`
/// (written in this batch, or durable before it), and deletes the marks the offset passed.
/// Costs one lock and a few comparisons for a group without marks.
fn write_marks(r: &mut Round<'_>, g: &Arc<OrderedGroupState>, offset: u64) {
    // Marks of messages retention deleted are moot too, wherever the offset is.
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
    for seq in passed {
        r.batch.delete_record(&g.keys, seq);
    }
    for p in pending {
        match p {
            // The offset passed it already (it was acked after coming back), or it was
            // trimmed: nothing will read the mark.
            PendingRecord::Failed { seq, .. } if seq <= floor => {}
            // Done for the group since it came back (a transaction acked it): its mark says so
            // and must not be overwritten.
            PendingRecord::Failed { seq, .. } if g.records().dead.contains(&seq) => {}
            PendingRecord::Failed { seq, deliveries, not_before_micros } => {
                r.batch.put_mark(&g.keys, seq, &OrderedMark::CameBack { deliveries, not_before_micros });
                g.records().stored.insert(seq);
            }
            PendingRecord::DeadLetter { msg, deliveries, reason, sub } => {
                let trimmed = msg.seq <= floor;
                let letter = Letter { msg, deliveries, reason, sub };
                dead_letter_one(r, g, letter, offset, trimmed)
            }
        }
    }
}

/// A dead letter an ordered subscription queued.
struct Letter {
    msg: RawMessage,
    deliveries: u32,
    reason: String,
    sub: Arc<dyn LiveSubscription>,
}

fn dead_letter_one(
    r: &mut Round<'_>,
    g: &Arc<OrderedGroupState>,
    letter: Letter,
    offset: u64,
    trimmed: bool,
) {
    let Letter { msg, deliveries, reason, sub } = letter;
    let seq = msg.seq;
    if seq <= offset {
        // Retention deleted it and the group moved past it meanwhile: nothing to move.
        return;
    }
    // The subscription holds the message as delivered: no need to read it back.
    let env = msg.envelope();
    let dlq = sub.dead_letter_queue();
    let origin = dead_letter::Origin { queue: &g.queue, group: &g.name, seq, attempts: deliveries };
    match dead_letter::append(r, &origin, &reason, env, &dlq) {
        Ok((dlq_seq, reason)) => {
            // The subscription still had the message to hand: its dead letter is written even
            // if retention deleted the original meanwhile, but no mark is needed (nothing reads
            // the queue there again).
            if !trimmed {
                r.batch.put_mark(&g.keys, seq, &OrderedMark::DeadLettered { deliveries });
                g.records().stored.insert(seq);
            }
            // Done for the group now, in memory: remembered for its next subscription and
            // counted acknowledged, so that the caller writes the offset past it in this same
            // batch (the copy, its mark and the offset land together or not at all; if the
            // write fails, the broker fails closed and memory no longer matters).
            g.records().dead.insert(seq);
            sub.ack(seq);
            let engine = r.engine.clone();
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

/// Sets an ordered group's offset (replay), re-checking that the target is still retained.
fn reset(r: &mut Round<'_>, group: Arc<OrderedGroupState>, offset: u64, reply: Reply<(), Error>) {
    if group.is_deleted() {
        group.active.store(false, Ordering::Release);
        let (group, queue) = (group.name.to_string(), group.queue.name.to_string());
        let _ = reply.send(Err(Error::NoSuchGroup { group, queue }));
        return;
    }
    if let Err(e) = groups::still_retained(r, &group.queue, offset) {
        group.active.store(false, Ordering::Release);
        let _ = reply.send(Err(e));
        return;
    }
    // Set here, before the round's commit loop reads it: acks made before the reset and not
    // yet committed must not be written after it in the same batch (the reset holds the
    // active slot, so no ack can arrive meanwhile).
    group.acked.store(offset, Ordering::SeqCst);
    // Its marks describe the old position: they go in the same batch (and only with a reset
    // that lands).
    forget_marks(r, &group);
    r.batch.put_offset(&group.keys, GroupOffset { mode: GroupMode::Ordered, committed: offset });
    r.on_done(move |res| {
        if res.is_ok() {
            // A reset may go backwards: store, not max. Runs after the round's commits.
            group.durable.store(offset, Ordering::SeqCst);
        }
        // The caller handed the active slot to the writer with the request, so that a dropped
        // `reset_to` future cannot let a subscriber start before the reset lands.
        group.active.store(false, Ordering::Release);
        let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
    });
}

/// A reset of `g`: its marks describe messages of the old position, so they all go (with what
/// is pending for them), in the same batch as the new offset.
fn forget_marks(r: &mut Round<'_>, g: &OrderedGroupState) {
    let dropped = {
        let mut rec = g.records();
        rec.failed.clear();
        rec.dead.clear();
        rec.stored.clear();
        // A queued dead letter holds its subscription, and so the active slot the reset holds:
        // there is none. Were there one, its mark would outlive the reset below.
        debug_assert!(!rec.pending.iter().any(|p| matches!(p, PendingRecord::DeadLetter { .. })));
        std::mem::take(&mut rec.pending)
    };
    // Dropped outside the lock: dropping a subscription's last handle takes it.
    drop(dropped);
    r.batch.delete_all_records(&g.keys);
}

/// Retention deleted `queue`'s messages up to `to`: the marks of every ordered group on it
/// there go too.
pub(super) fn trimmed(r: &mut Round<'_>, queue: &QueueState, to: u64) {
    for g in r.written.ordered_groups_of(queue.id).to_vec() {
        for seq in g.records().forget_through(to) {
            r.batch.delete_record(&g.keys, seq);
        }
    }
}

/// Nothing more will be written (the broker failed, or the writer stops): the groups' queued
/// marks go. A queued dead letter holds its subscription, which holds the group that queues
/// it: left there, they would keep each other — and the group's active slot — alive for good.
/// The messages are delivered again after the next open.
pub(super) fn abandon(engine: &Engine, written: &super::round::Written) {
    for g in engine.take_dirty() {
        g.dirty.swap(false, Ordering::AcqRel);
    }
    for g in written.ordered_groups(engine) {
        // Taken under the lock, dropped after it (see `forget_marks`).
        let pending = std::mem::take(&mut g.records().pending);
        drop(pending);
    }
}
