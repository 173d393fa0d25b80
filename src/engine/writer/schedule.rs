//! The writer's half of delayed messages, idempotent sends and recurring schedules.
//!
//! - **Submit**: each message of a call is checked against the queue's dedup index (a duplicate
//!   writes nothing), then appended now or put into the due index, and its idempotency key
//!   recorded — all in the round's one batch, so two producers racing with one key cannot both
//!   win, and a crash leaves either the message and its key or neither.
//! - **Fire**: what is due moves from the due index into its queue (delete + append in one
//!   batch): a delayed message gets its sequence when it becomes visible, so ordered groups see
//!   dense, time-ordered sequences. A recurring schedule's next firing is written in the batch
//!   that delivers the current one, so each firing happens once across crashes.
//! - **Cancel / reschedule** of delayed messages; **upsert / pause / delete** of recurring ones.
//!
//! Reads here see the store as of the last round; [`RoundJobs`](super::round::RoundJobs) holds
//! this round's own changes, and every lookup checks it first.

use std::sync::Arc;

use super::queue;
use super::round::Round;
use crate::engine::registry::QueueState;
use crate::engine::request::{Reply, ScheduleRequest, Submission};
use crate::error::{Error, FailedError};
use crate::events::Event;
use crate::model::ScheduleRecord;
use crate::schedule::{ON_TIME_PER_ROUND, plan_firings};
use crate::sent::{Original, ScheduledMessage, Sent};
use crate::store::{DueEntry, RECURRING, ReadError, envelope};
use crate::telemetry;

pub(super) fn apply(r: &mut Round<'_>, req: ScheduleRequest) {
    match req {
        ScheduleRequest::Submit { queue, msgs, reply } => submit(r, &queue, msgs, reply),
        // A deleted queue's delayed messages went with it.
        ScheduleRequest::Cancel { queue, reply, .. } if queue.is_deleted() => drop(reply.send(Ok(false))),
        ScheduleRequest::Reschedule { queue, reply, .. } if queue.is_deleted() => drop(reply.send(Ok(None))),
        ScheduleRequest::Cancel { queue, id, reply } => {
            let res = cancel(r, &queue, id);
            answer(r, reply, res);
        }
        ScheduleRequest::Reschedule { queue, id, due, reply } => {
            let res = reschedule(r, &queue, id, due);
            answer(r, reply, res);
        }
        ScheduleRequest::Fire => fire(r),
        ScheduleRequest::Upsert { name, record, reply } => {
            let res = upsert(r, name, record);
            answer(r, reply, res);
        }
        ScheduleRequest::Pause { name, paused, reply } => {
            let res = pause(r, &name, paused);
            answer(r, reply, res);
        }
        ScheduleRequest::Delete { name, reply } => {
            let res = delete(r, &name);
            answer(r, reply, res);
        }
    }
}

/// Answers once the round is durable; at once if the request failed before writing anything.
fn answer<T: Send + 'static>(r: &mut Round<'_>, reply: Reply<T, Error>, res: Result<T, Error>) {
    match res {
        Ok(v) => {
            r.on_done(move |res| drop(reply.send(res.map(|()| v).map_err(|e| Error::Storage(e.clone())))))
        }
        Err(e) => drop(reply.send(Err(e))),
    }
}

/// A fresh schedule id, persisted in this batch so it is never handed out again.
fn next_id(r: &mut Round<'_>) -> u64 {
    let id = r.written.next_scheduled_id;
    r.written.next_scheduled_id += 1;
    r.batch.put_next_scheduled_id(r.written.next_scheduled_id);
    id
}

