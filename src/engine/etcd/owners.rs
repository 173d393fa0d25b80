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
        self.lock().retain(|_, h| {
            let done =
                h.releasing && !h.group.dirty.load(Ordering::Acquire) && h.group.records().pending.is_empty();
            if done {
                h.stop.cancel();
            }
            !done
        });
    }

    /// Releases everything (the writer stops); the returned tasks end once their leases are
    /// revoked.
    pub fn release_all(&self) -> Vec<tokio::task::JoinHandle<()>> {
        self.lock()
            .drain()
            .map(|(_, h)| {
                h.stop.cancel();
                h.task
            })
            .collect()
    }

    /// A commit found another owner: `g`'s subscription here ends.
    pub fn lost(&self, g: &Arc<OrderedGroupState>) {
        if let Some(h) = self.lock().remove(&id(g)) {
            h.stop.cancel();
        }
        g.lose_ownership();
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
