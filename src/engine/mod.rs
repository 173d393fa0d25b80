//! The engine: the state shared by the public handles and the writer thread, the writer, and
//! the engine's background work (retention, completing rounds).
//!
//! The handles (`broker/`, `producer/`, `consumer/`, `work/`, `inspector.rs`) reach the engine
//! only through [`boundary`], which lists everything they may ask of it. Inside:
//!
//! - `registry/`: the in-memory state of queues and groups.
//! - `request.rs`: the request set the writer applies.
//! - `writer/`: the writer thread, its round, and the request handlers by concept.
//! - `inbox.rs`, `completion.rs`: where producers stage sends, and how a round resolves them.
//! - `shared.rs`: [`Shared`](shared::Shared), what every handle holds.
//! - `open.rs`: building the engine from what the store loaded.
//! - `retention.rs`: the retention pass and its background task.
//! - `inspect.rs`: stats, pending claims and peeks computed from the store.
//!
//! Public handles hold a `Shared`, which owns the writer's request channel; the writer holds
//! only the [`Engine`]. When the last handle is dropped the channel closes and the writer
//! finishes its last round and exits, so a broker dropped without `shutdown` still commits
//! what it can and closes RocksDB off the async workers.

pub(crate) mod boundary;
mod completion;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
mod gauges;
mod inbox;
mod inspect;
mod keyed;
mod open;
mod registry;
mod request;
mod retention;
mod shared;
mod timer;
mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use self::inbox::Inbox;
use self::registry::{OrderedGroupState, Registry, WorkGroupState};
use crate::clock::Clock;
use crate::error::Failure;
use crate::events::Event;
use crate::options::Options;
use crate::stats::WriterStats;
use crate::store::Store;

pub(crate) struct Engine {
    pub store: Store,
    /// Where producers stage sends for the writer.
    pub inbox: Inbox,
    pub registry: Registry,
    pub options: Options,
    /// Ordered groups whose acknowledged offset moved since the writer last committed them.
    pub dirty: Mutex<Vec<Arc<OrderedGroupState>>>,
    /// Work-queue groups with acks queued in memory (see `WorkGroupState::queue_ack`).
    pub dirty_work: Mutex<Vec<Arc<WorkGroupState>>>,
    /// Set by the writer after a failed write: the broker fails closed, keeping the cause.
    pub failed: Mutex<Option<Failure>>,
    pub counters: Counters,
    /// Lifecycle events (see [`Broker::events`](crate::Broker::events)).
    pub events: tokio::sync::broadcast::Sender<Event>,
    /// When the schedule's next entry is due (`timer.rs`).
    pub timer: Arc<timer::Timer>,
    /// The etcd side, for an engine over etcd (its `store` is then a detached stand-in).
    #[cfg(feature = "etcd")]
    pub etcd: Option<Arc<etcd::EtcdSide>>,
}

impl Engine {
    /// An engine over `store` with the registry it loaded, nothing staged or dirty yet.
    pub fn new(
        store: Store,
        registry: Registry,
        options: Options,
        timer: Arc<timer::Timer>,
        events: usize,
    ) -> Self {
        Engine {
            store,
            inbox: Inbox::new(options.channel_capacity, options.max_batch_messages, options.max_batch_bytes),
            registry,
            options,
            dirty: Mutex::new(Vec::new()),
            dirty_work: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            counters: Counters::default(),
            events: tokio::sync::broadcast::channel(events).0,
            timer,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// Broadcasts an event if anyone listens (building one is cheap; sending locks).
    pub fn emit(&self, event: impl FnOnce() -> Event) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event());
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.options.clock
    }

    /// Why the broker failed closed, if it did.
    pub fn failure(&self) -> Option<Failure> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fails the broker closed: every later write request and send is refused with `why`, and
    /// what is still staged fails with it.
    pub fn fail(&self, why: Failure) {
        *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
        self.inbox.fail(&why);
        // No offset becomes durable any more: wake whoever waits for one to see the failure.
        for g in self.registry.ordered.iter() {
            g.value().durable_moved.notify_waiters();
        }
    }

    pub fn mark_dirty(&self, group: Arc<OrderedGroupState>) {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner()).push(group);
    }

    /// Hands a work-queue group with queued acks to the writer.
    pub fn mark_work_dirty(&self, group: Arc<WorkGroupState>) {
        self.dirty_work.lock().unwrap_or_else(|p| p.into_inner()).push(group);
    }

    pub fn take_work_dirty(&self) -> Vec<Arc<WorkGroupState>> {
        std::mem::take(&mut *self.dirty_work.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn take_dirty(&self) -> Vec<Arc<OrderedGroupState>> {
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
    pub fn snapshot(&self) -> WriterStats {
        WriterStats {
            rounds: self.rounds.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            offset_commits: self.offset_commits.load(Ordering::Relaxed),
            write_time: std::time::Duration::from_nanos(self.write_nanos.load(Ordering::Relaxed)),
        }
    }
}