fn submit(r: &mut Round<'_>, queue: &Arc<QueueState>, msgs: Vec<Submission>, reply: Reply<Vec<Sent>, Error>) {
    if queue.is_deleted() {
        let _ = reply.send(Err(Error::QueueDeleted { queue: queue.name.to_string() }));
        return;
    }
    let now = r.stamp();
    // Checked before anything is written, so a read error refuses the whole call unwritten.
    let originals = match lookup_originals(r, queue, &msgs, now) {
        Ok(found) => found,
        Err(e) => {
            let _ = reply.send(Err(e.into()));
            return;
        }
    };
    let Some((sent, hits)) = put_submissions(r, queue, msgs, originals, now) else {
        // Unreachable: a queue handle exists only once the writer registered it.
        let _ =
            reply.send(Err(Error::Failed(FailedError::internal("send to a queue unknown to the writer"))));
        return;
    };
    let name = queue.name.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            telemetry::queue_counter(telemetry::DEDUP_HITS, &name, hits);
        }
        let _ = reply.send(res.map(|()| sent).map_err(|e| Error::Storage(e.clone())));
    });
}

/// The first half of a submit (and of a transaction's sends): the original each message's
/// idempotency key already names within its window, read before anything is written so that a
/// read error leaves the batch untouched.
pub(super) fn lookup_originals(
    r: &Round<'_>,
    queue: &QueueState,
    msgs: &[Submission],
    now: u64,
) -> Result<Vec<Option<Original>>, ReadError> {
    msgs.iter()
        .map(|m| match &m.idempotency_key {
            Some(k) => super::dedup::lookup(r, queue.id, k, now),
            None => Ok(None),
        })
        .collect()
}

/// The second half: each message is a duplicate (nothing written), delayed (into the due
/// index) or appended now, and its idempotency key recorded. Returns each outcome and how many
/// were duplicates; `None` (nothing written) if the writer does not know the queue.
pub(super) fn put_submissions(
    r: &mut Round<'_>,
    queue: &Arc<QueueState>,
    msgs: Vec<Submission>,
    originals: Vec<Option<Original>>,
    now: u64,
) -> Option<(Vec<Sent>, u64)> {
    if !r.written.next_seq.contains_key(&queue.id) {
        return None;
    }
    let mut sent = Vec::with_capacity(msgs.len());
    let mut hits = 0;
    for (m, found) in msgs.into_iter().zip(originals) {
        // A key seen earlier in this very call counts too.
        let found = found.or_else(|| m.idempotency_key.as_deref().and_then(|k| r.jobs.dedup(queue.id, k)));
        if let Some(original) = found {
            hits += 1;
            sent.push(Sent::Duplicate(original));
            continue;
        }
        let Submission { mut envelope, due, idempotency_key } = m;
        let outcome = match due {
            Some(due) if due > now => {
                let id = next_id(r);
                // The time field holds when it was sent; it is stamped again when it fires.
                envelope::stamp(&mut envelope, now);
                r.batch.put_scheduled(queue.id, id, due, &envelope);
                r.jobs.scheduled.insert((queue.id, id), Some((due, envelope)));
                r.engine.timer.offer(due);
                queue.count_scheduled(true);
                Original::Scheduled(id)
            }
            _ => {
                envelope::stamp(&mut envelope, now);
                // Known to the writer (checked above): `append` allocates its sequence.
                Original::Appended(queue::append(r, queue, &envelope)?)
            }
        };
        if let Some(k) = idempotency_key {
            super::dedup::record(r, queue, k, outcome, now);
        }
        sent.push(match outcome {
            Original::Appended(seq) => Sent::Appended(seq),
            Original::Scheduled(id) => {
                let due = r.jobs.scheduled.get(&(queue.id, id)).and_then(|e| e.as_ref().map(|(d, _)| *d));
                Sent::Scheduled(ScheduledMessage { id, due: crate::schedule::time_of(due.unwrap_or(now)) })
            }
        });
    }
    Some((sent, hits))
}

/// Where delayed message `id` stands: its due time and envelope, or `None` if it is not
/// scheduled (fired, cancelled, or never was).
fn lookup_scheduled(r: &Round<'_>, queue_id: u32, id: u64) -> Result<Option<(u64, Vec<u8>)>, ReadError> {
    if let Some(e) = r.jobs.scheduled.get(&(queue_id, id)) {
        return Ok(e.clone());
    }
    r.batch.scheduled(queue_id, id)
}

