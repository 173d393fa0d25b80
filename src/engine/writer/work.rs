//! The writer's half of work-queue groups: creating them, persisting claims, recording outcomes
//! (ack, retry, dead letter), moving offsets over finished sequences, resets and redriving dead
//! letters. Each request becomes entries of the round's one batch, so a dead letter's copy, its
//! claim deletion and the offset move are atomic.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::dead_letter;
use super::groups;
use super::queue;
use super::round::Round;
use crate::engine::registry::{QueueState, QueuedAck, WorkGroupState};
use crate::engine::request::{Outcome, RedriveItem, RedriveReply, Reply, WorkRequest};
use crate::error::{Error, FailedError};
use crate::events::Event;
use crate::model::{Claim, GroupMode, GroupOffset};
use crate::stats::{JobOutcome, OutcomeKind};
use crate::store::{ReadError, envelope};
use crate::telemetry;

pub(super) fn apply(r: &mut Round<'_>, req: WorkRequest) {
    match req {
        WorkRequest::Create { queue, group, start, reply } => {
            groups::create::<WorkGroupState>(r, queue, group, start, reply)
        }
        WorkRequest::Claim { group, epoch, claims, bucket, reply, .. } => {
            if group.is_deleted() {
                let _ = reply.send(Err(deleted(&group)));
                return;
            }
            // Claimed before a reset that is already in the batch: its records would bring back
            // attempts the reset dropped.
            if epoch != group.epoch() {
                let (seq, attempt) = claims.first().map_or((0, 0), |(s, c)| (*s, attempt_of(c)));
                let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                return;
            }
            // A claim at or below the offset (a purge or trim moved it meanwhile) would be a
            // record nothing ever deletes.
            let offset = group.progress().offset;
            for (seq, claim) in claims.iter().filter(|(seq, _)| *seq > offset) {
                r.batch.put_claim(&group.keys, *seq, claim);
            }
            // In the claims' batch: no claim is durable without the token it took.
            if let Some(micros) = bucket {
                r.batch.put_rate(&group.name, &group.queue.name, group.bucket_to_write(micros));
            }
            r.on_done(move |res| {
                drop(reply.send(res.map(|()| Vec::new()).map_err(|e| Error::Storage(e.clone()))))
            });
        }
        WorkRequest::Outcome { group, seq, attempt, epoch, outcome, reply, .. } => {
            if group.is_deleted() {
                // Nothing to revert: the group's memory is gone with it.
                let _ = reply.send(Err(deleted(&group)));
                return;
            }
            if epoch != group.epoch() {
                // Decided before a reset: the reset wins (and already forgot the slot).
                let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                return;
            }
            record_outcome(r, Attempt { group, seq, attempt }, outcome, reply)
        }
        WorkRequest::Redrive { dlq, expected, last, items, reply } => {
            redrive(r, dlq, Cursor { expected, last }, items, reply)
        }
        WorkRequest::SettleLetter { dlq, seq, item, reply } => settle_letter(r, dlq, seq, item, reply),
        WorkRequest::Reset { group, offset, reply } => reset(r, group, offset, reply),
        // Extensions live in memory here (a restart forgets leases anyway).
        WorkRequest::Extend(_) => {}
    }
}

/// The refusal of an outcome or claim of a deleted group.
fn deleted(g: &WorkGroupState) -> Error {
    Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() }
}

fn attempt_of(c: &Claim) -> u32 {
    match c {
        Claim::Leased { attempt, .. } | Claim::Waiting { attempt, .. } => *attempt,
        Claim::Done => 0,
    }
}

