//! Deleting groups and queues on etcd (`Broker::delete_group`, `Broker::delete_queue`): the
//! writer's requests, and every process forgetting a group or queue that any process deleted.
//!
//! The deletion is one transaction (`store/etcd/deletion.rs`). Every process learns it from a
//! watch of offset-record deletions, and forgets the group as the embedded writer does: marked
//! deleted (its subscriptions and pools end with `Error::GroupDeleted`, its deliveries and jobs
//! still out fail to settle with it), dropped from the registry with its claims' view and the
//! settings record the settings watch kept, so that a later subscribe creates the group anew.
//! Until the watch brings the deletion, what that process writes for the group is refused by
//! etcd (every group write compares the offset record or the owner key), never applied.
//!
//! A watch that breaks is started again from the last revision it saw; one whose revision was
//! compacted away re-reads the namespace's groups, and forgets each group registered here that
//! is absent there (read again on its own: one registered after the namespace was read is not
//! mistaken for a deleted one).
//!
//! A queue's deletion is one transaction too, its groups' deletions included (the groups
//! beyond one transaction are deleted first, each as a group deletion is). Every process learns
//! it from the namespace watch, the deleted record naming its id (`NamespaceEvent::QueueGone`):
//! the queue of that id is marked deleted (handles refuse sends with `QueueDeleted`) and
//! forgotten with its groups; a queue made anew under the name has another id and stays. Until
//! then, an append of that process is refused by etcd (its tail is gone); the writer then reads
//! the queue record, finds it gone or of another id, forgets the queue and answers the sends
//! with `QueueDeleted` — nothing of them was written.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::follow::{Followed, follow};
use super::forget::{forget, forget_queue, note_deleted};
use super::side::{EtcdSide, retrying};
use super::writer::Writer;
use crate::engine::Engine;
use crate::error::{Error, StorageError};
use crate::store::etcd::deletion::{QUEUE_DELETE_GROUPS, QueueDeletion};

/// Tries of a queue deletion refused because the queue or its groups changed meanwhile.
const TRIES: usize = 5;

impl Writer {
    /// Deletes queue `name` with everything of it; `false` if there is no such queue.
    pub(super) async fn delete_queue(&mut self, name: &str) -> Result<bool, Error> {
        let side = self.side.clone();
        let (store, t) = (&side.store, side.settings.request_timeout);
        // The id found by an earlier try: a try whose answer was lost may have deleted it.
        let mut seen: Option<u32> = None;
        for _ in 0..TRIES {
            let loaded = retrying(t, || store.load()).await?;
            let Some(i) = loaded.queues.iter().position(|(n, ..)| n == name) else {
                if let Some(qid) = seen {
                    self.tails.remove(&qid);
                    forget_queue(&self.engine, &side, name, qid);
                }
                return Ok(seen.is_some());
            };
            let qid = loaded.queues[i].1.id;
            if let Some(gone) = seen.filter(|&gone| gone != qid) {
                // The queue this call set out to delete is gone (a try whose answer was lost
                // deleted it), and another process has made the name anew since: that queue,
                // and what was sent to it, is not this call's to delete.
                self.tails.remove(&gone);
                forget_queue(&self.engine, &side, name, gone);
                return Ok(true);
            }
            seen = Some(qid);
            let (settings, _) = retrying(t, || store.all_settings()).await?;
            let mut groups: BTreeSet<String> =
                loaded.groups.iter().filter(|(_, q, _)| q == name).map(|(g, ..)| g.clone()).collect();
            groups.extend(settings.into_iter().filter(|r| r.queue == name).map(|r| r.group));
            let groups: Vec<String> = groups.into_iter().collect();
            if groups.len() > QUEUE_DELETE_GROUPS {
                // More than one transaction holds: those beyond it go first, as deleted groups.
                for g in &groups[QUEUE_DELETE_GROUPS..] {
                    let (_, rev) = retrying(t, || store.delete_group(g, name, None)).await?;
                    note_deleted(&side, g, name, rev);
                    forget(&self.engine, &side, g, name);
                }
                continue;
            }
            let plan = QueueDeletion {
                name,
                qid,
                queue_rev: loaded.queue_revs.get(i).copied().unwrap_or(0),
                read_at: loaded.revision,
                groups: &groups,
            };
            if let Some(rev) = retrying(t, || store.delete_queue(&plan)).await? {
                for g in &groups {
                    note_deleted(&side, g, name, rev);
                }
                self.tails.remove(&qid);
                forget_queue(&self.engine, &side, name, qid);
                tracing::info!(queue = %name, id = qid, "rockq: queue deleted");
                return Ok(true);
            }
        }
        Err(Error::Storage(StorageError::new(
            "etcd: the queue or its groups kept changing under a deletion; try again",
        )))
    }

