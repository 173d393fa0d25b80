//! What other processes change in the namespace, taught to this one without polling: one watch
//! over every queue record and tail key. A tail moved elsewhere is published to this process's
//! `QueueState`, so subscriptions here wake as for local sends; a queue record written
//! elsewhere registers a new queue, or brings its retention policy and first sequence (a trim)
//! here, where subscriptions skip to the new head and work groups past it; a purge mark makes
//! subscriptions here drop what they had read ahead of the purged range. A watch that breaks
//! (its start revision was compacted, the member went away) is replaced after re-reading every
//! queue and tail: state is re-read, not replayed, so no change is missed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::follow::{Followed, follow};
use super::side::{EtcdSide, register_queue};
use crate::engine::Engine;
use crate::model::QueueMeta;
use crate::store::etcd::retention::NamespaceEvent;

pub(super) async fn run(
    engine: Weak<Engine>,
    side: Arc<EtcdSide>,
    mut revision: i64,
    stop: CancellationToken,
) {
    loop {
        match side.store.watch_namespace(revision).await {
            Ok(stream) => {
                let side = &side;
                let each = |engine: Arc<Engine>, events| async move {
                    // Tests hold a batch back here (a slow watch), and learn when it went through.
                    crate::faults::reached("rockq-etcd-namespace-apply");
                    apply(&engine, side, events).await;
                    crate::faults::reached("rockq-etcd-namespace-applied");
                };
                if let Followed::Stopped = follow(stream, "namespace", &engine, &stop, each).await {
                    return;
                }
            }
            Err(e) => tracing::debug!(error = %e, "rockq: etcd watch did not start; retrying"),
        }
        // Re-read every queue and tail, then watch from there.
        loop {
            // The earliest due time too: a delayed message or a firing written while the
            // watch was down wakes the timer (read after the namespace, so nothing written
            // between the two is missed: the watch starts at the namespace's revision).
            let read = async {
                let loaded = side.store.load().await?;
                Ok::<_, crate::error::StorageError>((
                    loaded,
                    side.store.first_due().await?,
                    side.store.keyspaces().await?,
                ))
            };
            match read.await {
                Ok((loaded, first_due, keyspaces)) => {
                    let Some(engine) = engine.upgrade() else { return };
                    forget_missing(&engine, &side, &loaded.queues).await;
                    let mut events = Vec::with_capacity(loaded.queues.len() * 2);
                    let purged =
                        loaded.purged.iter().map(|&(qid, through)| NamespaceEvent::Purged { qid, through });
                    events.extend(purged);
                    for (name, meta, last) in loaded.queues {
                        events.push(NamespaceEvent::Tail { qid: meta.id, last });
                        events.push(NamespaceEvent::Queue { name, meta });
                    }
                    events.extend(
                        loaded.priorities.into_iter().map(|(qid, seq, priority)| NamespaceEvent::Priority {
                            qid,
                            seq,
                            priority,
                        }),
                    );
                    events.extend(first_due.map(|due| NamespaceEvent::Due { due }));
                    events.extend(
                        keyspaces.into_iter().map(|(name, id)| NamespaceEvent::Keyspace { name, id }),
                    );
                    apply(&engine, &side, events).await;
                    // A flow change written while the watch was down is applied too.
                    side.flows_changed.notify_one();
                    revision = loaded.revision;
                    break;
                }
                Err(_) => {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }
}

/// Forgets each queue registered here that the namespace no longer holds (deleted while the
/// watch was down), asked again on its own: one registered after the namespace was read is
/// not mistaken for a deleted one.
async fn forget_missing(engine: &Engine, side: &EtcdSide, stored: &[(String, QueueMeta, u64)]) {
    let here: Vec<(String, u32)> =
        engine.registry.queues.iter().map(|q| (q.name.to_string(), q.id)).collect();
    for (name, id) in here {
        if stored.iter().any(|(n, meta, _)| *n == name && meta.id == id) {
            continue;
        }
        if let Ok(found) = side.store.queue_record(&name).await
            && found.is_none_or(|(meta, _)| meta.id != id)
        {
            super::forget::forget_queue(engine, side, &name, id);
        }
    }
}

/// Applies what the watch saw. Purge marks first, so that subscriptions here drop what was
/// purged before they see the new first sequence (which alone would let them hand out what
/// they had read ahead, as after a retention trim); then queue records, so that a tail of a
/// queue created elsewhere finds it registered.
async fn apply(engine: &Engine, side: &EtcdSide, events: Vec<NamespaceEvent>) {
    let mut tails = Vec::new();
    // The queue of the last index entry (a call's entries come together).
    let mut indexed: Option<std::sync::Arc<crate::engine::registry::QueueState>> = None;
    for ev in &events {
        if let NamespaceEvent::Purged { qid, through } = *ev
            && let Some(q) = engine.registry.queues.iter().find(|q| q.id == qid)
        {
            q.purged_through.fetch_max(through, Ordering::SeqCst);
        }
    }
    for ev in events {
        match ev {
            NamespaceEvent::Queue { name, meta } => learn_queue(engine, side, &name, &meta).await,
            NamespaceEvent::Tail { qid, last } => tails.push((qid, last)),
            NamespaceEvent::Purged { .. } => {}
            NamespaceEvent::QueueGone { name, id } => super::forget::forget_queue(engine, side, &name, id),
            // Not registered if its count cannot be read now: `Broker::kv` finds it then.
            NamespaceEvent::Keyspace { name, id } => {
                if let Err(e) = super::keyspaces::learn_keyspace(engine, side, &name, id).await {
                    tracing::debug!(keyspace = %name, error = %e, "rockq: a keyspace seen in etcd not registered");
                }
            }
            NamespaceEvent::FlowChange => side.flows_changed.notify_one(),
            NamespaceEvent::Due { due } => {
                side.due_offers.fetch_min(due, Ordering::AcqRel);
                engine.timer.offer(due);
            }
            // Before the tails below: a claim that sees a message sees its priority.
            NamespaceEvent::Priority { qid, seq, priority } => {
                let q = match indexed.take() {
                    Some(q) if q.id == qid => Some(q),
                    _ => engine.registry.queues.iter().find(|q| q.id == qid).map(|q| q.clone()),
                };
                if let Some(q) = q {
                    if seq >= q.first_seq.load(Ordering::Acquire) {
                        q.index_priority(seq, priority);
                    }
                    indexed = Some(q);
                }
            }
        }
    }
    for (qid, last) in tails {
        if let Some(q) = engine.registry.queues.iter().find(|q| q.id == qid) {
            q.publish_max(last);
        }
    }
}

/// A queue record as it is now in etcd: registered if new here, else its policy and first
/// sequence taken over (the first sequence only grows).
pub(super) async fn learn_queue(engine: &Engine, side: &EtcdSide, name: &str, meta: &QueueMeta) {
    let q = match engine.registry.queue(name) {
        Some(q) if q.id == meta.id => q,
        // An older record of the name than the queue registered here: stale.
        Some(q) if q.id > meta.id => return,
        // The queue registered here was deleted and the name made anew (ids only grow): its
        // deletion was missed (a watch that broke meanwhile).
        Some(q) => {
            super::forget::forget_queue(engine, side, name, q.id);
            register_queue(engine, name, meta, meta.first_seq - 1);
            return;
        }
        None => {
            register_queue(engine, name, meta, meta.first_seq - 1);
            return;
        }
    };
    *q.retention.lock().unwrap_or_else(|p| p.into_inner()) = meta.retention;
    q.set_dedup_window(meta.dedup_window);
    let before = q.first_seq.fetch_max(meta.first_seq, Ordering::AcqRel);
    let to = meta.first_seq - 1;
    // The trim deleted their index entries with them (whoever raised the first sequence here).
    q.forget_priorities_through(to);
    if meta.first_seq > before {
        // Trimmed (here or elsewhere): the marks of ordered groups held here go (the trim
        // deleted them in etcd); subscriptions skip to the new first sequence as embedded.
        for g in engine.registry.ordered.iter().filter(|g| g.queue.id == q.id) {
            g.records().forget_through(to);
        }
    }
    // Work groups jump past the deleted head — also when another path here (a read that met
    // the gap, a new group's start) raised the first sequence before this record arrived:
    // judged by the groups' offsets, not by who raised it, so none stays behind the trim (and
    // `Broker::wait_job` on a job the trim removed is woken).
    let behind =
        engine.registry.work.iter().any(|g| g.queue.id == q.id && g.durable.load(Ordering::Acquire) < to);
    if meta.first_seq > before || behind {
        super::claims::trimmed(side, q.id, to).await;
    }
}