/// Acks queued in memory by worker pools, coalesced like ordered offsets: every group with
/// queued acks is finished in this round.
pub(super) fn commit_queued_acks(r: &mut Round<'_>) {
    for g in r.engine.take_work_dirty() {
        if g.is_deleted() {
            // Its offset record is gone: an ack must not write it back.
            drop(g.take_queued_acks());
            drop(g.take_queued_progress());
            continue;
        }
        // Progress first: an ack of the same job in this round then deletes what this writes.
        // A report on a job finished already (its ack in an earlier request of this round, or
        // round) is not written: nothing would delete it.
        for (seq, report) in g.take_queued_progress() {
            let p = g.progress();
            let finished = seq <= p.offset || p.done.contains(seq);
            drop(p);
            if !finished {
                r.batch.put_progress(&g.keys, seq, &report);
            }
        }
        let epoch = g.epoch();
        // Acks queued before a reset are dropped by it (see `WorkGroupState::reset`); one that
        // raced past it still carries the old epoch.
        let mut acks: Vec<_> = g.take_queued_acks().into_iter().filter(|a| a.epoch == epoch).collect();
        let keeps = g.keeps_outcomes();
        for a in &mut acks {
            // Not only when the group keeps outcomes: a flow step's ack moves its flow.
            if finish_seq(r, &g, a.seq) && (keeps || r.written.has_flow_jobs()) {
                let kind = OutcomeKind::Acked;
                keep_outcome(r, &g, a.seq, Finish { kind, attempt: a.attempt, result: a.result.take() });
            }
        }
        let engine = r.engine.clone();
        r.on_done(move |res| {
            if res.is_err() {
                return;
            }
            let (queue, group) = (&g.queue.name, &g.name);
            telemetry::group_counter(telemetry::ACKED, queue, group, acks.len() as u64);
            // Per ack: only when someone listens (events or TRACE logging).
            let per_ack = engine.events.receiver_count() > 0 || tracing::enabled!(tracing::Level::TRACE);
            for QueuedAck { seq, attempt, .. } in acks.into_iter().filter(|_| per_ack) {
                tracing::trace!(%queue, %group, seq, attempt, "rockq: acked");
                engine.emit(|| Event::Acked { queue: queue.clone(), group: group.clone(), seq, attempt });
            }
        });
    }
}

/// One offset record per work-queue group whose offset moved this round, written last.
pub(super) fn commit_offsets(r: &mut Round<'_>) {
    for g in r.done.work_offsets.take() {
        if g.is_deleted() {
            continue;
        }
        let offset = g.progress().offset;
        r.batch.put_offset(&g.keys, GroupOffset { mode: GroupMode::WorkQueue, committed: offset });
        r.done.work_durable.push((g, offset));
    }
}

/// An offset move over more sequences than this deletes their claim records with one range
/// tombstone instead of one point delete each (a gap closing over a long finished run).
const RANGE_DELETE_OVER: u64 = 32;

/// Marks `seq` finished (acked or dead-lettered): the offset moves over every contiguous
/// finished sequence, and their claims are deleted — one by one for a short move, with one
/// range tombstone for a long one. A finished sequence above a gap keeps a `Done` claim so a
/// restart does not deliver it again: O(1) per message however long the gap stays open.
///
/// Returns whether it finished `seq` now (not at or below the offset, nor finished already).
pub(super) fn finish_seq(r: &mut Round<'_>, g: &Arc<WorkGroupState>, seq: u64) -> bool {
    let mut p = g.progress();
    let before = p.offset;
    if seq <= before || !p.finish(seq) {
        return false;
    }
    let after = p.offset;
    drop(p);
    if after < seq {
        r.batch.put_claim(&g.keys, seq, &Claim::Done);
    }
    if g.forget_progress(seq) {
        r.batch.delete_progress(&g.keys, seq);
    }
    if after > before {
        if after - before > RANGE_DELETE_OVER {
            r.batch.delete_records_between(&g.keys, before + 1, after);
        } else {
            for s in before + 1..=after {
                r.batch.delete_record(&g.keys, s);
            }
        }
        r.done.work_offset_moved(g);
    }
    // Forgotten in memory once durable, per group in one lock (see `commit.rs`).
    r.done.work_finished(g, seq);
    true
}

/// How a job was finished, for its outcome record.
pub(super) struct Finish {
    pub kind: OutcomeKind,
    pub attempt: u32,
    pub result: Option<Bytes>,
}

