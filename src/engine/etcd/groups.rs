//! Deleting groups on etcd (`Broker::delete_group`): the writer's request, and every process
//! forgetting a group that any process deleted.
//!
//! The deletion is one transaction (`store/etcd/groups.rs`). Every process learns it from a
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

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::follow::{Followed, follow};
use super::side::{EtcdSide, retrying};
use super::writer::Writer;
use crate::engine::Engine;
use crate::error::Error;

impl Writer {
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
        // lost one have applied, the second finds nothing and answers `false`.
        let existed = retrying(t, || store.delete_group(group, queue)).await?;
        forget(&self.engine, &self.side, group, queue);
        if existed {
            tracing::info!(%queue, %group, "rockq: group deleted");
        }
        Ok(existed)
    }
}

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
