//! The writer's half of deleting and purging: each request is one batch.
//!
//! - **Deleting a queue** removes its record, every message, every group's offset, claims,
//!   delivery records and settings, its delayed messages (both index entries), its idempotency
//!   keys (both entries) and its redrive cursor. The states it had in memory are marked deleted
//!   as the request enters the batch (handles refuse, subscriptions end, and this thread
//!   refuses every later request naming them), and forgotten: a queue created again under the
//!   name gets a new id, so nothing of the old one can leak into it. Ids are never handed out
//!   again: the lowest unused one is persisted with the deletion.
//! - **Purging a queue** is a trim through its last sequence applied whatever its retention,
//!   with every group moved past it: work groups as a trim moves them (their claims and
//!   waiting retries there go), ordered groups' offsets set to the last sequence. Sequences
//!   continue.
//! - **Deleting a group** removes its offset, claims, delivery records and settings.
//!
//! Recurring schedules that target a deleted queue are kept: a schedule is a named object of
//! its own, and its next firing creates the queue again (empty, with a new id).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::round::Round;
use super::{ordered, work};
use crate::engine::registry::{OrderedGroupState, QueueState, WorkGroupState};
use crate::engine::request::{LifecycleRequest, Reply};
use crate::error::{Error, StorageError};
use crate::model::{GroupMode, GroupOffset};

pub(super) fn apply(r: &mut Round<'_>, req: LifecycleRequest) {
    match req {
        LifecycleRequest::DeleteQueue { name, reply } => delete_queue(r, &name, reply),
        LifecycleRequest::PurgeQueue { name, reply } => purge_queue(r, &name, reply),
        LifecycleRequest::DeleteGroup { queue, group, reply } => delete_group(r, &queue, &group, reply),
    }
}

/// Queue `name` as this thread knows it: registered, created in an earlier round whose sync is
/// still running, or created in this one.
fn find_queue(r: &Round<'_>, name: &str) -> Option<Arc<QueueState>> {
    r.engine
        .registry
        .queue(name)
        .or_else(|| r.done.queues.get(name).map(|(q, _)| q.clone()))
        .or_else(|| r.written.queues.get(name).cloned())
        .filter(|q| !q.is_deleted())
}

/// Answers `reply` with `value` once the round is durable.
fn answer<T: Send + 'static>(r: &mut Round<'_>, reply: Reply<T, Error>, value: T) {
    r.on_done(move |res| drop(reply.send(res.map(|()| value).map_err(|e| Error::Storage(e.clone())))));
}

fn delete_queue(r: &mut Round<'_>, name: &str, reply: Reply<bool, Error>) {
    let Some(queue) = find_queue(r, name) else {
        let _ = reply.send(Ok(false));
        return;
    };
    let id = queue.id;
    // Everything read first: a failed read leaves nothing changed.
    let read = (|| -> Result<_, StorageError> {
        Ok((r.batch.scheduled_of(id)?, r.batch.dedup_of(id)?, r.batch.settings_groups_of(name)?))
    })();
    let (scheduled, dedup, settings_groups) = match read {
        Ok(found) => found,
        Err(e) => {
            let _ = reply.send(Err(Error::Storage(e)));
            return;
        }
    };

    r.batch.delete_queue(name, id);
    // Delayed messages: the due entries as stored, then those this round wrote (the store
    // does not show them yet). Marked gone in the round's overlay, so a firing later in this
    // round does not append them to nowhere.
    for (sid, due) in scheduled {
        r.batch.delete_due(due, id, sid);
        r.jobs.scheduled.insert((id, sid), None);
    }
    for ((q, sid), entry) in r.jobs.scheduled.iter_mut() {
        if *q == id
            && let Some((due, _)) = entry.take()
        {
            r.batch.delete_due(due, id, *sid);
        }
    }
    // Idempotency keys' expiry entries, stored and written this round alike.
    for (key, expires) in dedup {
        r.batch.delete_dedup_expiry(expires, id, &key);
    }
    if let Some(keys) = r.jobs.dedup.remove(&id) {
        for (key, (_, expires)) in keys {
            r.batch.delete_dedup_expiry(expires, id, key.as_bytes());
        }
    }

    // Groups: those in memory (every group with an offset record), and any settings record.
    let groups = r.written.groups_of.remove(&id).unwrap_or_default();
    for g in &groups.ordered {
        r.batch.delete_group(&g.name, name);
        forget_ordered(r, g);
    }
    for g in &groups.work {
        r.batch.delete_group(&g.name, name);
        forget_work(r, g);
    }
    for group in settings_groups {
        r.batch.delete_group(&group, name);
    }
    r.written.settings.retain(|(_, q), _| &**q != name);
    r.written.cursors.remove(&id);
    r.written.letter_marks.remove(&id);

    // Forgotten by this thread and the registry: the name is free for a new queue (a new id).
    r.written.next_seq.remove(&id);
    r.written.queues.remove(name);
    r.written.queue_ids.remove(&id);
    // Created earlier in this round: answer its creators now (with the deleted state, which
    // refuses everything), so that the completer does not register it after all, and a create
    // later in this round makes a new queue.
    if let Some((q, waiters)) = r.done.queues.remove(&queue.name) {
        waiters.into_iter().for_each(|w| drop(w.send(Ok(q.clone()))));
    }
    r.engine.registry.queues.remove_if(name, |_, q| Arc::ptr_eq(q, &queue));
    r.batch.put_next_queue_id(r.written.next_queue_id);
    queue.mark_deleted();
    let deleted = queue.last_seq().saturating_sub(queue.first_seq.load(Ordering::SeqCst).saturating_sub(1));
    r.on_done(move |res| {
        if res.is_ok() {
            tracing::info!(queue = %queue.name, id, messages = deleted, "rockq: queue deleted");
        }
        let _ = reply.send(res.map(|()| true).map_err(|e| Error::Storage(e.clone())));
    });
}

