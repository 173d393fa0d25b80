//! The engine: the state shared by the public handles and the writer, the writers of both
//! backends, and the engine's background work (retention, gauges, completing rounds).
//!
//! The handles (`broker/`, `queue/`, `ordered/`, `work/`, `pool/`, `dead_letter/`, `kv/`,
//! `txn/`, `inspector.rs`) reach the engine only through [`boundary`], which lists everything
//! they may ask of it. Inside, from the handles' side down:
//!
//! - `shared.rs`: [`Shared`](shared::Shared), what every handle holds: the [`Engine`], the
//!   [`Backend`](backend::Backend) and the writer's request channel. `tasks.rs`: the periodic
//!   background tasks.
//! - `open.rs`, `connect.rs`: building an engine over RocksDB or over etcd (`etcd/start.rs`).
//! - `backend.rs`: **the seam between the two engines**: one match per operation that differs
//!   (reads, inspection, retention, ordered ownership, lease persistence), and `capability.rs`,
//!   the one table of what each engine carries out.
//! - `inspect.rs`, `retention.rs`, `gauges.rs`, `writer/`: the embedded engine (RocksDB): stats
//!   and peeks from the store, the retention pass, the metrics gauges, the writer thread with
//!   its round and the request handlers by concept. `etcd/`: the etcd engine.
//! - `figures.rs`, `dead_letter.rs`: what both engines share: pending claims as shown and live
//!   leases; the dead-letter copy.
//! - `registry/`: the in-memory state of queues and groups, the claim state machine.
//! - `request.rs`: the request set either writer applies.
//! - `inbox.rs`, `completion.rs`: where producers stage sends, and how a round resolves them.
//!
//! Public handles hold a `Shared`, which owns the writer's request channel; the writer holds
//! only the [`Engine`] (and its own store). When the last handle is dropped the channel closes
//! and the writer finishes its last round and exits, so a broker dropped without `shutdown`
//! still commits what it can and closes RocksDB off the async workers.

// First, so that its `cfg_etcd!` is in scope for the module declarations below.
#[macro_use]
mod backend;
pub(crate) mod boundary;
cfg_etcd! {
    mod connect;
}
mod capability;
mod completion;
mod dead_letter;
pub(crate) mod etcd;
#[cfg(feature = "json")]
pub(crate) mod export;
mod figures;
mod flow_moves;
mod gauges;
mod inbox;
mod inspect;
mod keyed;
mod open;
mod registry;
mod request;
mod retention;
mod shared;
mod tasks;
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

/// The state both backends share with the handles: the registry, the inbox of staged sends,
/// what is dirty, the broker's failure, counters and events. Storage is not here: the
/// embedded writer owns its store, the etcd writer its etcd side, and the handles reach
/// either through the [`Backend`](backend::Backend) in [`Shared`](shared::Shared).
pub(crate) struct Engine {
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
    /// Set when the engine's tasks are gone (the etcd engine's: dropped with the runtime that
    /// connected the broker): nothing is left to carry a call out, so every call is refused
    /// as after a shutdown ([`Shared::is_closed`](shared::Shared::is_closed)).
    pub tasks_gone: std::sync::atomic::AtomicBool,
}

impl Engine {
    /// An engine with the registry a backend loaded, nothing staged or dirty yet.
    pub fn new(registry: Registry, options: Options, timer: Arc<timer::Timer>, events: usize) -> Self {
        Engine {
            inbox: Inbox::new(options.channel_capacity, options.max_batch_messages, options.max_batch_bytes),
            registry,
            options,
            dirty: Mutex::new(Vec::new()),
            dirty_work: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            counters: Counters::default(),
            events: tokio::sync::broadcast::channel(events).0,
            timer,
            tasks_gone: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The engine's tasks ended (`tasks_gone`): later calls are refused with `Shutdown`, what
    /// is still staged fails with it, and whoever waits — for an offset or an outcome to
    /// become durable, for new messages, for a job to claim — is woken to see the end.
    /// Harmless after a clean stop (everything is closed).
    #[allow(dead_code)] // called by the etcd engine's tasks
    pub fn lose_tasks(&self) {
        self.tasks_gone.store(true, std::sync::atomic::Ordering::Release);
        drop(self.inbox.close(None));
        self.wake_durable_waiters();
        for q in self.registry.queues.iter() {
            q.poke();
        }
        for g in self.registry.work.iter() {
            g.value().changed.notify_waiters();
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
        self.wake_durable_waiters();
    }

    /// No offset becomes durable any more: wakes whoever waits for one to see why.
    fn wake_durable_waiters(&self) {
        for g in self.registry.ordered.iter() {
            g.value().durable_moved.notify_waiters();
        }
        for g in self.registry.work.iter() {
            g.value().settled.notify_waiters();
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

    /// Whether an ordered group waiting for the writer has a dead letter to write (its commit
    /// appends to the dead-letter queue).
    #[cfg(feature = "etcd")]
    pub fn dirty_letters(&self) -> bool {
        let dirty: Vec<Arc<OrderedGroupState>> = self.dirty.lock().unwrap_or_else(|p| p.into_inner()).clone();
        dirty.iter().any(|g| {
            g.records().pending.iter().any(|p| matches!(p, registry::PendingRecord::DeadLetter { .. }))
        })
    }

    /// Whether some ordered group waits for the writer's next round.
    #[cfg(feature = "etcd")]
    pub fn has_dirty(&self) -> bool {
        !self.dirty.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
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