fn cancel(r: &mut Round<'_>, queue: &QueueState, id: u64) -> Result<bool, Error> {
    let Some((due, _)) = lookup_scheduled(r, queue.id, id).map_err(Error::from)? else { return Ok(false) };
    r.batch.delete_scheduled(queue.id, id, due);
    r.jobs.scheduled.insert((queue.id, id), None);
    queue.count_scheduled(false);
    Ok(true)
}

fn reschedule(
    r: &mut Round<'_>,
    queue: &QueueState,
    id: u64,
    due: u64,
) -> Result<Option<ScheduledMessage>, Error> {
    // Never below the round's stamp (a time in the past is due now): the due index's floor
    // (see `fire`) relies on it.
    let due = due.max(r.stamp());
    let Some((old, env)) = lookup_scheduled(r, queue.id, id).map_err(Error::from)? else { return Ok(None) };
    r.batch.delete_due(old, queue.id, id);
    r.batch.put_scheduled(queue.id, id, due, &env);
    r.jobs.scheduled.insert((queue.id, id), Some((due, env)));
    r.engine.timer.offer(due);
    Ok(Some(ScheduledMessage { id, due: crate::schedule::time_of(due) }))
}

/// Appends what is due, at most one batch's worth, and tells the timer when to look next.
fn fire(r: &mut Round<'_>) {
    let now = r.stamp();
    let limits = (r.engine.options.max_batch_messages, r.engine.options.max_batch_bytes);
    let touched = &r.jobs.scheduled;
    let floor = r.written.due_floor;
    let read = r.batch.due_entries(floor, now, limits, |q, id| touched.contains_key(&(q, id)));
    let (entries, next) = match read {
        Ok(found) => found,
        Err(e) => {
            // Try again in a second rather than spin on a failing read.
            tracing::error!(error = %e, "rockq: reading the schedule failed");
            r.engine.timer.set(Some(now.saturating_add(1_000_000)));
            return;
        }
    };
    let mut delivered: rustc_hash::FxHashMap<u32, (Arc<QueueState>, u64)> = Default::default();
    // Everything below the last entry fired now is gone (fired, or moved this round): later
    // reads start there. No entry is ever written below it: new due times are after the round's
    // stamp, which never goes back.
    let last_due = entries.last().map(|e| e.due);
    // An entry left in place (its schedule could not be read) holds the floor and the timer.
    let mut kept: Option<u64> = None;
    for e in entries {
        if e.queue_id == RECURRING {
            let due = e.due;
            if !fire_recurring(r, e, now) {
                kept = Some(kept.map_or(due, |k| k.min(due)));
            }
            continue;
        }
        let DueEntry { due, queue_id, id, value: mut env } = e;
        r.batch.delete_scheduled(queue_id, id, due);
        r.jobs.scheduled.insert((queue_id, id), None);
        let Some(queue) = r.written.queue_ids.get(&queue_id).cloned() else {
            // A deleted queue's entries go with it (and this round's overlay hides them from
            // the read above): only a foreign write can cause this. Dropping the entry keeps
            // the timer from spinning on it.
            tracing::error!(queue_id, id, "rockq: a scheduled message names no queue; dropped");
            continue;
        };
        queue.count_scheduled(false);
        envelope::stamp(&mut env, now);
        if queue::append(r, &queue, &env).is_some() {
            delivered.entry(queue_id).or_insert_with(|| (queue.clone(), 0)).1 += 1;
        }
    }
    if let Some(last) = last_due {
        r.written.due_floor = r.written.due_floor.max(kept.unwrap_or(last));
    }
    // The earliest entry this round wrote counts too (the store does not show it yet); a kept
    // one is tried again in a second, not at once (the read failed).
    let written = r.jobs.scheduled.values().flatten().map(|(due, _)| *due).min();
    let retry = kept.map(|_| now.saturating_add(1_000_000));
    let next = [next, written, retry].into_iter().flatten().min();
    r.engine.timer.set(next);
    if !delivered.is_empty() {
        r.on_done(move |res| {
            if res.is_ok() {
                for (queue, n) in delivered.into_values() {
                    telemetry::queue_counter(telemetry::SCHEDULED_DELIVERED, &queue.name, n);
                }
            }
        });
    }
}