/// Writes job `seq`'s outcome if its group keeps outcomes (in the batch that finishes it, so
/// a job is never finished without its outcome, nor the other way round), and moves its flow
/// on if it is a flow step (`flow.rs`). The finish time is the broker's wall clock now. Every
/// path that finishes a job calls it.
pub(super) fn keep_outcome(r: &mut Round<'_>, g: &WorkGroupState, seq: u64, finish: Finish) {
    super::flow::finished(r, g, seq, &finish.kind, finish.result.as_ref());
    if !g.keeps_outcomes() {
        return;
    }
    let finished_at =
        std::time::UNIX_EPOCH + std::time::Duration::from_micros(r.engine.clock().wall_micros());
    let Finish { kind, attempt, result } = finish;
    r.batch.put_outcome(&g.keys, seq, &JobOutcome { kind, finished_at, attempt, result });
}

/// One attempt of one message of a group.
struct Attempt {
    group: Arc<WorkGroupState>,
    seq: u64,
    attempt: u32,
}

fn record_outcome(r: &mut Round<'_>, at: Attempt, outcome: Outcome, reply: Reply<(), Error>) {
    let Attempt { group: g, seq, attempt } = at;
    let engine = r.engine.clone();
    let (queue, group) = (g.queue.name.clone(), g.name.clone());
    match outcome {
        Outcome::Ack { .. } | Outcome::Deleted => {
            let (kind, result) = match outcome {
                Outcome::Ack { result, .. } => (OutcomeKind::Acked, result),
                _ => (OutcomeKind::Deleted, None),
            };
            if finish_seq(r, &g, seq) {
                keep_outcome(r, &g, seq, Finish { kind, attempt, result });
            }
            r.on_done(move |res| {
                if res.is_ok() {
                    tracing::trace!(%queue, %group, seq, attempt, "rockq: acked");
                    telemetry::group_counter(telemetry::ACKED, &queue, &group, 1);
                    engine.emit(|| Event::Acked { queue, group, seq, attempt });
                }
                let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
            });
        }
        Outcome::Retry { .. } if seq <= g.progress().offset => {
            // A purge or trim moved the group past it while its handler ran: nothing to retry.
            let _ = reply.send(Ok(()));
        }
        Outcome::Retry { claim, delay } => {
            let error = match &claim {
                Claim::Waiting { last_error, .. } => last_error.clone(),
                _ => String::new(),
            };
            r.batch.put_claim(&g.keys, seq, &claim);
            r.on_done(move |res| {
                if res.is_ok() {
                    tracing::debug!(%queue, %group, seq, attempt, ?delay, %error, "rockq: retry scheduled");
                    telemetry::group_counter(telemetry::RETRIED, &queue, &group, 1);
                    engine.emit(|| Event::Retried { queue, group, seq, attempt, delay, error });
                }
                let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
            });
        }
        Outcome::DeadLetter { reason, dlq } => {
            // Every refusal below puts the message back to claimable (`refuse_outcome`): a
            // `Settling` slot that nobody reverts would hold the group's offset (and
            // retention) forever.
            let stored = match r.batch.message(g.queue.id, seq) {
                Ok(v) => v,
                Err(e) => return refuse_outcome(&g, seq, reply, Error::Storage(e)),
            };
            let (env, reason) = match stored {
                // A message that does not decode is dead-lettered as it is stored: its raw
                // bytes become the payload, so nothing is lost and the group can move past it.
                Some(stored) => {
                    let env = envelope::decode(b"", &stored).unwrap_or_else(|_| envelope::Envelope {
                        payload: Bytes::from(stored),
                        ..envelope::Envelope::default()
                    });
                    (env, reason)
                }
                None if seq < g.queue.first_seq.load(Ordering::Acquire) => {
                    // Retention deleted it meanwhile (and moved the group past it).
                    let _ = reply.send(Ok(()));
                    return;
                }
                // Gone from storage (outside rockq's doing): refusing would bring it back as
                // exhausted again and again; the group moves on and the dead-letter queue
                // records the loss.
                None => (envelope::Envelope::default(), format!("{reason} (the stored message was missing)")),
            };
            let origin = dead_letter::Origin { queue: &g.queue, group: &g.name, seq, attempts: attempt };
            let (dlq_seq, reason) = match dead_letter::append(r, &origin, &reason, env, &dlq) {
                Ok(done) => done,
                Err(e) => return refuse_outcome(&g, seq, reply, Error::Failed(FailedError::internal(e))),
            };
            if finish_seq(r, &g, seq) {
                let kind = OutcomeKind::DeadLettered {
                    reason: reason.clone(),
                    dead_letter_queue: dlq.to_string(),
                    dead_letter_seq: dlq_seq,
                };
                keep_outcome(r, &g, seq, Finish { kind, attempt, result: None });
            }
            r.on_done(move |res| {
                if res.is_ok() {
                    tracing::warn!(%queue, %group, seq, attempt, %reason, dlq = %dlq, dlq_seq, "rockq: dead-lettered");
                    telemetry::group_counter(telemetry::DEAD_LETTERED, &queue, &group, 1);
                    engine.emit(|| Event::DeadLettered {
                        queue,
                        group,
                        seq,
                        attempts: attempt,
                        reason,
                        dlq,
                        dlq_seq,
                    });
                }
                let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
            });
        }
    }
}

