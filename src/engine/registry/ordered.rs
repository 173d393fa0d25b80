//! One ordered group's in-memory state: its acknowledged and durable offsets, the active
//! subscription slot, pause flag, and what it remembers about single messages above its offset
//! (`records.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::queue::QueueState;
use super::records::{GroupRecords, LiveSubscription};
use crate::store::GroupKeys;

/// One ordered group on one queue.
#[derive(Debug)]
pub(crate) struct OrderedGroupState {
    pub name: Arc<str>,
    pub queue: Arc<QueueState>,
    /// Its offset record and marks in the store.
    pub keys: GroupKeys,
    /// Highest contiguously acknowledged sequence known in memory. Never below `durable`.
    pub acked: AtomicU64,
    /// Highest sequence whose offset record is durable (in the mode's sense).
    pub durable: AtomicU64,
    /// Notified when `durable` moves (`Delivery::ack_durable` waits on it).
    pub durable_moved: tokio::sync::Notify,
    /// Set when `acked` moved and the writer has not yet picked the group up.
    pub dirty: AtomicBool,
    /// An ordered group has at most one active subscription per queue.
    pub active: AtomicBool,
    /// Messages this group never received because retention deleted them first.
    pub skipped: AtomicU64,
    /// A paused group hands out nothing (persisted in its settings record).
    pub paused: AtomicBool,
    /// The live subscription, for in-flight counts in stats.
    pub live: std::sync::Mutex<Option<std::sync::Weak<dyn LiveSubscription>>>,
    /// Delivery counts, redelivery times and dead letters above the offset (ordered groups).
    pub records: std::sync::Mutex<GroupRecords>,
    /// Set by the writer as the group's deletion (or its queue's) enters a batch.
    deleted: AtomicBool,
    /// The etcd engine: another process took the group over (this one's lease lapsed). Never
    /// set by the embedded engine.
    lost: AtomicBool,
}

impl OrderedGroupState {
    pub fn new(name: &str, queue: Arc<QueueState>, committed: u64) -> Arc<Self> {
        Arc::new(OrderedGroupState {
            keys: GroupKeys::ordered(name, &queue.name),
            name: Arc::from(name),
            queue,
            acked: AtomicU64::new(committed),
            durable: AtomicU64::new(committed),
            durable_moved: tokio::sync::Notify::new(),
            dirty: AtomicBool::new(false),
            active: AtomicBool::new(false),
            skipped: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            live: std::sync::Mutex::new(None),
            records: std::sync::Mutex::new(GroupRecords::default()),
            deleted: AtomicBool::new(false),
            lost: AtomicBool::new(false),
        })
    }

    /// Whether this process lost the group to another one (the etcd engine; never for the
    /// embedded one): its subscription ends.
    #[inline]
    pub fn ownership_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Another process owns the group now: the subscription here ends (woken to see it).
    #[allow(dead_code)] // the etcd engine's
    pub fn lose_ownership(&self) {
        self.lost.store(true, Ordering::Release);
        self.queue.poke();
    }

    /// This process owns the group again (a new subscription took it).
    #[allow(dead_code)] // the etcd engine's
    pub fn regain_ownership(&self) {
        self.lost.store(false, Ordering::Release);
    }

    /// Whether the group, or its queue, was deleted: its subscription ends and its
    /// acknowledgements are refused (a group created again under the name is a new state).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire) || self.queue.is_deleted()
    }

    /// The writer deleted the group: marks it and wakes its subscription.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.queue.poke();
    }

    /// Deliveries of the live subscription not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|w| w.upgrade());
        live.map_or(0, |s| s.in_flight())
    }

    pub fn records(&self) -> std::sync::MutexGuard<'_, GroupRecords> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the group for the writer's next round. Returns true if it just became dirty (the
    /// caller must then hand it to the writer).
    pub fn mark(&self) -> bool {
        !self.dirty.swap(true, Ordering::AcqRel)
    }

    /// The highest sequence whose delivery record is moot for a group at `offset`: the offset
    /// passed it, or retention deleted its message.
    pub fn records_moot_through(&self, offset: u64) -> u64 {
        offset.max(self.queue.first_seq.load(Ordering::Acquire).saturating_sub(1))
    }

    /// Records that everything up to `seq` is acknowledged. Returns true if the group just
    /// became dirty (the caller must then hand it to the writer).
    pub fn advance(&self, seq: u64) -> bool {
        self.acked.fetch_max(seq, Ordering::AcqRel);
        !self.dirty.swap(true, Ordering::AcqRel)
    }
}
