//! The writer's half of queues: creating them, allocating sequences and appending messages —
//! the staged sends of producers, and the copies that dead letters and redrives append.
//!
//! Owning sequence allocation here means sequences are dense and monotonic: a queue's next
//! sequence is read from the writer's own counter, which only this thread advances, and a
//! failed write makes the writer fail closed, so an allocated sequence is never reused.

use std::sync::Arc;

use super::round::Round;
use crate::engine::completion::{DELETED_VALUE, duplicate_value};
use crate::engine::inbox::Staged;
use crate::engine::registry::QueueState;
use crate::engine::request::QueueRequest;
use crate::error::Error;
use crate::model::QueueMeta;
use crate::retention::Retention;
use crate::sent::Original;
use crate::store::envelope;
use crate::telemetry;
use std::sync::atomic::Ordering;

pub(super) fn apply(r: &mut Round<'_>, req: QueueRequest) {
    match req {
        QueueRequest::Create { name, reply } => create(r, name, reply),
        QueueRequest::SetDedupWindow { queue, window, reply } => {
            if queue.is_deleted() {
                let _ = reply.send(Err(Error::QueueDeleted { queue: queue.name.to_string() }));
                return;
            }
            // Only this thread changes queue records, so the one written here is the latest.
            queue.set_dedup_window(window);
            r.batch.put_queue(&queue.name, &meta(&queue));
            r.on_done(move |res| drop(reply.send(res.map_err(|e| Error::Storage(e.clone())))));
        }
    }
}

fn create(r: &mut Round<'_>, name: String, reply: crate::engine::request::Reply<Arc<QueueState>, Error>) {
    if let Some(q) = r.engine.registry.queue(&name) {
        let _ = reply.send(Ok(q));
        return;
    }
    if let Some((_, waiters)) = r.done.queues.get_mut(name.as_str()) {
        waiters.push(reply);
        return;
    }
    if let Some(q) = r.written.queues.get(&name) {
        // Written in an earlier round whose sync is still running: answer after this round's
        // sync, which comes after that one.
        r.done.queues.get_or_insert_with(q.name.clone(), || (q.clone(), Vec::new())).1.push(reply);
        return;
    }
    match ensure(r, &name) {
        Ok(_) => {
            if let Some((_, waiters)) = r.done.queues.get_mut(name.as_str()) {
                waiters.push(reply);
            }
        }
        Err(e) => drop(reply.send(Err(e))),
    }
}

/// The queue `name`, created in this round if it does not exist yet (its record goes into the
/// batch, and it is registered when the round completes).
pub(super) fn ensure(r: &mut Round<'_>, name: &str) -> Result<Arc<QueueState>, Error> {
    if let Some(q) = r.engine.registry.queue(name) {
        return Ok(q);
    }
    if let Some((q, _)) = r.done.queues.get(name) {
        return Ok(q.clone());
    }
    if let Some(q) = r.written.queues.get(name) {
        return Ok(q.clone());
    }
    // Id u32::MAX is reserved so that `<id + 1>` is always a valid upper bound.
    if r.written.next_queue_id == u32::MAX {
        return Err(Error::TooManyQueues);
    }
    let id = r.written.next_queue_id;
    r.written.next_queue_id += 1;
    r.batch.put_queue(
        name,
        &QueueMeta {
            id,
            first_seq: 1,
            retention: Retention::default(),
            dedup_window: crate::model::DEFAULT_DEDUP_WINDOW,
        },
    );
    r.written.next_seq.insert(id, 1);
    let state = QueueState::new(id, name, 1, 0, Retention::default());
    r.written.queues.insert(name.to_owned(), state.clone());
    r.written.queue_ids.insert(id, state.clone());
    r.done.queues.get_or_insert_with(state.name.clone(), || (state.clone(), Vec::new()));
    Ok(state)
}

/// Appends one encoded envelope to `queue`; returns its sequence.
pub(super) fn append(r: &mut Round<'_>, queue: &Arc<QueueState>, envelope: &[u8]) -> Option<u64> {
    let next = r.written.next_seq.get_mut(&queue.id)?;
    let seq = *next;
    *next += 1;
    put(r, queue, seq, envelope);
    r.done.messages += 1;
    r.done.touched(queue, seq, 1);
    Some(seq)
}

