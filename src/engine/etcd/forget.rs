//! Forgetting here a group or a queue that was deleted (by this process's writer, or by
//! another process: `deletion.rs`), as the embedded writer forgets what it deletes.

use std::sync::Arc;

use super::side::EtcdSide;
use crate::engine::Engine;

/// Forgets group `group` on `queue` here, whichever its mode: marked deleted, dropped from the
/// registry, its claims' view and kept settings dropped.
pub(super) fn forget(engine: &Engine, side: &EtcdSide, group: &str, queue: &str) {
    let id = crate::store::group_id(group, queue);
    if let Some((_, g)) = engine.registry.ordered.remove(&id) {
        g.mark_deleted();
        // Its queued records would keep its subscription alive.
        drop(std::mem::take(&mut g.records().pending));
    }
    if let Some((_, g)) = engine.registry.work.remove(&id) {
        g.mark_deleted();
        drop(g.take_queued_acks());
    }
    // The claims watch ends with its `WorkSide`.
    side.work.remove(&id);
    side.group_settings.remove(&id);
    side.group_seen.remove(&id);
}

/// Group `group` on `queue` was deleted at `rev`: kept for a registration under way from an
/// earlier read, and for a settings record of it the settings watch brings late.
pub(super) fn note_deleted(side: &EtcdSide, group: &str, queue: &str, rev: i64) {
    let id = crate::store::group_id(group, queue);
    side.group_deleted.entry(id).and_modify(|d| *d = (*d).max(rev)).or_insert(rev);
}

/// Forgets group `group` on `queue`, just registered from a read at `seen`, if the deletion
/// watch applied a deletion after that read (it found nothing registered to forget then).
pub(super) fn forget_if_deleted_since(engine: &Engine, side: &EtcdSide, group: &str, queue: &str, seen: i64) {
    let id = crate::store::group_id(group, queue);
    if side.group_deleted.get(&id).is_some_and(|d| *d > seen) {
        forget(engine, side, group, queue);
    }
}

/// Forgets queue `name` of id `id` here (a queue of the name with another id was made anew,
/// and stays): its groups forgotten, the queue marked deleted (handles refuse sends with
/// `QueueDeleted`) and dropped from the registry, so that the name makes a new queue.
pub(super) fn forget_queue(engine: &Engine, side: &EtcdSide, name: &str, id: u32) {
    let Some(q) = engine.registry.queue(name).filter(|q| q.id == id) else { return };
    // Collected first: `forget` removes from the maps iterated here.
    let ordered = engine.registry.ordered.iter().filter(|g| g.queue.id == id).map(|g| g.name.to_string());
    let groups: Vec<String> = ordered
        .chain(engine.registry.work.iter().filter(|g| g.queue.id == id).map(|g| g.name.to_string()))
        .collect();
    for g in groups {
        forget(engine, side, &g, name);
    }
    // Settings kept for groups of it that never registered here.
    side.group_settings
        .retain(|gid, _| crate::store::keys::parse_offset_key(gid).map_or(true, |(_, queue)| queue != name));
    q.mark_deleted();
    engine.registry.queues.remove_if(name, |_, s| Arc::ptr_eq(s, &q));
}