/// Answers a refused outcome and puts its message back to claimable.
fn refuse_outcome(g: &WorkGroupState, seq: u64, reply: Reply<(), Error>, e: Error) {
    g.revert(seq);
    let _ = reply.send(Err(e));
}

/// The redrive cursor a request expects, and where it moves it.
struct Cursor {
    expected: u64,
    last: u64,
}

fn redrive(
    r: &mut Round<'_>,
    dlq: Arc<QueueState>,
    cursor: Cursor,
    items: Vec<RedriveItem>,
    reply: RedriveReply,
) {
    if dlq.is_deleted() {
        let _ = reply.send(Err(Error::QueueDeleted { queue: dlq.name.to_string() }));
        return;
    }
    let current = match current_cursor(r, &dlq) {
        Ok(c) => c,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    if current != cursor.expected {
        let _ = reply.send(Err(Error::RedriveConflict { dlq: dlq.name.to_string() }));
        return;
    }
    // A letter settled on its own since the caller read the marks is not moved again.
    let mut items = items;
    match marks_of(r, &dlq) {
        Ok(marks) => items.retain(|i| !marks.contains(&i.dlq_seq)),
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    }
    // Encode every message and resolve every target first, so a bad one leaves nothing
    // half-written.
    let mut encoded = Vec::with_capacity(items.len());
    for item in &items {
        match envelope::encode(&item.message, item.enqueued_at_micros) {
            Ok(v) => encoded.push(v),
            Err(e) => {
                let why = format!("cannot re-encode dead letter {}: {e:?}", item.dlq_seq);
                let _ = reply.send(Err(Error::Failed(FailedError::internal(why))));
                return;
            }
        }
    }
    let mut targets = Vec::with_capacity(items.len());
    for item in &items {
        match queue::ensure(r, &item.target) {
            Ok(q) => targets.push(q),
            Err(e) => {
                let _ = reply.send(Err(Error::Failed(FailedError::internal(format!(
                    "target {:?}: {e}",
                    item.target
                )))));
                return;
            }
        }
    }
    let mut moved = Vec::with_capacity(items.len());
    let mut events = Vec::with_capacity(items.len());
    for ((item, q), value) in items.into_iter().zip(targets).zip(encoded) {
        let Some(seq) = queue::append(r, &q, &value) else { continue };
        super::flow::redriven(r, &q, seq, &item.message, (&dlq.name, item.dlq_seq));
        events.push((item.dlq_seq, q.name.clone(), seq));
        moved.push((q.name.clone(), seq));
    }
    move_cursor(r, &dlq, cursor.last);
    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, events.len() as u64);
            for (dlq_seq, queue, seq) in events {
                engine.emit(|| Event::Redriven { dlq: dlq.name.clone(), dlq_seq, queue, seq });
            }
        }
        let _ = reply.send(res.map(|()| moved).map_err(|e| Error::Storage(e.clone())));
    });
}

/// The redrive cursor of `dlq` as this round sees it.
/// Raised to just below the queue's first live letter, as callers read it: a purge or trim
/// that moved the queue's head past the stored cursor covered those letters too (otherwise a
/// caller's expected cursor never matches again).
fn current_cursor(r: &mut Round<'_>, dlq: &QueueState) -> Result<u64, Error> {
    let stored = match r.written.cursors.get(&dlq.id) {
        Some(c) => *c,
        None => match r.batch.cursor(&dlq.name) {
            Ok(c) => c.unwrap_or(0),
            Err(ReadError::Corrupt(e)) => return Err(e.into()),
            Err(ReadError::Storage(e)) => return Err(Error::Storage(e)),
        },
    };
    Ok(stored.max(dlq.first_seq.load(Ordering::Acquire).saturating_sub(1)))
}

