//! An ordered group's single active subscriber across processes: the subscriber's process puts
//! `own/<group>:<queue>` = its owner id under an etcd lease it keeps alive. Every offset commit
//! compares that key, so a process whose lease lapsed (paused, partitioned) cannot commit after
//! another took over; its subscription ends with [`Error::OwnershipLost`].
//!
//! Release: dropping the subscription (with its deliveries) asks the writer to release; the
//! writer first commits what the group acknowledged, then revokes the lease, so the next owner
//! starts after everything this one acknowledged.
//!
//! [`Error::OwnershipLost`]: crate::Error::OwnershipLost

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::owners::{Held, id};
use super::side::{EtcdSide, retrying};
use crate::engine::registry::OrderedGroupState;
use crate::engine::request::Request;
use crate::error::Error;
use crate::model::OrderedMark;

/// Held by a subscription while it owns its group: dropping it asks the writer to release.
pub(crate) struct OwnerRelease {
    side: Arc<EtcdSide>,
    group: Arc<OrderedGroupState>,
    nudge: mpsc::Sender<Request>,
}

impl Drop for OwnerRelease {
    fn drop(&mut self) {
        // A full channel means the writer is busy and releases at the end of its round; a
        // closed one, that it stopped and released everything.
        if self.side.owners.request_release(&self.group) {
            let _ = self.nudge.try_send(Request::Commit);
        }
    }
}

/// Takes ownership of `g` for this process, then reads the group's offset and marks as the
/// last owner left them (another process may have moved them).
pub(crate) async fn acquire(
    side: &Arc<EtcdSide>,
    g: &Arc<OrderedGroupState>,
    nudge: mpsc::Sender<Request>,
) -> Result<OwnerRelease, Error> {
    let busy = || Error::Active { group: g.name.to_string(), queue: g.queue.name.to_string() };
    let ttl = side.settings.owner_ttl;
    let t = side.settings.request_timeout;
    let store = &side.store;
    // Held by this process still (its last subscription's release not done yet): the new
    // subscription takes it over as it stands, as the embedded engine's slot is free at once.
    if let Some(h) = side.owners.lock().get_mut(&id(g)) {
        h.releasing = false;
        g.regain_ownership();
        return Ok(OwnerRelease { side: side.clone(), group: g.clone(), nudge });
    }
    let deadline = tokio::time::Instant::now() + t;
    let lease = loop {
        match retrying(t, || store.acquire_owner(&g.name, &g.queue.name, &side.owner_id, ttl)).await? {
            Ok(lease) => break lease,
            // This process's own lease, being revoked right now: wait for it.
            Err(Some(holder)) if holder == side.owner_id && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            // Freed between the compare and the read: try again.
            Err(Some(holder)) if holder.is_empty() && tokio::time::Instant::now() < deadline => {}
            Err(Some(_)) => return Err(busy()),
            // Deleted by another process; this one's watch has not brought it yet.
            Err(None) => {
                return Err(Error::GroupDeleted {
                    group: g.name.to_string(),
                    queue: g.queue.name.to_string(),
                });
            }
        }
    };
    let stop = CancellationToken::new();
    let holder = side.clone();
    let (group, token) = (g.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let by_stop = holder.store.hold_lease(lease, ttl, token.cancelled()).await;
        if !by_stop {
            tracing::warn!(group = %group.name, queue = %group.queue.name, "rockq: etcd lease of an ordered group lost; its subscription ends");
            holder.owners.lost(&group);
        }
    });
    let release = OwnerRelease { side: side.clone(), group: g.clone(), nudge };
    side.owners.lock().insert(id(g), Held { group: g.clone(), stop, releasing: false, task });
    let refreshed = async {
        let offset = retrying(t, || store.offset(&g.name, &g.queue.name)).await?;
        let marks = retrying(t, || store.marks(&g.name, &g.queue.name)).await?;
        Ok::<_, crate::error::StorageError>((offset, marks))
    }
    .await;
    let (offset, marks) = refreshed?;
    g.regain_ownership();
    if let Some(o) = offset {
        g.acked.store(o.committed, Ordering::SeqCst);
        g.durable.store(o.committed, Ordering::SeqCst);
    }
    let mut rec = g.records();
    rec.failed.clear();
    rec.dead.clear();
    rec.stored.clear();
    for (seq, m) in marks {
        rec.stored.insert(seq);
        match m {
            OrderedMark::DeadLettered { .. } | OrderedMark::Acked => {
                rec.dead.insert(seq);
            }
            OrderedMark::CameBack { deliveries, not_before_micros } => {
                rec.failed.insert(seq, (deliveries, not_before_micros));
            }
        }
    }
    drop(rec);
    Ok(release)
}
