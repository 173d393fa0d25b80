//! In-memory state of every queue and group, shared by handles, subscriptions and the writer.
//!
//! Loaded from storage at open; after that only the writer inserts (it is the one task that
//! creates queues and groups), so a queue or group exists in memory exactly when its record is
//! durable.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::sync::watch;

/// One queue.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub id: u32,
    pub name: Arc<str>,
    /// First live sequence (retention moves it forward).
    pub first_seq: AtomicU64,
    /// Last sequence written and visible to readers. The writer publishes after each round
    /// that touched the queue; subscribers wait on it instead of polling.
    pub last: watch::Sender<u64>,
    /// Retention policy (persisted in the queue record; the writer changes it).
    pub retention: std::sync::Mutex<crate::Retention>,
}

impl QueueState {
    pub fn new(id: u32, name: &str, first_seq: u64, last_seq: u64, retention: crate::Retention) -> Arc<Self> {
        Arc::new(QueueState {
            id,
            name: Arc::from(name),
            first_seq: AtomicU64::new(first_seq),
            last: watch::Sender::new(last_seq),
            retention: std::sync::Mutex::new(retention),
        })
    }

    pub fn retention(&self) -> crate::Retention {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn last_seq(&self) -> u64 {
        *self.last.borrow()
    }
}

/// One (group, queue) pair.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub name: Arc<str>,
    pub queue: Arc<QueueState>,
    /// `consumer:<group>:<queue>`.
    pub key: Vec<u8>,
    /// Highest contiguously acknowledged sequence known in memory. Never below `durable`.
    pub acked: AtomicU64,
    /// Highest sequence whose offset record is durable (in the mode's sense).
    pub durable: AtomicU64,
    /// Set when `acked` moved and the writer has not yet picked the group up.
    pub dirty: AtomicBool,
    /// An ordered group has at most one active subscription per queue.
    pub active: AtomicBool,
    /// Messages this group never received because retention deleted them first.
    pub skipped: AtomicU64,
    /// A paused group hands out nothing (persisted in its settings record).
    pub paused: AtomicBool,
    /// The live subscription, for in-flight counts in stats.
    pub live: std::sync::Mutex<std::sync::Weak<crate::consumer::SubShared>>,
    /// Delivery counts, redelivery times and dead letters above the offset (ordered groups).
    pub records: std::sync::Mutex<crate::consumer::GroupRecords>,
}

impl GroupState {
    pub fn new(name: &str, queue: Arc<QueueState>, key: Vec<u8>, committed: u64) -> Arc<Self> {
        Arc::new(GroupState {
            name: Arc::from(name),
            queue,
            key,
            acked: AtomicU64::new(committed),
            durable: AtomicU64::new(committed),
            dirty: AtomicBool::new(false),
            active: AtomicBool::new(false),
            skipped: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            live: std::sync::Mutex::new(std::sync::Weak::new()),
            records: std::sync::Mutex::new(crate::consumer::GroupRecords::default()),
        })
    }

    /// Deliveries of the live subscription not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).upgrade();
        live.map_or(0, |s| s.in_flight())
    }

    pub fn records(&self) -> std::sync::MutexGuard<'_, crate::consumer::GroupRecords> {
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

/// Queues by name and groups by offset key.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub queues: DashMap<Arc<str>, Arc<QueueState>>,
    pub groups: DashMap<Vec<u8>, Arc<GroupState>>,
    /// Work-queue groups, by the same `consumer:<group>:<queue>` key (a key is in at most one
    /// of the two maps).
    pub work_groups: DashMap<Vec<u8>, Arc<crate::work::WorkGroupState>>,
}
