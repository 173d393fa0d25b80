//! The ordered groups this process owns across processes (their etcd leases, kept alive by a
//! task each), and releasing them: what `owner.rs` takes and a subscription's drop gives back.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::engine::registry::OrderedGroupState;

/// The groups this process owns.
#[derive(Default)]
pub(crate) struct Owners {
    held: Mutex<HashMap<usize, Held>>,
    /// The lease tasks of groups released or lost but maybe not yet revoked: shutdown waits
    /// for them too, or a runtime stopped right after it would cancel the revoke and leave the
    /// group owned for a whole TTL.
    ending: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

pub(super) struct Held {
    pub(super) group: Arc<OrderedGroupState>,
    /// Cancelled to revoke the lease.
    pub(super) stop: CancellationToken,
    /// The subscription is gone: release once the group has nothing left to commit.
    pub(super) releasing: bool,
    /// Keeps the lease alive; revokes it once `stop` is cancelled.
    pub(super) task: tokio::task::JoinHandle<()>,
}

pub(super) fn id(g: &Arc<OrderedGroupState>) -> usize {
    Arc::as_ptr(g) as usize
}

impl Owners {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this process holds `g`.
    pub fn holds(&self, g: &Arc<OrderedGroupState>) -> bool {
        self.lock().contains_key(&id(g))
    }

    /// Releases every group whose subscription is gone and that has nothing left to commit.
    pub fn release_clean(&self) {
        let done: Vec<Held> = {
            let mut held = self.lock();
            let ids: Vec<usize> = held
                .iter()
                .filter(|(_, h)| {
                    h.releasing
                        && !h.group.dirty.load(Ordering::Acquire)
                        && h.group.records().pending.is_empty()
                })
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter().filter_map(|k| held.remove(&k)).collect()
        };
        for h in done {
            h.stop.cancel();
            self.end(h.task);
        }
    }

    /// Releases everything (the writer stops); the returned tasks end once their leases are
    /// revoked, those of groups released earlier included.
    pub fn release_all(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks: Vec<_> = self
            .lock()
            .drain()
            .map(|(_, h)| {
                h.stop.cancel();
                h.task
            })
            .collect();
        tasks.append(&mut self.ending_lock());
        tasks
    }

    /// A commit found another owner: `g`'s subscription here ends.
    pub fn lost(&self, g: &Arc<OrderedGroupState>) {
        let held = self.lock().remove(&id(g));
        if let Some(h) = held {
            h.stop.cancel();
            self.end(h.task);
        }
        g.lose_ownership();
    }

    fn ending_lock(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.ending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `task` (its lease being revoked) for shutdown to wait on.
    fn end(&self, task: tokio::task::JoinHandle<()>) {
        let mut ending = self.ending_lock();
        ending.retain(|t| !t.is_finished());
        ending.push(task);
    }

    pub(super) fn request_release(&self, g: &Arc<OrderedGroupState>) -> bool {
        match self.lock().get_mut(&id(g)) {
            Some(h) => {
                h.releasing = true;
                true
            }
            None => false,
        }
    }
}