/// Writes message `seq` of `queue`, and its priority index entry if it has a priority (in the
/// same batch: the index is never behind the messages, nor ahead of them).
#[inline]
fn put(r: &mut Round<'_>, queue: &QueueState, seq: u64, envelope: &[u8]) {
    r.batch.put_message(queue.id, seq, envelope);
    let priority = envelope::priority(envelope);
    if priority > 0 {
        r.batch.put_priority(queue.id, seq, priority);
        // In memory at once: claims read it only up to the published sequence, which this
        // round's completion moves past `seq` after the write.
        queue.index_priority(seq, priority);
    }
}

/// Deletes messages `first..=to` of `queue` (retention, a purge), with their priority entries.
pub(super) fn trim(r: &mut Round<'_>, queue: &QueueState, first: u64, to: u64) {
    r.batch.trim_messages(queue.id, first, to);
    if queue.priorities_if_any().is_some() {
        r.batch.trim_priorities(queue.id, first, to);
        queue.forget_priorities_through(to);
    }
}

/// Appends one staged round's messages with sequences allocated in staging order, stamped
/// `now`.
pub(super) fn put_staged(r: &mut Round<'_>, mut s: Staged, now: u64) {
    // Next sequence of each of the round's queues: one map lookup per queue, not per message.
    // A queue deleted before this round has none (a queue handle exists only once the writer
    // has registered its queue): its sends are refused, the others of the round written.
    let mut next: Vec<u64> = Vec::with_capacity(s.queues.len());
    let mut gone: Vec<bool> = Vec::with_capacity(s.queues.len());
    for q in &s.queues {
        let n = r.written.next_seq.get(&q.id).copied().filter(|_| !q.is_deleted());
        next.push(n.unwrap_or(0));
        gone.push(n.is_none());
    }
    let firsts = next.clone();
    let mut seqs = Vec::with_capacity(s.sends.len());
    let mut calls = s.sends.iter().peekable();
    let mut start = 0;
    let (mut written, mut hits, mut refused) = (0u64, Vec::new(), Vec::new());
    for (i, &(q, end)) in s.msgs.iter().enumerate() {
        let q = q as usize;
        let first_of_call = calls.next_if(|&&first| first as usize == i).is_some();
        let env = &mut s.arena[start..end];
        start = end;
        if gone[q] {
            if first_of_call {
                refused.push((seqs.len(), s.queues[q].name.clone()));
                seqs.push(DELETED_VALUE);
            }
            continue;
        }
        // A send with an idempotency key is a call of one message (the handles see to it).
        if let Some(key) = envelope::idempotency_key(env) {
            let queue = &s.queues[q];
            if let Some(original) = super::dedup::check(r, queue, key, now, Original::Appended(next[q])) {
                seqs.push(duplicate_value(original));
                hits.push(queue.clone());
                continue;
            }
        }
        if first_of_call {
            seqs.push(next[q]);
        }
        envelope::stamp(env, now);
        put(r, &s.queues[q], next[q], env);
        next[q] += 1;
        written += 1;
    }
    if !hits.is_empty() {
        r.on_done(move |res| {
            if res.is_ok() {
                hits.iter().for_each(|q| telemetry::queue_counter(telemetry::DEDUP_HITS, &q.name, 1));
            }
        });
    }
    if !refused.is_empty() {
        s.resolver.completion().note_deleted(refused.into_boxed_slice());
    }
    r.done.messages += written;
    for (((queue, first), next), gone) in s.queues.iter().zip(firsts).zip(next).zip(gone) {
        if gone {
            continue;
        }
        r.written.next_seq.insert(queue.id, next);
        r.done.touched(queue, next - 1, next - first);
    }
    r.done.staged.push((s, seqs.into_boxed_slice()));
}

/// The record of `queue` as it stands (only this thread changes queue records).
pub(super) fn meta(queue: &QueueState) -> QueueMeta {
    QueueMeta {
        id: queue.id,
        first_seq: queue.first_seq.load(Ordering::SeqCst),
        retention: queue.retention(),
        dedup_window: queue.dedup_window(),
    }
}