/// The letters of `dlq` settled on their own, as this round sees them (read once, then kept:
/// the writer is their only writer).
fn marks_of<'r>(
    r: &'r mut Round<'_>,
    dlq: &QueueState,
) -> Result<&'r mut std::collections::BTreeSet<u64>, Error> {
    if !r.written.letter_marks.contains_key(&dlq.id) {
        let marks = r.batch.letter_marks(&dlq.name).map_err(Error::from)?;
        r.written.letter_marks.insert(dlq.id, marks);
    }
    Ok(r.written.letter_marks.entry(dlq.id).or_default())
}

/// Moves the cursor of `dlq` to `to`, then on over letters settled on their own right above
/// it; their marks go (the cursor covers them now). The marks must be loaded (`marks_of`):
/// every caller reads them first, to skip settled letters.
fn move_cursor(r: &mut Round<'_>, dlq: &QueueState, to: u64) {
    debug_assert!(r.written.letter_marks.contains_key(&dlq.id), "marks_of before move_cursor");
    let mut to = to;
    let had_marks = match r.written.letter_marks.get_mut(&dlq.id) {
        Some(marks) => {
            while marks.remove(&(to + 1)) {
                to += 1;
            }
            let below: Vec<u64> = marks.range(..=to).copied().collect();
            for s in below {
                marks.remove(&s);
            }
            true
        }
        None => false,
    };
    if had_marks {
        r.batch.delete_letter_marks_through(&dlq.name, to);
    }
    r.batch.put_cursor(&dlq.name, to);
    r.written.cursors.insert(dlq.id, to);
}

/// Settles dead letter `seq` of `dlq` on its own: appends its copy (a redrive) and moves the
/// cursor if it is the next one, or marks it settled otherwise — in one batch.
fn settle_letter(
    r: &mut Round<'_>,
    dlq: Arc<QueueState>,
    seq: u64,
    item: Option<RedriveItem>,
    reply: Reply<Option<(Arc<str>, u64)>, Error>,
) {
    if dlq.is_deleted() {
        let _ = reply.send(Err(Error::QueueDeleted { queue: dlq.name.to_string() }));
        return;
    }
    let missing = || Error::NoSuchLetter { dlq: dlq.name.to_string(), seq };
    let cursor = match current_cursor(r, &dlq) {
        Ok(c) => c,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    // Not above the cursor (redriven, or trimmed) or beyond the queue: no such letter.
    if seq <= cursor || seq > dlq.last_seq() {
        let _ = reply.send(Err(missing()));
        return;
    }
    match marks_of(r, &dlq) {
        Ok(marks) if marks.contains(&seq) => {
            let _ = reply.send(Err(missing()));
            return;
        }
        Ok(_) => {}
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    }
    let mut moved = None;
    if let Some(item) = item {
        let value = match envelope::encode(&item.message, item.enqueued_at_micros) {
            Ok(v) => v,
            Err(e) => {
                let why = format!("cannot re-encode dead letter {seq}: {e:?}");
                let _ = reply.send(Err(Error::Failed(FailedError::internal(why))));
                return;
            }
        };
        let q = match queue::ensure(r, &item.target) {
            Ok(q) => q,
            Err(e) => {
                let why = format!("target {:?}: {e}", item.target);
                let _ = reply.send(Err(Error::Failed(FailedError::internal(why))));
                return;
            }
        };
        let Some(new_seq) = queue::append(r, &q, &value) else {
            let _ = reply.send(Err(Error::QueueDeleted { queue: item.target.to_string() }));
            return;
        };
        super::flow::redriven(r, &q, new_seq, &item.message, (&dlq.name, seq));
        moved = Some((q.name.clone(), new_seq));
    }
    if seq == cursor + 1 {
        move_cursor(r, &dlq, seq);
    } else {
        if let Some(marks) = r.written.letter_marks.get_mut(&dlq.id) {
            marks.insert(seq);
        }
        r.batch.put_letter_mark(&dlq.name, seq);
    }
    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok()
            && let Some((queue, to)) = &moved
        {
            telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, 1);
            engine.emit(|| Event::Redriven {
                dlq: dlq.name.clone(),
                dlq_seq: seq,
                queue: queue.clone(),
                seq: *to,
            });
        }
        let _ = reply.send(res.map(|()| moved).map_err(|e| Error::Storage(e.clone())));
    });
}

