//! The writer's half of queues: creating them, allocating sequences and appending messages —
//! the staged sends of producers, and the copies that dead letters and redrives append.
//!
//! Owning sequence allocation here means sequences are dense and monotonic: a queue's next
//! sequence is read from the writer's own counter, which only this thread advances, and a
//! failed write makes the writer fail closed, so an allocated sequence is never reused.

use std::sync::Arc;

use super::round::Round;
use crate::engine::inbox::Staged;
use crate::engine::registry::QueueState;
use crate::engine::request::{QueueRequest, refuse};
use crate::error::{Closed, QueueError};
use crate::model::QueueMeta;
use crate::retention::Retention;
use crate::store::envelope;

pub(super) fn apply(r: &mut Round<'_>, req: QueueRequest) {
    match req {
        QueueRequest::Create { name, reply } => create(r, name, reply),
        QueueRequest::SetDedupWindow { queue, window, reply } => {
            // Only this thread changes queue records, so the one written here is the latest.
            queue.set_dedup_window(window);
            r.batch.put_queue(&queue.name, &super::retention::meta(&queue));
            r.on_done(move |res| drop(reply.send(res.map_err(|e| QueueError::Storage(e.clone())))));
        }
    }
}

pub(super) fn refuse_request(req: QueueRequest, why: &Closed) {
    match req {
        QueueRequest::Create { reply, .. } => refuse(reply, why),
        QueueRequest::SetDedupWindow { reply, .. } => refuse(reply, why),
    }
}

fn create(
    r: &mut Round<'_>,
    name: String,
    reply: crate::engine::request::Reply<Arc<QueueState>, QueueError>,
) {
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
pub(super) fn ensure(r: &mut Round<'_>, name: &str) -> Result<Arc<QueueState>, QueueError> {
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
        return Err(QueueError::TooManyQueues);
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
    r.batch.put_message(queue.id, seq, envelope);
    r.done.messages += 1;
    r.done.touched(queue, seq, 1);
    Some(seq)
}

/// Appends one staged round's messages with sequences allocated in staging order, stamped
/// `now`.
pub(super) fn put_staged(r: &mut Round<'_>, mut s: Staged, now: u64) {
    // Next sequence of each of the round's queues: one map lookup per queue, not per message.
    let Some(mut next) =
        s.queues.iter().map(|q| r.written.next_seq.get(&q.id).copied()).collect::<Option<Vec<u64>>>()
    else {
        // Unreachable: a queue handle exists only once the writer has registered the queue.
        s.fail(&crate::error::Failure::Internal("send to a queue unknown to the writer"));
        return;
    };
    let firsts = next.clone();
    let mut seqs = Vec::with_capacity(s.sends.len());
    let mut calls = s.sends.iter().peekable();
    let mut start = 0;
    for (i, &(q, end)) in s.msgs.iter().enumerate() {
        let q = q as usize;
        if calls.next_if(|&&first| first as usize == i).is_some() {
            seqs.push(next[q]);
        }
        let env = &mut s.arena[start..end];
        envelope::stamp(env, now);
        r.batch.put_message(s.queues[q].id, next[q], env);
        next[q] += 1;
        start = end;
    }
    r.done.messages += s.msgs.len() as u64;
    for ((queue, first), next) in s.queues.iter().zip(firsts).zip(next) {
        r.written.next_seq.insert(queue.id, next);
        r.done.touched(queue, next - 1, next - first);
    }
    r.done.staged.push((s, seqs.into_boxed_slice()));
}
