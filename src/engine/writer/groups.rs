//! Creating a group, either mode: one path for ordered and work-queue groups. A (group, queue)
//! pair is one mode for good; a group starts at the offset its `StartFrom` asks for, checked
//! against what the queue retains.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use dashmap::DashMap;

use super::round::{Created, QueueGroups, Round, Written};
use crate::engine::keyed::Keyed;
use crate::engine::registry::{OrderedGroupState, QueueState, Registry, WorkGroupState};
use crate::engine::request::Reply;
use crate::error::Error;
use crate::model::{GroupMode, GroupOffset, StartFrom};
use crate::store::GroupKeys;

/// The state of one mode's groups, as group creation needs it.
pub(super) trait GroupKind: Sized + Send + Sync + 'static {
    const MODE: GroupMode;
    fn new(name: &str, queue: Arc<QueueState>, committed: u64) -> Arc<Self>;
    fn keys(&self) -> &GroupKeys;
    fn registered(registry: &Registry) -> &DashMap<Vec<u8>, Arc<Self>>;
    fn written(written: &mut Written) -> &mut HashMap<Vec<u8>, Arc<Self>>;
    /// The groups of this kind on one queue, in the writer's index.
    fn of_queue(groups: &mut QueueGroups) -> &mut Vec<Arc<Self>>;
    fn created<'r>(r: &'r mut Round<'_>) -> &'r mut Keyed<Vec<u8>, Created<Self, Error>>;
}

impl GroupKind for OrderedGroupState {
    const MODE: GroupMode = GroupMode::Ordered;
    fn new(name: &str, queue: Arc<QueueState>, committed: u64) -> Arc<Self> {
        OrderedGroupState::new(name, queue, committed)
    }
    fn keys(&self) -> &GroupKeys {
        &self.keys
    }
    fn registered(registry: &Registry) -> &DashMap<Vec<u8>, Arc<Self>> {
        &registry.ordered
    }
    fn written(written: &mut Written) -> &mut HashMap<Vec<u8>, Arc<Self>> {
        &mut written.ordered
    }
    fn of_queue(groups: &mut QueueGroups) -> &mut Vec<Arc<Self>> {
        &mut groups.ordered
    }
    fn created<'r>(r: &'r mut Round<'_>) -> &'r mut Keyed<Vec<u8>, Created<Self, Error>> {
        &mut r.done.ordered
    }
}

impl GroupKind for WorkGroupState {
    const MODE: GroupMode = GroupMode::WorkQueue;
    fn new(name: &str, queue: Arc<QueueState>, committed: u64) -> Arc<Self> {
        WorkGroupState::new(name, queue, committed)
    }
    fn keys(&self) -> &GroupKeys {
        &self.keys
    }
    fn registered(registry: &Registry) -> &DashMap<Vec<u8>, Arc<Self>> {
        &registry.work
    }
    fn written(written: &mut Written) -> &mut HashMap<Vec<u8>, Arc<Self>> {
        &mut written.work
    }
    fn of_queue(groups: &mut QueueGroups) -> &mut Vec<Arc<Self>> {
        &mut groups.work
    }
    fn created<'r>(r: &'r mut Round<'_>) -> &'r mut Keyed<Vec<u8>, Created<Self, Error>> {
        &mut r.done.work
    }
}

/// Creates group `group` of kind `G` on `queue` (or answers with the existing one).
pub(super) fn create<G: GroupKind>(
    r: &mut Round<'_>,
    queue: Arc<QueueState>,
    group: String,
    start: StartFrom,
    reply: Reply<Arc<G>, Error>,
) {
    if queue.is_deleted() {
        let _ = reply.send(Err(Error::QueueDeleted { queue: queue.name.to_string() }));
        return;
    }
    let id = crate::store::group_id(&group, &queue.name);
    if let Some(g) = G::registered(&r.engine.registry).get(&id) {
        let _ = reply.send(Ok(g.clone()));
        return;
    }
    if let Some(e) = other_mode(r, &id, &group, &queue, G::MODE) {
        let _ = reply.send(Err(e));
        return;
    }
    if let Some((_, waiters)) = G::created(r).get_mut(&id) {
        waiters.push(reply);
        return;
    }
    if let Some(g) = G::written(r.written).get(&id).cloned() {
        // Written in an earlier round whose sync is still running.
        G::created(r).get_or_insert_with(id, || (g, Vec::new())).1.push(reply);
        return;
    }
    let committed = match start_offset(r, &queue, start) {
        Ok(c) => c,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    let queue_id = queue.id;
    let state = G::new(&group, queue, committed);
    G::of_queue(r.written.groups_of.entry(queue_id).or_default()).push(state.clone());
    r.batch.put_offset(state.keys(), GroupOffset { mode: G::MODE, committed });
    G::written(r.written).insert(id.clone(), state.clone());
    G::created(r).get_or_insert_with(id, || (state, Vec::new())).1.push(reply);
}

/// `WrongMode` if the pair exists (or is being created) in the other mode: a name is ordered or
/// work-queue on a queue, never both.
fn other_mode(r: &Round<'_>, id: &[u8], group: &str, queue: &QueueState, wanted: GroupMode) -> Option<Error> {
    let reg = &r.engine.registry;
    let existing = match wanted {
        GroupMode::WorkQueue => {
            (reg.ordered.contains_key(id) || r.written.ordered.contains_key(id)).then_some("ordered")
        }
        GroupMode::Ordered => {
            (reg.work.contains_key(id) || r.written.work.contains_key(id)).then_some("work-queue")
        }
    }?;
    Some(Error::WrongMode { group: group.to_owned(), queue: queue.name.to_string(), existing })
}

/// The initial offset of a new group starting at `start`.
fn start_offset(r: &Round<'_>, queue: &QueueState, start: StartFrom) -> Result<u64, Error> {
    let first = queue.first_seq.load(Ordering::SeqCst);
    // The writer's own counter, not the published value: "latest" includes every send queued
    // before this request.
    let next = r.written.next_seq.get(&queue.id).copied().unwrap_or(first);
    match start {
        StartFrom::Earliest => Ok(first - 1),
        StartFrom::Latest => Ok(next - 1),
        StartFrom::Sequence(s) if (first..=next).contains(&s) => Ok(s - 1),
        StartFrom::Sequence(requested) => Err(Error::OutOfRange { requested, first, next }),
    }
}

/// A reset target was checked against retention when it was asked for; a trim applied since may
/// have deleted it.
pub(super) fn still_retained(r: &Round<'_>, queue: &QueueState, offset: u64) -> Result<(), Error> {
    let first = queue.first_seq.load(Ordering::SeqCst);
    if offset + 1 >= first {
        return Ok(());
    }
    let next = r.written.next_seq.get(&queue.id).copied().unwrap_or(first);
    Err(Error::OutOfRange { requested: offset + 1, first, next })
}