/// Sets a work-queue group's offset (replay): its claims are deleted.
fn reset(r: &mut Round<'_>, group: Arc<WorkGroupState>, offset: u64, reply: Reply<(), Error>) {
    if group.is_deleted() {
        let (group, queue) = (group.name.to_string(), group.queue.name.to_string());
        let _ = reply.send(Err(Error::NoSuchGroup { group, queue }));
        return;
    }
    // Checked again here: a subscription or job could have appeared since the caller looked,
    // and nothing changes a group's claims between here and the batch's write.
    if group.subscriptions.load(Ordering::Acquire) > 0 || group.held(r.engine.clock().now()) {
        let (group, queue) = (group.name.to_string(), group.queue.name.to_string());
        let _ = reply.send(Err(Error::Active { group, queue }));
        return;
    }
    if let Err(e) = groups::still_retained(r, &group.queue, offset) {
        let _ = reply.send(Err(e));
        return;
    }
    group.progress().reset_to(offset);
    // In memory now, not when durable: outcomes, claims and acks decided before the reset but
    // arriving after it carry the old epoch and are refused; queued acks are dropped.
    group.reset(offset);
    r.batch.delete_all_records(&group.keys);
    // Progress goes with the claims (a reset forgets attempts). Kept outcomes stay for what
    // stays finished (at or below the new offset); those above go, since their jobs run again
    // (an old outcome must not make a queued job read as finished).
    drop(group.take_queued_progress());
    if group.has_progress.load(Ordering::Acquire) {
        r.batch.delete_progress_between(&group.keys, 0, u64::MAX);
    }
    r.batch.delete_outcomes_between(&group.keys, offset.saturating_add(1), u64::MAX);
    r.batch.put_offset(&group.keys, GroupOffset { mode: GroupMode::WorkQueue, committed: offset });
    r.done.work_offsets.remove(&super::round::GroupPtr::of(&group));
    r.on_done(move |res| {
        if res.is_ok() {
            // A reset may go backwards: store, not max.
            group.durable.store(offset, Ordering::SeqCst);
            group.settled.notify_waiters();
        }
        let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
    });
}

/// Every work-queue group of `queue` whose offset is behind `to` (a trim's cut, or a purge's
/// last sequence) jumps past it: its claims there go with one range delete, in the trim's
/// batch. Retention reports what a group had not finished as skipped (`report`); a purge,
/// which asked for it, does not.
pub(super) fn trimmed(r: &mut Round<'_>, queue: &QueueState, to: u64, report: bool) {
    for g in r.written.work_groups_of(queue.id).to_vec() {
        let mut p = g.progress();
        if p.offset >= to {
            continue;
        }
        let from = p.offset + 1;
        // Past `to` too, over messages finished while the trimmed head waited: their `done`
        // records go in the same range delete.
        let offset = p.trim_to(to);
        drop(p);
        r.batch.delete_records_through(&g.keys, offset);
        if g.has_progress.load(Ordering::Acquire) {
            r.batch.delete_progress_between(&g.keys, 0, offset);
        }
        r.done.work_offset_moved(&g);
        let engine = r.engine.clone();
        r.on_done(move |res| {
            if res.is_ok() && !report {
                g.skip_to(to);
            } else if res.is_ok() {
                g.skip_to(to);
                g.skipped.fetch_add(to - from + 1, Ordering::Relaxed);
                tracing::warn!(queue = %g.queue.name, group = %g.name, from, to, "rockq: retention skipped messages a group had not finished");
                engine.emit(|| Event::Skipped { queue: g.queue.name.clone(), group: g.name.clone(), from, to });
            }
        });
    }
}