/// A recurring schedule's due entry: every firing due by now is on time (within the grace: a
/// message of its own) or late (the `Missed` policy: one catch-up message, or none); then its
/// next firing is written — in this batch.
/// Returns false if the entry was left in place to be tried again (its schedule's record could
/// not be read: dropping the entry would stop the schedule for good).
fn fire_recurring(r: &mut Round<'_>, e: DueEntry, now: u64) -> bool {
    let Ok(name) = String::from_utf8(e.value) else {
        tracing::error!(id = e.id, "rockq: a recurring firing has no valid schedule name; dropped");
        r.batch.delete_due(e.due, RECURRING, e.id);
        r.jobs.scheduled.insert((RECURRING, e.id), None);
        return true;
    };
    let found = lookup_schedule(r, &name);
    if let Err(err) = &found {
        tracing::error!(schedule = %name, error = %err, "rockq: reading a schedule failed; retrying");
        return false;
    }
    r.batch.delete_due(e.due, RECURRING, e.id);
    r.jobs.scheduled.insert((RECURRING, e.id), None);
    let mut rec = match found {
        Ok(Some(rec)) if rec.id == e.id && rec.next_micros == e.due && !rec.paused => rec,
        // Replaced, paused or deleted since this entry was written: it is stale.
        _ => return true,
    };
    let grace = rec.recurrence.grace.as_micros().min(u128::from(u64::MAX)) as u64;
    let plan = plan_firings(&rec.recurrence, e.due, now, grace, rec.anchor_micros, ON_TIME_PER_ROUND);
    let (sends, mut missed) = plan.sends(rec.recurrence.missed);
    let mut fired: Vec<(u64, u64)> = Vec::with_capacity(sends.len());
    if !sends.is_empty() {
        match queue::ensure(r, &rec.queue) {
            Ok(q) => {
                for &folded in &sends {
                    let mut env = rec.envelope.clone();
                    envelope::stamp(&mut env, now);
                    match queue::append(r, &q, &env) {
                        Some(seq) => fired.push((seq, folded)),
                        None => missed += 1 + folded,
                    }
                }
            }
            Err(err) => {
                tracing::error!(schedule = %name, queue = %rec.queue, error = %err, "rockq: schedule cannot send");
                missed += sends.iter().map(|folded| 1 + folded).sum::<u64>();
            }
        }
    }
    // Every firing is counted once: as a message (`fired`), or as missed — folded into the
    // catch-up message beside its own firing, skipped, or not sendable.
    missed += fired.iter().map(|&(_, folded)| folded).sum::<u64>();
    if let Some(&(seq, _)) = fired.last() {
        rec.fired += fired.len() as u64;
        rec.last_micros = now;
        rec.last_seq = seq;
    }
    rec.missed_firings += missed;
    rec.next_micros = plan.next.unwrap_or(0);
    if let Some(n) = plan.next {
        r.batch.put_firing(rec.id, n, &name);
        // (If `n` is already due, this round stopped at its cap: `fire` sets the timer to it.)
        r.jobs.scheduled.insert((RECURRING, rec.id), Some((n, name.clone().into_bytes())));
    }
    r.batch.put_schedule(&name, &rec);
    let (queue, engine) = (Arc::<str>::from(rec.queue.as_str()), r.engine.clone());
    r.jobs.schedules.insert(name.clone(), Some(rec));
    r.on_done(move |res| {
        if res.is_err() {
            return;
        }
        let schedule = Arc::<str>::from(name);
        if !fired.is_empty() {
            metrics::counter!(telemetry::SCHEDULE_FIRED, "queue" => queue.clone(), "schedule" => schedule.clone())
                .increment(fired.len() as u64);
        }
        // One event per message; one without a message if firings were only skipped.
        let skipped = missed - fired.iter().map(|&(_, folded)| folded).sum::<u64>();
        let events = fired.iter().map(|&(seq, folded)| (Some(seq), folded));
        let events: Vec<_> = if fired.is_empty() { vec![(None, skipped)] } else { events.collect() };
        for (seq, missed) in events {
            tracing::debug!(%schedule, %queue, ?seq, missed, "rockq: schedule fired");
            let (schedule, queue) = (schedule.clone(), queue.clone());
            engine.emit(|| Event::ScheduleFired { schedule, queue, seq, missed });
        }
    });
    true
}

