//! Purging a queue on etcd (`Broker::purge_queue`): a trim of everything up to the queue's tail
//! as etcd holds it (`retention::apply`, the same transactions as a retention pass), then every
//! ordered group moved past it.
//!
//! - Work groups move in the trim's transaction: their claims in the purged range go, so a job
//!   of a purged message, in any process, has lost its lease.
//! - An ordered group owned by this process moves as embedded (its acknowledged offset jumps
//!   to the tail, committed this round under its owner key); an idle one moves in a
//!   transaction that compares its owner key absent. One owned by another process is that
//!   process's to move: the trim writes the queue's purge mark (`s/<qid>`), and when that
//!   process's namespace watch brings it, its subscription drops what it had read ahead or had
//!   handed back in the purged range and its offset moves past it, as embedded.
//! - Unlike embedded, the trim and the ordered offsets are separate transactions: a process
//!   stopped in between leaves an idle ordered group's offset behind the new first sequence,
//!   which its next subscription skips.

use std::sync::atomic::Ordering;

use super::retention::{Cut, apply};
use super::side::retrying;
use super::writer::Writer;
use crate::error::Error;
use crate::model::{GroupMode, QueueMeta};
use crate::store::etcd::retention::TrimPlan;

/// Tries of a purge whose trim was refused (a group created or moved meanwhile).
const TRIES: usize = 5;

impl Writer {
    /// Purges queue `name`; returns how many messages were deleted (0: no such queue).
    pub(super) async fn purge_queue(&mut self, name: &str) -> Result<u64, Error> {
        let t = self.side.settings.request_timeout;
        let side = self.side.clone();
        for _ in 0..TRIES {
            let loaded = retrying(t, || side.store.load()).await?;
            let Some(i) = loaded.queues.iter().position(|(n, ..)| n == name) else { return Ok(0) };
            let (_, meta, last) = &loaded.queues[i];
            let (first, last) = (meta.first_seq, *last);
            let groups = loaded.trim_groups(name);
            let local = self.engine.registry.queue(name).filter(|q| q.id == meta.id);
            if let Some(q) = &local {
                // Subscriptions here passing over the range do not report it skipped.
                q.purged_through.fetch_max(last, Ordering::SeqCst);
            }
            let deleted = if last >= first {
                let plan = TrimPlan {
                    queue: name.to_owned(),
                    meta: QueueMeta { first_seq: last + 1, ..*meta },
                    queue_rev: loaded.queue_revs.get(i).copied().unwrap_or(0),
                    to: last,
                    behind: groups.iter().filter(|g| g.committed < last).cloned().collect(),
                    read_at: loaded.revision,
                    purge: true,
                };
                if !apply(&self.engine, &side, plan, first, Cut::Purge).await? {
                    continue;
                }
                last - first + 1
            } else {
                0
            };
            for g in groups.iter().filter(|g| g.mode == GroupMode::Ordered && g.committed < last) {
                self.move_ordered_past(name, &g.group, last).await?;
            }
            tracing::info!(queue = %name, deleted, through = last, "rockq: queue purged");
            return Ok(deleted);
        }
        Err(Error::Storage(crate::error::StorageError::new(
            "etcd: the queue's groups kept changing under a purge; try again",
        )))
    }

    /// Moves ordered group `group` on `queue` past `last`: through its commit if this process
    /// owns it, else if nobody does.
    async fn move_ordered_past(&mut self, queue: &str, group: &str, last: u64) -> Result<(), Error> {
        let id = crate::store::group_id(group, queue);
        let state = self.engine.registry.ordered.get(&id).map(|g| g.clone());
        if let Some(g) = &state
            && self.side.owners.holds(g)
        {
            // `fetch_max`: the subscription's later acks below it change nothing; committed
            // this round (`commit_dirty`) under the owner key.
            if g.acked.fetch_max(last, Ordering::SeqCst) < last && g.mark() {
                self.engine.mark_dirty(g.clone());
            }
            return Ok(());
        }
        let store = &self.side.store;
        let t = self.side.settings.request_timeout;
        if retrying(t, || store.move_idle_ordered(group, queue, last)).await?
            && let Some(g) = state
        {
            g.acked.fetch_max(last, Ordering::SeqCst);
            g.durable.fetch_max(last, Ordering::SeqCst);
        }
        Ok(())
    }
}