    /// Deletes group `group` on `queue` (either mode); `false` if there is no such queue or
    /// group.
    pub(super) async fn delete_group(&mut self, queue: &str, group: &str) -> Result<bool, Error> {
        let (store, t) = (&self.side.store, self.side.settings.request_timeout);
        if self.engine.registry.queue(queue).is_none()
            && retrying(t, || store.queue_record(queue)).await?.is_none()
        {
            return Ok(false);
        }
        // Deleting again is harmless, so a try whose answer was lost is sent again; should the
        // lost one have applied, the second finds nothing, and the first's marker answers.
        let marked = self.marked(t).await?;
        let store = &self.side.store;
        let (mut existed, rev) = retrying(t, || store.delete_group(group, queue, Some(marked))).await?;
        if !existed {
            existed = retrying(t, || store.marker_exists(marked.nonce)).await?;
        }
        note_deleted(&self.side, group, queue, rev);
        forget(&self.engine, &self.side, group, queue);
        if existed {
            tracing::info!(%queue, %group, "rockq: group deleted");
        }
        Ok(existed)
    }
}

impl Writer {
    /// Whether `queue` is gone from etcd (its record deleted, or the name's record of another
    /// id): then forgotten here. Asked after an append was refused.
    pub(super) async fn queue_gone(&mut self, queue: &crate::engine::registry::QueueState) -> bool {
        // One try: the sends wait for this answer, and their request timeout is already spent.
        match self.side.store.queue_record(&queue.name).await {
            Ok(Some((meta, _))) if meta.id == queue.id => false,
            Ok(_) => {
                self.tails.remove(&queue.id);
                forget_queue(&self.engine, &self.side, &queue.name, queue.id);
                true
            }
            Err(_) => false,
        }
    }
}

/// Follows group deletions in the namespace from after `revision` until `stop`.
pub(super) async fn run(
    engine: Weak<Engine>,
    side: Arc<EtcdSide>,
    mut revision: i64,
    stop: CancellationToken,
) {
    loop {
        match side.store.watch_group_deletions(revision).await {
            Ok(stream) => {
                let apply = |engine: Arc<Engine>, deleted: Vec<(String, String, i64)>| {
                    // Tests hold a deletion back here, and learn when it went through.
                    crate::faults::reached("rockq-etcd-group-deletions-apply");
                    for (group, queue, rev) in deleted {
                        let id = crate::store::group_id(&group, &queue);
                        note_deleted(&side, &group, &queue, rev);
                        // Registered here from a read after the deletion: a new group.
                        if side.group_seen.get(&id).is_none_or(|seen| *seen < rev) {
                            forget(&engine, &side, &group, &queue);
                        }
                        revision = revision.max(rev);
                    }
                    crate::faults::reached("rockq-etcd-group-deletions-applied");
                    std::future::ready(())
                };
                if let Followed::Stopped = follow(stream, "group-deletion", &engine, &stop, apply).await {
                    return;
                }
            }
            Err(e) => tracing::debug!(error = %e, "rockq: etcd group-deletion watch did not start; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        // Deletions since `revision` may be compacted away: what the namespace holds now says.
        match reconcile(&engine, &side).await {
            Ok(Some(rev)) => revision = revision.max(rev),
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "rockq: re-reading the namespace's groups failed; retrying")
            }
        }
    }
}

/// Forgets every group registered here that the namespace no longer holds; returns the
/// revision read at (`None`: the engine is gone).
async fn reconcile(
    engine: &Weak<Engine>,
    side: &EtcdSide,
) -> Result<Option<i64>, crate::error::StorageError> {
    let loaded = side.store.load().await?;
    let stored: HashSet<Vec<u8>> =
        loaded.groups.iter().map(|(g, q, _)| crate::store::group_id(g, q)).collect();
    let Some(engine) = engine.upgrade() else { return Ok(None) };
    let mut missing: Vec<(String, String)> = Vec::new();
    for g in engine.registry.ordered.iter() {
        missing.push((g.name.to_string(), g.queue.name.to_string()));
    }
    for g in engine.registry.work.iter() {
        missing.push((g.name.to_string(), g.queue.name.to_string()));
    }
    missing.retain(|(g, q)| !stored.contains(&crate::store::group_id(g, q)));
    for (group, queue) in missing {
        // Registered after the namespace was read, perhaps: asked on its own.
        if side.store.offset(&group, &queue).await?.is_none() {
            forget(&engine, side, &group, &queue);
        }
    }
    Ok(Some(loaded.revision))
}
