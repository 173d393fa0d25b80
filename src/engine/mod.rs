//! The engine: state shared by the public handles and the writer thread.
//!
//! Public handles hold a [`Shared`], which owns the writer's request
//! channel; the writer holds only the `Engine`. When the last handle is dropped the channel
//! closes and the writer finishes its last round and exits, so a broker dropped without
//! `shutdown` still commits what it can and closes RocksDB off the async workers.

mod completion;
mod inbox;
mod shared;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::options::Options;
use crate::registry::{GroupState, Registry};
use crate::store::Store;

pub(crate) use completion::Completion;
#[cfg(test)]
pub(crate) use completion::Resolver;
pub(crate) use inbox::{Inbox, Staged};
pub(crate) use shared::{Shared, spawn_periodic};

pub(crate) struct Engine {
    pub store: Store,
    /// Where producers stage sends for the writer.
    pub inbox: Inbox,
    pub registry: Registry,
    pub options: Options,
    /// Groups whose acknowledged offset moved since the writer last committed them.
    pub dirty: Mutex<Vec<Arc<GroupState>>>,
    /// Work-queue groups with acks queued in memory (see `WorkGroupState::queue_ack`).
    pub dirty_work: Mutex<Vec<Arc<crate::work::WorkGroupState>>>,
    /// Set by the writer after a failed write: the broker fails closed.
    pub failed: Mutex<Option<String>>,
    pub counters: Counters,
    /// Work-queue lifecycle events (see [`Broker::events`](crate::Broker::events)).
    pub events: tokio::sync::broadcast::Sender<crate::Event>,
}

impl Engine {
    /// Broadcasts an event if anyone listens (building one is cheap; sending locks).
    pub fn emit(&self, event: impl FnOnce() -> crate::Event) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event());
        }
    }

    pub fn clock(&self) -> &crate::Clock {
        &self.options.clock
    }

    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn mark_dirty(&self, group: Arc<GroupState>) {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner()).push(group);
    }

    /// Hands a work-queue group with queued acks to the writer.
    pub fn mark_work_dirty(&self, group: Arc<crate::work::WorkGroupState>) {
        self.dirty_work.lock().unwrap_or_else(|p| p.into_inner()).push(group);
    }

    pub fn take_work_dirty(&self) -> Vec<Arc<crate::work::WorkGroupState>> {
        std::mem::take(&mut *self.dirty_work.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn take_dirty(&self) -> Vec<Arc<GroupState>> {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Writer counters, exported through [`Broker::writer_stats`](crate::Broker::writer_stats).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub rounds: AtomicU64,
    pub messages: AtomicU64,
    pub offset_commits: AtomicU64,
    pub write_nanos: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> crate::WriterStats {
        crate::WriterStats {
            rounds: self.rounds.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            offset_commits: self.offset_commits.load(Ordering::Relaxed),
            write_time: std::time::Duration::from_nanos(self.write_nanos.load(Ordering::Relaxed)),
        }
    }
}
