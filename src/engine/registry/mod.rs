//! The registry: in-memory state of every queue and group, shared by handles, subscriptions
//! and the writer.
//!
//! Loaded from storage at open; after that only the writer inserts (it is the one task that
//! creates queues and groups), so a queue or group exists in memory exactly when its record is
//! durable.
//!
//! - `queue.rs`: a queue (id, first sequence, the published last sequence subscribers wait on),
//!   with the index of its prioritised messages (`priority.rs`).
//! - `ordered.rs`, `records.rs`: an ordered group, and what it remembers about single messages
//!   above its offset (the live subscription's acknowledgement window is the consumer's, seen
//!   here through `LiveSubscription`).
//! - `keyspace.rs`: a keyspace of application state (its id and key count).
//! - `restore.rs`: the registry rebuilt from what the embedded store loaded at open.
//! - `work.rs`: a work-queue group's claims, leases, retries and finished sequences, over
//!   `dispatch.rs` (the claim index: ready, timers) and `finished.rs` (the finished bitmap).

mod dispatch;
mod finished;
mod key_locks;
mod keyspace;
#[cfg(test)]
mod limit_props;
mod ordered;
mod priority;
#[cfg(test)]
mod priority_props;
mod queue;
mod records;
mod restore;
mod work;

use std::sync::Arc;

use dashmap::DashMap;

pub(crate) use key_locks::{KeyLock, KeyLocks};
pub(crate) use keyspace::KeyspaceState;
pub(crate) use ordered::OrderedGroupState;
pub(crate) use queue::{QueueState, Watching};
pub(crate) use records::{LiveSubscription, PendingRecord};
pub(crate) use work::{Claimed, QueuedAck, Refused, SettlingGuard, TakenFrom, WorkGroupState};

/// Queues by name and groups by their identity (`store::group_id`).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub queues: DashMap<Arc<str>, Arc<QueueState>>,
    pub ordered: DashMap<Vec<u8>, Arc<OrderedGroupState>>,
    /// Work-queue groups, by the same identity (a (group, queue) pair is in at most one of the
    /// two maps).
    pub work: DashMap<Vec<u8>, Arc<WorkGroupState>>,
    /// Keyspaces of application state, by name.
    pub keyspaces: DashMap<Arc<str>, Arc<KeyspaceState>>,
    /// The last keyspace revision handed out, as loaded at open (the writer counts on from it).
    pub kv_revision: std::sync::atomic::AtomicU64,
    /// Flows' sent steps and the next flow id as loaded at open, until the writer takes them
    /// (it alone keeps flows from then on).
    pub flows_at_open: std::sync::Mutex<Option<crate::store::LoadedFlows>>,
}

impl Registry {
    /// Ordered group `group` on `queue`, if it exists.
    pub fn ordered(&self, group: &str, queue: &str) -> Option<Arc<OrderedGroupState>> {
        self.ordered.get(&crate::store::group_id(group, queue)).map(|g| g.clone())
    }

    /// Work-queue group `group` on `queue`, if it exists.
    pub fn work(&self, group: &str, queue: &str) -> Option<Arc<WorkGroupState>> {
        self.work.get(&crate::store::group_id(group, queue)).map(|g| g.clone())
    }

    /// Whether `group` exists on `queue`, in either mode.
    pub fn has_group(&self, group: &str, queue: &str) -> bool {
        let id = crate::store::group_id(group, queue);
        self.ordered.contains_key(&id) || self.work.contains_key(&id)
    }

    /// The keyspace `name`, if it exists.
    pub fn keyspace(&self, name: &str) -> Option<Arc<KeyspaceState>> {
        self.keyspaces.get(name).map(|k| k.clone())
    }

    /// The queue `name`, if it exists.
    pub fn queue(&self, name: &str) -> Option<Arc<QueueState>> {
        self.queues.get(name).map(|q| q.clone())
    }
}