/// Recurring schedule `name` as this round sees it.
fn lookup_schedule(r: &Round<'_>, name: &str) -> Result<Option<ScheduleRecord>, ReadError> {
    if let Some(rec) = r.jobs.schedules.get(name) {
        return Ok(rec.clone());
    }
    r.batch.schedule(name)
}

/// Takes schedule `rec`'s pending firing out of the due index.
fn unarm(r: &mut Round<'_>, rec: &ScheduleRecord) {
    if rec.next_micros != 0 {
        r.batch.delete_due(rec.next_micros, RECURRING, rec.id);
        r.jobs.scheduled.insert((RECURRING, rec.id), None);
    }
}

/// Puts schedule `rec`'s firing after `now` into the due index.
fn arm(r: &mut Round<'_>, name: &str, rec: &mut ScheduleRecord, now: u64) {
    rec.next_micros = rec.recurrence.next_after(now, rec.anchor_micros).unwrap_or(0);
    if rec.next_micros != 0 {
        r.batch.put_firing(rec.id, rec.next_micros, name);
        r.jobs.scheduled.insert((RECURRING, rec.id), Some((rec.next_micros, name.as_bytes().to_vec())));
        r.engine.timer.offer(rec.next_micros);
    }
}

/// Creates or replaces schedule `name`; returns its next firing (µs), if any. A replaced
/// schedule keeps its counters and paused state, and starts its recurrence from now.
fn upsert(r: &mut Round<'_>, name: String, mut rec: ScheduleRecord) -> Result<Option<u64>, Error> {
    let now = r.stamp();
    if let Some(old) = lookup_schedule(r, &name).map_err(Error::from)? {
        unarm(r, &old);
        rec.paused = old.paused;
        rec.fired = old.fired;
        rec.missed_firings = old.missed_firings;
        rec.last_micros = old.last_micros;
        rec.last_seq = old.last_seq;
    }
    // A fresh id: entries of the old version still in flight this round can never match it.
    rec.id = next_id(r);
    rec.anchor_micros = now;
    rec.next_micros = 0;
    if !rec.paused {
        arm(r, &name, &mut rec, now);
    }
    let next = Some(rec.next_micros).filter(|&n| n != 0);
    r.batch.put_schedule(&name, &rec);
    r.jobs.schedules.insert(name, Some(rec));
    Ok(next)
}

fn pause(r: &mut Round<'_>, name: &str, paused: bool) -> Result<(), Error> {
    let now = r.stamp();
    let Some(mut rec) = lookup_schedule(r, name).map_err(Error::from)? else {
        return Err(Error::NoSuchSchedule { name: name.to_owned() });
    };
    if rec.paused == paused {
        return Ok(());
    }
    rec.paused = paused;
    if paused {
        unarm(r, &rec);
        rec.next_micros = 0;
    } else {
        // Firings while paused are not missed ones: it resumes with the next after now.
        arm(r, name, &mut rec, now);
    }
    r.batch.put_schedule(name, &rec);
    r.jobs.schedules.insert(name.to_owned(), Some(rec));
    Ok(())
}

fn delete(r: &mut Round<'_>, name: &str) -> Result<bool, Error> {
    let Some(rec) = lookup_schedule(r, name).map_err(Error::from)? else { return Ok(false) };
    unarm(r, &rec);
    r.batch.delete_schedule(name);
    r.jobs.schedules.insert(name.to_owned(), None);
    Ok(true)
}