/// Marks an ordered group deleted and forgets it (its subscription ends; its queued records
/// are dropped: they would keep its subscription alive).
fn forget_ordered(r: &mut Round<'_>, g: &Arc<OrderedGroupState>) {
    g.mark_deleted();
    let id = g.keys.id().to_vec();
    r.written.ordered.remove(&id);
    r.engine.registry.ordered.remove_if(&id, |_, s| Arc::ptr_eq(s, g));
    // Created earlier in this round: not registered after all (see `delete_queue`).
    if let Some((created, waiters)) = r.done.ordered.remove(&id) {
        waiters.into_iter().for_each(|w| drop(w.send(Ok(created.clone()))));
    }
    let pending = std::mem::take(&mut g.records().pending);
    drop(pending);
}

/// Marks a work-queue group deleted and forgets it (its subscriptions and pools end; its
/// queued acks are dropped).
fn forget_work(r: &mut Round<'_>, g: &Arc<WorkGroupState>) {
    g.mark_deleted();
    let id = g.keys.id().to_vec();
    r.written.work.remove(&id);
    r.engine.registry.work.remove_if(&id, |_, s| Arc::ptr_eq(s, g));
    if let Some((created, waiters)) = r.done.work.remove(&id) {
        waiters.into_iter().for_each(|w| drop(w.send(Ok(created.clone()))));
    }
    r.done.work_offsets.remove(&super::round::GroupPtr::of(g));
    drop(g.take_queued_acks());
}

fn purge_queue(r: &mut Round<'_>, name: &str, reply: Reply<u64, Error>) {
    let Some(queue) = find_queue(r, name) else {
        let _ = reply.send(Ok(0));
        return;
    };
    let first = queue.first_seq.load(Ordering::SeqCst);
    // The writer's own counter: sends staged before this request (this round's included) are
    // purged too.
    let last = r.written.next_seq.get(&queue.id).map_or(queue.last_seq(), |n| n - 1);
    // Subscriptions passing over this range do not report it as skipped by retention.
    queue.purged_through.fetch_max(last, Ordering::SeqCst);
    let deleted = if last >= first {
        // Readers switch to the new first sequence before the range disappears (as for a trim).
        queue.first_seq.store(last + 1, Ordering::SeqCst);
        super::queue::trim(r, &queue, first, last);
        r.batch.put_queue(&queue.name, &super::queue::meta(&queue));
        last - first + 1
    } else {
        0
    };
    // Groups move past the purged range even if nothing was left in it: an ordered group
    // behind a trimmed head would otherwise keep its old offset.
    ordered::trimmed(r, &queue, last);
    work::trimmed(r, &queue, last, false);
    for g in r.written.ordered_groups_of(queue.id).to_vec() {
        // `fetch_max`: a live subscription's later acks below it change nothing, and it passes
        // the purged range when it next reads.
        if g.acked.fetch_max(last, Ordering::SeqCst) < last {
            r.batch.put_offset(&g.keys, GroupOffset { mode: GroupMode::Ordered, committed: last });
            r.done.commits.push((g, last));
        }
    }
    let queue_name = queue.name.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            tracing::info!(queue = %queue_name, deleted, through = last, "rockq: queue purged");
        }
    });
    answer(r, reply, deleted);
}

fn delete_group(r: &mut Round<'_>, queue: &str, group: &str, reply: Reply<bool, Error>) {
    let Some(q) = find_queue(r, queue) else {
        let _ = reply.send(Ok(false));
        return;
    };
    let id = crate::store::group_id(group, queue);
    let reg = &r.engine.registry;
    let same_queue = |g_queue: &Arc<QueueState>| Arc::ptr_eq(g_queue, &q);
    let ordered = reg
        .ordered
        .get(&id)
        .map(|g| g.clone())
        .or_else(|| r.written.ordered.get(&id).cloned())
        .filter(|g| same_queue(&g.queue) && !g.is_deleted());
    let work = reg
        .work
        .get(&id)
        .map(|g| g.clone())
        .or_else(|| r.written.work.get(&id).cloned())
        .filter(|g| same_queue(&g.queue) && !g.is_deleted());
    let key = (group.to_owned(), q.name.clone());
    let has_settings = match r.written.settings.get(&key) {
        Some(_) => true,
        None => match r.batch.settings(group, queue) {
            Ok(s) => s.is_some(),
            // A record that does not decode is a record: it goes.
            Err(crate::store::ReadError::Corrupt(_)) => true,
            Err(crate::store::ReadError::Storage(e)) => {
                let _ = reply.send(Err(Error::Storage(e)));
                return;
            }
        },
    };
    if ordered.is_none() && work.is_none() && !has_settings {
        let _ = reply.send(Ok(false));
        return;
    }
    r.batch.delete_group(group, queue);
    r.written.settings.remove(&key);
    if let Some(g) = &ordered {
        forget_ordered(r, g);
    }
    if let Some(g) = &work {
        forget_work(r, g);
    }
    if let Some(groups) = r.written.groups_of.get_mut(&q.id) {
        groups.ordered.retain(|g| !g.is_deleted());
        groups.work.retain(|g| !g.is_deleted());
    }
    let (queue, group) = (q.name.clone(), group.to_owned());
    r.on_done(move |res| {
        if res.is_ok() {
            tracing::info!(%queue, %group, "rockq: group deleted");
        }
        let _ = reply.send(res.map(|()| true).map_err(|e| Error::Storage(e.clone())));
    });
}
